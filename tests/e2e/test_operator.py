"""The operator end to end on the real local control plane (scripts/local-kube).

The Helm chart is installed with its defaults (namespaced: a Role, no ClusterRole; the operator runs as two
pods of the project's image on the local node, peering: one reconciles, the other stands by) and reconciles at
once, without an ERROR in its log. A GroupCluster
with an image that cannot run is applied first and stays in the background: its members are replaced with a
back-off and the reason reaches its status. A GroupCluster of 3 is applied and waited for with ``kubectl wait
--for=condition=Ready``, 10,000 keys are written through the members' HTTP API, the cluster is scaled to 5
with ``kubectl scale``, a member process is killed and replaced, a member pod is deleted and replaced, the
cluster is scaled to 2 (not to 1: numOwners 2 needs 2 members), and every key is read back after each step.
Then a member of the 2 is killed: the grid is degraded, which the status, an event and the operator log say.
An invalid GroupCluster is rejected by the API server, deleting the GroupCluster removes what it owned, and
``helm uninstall`` hands the broken GroupCluster over (it can then be deleted without an operator) and leaves
nothing behind. A second test shows the members' Kubernetes discovery naming the missing permission when RBAC
forbids it.
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from groupcluster.grid.client import GridClient
from groupcluster_operator.failures import failure_backoff
from groupcluster_operator.peering import peering_manifests

from .groupclusters import CLUSTER_LABEL, gc_events, get_gc, member_pods, settled, wait_settled
from .kubeharness import Kube, wait_for

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "groupcluster"
KEYS = 10_000

# The session fixture's set-up (a cold build of the binaries on a fresh machine) counts in the first test.
pytestmark = pytest.mark.timeout(1800)


def _initial_sizes(kube: Kube, ns: str) -> dict[str, str | None]:
    """Each member pod's ``--grid-set initial_cluster_size=N`` (None without one), by pod name."""
    out: dict[str, str | None] = {}
    for pod in member_pods(kube, ns):
        args = pod["spec"]["containers"][0]["args"]
        sets = [args[i + 1] for i, a in enumerate(args[:-1]) if a == "--grid-set"]
        sizes = [v.partition("=")[2] for v in sets if v.startswith("initial_cluster_size=")]
        assert len(sizes) <= 1, f"{pod['metadata']['name']}: initial_cluster_size set twice: {args}"
        out[pod["metadata"]["name"]] = sizes[0] if sizes else None
    return out


def _client(kube: Kube, ns: str) -> GridClient:
    urls = [f"http://{p['status']['podIP']}:8080" for p in member_pods(kube, ns) if p["status"].get("podIP")]
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


def _condition(gc: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in (gc.get("status") or {}).get("conditions") or () if c["type"] == kind), {})


def _time(text: str) -> datetime.datetime:
    return datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.UTC)


# kopf's retries of a forbidden request: 1+1+2+3+5+8+13+21 s. A namespaced operator that still scanned
# namespaces and CRDs cluster-wide waited out this whole schedule before it reconciled anything.
KOPF_RETRY_SECONDS = 54
# From the operator's start to its first step: Python and kopf starting, one discovery request, one list of
# pods, one create, on a 2-core machine shared with other jobs. Far below the retry schedule above.
FIRST_STEP_BOUND = 30


