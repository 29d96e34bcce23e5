"""The client Service and two peering operator replicas, end to end on the real local control plane.

The operators run as processes on the machine (``groupcluster operator --kubeconfig``, as one runs it outside a
cluster), so a test can SIGKILL one and read each one's log.

* The client Service ``NAME``: a ClusterIP Service owned by the GroupCluster, selecting only its member pods,
  exposing their HTTP port, publishing only ready members; the headless ``NAME-members`` keeps publishing members
  that are not ready. The local control plane has no kube-proxy and its pods have loopback addresses, which the API
  server refuses in an EndpointSlice: the EndpointSlice controller's refused attempts (its events) show which pods
  it selected, and the Service's endpoints are read as that controller computes them (the pods its selector
  matches, ready or not by their Ready condition). A member just created is not a ready endpoint until it is
  ready, and a PUT and GET through a ready endpoint's address work.
* Two operators peering through kopf: the older one reconciles, the other stands by (its log says nothing of the
  GroupCluster); the active one is SIGKILLed during a scale-up, the standby takes over and finishes it with every
  member kept and every key readable.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from groupcluster.grid.client import GridClient

from .kubeharness import Kube, wait_for

REPO = Path(__file__).resolve().parents[2]
CLUSTER_LABEL = "groupcluster.io/cluster"
GROUPCLUSTER = Path(sys.executable).parent / "groupcluster"

pytestmark = pytest.mark.timeout(900)


class Operator:
    """One ``groupcluster operator`` process in its own session, logging to a file."""

    def __init__(self, kube: Kube, ns: str, log: Path, peering: str | None) -> None:
        args = [
            str(GROUPCLUSTER), "--log-level=INFO", "operator", f"--kubeconfig={kube.kubeconfig}", "-n", ns,
            "--interval=1", "--member-image=groupcluster:test",
        ]  # fmt: skip
        if peering:
            args.append(f"--peering={peering}")
        env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_SERVICE_")}
        self.log = log
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)

    def stop(self) -> None:
        self.kill(signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.kill()
            self.proc.wait(10)


@pytest.fixture
def operators(kube: Kube, tmp_path: Path) -> Iterator[list[Operator]]:
    """Operators a test starts (appended to the list); all stopped at the end. The CRDs are applied first."""
    kube.kubectl("apply", "-f", str(REPO / "crds"))
    kube.kubectl("wait", "--for=condition=Established", "crd/groupclusters.groupcluster.io", "--timeout=60s")
    kube.kubectl("wait", "--for=condition=Established", "crd/kopfpeerings.kopf.dev", "--timeout=60s")
    started: list[Operator] = []
    try:
        yield started
    finally:
        for op in started:
            op.stop()


def _apply_cluster(kube: Kube, ns: str, name: str, replicas: int) -> None:
    manifest = {
        "apiVersion": "groupcluster.io/v1alpha1",
        "kind": "GroupCluster",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"replicas": replicas, "numOwners": 2, "stack": {"set": {"fd.timeout": "3s"}}},
    }
    kube.kubectl("apply", "-f", "-", input=json.dumps(manifest))


def _members(kube: Kube, ns: str, name: str) -> list[dict[str, Any]]:
    return kube.json("get", "pods", "-n", ns, "-l", f"{CLUSTER_LABEL}={name}")["items"]


def _ready(pod: dict[str, Any]) -> bool:
    conds = (pod.get("status") or {}).get("conditions") or ()
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conds)


def _wait_ready(kube: Kube, ns: str, name: str, n: int, timeout: float = 180) -> dict[str, Any]:
    def ready() -> dict[str, Any] | None:
        gc = kube.json("get", "groupcluster", name, "-n", ns)
        st = gc.get("status") or {}
        conds = {c["type"]: c["status"] for c in st.get("conditions") or ()}
        pods = [p for p in _members(kube, ns, name) if not p["metadata"].get("deletionTimestamp")]
        ok = conds.get("Ready") == "True" and st.get("readyReplicas") == n and len(pods) == n
        return gc if ok and st.get("phase") == "Running" else None

    return wait_for(f"GroupCluster {name} Ready with {n} members", ready, timeout, 1.0)


def _service_endpoints(kube: Kube, ns: str, service: str) -> dict[str, tuple[bool, int]]:
    """The Service's endpoints as the EndpointSlice controller computes them: pod IP -> (ready, target port).

    The pods its selector matches that have an IP and are not being deleted; ready when the pod's Ready condition
    is True or the Service publishes not-ready addresses; the port is the container port its targetPort names.
    """
    svc = kube.json("get", "svc", service, "-n", ns)["spec"]
    selector = ",".join(f"{k}={v}" for k, v in sorted(svc["selector"].items()))
    (port,) = svc["ports"] if len(svc["ports"]) == 1 else [p for p in svc["ports"] if p["name"] == "http"]
    out = {}
    for pod in kube.json("get", "pods", "-n", ns, "-l", selector)["items"]:
        ip = pod["status"].get("podIP")
        if not ip or pod["metadata"].get("deletionTimestamp") or pod["status"].get("phase") != "Running":
            continue
        named = {p["name"]: p["containerPort"] for c in pod["spec"]["containers"] for p in c.get("ports") or ()}
        target = port["targetPort"]
        out[ip] = (_ready(pod) or bool(svc.get("publishNotReadyAddresses")), named.get(target, target))
    return out


def _slice_attempts(kube: Kube, ns: str, service: str) -> list[set[str]]:
    """The address sets the EndpointSlice controller tried to publish for the Service (each refused here: the API
    server rejects loopback endpoint addresses), from its FailedToUpdateEndpointSlices events."""
    events = kube.json("get", "events", "-n", ns, "--field-selector", "reason=FailedToUpdateEndpointSlices")["items"]
    return [
        set(re.findall(r'addresses\[0\]: Invalid value: "([0-9.]+)"', e["message"]))
        for e in events
        if e["involvedObject"].get("kind") == "Service" and e["involvedObject"].get("name") == service
    ]


def _http(method: str, url: str, body: bytes | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=body, method=method)
    with urllib.request.urlopen(req, timeout=10) as resp:
        return resp.status, resp.read()


def test_client_service_reaches_only_ready_members(kube: Kube, namespace: str, operators: list[Operator]) -> None:
    ns = namespace
    operators.append(Operator(kube, ns, kube.state_dir / f"operator-{ns}.log", None))
    _apply_cluster(kube, ns, "web", 2)
    gc = _wait_ready(kube, ns, "web", 2)
    assert gc["status"]["clientService"] == "web"
    assert "SERVICE" in kube.kubectl("get", "groupcluster", "web", "-n", ns, "-o", "wide").stdout.splitlines()[0]

    # The client Service: named after the cluster, owned by it, the members' HTTP port, only ready members.
    svc = kube.json("get", "svc", "web", "-n", ns)
    spec = svc["spec"]
    assert spec["type"] == "ClusterIP" and spec["clusterIP"] not in ("", "None")
    assert spec["selector"] == {CLUSTER_LABEL: "web", "app.kubernetes.io/component": "member"}
    assert [(p["name"], p["port"], p["targetPort"], p["protocol"]) for p in spec["ports"]] == [
        ("http", 8080, "http", "TCP")
    ]
    assert not spec.get("publishNotReadyAddresses")
    (owner,) = svc["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == (
        "GroupCluster",
        "web",
        gc["metadata"]["uid"],
        True,
    )
    # The headless Service of the members' DNS names keeps publishing members that are not ready (a joiner's name
    # must resolve before it joined); the pods name it as their subdomain.
    headless = kube.json("get", "svc", "web-members", "-n", ns)["spec"]
    assert headless["clusterIP"] == "None" and headless["publishNotReadyAddresses"] is True
    assert {p["spec"]["subdomain"] for p in _members(kube, ns, "web")} == {"web-members"}

    # The real EndpointSlice controller selects exactly the member pods for the client Service (the addresses it
    # tried to publish; the API server refuses loopback addresses, so the slice itself stays empty here).
    ips = {p["status"]["podIP"] for p in _members(kube, ns, "web")}
    wait_for("the EndpointSlice controller to select the 2 members", lambda: ips in _slice_attempts(kube, ns, "web"))
    (slice_,) = kube.json("get", "endpointslices", "-n", ns, "-l", "kubernetes.io/service-name=web")["items"]
    assert slice_["metadata"]["ownerReferences"][0]["name"] == "web"
    assert _service_endpoints(kube, ns, "web") == {ip: (True, 8080) for ip in ips}

    # A member just created is an endpoint of the client Service only once it is ready (joined, state fetched):
    # a watch records every state of the joiner's pod, so the moment it runs with an address but is not ready is
    # seen however short it is.
    fields = '{.metadata.name} {.status.phase} {.status.podIP} {.status.conditions[?(@.type=="Ready")].status}{"\\n"}'
    watch = subprocess.Popen(
        [str(kube.bin_dir / "kubectl"), f"--kubeconfig={kube.kubeconfig}", "get", "pods", "-n", ns, "-l",
         f"{CLUSTER_LABEL}=web", "--watch", "-o", f"jsonpath={fields}"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    before = {p["metadata"]["name"] for p in _members(kube, ns, "web")}
    try:
        time.sleep(1)  # the watch's initial list
        kube.kubectl("scale", "groupcluster/web", "-n", ns, "--replicas=3")
        _wait_ready(kube, ns, "web", 3)
    finally:
        watch.terminate()
        seen = watch.communicate(timeout=10)[0].split("\n")
    (joiner,) = {p["metadata"]["name"] for p in _members(kube, ns, "web")} - before
    running = [parts for parts in map(str.split, seen) if parts[:2] == [joiner, "Running"] and len(parts) > 2]
    assert running, seen
    joiner_ip = running[0][2]
    # The joiner ran with an address while not ready: then the Service's endpoint for it was not ready (no
    # publishNotReadyAddresses); it turned ready only after that.
    states = [parts[3] if len(parts) > 3 else "" for parts in running]
    assert "False" in states and states[-1] == "True", seen
    assert states.index("False") < states.index("True"), seen
    endpoints = _service_endpoints(kube, ns, "web")
    assert set(endpoints) == ips | {joiner_ip} and all(ready for ready, _ in endpoints.values()), endpoints

    # PUT and GET through an address taken from the Service's endpoints: plain HTTP, then the Python client
    # pinned to that address (route=False: as through a port-forward, where the members' own addresses are not
    # reachable).
    address = sorted(f"{ip}:{port}" for ip, (ready, port) in endpoints.items() if ready)[0]
    assert _http("PUT", f"http://{address}/v1/kv/hello", b"grid")[0] in (200, 201, 204)
    assert _http("GET", f"http://{address}/v1/kv/hello") == (200, b"grid")
    with GridClient([address], route=False, timeout=30) as grid:
        grid.put(b"via-service", b"yes")
        assert grid.get(b"via-service") == b"yes" and grid.get(b"hello") == b"grid"

    # Owned by the GroupCluster: deleting it lets the garbage collector remove both Services.
    kube.kubectl("delete", "groupcluster", "web", "-n", ns, "--timeout=150s", timeout=180)
    wait_for(
        "both Services garbage-collected",
        lambda: not kube.json("get", "services", "-n", ns, "-l", f"{CLUSTER_LABEL}=web")["items"],
        90,
        1.0,
    )


KEYS = 2_000


def test_standby_operator_takes_over_a_scale_up_when_the_active_one_is_killed(
    kube: Kube, namespace: str, operators: list[Operator]
) -> None:
    ns = namespace
    first = Operator(kube, ns, kube.state_dir / f"operator-{ns}-a.log", "gc-ha")
    operators.append(first)
    wait_for("the first operator to resume", lambda: "Resuming operations" in first.text(), 60, 0.3)
    standby = Operator(kube, ns, kube.state_dir / f"operator-{ns}-b.log", "gc-ha")
    operators.append(standby)
    # Both keep-alive in the peering object (the operator made it: no chart here).
    wait_for(
        "both operators in the KopfPeering",
        lambda: len(kube.json("get", "kopfpeering", "gc-ha", "-n", ns).get("status") or {}) == 2,
        60,
        0.5,
    )

    _apply_cluster(kube, ns, "demo", 2)
    _wait_ready(kube, ns, "demo", 2)
    expected = {f"k-{i:04d}".encode(): f"v-{i}".encode() for i in range(KEYS)}
    urls = [f"{p['status']['podIP']}:8080" for p in _members(kube, ns, "demo")]
    with GridClient(urls, timeout=30) as grid:
        grid.put_many(expected)
    kept = {p["metadata"]["name"]: p["metadata"]["uid"] for p in _members(kube, ns, "demo")}

    # Scale 2 -> 4 and kill the active operator outright once it created the first new member.
    kube.kubectl("scale", "groupcluster/demo", "-n", ns, "--replicas=4")
    wait_for("the scale-up to start", lambda: "demo-2" in {p["metadata"]["name"] for p in _members(kube, ns, "demo")})
    first.kill()
    first.proc.wait(10)
    standby_log_at_kill = standby.text()
    killed_at = time.monotonic()
    assert len(_members(kube, ns, "demo")) == 3  # the scale-up is unfinished

    # While the active one lived, the standby did nothing: kopf kept it paused (no resume, no timer), it logged no
    # step of the GroupCluster; the active one did all of it.
    assert "Resuming operations" not in standby_log_at_kill, standby_log_at_kill
    assert "active replica of peering" not in standby_log_at_kill and f"{ns}/demo" not in standby_log_at_kill
    active_log = first.text()
    assert "active replica of peering 'gc-ha'" in active_log and f"{ns}/demo: MemberCreated" in active_log

    # The standby takes over (within the dead one's keep-alive lifetime) and finishes the scale-up.
    gc = _wait_ready(kube, ns, "demo", 4, timeout=240)
    took = time.monotonic() - killed_at
    log = standby.text()
    assert "active replica of peering 'gc-ha'" in log and f"{ns}/demo: MemberCreated" in log, log
    print(f"standby finished the scale-up {took:.0f} s after the active operator was killed")
    # No member lost: the two first members are the same pods, all four in one view, every key readable.
    members = {p["metadata"]["name"]: p["metadata"]["uid"] for p in _members(kube, ns, "demo")}
    assert all(members.get(name) == uid for name, uid in kept.items()), (kept, members)
    assert len(members) == 4 and gc["status"]["view"].endswith(", 4 members"), gc["status"]
    urls = [f"{p['status']['podIP']}:8080" for p in _members(kube, ns, "demo")]
    with GridClient(urls, timeout=30) as grid:
        got = grid.get_many(list(expected))
    missing = [k for k, v in expected.items() if got.get(k) != v]
    assert not missing, f"{len(missing)} keys lost, e.g. {missing[:3]}"
    # The dead replica was dropped from the peering object; the survivor logged no ERROR.
    wait_for(
        "the killed operator dropped from the KopfPeering",
        lambda: len(kube.json("get", "kopfpeering", "gc-ha", "-n", ns).get("status") or {}) == 1,
        60,
        1.0,
    )
    assert not [line for line in log.splitlines() if " ERROR " in line], log

    # A standby that stops leaves the GroupCluster alone: the finalizer stays for the replica at work (an operator
    # at work removes it on exit so that nothing waits for a gone operator; a standby must not act at all).
    third = Operator(kube, ns, kube.state_dir / f"operator-{ns}-c.log", "gc-ha")
    operators.append(third)
    wait_for(
        "the third operator in the KopfPeering and kopf started in it",
        lambda: (
            len(kube.json("get", "kopfpeering", "gc-ha", "-n", ns).get("status") or {}) == 2
            and "Initial authentication has finished" in third.text()
        ),
        60,
        0.5,
    )
    time.sleep(3)  # a few keep-alives and timer intervals as a standby
    third.stop()
    assert "standby replica of peering 'gc-ha': leaving the GroupClusters" in third.text(), third.text()
    assert "active replica" not in third.text() and "released" not in third.text()
    assert "groupcluster.io/operator" in kube.json("get", "groupcluster", "demo", "-n", ns)["metadata"]["finalizers"]
