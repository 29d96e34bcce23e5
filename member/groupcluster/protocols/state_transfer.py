"""STATE: non-blocking state transfer — a joiner gets the application state from a member, at a consistent cut.

The layer sits at the top of the stack. It has three jobs:

**Numbering.** Every reliable multicast the application sends is stamped with a small header carrying the
sender's *state sequence number* (1, 2, ... per sender incarnation). Every receiver therefore knows the
absolute position of each delivered multicast in its sender's stream, whatever the layers below did
(fragmentation, a sequencer that re-multicasts under its own seqnos, a joiner's NAKACK that starts in the
middle of each stream). Each member keeps ``delivered[sender]``: the highest number it passed to the
application.

**Donor.** A joiner asks for the state with a REQ *multicast* naming the donor: it travels in the same
ordered stream as the application's multicasts. Where the donor delivers it, it emits :class:`GetState` to the
application — after every multicast it delivered before the request, before any after it — and records its
vector ``delivered`` at that point (the *cut*). The driver answers synchronously with :class:`StateSnapshot`
(the application's bytes, taken before it handles any later output). The donor streams the bytes as
STATE_CHUNKs over reliable unicast, at most ``window`` chunks unacknowledged; the cut travels in chunk 0.
Multicasting the request is what makes the cut consistent on every stack: whatever the donor still had to
deliver from before the joiner's view (a flush's leftovers, a sequencer's replay of an earlier epoch, which
the joiner never receives) comes before the request, so it is in the state. A request also carries the
joiner's *floors* (below); if the donor's cut is below them it waits, after the request, until its delivery
reaches them, so a donor that is behind the joiner sends a state that covers what the joiner lacks.

**Joiner.** After :class:`RequestState` from the application, the member holds everything that would go up
to the application — multicast deliveries and view changes, in order — from its first view on, and asks a
donor (the coordinator by default, else the next member) for the state. For each sender it records a *floor*:
the number just below the first multicast it holds from that sender (raised when it has to drop held
messages, see ``max_buffered``); every multicast at or below a floor must be in the state. When the last
chunk arrives the state is acceptable iff ``cut[s] >= floor[s]`` for every sender ``s`` still in the view;
then it emits :class:`SetState`, and replays what it held: a held multicast numbered at or below the cut is
already in the state and goes up as :class:`StateCovered` (recorders note it; the application does not apply
it again), the rest as normal deliveries, view changes in between at their place. From then on it delivers
normally (a late message at or below the cut still counts as covered). A stale state (a floor above the
cut) is asked for again after ``retry_delay``; a donor that refuses, crashes, leaves the view or makes no
progress for ``request_timeout`` is replaced by the next member. A member whose first view holds only itself
founded the group: it gets ``SetState(None)`` at once.

Why no flush: the group never stops. The cut is a point in the donor's own delivery stream, and per-sender
numbering maps it onto the joiner's stream exactly (what the joiner holds either is in the state or comes
after it), so nobody has to be quiet while the state is taken. With virtual synchrony (the ``vsync`` stack)
the joiner holds only messages of its first view and later, and the donor installed that view before it
answers (it refuses requesters outside its view), so the cut is never stale; on stacks without flush a stale
cut is detected through the floors and re-requested.

Everything a peer can make us allocate is bounded: the announced state size (``max_state_size``), the chunk
count (:data:`MAX_CHUNKS`), vectors and floors (:data:`MAX_VECTOR`), the held messages (``max_buffered`` bytes
and ``max_buffered_messages``; beyond them held multicasts are dropped, their floors raised, and the state —
which will contain them — makes up for it) and concurrent donor transfers (``max_transfers``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..core import protocol_ids
from ..core.address import Address
from ..core.config import param
from ..core.errors import WireError
from ..core.events import Event, Left, Suspect, ViewChange
from ..core.layer import Layer, register_layer
from ..core.message import NO_FLOW_CONTROL, NO_RELIABILITY, Header, Message, register_header
from ..core.validate import MAX_INT, as_address, as_int, as_list, as_str
from ..core.view import View

_PID = protocol_ids.STATE
DATA, REQ, CHUNK, ACK, REFUSE = 0, 1, 2, 3, 4
KIND_NAMES = ("DATA", "REQ", "CHUNK", "ACK", "REFUSE")
# Most chunks one transfer may announce, and most entries in a cut vector or a floor list.
MAX_CHUNKS = 1 << 24
MAX_VECTOR = 4096
MAX_REASON = 256

Vector = dict[Address, int]
# A cut: per sender, the highest number applied and the ranges below it that were never applied (a sender's
# multicasts made while it was apart from us: per-sender streams have holes across partitions and merges).
Gaps = tuple[tuple[int, int], ...]
Cut = dict[Address, tuple[int, Gaps]]
MAX_GAPS = 64  # holes remembered per sender; older ones are forgotten (counted as applied)
TransferId = tuple[Address, int]  # (joiner, joiner's request counter)


# ---- events -------------------------------------------------------------------------------------------------
# They live here, not in core.events, because only this layer and its drivers use them.


@dataclass(frozen=True, slots=True)
class RequestState(Event):
    """Down, from the application: fetch the group's state once joined (``donor`` None: the coordinator)."""

    donor: Address | None = None


