"""The pure manifest builders: what the operator creates for a GroupCluster, checked without a cluster."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest
from groupcluster.grid.node import GridConfig
from groupcluster.runtime import member_cli
from groupcluster_operator import builders
from groupcluster_operator.model import ClusterSpec, SpecError
from groupcluster_operator.observations import MemberReport, PodState
from groupcluster_operator.planner import plan

UID = "0000-uid"


def spec(**fields: Any) -> ClusterSpec:
    body = {"metadata": {"name": "orders", "namespace": "shop"}, "spec": {"replicas": 3, **fields}}
    return ClusterSpec.from_resource(body, default_image="groupcluster:1.0")


def test_member_pod_runs_a_discovering_grid_member_with_probes() -> None:
    pod = builders.build_member_pod(spec(), UID, 2, initial_cluster_size=1)
    meta, pspec = pod["metadata"], pod["spec"]
    assert meta["name"] == "orders-2" and meta["namespace"] == "shop"
    assert meta["labels"]["groupcluster.io/cluster"] == "orders"
    assert meta["labels"]["groupcluster.io/ordinal"] == "2"
    assert meta["annotations"]["groupcluster.io/spec-hash"] == spec().pod_hash()
    assert meta["ownerReferences"] == [
        {
            "apiVersion": "groupcluster.io/v1alpha1",
            "kind": "GroupCluster",
            "name": "orders",
            "uid": UID,
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    assert pspec["restartPolicy"] == "Never"  # the planner, not the kubelet, decides what replaces a member
    assert pspec["serviceAccountName"] == "orders-member"
    (c,) = pspec["containers"]
    assert c["image"] == "groupcluster:1.0"
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {"member": 7800, "http": 8080}
    env = {e["name"]: e for e in c["env"]}
    assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    args = c["args"]
    assert args[:3] == ["member", "--cluster", "shop.orders"]
    assert "--kube-discovery" in args and args[args.index("--kube-selector") + 1] == "groupcluster.io/cluster=orders"
    # Long enough for the member's own hand-off timeout plus its leave.
    assert pspec["terminationGracePeriodSeconds"] > 120


def _secret_files(tmp_path: Path, s: ClusterSpec) -> Path:
    """The files a kubelet would mount from the operator's Secret (its volume's items), in a directory."""
    secret = builders.build_auth_secret(s, UID, cluster_secret="c" * 43, admin_token="a" * 43, kv_token="k" * 43)
    (volume,) = builders.build_member_pod(s, UID, 0, initial_cluster_size=1)["spec"]["volumes"]
    for item in volume["secret"]["items"]:
        (tmp_path / item["path"]).write_text(secret["stringData"][item["key"]])
    return tmp_path


def _parse_member_args(args: list[str], auth_dir: Path) -> argparse.Namespace:
    """The args as the container would run them ($(VAR) expanded), parsed by the real member command."""
    args = [a.replace("$(POD_IP)", "10.1.2.3").replace(f"$({builders.AUTH_DIR_ENV})", str(auth_dir)) for a in args]
    assert args[0] == "member"
    parser = argparse.ArgumentParser()
    member_cli.add_arguments(parser)
    return parser.parse_args(args[1:])


def test_member_args_are_accepted_by_the_real_member_command(tmp_path: Path) -> None:
    s = spec(
        numOwners=3,
        numSegments=64,
        partitionHandling="AllowReads",
        stack={"preset": "total-order", "transport": "tcp", "set": {"fd.timeout": "5s"}},
        grid={"op_timeout": "20s"},
        auth={"encrypt": True, "kvToken": True},
    )
    container = builders.build_member_pod(s, UID, 3, initial_cluster_size=4)["spec"]["containers"][0]
    ns = _parse_member_args(container["args"], _secret_files(tmp_path, s))
    assert ns.bind == ("10.1.2.3", 7800) and ns.http == ("10.1.2.3", 8080)
    assert ns.transport == "tcp" and ns.kube_discovery and ns.grid
    # The member read the tokens from the Secret's files.
    assert (ns.admin_token, ns.kv_token) == ("a" * 43, "k" * 43)
    stack = member_cli.load_spec(ns.stack, ns.overrides)  # a bad layer key or secret file would raise here
    transport = stack[0]
    assert transport["encrypt"] is True and transport["auth_secret_file"].endswith("/cluster-secret")
    grid = GridConfig.from_dict(dict(ns.grid_params))
    assert (grid.num_owners, grid.num_segments, grid.partition_handling, grid.op_timeout) == (
        3,
        64,
        "allow_reads",
        20.0,
    )
    assert grid.initial_cluster_size == 4  # join-only: the member cannot start a grid of its own


def _grid_params(pod: dict[str, Any]) -> dict[str, str]:
    args = pod["spec"]["containers"][0]["args"]
    pairs = [args[i + 1] for i, a in enumerate(args) if a == "--grid-set"]
    return dict(p.split("=", 1) for p in pairs)


def test_each_pod_carries_its_initial_cluster_size_on_the_command_line_and_as_an_annotation() -> None:
    first = builders.build_member_pod(spec(), UID, 0, initial_cluster_size=1)
    joiner = builders.build_member_pod(spec(), UID, 2, initial_cluster_size=3)
    assert _grid_params(first)["initial_cluster_size"] == "1"
    assert _grid_params(joiner)["initial_cluster_size"] == "3"
    assert joiner["metadata"]["annotations"]["groupcluster.io/initial-cluster-size"] == "3"
    # The planner reads it back from the pod (a pod of an older operator, without it, started with 1).
    assert PodState.from_pod(joiner).initial_cluster_size == 3
    del joiner["metadata"]["annotations"]["groupcluster.io/initial-cluster-size"]
    assert PodState.from_pod(joiner).initial_cluster_size == 1
    # The rest of the command line is the same for every pod.
    strip = [a for a in first["spec"]["containers"][0]["args"] if not a.startswith("initial_cluster_size=")]
    assert strip == [a for a in joiner["spec"]["containers"][0]["args"] if not a.startswith("initial_cluster_size=")]
    with pytest.raises(ValueError, match="initial_cluster_size"):
        builders.member_args(spec(), initial_cluster_size=0)


def test_pods_created_with_different_initial_sizes_are_all_up_to_date() -> None:
    """The size is per pod, not a spec change: the spec hash ignores it, so nobody is rolled for it."""
    s = spec()
    manifests = [builders.build_member_pod(s, UID, i, initial_cluster_size=i + 1) for i in range(3)]
    assert {m["metadata"]["annotations"]["groupcluster.io/spec-hash"] for m in manifests} == {s.pod_hash()}
    pods = []
    for i, m in enumerate(manifests):
        m["status"] = {"phase": "Running", "podIP": f"10.0.0.{i}", "conditions": [{"type": "Ready", "status": "True"}]}
        pods.append(PodState.from_pod(m))
    members = tuple(f"10.0.0.{i}:7800#1" for i in range(3))
    reports: dict[str, MemberReport | None] = {
        p.name: MemberReport(address=members[i], view_id="v|1", view_members=members, coordinator=members[0])
        for i, p in enumerate(pods)
    }
    step = plan(s, pods, reports)
    assert step.actions == [] and step.phase == "Running"  # no surge, no leave: nothing is outdated
    assert [m["upToDate"] for m in step.status["members"]] == [True, True, True]


def test_auth_is_on_by_default_hmac_only_with_the_admin_token(tmp_path: Path) -> None:
    s = spec()
    pod = builders.build_member_pod(s, UID, 0, initial_cluster_size=1)
    (c,) = pod["spec"]["containers"]
    ns = _parse_member_args(c["args"], _secret_files(tmp_path, s))
    assert ns.admin_token == "a" * 43 and ns.kv_token is None  # the data endpoints stay open by default
    stack = member_cli.load_spec(ns.stack, ns.overrides)
    assert stack[0].get("encrypt") in (None, False) and stack[0]["auth_secret_file"]
    assert not any("kv-token" in a for a in c["args"])
    # The Secret is mounted read-only, readable by the member's group only, with only the keys it reads.
    (volume,) = pod["spec"]["volumes"]
    assert volume["secret"]["secretName"] == "orders-auth"
    assert volume["secret"]["defaultMode"] == 0o440
    assert [i["key"] for i in volume["secret"]["items"]] == ["cluster-secret", "admin-token"]
    assert c["volumeMounts"] == [{"name": "auth", "mountPath": builders.AUTH_MOUNT_PATH, "readOnly": True}]
    assert pod["spec"]["securityContext"]["fsGroup"] == builders.MEMBER_GID
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env[builders.AUTH_DIR_ENV] == builders.AUTH_MOUNT_PATH
    assert pod["metadata"]["annotations"]["groupcluster.io/auth-mode"] == "mac"


def test_without_auth_no_secret_is_mounted_and_no_auth_argument_is_passed() -> None:
    pod = builders.build_member_pod(spec(auth={"enabled": False}), UID, 0, initial_cluster_size=1)
    (c,) = pod["spec"]["containers"]
    assert "volumes" not in pod["spec"] and "volumeMounts" not in c
    assert not [a for a in c["args"] if "auth" in a or "token" in a]
    assert pod["metadata"]["annotations"]["groupcluster.io/auth-mode"] == "off"


def test_existing_secret_is_mounted_and_a_template_fs_group_wins() -> None:
    s = spec(
        auth={"existingSecret": "my-keys", "kvToken": True}, podTemplate={"spec": {"securityContext": {"fsGroup": 7}}}
    )
    pod = builders.build_member_pod(s, UID, 0, initial_cluster_size=1)
    (volume,) = pod["spec"]["volumes"]
    assert volume["secret"]["secretName"] == "my-keys"
    assert [i["key"] for i in volume["secret"]["items"]] == ["cluster-secret", "admin-token", "kv-token"]
    assert pod["spec"]["securityContext"] == {"fsGroup": 7}


def test_a_change_of_spec_auth_or_of_the_secret_changes_the_pod_hash() -> None:
    base = spec().pod_hash()
    hashes = {
        base,
        spec(auth={"encrypt": True}).pod_hash(),
        spec(auth={"kvToken": True}).pod_hash(),
        spec(auth={"enabled": False}).pod_hash(),
        spec(auth={"existingSecret": "other"}).pod_hash(),
        spec().pod_hash("digest-of-the-keys"),
    }
    assert len(hashes) == 6
    assert spec(replicas=5).pod_hash() == base  # replicas is not something a pod runs
    pod = builders.build_member_pod(spec(), UID, 0, spec().pod_hash("d1"), initial_cluster_size=1)
    assert pod["metadata"]["annotations"]["groupcluster.io/spec-hash"] == spec().pod_hash("d1")


def test_pod_template_overrides_merge_without_breaking_our_labels() -> None:
    s = spec(
        podTemplate={
            "metadata": {"labels": {"team": "a", "groupcluster.io/cluster": "evil"}, "annotations": {"x": "y"}},
            "spec": {
                "nodeSelector": {"disk": "ssd"},
                "priorityClassName": "high",
                "env": [{"name": "EXTRA", "value": "1"}],
                "terminationGracePeriodSeconds": 60,
            },
        },
        resources={"requests": {"cpu": "100m"}},
    )
    pod = builders.build_member_pod(s, UID, 0, initial_cluster_size=1)
    assert pod["metadata"]["labels"]["team"] == "a"
    assert pod["metadata"]["labels"]["groupcluster.io/cluster"] == "orders"
    assert pod["metadata"]["annotations"]["x"] == "y"
    assert pod["spec"]["nodeSelector"] == {"disk": "ssd"} and pod["spec"]["priorityClassName"] == "high"
    assert pod["spec"]["terminationGracePeriodSeconds"] == 60
    c = pod["spec"]["containers"][0]
    assert {"name": "EXTRA", "value": "1"} in c["env"]
    assert c["resources"] == {"requests": {"cpu": "100m"}}


def test_headless_service_publishes_members_before_they_are_ready() -> None:
    svc = builders.build_headless_service(spec(), UID)
    assert svc["metadata"]["name"] == "orders-members"
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"] is True
    assert svc["spec"]["selector"] == {"groupcluster.io/cluster": "orders", "app.kubernetes.io/component": "member"}
    assert {p["name"]: p["protocol"] for p in svc["spec"]["ports"]} == {"http": "TCP", "member": "UDP"}
    # The members' DNS names (orders-0.orders-members) come from this Service.
    assert builders.build_member_pod(spec(), UID, 0, initial_cluster_size=1)["spec"]["subdomain"] == "orders-members"


def test_client_service_is_named_after_the_cluster_and_serves_ready_members_http_only() -> None:
    svc = builders.build_client_service(spec(), UID)
    meta, sspec = svc["metadata"], svc["spec"]
    assert meta["name"] == "orders" and meta["namespace"] == "shop"
    assert meta["ownerReferences"] == [builders.owner_reference(spec(), UID)]
    assert sspec["type"] == "ClusterIP" and "clusterIP" not in sspec
    # Only ready members: the Service must not publish addresses that are not ready.
    assert "publishNotReadyAddresses" not in sspec
    assert sspec["selector"] == builders.selector_labels(spec())
    assert sspec["ports"] == [{"name": "http", "port": 8080, "targetPort": "http", "protocol": "TCP"}]
    custom = spec(httpPort=9000)
    assert builders.build_client_service(custom, UID)["spec"]["ports"][0]["port"] == 9000
    # Both Services exist side by side: distinct names, one headless, one not.
    names = {o["metadata"]["name"] for o in builders.build_supporting_objects(spec(), UID) if o["kind"] == "Service"}
    assert names == {"orders", "orders-members"}


def test_disruption_budget_never_lets_a_drain_take_every_owner_of_a_segment() -> None:
    def budget(**fields: Any) -> int:
        return int(builders.build_pod_disruption_budget(spec(**fields), UID)["spec"]["maxUnavailable"])

    assert budget(replicas=3, numOwners=2) == 1
    assert budget(replicas=5, numOwners=4) == 3
    assert budget(replicas=3, numOwners=3) == 2  # never all 3: one member (one copy) stays
    # One owner: still one eviction at a time (the evicted member hands its segments off on SIGTERM); 0 would
    # block every drain of the node forever.
    assert budget(replicas=3, numOwners=1) == 1
    assert budget(replicas=1, numOwners=1) == 1
    # A named distributed cache with fewer copies bounds it too.
    assert budget(replicas=5, numOwners=4, caches=[{"name": "few", "numOwners": 2}]) == 1
    # Bypassing the API server's rule (numOwners > replicas): the operator refuses the spec outright.
    with pytest.raises(SpecError, match=r"spec\.numOwners: 4 copies .* spec\.replicas is 3"):
        spec(replicas=3, numOwners=4)
    with pytest.raises(SpecError, match=r"spec\.caches \(wide\)\.numOwners"):
        spec(replicas=2, caches=[{"name": "wide", "numOwners": 3}])
    assert spec(replicas=0, numOwners=4).num_owners == 4  # 0 stops the cluster: always allowed


def test_member_rbac_is_least_privilege() -> None:
    objs = builders.build_supporting_objects(spec(), UID)
    assert [o["kind"] for o in objs] == [
        "ServiceAccount",
        "Role",
        "RoleBinding",
        "Service",
        "Service",
        "PodDisruptionBudget",
    ]
    role = objs[1]
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]
    binding = objs[2]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "orders-member", "namespace": "shop"}]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert all(o["metadata"]["ownerReferences"][0]["uid"] == UID for o in objs)


def test_spec_caches_become_cache_options_the_real_member_command_accepts(tmp_path: Path) -> None:
    from groupcluster.grid.caches import parse_cache_specs

    s = spec(
        numOwners=3,
        caches=[
            {"name": "sessions", "mode": "replicated", "numSegments": 64},
            {"name": "near", "mode": "invalidation", "params": {"max_entries": "1000"}},
            {"name": "audit", "numOwners": 2, "params": {"op_timeout": "20s"}},
        ],
    )
    container = builders.build_member_pod(s, UID, 1, initial_cluster_size=2)["spec"]["containers"][0]
    ns = _parse_member_args(container["args"], _secret_files(tmp_path, s))
    assert ns.caches == [
        "sessions:mode=replicated,num_segments=64",
        "near:mode=invalidation,max_entries=1000",
        "audit:mode=distributed,num_owners=2,op_timeout=20s",
    ]
    specs = {c.name: c for c in parse_cache_specs(ns.caches)}  # what the member would refuse, it refuses here
    assert specs["near"].invalidation is not None and specs["near"].invalidation.max_entries == 1000
    assert specs["audit"].grid is not None and specs["audit"].grid.op_timeout == 20.0
    # The audit cache's 2 owners bound the members leaving at once, not the default cache's 3.
    assert s.max_leaving == 1 and spec(numOwners=3).max_leaving == 2
    assert s.pod_hash() != spec(numOwners=3).pod_hash()


@pytest.mark.parametrize(
    ("caches", "message"),
    [
        ([{"name": "Bad"}], r"spec.caches\[0\].name: 'Bad' must be 1 to 48 characters"),
        ([{"name": "default"}], r"not 'default', the grid's own cache"),
        ([{"name": "a"}, {"name": "a"}], r"spec.caches: 'a' is listed twice"),
        ([{"name": "a", "mode": "nearline"}], r"spec.caches\[0\] \(a\).mode: 'nearline' is not one of"),
        ([{"name": "a", "mode": "replicated", "numOwners": 2}], r"numOwners: only for distributed caches"),
        ([{"name": "a", "mode": "invalidation", "numSegments": 8}], r"an invalidation cache has no segments"),
        ([{"name": "a", "numOwners": 0}], r"spec.caches\[0\] \(a\).numOwners: expected an integer in \[1, 16\]"),
        ([{"name": "a", "params": {"mode": "replicated"}}], r"params: key 'mode' is not a cache parameter"),
        ([{"name": "a", "params": {"op_timeout": "1s,mode=x"}}], r"params.op_timeout: '1s,mode=x' must be one word"),
        ([{"name": "a", "size": 3}], r"spec.caches\[0\]: unknown field\(s\) size"),
        ({"name": "a"}, r"spec.caches: expected a list of caches"),
    ],
)
def test_bad_spec_caches_are_refused_naming_the_entry(caches: Any, message: str) -> None:
    from groupcluster_operator.model import SpecError

    with pytest.raises(SpecError, match=message):
        spec(caches=caches)
