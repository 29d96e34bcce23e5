"""The operator's API calls through the official client, against a stand-in API server (plain HTTP on 127.0.0.1).

The operator logs in with a kubeconfig whose user is an ``exec`` plugin (tests/e2e/exec_credential.py, in the
manner of ``aws eks get-token``): the calls must carry its token, renew it after a 401 and before it
expires, and every call must reach the path, method and content type the API defines.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web
from groupcluster.runtime.kube_client import ApiError, KubeClient, KubeConfigError
from groupcluster_operator.kubeapi import KubeApi
from groupcluster_operator.release import FINALIZER, release_finalizers, stop_deployment

PLUGIN = Path(__file__).resolve().parents[1] / "e2e" / "exec_credential.py"


class FakeServer:
    """Records (method, path, query, content type, token, body); answers from a few dicts."""

    def __init__(self) -> None:
        self.tokens = {"token-a"}
        self.forbid: set[str] = set()  # paths answered 403
        self.pods = [
            {"metadata": {"name": f"p{i}", "namespace": "shop"}, "status": {"podIP": f"10.0.0.{i}"}} for i in range(5)
        ]
        self.requests: list[dict[str, Any]] = []

    async def handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        token = request.headers.get("Authorization", "").removeprefix("Bearer ")
        rec = {
            "method": request.method,
            "path": request.path,
            "query": dict(request.query),
            "type": request.headers.get("Content-Type", ""),
            "token": token,
            "body": json.loads(raw) if raw else None,
        }
        self.requests.append(rec)
        if token not in self.tokens:
            return web.json_response({"kind": "Status", "code": 401, "message": "Unauthorized"}, status=401)
        if request.path in self.forbid:
            msg = f'pods is forbidden: User "alice" cannot {request.method.lower()} resource "pods"'
            return web.json_response({"kind": "Status", "code": 403, "message": msg}, status=403)
        path = request.path
        if path == "/api/v1/namespaces/shop/pods" and request.method == "GET":
            # Two items per page at most, whatever was asked: the client must follow `continue`.
            start = int(request.query.get("continue") or 0)
            limit = min(int(request.query.get("limit") or 100), 2)
            page = self.pods[start : start + limit]
            more = start + limit < len(self.pods)
            meta = {"continue": str(start + limit)} if more else {}
            return web.json_response({"kind": "PodList", "apiVersion": "v1", "metadata": meta, "items": page})
        if path == "/api/v1/namespaces/shop/pods" and request.method == "POST":
            return web.json_response(rec["body"], status=201)
        if path == "/api/v1/namespaces/shop/secrets/gone":
            return web.json_response({"kind": "Status", "code": 404, "message": "not found"}, status=404)
        if path.startswith("/api/v1/namespaces/shop/pods/"):
            name = path.rsplit("/", 1)[1]
            return web.json_response({"kind": "Pod", "apiVersion": "v1", "metadata": {"name": name}})
        if path == "/apis/groupcluster.io/v1alpha1/namespaces/shop/groupclusters":
            item = {"metadata": {"namespace": "shop", "name": "orders", "finalizers": ["keep.io/x", FINALIZER]}}
            return web.json_response(
                {"apiVersion": "groupcluster.io/v1alpha1", "kind": "GroupClusterList", "items": [item]}
            )
        if path.startswith("/apis/groupcluster.io/v1alpha1/namespaces/shop/groupclusters/"):
            return web.json_response({"metadata": {"name": path.rsplit("/", 1)[1]}})
        if path == "/apis/apps/v1/namespaces/ops/deployments/gco":
            return web.json_response(
                {
                    "kind": "Deployment",
                    "apiVersion": "apps/v1",
                    "metadata": {"name": "gco"},
                    "spec": {"selector": {"matchLabels": {"app": "op"}}, "template": {}},
                }
            )
        if path == "/apis/apps/v1/namespaces/ops/deployments/gco/scale":
            return web.json_response({"kind": "Scale", "apiVersion": "autoscaling/v1", "spec": {"replicas": 0}})
        if path == "/api/v1/namespaces/ops/pods":
            return web.json_response({"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": []})
        return web.json_response({"kind": "Status", "code": 404, "message": f"{path} not found"}, status=404)


@contextlib.asynccontextmanager
async def serve() -> AsyncIterator[tuple[FakeServer, str]]:
    fake = FakeServer()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", fake.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield fake, f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def exec_kubeconfig(tmp_path: Path, server: str, *, ttl: float | None = None) -> tuple[Path, Path, Path]:
    """A kubeconfig whose user runs the test exec plugin; returns (kubeconfig, token file, plugin run log)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    token_file, log = tmp_path / "token", tmp_path / "plugin.log"
    token_file.write_text("token-a\n")
    env = [{"name": "TEST_EXEC_TOKEN_FILE", "value": str(token_file)}, {"name": "TEST_EXEC_LOG", "value": str(log)}]
    if ttl is not None:
        env.append({"name": "TEST_EXEC_TTL", "value": str(ttl)})
    cfg = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": server}}],
        "users": [
            {
                "name": "u",
                "user": {
                    "exec": {
                        "apiVersion": "client.authentication.k8s.io/v1",
                        "command": sys.executable,
                        "args": [str(PLUGIN)],
                        "env": env,
                        "interactiveMode": "Never",
                    }
                },
            }
        ],
        "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u", "namespace": "shop"}}],
        "current-context": "ctx",
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(cfg))
    return path, token_file, log


