"""The operator's hand-over (no finalizer left for a gone operator) and its start-up checks, without a cluster.

A small fake stands in for the API server's few calls; the real thing runs in tests/e2e/test_operator.py
(``helm uninstall`` with a GroupCluster left, then deleting it without an operator).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from groupcluster_operator.cli import QuietTimers, RetriedRequest, crd_problem, quiet_logging
from groupcluster_operator.kubeapi import ApiError
from groupcluster_operator.release import FINALIZER, release_finalizers, removal_patch, stop_deployment


class FakeApi:
    """Stands in for KubeApi's GroupCluster, Deployment and pod calls with dicts; records the calls."""

    def __init__(self, objects: dict[str, dict[str, Any]], pods_left: int = 0) -> None:
        self.objects = objects  # "ns/name" -> GroupCluster
        self.calls: list[tuple[str, str, Any]] = []
        self.pods_left = pods_left
        self.conflict_once: set[str] = set()

    async def list_groupclusters(self, namespace: str | None, limit: int | None = None) -> list[dict[str, Any]]:
        self.calls.append(("LIST", f"groupclusters in {namespace}", None))
        return [o for k, o in self.objects.items() if namespace is None or k.startswith(f"{namespace}/")]

    async def json_patch_groupcluster(self, namespace: str, name: str, patch: list[dict[str, Any]]) -> Any:
        self.calls.append(("PATCH", f"{namespace}/{name}", patch))
        key = f"{namespace}/{name}"
        if key not in self.objects:
            raise ApiError(404, "not found")
        if key in self.conflict_once:
            self.conflict_once.discard(key)
            self.objects[key]["metadata"]["finalizers"].insert(0, "other.io/first")  # moved our index
            raise ApiError(422, "the test operation failed")
        fins = self.objects[key]["metadata"]["finalizers"]
        test, remove = patch
        assert fins[int(test["path"].rsplit("/", 1)[1])] == test["value"]
        del fins[int(remove["path"].rsplit("/", 1)[1])]
        return self.objects[key]

    async def read_deployment(self, namespace: str, name: str) -> dict[str, Any]:
        self.calls.append(("GET", f"deployment {namespace}/{name}", None))
        return {"spec": {"selector": {"matchLabels": {"app": "op", "tier": "x"}}}}

    async def scale_deployment(self, namespace: str, name: str, replicas: int) -> None:
        self.calls.append(("SCALE", f"deployment {namespace}/{name}", replicas))

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
    assert ("SCALE", "deployment ops/gco", 0) in api.calls
    assert [c[1] for c in api.calls if c[0] == "LIST"] == ["ops:app=op,tier=x"] * 3


def test_the_operator_waits_for_a_new_crd_and_refuses_to_start_without_one() -> None:
    class Discovery:
        """Serves ``answer`` (resource names, or an exception to raise); lists raise ``lists`` in turn."""

        def __init__(self, answer: Any, *lists: Exception) -> None:
            self.answer = answer
            self.lists = list(lists)
            self.listed: list[str | None] = []

        async def served_resources(self) -> list[str]:
            if isinstance(self.answer, Exception):
                raise self.answer
            return self.answer

        async def list_groupclusters(self, namespace: str | None, limit: int | None = None) -> list[dict[str, Any]]:
            assert limit == 1  # a probe, not a full list
            self.listed.append(namespace)
            if self.lists:
                raise self.lists.pop(0)
            return []

    served = ["groupclusters", "groupclusters/status"]
    assert asyncio.run(crd_problem(Discovery(served), ["a", "b"])) is None
    # A CRD installed moments ago: its storage answers 429 for a while; that is waited out, not logged.
    api = Discovery(served, ApiError(429, "storage is (re)initializing"))
    assert asyncio.run(crd_problem(api, None)) is None
    assert api.listed == [None, None]
    problem = asyncio.run(crd_problem(Discovery(served, ApiError(403, "forbidden")), ["shop"]))
    assert problem is not None and problem.startswith("cannot list groupclusters in namespace shop (check the")
    problem = asyncio.run(crd_problem(Discovery(served, *[ApiError(429, "later")] * 5), ["shop"], wait=0.5))
    assert problem is not None and "does not serve groupclusters in namespace shop yet" in problem
    problem = asyncio.run(crd_problem(Discovery(ApiError(404, "not found"))))
    assert problem is not None and "install the CRD first" in problem
    problem = asyncio.run(crd_problem(Discovery(["other"])))
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


def test_kopf_request_retries_are_warnings_and_the_last_attempt_an_error() -> None:
    import kopf  # noqa: F401  # its modules' loggers exist once it is imported, as in the operator

    quiet_logging()
    posting = logging.getLogger("kopf._core.engines.posting")
    assert any(isinstance(f, RetriedRequest) for f in posting.filters)
    seen: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record)

    keep = Keep()
    posting.addHandler(keep)
    try:
        url = "POST https://127.0.0.1:6443/api/v1/namespaces/ns/events"
        posting.error(f"Request attempt #1/9 failed; will retry: {url} -> ServerDisconnectedError()")
        posting.error(f"Request attempt #2/9 failed; TCP closed; will re-authenticate: {url}")
        posting.error(f"Request attempt #9/9 failed; escalating: {url} -> ServerDisconnectedError()")
    finally:
        posting.removeHandler(keep)
    assert [r.levelname for r in seen] == ["WARNING", "WARNING", "ERROR"]
