"""Pure parsing and validation of HTTP requests: keys, deadlines, batch and transaction bodies, cursors.

Every function takes decoded input (text, a decoded body) and returns what the grid takes, or raises
:class:`BadBatch` / ValueError with a message naming the bad field: the handlers answer it as a 400."""

from __future__ import annotations

import base64
import binascii
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import Any

import msgpack

from ..lifespan import LIFESPAN_PARAM, check_lifespan, parse_lifespan
from ..messages import DELETE, GET, PUT
from ..payload import DEFAULT_LIMITS
from ..tx.messages import TxId

# A key travels in the URL: keep it well inside the request-line limit of servers and proxies (8 KiB).
MAX_KEY_BYTES = 4096
MAX_VALUE_BYTES = DEFAULT_LIMITS.max_value_bytes
# Keys in a batch travel in the body, so they may be any bytes up to the grid's own key limit.
MAX_BATCH_KEY_BYTES = DEFAULT_LIMITS.max_key_bytes
MAX_BATCH_OPS = 10_000
MAX_BATCH_BYTES = 32 * 1024 * 1024
MAX_SCAN_LIMIT = 10_000
DEFAULT_SCAN_LIMIT = 1000
MSGPACK_TYPES = frozenset({"application/msgpack", "application/x-msgpack", "application/vnd.msgpack"})
OP_KINDS = {"get": GET, "put": PUT, "delete": DELETE}
_NO_VALUE_KINDS = {"get": GET, "delete": DELETE}
# Keys one transaction may name (reads, writes and locks together): the grid's per-message limit (TxLimits).
MAX_TX_KEYS = 4096
MAX_VERSION = (1 << 63) - 1
TX_MODES = ("optimistic", "pessimistic")
# The client's deadline for this attempt, a Unix time in seconds ("1764170000.250"): the member refuses to start
# the request after it, and operations started before it send no attempt after it (docs/grid.md, "Client
# deadlines"). The clients send it with every request.
DEADLINE_HEADER = "X-Grid-Deadline"


def parse_deadline(raw: str) -> float:
    """The value of an ``X-Grid-Deadline`` header as a Unix time; ValueError says what is wrong with it."""
    try:
        deadline = float(raw)
    except ValueError:
        deadline = math.nan
    if not math.isfinite(deadline) or deadline <= 0:
        shown = raw if len(raw) <= 40 else raw[:40] + "..."
        raise ValueError(f"{DEADLINE_HEADER}: expected a Unix time in seconds (e.g. 1764170000.25), got {shown!r}")
    return deadline


def accepts_msgpack(accept: str) -> bool:
    """Whether an ``Accept`` header names a msgpack type (then the answer is msgpack, else JSON)."""
    return any(t.strip().split(";")[0] in MSGPACK_TYPES for t in accept.split(","))


def body_is_msgpack(content_type: str) -> bool:
    """Whether a body of this ``Content-Type`` is msgpack (True) or JSON (False); ValueError for any other type
    (answered 415)."""
    if content_type in MSGPACK_TYPES:
        return True
    if content_type == "application/json":
        return False
    raise ValueError(
        f"Content-Type {content_type or '(none)'} is not supported: use application/msgpack or application/json"
    )


def parse_kv_lifespan(method: str, given: Sequence[str]) -> float:
    """The ``?lifespan=S`` of a key/value request (``given``: every value of the parameter), or ValueError: only a
    PUT takes one, once, and S must be a usable lifespan (:func:`~..lifespan.parse_lifespan`)."""
    if method != "PUT":
        raise ValueError(f"{LIFESPAN_PARAM}: only a PUT takes a lifespan, not a {method}")
    if len(given) > 1:
        raise ValueError(f"{LIFESPAN_PARAM}: given {len(given)} times; give it once")
    return parse_lifespan(given[0])


