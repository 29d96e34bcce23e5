"""Discovery through the Kubernetes API: the members of one GroupCluster find each other by listing pods.

Every ``interval`` seconds the member lists the pods of its namespace that match a label selector
(``GET /api/v1/namespaces/NS/pods?labelSelector=...``) with its service-account token, keeps the pods of
the same GroupCluster that have an IP and are not finished, and hands their member endpoints to the stack as
:class:`~groupcluster.core.events.UpdateHosts` whenever the set changes (like
:class:`~groupcluster.runtime.file_discovery.FileDiscovery`).

What KUBE_PING's users kept tripping over, and what this module does about it:

* **Bound tokens expire**: the token file is re-read every minute and at once after a 401 (the request is
  then retried once with the fresh token).
* **CA bundles with several certificates**: every certificate of ``ca.crt`` is trusted (a bundle that holds
  no certificate at all is a clear error).
* **RBAC 403s**: the log line names the missing permission (``list pods in namespace X``) and the service
  account that lacks it, and the discovery keeps retrying (a RoleBinding created later fixes it).
* **Singleton clusters**: when no peer is found the member says so (namespace, selector, what was seen), and
  says again when peers appear.
* **Old and new pods mixing**: only pods whose labels carry our cluster's name are used, even when the
  selector is broader; pods without an IP, or Succeeded/Failed, are skipped. Pods that are not *ready* are
  kept: a joining member is not ready until it has joined, and it must be found to join.

The member port of a pod is its container port named ``member`` when it declares one, else our own port.
Credentials: ``$GROUPCLUSTER_SA_DIR`` when set (the local control plane announces the service-account
volume there), else ``/var/run/secrets/kubernetes.io/serviceaccount``; the API server is
``https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT``.

:func:`select_peers` and :class:`TokenSource` are pure enough to test without a server; the operator reuses
:class:`InClusterConfig` for its own API client.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import logging
import os
import ssl
import time
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core.errors import ConfigError
from ..core.events import UpdateHosts

log = logging.getLogger("groupcluster.runtime.kube_discovery")

Endpoint = tuple[str, int]

DEFAULT_SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
SA_DIR_ENV = "GROUPCLUSTER_SA_DIR"
# Bound tokens are valid for an hour or so and are rotated by the kubelet well before; a minute is what the
# Kubernetes client libraries use too.
TOKEN_MAX_AGE = 60.0
DEFAULT_INTERVAL = 3.0
REQUEST_TIMEOUT = 10.0
# "no peer found" and "forbidden" repeat at most this often while the condition lasts.
REPEAT_LOG_EVERY = 60.0
CLUSTER_LABEL = "groupcluster.io/cluster"
MEMBER_PORT_NAME = "member"
# A pod list is small (one cluster's pods), but a broad selector must not make us buffer without bound.
MAX_LIST_BYTES = 32 * 1024 * 1024


async def _read_at_most(stream: Any, limit: int) -> bytes:
    """The body up to `limit` bytes. StreamReader.read(n) returns what has arrived so far, which for a chunked
    answer may be only its first chunk; read until the end or the limit."""
    parts: list[bytes] = []
    size = 0
    while size < limit:
        chunk = await stream.read(limit - size)
        if not chunk:
            break
        parts.append(chunk)
        size += len(chunk)
    return b"".join(parts)


class KubeConfigError(ConfigError):
    """In-cluster credentials are missing or unusable; the message says which file or variable."""


def service_account_dir(env: Mapping[str, str] | None = None) -> Path:
    """Where the service-account token, CA bundle and namespace are mounted."""
    env = os.environ if env is None else env
    return Path(env.get(SA_DIR_ENV) or DEFAULT_SA_DIR)


def ssl_context_for_bundle(ca_file: Path) -> ssl.SSLContext:
    """A client TLS context trusting every certificate in the PEM bundle ``ca_file`` (several are allowed)."""
    try:
        text = ca_file.read_text(encoding="ascii", errors="replace")
    except OSError as exc:
        raise KubeConfigError(f"CA bundle {ca_file}: {exc.strerror or exc}") from None
    count = text.count("-----BEGIN CERTIFICATE-----")
    if count == 0:
        raise KubeConfigError(f"CA bundle {ca_file}: no PEM certificate in it")
    ctx = ssl.create_default_context()
    try:
        # cadata loads every certificate of a concatenated bundle, not only the first.
        ctx.load_verify_locations(cadata=text)
    except ssl.SSLError as exc:
        raise KubeConfigError(f"CA bundle {ca_file}: not a valid PEM certificate bundle ({exc})") from None
    return ctx


def token_subject(token: str) -> str | None:
    """The ``sub`` claim of a JWT (e.g. ``system:serviceaccount:ns:name``), for log lines; None if unreadable.

    The signature is not checked: the value only names who we are in messages, the API server decides.
    """
    parts = token.split(".")
    if len(parts) != 3:
        return None
    try:
        payload = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except (ValueError, UnicodeDecodeError):
        return None
    sub = payload.get("sub") if isinstance(payload, dict) else None
    return sub if isinstance(sub, str) else None


class TokenSource:
    """The service-account token, re-read from its file when older than ``max_age`` or after a 401."""

    def __init__(self, path: Path, *, max_age: float = TOKEN_MAX_AGE, clock: Callable[[], float] = time.monotonic):
        self.path = path
        self.max_age = max_age
        self.clock = clock
        self._token: str | None = None
        self._read_at = 0.0
        self.reads = 0

    def get(self) -> str:
        now = self.clock()
        if self._token is None or now - self._read_at >= self.max_age:
            try:
                token = self.path.read_text(encoding="utf-8").strip()
            except OSError as exc:
                raise KubeConfigError(f"service-account token {self.path}: {exc.strerror or exc}") from None
            if not token:
                raise KubeConfigError(f"service-account token {self.path}: the file is empty")
            self._token, self._read_at = token, now
            self.reads += 1
        return self._token

    def invalidate(self) -> None:
        """Forget the cached token: the next :meth:`get` reads the file (after the server answered 401)."""
        self._token = None


@dataclass
class InClusterConfig:
    """How a pod reaches the API server: URL, CA bundle, token file and its own namespace."""

    server: str
    ca_file: Path
    token_file: Path
    namespace: str

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> InClusterConfig:
        env = os.environ if env is None else env
        host = env.get("KUBERNETES_SERVICE_HOST", "")
        port = env.get("KUBERNETES_SERVICE_PORT", "443")
        if not host:
            raise KubeConfigError(
                "KUBERNETES_SERVICE_HOST is not set: not running in a Kubernetes pod "
                "(in-cluster discovery and the operator's in-cluster login need it)"
            )
        if not port.isdigit():
            raise KubeConfigError(f"KUBERNETES_SERVICE_PORT: expected a port number, got {port!r}")
        sa = service_account_dir(env)
        ns_file = sa / "namespace"
        try:
            namespace = ns_file.read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise KubeConfigError(f"namespace file {ns_file}: {exc.strerror or exc}") from None
        if not namespace:
            raise KubeConfigError(f"namespace file {ns_file}: the file is empty")
        shown = f"[{host}]" if ":" in host else host
        return cls(
            server=f"https://{shown}:{port}", ca_file=sa / "ca.crt", token_file=sa / "token", namespace=namespace
        )


def _labels_match(labels: Mapping[str, str], required: Mapping[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in required.items())


def select_peers(
    pod_list: Mapping[str, Any],
    *,
    default_port: int,
    required_labels: Mapping[str, str] | None = None,
    port_name: str = MEMBER_PORT_NAME,
) -> tuple[Endpoint, ...]:
    """The member endpoints of a PodList: pods with an IP, not finished, carrying ``required_labels``.

    Sorted, without duplicates. Items that are not well-formed pods are skipped (the API server is trusted
    for the shape, but a proxy or a future version must not crash discovery).
    """
    items = pod_list.get("items")
    if not isinstance(items, list):
        raise ValueError("pod list: no 'items' list in the API server's answer")
    found: set[Endpoint] = set()
    for pod in items:
        if not isinstance(pod, dict):
            continue
        meta = pod.get("metadata") or {}
        status = pod.get("status") or {}
        spec = pod.get("spec") or {}
        labels = meta.get("labels") or {}
        if required_labels and not (isinstance(labels, dict) and _labels_match(labels, required_labels)):
            continue
        if status.get("phase") in ("Succeeded", "Failed"):
            continue  # a member that left (or died) does not answer any more
        ip = status.get("podIP")
        if not isinstance(ip, str) or not ip:
            continue
        found.add((ip, _member_port(spec, port_name, default_port)))
    return tuple(sorted(found))


def _member_port(spec: Mapping[str, Any], port_name: str, default: int) -> int:
    for container in spec.get("containers") or ():
        for port in (container or {}).get("ports") or ():
            if isinstance(port, dict) and port.get("name") == port_name:
                number = port.get("containerPort")
                if isinstance(number, int) and 0 < number < 65536:
                    return number
    return default


class KubeApiError(Exception):
    """An API request failed; ``status`` is the HTTP status (0 when no answer came)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def api_error_message(body: bytes) -> str:
    """The ``message`` of a Kubernetes Status object, or the body's start when it is not one."""
    try:
        data = json.loads(body)
        if isinstance(data, dict) and isinstance(data.get("message"), str):
            return data["message"]
    except ValueError:
        pass
    return body[:300].decode("utf-8", "replace")


