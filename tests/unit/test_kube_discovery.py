"""Kubernetes API discovery against a real local HTTPS server standing in for the API server.

The server is aiohttp on 127.0.0.1 with a certificate from a throw-away CA; the member trusts a bundle that
holds an unrelated CA first and ours second (KUBE_PING's users hit bundles with several certificates).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime
import ipaddress
import json
import logging
import os
import ssl
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from groupcluster.core.events import UpdateHosts
from groupcluster.runtime import kube_discovery as kd
from groupcluster.runtime.kube_discovery import (
    InClusterConfig,
    KubeConfigError,
    KubeDiscovery,
    KubeDiscoveryConfig,
    TokenSource,
    select_peers,
)


# -- certificates --------------------------------------------------------------------------------------------
def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _ca(cn: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(_name(cn))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def _pem(cert: x509.Certificate) -> str:
    return cert.public_bytes(serialization.Encoding.PEM).decode()


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("pki")
    other_key, other_ca = _ca("some other CA")
    ca_key, ca = _ca("test cluster CA")
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    server = (
        x509.CertificateBuilder()
        .subject_name(_name("kube-apiserver"))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    (d / "server.crt").write_text(_pem(server))
    (d / "server.key").write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    # A bundle whose FIRST certificate is not the one that signed the server: only loading all of them works.
    (d / "bundle.crt").write_text(_pem(other_ca) + _pem(ca))
    (d / "only-other.crt").write_text(_pem(other_ca))
    del other_key
    return {"dir": d}


# -- a stand-in API server -----------------------------------------------------------------------------------
def _jwt(sub: str) -> str:
    def b64(obj: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).decode().rstrip("=")

    return f"{b64({'alg': 'none'})}.{b64({'sub': sub})}.sig"


def _pod(name: str, ip: str | None, phase: str = "Running", cluster: str = "orders", port: int | None = None) -> dict:
    container: dict[str, Any] = {"name": "member"}
    if port is not None:
        container["ports"] = [{"name": "member", "containerPort": port}, {"name": "http", "containerPort": 8080}]
    status: dict[str, Any] = {"phase": phase}
    if ip:
        status["podIP"] = ip
    return {
        "metadata": {"name": name, "labels": {"groupcluster.io/cluster": cluster}},
        "spec": {"containers": [container]},
        "status": status,
    }


class FakeApi:
    """Records requests; answers pod lists for one namespace, 401 for tokens not (yet) accepted, or 403."""

    def __init__(self) -> None:
        self.valid_tokens = {"token-1"}
        self.forbid = False
        self.chunked = False  # answer in several chunks with pauses, as a real API server may
        self.page = 0  # > 0: at most this many pods per answer, the rest behind a `continue` token
        self.pods: list[dict[str, Any]] = []
        self.requests: list[tuple[str, str, str]] = []  # (path, selector, token)

    async def pods_handler(self, request: web.Request) -> web.StreamResponse:
        token = request.headers.get("Authorization", "").removeprefix("Bearer ")
        self.requests.append((request.path, request.query.get("labelSelector", ""), token))
        if token not in self.valid_tokens:
            return web.json_response({"kind": "Status", "message": "Unauthorized", "code": 401}, status=401)
        ns = request.match_info["ns"]
        if self.forbid:
            msg = (
                f'pods is forbidden: User "system:serviceaccount:{ns}:member" cannot list resource "pods" '
                f'in API group "" in the namespace "{ns}"'
            )
            return web.json_response({"kind": "Status", "message": msg, "code": 403}, status=403)
        if self.page:
            start = int(request.query.get("continue") or 0)
            end = start + min(self.page, int(request.query.get("limit") or self.page))
            meta = {"continue": str(end)} if end < len(self.pods) else {}
            return web.json_response({"kind": "PodList", "metadata": meta, "items": self.pods[start:end]})
        if not self.chunked:
            return web.json_response({"kind": "PodList", "items": self.pods})
        body = json.dumps({"kind": "PodList", "items": self.pods}).encode()
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        for start in range(0, len(body), 40):
            await resp.write(body[start : start + 40])
            await asyncio.sleep(0.01)  # the client sees the first chunk before the rest exists
        await resp.write_eof()
        return resp


@contextlib.asynccontextmanager
async def serve_api(pki: dict[str, Path]) -> AsyncIterator[tuple[FakeApi, str]]:
    fake = FakeApi()
    app = web.Application()
    app.router.add_get("/api/v1/namespaces/{ns}/pods", fake.pods_handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(pki["dir"] / "server.crt", pki["dir"] / "server.key")
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ctx)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield fake, f"https://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def _sa_dir(tmp_path: Path, pki: dict[str, Path], token: str = "token-1", bundle: str = "bundle.crt") -> Path:
    sa = tmp_path / "sa"
    sa.mkdir(exist_ok=True)
    (sa / "token").write_text(token + "\n")
    (sa / "namespace").write_text("prod\n")
    (sa / "ca.crt").write_text((pki["dir"] / bundle).read_text())
    return sa


def _discovery(
    server: str, sa: Path, updates: list[UpdateHosts], *, clock: Callable[[], float] | None = None, **cfg: Any
) -> KubeDiscovery:
    cluster = InClusterConfig(server=server, ca_file=sa / "ca.crt", token_file=sa / "token", namespace="prod")
    config = KubeDiscoveryConfig(
        selector="groupcluster.io/cluster=orders", required_labels={"groupcluster.io/cluster": "orders"}, **cfg
    )
    kwargs = {"clock": clock} if clock is not None else {}
    return KubeDiscovery(updates.append, ("10.0.0.1", 7800), config, cluster, **kwargs)


# -- pure logic ----------------------------------------------------------------------------------------------
def test_select_peers_keeps_pods_of_our_cluster_with_an_ip_and_not_finished() -> None:
    pods = {
        "items": [
            _pod("a", "10.0.0.1"),
            _pod("b", "10.0.0.2", phase="Pending"),  # starting: must be found to join
            _pod("c", None),  # no IP yet
            _pod("d", "10.0.0.4", phase="Succeeded"),  # left
            _pod("e", "10.0.0.5", phase="Failed"),
            _pod("f", "10.0.0.6", cluster="payments"),  # another cluster matched by a broad selector
            _pod("g", "10.0.0.7", port=7900),  # declares its member port
            "not a pod",
        ]
    }
    got = select_peers(pods, default_port=7800, required_labels={"groupcluster.io/cluster": "orders"})
    assert got == (("10.0.0.1", 7800), ("10.0.0.2", 7800), ("10.0.0.7", 7900))


def test_select_peers_rejects_an_answer_without_items() -> None:
    with pytest.raises(ValueError, match="items"):
        select_peers({"kind": "Status"}, default_port=7800)


def test_token_source_rereads_after_max_age_and_after_invalidate(tmp_path: Path) -> None:
    now = [0.0]
    path = tmp_path / "token"
    path.write_text("one\n")
    src = TokenSource(path, max_age=60, clock=lambda: now[0])
    assert src.get() == "one"
    path.write_text("two\n")
    now[0] = 59.0
    assert src.get() == "one"  # cached within the minute
    now[0] = 60.0
    assert src.get() == "two"
    path.write_text("three\n")
    src.invalidate()
    assert src.get() == "three"
    path.write_text("")
    src.invalidate()
    with pytest.raises(KubeConfigError, match="empty"):
        src.get()


def test_in_cluster_config_reads_the_sa_dir_from_the_environment(tmp_path: Path, pki: dict[str, Path]) -> None:
    sa = _sa_dir(tmp_path, pki)
    env = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": "6443", "GROUPCLUSTER_SA_DIR": str(sa)}
    cfg = InClusterConfig.from_env(env)
    assert cfg.server == "https://127.0.0.1:6443"
    assert cfg.namespace == "prod" and cfg.token_file == sa / "token" and cfg.ca_file == sa / "ca.crt"
    with pytest.raises(KubeConfigError, match="KUBERNETES_SERVICE_HOST"):
        InClusterConfig.from_env({"GROUPCLUSTER_SA_DIR": str(sa)})
    with pytest.raises(KubeConfigError, match="namespace file"):
        InClusterConfig.from_env({**env, "GROUPCLUSTER_SA_DIR": str(tmp_path / "missing")})


def test_a_ca_bundle_without_certificates_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "ca.crt"
    bad.write_text("hello\n")
    with pytest.raises(KubeConfigError, match="no PEM certificate"):
        kd.ssl_context_for_bundle(bad)


def test_selector_terms_and_token_subject() -> None:
    assert kd.parse_selector_labels("a=b, c==d,e!=f,g in (h)") == {"a": "b", "c": "d"}
    assert kd.token_subject(_jwt("system:serviceaccount:prod:member")) == "system:serviceaccount:prod:member"
    assert kd.token_subject("opaque") is None


# -- against the HTTPS stand-in -------------------------------------------------------------------------------
def test_lists_pods_through_a_ca_bundle_and_feeds_update_hosts(tmp_path: Path, pki: dict[str, Path]) -> None:
    async def body() -> None:
        async with serve_api(pki) as api:
            fake, server = api
            fake.pods = [_pod("a", "10.0.0.1"), _pod("b", "10.0.0.2"), _pod("x", "10.0.0.9", cluster="other")]
            updates: list[UpdateHosts] = []
            disc = _discovery(server, _sa_dir(tmp_path, pki), updates)
            try:
                assert await disc.poll() is True
                assert updates == [UpdateHosts((("10.0.0.1", 7800), ("10.0.0.2", 7800)))]
                assert await disc.poll() is False  # unchanged: nothing new for the stack
                fake.pods.append(_pod("c", "10.0.0.3"))
                assert await disc.poll() is True
                assert updates[-1].hosts[-1] == ("10.0.0.3", 7800)
            finally:
                await disc.aclose()
            path, selector, token = fake.requests[0]
            assert path == "/api/v1/namespaces/prod/pods"
            assert selector == "groupcluster.io/cluster=orders"
            assert token == "token-1"

    asyncio.run(body())


def test_a_pod_list_answered_in_chunks_is_read_to_its_end(tmp_path: Path, pki: dict[str, Path]) -> None:
    # A CI run saw "the pod list is not JSON" from a real API server: only the first chunk had been read.
    async def body() -> None:
        async with serve_api(pki) as api:
            fake, server = api
            fake.chunked = True
            fake.pods = [_pod(f"p{i}", f"10.0.0.{i}") for i in range(1, 6)]
            updates: list[UpdateHosts] = []
            disc = _discovery(server, _sa_dir(tmp_path, pki), updates)
            try:
                assert await disc.poll() is True
            finally:
                await disc.aclose()
            assert disc.failures == 0
            assert [h for h, _ in updates[-1].hosts] == [f"10.0.0.{i}" for i in range(1, 6)]

    asyncio.run(body())


def test_a_pod_list_in_pages_is_followed_to_its_last_page(tmp_path: Path, pki: dict[str, Path]) -> None:
    async def body() -> None:
        async with serve_api(pki) as api:
            fake, server = api
            fake.page = 2
            fake.pods = [_pod(f"p{i}", f"10.0.0.{i}") for i in range(1, 6)]
            updates: list[UpdateHosts] = []
            disc = _discovery(server, _sa_dir(tmp_path, pki), updates)
            try:
                assert await disc.poll() is True
            finally:
                await disc.aclose()
            assert [h for h, _ in updates[-1].hosts] == [f"10.0.0.{i}" for i in range(1, 6)]
            assert len(fake.requests) == 3  # three pages, each with the selector
            assert {sel for _, sel, _ in fake.requests} == {"groupcluster.io/cluster=orders"}

    asyncio.run(body())


def test_a_ca_bundle_rotated_in_place_is_trusted_as_it_is_now(tmp_path: Path, pki: dict[str, Path]) -> None:
    async def body() -> None:
        async with serve_api(pki) as api:
            fake, server = api
            fake.pods = [_pod("b", "10.0.0.2")]
            sa = _sa_dir(tmp_path, pki, bundle="only-other.crt")
            disc = _discovery(server, sa, [])
            try:
                assert await disc.poll() is False and disc.failures == 1
                (sa / "ca.crt").write_text((pki["dir"] / "bundle.crt").read_text())
                os.utime(sa / "ca.crt", (1, 1))  # a different mtime even on a coarse clock
                assert await disc.poll() is True and disc.failures == 1
            finally:
                await disc.aclose()

    asyncio.run(body())


def test_a_bundle_without_the_signing_ca_fails_tls_and_is_logged(
    tmp_path: Path, pki: dict[str, Path], caplog: pytest.LogCaptureFixture
) -> None:
    async def body() -> None:
        async with serve_api(pki) as api:
            _, server = api
            updates: list[UpdateHosts] = []
            disc = _discovery(server, _sa_dir(tmp_path, pki, bundle="only-other.crt"), updates)
            try:
                with caplog.at_level(logging.WARNING, logger="groupcluster.runtime.kube_discovery"):
                    assert await disc.poll() is False
            finally:
                await disc.aclose()
            assert updates == []
            assert "listing pods" in caplog.text and "certificate" in caplog.text.lower()

    asyncio.run(body())


def test_a_401_rereads_the_token_file_and_retries(tmp_path: Path, pki: dict[str, Path]) -> None:
    async def body() -> None:
        async with serve_api(pki) as api:
            fake, server = api
            fake.pods = [_pod("a", "10.0.0.1"), _pod("b", "10.0.0.2")]
            sa = _sa_dir(tmp_path, pki)
            updates: list[UpdateHosts] = []
            disc = _discovery(server, sa, updates)
            try:
                assert await disc.poll() is True
                # The kubelet rotated the bound token and the server stopped accepting the old one.
                (sa / "token").write_text("token-2\n")
                fake.valid_tokens = {"token-2"}
                fake.pods.append(_pod("c", "10.0.0.3"))
                assert await disc.poll() is True  # within the minute: only the 401 can have made it re-read
            finally:
                await disc.aclose()
            assert [t for _, _, t in fake.requests] == ["token-1", "token-1", "token-2"]
            assert disc.tokens.reads == 2 and disc.failures == 0

    asyncio.run(body())


def test_the_token_is_reread_every_minute(tmp_path: Path, pki: dict[str, Path]) -> None:
    async def body() -> None:
        async with serve_api(pki) as api:
            fake, server = api
            fake.valid_tokens = {"token-1", "token-2"}
            fake.pods = [_pod("b", "10.0.0.2")]
            now = [1000.0]
            sa = _sa_dir(tmp_path, pki)
            disc = _discovery(server, sa, [], clock=lambda: now[0])
            try:
                await disc.poll()
                (sa / "token").write_text("token-2\n")
                now[0] += 30
                await disc.poll()
                now[0] += 31
                await disc.poll()
            finally:
                await disc.aclose()
            assert [t for _, _, t in fake.requests] == ["token-1", "token-1", "token-2"]

    asyncio.run(body())


def test_a_403_names_the_missing_permission_and_discovery_recovers(
    tmp_path: Path, pki: dict[str, Path], caplog: pytest.LogCaptureFixture
) -> None:
    async def body() -> None:
        async with serve_api(pki) as api:
            fake, server = api
            token = _jwt("system:serviceaccount:prod:member")
            fake.valid_tokens = {token}
            fake.forbid = True
            fake.pods = [_pod("b", "10.0.0.2")]
            updates: list[UpdateHosts] = []
            disc = _discovery(server, _sa_dir(tmp_path, pki, token=token), updates)
            try:
                with caplog.at_level(logging.ERROR, logger="groupcluster.runtime.kube_discovery"):
                    assert await disc.poll() is False
                    assert await disc.poll() is False
                errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
                assert len(errors) == 1, errors  # said once, not every few seconds
                assert "list pods in namespace prod" in errors[0]
                assert "system:serviceaccount:prod:member" in errors[0]
                assert "a Role in namespace prod with verbs [list] on resources [pods]" in errors[0]
                fake.forbid = False  # someone created the RoleBinding
                assert await disc.poll() is True
                assert updates == [UpdateHosts((("10.0.0.2", 7800),))]
            finally:
                await disc.aclose()

    asyncio.run(body())


def test_no_peer_found_is_said_clearly(tmp_path: Path, pki: dict[str, Path], caplog: pytest.LogCaptureFixture) -> None:
    async def body() -> None:
        async with serve_api(pki) as api:
            fake, server = api
            fake.pods = [_pod("me", "10.0.0.1"), _pod("starting", None)]  # only ourselves has an IP
            disc = _discovery(server, _sa_dir(tmp_path, pki), [])
            try:
                with caplog.at_level(logging.INFO, logger="groupcluster.runtime.kube_discovery"):
                    await disc.poll()
                    fake.pods = [_pod("me", "10.0.0.1"), _pod("starting", "10.0.0.2")]
                    await disc.poll()
            finally:
                await disc.aclose()
            text = caplog.text
            assert "no peer found in namespace prod with selector 'groupcluster.io/cluster=orders'" in text
            assert "2 pod(s) listed" in text
            assert "1 peer(s) found: 10.0.0.2:7800" in text

    asyncio.run(body())


def test_start_lists_before_returning_and_keeps_polling(tmp_path: Path, pki: dict[str, Path]) -> None:
    async def body() -> None:
        async with serve_api(pki) as api:
            fake, server = api
            fake.pods = [_pod("b", "10.0.0.2")]
            updates: list[UpdateHosts] = []
            disc = _discovery(server, _sa_dir(tmp_path, pki), updates, interval=0.05)
            try:
                await disc.start()
                assert updates == [UpdateHosts((("10.0.0.2", 7800),))]  # before start() returned
                fake.pods.append(_pod("c", "10.0.0.3"))
                for _ in range(100):
                    if len(updates) == 2:
                        break
                    await asyncio.sleep(0.02)
                assert updates[-1] == UpdateHosts((("10.0.0.2", 7800), ("10.0.0.3", 7800)))
            finally:
                await disc.aclose()

    asyncio.run(body())


def test_member_options_build_the_factory_or_fail_clearly(tmp_path: Path, pki: dict[str, Path]) -> None:
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--cluster")
    kd.add_arguments(parser)
    args = parser.parse_args(["--cluster", "orders"])
    assert kd.from_args(args) is None  # not asked for
    args = parser.parse_args(["--cluster", "orders", "--kube-discovery"])
    monkey = pytest.MonkeyPatch()
    try:
        monkey.delenv("KUBERNETES_SERVICE_HOST", raising=False)
        with pytest.raises(KubeConfigError, match="KUBERNETES_SERVICE_HOST"):
            kd.from_args(args)
        sa = _sa_dir(tmp_path, pki)
        monkey.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
        monkey.setenv("KUBERNETES_SERVICE_PORT", "6443")
        monkey.setenv("GROUPCLUSTER_SA_DIR", str(sa))
        make = kd.from_args(args)
        assert make is not None
        disc = make(lambda ev: None, ("10.0.0.1", 7800))
        assert disc.config.selector == "groupcluster.io/cluster=orders"
        assert disc.config.required_labels == {"groupcluster.io/cluster": "orders"}
        assert disc.namespace == "prod"
    finally:
        monkey.undo()
