"""The change feed: per segment, a bounded log of the writes a member applied (:class:`FeedStore`), paged in
version order up to a point where nothing older can still arrive (:func:`stable_bound`), and
:class:`ChangeFeed`, the node hooks that give a :class:`~.node.GridNode` this store and report how far back
writes it stamped are still on their way. Sans-IO; the driver (``grid/driver/``) serves it and the Spark
stream reads it (docs/spark.md)."""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from .node import GridNode, NodeHooks
from .store import FREE_AT_ONCE, SEQ_BITS, SegmentStore, version_topology
from .topology import CacheTopology

DEFAULT_FEED_ENTRIES = 10_000  # per segment; a reader further behind falls back to a scan of the segment
# Per segment too: the log keeps overwritten values alive, so it is bounded in bytes (256 segments: 64 MiB).
DEFAULT_FEED_BYTES = 256 * 1024
FEED_ENTRY_OVERHEAD = 64  # bytes counted per log entry besides key and value (tuple, version, deque slot)
ALL_STABLE = (1 << 63) - 1  # "every entry in the log is stable"

# (version, key, value or None for a deletion): one write applied by this member, as the feed gives it.
FeedEntry = tuple[int, bytes, bytes | None]


class FeedLog:
    """The writes one member applied to one segment, in the order they arrived (bounded).

    ``floor``: the log holds every write this member applied with a version above it (a reader whose offset
    is below ``floor`` cannot be served from the log). ``declared``: the highest version already answered as
    stable; a write arriving at or below it (only a merge push can) came too late for readers that passed it
    and is counted in :attr:`FeedStore.late`.
    """

    __slots__ = ("declared", "entries", "floor", "size", "top")

    def __init__(self, floor: int) -> None:
        self.entries: deque[FeedEntry] = deque()
        self.size = 0  # bytes counted (keys, values, FEED_ENTRY_OVERHEAD each)
        self.floor = floor
        self.top = floor
        self.declared = floor


@dataclass(frozen=True, slots=True)
class ChangePage:
    """One answer of the change feed for a segment.

    ``covered`` False: the log does not reach back to ``after`` (``floor`` is where it starts); read the
    segment by scan instead. Otherwise ``entries`` are the writes with versions in ``(after, upto]`` in version
    order (``(version, key, value or None)``), and the reader continues with ``after = upto``; ``more`` says
    the page stopped at ``limit`` and more stable entries follow.
    """

    segment: int
    topology_id: int
    covered: bool
    floor: int
    entries: list[FeedEntry]
    upto: int
    more: bool


