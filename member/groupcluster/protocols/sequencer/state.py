"""SEQUENCER's configuration and state: every field of the layer, shared by the roles it is built of (forwarding,
member, coordinator, view sync), and the helpers they all use."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, Final

from ...core.address import Address
from ...core.config import param
from ...core.layer import Layer
from ...core.message import Message
from ...core.validate import as_address
from ...core.view import View, ViewId
from .wire import _PID, BatchId, Item, Run, SequencerHeader

_MAX_ADDRESSES: Final = 8192  # interned origin addresses


@dataclass(frozen=True)
class SequencerConfig:
    max_batch_size: int = param(
        "48KiB",
        "size",
        doc="largest FORWARD or BCAST payload: what one step forwards or sequences travels together up to this "
        "size (a single larger message travels alone; keep it below the transport's max_frame_size)",
        minimum=1024,
    )
    ack_interval: float = param(
        "100ms",
        "duration",
        doc="a member re-acknowledges received batches this often while they are not committed yet",
        minimum=0.001,
    )
    sync_retry: float = param(
        "500ms",
        "duration",
        doc="a new coordinator asks members for their SYNC again after this long (and a member whose forward "
        "window stayed full this long without progress forwards again)",
        minimum=0.001,
    )
    max_queued: int = param(
        "16MiB",
        "size",
        doc="bytes of own multicasts not delivered yet (e.g. sent before joining) before Backpressure(True)",
        minimum=1,
    )
    forward_window: int = param(
        500,
        "int",
        doc="messages a member forwards to the coordinator that it has not seen sequenced yet; the rest waits in the "
        "forward-table. Small enough that the coordinator's input stays short: a member's ACKs travel behind its "
        "FORWARDs, and with everything forwarded at once no batch could commit before the coordinator had read it all "
        "(messages, not bytes: the coordinator's work is per message; flow control bounds the bytes)",
        minimum=1,
    )
    max_stray: int = param(
        "16MiB",
        "size",
        doc="bytes of forwarded messages kept while we are not (yet) the coordinator their sender believes we are",
        minimum=0,
    )
    leave_timeout: float = param(
        "2s", "duration", doc="a leaving member waits this long for its own multicasts to be delivered"
    )


class _Batch:
    """A received batch: its identity (original epoch, seq), its payload as sequenced, its decoded runs."""

    __slots__ = ("ident", "raw", "runs")

    def __init__(self, ident: BatchId, raw: bytes, runs: list[Run]) -> None:
        self.ident = ident
        self.raw = raw
        self.runs = runs


class _Sync:
    """A coordinator's collection of SYNCs for one epoch."""

    __slots__ = ("batches", "epochs", "forwards", "fwd_seqs", "gaps", "parts", "totals", "waiting")

    def __init__(self, waiting: set[Address]) -> None:
        self.waiting = waiting
        self.parts: dict[Address, set[int]] = {}
        self.totals: dict[Address, int] = {}
        self.batches: dict[BatchId, _Batch] = {}
        self.epochs: dict[Address, set[ViewId]] = {}
        self.forwards: dict[Address, list[tuple[int, list[Any]]]] = {}
        self.fwd_seqs: dict[Address, int] = {}  # each member's highest forward seqno when it synced
        # Per sender, the forward seqnos some member skipped past and can no longer deliver (see
        # ViewSync._maybe_open), as (first, last) ranges.
        self.gaps: dict[Address, list[tuple[int, int]]] = {}


