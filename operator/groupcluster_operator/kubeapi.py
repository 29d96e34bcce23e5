"""A small asyncio client of the Kubernetes API (aiohttp): the few calls the operator makes itself.

kopf watches the GroupClusters and posts events; creating pods, services and RBAC objects, deleting pods and
patching annotations go through :class:`KubeApi`. The same credentials feed kopf's login handler
(:meth:`KubeApi.connection_info`), so the operator talks to one server with one identity.

Credentials, in this order: in a pod, the service account (``$GROUPCLUSTER_SA_DIR`` or the standard mount;
the token file is re-read every minute and after a 401, like the members' discovery); else a kubeconfig
(``--kubeconfig``, ``$KUBECONFIG`` or ``~/.kube/config``: its current context, with a bearer token or a
client certificate, and a CA file or inline CA data).
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import json
import os
import ssl
import tempfile
import urllib.parse
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from groupcluster.runtime.kube_discovery import (
    InClusterConfig,
    KubeConfigError,
    TokenSource,
    api_error_message,
    ssl_context_for_bundle,
)

REQUEST_TIMEOUT = 15.0


class ApiError(Exception):
    """An API call failed: ``status`` is the HTTP status (0: no answer), the message is the server's."""

    def __init__(self, status: int, message: str, *, method: str = "", path: str = "") -> None:
        super().__init__(f"{method} {path}: HTTP {status}: {message}" if method else message)
        self.status = status
        self.reason = message


