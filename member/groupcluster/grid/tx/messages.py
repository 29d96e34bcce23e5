"""The wire format of grid transactions (docs/grid-transactions.md): versioned msgpack payloads carrying
batches of two-phase-commit messages, strictly validated.

    payload = [TX_FORMAT_VERSION, [message, ...]]
    message = [type, field, ...]

The types are TX_LOCK (pessimistic: lock keys before the commit), TX_PREPARE, TX_VOTE (the answer to both),
TX_COMMIT, TX_ROLLBACK, TX_ACK (the answer to both) and TX_LOCK_INFO (state transfer: the transactions that
hold or wait for locks in given segments). A transaction id is ``[originator address, sequence]``.

Inside a member these messages travel in the grid payload (:mod:`..messages`, format 5), under their own type
numbers (20 and up, apart from the grid's); :func:`tx_to_wire` and :func:`decode_tx_message` are the per-message
halves the grid codec uses. The standalone payload (:func:`encode_tx_payload`) is what the core's unit tests
exchange. TX_INFO_ACK acknowledges a TX_LOCK_INFO: the pushing owner re-sends the information until the new
primary acknowledges it, since a new primary blocks lock acquisition until it has it. TX_REPORT_REQ and
TX_REPORT are the automatic resolution of in-doubt transactions: the view coordinator asks every member for
its reports, and decides from all of them (:class:`~.resolution.TxResolver`).

:func:`decode_tx_payload` checks every field and every size a peer controls and raises
:class:`~groupcluster.core.errors.WireError` naming the bad field.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgpack

from ...core.address import Address
from ...core.errors import WireError
from ...core.validate import MAX_INT, as_address, as_bool, as_bytes, as_int, as_list, as_str
from ...core.wire import unpack_bounded
from ..consistent_hash import MAX_SEGMENTS

TX_FORMAT_VERSION = 1

# Type numbers continue after the grid's (1-12), so both can share one payload once wired together.
TX_LOCK, TX_PREPARE, TX_VOTE, TX_COMMIT, TX_ROLLBACK, TX_ACK, TX_LOCK_INFO = 20, 21, 22, 23, 24, 25, 26
TX_INFO_ACK = 27
TX_REPORT_REQ, TX_REPORT = 28, 29
TX_TYPES = frozenset(
    (TX_LOCK, TX_PREPARE, TX_VOTE, TX_COMMIT, TX_ROLLBACK, TX_ACK, TX_LOCK_INFO, TX_INFO_ACK, TX_REPORT_REQ, TX_REPORT)
)

# Votes (answers to TX_LOCK and TX_PREPARE). RETRY: the sender's topology is newer than the message's; the
# originator retries on the owners of a topology at least as new as the one in the vote.
YES, NO, VOTE_RETRY = 0, 1, 2
VOTE_NAMES = {YES: "YES", NO: "NO", VOTE_RETRY: "RETRY"}

# Acks (answers to TX_COMMIT and TX_ROLLBACK). ACK_RETRY: the decision was applied, but the sender's topology
# is newer, so other members may own the keys now: send the decision to the owners of that topology too.
# ACK_ROLLED_BACK / ACK_COMMITTED: the sender already holds the *other* outcome for this attempt (a late or
# forged message); it keeps what it has and says so, and the originator reports the inconsistency.
ACK_OK, ACK_RETRY, ACK_ROLLED_BACK, ACK_COMMITTED = 0, 2, 3, 4
ACK_NAMES = {ACK_OK: "OK", ACK_RETRY: "RETRY", ACK_ROLLED_BACK: "ROLLED_BACK", ACK_COMMITTED: "COMMITTED"}

# Record states carried by TX_LOCK_INFO (the participant's states, see tx.TxState).
INFO_ACTIVE, INFO_PREPARED = 0, 1

# A member's state of a transaction in a TX_REPORT: tx.TxState's values, and REPORT_UNKNOWN (no record here).
REPORT_UNKNOWN, REPORT_MAX_STATE = -1, 3

MAX_REASON_LEN = 512


@dataclass(frozen=True, slots=True)
class TxLimits:
    """Bounds on what a peer can make us allocate."""

    max_payload_bytes: int = 8 * 1024 * 1024
    max_messages: int = 4096
    max_tx_keys: int = 4096  # keys of one transaction in one message
    max_key_bytes: int = 64 * 1024
    max_value_bytes: int = 4 * 1024 * 1024
    max_records: int = 100_000  # transactions in one TX_LOCK_INFO, reports in one TX_REPORT
    max_view: int = 4096  # members named by one report (the view at the transaction's prepare)


DEFAULT_TX_LIMITS = TxLimits()


@dataclass(frozen=True, order=True, slots=True)
class TxId:
    """A transaction: its originator and a sequence the originator never reuses (ordered, so tables can list
    transactions deterministically)."""

    origin: Address
    seq: int

    def to_wire(self) -> list[Any]:
        return [self.origin.to_wire(), self.seq]

    @classmethod
    def from_wire(cls, data: Any, field: str) -> TxId:
        items = as_list(data, field, 2, exact=2)
        return cls(as_address(items[0], f"{field}.origin"), as_int(items[1], f"{field}.seq"))

    def __str__(self) -> str:
        return f"{self.origin}/{self.seq}"

    @classmethod
    def parse(cls, text: str) -> TxId:
        """The inverse of ``str(tx)``: ``host:port#incarnation/seq``; ValueError says what is wrong."""
        if type(text) is not str:
            raise ValueError(f"transaction id: expected a string, got {type(text).__name__}")
        origin, sep, seq = text.rpartition("/")
        if not sep or not origin:
            raise ValueError(f"transaction id {text!r}: expected originator/sequence (e.g. 10.0.0.1:7800#3/12)")
        if not seq.isdigit() or not seq.isascii():
            raise ValueError(f"transaction id {text!r}: the sequence {seq!r} is not a non-negative integer")
        try:
            address = Address.parse(origin)
        except ValueError as exc:
            raise ValueError(f"transaction id {text!r}: bad originator: {exc}") from None
        return cls(address, int(seq))


