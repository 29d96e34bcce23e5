"""The local data container: newest version wins, tombstones during transfers, segments, batches."""

from __future__ import annotations

import os

import pytest
from groupcluster.grid.store import SEQ_BITS, SegmentStore, make_version, version_topology
from hypothesis import given, settings
from hypothesis import strategies as st

# Derandomized and without the example database, so CI runs the same examples every time; GRID_HYPOTHESIS_SCALE=20
# multiplies the examples for a local search for new failures.
EXAMPLES_SCALE = int(os.environ.get("GRID_HYPOTHESIS_SCALE", "1"))


def test_versions_order_by_topology_then_sequence() -> None:
    assert make_version(3, 1) > make_version(2, 999)
    assert make_version(3, 2) > make_version(3, 1)
    assert version_topology(make_version(7, 5)) == 7
    with pytest.raises(ValueError, match="sequence"):
        make_version(1, 1 << SEQ_BITS)


def test_newer_version_wins_and_older_is_ignored() -> None:
    s = SegmentStore(4)
    assert s.write(1, b"k", 10, b"a")
    assert not s.write(1, b"k", 9, b"old")
    assert not s.write(1, b"k", 10, b"A")  # a tie goes to the greater value (b"a" > b"A")
    assert s.write(1, b"k", 11, b"b")
    assert s.value(1, b"k") == b"b" and len(s) == 1


def test_delete_outside_a_rebalance_removes_the_key() -> None:
    s = SegmentStore(4)
    s.write(0, b"k", 1, b"v")
    assert s.write(0, b"k", 2, None)
    assert s.get(0, b"k") is None and s.tombstones == 0


def test_write_during_transfer_wins_over_transferred_value() -> None:
    s = SegmentStore(4)
    s.keep_tombstones = True
    s.add_segment(2)
    s.write(2, b"new", 20, b"written-during-transfer")
    s.write(2, b"gone", 21, None)  # deleted during the transfer: a tombstone
    applied = s.apply_transferred(2, [(b"new", 5, b"stale"), (b"gone", 6, b"resurrect?"), (b"other", 7, b"x")])
    assert applied == 1
    assert s.value(2, b"new") == b"written-during-transfer"
    assert s.get(2, b"gone") == (21, None) and s.value(2, b"gone") is None
    assert s.value(2, b"other") == b"x"
    assert s.tombstones == 1 and len(s) == 2
    # The rebalance ends: tombstones go.
    s.keep_tombstones = False
    assert s.purge_tombstones() == 1
    assert s.get(2, b"gone") is None and s.tombstones == 0


def test_transferred_newer_value_replaces_an_older_one() -> None:
    s = SegmentStore(4)
    s.write(0, b"k", 1, b"old")
    assert s.apply_transferred(0, [(b"k", 2, b"newer")]) == 1
    assert s.value(0, b"k") == b"newer"


def test_segment_add_remove_clear() -> None:
    s = SegmentStore(4)
    s.add_segment(3)
    s.write(3, b"a", 1, b"x")
    s.write(3, b"b", 1, b"y")
    assert s.held_segments() == {3}
    assert s.clear_segment(3) == 2 and s.has_segment(3) and len(s) == 0
    s.write(3, b"a", 1, b"x")
    assert s.remove_segment(3) == 1 and not s.has_segment(3)
    assert s.remove_segment(3) == 0
    with pytest.raises(ValueError, match="segment 9"):
        s.add_segment(9)


def test_segment_batches_respect_both_limits_and_snapshot() -> None:
    s = SegmentStore(2)
    for i in range(25):
        s.write(1, b"k%02d" % i, 1, b"v" * 10)
    batches = list(s.segment_batches(1, 10, 10_000))
    assert [len(b) for b in batches] == [10, 10, 5]
    assert len({e[0] for b in batches for e in b}) == 25
    by_bytes = list(s.segment_batches(1, 1000, 100))
    assert all(len(b) <= 2 for b in by_bytes) and sum(len(b) for b in by_bytes) == 25
    it = s.segment_batches(1, 10, 10_000)
    first = next(it)
    s.write(1, b"late", 2, b"z")  # after the snapshot: not in this iteration (the write-all phases carry it)
    rest = [e for b in it for e in b]
    assert b"late" not in {e[0] for e in first + rest}
    assert list(s.segment_batches(0, 10, 10)) == []
    with pytest.raises(ValueError, match="max_entries and max_bytes must be at least 1"):
        next(s.segment_batches(1, 0, 10))