@dataclass(frozen=True, slots=True)
class GetState(Event):
    """Up, to the application (donor side): answer at once with :class:`StateSnapshot` for ``transfer``.

    The state must be the one reached after every delivery output before this event and none after it.
    """

    transfer: TransferId


@dataclass(frozen=True, slots=True)
class StateSnapshot(Event):
    """Down, from the application: the state asked for by :class:`GetState` (``b""`` if it keeps none)."""

    transfer: TransferId
    state: bytes


@dataclass(frozen=True, slots=True)
class SetState(Event):
    """Up, to the application (joiner side): replace your state with ``state``; deliveries that follow continue
    from it. ``state`` is None (and ``donor`` None) for the member that founded the group: it starts empty."""

    state: bytes | None
    donor: Address | None
    transfer: TransferId | None = None


@dataclass(frozen=True, slots=True)
class StateCovered(Event):
    """Up (joiner side): multicasts received that the transferred state already contains — not to be applied
    again. Recorders count them as delivered through the state, at this position of the stream."""

    messages: list[Message]


# ---- header -------------------------------------------------------------------------------------------------


def _vector_to_wire(vec: Vector) -> list[Any]:
    return [[a.to_wire(), s] for a, s in vec.items()]


def _vector_from_wire(data: Any, field: str) -> Vector:
    out: Vector = {}
    for i, item in enumerate(as_list(data, field, MAX_VECTOR)):
        pair = as_list(item, f"{field}[{i}]", 2, exact=2)
        addr = as_address(pair[0], f"{field}[{i}].member")
        if addr in out:
            raise WireError(f"{field}[{i}]: member {addr} appears twice")
        out[addr] = as_int(pair[1], f"{field}[{i}].seq")
    return out


def _cut_to_wire(cut: Cut) -> list[Any]:
    return [[a.to_wire(), top, [list(g) for g in gaps]] for a, (top, gaps) in cut.items()]


def _cut_from_wire(data: Any, field: str) -> Cut:
    out: Cut = {}
    for i, item in enumerate(as_list(data, field, MAX_VECTOR)):
        parts = as_list(item, f"{field}[{i}]", 3, exact=3)
        addr = as_address(parts[0], f"{field}[{i}].member")
        if addr in out:
            raise WireError(f"{field}[{i}]: member {addr} appears twice")
        top = as_int(parts[1], f"{field}[{i}].seq")
        gaps: list[tuple[int, int]] = []
        prev = 0
        for k, g in enumerate(as_list(parts[2], f"{field}[{i}].gaps", MAX_GAPS)):
            lo, hi = as_list(g, f"{field}[{i}].gaps[{k}]", 2, exact=2)
            # Sorted, disjoint, below the highest seq (which was applied): anything else is malformed.
            lo = as_int(lo, f"{field}[{i}].gaps[{k}].lo", prev + 1, top - 1)
            hi = as_int(hi, f"{field}[{i}].gaps[{k}].hi", lo, top - 1)
            gaps.append((lo, hi))
            prev = hi + 1
        out[addr] = (top, tuple(gaps))
    return out


