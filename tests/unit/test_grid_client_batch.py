"""The batch client's bulk paths (the path of Spark batch writes) against their per-key definitions (no I/O).

``_put_ops`` checks a whole mapping with C-level passes and falls back to the per-entry loop, which names the
first bad entry; ``_Router.targets`` routes many keys at once and must pick what ``_Router.target`` picks for
each key (a member to avoid included).
"""

from __future__ import annotations

import random
import time

import msgpack
import pytest
from groupcluster.grid.client import BATCH_KEY_LIMIT, VALUE_LIMIT
from groupcluster.grid.client._batch import _BatchRun, _put_ops
from groupcluster.grid.client._routing import _Router
from groupcluster.grid.client._wire import _Reply


def test_put_ops_keeps_the_last_value_of_a_key_and_checks_every_entry() -> None:
    assert _put_ops([(b"a", b"1"), (b"b", b"2"), (b"a", b"3")]) == [("put", b"a", b"3"), ("put", b"b", b"2")]
    assert _put_ops({}) == []
    with pytest.raises(TypeError, match="key: expected bytes, got str"):
        _put_ops({b"ok": b"1", "text": b"2"})  # type: ignore[dict-item]
    with pytest.raises(TypeError, match=r"value of b'k': expected bytes, got bytearray"):
        _put_ops({b"ok": b"1", b"k": bytearray(b"2")})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match=r"key: 0 bytes is outside \[1, "):
        _put_ops({b"": b"1"})
    with pytest.raises(ValueError, match=f"key: {BATCH_KEY_LIMIT + 1} bytes"):
        _put_ops({b"k" * (BATCH_KEY_LIMIT + 1): b"1"})
    with pytest.raises(ValueError, match=f"exceed the limit of {VALUE_LIMIT}"):
        _put_ops({b"k": b"v" * (VALUE_LIMIT + 1)})


def test_targets_route_each_key_as_target_does() -> None:
    r = _Router(["http://a:1", "http://b:1", "http://c:1"], retries=1, backoff=0.01, timeout=1.0, avoid=1.0)
    r.table = {
        "num_segments": 8,
        "members": ["http://a:1", "http://b:1", None],
        "read": [0, 1, 2, 0, 1, -1, 0, 1],
        "write": [1, 0, 0, 1, 2, 1, -1, 0],
    }
    r.avoid["http://b:1"] = time.monotonic() + 60  # routed keys of b go to any other member instead
    keys = [b"k%d" % i for i in range(300)]
    writes = [i % 3 != 0 for i in range(300)]
    r.rng = random.Random(5)
    bulk = r.targets(keys, writes)
    r.rng = random.Random(5)
    one = [r.target(k, w) for k, w in zip(keys, writes, strict=True)]
    assert bulk == one
    assert "http://b:1" not in bulk and {"http://a:1", "http://c:1"} <= set(bulk)
    r.table = None  # no routing table yet: any member, as target() does
    r.rng = random.Random(6)
    bulk = r.targets(keys[:20], writes[:20])
    r.rng = random.Random(6)
    assert bulk == [r.target(k, w) for k, w in zip(keys[:20], writes[:20], strict=True)]


def test_a_batch_body_gives_puts_their_value_and_other_operations_none() -> None:
    run = _BatchRun([("put", b"k", b"v"), ("get", b"g", None), ("delete", b"d", None)], 10.0)
    assert msgpack.unpackb(run.body([2, 0, 1])) == {"ops": [["delete", b"d"], ["put", b"k", b"v"], ["get", b"g"]]}


def test_targets_of_writes_only_route_each_key_as_target_does() -> None:
    r = _Router(["http://a:1", "http://b:1"], retries=1, backoff=0.01, timeout=1.0, avoid=1.0)
    r.table = {"num_segments": 4, "members": ["http://a:1", "http://b:1"], "read": [0, 0, 0, 0], "write": [0, 1, -1, 1]}
    keys = [b"w%d" % i for i in range(200)]
    r.rng = random.Random(7)
    bulk = r.targets(keys, [True] * len(keys))
    r.rng = random.Random(7)
    assert bulk == [r.target(k, True) for k in keys]


def test_plan_cuts_requests_by_count_and_by_bytes() -> None:
    r = _Router(["http://a:1"], retries=1, backoff=0.01, timeout=1.0, avoid=1.0)
    small = _BatchRun([("put", b"k%d" % i, b"v") for i in range(2500)], 10.0)
    assert [len(idxs) for _, idxs in small.plan(r, 1000, route=False)] == [1000, 1000, 500]
    big = 1024 * 1024  # four such values (and their keys) exceed a request's ~4 MiB
    heavy = _BatchRun([("put", b"b%d" % i, b"x" * big) for i in range(9)], 10.0)
    plan = heavy.plan(r, 1000, route=False)
    assert [idxs for _, idxs in plan] == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]


def test_absorb_records_values_versions_and_failures_and_skips_nothing_when_all_writes_are_done() -> None:
    r = _Router(["http://a:1"], retries=1, backoff=0.01, timeout=1.0, avoid=1.0)
    writes = _BatchRun([("put", b"a", b"1"), ("delete", b"b", None)], 10.0)
    ok = msgpack.packb({"topology_id": 3, "results": [{"status": 200}, {"status": 200}]})
    writes.absorb(r, "http://a:1", [0, 1], _Reply(200, ok))
    writes.next_round()
    assert writes.finish() == [None, None] and writes.versions == [None, None]
    mixed = _BatchRun([("put", b"a", b"1"), ("get", b"g", None), ("put", b"c", b"2")], 10.0)
    answer = {
        "topology_id": 3,
        "results": [{"status": 200}, {"status": 200, "value": b"x", "version": 9}, {"status": 503}],
    }
    mixed.absorb(r, "http://a:1", [0, 1, 2], _Reply(200, msgpack.packb(answer)))
    assert mixed.results == [None, b"x", None] and mixed.versions == [None, 9, None] and mixed.retry == [2]
    puts = _BatchRun([("put", b"a", b"1"), ("put", b"c", b"2")], 10.0)
    answer = {"topology_id": 3, "results": [{"status": 200}, {"status": 500, "error": "boom"}]}
    puts.absorb(r, "http://a:1", [0, 1], _Reply(200, msgpack.packb(answer)))
    assert puts.failed == {1: "HTTP 500: boom"}