def test_tombstones_are_transferred_only_when_asked() -> None:
    s = SegmentStore(2)
    s.keep_tombstones = True
    s.write(0, b"a", 1, b"x")
    s.write(0, b"b", 2, None)
    assert {e[0] for b in s.segment_batches(0, 10, 1000) for e in b} == {b"a", b"b"}
    assert {e[0] for b in s.segment_batches(0, 10, 1000, tombstones=False) for e in b} == {b"a"}


OPS = st.lists(
    st.tuples(st.sampled_from(["write", "delete", "transfer"]), st.integers(0, 5), st.integers(1, 50), st.booleans()),
    max_size=60,
)


@settings(max_examples=200 * EXAMPLES_SCALE, deadline=None, derandomize=True, database=None)
@given(ops=OPS)
def test_property_store_holds_the_newest_version_of_each_key(ops: list[tuple[str, int, int, bool]]) -> None:
    """Whatever order writes, deletes and transferred entries arrive in, the newest version decides."""
    s = SegmentStore(1)
    s.keep_tombstones = True
    newest: dict[bytes, tuple[int, bytes | None]] = {}
    for kind, k, ver, _ in ops:
        key = b"k%d" % k
        value = None if kind == "delete" else b"v%d" % ver
        if kind == "transfer":
            s.apply_transferred(0, [(key, ver, value)])
        else:
            s.write(0, key, ver, value)
        old = newest.get(key)
        # Newest version; a tie of different values goes to the greater one, a deletion counting least.
        if old is None or old[0] < ver or (old[0] == ver and value is not None and (old[1] is None or value > old[1])):
            newest[key] = (ver, value)
    for key, (_, value) in newest.items():
        assert s.value(0, key) == value
    assert len(s) == sum(1 for _, v in newest.values() if v is not None)
    assert s.tombstones == sum(1 for _, v in newest.values() if v is None)


def test_equal_versions_with_different_values_resolve_the_same_everywhere() -> None:
    # Two partitions can stamp the same version (topology id and sequence) on different values; every replica
    # must keep the same one whatever the order they arrive in: the greater value, a deletion counting least.
    for order in ((b"a", b"b"), (b"b", b"a")):
        s = SegmentStore(4)
        s.keep_tombstones = True
        for value in order:
            s.write(1, b"k", 7, value)
        assert s.get(1, b"k") == (7, b"b")
        assert not s.write(1, b"k", 7, None)  # a deletion loses a tie
        assert s.write(1, b"k", 8, None) and s.get(1, b"k") == (8, None)


def test_tombstones_expire_by_the_time_this_store_got_them() -> None:
    s = SegmentStore(4)
    s.keep_tombstones = True
    s.write(0, b"a", 10, b"x", now=1.0)
    s.write(0, b"a", 11, None, now=2.0)  # tombstone at t=2
    s.apply_transferred(1, [(b"b", 5, None), (b"c", 6, b"y")], now=3.0)  # a transferred tombstone at t=3
    s.write(2, b"d", 7, None, now=4.0)
    s.write(2, b"d", 8, b"back", now=4.5)  # rewritten: its tombstone is no longer one
    assert s.tombstones == 2 and s.oldest_tombstone() == 2.0
    assert s.expire_tombstones(1.9, 0.0) == 0
    assert s.expire_tombstones(7.0, 5.0) == 1 and s.get(0, b"a") is None
    # The rewritten key's queued tombstone is skipped, the live value stays.
    assert s.expire_tombstones(10.0, 0.0) == 1 and s.get(1, b"b") is None
    assert s.get(2, b"d") == (8, b"back") and s.get(1, b"c") == (6, b"y")
    assert s.tombstones == 0 and s.oldest_tombstone() is None
    # Once expired, an older value is accepted again: that is the trade-off of the grace period.
    assert s.write(0, b"a", 10, b"x", now=11.0)


def test_expiry_skips_tombstones_of_dropped_segments_and_newer_deletes() -> None:
    s = SegmentStore(4)
    s.keep_tombstones = True
    s.write(0, b"a", 1, None, now=1.0)
    s.write(0, b"a", 2, None, now=5.0)  # a newer delete of the same key: dated t=5 now
    s.write(3, b"z", 1, None, now=1.5)
    s.remove_segment(3)
    assert s.expire_tombstones(2.0, 0.0) == 0 and s.get(0, b"a") == (2, None)
    assert s.expire_tombstones(5.5, 0.5) == 1 and s.tombstones == 0


