"""The column forms of grid messages: the packed chunk of state-transfer entries (:class:`EntryChunk`) and
the batches of operations, answers, backups and their acknowledgements (:class:`CommandBatch`,
:class:`ResponseBatch`, :class:`BackupBatch`, :class:`BackupAckBatch`), each a message whose fields travel as
columns, with the packing and bulk checks of those columns.
"""

from __future__ import annotations

import math
import sys
from array import array
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import msgpack

from ..core.errors import WireError
from ..core.validate import MAX_INT, as_int, as_list, as_str
from ..core.wire import unpack_bounded
from .messages import (
    BACKUP_ACK_BATCH,
    BACKUP_BATCH,
    CMD_BATCH,
    DELETE,
    ERROR,
    GET,
    MAX_ERROR_LEN,
    NOT_FOUND,
    OK,
    PUT,
    RETRY,
    RSP_BATCH,
    Backup,
    BackupAck,
    Command,
    Response,
)

if TYPE_CHECKING:
    from .payload import GridLimits

_BIG_ENDIAN = sys.byteorder == "big"
_EMPTY = b""


def _versions_blob(versions: Iterable[int]) -> bytes:
    """Versions as little-endian unsigned 64-bit integers, 8 bytes each."""
    arr = array("Q", versions)
    if _BIG_ENDIAN:
        arr.byteswap()
    return arr.tobytes()


