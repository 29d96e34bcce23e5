"""The operator replicas' peering set-up, the client Service's objects and the status a step plans from, against an
in-memory API server.

The real peering (two processes, one SIGKILLed during a scale-up) and the client Service on a cluster run in
tests/e2e/test_operator_ha.py.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any

import pytest
from groupcluster_operator import builders, handlers
from groupcluster_operator.cli import add_arguments
from groupcluster_operator.kubeapi import ApiError, KubeApi
from groupcluster_operator.model import ClusterSpec
from groupcluster_operator.peering import LIFETIME, peering_manifests, peering_problem, start_priority

UID = "uid-1"


class StoreApi:
    """The KubeApi calls the operator makes here, on a dict of objects by "Kind/namespace/name"; records calls."""

    def __init__(self, discovery: dict[str, list[str]] | None = None, forbid: set[str] | None = None) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.discovery = discovery or {}  # "group/version" -> served plurals
        self.forbid = forbid or set()  # keys whose creation is refused (403)
        self.calls: list[tuple[str, str]] = []

    @staticmethod
    def key(manifest: dict[str, Any]) -> str:
        meta = manifest["metadata"]
        return f"{manifest['kind']}/{meta.get('namespace') or ''}/{meta['name']}"

    async def served_resources(self, group: str = "groupcluster.io", version: str = "v1alpha1") -> list[str]:
        if f"{group}/{version}" not in self.discovery:
            raise ApiError(404, "not found")
        return self.discovery[f"{group}/{version}"]

    async def get(self, manifest: dict[str, Any]) -> dict[str, Any] | None:
        self.calls.append(("get", self.key(manifest)))
        return self.objects.get(self.key(manifest))

    async def create(self, manifest: dict[str, Any]) -> dict[str, Any]:
        key = self.key(manifest)
        self.calls.append(("create", key))
        if key in self.forbid:
            raise ApiError(403, "forbidden")
        if key in self.objects:
            raise ApiError(409, "already exists")
        self.objects[key] = manifest
        return manifest

    async def ensure(self, manifest: dict[str, Any]) -> bool:
        return await KubeApi.ensure(self, manifest)  # type: ignore[arg-type]

    async def merge_patch(self, manifest: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
        key = self.key(manifest)
        self.calls.append(("patch", key))
        obj = self.objects[key]
        for field_name, value in patch.items():
            obj.setdefault(field_name, {}).update(value)
        return obj

    async def delete(self, manifest: dict[str, Any]) -> bool:
        self.calls.append(("delete", self.key(manifest)))
        return self.objects.pop(self.key(manifest), None) is not None

    async def list_groupclusters(self, namespace: str | None, limit: int | None = None) -> list[dict[str, Any]]:
        self.calls.append(("list", f"GroupCluster/{namespace or ''}"))
        return []

    async def close(self) -> None:
        self.calls.append(("close", ""))


def test_the_replica_started_first_ranks_first_and_no_two_tie() -> None:
    first, second = start_priority(1_700_000_000_000_000_000), start_priority(1_700_000_000_000_001_000)
    assert first > second  # kopf pauses the lower priority while the higher one lives
    assert start_priority(1_700_000_000_000_000_000) != start_priority(1_700_000_000_000_002_000)
    assert start_priority() < first  # now is later than 2023
    assert 5 <= LIFETIME <= 60


def test_peering_objects_namespaced_in_each_watched_namespace_or_one_cluster_wide() -> None:
    assert peering_manifests("gc", ["a", "b"]) == [
        {"apiVersion": "kopf.dev/v1", "kind": "KopfPeering", "metadata": {"name": "gc", "namespace": "a"}},
        {"apiVersion": "kopf.dev/v1", "kind": "KopfPeering", "metadata": {"name": "gc", "namespace": "b"}},
    ]
    assert peering_manifests("gc", None) == [
        {"apiVersion": "kopf.dev/v1", "kind": "ClusterKopfPeering", "metadata": {"name": "gc"}}
    ]


def test_peering_without_the_crd_is_refused_naming_the_fix() -> None:
    api = StoreApi(discovery={"kopf.dev/v1": ["clusterkopfpeerings"]})
    problem = asyncio.run(peering_problem(api, "gc", ["a"]))
    assert problem is not None and "kopfpeerings.kopf.dev" in problem and "crds/kopf-peering.yaml" in problem
    assert "without --peering" in problem
    assert asyncio.run(peering_problem(StoreApi(), "gc", None)) is not None  # no kopf.dev group at all


def test_missing_peering_objects_are_made_and_existing_ones_kept() -> None:
    api = StoreApi(discovery={"kopf.dev/v1": ["kopfpeerings", "clusterkopfpeerings"]})
    kept = {"metadata": {"name": "gc", "namespace": "a"}, "status": {"other": {"priority": 1}}}
    api.objects["KopfPeering/a/gc"] = kept
    assert asyncio.run(peering_problem(api, "gc", ["a", "b"])) is None
    assert api.objects["KopfPeering/a/gc"] is kept
    assert api.objects["KopfPeering/b/gc"]["kind"] == "KopfPeering"
    assert asyncio.run(peering_problem(api, "gc", None)) is None
    assert "ClusterKopfPeering//gc" in api.objects
    # Without the right to make one, the operator says which and where, instead of pausing forever.
    api = StoreApi(discovery={"kopf.dev/v1": ["kopfpeerings"]}, forbid={"KopfPeering/c/gc"})
    problem = asyncio.run(peering_problem(api, "gc", ["c"]))
    assert problem is not None and "KopfPeering gc in namespace c" in problem and "403" in problem


def test_a_peering_object_the_operator_makes_carries_the_marks_it_was_given() -> None:
    marks = {"labels": {"app.kubernetes.io/managed-by": "Helm"}, "annotations": {"meta.helm.sh/release-name": "r"}}
    api = StoreApi(discovery={"kopf.dev/v1": ["kopfpeerings"]})
    assert asyncio.run(peering_problem(api, "gc", ["a"], marks)) is None
    made = api.objects["KopfPeering/a/gc"]["metadata"]
    assert made["labels"] == marks["labels"] and made["annotations"] == marks["annotations"]
    assert peering_manifests("gc", None, {"labels": {}, "annotations": {}}) == peering_manifests("gc", None)


def test_the_chart_passes_helm_ownership_marks_and_the_cli_parses_them() -> None:
    # Without these Helm cannot adopt a peering object its own operator pod made first: the install fails with
    # "kopfpeerings.kopf.dev ... already exists" (pods can start before Helm creates custom resources).
    chart = Path(__file__).resolve().parents[2] / "charts" / "groupcluster" / "templates" / "deployment.yaml"
    text = chart.read_text()
    assert "--peering-label=app.kubernetes.io/managed-by={{ .Release.Service }}" in text
    assert "--peering-annotation=meta.helm.sh/release-name={{ .Release.Name }}" in text
    assert "--peering-annotation=meta.helm.sh/release-namespace={{ .Release.Namespace }}" in text
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(
        ["--peering", "p", "--peering-label=a=b=c", "--peering-annotation", "x=", "--peering-label=d=e"]
    )
    assert dict(args.peering_label) == {"a": "b=c", "d": "e"} and dict(args.peering_annotation) == {"x": ""}
    with pytest.raises(SystemExit):
        parser.parse_args(["--peering-label", "novalue"])


SPEC = ClusterSpec(name="orders", namespace="shop", image="i")
SERVICES = "Service/shop"


def _ensure(api: StoreApi) -> None:
    handlers.CONFIG.ensured.pop(UID, None)
    asyncio.run(handlers._ensure_supporting(api, SPEC, UID))


def test_supporting_objects_include_the_client_service_beside_the_headless_one() -> None:
    api = StoreApi()
    _ensure(api)
    assert api.objects[f"{SERVICES}/orders"]["spec"]["type"] == "ClusterIP"
    assert api.objects[f"{SERVICES}/orders-members"]["spec"]["clusterIP"] == "None"
    assert not [c for c in api.calls if c[0] == "delete"]
    _ensure(api)  # a second pass changes nothing
    assert not [c for c in api.calls if c[0] == "delete"]


def test_an_older_operators_headless_service_named_after_the_cluster_is_replaced_by_the_client_service() -> None:
    api = StoreApi()
    old = builders.build_headless_service(SPEC, UID)
    old["metadata"]["name"] = "orders"  # what older operators created
    api.objects[f"{SERVICES}/orders"] = old
    _ensure(api)
    client = api.objects[f"{SERVICES}/orders"]
    assert client["spec"]["type"] == "ClusterIP" and "publishNotReadyAddresses" not in client["spec"]
    assert api.objects[f"{SERVICES}/orders-members"]["spec"]["clusterIP"] == "None"
    assert ("delete", f"{SERVICES}/orders") in api.calls


def test_a_headless_service_of_someone_else_is_left_alone() -> None:
    api = StoreApi()
    foreign = builders.build_headless_service(SPEC, "another-uid")
    foreign["metadata"]["name"] = "orders"
    api.objects[f"{SERVICES}/orders"] = foreign
    _ensure(api)
    assert api.objects[f"{SERVICES}/orders"] is foreign
    assert not [c for c in api.calls if c[0] == "delete"]


def test_a_standby_leaves_the_finalizers_on_exit_and_the_replica_at_work_releases_them() -> None:
    saved = (handlers.CONFIG.api, handlers.CONFIG.peering, handlers.CONFIG.active, handlers.CONFIG.namespaces)
    try:
        for active, released in ((False, False), (True, True)):
            api = StoreApi()
            handlers.CONFIG.api, handlers.CONFIG.peering = api, "gc"
            handlers.CONFIG.active, handlers.CONFIG.namespaces = active, ["shop"]
            asyncio.run(handlers.cleanup())
            listed = ("list", "GroupCluster/shop") in api.calls
            assert listed is released, (active, api.calls)
            assert handlers.CONFIG.api is None  # closed either way
    finally:
        handlers.CONFIG.api, handlers.CONFIG.peering, handlers.CONFIG.active, handlers.CONFIG.namespaces = saved


def test_a_replica_announces_itself_in_kopfs_format_before_kopf_looks() -> None:
    from groupcluster_operator.peering import announce

    api = StoreApi()
    for ns in ("a", "b"):
        api.objects[f"KopfPeering/{ns}/gc"] = {"kind": "KopfPeering", "metadata": {"name": "gc", "namespace": ns}}
    asyncio.run(announce(api, "gc", ["a", "b"], "op-1", -5, wait=0.0))  # type: ignore[arg-type]
    assert [c for c in api.calls if c[0] == "patch"] == [("patch", "KopfPeering/a/gc"), ("patch", "KopfPeering/b/gc")]
    entry = api.objects["KopfPeering/b/gc"]["status"]["op-1"]
    assert (entry["priority"], entry["lifetime"]) == (-5, LIFETIME)
    # kopf reads lastseen with iso8601 and judges the peer alive until lastseen + lifetime.
    from kopf._core.engines.peering import Peer

    assert not Peer(identity="op-1", **entry).is_dead


def test_a_step_plans_from_the_status_the_last_step_wrote_until_the_watch_delivers_it() -> None:
    # A member pod deleted by hand that leaves within a second: the step that saw it terminating marks it
    # deleted-by-others in the status; the next step, whose body the watch has not refreshed yet (same
    # resourceVersion), must still know that, or it reports the replacement as a plain scale-up.
    saved = dict(handlers.CONFIG.written)
    try:
        handlers.CONFIG.written.clear()
        body_status = {"phase": "Running", "members": [{"pod": "demo-2", "leaving": False, "deleted": False}]}
        assert handlers._previous_status("u", "41", body_status) is body_status  # nothing written yet
        wrote = {"members": [{"pod": "demo-2", "leaving": True, "deleted": True}]}
        handlers.CONFIG.written["u"] = ("41", wrote)
        merged = handlers._previous_status("u", "41", body_status)
        assert merged == {"phase": "Running", **wrote}
        # Once the body moved on (our write or anyone's), the body is the truth again.
        assert handlers._previous_status("u", "42", body_status) is body_status
    finally:
        handlers.CONFIG.written.clear()
        handlers.CONFIG.written.update(saved)
