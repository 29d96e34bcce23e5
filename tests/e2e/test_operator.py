"""The operator end to end on the real local control plane (scripts/local-kube).

The Helm chart is installed (the operator runs as a pod of the project's image on the local node), a
GroupCluster of 3 is applied, 10,000 keys are written through the members' HTTP API, the cluster is scaled
to 5 with ``kubectl scale``, a member process is killed and replaced, the cluster is scaled to 2, and every
key is read back after each step. An invalid GroupCluster is rejected by the API server, deleting the
GroupCluster removes what it owned, and ``helm uninstall`` leaves nothing behind. A second test shows the
members' Kubernetes discovery naming the missing permission when RBAC forbids it.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from groupcluster.grid.client import GridClient

from .conftest import Kube, wait_for

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "groupcluster"
KEYS = 10_000
CLUSTER_LABEL = "groupcluster.io/cluster"

# The session fixture's set-up (a cold build of the binaries on a fresh machine) counts in the first test.
pytestmark = pytest.mark.timeout(1800)


def _gc(kube: Kube, ns: str, name: str = "demo") -> dict[str, Any]:
    return kube.json("get", "groupcluster", name, "-n", ns)


def _member_pods(kube: Kube, ns: str, name: str = "demo") -> list[dict[str, Any]]:
    return kube.json("get", "pods", "-n", ns, "-l", f"{CLUSTER_LABEL}={name}")["items"]


def _initial_sizes(kube: Kube, ns: str) -> dict[str, str | None]:
    """Each member pod's ``--grid-set initial_cluster_size=N`` (None without one), by pod name."""
    out: dict[str, str | None] = {}
    for pod in _member_pods(kube, ns):
        args = pod["spec"]["containers"][0]["args"]
        sets = [args[i + 1] for i, a in enumerate(args[:-1]) if a == "--grid-set"]
        sizes = [v.partition("=")[2] for v in sets if v.startswith("initial_cluster_size=")]
        assert len(sizes) <= 1, f"{pod['metadata']['name']}: initial_cluster_size set twice: {args}"
        out[pod["metadata"]["name"]] = sizes[0] if sizes else None
    return out


def _settled(kube: Kube, ns: str, n: int) -> dict[str, Any] | None:
    """The GroupCluster once n members are ready in one view and nothing is moving; else None."""
    gc = _gc(kube, ns)
    st = gc.get("status") or {}
    conds = {c["type"]: c["status"] for c in st.get("conditions") or ()}
    pods = [p for p in _member_pods(kube, ns) if not p["metadata"].get("deletionTimestamp")]
    ok = (
        st.get("phase") == "Running"
        and st.get("replicas") == n
        and st.get("readyReplicas") == n
        and len(pods) == n
        and conds.get("WellFormed") == "True"
        and conds.get("Rebalancing") == "False"
        and len(st.get("members") or ()) == n
    )
    return gc if ok else None


def _wait_settled(kube: Kube, ns: str, n: int, timeout: float = 150) -> dict[str, Any]:
    return wait_for(f"GroupCluster demo settled with {n} members", lambda: _settled(kube, ns, n), timeout, 1.0)


def _client(kube: Kube, ns: str) -> GridClient:
    urls = [f"http://{p['status']['podIP']}:8080" for p in _member_pods(kube, ns) if p["status"].get("podIP")]
    return GridClient(urls, timeout=30)


# spec.grid.max_entries of the test's cluster: far above what it writes (the status reports it, Full stays False).
BOUND = 1_000_000


def _expected() -> dict[bytes, bytes]:
    return {f"key-{i:05d}".encode(): f"value-{i}-{'x' * (i % 50)}".encode() for i in range(KEYS)}


def _check_all_keys(kube: Kube, ns: str, expected: dict[bytes, bytes], when: str) -> None:
    client = _client(kube, ns)
    try:
        got = client.get_many(list(expected))
    finally:
        client.close()
    missing = [k for k, v in expected.items() if got.get(k) != v]
    assert not missing, f"{when}: {len(missing)} of {len(expected)} keys lost or wrong, e.g. {missing[:3]}"


def _events(kube: Kube, ns: str, reason: str) -> list[dict[str, Any]]:
    items = kube.json("get", "events", "-n", ns, "--field-selector", f"reason={reason}")["items"]
    return [e for e in items if e["involvedObject"].get("kind") == "GroupCluster"]