def parse_page(segment: str, query: Mapping[str, str]) -> tuple[int, int]:
    """(segment, page limit) of a ``/v1/segments/{id}`` or ``/v1/changes/{id}`` request, or ValueError. The query
    takes ``after`` (read by the endpoint) and ``limit`` (default :data:`DEFAULT_SCAN_LIMIT`)."""
    # isdecimal, not isdigit: int() refuses the digits that are not decimal ("²"), which would be a 500.
    if not segment.isdecimal():
        raise ValueError(f"segment: expected a segment number, got {segment!r}")
    unknown = sorted(set(query) - {"after", "limit"})
    if unknown:
        raise ValueError(f"unknown query parameter(s) {', '.join(unknown)} (after, limit)")
    limit_text = query.get("limit", str(DEFAULT_SCAN_LIMIT))
    if not limit_text.isdecimal() or not 1 <= int(limit_text) <= MAX_SCAN_LIMIT:
        raise ValueError(f"limit: expected 1 to {MAX_SCAN_LIMIT}, got {limit_text!r}")
    return int(segment), int(limit_text)


def parse_change_version(text: str) -> int:
    """The ``after`` version of a change-feed page (an integer 0 to 2^63-1), or ValueError."""
    if not text.isdecimal() or int(text) >= 1 << 63:
        raise ValueError(f"after: expected a version (an integer >= 0), got {text!r}")
    return int(text)


def parse_key(raw: str) -> bytes:
    """The key bytes of a decoded URL path segment, or ValueError saying what is wrong with it."""
    if not raw:
        raise ValueError("missing key: use /v1/kv/{key}")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in raw):
        raise ValueError("bad key: control characters are not allowed")
    try:
        key = raw.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("bad key: not valid UTF-8") from None
    if len(key) > MAX_KEY_BYTES:
        raise ValueError(f"bad key: {len(key)} bytes exceed the limit of {MAX_KEY_BYTES}")
    return key


class BadBatch(ValueError):
    """A malformed batch body; the message names the field."""


def _field_bytes(value: Any, where: str, binary: bool) -> bytes:
    """A key or value from a decoded body: raw bytes in msgpack, a base64 string in JSON."""
    if binary:
        if type(value) is not bytes:
            raise BadBatch(f"{where}: expected bytes (msgpack bin), got {type(value).__name__}")
        return value
    if type(value) is not str:
        raise BadBatch(f"{where}: expected a base64 string, got {type(value).__name__}")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise BadBatch(f"{where}: not valid base64") from None


def _batch_lifespan(options: Any, where: str) -> float:
    """The lifespan of a batch put from its options map (``{"lifespan": seconds}``), or :class:`BadBatch`."""
    if not isinstance(options, dict):
        raise BadBatch(f'{where}: expected a map {{"lifespan": seconds}}, got {type(options).__name__}')
    unknown = sorted(str(k) for k in options if k != LIFESPAN_PARAM)
    if unknown:
        raise BadBatch(f'{where}: unknown field(s) {", ".join(unknown)} (only "lifespan")')
    if LIFESPAN_PARAM not in options:
        raise BadBatch(f'{where}: missing "lifespan" (leave the map out for an entry that never expires)')
    seconds = options[LIFESPAN_PARAM]
    if type(seconds) not in (int, float):
        raise BadBatch(f"{where}.lifespan: expected a number of seconds, got {type(seconds).__name__}")
    try:
        return check_lifespan(seconds, f"{where}.lifespan")
    except ValueError as exc:
        raise BadBatch(str(exc)) from None