# key -> new value, None for a delete
Write = tuple[bytes, bytes | None]
# key -> version, None for a delete: what a commit applies on every owner
VersionedWrite = tuple[bytes, int, bytes | None]


@dataclass(frozen=True, slots=True)
class TxLock:
    """Pessimistic locking: lock ``keys`` (the recipient is their primary) for the transaction, now."""

    tx: TxId
    attempt: int
    request: int  # numbers the lock requests of one transaction (from 1); its vote echoes it
    topology_id: int
    keys: tuple[bytes, ...]


@dataclass(frozen=True, slots=True)
class TxPrepare:
    """Phase one, sent to every owner of every written key.

    ``writes`` are the writes of keys the recipient owns; ``lock_keys`` those it is the primary of (it locks
    them, validates ``reads`` and stamps versions; as a backup it records backup locks for the others).
    ``reads``: key -> version read by the transaction (0: absent), checked by the primary in optimistic mode.
    ``wait``: whether the recipient may queue for a lock another transaction holds. False for optimistic
    transactions: a held key makes it vote NO at once (a conflict), so they never wait for each other and
    cannot deadlock. Absent on the wire (an older sender): True.
    ``floors``: key -> version the transaction read, for written keys the recipient backs up (not its
    lock keys). The primary validated that read under the lock and stamps above it, so every write it orders
    before this transaction has a version at most the floor and every write after it a greater one than this
    transaction's: a backup that must stamp the write itself, because the primary died with the version,
    stamps ``floor + 1`` and lands between them (TxTable.late_version). Absent on the wire: none.
    """

    tx: TxId
    attempt: int
    topology_id: int
    lock_keys: tuple[bytes, ...]
    writes: tuple[Write, ...]
    reads: tuple[tuple[bytes, int], ...] = ()
    wait: bool = True
    floors: tuple[tuple[bytes, int], ...] = ()


@dataclass(frozen=True, slots=True)
class TxVote:
    """The answer to TX_LOCK and TX_PREPARE. A YES to a prepare carries the versions the primary stamped for
    its lock keys; the commit carries them to every owner, so all owners store the same version.

    ``request`` 0 answers the prepare, n > 0 the lock request n: a late answer to a lock request can never
    count as a prepare vote."""

    tx: TxId
    attempt: int
    request: int
    code: int
    topology_id: int
    versions: tuple[tuple[bytes, int], ...] = ()
    reason: str = ""


