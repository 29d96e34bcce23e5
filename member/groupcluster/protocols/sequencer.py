"""SEQUENCER: total order through the coordinator (seed 004), uniform, batched, resynchronised on every view.

A member does not multicast its application messages itself: it forwards them (reliable unicast, through
UNICAST below) to the coordinator of its view, each tagged with its own *forward seqno*; the coordinator
multicasts them (through NAKACK below: one reliable FIFO stream from one sender is a total order) in
*batches*, and every member delivers them in that order with ``msg.src`` set to the original sender. What a
member forwarded stays in its *forward-table* until it delivered it; a per-sender *received-table* (highest
forward seqno delivered) discards copies that come back after a failover; entries of senders that left the view
are kept aside, bounded, for when they or their old batches return. Messages with ``NO_RELIABILITY`` and
unicasts pass straight through.

Batching is what makes it cheap: everything a member multicasts in one driver step travels to the
coordinator as one FORWARD message (up to ``max_batch_size``), and everything the coordinator sequences in
one step leaves as one BCAST. A batch is a msgpack list of *runs* ``[origin, first forward seqno, items]``,
an item being the payload bytes (or ``[flags, headers, payload]`` when upper layers, e.g. FRAG, added
headers), so the per-message cost is a few bytes and no header object.

Where this goes beyond seed 004, and why (``docs/total-order.md`` has the argument in full):

* **Epochs.** Every view is an epoch, named by its view id; batches are numbered 1, 2, ... per epoch and a
  member accepts BCASTs only from its current view's coordinator for its current view id.
* **Uniform delivery.** A member delivers batch k only when the coordinator *committed* it, i.e. every member
  of the view acknowledged receiving it (ACK, cumulative, unreliable and repeated; COMMIT rides on the next
  BCAST or goes alone, reliably). So whatever any member delivered - the coordinator included, even if it
  crashes a moment later - every other member of that view holds too, and the survivors can finish it in the
  same order. Without this, seed 004's design lets a crashed coordinator deliver messages that the survivors
  later deliver in another order (members resend them in arbitrary interleavings).
* **Sync on every view change** (a small flush, done by the sequencer itself). Each member sends the new
  coordinator a SYNC: the batches it received but has not delivered yet (by their original identity: the
  epoch that sequenced them and their number there), its forward-table, and the epochs it has been in. The
  coordinator waits for every member's SYNC (members that never send one are removed by the next view, which
  restarts the sync), then re-multicasts the union of those batches in (epoch, number) order, then the
  forward-tables' messages, then new traffic. A replayed batch is delivered by every member of the view that
  has not delivered it (members of its epoch skip it by number, others drop what their received-table has):
  a member that skipped it could deliver its messages later in another position, when their sender, absent
  from this view, forwards them again. A forwarded message that a replay delivers to its sender is not
  sequenced a second time.

* **Gaps.** A member's SYNC announces its highest forward seqno, so the coordinator knows where its next
  FORWARD must start; one that starts later (forwards were lost, e.g. while the receiver was not coordinator
  yet) is held and the sender asked to RESEND from the first missing seqno.
* **Fragments** of one message (FRAG is above us) are delivered together once all are committed: when a view
  change splits them, the rest comes by replay after the view, and FRAG forgets partial messages of senders
  outside the new view.

Multicasts sent before the first view wait in the forward-table and travel with the first SYNC; more than
``max_queued`` bytes of undelivered own multicasts raise ``Backpressure(True)``. A graceful leave waits (up to
``leave_timeout``) until the member's own multicasts were delivered.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from itertools import islice
from typing import Any

import msgpack

from ..core import protocol_ids
from ..core.address import Address
from ..core.config import param
from ..core.errors import WireError
from ..core.events import Backpressure, Disconnect, Event, FlushHold, FlushRelease, Left, ViewChange
from ..core.layer import Layer, register_layer
from ..core.message import ALL_FLAGS, HEADER_TYPES, NO_RELIABILITY, Header, Message, register_header
from ..core.validate import MAX_INT, as_address, as_bytes, as_int, as_list
from ..core.view import View, ViewId

FORWARD, BCAST, COMMIT, ACK, SYNC, SYNC_REQ, RESEND = 0, 1, 2, 3, 4, 5, 6
KIND_NAMES = ("FORWARD", "BCAST", "COMMIT", "ACK", "SYNC", "SYNC_REQ", "RESEND")
_PID = protocol_ids.SEQUENCER
_FRAG = protocol_ids.FRAG

# Bounds on what a peer can make us allocate (a batch also fits in one frame: the transport limits that).
MAX_RUNS = 65536
MAX_ITEMS = 1 << 20
MAX_HEADERS = 16
MAX_SYNC_PARTS = 1 << 20
MAX_EPOCHS = 1024  # epochs remembered per member (and announced in a SYNC)
_ITEM_OVERHEAD = 8  # rough msgpack bytes per item, for cutting batches
_MAX_FUTURE_SYNCS = 4096  # senders whose SYNC for a view we have not installed yet is kept
_MAX_ADDRESSES = 8192  # interned origin addresses
_MAX_OWN_RUNS = 1024  # own batches awaiting their loopback (it comes in the same step: a bound, not a need)
_MAX_RETIRED = 4096  # received-table entries of senders outside our view (see _retire_senders), as NAKACK's
_new_message = object.__new__

BatchId = tuple[ViewId, int]
# A decoded item: payload bytes (no flags, no headers), or (flags, headers, payload).
Item = Any
Run = tuple[Address, int, list[Item]]


@register_header
class SequencerHeader(Header):
    """FORWARD | BCAST(epoch, seq, commit, replay) | COMMIT(epoch, commit) | ACK(epoch, seq) |
    SYNC(epoch, part, parts) | SYNC_REQ(epoch) | RESEND(epoch, seq: forward again from this forward seqno).
    ``replay`` names the original (epoch, seq) of a re-multicast batch. FORWARD, BCAST and SYNC carry their
    batch in the payload."""

    PROTO_ID = protocol_ids.SEQUENCER
    __slots__ = ("commit", "epoch", "kind", "replay", "seq")

    def __init__(
        self,
        kind: int,
        epoch: ViewId | None = None,
        seq: int = 0,
        commit: int = 0,
        replay: BatchId | None = None,
    ) -> None:
        self.kind = kind
        self.epoch = epoch
        self.seq = seq
        self.commit = commit
        self.replay = replay

    def to_wire(self) -> list[Any]:
        kind = self.kind
        if kind == FORWARD:
            return [FORWARD]
        assert self.epoch is not None
        epoch = self.epoch.to_wire()
        if kind == BCAST:
            replay = None if self.replay is None else [self.replay[0].to_wire(), self.replay[1]]
            return [BCAST, epoch, self.seq, self.commit, replay]
        if kind == COMMIT:
            return [COMMIT, epoch, self.commit]
        if kind == ACK:
            return [ACK, epoch, self.seq]
        if kind == SYNC:
            return [SYNC, epoch, self.seq, self.commit]
        if kind == RESEND:
            return [RESEND, epoch, self.seq]
        return [SYNC_REQ, epoch]

    @classmethod
    def from_wire(cls, data: Any) -> SequencerHeader:
        if type(data) is not list or not data:
            raise WireError("sequencer: expected a non-empty list")
        kind = as_int(data[0], "sequencer.kind", 0, len(KIND_NAMES) - 1)
        sizes = (1, 5, 3, 3, 4, 2, 3)
        if len(data) != sizes[kind]:
            raise WireError(f"sequencer: {KIND_NAMES[kind]} needs {sizes[kind]} fields, got {len(data)}")
        if kind == FORWARD:
            return cls(FORWARD)
        epoch = ViewId.from_wire(data[1], "sequencer.epoch")
        if kind == BCAST:
            seq = as_int(data[2], "sequencer.seq", 1)
            commit = as_int(data[3], "sequencer.commit", 0, seq - 1)
            replay = None
            if data[4] is not None:
                r = as_list(data[4], "sequencer.replay", 2, exact=2)
                replay = (ViewId.from_wire(r[0], "sequencer.replay.epoch"), as_int(r[1], "sequencer.replay.seq", 1))
            return cls(BCAST, epoch, seq, commit, replay)
        if kind == COMMIT:
            return cls(COMMIT, epoch, commit=as_int(data[2], "sequencer.commit"))
        if kind == ACK:
            return cls(ACK, epoch, seq=as_int(data[2], "sequencer.seq"))
        if kind == RESEND:
            return cls(RESEND, epoch, seq=as_int(data[2], "sequencer.seq", 1))
        if kind == SYNC:
            parts = as_int(data[3], "sequencer.parts", 1, MAX_SYNC_PARTS)
            return cls(SYNC, epoch, seq=as_int(data[2], "sequencer.part", 0, parts - 1), commit=parts)
        return cls(SYNC_REQ, epoch)

    def __repr__(self) -> str:
        return (
            f"SequencerHeader({KIND_NAMES[self.kind]}, epoch={self.epoch}, seq={self.seq}, commit={self.commit}, "
            f"replay={self.replay})"
        )


# ---- batch encoding --------------------------------------------------------------------------------------


def _pack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def _unpack(data: bytes, field: str) -> Any:
    try:
        return msgpack.unpackb(data, raw=False, use_list=True, strict_map_key=True, max_map_len=0, max_ext_len=0)
    except Exception as exc:  # msgpack raises several types for malformed input
        raise WireError(f"{field}: not valid msgpack ({type(exc).__name__}: {exc})") from None


def item_of(msg: Message) -> Any:
    """The wire form of an application message inside a batch: its payload, or [flags, headers, payload].

    Built of tuples: it stays in the forward-table until delivered (up to megabytes of messages), and tuples
    of plain values drop out of the cyclic garbage collector's walks after its first look, lists never do."""
    if not msg.flags and not msg.headers:
        return msg.payload
    flat: list[Any] = []
    for pid, hdr in msg.headers.items():
        flat.append(pid)
        wire = hdr.to_wire()
        flat.append(tuple(wire) if type(wire) is list else wire)
    return (msg.flags, tuple(flat), msg.payload)


