"""SEQUENCER's forward-table and forward window: a member's own multicasts, kept until delivered, forwarded to
the coordinator as far as the window allows and again when the coordinator asks (RESEND) or the window stalls;
a graceful leave waits until they were delivered."""

from __future__ import annotations

from itertools import islice
from typing import Any

from ...core.events import Backpressure, Disconnect
from .state import SequencerState
from .wire import _ITEM_OVERHEAD, FORWARD, Run, SequencerHeader, _item_size, _pack, forward_body


class ForwardTable(SequencerState):
    """What every member does with its own multicasts (:meth:`~.layer.Sequencer.down` puts them in the table)."""

    def _leave_now(self) -> None:
        if self.leave_pending:
            self.leave_pending = False
            self.cancel_timer("leave")
            self.below.down_event(Disconnect())

    def _forget_own(self, upto: int) -> None:
        table = self.fwd_table
        n = min(upto - self.fwd_first + 1, len(table))
        if n <= 0:
            return
        # The delivered ones are at the front: this costs what it frees, not a scan of what is still in flight.
        self.fwd_first += n
        freed = 0
        popleft = table.popleft
        for _ in range(n):
            item = popleft()
            freed += len(item) if type(item) is bytes else len(item[2])
        self.fwd_bytes -= freed
        if self.blocked and self.fwd_bytes < self.config.max_queued // 2:
            self.blocked = False
            self.count("backpressure_off")
            self.above.up_event(Backpressure(False))

    def _resend_forwards(self, frm: int) -> None:
        """The coordinator lacks our forwards from ``frm`` on: forward them (and what follows) again."""
        table = self.fwd_table
        first = max(frm, self.fwd_first)
        last = self.fwd_first + len(table) - 1
        if first > last:
            return
        self.count("forwards_resent")
        self._open_window()
        if self.out_items:
            # Not forwarded yet: they join the resent ones, in order.
            last = min(last, self.out_start - 1)
        if first <= last:
            items = list(islice(table, first - self.fwd_first, last - self.fwd_first + 1))
            self.out_items = items + self._pending_out()
            self.out_pos = 0
            self.out_start = first

    def _pending_out(self) -> list[Any]:
        """The own multicasts not forwarded yet, taken out of ``out_items`` (which is left empty)."""
        items, pos = self.out_items, self.out_pos
        self.out_items = []
        self.out_pos = 0
        return items[pos:] if pos else items

    def _forward(self) -> bool:
        """Forward the waiting ``out_items`` to the coordinator, cut at ``max_batch_size``, as far as the forward
        window allows; the rest waits in place for our next BCAST (the end of that step forwards more)."""
        room = self.config.forward_window - self.fwd_inflight
        if room <= 0:
            self.count("forwards_windowed")
            self._watch_window()
            return False
        limit = self._max_batch
        coord = self.coord
        flight = self.fwd_flight
        items = self.out_items
        start = self.out_start
        sent = 0
        i = self.out_pos
        n = len(items)
        while i < n and sent < room:
            chunk: list[Any] = []
            size = 0
            want = room - sent
            while i < n:
                item = items[i]
                isize = len(item) + _ITEM_OVERHEAD if type(item) is bytes else _item_size(item)
                if chunk and (size + isize > limit or len(chunk) >= want):
                    break
                chunk.append(item)
                size += isize
                i += 1
            self._send(coord, SequencerHeader(FORWARD), _pack(forward_body(start, chunk)))
            start += len(chunk)
            flight.append((start - 1, len(chunk)))
            sent += len(chunk)
        self.fwd_inflight += sent
        self.count("forwards_sent")
        self.out_start = start
        if i < n:
            if 2 * i >= n:
                # Most of the list went: drop the forwarded ones (costs what waits, less than what went).
                del items[:i]
                i = 0
            self.out_pos = i
            self.count("forwards_windowed")
            self._watch_window()
        else:
            self.out_items = []
            self.out_pos = 0
        return True

    def _watch_window(self) -> None:
        if not self.ctx.has_timer("window"):
            self.fwd_seen_at_timer = self.fwd_seen
            self.set_timer("window", self.config.sync_retry)

    def _seen_own(self, runs: list[Run]) -> None:
        """Our forwards in a batch of the coordinator's are out of its input: they leave the forward window."""
        me = self.local_address
        seen = self.fwd_seen
        for origin, start, items in runs:
            if origin == me and start + len(items) - 1 > seen:
                seen = start + len(items) - 1
        self.fwd_seen = seen
        flight = self.fwd_flight
        while flight and flight[0][0] <= seen:
            self.fwd_inflight -= flight.popleft()[1]

    def _open_window(self) -> None:
        """Forget what is in flight: a new epoch (its SYNC carries the forward-table), or the coordinator asked
        for a RESEND (it holds what we forwarded after a gap: waiting for that to be sequenced would wait for
        ever)."""
        self.fwd_flight.clear()
        self.fwd_inflight = 0
