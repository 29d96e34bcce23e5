"""Access to the Kubernetes API through the official asyncio client (``kubernetes_asyncio``).

Shared by the members' discovery (:mod:`groupcluster.runtime.kube_discovery`) and the operator
(:mod:`groupcluster_operator.kubeapi`). The client library does the HTTP, TLS and the kubeconfig; this module
adds what its users kept asking for:

* **Bound tokens rotate**: in a pod, the service-account token is re-read every minute and at once after a
  401 (the call is then retried once); kubeconfig credentials that expire (``exec`` plugins such as
  ``aws eks get-token``, ``gke-gcloud-auth-plugin`` or ``kubelogin``, and the ``gcp`` and ``oidc``
  auth-providers) are renewed before they expire and after a 401 the same way.
* **CA bundles**: every certificate of ``ca.crt`` is trusted; a bundle that holds none is a clear error, and a
  bundle rotated in place is picked up (the client is rebuilt when the file changes).
* **Lists come in pages** (``limit`` and ``continue``), so a broad selector never makes one huge answer.
* **Errors say what to do**: :class:`ApiError` carries the verb, resource and namespace of the call, and a 403
  names the identity and the RBAC rule that would allow it.
"""

from __future__ import annotations

import base64
import datetime
import json
import os
import ssl
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.config import kube_config
from kubernetes_asyncio.config.config_exception import ConfigException

from ..core.errors import ConfigError

DEFAULT_SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
SA_DIR_ENV = "GROUPCLUSTER_SA_DIR"
# Bound tokens are valid for an hour or so and are rotated by the kubelet well before; a minute is what the
# Kubernetes client libraries use too.
TOKEN_MAX_AGE = 60.0
# Credentials from a kubeconfig auth-provider or token file are looked at again this often.
PROVIDER_RECHECK = 60.0
# An expiring credential is renewed this long before it expires, so no call goes out with a dying one.
EXPIRY_MARGIN = 30.0
REQUEST_TIMEOUT = 15.0
# Items per page of a list: small enough that one answer stays small, large enough that a cluster's pods are one.
PAGE_SIZE = 500


class KubeConfigError(ConfigError):
    """Credentials are missing or unusable; the message says which file, variable or kubeconfig entry."""


def service_account_dir(env: Mapping[str, str] | None = None) -> Path:
    """Where the service-account token, CA bundle and namespace are mounted."""
    env = os.environ if env is None else env
    return Path(env.get(SA_DIR_ENV) or DEFAULT_SA_DIR)


def ssl_context_for_bundle(ca_file: Path) -> ssl.SSLContext:
    """A client TLS context trusting every certificate in the PEM bundle ``ca_file`` (several are allowed).

    The client library loads the bundle itself; this check runs first so that an unreadable or empty bundle
    is reported by name instead of as an SSL error from deep inside the first request.
    """
    try:
        text = ca_file.read_text(encoding="ascii", errors="replace")
    except OSError as exc:
        raise KubeConfigError(f"CA bundle {ca_file}: {exc.strerror or exc}") from None
    if "-----BEGIN CERTIFICATE-----" not in text:
        raise KubeConfigError(f"CA bundle {ca_file}: no PEM certificate in it")
    ctx = ssl.create_default_context()
    try:
        ctx.load_verify_locations(cadata=text)
    except ssl.SSLError as exc:
        raise KubeConfigError(f"CA bundle {ca_file}: not a valid PEM certificate bundle ({exc})") from None
    return ctx


def token_subject(token: str) -> str | None:
    """The ``sub`` claim of a JWT (e.g. ``system:serviceaccount:ns:name``), for messages; None if unreadable.

    The signature is not checked: the value only names who we are in messages, the API server decides.
    """
    parts = token.removeprefix("Bearer ").split(".")
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


@dataclass(frozen=True)
class Op:
    """What a call does, for error messages and RBAC hints: ``list pods in namespace prod``."""

    verb: str
    resource: str
    namespace: str | None = None
    group: str = ""  # the API group ("" is the core group)

    def __str__(self) -> str:
        resource = f"{self.resource}.{self.group}" if self.group else self.resource
        where = f"in namespace {self.namespace}" if self.namespace else "at the cluster scope"
        return f"{self.verb} {resource} {where}"