def parse_batch(
    doc: Any, binary: bool, lifespans: list[float | None] | None = None
) -> list[tuple[int, bytes, bytes | None]]:
    """``(kind, key, value)`` for every operation of a decoded batch body, or :class:`BadBatch`.

    A put may carry a fourth element ``{"lifespan": seconds}``. ``lifespans`` receives one entry per operation
    (seconds, or None for no lifespan) when at least one put carries one, and stays empty otherwise; without
    that list a lifespan is refused (:class:`BadBatch`)."""
    ops = _batch_ops(doc)
    if binary:
        fast = _parse_uniform(ops)
        if fast is not None:
            return fast
    out: list[tuple[int, bytes, bytes | None]] = []
    # Filled from the first put with a lifespan on (None for the operations before it): a batch without any
    # builds no list.
    spans: list[float | None] | None = None
    for i, op in enumerate(ops):
        if not isinstance(op, list) or not 2 <= len(op) <= 4:
            raise BadBatch(
                f'ops[{i}]: expected [op, key], ["put", key, value] or ["put", key, value, {{"lifespan": s}}]'
            )
        kind = OP_KINDS.get(op[0]) if isinstance(op[0], str) else None
        if kind is None:
            raise BadBatch(f"ops[{i}][0]: unknown op {op[0]!r} (expected get, put or delete)")
        key = _field_bytes(op[1], f"ops[{i}][1] (key)", binary)
        if not 1 <= len(key) <= MAX_BATCH_KEY_BYTES:
            raise BadBatch(f"ops[{i}][1] (key): {len(key)} bytes is outside [1, {MAX_BATCH_KEY_BYTES}]")
        value = None
        if kind == PUT:
            value = _batch_put_value(op, i, binary)
            if len(op) == 4:
                if lifespans is None:
                    raise BadBatch(f"ops[{i}][3].lifespan: lifespans are not accepted here")
                if spans is None:
                    spans = [None] * i
                spans.append(_batch_lifespan(op[3], f"ops[{i}][3]"))
            elif spans is not None:
                spans.append(None)
        else:
            _check_no_value(op, i)
            if spans is not None:
                spans.append(None)
        out.append((kind, key, value))
    if spans is not None and lifespans is not None:
        lifespans.extend(spans)
    return out


def _batch_ops(doc: Any) -> list[Any]:
    """The operations list of a batch body ``{"ops": [...]}``: a non-empty list within the limit."""
    if not isinstance(doc, dict) or "ops" not in doc:
        raise BadBatch('body: expected a map {"ops": [[op, key, value?], ...]}')
    unknown = sorted(str(k) for k in doc if k != "ops")
    if unknown:
        raise BadBatch(f'body: unknown field(s) {", ".join(unknown)} (only "ops")')
    ops = doc["ops"]
    if not isinstance(ops, list):
        raise BadBatch(f"ops: expected a list, got {type(ops).__name__}")
    if not ops:
        raise BadBatch("ops: empty (give at least one operation)")
    if len(ops) > MAX_BATCH_OPS:
        raise BadBatch(f"ops: {len(ops)} operations exceed the limit of {MAX_BATCH_OPS}")
    return ops


def _batch_put_value(op: list[Any], i: int, binary: bool) -> bytes:
    """The value of put ``ops[i]``, within the size limit."""
    if len(op) < 3:
        raise BadBatch(f'ops[{i}]: put needs a value: ["put", key, value]')
    value = _field_bytes(op[2], f"ops[{i}][2] (value)", binary)
    if len(value) > MAX_VALUE_BYTES:
        raise BadBatch(f"ops[{i}][2] (value): {len(value)} bytes exceed the limit of {MAX_VALUE_BYTES}")
    return value


def _check_no_value(op: list[Any], i: int) -> None:
    """A get or delete ``ops[i]`` is ``[op, key]``: no value, no lifespan."""
    if len(op) == 2:
        return
    if isinstance(op[-1], dict) and LIFESPAN_PARAM in op[-1]:
        raise BadBatch(f"ops[{i}]: {op[0]} takes no lifespan (only a put does)")
    raise BadBatch(f"ops[{i}]: {op[0]} takes no value: [{op[0]!r}, key]")


_LIST_TYPE = {list}
_BYTES_TYPE = {bytes}
_STR_TYPE = {str}
_PUT_KIND = {"put"}
_LEN_3 = {3}
_LEN_2 = {2}