def _item_size(item: Any) -> int:
    return len(item) + _ITEM_OVERHEAD if type(item) is bytes else len(item[2]) + 16 * len(item[1]) + _ITEM_OVERHEAD


def check_items(data: Any, field: str, *, decode: bool) -> list[Any]:
    """Validate a list of items. ``decode`` turns [flags, headers, payload] into (flags, {pid: Header},
    payload); otherwise the wire form is kept (the coordinator re-multicasts it as it came).

    Items with headers are the common case on stacks with a layer above us that stamps every multicast (STATE's
    sequence number), so they are checked here in one tight loop: plain type tests, no field names formatted.
    Anything that fails them goes through :func:`_check_items_named`, which raises the error naming the field.
    """
    items = as_list(data, field, MAX_ITEMS)
    if len(set(map(type, items))) == 1 and type(items[0]) is bytes:
        return items  # the common case without headers, checked in C: plain payloads only
    out: list[Any] | None = [] if decode else None
    header_types = HEADER_TYPES
    max_headers2 = 2 * MAX_HEADERS
    try:
        for item in items:
            if type(item) is bytes:
                if out is not None:
                    out.append(item)
                continue
            if type(item) is not list or len(item) != 3:
                break
            flags, raw_headers, payload = item
            if (
                type(flags) is not int
                or flags < 0
                or flags & ~ALL_FLAGS
                or type(payload) is not bytes
                or type(raw_headers) is not list
                or len(raw_headers) > max_headers2
                or len(raw_headers) % 2
            ):
                break
            if len(raw_headers) == 2:  # one header (STATE's): no duplicate to look for
                pid = raw_headers[0]
                cls = header_types.get(pid) if type(pid) is int else None
                if cls is None or pid == _PID:
                    break
                headers = {pid: cls.from_wire(raw_headers[1])}
            else:
                headers = {}
                for j in range(0, len(raw_headers), 2):
                    pid = raw_headers[j]
                    cls = header_types.get(pid) if type(pid) is int else None
                    if cls is None or pid == _PID or pid in headers:
                        raise WireError("")  # named below
                    headers[pid] = cls.from_wire(raw_headers[j + 1])
            if out is not None:
                out.append((flags, headers, payload))
        else:
            return out if out is not None else items
    except Exception:  # a header class must never turn bad input into a crash: the named pass says what it is
        pass
    _check_items_named(items, field)
    raise WireError(f"{field}: invalid item")  # not reached: the named pass raises


