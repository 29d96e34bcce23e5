"""The grid wire format: versioned msgpack payloads carrying batches of grid messages, strictly validated.

    payload = [GRID_FORMAT_VERSION, [message, ...]]
    message = [type, field, ...]          (one list per message; the fields of each type are in :func:`_wire`,
                                           a batch's in :mod:`.columns`)

A payload travels as the body of one group message (unicast or multicast), so the messages a member emits
for one destination in one step share a payload. :func:`decode_payload` checks every field and every size
a peer controls and raises :class:`~groupcluster.core.errors.WireError` naming the bad field; the node drops
the payload and counts it. The messages themselves are in :mod:`.messages`, their column forms in
:mod:`.columns`, the transaction messages that share the payload in :mod:`.tx.messages`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, cast

import msgpack

from ..core.errors import WireError
from ..core.validate import MAX_INT, as_bool, as_bytes, as_int, as_list, as_str
from ..core.wire import unpack_bounded
from .columns import BATCH_TYPES, BackupAckBatch, BackupBatch, CommandBatch, EntryChunk, ResponseBatch, unbatched
from .consistent_hash import MAX_SEGMENTS
from .messages import (
    BACKUP,
    BACKUP_ACK,
    CMD,
    CONFIRM,
    FETCH,
    MAX_ERROR_LEN,
    PUT,
    RSP,
    STATUS,
    TOPOLOGY,
    XFER_ACK,
    XFER_CANCEL,
    XFER_DATA,
    XFER_FAIL,
    Backup,
    BackupAck,
    Command,
    Confirm,
    Fetch,
    Response,
    Status,
    Topology,
    XferAck,
    XferCancel,
    XferData,
    XferFail,
)
from .topology import CacheTopology, MemberStatus
from .tx.messages import (
    TX_TYPES,
    TxAck,
    TxCommit,
    TxInfoAck,
    TxLimits,
    TxLock,
    TxLockInfo,
    TxMessage,
    TxPrepare,
    TxReportAnswer,
    TxReportRequest,
    TxRollback,
    TxVote,
    decode_tx_message,
    tx_to_wire,
)

# 2: XFER_DATA carries its entries as one packed chunk (:class:`EntryChunk`) instead of a list per entry.
# 3: operations, responses, backups and their acknowledgements travel as batches (CMD_BATCH, RSP_BATCH,
#    BACKUP_BATCH, BACKUP_ACK_BATCH: one message per destination and step, fields as columns).
# 4: the transaction messages (types 20-27, grid/tx/messages.py) share the payload, and answers carry the
#    version of the entry a GET read (RSP and RSP_BATCH gain a version field; 0 when absent or not a GET).
# 5: topologies carry the grid's id and the re-stamp topology of the last merge of grids that never met
#    (CacheTopology.grid_id, restamp), so the members of a merged group order those grids' writes by time.
#    Also TX_REPORT_REQ and TX_REPORT (types 28-29): the automatic resolution of in-doubt transactions.
# 6: operations carry their client's deadline (CMD gains a field, CMD_BATCH a column; docs/grid.md, "Client
#    deadlines"), so an owner does not apply a write its client has given up on.
# 7: entries may expire (docs/grid.md, "Expiry"): CMD and BACKUP gain an expiry field (a Unix time, 0.0:
#    none), CMD_BATCH and BACKUP_BATCH an expiry column, and a transfer chunk an expiry column (nil: none).
# 8: topologies carry the id of the topology that fixed their stable set (CacheTopology.stable_id): after a
#    merge of degraded partitions the coordinator counts the majority against the newest one.
# 9: topologies carry the owners the grid lost without a handoff (CacheTopology.lost), and a status may carry
#    those its member lost (MemberStatus.lost): a member that took over data of a side cut off from the rest
#    does not leave alone with the only copy.
# 10: a status may carry the coordinators its member joined while it held no topology (MemberStatus.joined,
#    after its lost owners), so a coordinator can tell that no grid exists that a member belongs to before it
#    starts an empty one.
GRID_FORMAT_VERSION = 10


@dataclass(frozen=True, slots=True)
class GridLimits:
    """Bounds on what a peer can make us allocate."""

    max_payload_bytes: int = 8 * 1024 * 1024
    max_messages: int = 8192
    max_key_bytes: int = 64 * 1024
    max_value_bytes: int = 4 * 1024 * 1024
    max_batch_entries: int = 100_000


DEFAULT_LIMITS = GridLimits()


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
    | CommandBatch
    | ResponseBatch
    | BackupBatch
    | BackupAckBatch
    | TxMessage
)

_TX_CLASSES: frozenset[type] = frozenset(
    (TxLock, TxPrepare, TxVote, TxCommit, TxRollback, TxAck, TxLockInfo, TxInfoAck, TxReportRequest, TxReportAnswer)
)


def _wire(msg: GridMessage) -> list[Any]:  # noqa: C901  one case per message type, as the decoder
    # ``type(msg) is`` (not isinstance): the exact classes, as the decoder makes them; the checker narrows it.
    if (
        type(msg) is BackupBatch
        or type(msg) is BackupAckBatch
        or type(msg) is ResponseBatch
        or type(msg) is CommandBatch
    ):
        if len(msg) == 1:
            # A batch of one goes as its single message: half the cost to encode and decode (no columns).
            return _wire(unbatched([msg])[0])
        return msg.to_wire()
    if type(msg) is Command:
        return [CMD, msg.op_id, msg.attempt, msg.topology_id, msg.kind, msg.key, msg.value, msg.deadline, msg.expires]
    if type(msg) is Response:
        return [RSP, msg.op_id, msg.attempt, msg.code, msg.topology_id, msg.value, msg.error, msg.version]
    if type(msg) is Backup:
        return [BACKUP, msg.write_id, msg.topology_id, msg.version, msg.key, msg.value, msg.expires]
    if type(msg) is BackupAck:
        return [BACKUP_ACK, msg.write_id, msg.code, msg.topology_id]
    if type(msg) is XferData:
        return [XFER_DATA, msg.xfer_id, msg.segment, _chunk(msg.entries).blob, list(msg.done), msg.last]
    if type(msg) is XferAck:
        return [XFER_ACK, msg.xfer_id]
    if type(msg) is Fetch:
        return [FETCH, msg.xfer_id, msg.topology_id, msg.rebalance_id, list(msg.segments)]
    if type(msg) is Confirm:
        return [CONFIRM, msg.topology_id]
    if type(msg) is Topology:
        return [TOPOLOGY, msg.topology.to_wire()]
    if type(msg) is Status:
        return [STATUS, msg.status.to_wire()]
    if type(msg) is XferCancel:
        return [XFER_CANCEL, msg.xfer_id]
    if type(msg) is XferFail:
        return [XFER_FAIL, msg.xfer_id, list(msg.segments)]
    if type(msg) in _TX_CLASSES:
        return tx_to_wire(cast(TxMessage, msg))  # _TX_CLASSES holds exactly the classes of TxMessage
    raise TypeError(f"not a grid message: {msg!r}")


def _chunk(entries: EntryChunk | Iterable[tuple[bytes, int, bytes | None]]) -> EntryChunk:
    return entries if type(entries) is EntryChunk else EntryChunk.of(entries)


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


def _unix_time(v: Any, field: str) -> float:
    """A Unix time as a float (0.0: none), finite and not negative."""
    if type(v) is not float or not 0.0 <= v < math.inf:
        shown = v if type(v) in (int, float) else type(v).__name__
        raise WireError(f"{field}: expected a Unix time as a float (0.0: none), got {shown}")
    return v


def _uint(v: Any) -> bool:
    return type(v) is int and 0 <= v <= MAX_INT


def _decode_fast(raw: Any, lim: GridLimits) -> GridMessage | None:
    """The per-operation messages when every field is well-formed, checked inline (no field names built);
    None sends the message to :func:`_decode_one`, which names what is wrong. Batches of thousands of
    operations made the generic validators' per-field calls and names a large share of a member's time."""
    if type(raw) is not list:
        return None
    n = len(raw)
    if n == 9:
        kind, a, b, c, d, e, g, h, x = raw
        if kind == CMD and (
            _uint(a)
            and _uint(b)
            and _uint(c)
            and type(d) is int
            and 0 <= d <= 2
            and type(e) is bytes
            and len(e) <= lim.max_key_bytes
            and (g is None if d != PUT else (type(g) is bytes and len(g) <= lim.max_value_bytes))
            and type(h) is float
            and 0.0 <= h < math.inf
            and type(x) is float
            and (x == 0.0 or (d == PUT and 0.0 < x < math.inf))
        ):
            return Command(a, b, c, d, e, g, h, x)
    elif n == 8:
        kind, a, b, c, d, e, g, h = raw
        if kind == RSP and (
            _uint(a)
            and _uint(b)
            and type(c) is int
            and 0 <= c <= 3
            and _uint(d)
            and (e is None or (type(e) is bytes and len(e) <= lim.max_value_bytes))
            and type(g) is str
            and len(g) <= MAX_ERROR_LEN
            and _uint(h)
        ):
            return Response(a, b, c, d, e, g, h)
    elif n == 7:
        kind, a, b, c, d, e, x = raw
        if kind == BACKUP and (
            _uint(a)
            and _uint(b)
            and _uint(c)
            and type(d) is bytes
            and len(d) <= lim.max_key_bytes
            and (e is None or (type(e) is bytes and len(e) <= lim.max_value_bytes))
            and type(x) is float
            and 0.0 <= x < math.inf
        ):
            return Backup(a, b, c, d, e, x)
    elif n == 4:
        kind, a, b, c = raw
        if kind == BACKUP_ACK and _uint(a) and type(b) is int and 0 <= b <= 3 and _uint(c):
            return BackupAck(a, b, c)
    elif n == 2:
        kind, a = raw
        if kind == XFER_ACK and _uint(a):
            return XferAck(a)
    return None


def _decode_one(raw: Any, f: str, lim: GridLimits) -> GridMessage:  # noqa: C901  one case per message kind
    if type(raw) is not list or not raw:
        raise WireError(f"{f}: expected a non-empty list")
    kind = raw[0]
    if kind == CMD:
        as_list(raw, f, 9, exact=9)
        op = as_int(raw[4], f"{f}.kind", 0, 2)
        value = _opt_bytes(raw[6], f"{f}.value", lim.max_value_bytes)
        if (op == PUT) != (value is not None):
            raise WireError(f"{f}.value: a PUT carries a value, GET and DELETE do not")
        deadline = raw[7]
        if type(deadline) is not float or not 0.0 <= deadline < math.inf:
            shown = deadline if type(deadline) in (int, float) else type(deadline).__name__
            raise WireError(f"{f}.deadline: expected a Unix time as a float (0.0: none), got {shown}")
        expires = _unix_time(raw[8], f"{f}.expires")
        if expires and op != PUT:
            raise WireError(f"{f}.expires: only a PUT carries an expiry")
        return Command(
            as_int(raw[1], f"{f}.op_id"),
            as_int(raw[2], f"{f}.attempt"),
            as_int(raw[3], f"{f}.topology_id"),
            op,
            as_bytes(raw[5], f"{f}.key", lim.max_key_bytes),
            value,
            deadline,
            expires,
        )
    if kind == RSP:
        as_list(raw, f, 8, exact=8)
        return Response(
            as_int(raw[1], f"{f}.op_id"),
            as_int(raw[2], f"{f}.attempt"),
            as_int(raw[3], f"{f}.code", 0, 3),
            as_int(raw[4], f"{f}.topology_id"),
            _opt_bytes(raw[5], f"{f}.value", lim.max_value_bytes),
            as_str(raw[6], f"{f}.error", MAX_ERROR_LEN),
            as_int(raw[7], f"{f}.version", 0, MAX_INT),
        )
    if kind == BACKUP:
        as_list(raw, f, 7, exact=7)
        return Backup(
            as_int(raw[1], f"{f}.write_id"),
            as_int(raw[2], f"{f}.topology_id"),
            as_int(raw[3], f"{f}.version", 0, MAX_INT),
            as_bytes(raw[4], f"{f}.key", lim.max_key_bytes),
            _opt_bytes(raw[5], f"{f}.value", lim.max_value_bytes),
            _unix_time(raw[6], f"{f}.expires"),
        )
    if kind == BACKUP_ACK:
        as_list(raw, f, 4, exact=4)
        return BackupAck(
            as_int(raw[1], f"{f}.write_id"), as_int(raw[2], f"{f}.code", 0, 3), as_int(raw[3], f"{f}.topology_id")
        )
    if kind == XFER_DATA:
        as_list(raw, f, 6, exact=6)
        return XferData(
            as_int(raw[1], f"{f}.xfer_id"),
            as_int(raw[2], f"{f}.segment", 0, MAX_SEGMENTS - 1),
            EntryChunk.decode(raw[3], f"{f}.entries", lim),
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
    batch = BATCH_TYPES.get(kind) if type(kind) is int else None
    if batch is not None:
        return batch.from_wire(raw, f, lim)
    if type(kind) is int and kind in TX_TYPES:
        return decode_tx_message(raw, f, _tx_limits(lim))
    raise WireError(f"{f}.type: unknown grid message type {kind!r}")


def _tx_limits(lim: GridLimits) -> TxLimits:
    """The transaction messages' bounds under the grid's: the same key and value sizes."""
    cached = _TX_LIMITS.get(lim)
    if cached is None:
        cached = _TX_LIMITS[lim] = TxLimits(
            max_payload_bytes=lim.max_payload_bytes,
            max_messages=lim.max_messages,
            max_key_bytes=lim.max_key_bytes,
            max_value_bytes=lim.max_value_bytes,
        )
    return cached


_TX_LIMITS: dict[GridLimits, TxLimits] = {}


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
    fast = _decode_fast
    for i, raw in enumerate(raw_msgs):
        msg = fast(raw, limits)
        if msg is not None:
            out.append(msg)
            continue
        try:
            out.append(_decode_one(raw, f"grid.messages[{i}]", limits))
        except WireError:
            raise
        except (ValueError, TypeError) as exc:  # e.g. a CH that violates its invariants
            raise WireError(f"grid.messages[{i}]: {exc}") from None
    return out