def test_helm_install_scale_kill_and_uninstall(kube: Kube, namespace: str) -> None:
    ns = namespace
    lint = kube.helm("lint", str(CHART))
    assert "0 chart(s) failed" in lint.stdout and "[WARNING]" not in lint.stdout, lint.stdout
    kube.helm("install", "gco", str(CHART), "-n", ns, "--set", "operator.interval=1", "--wait", "--timeout", "120s")
    kube.kubectl("wait", "--for=condition=Established", "crd/groupclusters.groupcluster.io", "--timeout=60s")
    (op,) = kube.json("get", "pods", "-n", ns, "-l", "app.kubernetes.io/component=operator")["items"]
    assert op["spec"]["serviceAccountName"] == "gco-groupcluster"
    explain = kube.kubectl("explain", "groupcluster.spec.numOwners").stdout
    assert "Copies of every segment" in explain

    manifest = {
        "apiVersion": "groupcluster.io/v1alpha1",
        "kind": "GroupCluster",
        "metadata": {"name": "demo", "namespace": ns},
        "spec": {
            "replicas": 3,
            "numOwners": 2,
            "stack": {"set": {"fd.timeout": "3s"}},
            "grid": {"max_entries": str(BOUND)},
        },
    }
    kube.kubectl("apply", "-f", "-", input=json.dumps(manifest))
    gc = _wait_settled(kube, ns, 3)
    # Members after the first are join-only: each was created while k members were ready, with k+1, so a
    # failed join cannot start a second, empty grid (docs/operator.md). The first may start the grid alone.
    assert _initial_sizes(kube, ns) == {"demo-0": "1", "demo-1": "2", "demo-2": "3"}
    st = gc["status"]
    assert st["selector"] == f"{CLUSTER_LABEL}=demo" and st["viewId"] and st["coordinator"].startswith("demo-")
    assert gc["spec"]["numSegments"] == 256  # the CRD's default, applied by the API server
    # The members found each other through the API server: the RBAC the operator created allows it.
    for kind, name in (("sa", "demo-member"), ("role", "demo-member"), ("rolebinding", "demo-member")):
        kube.kubectl("get", kind, name, "-n", ns)
    assert kube.json("get", "pdb", "demo", "-n", ns)["spec"]["maxUnavailable"] == 1
    assert kube.json("get", "svc", "demo", "-n", ns)["spec"]["clusterIP"] == "None"

    expected = _expected()
    client = _client(kube, ns)
    try:
        client.put_many(expected)
    finally:
        client.close()
    _check_all_keys(kube, ns, expected, "after writing on 3 members")

    def counted() -> dict[str, Any] | None:
        # The members' entry counts and bound reach the GroupCluster's status (the CRD keeps the fields).
        gc = kube.json("get", "groupcluster", "demo", "-n", ns)
        members = gc.get("status", {}).get("members") or []
        if sum(m.get("entries", 0) for m in members) == 2 * len(expected):
            return gc
        return None

    gc = wait_for("the members' entries in the status", counted, 60, 1.0)
    assert {m["maxEntries"] for m in gc["status"]["members"]} == {BOUND}
    assert {c["type"]: c["status"] for c in gc["status"]["conditions"]}["Full"] == "False"

    # kubectl scale goes through the scale subresource.
    kube.kubectl("scale", "groupcluster/demo", "-n", ns, "--replicas=5")
    gc = _wait_settled(kube, ns, 5)
    scale = json.loads(
        kube.kubectl("get", "--raw", f"/apis/groupcluster.io/v1alpha1/namespaces/{ns}/groupclusters/demo/scale").stdout
    )
    assert scale["spec"]["replicas"] == 5 and scale["status"]["replicas"] == 5
    assert scale["status"]["selector"] == f"{CLUSTER_LABEL}=demo"
    sizes = _initial_sizes(kube, ns)
    assert (sizes["demo-3"], sizes["demo-4"]) == ("4", "5")
    # Per pod, not a spec change: every member still counts as up to date (nobody is rolled for it).
    assert all(m["upToDate"] for m in gc["status"]["members"]), gc["status"]["members"]
    _check_all_keys(kube, ns, expected, "after scaling to 5")

    # Kill a member's process outright (not the coordinator, so the survivors keep a majority either way).
    victim = next(p for p in _member_pods(kube, ns) if p["metadata"]["name"] != gc["status"]["coordinator"])
    uid, name = victim["metadata"]["uid"], victim["metadata"]["name"]
    survivors = {p["metadata"]["name"] for p in _member_pods(kube, ns)} - {name}
    pids = kube.pod_pids(uid)
    assert pids, f"no process for pod {name}"
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    wait_for("a MemberDied event", lambda: _events(kube, ns, "MemberDied"), 60, 1.0)
    wait_for(
        f"pod {name} replaced",
        lambda: all(p["metadata"]["uid"] != uid for p in _member_pods(kube, ns)) and _settled(kube, ns, 5),
        150,
        1.0,
    )
    _check_all_keys(kube, ns, expected, "after a member was killed and replaced")
    sizes = _initial_sizes(kube, ns)
    (replacement,) = set(sizes) - survivors
    assert sizes[replacement] == "5", f"{replacement} should have joined the 4 members left: {sizes}"

    kube.kubectl("scale", "groupcluster/demo", "-n", ns, "--replicas=2")
    gc = _wait_settled(kube, ns, 2, timeout=200)
    assert {m["pod"] for m in gc["status"]["members"]} == {p["metadata"]["name"] for p in _member_pods(kube, ns)}
    _check_all_keys(kube, ns, expected, "after scaling down to 2")
    assert len(_events(kube, ns, "MemberLeft")) >= 3  # each of the leaves was graceful

    # The API server rejects an invalid GroupCluster, naming each bad field.
    bad = {
        "apiVersion": "groupcluster.io/v1alpha1",
        "kind": "GroupCluster",
        "metadata": {"name": "bad", "namespace": ns},
        "spec": {"replicas": -1, "numOwners": 40, "partitionHandling": "Sometimes"},
    }
    res = kube.kubectl("apply", "-f", "-", input=json.dumps(bad), check=False)
    assert res.returncode != 0
    assert 'The GroupCluster "bad" is invalid' in res.stderr, res.stderr
    assert "spec.numOwners" in res.stderr and "less than or equal to 16" in res.stderr
    assert "spec.replicas" in res.stderr and "spec.partitionHandling" in res.stderr
    # Named caches: bad entries are refused (the schema first, then its rules), and the list is fixed at creation.
    bad["spec"] = {"caches": [{"name": "x", "mode": "nearline"}, {"name": "Bad"}]}
    res = kube.kubectl("apply", "-f", "-", input=json.dumps(bad), check=False)
    assert res.returncode != 0 and "spec.caches[0].mode" in res.stderr and "spec.caches[1].name" in res.stderr
    bad["spec"] = {"caches": [{"name": "default"}, {"name": "r", "mode": "replicated", "numOwners": 2}]}
    res = kube.kubectl("apply", "-f", "-", input=json.dumps(bad), check=False)
    assert res.returncode != 0 and "'default' is the grid's own cache" in res.stderr, res.stderr
    assert "numOwners is only for distributed caches" in res.stderr, res.stderr
    patch = json.dumps({"spec": {"caches": [{"name": "sessions", "mode": "replicated"}]}})
    res = kube.kubectl("patch", "groupcluster", "demo", "-n", ns, "--type", "merge", "-p", patch, check=False)
    assert res.returncode != 0 and "caches cannot be changed after creation" in res.stderr, res.stderr

    # Deleting the GroupCluster removes everything it owned (owner references; the operator drops its finalizer).
    # Up to 150 s: once, on a loaded machine, kopf logged the deletion processed but the finalizer stayed until
    # its next pass a minute later (after a re-authentication), past the 60 s this waited then.
    kube.kubectl("delete", "groupcluster", "demo", "-n", ns, "--timeout=150s", timeout=180)
    kinds = "pods,serviceaccounts,roles,rolebindings,services,poddisruptionbudgets"
    wait_for(
        "the GroupCluster's objects to be garbage-collected",
        lambda: not kube.json("get", kinds, "-n", ns, "-l", f"{CLUSTER_LABEL}=demo")["items"],
        90,
        1.0,
    )

    kube.helm("uninstall", "gco", "-n", ns, "--wait", "--timeout", "120s")

    def leftovers() -> list[str]:
        items = kube.json("get", "deployments,replicasets,pods,services,roles,rolebindings,serviceaccounts", "-n", ns)
        names = [f"{i['kind']}/{i['metadata']['name']}" for i in items["items"]]
        # The namespace's own default account is Kubernetes', not the chart's.
        return [n for n in names if n != "ServiceAccount/default"]

    wait_for("nothing left after helm uninstall", lambda: not leftovers() or None, 60, 1.0)
    # Helm never deletes CRDs (documented): removing the CRD is a separate, deliberate step.
    kube.kubectl("get", "crd", "groupclusters.groupcluster.io")
    kube.kubectl("delete", "crd", "groupclusters.groupcluster.io", "--timeout=60s", timeout=90)


