"""Every join and leave the operator drives is a flushed view change, on every preset the CRD offers.

The chart's operator runs one GroupCluster per preset (vsync and total-order) side by side; each is scaled
2 -> 3 (a join) -> 2 (a graceful leave) with ``kubectl scale``. Each member reports on ``/v1/status`` how many
views it installed and how many flushes blocked it and ended with a view (``flushed_view_changes``, its FLUSH
layer's ``flush.unblocked``). GMS flushes every view change of a view of two or
more members (a lone member's needs none), so across the join and across the leave, on each member present
before and after, both counts grow, and by the same amount. A preset without FLUSH (the old total-order) fails
it.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from .kubeharness import Kube, wait_for

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "groupcluster"
CLUSTER_LABEL = "groupcluster.io/cluster"
PRESETS = {"vs": "vsync", "to": "total-order"}

pytestmark = pytest.mark.timeout(1800)


def _pods(kube: Kube, ns: str, name: str) -> list[dict[str, Any]]:
    items = kube.json("get", "pods", "-n", ns, "-l", f"{CLUSTER_LABEL}={name}")["items"]
    return [p for p in items if not p["metadata"].get("deletionTimestamp")]


def _settled(kube: Kube, ns: str, name: str, n: int) -> bool:
    st = kube.json("get", "groupcluster", name, "-n", ns).get("status") or {}
    conds = {c["type"]: c["status"] for c in st.get("conditions") or ()}
    return (
        st.get("phase") == "Running"
        and st.get("readyReplicas") == n
        and len(_pods(kube, ns, name)) == n
        and len(st.get("members") or ()) == n
        and conds.get("Rebalancing") == "False"
    )


def _wait_all(kube: Kube, ns: str, n: int) -> None:
    for name in PRESETS:
        wait_for(f"{name} settled with {n} members", lambda name=name: _settled(kube, ns, name, n), 180, 1.0)


def _status(pod: dict[str, Any]) -> dict[str, Any]:
    url = f"http://{pod['status']['podIP']}:8080/v1/status"
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.loads(resp.read())


def _flushes(kube: Kube, ns: str, name: str, n: int) -> dict[str, tuple[int, int]]:
    """(views installed, flushes that ended in a view) per member pod, once all n share one view."""

    def one_view() -> dict[str, dict[str, Any]] | None:
        got = {p["metadata"]["name"]: _status(p) for p in _pods(kube, ns, name)}
        views = {json.dumps(s["view"]["id"]) for s in got.values() if s.get("view")}
        if len(got) == n and len(views) == 1 and all(len(s["view"]["members"]) == n for s in got.values()):
            return got
        return None

    got = wait_for(f"{name}: {n} members in one view", one_view, 60, 1.0)
    return {pod: (s["views_installed"], s["flushed_view_changes"]) for pod, s in got.items()}


def test_every_join_and_leave_is_a_flushed_view_change_on_every_preset(kube: Kube, namespace: str) -> None:
    ns = namespace
    kube.helm("install", "gco", str(CHART), "-n", ns, "--set", "operator.interval=1", "--wait", "--timeout", "120s")
    kube.kubectl("wait", "--for=condition=Established", "crd/groupclusters.groupcluster.io", "--timeout=60s")
    for name, preset in PRESETS.items():
        manifest = {
            "apiVersion": "groupcluster.io/v1alpha1",
            "kind": "GroupCluster",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"replicas": 2, "numOwners": 1, "stack": {"preset": preset, "set": {"fd.timeout": "3s"}}},
        }
        kube.kubectl("apply", "-f", "-", input=json.dumps(manifest))
    _wait_all(kube, ns, 2)
    before = {name: _flushes(kube, ns, name, 2) for name in PRESETS}
    for name in PRESETS:
        kube.kubectl("scale", f"groupcluster/{name}", "-n", ns, "--replicas=3")
    _wait_all(kube, ns, 3)
    joined = {name: _flushes(kube, ns, name, 3) for name in PRESETS}
    for name in PRESETS:
        kube.kubectl("scale", f"groupcluster/{name}", "-n", ns, "--replicas=2")
    _wait_all(kube, ns, 2)
    left = {name: _flushes(kube, ns, name, 2) for name in PRESETS}
    for name, preset in PRESETS.items():
        print(f"{preset}: (views, flushed) at 2 {before[name]}, joined {joined[name]}, left {left[name]}")
        for step, old, new in (("join", before[name], joined[name]), ("leave", joined[name], left[name])):
            stayed = sorted(set(old) & set(new))
            assert len(stayed) == 2, f"{preset}, {step}: {old} -> {new}"
            for pod in stayed:
                views = new[pod][0] - old[pod][0]
                flushed = new[pod][1] - old[pod][1]
                # Every view change of a view of two or more members is flushed (only a lone member's is not).
                assert views >= 1 and flushed == views, (
                    f"{preset}, {step}: {pod} installed {views} view(s), {flushed} of them after a flush"
                )