class EntryChunk:
    """A batch of state-transfer entries of one segment as three columns: keys, versions, values (None: a
    tombstone), and optionally a fourth, ``expiries`` (each entry's expiry as a Unix time, 0.0: none; None when
    no entry of the chunk expires). Keys are distinct.

    On the wire it is *one* msgpack bin inside the XFER_DATA message, holding
    ``[keys, versions, values, tombstones, expiries]``: keys and values as lists of bin (a tombstone's value is
    an empty bin, its index listed in ``tombstones``), versions as one bin of little-endian uint64s, expiries
    one bin of little-endian float64s or nil. Per entry that is
    two bin objects and eight bytes instead of a list with three fields, so both sides handle a chunk in a few
    C-level calls rather than a Python step per entry (docs/grid.md, "state transfer"). :meth:`decode` checks
    the whole chunk in bulk: the types (one ``join`` per column), the limits, distinct keys.
    """

    __slots__ = ("_blob", "_nbytes", "expiries", "keys", "values", "versions")

    def __init__(
        self,
        keys: list[bytes],
        versions: list[int] | array,
        values: list[bytes | None],
        expiries: list[float] | array | None = None,
    ) -> None:
        if not len(keys) == len(versions) == len(values):
            raise ValueError(f"EntryChunk: {len(keys)} keys, {len(versions)} versions, {len(values)} values")
        if expiries is not None and len(expiries) != len(keys):
            raise ValueError(f"EntryChunk: {len(expiries)} expiries for {len(keys)} keys")
        self.keys = keys
        self.versions = versions
        self.values = values
        self.expiries = expiries
        self._blob: bytes | None = None
        self._nbytes: int | None = None

    @classmethod
    def of(cls, entries: Iterable[tuple[bytes, int, bytes | None]]) -> EntryChunk:
        """A chunk from ``(key, version, value)`` tuples (tests, small batches)."""
        rows = list(entries)
        return cls([e[0] for e in rows], [e[1] for e in rows], [e[2] for e in rows])

    def __len__(self) -> int:
        return len(self.keys)

    def __iter__(self) -> Iterator[tuple[bytes, int, bytes | None]]:
        return zip(self.keys, self.versions, self.values, strict=True)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, EntryChunk):
            return (self.keys, list(self.versions), self.values, _col(self.expiries)) == (
                other.keys,
                list(other.versions),
                other.values,
                _col(other.expiries),
            )
        if isinstance(other, list):
            return list(self) == [tuple(e) for e in other]
        return NotImplemented

    # No __hash__: a class that defines __eq__ and not __hash__ gets __hash__ = None (mutable columns).

    def __repr__(self) -> str:
        return f"EntryChunk({len(self)} entries)"

    @property
    def nbytes(self) -> int:
        """Key and value bytes (what the rebalance counters report)."""
        if self._nbytes is None:
            self._nbytes = sum(map(len, self.keys)) + sum(map(len, filter(None, self.values)))
        return self._nbytes

    @property
    def blob(self) -> bytes:
        """The packed form (built once: the size estimate and the encoder share it)."""
        if self._blob is None:
            values = self.values
            tombs: list[int] = []
            if None in values:
                tombs = [i for i, v in enumerate(values) if v is None]
                values = [_EMPTY if v is None else v for v in values]
            expiries = _deadlines_blob(self.expiries) if self.expiries is not None else None
            self._blob = msgpack.packb(
                [self.keys, _versions_blob(self.versions), values, tombs, expiries], use_bin_type=True
            )
        return self._blob

    @classmethod
    def decode(cls, blob: Any, field: str, lim: GridLimits) -> EntryChunk:
        """Validate and unpack a chunk received from a peer; :class:`WireError` names what is wrong."""
        if type(blob) is not bytes:
            raise WireError(f"{field}: expected bytes (a packed chunk), got {type(blob).__name__}")
        # The bin bound covers the versions column too; the key and value limits are checked below.
        max_bin = max(lim.max_value_bytes, lim.max_key_bytes, 8 * lim.max_batch_entries)
        parts = as_list(unpack_bounded(blob, field, max_bin, lim.max_batch_entries), field, 5, exact=5)
        keys, vblob, values, tombs, eblob = parts
        keys = as_list(keys, f"{field}.keys", lim.max_batch_entries)
        values = as_list(values, f"{field}.values", lim.max_batch_entries)
        n = len(keys)
        if len(values) != n:
            raise WireError(f"{field}.values: {len(values)} values for {n} keys")
        if type(vblob) is not bytes or len(vblob) != 8 * n:
            got = f"{len(vblob)} bytes" if type(vblob) is bytes else type(vblob).__name__
            raise WireError(f"{field}.versions: expected {8 * n} bytes (8 per key), got {got}")
        # Types in bulk: join accepts only bytes-like items, and the decoder produces no bytes-like type but
        # bytes. The joined length bounds every item, so one comparison usually settles the size limits.
        try:
            key_bytes = len(_EMPTY.join(keys))
        except TypeError:
            i = next(i for i, k in enumerate(keys) if type(k) is not bytes)
            raise WireError(f"{field}.keys[{i}]: expected bytes, got {type(keys[i]).__name__}") from None
        if key_bytes > lim.max_key_bytes and max(map(len, keys)) > lim.max_key_bytes:
            i = next(i for i, k in enumerate(keys) if len(k) > lim.max_key_bytes)
            raise WireError(f"{field}.keys[{i}]: {len(keys[i])} bytes exceed the limit of {lim.max_key_bytes}")
        try:
            value_bytes = len(_EMPTY.join(values))
        except TypeError:
            i = next(i for i, v in enumerate(values) if type(v) is not bytes)
            raise WireError(f"{field}.values[{i}]: expected bytes, got {type(values[i]).__name__}") from None
        if value_bytes > lim.max_value_bytes and max(map(len, values)) > lim.max_value_bytes:
            i = next(i for i, v in enumerate(values) if len(v) > lim.max_value_bytes)
            raise WireError(f"{field}.values[{i}]: {len(values[i])} bytes exceed the limit of {lim.max_value_bytes}")
        # Versions are at most MAX_INT (2**63 - 1): the top byte of each little-endian uint64 is below 0x80.
        if not vblob[7::8].isascii():
            i = next(i for i in range(n) if vblob[8 * i + 7] >= 0x80)
            raise WireError(f"{field}.versions[{i}]: above the limit of {MAX_INT}")
        if len(set(keys)) != n:
            raise WireError(f"{field}.keys: a key is listed twice")
        tombs = as_list(tombs, f"{field}.tombstones", n)
        if tombs:
            seen: set[int] = set()
            for j, i in enumerate(tombs):
                as_int(i, f"{field}.tombstones[{j}]", 0, n - 1)
                if i in seen:
                    raise WireError(f"{field}.tombstones: index {i} is listed twice")
                if values[i]:
                    raise WireError(f"{field}.values[{i}]: a tombstone carries no value")
                seen.add(i)
                values[i] = None
        versions = array("Q")
        versions.frombytes(vblob)
        if _BIG_ENDIAN:
            versions.byteswap()
        expiries = _deadlines(eblob, f"{field}.expiries", n) if eblob is not None else None
        chunk = cls(keys, versions, values, expiries)
        chunk._blob = blob
        chunk._nbytes = key_bytes + value_bytes  # tombstones' placeholders are empty
        return chunk