def test_discovery_without_rbac_names_the_missing_permission(kube: Kube, namespace: str) -> None:
    ns = namespace
    kube.kubectl("create", "serviceaccount", "nobody", "-n", ns)
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "lonely", "namespace": ns, "labels": {CLUSTER_LABEL: "lonely"}},
        "spec": {
            "serviceAccountName": "nobody",
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "member",
                    "image": "groupcluster:test",
                    "args": ["member", "--cluster", "lonely", "--bind", "$(POD_IP):7800", "--kube-discovery"],
                    "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
                }
            ],
        },
    }
    kube.kubectl("apply", "-f", "-", input=json.dumps(pod))
    wait_for("the pod to run", lambda: kube.json("get", "pod", "lonely", "-n", ns)["status"].get("phase") == "Running")
    log_file = kube.pod_log_file(ns, "lonely", "member")

    def said() -> str | None:
        text = log_file.read_text(errors="replace") if log_file.exists() else ""
        return text if "list pods in namespace" in text else None

    text = wait_for("the 403 log line", said, 30, 0.5)
    assert f"list pods in namespace {ns}" in text
    assert f"system:serviceaccount:{ns}:nobody" in text
    # Granting the permission fixes it without a restart: the member finds itself and logs no new 403.
    kube.kubectl("create", "role", "lister", "--verb=list", "--resource=pods", "-n", ns)
    kube.kubectl("create", "rolebinding", "lister", "--role=lister", f"--serviceaccount={ns}:nobody", "-n", ns)
    time.sleep(8)  # two discovery rounds (3 s apart) after the binding
    after = log_file.read_text(errors="replace")
    assert after.count("forbidden (403)") == text.count("forbidden (403)")
    assert "no peer found in namespace" in after
    kube.kubectl("delete", "pod", "lonely", "-n", ns, "--wait=false")
