"""The STATE layer: its entry points (numbering multicasts down, the stream and events up, timers, the end of a
step), each handing the work to the joiner or the donor role."""

from __future__ import annotations

from typing import Any

from ...core import protocol_ids
from ...core.address import Address
from ...core.events import Event, Left, Suspect, ViewChange
from ...core.layer import register_layer
from ...core.message import NO_RELIABILITY, Message
from ...core.view import View
from .events import RequestState, StateSnapshot
from .joiner import JoinerRole
from .state import ABANDONED, COVERED, FETCHING, FRESH, WANTED, StateConfig
from .wire import _PID, ACK, CHUNK, DATA, NO_STATE_YET, REFUSE, REQ, StateHeader


class StateTransfer(JoinerRole):
    """Non-blocking state transfer (see the package's docstring), built of its two roles, each on the one before
    (DonorRole, JoinerRole), on the state they share (StateTransferState)."""

    NAME = "state"
    PROTO_ID = protocol_ids.STATE
    Config = StateConfig

    def down(self, msg: Message) -> None:
        if msg.dest is None and not msg.flags & NO_RELIABILITY:
            self.next_seq = seq = self.next_seq + 1
            msg.headers[_PID] = StateHeader(DATA, seq)
        self.below.down(msg)

    def down_event(self, event: Event) -> Any:
        if isinstance(event, RequestState):
            self._on_request_state(event)
            return None
        if isinstance(event, StateSnapshot):
            self._on_snapshot(event)
            return None
        return self.below.down_event(event)

    def up(self, batch: list[Message]) -> None:  # noqa: C901, PLR0912  the hot path: one pass that keeps each message's place in the stream
        if self.phase == ABANDONED:
            # Sim seed 287 (total-order): a joiner that left before its state came had its own last multicasts
            # delivered after Left, before any state.
            self.count("dropped_after_abandoning", len(batch))
            return
        # The common case — application multicasts and unicasts, nothing held — costs one pass.
        out: list[Message] | None = None
        delivered = self.delivered
        # WANTED holds too: a layer below may deliver (a sequencer's first replay) before our first view comes up.
        holding = self.phase == FETCHING or self.phase == WANTED
        covered: list[Message] = []
        # A run of consecutive multicasts of one sender (how SEQUENCER and NAKACK deliver) is accounted once:
        # while ``run_src`` is set, its entry in ``delivered`` is ``run_next - 1``, written back when the run ends
        # (before anything else reads ``delivered``), not per message.
        run_src: Address | None = None
        run_next = 0
        for k, msg in enumerate(batch):
            hdr: StateHeader | None = msg.headers.get(_PID)
            if (
                run_src is not None
                and hdr is not None
                and msg.src is run_src
                and hdr.seq == run_next
                and hdr.kind == DATA
            ):
                run_next += 1
                if out is not None:
                    if covered:
                        self._pass_up([], covered)
                        covered = []
                    out.append(msg)
                continue
            if run_src is not None:
                delivered[run_src] = run_next - 1
                run_src = None
            if hdr is None or hdr.kind != DATA:
                if hdr is not None:
                    if out is None:
                        out = batch[:k]
                    if hdr.kind != REQ:
                        self._control(msg.src, hdr, msg)  # type: ignore[arg-type]  # src is set on the way up (below)
                        holding = self.phase == FETCHING  # the last chunk ends the holding mid-batch
                    elif hdr.donor == self.local_address and msg.src != hdr.donor:
                        # The cut is here: what came before the request in the stream goes up first.
                        self._pass_up(out, covered)
                        out, covered = [], []
                        self._on_req(msg.src, hdr)  # type: ignore[arg-type]  # src is set on the way up (below)
                elif out is not None:
                    if covered:
                        self._pass_up([], covered)
                        covered = []
                    out.append(msg)
                continue
            # Message.src is Address | None (None before the transport stamps a message going down); on the way up
            # it is always set. Not msg.sender(), which checks it: this is the per-message hot path.
            src: Address = msg.src  # type: ignore[assignment]
            seq = hdr.seq
            if holding:
                if out is None:
                    out = batch[:k]
                self._hold(src, seq, msg)
                continue
            if seq == delivered.get(src, 0) + 1:
                run_src = src
                run_next = seq + 1
                if out is not None:
                    if covered:
                        self._pass_up([], covered)
                        covered = []
                    out.append(msg)
                continue
            verdict = self._apply(src, seq)
            if verdict is FRESH:
                if out is not None:
                    if covered:
                        self._pass_up([], covered)
                        covered = []
                    out.append(msg)
                continue
            if out is None:
                out = batch[:k]
            if verdict is COVERED:
                # Covered ones go up at their place in the stream, between the deliveries around them: a joiner
                # applies a sender's multicast the donor's cut has a hole for (sent in an epoch the donor was
                # not in) before that sender's later ones the state holds, so they must not overtake it.
                if out:
                    self.above.up(out)
                    out = []
                covered.append(msg)
        if run_src is not None:
            delivered[run_src] = run_next - 1
        # At most one of the two is not empty here: each one went up when the other kind followed it.
        self._pass_up(batch if out is None else out, covered)
        if self.waiting:
            self._check_waiting()

    def up_event(self, event: Event) -> None:
        if isinstance(event, ViewChange):
            fetching = self.phase == FETCHING
            first = self.view is None
            self._on_view(event.view)
            if fetching and self.phase == FETCHING:
                self.held.append(event)  # the application sees it in order with the held multicasts
                return
            self.above.up_event(event)
            if first and self.phase == WANTED:
                self._begin()  # hold from the first view on: multicasts may come up before GMS reports Joined
            return
        if isinstance(event, Suspect):
            self.suspects.add(event.member)
            inc = self.incoming
            if inc is not None and inc.donor == event.member:
                self.count("donor_suspected")
                self._next_donor("donor suspected")
        if isinstance(event, Left):
            # Leaving: whatever we hold is of no use to anyone any more.
            self._stop_fetching()
        self.above.up_event(event)

    def _on_view(self, view: View) -> None:
        self.view = view
        members = set(view.members)
        self.suspects &= members
        for gone in [j for j in self.outgoing if j not in members]:
            del self.outgoing[gone]
            self.count("transfers_dropped_left")
        for gone in [j for j in self.waiting if j not in members]:
            del self.waiting[gone]
        if self.phase != FETCHING:
            return
        if view.members == (self.local_address,):
            # Sim seed 173 (total-order): every member that could give a state crashed; alone, we would hold
            # our deliveries forever. Start from nothing, as a founder does.
            self._found("alone in our view: no member is left to give a state")
            return
        inc = self.incoming
        if inc is None:
            if not self.ctx.has_timer("retry"):
                self._ask(self._pick_donor())
        elif inc.donor not in members:
            self.count("donor_left")
            self._next_donor("the donor left the view")

    def _control(self, src: Address, hdr: StateHeader, msg: Message) -> None:
        kind = hdr.kind
        if kind == CHUNK:
            self._on_chunk(src, hdr, msg.payload)
        elif kind == ACK:
            t = self.outgoing.get(src)
            if t is not None and t.tid == hdr.tid and t.ready:
                if hdr.index > t.next_index:
                    self.count("bad_acks")
                    return
                if hdr.index > t.acked:
                    t.acked = hdr.index
                    t.last_progress = self.now
                if t.acked >= t.count:
                    del self.outgoing[src]
                    self.count("transfers_done")
                    if not self.outgoing and not self.waiting:
                        self.cancel_timer("donor")
                else:
                    self._pump(t)
        elif kind == REFUSE:
            inc = self.incoming
            if inc is not None and inc.donor == src and inc.tid == hdr.tid:
                self.count("refused")
                self.ctx.log.info("state transfer: %s refused: %s", src, hdr.reason)
                if hdr.reason == NO_STATE_YET:
                    self.stateless.add(src)
                # Another member may serve us; if everyone refused, the round starts again after the delay.
                nxt = self._pick_donor(round_again=False)
                if nxt is not None:
                    self._ask(nxt)
                elif self._nobody_has_state():
                    self._found("every other member is still waiting for a state")
                else:
                    self.tried = []
                    self.stateless.clear()
                    self._retry_later()

    def end_of_step(self) -> bool:
        busy = False
        if self.ack_due:
            self.ack_due = False
            inc = self.incoming
            if inc is not None:
                self._send_ack(inc)
                busy = True
        if self.snapshot_due:
            due, self.snapshot_due = self.snapshot_due, []
            for t in due:
                if not t.ready and self.outgoing.get(t.joiner) is t:
                    self.count("snapshots_unanswered")
            busy = busy or bool(due)
        return busy

    def on_timer(self, key: object) -> None:
        if key == "progress":
            inc = self.incoming
            if self.phase == FETCHING and inc is not None:
                self.count("donor_timeouts")
                self._next_donor(f"{inc.donor} made no progress for {self.config.request_timeout:g}s")
        elif key == "retry":
            if self.phase == FETCHING and self.incoming is None:
                self._ask(self._pick_donor())
        elif key == "donor":
            now = self.now
            limit = self.config.request_timeout
            for j, t in list(self.outgoing.items()):
                if now - t.last_progress >= limit:
                    del self.outgoing[j]
                    self.count("transfers_timed_out")
            for j, w in list(self.waiting.items()):
                if now - w.since >= limit:
                    del self.waiting[j]
                    self.count("waits_timed_out")
            if self.outgoing or self.waiting:
                self.set_timer("donor", limit)

    def describe_state(self) -> dict[str, Any]:
        inc = self.incoming
        return {
            "phase": self.phase,
            "next_seq": self.next_seq,
            "donor": None if inc is None else str(inc.donor),
            "received": None if inc is None else f"{inc.next_index}/{inc.count}",
            "held": self.held_messages,
            "serving": sorted(map(str, self.outgoing)),
        }


register_layer(StateTransfer)