def _check_items_named(items: list[Any], field: str) -> None:
    """The slow pass over items that failed the fast one: raises a WireError naming the bad field."""
    for i, item in enumerate(items):
        if type(item) is bytes:
            continue
        parts = as_list(item, f"{field}[{i}]", 3, exact=3)
        flags = parts[0]
        if type(flags) is not int or flags < 0 or flags & ~ALL_FLAGS:
            raise WireError(f"{field}[{i}].flags: invalid flags {flags!r}")
        raw_headers = parts[1]
        if type(raw_headers) is not list or len(raw_headers) > 2 * MAX_HEADERS or len(raw_headers) % 2:
            raise WireError(f"{field}[{i}].headers: expected a flat list of (id, header) pairs")
        seen: set[int] = set()
        for j in range(0, len(raw_headers), 2):
            pid = raw_headers[j]
            cls = HEADER_TYPES.get(pid) if type(pid) is int else None
            if cls is None or pid == _PID:
                raise WireError(f"{field}[{i}].headers: protocol id {pid!r} is not allowed here")
            if pid in seen:
                raise WireError(f"{field}[{i}].headers: protocol id {pid} appears twice")
            seen.add(pid)
            try:
                cls.from_wire(raw_headers[j + 1])
            except WireError as exc:
                raise WireError(f"{field}[{i}].headers[{cls.__name__}]: {exc}") from None
            except Exception as exc:  # a header class must never turn bad input into a crash
                raise WireError(f"{field}[{i}].headers[{cls.__name__}]: {type(exc).__name__}: {exc}") from None
        as_bytes(parts[2], f"{field}[{i}].payload", MAX_INT)


def columns_of(items: list[Any]) -> list[Any] | None:
    """The *uniform* wire form of ``items`` (wire form, see :func:`item_of`) when each has the same flags and
    exactly one header, of the same protocol (STATE's on every multicast of the total-order stack):
    ``[payloads, flags, protocol id, header wire forms]``. None otherwise (they travel item by item).

    Four lists for a whole run instead of three per message: msgpack builds fewer objects, and a receiver
    checks the payloads and the flags once per run and decodes the headers in one pass of one class."""
    first = items[0]
    if type(first) is bytes:
        return None
    flat = first[1]
    if len(flat) != 2:
        return None
    flags = first[0]
    pid = flat[0]
    try:
        if {(item[0], item[1][0], len(item[1])) for item in items} != {(flags, pid, 2)}:
            return None
    except (TypeError, IndexError, KeyError):  # a plain payload among them (bytes index to ints)
        return None
    return [[item[2] for item in items], flags, pid, [item[1][1] for item in items]]


def check_columns(cols: list[Any], field: str) -> tuple[list[Item], list[Any]]:
    """Validate the uniform form ``[payloads, flags, protocol id, header wire forms]`` (see :func:`columns_of`):
    the items decoded, and in their per-item wire form (what the coordinator sequences)."""
    payloads = as_list(cols[0], f"{field}.payloads", MAX_ITEMS)
    flags, pid = cols[1], cols[2]
    wires = as_list(cols[3], f"{field}.headers", MAX_ITEMS)
    if not payloads or len(wires) != len(payloads):
        raise WireError(f"{field}: {len(payloads)} payloads but {len(wires)} headers")
    if len(set(map(type, payloads))) != 1 or type(payloads[0]) is not bytes:
        raise WireError(f"{field}.payloads: expected a list of bytes")
    if type(flags) is not int or flags < 0 or flags & ~ALL_FLAGS:
        raise WireError(f"{field}.flags: invalid flags {flags!r}")
    cls = HEADER_TYPES.get(pid) if type(pid) is int else None
    if cls is None or pid == _PID:
        raise WireError(f"{field}.headers: protocol id {pid!r} is not allowed here")
    try:
        headers = list(map(cls.from_wire, wires))
    except WireError as exc:
        raise WireError(f"{field}.headers[{cls.__name__}]: {exc}") from None
    except Exception as exc:  # a header class must never turn bad input into a crash
        raise WireError(f"{field}.headers[{cls.__name__}]: {type(exc).__name__}: {exc}") from None
    decoded = [(flags, {pid: hdr}, payload) for hdr, payload in zip(headers, payloads, strict=True)]
    return decoded, [[flags, [pid, wire], payload] for wire, payload in zip(wires, payloads, strict=True)]


def forward_body(start: int, items: list[Any]) -> list[Any]:
    """What a FORWARD carries: ``[start, items]``, or ``[start, *uniform form]`` (see :func:`columns_of`)."""
    cols = columns_of(items)
    return [start, items] if cols is None else [start, *cols]


def decode_forward(payload: bytes) -> tuple[int, list[Any]]:
    """FORWARD payload: [first forward seqno, items] (items kept in wire form)."""
    start, items, _decoded = decode_forward_both(payload)
    return start, items


def decode_forward_both(payload: bytes) -> tuple[int, list[Any], list[Item]]:
    """FORWARD payload: the first forward seqno, the items in wire form (re-multicast as they came) and the
    same items decoded (the coordinator delivers them too: validating builds the header objects anyway, so they
    are kept rather than built a second time when our own BCAST comes back). Plain payloads share one list."""
    data = as_list(_unpack(payload, "sequencer.forward"), "sequencer.forward", 5)
    start = as_int(data[0] if data else None, "sequencer.forward.start", 1)
    if len(data) == 5:
        decoded, items = check_columns(data[1:], "sequencer.forward")
        return start, items, decoded
    if len(data) != 2:
        raise WireError(f"sequencer.forward: expected 2 or 5 fields, got {len(data)}")
    decoded = check_items(data[1], "sequencer.forward.items", decode=True)
    if not decoded:
        raise WireError("sequencer.forward.items: empty")
    return start, data[1], decoded


