"""The grid wire format: versioned msgpack payloads carrying batches of grid messages, strictly validated.

    payload = [GRID_FORMAT_VERSION, [message, ...]]
    message = [type, field, ...]          (one list per message; the fields of each type are listed below)

A payload travels as the body of one group message (unicast or multicast), so the messages a member emits
for one destination in one step share a payload. :func:`decode_payload` checks every field and every size
a peer controls and raises :class:`~groupcluster.core.errors.WireError` naming the bad field; the node drops
the payload and counts it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgpack

from ..core.errors import WireError
from ..core.validate import MAX_INT, as_bool, as_bytes, as_int, as_list, as_str
from ..core.wire import unpack_bounded
from .consistent_hash import MAX_SEGMENTS
from .topology import CacheTopology, MemberStatus

GRID_FORMAT_VERSION = 1

STATUS, TOPOLOGY, CONFIRM, CMD, RSP, BACKUP, BACKUP_ACK = 1, 2, 3, 4, 5, 6, 7
FETCH, XFER_DATA, XFER_ACK, XFER_CANCEL, XFER_FAIL = 8, 9, 10, 11, 12

GET, PUT, DELETE = 0, 1, 2
OP_NAMES = {GET: "GET", PUT: "PUT", DELETE: "DELETE"}

# Response codes: OK (value for GET, None otherwise), NOT_FOUND (GET of an absent key), RETRY (stale or
# future topology: the originator retries on the owners of a topology at least as new as the one given),
# ERROR (the message says why; e.g. the segment is unavailable in degraded mode).
OK, NOT_FOUND, RETRY, ERROR = 0, 1, 2, 3
MAX_ERROR_LEN = 512


@dataclass(frozen=True, slots=True)
class GridLimits:
    """Bounds on what a peer can make us allocate."""

    max_payload_bytes: int = 8 * 1024 * 1024
    max_messages: int = 8192
    max_key_bytes: int = 64 * 1024
    max_value_bytes: int = 4 * 1024 * 1024
    max_batch_entries: int = 100_000


DEFAULT_LIMITS = GridLimits()


@dataclass(frozen=True, slots=True)
class Status:
    status: MemberStatus


@dataclass(frozen=True, slots=True)
class Topology:
    topology: CacheTopology


@dataclass(frozen=True, slots=True)
class Confirm:
    topology_id: int


@dataclass(frozen=True, slots=True)
class Command:
    op_id: int
    attempt: int
    topology_id: int
    kind: int
    key: bytes
    value: bytes | None


@dataclass(frozen=True, slots=True)
class Response:
    op_id: int
    attempt: int
    code: int
    topology_id: int
    value: bytes | None = None
    error: str = ""


@dataclass(frozen=True, slots=True)
class Backup:
    write_id: int
    topology_id: int
    version: int
    key: bytes
    value: bytes | None  # None: a delete


@dataclass(frozen=True, slots=True)
class BackupAck:
    write_id: int
    code: int
    topology_id: int


@dataclass(frozen=True, slots=True)
class Fetch:
    xfer_id: int
    topology_id: int
    rebalance_id: int
    segments: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class XferData:
    xfer_id: int
    segment: int
    entries: list[tuple[bytes, int, bytes | None]]
    done: tuple[int, ...]  # segments complete with this batch
    last: bool


@dataclass(frozen=True, slots=True)
class XferAck:
    xfer_id: int


@dataclass(frozen=True, slots=True)
class XferCancel:
    xfer_id: int


@dataclass(frozen=True, slots=True)
class XferFail:
    xfer_id: int
    segments: tuple[int, ...]


GridMessage = (
    Status
    | Topology
    | Confirm
    | Command
    | Response
    | Backup
    | BackupAck
    | Fetch
    | XferData
    | XferAck
    | XferCancel
    | XferFail
)


def _wire(msg: GridMessage) -> list[Any]:
    t = type(msg)
    if t is Command:
        return [CMD, msg.op_id, msg.attempt, msg.topology_id, msg.kind, msg.key, msg.value]  # type: ignore[union-attr]
    if t is Response:
        return [RSP, msg.op_id, msg.attempt, msg.code, msg.topology_id, msg.value, msg.error]  # type: ignore[union-attr]
    if t is Backup:
        return [BACKUP, msg.write_id, msg.topology_id, msg.version, msg.key, msg.value]  # type: ignore[union-attr]
    if t is BackupAck:
        return [BACKUP_ACK, msg.write_id, msg.code, msg.topology_id]  # type: ignore[union-attr]
    if t is XferData:
        return [
            XFER_DATA,
            msg.xfer_id,  # type: ignore[union-attr]
            msg.segment,  # type: ignore[union-attr]
            [list(e) for e in msg.entries],  # type: ignore[union-attr]
            list(msg.done),  # type: ignore[union-attr]
            msg.last,  # type: ignore[union-attr]
        ]
    if t is XferAck:
        return [XFER_ACK, msg.xfer_id]  # type: ignore[union-attr]
    if t is Fetch:
        return [FETCH, msg.xfer_id, msg.topology_id, msg.rebalance_id, list(msg.segments)]  # type: ignore[union-attr]
    if t is Confirm:
        return [CONFIRM, msg.topology_id]  # type: ignore[union-attr]
    if t is Topology:
        return [TOPOLOGY, msg.topology.to_wire()]  # type: ignore[union-attr]
    if t is Status:
        return [STATUS, msg.status.to_wire()]  # type: ignore[union-attr]
    if t is XferCancel:
        return [XFER_CANCEL, msg.xfer_id]  # type: ignore[union-attr]
    if t is XferFail:
        return [XFER_FAIL, msg.xfer_id, list(msg.segments)]  # type: ignore[union-attr]
    raise TypeError(f"not a grid message: {msg!r}")


def encode_payload(messages: list[GridMessage]) -> bytes:
    """One payload for a batch of messages to the same destination."""
    return msgpack.packb([GRID_FORMAT_VERSION, [_wire(m) for m in messages]], use_bin_type=True)


def _opt_bytes(value: Any, field: str, max_len: int) -> bytes | None:
    return None if value is None else as_bytes(value, field, max_len)


def _segments(value: Any, field: str) -> tuple[int, ...]:
    segs = as_list(value, field, MAX_SEGMENTS)
    out = tuple(as_int(s, f"{field}[{i}]", 0, MAX_SEGMENTS - 1) for i, s in enumerate(segs))
    if len(set(out)) != len(out):
        raise WireError(f"{field}: a segment is listed twice")
    return out


def _decode_one(raw: Any, f: str, lim: GridLimits) -> GridMessage:
    if type(raw) is not list or not raw:
        raise WireError(f"{f}: expected a non-empty list")
    kind = raw[0]
    if kind == CMD:
        as_list(raw, f, 7, exact=7)
        op = as_int(raw[4], f"{f}.kind", 0, 2)
        value = _opt_bytes(raw[6], f"{f}.value", lim.max_value_bytes)
        if (op == PUT) != (value is not None):
            raise WireError(f"{f}.value: a PUT carries a value, GET and DELETE do not")
        return Command(
            as_int(raw[1], f"{f}.op_id"),
            as_int(raw[2], f"{f}.attempt"),
            as_int(raw[3], f"{f}.topology_id"),
            op,
            as_bytes(raw[5], f"{f}.key", lim.max_key_bytes),
            value,
        )
    if kind == RSP:
        as_list(raw, f, 7, exact=7)
        return Response(
            as_int(raw[1], f"{f}.op_id"),
            as_int(raw[2], f"{f}.attempt"),
            as_int(raw[3], f"{f}.code", 0, 3),
            as_int(raw[4], f"{f}.topology_id"),
            _opt_bytes(raw[5], f"{f}.value", lim.max_value_bytes),
            as_str(raw[6], f"{f}.error", MAX_ERROR_LEN),
        )
    if kind == BACKUP:
        as_list(raw, f, 6, exact=6)
        return Backup(
            as_int(raw[1], f"{f}.write_id"),
            as_int(raw[2], f"{f}.topology_id"),
            as_int(raw[3], f"{f}.version", 0, MAX_INT),
            as_bytes(raw[4], f"{f}.key", lim.max_key_bytes),
            _opt_bytes(raw[5], f"{f}.value", lim.max_value_bytes),
        )
    if kind == BACKUP_ACK:
        as_list(raw, f, 4, exact=4)
        return BackupAck(
            as_int(raw[1], f"{f}.write_id"), as_int(raw[2], f"{f}.code", 0, 3), as_int(raw[3], f"{f}.topology_id")
        )
    if kind == XFER_DATA:
        as_list(raw, f, 6, exact=6)
        raw_entries = as_list(raw[3], f"{f}.entries", lim.max_batch_entries)
        entries: list[tuple[bytes, int, bytes | None]] = []
        max_key, max_val = lim.max_key_bytes, lim.max_value_bytes
        for i, e in enumerate(raw_entries):
            # Fast path for the common well-formed entry; the validators name the field otherwise.
            if type(e) is list and len(e) == 3:
                k, ver, val = e
                if (
                    type(k) is bytes
                    and len(k) <= max_key
                    and type(ver) is int
                    and 0 <= ver <= MAX_INT
                    and (val is None or (type(val) is bytes and len(val) <= max_val))
                ):
                    entries.append((k, ver, val))
                    continue
            item = as_list(e, f"{f}.entries[{i}]", 3, exact=3)
            entries.append(
                (
                    as_bytes(item[0], f"{f}.entries[{i}].key", max_key),
                    as_int(item[1], f"{f}.entries[{i}].version", 0, MAX_INT),
                    _opt_bytes(item[2], f"{f}.entries[{i}].value", max_val),
                )
            )
        return XferData(
            as_int(raw[1], f"{f}.xfer_id"),
            as_int(raw[2], f"{f}.segment", 0, MAX_SEGMENTS - 1),
            entries,
            _segments(raw[4], f"{f}.done"),
            as_bool(raw[5], f"{f}.last"),
        )
    if kind == XFER_ACK:
        as_list(raw, f, 2, exact=2)
        return XferAck(as_int(raw[1], f"{f}.xfer_id"))
    if kind == FETCH:
        as_list(raw, f, 5, exact=5)
        return Fetch(
            as_int(raw[1], f"{f}.xfer_id"),
            as_int(raw[2], f"{f}.topology_id"),
            as_int(raw[3], f"{f}.rebalance_id"),
            _segments(raw[4], f"{f}.segments"),
        )
    if kind == CONFIRM:
        as_list(raw, f, 2, exact=2)
        return Confirm(as_int(raw[1], f"{f}.topology_id"))
    if kind == TOPOLOGY:
        as_list(raw, f, 2, exact=2)
        return Topology(CacheTopology.from_wire(raw[1], f"{f}.topology"))
    if kind == STATUS:
        as_list(raw, f, 2, exact=2)
        return Status(MemberStatus.from_wire(raw[1], f"{f}.status"))
    if kind == XFER_CANCEL:
        as_list(raw, f, 2, exact=2)
        return XferCancel(as_int(raw[1], f"{f}.xfer_id"))
    if kind == XFER_FAIL:
        as_list(raw, f, 3, exact=3)
        return XferFail(as_int(raw[1], f"{f}.xfer_id"), _segments(raw[2], f"{f}.segments"))
    raise WireError(f"{f}.type: unknown grid message type {kind!r}")


def decode_payload(data: bytes, limits: GridLimits = DEFAULT_LIMITS) -> list[GridMessage]:
    """Decode and validate one payload; raises WireError naming the bad field."""
    if type(data) is not bytes:
        raise WireError(f"grid: expected bytes, got {type(data).__name__}")
    if len(data) > limits.max_payload_bytes:
        raise WireError(f"grid: {len(data)} bytes exceed the limit of {limits.max_payload_bytes}")
    max_array = max(limits.max_messages, limits.max_batch_entries, MAX_SEGMENTS)
    frame = unpack_bounded(data, "grid", limits.max_payload_bytes, max_array)
    parts = as_list(frame, "grid", 2, exact=2)
    version = as_int(parts[0], "grid.version")
    if version != GRID_FORMAT_VERSION:
        raise WireError(f"grid.version: unsupported grid format {version} (this member speaks {GRID_FORMAT_VERSION})")
    raw_msgs = as_list(parts[1], "grid.messages", limits.max_messages)
    out = []
    for i, raw in enumerate(raw_msgs):
        try:
            out.append(_decode_one(raw, f"grid.messages[{i}]", limits))
        except WireError:
            raise
        except (ValueError, TypeError) as exc:  # e.g. a CH that violates its invariants
            raise WireError(f"grid.messages[{i}]: {exc}") from None
    return out
