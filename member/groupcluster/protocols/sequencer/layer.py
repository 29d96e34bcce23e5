"""The SEQUENCER layer: its entry points (application multicasts down, messages and events up, timers, the end of a
step), each handing the work to the role it belongs to."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from ...core import protocol_ids
from ...core.events import Backpressure, Disconnect, Event, FlushHold, FlushRelease, Left, ViewChange
from ...core.layer import register_layer
from ...core.message import NO_RELIABILITY, Message
from .state import SequencerConfig
from .view_sync import ViewSync
from .wire import _PID, ACK, BCAST, COMMIT, FORWARD, RESEND, SYNC, SYNC_REQ, SequencerHeader, item_of


class Sequencer(ViewSync):
    """Total order through the coordinator (see the package's docstring), built of its roles, each on the one
    before: ForwardTable, MemberRole, CoordinatorRole, ViewSync, on the state they share (SequencerState)."""

    NAME = "sequencer"
    PROTO_ID = protocol_ids.SEQUENCER
    Config = SequencerConfig

    def down(self, msg: Message) -> None:
        if msg.dest is not None or msg.flags & NO_RELIABILITY:
            self.below.down(msg)
            return
        if self.left:
            self.count("dropped_after_leaving")
            return
        self.fwd_seq = seq = self.fwd_seq + 1
        item = msg.payload if not msg.flags and not msg.headers else item_of(msg)
        if not self.fwd_table:
            self.fwd_first = seq
        self.fwd_table.append(item)
        self.fwd_bytes += len(msg.payload)
        if not self.blocked and self.fwd_bytes > self.config.max_queued:
            self.blocked = True
            self.count("backpressure_on")
            self.above.up_event(Backpressure(True))
        if self.epoch is None:
            return  # no view yet: it travels with our first SYNC
        # Forwarded (or, at the coordinator, sequenced) at the end of the step, all together.
        if not self.out_items:
            self.out_start = seq
        self.out_items.append(item)
        if self.is_coord:
            self.out_decoded.append(item if item is msg.payload else (msg.flags, dict(msg.headers), msg.payload))

    def down_event(self, event: Event) -> Any:
        if isinstance(event, FlushHold):
            self._freeze()
        elif isinstance(event, FlushRelease) and not event.members and self.frozen:
            self.frozen = False
            self.thaw_due = True
        if isinstance(event, Disconnect) and self.fwd_table and self.view is not None and not self.left:
            # Our multicasts are with the coordinator: leaving now would lose them. Wait (bounded).
            self.leave_pending = True
            self.set_timer("leave", self.config.leave_timeout)
            return None
        return self.below.down_event(event)

    def up(self, batch: list[Message]) -> None:
        out: list[Message] | None = None
        for i, msg in enumerate(batch):
            hdr: SequencerHeader | None = msg.headers.get(_PID)
            if hdr is None:
                if out is not None:
                    out.append(msg)
                continue
            if out is None:
                out = batch[:i]
            self._out = out
            try:
                self._handle(msg, hdr)
            finally:
                self._out = None
        if out is None:
            out = batch
        if out:
            self._up_by_sender(out)

    def _up_by_sender(self, msgs: list[Message]) -> None:
        """Pass ``msgs`` up in order, cut where the sender changes: layers above (FLOW) handle a batch from
        one sender at once, and per message otherwise."""
        first = msgs[0].src
        if msgs[-1].src is first and all(m.src is first for m in msgs):
            self.above.up(msgs)
            return
        start = 0
        for i in range(1, len(msgs)):
            if msgs[i].src is not msgs[start].src:
                self.above.up(msgs[start:i])
                start = i
        self.above.up(msgs[start:])

    def _handle(self, msg: Message, hdr: SequencerHeader) -> None:
        if self.left:
            return
        kind = hdr.kind
        src = msg.src
        assert src is not None
        if kind == BCAST:
            self._on_bcast(src, hdr, msg.payload)
        elif kind == FORWARD:
            self._on_forward(src, msg.payload)
        elif kind == ACK:
            if self.is_coord and hdr.epoch == self.epoch:
                self._on_ack(src, hdr.seq)
        elif kind == COMMIT:
            if hdr.epoch == self.epoch and src == self.coord:
                self._learn_commit(hdr.commit)
        elif kind == SYNC:
            self._on_sync(src, hdr, msg.payload)
        elif kind == SYNC_REQ and hdr.epoch == self.epoch and src == self.coord and not self.is_coord:
            self.count("sync_resent")
            self._send_sync()
        elif kind == RESEND and hdr.epoch == self.epoch and src == self.coord and not self.is_coord:
            self._resend_forwards(hdr.seq)

    def up_event(self, event: Event) -> None:
        if isinstance(event, ViewChange):
            self._on_view(event.view)
        elif isinstance(event, Left):
            self._on_left()
        self.above.up_event(event)

    def _on_left(self) -> None:
        self.left = True
        self.cancel_timer("ack")
        self.cancel_timer("sync")
        self.cancel_timer("leave")
        self.leave_pending = False
        self.is_coord = False
        self.open = False
        self.sync = None
        self.queue, self.strays, self.stray_bytes = [], [], 0
        self.held, self.held_bytes = {}, 0
        self.cancel_timer("resend")
        self.out_items = []
        self.out_pos = 0
        self.out_decoded = []
        self._open_window()

    # -- timers and end of step ----------------------------------------------------------------------------------
    def on_timer(self, key: Hashable) -> None:
        if key == "ack":
            if not self.is_coord and self.recv_high > self.commit_known and self.coord is not None:
                self.acked = 0  # lost acks are the reason we are here: send again
                self._send_ack()
                self.set_timer("ack", self.config.ack_interval)
        elif key == "sync":
            sync = self.sync
            if sync is not None and self.is_coord and sync.waiting:
                self.count("sync_requests")
                for member in sorted(sync.waiting):
                    self._send(member, SequencerHeader(SYNC_REQ, self.epoch), flags=NO_RELIABILITY)
                self.set_timer("sync", self.config.sync_retry)
        elif key == "resend":
            if self.held and self.is_coord:
                for origin in sorted(self.held):
                    self._ask_resend(origin)
        elif key == "window":
            # Forwards wait for the window, and none of ours was sequenced since the timer was set: what we
            # forwarded may be lost (e.g. a coordinator-to-be dropped its strays over max_stray), and with the
            # window full no later FORWARD would show the coordinator the gap. Forward again from the first
            # unseen one (the coordinator discards what it has already).
            if self.out_items and not self.is_coord and self.coord is not None and not self.left:
                if self.fwd_seen == self.fwd_seen_at_timer:
                    self.count("window_stalls")
                    self._resend_forwards(self.fwd_seen + 1)
                self._watch_window()
        elif key == "leave" and self.leave_pending:
            self.count("left_with_undelivered")
            self._leave_now()

    def end_of_step(self) -> bool:
        busy = False
        if self.thaw_due:
            self.thaw_due = False
            if not self.frozen:
                self._thaw()
                busy = True
        if self.sync_due:
            self.sync_due = False
            if not self.is_coord and self.coord is not None and not self.left:
                self._send_sync()
                busy = True
        if self.open_due:
            self.open_due = False
            if self.is_coord and self.sync is not None:
                self._maybe_open()
                busy = True
        if self.out_items and self.is_coord:
            items = self._pending_out()
            decoded, self.out_decoded = self.out_decoded, []
            if self.open and not self.frozen:
                self._sequence(
                    self.local_address, self.out_start, items, decoded if len(decoded) == len(items) else None
                )
            else:
                self.queue.append((self.local_address, self.out_start, items))
        if self.out_items and self.coord is not None and not self.is_coord:
            busy = self._forward() or busy
        if self.is_coord:
            if self._runs or self._ready:
                self._flush_batch()
                busy = True
            elif self.commit > self.commit_sent:
                self.commit_sent = self.commit
                self._send(None, SequencerHeader(COMMIT, self.epoch, commit=self.commit))
                busy = True
        elif self.recv_high > self.acked and self.coord is not None:
            self._send_ack()
            busy = True
        if self._late:
            late, self._late = self._late, []
            self._up_by_sender(late)
            busy = True
        return busy

    def describe_state(self) -> dict[str, Any]:
        return {
            "epoch": None if self.epoch is None else str(self.epoch),
            "coordinator": None if self.coord is None else str(self.coord),
            "sequencing": self.is_coord and self.open,
            "syncing": self.sync is not None,
            "received": self.recv_high,
            "committed": self.commit_known,
            "delivered": self.delivered_seq,
            "pending_batches": sum(len(p) for p in self.pending.values()),
            "forward_table": len(self.fwd_table),
        }


register_layer(Sequencer)