def decode_items(items: list[Any]) -> list[Item]:
    """Items in wire form that were validated already (checked forwards, our own), decoded: only the header
    objects are made, which the layers above need."""
    if len(set(map(type, items))) == 1 and type(items[0]) is bytes:
        return items
    header_types = HEADER_TYPES
    decoded: list[Item] = []
    for item in items:
        if type(item) is bytes:
            decoded.append(item)
            continue
        flags, raw_headers, payload = item
        headers = {}
        for j in range(0, len(raw_headers), 2):
            wire = raw_headers[j + 1]
            # Our own items keep header wire forms as tuples (see item_of); header classes read lists.
            headers[raw_headers[j]] = header_types[raw_headers[j]].from_wire(
                list(wire) if type(wire) is tuple else wire
            )
        decoded.append((flags, headers, payload))
    return decoded


def wire_run(run: list[Any]) -> list[Any]:
    """A run of a batch on the wire: ``[origin, start, items]``, or ``[origin, start, *uniform form]`` (see
    :func:`columns_of`). ``run`` may carry more (the coordinator keeps the decoded items after the three)."""
    cols = columns_of(run[2])
    return run[:3] if cols is None else [run[0], run[1], *cols]


def decode_batch(payload: bytes, address: Callable[[Any, str], Address]) -> list[Run]:
    """BCAST payload: a list of runs [origin, first forward seqno, items] or [origin, first forward seqno,
    *uniform form] (items decoded)."""
    runs = as_list(_unpack(payload, "sequencer.batch"), "sequencer.batch", MAX_RUNS)
    out: list[Run] = []
    for i, run in enumerate(runs):
        if type(run) is not list or (len(run) != 3 and len(run) != 6):
            run = as_list(run, f"sequencer.batch[{i}]", 6)
            if len(run) != 3 and len(run) != 6:
                raise WireError(f"sequencer.batch[{i}]: expected 3 or 6 fields, got {len(run)}")
        origin = address(run[0], f"sequencer.batch[{i}].origin")
        start = run[1]
        if type(start) is not int or not 1 <= start <= MAX_INT:
            as_int(start, f"sequencer.batch[{i}].start", 1)
        if len(run) == 6:
            items = check_columns(run[2:], f"sequencer.batch[{i}]")[0]
        else:
            items = check_items(run[2], f"sequencer.batch[{i}].items", decode=True)
        out.append((origin, start, items))
    return out


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

    __slots__ = ("batches", "epochs", "forwards", "fwd_seqs", "parts", "totals", "waiting")

    def __init__(self, waiting: set[Address]) -> None:
        self.waiting = waiting
        self.parts: dict[Address, set[int]] = {}
        self.totals: dict[Address, int] = {}
        self.batches: dict[BatchId, _Batch] = {}
        self.epochs: dict[Address, set[ViewId]] = {}
        self.forwards: dict[Address, list[tuple[int, list[Any]]]] = {}
        self.fwd_seqs: dict[Address, int] = {}  # each member's highest forward seqno when it synced


