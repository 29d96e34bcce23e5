"""The operator's own calls to the Kubernetes API, through the official asyncio client (``kubernetes_asyncio``).

kopf watches the GroupClusters and posts events; creating pods, services, secrets and RBAC objects, deleting
pods, patching annotations, and the start-up and hand-over calls go through :class:`KubeApi`. The same
credentials feed kopf's login handler (:meth:`KubeApi.connection_info`), so the operator talks to one server
with one identity.

Credentials (:class:`groupcluster.runtime.kube_client.KubeClient`): in a pod, the service account (the token
file is re-read every minute and after a 401); else a kubeconfig (``--kubeconfig``, ``$KUBECONFIG`` or
``~/.kube/config``, its current context) with any credential the official client supports: a token or token
file, a client certificate, an ``exec`` plugin (EKS, GKE, AKS with kubelogin) or the ``gcp`` and ``oidc``
auth-providers. Failures raise :class:`ApiError`, whose message names the call (and for a 403 the RBAC rule).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from groupcluster.runtime.kube_client import ApiError, KubeClient, Op, to_json
from kubernetes_asyncio.client import (
    AppsV1Api,
    CoreV1Api,
    CustomObjectsApi,
    PolicyV1Api,
    RbacAuthorizationV1Api,
)

from .model import GROUP, PLURAL, VERSION

__all__ = ["ApiError", "KubeApi"]

MERGE_PATCH = "application/merge-patch+json"


# kind -> (API class, the method name's suffix, plural, API group): the kinds the operator creates.
KINDS: dict[str, tuple[type, str, str, str]] = {
    "Pod": (CoreV1Api, "namespaced_pod", "pods", ""),
    "Service": (CoreV1Api, "namespaced_service", "services", ""),
    "ServiceAccount": (CoreV1Api, "namespaced_service_account", "serviceaccounts", ""),
    "Secret": (CoreV1Api, "namespaced_secret", "secrets", ""),
    "Role": (RbacAuthorizationV1Api, "namespaced_role", "roles", "rbac.authorization.k8s.io"),
    "RoleBinding": (RbacAuthorizationV1Api, "namespaced_role_binding", "rolebindings", "rbac.authorization.k8s.io"),
    "PodDisruptionBudget": (PolicyV1Api, "namespaced_pod_disruption_budget", "poddisruptionbudgets", "policy"),
}

# kind -> (API group, version, plural, namespaced): custom objects the operator makes (kopf's peering objects).
CUSTOM_KINDS: dict[str, tuple[str, str, str, bool]] = {
    "KopfPeering": ("kopf.dev", "v1", "kopfpeerings", True),
    "ClusterKopfPeering": ("kopf.dev", "v1", "clusterkopfpeerings", False),
}


class KubeApi:
    """The operator's calls, on one :class:`KubeClient`; objects go in and come out as JSON dicts."""

    def __init__(self, client: KubeClient) -> None:
        self.client = client

    # -- construction ------------------------------------------------------------------------------------
    @classmethod
    async def auto(cls, kubeconfig: str | Path | None = None) -> KubeApi:
        """In-cluster credentials when running in a pod (and no kubeconfig was named), else the kubeconfig."""
        return cls(await KubeClient.auto(kubeconfig))

    @property
    def server(self) -> str:
        return self.client.server

    @property
    def namespace(self) -> str:
        return self.client.namespace

    async def connection_info(self, *, renew: bool = False) -> Any:
        """kopf's ConnectionInfo for the same credentials, with their expiry so that kopf asks again in time.

        ``renew``: get a fresh credential first (kopf asks again only when the one it had expired or was
        refused, and it never uses a refused one again).
        """
        import kopf

        if renew:
            self.client.renew()
        conf = self.client.configuration
        token = await self.client.current_token()
        return kopf.ConnectionInfo(
            server=self.client.server,
            ca_path=conf.ssl_ca_cert or None,
            insecure=not conf.verify_ssl,
            scheme="Bearer" if token else None,
            token=token or None,
            certificate_path=conf.cert_file or None,
            private_key_path=conf.key_file or None,
            default_namespace=self.client.namespace,
            expiration=await self.client.expiration(),
        )

    async def close(self) -> None:
        await self.client.close()

    # -- objects the operator creates -------------------------------------------------------------------
    @staticmethod
    def _kind(manifest: Mapping[str, Any]) -> tuple[type, str, str, str]:
        kind = manifest["kind"]
        if kind not in KINDS:
            raise ValueError(f"kubeapi: unknown kind {kind!r}")
        return KINDS[kind]

    async def _on(self, verb: str, manifest: Mapping[str, Any], **kwargs: Any) -> Any:
        if manifest["kind"] in CUSTOM_KINDS:
            return await self._on_custom(verb, manifest, **kwargs)
        api_class, suffix, plural, group = self._kind(manifest)
        namespace = manifest["metadata"]["namespace"]
        method = {"get": "read", "patch": "patch", "create": "create", "delete": "delete"}[verb]
        op = Op(verb, plural, namespace, group)
        return await self.client.call(op, api_class, f"{method}_{suffix}", namespace=namespace, **kwargs)

    async def _on_custom(self, verb: str, manifest: Mapping[str, Any], **kwargs: Any) -> Any:
        group, version, plural, namespaced = CUSTOM_KINDS[manifest["kind"]]
        namespace = manifest["metadata"].get("namespace") if namespaced else None
        scope = "namespaced" if namespaced else "cluster"
        method = f"{verb}_{scope}_custom_object"  # get, create, patch, delete
        where = (group, version, namespace, plural) if namespaced else (group, version, plural)
        if "name" in kwargs:
            where = (*where, kwargs.pop("name"))
        if "body" in kwargs:
            where = (*where, kwargs.pop("body"))
        return await self.client.call(Op(verb, plural, namespace, group), CustomObjectsApi, method, *where, **kwargs)

    async def create(self, manifest: Mapping[str, Any]) -> dict[str, Any]:
        return to_json(await self._on("create", manifest, body=dict(manifest)))

    async def get(self, manifest: Mapping[str, Any]) -> dict[str, Any] | None:
        """The object named by ``manifest`` (kind, name, namespace) as it is now, or None if it does not exist."""
        try:
            return to_json(await self._on("get", manifest, name=manifest["metadata"]["name"]))
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

    async def merge_patch(self, manifest: Mapping[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
        name = manifest["metadata"]["name"]
        return to_json(await self._on("patch", manifest, name=name, body=dict(patch), _content_type=MERGE_PATCH))

    async def delete(self, manifest: Mapping[str, Any]) -> bool:
        """Delete the object (in the background); returns False when it was already gone."""
        try:
            await self._on("delete", manifest, name=manifest["metadata"]["name"], propagation_policy="Background")
        except ApiError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    async def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        op = Op("list", "pods", namespace)
        return await self.client.list_all(op, CoreV1Api, "list_namespaced_pod", namespace, label_selector=selector)

    async def delete_pod(self, namespace: str, name: str, grace_seconds: int | None = None) -> None:
        """Delete a pod (gone already is fine), with ``grace_seconds`` instead of its own grace period."""
        kwargs: dict[str, Any] = {"propagation_policy": "Background"}
        if grace_seconds is not None:
            kwargs["grace_period_seconds"] = grace_seconds
        try:
            await self.client.call(
                Op("delete", "pods", namespace), CoreV1Api, "delete_namespaced_pod", name, namespace, **kwargs
            )
        except ApiError as exc:
            if exc.status != 404:
                raise

    # -- GroupClusters ----------------------------------------------------------------------------------
    async def served_resources(self, group: str = GROUP, version: str = VERSION) -> list[str]:
        """The resource names the API server serves in an API group and version (default: the GroupCluster's)."""
        op = Op("get", f"the API discovery of {group}/{version}")
        found = to_json(await self.client.call(op, CustomObjectsApi, "get_api_resources", group, version))
        return [str(r.get("name")) for r in (found or {}).get("resources") or ()]

    async def list_groupclusters(self, namespace: str | None, limit: int | None = None) -> list[dict[str, Any]]:
        """GroupClusters in ``namespace`` (None: every namespace); ``limit``: one page of at most that many."""
        op = Op("list", PLURAL, namespace, GROUP)
        args: Sequence[Any]
        if namespace is None:
            method, args = "list_cluster_custom_object", (GROUP, VERSION, PLURAL)
        else:
            method, args = "list_namespaced_custom_object", (GROUP, VERSION, namespace, PLURAL)
        if limit is not None:
            page = await self.client.call(op, CustomObjectsApi, method, *args, limit=limit)
            return list((page or {}).get("items") or [])
        return await self.client.list_all(op, CustomObjectsApi, method, *args)

    async def json_patch_groupcluster(self, namespace: str, name: str, patch: list[dict[str, Any]]) -> Any:
        """A JSON patch (a list of operations; the client sends it as ``application/json-patch+json``)."""
        op = Op("patch", PLURAL, namespace, GROUP)
        return await self.client.call(
            op, CustomObjectsApi, "patch_namespaced_custom_object", GROUP, VERSION, namespace, PLURAL, name, patch
        )

    # -- the operator's own Deployment (hand-over) ----------------------------------------------------------
    async def read_deployment(self, namespace: str, name: str) -> dict[str, Any]:
        op = Op("get", "deployments", namespace, "apps")
        return to_json(await self.client.call(op, AppsV1Api, "read_namespaced_deployment", name, namespace))

    async def scale_deployment(self, namespace: str, name: str, replicas: int) -> None:
        op = Op("patch", "deployments/scale", namespace, "apps")
        body = {"spec": {"replicas": replicas}}
        await self.client.call(
            op, AppsV1Api, "patch_namespaced_deployment_scale", name, namespace, body, _content_type=MERGE_PATCH
        )