@dataclass(frozen=True, slots=True)
class TxCommit:
    """Phase two, commit. Self-contained (writes with their versions), so a member that never saw the
    prepare (a new owner after a topology change) applies it all the same."""

    tx: TxId
    attempt: int
    topology_id: int
    writes: tuple[VersionedWrite, ...]
    # Sent by a resolver (the view coordinator's automatic resolution, an operator's resolve), not by the
    # originator's own two-phase commit: a participant in doubt takes it even when it comes from the
    # originator's address (the coordinator may be the originator, back after a partition). Absent on the wire
    # (an older sender): False.
    resolved: bool = False


@dataclass(frozen=True, slots=True)
class TxRollback:
    """Phase two, rollback: release everything the transaction holds (attempts up to ``attempt``)."""

    tx: TxId
    attempt: int
    topology_id: int
    resolved: bool = False  # as TxCommit.resolved


@dataclass(frozen=True, slots=True)
class TxAck:
    tx: TxId
    attempt: int
    code: int
    topology_id: int


@dataclass(frozen=True, slots=True)
class TxRecordInfo:
    """One transaction's lock information for some segments (state transfer; see tx.TxTable.export_segments).

    ``lock_keys`` are the keys it holds or waits for (as primary, or as backup locks); ``writes`` and
    ``versions`` what its prepare carried and what the primary stamped, so the new owner can commit it;
    ``floors`` the prepare's floors of the pushed backup keys (see TxPrepare; absent on the wire: none)."""

    tx: TxId
    attempt: int
    state: int  # INFO_ACTIVE or INFO_PREPARED
    in_doubt: bool
    lock_keys: tuple[bytes, ...]
    writes: tuple[Write, ...]
    versions: tuple[tuple[bytes, int], ...]
    floors: tuple[tuple[bytes, int], ...] = ()


@dataclass(frozen=True, slots=True)
class TxLockInfo:
    topology_id: int
    segments: tuple[int, ...]
    records: tuple[TxRecordInfo, ...]


@dataclass(frozen=True, slots=True)
class TxInfoAck:
    """The new primary got the TX_LOCK_INFO of ``segments`` the sender pushed under ``topology_id``."""

    topology_id: int
    segments: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class TxReportRequest:
    """The view coordinator asks a member for its reports (automatic resolution of in-doubt transactions):
    those of ``txs`` and of every transaction in doubt on the member (``txs`` empty: only those), or prepared
    there with an originator outside ``members`` (the coordinator's view: the member may not have installed it
    yet, and would otherwise report nothing until the next view change)."""

    request_id: int
    txs: tuple[TxId, ...] = ()
    members: tuple[Address, ...] = ()


@dataclass(frozen=True, slots=True)
class TxReportInfo:
    """One member's report of one transaction, as a TX_REPORT carries it.

    ``state``: a ``tx.TxState`` value or REPORT_UNKNOWN. ``deciding``: the member is the transaction's
    originator and has not decided yet (a resolver must wait). ``views``: the members of the view at the
    transaction's prepare here (or at the import of its lock information): a member of it that left may have
    committed the transaction and taken its data away by state transfer."""

    tx: TxId
    state: int
    attempt: int
    in_doubt: bool
    deciding: bool
    writes: tuple[Write, ...]
    versions: tuple[tuple[bytes, int], ...]
    views: tuple[Address, ...]


@dataclass(frozen=True, slots=True)
class TxReportAnswer:
    """The answer to a TX_REPORT_REQ: the request's id and the member's reports."""

    request_id: int
    reports: tuple[TxReportInfo, ...]


TxMessage = (
    TxLock
    | TxPrepare
    | TxVote
    | TxCommit
    | TxRollback
    | TxAck
    | TxLockInfo
    | TxInfoAck
    | TxReportRequest
    | TxReportAnswer
)


def _record_wire(r: TxRecordInfo) -> list[Any]:
    return [
        r.tx.to_wire(),
        r.attempt,
        r.state,
        r.in_doubt,
        list(r.lock_keys),
        [list(w) for w in r.writes],
        [list(v) for v in r.versions],
        *([[list(f) for f in r.floors]] if r.floors else []),
    ]


def _report_wire(r: TxReportInfo) -> list[Any]:
    return [
        r.tx.to_wire(),
        r.state,
        r.attempt,
        r.in_doubt,
        r.deciding,
        [list(w) for w in r.writes],
        [list(v) for v in r.versions],
        [m.to_wire() for m in r.views],
    ]