def _parse_uniform(ops: list[Any]) -> list[tuple[int, bytes, bytes | None]] | None:
    """:func:`parse_batch` of a msgpack batch of only puts, or of only gets and deletes, with every check done
    per column (C-level ``map``/``set``/``min``/``max``) instead of per operation: what clients send (the
    Spark writer sends millions of puts). None when anything is off or mixed; the per-operation loop then
    runs and names the first bad operation."""
    if set(map(type, ops)) != _LIST_TYPE:
        return None
    lens = set(map(len, ops))
    if lens == _LEN_3:
        kinds, keys, values = zip(*ops, strict=True)
        if (
            set(map(type, kinds)) != _STR_TYPE  # first: set() of unhashable names would raise
            or set(kinds) != _PUT_KIND
            or set(map(type, keys)) != _BYTES_TYPE
            or set(map(type, values)) != _BYTES_TYPE
            or max(map(len, values)) > MAX_VALUE_BYTES
        ):
            return None
        out: list[tuple[int, bytes, bytes | None]] = list(zip(repeat(PUT), keys, values))
    elif lens == _LEN_2:
        names, keys = zip(*ops, strict=True)
        if (
            set(map(type, names)) != _STR_TYPE
            or not set(names) <= _NO_VALUE_KINDS.keys()
            or set(map(type, keys)) != _BYTES_TYPE
        ):
            return None
        out = list(zip(map(_NO_VALUE_KINDS.__getitem__, names), keys, repeat(None)))
    else:
        return None
    if min(map(len, keys)) < 1 or max(map(len, keys)) > MAX_BATCH_KEY_BYTES:
        return None
    return out


@dataclass(frozen=True, slots=True)
class TxRequest:
    """A parsed transaction body: ``writes`` (value None deletes), ``reads`` (key -> version read, 0 = absent),
    ``lock`` (keys to lock first; pessimistic only) and ``mode`` (None: the grid's default)."""

    mode: str | None
    reads: dict[bytes, int]
    writes: dict[bytes, bytes | None]
    lock: tuple[bytes, ...]


def _tx_key(value: Any, where: str, binary: bool) -> bytes:
    key = _field_bytes(value, where, binary)
    if not 1 <= len(key) <= MAX_BATCH_KEY_BYTES:
        raise BadBatch(f"{where}: {len(key)} bytes is outside [1, {MAX_BATCH_KEY_BYTES}]")
    return key


def _key_label(raw: Any) -> str:
    """A map key as it appears in an error message (shortened)."""
    text = repr(raw)
    return text if len(text) <= 40 else text[:37] + "..."


def _tx_map(doc: dict[str, Any], name: str) -> dict[Any, Any]:
    value = doc.get(name, {})
    if value is None:
        return {}
    if not isinstance(value, dict):
        kind = "{key: version}" if name == "reads" else "{key: value or null}"
        raise BadBatch(f"{name}: expected a map {kind}, got {type(value).__name__}")
    if len(value) > MAX_TX_KEYS:
        raise BadBatch(f"{name}: {len(value)} keys exceed the limit of {MAX_TX_KEYS}")
    return value


def parse_mode(doc: dict[str, Any]) -> str | None:
    mode = doc.get("mode")
    if mode is None:
        return None
    if not isinstance(mode, str) or mode not in TX_MODES:
        raise BadBatch(f"mode: expected {' or '.join(repr(m) for m in TX_MODES)}, got {mode!r}")
    return mode


def _check_fields(doc: Any, allowed: tuple[str, ...], shape: str) -> dict[str, Any]:
    if not isinstance(doc, dict):
        raise BadBatch(f"body: expected a map {shape}, got {type(doc).__name__}")
    unknown = sorted(str(k) for k in doc if k not in allowed)
    if unknown:
        raise BadBatch(f"body: unknown field(s) {', '.join(unknown)} (expected {', '.join(allowed)})")
    return doc