def runs(log: Path) -> int:
    return len(log.read_text().splitlines()) if log.exists() else 0


def test_calls_reach_the_api_with_the_exec_token_and_lists_are_paged(tmp_path: Path) -> None:
    async def body() -> None:
        async with serve() as (fake, server):
            kubeconfig, _, log = exec_kubeconfig(tmp_path, server)
            api = await KubeApi.auto(str(kubeconfig))
            try:
                assert api.namespace == "shop" and api.server == server
                pods = await api.list_pods("shop", "groupcluster.io/cluster=orders")
                assert [p["metadata"]["name"] for p in pods] == ["p0", "p1", "p2", "p3", "p4"]
                lists = [r for r in fake.requests if r["path"] == "/api/v1/namespaces/shop/pods"]
                assert [r["query"].get("continue") for r in lists] == [None, "2", "4"]
                assert {r["query"]["labelSelector"] for r in lists} == {"groupcluster.io/cluster=orders"}
                assert {r["token"] for r in fake.requests} == {"token-a"}

                pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "orders-1", "namespace": "shop"}}
                created = await api.create(pod)
                assert created["metadata"]["name"] == "orders-1"
                assert fake.requests[-1]["body"] == pod and fake.requests[-1]["method"] == "POST"
                await api.merge_patch(pod, {"metadata": {"annotations": {"a": "b"}}})
                assert fake.requests[-1]["type"] == "application/merge-patch+json"
                assert fake.requests[-1]["path"] == "/api/v1/namespaces/shop/pods/orders-1"
                await api.delete_pod("shop", "orders-1", 5)
                assert fake.requests[-1]["method"] == "DELETE"
                assert fake.requests[-1]["query"].get("gracePeriodSeconds") == "5"
                secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "gone", "namespace": "shop"}}
                assert await api.get(secret) is None

                assert await release_finalizers(api, ["shop"]) == ["shop/orders"]  # type: ignore[arg-type]
                patch = fake.requests[-1]
                assert patch["type"] == "application/json-patch+json"
                assert patch["body"][1] == {"op": "remove", "path": "/metadata/finalizers/1"}
                assert await stop_deployment(api, "ops", "gco", timeout=5)  # type: ignore[arg-type]
                scale = next(r for r in fake.requests if r["path"].endswith("/scale"))
                assert scale["body"] == {"spec": {"replicas": 0}} and scale["type"] == "application/merge-patch+json"
            finally:
                await api.close()
            assert runs(log) == 1  # no expiry given: the credential is kept until the server refuses it

    asyncio.run(body())


