"""Discovery through the Kubernetes API: the members of one GroupCluster find each other by listing pods.

Every ``interval`` seconds the member lists the pods of its namespace that match a label selector
(``GET /api/v1/namespaces/NS/pods?labelSelector=...``, through the official client and its service-account
token: :mod:`groupcluster.runtime.kube_client`), keeps the pods of
the same GroupCluster that have an IP and are not finished, and hands their member endpoints to the stack as
:class:`~groupcluster.core.events.UpdateHosts` whenever the set changes (like
:class:`~groupcluster.runtime.file_discovery.FileDiscovery`).

What KUBE_PING's users kept tripping over, and what this module does about it:

* **Bound tokens expire**: the token file is re-read every minute and at once after a 401 (the request is
  then retried once with the fresh token).
* **CA bundles with several certificates**: every certificate of ``ca.crt`` is trusted (a bundle that holds
  no certificate at all is a clear error); a bundle rotated in place is trusted as it is now.
* **Large namespaces**: the pods are listed in pages.
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

:func:`select_peers` is pure enough to test without a server.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kubernetes_asyncio.client import CoreV1Api

from ..core.errors import ConfigError
from ..core.events import UpdateHosts
from .kube_client import (
    ApiError,
    InClusterConfig,
    KubeClient,
    KubeConfigError,
    Op,
    TokenSource,
    service_account_dir,
    ssl_context_for_bundle,
    token_subject,
)

log = logging.getLogger("groupcluster.runtime.kube_discovery")

Endpoint = tuple[str, int]

DEFAULT_INTERVAL = 3.0
# "no peer found" and "forbidden" repeat at most this often while the condition lasts.
REPEAT_LOG_EVERY = 60.0
CLUSTER_LABEL = "groupcluster.io/cluster"
MEMBER_PORT_NAME = "member"

# Re-exported: the members' and the operator's tests and callers name them here.
__all__ = [
    "InClusterConfig",
    "KubeConfigError",
    "KubeDiscovery",
    "KubeDiscoveryConfig",
    "TokenSource",
    "add_arguments",
    "factory",
    "from_args",
    "parse_selector_labels",
    "select_peers",
    "service_account_dir",
    "ssl_context_for_bundle",
    "token_subject",
]


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
        self.client = KubeClient.in_cluster(cluster, clock=clock)
        assert self.client.tokens is not None
        self.tokens: TokenSource = self.client.tokens
        self.clock = clock
        self.hosts: tuple[Endpoint, ...] = ()
        self.polls = 0
        self.failures = 0
        self._task: asyncio.Task[None] | None = None
        # The loop keeps only a weak reference to a task: without this one the close could be collected unfinished.
        self._closing: asyncio.Task[None] | None = None
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
        # close() is a coroutine; when the loop is going away the connections are released with it anyway.
        with contextlib.suppress(RuntimeError):
            self._closing = asyncio.get_running_loop().create_task(self.client.close())

    async def aclose(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.client.close()

    # -- one listing -----------------------------------------------------------------------------------
    def _log_limited(self, key: str, level: int, msg: str, *args: Any) -> None:
        """Log a recurring condition when it starts and then at most every REPEAT_LOG_EVERY seconds."""
        now = self.clock()
        last = self._last_logged.get(key)
        if last is None or now - last >= REPEAT_LOG_EVERY:
            self._last_logged[key] = now
            log.log(level, msg, *args)

    def _op(self) -> Op:
        return Op("list", "pods", self.namespace)

    async def list_pods(self) -> dict[str, Any]:
        """One listing (every page) as a PodList; raises ApiError or KubeConfigError."""
        kwargs: dict[str, Any] = {"label_selector": self.config.selector} if self.config.selector else {}
        items = await self.client.list_all(self._op(), CoreV1Api, "list_namespaced_pod", self.namespace, **kwargs)
        return {"kind": "PodList", "items": items}

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
        except ApiError as exc:
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

    def _log_failure(self, exc: ApiError) -> None:
        if exc.status == 403:
            # The message names who lacks which permission and the Role that grants it; retrying fixes
            # itself once a RoleBinding appears.
            self._log_limited("forbidden", logging.ERROR, "kube discovery: %s", exc)
        elif exc.status == 401:
            self._log_limited(
                "api",
                logging.ERROR,
                "kube discovery: unauthorized (401) even with a freshly read token from %s: %s",
                self.cluster.token_file,
                exc.reason,
            )
        else:
            self._log_limited(
                "api", logging.WARNING, "kube discovery: listing pods at %s failed: %s", self.client.server, exc
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