def parse_tx(doc: Any, binary: bool, *, interactive: bool = False) -> TxRequest:
    """The transaction in a decoded ``POST /v1/tx`` body (``interactive``: a ``/v1/tx/{id}/commit`` body, which
    takes no ``mode`` or ``lock``), or :class:`BadBatch` naming the field. Keys are bytes in msgpack and base64
    strings in JSON (map keys too)."""
    allowed = ("reads", "writes") if interactive else ("mode", "reads", "writes", "lock")
    doc = _check_fields(doc, allowed, '{"reads": {key: version}, "writes": {key: value or null}}')
    mode = None if interactive else parse_mode(doc)
    reads: dict[bytes, int] = {}
    for raw, version in _tx_map(doc, "reads").items():
        where = f"reads[{_key_label(raw)}]"
        key = _tx_key(raw, f"{where} (key)", binary)
        if type(version) is not int or not 0 <= version <= MAX_VERSION:
            raise BadBatch(f"{where}: expected a version (an integer 0 to 2^63-1; 0 = read as absent), got {version!r}")
        if key in reads:
            raise BadBatch(f"{where}: the key is given twice")
        reads[key] = version
    writes: dict[bytes, bytes | None] = {}
    for raw, value in _tx_map(doc, "writes").items():
        where = f"writes[{_key_label(raw)}]"
        key = _tx_key(raw, f"{where} (key)", binary)
        if key in writes:
            raise BadBatch(f"{where}: the key is given twice")
        if value is None:
            writes[key] = None
            continue
        data = _field_bytes(value, f"{where} (value)", binary)
        if len(data) > MAX_VALUE_BYTES:
            raise BadBatch(f"{where} (value): {len(data)} bytes exceed the limit of {MAX_VALUE_BYTES}")
        writes[key] = data
    lock: tuple[bytes, ...] = ()
    if not interactive:
        lock = parse_keys(doc.get("lock", []), "lock", binary)
        if lock:
            if mode == "optimistic":
                raise BadBatch('lock: an optimistic transaction locks nothing ahead (give "mode": "pessimistic")')
            mode = "pessimistic"
    if not writes and not reads and not lock and not interactive:
        raise BadBatch('body: an empty transaction (give "writes", "reads" or "lock")')
    if len(reads.keys() | writes.keys() | set(lock)) > MAX_TX_KEYS:
        raise BadBatch(f"body: the transaction names more than {MAX_TX_KEYS} distinct keys")
    return TxRequest(mode, reads, writes, lock)


def parse_keys(value: Any, name: str, binary: bool) -> tuple[bytes, ...]:
    """A list of keys (``lock``, ``keys``): at least one when given, no duplicates."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise BadBatch(f"{name}: expected a list of keys, got {type(value).__name__}")
    if len(value) > MAX_TX_KEYS:
        raise BadBatch(f"{name}: {len(value)} keys exceed the limit of {MAX_TX_KEYS}")
    keys: list[bytes] = []
    seen: set[bytes] = set()
    for i, raw in enumerate(value):
        key = _tx_key(raw, f"{name}[{i}]", binary)
        if key in seen:
            raise BadBatch(f"{name}[{i}]: the key is given twice")
        seen.add(key)
        keys.append(key)
    return tuple(keys)


def parse_tx_begin(doc: Any) -> str | None:
    """The mode of a ``POST /v1/tx/begin`` body (None for an empty body: the grid's default)."""
    if doc is None:
        return None
    return parse_mode(_check_fields(doc, ("mode",), '{"mode": "optimistic" or "pessimistic"}'))


def parse_tx_lock(doc: Any, binary: bool) -> tuple[bytes, ...]:
    doc = _check_fields(doc, ("keys",), '{"keys": [key, ...]}')
    if "keys" not in doc:
        raise BadBatch('keys: missing (give {"keys": [key, ...]})')
    keys = parse_keys(doc["keys"], "keys", binary)
    if not keys:
        raise BadBatch("keys: empty (give at least one key)")
    return keys


def parse_tx_resolve(doc: Any, binary: bool) -> tuple[bool | None, dict[bytes, int], bool]:
    """``{"commit": bool, "versions": {key: version}}`` (versions optional: other members' stamped versions,
    which a commit may need), or ``{"cluster": true, "commit": bool or null}`` (resolve on every member from
    this one; null: the grid's own rule decides) -> (commit, versions, cluster)."""
    doc = _check_fields(doc, ("commit", "versions", "cluster"), '{"commit": true or false}')
    cluster = doc.get("cluster", False)
    if type(cluster) is not bool:
        raise BadBatch(f"cluster: expected true (resolve on every member from this one) or false, got {cluster!r}")
    commit = doc.get("commit")
    if cluster and "versions" in doc:
        raise BadBatch("versions: not with cluster (the member collects every member's versions itself)")
    if cluster and commit is None:
        return None, {}, True
    if type(commit) is not bool:
        also = ", or null with cluster" if cluster else ""
        raise BadBatch(f"commit: expected true (commit) or false (roll back){also}, got {commit!r}")
    versions: dict[bytes, int] = {}
    for raw, version in _tx_map(doc, "versions").items():
        where = f"versions[{_key_label(raw)}]"
        key = _tx_key(raw, f"{where} (key)", binary)
        if type(version) is not int or not 1 <= version <= MAX_VERSION:
            raise BadBatch(f"{where}: expected a version (an integer 1 to 2^63-1), got {version!r}")
        versions[key] = version
    return commit, versions, cluster


def parse_tx_id(text: str) -> TxId:
    """A transaction id from a URL (``host:port#incarnation/seq``), or :class:`BadBatch`."""
    try:
        return TxId.parse(text)
    except (ValueError, TypeError) as exc:
        raise BadBatch(f"transaction id {text[:80]!r}: {exc} (ids look like 127.0.0.1:7800#123/4)") from None


def no_duplicates(pairs: list[tuple[Any, Any]]) -> dict[Any, Any]:
    out: dict[Any, Any] = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"the map key {_key_label(k)} is given twice")
        out[k] = v
    return out