def status_message(body: Any) -> str:
    """The ``message`` of a Kubernetes Status object, or the body's start when it is not one."""
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    if not body:
        return ""
    try:
        data = json.loads(body)
        if isinstance(data, dict) and isinstance(data.get("message"), str):
            return data["message"]
    except (TypeError, ValueError):
        pass
    return str(body)[:300]


class ApiError(Exception):
    """A call failed: ``status`` is the HTTP status (0: no answer), ``reason`` the server's message.

    ``op`` says what was attempted; ``who`` is the identity the server saw, when known. The message of a 403
    names the missing permission and the RBAC rule that grants it.
    """

    def __init__(self, status: int, reason: str, op: Op | None = None, who: str | None = None) -> None:
        self.status = status
        self.reason = reason
        self.op = op
        self.who = who
        super().__init__(self._message())

    def _message(self) -> str:
        if self.op is None:
            return f"HTTP {self.status}: {self.reason}" if self.status else self.reason
        if self.status == 403:
            op = self.op
            scope = f"a Role in namespace {op.namespace}" if op.namespace else "a ClusterRole"
            group = f"apiGroups [{op.group or ''!r}]"
            return (
                f"forbidden (403): {self.who or 'this identity'} lacks the permission to {op} (RBAC: {scope} with "
                f"verbs [{op.verb}] on resources [{op.resource}], {group}, bound to it); "
                f"the API server said: {self.reason}"
            )
        where = f"HTTP {self.status}" if self.status else "no answer"
        return f"{self.op}: {where}: {self.reason}"


def _strip_token(conf: k8s.Configuration) -> None:
    # The library takes a tokenFile's content as it is; `kubectl create token > FILE` ends it with a newline,
    # which aiohttp then refuses to put in a header.
    value = conf.api_key.get("BearerToken")
    if isinstance(value, str):
        conf.api_key["BearerToken"] = value.strip()


