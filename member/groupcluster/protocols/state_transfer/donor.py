"""STATE's donor role: a joiner's request served where it sits in the delivery stream, once our delivery reached
its floors: the snapshot taken at that cut (GetState), then streamed in chunks, ``window`` at a time."""

from __future__ import annotations

from ...core.address import Address
from ...core.message import NO_FLOW_CONTROL, Message
from .events import GetState, StateSnapshot
from .state import FETCHING, WANTED, StateTransferState, _Outgoing, _Waiting
from .wire import _PID, CHUNK, MAX_CHUNKS, NO_STATE_YET, REFUSE, StateHeader


class DonorRole(StateTransferState):
    """What a member that has a state does for a joiner that asks for it."""

    def _refuse(self, joiner: Address, tid: int, reason: str) -> None:
        self.count("requests_refused")
        self._send(joiner, StateHeader(REFUSE, tid=tid, reason=reason))

    def _on_req(self, joiner: Address, hdr: StateHeader) -> None:
        view = self.view
        if view is None or joiner not in view.members:
            # Until we install a view with the joiner we may lack messages of the views before it.
            self._refuse(joiner, hdr.tid, "not in my view yet")
            return
        if self.phase in (FETCHING, WANTED):
            self._refuse(joiner, hdr.tid, NO_STATE_YET)
            return
        old = self.outgoing.get(joiner)
        if old is not None and old.tid > hdr.tid:
            return  # a late copy of an older request
        self.outgoing.pop(joiner, None)  # a new request supersedes the joiner's older transfer
        self.waiting.pop(joiner, None)
        if len(self.outgoing) + len(self.waiting) >= self.config.max_transfers:
            self._refuse(joiner, hdr.tid, f"serving {self.config.max_transfers} transfers already")
            return
        self.count("requests_served")
        self.waiting[joiner] = _Waiting(joiner, hdr.tid, hdr.vector or {}, self.now)
        self.set_timer("donor", self.config.request_timeout)
        self._check_waiting()

    def _check_waiting(self) -> None:
        delivered = self.delivered
        members = set(self.view.members) if self.view is not None else set()
        for joiner, w in list(self.waiting.items()):
            # A sender that left our view sends nothing more: its floor could never be reached.
            if all(delivered.get(s, 0) >= f for s, f in w.floors.items() if s in members):
                del self.waiting[joiner]
                self._take_snapshot(w)
            elif w.floors:
                self.count("snapshot_waits")

    def _take_snapshot(self, w: _Waiting) -> None:
        t = _Outgoing(w.joiner, w.tid, self._snapshot_cut(), last_progress=self.now)
        self.outgoing[w.joiner] = t
        self.snapshot_due.append(t)
        self.count("snapshots")
        # At this point of our delivery stream: every Deliver before this event is in the state, none after.
        self.above.up_event(GetState((w.joiner, w.tid)))

    def _on_snapshot(self, event: StateSnapshot) -> None:
        joiner, tid = event.transfer
        t = self.outgoing.get(joiner)
        if t is None or t.tid != tid or t.ready:
            self.count("stray_snapshots")
            return
        data = event.state
        if not isinstance(data, bytes | bytearray | memoryview):
            raise TypeError(f"StateSnapshot.state: expected bytes, got {type(data).__name__}")
        t.data = bytes(data)
        size = self.config.chunk_size
        t.count = max(1, -(-len(t.data) // size))
        if t.count > MAX_CHUNKS:
            self.outgoing.pop(joiner, None)
            self._refuse(joiner, tid, f"state of {len(t.data)} bytes needs more than {MAX_CHUNKS} chunks")
            return
        t.ready = True
        t.last_progress = self.now
        self._pump(t)

    def _pump(self, t: _Outgoing) -> None:
        size = self.config.chunk_size
        limit = min(t.count, t.acked + self.config.window)
        data = t.data
        total = len(data)
        while t.next_index < limit:
            i = t.next_index
            hdr = StateHeader(CHUNK, tid=t.tid, index=i, count=t.count, total=total, cut=t.cut if i == 0 else None)
            self.below.down(
                Message(t.joiner, data[i * size : (i + 1) * size], flags=NO_FLOW_CONTROL, headers={_PID: hdr})
            )
            t.next_index = i + 1
            self.count("chunks_sent")