def unpack_body(raw: bytes, pairs_hook: Callable[[list[tuple[Any, Any]]], Any] | None = None) -> Any:
    """A msgpack batch body with every length bounded (as :func:`~...core.wire.unpack_bounded` does for peers,
    but a map is allowed at the top). Arrays get twice the operation limit, so a list just over the limit
    still decodes and :func:`parse_batch` says which limit it broke."""
    return msgpack.unpackb(
        raw,
        raw=False,
        strict_map_key=True,
        max_bin_len=MAX_VALUE_BYTES + MAX_BATCH_KEY_BYTES,
        max_str_len=MAX_BATCH_KEY_BYTES,
        max_array_len=2 * MAX_BATCH_OPS,
        # A transaction's reads and writes are maps of keys; a batch body is a map of one field.
        max_map_len=2 * MAX_TX_KEYS if pairs_hook is not None else 8,
        max_ext_len=0,
        object_pairs_hook=pairs_hook,
    )


def decode_body(raw: bytes, binary: bool, *, strict: bool) -> Any:
    """A request body decoded from msgpack (``binary``) or JSON, or :class:`BadBatch` (a 400). ``strict``: a map
    that names a key twice is refused."""
    hook = no_duplicates if strict else None
    try:
        return unpack_body(raw, hook) if binary else json.loads(raw, object_pairs_hook=hook)
    except (ValueError, msgpack.UnpackException) as exc:
        raise BadBatch(f"body: not valid {'msgpack' if binary else 'JSON'} ({exc})") from None
    except Exception as exc:  # msgpack raises assorted errors on hostile input; all of them mean "bad body"
        raise BadBatch(f"body: not valid {'msgpack' if binary else 'JSON'} ({type(exc).__name__})") from None


_B64URL = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"


def decode_cursor(text: str) -> bytes:
    # The cursor is base64url without padding; the decoder silently skips foreign characters, so check first.
    bad = ValueError("after: not a cursor from a previous page (base64url)")
    if not text or text.strip(_B64URL):
        raise bad
    try:
        key = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        raise bad from None
    if not key:
        raise bad
    return key


def encode_cursor(key: bytes) -> str:
    return base64.urlsafe_b64encode(key).decode("ascii").rstrip("=")