def covers(cut: Cut, src: Address, seq: int) -> bool:
    """Whether the state with cut ``cut`` contains multicast ``seq`` of ``src``."""
    entry = cut.get(src)
    if entry is None or seq > entry[0]:
        return False
    return not any(lo <= seq <= hi for lo, hi in entry[1])


_new_header = object.__new__


@register_header
class StateHeader(Header):
    """DATA(seq) on every application multicast; REQ (a multicast marker naming the donor) and CHUNK / ACK /
    REFUSE (reliable unicasts) for a transfer.

    Wire forms: DATA ``[0, seq]``; REQ ``[1, tid, donor, floors]``; CHUNK ``[2, tid, index, count, total, cut|nil]``
    (the chunk's bytes are the payload; the cut only on chunk 0); ACK ``[3, tid, next_index]``;
    REFUSE ``[4, tid, reason]``.
    """

    PROTO_ID = protocol_ids.STATE
    # Every application multicast carries a DATA header, so DATA is made cheap: only ``kind`` and ``seq`` are
    # slots; the fields of the rare transfer headers live in the instance dict, their defaults on the class.
    __slots__ = ("__dict__", "kind", "seq")
    count = 0
    cut: Cut | None = None
    donor: Address | None = None
    index = 0
    reason = ""
    tid = 0
    total = 0
    vector: Vector | None = None

    def __init__(
        self,
        kind: int,
        seq: int = 0,
        *,
        tid: int = 0,
        index: int = 0,
        count: int = 0,
        total: int = 0,
        vector: Vector | None = None,
        reason: str = "",
        donor: Address | None = None,
        cut: Cut | None = None,
    ) -> None:
        self.kind = kind
        self.seq = seq
        if kind != DATA or tid or index or count or total or vector is not None or reason or donor is not None:
            self.donor = donor
            self.tid = tid
            self.index = index
            self.count = count
            self.total = total
            self.vector = vector
            self.reason = reason
        if cut is not None:
            self.cut = cut

    def to_wire(self) -> list[Any]:
        kind = self.kind
        if kind == DATA:
            return [DATA, self.seq]
        if kind == REQ:
            assert self.donor is not None
            return [REQ, self.tid, self.donor.to_wire(), _vector_to_wire(self.vector or {})]
        if kind == CHUNK:
            cut = None if self.cut is None else _cut_to_wire(self.cut)
            return [CHUNK, self.tid, self.index, self.count, self.total, cut]
        if kind == ACK:
            return [ACK, self.tid, self.index]
        return [REFUSE, self.tid, self.reason]

    @classmethod
    def from_wire(cls, data: Any) -> StateHeader:
        if type(data) is list and len(data) == 2:
            kind, seq = data
            if type(kind) is int and kind == DATA and type(seq) is int and 1 <= seq <= MAX_INT:
                # DATA, on every multicast: checked and built without the general path's calls.
                hdr = _new_header(cls)
                hdr.kind = DATA
                hdr.seq = seq
                return hdr
        items = as_list(data, "state", 6)
        kind = as_int(items[0] if items else None, "state.kind", 0, len(KIND_NAMES) - 1)
        want = (2, 4, 6, 3, 3)[kind]
        if len(items) != want:
            raise WireError(f"state: {KIND_NAMES[kind]} needs {want} fields, got {len(items)}")
        if kind == DATA:
            return cls(DATA, as_int(items[1], "state.seq", 1, MAX_INT))
        tid = as_int(items[1], "state.tid", 0, MAX_INT)
        if kind == REQ:
            donor = as_address(items[2], "state.donor")
            return cls(REQ, tid=tid, donor=donor, vector=_vector_from_wire(items[3], "state.floors"))
        if kind == CHUNK:
            count = as_int(items[3], "state.count", 1, MAX_CHUNKS)
            index = as_int(items[2], "state.index", 0, count - 1)
            total = as_int(items[4], "state.total", 0, MAX_INT)
            if items[5] is None:
                if index == 0:
                    raise WireError("state: CHUNK 0 without the cut")
                cut = None
            else:
                if index != 0:
                    raise WireError(f"state: CHUNK {index} carries a cut (only chunk 0 does)")
                cut = _cut_from_wire(items[5], "state.cut")
            return cls(CHUNK, tid=tid, index=index, count=count, total=total, cut=cut)
        if kind == ACK:
            return cls(ACK, tid=tid, index=as_int(items[2], "state.next_index", 0, MAX_CHUNKS))
        return cls(REFUSE, tid=tid, reason=as_str(items[2], "state.reason", MAX_REASON))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, StateHeader) and other.to_wire() == self.to_wire()

    def __hash__(self) -> int:
        return hash((self.kind, self.seq, self.tid, self.index))

    def __repr__(self) -> str:
        if self.kind == DATA:
            return f"StateHeader(DATA {self.seq})"
        return f"StateHeader({KIND_NAMES[self.kind]} tid={self.tid} index={self.index}/{self.count})"