# ==== batches of operations (grid format 3) ==============================================================
# What one member sends one destination in one step (a POST /v1/batch of a thousand operations makes such
# steps) travels as one message per kind, its fields as columns: integers as one bin of little-endian uint64s,
# small codes as one bin of bytes, keys and values as lists of bin. Both sides handle a batch in a few C-level
# calls plus one loop over its entries, instead of a message object, a list and a dispatch per operation. The
# node fills a batch while it is the last message queued for its destination, so the order of messages to a
# destination is what the single messages would have had, and a batch's entries are handled in order.
# Builders cap a batch (:data:`BATCH_MAX_ENTRIES`, :data:`BATCH_MAX_BYTES`) well below the decoding limits.
BATCH_MAX_ENTRIES = 4096
BATCH_MAX_BYTES = 512 * 1024


def _u64s(blob: Any, field: str, n: int) -> array:
    """A column of ``n`` integers in [0, MAX_INT] packed as little-endian uint64s, checked in bulk."""
    if type(blob) is not bytes or len(blob) != 8 * n:
        got = f"{len(blob)} bytes" if type(blob) is bytes else type(blob).__name__
        raise WireError(f"{field}: expected {8 * n} bytes (8 per entry), got {got}")
    if not blob[7::8].isascii():  # the top byte of a little-endian uint64 <= MAX_INT is below 0x80
        i = next(i for i in range(n) if blob[8 * i + 7] >= 0x80)
        raise WireError(f"{field}[{i}]: above the limit of {MAX_INT}")
    out = array("Q")
    out.frombytes(blob)
    if _BIG_ENDIAN:
        out.byteswap()
    return out


def _codes(blob: Any, field: str, n: int, allowed: bytes) -> bytearray:
    """A column of ``n`` one-byte codes, each one of ``allowed`` (a bytearray, as a batch being built holds)."""
    if type(blob) is not bytes or len(blob) != n:
        got = f"{len(blob)} bytes" if type(blob) is bytes else type(blob).__name__
        raise WireError(f"{field}: expected {n} bytes (1 per entry), got {got}")
    if blob.translate(None, allowed):
        i = next(i for i, c in enumerate(blob) if c not in allowed)
        raise WireError(f"{field}[{i}]: {blob[i]} is not one of {list(allowed)}")
    return bytearray(blob)


