"""RuntimeSegments: what a grid runtime serves by segment: scans, the change feed and its stable version, and
the routing table clients route keys with."""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Any

from ..consistent_hash import segment_of
from ..errors import GridLeaving, GridNotOwner, GridUnavailable
from ..feed import ChangePage, FeedStore, stable_bound
from ..store import Segment
from .runtime_base import RuntimeBase


@dataclass(frozen=True, slots=True)
class SegmentPage:
    """One page of a segment scan: entries ``(key, value, version)`` in key order, after the cursor given."""

    segment: int
    topology_id: int
    entries: list[tuple[bytes, bytes, int]]
    more: bool  # True: entries after the last one exist; ask again with ``after`` = the last key


class RuntimeSegments(RuntimeBase):
    """Segment scans and change-feed pages (from a member that reads the segment), and the routing table."""

    def scan_segment(
        self, segment: int, after: bytes | None = None, limit: int = 1000, max_bytes: int = 4 << 20
    ) -> SegmentPage:
        """Up to ``limit`` live entries of ``segment`` with keys above ``after``, in key order (one page).

        Served only by a member that reads the segment in the installed topology (it holds a complete copy);
        others raise :class:`GridNotOwner` naming the members that do. Key order makes the cursor stable
        while writes go on: a key present during the whole scan is returned exactly once.
        """
        node = self._require_node()
        t = node.topology
        assert t is not None and node.store is not None
        if not 0 <= segment < t.num_segments:
            raise ValueError(f"segment: {segment} is outside [0, {t.num_segments - 1}]")
        if limit < 1:
            raise ValueError(f"limit: expected at least 1, got {limit}")
        if node.leaving:
            raise GridLeaving("this member is leaving the grid; read the segment from another owner")
        if not t.can_read(segment):
            raise GridUnavailable(f"segment {segment} is unavailable for reads ({t.mode.value})")
        owners = t.read_owners(segment)
        if node.address not in owners or not node.store.has_segment(segment):
            urls = [self.endpoints.get(m) for m in owners]
            raise GridNotOwner(f"segment {segment} is not readable on this member; read it from its owners", urls)
        data = node.store.segments.get(segment) or Segment()
        # nsmallest keeps the page O(n log limit) without sorting the whole segment for every page.
        keys = heapq.nsmallest(
            limit + 1, (k for k, v in data.val.items() if v is not None and (after is None or k > after))
        )
        entries: list[tuple[bytes, bytes, int]] = []
        size = 0
        more = len(keys) > limit
        for k in keys[:limit]:
            version, value = data[k]
            assert value is not None
            size += len(k) + len(value)
            if entries and size > max_bytes:
                more = True
                break
            entries.append((k, value, version))
        self.counters["segment_pages"] += 1
        return SegmentPage(segment, t.topology_id, entries, more)

    def stable_version(self) -> int:
        """The version at or below which no write can still arrive at this member (:data:`ALL_STABLE`: none).

        A segment's versions under one topology come from its one primary, in order (FIFO channel), so the
        only writes that arrive out of version order are the re-driven ones: stamped under an older topology,
        pushed to the owners of a newer one. Every member announces the lowest topology it may still push
        such writes of (:meth:`ChangeFeed.oldest_unfinished`); once every member of the view announced at least
        our topology, nothing older can come and the whole log is stable. Until then only the versions of
        topologies before the lowest announced one are. A member not heard from yet counts as 0.
        """
        node = self._require_node()
        t = node.topology
        assert t is not None
        others = (self.unfinished.get(m, 0) for m in node.view if m != node.address)
        return stable_bound(t.topology_id, self.feed.oldest_unfinished(node), others)

    def changes(self, segment: int, after: int, limit: int = 1000, max_bytes: int = 4 << 20) -> ChangePage:
        """One page of the change feed of ``segment`` after version ``after`` (see :class:`FeedStore`).

        Served, like a segment scan, only by a member that reads the segment in its installed topology;
        others raise :class:`GridNotOwner` naming the members that do.
        """
        node = self._require_node()
        t = node.topology
        store = node.store
        assert t is not None and store is not None
        if not 0 <= segment < t.num_segments:
            raise ValueError(f"segment: {segment} is outside [0, {t.num_segments - 1}]")
        if node.leaving:
            raise GridLeaving("this member is leaving the grid; read the segment from another owner")
        if not t.can_read(segment):
            raise GridUnavailable(f"segment {segment} is unavailable for reads ({t.mode.value})")
        owners = t.read_owners(segment)
        if node.address not in owners or not store.has_segment(segment) or not isinstance(store, FeedStore):
            urls = [self.endpoints.get(m) for m in owners]
            raise GridNotOwner(f"segment {segment} is not readable on this member; read it from its owners", urls)
        page = store.changes(segment, after, limit, self.stable_version(), max_bytes)
        self.counters["change_pages"] += 1
        if not page.covered:
            self.counters["change_pages_uncovered"] += 1
        return page

    def routing(self) -> dict[str, Any] | None:
        """What a client needs to route keys itself: per segment, the member to read from and to write to.

        Members are listed by HTTP URL (``null`` when a member has not announced one yet); ``read``/``write``
        hold indexes into that list, ``-1`` where no live owner exists (any member forwards); ``owners`` lists,
        per segment, every member that can serve reads and segment scans, preferred first.
        """
        node = self.node
        if node is None or node.topology is None:
            return None
        t = node.topology
        members = list(t.members)
        urls = [self.endpoints.get(m) for m in members]
        cached = self._routing_cache
        if cached is not None and cached[0] is t and cached[1] == urls:
            return cached[2]  # clients and progress bars ask often; a topology's table never changes
        index = {m: i for i, m in enumerate(members)}
        read, write, owners = [], [], []
        routes = node.owner_routes()  # the node's, computed once per topology
        if routes is None:
            raise RuntimeError("routing: the node has a topology but no owner routes")
        for r, w in zip(*routes, strict=True):
            read.append(index.get(r[0], -1) if r else -1)
            write.append(index.get(w[0], -1) if w else -1)
            owners.append([index[m] for m in r if m in index])
        table = {
            "topology_id": t.topology_id,
            "num_segments": t.num_segments,
            "members": urls,
            "addresses": [str(m) for m in members],
            "read": read,
            "write": write,
            "owners": owners,
        }
        self._routing_cache = (t, urls, table)
        return table

    def segment_of(self, key: bytes) -> int | None:
        t = self.node.topology if self.node is not None else None
        return None if t is None else segment_of(key, t.num_segments)