# ---- configuration ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StateConfig:
    chunk_size: int = param(
        "56KiB",
        "size",
        doc="bytes of state per chunk (the default fits FRAG's default frag_size: one chunk, one message)",
        minimum=1,
    )
    window: int = param(8, "int", doc="chunks a donor has sent and not yet seen acknowledged", minimum=1)
    request_timeout: float = param(
        "5s",
        "duration",
        doc="joiner: a donor silent this long (no chunk) is replaced by the next member; donor: a transfer "
        "without an ack (or a request it waits on) this long is dropped",
    )
    retry_delay: float = param("200ms", "duration", doc="pause before asking again after a refusal or a stale state")
    max_state_size: int = param("1GiB", "size", doc="largest state a joiner accepts (it allocates that much)")
    max_buffered: int = param(
        "64MiB", "size", doc="payload bytes a joiner holds while it waits for the state; beyond, held ones drop"
    )
    max_buffered_messages: int = param(
        200_000, "int", doc="multicasts a joiner holds while it waits for the state; beyond, held ones drop", minimum=1
    )
    max_transfers: int = param(4, "int", doc="transfers a donor serves at once; more are refused", minimum=1)


# ---- state of one transfer --------------------------------------------------------------------------------


@dataclass
class _Outgoing:
    """Donor side: one snapshot being streamed to a joiner."""

    joiner: Address
    tid: int
    cut: Cut
    data: bytes = b""
    count: int = 0
    next_index: int = 0  # next chunk to send
    acked: int = 0  # chunks the joiner has (cumulative)
    last_progress: float = 0.0
    ready: bool = False  # the application answered GetState


@dataclass
class _Waiting:
    """Donor side: a request whose floors our own cut has not reached yet."""

    joiner: Address
    tid: int
    floors: Vector
    since: float


@dataclass
class _Incoming:
    """Joiner side: the transfer in progress."""

    donor: Address
    tid: int
    cut: Cut | None = None
    buf: bytearray | None = None
    count: int = 0
    total: int = 0
    next_index: int = 0
    offset: int = 0


IDLE, WANTED, FETCHING, DONE = "idle", "wanted", "fetching", "done"
# Left the group before the state came: nothing delivered from now on can apply to a state we never had.
ABANDONED = "abandoned"
FRESH, COVERED, DUPLICATE = "fresh", "covered", "duplicate"
NO_STATE_YET = "I have no state yet"