def _bins(items: Any, field: str, n: int, max_len: int, *, nullable: bool = False) -> int:
    """Check a list of ``n`` bins (None allowed where ``nullable``), each at most ``max_len`` bytes; returns
    the bytes they hold. One ``join`` checks the types (it takes only bytes-like items, and the decoder makes
    no bytes-like type but bytes), and the joined length usually settles the size limit."""
    if type(items) is not list or len(items) != n:
        got = f"{len(items)} items" if type(items) is list else type(items).__name__
        raise WireError(f"{field}: expected a list of {n} items, got {got}")
    present = [v for v in items if v is not None] if nullable else items
    try:
        total = len(_EMPTY.join(present))
    except TypeError:
        i = next(i for i, v in enumerate(items) if type(v) is not bytes and not (nullable and v is None))
        raise WireError(f"{field}[{i}]: expected bytes, got {type(items[i]).__name__}") from None
    if total > max_len and max(map(len, present)) > max_len:
        i = next(i for i, v in enumerate(items) if v is not None and len(v) > max_len)
        raise WireError(f"{field}[{i}]: {len(items[i])} bytes exceed the limit of {max_len}")
    return total


class _Batch:
    """Columns shared by the batch messages; ``nbytes`` counts keys and values (for the builders' cap)."""

    __slots__ = ("nbytes",)
    nbytes: int

    def full(self, extra: int) -> bool:
        """Whether an entry of ``extra`` key and value bytes must start a new batch (the node checks the entry
        count itself, inline). A single entry above the byte cap still goes, alone."""
        return self.nbytes + extra > BATCH_MAX_BYTES and self.nbytes > 0

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return all(_col(getattr(self, f)) == _col(getattr(other, f)) for f in type(self).__slots__ if f != "nbytes")

    # No __hash__: defining __eq__ alone makes the batches unhashable (mutable while one is built).


def _col(v: Any) -> Any:
    return list(v) if isinstance(v, (array, bytearray, bytes)) else v


class CommandBatch(_Batch):
    """Client operations for one owner, all tagged with the originator's topology ``topology_id``.

    Wire: ``[CMD_BATCH, topology_id, op_ids, attempts, kinds, keys, put_values, deadlines, expiries]``: op ids
    and attempts as uint64 columns, kinds one byte each, keys a list of bin, the values of the PUTs only, in
    order (GET and DELETE carry none, so a value cannot be on the wrong operation), the clients' deadlines and
    the PUTs' expiries as little-endian float64 columns (0.0: none), each nil when no operation has one.
    """

    __slots__ = ("attempts", "deadlines", "expiries", "keys", "kinds", "op_ids", "topology_id", "values")

    def __init__(self, topology_id: int) -> None:
        self.topology_id = topology_id
        self.op_ids: list[int] | array = []
        self.attempts: list[int] | array = []
        self.kinds = bytearray()
        self.keys: list[bytes] = []
        self.values: list[bytes | None] = []
        self.deadlines: list[float] | array = []
        self.expiries: list[float] | array = []
        self.nbytes = 0

    def add(
        self,
        op_id: int,
        attempt: int,
        kind: int,
        key: bytes,
        value: bytes | None,
        deadline: float = 0.0,
        expires: float = 0.0,
    ) -> None:
        self.op_ids.append(op_id)
        self.attempts.append(attempt)
        self.kinds.append(kind)
        self.keys.append(key)
        self.values.append(value)
        self.deadlines.append(deadline)
        self.expiries.append(expires)
        self.nbytes += len(key) + (len(value) if value is not None else 0)

    def __len__(self) -> int:
        return len(self.keys)

    def __repr__(self) -> str:
        return f"CommandBatch(topology {self.topology_id}, {len(self)} operations)"

    def commands(self) -> list[Command]:
        tid = self.topology_id
        return [
            Command(o, a, tid, k, key, v if k == PUT else None, d, e if k == PUT else 0.0)
            for o, a, k, key, v, d, e in zip(
                self.op_ids,
                self.attempts,
                self.kinds,
                self.keys,
                self.values,
                self.deadlines,
                self.expiries,
                strict=True,
            )
        ]

    def to_wire(self) -> list[Any]:
        puts = [v for v in self.values if v is not None]
        return [CMD_BATCH, self.topology_id, _versions_blob(self.op_ids), _versions_blob(self.attempts),
                bytes(self.kinds), self.keys, puts, _deadlines_blob(self.deadlines),
                _deadlines_blob(self.expiries)]  # fmt: skip

    @classmethod
    def from_wire(cls, raw: list[Any], f: str, lim: GridLimits) -> CommandBatch:
        as_list(raw, f, 9, exact=9)
        tid = as_int(raw[1], f"{f}.topology_id")
        keys = as_list(raw[5], f"{f}.keys", lim.max_batch_entries)
        n = len(keys)
        b = cls(tid)
        b.op_ids = _u64s(raw[2], f"{f}.op_ids", n)
        b.attempts = _u64s(raw[3], f"{f}.attempts", n)
        kinds = b.kinds = _codes(raw[4], f"{f}.kinds", n, bytes((GET, PUT, DELETE)))
        b.nbytes = _bins(keys, f"{f}.keys", n, lim.max_key_bytes)
        puts = raw[6]
        b.nbytes += _bins(puts, f"{f}.values", kinds.count(PUT), lim.max_value_bytes)
        it = iter(puts)
        b.keys = keys
        b.values = [next(it) if k == PUT else None for k in kinds]
        b.deadlines = _deadlines(raw[7], f"{f}.deadlines", n)
        b.expiries = _deadlines(raw[8], f"{f}.expiries", n)
        return b


