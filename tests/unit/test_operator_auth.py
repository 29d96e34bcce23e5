"""spec.auth in the operator, without a cluster: the model, the Secret it creates and checks, the planner's
guards, and the admin token on the wire to a real member HTTP API (loopback socket, the member's own app)."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import pytest
from aiohttp import web
from groupcluster.grid.http import MemberContext, build_app
from groupcluster_operator import builders, handlers
from groupcluster_operator.actions import CreatePod, DeletePod, RequestLeave
from groupcluster_operator.auth import AuthSecretError, read_auth_secret, required_keys
from groupcluster_operator.model import ClusterSpec, SpecError
from groupcluster_operator.observations import MemberReport, PodState
from groupcluster_operator.planner import plan

UID = "uid-1"
KEY = "k" * 43
ADMIN = "a" * 43
KV = "v" * 43


def spec(replicas: int = 3, **fields: Any) -> ClusterSpec:
    body = {"metadata": {"name": "demo", "namespace": "ns"}, "spec": {"replicas": replicas, **fields}}
    return ClusterSpec.from_resource(body, default_image="groupcluster:test")


def as_stored(manifest: dict[str, Any]) -> dict[str, Any]:
    """What the API server returns for a Secret created with stringData: base64 ``data``."""
    data = {k: base64.b64encode(v.encode()).decode() for k, v in manifest["stringData"].items()}
    out = {k: v for k, v in manifest.items() if k != "stringData"}
    return {**out, "data": data}


def secret_with(**data: str) -> dict[str, Any]:
    return {"metadata": {"name": "x"}, "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}}


# -- the model -----------------------------------------------------------------------------------------------
def test_auth_defaults_hmac_with_an_operator_secret() -> None:
    s = spec()
    assert (s.auth.enabled, s.auth.encrypt, s.auth.kv_token, s.auth.existing_secret) == (True, False, False, "")
    assert s.auth.mode == "mac" and s.auth_secret_name == "demo-auth"
    assert spec(auth={"encrypt": True}).auth.mode == "aead"
    assert spec(auth={"enabled": False}).auth.mode == "off"
    assert spec(auth={"existingSecret": "team.keys-1"}).auth_secret_name == "team.keys-1"


@pytest.mark.parametrize(
    ("auth", "message"),
    [
        ("yes", "spec.auth: expected an object"),
        ({"enabled": "true"}, "spec.auth.enabled: expected true or false"),
        ({"kvToken": 1}, "spec.auth.kvToken: expected true or false"),
        ({"existingSecret": "Not_A_Name"}, "spec.auth.existingSecret: 'Not_A_Name' is not a valid Secret name"),
        ({"enabled": False, "encrypt": True}, "spec.auth: encrypt, kvToken and existingSecret need enabled: true"),
        ({"enabled": False, "kvToken": True}, "need enabled: true"),
        ({"encrpyt": True}, "spec.auth: unknown field(s) encrpyt"),
    ],
)
def test_bad_auth_values_are_named(auth: Any, message: str) -> None:
    with pytest.raises(SpecError, match=message.replace("(", r"\(").replace(")", r"\)")):
        spec(auth=auth)


def test_stack_set_cannot_override_what_spec_auth_manages() -> None:
    with pytest.raises(SpecError, match=r"spec.stack.set: transport.encrypt is managed by spec.auth"):
        spec(stack={"set": {"transport.encrypt": "true"}})
    with pytest.raises(SpecError, match=r"transport\.auth_secret_file is managed"):
        spec(stack={"set": {"transport.auth_secret_file": "/tmp/k"}})


# -- the Secret ----------------------------------------------------------------------------------------------
def test_the_operator_secret_holds_the_keys_and_is_owned_by_the_cluster() -> None:
    s = spec(auth={"kvToken": True})
    secret = builders.build_auth_secret(s, UID, cluster_secret=KEY, admin_token=ADMIN, kv_token=KV)
    assert secret["kind"] == "Secret" and secret["type"] == "Opaque"
    assert secret["metadata"]["name"] == "demo-auth" and secret["metadata"]["namespace"] == "ns"
    (ref,) = secret["metadata"]["ownerReferences"]
    assert ref["uid"] == UID and ref["kind"] == "GroupCluster" and ref["controller"] is True
    assert secret["stringData"] == {"cluster-secret": KEY + "\n", "admin-token": ADMIN, "kv-token": KV}
    material = read_auth_secret(s, as_stored(secret))
    assert (material.admin_token, material.kv_token, material.secret_name) == (ADMIN, KV, "demo-auth")
    assert ADMIN not in repr(material) and KV not in repr(material)


def test_the_builder_refuses_weak_or_multi_line_material_and_user_secrets() -> None:
    with pytest.raises(ValueError, match="cluster_secret: expected one word of at least 32"):
        builders.build_auth_secret(spec(), UID, cluster_secret="short", admin_token=ADMIN, kv_token=KV)
    with pytest.raises(ValueError, match="admin_token"):
        builders.build_auth_secret(spec(), UID, cluster_secret=KEY, admin_token=ADMIN + "\nx", kv_token=KV)
    with pytest.raises(ValueError, match="the user manages that Secret"):
        builders.build_auth_secret(
            spec(auth={"existingSecret": "mine"}), UID, cluster_secret=KEY, admin_token=ADMIN, kv_token=KV
        )


@pytest.mark.parametrize(
    ("auth", "data", "message"),
    [
        ({}, {"cluster-secret": KEY}, "Secret ns/demo-auth lacks the key(s) admin-token"),
        ({"kvToken": True}, {"cluster-secret": KEY, "admin-token": ADMIN}, "lacks the key(s) kv-token"),
        ({"existingSecret": "mine"}, {"admin-token": ADMIN}, "Secret ns/mine lacks the key(s) cluster-secret"),
        ({}, {"cluster-secret": "# only a comment\n", "admin-token": ADMIN}, "holds no key line"),
        ({}, {"cluster-secret": f"{KEY}\nshort\n", "admin-token": ADMIN}, "key line(s) [2] are shorter than 16"),
        ({}, {"cluster-secret": KEY, "admin-token": "two words here, long enough"}, "admin-token must be one word"),
        ({}, {"cluster-secret": KEY, "admin-token": "  "}, "lacks the key(s) admin-token"),
    ],
)
def test_a_secret_lacking_a_key_or_malformed_is_named(auth: dict[str, Any], data: dict[str, str], message: str) -> None:
    with pytest.raises(AuthSecretError) as info:
        read_auth_secret(spec(auth=auth), secret_with(**data))
    assert message in str(info.value)


def test_a_missing_or_undecodable_secret_is_named() -> None:
    with pytest.raises(AuthSecretError, match="Secret ns/mine does not exist"):
        read_auth_secret(spec(auth={"existingSecret": "mine"}), None)
    bad = {"data": {"cluster-secret": "!!not base64!!", "admin-token": base64.b64encode(ADMIN.encode()).decode()}}
    with pytest.raises(AuthSecretError, match="key cluster-secret is not UTF-8 text"):
        read_auth_secret(spec(), bad)


def test_digest_follows_the_keys_members_read_and_rotation_lines_are_accepted() -> None:
    s = spec()
    one = read_auth_secret(s, secret_with(**{"cluster-secret": KEY, "admin-token": ADMIN}))
    # A second key line (rotation): accepted, and the members must roll to read it.
    two = read_auth_secret(s, secret_with(**{"cluster-secret": f"{KEY}\n{'n' * 43}\n", "admin-token": ADMIN}))
    assert one.digest != two.digest
    # A key the members of this spec do not mount (kv-token while kvToken is off) does not roll them.
    extra = read_auth_secret(s, secret_with(**{"cluster-secret": KEY, "admin-token": ADMIN, "kv-token": KV}))
    assert extra.digest == one.digest and extra.kv_token is None
    assert required_keys(s) == ("cluster-secret", "admin-token")


# -- the planner's guards ------------------------------------------------------------------------------------
def members(n: int, s: ClusterSpec, mode: str | None = "mac") -> tuple[list[PodState], dict[str, MemberReport | None]]:
    h = s.pod_hash()
    addrs = tuple(f"10.0.0.{10 + i}:7800#{i}" for i in range(n))
    pods = [
        PodState(f"demo-{i}", i, "Running", f"10.0.0.{10 + i}", ready=True, spec_hash=h, auth_mode=mode)
        for i in range(n)
    ]
    reports: dict[str, MemberReport | None] = {
        p.name: MemberReport(address=addrs[i], view_id="v|1", view_members=addrs, coordinator=addrs[0])
        for i, p in enumerate(pods)
    }
    return pods, reports


def test_a_bad_secret_stops_creating_and_leaving_and_reports_degraded_once() -> None:
    s = spec(3)
    problem = "Secret ns/mine lacks the key(s) admin-token (or they are empty)"
    step = plan(s, [], {}, auth_problem=problem, now="t0")
    assert step.actions == [] and step.phase == "Degraded"
    assert problem in step.message
    degraded = next(c for c in step.status["conditions"] if c["type"] == "Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == "AuthSecretInvalid" and problem in degraded["message"]
    assert [(e.type, e.reason) for e in step.events] == [("Warning", "AuthSecretInvalid")]
    assert problem in step.events[0].message
    # The next reconciliation with the same problem posts no second event.
    again = plan(s, [], {}, auth_problem=problem, previous_conditions=step.status["conditions"], now="t1")
    assert again.events == [] and again.actions == []
    # No leave either (it needs the Secret's token); a pod that finished is still cleaned up.
    pods, reports = members(4, s)
    pods[3] = PodState("demo-3", 3, "Failed", exit_code=1, spec_hash=s.pod_hash(), auth_mode="mac")
    step = plan(spec(2), pods, reports, auth_problem=problem)
    assert [type(a) for a in step.actions] == [DeletePod]
    # Fixed: creation resumes.
    assert plan(s, [], {}).actions == [CreatePod(0, "scaling up: 0 of 3 members", 1)]


def test_a_change_of_frame_authentication_is_not_rolled_into_a_split() -> None:
    old = spec(3)
    pods, reports = members(3, old, mode="mac")
    new = spec(3, auth={"encrypt": True})
    step = plan(new, pods, reports, now="t0")
    # Rule 6 would surge a new (encrypting) member: it could not read the others' frames. Held, and said why.
    assert not any(isinstance(a, CreatePod) for a in step.actions)
    assert step.phase == "Degraded" and "'aead' but members run mac" in step.message
    assert [e.reason for e in step.events] == ["AuthSettingsDiffer"]
    # Leaves still run: scaling to 0 and back is the way to apply it.
    step = plan(spec(2, auth={"encrypt": True}), pods, reports)
    assert [type(a) for a in step.actions] == [RequestLeave]
    assert plan(new, [], {}).actions == [CreatePod(0, "scaling up: 0 of 3 members", 1)]
    # Pods of an operator from before spec.auth (a spec hash, no auth annotation) ran without authentication.
    pre = PodState.from_pod({"metadata": {"name": "demo-0", "annotations": {"groupcluster.io/spec-hash": "x"}}})
    assert pre.auth_mode == "off"
    ours = PodState.from_pod(builders.build_member_pod(new, UID, 0, initial_cluster_size=1))
    assert ours.auth_mode == "aead"
    # A change that keeps the wire format (kvToken) rolls as usual.
    step = plan(spec(3, auth={"kvToken": True}), pods, reports)
    assert [type(a) for a in step.actions] == [CreatePod] and step.phase == "Updating"


# -- the admin token on the wire -----------------------------------------------------------------------------
def test_leave_and_force_available_carry_the_admin_token_to_a_real_member_api() -> None:
    async def scenario() -> None:
        asked: list[str] = []
        ctx = MemberContext(
            cluster="ns.demo",
            grid=None,
            request_leave=lambda: asked.append("leave"),
            channel=lambda: None,
            admin_token=ADMIN,
        )
        runner = web.AppRunner(build_app(ctx))
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        pod = PodState("demo-0", 0, "Running", "127.0.0.1")
        try:
            status, error = await handlers.request_leave(pod, port, None)
            assert status == 401 and error is not None and "missing bearer token" in error
            status, error = await handlers.request_leave(pod, port, "w" * 43)
            assert status == 401 and error is not None and "wrong bearer token" in error
            # The right token passes the check; this member has not joined, which is the next answer.
            status, error = await handlers.request_leave(pod, port, ADMIN)
            assert status == 409 and error is not None and "not joined" in error
            status, text = await handlers.request_force_available(pod, port, "w" * 43)
            assert status == 401
            status, text = await handlers.request_force_available(pod, port, ADMIN)
            assert status == 404 and "runs no data grid" in text
            # The status the operator polls stays open.
            report = await handlers.fetch_report(pod, port)
            assert report is not None
        finally:
            if handlers.CONFIG.http is not None:
                await handlers.CONFIG.http.close()
                handlers.CONFIG.http = None
            await runner.cleanup()

    asyncio.run(scenario())