def test_helm_install_scale_kill_and_uninstall(kube: Kube, namespace: str) -> None:
    ns = namespace
    lint = kube.helm("lint", str(CHART))
    assert "0 chart(s) failed" in lint.stdout and "[WARNING]" not in lint.stdout, lint.stdout
    # values.schema.json: a misspelt value is refused, naming it, instead of being ignored.
    typo = kube.helm("template", "gco", str(CHART), "--set", "image.repositry=x", check=False)
    assert typo.returncode != 0 and "repositry" in typo.stderr and "not allowed" in typo.stderr, typo.stderr
    # An operator pod can start before Helm creates the chart's custom resources and make the missing peering
    # object itself: made first here as the chart's operator makes it, the install must adopt it, not fail.
    rendered = kube.helm("template", "gco", str(CHART), "-n", ns).stdout
    args = next(
        doc["spec"]["template"]["spec"]["containers"][0]["args"]
        for doc in yaml.safe_load_all(rendered)
        if doc and doc["kind"] == "Deployment"
    )
    marks: dict[str, dict[str, str]] = {"labels": {}, "annotations": {}}
    for arg in args:
        for flag, kind in (("--peering-label=", "labels"), ("--peering-annotation=", "annotations")):
            if arg.startswith(flag):
                key, _, value = arg.removeprefix(flag).partition("=")
                marks[kind][key] = value
    (early,) = peering_manifests("gco-groupcluster", [ns], marks)
    # The peering CRDs are the chart's (crds/): Helm leaves CRDs that already exist as they are.
    kube.kubectl("apply", "-f", str(CHART / "crds" / "kopf-peering.yaml"))
    kube.kubectl("wait", "--for=condition=Established", "crd/kopfpeerings.kopf.dev", "--timeout=60s")
    kube.kubectl("create", "-f", "-", input=json.dumps(early))
    kube.helm("install", "gco", str(CHART), "-n", ns, "--set", "operator.interval=1", "--wait", "--timeout", "120s")
    kube.kubectl("wait", "--for=condition=Established", "crd/groupclusters.groupcluster.io", "--timeout=60s")
    ops = kube.json("get", "pods", "-n", ns, "-l", "app.kubernetes.io/component=operator")["items"]
    # Two replicas by default, peering through kopf: one reconciles, the other stands by.
    assert len(ops) == 2 and {o["spec"]["serviceAccountName"] for o in ops} == {"gco-groupcluster"}
    assert kube.json("get", "kopfpeering", "gco-groupcluster", "-n", ns)["metadata"]["name"] == "gco-groupcluster"
    # The default install is namespaced: a Role, no ClusterRole.
    assert kube.json("get", "role", "gco-groupcluster", "-n", ns)["rules"]
    assert kube.kubectl("get", "clusterrole", "gco-groupcluster", check=False).returncode != 0
    explain = kube.kubectl("explain", "groupcluster.spec.numOwners").stdout
    assert "Copies of every segment" in explain

    # An image that cannot run (the local node runs only the project's image without a command): every member
    # exits at once. It stays while the rest of the test runs, so its back-off has time to grow.
    broken = {
        "apiVersion": "groupcluster.io/v1alpha1",
        "kind": "GroupCluster",
        "metadata": {"name": "broken", "namespace": ns},
        "spec": {"replicas": 1, "numOwners": 1, "image": "registry.invalid/nosuch:1"},
    }
    kube.kubectl("apply", "-f", "-", input=json.dumps(broken))
    broken_applied = time.monotonic()

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
    # The Ready condition: kubectl can wait for it.
    kube.kubectl("wait", "--for=condition=Ready", "groupcluster/demo", "-n", ns, "--timeout=150s", timeout=180)
    gc = wait_settled(kube, ns, 3)
    # The operator's first step came right after its start, not after kopf's retries of forbidden cluster-wide
    # scans (which took the ~54 s of KOPF_RETRY_SECONDS before anything happened).
    # From the first replica's start: the oldest one is the one at work.
    started = min(_time(o["status"]["containerStatuses"][0]["state"]["running"]["startedAt"]) for o in ops)
    first_pod = min(
        _time(p["metadata"]["creationTimestamp"]) for p in member_pods(kube, ns) + member_pods(kube, ns, "broken")
    )
    first_step = (first_pod - started).total_seconds()
    assert first_step < FIRST_STEP_BOUND < KOPF_RETRY_SECONDS, f"first member pod {first_step:.0f} s after the start"
    print(f"operator start -> first member pod: {first_step:.0f} s")
    # READY as ready/wanted, the view short and readable; the full view id stays in the status.
    table = kube.kubectl("get", "groupcluster", "demo", "-n", ns).stdout.splitlines()
    assert table[0].split()[:4] == ["NAME", "READY", "PHASE", "VIEW"], table
    assert table[1].split()[1:3] == ["3/3", "Running"] and "3 members" in table[1], table
    assert gc["status"]["view"].startswith("demo-") and gc["status"]["view"].endswith(", 3 members")
    assert _condition(gc, "Ready")["reason"] == "AllMembersReady"
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
    # The headless Service of the members' DNS names, and the client Service named after the cluster.
    assert kube.json("get", "svc", "demo-members", "-n", ns)["spec"]["clusterIP"] == "None"
    client_svc = kube.json("get", "svc", "demo", "-n", ns)["spec"]
    assert client_svc["type"] == "ClusterIP" and client_svc["clusterIP"] != "None"
    assert gc["status"]["clientService"] == "demo"

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
    gc = wait_settled(kube, ns, 5)
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
    victim = next(p for p in member_pods(kube, ns) if p["metadata"]["name"] != gc["status"]["coordinator"])
    uid, name = victim["metadata"]["uid"], victim["metadata"]["name"]
    survivors = {p["metadata"]["name"] for p in member_pods(kube, ns)} - {name}
    pids = kube.pod_pids(uid)
    assert pids, f"no process for pod {name}"
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    wait_for("a MemberDied event", lambda: gc_events(kube, ns, "MemberDied"), 60, 1.0)
    wait_for(
        f"pod {name} replaced",
        lambda: all(p["metadata"]["uid"] != uid for p in member_pods(kube, ns)) and settled(kube, ns, 5),
        150,
        1.0,
    )
    _check_all_keys(kube, ns, expected, "after a member was killed and replaced")
    sizes = _initial_sizes(kube, ns)
    (replacement,) = set(sizes) - survivors
    assert sizes[replacement] == "5", f"{replacement} should have joined the 4 members left: {sizes}"

    # A member pod deleted by hand: it hands its data off and leaves, and the operator says it replaces it
    # (not "scaling up").
    gc = get_gc(kube, ns)
    deleted = next(p for p in member_pods(kube, ns) if p["metadata"]["name"] != gc["status"]["coordinator"])
    name = deleted["metadata"]["name"]
    kube.kubectl("delete", "pod", name, "-n", ns, "--wait=false")
    wait_for("a MemberDeleted event", lambda: gc_events(kube, ns, "MemberDeleted"), 60, 1.0)
    wait_for(
        f"pod {name} replaced",
        lambda: (
            all(p["metadata"]["uid"] != deleted["metadata"]["uid"] for p in member_pods(kube, ns))
            and settled(kube, ns, 5)
        ),
        150,
        1.0,
    )
    created = [e["message"] for e in gc_events(kube, ns, "MemberCreated", "demo")]
    assert any(f"replacing {name} (pod deleted)" in m for m in created), created
    # Replaced: nothing left to replace (the field is in the CRD's schema, or the API server would prune it).
    assert get_gc(kube, ns)["status"]["pendingReplacements"] == []
    _check_all_keys(kube, ns, expected, "after a member pod was deleted and replaced")

    kube.kubectl("scale", "groupcluster/demo", "-n", ns, "--replicas=2")
    gc = wait_settled(kube, ns, 2, timeout=200)
    assert {m["pod"] for m in gc["status"]["members"]} == {p["metadata"]["name"] for p in member_pods(kube, ns)}
    _check_all_keys(kube, ns, expected, "after scaling down to 2")
    assert len(gc_events(kube, ns, "MemberLeft")) >= 3  # each of the leaves was graceful
    # Fewer members than copies is refused (scale subresource included), naming the rule; 2 stay.
    res = kube.kubectl("scale", "groupcluster/demo", "-n", ns, "--replicas=1", check=False)
    assert res.returncode != 0 and "numOwners must not exceed replicas" in res.stderr, res.stderr
    assert kube.json("get", "pdb", "demo", "-n", ns)["spec"]["maxUnavailable"] == 1

    # One of the last two members dies: the survivor holds every segment but only half of the last stable
    # members, so the grid is degraded (docs/operator.md, "Known limits"). The status says so, not "waiting for
    # a member to join".
    victim = next(p for p in member_pods(kube, ns) if p["metadata"]["name"] != gc["status"]["coordinator"])
    for pid in kube.pod_pids(victim["metadata"]["uid"]):
        os.kill(pid, signal.SIGKILL)

    def grid_degraded() -> dict[str, Any] | None:
        gc = get_gc(kube, ns)
        cond = _condition(gc, "Degraded")
        return gc if cond.get("status") == "True" and cond.get("reason") == "GridDegraded" else None

    gc = wait_for("the Degraded condition with reason GridDegraded", grid_degraded, 90, 1.0)
    st = gc["status"]
    assert st["phase"] == "Degraded" and st["message"].startswith("the grid is degraded: every segment still has")
    assert "to join" not in st["message"] and "reads and writes are refused" in st["message"], st["message"]
    assert _condition(gc, "Ready")["status"] == "False"
    warned = gc_events(kube, ns, "GridDegraded", "demo")
    assert warned and all(e["type"] == "Warning" and "force-available" in e["message"] for e in warned), warned

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

    # The broken GroupCluster, all along: its members were replaced with a back-off (without one this machine
    # made ~26 pods in 54 s, one per exit), and the reason is in its status, its Ready condition and events.
    gc = get_gc(kube, ns, "broken")
    st, age = gc["status"], time.monotonic() - broken_applied
    print(f"broken GroupCluster: {st['failures']['count']} member exits in {age:.0f} s")
    # The schedule allows this many exits in `age` seconds (5 s doubling from the second on; +1 for the one that
    # may be starting); without a back-off it would be one every second or two.
    allowed, waited = 1, 0
    while waited + failure_backoff(allowed) <= age:
        waited += failure_backoff(allowed)
        allowed += 1
    assert age > 30 and 3 <= st["failures"]["count"] <= allowed + 1 < age / 4, (age, allowed, st["failures"])
    assert "is not the project's image" in st["failures"]["lastReason"], st["failures"]
    ready = _condition(gc, "Ready")
    if st["phase"] == "Failing":  # in a back-off (else a new member is being tried right now)
        assert ready["reason"] == "MemberFailing" and "next attempt in" in st["message"], st
        assert st["failures"]["failedPods"] and st["failures"]["retryAfter"]
    assert ready["status"] == "False"
    died = gc_events(kube, ns, "MemberDied", "broken")
    assert died and all(e["type"] == "Warning" for e in died)
    assert any("StartError" in e["message"] and "exits in a row" in e["message"] for e in died), died
    assert len(member_pods(kube, ns, "broken")) <= 2  # a failed pod kept for inspection, perhaps its successor

    # The operator's log at the chart's default level: its steps and warnings, no ERROR, none of kopf's per-run
    # "Timer ... succeeded" lines, no access-log line per liveness probe.
    logs = [kube.pod_log_file(ns, o["metadata"]["name"], "operator").read_text(errors="replace") for o in ops]
    log = "\n".join(logs)
    errors = [line for line in log.splitlines() if " ERROR " in line]
    assert not errors, "\n".join(errors[:5])
    # Exactly one of the two replicas worked; the other stood by all along.
    assert [("active replica of peering" in text) for text in logs].count(True) == 1, logs
    assert "Timer 'reconcile' succeeded" not in log
    assert "aiohttp.access" not in log
    assert f"{ns}/demo: GridDegraded: the grid is degraded" in log and f"{ns}/broken: MemberDied:" in log

    # helm uninstall with a GroupCluster left: the pre-delete hook stops the operator and hands the cluster
    # over; it keeps its objects (nothing deletes them) and is no longer blocked by the operator's finalizer.
    kube.helm("uninstall", "gco", "-n", ns, "--wait", "--timeout", "120s")
    gc = get_gc(kube, ns, "broken")
    assert "groupcluster.io/operator" not in (gc["metadata"].get("finalizers") or []), gc["metadata"]
    assert kube.json("get", "svc", "broken", "-n", ns)["metadata"]["name"] == "broken"
    kube.kubectl("delete", "groupcluster", "broken", "-n", ns, "--timeout=30s", timeout=60)
    wait_for(
        "the handed-over GroupCluster's objects to be garbage-collected",
        lambda: not kube.json("get", kinds, "-n", ns, "-l", f"{CLUSTER_LABEL}=broken")["items"],
        90,
        1.0,
    )

    def leftovers() -> list[str]:
        kinds = "deployments,replicasets,jobs,pods,services,roles,rolebindings,serviceaccounts"
        items = kube.json("get", kinds, "-n", ns)
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