def _wire(msg: TxMessage) -> list[Any]:
    if isinstance(msg, TxPrepare):
        return [
            TX_PREPARE,
            msg.tx.to_wire(),
            msg.attempt,
            msg.topology_id,
            list(msg.lock_keys),
            [list(w) for w in msg.writes],
            [list(r) for r in msg.reads],
            msg.wait,
            *([[list(f) for f in msg.floors]] if msg.floors else []),
        ]
    if isinstance(msg, TxVote):
        vs = [list(v) for v in msg.versions]
        # Reasons name keys, which may be long: cut to what a receiver accepts (a longer one would make it
        # refuse the whole payload).
        reason = msg.reason[:MAX_REASON_LEN]
        return [TX_VOTE, msg.tx.to_wire(), msg.attempt, msg.request, msg.code, msg.topology_id, vs, reason]
    if isinstance(msg, TxCommit):
        out = [TX_COMMIT, msg.tx.to_wire(), msg.attempt, msg.topology_id, [list(w) for w in msg.writes]]
        if msg.resolved:
            out.append(True)
        return out
    if isinstance(msg, TxRollback):
        out = [TX_ROLLBACK, msg.tx.to_wire(), msg.attempt, msg.topology_id]
        if msg.resolved:
            out.append(True)
        return out
    if isinstance(msg, TxAck):
        return [TX_ACK, msg.tx.to_wire(), msg.attempt, msg.code, msg.topology_id]
    if isinstance(msg, TxLock):
        return [TX_LOCK, msg.tx.to_wire(), msg.attempt, msg.request, msg.topology_id, list(msg.keys)]
    if isinstance(msg, TxLockInfo):
        return [TX_LOCK_INFO, msg.topology_id, list(msg.segments), [_record_wire(r) for r in msg.records]]
    if isinstance(msg, TxInfoAck):
        return [TX_INFO_ACK, msg.topology_id, list(msg.segments)]
    if isinstance(msg, TxReportRequest):
        return [TX_REPORT_REQ, msg.request_id, [t.to_wire() for t in msg.txs], [m.to_wire() for m in msg.members]]
    if isinstance(msg, TxReportAnswer):
        return [TX_REPORT, msg.request_id, [_report_wire(r) for r in msg.reports]]
    raise TypeError(f"not a transaction message: {msg!r}")


tx_to_wire = _wire


def encode_tx_payload(messages: Sequence[TxMessage]) -> bytes:
    """One payload for a batch of messages to the same destination."""
    return msgpack.packb([TX_FORMAT_VERSION, [_wire(m) for m in messages]], use_bin_type=True)


def approx_size(msg: TxMessage) -> int:
    """Roughly the encoded bytes of ``msg`` (the node cuts payloads by it)."""
    if isinstance(msg, TxPrepare):
        return 64 + sum(len(k) + 10 for k in msg.lock_keys) + sum(len(k) + len(v or b"") + 8 for k, v in msg.writes)
    if isinstance(msg, TxCommit):
        return 64 + sum(len(k) + len(v or b"") + 18 for k, _, v in msg.writes)
    if isinstance(msg, TxLock):
        return 64 + sum(len(k) + 4 for k in msg.keys)
    if isinstance(msg, TxLockInfo):
        return (
            64
            + 4 * len(msg.segments)
            + sum(
                80 + sum(len(k) + 4 for k in r.lock_keys) + sum(len(k) + len(v or b"") + 8 for k, v in r.writes)
                for r in msg.records
            )
        )
    if isinstance(msg, TxVote):
        return 96 + len(msg.reason) + sum(len(k) + 10 for k, _ in msg.versions)
    if isinstance(msg, TxReportRequest):
        return 32 + 48 * len(msg.txs) + 40 * len(msg.members)
    if isinstance(msg, TxReportAnswer):
        return 32 + sum(
            80
            + 40 * len(r.views)
            + sum(len(k) + len(v or b"") + 8 for k, v in r.writes)
            + sum(len(k) + 10 for k, _ in r.versions)
            for r in msg.reports
        )
    return 64


# -- validation helpers: each names the field and the item that is wrong --------------------------------------