def _deadlines_blob(deadlines: list[float] | array) -> bytes | None:
    """A column of Unix times (deadlines, expiries) as little-endian float64s, or None when every entry is 0.0
    (none)."""
    if not any(deadlines):
        return None
    arr = array("d", deadlines)
    if _BIG_ENDIAN:
        arr.byteswap()
    return arr.tobytes()


def _deadlines(raw: Any, f: str, n: int) -> list[float] | array:
    """A column of Unix times from the wire (see :func:`_deadlines_blob`): nil, or 8 bytes per entry, each a
    finite non-negative float64."""
    if raw is None:
        return [0.0] * n
    if type(raw) is not bytes or len(raw) != 8 * n:
        got = f"{len(raw)} bytes" if type(raw) is bytes else type(raw).__name__
        raise WireError(f"{f}: expected nil or {8 * n} bytes (8 per operation), got {got}")
    arr = array("d")
    arr.frombytes(raw)
    if _BIG_ENDIAN:
        arr.byteswap()
    # One pass in C: a NaN or an infinity makes the sum non-finite, a negative entry the minimum negative.
    if n and (not math.isfinite(sum(arr)) or min(arr) < 0):
        i = next(i for i, d in enumerate(arr) if not (math.isfinite(d) and d >= 0))
        raise WireError(f"{f}[{i}]: expected a Unix time (finite, not negative), got {arr[i]}")
    return arr


