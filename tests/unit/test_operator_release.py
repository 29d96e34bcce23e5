"""The operator's hand-over (no finalizer left for a gone operator) and its start-up checks, without a cluster.

A small fake stands in for the API server's few calls; the real thing runs in tests/e2e/test_operator.py
(``helm uninstall`` with a GroupCluster left, then deleting it without an operator).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from groupcluster_operator.cli import QuietTimers, crd_problem
from groupcluster_operator.kubeapi import ApiError
from groupcluster_operator.release import FINALIZER, release_finalizers, removal_patch, stop_deployment

GC = "/apis/groupcluster.io/v1alpha1"


class FakeApi:
    """Answers GET/PATCH of GroupClusters, a Deployment's scale and pod lists from dicts; records the calls."""

    def __init__(self, objects: dict[str, dict[str, Any]], pods_left: int = 0) -> None:
        self.objects = objects  # "ns/name" -> GroupCluster
        self.calls: list[tuple[str, str, Any]] = []
        self.pods_left = pods_left
        self.conflict_once: set[str] = set()

    async def request(self, method: str, path: str, *, body: Any = None, content_type: str = "") -> Any:
        self.calls.append((method, path, body))
        if method == "GET" and path.endswith("/groupclusters"):
            ns = path.split("/namespaces/")[1].split("/")[0] if "/namespaces/" in path else None
            return {"items": [o for k, o in self.objects.items() if ns is None or k.startswith(f"{ns}/")]}
        if method == "PATCH" and "/groupclusters/" in path:
            ns, name = path.split("/namespaces/")[1].split("/groupclusters/")
            key = f"{ns}/{name}"
            if key in self.conflict_once:
                self.conflict_once.discard(key)
                self.objects[key]["metadata"]["finalizers"].insert(0, "other.io/first")  # moved our index
                raise ApiError(422, "the test operation failed")
            assert content_type == "application/json-patch+json"
            fins = self.objects[key]["metadata"]["finalizers"]
            test, remove = body
            assert fins[int(test["path"].rsplit("/", 1)[1])] == test["value"]
            del fins[int(remove["path"].rsplit("/", 1)[1])]
            return self.objects[key]
        if method == "GET" and "/deployments/" in path:
            return {"spec": {"selector": {"matchLabels": {"app": "op", "tier": "x"}}}}
        if method == "PATCH" and path.endswith("/scale"):
            assert body == {"spec": {"replicas": 0}}
            return {}
        raise ApiError(404, "not found")

    async def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        self.calls.append(("LIST", f"{namespace}:{selector}", None))
        if self.pods_left:
            self.pods_left -= 1
            return [{"metadata": {"name": "op-1"}}]
        return []


def gc(ns: str, name: str, *finalizers: str) -> dict[str, Any]:
    return {"metadata": {"namespace": ns, "name": name, "finalizers": list(finalizers)}}


def test_removal_patch_removes_only_our_finalizer_and_only_if_the_list_is_unchanged() -> None:
    assert removal_patch(["a.io/x"]) is None
    assert removal_patch(["a.io/x", FINALIZER]) == [
        {"op": "test", "path": "/metadata/finalizers/1", "value": FINALIZER},
        {"op": "remove", "path": "/metadata/finalizers/1"},
    ]


def test_release_removes_the_finalizer_in_the_watched_namespaces_and_keeps_others() -> None:
    api = FakeApi(
        {
            "a/one": gc("a", "one", FINALIZER),
            "a/two": gc("a", "two", "keep.io/mine", FINALIZER),
            "a/three": gc("a", "three"),
            "b/four": gc("b", "four", FINALIZER),
        }
    )
    api.conflict_once.add("a/two")  # someone added a finalizer between our read and our patch
    released = asyncio.run(release_finalizers(api, ["a"]))  # type: ignore[arg-type]
    assert sorted(released) == ["a/one", "a/two"]
    assert api.objects["a/two"]["metadata"]["finalizers"] == ["other.io/first", "keep.io/mine"]
    assert api.objects["b/four"]["metadata"]["finalizers"] == [FINALIZER]  # not watched: not ours to touch
    # Cluster-wide: every namespace.
    assert asyncio.run(release_finalizers(api, None)) == ["b/four"]  # type: ignore[arg-type]


def test_stop_deployment_scales_to_zero_and_waits_for_the_pods() -> None:
    api = FakeApi({}, pods_left=2)
    assert asyncio.run(stop_deployment(api, "ops", "gco", timeout=30))  # type: ignore[arg-type]
    assert ("PATCH", "/apis/apps/v1/namespaces/ops/deployments/gco/scale", {"spec": {"replicas": 0}}) in api.calls
    assert [c[1] for c in api.calls if c[0] == "LIST"] == ["ops:app=op,tier=x"] * 3


def test_the_operator_waits_for_a_new_crd_and_refuses_to_start_without_one() -> None:
    class Discovery:
        """Discovery answers ``answer``; lists answer ``lists`` in turn (an exception is raised), then items."""

        def __init__(self, answer: Any, *lists: Exception) -> None:
            self.answer = answer
            self.lists = list(lists)
            self.listed: list[str] = []

        async def request(self, method: str, path: str, params: Any = None) -> Any:
            if path != GC:
                self.listed.append(path)
                if self.lists:
                    raise self.lists.pop(0)
                return {"items": []}
            if isinstance(self.answer, Exception):
                raise self.answer
            return self.answer

    served = {"resources": [{"name": "groupclusters"}]}
    assert asyncio.run(crd_problem(Discovery(served), ["a", "b"])) is None
    # A CRD installed moments ago: its storage answers 429 for a while; that is waited out, not logged.
    api = Discovery(served, ApiError(429, "storage is (re)initializing"))
    assert asyncio.run(crd_problem(api, None)) is None
    assert api.listed == [f"{GC}/groupclusters"] * 2
    problem = asyncio.run(crd_problem(Discovery(served, ApiError(403, "forbidden")), ["shop"]))
    assert problem is not None and problem.startswith("cannot list groupclusters in namespace shop (check the")
    problem = asyncio.run(crd_problem(Discovery(served, *[ApiError(429, "later")] * 5), ["shop"], wait=0.5))
    assert problem is not None and "does not serve groupclusters in namespace shop yet" in problem
    problem = asyncio.run(crd_problem(Discovery(ApiError(404, "not found"))))
    assert problem is not None and "install the CRD first" in problem
    problem = asyncio.run(crd_problem(Discovery(ApiError(403, "forbidden"))))
    assert problem is not None and problem.startswith("cannot read") and "forbidden" in problem


def test_kopf_timer_successes_are_dropped_and_everything_else_kept() -> None:
    quiet = QuietTimers()

    def record(level: int, msg: str) -> logging.LogRecord:
        return logging.LogRecord("kopf.objects", level, __file__, 1, msg, None, None)

    assert not quiet.filter(record(logging.INFO, "Timer 'reconcile' succeeded."))
    assert quiet.filter(record(logging.INFO, "Handler 'stop-members' succeeded."))
    assert quiet.filter(record(logging.ERROR, "Timer 'reconcile' failed with an exception."))
