"""Grid transactions, the pure core: key locks, the participant's transaction table and the originator's
two-phase-commit coordinator (docs/grid-transactions.md).

Three sans-IO state machines. None touches sockets, threads, asyncio, the time module or the global random:
``now`` is an argument of every call, timeouts are deadlines (``next_deadline()``, then ``tick(now)``), and
every call returns the outputs it produced (:class:`TxSend`, :class:`TxOutcome`, :class:`TxLocked`) for the
driver (``GridNode`` once wired, the unit tests' in-memory network for now).

* :class:`LockTable` — per-key exclusive locks owned by transaction ids, FIFO waiters, deadlines, segments
  whose lock acquisition is blocked until their lock information arrives, backup lock records.
* :class:`TxTable` — one member as a participant: ACTIVE → PREPARED → COMMITTED | ROLLED_BACK, idempotent
  decisions, in-doubt transactions (prepared, originator gone), explicit resolution, retry answers to
  commands of an old topology, lock information for state transfer (push, import, pass on, drop).
* :class:`TxCoordinator` — the originator: participants from a routing function, prepare, votes, the decision
  (commit only on a YES from every participant of one attempt; presumed abort otherwise), retries on a newer
  topology, completion, the outcome.

The decision rule, in short: a participant never commits on its own; it commits only on a TX_COMMIT (sent by
the originator after every participant voted YES, or by a resolver) or an operator's :meth:`TxTable.resolve`.
A participant that has not voted YES rolls back when the originator leaves the view (presumed abort: no
commit can have been decided without its vote). A prepared participant whose originator leaves stays
prepared, *in doubt*, with its locks, until it is resolved; :func:`termination_decision` gives the one
answer every participant can be resolved with.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum, IntEnum
from typing import Any

from ...core.address import Address
from ...core.config import param, parse_params
from ...core.errors import ConfigError
from .messages import (
    ACK_COMMITTED,
    ACK_OK,
    ACK_RETRY,
    ACK_ROLLED_BACK,
    INFO_ACTIVE,
    INFO_PREPARED,
    NO,
    REPORT_UNKNOWN,
    VOTE_RETRY,
    YES,
    TxAck,
    TxCommit,
    TxId,
    TxLock,
    TxLockInfo,
    TxMessage,
    TxPrepare,
    TxRecordInfo,
    TxReportAnswer,
    TxReportInfo,
    TxReportRequest,
    TxRollback,
    TxVote,
    VersionedWrite,
    Write,
)

# The stable failure reasons a member reports for a transaction or an operation (OpResult.reason, grid/node/results.py;
# docs/grid-transactions.md, "Using transactions"). The core's own texts (TxOutcome.reason) are for people.
REASON_CONFLICT = "conflict"  # optimistic validation: a key read changed before the commit
REASON_LOCK_TIMEOUT = "lock_timeout"  # a lock was not granted within lock_timeout
REASON_TIMEOUT = "timeout"  # no answer in time (operation or transaction timeout)
REASON_ROLLED_BACK = "rolled_back"  # rolled back (by the client, the originator lost a participant, ...)
REASON_UNAVAILABLE = "unavailable"  # a segment cannot be written (degraded) or has no owner
REASON_LOCKED = "locked"  # a plain write on a key a transaction holds
REASON_FULL = "full"  # a PUT past its primary's max_entries or max_bytes bound
REASON_MIXED = "mixed"  # committed, but a participant had been resolved to roll back (ok True)
REASON_ERROR = "error"  # any other failure of a plain operation

# A version of 0 in a transaction's reads means "the key was absent": real versions start at 1 << 40
# (store.make_version with a topology id of at least 1).
ABSENT = 0


class LockingMode(Enum):
    """OPTIMISTIC: keys are locked at prepare only and the primary checks that what the transaction read is
    unchanged. PESSIMISTIC: :meth:`TxCoordinator.lock` locks keys while the transaction runs (read under
    lock, so conflicts are found early); the prepare still validates reads, since a topology change can
    force a retry in which locks are taken again."""

    OPTIMISTIC = "optimistic"
    PESSIMISTIC = "pessimistic"


@dataclass(frozen=True)
class TxConfig:
    locking: str = param(
        "optimistic", "choice", choices=tuple(m.value for m in LockingMode), doc="default locking mode"
    )
    lock_timeout: float = param("10s", "duration", doc="participant: fail a lock not acquired within this")
    tx_timeout: float = param("30s", "duration", doc="originator: roll back a transaction not prepared within this")
    resend_interval: float = param("3s", "duration", doc="originator: resend unanswered transaction messages")
    completed_retention: float = param(
        "10m", "duration", doc="participant: remember a finished transaction this long (late duplicates)"
    )
    max_held: int = param(10_000, "int", doc="participant: messages held for a topology not yet installed", minimum=1)

    def __post_init__(self) -> None:
        if self.lock_timeout <= 0 or self.tx_timeout <= 0 or self.resend_interval <= 0:
            raise ConfigError("tx: lock_timeout, tx_timeout and resend_interval must be positive")

    @classmethod
    def from_dict(cls, params: dict[str, Any]) -> TxConfig:
        """Parse ``{"locking": "pessimistic", "lock_timeout": "5s", ...}``; errors name the bad key."""
        return parse_params(cls, params, "tx")

    @property
    def mode(self) -> LockingMode:
        return LockingMode(self.locking)


# -- outputs ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TxSend:
    """Send ``message`` to ``dest``."""

    dest: Address
    message: TxMessage


@dataclass(frozen=True, slots=True)
class TxOutcome:
    """A finished transaction on its originator. ``committed`` True only once every owner acknowledged the
    commit (so a participant in doubt never holds a transaction a client was told is committed without
    another participant having committed it: see :func:`termination_decision`)."""

    tx: TxId
    committed: bool
    reason: str = ""
    attempts: int = 1
    # A participant answered with the other outcome (it was resolved the other way while this originator
    # was cut off): the transaction is not atomic. XA calls this a heuristic mixed outcome.
    mixed: bool = False


@dataclass(frozen=True, slots=True)
class TxLocked:
    """The answer to :meth:`TxCoordinator.lock` (pessimistic mode). On ``ok`` False the transaction is rolled
    back (a :class:`TxOutcome` follows)."""

    tx: TxId
    request: int
    ok: bool
    reason: str = ""


TxOutput = TxSend | TxOutcome | TxLocked


# -- lock table ------------------------------------------------------------------------------------------------


class _Request:
    __slots__ = ("deadline", "index", "keys", "parked", "tx", "wait", "waiting")

    def __init__(self, tx: TxId, keys: tuple[bytes, ...], deadline: float, wait: bool = True) -> None:
        self.tx = tx
        self.keys = keys
        self.wait = wait  # False: fail instead of queueing behind a holder (optimistic prepares)
        self.index = 0  # keys[:index] are held
        self.deadline = deadline
        self.waiting: bytes | None = None  # queued behind this key's holders
        self.parked = False  # the next key's segment is blocked


class _Lock:
    __slots__ = ("holders", "waiters")

    def __init__(self) -> None:
        # Normally one holder. Several only after backup locks were promoted or lock information imported:
        # the seed's rule "treat every key any transaction attempted to lock as locked, possibly by several
        # transactions at once"; new requests wait until all of them are gone.
        self.holders: set[TxId] = set()
        self.waiters: deque[_Request] = deque()


class LockTable:
    """Per-key exclusive locks owned by transactions, on the primary owner; backup lock records elsewhere.

    **Deadlocks.** One request locks its keys one at a time in sorted order, so two requests on one member
    never wait for each other in a cycle (a request holds only keys below the one it waits for). That does
    not hold across requests (pessimistic locks taken as the transaction runs) nor across members (a
    transaction's prepares reach several primaries at once), so every request also has a deadline: a
    request still waiting at its deadline fails (:meth:`tick`), the participant votes NO and the
    transaction rolls back, which breaks any cycle. We do not detect cycles: the coordinators would need a
    wait-for graph spanning members, and timeouts already bound how long a lock can be waited for.

    **No-wait requests** (``acquire(..., wait=False)``, the optimistic prepares) never queue behind another
    transaction: a key held (or queued for) by another transaction fails the request at once, reported by
    :meth:`take_failed` like a deadline. They still park on a blocked segment: there the holders are not
    known yet (the lock information is one message away), and failing would refuse transactions that do not
    conflict at all; once unblocked they go on, and fail if a key turned out held. A request that never waits
    for a transaction is in no wait-for cycle, so optimistic transactions cannot deadlock.

    **Blocked segments.** A member that becomes the primary of a segment does not know which keys of it are
    locked until the pushing owner's lock information arrives; :meth:`block_segments` parks every request
    for a key there until :meth:`unblock_segments` (requests keep their deadlines meanwhile).
    """

    def __init__(self, segment_of: Callable[[bytes], int]) -> None:
        self._segment_of = segment_of
        self._locks: dict[bytes, _Lock] = {}
        self._held: dict[TxId, set[bytes]] = {}
        self._requests: dict[TxId, _Request] = {}
        self._parked: list[_Request] = []
        self._blocked: set[int] = set()
        self._backup: dict[TxId, set[bytes]] = {}
        self._failed: list[tuple[TxId, bytes]] = []  # no-wait requests that met a holder, not yet taken

    # -- queries

    def holders(self, key: bytes) -> frozenset[TxId]:
        lock = self._locks.get(key)
        return frozenset(lock.holders) if lock else frozenset()

    def held_by(self, tx: TxId) -> frozenset[bytes]:
        return frozenset(self._held.get(tx, ()))

    def backup_locks(self, tx: TxId) -> frozenset[bytes]:
        return frozenset(self._backup.get(tx, ()))

    def waiting(self, tx: TxId) -> bool:
        return tx in self._requests

    def requested(self, tx: TxId) -> frozenset[bytes]:
        """The keys ``tx``'s pending request still waits for (empty when none)."""
        req = self._requests.get(tx)
        return frozenset(req.keys[req.index :]) if req is not None else frozenset()

    @property
    def blocked_segments(self) -> frozenset[int]:
        return frozenset(self._blocked)

    # Cheap first checks for the plain write path, true while no transaction runs here: one truth test each.
    def any_locked(self) -> bool:
        """Whether any key has a lock (held, or waited for)."""
        return bool(self._locks)

    def any_held(self) -> bool:
        """Whether any transaction holds keys here."""
        return bool(self._held)

    def any_blocked(self) -> bool:
        """Whether any segment is blocked (waiting for the previous primary's lock information)."""
        return bool(self._blocked)

    def is_held(self, key: bytes) -> bool:
        """Whether a transaction holds ``key`` (the node's check before a plain write: a dict lookup)."""
        lock = self._locks.get(key)
        return lock is not None and bool(lock.holders)

    def is_blocked(self, segment: int) -> bool:
        return segment in self._blocked

    def holder_list(self, key: bytes) -> list[TxId]:
        lock = self._locks.get(key)
        return sorted(lock.holders) if lock else []

    def locked_keys(self) -> frozenset[bytes]:
        return frozenset(k for k, lock in self._locks.items() if lock.holders)

    def segments(self) -> frozenset[int]:
        """The segments of the keys held or recorded as backup locks here."""
        seg = self._segment_of
        return frozenset(seg(k) for keys in (*self._held.values(), *self._backup.values()) for k in keys)

    def empty(self) -> bool:
        """Nothing held, waited for or recorded as a backup lock (the checkers' "no lock held forever")."""
        return not self._locks and not self._held and not self._requests and not self._backup

    def next_deadline(self) -> float | None:
        # A linear scan: requests waiting at once are few (one per transaction blocked on this member).
        return min((r.deadline for r in self._requests.values()), default=None)

    # -- acquisition

    def acquire(self, tx: TxId, keys: Iterable[bytes], deadline: float, wait: bool = True) -> bool:
        """Lock ``keys`` for ``tx`` (keys it holds already count as acquired). True: all held now. False: the
        request waits; :meth:`release`, :meth:`unblock_segments`, :meth:`import_locks` and :meth:`tick` report
        it granted (its tx in their result) or :meth:`tick` failed. One request per transaction at a time.
        ``wait`` False: a key another transaction holds fails the request instead (at once, or when its
        blocked segment unblocks); :meth:`take_failed` reports it. The failed request keeps what it got."""
        if tx in self._requests:
            raise ValueError(f"transaction {tx} already waits for a lock")
        req = _Request(tx, tuple(sorted(set(keys))), deadline, wait)
        self._requests[tx] = req
        return self._advance(req)

    def take_failed(self) -> list[tuple[TxId, bytes]]:
        """The no-wait requests that met a held key since the last call: ``(tx, key)``, in order."""
        failed, self._failed = self._failed, []
        return failed

    def _advance(self, req: _Request) -> bool:
        held = self._held.setdefault(req.tx, set())
        while req.index < len(req.keys):
            key = req.keys[req.index]
            lock = self._locks.get(key)
            if key in held and (lock is None or len(lock.holders) <= 1):
                req.index += 1
                continue
            if self._segment_of(key) in self._blocked:
                req.parked = True
                self._parked.append(req)
                return False
            if lock is None:
                lock = self._locks[key] = _Lock()
            # A key this transaction holds *shared* (promoted backup locks, imported lock information) is not
            # acquired until the other holders are gone: counting it as held let a pessimistic transaction's
            # prepare validate on a new primary while a committed transaction, whose commit had not reached
            # that (formerly backup) member yet, still held the key (the random search found the lost update).
            if lock.holders - {req.tx} or lock.waiters:
                if not req.wait:
                    self._failed.append((req.tx, key))
                    del self._requests[req.tx]
                    if not held:
                        del self._held[req.tx]
                    return False
                req.waiting = key
                if req.tx in lock.holders:
                    # A sharing holder goes first: whoever queued before it waits for it to leave anyway.
                    # (Two sharing holders both asking again wait for each other: the lock timeout ends that.)
                    lock.waiters.appendleft(req)
                else:
                    lock.waiters.append(req)
                return False
            lock.holders.add(req.tx)
            held.add(key)
            req.index += 1
        del self._requests[req.tx]
        if not held:
            del self._held[req.tx]  # a request for no keys leaves nothing behind
        return True

    def _wake(self, key: bytes, granted: list[TxId]) -> None:
        """Hand a key with no holder but (perhaps) its first waiter to that waiter (FIFO), unless its segment
        is blocked."""
        lock = self._locks.get(key)
        if lock is None:
            return
        if not lock.waiters:
            if not lock.holders:
                del self._locks[key]
            return
        if lock.holders - {lock.waiters[0].tx}:
            return  # held by others (the head may share it: it waits for them to go)
        if self._segment_of(key) in self._blocked:
            return  # unblock_segments wakes it
        req = lock.waiters.popleft()
        req.waiting = None
        lock.holders.add(req.tx)
        self._held.setdefault(req.tx, set()).add(key)
        req.index += 1
        if self._advance(req):
            granted.append(req.tx)

    def release(self, tx: TxId, keep: Iterable[bytes] = ()) -> list[TxId]:
        """Drop everything ``tx`` holds (but the held keys in ``keep``), waits for or records as backup locks;
        returns the transactions whose requests this completed, in the order they were granted."""
        self._backup.pop(tx, None)
        granted = self.cancel_request(tx)
        held = self._held.pop(tx, set())
        kept = held.intersection(keep)
        if kept:
            self._held[tx] = kept
        for key in sorted(held - kept):
            lock = self._locks.get(key)
            if lock is not None:
                lock.holders.discard(tx)
                self._wake(key, granted)
        return granted

    def drop_segments(self, segments: Iterable[int]) -> list[TxId]:
        """This member owns ``segments`` no more (their lock information went to the new primary): forget
        every lock and backup lock on their keys. Returns the transactions whose requests this completed."""
        segs = set(segments)
        granted: list[TxId] = []
        for tx in sorted(self._backup):
            keys = self._backup[tx]
            keys.difference_update([k for k in keys if self._segment_of(k) in segs])
            if not keys:
                del self._backup[tx]
        for tx in sorted(self._held):
            held = self._held[tx]
            gone = sorted(k for k in held if self._segment_of(k) in segs)
            held.difference_update(gone)
            if not held and tx not in self._requests:
                del self._held[tx]
            for key in gone:
                lock = self._locks.get(key)
                if lock is not None:
                    lock.holders.discard(tx)
                    self._wake(key, granted)
        return granted

    def cancel_request(self, tx: TxId) -> list[TxId]:
        """Stop waiting (keys held stay held); returns the transactions whose requests this completed."""
        granted: list[TxId] = []
        req = self._requests.pop(tx, None)
        if req is not None:
            if req.waiting is not None:
                self._locks[req.waiting].waiters.remove(req)
                self._wake(req.waiting, granted)
            if req.parked:
                self._parked.remove(req)
            if not self._held.get(tx, True):
                del self._held[tx]  # it got nothing
        return granted

    def tick(self, now: float) -> tuple[list[TxId], list[tuple[TxId, bytes]]]:
        """Fail the requests whose deadline passed: ``(granted, failed)`` where failed lists ``(tx, key it
        waited for)``. A failed transaction keeps the keys it got so far until :meth:`release` (the caller
        rolls it back). ``granted`` is empty unless a release happened inside (kept for a uniform shape)."""
        failed: list[tuple[TxId, bytes]] = []
        granted: list[TxId] = []
        for req in sorted((r for r in self._requests.values() if r.deadline <= now), key=lambda r: r.tx):
            failed.append((req.tx, req.keys[req.index]))
            granted.extend(self.cancel_request(req.tx))
        return granted, failed

    # -- blocking during state transfer

    def block_segments(self, segments: Iterable[int]) -> None:
        """Park lock requests for keys of ``segments`` until :meth:`unblock_segments`."""
        self._blocked.update(segments)

    def unblock_segments(self, segments: Iterable[int]) -> list[TxId]:
        """Lock information for ``segments`` arrived (or is known not to come): resume their requests.
        Returns the transactions whose requests completed."""
        segs = set(segments)
        self._blocked.difference_update(segs)
        granted: list[TxId] = []
        # Queued waiters first (they were there before), then the parked requests in their order.
        for key in sorted(k for k in self._locks if self._segment_of(k) in segs):
            self._wake(key, granted)
        parked, self._parked = self._parked, []
        for req in parked:
            if req.tx not in self._requests:
                continue
            req.parked = False
            if self._advance(req):
                granted.append(req.tx)
        return granted

    # -- backup locks, promotion, state transfer

    def add_backup_locks(self, tx: TxId, keys: Iterable[bytes]) -> None:
        """On a backup owner: ``tx`` (prepared, or locking pessimistically) holds ``keys`` on their primary.
        Nothing waits on a backup lock until it is promoted."""
        ks = set(keys)
        if ks:
            self._backup.setdefault(tx, set()).update(ks)

    def force_hold(self, tx: TxId, keys: Iterable[bytes]) -> None:
        """Make ``tx`` a holder of ``keys`` whatever else holds them (promotion, imported lock info)."""
        held = self._held.setdefault(tx, set())
        for key in keys:
            lock = self._locks.get(key)
            if lock is None:
                lock = self._locks[key] = _Lock()
            lock.holders.add(tx)
            held.add(key)
        if not held:
            del self._held[tx]

    def promote(self, segments: Iterable[int]) -> None:
        """This member became the primary of ``segments``: the backup locks of their keys become locks."""
        segs = set(segments)
        for tx in sorted(self._backup):
            keys = self._backup[tx]
            moved = {k for k in keys if self._segment_of(k) in segs}
            if moved:
                self.force_hold(tx, moved)
                keys -= moved
                if not keys:
                    del self._backup[tx]

    def keys_in(self, tx: TxId, segments: frozenset[int]) -> tuple[bytes, ...]:
        """The keys of ``segments`` that ``tx`` holds, waits for or records as backup locks (sorted)."""
        keys = set(self._held.get(tx, ())) | set(self._backup.get(tx, ()))
        req = self._requests.get(tx)
        if req is not None:
            keys.update(req.keys[req.index :])
        return tuple(sorted(k for k in keys if self._segment_of(k) in segments))


# -- participant -------------------------------------------------------------------------------------------------


class TxState(IntEnum):
    ACTIVE = 0  # known here, locks (being) taken, no YES vote for a prepare given
    PREPARED = 1  # voted YES: only a decision (commit or rollback) ends it
    COMMITTED = 2
    ROLLED_BACK = 3


TERMINAL = (TxState.COMMITTED, TxState.ROLLED_BACK)


@dataclass(frozen=True, slots=True)
class InDoubt:
    """A prepared transaction whose originator left the view: it keeps its locks until resolved."""

    tx: TxId
    attempt: int
    keys: tuple[bytes, ...]
    writes: tuple[Write, ...]
    versions: tuple[tuple[bytes, int], ...]  # stamped here (as primary); a resolver collects them


@dataclass(frozen=True, slots=True)
class TxReport:
    """One member's knowledge of a transaction (:meth:`TxTable.report`)."""

    tx: TxId
    state: TxState | None
    attempt: int
    writes: tuple[Write, ...]
    versions: tuple[tuple[bytes, int], ...]
    in_doubt: bool = False
    # The members of the view at its prepare here (or at the import of its lock information), sorted.
    views: tuple[Address, ...] = ()


class _Record:
    __slots__ = (
        "attempt",
        "backup_keys",
        "decided",
        "expires",
        "imported",
        "in_doubt",
        "lock_keys",
        "lost",
        "pending",
        "prepared_attempt",
        "reads",
        "reason",
        "reply_to",
        "stamp_keys",
        "state",
        "topology_id",
        "tx",
        "versions",
        "views",
        "writes",
    )

    def __init__(self, tx: TxId, attempt: int, reply_to: Address) -> None:
        self.tx = tx
        self.attempt = attempt
        self.reply_to = reply_to
        self.state = TxState.ACTIVE
        self.lock_keys: tuple[bytes, ...] = ()
        self.backup_keys: tuple[bytes, ...] = ()
        # The keys the prepare asked this member to stamp (it is their primary in the prepare's topology).
        # Not lock_keys: those may include keys inherited by an import, whose primary is another member now.
        self.stamp_keys: frozenset[bytes] = frozenset()
        self.writes: dict[bytes, bytes | None] = {}
        self.reads: dict[bytes, int] = {}
        self.versions: dict[bytes, int] = {}
        self.in_doubt = False
        self.reason = ""
        self.topology_id = 0
        self.prepared_attempt = 0  # the attempt this member voted YES to a prepare of (0: none)
        self.expires = 0.0  # finished: forgotten at this time
        self.decided = False  # finished by a decision (commit, rollback message, resolve), not on local grounds
        self.imported = False  # known here only through pushed lock information
        # Committed keys whose applied write this member's copy lost since (the segment was dropped or emptied
        # for a fresh transfer): ``versions`` still names them, but a repeated commit must apply them again.
        self.lost: set[bytes] = set()
        # The request a lock wait will answer: 0 the prepare, n the lock request n, None nothing waits.
        self.pending: int | None = None
        # The members of the view when it prepared here (or its lock information came): a resolver rolls an
        # in-doubt transaction back only when all of them but the originator are still members.
        self.views: frozenset[Address] = frozenset()


class TxTable:
    """One member's participant side of every transaction that touches keys it owns.

    ``version_of(key)`` is the version the member holds (0: absent), for optimistic validation;
    ``stamp(key)`` a fresh version for a key this member is the primary of (``store.make_version`` of the
    topology and a sequence, as the grid's writes are stamped); ``segment_of`` maps keys to segments;
    ``apply(tx, writes)`` applies a committed transaction's writes (key, version, value or None) to the
    member's store: every entry of a segment the member holds, "newest version wins".

    ``apply`` is a call, not an output, on purpose: a commit releases the transaction's locks, and a waiting
    prepare that gets them validates its reads at once, in the same call; it must see the committed
    versions (an output applied after the call would let it validate against the old ones: the property
    test found exactly that lost update).
    """

    def __init__(
        self,
        address: Address,
        config: TxConfig | None = None,
        *,
        segment_of: Callable[[bytes], int],
        version_of: Callable[[bytes], int],
        stamp: Callable[[bytes], int],
        apply: Callable[[TxId, tuple[VersionedWrite, ...]], None],
        room: Callable[[list[tuple[bytes, bytes]]], str] | None = None,
        topology_id: int = 0,
    ) -> None:
        self.address = address
        self.config = config or TxConfig()
        self.locks = LockTable(segment_of)
        self.topology_id = topology_id
        self._segment_of = segment_of
        self._version_of = version_of
        self._stamp = stamp
        self._apply = apply
        self._room = room
        self._txs: dict[TxId, _Record] = {}
        self._expiry: deque[tuple[float, TxId]] = deque()  # finished records, oldest first
        self._held: list[tuple[Address, TxMessage]] = []  # for a topology not installed yet
        self._members: frozenset[Address] | None = None
        self.dropped_held = 0
        # Lock information to pass on: segments this member still waits for, and who gets them next
        # (:meth:`push_lock_info`); segments it owns no more (:meth:`drop_segments`).
        self._forward: dict[int, Address] = {}
        self._dropped: set[int] = set()

    # -- queries

    def state_of(self, tx: TxId) -> TxState | None:
        rec = self._txs.get(tx)
        return None if rec is None else rec.state

    def report(self, tx: TxId) -> TxReport:
        """What a resolver asks every member about an in-doubt transaction: the state here (None: unknown),
        the attempt, the writes its prepare brought here and the versions known here (stamped as primary, or
        carried by the commit). From all reports a resolver builds one self-contained TX_COMMIT (or a
        TX_ROLLBACK) and sends it to every current owner of the keys and every member that knows the
        transaction (see docs/grid-transactions.md, "Resolution")."""
        rec = self._txs.get(tx)
        if rec is None:
            return TxReport(tx, None, 0, (), ())
        return TxReport(
            tx,
            rec.state,
            rec.attempt,
            tuple(sorted(rec.writes.items())),
            tuple(sorted(rec.versions.items())),
            rec.in_doubt and rec.state == TxState.PREPARED,
            tuple(sorted(rec.views)),
        )

    def active(self) -> list[TxId]:
        """Transactions not finished here (ACTIVE or PREPARED), sorted."""
        return sorted(t for t, r in self._txs.items() if r.state not in TERMINAL)

    def unresolved(self, members: Iterable[Address] = ()) -> list[TxId]:
        """Prepared here and in doubt, or prepared with an originator outside ``members`` (a resolver's view,
        which this member may not have installed yet): what a resolver must hear about, sorted."""
        present = frozenset(members)
        return sorted(
            t
            for t, r in self._txs.items()
            if r.state == TxState.PREPARED and (r.in_doubt or (present and t.origin not in present))
        )

    def in_doubt(self) -> list[InDoubt]:
        return [
            InDoubt(
                r.tx,
                r.attempt,
                tuple(sorted(set(r.lock_keys) | set(r.backup_keys))),
                tuple(sorted(r.writes.items())),
                tuple(sorted(r.versions.items())),
            )
            for t, r in sorted(self._txs.items())
            if r.in_doubt and r.state == TxState.PREPARED
        ]

    def next_deadline(self) -> float | None:
        deadlines = [
            d for d in (self.locks.next_deadline(), self._expiry[0][0] if self._expiry else None) if d is not None
        ]
        return min(deadlines, default=None)

    # -- inputs

    def on_message(self, src: Address, msg: TxMessage, now: float) -> list[TxOutput]:
        out: list[TxOutput] = []
        if isinstance(msg, TxPrepare | TxLock):
            if msg.topology_id > self.topology_id:
                self._hold(src, msg)
            elif msg.topology_id < self.topology_id:
                request = msg.request if isinstance(msg, TxLock) else 0
                out.append(TxSend(src, TxVote(msg.tx, msg.attempt, request, VOTE_RETRY, self.topology_id)))
            elif isinstance(msg, TxPrepare):
                self._on_prepare(src, msg, now, out)
            else:
                self._on_lock(src, msg, now, out)
        elif isinstance(msg, TxCommit):
            if msg.topology_id > self.topology_id:
                self._hold(src, msg)  # the writes may be for segments this member gets with that topology
            else:
                self._on_commit(src, msg, now, out)
        elif isinstance(msg, TxRollback):
            self._on_rollback(src, msg, now, out)  # releasing is right under any topology
        elif isinstance(msg, TxLockInfo):
            self.import_lock_info(msg, now, out)
        return out

    def on_topology(self, topology_id: int, now: float) -> list[TxOutput]:
        """This member installed ``topology_id``. Lock requests of an older topology still waiting here are
        answered RETRY (the keys may have a new primary, which will not see this wait; the originator asks
        again under the new topology), keeping the locks they got; messages held for it are handled now.
        Call it before exporting lock information, so that waits never travel as locks."""
        self.topology_id = max(self.topology_id, topology_id)
        out: list[TxOutput] = []
        stale = [r for _, r in sorted(self._txs.items()) if r.pending is not None and r.topology_id < topology_id]
        granted: list[TxId] = []
        for rec in stale:
            request, rec.pending = rec.pending, None
            assert request is not None  # stale holds only records with a pending request
            granted.extend(self.locks.cancel_request(rec.tx))
            out.append(TxSend(rec.reply_to, TxVote(rec.tx, rec.attempt, request, VOTE_RETRY, self.topology_id)))
        self._granted(granted, now, out)  # only current-topology requests: the stale ones wait no more
        ready = [(s, m) for s, m in self._held if m.topology_id <= self.topology_id]  # type: ignore[union-attr]
        self._held = [(s, m) for s, m in self._held if m.topology_id > self.topology_id]  # type: ignore[union-attr]
        for src, msg in ready:
            out.extend(self.on_message(src, msg, now))
        return out

    def on_view(self, members: Iterable[Address], now: float) -> list[TxOutput]:
        """A new view. Transactions whose originator left: not yet voted YES → rolled back (presumed abort:
        nobody can have decided to commit without this member's vote); PREPARED → in doubt, locks kept."""
        self._members = frozenset(members)
        out: list[TxOutput] = []
        for tx in sorted(self._txs):
            rec = self._txs[tx]
            if tx.origin in self._members or rec.state in TERMINAL:
                continue
            if rec.state == TxState.PREPARED:
                rec.in_doubt = True
            else:
                self._finish(rec, TxState.ROLLED_BACK, now, out, "originator left before prepare")
        return out

    def tick(self, now: float) -> list[TxOutput]:
        out: list[TxOutput] = []
        granted, failed = self.locks.tick(now)
        self._granted(granted, now, out)
        for tx, key in failed:
            rec = self._txs.get(tx)
            if rec is None or rec.pending is None:
                self.locks.release(tx)
                continue
            request = rec.pending
            rec.pending = None
            reason = f"lock timeout on key {key!r}"
            self._finish(rec, TxState.ROLLED_BACK, now, out, reason)
            out.append(TxSend(rec.reply_to, TxVote(tx, rec.attempt, request, NO, self.topology_id, (), reason)))
        while self._expiry and self._expiry[0][0] <= now:
            _, tx = self._expiry.popleft()
            rec = self._txs.get(tx)
            # A record can finish twice (an abandoned attempt, then the decision): only its last expiry counts.
            if rec is not None and rec.state in TERMINAL and rec.expires <= now:
                del self._txs[tx]
        return out

    def resolve(
        self,
        tx: TxId,
        commit: bool,
        now: float,
        versions: Mapping[bytes, int] | None = None,
        *,
        not_held: Iterable[bytes] = (),
    ) -> list[TxOutput]:
        """An operator's (or a resolver's) decision for a PREPARED transaction, normally an in-doubt one.
        Committing needs a version for every written key: the ones stamped here are known, the others come
        from ``versions`` (collected from the primaries' :meth:`in_doubt`, or stamped anew by the current
        primary when the stamping one is gone). Decide with :func:`termination_decision` and resolve every
        participant the same way. ``not_held``: written keys whose segments this member holds no more; they
        need no version and are not written here (their owners store them), and a commit drops them from the
        record, so no lock waits for their version."""
        rec = self._txs.get(tx)
        if rec is None or rec.state != TxState.PREPARED:
            state = "unknown" if rec is None else rec.state.name
            raise ValueError(f"transaction {tx} is {state} here, not PREPARED")
        out: list[TxOutput] = []
        if commit:
            vs = dict(rec.versions)
            vs.update(versions or {})
            gone = set(not_held)
            missing = sorted(k for k in rec.writes if k not in vs and k not in gone)
            if missing:
                raise ValueError(f"transaction {tx}: no version for written keys {missing!r}")
            rec.writes = {k: v for k, v in rec.writes.items() if k in vs or k not in gone}
            writes = tuple((k, vs[k], v) for k, v in sorted(rec.writes.items()))
            rec.versions = {k: vs[k] for k in rec.writes}
            self._apply(tx, writes)
            self._finish(rec, TxState.COMMITTED, now, out)
        else:
            self._finish(rec, TxState.ROLLED_BACK, now, out, "resolved", decided=True)
        return out

    def stamp_committed(
        self, is_primary: Callable[[bytes], bool], now: float
    ) -> tuple[list[TxOutput], list[tuple[TxId, int, tuple[VersionedWrite, ...]]]]:
        """Committed here, originator gone, and a key still held because its write came without a version
        (a pushed write of a prepared backup record; its stamping primary was the originator, which died with
        the version: simulation seed 19): where this member is the key's current write primary
        (``is_primary(key)``) and its segment is not blocked, stamp a version now, apply the write and release
        the key, as a primary does for any write. Returns the outputs and, per transaction, ``(tx, attempt,
        writes stamped)``: the caller sends them to the key's other owners, which hold the same committed
        record waiting for that version. Only without the originator: while it lives its commit carries the
        version it collected, and a second one would make the owners' versions differ."""
        out: list[TxOutput] = []
        stamped: list[tuple[TxId, int, tuple[VersionedWrite, ...]]] = []
        members = self._members
        for tx in sorted(self.locks._held):
            rec = self._txs.get(tx)
            if rec is None or rec.state != TxState.COMMITTED or members is None or tx.origin in members:
                continue
            keys = sorted(
                k for k in self._unapplied(rec) if not self.locks.is_blocked(self._segment_of(k)) and is_primary(k)
            )
            if not keys:
                continue
            writes = tuple((k, self._stamp(k), rec.writes[k]) for k in keys)
            rec.versions.update((k, v) for k, v, _ in writes)
            self._apply(tx, writes)
            self._release_applied(rec, now, out)
            stamped.append((tx, rec.attempt, writes))
        return out, stamped

    # -- state transfer

    def block_segments(self, segments: Iterable[int]) -> None:
        """New primary of ``segments``: no lock is granted there until their lock information arrived."""
        segs = set(segments)
        self._dropped -= segs
        self.locks.block_segments(segs)

    def push_lock_info(self, segments: Iterable[int], dest: Address) -> list[TxOutput]:
        """The old primary's side of a move: send ``dest`` (the new primary) the lock information of
        ``segments``, after installing the topology (so that waits of the old one were answered RETRY).
        Segments this member still waits for itself (it became their primary in a topology just before, and
        its own pusher has not answered yet) are sent on when their information arrives: pushing them now
        would push nothing, and the new primary would grant locks that an in-doubt transaction holds (the
        property test found that lost update)."""
        segs = set(segments)
        waiting = segs & self.locks.blocked_segments
        out: list[TxOutput] = []
        if segs - waiting:
            out.append(TxSend(dest, self.export_segments(segs - waiting)))
        for seg in waiting:
            self._forward[seg] = dest
        return out

    def export_segments(self, segments: Iterable[int]) -> TxLockInfo:
        """The pushing owner's lock information for ``segments``: every unfinished transaction that holds,
        waits for or backs up a lock there (finished ones are not pushed: the seed's note that a primary must
        not push backup locks of a transaction it got the commit for)."""
        segs = frozenset(segments)
        records = []
        for tx in sorted(self._txs):
            rec = self._txs[tx]
            if rec.state in TERMINAL:
                continue
            keys = self.locks.keys_in(tx, segs)
            if not keys:
                continue
            prepared = rec.state == TxState.PREPARED
            ks = set(keys)
            writes = tuple(sorted((k, v) for k, v in rec.writes.items() if k in ks)) if prepared else ()
            versions = tuple(sorted((k, v) for k, v in rec.versions.items() if k in ks)) if prepared else ()
            state = INFO_PREPARED if prepared else INFO_ACTIVE
            records.append(TxRecordInfo(tx, rec.attempt, state, rec.in_doubt, keys, writes, versions))
        return TxLockInfo(self.topology_id, tuple(sorted(segs)), tuple(records))

    def import_lock_info(self, info: TxLockInfo, now: float, out: list[TxOutput] | None = None) -> list[TxOutput]:
        """Lock information pushed for ``info.segments``: their keys stay locked by those transactions here
        (as a new primary would treat promoted backup locks), then the segments are unblocked. A transaction
        received from any pusher will be committed or rolled back here by the originator's retry."""
        out = [] if out is None else out
        for r in info.records:
            rec = self._txs.get(r.tx)
            if rec is not None and rec.state == TxState.COMMITTED:
                # Committed here already, maybe by a commit computed before this member owned these keys (a
                # backup of other keys): the prepared writes pushed with their versions are the transaction's,
                # apply those it lacks (the property test found a new primary that skipped them and served
                # the old value).
                vs = dict(r.versions)
                missing = tuple(
                    (k, vs[k], v) for k, v in r.writes if k in vs and (k not in rec.versions or k in rec.lost)
                )
                if missing:
                    rec.lost.difference_update(k for k, _, _ in missing)
                    rec.versions.update((k, ver) for k, ver, _ in missing)
                    self._apply(r.tx, missing)
                # Writes pushed without a version (the pusher was a backup) cannot be applied yet: keep their
                # keys locked for this transaction until a commit or resolution brings the versions.
                waiting = [k for k, _ in r.writes if k not in rec.versions]
                if waiting:
                    rec.writes.update((k, v) for k, v in r.writes if k in waiting)
                    self.locks.force_hold(r.tx, waiting)
                if missing:
                    self._release_applied(rec, now, out)  # keys held for an earlier push have their write now
                continue
            if rec is not None and rec.attempt > r.attempt:
                continue  # we know a newer attempt: the originator gave the pushed one up, it never commits
            if rec is not None and rec.state == TxState.ROLLED_BACK:
                if rec.decided and rec.attempt >= r.attempt:
                    continue  # a decision rolled this attempt back
                # Rolled back here on local grounds only (a lock timeout, a presumed abort, an older attempt):
                # the pushed attempt may still commit elsewhere, so its locks must hold here until its decision.
                rec.state = TxState.ACTIVE
                rec.reason = ""
            gone = self._members is not None and r.tx.origin not in self._members
            if gone and r.state == INFO_ACTIVE and (rec is None or rec.state == TxState.ACTIVE):
                # Presumed abort, as on_view does: the originator left before this transaction prepared.
                rec = rec or _Record(r.tx, r.attempt, r.tx.origin)
                self._txs[r.tx] = rec
                self._finish(rec, TxState.ROLLED_BACK, now, out, "originator left before prepare")
                continue
            if rec is None:
                rec = self._txs[r.tx] = _Record(r.tx, r.attempt, r.tx.origin)
                rec.imported = True
            rec.attempt = r.attempt
            if r.state == INFO_PREPARED and rec.state == TxState.ACTIVE and rec.pending is None:
                rec.state = TxState.PREPARED
                rec.prepared_attempt = r.attempt
            if r.state == INFO_PREPARED:
                # The information does not carry the view of the prepare: ours now is what we can name
                # (the members that prepared it report their own).
                rec.views = rec.views | (self._members or frozenset())
            rec.in_doubt = rec.in_doubt or r.in_doubt
            if self._members is not None and r.tx.origin not in self._members and rec.state == TxState.PREPARED:
                rec.in_doubt = True
            # Keys the transaction's own request waits for here it acquires in its turn: taking them as held
            # because a pusher recorded them (as backup locks of the same attempt, in a forwarded push) would
            # let the waiting request skip the queue (the property test found four transactions validating one
            # key at once). Keys it does not wait for here are held, even if it locked them here once before
            # (a lock dropped with the segment and pushed back: the property test found that too).
            waiting_for = self.locks.requested(r.tx)
            hold = [k for k in r.lock_keys if k not in waiting_for]
            rec.lock_keys = tuple(sorted(set(rec.lock_keys) | set(hold)))
            rec.writes.update(r.writes)
            rec.versions.update(r.versions)
            self.locks.force_hold(r.tx, hold)
        self._granted(self.locks.unblock_segments(info.segments), now, out)
        onward: dict[Address, list[int]] = {}
        for seg in info.segments:
            dest = self._forward.pop(seg, None)
            if dest is not None:
                onward.setdefault(dest, []).append(seg)
        for dest, segs in sorted(onward.items()):
            out.append(TxSend(dest, self.export_segments(segs)))
        dropped = self._dropped.intersection(info.segments)
        if dropped:
            # Passed on, and none of our business any more: locks go, and records known here only through
            # this information go too (a forwarded push carries what the forwarder holds by then, including
            # transactions of later topologies; kept here they would never hear their decision: the random
            # search found such a record left prepared for good).
            self._granted(self.locks.drop_segments(dropped), now, out)
            for r in info.records:
                rec = self._txs.get(r.tx)
                if (
                    rec is not None
                    and rec.imported
                    and rec.state not in TERMINAL
                    and not self.locks.held_by(r.tx)
                    and all(self._segment_of(k) in self._dropped for k in rec.lock_keys)
                ):
                    del self._txs[r.tx]
        return out

    def drop_segments(self, segments: Iterable[int], now: float) -> list[TxOutput]:
        """This member owns ``segments`` no more, and their lock information was pushed: their locks and
        backup locks go (records stay until their decision; a member that no longer owns a key gets no write
        of it, so a committed record waiting for a version there would hold its lock for good)."""
        segs = set(segments)
        self._dropped |= segs
        out: list[TxOutput] = []
        # Segments whose information this member still has to pass on keep their locks until it has (then
        # import_lock_info drops them): dropping first would pass on nothing (the property test found it).
        self._granted(self.locks.drop_segments(segs - set(self._forward)), now, out)
        return out

    def settle_own(self, tx: TxId, now: float) -> list[TxOutput]:
        """This member is ``tx``'s originator and completed its commit: every owner of its keys in the newest
        topology acknowledged it, and owners since took the keys by state transfer. A write waiting here for its
        version (pushed without one by a backup that missed the decision: cut off, in doubt) is therefore in
        place or superseded, and no commit will bring the version: its key is released and the write dropped
        from the record."""
        rec = self._txs.get(tx)
        out: list[TxOutput] = []
        if rec is None or rec.state != TxState.COMMITTED:
            return out
        waiting = self._unapplied(rec)
        if waiting:
            for k in waiting:
                del rec.writes[k]
            self._release_applied(rec, now, out)
        return out

    def forget_applied(self, segments: Iterable[int]) -> None:
        """This member's copy of ``segments`` is gone (dropped, or emptied for a fresh state transfer): the
        committed writes it applied there went with it. A transfer into the emptied copy may come from an owner
        that has not applied the commit yet, so a repeated commit (the originator drives it to this topology's
        owners) must apply those writes again instead of taking them as done; newest version wins, so a copy
        that does carry them is unharmed."""
        segs = frozenset(segments)
        if not segs:
            return
        segment_of = self._segment_of
        for rec in self._txs.values():
            if rec.state == TxState.COMMITTED and rec.versions:
                rec.lost.update(k for k in rec.versions if segment_of(k) in segs)

    def promote(self, segments: Iterable[int]) -> None:
        """This member (a backup) became the primary of ``segments``: its backup locks there become locks."""
        segs = frozenset(segments)
        self._dropped -= segs
        for rec in self._txs.values():
            moved = tuple(k for k in rec.backup_keys if self._segment_of(k) in segs)
            if moved:
                rec.lock_keys = tuple(sorted(set(rec.lock_keys) | set(moved)))
                rec.backup_keys = tuple(k for k in rec.backup_keys if k not in moved)
        self.locks.promote(segs)

    # -- handlers

    def _hold(self, src: Address, msg: TxMessage) -> None:
        if len(self._held) >= self.config.max_held:
            self._held.pop(0)  # the originator resends
            self.dropped_held += 1
        self._held.append((src, msg))

    def _vote(self, rec: _Record, request: int, out: list[TxOutput]) -> None:
        """(Re)send the vote the record stands for."""
        if rec.state == TxState.ROLLED_BACK:
            vote = TxVote(rec.tx, rec.attempt, request, NO, self.topology_id, (), rec.reason or "rolled back")
        else:
            versions = tuple(sorted(rec.versions.items())) if request == 0 else ()
            vote = TxVote(rec.tx, rec.attempt, request, YES, self.topology_id, versions)
        out.append(TxSend(rec.reply_to, vote))

    def _fresh(self, src: Address, msg: TxPrepare | TxLock, now: float, out: list[TxOutput]) -> _Record | None:
        """The record a prepare or lock request works on, or None when it is a duplicate or stale (answered)."""
        request = msg.request if isinstance(msg, TxLock) else 0
        if self._members is not None and msg.tx.origin not in self._members:
            # A late request of a gone originator (any attempt): locking for it would lock for good.
            return None
        rec = self._txs.get(msg.tx)
        if rec is None:
            rec = self._txs[msg.tx] = _Record(msg.tx, msg.attempt, src)
            return rec
        if msg.attempt < rec.attempt:
            return None  # an abandoned attempt; the originator moved on
        if msg.attempt > rec.attempt:
            if rec.state == TxState.COMMITTED:
                out.append(TxSend(src, TxVote(msg.tx, msg.attempt, request, NO, self.topology_id, (), "committed")))
                return None
            # The originator gave the older attempt up (it never commits one it re-prepared): start over, from
            # nothing. Keeping the old attempt's locks would be wrong: some may be promoted backup locks or
            # imported ones, shared with other holders, and the new attempt would validate its reads while
            # another transaction still holds the key (the property test found that lost update).
            self._granted(self.locks.release(msg.tx), now, out)
            rec.state = TxState.ACTIVE
            rec.pending = None
            rec.in_doubt = False
            rec.attempt = msg.attempt
            rec.lock_keys = rec.backup_keys = ()
            rec.versions = {}
            rec.reply_to = src
            return rec
        # Same attempt.
        if rec.state == TxState.ROLLED_BACK:
            self._vote(rec, request, out)  # a late or duplicate request after a rollback: still NO
            return None
        if rec.pending is not None:
            return None  # a duplicate of the request that waits for its locks
        if rec.state != TxState.ACTIVE:
            if request == 0:
                self._vote(rec, 0, out)  # a duplicate prepare: the same vote again
            return None
        return rec

    def _on_lock(self, src: Address, msg: TxLock, now: float, out: list[TxOutput]) -> None:
        rec = self._fresh(src, msg, now, out)
        if rec is None:
            return
        rec.lock_keys = tuple(sorted(set(rec.lock_keys) | set(msg.keys)))
        rec.topology_id = msg.topology_id
        if self.locks.acquire(rec.tx, msg.keys, now + self.config.lock_timeout):
            self._vote(rec, msg.request, out)
        else:
            rec.pending = msg.request

    def _on_prepare(self, src: Address, msg: TxPrepare, now: float, out: list[TxOutput]) -> None:
        rec = self._fresh(src, msg, now, out)
        if rec is None:
            return
        rec.topology_id = msg.topology_id
        rec.writes = dict(msg.writes)
        rec.reads = dict(msg.reads)
        locked = set(msg.lock_keys)
        rec.stamp_keys = frozenset(locked)
        rec.lock_keys = tuple(sorted(locked | set(rec.lock_keys)))
        rec.backup_keys = tuple(sorted(k for k in rec.writes if k not in locked))
        self.locks.add_backup_locks(rec.tx, rec.backup_keys)
        if self.locks.acquire(rec.tx, rec.lock_keys, now + self.config.lock_timeout, msg.wait):
            self._prepared(rec, now, out)
        else:
            rec.pending = 0
            self._granted((), now, out)  # a no-wait prepare that met a held key failed already: vote NO

    def _prepared(self, rec: _Record, now: float, out: list[TxOutput]) -> None:
        """Every lock of a prepare is held: validate what was read, stamp versions, vote."""
        if self._members is not None and rec.tx.origin not in self._members:
            self._finish(rec, TxState.ROLLED_BACK, now, out, "originator left before prepare")
            return
        for key in sorted(rec.reads):
            seen, now_version = rec.reads[key], self._version_of(key)
            if seen != now_version:
                reason = f"key {key!r} changed since it was read (version {seen}, now {now_version})"
                self._finish(rec, TxState.ROLLED_BACK, now, out, reason)
                self._vote(rec, 0, out)
                return
        if self._room is not None:
            # The keys whose primary we are that the transaction puts: a member at its max_entries or max_bytes
            # bound refuses those that would add a key or grow its bytes past it, as it refuses plain PUTs.
            puts = [(k, v) for k, v in sorted(rec.writes.items()) if v is not None and k in rec.stamp_keys]
            refused = self._room(puts) if puts else ""
            if refused:
                self._finish(rec, TxState.ROLLED_BACK, now, out, refused)
                self._vote(rec, 0, out)
                return
        rec.versions = {k: self._stamp(k) for k in sorted(rec.writes) if k in rec.stamp_keys}
        rec.state = TxState.PREPARED
        rec.prepared_attempt = rec.attempt
        rec.views = self._members or frozenset()
        self._vote(rec, 0, out)

    def _granted(self, txs: Iterable[TxId], now: float, out: list[TxOutput]) -> None:
        """Answer the requests a lock operation completed, then the no-wait ones it failed (every lock
        operation that can advance a request ends here)."""
        for tx in txs:
            rec = self._txs.get(tx)
            if rec is None or rec.pending is None:
                continue
            request, rec.pending = rec.pending, None
            if request == 0:
                self._prepared(rec, now, out)
            else:
                self._vote(rec, request, out)
        for tx, key in self.locks.take_failed():
            self._conflict(tx, key, now, out)

    def _conflict(self, tx: TxId, key: bytes, now: float, out: list[TxOutput]) -> None:
        """A no-wait (optimistic) prepare found ``key`` held by another transaction: vote NO now. Waiting
        would only delay the same answer in the usual case (the holder commits and the read no longer
        validates), and it is what made optimistic transactions deadlock across members."""
        rec = self._txs.get(tx)
        if rec is None or rec.pending is None:
            self._granted(self.locks.release(tx), now, out)
            return
        request, rec.pending = rec.pending, None
        holders = self.locks.holder_list(key)
        holder = f" ({holders[0]})" if holders else ""
        reason = f"conflict: key {key!r} is locked by another transaction{holder}"
        self._finish(rec, TxState.ROLLED_BACK, now, out, reason)
        out.append(TxSend(rec.reply_to, TxVote(tx, rec.attempt, request, NO, self.topology_id, (), reason)))

    def _accepts_decision(self, src: Address, rec: _Record, msg: TxCommit | TxRollback) -> bool:
        # Once in doubt, the originator's own (late) decision no longer counts: a resolver may already have
        # decided for every participant, and one participant taking the late message would split them. A
        # resolver's decision counts whoever sends it (the view coordinator can be the originator, back after
        # a partition: simulation seed 19 with automatic resolution).
        return msg.resolved or not (rec.in_doubt and src == rec.tx.origin)

    def _on_commit(self, src: Address, msg: TxCommit, now: float, out: list[TxOutput]) -> None:
        rec = self._txs.get(msg.tx)
        retry = self.topology_id > msg.topology_id
        code = ACK_RETRY if retry else ACK_OK
        if rec is not None:
            if not self._accepts_decision(src, rec, msg):
                return
            if rec.state == TxState.ROLLED_BACK and rec.prepared_attempt == msg.attempt:
                # It voted YES to this very attempt and was then rolled back (by a resolver, while the
                # originator was cut off): never apply after that; say so.
                code = ACK_ROLLED_BACK
            elif rec.state == TxState.COMMITTED:
                # A repeat, maybe under a newer topology that made this member the owner of more of the keys
                # (the property test found a new owner that had committed only its old keys): apply those.
                new = tuple(w for w in msg.writes if w[0] not in rec.versions or w[0] in rec.lost)
                if new:
                    rec.lost.difference_update(k for k, _, _ in new)
                    rec.versions.update((k, v) for k, v, _ in new)
                    self._apply(msg.tx, new)
                    self._release_applied(rec, now, out)
            else:
                # Prepared, active, or rolled back without ever voting YES to this attempt (a failed lock
                # request, an abandoned attempt, a presumed abort): the commit was decided without it, and if
                # it owns keys of the commit now it needs the writes (the property test found a new owner
                # that refused them).
                rec.attempt = msg.attempt
                # The commit may have been computed for an older topology, without keys this member got since
                # (imported lock information brings the prepared writes and their versions): apply those too,
                # before their locks go. Releasing an imported lock without its write let a waiting prepare
                # validate against the old value (the property test found that lost update).
                writes = {k: (v, val) for k, v, val in msg.writes}
                for k, val in rec.writes.items():
                    if k not in writes and k in rec.versions and rec.prepared_attempt == msg.attempt:
                        writes[k] = (rec.versions[k], val)
                entries = tuple((k, v, val) for k, (v, val) in sorted(writes.items()))
                rec.versions = {k: v for k, v, _ in entries}
                self._apply(msg.tx, entries)  # before the locks go (see the class docstring)
                self._finish(rec, TxState.COMMITTED, now, out)
        else:
            # Never prepared here (a new owner after a topology change): the decision is final and the
            # commit self-contained, so apply it and remember it.
            rec = self._txs[msg.tx] = _Record(msg.tx, msg.attempt, src)
            rec.versions = {k: v for k, v, _ in msg.writes}
            self._apply(msg.tx, msg.writes)
            self._finish(rec, TxState.COMMITTED, now, out)
        out.append(TxSend(src, TxAck(msg.tx, msg.attempt, code, max(self.topology_id, msg.topology_id))))

    def _on_rollback(self, src: Address, msg: TxRollback, now: float, out: list[TxOutput]) -> None:
        rec = self._txs.get(msg.tx)
        code = ACK_RETRY if self.topology_id > msg.topology_id else ACK_OK
        if rec is None:
            # Remember it, so a prepare of this attempt that arrives late is refused instead of locking.
            rec = self._txs[msg.tx] = _Record(msg.tx, msg.attempt, src)
            self._finish(rec, TxState.ROLLED_BACK, now, out, "rolled back", decided=True)
        elif not self._accepts_decision(src, rec, msg):
            return
        elif rec.state == TxState.COMMITTED:
            # The other outcome only if the rollback is of the committed attempt (an abandoned older attempt's
            # rollback arriving late is just acknowledged).
            code = ACK_COMMITTED if msg.attempt >= rec.attempt else code
        elif rec.attempt <= msg.attempt:
            # Remember the highest attempt rolled back: a prepare of it that arrives after its rollback must
            # be refused, not start a new attempt (the property test found that lock left behind).
            rec.attempt = msg.attempt
            if rec.state != TxState.ROLLED_BACK:
                self._finish(rec, TxState.ROLLED_BACK, now, out, "rolled back", decided=True)
            rec.decided = True
        out.append(TxSend(src, TxAck(msg.tx, msg.attempt, code, max(self.topology_id, msg.topology_id))))

    def _finish(
        self, rec: _Record, state: TxState, now: float, out: list[TxOutput], reason: str = "", *, decided: bool = False
    ) -> None:
        rec.state = state
        rec.decided = decided or state == TxState.COMMITTED
        rec.pending = None
        rec.in_doubt = False
        rec.reason = reason
        rec.expires = now + self.config.completed_retention
        self._expiry.append((rec.expires, rec.tx))
        self._granted(self.locks.release(rec.tx, self._unapplied(rec)), now, out)

    def _unapplied(self, rec: _Record) -> set[bytes]:
        """Keys a committed transaction holds here whose write is known but not its version, so not applied:
        their locks stay until a commit or resolution brings the version (typically an imported lock of a
        prepared backup record: backups do not know versions). Releasing them let a later transaction
        overwrite the key before the committed write arrived (the property test found that lost update)."""
        if rec.state != TxState.COMMITTED:
            return set()
        return {k for k in self.locks.held_by(rec.tx) if k in rec.writes and k not in rec.versions}

    def _release_applied(self, rec: _Record, now: float, out: list[TxOutput]) -> None:
        if self.locks.held_by(rec.tx):
            self._granted(self.locks.release(rec.tx, self._unapplied(rec)), now, out)


def termination_decision(states: Iterable[TxState | None]) -> bool | None:
    """The one decision for an in-doubt transaction, from what each participant reports (None: unknown
    there). True: commit everywhere; False: roll back everywhere; None: nothing reported.

    * a participant COMMITTED → commit: the originator decided commit (only it or a resolver sends commits);
    * otherwise any participant ROLLED_BACK, ACTIVE or not knowing it → roll back: it never voted YES, so no
      commit was decided (presumed abort). "Unknown" relies on ``completed_retention`` being longer than
      the time to resolve: a participant must not have forgotten a commit;
    * all PREPARED → roll back: nobody applied the commit and the originator reports a commit to its client
      only after every owner acknowledged it, so no client was told the transaction committed.

    Every participant must be resolved with the answer computed from *all* their reports, after all of them
    installed a view without the originator (from then on they ignore its late decisions).
    """
    seen = list(states)
    if not seen:
        return None
    return TxState.COMMITTED in seen


# -- automatic resolution ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TxDecided:
    """The resolver's decision for an in-doubt transaction. The driver sends it, self-contained (a TX_COMMIT
    with each owner's writes and the versions known, or a TX_ROLLBACK), to the current write owners of the keys
    and to ``members`` (those that reported it unfinished). A written key with no version anywhere (its
    stamping primary is gone) is committed by its current primary, which stamps one
    (:meth:`TxTable.stamp_committed`)."""

    tx: TxId
    commit: bool
    attempt: int
    writes: tuple[Write, ...]
    versions: tuple[tuple[bytes, int], ...]
    members: tuple[Address, ...]


ResolverOutput = TxSend | TxDecided


def resolution(tx: TxId, reports: Mapping[Address, TxReportInfo], members: Iterable[Address]) -> bool | str:
    """The automatic decision for in-doubt ``tx`` from the reports of *every* member of the current view
    (``members``): True commit, False roll back, or a text saying why it stays in doubt.

    * some member COMMITTED it → commit (only the originator after a unanimous YES, or a resolver, commits);
    * its originator is a member and still deciding → wait for it;
    * its originator is a member and reports it ROLLED_BACK → roll back (it decided so, and only it decides a
      commit; the node reports what its originator side decided. Simulation seed 19 had one: an originator back
      after a partition had rolled the transaction back, and a participant that left kept it in doubt);
    * a member has it PREPARED without knowing it in doubt while the originator is gone (it has not installed
      the view without the originator yet, and would still take the originator's late commit) → wait;
    * a member of a view at its prepare, other than the originator, is no longer a member → stay in doubt: it
      may have committed the transaction and its data may have moved by state transfer, so no member left
      can tell a rollback is safe (an operator decides: ``groupcluster tx resolve``);
    * otherwise roll back (:func:`termination_decision`: nobody committed it, so no client was told it did).
    """
    present = set(members)
    states = [r.state for r in reports.values()]
    if int(TxState.COMMITTED) in states:
        return True
    deciding = sorted(str(m) for m, r in reports.items() if r.deciding)
    if deciding:
        return f"its originator {deciding[0]} has not decided yet"
    origin = reports.get(tx.origin) if tx.origin in present else None
    if origin is not None and origin.state == int(TxState.ROLLED_BACK):
        return False
    if tx.origin not in present:
        unaware = sorted(str(m) for m, r in reports.items() if r.state == int(TxState.PREPARED) and not r.in_doubt)
        if unaware:
            return f"{', '.join(unaware)} prepared it and has not seen its originator leave yet"
    views: set[Address] = set()
    for r in reports.values():
        views.update(r.views)
    left = sorted(str(m) for m in views - present - {tx.origin})
    if left:
        return f"members of its prepare-time view left ({', '.join(left)}): one may have committed it"
    return False


class TxResolver:
    """The view coordinator's automatic resolution of in-doubt transactions (docs/grid-transactions.md,
    "Resolving in-doubt transactions"), one per member, active on the view coordinator only.

    After a view change that removed a member (or made this member coordinator), and then every
    ``resend_interval`` while any member reports a transaction in doubt or a round went unanswered, it sends
    every member a TX_REPORT_REQ (the transactions it knows in doubt; each member adds those in doubt on it).
    Once every member of the view answered a round, each transaction in doubt that the round asked about is
    decided by :func:`resolution` (one in doubt that the round did not name yet is asked about in a new round,
    at once). Decisions come out as :class:`TxDecided`; those it cannot take are listed in :attr:`undecided`.
    A round's decisions are taken from fresh reports each time, so a lost decision message is decided (the
    same way) again in the next round."""

    def __init__(self, address: Address, config: TxConfig | None = None) -> None:
        self.address = address
        self.config = config or TxConfig()
        self.enabled = True
        self._members: tuple[Address, ...] = ()
        self._request = 0
        self._asked: frozenset[TxId] = frozenset()
        self._waiting: set[Address] = set()
        self._answers: dict[Address, TxReportAnswer] = {}
        self._next_round: float | None = None
        self._known: frozenset[TxId] = frozenset()
        self.undecided: dict[TxId, str] = {}  # in doubt and not decidable by the last round: why
        self.rounds = 0
        self.decided = 0

    @property
    def active(self) -> bool:
        return self.enabled and bool(self._members) and self._members[0] == self.address

    def next_deadline(self) -> float | None:
        return self._next_round if self.active else None

    def on_view(self, members: Sequence[Address], now: float, *, removed: bool) -> list[ResolverOutput]:
        """A new view; ``removed``: a member of the previous view is not in it (a merge view counts too)."""
        was = self.active
        self._members = tuple(members)
        if not self.active:
            self._next_round = None
            self._waiting.clear()
            self._answers.clear()
            self.undecided.clear()
            return []
        if removed or not was or self._next_round is not None:
            return self._start(now)
        return []

    def tick(self, now: float) -> list[ResolverOutput]:
        if self.active and self._next_round is not None and now >= self._next_round:
            return self._start(now)
        return []

    def on_answer(self, src: Address, answer: TxReportAnswer, now: float) -> list[ResolverOutput]:
        if not self.active or answer.request_id != self._request or src not in self._waiting:
            return []  # an answer to an older round, or a duplicate
        self._waiting.discard(src)
        self._answers[src] = answer
        if self._waiting:
            return []
        return self._complete(now)

    def _start(self, now: float) -> list[ResolverOutput]:
        self._request += 1
        self.rounds += 1
        self._asked = self._known
        self._waiting = set(self._members)
        self._answers = {}
        # Unless every answer comes and nothing is in doubt, another round follows.
        self._next_round = now + self.config.resend_interval
        msg = TxReportRequest(self._request, tuple(sorted(self._asked)), self._members)
        return [TxSend(m, msg) for m in self._members]

    def _complete(self, now: float) -> list[ResolverOutput]:
        by_tx: dict[TxId, dict[Address, TxReportInfo]] = {}
        in_doubt: set[TxId] = set()
        present = set(self._members)
        for member, answer in self._answers.items():
            for r in answer.reports:
                by_tx.setdefault(r.tx, {})[member] = r
                # Prepared with its originator gone from our view counts too: the member's view may be behind
                # (simulation seed 446: it reported nothing in the round of the view change, in doubt later).
                if r.in_doubt or (r.state == int(TxState.PREPARED) and r.tx.origin not in present):
                    in_doubt.add(r.tx)
        out: list[ResolverOutput] = []
        new = in_doubt - self._asked
        self.undecided = {}
        for tx in sorted(in_doubt & self._asked):
            reports = by_tx[tx]
            verdict = resolution(tx, reports, self._members)
            if isinstance(verdict, str):
                self.undecided[tx] = verdict
                continue
            self.decided += 1
            out.append(decision(tx, verdict, reports))
        self._known = frozenset(in_doubt)
        if new:
            out += self._start(now)  # ask every member about them now
        elif not in_doubt:
            self._next_round = None
        return out


def decision(tx: TxId, commit: bool, reports: Mapping[Address, TxReportInfo]) -> TxDecided:
    """The decision for ``tx`` with what the members reported: the writes and versions merged (a committed
    report's versions win: they are what every owner must store), and the members that have it unfinished."""
    writes: dict[bytes, bytes | None] = {}
    versions: dict[bytes, int] = {}
    attempt = 0
    # Committed reports last: the versions a commit carried are the ones every owner must store.
    for member in sorted(reports, key=lambda m: (reports[m].state == int(TxState.COMMITTED), m)):
        r = reports[member]
        writes.update(r.writes)
        versions.update(r.versions)
        if r.in_doubt or r.state == int(TxState.COMMITTED):
            attempt = max(attempt, r.attempt)
    unfinished = tuple(sorted(m for m, r in reports.items() if r.state in (int(TxState.ACTIVE), int(TxState.PREPARED))))
    return TxDecided(
        tx,
        commit,
        attempt,
        tuple(sorted(writes.items())),
        tuple(sorted((k, v) for k, v in versions.items() if k in writes)),
        unfinished,
    )


def report_info(report: TxReport, deciding: bool = False) -> TxReportInfo:
    """A :class:`TxReport` as a TX_REPORT carries it."""
    state = REPORT_UNKNOWN if report.state is None else int(report.state)
    if report.state is None:
        return TxReportInfo(report.tx, state, 0, False, deciding, (), (), ())
    return TxReportInfo(
        report.tx, state, report.attempt, report.in_doubt, deciding, report.writes, report.versions, report.views
    )


# -- coordinator -------------------------------------------------------------------------------------------------

# (keys) -> (topology id, key -> owners, primary first): the originator's current routing.
Router = Callable[[Sequence[bytes]], tuple[int, Mapping[bytes, Sequence[Address]]]]


class CoordState(IntEnum):
    ACTIVE = 0  # the client works (pessimistic lock requests may run)
    PREPARING = 1  # prepares of the current attempt sent, votes being gathered
    WAITING = 2  # a participant answered RETRY: waiting for a newer topology to prepare again
    COMMITTING = 3  # decided commit: waiting for every owner's ack
    ROLLING_BACK = 4  # decided rollback (outcome reported): releasing locks everywhere
    DONE = 5


@dataclass(slots=True)
class _CTx:
    tx: TxId
    mode: LockingMode
    state: CoordState = CoordState.ACTIVE
    attempt: int = 1
    writes: dict[bytes, bytes | None] = field(default_factory=dict)
    reads: dict[bytes, int] = field(default_factory=dict)
    locked: set[bytes] = field(default_factory=set)  # pessimistic locks granted
    # every key ever asked of a participant: the decision goes to all their owners (a lock request that
    # failed as a whole may still hold some of its keys somewhere, or their lock information moved)
    touched: set[bytes] = field(default_factory=set)
    deadline: float = 0.0
    resend_at: float = 0.0
    need_topology: int = 0
    contacted: set[Address] = field(default_factory=set)
    # the messages of the current phase not answered yet, by destination (resent on resend_at)
    unanswered: dict[Address, TxMessage] = field(default_factory=dict)
    votes: dict[Address, TxVote] = field(default_factory=dict)
    primary_of: dict[bytes, Address] = field(default_factory=dict)
    versions: dict[bytes, int] = field(default_factory=dict)
    # lock requests: how many were made, the one in progress (0: none) and its keys
    requests: int = 0
    request: int = 0
    request_keys: tuple[bytes, ...] = ()
    # the lock request's primaries not asked yet, in the global order (see _send_locks)
    lock_plan: list[tuple[Address, TxLock]] = field(default_factory=list)
    acked: dict[Address, int] = field(default_factory=dict)  # completion acks: member -> topology id
    reason: str = ""
    mixed: bool = False
    # The committed attempt's voters per written key: the owners its prepare went to (each voted YES). A
    # member that voted on none of the keys but owns some now is ``held`` back until a voter of each of its
    # keys answered the commit: applied (the key is ``confirmed``, its write goes) or rolled back (``refused``,
    # its write never goes); see _send_completion.
    voters_of: dict[bytes, tuple[Address, ...]] = field(default_factory=dict)
    confirmed: set[bytes] = field(default_factory=set)
    refused: set[bytes] = field(default_factory=set)
    held: set[Address] = field(default_factory=set)


class TxCoordinator:
    """The originator's side: one instance per member, any number of transactions.

    ``router(keys)`` returns the originator's current topology id and the owners of each key (primary
    first); call :meth:`on_topology` whenever it changes. The outcome of a transaction is one
    :class:`TxOutcome`: committed only after every owner acknowledged the commit; rolled back on any NO, a
    timeout before the decision, or :meth:`rollback`.
    """

    def __init__(self, address: Address, router: Router, config: TxConfig | None = None) -> None:
        self.address = address
        self.config = config or TxConfig()
        self._router = router
        self._seq = 0
        self._txs: dict[TxId, _CTx] = {}
        self._members: frozenset[Address] | None = None

    # -- queries

    def state_of(self, tx: TxId) -> CoordState | None:
        c = self._txs.get(tx)
        return None if c is None else c.state

    def pending(self) -> list[TxId]:
        return sorted(self._txs)

    def decided(self, tx: TxId) -> TxReport | None:
        """The decision taken and still being completed, as a report: COMMITTED (with the commit's writes and
        versions) or ROLLED_BACK; None before a decision or once done."""
        c = self._txs.get(tx)
        if c is None or c.state not in (CoordState.COMMITTING, CoordState.ROLLING_BACK):
            return None
        if c.state == CoordState.ROLLING_BACK:
            return TxReport(tx, TxState.ROLLED_BACK, c.attempt, (), ())
        return TxReport(
            tx, TxState.COMMITTED, c.attempt, tuple(sorted(c.writes.items())), tuple(sorted(c.versions.items()))
        )

    def next_deadline(self) -> float | None:
        out: list[float] = []
        for c in self._txs.values():
            if self._timed(c):
                out.append(c.deadline)
            if c.unanswered:
                out.append(c.resend_at)
        return min(out, default=None)

    @staticmethod
    def _timed(c: _CTx) -> bool:
        """Before the decision, while something is asked of the participants, the transaction has a deadline."""
        return c.state in (CoordState.PREPARING, CoordState.WAITING) or (c.state == CoordState.ACTIVE and c.request > 0)

    # -- the client's calls

    def begin(self, now: float, mode: LockingMode | str | None = None) -> TxId:
        self._seq += 1
        tx = TxId(self.address, self._seq)
        m = self.config.mode if mode is None else LockingMode(mode)
        self._txs[tx] = _CTx(tx, m, deadline=now + self.config.tx_timeout)
        return tx

    def lock(self, tx: TxId, keys: Iterable[bytes], now: float) -> list[TxOutput]:
        """Pessimistic mode: lock ``keys`` on their primaries now; a :class:`TxLocked` answers."""
        c = self._get(tx, CoordState.ACTIVE)
        if c.mode != LockingMode.PESSIMISTIC:
            raise ValueError(f"transaction {tx} is optimistic: keys are locked at prepare")
        if c.request:
            raise ValueError(f"transaction {tx} already waits for a lock request")
        c.request_keys = tuple(sorted(set(keys) - c.locked))
        c.requests += 1
        out: list[TxOutput] = []
        if not c.request_keys:
            out.append(TxLocked(tx, c.requests, True))
            return out
        c.request = c.requests
        c.deadline = now + self.config.tx_timeout
        self._send_locks(c, now, out)
        return out

    def commit(
        self,
        tx: TxId,
        writes: Mapping[bytes, bytes | None],
        now: float,
        reads: Mapping[bytes, int] | None = None,
    ) -> list[TxOutput]:
        """Start two-phase commit: ``writes`` (key -> value, None deletes) and the versions the transaction
        read (key -> version, 0 absent; validated on the primaries)."""
        c = self._get(tx, CoordState.ACTIVE)
        if c.request:
            raise ValueError(f"transaction {tx} still waits for a lock request")
        c.writes = dict(writes)
        c.reads = dict(reads or {})
        c.deadline = now + self.config.tx_timeout
        out: list[TxOutput] = []
        if not c.writes and not c.reads and not c.locked:
            self._done(c, True, out)  # nothing to do anywhere
            return out
        self._send_prepares(c, now, out)
        return out

    def rollback(self, tx: TxId, now: float) -> list[TxOutput]:
        c = self._txs.get(tx)
        if c is None or c.state >= CoordState.COMMITTING:
            raise ValueError(f"transaction {tx} is not running (state {None if c is None else c.state.name})")
        out: list[TxOutput] = []
        self._decide(c, False, now, out, "rolled back by the client")
        return out

    # -- inputs

    def on_message(self, src: Address, msg: TxMessage, now: float) -> list[TxOutput]:
        out: list[TxOutput] = []
        c = self._txs.get(msg.tx) if isinstance(msg, TxVote | TxAck) else None
        if c is None:
            return out
        if isinstance(msg, TxVote):
            if msg.attempt == c.attempt:
                if msg.request == 0 and c.state == CoordState.PREPARING:
                    self._on_prepare_vote(c, src, msg, now, out)
                elif msg.request and msg.request == c.request and c.state == CoordState.ACTIVE:
                    self._on_lock_vote(c, src, msg, now, out)
        elif c.state in (CoordState.COMMITTING, CoordState.ROLLING_BACK):
            self._on_ack(c, src, msg, now, out)  # type: ignore[arg-type]
        return out

    def resolved_here(self, tx: TxId, commit: bool, now: float) -> list[TxOutput]:
        """This member sent a resolution of ``tx`` (an operator's, or the automatic resolver's) while this
        originator still completes its own decision. The same decision: nothing changes. The other one
        overrules ours and we stop sending it: an overruled commit is reported rolled back (mixed when a voter
        had applied it); an overruled rollback was reported when it was decided, so nothing more is. The
        answers to the resolution come back here and cannot be told from answers to our decision, so going on
        would take them for acknowledgements of it (simulation seed 912: an operator rolled back, on every
        member, a commit the participants in doubt had ignored; the originator took their acks of the rollback
        for applied commits and sent the commit on to a new owner)."""
        c = self._txs.get(tx)
        if c is None or c.state not in (CoordState.COMMITTING, CoordState.ROLLING_BACK):
            return []
        if commit == (c.state == CoordState.COMMITTING):
            return []
        out: list[TxOutput] = []
        if c.state == CoordState.COMMITTING:
            # Reported as rolled back: no client was told it committed (that waits for every ack).
            reason = "rolled back by a resolution while committing"
            out.append(TxOutcome(c.tx, False, reason, c.attempt, bool(c.confirmed)))
        self._done(c, None, out)
        return out

    def on_topology(self, now: float) -> list[TxOutput]:
        """The router's topology changed: retry what waited for it; send decisions to the new owners."""
        out: list[TxOutput] = []
        tid, _ = self._router(())
        for tx in sorted(self._txs):
            c = self._txs[tx]
            # Owners of any topology seen during the transaction may hold its lock information (pushed to a
            # primary of that topology, possibly arriving late): the decision goes to all of them.
            _, owners = self._router(sorted(c.touched))
            c.contacted.update(o for route in owners.values() for o in route)
            if c.state == CoordState.WAITING and tid >= c.need_topology:
                c.attempt += 1
                self._send_prepares(c, now, out)
            elif c.state == CoordState.ACTIVE and c.request and c.need_topology and tid >= c.need_topology:
                c.need_topology = 0
                self._send_locks(c, now, out)
            elif c.state in (CoordState.COMMITTING, CoordState.ROLLING_BACK):
                self._send_completion(c, now, out)
        return out

    def on_view(self, members: Iterable[Address], now: float) -> list[TxOutput]:
        """Members that left answer nothing more: a missing vote from one means a new attempt once the
        topology without it arrives; a missing ack means the new owners get the decision then."""
        self._members = frozenset(members)
        out: list[TxOutput] = []
        tid, _ = self._router(())
        for tx in sorted(self._txs):
            c = self._txs[tx]
            gone = {d for d in c.unanswered if d not in self._members}
            # a primary of the lock request not asked yet counts too: it would never answer
            planned_gone = {d for d, _ in c.lock_plan if d not in self._members}
            if not gone and not planned_gone:
                continue
            for d in gone:
                del c.unanswered[d]
            gone |= planned_gone
            # The topology without them is the next one, unless the router has it already (a driver can install
            # it before the view: waiting for one more would wait for good, simulation seed 1250).
            _, owners = self._router(sorted(c.touched))
            owner_gone = any(o in gone for route in owners.values() for o in route)
            need = tid + 1 if owner_gone else tid
            if c.state == CoordState.PREPARING:
                self._abandon(c, need, now, out)
            elif c.state == CoordState.ACTIVE and c.request:
                c.need_topology = need  # resend the lock request to the new primaries
                c.unanswered.clear()
                c.lock_plan = []
                if need <= tid:
                    c.need_topology = 0
                    self._send_locks(c, now, out)
            elif c.state in (CoordState.COMMITTING, CoordState.ROLLING_BACK):
                if owner_gone:
                    # An owner left without acknowledging the decision: the owners of the topology that
                    # replaces it must have it before a commit is reported (they take its keys over). Completing
                    # now reported a commit nobody had applied when every owner was cut off from the originator
                    # (simulation seed 1171: the participants, in doubt, were then rolled back).
                    c.need_topology = max(c.need_topology, tid + 1)
                if c.held:
                    # voters that left may release members held back for them
                    self._send_completion(c, now, out, only=c.held)
                else:
                    self._maybe_complete(c, out)
        return out

    def tick(self, now: float) -> list[TxOutput]:
        out: list[TxOutput] = []
        for tx in sorted(self._txs):
            c = self._txs[tx]
            timed = c.state in (CoordState.PREPARING, CoordState.WAITING) or (
                c.state == CoordState.ACTIVE and c.request
            )
            if timed and now >= c.deadline:
                if c.state == CoordState.ACTIVE:
                    out.append(TxLocked(tx, c.request, False, "lock request timed out"))
                self._decide(c, False, now, out, "timed out before every participant voted")
                continue
            if c.unanswered and now >= c.resend_at:
                if c.state in (CoordState.COMMITTING, CoordState.ROLLING_BACK):
                    self._send_completion(c, now, out)  # routed anew: the owners may have changed
                    continue
                for dest, msg in sorted(c.unanswered.items()):
                    out.append(TxSend(dest, msg))
                c.resend_at = now + self.config.resend_interval
        return out

    # -- internals

    def _get(self, tx: TxId, state: CoordState) -> _CTx:
        c = self._txs.get(tx)
        if c is None or c.state != state:
            got = "unknown" if c is None else c.state.name
            raise ValueError(f"transaction {tx} is {got}, expected {state.name}")
        return c

    def _send(self, c: _CTx, dest: Address, msg: TxMessage, now: float, out: list[TxOutput]) -> None:
        c.contacted.add(dest)
        c.unanswered[dest] = msg
        c.resend_at = now + self.config.resend_interval
        out.append(TxSend(dest, msg))

    def _send_locks(self, c: _CTx, now: float, out: list[TxOutput]) -> None:
        """Send a pessimistic lock request to its primaries **one at a time, in address order** (the next
        only once the previous granted its keys; each primary takes its keys in key order). Every waiting
        request then holds only locks below, in the global (primary, key) order, the one it waits for, so
        lock requests cannot wait for each other in a cycle across members; asking every primary at once
        let two transactions each hold a key on one member and wait on the other until the lock timeout.
        The price is one round trip per primary. Lock requests made one after another by the same
        transaction (keys locked as the client touches them) are outside this order: the lock timeout
        still breaks such cycles."""
        c.touched.update(c.request_keys)
        tid, owners = self._router(c.request_keys)
        by_primary: dict[Address, list[bytes]] = {}
        for key in c.request_keys:
            by_primary.setdefault(owners[key][0], []).append(key)
        c.unanswered.clear()
        c.votes.clear()
        c.lock_plan = [
            (dest, TxLock(c.tx, c.attempt, c.request, tid, tuple(by_primary[dest]))) for dest in sorted(by_primary)
        ]
        self._send_next_lock(c, now, out)

    def _send_next_lock(self, c: _CTx, now: float, out: list[TxOutput]) -> None:
        dest, msg = c.lock_plan.pop(0)
        self._send(c, dest, msg, now, out)

    def _on_lock_vote(self, c: _CTx, src: Address, vote: TxVote, now: float, out: list[TxOutput]) -> None:
        if src not in c.unanswered:
            return
        del c.unanswered[src]
        if vote.code == NO:
            out.append(TxLocked(c.tx, c.request, False, vote.reason))
            self._decide(c, False, now, out, vote.reason or "lock refused")
        elif vote.code == VOTE_RETRY:
            c.unanswered.clear()
            c.lock_plan = []
            c.need_topology = vote.topology_id
            tid, _ = self._router(())
            if tid >= c.need_topology:
                c.need_topology = 0
                self._send_locks(c, now, out)
        elif not c.unanswered and not c.need_topology and c.lock_plan:
            self._send_next_lock(c, now, out)  # the next primary in the order
        elif not c.unanswered and not c.need_topology:
            c.locked.update(c.request_keys)
            out.append(TxLocked(c.tx, c.request, True))
            c.request_keys = ()
            c.request = 0

    def _send_prepares(self, c: _CTx, now: float, out: list[TxOutput]) -> None:
        keys = sorted(set(c.writes) | set(c.reads) | c.locked)
        c.touched.update(keys)
        tid, owners = self._router(keys)
        lock_keys: dict[Address, list[bytes]] = {}
        writes: dict[Address, list[Write]] = {}
        c.primary_of = {}
        c.voters_of = {}
        for key in keys:
            route = owners[key]
            primary = route[0]
            c.primary_of[key] = primary
            lock_keys.setdefault(primary, []).append(key)
            if key in c.writes:
                c.voters_of[key] = tuple(route)
                for dest in route:
                    writes.setdefault(dest, []).append((key, c.writes[key]))
        c.state = CoordState.PREPARING
        c.unanswered.clear()
        c.votes.clear()
        c.versions = {}
        # Optimistic prepares never queue behind another transaction (a held key is a conflict: NO at once),
        # so they cannot deadlock; pessimistic ones wait (their keys are normally held already).
        wait = c.mode == LockingMode.PESSIMISTIC
        for dest in sorted(set(lock_keys) | set(writes)):
            lk = tuple(lock_keys.get(dest, ()))
            reads = tuple((k, c.reads[k]) for k in lk if k in c.reads)
            msg = TxPrepare(c.tx, c.attempt, tid, lk, tuple(writes.get(dest, ())), reads, wait)
            self._send(c, dest, msg, now, out)

    def _on_prepare_vote(self, c: _CTx, src: Address, vote: TxVote, now: float, out: list[TxOutput]) -> None:
        if src not in c.unanswered:
            return
        del c.unanswered[src]
        if vote.code == NO:
            self._decide(c, False, now, out, vote.reason or "a participant voted no")
            return
        if vote.code == VOTE_RETRY:
            self._abandon(c, vote.topology_id, now, out)
            return
        c.votes[src] = vote
        # Only a key's primary (in this attempt's routing) stamps its version; anything else is ignored, so
        # a participant can never make two transactions commit one key with one version.
        c.versions.update((k, v) for k, v in vote.versions if c.primary_of.get(k) == src)
        if c.unanswered:
            return
        # Every participant of this attempt voted YES: the decision is commit, final from here on.
        missing = sorted(k for k in c.writes if k not in c.versions)
        if missing:
            self._decide(c, False, now, out, f"no version stamped for {missing!r}")
            return
        self._decide(c, True, now, out)

    def _abandon(self, c: _CTx, need_topology: int, now: float, out: list[TxOutput]) -> None:
        """Give the current attempt up (a participant is on a newer topology, or gone) and prepare again,
        as a new attempt, once the router has that topology. Participants of the old attempt release their
        locks on the rollback (best effort: the next attempt's prepare and the final decision also do)."""
        tid, _ = self._router(())
        for dest in sorted(c.contacted):
            if self._members is None or dest in self._members:
                out.append(TxSend(dest, TxRollback(c.tx, c.attempt, tid)))
        c.unanswered.clear()
        c.votes.clear()
        c.need_topology = need_topology
        c.state = CoordState.WAITING
        if tid >= need_topology:
            c.attempt += 1
            self._send_prepares(c, now, out)

    def _decide(self, c: _CTx, commit: bool, now: float, out: list[TxOutput], reason: str = "") -> None:
        c.state = CoordState.COMMITTING if commit else CoordState.ROLLING_BACK
        c.reason = reason
        c.unanswered.clear()
        c.acked.clear()
        c.request = 0
        c.lock_plan = []
        if not commit:
            # Presumed abort: a rollback can be reported at once; the messages below only free locks.
            out.append(TxOutcome(c.tx, False, reason, c.attempt))
        self._send_completion(c, now, out)

    def _send_completion(self, c: _CTx, now: float, out: list[TxOutput], only: Iterable[Address] | None = None) -> None:
        """Send the decision to every member contacted and every current owner of the keys that has not
        acknowledged it under the current topology (a commit carries each owner's writes); ``only``: just to
        these (members held back before).

        A member that voted on none of the keys (it got its keys by state transfer since the prepare) gets
        the commit only once their voters answered. Between the prepare and this commit an automatic resolver
        may have rolled the transaction back (the originator was cut off by a partition, not gone), and such a
        new owner's copy of a key came from a rolled-back owner: applying the late commit there alone left the
        key's replicas unequal (simulation seed 1461). So it is held back until a voter of each of its keys
        answers: applied, and the write goes; rolled back, and it never goes. A key whose voters all left is
        sent as before: nobody is left to ask. A member that voted on some keys gets all of its keys at once,
        as before: holding part of its writes back let it release the other keys' locks early, and holding
        it whole could hold every member back."""
        keys = sorted(c.touched)
        tid, owners = self._router(keys)
        targets = {d for d in c.contacted if self._members is None or d in self._members}
        per_dest: dict[Address, list[VersionedWrite]] = {}
        held: set[Address] = set()
        voters = {v for vs in c.voters_of.values() for v in vs}
        for key in keys:
            for dest in owners[key]:
                targets.add(dest)
                if c.state == CoordState.COMMITTING and key in c.writes:
                    if dest not in voters and c.voters_of:
                        applied = self._applied_by_voter(c, key)
                        if applied is None:
                            held.add(dest)
                            continue
                        if not applied:
                            continue  # rolled back where it was voted: the key stays as they have it
                    per_dest.setdefault(dest, []).append((key, c.versions[key], c.writes[key]))
        chosen = None if only is None else set(only)
        if chosen is None:
            c.unanswered.clear()
        c.held = held
        for dest in sorted(targets):
            if c.acked.get(dest, -1) >= tid or dest in held or (chosen is not None and dest not in chosen):
                continue
            if c.state == CoordState.COMMITTING:
                msg: TxMessage = TxCommit(c.tx, c.attempt, tid, tuple(per_dest.get(dest, ())))
            else:
                msg = TxRollback(c.tx, c.attempt, tid)
            self._send(c, dest, msg, now, out)
        self._maybe_complete(c, out)

    def _applied_by_voter(self, c: _CTx, key: bytes) -> bool | None:
        """Whether a voter of ``key`` applied the commit (True), was rolled back instead (False), or has not
        answered yet (None). True as well when every voter left: nobody is left to ask."""
        if key in c.refused:
            return False
        if key in c.confirmed:
            return True
        voters = c.voters_of.get(key, ())
        if self._members is not None and not any(v in self._members for v in voters):
            return True
        return None

    def _on_ack(self, c: _CTx, src: Address, ack: TxAck, now: float, out: list[TxOutput]) -> None:
        if ack.attempt == c.attempt and c.state == CoordState.COMMITTING:
            # What a voter did with the commit is final whatever topology its answer names (the answers to
            # a late commit name the participant's newer topology and are otherwise not counted): it decides
            # whether the owners that did not vote get the keys it voted on (see _send_completion).
            voted = {k for k, voters in c.voters_of.items() if src in voters}
            if ack.code == ACK_ROLLED_BACK:
                news = voted - c.refused
                c.refused |= voted
                if news:
                    c.mixed = True
                    c.reason = c.reason or f"{src} had rolled it back, not committed"
            elif ack.code in (ACK_OK, ACK_RETRY):
                news = voted - c.confirmed
                c.confirmed |= voted
            else:
                news = set()
            if news and c.held:
                self._send_completion(c, now, out, only=c.held)
        sent = c.unanswered.get(src)
        if ack.attempt != c.attempt or sent is None:
            return
        if ack.code == ACK_RETRY:
            # Applied there, but the keys may have new owners: send the decision to them (and again to this
            # member, with the writes it owns then) once we route by that topology; until then this
            # transaction is not complete. Not counted as an ack: it answered a message whose writes were
            # computed for an older topology (the property test found a new owner never sent its writes
            # because such an answer counted for the newer topology).
            del c.unanswered[src]
            c.need_topology = max(c.need_topology, ack.topology_id)
            tid, _ = self._router(())
            if tid >= c.need_topology:
                self._send_completion(c, now, out)
            return
        if ack.topology_id != sent.topology_id:  # type: ignore[union-attr]
            return  # the answer to an earlier message to it, for another topology: wait for this one's
        if ack.code in (ACK_ROLLED_BACK, ACK_COMMITTED):
            want = "committed" if c.state == CoordState.COMMITTING else "rolled back"
            got = "rolled back" if ack.code == ACK_ROLLED_BACK else "committed"
            c.mixed = True
            c.reason = c.reason or f"{src} had {got} it, not {want}"
        del c.unanswered[src]
        c.acked[src] = ack.topology_id
        self._maybe_complete(c, out)

    def _maybe_complete(self, c: _CTx, out: list[TxOutput]) -> None:
        if c.unanswered or c.held:
            return
        tid, _ = self._router(())
        if c.need_topology > tid:
            return  # the owners of a newer topology still need the decision
        if c.state == CoordState.COMMITTING:
            out.append(TxOutcome(c.tx, True, c.reason, c.attempt, c.mixed))
        self._done(c, None, out)

    def _done(self, c: _CTx, committed: bool | None, out: list[TxOutput]) -> None:
        if committed is not None:
            out.append(TxOutcome(c.tx, committed, "", c.attempt))
        c.state = CoordState.DONE
        del self._txs[c.tx]
