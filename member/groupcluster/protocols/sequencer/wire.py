"""SEQUENCER's wire forms: the header and its kinds, the bounds on what a peer can make us allocate, and the
codec of the batches that FORWARD, BCAST and SYNC carry (runs of items, plain or in uniform form), validated."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import msgpack

from ...core import protocol_ids
from ...core.address import Address
from ...core.errors import WireError
from ...core.message import ALL_FLAGS, HEADER_TYPES, NATIVE, Header, Message, register_header
from ...core.validate import MAX_INT, as_bytes, as_int, as_list
from ...core.view import ViewId

FORWARD: Final = 0
BCAST: Final = 1
COMMIT: Final = 2
ACK: Final = 3
SYNC: Final = 4
SYNC_REQ: Final = 5
RESEND: Final = 6
KIND_NAMES = ("FORWARD", "BCAST", "COMMIT", "ACK", "SYNC", "SYNC_REQ", "RESEND")
_PID: Final = protocol_ids.SEQUENCER

# Bounds on what a peer can make us allocate (a batch also fits in one frame: the transport limits that).
MAX_RUNS: Final = 65536
MAX_ITEMS: Final = 1 << 20
MAX_HEADERS: Final = 16
MAX_SYNC_PARTS: Final = 1 << 20
MAX_EPOCHS: Final = 1024  # epochs remembered per member (and announced in a SYNC)
MAX_MARKS: Final = 1 << 16  # senders a SYNC part names as skipped past; ranges per sender: half as many as this
_ITEM_OVERHEAD: Final = 8  # rough msgpack bytes per item, for cutting batches

_new_message: Final = Message.__new__  # not object.__new__, which a Message compiled with mypyc refuses

BatchId = tuple[ViewId, int]
# A decoded item: payload bytes (no flags, no headers), or (flags, headers, payload); in a run of a received batch
# that came in uniform form, the message itself (see columns_messages).
Item = Any
Run = tuple[Address, int, list[Item]]


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


register_header(SequencerHeader)


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
    headers = msg.headers
    if not headers:
        return msg.payload if not msg.flags else (msg.flags, (), msg.payload)
    if len(headers) == 1:  # the common case (STATE's header on every multicast): no flat list to build first
        for pid, hdr in headers.items():
            wire = hdr.to_wire()
            return (msg.flags, (pid, tuple(wire) if type(wire) is list else wire), msg.payload)
    flat: list[Any] = []
    for pid, hdr in headers.items():
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
    # One pass that stops at the first difference (no tuple built and hashed per item).
    for item in items:
        if type(item) is bytes:
            return None
        hdrs = item[1]
        if item[0] != flags or len(hdrs) != 2 or hdrs[0] != pid:
            return None
    return [[item[2] for item in items], flags, pid, [item[1][1] for item in items]]


def _check_columns(cols: list[Any], field: str) -> tuple[list[bytes], int, int, list[Any], list[Any]]:
    """Validate the uniform form ``[payloads, flags, protocol id, header wire forms]`` (see :func:`columns_of`):
    the payloads, flags, protocol id, header wire forms and the headers decoded."""
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
        headers = cls.from_wire_many(wires)
    except WireError as exc:
        raise WireError(f"{field}.headers[{cls.__name__}]: {exc}") from None
    except Exception as exc:  # a header class must never turn bad input into a crash
        raise WireError(f"{field}.headers[{cls.__name__}]: {type(exc).__name__}: {exc}") from None
    return payloads, flags, pid, wires, headers


def check_columns(cols: list[Any], field: str) -> tuple[list[Item], list[Any]]:
    """Validate the uniform form (see :func:`_check_columns`): the items decoded, and in their per-item wire
    form (what the coordinator sequences)."""
    payloads, flags, pid, wires, headers = _check_columns(cols, field)
    decoded = [(flags, {pid: hdr}, payload) for hdr, payload in zip(headers, payloads, strict=True)]
    return decoded, [[flags, [pid, wire], payload] for wire, payload in zip(wires, payloads, strict=True)]


def columns_messages(cols: list[Any], field: str, origin: Address) -> list[Message]:
    """Validate the uniform form of a run of a batch (see :func:`_check_columns`) and decode it straight into
    the messages ``origin`` multicast, as they will be delivered: a member needs nothing else of them, so no
    item per message is built and taken apart again (see :meth:`.member.MemberRole._deliver_items`)."""
    payloads, flags, pid, _wires, headers = _check_columns(cols, field)
    if NATIVE:
        return [
            Message(None, payload, src=origin, flags=flags, headers={pid: hdr})
            for hdr, payload in zip(headers, payloads, strict=True)
        ]
    new = _new_message
    out: list[Message] = []
    for hdr, payload in zip(headers, payloads, strict=True):
        # Built field by field, as _deliver_items does: interpreted, a keyword call costs more.
        msg = new(Message)
        msg.dest = None
        msg.src = origin
        msg.payload = payload
        msg.flags = flags
        msg.headers = {pid: hdr}
        out.append(msg)
    return out


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
    *uniform form] (items decoded; a run in uniform form decoded into its messages, see :func:`columns_messages`)."""
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
            items = columns_messages(run[2:], f"sequencer.batch[{i}]", origin)
        else:
            items = check_items(run[2], f"sequencer.batch[{i}].items", decode=True)
        out.append((origin, start, items))
    return out


def trim_batch(payload: bytes, keep: list[list[tuple[int, int]] | None]) -> bytes:
    """A batch (validated already) with only the parts ``keep[i]`` of its run i, as (offset, count) each (None:
    the whole run): a run may become several, or none. The coordinator's replay leaves out what some member of
    the view can no longer deliver (see :meth:`.view_sync.ViewSync._maybe_open`)."""
    runs = _unpack(payload, "sequencer.batch")
    out: list[Any] = []
    for run, parts in zip(runs, keep, strict=True):
        if parts is None:
            out.append(run)
            continue
        for k, n in parts:
            if len(run) == 6:
                out.append([run[0], run[1] + k, run[2][k : k + n], run[3], run[4], run[5][k : k + n]])
            else:
                out.append([run[0], run[1] + k, run[2][k : k + n]])
    return _pack(out)
