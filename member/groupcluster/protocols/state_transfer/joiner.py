"""STATE's joiner role: after RequestState, hold what would go up from the first view on, ask a donor (the next
one when it refuses, fails or stalls), collect its chunks, check the cut against the floors, set the state and
replay what was held (what the state covers goes up as StateCovered)."""

from __future__ import annotations

from typing import Any

from ...core.address import Address
from ...core.message import NO_FLOW_CONTROL, Message
from .donor import DonorRole
from .events import RequestState, SetState, StateCovered
from .state import ABANDONED, COVERED, DONE, DUPLICATE, FETCHING, FRESH, WANTED, _Incoming
from .wire import _PID, ACK, REQ, Cut, StateHeader


class JoinerRole(DonorRole):
    """What a member that asked for the state does until it has it."""

    def _on_request_state(self, event: RequestState) -> None:
        if self.phase in (FETCHING, WANTED):
            return
        self.preferred_donor = event.donor
        self.phase = WANTED
        if self.view is not None:
            self._begin()

    def _begin(self) -> None:
        view = self.view
        assert view is not None
        me = self.local_address
        if view.members == (me,):
            self.phase = DONE
            self.count("founded")
            self.above.up_event(SetState(None, None))
            self._replay({})  # what a layer below delivered before our first view came up
            return
        self.phase = FETCHING
        self.tried = []
        self.count("fetches_started")
        self._ask(self._pick_donor())

    def _candidates(self) -> list[Address]:
        view = self.view
        if view is None:
            return []
        me = self.local_address
        return [m for m in view.members if m != me and m not in self.suspects]

    def _pick_donor(self, *, round_again: bool = True) -> Address | None:
        """The preferred donor, else the first member (the coordinator) not asked in this round."""
        cands = self._candidates()
        if not cands:
            return None
        pref = self.preferred_donor
        if pref is not None and pref in cands and pref not in self.tried:
            return pref
        fresh = [m for m in cands if m not in self.tried]
        if not fresh:
            if not round_again:
                return None
            self.tried = []  # everyone was asked: go round again, from the coordinator
            fresh = cands
        return fresh[0]

    def _ask(self, donor: Address | None) -> None:
        self.cancel_timer("retry")
        if donor is None:
            # Alone in our view (the others left or are suspected): ask again once a view brings members.
            self.incoming = None
            self.cancel_timer("progress")
            self.count("no_donor")
            return
        self.tid_counter += 1
        self.incoming = _Incoming(donor, self.tid_counter)
        self.tried.append(donor)
        self.count("requests_sent")
        # A multicast, not a unicast: it travels in the same ordered stream as the application's multicasts, so
        # the donor takes its snapshot where the request sits in that stream — after everything delivered before
        # it, which includes whatever earlier views (or a sequencer's earlier epochs) still owed the donor but
        # will never reach us.
        # Floors of senders gone from the view can never be reached by a donor's cut: they are not asked for.
        members = set(self.view.members) if self.view is not None else set()
        floors = {s: f for s, f in self.floors.items() if s in members}
        marker = StateHeader(REQ, tid=self.tid_counter, donor=donor, vector=floors)
        self.below.down(Message(None, flags=NO_FLOW_CONTROL, headers={_PID: marker}))
        self.set_timer("progress", self.config.request_timeout)

    def _next_donor(self, why: str) -> None:
        self.ctx.log.info("state transfer: %s; asking the next member", why)
        self._ask(self._pick_donor())

    def _nobody_has_state(self) -> bool:
        """Every other member refused because it waits for a state too (the members that had one are gone),
        and we are the most senior of us: someone must start from nothing, deterministically."""
        cands = self._candidates()
        return bool(cands) and all(m in self.stateless for m in cands) and self._senior()

    def _senior(self) -> bool:
        view = self.view
        me = self.local_address
        return view is not None and next((m for m in view.members if m not in self.suspects), None) == me

    def _found(self, why: str) -> None:
        """Start from an empty state, as the member that founded the group does; deliver what we held."""
        self.ctx.log.info("state transfer: %s; starting from an empty state", why)
        self.count("founded_without_state")
        self.incoming = None
        self.cancel_timer("progress")
        self.cancel_timer("retry")
        self.phase = DONE
        self.above.up_event(SetState(None, None))
        self._replay({})

    def _retry_later(self) -> None:
        self.incoming = None
        self.cancel_timer("progress")
        self.set_timer("retry", self.config.retry_delay)

    def _hold(self, src: Address, seq: int, msg: Message) -> None:
        if src not in self.floors:
            self.floors[src] = seq - 1
        held = self.held
        if held and type(held[-1]) is list:
            held[-1].append(msg)
        else:
            held.append([msg])
        self.held_messages += 1
        self.held_bytes += len(msg.payload)
        if self.held_messages > self.config.max_buffered_messages or self.held_bytes > self.config.max_buffered:
            self._drop_held()

    def _drop_held(self) -> None:
        """Too much held: drop the held multicasts; the state must then contain them (their floors rise)."""
        floors = self.floors
        dropped = 0
        kept: list[Any] = []
        for item in self.held:
            if type(item) is list:
                for msg in item:
                    seq = msg.headers[_PID].seq
                    if seq > floors.get(msg.src, 0):
                        floors[msg.src] = seq
                    dropped += 1
            else:
                kept.append(item)
        self.held = kept
        self.held_messages = 0
        self.held_bytes = 0
        self.count("buffer_overflows")
        self.count("held_dropped", dropped)
        self.ctx.log.warning(
            "state transfer: dropped %d held multicasts (limits: %d messages, %d bytes); the state must cover them",
            dropped,
            self.config.max_buffered_messages,
            self.config.max_buffered,
        )
        inc = self.incoming
        if inc is not None and inc.cut is None and inc.next_index == 0:
            # The donor has not taken its snapshot for this request yet, but it waits only for the floors it was
            # sent: ask again with the raised ones rather than get a state we would have to refuse.
            self._ask(inc.donor)

    def _on_chunk(self, src: Address, hdr: StateHeader, payload: bytes) -> None:
        inc = self.incoming
        if inc is None or inc.donor != src or inc.tid != hdr.tid or self.phase != FETCHING:
            self.count("stray_chunks")
            return
        if hdr.index != inc.next_index:
            # Reliable FIFO unicast below delivers chunks in order, once: anything else is a broken donor.
            self._bad_transfer(f"chunk {hdr.index} arrived when {inc.next_index} was due")
            return
        if hdr.index == 0:
            if hdr.total > self.config.max_state_size:
                self._bad_transfer(f"state of {hdr.total} bytes exceeds max_state_size {self.config.max_state_size}")
                return
            if hdr.count > max(1, hdr.total):
                self._bad_transfer(f"{hdr.count} chunks announced for {hdr.total} bytes")
                return
            inc.cut = hdr.cut or {}
            inc.count = hdr.count
            inc.total = hdr.total
            # Grown as chunks arrive (they come in order), not allocated up front: an announced size costs
            # nothing until the bytes are really sent.
            inc.buf = bytearray()
        elif hdr.count != inc.count or hdr.total != inc.total:
            self._bad_transfer("chunk count or size changed during the transfer")
            return
        assert inc.buf is not None
        end = inc.offset + len(payload)
        last = hdr.index == inc.count - 1
        if end > inc.total or (last and end != inc.total):
            self._bad_transfer(f"chunk {hdr.index} ends at byte {end} of {inc.total}")
            return
        inc.buf += payload
        inc.offset = end
        inc.next_index += 1
        self.ack_due = True
        self.set_timer("progress", self.config.request_timeout)
        if last:
            self._complete(inc)

    def _bad_transfer(self, why: str) -> None:
        self.count("bad_transfers")
        self.ctx.log.warning("state transfer from %s: %s", self.incoming.donor if self.incoming else "?", why)
        self._next_donor(why)

    def _complete(self, inc: _Incoming) -> None:
        self._send_ack(inc)
        cut = inc.cut or {}
        members = set(self.view.members) if self.view is not None else set()
        stale = [s for s, floor in self.floors.items() if cut.get(s, (0,))[0] < floor and s in members]
        if stale:
            # Multicasts between the donor's cut and what we hold were never in our hands: ask again; the
            # donor's next snapshot waits until its cut reaches our floors.
            self.count("stale_states")
            self.ctx.log.info(
                "state from %s is older than what we hold from %d sender(s): asking again", inc.donor, len(stale)
            )
            self.tried = [m for m in self.tried if m != inc.donor]  # the same donor is fine: it will wait
            self._retry_later()
            return
        gaps = [s for s, floor in self.floors.items() if cut.get(s, (0,))[0] < floor]
        if gaps:
            self.count("senders_gone_with_gaps", len(gaps))
        data = bytes(inc.buf or b"")
        self.incoming = None
        self.cancel_timer("progress")
        self.cancel_timer("retry")
        self.phase = DONE
        self.cut = dict(cut)
        self.count("states_set")
        self.count("state_bytes", len(data))
        self.above.up_event(SetState(data, inc.donor, (self.local_address, inc.tid)))
        self._replay(cut)

    def _replay(self, cut: Cut) -> None:
        """Give the application what we held, in order, minus what the state contains."""
        held, self.held = self.held, []
        self.held_messages = 0
        self.held_bytes = 0
        self.floors = {}
        # From now on we have applied exactly what the state has (the application replaced its own). In place:
        # ``up`` keeps the vector in a local while it walks a batch, and a state set in the middle of one (its last
        # chunk, or a refusal that makes us found the group) must count the batch's later multicasts in the new
        # vector; rebinding it counted them in the old one, and the next cut showed them as holes.
        delivered = self.delivered
        delivered.clear()
        delivered.update((s, top) for s, (top, _) in cut.items())
        self.missing = {s: [[lo, hi] for lo, hi in gaps] for s, (_, gaps) in cut.items() if gaps}
        above = self.above
        for item in held:
            if type(item) is not list:
                above.up_event(item)
                continue
            run: list[Message] = []
            run_kind = FRESH
            for msg in item:
                verdict = self._apply(msg.src, msg.headers[_PID].seq)
                if verdict is DUPLICATE:
                    continue
                if verdict is not run_kind and run:
                    self._pass_run(run, run_kind)
                    run = []
                run_kind = verdict
                run.append(msg)
            if run:
                self._pass_run(run, run_kind)

    def _pass_run(self, run: list[Message], kind: str) -> None:
        if kind is COVERED:
            self.count("covered", len(run))
            self.above.up_event(StateCovered(run))
        else:
            self.above.up(run)

    def _stop_fetching(self) -> None:
        if self.phase in (FETCHING, WANTED):
            self.phase = ABANDONED
        self.incoming = None
        self.held = []
        self.held_messages = 0
        self.held_bytes = 0
        for key in ("progress", "retry"):
            self.cancel_timer(key)

    def _send_ack(self, inc: _Incoming) -> None:
        self.ack_due = False
        self._send(inc.donor, StateHeader(ACK, tid=inc.tid, index=inc.next_index))