class FeedStore(SegmentStore):
    """A :class:`SegmentStore` that also keeps, per segment, a log (bounded in entries and bytes) of the writes
    applied through :meth:`write` (local writes, backups, re-driven writes and merge pushes; not state
    transfer).

    A log starts when the member starts holding the segment. A segment created by the first topology that
    names us its owner (no fetch) starts complete (``floor`` 0); a segment cleared for a fetch under topology
    T starts at ``floor = (T << 40) - 1``: the transfer brings everything stamped before T (not logged), and
    every write stamped under T or later reaches us as a write owner through :meth:`write`.
    """

    __slots__ = ("feeds", "late", "max_bytes", "max_entries", "topology_id")

    def __init__(
        self, num_segments: int, max_entries: int = DEFAULT_FEED_ENTRIES, max_bytes: int = DEFAULT_FEED_BYTES
    ) -> None:
        super().__init__(num_segments)
        if max_entries < 1:
            raise ValueError(f"max_entries: expected at least 1, got {max_entries}")
        if max_bytes < 1:
            raise ValueError(f"max_bytes: expected at least 1, got {max_bytes}")
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.feeds: dict[int, FeedLog] = {}
        # The topology being installed: new logs of fetched segments start at its first version.
        self.topology_id = 0
        self.late = 0  # entries that arrived below a version already answered as stable

    def _fetch_floor(self) -> int:
        return max(0, (self.topology_id << SEQ_BITS) - 1)

    def add_segment(self, segment: int) -> None:
        if segment not in self.segments:
            self._check_segment(segment)
            self.feeds[segment] = FeedLog(0)
        super().add_segment(segment)

    def remove_segment(self, segment: int) -> int:
        log = self.feeds.pop(segment, None)
        if log is not None and len(log.entries) > FREE_AT_ONCE:
            # Freed a slice per step with the segment's entries (SegmentStore.collect): dropping the logs of
            # a third of the segments at once cost a member ~20 ms in one step at the end of a rebalance.
            self._garbage.append(log.entries)
        return super().remove_segment(segment)

    def clear_segment(self, segment: int) -> int:
        n = super().clear_segment(segment)
        self.feeds[segment] = FeedLog(self._fetch_floor())
        return n

    def write(self, segment: int, key: bytes, version: int, value: bytes | None, *, now: float = 0.0) -> bool:
        # Every write a member applies comes here (on the primary and on each backup): the logging below is
        # kept to a few operations per entry, and eviction leaves this function only when a log is full.
        # SegmentStore.write's common case (a value newer than the stored one, or a new key) is repeated here
        # (saves a call per write), its byte count too (tests/unit/test_grid_store.py checks both copies);
        # anything else goes through it.
        data = self.segments.get(segment)
        old = data.ver.get(key) if data is not None and value is not None else None
        if data is not None and value is not None and (old is None or old < version):
            vals = data.val
            if old is None:
                self.nbytes += len(key) + len(value)
            else:
                held = vals[key]
                if held is None:
                    self.tombstones -= 1
                    self.nbytes += len(key) + len(value)
                else:
                    self.nbytes += len(value) - len(held)
            data.ver[key] = version
            vals[key] = value
        elif not super().write(segment, key, version, value, now=now):
            return False
        log = self.feeds.get(segment)
        if log is None:
            # Created by a write, not by a topology: what came before is unknown to us.
            log = self.feeds[segment] = FeedLog(self._fetch_floor())
        if version <= log.declared:
            # Arrived behind a point already answered as stable (a merge pushes each partition's entries
            # with their old versions): readers past it never see it. Counted, so it shows.
            self.late += 1
        entries = log.entries
        entries.append((version, key, value))
        log.size += len(key) + (len(value) if value is not None else 0) + FEED_ENTRY_OVERHEAD
        if version > log.top:
            log.top = version
        if len(entries) > self.max_entries or log.size > self.max_bytes:
            self._evict(log)
        return True

    def _evict(self, log: FeedLog) -> None:
        # Eviction is in arrival order and raises the floor to the highest version evicted: an entry that
        # stays has a version above it or arrived later, so "complete above floor" stays true. The newest
        # entry always stays, whatever its size. A full log is cut a sixteenth below its bounds, not just
        # under them: a log stays full under a steady write load, and a call here per write (one entry out
        # each) was ~5% of a member's CPU while Spark wrote into the grid. Small bounds are kept exactly.
        entries = log.entries
        floor = log.floor
        size = log.size
        max_entries = self.max_entries - (self.max_entries >> 4)
        max_bytes = self.max_bytes - (self.max_bytes >> 4)
        while len(entries) > 1 and (len(entries) > max_entries or size > max_bytes):
            version, key, value = entries.popleft()
            size -= len(key) + (len(value) if value is not None else 0) + FEED_ENTRY_OVERHEAD
            if version > floor:
                floor = version
        log.floor = floor
        log.size = size

    def changes(self, segment: int, after: int, limit: int, stable: int, max_bytes: int = 4 << 20) -> ChangePage:
        """The writes with versions in ``(after, stable]`` in version order, at most ``limit`` (one page).

        ``stable``: no write with a version at or below it can still arrive (:data:`ALL_STABLE`: none below
        any version; the driver works it out from what every member has in flight).
        """
        self._check_segment(segment)
        if after < 0:
            raise ValueError(f"after: expected a version >= 0, got {after}")
        if limit < 1:
            raise ValueError(f"limit: expected at least 1, got {limit}")
        log = self.feeds.get(segment)
        if log is None or after < log.floor:
            floor = log.floor if log is not None else ALL_STABLE
            return ChangePage(segment, self.topology_id, False, floor, [], after, False)
        bound = min(stable, log.top)
        # heapq.nsmallest keeps a page O(n log limit) instead of sorting the whole log each time.
        picked = heapq.nsmallest(limit + 1, (e for e in log.entries if after < e[0] <= bound))
        more = len(picked) > limit
        out: list[FeedEntry] = []
        size = 0
        for e in picked[:limit]:
            size += len(e[1]) + (len(e[2]) if e[2] is not None else 0)
            if out and size > max_bytes:
                more = True
                break
            out.append(e)
        upto = out[-1][0] if more else max(after, bound)
        if upto > log.declared:
            log.declared = upto
        return ChangePage(segment, self.topology_id, True, log.floor, out, upto, more)

    def describe(self) -> dict[str, Any]:
        d = super().describe()
        d["feed_entries"] = sum(len(f.entries) for f in self.feeds.values())
        d["feed_late"] = self.late
        return d


def stable_bound(topology_id: int, own_low: int, others: Iterable[int]) -> int:
    """The version at or below which no write can still arrive at a member whose topology is ``topology_id``.

    ``own_low`` and ``others``: per member of the view, the lowest topology whose versions may still come
    from it (0 for a member not heard from). Once all reached our topology, every entry held is final
    (:data:`ALL_STABLE`); otherwise only versions of topologies below the lowest one.
    """
    low = min([own_low, *others])
    return ALL_STABLE if low >= topology_id else max(0, (low << SEQ_BITS) - 1)


class ChangeFeed(NodeHooks):
    """The change feed's part in a node's steps (pass it as the node's ``hooks``; one per node).

    The node's store is a :class:`FeedStore` (a :class:`~.persist.PersistentStore` with ``persistent``); each
    topology installed tells the store where the logs of segments fetched under it start; every re-drive is
    noted, so the driver knows when :meth:`oldest_unfinished` may have changed (``redriven``).
    """

    def __init__(
        self,
        *,
        persistent: bool = False,
        entries: int = DEFAULT_FEED_ENTRIES,
        max_bytes: int = DEFAULT_FEED_BYTES,
    ) -> None:
        self.persistent = persistent
        self.entries = entries
        self.max_bytes = max_bytes
        self.redriven = False  # a write was re-driven since oldest_unfinished last ran

    def new_store(self, num_segments: int) -> SegmentStore:
        if self.persistent:
            from .persist import PersistentStore  # persist.py builds on FeedStore

            return PersistentStore(num_segments, self.entries, self.max_bytes)
        return FeedStore(num_segments, self.entries, self.max_bytes)

    def installing(self, t: CacheTopology, store: SegmentStore) -> None:
        assert isinstance(store, FeedStore), "the store was not made by ChangeFeed.new_store"
        store.topology_id = t.topology_id

    def redriving(self, version: int) -> None:
        self.redriven = True

    def oldest_unfinished(self, node: GridNode) -> int:
        """The lowest topology id whose versions may still arrive from ``node``: its installed topology, or the
        stamp topology of a write it applied under an older one and is still pushing to its owners."""
        t = node.topology
        low = t.topology_id if t is not None else 0
        for pw in node.replication.writes.values():
            vt = version_topology(pw.version)
            if vt < low:
                low = vt
        self.redriven = False
        return low
