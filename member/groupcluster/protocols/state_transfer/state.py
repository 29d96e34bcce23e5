"""STATE's configuration and state: every field of the layer, shared by its two roles (joiner and donor), and
the per-sender accounting both use (which multicasts were applied, the holes, what a cut covers)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...core.address import Address
from ...core.config import param
from ...core.layer import Layer
from ...core.message import NO_FLOW_CONTROL, Message
from ...core.view import View
from .events import StateCovered
from .wire import _PID, MAX_GAPS, Cut, StateHeader, Vector, covers


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


class StateTransferState(Layer):
    """The layer's fields and the helpers both roles use; :class:`~.layer.StateTransfer` is built on this."""

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

    def _send(self, dest: Address, hdr: StateHeader) -> None:
        self.below.down(Message(dest, flags=NO_FLOW_CONTROL, headers={_PID: hdr}))