class KubeClient:
    """One API server and one identity; :meth:`call` runs a ``kubernetes_asyncio`` API method with them.

    Build with :meth:`in_cluster`, :meth:`from_kubeconfig` or :meth:`auto`.
    """

    def __init__(self, configuration: k8s.Configuration, namespace: str, *, describe: str) -> None:
        self.configuration = configuration
        self.namespace = namespace
        self.describe = describe  # "service account ..." / "kubeconfig ... user ...", for messages
        self.tokens: TokenSource | None = None
        self._loader: kube_config.KubeConfigLoader | None = None
        self._loader_expiry: float | None = None  # monotonic time; None: valid until a 401
        self._loader_stale = False
        self._tls_key: tuple[Any, ...] = ()
        self._api: k8s.ApiClient | None = None
        self.request_timeout = REQUEST_TIMEOUT

    @property
    def server(self) -> str:
        return str(self.configuration.host)

    # -- construction ------------------------------------------------------------------------------------
    @classmethod
    def in_cluster(cls, cfg: InClusterConfig, *, clock: Callable[[], float] = time.monotonic) -> KubeClient:
        """The pod's service account; the token file is re-read every minute and after a 401.

        Nothing is read yet: a missing token or CA bundle is reported by the first call (and the next call
        tries again), since the kubelet may still be writing them.
        """
        conf = k8s.Configuration(host=cfg.server)
        conf.ssl_ca_cert = str(cfg.ca_file)
        tokens = TokenSource(cfg.token_file, clock=clock)

        def fresh_token(configuration: k8s.Configuration) -> None:
            configuration.api_key["BearerToken"] = f"Bearer {tokens.get()}"

        conf.refresh_api_key_hook = fresh_token
        # The client calls the hook only for a key it holds; the hook fills in the real token per call.
        conf.api_key["BearerToken"] = ""
        self = cls(conf, cfg.namespace, describe=f"the service account of {cfg.token_file}")
        self.tokens = tokens
        return self

    @classmethod
    async def from_kubeconfig(cls, path: str | Path | None = None, context: str | None = None) -> KubeClient:
        """A kubeconfig's context (its current one unless ``context``): every credential kind the official
        client supports: tokens, token files, client certificates, ``exec`` plugins, ``gcp`` and ``oidc``."""
        if path is None:
            path = os.environ.get("KUBECONFIG", "").split(os.pathsep)[0] or Path.home() / ".kube" / "config"
        path = Path(path)
        if not path.is_file():
            raise KubeConfigError(f"kubeconfig {path}: no such file")
        conf = k8s.Configuration()
        try:
            loader = await kube_config.load_kube_config(
                str(path), context=context, client_configuration=conf, persist_config=False
            )
        except (ConfigException, KeyError, ValueError, AssertionError, OSError) as exc:
            raise KubeConfigError(f"kubeconfig {path}: {exc or type(exc).__name__}") from None
        _strip_token(conf)
        ctx = loader.current_context or {}
        details = ctx.get("context") or {}
        self = cls(
            conf,
            details.get("namespace") or "default",
            describe=f"user {details.get('user')!r} of kubeconfig {path} (context {ctx.get('name')!r})",
        )
        user = loader._user
        if user is not None and any(k in user for k in ("exec", "auth-provider", "tokenFile")):
            self._loader = loader
            self._loader_expiry = self._expiry_of(loader)
            conf.refresh_api_key_hook = self._refresh_from_loader
        return self

    @classmethod
    async def auto(cls, kubeconfig: str | Path | None = None) -> KubeClient:
        """In-cluster credentials when running in a pod (and no kubeconfig was named), else the kubeconfig."""
        if not kubeconfig and os.environ.get("KUBERNETES_SERVICE_HOST"):
            return cls.in_cluster(InClusterConfig.from_env())
        return await cls.from_kubeconfig(kubeconfig)

    # -- credentials ------------------------------------------------------------------------------------
    def _expiry_of(self, loader: kube_config.KubeConfigLoader) -> float | None:
        """When the loader's credential must be renewed (monotonic), or None when only a 401 says so."""
        user: Any = loader._user or {}
        if "auth-provider" in user or ("tokenFile" in user and "exec" not in user):
            # The provider knows when its token expires; a token file may be rewritten by whoever manages it.
            return time.monotonic() + PROVIDER_RECHECK
        expiry = getattr(loader, "exec_plugin_expiry", None)
        if expiry is None:
            return None
        left = (expiry - datetime.datetime.now(datetime.UTC)).total_seconds()
        return time.monotonic() + left - EXPIRY_MARGIN

    async def _refresh_from_loader(self, configuration: k8s.Configuration) -> None:
        loader = self._loader
        assert loader is not None
        due = self._loader_expiry is not None and time.monotonic() >= self._loader_expiry
        if not (self._loader_stale or due):
            return
        if hasattr(loader, "exec_plugin_expiry"):
            # The library keeps an exec credential until its own expiry; a 401 or our margin says renew now.
            del loader.exec_plugin_expiry
        try:
            await loader.load_and_set(configuration)
        except (ConfigException, KeyError, ValueError, OSError) as exc:
            raise KubeConfigError(f"{self.describe}: renewing the credential failed: {exc}") from None
        _strip_token(configuration)
        self._loader_stale = False
        self._loader_expiry = self._expiry_of(loader)

    def renew(self) -> bool:
        """Make the next call use a fresh credential (after a 401); False when there is none to get."""
        if self.tokens is not None:
            self.tokens.invalidate()
            return True
        if self._loader is not None:
            self._loader_stale = True
            return True
        return False

    async def current_token(self) -> str | None:
        """The bearer token calls carry now (renewed first if due), without the ``Bearer`` prefix."""
        value = await self.configuration.get_api_key_with_prefix("BearerToken")
        if not value or not value.startswith("Bearer "):
            return None
        return value.removeprefix("Bearer ").strip()

    async def identity(self) -> str:
        """Who the API server sees, for messages: a token's subject when it has one, else our description."""
        try:
            token = await self.current_token()
        except (KubeConfigError, ConfigException):
            token = None
        return (token_subject(token) if token else None) or self.describe

    async def expiration(self) -> datetime.datetime | None:
        """When the current credential should be asked for again (for kopf's login), None: no known end."""
        if self.tokens is not None:
            return datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=self.tokens.max_age)
        if self._loader_expiry is None:
            return None
        return datetime.datetime.now(datetime.UTC) + datetime.timedelta(
            seconds=max(1.0, self._loader_expiry - time.monotonic())
        )

    # -- the client -------------------------------------------------------------------------------------
    async def _client(self) -> k8s.ApiClient:
        """The ApiClient, rebuilt when what its TLS context was made from changed (CA rotated, new exec cert)."""
        ca = self.configuration.ssl_ca_cert
        try:
            mtime = os.stat(ca).st_mtime if ca else None
        except OSError as exc:
            raise KubeConfigError(f"CA bundle {ca}: {exc.strerror or exc}") from None
        key = (ca, mtime, self.configuration.cert_file, self.configuration.key_file)
        if self._api is None or key != self._tls_key:
            if ca:
                ssl_context_for_bundle(Path(ca))  # an empty or broken bundle is named, not an SSL error later
            if self._api is not None:
                await self._api.close()
            self._api = k8s.ApiClient(self.configuration)
            self._tls_key = key
        return self._api

    async def close(self) -> None:
        api, self._api = self._api, None
        if api is not None:
            await api.close()

    async def call(self, op: Op, api_class: type, method: str, *args: Any, **kwargs: Any) -> Any:
        """``api_class(client).method(*args, **kwargs)``; a 401 renews the credential and retries once.

        Raises :class:`ApiError` (with ``op`` in its message) or :class:`KubeConfigError`.
        """
        for attempt in (1, 2):
            api = api_class(await self._client())
            try:
                return await getattr(api, method)(*args, _request_timeout=self.request_timeout, **kwargs)
            except ApiException as exc:
                if exc.status == 401 and attempt == 1 and self.renew():
                    continue
                who = await self.identity() if exc.status in (401, 403) else None
                raise ApiError(int(exc.status or 0), status_message(exc.body) or str(exc.reason), op, who) from None
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                raise ApiError(0, f"{type(exc).__name__}: {exc}", op) from None
        raise AssertionError("unreachable")  # pragma: no cover

    async def list_all(
        self, op: Op, api_class: type, method: str, *args: Any, page_size: int = PAGE_SIZE, **kwargs: Any
    ) -> list[dict[str, Any]]:
        """Every item of a list call, page by page (``limit`` / ``continue``), as plain JSON dicts."""
        items: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            more = {"_continue": token} if token else {}
            data = to_json(await self.call(op, api_class, method, *args, limit=page_size, **more, **kwargs))
            items.extend(i for i in data.get("items") or () if isinstance(i, dict))
            token = (data.get("metadata") or {}).get("continue")
            if not token:
                return items


# ApiClient.sanitize_for_serialization needs nothing of an ApiClient but PRIMITIVE_TYPES (and itself, to
# recurse); an ApiClient proper would open an HTTP session just to convert a model.
_SANITIZE: Any = k8s.ApiClient.sanitize_for_serialization


class _Serializer:
    PRIMITIVE_TYPES = k8s.ApiClient.PRIMITIVE_TYPES
    sanitize_for_serialization = _SANITIZE


_SERIALIZER = _Serializer()


def to_json(obj: Any) -> Any:
    """A model object as the API's JSON (camelCase keys, no unset fields): how the rest of the code reads objects."""
    return _SANITIZE(_SERIALIZER, obj)


__all__ = [
    "ApiError",
    "InClusterConfig",
    "KubeClient",
    "KubeConfigError",
    "Op",
    "TokenSource",
    "service_account_dir",
    "ssl_context_for_bundle",
    "status_message",
    "to_json",
    "token_subject",
]
