"""The batch client's bulk paths (issue 7: Spark batch writes) against their per-key definitions (no I/O).

``_put_ops`` checks a whole mapping with C-level passes and falls back to the per-entry loop, which names the
first bad entry; ``_Router.targets`` routes many keys at once and must pick what ``_Router.target`` picks for
each key (a member to avoid included).
"""

from __future__ import annotations

import random
import time

import msgpack
import pytest
from groupcluster.grid.client import BATCH_KEY_LIMIT, VALUE_LIMIT, _BatchRun, _put_ops, _Router


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
