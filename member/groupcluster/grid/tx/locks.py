"""Key locks on one member: :class:`LockTable` holds per-key exclusive locks owned by transactions (on the
primary owner), FIFO waiters with deadlines, segments whose lock acquisition waits for their lock information,
and backup lock records (on the other owners)."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable

from .messages import TxId


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

    def demote(self, segments: Iterable[int]) -> list[TxId]:
        """The reverse of :meth:`promote`: this member stays an owner of ``segments`` but is their primary no
        more (their lock information went to the new primary, which holds those locks now and releases them at
        the decision). The locks held on their keys become backup locks: still known (exported, promoted again
        if this member becomes the primary once more) but locking nothing, and released with the record like
        any backup lock. Kept as locks they waited here for a version that a backup may never get (a resolved
        commit carries only the writes whose versions it knows). Returns the transactions whose requests this
        completed."""
        segs = set(segments)
        freed: set[bytes] = set()
        for tx in sorted(self._held):
            held = self._held[tx]
            moved = {k for k in held if self._segment_of(k) in segs}
            if not moved:
                continue
            held -= moved
            if not held and tx not in self._requests:
                del self._held[tx]
            self._backup.setdefault(tx, set()).update(moved)
            for key in moved:
                self._locks[key].holders.discard(tx)
            freed |= moved
        # Waiters are woken only once every lock there is demoted: a lock granted now stays a lock.
        granted: list[TxId] = []
        for key in sorted(freed):
            self._wake(key, granted)
        return granted

    def keys_in(self, tx: TxId, segments: frozenset[int]) -> tuple[bytes, ...]:
        """The keys of ``segments`` that ``tx`` holds, waits for or records as backup locks (sorted)."""
        keys = set(self._held.get(tx, ())) | set(self._backup.get(tx, ()))
        req = self._requests.get(tx)
        if req is not None:
            keys.update(req.keys[req.index :])
        return tuple(sorted(k for k in keys if self._segment_of(k) in segments))