@register_layer
class Sequencer(Layer):
    NAME = "sequencer"
    PROTO_ID = protocol_ids.SEQUENCER
    Config = SequencerConfig

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
        self.fwd_seq = 0
        # Own multicasts not delivered yet, in forward-seqno order: fwd_table[i] has seqno fwd_first + i. Their
        # seqnos are contiguous (only delivery removes them, from the front), so a deque does: a dict popped at
        # its front rescans its deleted slots on every next(iter()), quadratic in what is in flight.
        self.fwd_table: deque[Any] = deque()
        self.fwd_first = 1
        self.fwd_bytes = 0
        self.out_start = 0  # forwards of this step: first seqno and items
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

    # -- down: application multicasts ------------------------------------------------------------------------
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

    def _freeze(self) -> None:
        """FLUSH holds our delivery at what NAKACK delivered so far, and its digest (taken below, right after
        this) is what every survivor of the view will deliver of each stream. As coordinator we deliver a batch
        when we commit it, but the others only when our COMMIT reaches them: so every commit we made goes out
        now, ahead of the digest, and none follows until the view changes. Whatever this epoch left
        uncommitted is replayed in the next one, to every member alike; forwards that arrive meanwhile wait
        in the queue, and the senders' forward-tables carry them into the next view anyway."""
        self.frozen = True
        self.thaw_due = False
        if not self.is_coord or self.left:
            return
        self._flush_batch()
        if self.commit > self.commit_sent:
            self.commit_sent = self.commit
            self._send(None, SequencerHeader(COMMIT, self.epoch, commit=self.commit))

    def _thaw(self) -> None:
        """The flush was released without a view change: commit what was acknowledged meanwhile and sequence
        the forwards that waited."""
        if not self.is_coord or not self.open or self.left:
            return
        commit = min(self.acks.values()) if self.acks else 0
        if commit > self.commit:
            self.commit = commit
            self._learn_commit(commit)
        queue, self.queue = self.queue, []
        for origin, start, items in queue:
            if start + len(items) - 1 > self.seq_high.get(origin, 0):
                self._accept(origin, start, items)

    def _leave_now(self) -> None:
        if self.leave_pending:
            self.leave_pending = False
            self.cancel_timer("leave")
            self.below.down_event(Disconnect())

    # -- up ----------------------------------------------------------------------------------------------------
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

    # -- member: batches, commits, delivery ----------------------------------------------------------------------
    def _on_bcast(self, src: Address, hdr: SequencerHeader, payload: bytes) -> None:
        if hdr.epoch != self.epoch or src != self.coord:
            self.count("foreign_batches")
            return
        seq = hdr.seq
        if seq <= self.recv_high or seq in self.cur:
            self.count("duplicate_batches")
            return
        epoch = hdr.epoch
        assert epoch is not None  # from_wire: a BCAST names its epoch
        ident = hdr.replay if hdr.replay is not None else (epoch, seq)
        own = self._own_runs.pop(seq, None) if self.is_coord and src == self.local_address else None
        try:
            runs = decode_batch(payload, self._address) if own is None else self._own_batch(own)
        except WireError as exc:
            # Acknowledged all the same (the stream must not stall on it), but nothing of it is delivered.
            self.count("bad_batches")
            self.ctx.log.warning("undecodable batch %d from %s: %s", seq, src, exc)
            runs = []
        if self.fwd_flight:
            self._seen_own(runs)
        batch = _Batch(ident, payload, runs)
        self.cur[seq] = batch
        e, b = ident
        if b > self.delivered_in.get(e, 0):
            self.pending.setdefault(e, {})[b] = batch
        nxt = self.recv_high + 1
        while nxt in self.cur:
            nxt += 1
        if nxt - 1 != self.recv_high:
            self.recv_high = nxt - 1
        else:
            self.count("batch_gaps")
        self._learn_commit(hdr.commit)
        if self.is_coord:
            self._on_ack(self.local_address, self.recv_high)
        elif self.recv_high > self.commit_known and not self.ctx.has_timer("ack"):
            self.set_timer("ack", self.config.ack_interval)

    def _own_batch(self, own_runs: list[list[Any]]) -> list[Run]:
        """The runs of a batch we sequenced, from the objects we packed: each run carries its items decoded
        next to their wire form (see :meth:`_sequence`), so nothing is unpacked, validated or built again."""
        address = self._address
        return [(address(run[0], "sequencer.batch[].origin"), run[1], run[3]) for run in own_runs]

    def _learn_commit(self, commit: int) -> None:
        if commit <= self.commit_known:
            return
        self.commit_known = commit
        out: list[Message] = []
        cur = self.cur
        while self.delivered_seq < commit and self.delivered_seq + 1 in cur:
            self.delivered_seq += 1
            self._deliver(cur.pop(self.delivered_seq), out)
        if out:
            self._emit(out)
        if self.leave_pending and not self.fwd_table:
            self._leave_now()

    def _deliver(self, batch: _Batch, out: list[Message]) -> None:
        e, b = batch.ident
        self._settle_pending(e, b)
        if e in self.epochs_seen:
            # Batches of an epoch we were in reach us in seq order, so a watermark tells which we delivered.
            if b <= self.delivered_in.get(e, 0):
                self.count("batches_skipped")
                return
            self.delivered_in[e] = b
        # A replay of an epoch we were not in (the other side of a merge, or before we joined) is delivered too,
        # minus what the received-table says we have: every member of this view that lacks its messages delivers
        # them here, at this position. Skipping them would let us deliver them later in another position: their
        # sender, if it was not here to take the replay, still has them in its forward-table and forwards them
        # again in a later epoch, where the members that delivered them here discard them and we would not.
        me = self.local_address
        high = self.high
        for origin, start, items in batch.runs:
            h = high.get(origin)
            member = h is not None or origin in self.members
            if h is None:
                h = 0 if member else self.retired.get(origin, 0)
            n = len(items)
            if start > h:
                first = 0
            else:
                first = h - start + 1
                if first >= n:
                    self.count("duplicates", n)
                    continue
                self.count("duplicates", first)
            self._deliver_items(origin, items[first:] if first else items, out)
            last = start + n - 1
            if member:
                high[origin] = last
            else:
                self._retire(origin, last)
            if origin == me:
                self._forget_own(last)
        if len(self.delivered_in) > MAX_EPOCHS:
            for old in list(self.delivered_in)[: len(self.delivered_in) - MAX_EPOCHS]:
                del self.delivered_in[old]

    def _settle_pending(self, e: ViewId, b: int) -> None:
        """Batch ``b`` of epoch ``e`` and any older one of its epoch are settled (older ones were delivered or
        skipped). Batches of an epoch are added in seq order, so the settled ones are at the front."""
        per_epoch = self.pending.get(e)
        if per_epoch is None:
            return
        while per_epoch:
            first = next(iter(per_epoch))
            if first > b:
                break
            del per_epoch[first]
        if not per_epoch:
            del self.pending[e]

    def _deliver_items(self, origin: Address, todo: Sequence[Any], out: list[Message]) -> None:
        """Append ``origin``'s sequenced items (plain payloads or (flags, headers, payload)) to ``out`` as
        messages, reassembling fragments."""
        if len(set(map(type, todo))) == 1 and type(todo[0]) is bytes:
            out.extend([Message(None, p, src=origin) for p in todo])
            return
        append = out.append
        for item in todo:
            if type(item) is bytes:
                append(Message(None, item, src=origin))
                continue
            flags, headers, payload = item
            # Built field by field (a keyword call costs more), and the header dict is the item's own: a
            # decoded batch is delivered once (it leaves ``cur`` as it is delivered).
            msg = _new_message(Message)
            msg.dest = None
            msg.src = origin
            msg.payload = payload
            msg.flags = flags
            msg.headers = headers
            frag = headers.get(_FRAG)
            if frag is None:
                append(msg)
            else:
                self._fragment(origin, frag, msg, out)

    def _retire_senders(self, view: View) -> None:
        """Keep ``high`` to the members of ``view``: entries of senders that left move to ``retired``, those of
        members that came back (same address: a partition healed) move back.

        Why an entry cannot simply be dropped when its sender leaves the view: leaving the view is also what a
        member that is only cut off does (a crash and a partition look the same from here), and it comes back
        with the same address. Its forward-table still holds what it did not deliver itself, some of which we
        delivered while it was away (a replay its side never took): that is sequenced again, and only this
        entry tells us it is a duplicate. Replays of old batches held by members that were away bring its
        messages back too. So nothing local shows that a departed sender's messages can no longer reach us; its
        entry is kept, out of the way, and ``retired`` is bounded: past ``_MAX_RETIRED`` departed senders the
        one delivered from least recently is forgotten (a restart is a new address, so without a bound the
        table would grow with every restart). Forgetting one could deliver a message twice only if that
        sender, or a batch holding its messages, came back after that many others left since; losing a message
        it cannot: an entry only ever suppresses deliveries."""
        members = frozenset(view.members)
        self.members = members
        high, retired = self.high, self.retired
        for gone in [s for s in high if s not in members]:
            self._retire(gone, high.pop(gone))
        for member in view.members:
            if member not in high:
                back = retired.pop(member, None)
                if back is not None:
                    high[member] = back

    def _retire(self, sender: Address, last: int) -> None:
        retired = self.retired
        retired.pop(sender, None)
        retired[sender] = last
        if len(retired) > _MAX_RETIRED:
            del retired[next(iter(retired))]
            self.count("retired_forgotten")

    def _fragment(self, origin: Address, frag: Any, msg: Message, out: list[Message]) -> None:
        key = (origin, frag.frag_id)
        parts = self.fragments.get(key)
        if parts is None:
            if frag.count == 1:
                out.append(msg)
                return
            parts = self.fragments[key] = []
        parts.append(msg)
        self.fragment_bytes += len(msg.payload)
        if len(parts) >= frag.count:
            del self.fragments[key]
            self.fragment_bytes -= sum(len(m.payload) for m in parts)
            out.extend(parts)
            return
        while self.fragment_bytes > self.config.max_queued and self.fragments:
            # Bounded: the oldest incomplete message goes (FRAG above would drop it as well).
            oldest = next(iter(self.fragments))
            self.fragment_bytes -= sum(len(m.payload) for m in self.fragments.pop(oldest))
            self.count("fragments_dropped")

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

    # -- view changes ---------------------------------------------------------------------------------------------
    def up_event(self, event: Event) -> None:
        if isinstance(event, ViewChange):
            self._on_view(event.view)
        elif isinstance(event, Left):
            self._on_left()
        self.above.up_event(event)

    def _on_view(self, view: View) -> None:
        me = self.local_address
        self.view = view
        self._retire_senders(view)
        epoch = view.view_id
        self.epoch = epoch
        self.coord = view.coordinator
        self.epochs_seen[epoch] = None
        if len(self.epochs_seen) > MAX_EPOCHS:
            del self.epochs_seen[next(iter(self.epochs_seen))]
        # The previous epoch's undelivered batches stay in ``pending`` (reported in our SYNC); its own
        # bookkeeping starts over.
        self.recv_high = 0
        self.cur = {}
        self.commit_known = 0
        self.delivered_seq = 0
        self.acked = 0
        self.cancel_timer("ack")
        self.out_items = []  # they are in the forward-table, which our SYNC carries
        self.out_decoded = []
        self._open_window()
        self.sync_parts = self._build_sync()
        was_coord = self.is_coord
        self.is_coord = self.coord == me
        self.open = False
        self.frozen = self.thaw_due = False
        self.sync = None
        self._runs, self._run_origin, self._batch_bytes, self._ready = [], None, 0, []
        self._own_runs = {}
        self.cancel_timer("sync")
        self.count("epochs")
        self.held, self.held_bytes = {}, 0
        self.cancel_timer("resend")
        if not self.is_coord:
            if was_coord:
                self.queue = []
            # Strays are kept: forwards meant for a view we have not installed yet may be among them.
            # The SYNC leaves at the end of the step: a joiner's GMS drops what is sent down while it is still
            # installing its first view.
            self.sync_due = True
            return
        members = set(view.members)
        # Forwards queued during an unfinished sync stay (deduplicated later) if their sender is still here.
        self.queue = [q for q in self.queue if q[0] in members] if was_coord else []
        self.next_seq = 0
        self.acks = {m: 0 for m in view.members}
        self.commit = self.commit_sent = 0
        self.seq_high = {}
        self.sync = _Sync(members - {me})
        self._add_sync_parts(me, self.sync_parts)
        for sender in list(self.future_syncs):
            fepoch, parts = self.future_syncs[sender]
            if fepoch == epoch:
                del self.future_syncs[sender]
                if sender in members:
                    self._add_sync_parts(sender, parts)
            elif fepoch.seq <= epoch.seq:
                del self.future_syncs[sender]
        if self.sync is not None and self.sync.waiting:
            self.set_timer("sync", self.config.sync_retry)
        self.open_due = True  # at the end of the step, for the same reason

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
        self.out_decoded = []
        self._open_window()

    # -- member: SYNC --------------------------------------------------------------------------------------------
    def _build_sync(self) -> list[tuple[SequencerHeader, bytes]]:
        """Our SYNC for the current epoch, cut into parts of at most ``max_batch_size`` bytes: epochs seen
        (first part), undelivered batches by identity, and the forward-table."""
        assert self.epoch is not None
        limit = self._max_batch
        fwd_seq = self.fwd_seq
        bodies: list[list[Any]] = []
        epochs = [e.to_wire() for e in self.epochs_seen]
        batches: list[Any] = []
        size = 0
        for e in sorted(self.pending):
            ewire = e.to_wire()
            for b in sorted(self.pending[e]):
                raw = self.pending[e][b].raw
                if batches and size + len(raw) > limit:
                    bodies.append([epochs, batches, None, fwd_seq])
                    epochs, batches, size = [], [], 0
                batches.append([ewire, b, raw])
                size += len(raw) + 64
        if self.fwd_table:
            start = self.fwd_first
            items: list[Any] = []
            for s, item in enumerate(self.fwd_table, start):
                isize = _item_size(item)
                if items and size + isize > limit:
                    bodies.append([epochs, batches, [start, items], fwd_seq])
                    epochs, batches, size, items, start = [], [], 0, [], s
                items.append(item)
                size += isize
            bodies.append([epochs, batches, [start, items], fwd_seq])
        elif batches or epochs or not bodies:
            bodies.append([epochs, batches, None, fwd_seq])
        total = len(bodies)
        return [(SequencerHeader(SYNC, self.epoch, i, total), _pack(body)) for i, body in enumerate(bodies)]

    def _send_sync(self) -> None:
        coord = self.coord
        for hdr, payload in self.sync_parts:
            self._send(coord, hdr, payload)
        self.count("syncs_sent")

    # -- coordinator: SYNC ----------------------------------------------------------------------------------------
    def _on_sync(self, src: Address, hdr: SequencerHeader, payload: bytes) -> None:
        epoch = hdr.epoch
        assert epoch is not None
        if self.is_coord and epoch == self.epoch:
            if self.sync is not None and src in self.sync.waiting:
                self._add_sync_parts(src, [(hdr, payload)])
                self._maybe_open()
            return
        if self.epoch is None or epoch.seq > self.epoch.seq or (epoch.seq == self.epoch.seq and epoch != self.epoch):
            # For a view we have not installed yet (its SYNC overtook the VIEW): keep it for then.
            held = self.future_syncs.get(src)
            if held is None or held[0] != epoch:
                if held is None and len(self.future_syncs) >= _MAX_FUTURE_SYNCS:
                    self.count("future_syncs_dropped")
                    return
                held = self.future_syncs[src] = (epoch, [])
            held[1].append((hdr, payload))
            return
        self.count("stale_syncs")

    def _add_sync_parts(self, src: Address, parts: list[tuple[SequencerHeader, bytes]]) -> None:
        sync = self.sync
        assert sync is not None
        for hdr, payload in parts:
            got = sync.parts.setdefault(src, set())
            if hdr.seq in got:
                continue
            if sync.totals.setdefault(src, hdr.commit) != hdr.commit:
                self.count("bad_syncs")
                continue
            try:
                self._absorb_sync_part(sync, src, payload)
            except WireError as exc:
                self.count("bad_syncs")
                self.ctx.log.warning("bad SYNC part from %s: %s", src, exc)
                continue
            got.add(hdr.seq)
            if len(got) == sync.totals[src]:
                sync.waiting.discard(src)

    def _absorb_sync_part(self, sync: _Sync, src: Address, payload: bytes) -> None:
        body = as_list(_unpack(payload, "sequencer.sync"), "sequencer.sync", 4, exact=4)
        fwd_seq = as_int(body[3], "sequencer.sync.fwd_seq")
        epochs = [ViewId.from_wire(e, "sequencer.sync.epochs[]") for e in as_list(body[0], "sync.epochs", MAX_EPOCHS)]
        batches = []
        for i, raw_batch in enumerate(as_list(body[1], "sequencer.sync.batches", MAX_RUNS)):
            e_wire, b, raw = as_list(raw_batch, f"sequencer.sync.batches[{i}]", 3, exact=3)
            ident = (
                ViewId.from_wire(e_wire, f"sequencer.sync.batches[{i}].epoch"),
                as_int(b, f"sequencer.sync.batches[{i}].seq", 1),
            )
            raw = as_bytes(raw, f"sequencer.sync.batches[{i}].payload", MAX_INT)
            batches.append(_Batch(ident, raw, decode_batch(raw, self._address)))
        forwards = None
        if body[2] is not None:
            fwd = as_list(body[2], "sequencer.sync.forwards", 2, exact=2)
            start = as_int(fwd[0], "sequencer.sync.forwards.start", 1)
            forwards = (start, check_items(fwd[1], "sequencer.sync.forwards.items", decode=False))
        # Validated in full: only now change state.
        sync.fwd_seqs[src] = max(fwd_seq, sync.fwd_seqs.get(src, 0))
        sync.epochs.setdefault(src, set()).update(epochs)
        for batch in batches:
            sync.batches.setdefault(batch.ident, batch)
        if forwards is not None and forwards[1]:
            sync.forwards.setdefault(src, []).append(forwards)

    def _maybe_open(self) -> None:
        sync = self.sync
        if sync is None or sync.waiting or not self.is_coord:
            return
        self.sync = None
        self.cancel_timer("sync")
        assert self.epoch is not None and self.view is not None
        # 1. Replay every undelivered batch anyone reported, in (epoch, seq) order: each member finishes the
        #    epochs it was in, in their order.
        seeded: dict[Address, int] = {}
        for ident in sorted(sync.batches):
            batch = sync.batches[ident]
            self._flush_batch()
            self._bcast(batch.raw, replay=ident)
            self.count("batches_replayed")
            for origin, start, items in batch.runs:
                # The sender is in this view: the replay delivers these to it (whatever epochs it was in), so
                # its forward-table copies must not be sequenced again (they would reach others in a second
                # position).
                if origin in sync.epochs:
                    last = start + len(items) - 1
                    if last > seeded.get(origin, 0):
                        seeded[origin] = last
        self.seq_high = dict(seeded)
        # 2. The members' forward-tables (what they multicast and have not delivered), in view order. A
        #    member's forward seqnos up to the one its SYNC announced are settled now (delivered by it, or
        #    sequenced here): its next FORWARD must continue right after, or something was lost (see held).
        for member in self.view.members:
            for start, items in sync.forwards.get(member, ()):
                self._sequence(member, start, items, resent=True)
            announced = sync.fwd_seqs.get(member, 0)
            if announced > self.seq_high.get(member, 0):
                self.seq_high[member] = announced
        self.open = True
        # 3. Forwards that reached us before we were coordinator, then those that arrived during the sync.
        strays, self.strays, self.stray_bytes = self.strays, [], 0
        members = set(self.view.members)
        for origin, start, items, _size in strays:
            if origin in members and start + len(items) - 1 > self.seq_high.get(origin, 0):
                self._accept(origin, start, items)
        queue, self.queue = self.queue, []
        for origin, start, items in queue:
            if start + len(items) - 1 > self.seq_high.get(origin, 0):
                self._accept(origin, start, items)
        self.count("syncs_completed")

    # -- coordinator: sequencing ----------------------------------------------------------------------------------
    def _on_forward(self, src: Address, payload: bytes) -> None:
        try:
            start, items, decoded = decode_forward_both(payload)
        except WireError as exc:
            self.count("bad_forwards")
            self.ctx.log.warning("bad FORWARD from %s: %s", src, exc)
            return
        view = self.view
        if self.is_coord and view is not None and src in view.members:
            if self.open and not self.frozen:
                self._accept(src, start, items, decoded)
            else:
                self.queue.append((src, start, items))
            return
        # We are not (yet) its coordinator: keep it, bounded, in case the view that makes us one arrives.
        size = sum(_item_size(i) for i in items)
        self.strays.append((src, start, items, size))
        self.stray_bytes += size
        while self.stray_bytes > self.config.max_stray and self.strays:
            self.stray_bytes -= self.strays.pop(0)[3]
            self.count("strays_dropped")

    def _accept(self, origin: Address, start: int, items: list[Any], decoded: list[Item] | None = None) -> None:
        """A FORWARD from a member, the epoch open: sequence it if it continues the sender's forward seqnos,
        else hold it and ask the sender to forward the missing ones again."""
        high = self.seq_high.get(origin, 0)
        if start > high + 1:
            held = self.held.setdefault(origin, [])
            held.append((start, items))
            self.held_bytes += sum(_item_size(i) for i in items)
            self.count("forwards_held")
            if len(held) == 1:
                self._ask_resend(origin)
            return
        self._sequence(origin, start, items, decoded)
        waiting = self.held.get(origin)
        if waiting:
            waiting.sort(key=lambda h: h[0])
            while waiting and waiting[0][0] <= self.seq_high.get(origin, 0) + 1:
                hstart, hitems = waiting.pop(0)
                self.held_bytes -= sum(_item_size(i) for i in hitems)
                self._sequence(origin, hstart, hitems)
            if not waiting:
                del self.held[origin]

    def _ask_resend(self, origin: Address) -> None:
        self.count("resend_requests")
        frm = self.seq_high.get(origin, 0) + 1
        self._send(origin, SequencerHeader(RESEND, self.epoch, seq=frm), flags=NO_RELIABILITY)
        if not self.ctx.has_timer("resend"):
            self.set_timer("resend", self.config.sync_retry)

    def _sequence(
        self,
        origin: Address,
        start: int,
        items: list[Any],
        decoded: list[Item] | None = None,
        *,
        resent: bool = False,
    ) -> None:
        """Add ``origin``'s messages ``start``, ``start+1``, ... to the batch being filled, minus those
        already sequenced in this epoch. ``decoded``: the same items decoded, when the caller has them."""
        high = self.seq_high.get(origin, 0)
        n = len(items)
        if start + n - 1 <= high:
            self.count("duplicate_forwards", n)
            return
        if start <= high:
            self.count("duplicate_forwards", high - start + 1)
            items = items[high - start + 1 :]
            if decoded is not None:
                decoded = decoded[high - start + 1 :]
            start = high + 1
            n = len(items)
        if decoded is None:
            decoded = decode_items(items)
        self.seq_high[origin] = start + n - 1
        self.count("sequenced_resent" if resent else "sequenced", n)
        limit = self._max_batch
        size = self._batch_bytes
        runs = self._runs
        if self._run_origin is origin and self._run_next == start and runs:
            run = runs[-1]
            run_items, run_decoded = run[2], run[3]
        else:
            run_items, run_decoded = [], []
            runs.append([origin.to_wire(), start, run_items, run_decoded])
            self._run_origin = origin
        if len(set(map(type, items))) == 1 and type(items[0]) is bytes:
            total = sum(map(len, items)) + _ITEM_OVERHEAD * n
            if size + total <= limit:
                run_items.extend(items)
                run_decoded.extend(items)
                self._batch_bytes = size + total
                self._run_next = start + n
                return
        for item, dec in zip(items, decoded, strict=True):
            isize = len(item) + _ITEM_OVERHEAD if type(item) is bytes else _item_size(item)
            if size + isize > limit and size:
                if not run_items:
                    runs.pop()
                self._ready.append(runs)
                runs = self._runs = []
                size = 0
                run_items, run_decoded = [], []
                runs.append([origin.to_wire(), start, run_items, run_decoded])
            run_items.append(item)
            run_decoded.append(dec)
            size += isize
            start += 1
        self._batch_bytes = size
        self._run_next = start

    def _flush_batch(self) -> None:
        """Multicast the full batches and the one being filled."""
        ready = self._ready
        if self._runs:
            ready.append(self._runs)
            self._runs = []
        self._run_origin = None
        self._batch_bytes = 0
        if not ready:
            return
        self._ready = []
        for runs in ready:
            self._bcast(_pack([wire_run(run) for run in runs]), runs=runs)

    def _bcast(self, payload: bytes, replay: BatchId | None = None, runs: list[list[Any]] | None = None) -> None:
        self.next_seq += 1
        if runs is not None:
            # Our own BCAST comes back to us by loopback within this step: keep what we packed, so we do not
            # unpack and validate again what we built from checked forwards (see _own_batch).
            if len(self._own_runs) >= _MAX_OWN_RUNS:
                self._own_runs.clear()
            self._own_runs[self.next_seq] = runs
        self.commit_sent = self.commit
        self._send(None, SequencerHeader(BCAST, self.epoch, self.next_seq, self.commit, replay), payload)
        self.count("batches_sent")

    def _on_ack(self, src: Address, seq: int) -> None:
        acks = self.acks
        prev = acks.get(src)
        if prev is None or seq <= prev or seq > self.next_seq:
            return
        acks[src] = seq
        if prev != self.commit or self.frozen:
            return  # the minimum did not move, or a flush holds our commits (see _freeze)
        commit = min(acks.values())
        if commit > self.commit:
            self.commit = commit
            # The coordinator is a member too: it learns the commit here, not from its own COMMIT.
            self._learn_commit(commit)

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
            self.out_items = items + self.out_items
            self.out_start = first

    def _forward(self, items: list[Any], start: int) -> bool:
        """Forward ``items`` (forward seqnos from ``start``) to the coordinator, cut at ``max_batch_size``, as far
        as the forward window allows; the rest waits in ``out_items`` for our next BCAST (the end of that step
        forwards more)."""
        room = self.config.forward_window - self.fwd_inflight
        if room <= 0:
            self.out_items, self.out_start = items, start
            self.count("forwards_windowed")
            self._watch_window()
            return False
        limit = self._max_batch
        coord = self.coord
        flight = self.fwd_flight
        sent = 0
        i = 0
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
        if i < n:
            self.out_items, self.out_start = items[i:], start
            self.count("forwards_windowed")
            self._watch_window()
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

    def _send_ack(self) -> None:
        if self.recv_high > self.acked:
            self.acked = self.recv_high
            self._send(self.coord, SequencerHeader(ACK, self.epoch, seq=self.recv_high), flags=NO_RELIABILITY)

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
            items, self.out_items = self.out_items, []
            decoded, self.out_decoded = self.out_decoded, []
            if self.open and not self.frozen:
                self._sequence(
                    self.local_address, self.out_start, items, decoded if len(decoded) == len(items) else None
                )
            else:
                self.queue.append((self.local_address, self.out_start, items))
        if self.out_items and self.coord is not None and not self.is_coord:
            items, self.out_items = self.out_items, []
            busy = self._forward(items, self.out_start) or busy
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
