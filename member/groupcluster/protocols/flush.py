"""FLUSH: virtual synchrony — before a view change, every surviving member delivers the same old-view messages.

Seeds 000 and 001 describe JGroups' FLUSH (START_FLUSH, block(), FLUSH_OK, FLUSH_COMPLETED, STOP_FLUSH);
JGroups dropped it in 5.4 as slow and prone to hangs. This one takes two rounds before the view change and
can never block the group forever:

1. The flush coordinator (the GMS coordinator, asked by GMS through :class:`FlushRequest`) sends
   START_FLUSH to every participant — the old view minus suspected members; flush control goes by reliable
   unicast, since multicasts would queue behind the delivery holds.
2. Each participant passes :class:`Block` up to the application (which may still send), and when block() is
   done (:class:`BlockOk`, or at once with ``block_ok: auto``) it closes its latch for *its own* multicasts,
   holds delivery at what it delivered so far, and answers FLUSH_OK with its NAKACK digest.
3. With every FLUSH_OK in, the coordinator sends FLUSH_TARGET: per sender the highest seqno any
   participant has, and a participant holding it. Each member delivers exactly that much of every stream —
   fetching what it lacks from the holder, which matters for senders that crashed — then answers
   FLUSH_COMPLETED. A participant that stays silent past ``start_flush_timeout`` is reported to GMS
   (:class:`FlushFailed`), which suspects it and flushes again without it.
4. GMS installs the new view; installing it unblocks every member (:class:`Unblock`) and releases the
   multicasts queued behind the latch, which go out in the new view. There is no STOP round: the view is it.
   A member that completed its flush holds incoming multicasts until it installs the new view too: they were
   sent in the new view by members that installed it first, and must not be delivered in the old one.

Seed 000's open question — a message sent after block() returns but before the latch closes — cannot arise:
the latch for a member's own multicasts closes in the same step in which block() is reported done, before
FLUSH_OK leaves, so every old-view multicast of a member precedes its digest. Multicasts sent later wait in
the layer and are sent in the new view. Unicasts always pass (virtual synchrony concerns multicasts).
A new coordinator restarts a flush with a new flush id, which supersedes the old one everywhere. A member
flushes only for the member it would follow as coordinator (the next member restarts the flush when the
coordinator crashes). Its failure detector may not suspect the crashed coordinator yet when the
successor's START_FLUSH comes: it then has the coordinator verified at once (:class:`VerifySuspect`) and
joins the flush as soon as it suspects it too, within ``successor_timeout``; if the coordinator answers, the
successor acted on a false suspicion and is refused, so it cannot split a healthy group. A member
blocked longer than ``timeout`` without a new view asks GMS (:class:`FlushAbandoned`) to move it into a view
of its own, since the others may have installed a view that never reached it; MERGE brings it back.
GMS also flushes each subgroup before a merge (START_FLUSH carries the view it flushes, so a start that
overtakes its VIEW waits for it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..core import protocol_ids
from ..core.address import Address
from ..core.config import param
from ..core.digest import Digest
from ..core.errors import WireError
from ..core.events import (
    Backpressure,
    Block,
    BlockOk,
    Event,
    FlushAbandoned,
    FlushCompleted,
    FlushFailed,
    FlushHold,
    FlushRelease,
    FlushRequest,
    FlushTarget,
    GetDigest,
    Suspect,
    Unblock,
    Unsuspect,
    VerifySuspect,
    ViewChange,
)
from ..core.layer import Layer, register_layer, split_batch
from ..core.message import NO_FLOW_CONTROL, NO_RELIABILITY, Header, Message, register_header
from ..core.validate import as_address, as_address_list, as_int, as_list
from ..core.view import View, ViewId

START_FLUSH, FLUSH_OK, FLUSH_TARGET, FLUSH_COMPLETED = 0, 1, 2, 3
KIND_NAMES = ("START_FLUSH", "FLUSH_OK", "FLUSH_TARGET", "FLUSH_COMPLETED")
FlushId = tuple[Address, int]


@register_header
class FlushHeader(Header):
    PROTO_ID = protocol_ids.FLUSH
    __slots__ = ("digest", "flush_id", "holders", "kind", "participants", "view_id")

    def __init__(
        self,
        kind: int,
        flush_id: FlushId,
        *,
        participants: tuple[Address, ...] = (),
        digest: Digest | None = None,
        holders: tuple[tuple[Address, Address], ...] = (),
        view_id: ViewId | None = None,
    ) -> None:
        self.kind = kind
        self.view_id = view_id  # START_FLUSH: the view being flushed
        self.flush_id = flush_id
        self.participants = participants
        self.digest = digest
        self.holders = holders

    def to_wire(self) -> list[Any]:
        return [
            self.kind,
            [self.flush_id[0].to_wire(), self.flush_id[1]],
            [m.to_wire() for m in self.participants],
            None if self.digest is None else self.digest.to_wire(),
            [[s.to_wire(), h.to_wire()] for s, h in self.holders],
            None if self.view_id is None else self.view_id.to_wire(),
        ]

    @classmethod
    def from_wire(cls, data: Any) -> FlushHeader:
        items = as_list(data, "flush", 6, exact=6)
        kind = as_int(items[0], "flush.kind", 0, len(KIND_NAMES) - 1)
        fid = as_list(items[1], "flush.flush_id", 2, exact=2)
        flush_id = (as_address(fid[0], "flush.flush_id.coordinator"), as_int(fid[1], "flush.flush_id.counter"))
        holders = []
        for i, pair in enumerate(as_list(items[4], "flush.holders", 4096)):
            s, h = as_list(pair, f"flush.holders[{i}]", 2, exact=2)
            holders.append((as_address(s, f"flush.holders[{i}].sender"), as_address(h, f"flush.holders[{i}].holder")))
        hdr = cls(
            kind,
            flush_id,
            participants=as_address_list(items[2], "flush.participants"),
            digest=None if items[3] is None else Digest.from_wire(items[3], "flush.digest"),
            holders=tuple(holders),
            view_id=None if items[5] is None else ViewId.from_wire(items[5], "flush.view_id"),
        )
        if kind in (FLUSH_OK, FLUSH_TARGET) and hdr.digest is None:
            raise WireError(f"flush: {KIND_NAMES[kind]} without a digest")
        if kind == START_FLUSH and (not hdr.participants or hdr.view_id is None):
            raise WireError("flush: START_FLUSH without participants or view id")
        return hdr


@dataclass(frozen=True)
class FlushConfig:
    timeout: float = param(
        "8s",
        "duration",
        doc="longest a member stays blocked; then it moves into a view of its own (MERGE rejoins); a coordinator "
        "whose subgroup is flushed for a merge waits for the merge to end (gms.merge_timeout)",
    )
    start_flush_timeout: float = param(
        "2s", "duration", doc="a participant that has not answered START_FLUSH (FLUSH_OK) by then is reported failed"
    )
    end_flush_timeout: float = param(
        "2s", "duration", doc="a participant that has not confirmed FLUSH_TARGET (FLUSH_COMPLETED) by then is reported"
    )
    retry_timeout: float = param("100ms", "duration", doc="after a failed round, wait this long before flushing again")
    successor_timeout: float = param(
        "1.5s",
        "duration",
        doc="a successor's START_FLUSH waits this long for our failure detector to confirm the members it removes "
        "(above fd.verify_timeout, below start_flush_timeout); unconfirmed, it is refused",
    )
    enable_reconciliation: bool = param(
        True, "bool", doc="deliver what any participant delivered (off: only the latch, no virtual synchrony)"
    )
    block_ok: str = param(
        "auto", "choice", choices=("auto", "app"), doc="auto: block() is done at once; app: wait for BlockOk"
    )
    max_queued: int = param("16MiB", "size", doc="multicasts queued behind the latch before backpressure")


@dataclass
class _Round:
    """A flush as a participant sees it."""

    flush_id: FlushId
    coordinator: Address
    participants: tuple[Address, ...]
    ok_sent: bool = False
    target: Digest | None = None
    completed: bool = False


@dataclass
class _Coordinating:
    """A flush this member coordinates."""

    flush_id: FlushId
    participants: tuple[Address, ...]
    oks: dict[Address, Digest] = field(default_factory=dict)
    completed: set[Address] = field(default_factory=set)
    target_sent: bool = False


@register_layer
class Flush(Layer):
    NAME = "flush"
    PROTO_ID = protocol_ids.FLUSH
    Config = FlushConfig

    def __init__(self, config: FlushConfig, ctx: Any) -> None:
        super().__init__(config, ctx)
        self.view: View | None = None
        self.latched = False
        self.queue: list[Message] = []
        self.queued_bytes = 0
        self.backpressure = False
        self.round: _Round | None = None
        self.coordinating: _Coordinating | None = None
        self.held: list[Message] = []  # next-view multicasts that arrived before our next view
        self.suspects: set[Address] = set()
        # A START_FLUSH for a view we have not installed yet (it overtook the VIEW): run it once we have.
        self.early_start: tuple[Address, FlushHeader] | None = None
        # A START_FLUSH from a successor of members we do not suspect yet: run once we suspect them too.
        self.successor_start: tuple[Address, FlushHeader] | None = None

    # -- application side ----------------------------------------------------------------------------
    def down(self, msg: Message) -> None:
        if self.latched and msg.dest is None and not msg.flags & NO_RELIABILITY:
            self.queue.append(msg)
            self.queued_bytes += len(msg.payload)
            if not self.backpressure and self.queued_bytes > self.config.max_queued:
                self.backpressure = True
                self.above.up_event(Backpressure(True))
            return
        self.below.down(msg)

    def down_event(self, event: Event) -> Any:
        if isinstance(event, BlockOk):
            self._block_done()
            return None
        if isinstance(event, FlushCompleted | FlushFailed):  # pragma: no cover - those travel down from here only
            return self.below.down_event(event)
        return self.below.down_event(event)

    # -- from below ----------------------------------------------------------------------------------
    def up(self, batch: list[Message]) -> None:
        out, own = split_batch(batch, protocol_ids.FLUSH)
        # The multicasts first: NAKACK counted them as delivered when it passed this batch up, so the digest a
        # control message of the same batch reads (FLUSH_OK, completion) already includes them — they belong
        # to the old view and must reach the application before the round can complete.
        r = self.round
        if out and ((r is not None and r.completed) or self.held):
            # Our old-view delivery is complete; a multicast arriving now was sent in the next view (its
            # sender installed it before us): deliver it after we install that view too. While a sender has
            # anything held, its later multicasts queue behind it (FIFO), even if a new flush round started
            # meanwhile; but only its own: a new round's target may deliver old-view multicasts of a sender
            # the completed round did not flush (it never installed that next view), and those are delivered
            # in the old view, as its other participants do.
            senders = None if r is not None and r.completed else {m.src for m in self.held}
            kept: list[Message] = []
            held: list[Message] = []
            for m in out:
                if m.dest is None and (senders is None or m.src in senders):
                    held.append(m)
                else:
                    kept.append(m)
            if held:
                self.held.extend(held)
                out = kept
        if out:
            self.above.up(out)
        for msg, hdr in own:  # flush control is unicast: its order against multicasts carries no meaning
            self._handle(msg.sender(), hdr)

    def up_event(self, event: Event) -> None:
        if isinstance(event, FlushRequest):
            self._start(event.flush_id, event.participants)
            return
        if isinstance(event, Suspect):
            self.suspects.add(event.member)
            self.above.up_event(event)
            waiting = self.successor_start
            if waiting is not None and self.view is not None and self._senior(self.view) == waiting[0]:
                # We suspect every member before the successor now: it is the one we follow.
                self.successor_start = None
                self.cancel_timer("successor")
                self._on_start(*waiting)
            return
        if isinstance(event, Unsuspect):
            self.suspects.discard(event.member)
        if isinstance(event, ViewChange):
            self.view = event.view
            self.suspects &= set(event.view.members)
            self.coordinating = None
            self.successor_start = None  # it flushed the view before
            self.cancel_timer("successor")
            self.above.up_event(event)
            self._release_held(event.view.members)
            self._unblock("view installed")
            early, self.early_start = self.early_start, None
            if early is not None and early[1].view_id == event.view.view_id:
                self._on_start(*early)
            return
        self.above.up_event(event)

    def _handle(self, src: Address, hdr: FlushHeader) -> None:
        kind = hdr.kind
        if kind == START_FLUSH:
            self._on_start(src, hdr)
        elif kind == FLUSH_OK:
            c = self.coordinating
            if c is not None and c.flush_id == hdr.flush_id and src in c.participants and hdr.digest is not None:
                c.oks[src] = hdr.digest
                self._maybe_send_target()
        elif kind == FLUSH_TARGET:
            r = self.round
            if r is not None and r.flush_id == hdr.flush_id and hdr.digest is not None and not r.completed:
                r.target = hdr.digest
                self._deliver_covered(hdr.digest)
                self.below.down_event(FlushTarget(hdr.digest, hdr.holders))
        elif kind == FLUSH_COMPLETED:
            c = self.coordinating
            if c is not None and c.flush_id == hdr.flush_id and src in c.participants:
                c.completed.add(src)
                if c.completed >= set(c.participants):
                    self.coordinating = None
                    self.cancel_timer("coordinate")
                    self.count("flushes_completed")
                    self.below.down_event(FlushCompleted(c.flush_id))

    # -- coordinator -----------------------------------------------------------------------------------
    def _start(self, flush_id: FlushId, participants: tuple[Address, ...]) -> None:
        if self.view is None:
            return  # GMS flushes only once it has a view; nothing to flush before
        self.coordinating = _Coordinating(flush_id, participants)
        self.count("flushes_started")
        view_id = self.view.view_id
        for p in participants:
            self._send(p, FlushHeader(START_FLUSH, flush_id, participants=participants, view_id=view_id))
        self.set_timer("coordinate", self.config.start_flush_timeout)

    def _maybe_send_target(self) -> None:
        c = self.coordinating
        if c is None or c.target_sent or set(c.oks) < set(c.participants):
            return
        best: dict[Address, tuple[int, Address]] = {}
        for member in c.participants:
            for sender, (delivered, _) in c.oks[member].items():
                cur = best.get(sender)
                # The sender itself holds its whole stream; otherwise any participant with the most.
                if cur is None or delivered > cur[0] or (delivered == cur[0] and member == sender):
                    best[sender] = (delivered, member)
        target = Digest({s: (d, d) for s, (d, _) in best.items()})
        holders = tuple((s, h) for s, (_, h) in best.items() if h != s)
        if not self.config.enable_reconciliation:
            # Seed 001's switch: members only quiet down; nobody fetches what others delivered.
            target, holders = Digest({}), ()
        c.target_sent = True
        for p in c.participants:
            self._send(
                p, FlushHeader(FLUSH_TARGET, c.flush_id, participants=c.participants, digest=target, holders=holders)
            )
        self.set_timer("coordinate", self.config.end_flush_timeout)

    # -- participant -----------------------------------------------------------------------------------
    def _on_start(self, src: Address, hdr: FlushHeader) -> None:
        me = self.local_address
        if me not in hdr.participants:
            return
        # Only the member our membership layer would follow may flush us: the first member of our view we do
        # not suspect (or a successor, once we suspect the members it removes too). Two members that both think
        # they coordinate (after an asymmetric partition) must not take turns superseding each other's rounds
        # forever; the other one's flush fails and it moves on.
        view = self.view
        if view is None or hdr.view_id != view.view_id:
            # A flush of another view: one we have not installed yet (the unicast START_FLUSH overtook the
            # multicast VIEW) runs once we have it; until then we are still flushed for the view before, and
            # answering now would deliver next-view messages in our old view. Stale ones are dropped then.
            self.count("flush_starts_deferred")
            self.early_start = (src, hdr)
            return
        if src != self._senior(view):
            disputed = self._disputed(view, src, hdr.participants)
            if not disputed:
                self.count("flushes_refused")
                return
            # src succeeds members we still think alive: it saw them die first (the coordinator crashed, and our
            # detector is slower). Refusing would exclude us from the successor's view, so we ask our detector
            # to verify them now and follow src once we suspect them too. If they answer, src's view is the
            # split of one member's false suspicion: refused when the wait ends, and the group stays whole.
            if self.successor_start is None or self.successor_start[1].flush_id != hdr.flush_id:
                self.count("successor_starts_verified")
                self.below.down_event(VerifySuspect(disputed))
                self.set_timer("successor", self.config.successor_timeout)
            self.successor_start = (src, hdr)
            return
        r = self.round
        if r is not None and r.flush_id == hdr.flush_id:
            return
        # A new flush (possibly from a new coordinator after a crash) supersedes the old one.
        if r is not None:
            self.below.down_event(FlushRelease())
        self.round = _Round(hdr.flush_id, src, hdr.participants)
        self.set_timer("blocked", self.config.timeout)
        if self.latched:
            self._block_done()  # the application is blocked already (an earlier round was superseded)
            return
        self.above.up_event(Block())
        if self.config.block_ok == "auto":
            self._block_done()

    def _senior(self, view: View) -> Address | None:
        """The member our membership layer follows: the first of the view that we do not suspect."""
        return next((m for m in view.members if m not in self.suspects), None)

    def _disputed(self, view: View, src: Address, participants: tuple[Address, ...]) -> tuple[Address, ...]:
        """The members we do not suspect that ``src`` removes to be coordinator; empty if it is no successor.

        ``src`` is the successor of every member before it in the view that we suspect or that its flush leaves
        out (it suspects them): the member the membership layer will follow once they are removed. A member
        before it that it still flushes (or we ourselves) outranks it, whatever anyone suspects.
        """
        if src not in view.members or src not in participants:
            return ()
        me = self.local_address
        disputed = []
        for m in view.members:
            if m == src:
                break
            if m == me or m in participants:
                return ()
            if m not in self.suspects:
                disputed.append(m)
        return tuple(disputed)

    def _block_done(self) -> None:
        r = self.round
        if r is None or r.ok_sent:
            return
        r.ok_sent = True
        self.latched = True
        digest = self.below.down_event(FlushHold())
        if not isinstance(digest, Digest):
            digest = self.below.down_event(GetDigest())
        if isinstance(digest, Digest) and self.held:
            digest = self._without_held(digest)
        self._send(r.coordinator, FlushHeader(FLUSH_OK, r.flush_id, digest=digest))

    def _without_held(self, digest: Digest) -> Digest:
        """``digest`` as the application saw it: the held next-view multicasts were not delivered in this view.

        NAKACK counts them as delivered. A round that supersedes a completed one (its coordinator crashed after
        installing the next view, which never reached us) must not take them as old-view messages: its
        coordinator would fetch and deliver them in our old view, while we drop or deliver them in another.
        """
        first: dict[Address, int] = {}
        for msg in self.held:
            hdr = msg.headers.get(protocol_ids.NAKACK)
            seqno = getattr(hdr, "seqno", None)
            if msg.src is not None and isinstance(seqno, int) and msg.src not in first:
                first[msg.src] = seqno
        entries = dict(digest.items())
        for sender, seqno in first.items():
            if sender in entries:
                delivered, received = entries[sender]
                entries[sender] = (min(delivered, seqno - 1), received)
        return Digest(entries)

    def _deliver_covered(self, target: Digest) -> None:
        """Deliver, in this view, the held multicasts that ``target`` puts in it.

        We held them as next-view multicasts after completing an earlier round, but a participant of this
        round of the same view reported them delivered in it: their sender unblocked in this view without a
        new one (its own round timed out) and sent them here. Every other participant delivers them before
        this view ends, so must we; holding them until the next view would deliver them in another view.
        """
        if not self.held:
            return
        out: list[Message] = []
        kept: list[Message] = []
        stopped: set[Address | None] = set()  # a sender's messages after its first uncovered one stay held (FIFO)
        for msg in self.held:
            hdr = msg.headers.get(protocol_ids.NAKACK)
            seqno = getattr(hdr, "seqno", None)
            src = msg.src
            if (
                src not in stopped
                and src is not None
                and isinstance(seqno, int)
                and src in target
                and seqno <= target.delivered(src)
            ):
                out.append(msg)
            else:
                stopped.add(src)
                kept.append(msg)
        if out:
            self.held = kept
            self.count("held_delivered_in_view", len(out))
            self.above.up(out)

    def end_of_step(self) -> bool:
        # Completion is checked at the end of the step, never in the middle of a batch: layers between NAKACK
        # and us may pass a batch up in parts, and NAKACK's digest already counts the parts not yet here. And at
        # the end of every step while the round waits for its target, not only of those in which something
        # reached us: NAKACK also delivers messages that a layer between it and us keeps (GMS consumes a VIEW
        # that a merge's subgroup coordinator cast to its old view), and the last one we fetch may be such.
        r = self.round
        if r is None or r.target is None or r.completed:
            return False
        return self._check_complete()

    def _check_complete(self) -> bool:
        r = self.round
        if r is None or r.target is None or r.completed:
            return False
        digest = self.below.down_event(GetDigest())
        if not isinstance(digest, Digest):
            return False
        for sender, (want, _) in r.target.items():
            if sender in digest and digest.delivered(sender) < want:
                return False
        r.completed = True
        # Old-view streams of participants are complete: later messages from them are new-view control
        # traffic (the view itself), which must flow. Non-participants stay held until the view removes them.
        self.below.down_event(FlushRelease(r.participants))
        self._send(r.coordinator, FlushHeader(FLUSH_COMPLETED, r.flush_id))
        return True

    def _release_held(self, members: tuple[Address, ...] | None = None) -> None:
        """Deliver the held next-view multicasts; at a view change only those of its members.

        A held multicast was sent in a view that followed our completed flush. If its sender is not in the view
        we install now, that view is another one (ours after the next view never reached us, say): the message
        belongs to a view we never installed and is dropped, as NAKACK drops the stream of a removed member.
        """
        if not self.held:
            return
        held, self.held = self.held, []
        if members is not None:
            kept = set(members)
            out = [m for m in held if m.src in kept]
            if len(out) < len(held):
                self.count("held_dropped", len(held) - len(out))
            held = out
        if held:
            self.above.up(held)

    def _unblock(self, reason: str) -> None:
        self.cancel_timer("blocked")
        self._release_held()
        was_blocked = self.round is not None or self.latched
        self.round = None
        if not was_blocked:
            return
        self.latched = False
        self.below.down_event(FlushRelease())
        queued, self.queue = self.queue, []
        self.queued_bytes = 0
        for msg in queued:
            self.below.down(msg)
        if self.backpressure:
            self.backpressure = False
            self.above.up_event(Backpressure(False))
        self.above.up_event(Unblock())
        self.count("unblocked")

    def on_timer(self, key: object) -> None:
        if key == "successor":
            waiting, self.successor_start = self.successor_start, None
            if waiting is not None:
                self.count("flushes_refused")
                self.ctx.log.info("refusing the flush of %s: the members it removes answer us", waiting[0])
            return
        if key == "blocked":
            self.count("block_timeouts")
            # Unblocking in the old view would send our queued multicasts into a view the others may have left
            # (they installed the next one, which never reached us): GMS moves us into a view of our own first,
            # which unblocks us through the view change. It answers True when a view is on its way (a merge
            # our flush prepared ends by its own timeout, or our own VIEW has not looped back yet): we wait for
            # it. Otherwise we unblock here.
            if self.below.down_event(FlushAbandoned()) is True and (self.round is not None or self.latched):
                self.ctx.log.info("flush blocked %.1fs: waiting for the view GMS prepares", self.config.timeout)
                self.set_timer("blocked", self.config.timeout)
                return
            self.ctx.log.warning("blocked by a flush for %.1fs without a new view: unblocking", self.config.timeout)
            if self.round is not None or self.latched:
                self._unblock("timeout")
        elif key == "coordinate":
            c = self.coordinating
            if c is None:
                return
            waiting_for = c.completed if c.target_sent else set(c.oks)
            missing = tuple(m for m in c.participants if m not in waiting_for)
            self.coordinating = None
            self.count("flushes_failed")
            self.below.down_event(FlushFailed(c.flush_id, missing, retry_after=self.config.retry_timeout))

    def _send(self, dest: Address, hdr: FlushHeader) -> None:
        # Flush control travels as reliable unicasts: multicasts would queue behind the delivery holds.
        self.below.down(Message(dest, flags=NO_FLOW_CONTROL, headers={protocol_ids.FLUSH: hdr}))

    def describe_state(self) -> dict[str, Any]:
        return {
            "latched": self.latched,
            "queued": len(self.queue),
            "round": None if self.round is None else str(self.round.flush_id),
            "awaiting_successor": None if self.successor_start is None else str(self.successor_start[0]),
        }