class ResponseBatch(_Batch):
    """Answers to one originator's operations, each with its own code and topology id (as :class:`Response`).

    Wire: ``[RSP_BATCH, op_ids, attempts, codes, topology_ids, values, errors, versions]``: values a list of
    bin or nil per entry, errors ``[[index, text], ...]`` for the entries that have one, versions a uint64
    column (a GET's entry version, else 0).
    """

    __slots__ = ("attempts", "codes", "errors", "op_ids", "topology_ids", "values", "versions")

    def __init__(self) -> None:
        self.op_ids: list[int] | array = []
        self.attempts: list[int] | array = []
        self.codes = bytearray()
        self.topology_ids: list[int] | array = []
        self.values: list[bytes | None] = []
        self.errors: dict[int, str] = {}
        self.versions: list[int] | array = []
        self.nbytes = 0

    def add(
        self, op_id: int, attempt: int, code: int, tid: int, value: bytes | None, error: str, version: int = 0
    ) -> None:
        if error:
            self.errors[len(self.values)] = error
        self.versions.append(version)
        self.op_ids.append(op_id)
        self.attempts.append(attempt)
        self.codes.append(code)
        self.topology_ids.append(tid)
        self.values.append(value)
        self.nbytes += (len(value) if value is not None else 0) + len(error)

    def __len__(self) -> int:
        return len(self.values)

    def __repr__(self) -> str:
        return f"ResponseBatch({len(self)} answers)"

    def responses(self) -> list[Response]:
        err = self.errors
        return [
            Response(o, a, c, t, v, err.get(i, ""), ver)
            for i, (o, a, c, t, v, ver) in enumerate(
                zip(self.op_ids, self.attempts, self.codes, self.topology_ids, self.values, self.versions, strict=True)
            )
        ]

    def to_wire(self) -> list[Any]:
        return [RSP_BATCH, _versions_blob(self.op_ids), _versions_blob(self.attempts), bytes(self.codes),
                _versions_blob(self.topology_ids), self.values, [[i, e] for i, e in self.errors.items()],
                _versions_blob(self.versions)]  # fmt: skip

    @classmethod
    def from_wire(cls, raw: list[Any], f: str, lim: GridLimits) -> ResponseBatch:
        as_list(raw, f, 8, exact=8)
        values = as_list(raw[5], f"{f}.values", lim.max_batch_entries)
        n = len(values)
        b = cls()
        b.op_ids = _u64s(raw[1], f"{f}.op_ids", n)
        b.attempts = _u64s(raw[2], f"{f}.attempts", n)
        b.codes = _codes(raw[3], f"{f}.codes", n, bytes((OK, NOT_FOUND, RETRY, ERROR)))
        b.topology_ids = _u64s(raw[4], f"{f}.topology_ids", n)
        b.nbytes = _bins(values, f"{f}.values", n, lim.max_value_bytes, nullable=True)
        b.values = values
        for j, item in enumerate(as_list(raw[6], f"{f}.errors", n)):
            pair = as_list(item, f"{f}.errors[{j}]", 2, exact=2)
            i = as_int(pair[0], f"{f}.errors[{j}].index", 0, n - 1)
            if i in b.errors:
                raise WireError(f"{f}.errors[{j}]: entry {i} is listed twice")
            b.errors[i] = as_str(pair[1], f"{f}.errors[{j}].text", MAX_ERROR_LEN)
        b.versions = _u64s(raw[7], f"{f}.versions", n)
        return b


class BackupBatch(_Batch):
    """Writes a primary applied, for one backup owner, all under the primary's topology ``topology_id``.

    Wire: ``[BACKUP_BATCH, topology_id, write_ids, versions, keys, values, expiries]``: ids and versions as
    uint64 columns, values a list of bin or nil (a delete), expiries a float64 column (0.0: none) or nil when no
    entry has one. A key may appear more than once; entries apply in order.
    """

    __slots__ = ("expiries", "keys", "topology_id", "values", "versions", "write_ids")

    def __init__(self, topology_id: int) -> None:
        self.topology_id = topology_id
        self.write_ids: list[int] | array = []
        self.versions: list[int] | array = []
        self.keys: list[bytes] = []
        self.values: list[bytes | None] = []
        self.expiries: list[float] | array = []
        self.nbytes = 0

    def add(self, write_id: int, version: int, key: bytes, value: bytes | None, expires: float = 0.0) -> None:
        self.write_ids.append(write_id)
        self.versions.append(version)
        self.keys.append(key)
        self.values.append(value)
        self.expiries.append(expires)
        self.nbytes += len(key) + (len(value) if value is not None else 0)

    def __len__(self) -> int:
        return len(self.keys)

    def __repr__(self) -> str:
        return f"BackupBatch(topology {self.topology_id}, {len(self)} writes)"

    def backups(self) -> list[Backup]:
        tid = self.topology_id
        return [
            Backup(w, tid, ver, k, v, e)
            for w, ver, k, v, e in zip(
                self.write_ids, self.versions, self.keys, self.values, self.expiries, strict=True
            )
        ]

    def to_wire(self) -> list[Any]:
        return [BACKUP_BATCH, self.topology_id, _versions_blob(self.write_ids), _versions_blob(self.versions),
                self.keys, self.values, _deadlines_blob(self.expiries)]  # fmt: skip

    @classmethod
    def from_wire(cls, raw: list[Any], f: str, lim: GridLimits) -> BackupBatch:
        as_list(raw, f, 7, exact=7)
        tid = as_int(raw[1], f"{f}.topology_id")
        keys = as_list(raw[4], f"{f}.keys", lim.max_batch_entries)
        n = len(keys)
        b = cls(tid)
        b.write_ids = _u64s(raw[2], f"{f}.write_ids", n)
        b.versions = _u64s(raw[3], f"{f}.versions", n)
        b.nbytes = _bins(keys, f"{f}.keys", n, lim.max_key_bytes)
        b.nbytes += _bins(raw[5], f"{f}.values", n, lim.max_value_bytes, nullable=True)
        b.keys = keys
        b.values = raw[5]
        b.expiries = _deadlines(raw[6], f"{f}.expiries", n)
        return b