def _keys(value: Any, field: str, lim: TxLimits) -> tuple[bytes, ...]:
    items = as_list(value, field, lim.max_tx_keys)
    out = tuple(as_bytes(k, f"{field}[{i}]", lim.max_key_bytes) for i, k in enumerate(items))
    if len(set(out)) != len(out):
        raise WireError(f"{field}: a key is listed twice")
    return out


def _writes(value: Any, field: str, lim: TxLimits) -> tuple[Write, ...]:
    items = as_list(value, field, lim.max_tx_keys)
    out: list[Write] = []
    for i, w in enumerate(items):
        pair = as_list(w, f"{field}[{i}]", 2, exact=2)
        key = as_bytes(pair[0], f"{field}[{i}].key", lim.max_key_bytes)
        val = None if pair[1] is None else as_bytes(pair[1], f"{field}[{i}].value", lim.max_value_bytes)
        out.append((key, val))
    if len({k for k, _ in out}) != len(out):
        raise WireError(f"{field}: a key is written twice")
    return tuple(out)


def _versioned(value: Any, field: str, lim: TxLimits) -> tuple[VersionedWrite, ...]:
    items = as_list(value, field, lim.max_tx_keys)
    out: list[VersionedWrite] = []
    for i, w in enumerate(items):
        triple = as_list(w, f"{field}[{i}]", 3, exact=3)
        key = as_bytes(triple[0], f"{field}[{i}].key", lim.max_key_bytes)
        version = as_int(triple[1], f"{field}[{i}].version", 1, MAX_INT)
        val = None if triple[2] is None else as_bytes(triple[2], f"{field}[{i}].value", lim.max_value_bytes)
        out.append((key, version, val))
    if len({k for k, _, _ in out}) != len(out):
        raise WireError(f"{field}: a key is written twice")
    return tuple(out)


def _key_versions(value: Any, field: str, lim: TxLimits, lo: int) -> tuple[tuple[bytes, int], ...]:
    items = as_list(value, field, lim.max_tx_keys)
    out: list[tuple[bytes, int]] = []
    for i, kv in enumerate(items):
        pair = as_list(kv, f"{field}[{i}]", 2, exact=2)
        out.append(
            (as_bytes(pair[0], f"{field}[{i}].key", lim.max_key_bytes), as_int(pair[1], f"{field}[{i}].version", lo))
        )
    if len({k for k, _ in out}) != len(out):
        raise WireError(f"{field}: a key is listed twice")
    return tuple(out)


def _segments(value: Any, field: str) -> tuple[int, ...]:
    segs = as_list(value, field, MAX_SEGMENTS)
    out = tuple(as_int(s, f"{field}[{i}]", 0, MAX_SEGMENTS - 1) for i, s in enumerate(segs))
    if len(set(out)) != len(out):
        raise WireError(f"{field}: a segment is listed twice")
    return out


def _record(raw: Any, f: str, lim: TxLimits) -> TxRecordInfo:
    items = as_list(raw, f, 8)
    if len(items) < 7:
        raise WireError(f"{f}: expected 7 or 8 items, got {len(items)}")
    lock_keys = _keys(items[4], f"{f}.lock_keys", lim)
    writes = _writes(items[5], f"{f}.writes", lim)
    versions = _key_versions(items[6], f"{f}.versions", lim, 1)
    floors = _floors(items[7], f"{f}.floors", lim, writes) if len(items) == 8 else ()
    state = as_int(items[2], f"{f}.state", INFO_ACTIVE, INFO_PREPARED)
    if state == INFO_ACTIVE and (writes or versions):
        raise WireError(f"{f}.writes: an active (unprepared) transaction carries no writes or versions")
    return TxRecordInfo(
        TxId.from_wire(items[0], f"{f}.tx"),
        as_int(items[1], f"{f}.attempt"),
        state,
        as_bool(items[3], f"{f}.in_doubt"),
        lock_keys,
        writes,
        versions,
        floors,
    )


def _floors(value: Any, field: str, lim: TxLimits, writes: tuple[Write, ...]) -> tuple[tuple[bytes, int], ...]:
    out = _key_versions(value, field, lim, 0)
    written = {k for k, _ in writes}
    for i, (key, _) in enumerate(out):
        if key not in written:
            raise WireError(f"{field}[{i}].key: a floor is only for a key the message writes")
    return out