class KubeApi:
    """Authenticated JSON requests to one API server."""

    def __init__(
        self,
        server: str,
        ssl_context: ssl.SSLContext | bool,
        *,
        tokens: TokenSource | None = None,
        static_token: str | None = None,
        namespace: str | None = None,
        ca_file: Path | None = None,
        ca_data: str | None = None,
        cert_file: str | None = None,
        key_file: str | None = None,
        cert_data: str | None = None,
        key_data: str | None = None,
    ) -> None:
        self.server = server.rstrip("/")
        self.ssl_context = ssl_context
        self.tokens = tokens
        self.static_token = static_token
        self.namespace = namespace
        self.ca_file = ca_file
        self.ca_data = ca_data
        self.cert_file = cert_file
        self.key_file = key_file
        self.cert_data = cert_data
        self.key_data = key_data
        self._session: aiohttp.ClientSession | None = None

    # -- construction ------------------------------------------------------------------------------------
    @classmethod
    def in_cluster(cls, env: Mapping[str, str] | None = None) -> KubeApi:
        cfg = InClusterConfig.from_env(env)
        return cls(
            cfg.server,
            ssl_context_for_bundle(cfg.ca_file),
            tokens=TokenSource(cfg.token_file),
            namespace=cfg.namespace,
            ca_file=cfg.ca_file,
        )

    @classmethod
    def from_kubeconfig(cls, path: str | Path | None = None, context: str | None = None) -> KubeApi:
        path = Path(path or os.environ.get("KUBECONFIG", "").split(os.pathsep)[0] or Path.home() / ".kube" / "config")
        try:
            cfg = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise KubeConfigError(f"kubeconfig {path}: {exc}") from None
        name = context or cfg.get("current-context")

        def pick(kind: str, wanted: str | None) -> dict[str, Any]:
            for entry in cfg.get(f"{kind}s") or ():
                if entry.get("name") == wanted:
                    return entry.get(kind) or {}
            raise KubeConfigError(f"kubeconfig {path}: no {kind} named {wanted!r}")

        ctx = pick("context", name)
        cluster = pick("cluster", ctx.get("cluster"))
        user = pick("user", ctx.get("user"))
        base = path.parent

        def file_or_data(key: str, entry: Mapping[str, Any]) -> tuple[str | None, str | None]:
            if entry.get(f"{key}-data"):
                return None, base64.b64decode(entry[f"{key}-data"]).decode()
            if entry.get(key):
                return str(base / entry[key]), None
            return None, None

        ca_path, ca_pem = file_or_data("certificate-authority", cluster)
        if cluster.get("insecure-skip-tls-verify"):
            ctx_ssl = ssl.create_default_context()
            ctx_ssl.check_hostname = False
            ctx_ssl.verify_mode = ssl.CERT_NONE
        elif ca_path:
            ctx_ssl = ssl_context_for_bundle(Path(ca_path))
        else:
            ctx_ssl = ssl.create_default_context(cadata=ca_pem) if ca_pem else ssl.create_default_context()
        cert_path, cert_pem = file_or_data("client-certificate", user)
        key_path, key_pem = file_or_data("client-key", user)
        if user.get("exec") or user.get("auth-provider"):
            raise KubeConfigError(f"kubeconfig {path}: exec and auth-provider users are not supported; use a token")
        if cert_path or cert_pem:
            with _materialized(cert_path, cert_pem) as c, _materialized(key_path, key_pem) as k:
                ctx_ssl.load_cert_chain(c, k)
        token = user.get("token")
        if not token and user.get("tokenFile"):
            token = Path(base / user["tokenFile"]).read_text(encoding="utf-8").strip()
        server = cluster.get("server")
        if not server:
            raise KubeConfigError(f"kubeconfig {path}: cluster {ctx.get('cluster')!r} has no server")
        return cls(
            server,
            ctx_ssl,
            static_token=token,
            namespace=ctx.get("namespace") or "default",
            ca_file=Path(ca_path) if ca_path else None,
            ca_data=ca_pem,
            cert_file=cert_path,
            key_file=key_path,
            cert_data=cert_pem,
            key_data=key_pem,
        )

    @classmethod
    def auto(cls, kubeconfig: str | None = None) -> KubeApi:
        """In-cluster credentials when running in a pod (and no kubeconfig was named), else the kubeconfig."""
        if not kubeconfig and os.environ.get("KUBERNETES_SERVICE_HOST"):
            return cls.in_cluster()
        return cls.from_kubeconfig(kubeconfig)

    def connection_info(self) -> Any:
        """kopf's ConnectionInfo for these credentials; it expires in a minute so kopf re-reads the token."""
        import kopf

        token = self.tokens.get() if self.tokens is not None else self.static_token
        expiration = None
        if self.tokens is not None:
            expiration = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=self.tokens.max_age)
        return kopf.ConnectionInfo(
            server=self.server,
            ca_path=str(self.ca_file) if self.ca_file else None,
            ca_data=self.ca_data if not self.ca_file else None,
            insecure=self.ssl_context is not True and getattr(self.ssl_context, "verify_mode", None) == ssl.CERT_NONE,
            scheme="Bearer" if token else None,
            token=token,
            certificate_path=self.cert_file,
            certificate_data=self.cert_data,
            private_key_path=self.key_file,
            private_key_data=self.key_data,
            default_namespace=self.namespace,
            expiration=expiration,
        )

    # -- requests ---------------------------------------------------------------------------------------
    async def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(ssl=self.ssl_context),
                timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT),
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _token(self) -> str | None:
        return self.tokens.get() if self.tokens is not None else self.static_token

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        params: Mapping[str, str] | None = None,
        content_type: str = "application/json",
    ) -> Any:
        """One call; returns the decoded JSON answer. A 401 re-reads the token and retries once."""
        session = await self._client()
        url = self.server + path + (f"?{urllib.parse.urlencode(params)}" if params else "")
        data = None if body is None else json.dumps(body)
        for attempt in (1, 2):
            headers = {"Accept": "application/json"}
            if data is not None:
                headers["Content-Type"] = content_type
            token = self._token()
            if token:
                headers["Authorization"] = f"Bearer {token}"
            try:
                async with session.request(method, url, data=data, headers=headers) as resp:
                    raw = await resp.read()
                    if resp.status == 401 and attempt == 1 and self.tokens is not None:
                        self.tokens.invalidate()
                        continue
                    if resp.status >= 400:
                        raise ApiError(resp.status, api_error_message(raw), method=method, path=path)
                    return json.loads(raw) if raw else None
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                raise ApiError(0, f"{type(exc).__name__}: {exc}", method=method, path=path) from None
        raise AssertionError("unreachable")  # pragma: no cover

    # -- helpers ----------------------------------------------------------------------------------------
    @staticmethod
    def path_of(manifest: Mapping[str, Any], name: str | None = None) -> str:
        """The collection path of a manifest's kind (``name`` appended for one object)."""
        api_version = manifest["apiVersion"]
        kind = manifest["kind"]
        ns = manifest["metadata"].get("namespace")
        prefix = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
        plural = PLURALS.get(kind)
        if plural is None:
            raise ValueError(f"kubeapi: unknown kind {kind!r}")
        path = f"{prefix}/namespaces/{ns}/{plural}" if ns else f"{prefix}/{plural}"
        return f"{path}/{name}" if name else path

    async def create(self, manifest: Mapping[str, Any]) -> Any:
        return await self.request("POST", self.path_of(manifest), body=manifest)

    async def get(self, manifest: Mapping[str, Any]) -> Any | None:
        try:
            return await self.request("GET", self.path_of(manifest, manifest["metadata"]["name"]))
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    async def ensure(self, manifest: Mapping[str, Any]) -> bool:
        """Create the object unless it exists; returns True if it was created."""
        if await self.get(manifest) is not None:
            return False
        try:
            await self.create(manifest)
        except ApiError as exc:
            if exc.status == 409:  # created meanwhile (another reconciliation, or an operator restart)
                return False
            raise
        return True

    async def merge_patch(self, manifest: Mapping[str, Any], patch: Mapping[str, Any]) -> Any:
        return await self.request(
            "PATCH",
            self.path_of(manifest, manifest["metadata"]["name"]),
            body=patch,
            content_type="application/merge-patch+json",
        )

    async def delete(self, manifest: Mapping[str, Any]) -> bool:
        """Delete the object (in the background); returns False when it was already gone."""
        body = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"}
        try:
            await self.request("DELETE", self.path_of(manifest, manifest["metadata"]["name"]), body=body)
        except ApiError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    async def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        data = await self.request("GET", f"/api/v1/namespaces/{namespace}/pods", params={"labelSelector": selector})
        return list((data or {}).get("items") or [])

    async def delete_pod(self, namespace: str, name: str, grace_seconds: int | None = None) -> None:
        body: dict[str, Any] = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"}
        if grace_seconds is not None:
            body["gracePeriodSeconds"] = grace_seconds
        try:
            await self.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}", body=body)
        except ApiError as exc:
            if exc.status != 404:
                raise


PLURALS = {
    "Pod": "pods",
    "Service": "services",
    "ServiceAccount": "serviceaccounts",
    "Role": "roles",
    "RoleBinding": "rolebindings",
    "PodDisruptionBudget": "poddisruptionbudgets",
    "GroupCluster": "groupclusters",
    "Event": "events",
    "Secret": "secrets",
    "KopfPeering": "kopfpeerings",
    "ClusterKopfPeering": "clusterkopfpeerings",
}


@contextlib.contextmanager
def _materialized(path: str | None, pem: str | None) -> Any:
    """A file path for PEM data (``ssl`` loads client certificates from files only); removed afterwards."""
    if path or pem is None:
        yield path
        return
    fd, tmp = tempfile.mkstemp(suffix=".pem")
    try:
        with os.fdopen(fd, "w", encoding="ascii") as fh:
            fh.write(pem)
        yield tmp
    finally:
        os.unlink(tmp)