def test_segment_chunks_are_columns_within_both_limits() -> None:
    s = SegmentStore(2)
    for i in range(100):
        s.write(1, b"k%03d" % i, i, b"v" * (5 if i < 50 else 50))  # sizes change midway: the guess adapts
    chunks = list(s.segment_chunks(1, 30, 400))
    for keys, versions, values in chunks:
        assert len(keys) == len(versions) == len(values) <= 30
        size = sum(map(len, keys)) + sum(map(len, values)) + 24 * len(keys)
        assert size <= 400 or len(keys) == 1
    flat = [(k, ver, val) for keys, vers, vals in chunks for k, ver, val in zip(keys, vers, vals, strict=True)]
    assert flat == [(k, ver, val) for k, (ver, val) in s.segments[1].items()]
    # A single entry above the byte bound is a chunk of its own.
    s.write(0, b"big", 1, b"x" * 1000)
    s.write(0, b"small", 2, b"y")
    assert [len(c[0]) for c in s.segment_chunks(0, 10, 100)] == [1, 1]


def _chunk_ops(keys: int, max_size: int, min_size: int = 0) -> st.SearchStrategy[list[tuple[int, int, bool, bool]]]:
    # (key, version, tombstone?, tie-breaking value bit); tombstones rare, so the bulk path gets its share.
    entry = st.tuples(st.integers(0, keys), st.integers(1, 40), st.integers(0, 15).map(lambda x: x == 0), st.booleans())
    return st.lists(entry, min_size=min_size, max_size=max_size, unique_by=lambda t: t[0])


@settings(max_examples=150 * EXAMPLES_SCALE, deadline=None, derandomize=True, database=None)
@given(
    held=_chunk_ops(400, 12) | _chunk_ops(20, 20),
    chunk=_chunk_ops(400, 80, 16) | _chunk_ops(40, 20),
    keep=st.booleans(),
)
def test_property_apply_chunk_equals_applying_entry_by_entry(
    held: list[tuple[int, int, bool, bool]], chunk: list[tuple[int, int, bool, bool]], keep: bool
) -> None:
    """The bulk path gives exactly the store, tombstone count and applied count of the per-entry path."""
    stores = [SegmentStore(1), SegmentStore(1)]
    for s in stores:
        s.keep_tombstones = True
        for k, ver, dead, _ in held:
            s.write(0, b"k%d" % k, ver, None if dead else b"v%d" % ver, now=1.0)
        s.keep_tombstones = keep
    entries = [(b"k%d" % k, ver, None if dead else b"w%d" % (ver * 2 + tie)) for k, ver, dead, tie in chunk]
    one = stores[0].apply_transferred(0, entries, now=2.0)
    bulk = stores[1].apply_chunk(0, [e[0] for e in entries], [e[1] for e in entries], [e[2] for e in entries], now=2.0)
    assert bulk == one
    assert stores[1].segments == stores[0].segments
    assert stores[1].tombstones == stores[0].tombstones
    assert list(stores[1]._tomb_queue) == list(stores[0]._tomb_queue)
    assert stores[1].nbytes == stores[0].nbytes == stores[0].count_bytes()


def test_apply_chunk_bulk_path_with_a_few_writes_during_the_transfer() -> None:
    s = SegmentStore(1)
    s.keep_tombstones = True
    s.write(0, b"k5", 100, b"written-during-transfer")
    s.write(0, b"k6", 101, None)
    keys = [b"k%d" % i for i in range(200)]
    values: list[bytes | None] = [b"old"] * 200
    values[7] = None  # a transferred tombstone of a key we do not hold
    applied = s.apply_chunk(0, keys, [3] * 200, values, now=5.0)
    assert applied == 198  # k5 and k6 hold newer versions
    assert s.get(0, b"k5") == (100, b"written-during-transfer") and s.get(0, b"k6") == (101, None)
    assert s.get(0, b"k7") == (3, None) and s.tombstones == 2 and len(s) == 198