def _report(raw: Any, f: str, lim: TxLimits) -> TxReportInfo:
    items = as_list(raw, f, 8, exact=8)
    state = as_int(items[1], f"{f}.state", REPORT_UNKNOWN, REPORT_MAX_STATE)
    writes = _writes(items[5], f"{f}.writes", lim)
    versions = _key_versions(items[6], f"{f}.versions", lim, 1)
    raw_views = as_list(items[7], f"{f}.views", lim.max_view)
    views = tuple(as_address(m, f"{f}.views[{i}]") for i, m in enumerate(raw_views))
    if len(set(views)) != len(views):
        raise WireError(f"{f}.views: a member is listed twice")
    if state == REPORT_UNKNOWN and (writes or versions or views):
        raise WireError(f"{f}.state: a transaction unknown to the member carries no writes, versions or views")
    return TxReportInfo(
        TxId.from_wire(items[0], f"{f}.tx"),
        state,
        as_int(items[2], f"{f}.attempt"),
        as_bool(items[3], f"{f}.in_doubt"),
        as_bool(items[4], f"{f}.deciding"),
        writes,
        versions,
        views,
    )


def _decode_prepare(raw: list[Any], f: str, lim: TxLimits) -> TxPrepare:
    as_list(raw, f, 9)
    if len(raw) < 7:
        raise WireError(f"{f}: expected 7 to 9 items, got {len(raw)}")
    lock_keys = _keys(raw[4], f"{f}.lock_keys", lim)
    writes = _writes(raw[5], f"{f}.writes", lim)
    reads = _key_versions(raw[6], f"{f}.reads", lim, 0)
    locked = set(lock_keys)
    for i, (key, _) in enumerate(reads):
        # Only a primary validates reads, and only of the keys it locks (it cannot check the others).
        if key not in locked:
            raise WireError(f"{f}.reads[{i}].key: a read is validated only on a key the recipient locks")
    floors = _floors(raw[8], f"{f}.floors", lim, writes) if len(raw) == 9 else ()
    for i, (key, _) in enumerate(floors):
        if key in locked:
            raise WireError(f"{f}.floors[{i}].key: a floor is only for a key the recipient backs up")
    return TxPrepare(
        TxId.from_wire(raw[1], f"{f}.tx"),
        as_int(raw[2], f"{f}.attempt"),
        as_int(raw[3], f"{f}.topology_id"),
        lock_keys,
        writes,
        reads,
        as_bool(raw[7], f"{f}.wait") if len(raw) >= 8 else True,
        floors,
    )