@dataclass
class KubeDiscoveryConfig:
    """What to list: namespace, selector, and which labels a pod of our cluster must carry."""

    namespace: str | None = None
    selector: str = ""
    required_labels: dict[str, str] = field(default_factory=dict)
    interval: float = DEFAULT_INTERVAL
    port_name: str = MEMBER_PORT_NAME


class KubeDiscovery:
    """Polls the API server for our cluster's pods and feeds their endpoints to ``control``.

    Create through :func:`factory` for :meth:`Channel.connect <groupcluster.runtime.channel.Channel.connect>`;
    ``start`` does the first listing before the stack starts, so the first discovery round already probes
    the peers found.
    """

    def __init__(
        self,
        control: Callable[[UpdateHosts], object],
        endpoint: Endpoint,
        config: KubeDiscoveryConfig,
        cluster: InClusterConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.control = control
        self.endpoint = endpoint
        self.config = config
        self.cluster = cluster
        self.namespace = config.namespace or cluster.namespace
        self.tokens = TokenSource(cluster.token_file, clock=clock)
        self.clock = clock
        self.hosts: tuple[Endpoint, ...] = ()
        self.polls = 0
        self.failures = 0
        self._ssl: ssl.SSLContext | None = None
        self._ca_mtime: float | None = None
        self._session: Any = None
        self._task: asyncio.Task[None] | None = None
        self._last_logged: dict[str, float] = {}
        self._alone = False

    # -- life cycle ------------------------------------------------------------------------------------
    async def start(self) -> None:
        await self.poll()
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.config.interval)
            await self.poll()

    def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
        session, self._session = self._session, None
        if session is not None and not session.closed:
            # close() is a coroutine; when the loop is going away the connector is released with it anyway.
            with contextlib.suppress(RuntimeError):
                asyncio.get_running_loop().create_task(session.close())

    async def aclose(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    # -- one listing -----------------------------------------------------------------------------------
    def _log_limited(self, key: str, level: int, msg: str, *args: Any) -> None:
        """Log a recurring condition when it starts and then at most every REPEAT_LOG_EVERY seconds."""
        now = self.clock()
        last = self._last_logged.get(key)
        if last is None or now - last >= REPEAT_LOG_EVERY:
            self._last_logged[key] = now
            log.log(level, msg, *args)

    async def _client(self) -> Any:
        import aiohttp

        try:
            mtime = self.cluster.ca_file.stat().st_mtime
        except OSError as exc:
            raise KubeConfigError(f"CA bundle {self.cluster.ca_file}: {exc.strerror or exc}") from None
        if self._session is None or mtime != self._ca_mtime:
            # The CA bundle is rotated in place (a projected volume): trust what it holds now.
            self._ssl = ssl_context_for_bundle(self.cluster.ca_file)
            self._ca_mtime = mtime
            if self._session is not None:
                await self._session.close()
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(ssl=self._ssl),
                timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT),
            )
        return self._session

    def _url(self) -> str:
        ns = urllib.parse.quote(self.namespace, safe="")
        query = urllib.parse.urlencode({"labelSelector": self.config.selector}) if self.config.selector else ""
        return f"{self.cluster.server}/api/v1/namespaces/{ns}/pods" + (f"?{query}" if query else "")

    async def list_pods(self) -> dict[str, Any]:
        """One listing; a 401 re-reads the token and retries once. Raises KubeApiError or KubeConfigError."""
        import aiohttp

        session = await self._client()
        for attempt in (1, 2):
            headers = {"Authorization": f"Bearer {self.tokens.get()}", "Accept": "application/json"}
            try:
                async with session.get(self._url(), headers=headers) as resp:
                    body = await _read_at_most(resp.content, MAX_LIST_BYTES + 1)
                    if resp.status == 401 and attempt == 1:
                        log.info("kube discovery: the API server answered 401; re-reading the token file")
                        self.tokens.invalidate()
                        continue
                    if resp.status != 200:
                        raise KubeApiError(resp.status, api_error_message(body))
                    if len(body) > MAX_LIST_BYTES:
                        raise KubeApiError(resp.status, f"pod list larger than {MAX_LIST_BYTES} bytes")
                    try:
                        data = json.loads(body)
                    except ValueError:
                        raise KubeApiError(resp.status, "the pod list is not JSON") from None
                    if not isinstance(data, dict):
                        raise KubeApiError(resp.status, "the pod list is not a JSON object")
                    return data
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                raise KubeApiError(0, f"{type(exc).__name__}: {exc}") from None
        raise AssertionError("unreachable")  # pragma: no cover

    async def poll(self) -> bool:
        """List once and pass changed endpoints on; returns True if the hosts changed. Never raises."""
        self.polls += 1
        try:
            data = await self.list_pods()
            hosts = select_peers(
                data,
                default_port=self.endpoint[1],
                required_labels=self.config.required_labels,
                port_name=self.config.port_name,
            )
        except KubeApiError as exc:
            self.failures += 1
            self._log_failure(exc)
            return False
        except (KubeConfigError, ValueError) as exc:
            self.failures += 1
            self._log_limited("config", logging.ERROR, "kube discovery: %s", exc)
            return False
        self._last_logged.pop("forbidden", None)
        self._last_logged.pop("api", None)
        peers = [h for h in hosts if h != self.endpoint]
        if not peers:
            self._alone = True
            self._log_limited(
                "alone",
                logging.WARNING,
                "kube discovery: no peer found in namespace %s with selector %r (%d pod(s) listed, none other "
                "with an IP); this member starts or stays in a group of its own until peers appear",
                self.namespace,
                self.config.selector,
                len(data.get("items") or ()),
            )
        elif self._alone:
            self._alone = False
            self._last_logged.pop("alone", None)
            log.info("kube discovery: %d peer(s) found: %s", len(peers), ", ".join(f"{h}:{p}" for h, p in peers))
        if hosts == self.hosts:
            return False
        self.hosts = hosts
        self.control(UpdateHosts(hosts))
        return True

    def _log_failure(self, exc: KubeApiError) -> None:
        if exc.status == 403:
            who = None
            with contextlib.suppress(KubeConfigError):
                who = token_subject(self.tokens.get())
            self._log_limited(
                "forbidden",
                logging.ERROR,
                "kube discovery: forbidden (403): %s lacks the permission to list pods in namespace %s "
                "(RBAC: a Role with verbs [list] on resource pods, bound to that service account); "
                "the API server said: %s",
                who or "this pod's service account",
                self.namespace,
                exc,
            )
        elif exc.status == 401:
            self._log_limited(
                "api",
                logging.ERROR,
                "kube discovery: unauthorized (401) even with a freshly read token from %s: %s",
                self.cluster.token_file,
                exc,
            )
        else:
            where = f"HTTP {exc.status}" if exc.status else "no answer"
            self._log_limited(
                "api", logging.WARNING, "kube discovery: listing pods at %s failed (%s): %s", self._url(), where, exc
            )


