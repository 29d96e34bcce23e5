"""Outbound state transfer (the state provider): serving FETCH requests as windowed, paced streams of chunks.

It holds the streams this member sends (by receiver and transfer id) and those whose window has room for
another chunk in a later step (``defer_transfer``)."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import TYPE_CHECKING

from ...core.address import Address
from ..columns import EntryChunk
from ..messages import Fetch, XferAck, XferCancel, XferData, XferFail
from ..store import (
    Columns,
    SegmentStore,
)

if TYPE_CHECKING:
    from .facade import GridNode


class _OutXfer:
    __slots__ = ("batches", "unacked")

    def __init__(self, batches: Iterator[XferData]) -> None:
        self.batches = batches
        self.unacked = 0


def _batches(
    store: SegmentStore, xid: int, segments: list[int], max_entries: int, max_bytes: int
) -> Iterator[XferData]:
    """The stream of one FETCH: chunks per segment, each segment's last chunk marking it done."""
    n = len(segments)
    for i, s in enumerate(segments):
        it = store.segment_chunks(s, max_entries, max_bytes)
        prev: Columns | None = next(it, None)
        while prev is not None:
            nxt = next(it, None)
            if nxt is None:
                break
            yield XferData(xid, s, EntryChunk(*prev, store.expiries_of(s, prev[0], prev[1])), (), False)
            prev = nxt
        keys, versions, values = prev or ([], [], [])
        chunk = EntryChunk(keys, versions, values, store.expiries_of(s, keys, versions))
        yield XferData(xid, s, chunk, (s,), i == n - 1)


class StateProvider:
    """This member as a state-transfer source: its outbound streams."""

    def __init__(self, node: GridNode) -> None:
        self.node = node
        self.out_xfers: dict[tuple[Address, int], _OutXfer] = {}
        self._pumps: deque[tuple[Address, int]] = deque()

    def on_xfer_cancel(self, src: Address, msg: XferCancel) -> None:
        self.out_xfers.pop((src, msg.xfer_id), None)

    def on_fetch(self, src: Address, f: Fetch) -> None:
        t = self.node.topology
        if t is None or f.topology_id > t.topology_id:
            # A source serves only once it writes to the new owners too, so nothing written after its
            # snapshot can miss them.
            self.node._hold(f.topology_id, src, f)
            return
        store = self.node.store
        assert store is not None
        mine = t.current.segments_owned(self.node.address)
        bad = tuple(s for s in f.segments if s not in mine or not store.has_segment(s) or s >= t.num_segments)
        if bad:
            self.node._emit(src, XferFail(f.xfer_id, bad))
        good = [s for s in f.segments if s not in bad]
        if not good:
            return
        cfg = self.node.config
        stream = _OutXfer(_batches(store, f.xfer_id, good, cfg.transfer_batch_entries, cfg.transfer_batch_bytes))
        self.out_xfers[(src, f.xfer_id)] = stream
        self._pump(src, f.xfer_id, stream)

    def _pump(self, dest: Address, xid: int, stream: _OutXfer) -> None:
        """Send the stream's next chunks while its window has room. With ``defer_transfer``, one chunk per step:
        if the window has room for more, the stream waits in ``_pumps`` for the next step (a FETCH used to
        produce the whole first window in one step, 1.5-2 ms of a source's loop with 256 KiB chunks)."""
        limit = 1 if self.node.defer_transfer else self.node.config.transfer_window
        sent = 0
        while stream.unacked < self.node.config.transfer_window:
            if sent == limit:
                self._pumps.append((dest, xid))
                return
            sent += 1
            batch = next(stream.batches, None)
            if batch is None:
                self.out_xfers.pop((dest, xid), None)
                return
            stream.unacked += 1
            self.node.metrics["grid.xfer_entries_out"] += len(batch.entries)
            # In order with everything else to ``dest``: a chunk must not be overtaken by, say, a topology
            # that makes the receiver an owner of what the chunk completes (seed 39 lost a write that way).
            self.node._emit(dest, batch)
            if batch.last:
                self.out_xfers.pop((dest, xid), None)
                return

    def on_xfer_ack(self, src: Address, ack: XferAck) -> None:
        stream = self.out_xfers.get((src, ack.xfer_id))
        if stream is not None:
            stream.unacked -= 1
            self._pump(src, ack.xfer_id, stream)

    @property
    def pumping(self) -> bool:
        """Whether a stream waits for a step to send its next chunk."""
        return bool(self._pumps)

    def step(self) -> None:
        """Send the next chunk of the stream that waited longest for a step."""
        dest, xid = self._pumps.popleft()
        stream = self.out_xfers.get((dest, xid))
        if stream is not None:
            self._pump(dest, xid, stream)
