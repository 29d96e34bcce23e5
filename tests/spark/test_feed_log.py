"""Unit tests of the member-side change feed (pure): :class:`FeedStore` logs, bounds, ordering, truncation,
and the :class:`ChangeFeed` hooks that install it in a node and reports writes still in flight from older topologies.

They live with the Spark tests because the feed exists for the Spark stream; they need no SparkSession.
"""

from __future__ import annotations

import pytest
from groupcluster.core.address import Address
from groupcluster.grid.feed import ALL_STABLE, ChangeFeed, FeedStore, stable_bound
from groupcluster.grid.node import GridConfig, GridNode, _PendingWrite
from groupcluster.grid.store import make_version


def v(topology: int, seq: int) -> int:
    return make_version(topology, seq)


def held(num_segments: int = 4, max_entries: int = 100) -> FeedStore:
    s = FeedStore(num_segments, max_entries)
    s.topology_id = 1
    for seg in range(num_segments):
        s.add_segment(seg)  # the first topology: owner from the start, the logs are complete
    return s


def test_puts_deletes_and_overwrites_come_out_in_version_order() -> None:
    s = held()
    s.write(0, b"a", v(1, 1), b"1")
    s.write(0, b"a", v(1, 2), b"2")  # an overwrite: both versions are in the feed
    s.write(0, b"b", v(1, 4), b"x")
    s.write(0, b"a", v(1, 3), None)  # a delete arriving out of order (a re-driven write)
    page = s.changes(0, 0, 100, ALL_STABLE)
    assert page.covered and not page.more
    assert page.entries == [(v(1, 1), b"a", b"1"), (v(1, 2), b"a", b"2"), (v(1, 3), b"a", None), (v(1, 4), b"b", b"x")]
    assert page.upto == v(1, 4)
    # Nothing after the last version; the cursor stays where it is.
    again = s.changes(0, page.upto, 100, ALL_STABLE)
    assert again.covered and again.entries == [] and again.upto == v(1, 4)
    # Other segments have their own log.
    assert s.changes(1, 0, 100, ALL_STABLE).entries == []


def test_a_write_that_loses_to_a_newer_version_is_not_in_the_feed() -> None:
    s = held()
    s.write(0, b"a", v(1, 5), b"new")
    assert not s.write(0, b"a", v(1, 3), b"old")
    assert [e[0] for e in s.changes(0, 0, 10, ALL_STABLE).entries] == [v(1, 5)]


def test_pages_follow_limit_and_continue_from_upto() -> None:
    s = held()
    for i in range(1, 8):
        s.write(2, f"k{i}".encode(), v(1, i), b"x")
    seen: list[int] = []
    after = 0
    while True:
        page = s.changes(2, after, 3, ALL_STABLE)
        assert len(page.entries) <= 3
        seen += [e[0] for e in page.entries]
        after = page.upto
        if not page.more:
            break
    assert seen == [v(1, i) for i in range(1, 8)]


def test_the_stable_bound_holds_back_newer_entries_until_released() -> None:
    s = held()
    s.write(0, b"a", v(2, 1), b"new topology")
    s.write(0, b"b", v(1, 9), b"old topology")
    page = s.changes(0, 0, 10, stable=v(2, 0) - 1)
    assert page.entries == [(v(1, 9), b"b", b"old topology")]
    assert page.upto == v(2, 0) - 1  # the reader may move up to the bound, not past it
    page = s.changes(0, page.upto, 10, ALL_STABLE)
    assert page.entries == [(v(2, 1), b"a", b"new topology")]


def test_the_log_is_bounded_and_says_when_it_no_longer_reaches_back() -> None:
    s = held(max_entries=5)
    for i in range(1, 9):
        s.write(0, f"k{i}".encode(), v(1, i), b"x")
    assert len(s.feeds[0].entries) == 5
    assert s.feeds[0].floor == v(1, 3)  # entries 1..3 were evicted
    old = s.changes(0, v(1, 2), 10, ALL_STABLE)
    assert not old.covered and old.entries == [] and old.floor == v(1, 3)
    ok = s.changes(0, v(1, 3), 10, ALL_STABLE)
    assert ok.covered and [e[0] for e in ok.entries] == [v(1, i) for i in range(4, 9)]


def test_the_log_is_bounded_in_bytes_and_keeps_the_newest_entry() -> None:
    s = FeedStore(2, max_entries=1000, max_bytes=1000)
    s.add_segment(0)
    for i in range(1, 6):
        s.write(0, b"k", v(1, i), b"x" * 300)  # 300 + 1 + 64 bytes each: two fit
    assert [e[0] for e in s.feeds[0].entries] == [v(1, 4), v(1, 5)]
    assert s.feeds[0].floor == v(1, 3)
    s.write(0, b"big", v(1, 6), b"y" * 5000)  # alone above the bound: kept, everything before it goes
    assert [e[0] for e in s.feeds[0].entries] == [v(1, 6)]
    assert s.changes(0, v(1, 5), 10, ALL_STABLE).entries == [(v(1, 6), b"big", b"y" * 5000)]
    with pytest.raises(ValueError, match="max_bytes"):
        FeedStore(2, 10, 0)