def _decode_one(raw: Any, f: str, lim: TxLimits) -> TxMessage:  # noqa: C901  the wire format's table: one case per message kind
    if type(raw) is not list or not raw:
        raise WireError(f"{f}: expected a non-empty list")
    kind = raw[0]
    if kind == TX_PREPARE:
        return _decode_prepare(raw, f, lim)
    if kind == TX_VOTE:
        as_list(raw, f, 8, exact=8)
        return TxVote(
            TxId.from_wire(raw[1], f"{f}.tx"),
            as_int(raw[2], f"{f}.attempt"),
            as_int(raw[3], f"{f}.request"),
            as_int(raw[4], f"{f}.code", YES, VOTE_RETRY),
            as_int(raw[5], f"{f}.topology_id"),
            _key_versions(raw[6], f"{f}.versions", lim, 1),
            as_str(raw[7], f"{f}.reason", MAX_REASON_LEN),
        )
    if kind == TX_COMMIT:
        as_list(raw, f, 6)
        if len(raw) < 5:
            raise WireError(f"{f}: expected 5 or 6 items, got {len(raw)}")
        return TxCommit(
            TxId.from_wire(raw[1], f"{f}.tx"),
            as_int(raw[2], f"{f}.attempt"),
            as_int(raw[3], f"{f}.topology_id"),
            _versioned(raw[4], f"{f}.writes", lim),
            as_bool(raw[5], f"{f}.resolved") if len(raw) == 6 else False,
        )
    if kind == TX_ROLLBACK:
        as_list(raw, f, 5)
        if len(raw) < 4:
            raise WireError(f"{f}: expected 4 or 5 items, got {len(raw)}")
        return TxRollback(
            TxId.from_wire(raw[1], f"{f}.tx"),
            as_int(raw[2], f"{f}.attempt"),
            as_int(raw[3], f"{f}.topology_id"),
            as_bool(raw[4], f"{f}.resolved") if len(raw) == 5 else False,
        )
    if kind == TX_ACK:
        as_list(raw, f, 5, exact=5)
        code = as_int(raw[3], f"{f}.code", ACK_OK, ACK_COMMITTED)
        if code not in ACK_NAMES:
            raise WireError(f"{f}.code: {code} is not an acknowledgement code")
        return TxAck(
            TxId.from_wire(raw[1], f"{f}.tx"), as_int(raw[2], f"{f}.attempt"), code, as_int(raw[4], f"{f}.topology_id")
        )
    if kind == TX_LOCK:
        as_list(raw, f, 6, exact=6)
        return TxLock(
            TxId.from_wire(raw[1], f"{f}.tx"),
            as_int(raw[2], f"{f}.attempt"),
            as_int(raw[3], f"{f}.request", 1),
            as_int(raw[4], f"{f}.topology_id"),
            _keys(raw[5], f"{f}.keys", lim),
        )
    if kind == TX_LOCK_INFO:
        as_list(raw, f, 4, exact=4)
        records = as_list(raw[3], f"{f}.records", lim.max_records)
        return TxLockInfo(
            as_int(raw[1], f"{f}.topology_id"),
            _segments(raw[2], f"{f}.segments"),
            tuple(_record(r, f"{f}.records[{i}]", lim) for i, r in enumerate(records)),
        )
    if kind == TX_INFO_ACK:
        as_list(raw, f, 3, exact=3)
        return TxInfoAck(as_int(raw[1], f"{f}.topology_id"), _segments(raw[2], f"{f}.segments"))
    if kind == TX_REPORT_REQ:
        as_list(raw, f, 4, exact=4)
        txs = as_list(raw[2], f"{f}.txs", lim.max_records)
        ids = tuple(TxId.from_wire(t, f"{f}.txs[{i}]") for i, t in enumerate(txs))
        if len(set(ids)) != len(ids):
            raise WireError(f"{f}.txs: a transaction is listed twice")
        raw_members = as_list(raw[3], f"{f}.members", lim.max_view)
        members = tuple(as_address(m, f"{f}.members[{i}]") for i, m in enumerate(raw_members))
        if len(set(members)) != len(members):
            raise WireError(f"{f}.members: a member is listed twice")
        return TxReportRequest(as_int(raw[1], f"{f}.request_id"), ids, members)
    if kind == TX_REPORT:
        as_list(raw, f, 3, exact=3)
        reports = as_list(raw[2], f"{f}.reports", lim.max_records)
        out = tuple(_report(r, f"{f}.reports[{i}]", lim) for i, r in enumerate(reports))
        if len({r.tx for r in out}) != len(out):
            raise WireError(f"{f}.reports: a transaction is reported twice")
        return TxReportAnswer(as_int(raw[1], f"{f}.request_id"), out)
    raise WireError(f"{f}.type: unknown transaction message type {kind!r}")


def decode_tx_message(raw: Any, field: str, limits: TxLimits = DEFAULT_TX_LIMITS) -> TxMessage:
    """One message of a payload (the grid codec's hook); raises WireError naming ``field``'s bad part."""
    return _decode_one(raw, field, limits)


def decode_tx_payload(data: bytes, limits: TxLimits = DEFAULT_TX_LIMITS) -> list[TxMessage]:
    """Decode and validate one payload; raises WireError naming the bad field."""
    if type(data) is not bytes:
        raise WireError(f"tx: expected bytes, got {type(data).__name__}")
    if len(data) > limits.max_payload_bytes:
        raise WireError(f"tx: {len(data)} bytes exceed the limit of {limits.max_payload_bytes}")
    max_array = max(limits.max_messages, limits.max_tx_keys, limits.max_records, MAX_SEGMENTS)
    frame = unpack_bounded(data, "tx", limits.max_payload_bytes, max_array)
    parts = as_list(frame, "tx", 2, exact=2)
    version = as_int(parts[0], "tx.version")
    if version != TX_FORMAT_VERSION:
        raise WireError(
            f"tx.version: unsupported transaction format {version} (this member speaks {TX_FORMAT_VERSION})"
        )
    raw_msgs = as_list(parts[1], "tx.messages", limits.max_messages)
    return [_decode_one(raw, f"tx.messages[{i}]", limits) for i, raw in enumerate(raw_msgs)]