class SequencerState(Layer):
    """The layer's fields, by the role that mostly uses them; :class:`~.layer.Sequencer` is built on this."""

    def __init__(self, config: SequencerConfig, ctx: Any) -> None:
        super().__init__(config, ctx)
        self._max_batch = config.max_batch_size
        self.view: View | None = None
        self.left = False
        self._addresses: dict[tuple[Any, ...], Address] = {}
        # -- every member --------------------------------------------------------------------------------
        self.epoch: ViewId | None = None
        self.coord: Address | None = None
        self.epochs_seen: dict[ViewId, None] = {}  # insertion-ordered, bounded
        self.recv_high = 0  # highest batch seq of the current epoch received without a gap
        self.cur: dict[int, _Batch] = {}  # current epoch: received, not delivered, by seq
        self.commit_known = 0  # highest committed seq of the current epoch we know of
        self.delivered_seq = 0  # highest seq of the current epoch delivered (or skipped)
        self.acked = 0  # highest seq acknowledged to the coordinator
        # Received but not delivered, by original identity, across epochs (what a SYNC reports).
        self.pending: dict[ViewId, dict[int, _Batch]] = {}
        self.delivered_in: dict[ViewId, int] = {}  # per original epoch: highest batch seq delivered
        # The received-table: per original sender in our view, the highest forward seqno delivered; senders
        # outside it are in ``retired`` (see _retire_senders), least recently delivered first.
        self.high: dict[Address, int] = {}
        self.retired: dict[Address, int] = {}
        self.members: frozenset[Address] = frozenset()
        # Per sender, the forward seqnos we skipped past (delivered later ones first, e.g. after a merge, while the
        # other side delivered these): below our received-table entry, yet never delivered. Announced in our SYNC
        # so that a replay leaves them out for everyone (see ViewSync._maybe_open). Bounded.
        self.gaps: dict[Address, list[tuple[int, int]]] = {}
        # We joined a group (not a merge) and none of our own multicasts was delivered yet: what we skip until then
        # was sequenced before our first one (STATE's request, on the preset), and the state we take holds it.
        self.grouped = False
        self.joining = False
        self.fwd_seq = 0
        # Own multicasts not delivered yet, in forward-seqno order: fwd_table[i] has seqno fwd_first + i. Their
        # seqnos are contiguous (only delivery removes them, from the front), so a deque does: a dict popped at
        # its front rescans its deleted slots on every next(iter()), quadratic in what is in flight.
        self.fwd_table: deque[Any] = deque()
        self.fwd_first = 1
        self.fwd_bytes = 0
        # Own multicasts not forwarded yet: out_items[out_pos:], the first with forward seqno out_start. What the
        # window lets go leaves by moving out_pos (the list is compacted once most of it went), so a backlog of
        # thousands waiting for the window is not copied on every forward. Empty when nothing waits.
        self.out_start = 0
        self.out_pos = 0
        # The forward window: FORWARDs sent in this epoch and not seen sequenced yet, as (last forward seqno,
        # messages), their messages in all, and the highest own forward seqno seen in a BCAST.
        self.fwd_flight: deque[tuple[int, int]] = deque()
        self.fwd_inflight = 0
        self.fwd_seen = 0
        self.fwd_seen_at_timer = 0  # fwd_seen when the "window" timer was set (see on_timer)
        self.out_items: list[Any] = []
        # At the coordinator: the same messages decoded, taken from the messages themselves (our own need no
        # header objects built from their wire forms when our BCAST comes back).
        self.out_decoded: list[Item] = []
        self.blocked = False
        self.sync_parts: list[tuple[SequencerHeader, bytes]] = []  # our SYNC for the current epoch
        self.leave_pending = False
        self.sync_due = False  # our SYNC for the current epoch is to be sent at the end of the step
        self.open_due = False  # as coordinator: see whether the sync is complete at the end of the step
        self._late: list[Message] = []  # deliveries made outside an up() call
        self._out: list[Message] | None = None
        # Fragments of a message (FRAG, above) are delivered together once all are committed: if a view
        # change splits them, the rest comes by replay after the view, and FRAG, which forgets partial
        # messages of senders that left the view, must get them in one piece.
        self.fragments: dict[tuple[Address, int], list[Message]] = {}
        self.fragment_bytes = 0
        # -- coordinator ---------------------------------------------------------------------------------
        self.is_coord = False
        self.sync: _Sync | None = None
        self.open = False  # epoch synced: new messages are sequenced
        # A FLUSH above holds this member's delivery for the view change: as coordinator, sequence and commit
        # nothing more in this epoch (see _freeze); a release before the view (the round was superseded or
        # abandoned) resumes at the end of the step.
        self.frozen = False
        self.thaw_due = False
        self.next_seq = 0
        self.acks: dict[Address, int] = {}
        self.commit = 0
        self.commit_sent = 0
        self.seq_high: dict[Address, int] = {}  # per origin: highest forward seqno sequenced in this epoch
        # The batch being filled: runs [origin wire, start, items, the same items decoded] (packed without the
        # last, which our own delivery of the batch uses).
        self._runs: list[list[Any]] = []
        self._run_origin: Address | None = None
        self._run_next = 0
        self._batch_bytes = 0
        self._ready: list[list[list[Any]]] = []  # full batches waiting for the end of the step
        self._own_runs: dict[int, list[list[Any]]] = {}  # batches we multicast, by seq, until loopback brings them
        self.queue: list[tuple[Address, int, list[Any]]] = []  # forwards received while syncing
        self.strays: list[tuple[Address, int, list[Any], int]] = []  # forwards received while not coordinator
        self.stray_bytes = 0
        self.future_syncs: dict[Address, tuple[ViewId, list[tuple[SequencerHeader, bytes]]]] = {}
        # Forwards that arrived after a gap in their sender's forward seqnos (some were lost on the way, e.g.
        # while we were not coordinator yet): held until the sender resent the missing ones.
        self.held: dict[Address, list[tuple[int, list[Any]]]] = {}
        self.held_bytes = 0

    # -- helpers -------------------------------------------------------------------------------------------
    def _address(self, wire: Any, field: str) -> Address:
        key = tuple(wire) if type(wire) is list else None
        if key is not None:
            addr = self._addresses.get(key)
            if addr is not None:
                return addr
        addr = as_address(wire, field)
        if len(self._addresses) >= _MAX_ADDRESSES:
            self._addresses.clear()
        self._addresses[(addr.host, addr.port, addr.incarnation)] = addr
        return addr

    def _send(self, dest: Address | None, hdr: SequencerHeader, payload: bytes = b"", flags: int = 0) -> None:
        self.below.down(Message(dest, payload, flags=flags, headers={_PID: hdr}))

    def _emit(self, msgs: list[Message]) -> None:
        if self._out is not None:
            self._out.extend(msgs)
        else:
            self._late.extend(msgs)