def parse_selector_labels(selector: str) -> dict[str, str]:
    """The ``key=value`` (or ``key==value``) terms of a label selector; other terms are left to the server."""
    out: dict[str, str] = {}
    for term in selector.split(","):
        term = term.strip()
        if "!=" in term or not term:
            continue
        key, sep, value = term.partition("==") if "==" in term else term.partition("=")
        if sep and key.strip() and " in " not in key:
            out[key.strip()] = value.strip()
    return out


def factory(
    config: KubeDiscoveryConfig, cluster: InClusterConfig | None = None
) -> Callable[[Callable[[UpdateHosts], object], Endpoint], KubeDiscovery]:
    """A ``discovery`` argument for :meth:`Channel.connect`: builds the adapter once the endpoint is known."""
    resolved = cluster or InClusterConfig.from_env()

    def make(control: Callable[[UpdateHosts], object], endpoint: Endpoint) -> KubeDiscovery:
        return KubeDiscovery(control, endpoint, config, resolved)

    return make


# -- the member command's options ------------------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``--kube-discovery`` and its options (``groupcluster member``)."""
    group = parser.add_argument_group("discovery through the Kubernetes API")
    group.add_argument(
        "--kube-discovery",
        action="store_true",
        default=os.environ.get("GROUPCLUSTER_KUBE_DISCOVERY", "") not in ("", "0", "false"),
        help="find peers by listing this namespace's pods (in a pod; env GROUPCLUSTER_KUBE_DISCOVERY=1)",
    )
    group.add_argument(
        "--kube-selector",
        default=os.environ.get("GROUPCLUSTER_KUBE_SELECTOR"),
        metavar="SELECTOR",
        help=f"label selector of our cluster's pods (default {CLUSTER_LABEL}=CLUSTER; env GROUPCLUSTER_KUBE_SELECTOR)",
    )
    group.add_argument(
        "--kube-namespace",
        default=os.environ.get("GROUPCLUSTER_KUBE_NAMESPACE"),
        metavar="NS",
        help="namespace to list (default: the pod's own, from the service-account volume)",
    )
    group.add_argument(
        "--kube-interval",
        type=float,
        default=DEFAULT_INTERVAL,
        metavar="SECONDS",
        help=f"seconds between listings (default {DEFAULT_INTERVAL:g})",
    )


def from_args(args: argparse.Namespace) -> Callable[[Callable[[UpdateHosts], object], Endpoint], KubeDiscovery] | None:
    """The discovery factory for ``groupcluster member``, or None without ``--kube-discovery``."""
    if not getattr(args, "kube_discovery", False):
        return None
    if not args.kube_interval > 0:
        raise ConfigError(f"--kube-interval: expected a positive number of seconds, got {args.kube_interval}")
    selector = args.kube_selector or f"{CLUSTER_LABEL}={args.cluster}"
    # The selector's equality terms are checked again on every pod listed, so a selector that the server
    # reads more broadly (or a set-based one) cannot mix another cluster's pods into ours.
    labels = parse_selector_labels(selector) or {CLUSTER_LABEL: args.cluster}
    config = KubeDiscoveryConfig(
        namespace=args.kube_namespace, selector=selector, required_labels=labels, interval=args.kube_interval
    )
    return factory(config)
