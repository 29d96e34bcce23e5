"""Reading GroupClusters and their member pods on the local control plane, for the operator's e2e tests.

Not a test module: test_operator.py, test_operator_auth.py and test_operator_outside.py import it.
"""

from __future__ import annotations

from typing import Any

from .kubeharness import Kube, wait_for

CLUSTER_LABEL = "groupcluster.io/cluster"


def get_gc(kube: Kube, ns: str, name: str = "demo") -> dict[str, Any]:
    return kube.json("get", "groupcluster", name, "-n", ns)


def member_pods(kube: Kube, ns: str, name: str = "demo") -> list[dict[str, Any]]:
    return kube.json("get", "pods", "-n", ns, "-l", f"{CLUSTER_LABEL}={name}")["items"]


def settled(kube: Kube, ns: str, n: int) -> dict[str, Any] | None:
    """The GroupCluster once n members are ready in one view and nothing is moving; else None."""
    gc = get_gc(kube, ns)
    st = gc.get("status") or {}
    conds = {c["type"]: c["status"] for c in st.get("conditions") or ()}
    pods = [p for p in member_pods(kube, ns) if not p["metadata"].get("deletionTimestamp")]
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


def wait_settled(kube: Kube, ns: str, n: int, timeout: float = 150) -> dict[str, Any]:
    return wait_for(f"GroupCluster demo settled with {n} members", lambda: settled(kube, ns, n), timeout, 1.0)


def gc_events(kube: Kube, ns: str, reason: str, name: str | None = None) -> list[dict[str, Any]]:
    items = kube.json("get", "events", "-n", ns, "--field-selector", f"reason={reason}")["items"]
    return [
        e
        for e in items
        if e["involvedObject"].get("kind") == "GroupCluster" and name in (None, e["involvedObject"].get("name"))
    ]
