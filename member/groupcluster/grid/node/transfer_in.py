"""Inbound state transfer (the state consumer): a new owner fetching its segments, and pacing what it receives.

It holds this member's inbound streams (by transfer id), which segments of the current rebalance it started
and finished fetching, retries after a source failed a segment, and the acknowledgements held back by
``transfer_rate``."""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterable
from typing import TYPE_CHECKING

from ...core.address import Address
from ..messages import Fetch, XferAck, XferCancel, XferData, XferFail
from ..topology import (
    CacheTopology,
    Phase,
)
from .events import EVENT_ARRIVED

if TYPE_CHECKING:
    from .facade import GridNode


XFER_OVERHEAD = 64  # bytes a chunk's message costs beyond its packed entries (pacing; approximate)


class _InXfer:
    __slots__ = ("remaining", "source")

    def __init__(self, source: Address, segments: Iterable[int]) -> None:
        self.source = source
        self.remaining = set(segments)


class StateConsumer:
    """This member as a new owner pulling segments: its inbound streams and their pacing."""

    def __init__(self, node: GridNode) -> None:
        self.node = node
        self._next_xfer = 1
        self.in_xfers: dict[int, _InXfer] = {}
        self.xfer_rebalance = -1  # the rebalance our fetch state belongs to
        self.fetch_started: set[int] = set()  # segments cleared and (being) fetched in that rebalance
        self.fetched: set[int] = set()
        self.fetch_tries: Counter[int] = Counter()
        self.refetch_at: float | None = None
        # Pacing (transfer_rate): when the next chunk may be acknowledged, and acknowledgements held until then
        # as (due time, source, transfer id); streams whose window has room for another chunk in a later step.
        self._ack_at = 0.0
        self.acks_due: deque[tuple[float, Address, int]] = deque()
        self._to_fetch_cache: tuple[CacheTopology, frozenset[int]] | None = None

    def to_fetch(self, t: CacheTopology) -> frozenset[int]:
        """Our segments to pull in ``t`` (asked after every transfer chunk: cached per topology)."""
        cached = self._to_fetch_cache
        if cached is None or cached[0] is not t:
            cached = self._to_fetch_cache = (t, t.segments_to_fetch(self.node.address))
        return cached[1]

    # ==== state transfer ===================================================================================
    def cancel_in_xfers(self) -> None:
        for xid, xf in self.in_xfers.items():
            if xf.source in self.node.view:
                self.node._emit(xf.source, XferCancel(xid))
        self.in_xfers.clear()

    def plan_fetches(self) -> None:
        """Request every segment still missing from a live current owner, one stream per source."""
        t = self.node.topology
        if t is None or t.phase != Phase.READ_OLD_WRITE_ALL:
            return
        need = self.to_fetch(t) - self.fetched
        for xf in self.in_xfers.values():
            need -= xf.remaining
        alive = set(self.node.view) & set(t.members)
        by_source: dict[Address, list[int]] = {}
        # Segments each source already streams to us: a segment goes to the least loaded of its owners. Always
        # asking the primary left one old member streaming 45% of a joiner's segments and another 15%, so
        # the last ~100 ms of a 1M-entry rebalance ran one stream alone.
        load: Counter[Address] = Counter()
        for xf in self.in_xfers.values():
            load[xf.source] += len(xf.remaining)
        for s in sorted(need):
            sources = [m for m in t.current.owners_of(s) if m in alive and m != self.node.address]
            if not sources:
                # Nobody holds it any more (more owners failed than the data survives): start empty.
                self.node.metrics["grid.segments_unrecoverable"] += 1
                self.fetched.add(s)
                continue
            # A retry (the source failed the segment) asks the next owner in turn, as before; a first try the
            # least loaded owner, ties to the first listed (deterministic, so simulation seeds replay).
            k = self.fetch_tries[s] % len(sources)
            turn = sources[k:] + sources[:k]
            src = min(turn, key=lambda m: load[m]) if not self.fetch_tries[s] else turn[0]
            load[src] += 1
            by_source.setdefault(src, []).append(s)
        for src, segs in by_source.items():
            xid = self._next_xfer
            self._next_xfer += 1
            self.in_xfers[xid] = _InXfer(src, segs)
            self.node._emit(src, Fetch(xid, t.topology_id, t.rebalance_id, tuple(segs)))
        self.node.membership.maybe_confirm()

    def on_xfer_data(self, src: Address, d: XferData) -> None:
        xf = self.in_xfers.get(d.xfer_id)
        if xf is None or xf.source != src:
            return  # a stream we cancelled
        store = self.node.store
        assert store is not None
        chunk = d.entries
        if d.segment in xf.remaining and len(chunk):
            applied = store.apply_chunk(d.segment, chunk.keys, chunk.versions, chunk.values, now=self.node._now)
            if chunk.expiries is not None:
                store.set_expiries(d.segment, chunk.keys, chunk.versions, chunk.expiries)
            self.node.metrics["grid.xfer_entries_in"] += len(chunk)
            self.node.metrics["grid.xfer_entries_applied"] += applied
            self.node.metrics["grid.xfer_bytes_in"] += chunk.nbytes
            if EVENT_ARRIVED in self.node.events.event_kinds:
                # Every entry received, applied or not (a newer local write wins): duplicates are allowed.
                self.node.events.event(EVENT_ARRIVED, d.segment, chunk.keys, chunk.versions, chunk.values)
        for s in d.done:
            if s in xf.remaining:
                xf.remaining.discard(s)
                self.fetched.add(s)
        if d.last or not xf.remaining:
            self.in_xfers.pop(d.xfer_id, None)
            if xf.remaining:  # the source ended early: fetch the rest again
                self.plan_fetches()
        else:
            self._ack(src, d)
        self.node.membership.maybe_confirm()

    def _ack(self, src: Address, d: XferData) -> None:
        """Acknowledge a chunk, which lets its source send the next one: at once, or with ``transfer_rate`` once
        the chunks acknowledged so far are within the rate (each is counted at its packed size)."""
        rate = self.node.config.transfer_rate
        if not rate:
            self.node._emit(src, XferAck(d.xfer_id))
            return
        now = self.node._now
        due = max(now, self._ack_at)
        self._ack_at = due + (len(d.entries.blob) + XFER_OVERHEAD) / rate
        if due > now or self.acks_due:
            self.acks_due.append((due, src, d.xfer_id))
        else:
            self.node._emit(src, XferAck(d.xfer_id))

    def on_xfer_fail(self, src: Address, f: XferFail) -> None:
        xf = self.in_xfers.get(f.xfer_id)
        if xf is None or xf.source != src:
            return
        for s in f.segments:
            if s in xf.remaining:
                xf.remaining.discard(s)
                self.fetch_tries[s] += 1
        if not xf.remaining:
            self.in_xfers.pop(f.xfer_id, None)
        self.node.metrics["grid.xfer_failed"] += len(f.segments)
        # Try another owner after a short pause (the source may just not have caught up with us).
        self.refetch_at = self.node._now + self.node.config.retry_backoff

    def tick(self, now: float) -> None:
        """Fetch again after a failed segment's pause; send the acknowledgements ``transfer_rate`` held back."""
        if self.refetch_at is not None and now >= self.refetch_at:
            self.refetch_at = None
            self.plan_fetches()
        while self.acks_due and self.acks_due[0][0] <= now:
            _, src, xid = self.acks_due.popleft()
            xf = self.in_xfers.get(xid)
            if xf is not None and xf.source == src:  # not cancelled meanwhile
                self.node._emit(src, XferAck(xid))
