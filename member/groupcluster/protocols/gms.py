"""GMS: group membership — join, graceful leave, crash removal, coordinator failover, view bundling, merge.

The coordinator (first member of the view) turns queued requests into views. Requests that arrive within
``view_bundling`` of each other become one view; while a view is being installed (waiting for acks) further
requests queue and are computed against the membership of the view last *sent* — the temporary membership
list of seed 002 — so concurrent joins and leaves never undo each other.

A view travels as a NAKACK multicast to the members of the old view (so a leaver sees the view without
itself), and each member acknowledges it. Joiners get a JOIN_RSP with the view and a digest only after the
acks. The digest is taken in the same step in which the view message was sent, after NAKACK gave it a seqno,
so the coordinator's entry always counts the view message: the race seed 002 patched with "+1" cannot happen
(the layer runs single-threaded, and there is no window between sending and reading the digest).

A joiner announces its own next seqno in its JOIN_REQ and the view carries it to every member, so a member
that rejoins after being excluded is never asked to resend (and nobody redelivers) what it sent before.

Merge (seed 002, MERGE2): the merge leader is the lowest coordinator address; it collects MERGE_RSP (view +
digest) from the other coordinators, computes the merged view (max view seq + 1) and digest, sends
INSTALL_MERGE_VIEW to them, and each coordinator multicasts the merge view and digest in its subgroup.
Every merge has an id and a timeout, so a crashed leader or coordinator cannot block membership.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from ..core import protocol_ids
from ..core.address import Address
from ..core.config import param
from ..core.digest import Digest
from ..core.errors import WireError
from ..core.events import (
    Connect,
    Disconnect,
    Event,
    FindMembers,
    FlushAbandoned,
    FlushCompleted,
    FlushFailed,
    FlushGroup,
    FlushRequest,
    GetDigest,
    Joined,
    Left,
    MembersFound,
    MergeDigest,
    MergeNeeded,
    SetDigest,
    Suspect,
    Unsuspect,
    ViewChange,
)
from ..core.layer import Layer, register_layer
from ..core.message import NO_FLOW_CONTROL, Header, Message, register_header
from ..core.validate import as_address, as_int, as_list, as_str
from ..core.view import View, ViewId

JOIN_REQ, JOIN_RSP, VIEW, VIEW_ACK, LEAVE_REQ, SUSPECT = 0, 1, 2, 3, 4, 5
MERGE_REQ, MERGE_RSP, INSTALL_MERGE_VIEW, CANCEL_MERGE = 6, 7, 8, 9
FLUSH_REQ = 10  # a member asks the coordinator for a group flush (FlushGroup)
KIND_NAMES = (
    "JOIN_REQ",
    "JOIN_RSP",
    "VIEW",
    "VIEW_ACK",
    "LEAVE_REQ",
    "SUSPECT",
    "MERGE_REQ",
    "MERGE_RSP",
    "INSTALL_MERGE_VIEW",
    "CANCEL_MERGE",
    "FLUSH_REQ",
)

MergeId = tuple[Address, int]


@register_header
class GmsHeader(Header):
    """All GMS messages: a kind and the fields that kind uses (unused fields travel as nil)."""

    PROTO_ID = protocol_ids.GMS
    __slots__ = ("digest", "kind", "member", "merge_id", "reason", "seqno", "view", "view_id")

    def __init__(
        self,
        kind: int,
        *,
        view: View | None = None,
        digest: Digest | None = None,
        view_id: ViewId | None = None,
        member: Address | None = None,
        merge_id: MergeId | None = None,
        reason: str | None = None,
        seqno: int = 0,
    ) -> None:
        self.kind = kind
        self.view = view
        self.digest = digest
        self.view_id = view_id
        self.member = member
        self.merge_id = merge_id
        self.reason = reason
        self.seqno = seqno

    def to_wire(self) -> list[Any]:
        return [
            self.kind,
            None if self.view is None else self.view.to_wire(),
            None if self.digest is None else self.digest.to_wire(),
            None if self.view_id is None else self.view_id.to_wire(),
            None if self.member is None else self.member.to_wire(),
            None if self.merge_id is None else [self.merge_id[0].to_wire(), self.merge_id[1]],
            self.reason,
            self.seqno,
        ]

    @classmethod
    def from_wire(cls, data: Any) -> GmsHeader:
        items = as_list(data, "gms", 8, exact=8)
        kind = as_int(items[0], "gms.kind", 0, len(KIND_NAMES) - 1)
        merge_id = None
        if items[5] is not None:
            mid = as_list(items[5], "gms.merge_id", 2, exact=2)
            merge_id = (as_address(mid[0], "gms.merge_id.leader"), as_int(mid[1], "gms.merge_id.counter"))
        hdr = cls(
            kind,
            view=None if items[1] is None else View.from_wire(items[1], "gms.view"),
            digest=None if items[2] is None else Digest.from_wire(items[2], "gms.digest"),
            view_id=None if items[3] is None else ViewId.from_wire(items[3], "gms.view_id"),
            member=None if items[4] is None else as_address(items[4], "gms.member"),
            merge_id=merge_id,
            reason=None if items[6] is None else as_str(items[6], "gms.reason", 512),
            seqno=as_int(items[7], "gms.seqno"),
        )
        needs_view = (VIEW, INSTALL_MERGE_VIEW)
        if kind in needs_view and hdr.view is None:
            raise WireError(f"gms: {KIND_NAMES[kind]} without a view")
        if kind in (MERGE_REQ, MERGE_RSP, INSTALL_MERGE_VIEW, CANCEL_MERGE) and merge_id is None:
            raise WireError(f"gms: {KIND_NAMES[kind]} without a merge id")
        return hdr

    def __repr__(self) -> str:
        return f"GmsHeader({KIND_NAMES[self.kind]}, view={self.view}, reason={self.reason})"


@dataclass(frozen=True)
class GmsConfig:
    join_timeout: float = param("2s", "duration", doc="wait this long for a JOIN_RSP before discovering again")
    join_retry: float = param("300ms", "duration", doc="pause before discovering again when nobody is coordinator")
    max_join_attempts: int = param(
        20, "int", doc="after this many attempts without a coordinator, start a group of our own", minimum=1
    )
    view_bundling: float = param("10ms", "duration", doc="requests arriving within this window share one view")
    view_ack_timeout: float = param("2s", "duration", doc="longest wait for members to acknowledge a view")
    leave_timeout: float = param("2s", "duration", doc="resend a leave request after this long")
    max_leave_attempts: int = param(3, "int", doc="leave anyway after this many unanswered requests", minimum=1)
    merge_timeout: float = param("5s", "duration", doc="a merge not finished by then is cancelled")
    use_flush: bool = param(False, "bool", doc="flush the old view before every view change (virtual synchrony)")
    flush_guard_timeout: float = param(
        "6s", "duration", doc="flush again if FLUSH neither completed nor failed a flush within this time"
    )
    orphan_timeout: float = param(
        "6s", "duration", doc="coordinator suspected and no new view for this long: continue alone until merged"
    )
    max_early_messages: int = param(
        100_000, "int", doc="messages kept that arrive while joining, before our view does", minimum=0
    )


@dataclass
class _PendingView:
    view: View
    joiners: tuple[Address, ...]
    join_digest: Digest
    awaiting: set[Address]


@dataclass
class _Merge:
    merge_id: MergeId
    leader: Address
    waiting: set[Address] = field(default_factory=set)
    responses: dict[Address, tuple[View, Digest]] = field(default_factory=dict)
    # use_flush: our subgroup was flushed for this merge, so its members are blocked until a view comes.
    flushed: bool = False
    # use_flush: the members of our view that take part in our subgroup's flush (the others are suspected).
    participants: tuple[Address, ...] | None = None


@register_layer
class Gms(Layer):
    NAME = "gms"
    PROTO_ID = protocol_ids.GMS
    Config = GmsConfig

    def __init__(self, config: GmsConfig, ctx: Any) -> None:
        super().__init__(config, ctx)
        self.state = "idle"  # idle -> joining -> member -> leaving -> left
        self.view: View | None = None
        self.max_seq = 0
        self.suspects: set[Address] = set()
        # Coordinator state.
        self.queue: list[tuple[str, Address, int]] = []  # (join|leave|suspect, member, joiner's seqno)
        self.pending: _PendingView | None = None
        self.tmp_members: tuple[Address, ...] = ()
        self.join_rsp_cache: dict[Address, tuple[View, Digest]] = {}
        self.merge: _Merge | None = None
        self.merge_counter = 0
        # Set when every member before us in the view is suspected: we act as coordinator until our view.
        self.acting_coordinator = False
        self.leave_after_pending = False
        # FLUSH (use_flush): the flush in progress, and whether the queue may now become a view.
        self.flushing: tuple[Address, int] | None = None
        self.flush_for_merge = False  # the flush in progress prepares our subgroup for self.merge
        # A view we multicast and have not installed yet (it reaches us through our own stream), and the one
        # FlushAbandoned was already deferred for (each cast view is waited for once).
        self.casting: ViewId | None = None
        self.abandon_deferred_for: ViewId | None = None
        self.flush_ready = False
        self.flush_counter = 0
        self.cancel_timer("orphan")
        # Client state.
        self.early: list[Message] = []  # messages received while joining, delivered once joined
        self.join_attempts = 0
        self.join_target: Address | None = None
        self.leave_attempts = 0

    # -- helpers -------------------------------------------------------------------------------------
    @property
    def is_coordinator(self) -> bool:
        if self.view is None or self.state not in ("member", "leaving"):
            return False
        return self.acting_coordinator or self.view.coordinator == self.local_address

    def _send(self, dest: Address | None, hdr: GmsHeader) -> None:
        self.below.down(Message(dest, flags=NO_FLOW_CONTROL, headers={protocol_ids.GMS: hdr}))

    def _own_seqno(self) -> int:
        digest = self.below.down_event(GetDigest())
        return digest.delivered(self.local_address) if isinstance(digest, Digest) else 0

    # -- from above ----------------------------------------------------------------------------------
    def down(self, msg: Message) -> None:
        if self.state not in ("member", "leaving"):
            self.count("dropped_not_joined")
            return
        self.below.down(msg)

    def down_event(self, event: Event) -> Any:  # noqa: C901  one case per control event
        if isinstance(event, Connect):
            self.state = "joining"
            self.join_attempts = 0
            self._discover()
            return None
        if isinstance(event, Disconnect):
            self._leave()
            return None
        if isinstance(event, FlushCompleted):
            if event.flush_id == self.flushing:
                self.cancel_timer("flush")
                self.flushing = None
                if self.flush_for_merge:
                    self._merge_flushed()
                else:
                    self.flush_ready = True
                    self._process_queue()
            return None
        if isinstance(event, FlushGroup):
            if not self.config.use_flush or self.view is None or self.state != "member":
                return False
            if self.is_coordinator:
                self._enqueue("flush", self.local_address)
            else:
                self._send(self.view.coordinator, GmsHeader(FLUSH_REQ))
            return True
        if isinstance(event, FlushAbandoned):
            view = self.view
            alone = view is None or len(view.members) == 1
            if self.state in ("member", "leaving") and not alone and not self.is_coordinator:
                self._continue_alone("flush_abandoned", "blocked by a flush without a new view")
                if self.state == "leaving":
                    self._left("left")  # alone now: nobody is left to hand over to
                return None
            if self.merge is not None:
                # Our subgroup is flushed for a merge whose digest (ours, cut by that flush) the leader puts into
                # the merged view. Unblocking in the old view now would multicast past that cut, and the other
                # subgroups would deliver those messages in the merged view while we delivered them in the old
                # one. The merge ends within merge_timeout, with the merged view or a view of our own.
                self.count("flush_abandon_deferred")
                return True
            casting = self.casting
            if casting is not None and casting != self.abandon_deferred_for:
                # We multicast the view that ends this flush (a merge that ended in the same instant, say) and it
                # is on its way to us: the members that install it first deliver what we would send now in it.
                self.abandon_deferred_for = casting
                self.count("flush_abandon_deferred")
                return True
            return None
        if isinstance(event, FlushFailed):
            if event.flush_id == self.flushing:
                self.cancel_timer("flush")
                self.flushing = None
                self.count("flush_failures")
                if self.flush_for_merge:
                    self._merge_flush_failed()
                for m in event.missing:
                    if m != self.local_address:
                        self.suspects.add(m)
                        self._enqueue("suspect", m)
                self.set_timer("bundle", max(self.config.view_bundling, event.retry_after))
            return None
        return self.below.down_event(event)

    # -- from below ----------------------------------------------------------------------------------
    def up(self, batch: list[Message]) -> None:
        pid = protocol_ids.GMS
        # In order: messages that precede a VIEW in the stream are delivered before it is installed.
        pending: list[Message] = []
        for msg in batch:
            hdr: GmsHeader | None = msg.headers.get(pid)
            if hdr is None:
                pending.append(msg)
                continue
            if pending:
                self._deliver(pending)
                pending = []
            self._handle(msg.sender(), hdr)
        if pending:
            self._deliver(batch if len(pending) == len(batch) else pending)

    def _deliver(self, out: list[Message]) -> None:
        if self.state in ("member", "leaving"):
            self.above.up(out)
        elif self.state == "joining":
            # The coordinator installs a view with us before our JOIN_RSP arrives, and members may already
            # send to us (UNICAST has acknowledged these): keep them for when we have the view.
            room = self.config.max_early_messages - len(self.early)
            if len(out) > room:
                self.count("early_dropped", len(out) - max(room, 0))
            self.early.extend(out[: max(room, 0)])

    def up_event(self, event: Event) -> None:
        if isinstance(event, MembersFound):
            if event.purpose == "join":
                self._on_members_found(event)
            return
        if isinstance(event, Suspect):
            self._on_suspect(event.member)
            self.above.up_event(event)  # FLUSH and the application see suspicions too
            return
        if isinstance(event, Unsuspect):
            self.suspects.discard(event.member)
            self.above.up_event(event)
            return
        if isinstance(event, MergeNeeded):
            self._on_merge_needed(event)
            return
        self.above.up_event(event)

    def _handle(self, src: Address, hdr: GmsHeader) -> None:  # noqa: C901  one case per GMS message kind
        kind = hdr.kind
        if self.state == "left":
            return
        if kind == VIEW:
            assert hdr.view is not None
            self._on_view(src, hdr.view, hdr.digest)
        elif kind == VIEW_ACK:
            if self.pending is not None and hdr.view_id == self.pending.view.view_id:
                self.pending.awaiting.discard(src)
                if not self.pending.awaiting:
                    self._finish_pending()
        elif kind == JOIN_REQ:
            self._on_join_req(src, hdr.seqno)
        elif kind == JOIN_RSP:
            self._on_join_rsp(src, hdr)
        elif kind == LEAVE_REQ:
            if self.is_coordinator and self.view is not None and src in self.view.members:
                self._enqueue("leave", src)
        elif kind == SUSPECT:
            self._on_suspect_report(hdr.member)
        elif kind == FLUSH_REQ:
            if self.is_coordinator and self.config.use_flush and self.view is not None and src in self.view.members:
                self._enqueue("flush", src)  # flushed like any view change; the view it ends in keeps the members
        elif kind == MERGE_REQ:
            self._on_merge_req(src, hdr)
        elif kind == MERGE_RSP:
            self._on_merge_rsp(src, hdr)
        elif kind == INSTALL_MERGE_VIEW:
            m = self.merge
            if m is not None and m.merge_id == hdr.merge_id and hdr.view is not None:
                self._cast_view(hdr.view, hdr.digest)
                m.flushed = False  # the merged view unblocks our subgroup
                self._end_merge()
        elif kind == CANCEL_MERGE and self.merge is not None and self.merge.merge_id == hdr.merge_id:
            self._end_merge()

    # -- joining -------------------------------------------------------------------------------------
    def _discover(self) -> None:
        self.join_attempts += 1
        self.below.down_event(FindMembers("join"))

    def _on_members_found(self, event: MembersFound) -> None:
        if self.state != "joining":
            return
        me = self.local_address
        # An answer naming us as coordinator comes from a view we never installed (its coordinator named us its
        # successor and left): a join request to ourselves is rejected forever, so such answers count as none.
        coords = Counter(
            r.coordinator
            for r in event.responses
            if r.coordinator is not None and r.coordinator != me and r.address != me
        )
        if coords:
            # The coordinator most responders name; ties go to the lowest address (deterministic).
            best = max(coords.values())
            self.join_target = min(c for c, n in coords.items() if n == best)
            self._send(self.join_target, GmsHeader(JOIN_REQ, seqno=self._own_seqno()))
            self.set_timer("join", self.config.join_timeout)
            return
        others = [r.address for r in event.responses if r.address != me]
        # Nobody answered: ask once more before founding a group, so members started together (whose first
        # requests crossed while they were still starting) find each other instead of splitting.
        alone = not others and self.join_attempts >= 2
        if alone or (others and me < min(others)) or self.join_attempts >= self.config.max_join_attempts:
            # Nobody is coordinator and we are the lowest (or we waited long enough): found the group.
            self._install(View(ViewId(self.max_seq + 1, me), (me,)))
            return
        self.set_timer("rediscover", self.config.join_retry * (1 + self.ctx.rng.random()))

    def _on_join_rsp(self, src: Address, hdr: GmsHeader) -> None:
        if self.state != "joining":
            return
        self.cancel_timer("join")
        if hdr.view is None or hdr.digest is None:
            self.count("join_rejected")
            self.ctx.log.info("join rejected by %s: %s", src, hdr.reason)
            self.set_timer("rediscover", self.config.join_retry * (1 + self.ctx.rng.random()))
            return
        if self.local_address not in hdr.view.members:
            return
        self.below.down_event(SetDigest(hdr.digest))
        self._install(hdr.view)

    # -- coordinator: requests -> views --------------------------------------------------------------
    def _on_join_req(self, joiner: Address, seqno: int) -> None:
        if not self.is_coordinator or self.view is None:
            coord = None if self.view is None else self.view.coordinator
            self._send(joiner, GmsHeader(JOIN_RSP, member=coord, reason="not coordinator"))
            return
        if joiner in self.view.members:
            cached = self.join_rsp_cache.get(joiner)
            if cached is not None:
                self._send(joiner, GmsHeader(JOIN_RSP, view=cached[0], digest=cached[1]))
            else:
                # A member of our view that is still joining never got its JOIN_RSP (its coordinator died
                # first). No digest from back then exists here, so remove it; its next JOIN_REQ adds it anew.
                self.count("stale_joiners_removed")
                self._enqueue("suspect", joiner)
            return
        # A new incarnation on an endpoint means the old one is gone: remove it in the same view.
        for m in self.view.members:
            if m.endpoint == joiner.endpoint and m != joiner:
                self.suspects.add(m)
                self._enqueue("suspect", m)
        self._enqueue("join", joiner, seqno)

    def _enqueue(self, kind: str, member: Address, seqno: int = 0) -> None:
        self.queue.append((kind, member, seqno))
        if not self.ctx.has_timer("bundle"):
            self.set_timer("bundle", self.config.view_bundling)

    def _request_flush(self, members: tuple[Address, ...], for_merge: bool) -> bool:
        """Ask FLUSH to flush ``members`` (minus suspects); False when there is nobody else to flush."""
        participants = tuple(m for m in members if m not in self.suspects)
        # Alone, a view change needs no flush: the VIEW message itself orders our multicasts before and after
        # it. A merge does: our digest goes out before the merged view comes, and what we multicast between
        # the two must wait for the merged view, or its new members would deliver it as part of that view.
        if len(participants) < (1 if for_merge else 2):
            return False
        self.flush_counter += 1
        self.flushing = (self.local_address, self.flush_counter)
        self.flush_for_merge = for_merge
        # Never wait on FLUSH forever: if neither FlushCompleted nor FlushFailed comes, flush again.
        self.set_timer("flush", self.config.flush_guard_timeout)
        self.above.up_event(FlushRequest(self.flushing, participants))
        return True

    def _process_queue(self) -> None:
        # After a flush the members are blocked until a view arrives: a completed flush needs a view even with
        # nothing queued (a merge it was made for was cancelled).
        if not (self.queue or self.flush_ready) or not self.is_coordinator:
            return
        if self.pending is not None or self.merge is not None:
            return
        if self.flushing is not None:
            return  # requests keep queueing (bundled) until the flush completes
        assert self.view is not None
        me = self.local_address
        base = self.tmp_members or self.view.members
        if self.config.use_flush and not self.flush_ready and self._request_flush(base, for_merge=False):
            return
        flushed, self.flush_ready = self.flush_ready, False
        requests, self.queue = self.queue, []
        removed = {m for kind, m, _ in requests if kind in ("leave", "suspect") and m in base}
        if self.state == "leaving":
            removed.add(me)  # we became coordinator while leaving: our own view must not contain us
        joiners: dict[Address, int] = {}
        for kind, m, seqno in requests:
            if kind == "join" and m not in base and m not in removed:
                joiners[m] = seqno
        members = tuple(m for m in base if m not in removed) + tuple(joiners)
        asked = any(kind == "flush" for kind, _, _ in requests)  # Channel.flush(): a view ends it, even alone
        if members == base and not (flushed or asked):
            return
        # After a flush the members are blocked until a view arrives: install one even if nothing changed.
        if not members:
            self._left("left")
            return
        self.max_seq += 1
        view = View(ViewId(self.max_seq, me), members)
        start_points = Digest({j: (s, s) for j, s in joiners.items()}) if joiners else None
        self.tmp_members = members
        self.casting = view.view_id
        self._send(None, GmsHeader(VIEW, view=view, digest=start_points))
        # Same step, after NAKACK numbered the view message: our own entry includes it (no race, no "+1").
        current = self.below.down_event(GetDigest())
        entries = {m: current[m] for m in members if isinstance(current, Digest) and m in current}
        for j, s in joiners.items():
            entries[j] = (s, s)
        awaiting = set(members) - {me} - set(joiners)
        self.pending = _PendingView(view, tuple(joiners), Digest(entries), awaiting)
        self.count("views_sent")
        if awaiting:
            self.set_timer("ack", self.config.view_ack_timeout)
        else:
            self._finish_pending()

    def _finish_pending(self) -> None:
        pending, self.pending = self.pending, None
        self.cancel_timer("ack")
        if pending is None:
            return
        if self.leave_after_pending:
            self._left("left")
            return
        if pending.awaiting:
            self.count("view_ack_timeouts")
        self.join_rsp_cache = {j: (pending.view, pending.join_digest) for j in pending.joiners}
        for j in pending.joiners:
            self._send(j, GmsHeader(JOIN_RSP, view=pending.view, digest=pending.join_digest))
        if self.queue and not self.ctx.has_timer("bundle"):
            self.set_timer("bundle", self.config.view_bundling)

    # -- installing views ----------------------------------------------------------------------------
    def _acceptable(self, view: View) -> bool:
        cur = self.view
        if cur is None:
            return True
        if view.view_id == cur.view_id:
            return False
        if view.view_id.seq > cur.view_id.seq:
            return True
        # Same seq from another creator: after a coordinator crashed mid-install, its successor (a member of
        # our view) may reuse the seq; a creator outside our view is a stale or foreign view.
        return view.view_id.seq == cur.view_id.seq and view.view_id.creator in cur.members

    def _on_view(self, src: Address, view: View, digest: Digest | None) -> None:
        self.max_seq = max(self.max_seq, view.view_id.seq)
        if self.state not in ("member", "leaving") or not self._acceptable(view):
            self.count("views_ignored")
            return
        me = self.local_address
        if digest is not None and not view.is_merge and me in digest:
            # A view that adds us as a joiner answers a JOIN_REQ of ours that arrived late (we joined another
            # group meanwhile): we are not joining; moving into it would skip the flush of the view we are in.
            self.count("views_ignored_as_joiner")
            return
        if me not in view.members:
            if self.state == "leaving":
                if self.pending is not None and self.pending.view.view_id == view.view_id:
                    # Our own view without us: stay (and retransmit it) until the members acknowledged it.
                    self.leave_after_pending = True
                else:
                    self._left("left")
            else:
                # Excluded (e.g. falsely suspected): carry on alone; MERGE brings us back.
                self._continue_alone("excluded", f"excluded by view {view}")
            return
        if digest is not None:
            # After a flushed merge the digest is every subgroup's cut: windows behind it move up to it.
            self.below.down_event(MergeDigest(digest, cut=self.config.use_flush and view.is_merge))
        self._install(view)
        if src != me:
            self._send(src, GmsHeader(VIEW_ACK, view_id=view.view_id))

    def _install(self, view: View) -> None:
        me = self.local_address
        self.view = view
        self.casting = None  # any view installed unblocks FLUSH
        self.acting_coordinator = False
        self.flush_ready = False  # a flush readies only the view that follows it
        self.max_seq = max(self.max_seq, view.view_id.seq)
        self.suspects &= set(view.members)
        if self.pending is None:
            self.tmp_members = view.members
        self.below.down_event(ViewChange(view))
        joined = self.state == "joining"
        if joined:
            # Member before the layers above see the view: they may send in it at once (SEQUENCER's SYNC).
            self.state = "member"
        self.above.up_event(ViewChange(view))
        if joined:
            self.cancel_timer("join")
            self.cancel_timer("rediscover")
            self.above.up_event(Joined(view))
            early, self.early = self.early, []
            early = [m for m in early if m.src in view.members]
            if early:
                self.above.up(early)
        if self.merge is not None:
            self.merge.flushed = False  # whatever view this is, it unblocked the members we flushed
        if self.flushing is not None:
            # A view (e.g. a merge) arrived during our flush: that round is void; flush again for the queue.
            self.flushing = None
            self.cancel_timer("flush")
            if self.queue and not self.ctx.has_timer("bundle"):
                self.set_timer("bundle", self.config.view_bundling)
        if view.coordinator == me:
            # Members suspected before we became coordinator are removed in our first view.
            for s in sorted(self.suspects):
                self._enqueue("suspect", s)
            if self.state == "leaving":
                self._enqueue("leave", me)
        else:
            self.queue.clear()
            self.pending = None
            self.flushing = None
            self.flush_ready = False
            self.cancel_timer("ack")

    def _cast_view(self, view: View, digest: Digest | None) -> None:
        self.max_seq = max(self.max_seq, view.view_id.seq)
        self.tmp_members = view.members
        self.casting = view.view_id
        self._send(None, GmsHeader(VIEW, view=view, digest=digest))

    # -- failures ------------------------------------------------------------------------------------
    def _on_suspect(self, member: Address) -> None:
        view = self.view
        me = self.local_address
        if view is None or member not in view.members or member == me or self.state not in ("member", "leaving"):
            return
        self.suspects.add(member)
        self.count("suspects")
        if self.is_coordinator:
            self._enqueue("suspect", member)
            return
        alive = [m for m in view.members if m not in self.suspects]
        if alive and alive[0] == me:
            # Every member before us is suspected: we take over as coordinator.
            self.ctx.log.info("taking over as coordinator from %s", view.coordinator)
            self.count("takeovers")
            self.pending = None
            self.tmp_members = view.members
            self.acting_coordinator = True
            for s in sorted(self.suspects):
                self._enqueue("suspect", s)
        elif alive:
            self._send(alive[0], GmsHeader(SUSPECT, member=member))
            if member == view.coordinator and not self.ctx.has_timer("orphan"):
                # If no successor installs a view for us (it may have moved on to another view), we are
                # orphaned: continue alone and let MERGE bring us back.
                self.set_timer("orphan", self.config.orphan_timeout)

    def _on_suspect_report(self, member: Address | None) -> None:
        """Another member suspects ``member``; only the coordinator acts on it."""
        if not self.is_coordinator or member is None or self.view is None or member == self.local_address:
            return
        if member in self.view.members:
            self.suspects.add(member)
            self._enqueue("suspect", member)

    def _continue_alone(self, counter: str, reason: str) -> None:
        """We are out of our group's view (or it has no coordinator for us): be a singleton until merged."""
        self.count(counter)
        self.ctx.log.info("%s: continuing alone until merged", reason)
        self.max_seq += 1
        self._install(View(ViewId(self.max_seq, self.local_address), (self.local_address,)))

    # -- leaving -------------------------------------------------------------------------------------
    def _leave(self) -> None:
        if self.state == "joining" or self.state == "idle":
            self._left("left before joining")
            return
        if self.state != "member" or self.view is None:
            return
        me = self.local_address
        if len(self.view.members) == 1:
            self._left("left")
            return
        self.state = "leaving"
        self.leave_attempts = 1
        if self.is_coordinator:
            # The coordinator removes itself: the next member becomes coordinator of the view it receives.
            self.queue.append(("leave", me, 0))
            self.cancel_timer("bundle")
            self._process_queue()
        else:
            self._send(self.view.coordinator, GmsHeader(LEAVE_REQ))
        self.set_timer("leave", self.config.leave_timeout)

    def _left(self, reason: str) -> None:
        if self.state == "left":
            return
        self.state = "left"
        for key in ("join", "rediscover", "leave", "bundle", "ack", "merge"):
            self.cancel_timer(key)
        self.above.up_event(Left(reason))

    # -- merge ---------------------------------------------------------------------------------------
    def _on_merge_needed(self, event: MergeNeeded) -> None:
        view = self.view
        if view is not None and self.state == "member" and not self.is_coordinator:
            if view.coordinator in event.coordinators:
                self._continue_alone("orphaned", "our coordinator announces a view without us")
            return
        if not self.is_coordinator or self.view is None or self._busy():
            return
        me = self.local_address
        coords = sorted(set(event.coordinators) | {me})
        if len(coords) < 2 or coords[0] != me:
            return  # the lowest coordinator leads; it sees the same coordinators
        self.merge_counter += 1
        merge_id = (me, self.merge_counter)
        self.merge = _Merge(merge_id, me, waiting=set(coords) - {me})
        self.count("merges_started")
        for c in coords[1:]:
            self._send(c, GmsHeader(MERGE_REQ, merge_id=merge_id))
        self.set_timer("merge", self.config.merge_timeout)
        self._prepare_merge()

    def _busy(self) -> bool:
        return self.pending is not None or self.merge is not None or self.flushing is not None

    def _prepare_merge(self) -> None:
        """Flush our subgroup (use_flush) before our view and digest go into the merge, else answer at once.

        Virtual synchrony across a merge: the members of each subgroup must deliver the same messages of
        their old view before the merged view, and send nothing more in it — the same flush as for any view
        change, run by each subgroup's coordinator over its own members. Their digest then is final.
        """
        assert self.view is not None and self.merge is not None
        if self.config.use_flush and self._request_flush(self.view.members, for_merge=True):
            self.merge.participants = tuple(m for m in self.view.members if m not in self.suspects)
            return
        self._merge_flushed()

    def _merge_flushed(self) -> None:
        m = self.merge
        if m is None or self.view is None:
            # The merge ended while we flushed: the blocked members still need a view.
            self.flush_ready = True
            self._process_queue()
            return
        m.flushed = self.config.use_flush
        me = self.local_address
        view = self.view
        if m.participants is not None and m.participants != view.members:
            # Only the members we flushed go into the merge. A suspect left out of the flush may never have
            # installed our view (its JOIN_REQ reached two coordinators and it joined the other one), so our
            # digest entry for it is no cut of its stream: a merged view listing it would start its stream
            # there, while members that delivered more of it in an earlier view start higher, and every flush
            # of the merged view would wait for messages nobody in it can retransmit. (The view id still tells
            # the leader our seq; the subgroup is never installed as such.)
            view = View(view.view_id, m.participants)
        digest = self._my_digest(view.members)
        if m.leader == me:
            m.responses[me] = (view, digest)
            if not m.waiting:
                self._finish_merge()
        else:
            self._send(m.leader, GmsHeader(MERGE_RSP, merge_id=m.merge_id, view=view, digest=digest))

    def _merge_flush_failed(self) -> None:
        m = self.merge
        if m is None:
            return
        if m.leader != self.local_address:
            self._send(m.leader, GmsHeader(MERGE_RSP, merge_id=m.merge_id, reason="flush failed"))
        self._abort_merge()

    def _my_digest(self, members: tuple[Address, ...]) -> Digest:
        digest = self.below.down_event(GetDigest())
        assert isinstance(digest, Digest)
        return Digest({m: digest[m] for m in members if m in digest})

    def _on_merge_req(self, src: Address, hdr: GmsHeader) -> None:
        busy = self.pending is not None or self.flushing is not None
        busy = busy or (self.merge is not None and self.merge.merge_id != hdr.merge_id)
        if not self.is_coordinator or busy or self.view is None:
            self._send(src, GmsHeader(MERGE_RSP, merge_id=hdr.merge_id, reason="busy or not coordinator"))
            return
        assert hdr.merge_id is not None
        if self.merge is not None:
            return  # a repeated request for the merge we already prepare
        self.merge = _Merge(hdr.merge_id, src)
        self.set_timer("merge", self.config.merge_timeout)
        self._prepare_merge()

    def _on_merge_rsp(self, src: Address, hdr: GmsHeader) -> None:
        m = self.merge
        if m is None or m.merge_id != hdr.merge_id or m.leader != self.local_address or src not in m.waiting:
            return
        m.waiting.discard(src)
        if hdr.view is not None and hdr.digest is not None:
            m.responses[src] = (hdr.view, hdr.digest)
        if not m.waiting and self.local_address in m.responses:
            self._finish_merge()

    def _finish_merge(self) -> None:
        m = self.merge
        assert m is not None
        me = self.local_address
        others = sorted(c for c in m.responses if c != me)
        if me not in m.responses or not others:
            self._abort_merge()
            return
        members: list[Address] = list(m.responses[me][0].members)
        seen = set(members)
        digest = Digest({})
        seq = self.max_seq
        for c in [me, *others]:
            view, dig = m.responses[c]
            seq = max(seq, view.view_id.seq)
            for x in view.members:
                if x not in seen:
                    seen.add(x)
                    members.append(x)
            digest = digest.union(Digest({x: dig[x] for x in view.members if x in dig}))
        subgroups = tuple(m.responses[c][0].members for c in [me, *others])
        merged = View(ViewId(seq + 1, me), tuple(members), subgroups)
        self.count("merges_led")
        for c in others:
            self._send(c, GmsHeader(INSTALL_MERGE_VIEW, merge_id=m.merge_id, view=merged, digest=digest))
        self._cast_view(merged, digest)
        m.flushed = False  # the merged view unblocks our subgroup
        self._end_merge()

    def _abort_merge(self) -> None:
        """Give up a merge; as leader, tell the coordinators that answered, whose subgroups may be blocked."""
        m = self.merge
        if m is not None and m.leader == self.local_address:
            for c in sorted(m.responses):
                if c != self.local_address:
                    self._send(c, GmsHeader(CANCEL_MERGE, merge_id=m.merge_id))
        self.count("merges_aborted")
        self._end_merge()

    def _end_merge(self) -> None:
        m, self.merge = self.merge, None
        self.cancel_timer("merge")
        if self.flushing is not None and self.flush_for_merge:
            # Our subgroup flush is still running: when it completes, _merge_flushed installs a view.
            return
        if m is not None and m.flushed:
            # We flushed our subgroup but no merged view came: its members are blocked until a view arrives.
            self.flush_ready = True
            self._process_queue()
        elif self.queue and not self.ctx.has_timer("bundle"):
            self.set_timer("bundle", self.config.view_bundling)

    # -- timers --------------------------------------------------------------------------------------
    def on_timer(self, key: object) -> None:  # noqa: C901  one case per timer
        if key == "bundle":
            self._process_queue()
        elif key == "ack":
            self._finish_pending()
        elif key == "flush":
            if self.flushing is not None:
                self.count("flush_guard_timeouts")
                self.flushing = None
                if self.flush_for_merge:
                    self._merge_flush_failed()
                else:
                    self._process_queue()
        elif key == "orphan":
            view = self.view
            if view is not None and self.state == "member" and view.coordinator in self.suspects:
                self._continue_alone("orphaned", "coordinator suspected and no new view came")
        elif key in ("join", "rediscover"):
            if self.state == "joining":
                self._discover()
        elif key == "leave":
            if self.state != "leaving" or self.view is None:
                return
            self.leave_attempts += 1
            if self.leave_attempts > self.config.max_leave_attempts:
                self._left("leave timed out")
                return
            alive = [m for m in self.view.members if m not in self.suspects and m != self.local_address]
            if alive:
                self._send(alive[0], GmsHeader(LEAVE_REQ))
            self.set_timer("leave", self.config.leave_timeout)
        elif key == "merge":
            m = self.merge
            if m is not None and m.leader == self.local_address:
                self._finish_merge()  # with the subgroups that answered, or aborted if we are not ready
            else:
                self._end_merge()

    def describe_state(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "view": None if self.view is None else str(self.view),
            "coordinator": self.is_coordinator,
            "suspects": sorted(map(str, self.suspects)),
            "merging": self.merge is not None,
        }