def test_a_fetched_segment_starts_at_the_fetch_topology() -> None:
    s = FeedStore(4)
    s.topology_id = 7
    s.clear_segment(3)  # a new owner starts fetching under topology 7
    s.apply_transferred(3, [(b"t", v(5, 1), b"transferred")])  # state transfer: not in the feed
    s.write(3, b"w", v(7, 2), b"written")
    assert not s.changes(3, v(5, 0), 10, ALL_STABLE).covered
    page = s.changes(3, v(7, 0) - 1, 10, ALL_STABLE)
    assert page.covered and page.entries == [(v(7, 2), b"w", b"written")]
    # Dropping the segment drops its log; a segment we never held has none.
    s.remove_segment(3)
    assert not s.changes(3, v(7, 0), 10, ALL_STABLE).covered
    assert not s.changes(2, 0, 10, ALL_STABLE).covered


def test_a_write_behind_what_was_declared_stable_is_counted() -> None:
    s = held()
    s.write(0, b"a", v(3, 1), b"x")
    s.write(0, b"b", v(3, 2), b"y")
    assert s.changes(0, 0, 10, ALL_STABLE).upto == v(3, 2)
    assert s.late == 0
    s.write(0, b"c", v(2, 8), b"late")  # e.g. pushed after a merge, with its old version
    assert s.late == 1 and s.describe()["feed_late"] == 1
    # A reader that had not passed it still gets it, in version order.
    assert [e[0] for e in s.changes(0, 0, 10, ALL_STABLE).entries] == [v(2, 8), v(3, 1), v(3, 2)]


def test_bad_arguments_are_named() -> None:
    s = held()
    with pytest.raises(ValueError, match="segment 9 is outside"):
        s.changes(9, 0, 10, ALL_STABLE)
    with pytest.raises(ValueError, match="after"):
        s.changes(0, -1, 10, ALL_STABLE)
    with pytest.raises(ValueError, match="limit"):
        s.changes(0, 0, 0, ALL_STABLE)
    with pytest.raises(ValueError, match="max_entries"):
        FeedStore(4, 0)


def test_the_feed_node_writes_through_its_feed_store() -> None:
    a = Address("127.0.0.1", 7001, 1)
    feed = ChangeFeed()
    node = GridNode(a, GridConfig.from_dict({"num_segments": 8, "num_owners": 1}), hooks=feed)
    node.on_view([a], 0.0)
    for _ in range(20):
        if node.topology is not None:
            break
        node.tick(node.next_deadline() or 0.0)
    assert node.topology is not None and isinstance(node.store, FeedStore)
    node.put(b"k", b"v1", 1.0)
    node.put(b"k", b"v2", 1.0)
    node.delete(b"k", 1.0)
    results = node.take_results()
    assert [r.ok for r in results] == [True, True, True]
    seg = next(s for s, f in node.store.feeds.items() if f.entries)
    page = node.store.changes(seg, 0, 10, ALL_STABLE)
    assert [(k, val) for _, k, val in page.entries] == [(b"k", b"v1"), (b"k", b"v2"), (b"k", None)]
    # Nothing stamped under an older topology is in flight: the oldest unfinished is our own topology.
    assert feed.oldest_unfinished(node) == node.topology.topology_id


def test_the_stable_bound_waits_for_every_member_to_leave_older_topologies_behind() -> None:
    assert stable_bound(5, 5, []) == ALL_STABLE  # alone, nothing older in flight
    assert stable_bound(5, 5, [5, 6]) == ALL_STABLE  # a member already on a newer topology is fine
    # A member still on topology 4 (it may stamp or re-drive versions of 4): only versions below 4 are final.
    assert stable_bound(5, 5, [5, 4]) == v(4, 0) - 1
    assert stable_bound(5, 3, [5]) == v(3, 0) - 1  # we ourselves still re-drive a write of topology 3
    assert stable_bound(5, 5, [0]) == 0  # a member not heard from yet holds everything back


def test_a_write_being_re_driven_holds_back_its_topology() -> None:
    a = Address("127.0.0.1", 7001, 1)
    b = Address("127.0.0.1", 7002, 1)
    feed = ChangeFeed()
    node = GridNode(a, GridConfig.from_dict({"num_segments": 8, "num_owners": 1}), hooks=feed)
    node.on_view([a], 0.0)
    for _ in range(20):
        if node.topology is not None:
            break
        node.tick(node.next_deadline() or 0.0)
    assert node.topology is not None
    tid = node.topology.topology_id
    assert feed.oldest_unfinished(node) == tid
    # A write stamped under an older topology, still on its way to a backup: its topology is reported.
    node.replication.writes[99] = _PendingWrite(b, 1, 1, tid, {b}, b"k", v(tid - 1, 3) if tid > 1 else 3, b"v")
    assert feed.oldest_unfinished(node) == max(tid - 1, 0)
    del node.replication.writes[99]
    assert feed.oldest_unfinished(node) == tid


def test_a_full_log_is_cut_a_sixteenth_below_its_bound_and_stays_complete_above_its_floor() -> None:
    # A log stays full under steady writes; cutting it a little below the bound (not one entry per write)
    # keeps eviction out of most writes. What it holds must still be every write above the floor.
    s = held(max_entries=1600)
    for i in range(1, 1601):
        s.write(i % 4, b"k%d" % i, v(1, i), b"x")
    assert len(s.feeds[0].entries) == 400  # 1600 writes over 4 segments: no log is full yet
    for i in range(1601, 6401):
        s.write(0, b"k%d" % i, v(1, i), b"x")
    log = s.feeds[0]
    assert 1500 <= len(log.entries) <= 1600
    page = s.changes(0, log.floor, 2000, ALL_STABLE)
    assert page.covered and [e[0] for e in page.entries] == sorted(e[0] for e in log.entries)
    assert page.entries[-1][0] == v(1, 6400) and page.entries[0][0] > log.floor
    assert not s.changes(0, log.floor - 1, 10, ALL_STABLE).covered