def test_segments_are_invisible_to_the_garbage_collector() -> None:
    """Writes, transfers, deletes and tombstones never leave a store container the cyclic collector walks:
    the entries live in plain dicts of ints, bytes and None (a tracked dict of millions of tuples paused
    loaded members for up to 0.6 s per collection)."""
    import gc

    s = SegmentStore(2)
    s.keep_tombstones = True
    s.write(0, b"a", 1, b"x")
    s.write(0, b"b", 2, None)
    s.apply_transferred(0, [(b"c", 3, b"y"), (b"d", 4, None)])
    s.apply_chunk(1, [b"k%d" % i for i in range(100)], list(range(100)), [b"v"] * 99 + [None])
    s.apply_chunk(1, [b"k%d" % i for i in range(50, 150)], list(range(1, 101)), [b"w"] * 100)
    for seg in s.segments.values():
        assert not gc.is_tracked(seg.ver) and not gc.is_tracked(seg.val)
    assert s.get(0, b"a") == (1, b"x") and s.get(0, b"b") == (2, None) and s.get(1, b"k60") == (60, b"v")
    assert s.get(1, b"k120") == (71, b"w")
    assert dict(s.segments[0].items()) == {b"a": (1, b"x"), b"b": (2, None), b"c": (3, b"y"), b"d": (4, None)}


def test_dropped_segments_and_their_change_logs_are_freed_a_slice_per_step() -> None:
    # At the end of a rebalance a member drops a third of its segments in one step; their entries, and the
    # change-feed logs a member's FeedStore keeps per segment, are freed a budget at a time (the logs were
    # freed at once: ~20 ms in one step on the loaded machine, a stall for every operation waiting).
    from groupcluster.grid.feed import FeedStore
    from groupcluster.grid.store import FREE_AT_ONCE

    n = FREE_AT_ONCE * 3
    store = FeedStore(4, max_entries=n, max_bytes=1 << 30)
    store.add_segment(1)
    for i in range(n):
        store.write(1, b"k%d" % i, make_version(1, i + 1), b"v")
    assert len(store.feeds[1].entries) == n
    assert store.remove_segment(1) == n
    assert 1 not in store.feeds and store.garbage == 2 * n  # the entries and the log, both still to free
    freed = []
    while store.garbage:
        freed.append(store.collect(FREE_AT_ONCE))
    assert freed == [FREE_AT_ONCE] * 6 and store.garbage == 0


_STORE_OP = st.tuples(
    st.sampled_from(["write", "transfer", "chunk", "keep", "purge", "expire", "remove", "clear"]),
    st.integers(0, 1),  # segment
    st.integers(0, 7),  # key: few, so writes meet what is held
    st.integers(1, 600),  # version (a write's is mostly above the earlier ops': see below)
    st.integers(-1, 12),  # value size (-1: a delete or tombstone)
)


@pytest.mark.parametrize("feed", [False, True], ids=["store", "feed-store"])
@settings(max_examples=100 * EXAMPLES_SCALE, deadline=None, derandomize=True, database=None)
@given(ops=st.lists(_STORE_OP, max_size=60))
def test_property_nbytes_follows_every_change(feed: bool, ops: list[tuple[str, int, int, int, int]]) -> None:
    """The running count of live key and value bytes (what max_bytes reads) equals a recount after any mix of
    writes, deletes, transfers (entry by entry and in bulk, with clashes and tombstones), tombstone purges and
    expiries, and segment drops; for the change-feed store too, whose write path has its own copy."""
    from groupcluster.grid.feed import FeedStore

    s = FeedStore(2) if feed else SegmentStore(2)
    for n, (op, seg, k, ver, size) in enumerate(ops):
        key = b"k%d" % k
        value = None if size < 0 else bytes([65 + k % 26]) * size
        if op == "write":
            # Mostly newer than what came before, so writes overwrite values (of other sizes) and tombstones.
            s.write(seg, key, 10 * n + ver % 12, value, now=float(n))
        elif op == "transfer":
            s.apply_transferred(seg, [(key, ver, value)], now=float(n))
        elif op == "chunk":
            keys = [b"k%d" % ((k + i) % 24) for i in range(20)]
            values = [None if (i + size) % 7 == 0 else bytes([66]) * ((size + i) % 9) for i in range(20)]
            s.apply_chunk(seg, keys, [ver + i % 3 for i in range(20)], values, now=float(n))
        elif op == "keep":
            s.keep_tombstones = not s.keep_tombstones
        elif op == "purge":
            s.purge_tombstones()
        elif op == "expire":
            s.expire_tombstones(float(n), float(size % 5))
        elif op == "remove":
            s.remove_segment(seg)
        else:
            s.clear_segment(seg)
        assert s.nbytes == s.count_bytes(), (n, op)
    assert s.describe()["bytes"] == s.nbytes
