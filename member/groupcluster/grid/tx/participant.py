"""One member as a transaction participant: :class:`TxTable` takes each transaction on the keys it owns
ACTIVE → PREPARED → COMMITTED | ROLLED_BACK (votes, idempotent decisions, in-doubt transactions and their
resolution, retry answers to commands of an old topology). Its records are in :mod:`.records`, its part in
state transfer (lock information of segments that change owners) in :mod:`.lock_transfer`.

A participant never commits on its own: only on a TX_COMMIT (sent by the originator after every participant
voted YES, or by a resolver) or an operator's :meth:`TxTable.resolve`."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Mapping

from ...core.address import Address
from ..store import MAX_SEQ, version_seq
from .config import TxConfig
from .lock_transfer import LockTransfer
from .locks import LockTable
from .messages import (
    ACK_COMMITTED,
    ACK_OK,
    ACK_RETRY,
    ACK_ROLLED_BACK,
    NO,
    VOTE_RETRY,
    YES,
    TxAck,
    TxCommit,
    TxId,
    TxLock,
    TxLockInfo,
    TxMessage,
    TxPrepare,
    TxRollback,
    TxVote,
    VersionedWrite,
)
from .outputs import TxOutput, TxSend
from .records import ABSENT, TERMINAL, InDoubt, TxRecord, TxReport, TxState

# Messages held until their topology is installed here.
Held = TxPrepare | TxLock | TxCommit


class TxTable(LockTransfer):
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
        self._txs: dict[TxId, TxRecord] = {}
        self._expiry: deque[tuple[float, TxId]] = deque()  # finished records, oldest first
        self._held: list[tuple[Address, Held]] = []  # for a topology not installed yet
        self._members: frozenset[Address] | None = None
        self.dropped_held = 0
        # Lock information to pass on: segments this member still waits for, and who gets them next
        # (:meth:`push_lock_info`); segments it owns no more (:meth:`drop_segments`); segments it is a backup
        # of after being their primary (:meth:`demote`).
        self._forward: dict[int, Address] = {}
        self._dropped: set[int] = set()
        self._demoted: set[int] = set()

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
        ready = [(s, m) for s, m in self._held if m.topology_id <= self.topology_id]
        self._held = [(s, m) for s, m in self._held if m.topology_id > self.topology_id]
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
        primary when the stamping one is gone). Decide with :func:`~.resolution.termination_decision` and resolve every
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
            writes = tuple((k, self.late_version(tx, k), rec.writes[k]) for k in keys)
            rec.versions.update((k, v) for k, v, _ in writes)
            self._apply(tx, writes)
            self._release_applied(rec, now, out)
            stamped.append((tx, rec.attempt, writes))
        return out, stamped

    def late_version(self, tx: TxId, key: bytes) -> int:
        """The version this member, now ``key``'s primary, gives a committed write of ``tx`` whose stamping
        primary died with the version. Just above the transaction's floor for the key where the prepare named
        one: the dead primary ordered every other write of the key before the transaction (at most the floor)
        or after it (above its own version, so at least floor + 2), and a fresh stamp would have put this
        write after all of them, over writes of transactions that read it (simulation seed 760155000251: a
        transfer's counter went back to its value before a later committed transfer). Without a floor (a blind
        write, a key read absent) a fresh stamp, as for any write."""
        rec = self._txs.get(tx)
        floor = rec.floors.get(key) if rec is not None else None
        if floor is not None and floor != ABSENT and version_seq(floor) < MAX_SEQ:
            return floor + 1
        return self._stamp(key)

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

    # -- handlers

    def _hold(self, src: Address, msg: Held) -> None:
        if len(self._held) >= self.config.max_held:
            self._held.pop(0)  # the originator resends
            self.dropped_held += 1
        self._held.append((src, msg))

    def _vote(self, rec: TxRecord, request: int, out: list[TxOutput]) -> None:
        """(Re)send the vote the record stands for."""
        if rec.state == TxState.ROLLED_BACK:
            vote = TxVote(rec.tx, rec.attempt, request, NO, self.topology_id, (), rec.reason or "rolled back")
        else:
            versions = tuple(sorted(rec.versions.items())) if request == 0 else ()
            vote = TxVote(rec.tx, rec.attempt, request, YES, self.topology_id, versions)
        out.append(TxSend(rec.reply_to, vote))

    def _fresh(self, src: Address, msg: TxPrepare | TxLock, now: float, out: list[TxOutput]) -> TxRecord | None:
        """The record a prepare or lock request works on, or None when it is a duplicate or stale (answered)."""
        request = msg.request if isinstance(msg, TxLock) else 0
        if self._members is not None and msg.tx.origin not in self._members:
            # A late request of a gone originator (any attempt): locking for it would lock for good.
            return None
        rec = self._txs.get(msg.tx)
        if rec is None:
            rec = self._txs[msg.tx] = TxRecord(msg.tx, msg.attempt, src)
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
        rec.floors = dict(msg.floors)
        self.locks.add_backup_locks(rec.tx, rec.backup_keys)
        if self.locks.acquire(rec.tx, rec.lock_keys, now + self.config.lock_timeout, msg.wait):
            self._prepared(rec, now, out)
        else:
            rec.pending = 0
            self._granted((), now, out)  # a no-wait prepare that met a held key failed already: vote NO

    def _prepared(self, rec: TxRecord, now: float, out: list[TxOutput]) -> None:
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

    def _accepts_decision(self, src: Address, rec: TxRecord, msg: TxCommit | TxRollback) -> bool:
        # Once in doubt, the originator's own (late) commit no longer counts: a resolver may already have rolled
        # the transaction back for every participant, and one participant taking the late commit would split
        # them. A resolver's decision counts whoever sends it (the view coordinator can be the originator, back
        # after a partition: simulation seed 19 with automatic resolution). The originator's rollback counts
        # too: it sends one only for an attempt it gave up or decided to roll back, so that attempt and every
        # earlier one never commit, and a resolver commits only what some member committed; ignored, it was
        # resent unanswered until an operator resolved the member, and the originator stayed pending meanwhile.
        if msg.resolved or isinstance(msg, TxRollback):
            return True
        return not (rec.in_doubt and src == rec.tx.origin)

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
            rec = self._txs[msg.tx] = TxRecord(msg.tx, msg.attempt, src)
            rec.versions = {k: v for k, v, _ in msg.writes}
            self._apply(msg.tx, msg.writes)
            self._finish(rec, TxState.COMMITTED, now, out)
        out.append(TxSend(src, TxAck(msg.tx, msg.attempt, code, max(self.topology_id, msg.topology_id))))

    def _on_rollback(self, src: Address, msg: TxRollback, now: float, out: list[TxOutput]) -> None:
        rec = self._txs.get(msg.tx)
        code = ACK_RETRY if self.topology_id > msg.topology_id else ACK_OK
        if rec is None:
            # Remember it, so a prepare of this attempt that arrives late is refused instead of locking.
            rec = self._txs[msg.tx] = TxRecord(msg.tx, msg.attempt, src)
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
        self, rec: TxRecord, state: TxState, now: float, out: list[TxOutput], reason: str = "", *, decided: bool = False
    ) -> None:
        rec.state = state
        rec.decided = decided or state == TxState.COMMITTED
        rec.pending = None
        rec.in_doubt = False
        rec.reason = reason
        rec.expires = now + self.config.completed_retention
        self._expiry.append((rec.expires, rec.tx))
        self._granted(self.locks.release(rec.tx, self._unapplied(rec)), now, out)

    def _unapplied(self, rec: TxRecord) -> set[bytes]:
        """Keys a committed transaction holds here whose write is known but not its version, so not applied:
        their locks stay until a commit or resolution brings the version (typically an imported lock of a
        prepared backup record: backups do not know versions). Releasing them let a later transaction
        overwrite the key before the committed write arrived (the property test found that lost update)."""
        if rec.state != TxState.COMMITTED:
            return set()
        return {k for k in self.locks.held_by(rec.tx) if k in rec.writes and k not in rec.versions}

    def _release_applied(self, rec: TxRecord, now: float, out: list[TxOutput]) -> None:
        if self.locks.held_by(rec.tx):
            self._granted(self.locks.release(rec.tx, self._unapplied(rec)), now, out)