def test_a_401_runs_the_exec_plugin_again_and_retries(tmp_path: Path) -> None:
    async def body() -> None:
        async with serve() as (fake, server):
            kubeconfig, token_file, log = exec_kubeconfig(tmp_path, server)
            api = await KubeApi.auto(str(kubeconfig))
            try:
                await api.list_pods("shop", "")
                # The identity provider rotated the credential: the old token is refused from now on.
                token_file.write_text("token-b\n")
                fake.tokens = {"token-b"}
                assert len(await api.list_pods("shop", "")) == 5
                info = await api.connection_info()
                assert info.token == "token-b" and info.scheme == "Bearer"
                # kopf logs in again only after a 401 (or an expiry) of its own: that asks the plugin anew.
                token_file.write_text("token-d\n")
                assert (await api.connection_info(renew=True)).token == "token-d"
            finally:
                await api.close()
            tokens = [r["token"] for r in fake.requests]
            assert tokens[:4] == ["token-a"] * 3 + ["token-a"] and tokens[4:] == ["token-b"] * 3
            assert runs(log) == 3

    asyncio.run(body())


def test_an_expiring_exec_credential_is_renewed_before_it_expires(tmp_path: Path) -> None:
    async def body(ttl: float) -> tuple[str, Any, int]:
        async with serve() as (_, server):
            kubeconfig, token_file, log = exec_kubeconfig(tmp_path / str(ttl), server, ttl=ttl)
            api = await KubeApi.auto(str(kubeconfig))
            try:
                token_file.write_text("token-c\n")
                info = await api.connection_info()
            finally:
                await api.close()
            return info.token, info.expiration, runs(log)

    # Valid for an hour: kept, and kopf is told when to log in again.
    token, expiration, plugin_runs = asyncio.run(body(3600))
    assert (token, plugin_runs) == ("token-a", 1)
    left = (expiration - datetime.datetime.now(datetime.UTC)).total_seconds()
    assert 3500 < left < 3600
    # Valid for 20 s, less than the renewal margin: the next use runs the plugin again.
    token, _, plugin_runs = asyncio.run(body(20))
    assert (token, plugin_runs) == ("token-c", 2)


def test_a_403_names_the_call_the_identity_and_the_rbac_rule(tmp_path: Path) -> None:
    async def body() -> None:
        async with serve() as (fake, server):
            kubeconfig, _, _ = exec_kubeconfig(tmp_path, server)
            api = await KubeApi.auto(str(kubeconfig))
            fake.forbid.add("/api/v1/namespaces/shop/pods")
            try:
                with pytest.raises(ApiError) as err:
                    await api.list_pods("shop", "")
            finally:
                await api.close()
            text = str(err.value)
            assert err.value.status == 403
            assert "lacks the permission to list pods in namespace shop" in text
            assert "a Role in namespace shop with verbs [list] on resources [pods]" in text
            assert "user 'u' of kubeconfig" in text  # an opaque token: the kubeconfig's user names us
            assert 'User "alice" cannot' in text  # and what the server said

    asyncio.run(body())


def test_kubeconfig_problems_are_named(tmp_path: Path) -> None:
    async def body() -> None:
        with pytest.raises(KubeConfigError, match="no such file"):
            await KubeClient.from_kubeconfig(tmp_path / "missing")
        broken = tmp_path / "broken"
        broken.write_text(yaml.safe_dump({"current-context": "nope", "contexts": [], "clusters": [], "users": []}))
        with pytest.raises(KubeConfigError, match=str(broken)):
            await KubeClient.from_kubeconfig(broken)

    asyncio.run(body())


def test_a_kubeconfig_token_file_is_read_again_after_a_401(tmp_path: Path) -> None:
    async def body() -> None:
        async with serve() as (fake, server):
            token_file = tmp_path / "sa-token"
            token_file.write_text("token-a\n")
            cfg = {
                "clusters": [{"name": "c", "cluster": {"server": server}}],
                "users": [{"name": "u", "user": {"tokenFile": str(token_file)}}],
                "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "ctx",
            }
            kubeconfig = tmp_path / "kubeconfig"
            kubeconfig.write_text(yaml.safe_dump(cfg))
            api = await KubeApi.auto(str(kubeconfig))
            try:
                assert api.namespace == "default"
                await api.list_pods("shop", "")
                token_file.write_text("token-b\n")  # rotated by whoever manages the file
                fake.tokens = {"token-b"}
                assert len(await api.list_pods("shop", "")) == 5
            finally:
                await api.close()
            assert [r["token"] for r in fake.requests][3:] == ["token-a", "token-b", "token-b", "token-b"]

    asyncio.run(body())