class BackupAckBatch(_Batch):
    """Acknowledgements of backups to one primary, each with its own code and topology id (as
    :class:`BackupAck`). Wire: ``[BACKUP_ACK_BATCH, write_ids, codes, topology_ids]``."""

    __slots__ = ("codes", "topology_ids", "write_ids")

    def __init__(self) -> None:
        self.write_ids: list[int] | array = []
        self.codes = bytearray()
        self.topology_ids: list[int] | array = []
        self.nbytes = 0

    def add(self, write_id: int, code: int, tid: int) -> None:
        self.write_ids.append(write_id)
        self.codes.append(code)
        self.topology_ids.append(tid)

    def __len__(self) -> int:
        return len(self.codes)

    def __repr__(self) -> str:
        return f"BackupAckBatch({len(self)} acknowledgements)"

    def acks(self) -> list[BackupAck]:
        return [BackupAck(w, c, t) for w, c, t in zip(self.write_ids, self.codes, self.topology_ids, strict=True)]

    def to_wire(self) -> list[Any]:
        return [BACKUP_ACK_BATCH, _versions_blob(self.write_ids), bytes(self.codes), _versions_blob(self.topology_ids)]

    @classmethod
    def from_wire(cls, raw: list[Any], f: str, lim: GridLimits) -> BackupAckBatch:
        as_list(raw, f, 4, exact=4)
        codes = raw[2]
        if type(codes) is not bytes or len(codes) > lim.max_batch_entries:
            got = f"{len(codes)} bytes" if type(codes) is bytes else type(codes).__name__
            raise WireError(f"{f}.codes: expected at most {lim.max_batch_entries} bytes (1 per entry), got {got}")
        n = len(codes)
        b = cls()
        b.write_ids = _u64s(raw[1], f"{f}.write_ids", n)
        b.codes = _codes(codes, f"{f}.codes", n, bytes((OK, NOT_FOUND, RETRY, ERROR)))
        b.topology_ids = _u64s(raw[3], f"{f}.topology_ids", n)
        return b


BATCH_TYPES: dict[int, Any] = {
    CMD_BATCH: CommandBatch,
    RSP_BATCH: ResponseBatch,
    BACKUP_BATCH: BackupBatch,
    BACKUP_ACK_BATCH: BackupAckBatch,
}


def unbatched(messages: Iterable[Any]) -> list[Any]:
    """``messages`` with every batch replaced by its entries as single messages, in order (tests, tracing)."""
    out: list[Any] = []
    for m in messages:
        t = type(m)
        if t is CommandBatch:
            out += m.commands()
        elif t is ResponseBatch:
            out += m.responses()
        elif t is BackupBatch:
            out += m.backups()
        elif t is BackupAckBatch:
            out += m.acks()
        else:
            out.append(m)
    return out