@register_layer
class StateTransfer(Layer):
    NAME = "state"
    PROTO_ID = protocol_ids.STATE
    Config = StateConfig

    def __init__(self, config: StateConfig, ctx: Any) -> None:
        super().__init__(config, ctx)
        self.next_seq = 0
        self.delivered: Vector = {}
        self.missing: dict[Address, list[list[int]]] = {}  # per sender: [lo, hi] ranges never applied, sorted
        self.view: View | None = None
        self.suspects: set[Address] = set()
        # Joiner.
        self.phase = IDLE
        self.preferred_donor: Address | None = None
        self.incoming: _Incoming | None = None
        self.tid_counter = 0
        self.tried: list[Address] = []  # donors asked in this round, to move on to the next one
        self.stateless: set[Address] = set()  # members that refused in this round because they fetch too
        self.floors: Vector = {}
        self.held: list[Any] = []  # list[Message] batches and Event objects, in the order they came up
        self.held_messages = 0
        self.held_bytes = 0
        self.cut: Cut = {}  # the cut of the state we set: later messages it contains are covered
        self.ack_due = False
        # Donor.
        self.outgoing: dict[Address, _Outgoing] = {}
        self.waiting: dict[Address, _Waiting] = {}
        self.snapshot_due: list[_Outgoing] = []

    # -- down: numbering -------------------------------------------------------------------------------
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

    # -- up: traffic -----------------------------------------------------------------------------------
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
        for k, msg in enumerate(batch):
            hdr: StateHeader | None = msg.headers.get(_PID)
            if hdr is None or hdr.kind != DATA:
                if hdr is not None:
                    if out is None:
                        out = batch[:k]
                    if hdr.kind != REQ:
                        self._control(msg.src, hdr, msg)  # type: ignore[arg-type]
                        holding = self.phase == FETCHING  # the last chunk ends the holding mid-batch
                    elif hdr.donor == self.local_address and msg.src != hdr.donor:
                        # The cut is here: what came before the request in the stream goes up first.
                        self._pass_up(out, covered)
                        out, covered = [], []
                        self._on_req(msg.src, hdr)  # type: ignore[arg-type]
                elif out is not None:
                    if covered:
                        self._pass_up([], covered)
                        covered = []
                    out.append(msg)
                continue
            src = msg.src
            seq = hdr.seq
            if holding:
                if out is None:
                    out = batch[:k]
                self._hold(src, seq, msg)  # type: ignore[arg-type]
                continue
            if seq == delivered.get(src, 0) + 1:  # type: ignore[arg-type]
                delivered[src] = seq  # type: ignore[index]
                if out is not None:
                    if covered:
                        self._pass_up([], covered)
                        covered = []
                    out.append(msg)
                continue
            verdict = self._apply(src, seq)  # type: ignore[arg-type]
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
        # At most one of the two is not empty here: each one went up when the other kind followed it.
        self._pass_up(batch if out is None else out, covered)
        if self.waiting:
            self._check_waiting()

    def _apply(self, src: Address, seq: int) -> str:
        """Account for multicast ``seq`` of ``src`` off the fast path: FRESH (deliver it), COVERED (our state
        has it) or DUPLICATE."""
        last = self.delivered.get(src, 0)
        if seq > last:
            if seq > last + 1:
                # A hole: multicasts the sender made while apart from us (or before we joined).
                holes = self.missing.setdefault(src, [])
                holes.append([last + 1, seq - 1])
                if len(holes) > MAX_GAPS:
                    del holes[0]
                    self.count("gaps_forgotten")
            self.delivered[src] = seq
            return FRESH
        gaps = self.missing.get(src)
        if gaps:
            for i, (lo, hi) in enumerate(gaps):
                if lo <= seq <= hi:
                    # One the state did not have, delivered late (e.g. held while the state was on its way).
                    parts = [r for r in ([lo, seq - 1], [seq + 1, hi]) if r[0] <= r[1]]
                    gaps[i : i + 1] = parts
                    if not gaps:
                        del self.missing[src]
                    return FRESH
        if covers(self.cut, src, seq):
            return COVERED
        self.count("duplicates_dropped")
        return DUPLICATE

    def _snapshot_cut(self) -> Cut:
        missing = self.missing
        return {s: (top, tuple((lo, hi) for lo, hi in missing.get(s, ()))) for s, top in self.delivered.items()}

    def _pass_up(self, msgs: list[Message], covered: list[Message]) -> None:
        if covered:
            self.count("covered", len(covered))
            self.above.up_event(StateCovered(covered))
        if msgs:
            self.above.up(msgs)

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

    # -- joiner ------------------------------------------------------------------------------------------
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

    # -- donor -------------------------------------------------------------------------------------------
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

    # -- timers ------------------------------------------------------------------------------------------
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

    def _send(self, dest: Address, hdr: StateHeader) -> None:
        self.below.down(Message(dest, flags=NO_FLOW_CONTROL, headers={_PID: hdr}))

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
