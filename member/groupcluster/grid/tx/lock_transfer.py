"""Lock information across state transfer, the participant's side of segments changing owners: a new primary
blocks them until their lock information arrives (:meth:`LockTransfer.block_segments`), the old one pushes it
(:meth:`~LockTransfer.push_lock_info`, :meth:`~LockTransfer.export_segments`), the new one imports it
(:meth:`~LockTransfer.import_lock_info`) and passes it on where the segments moved again; a backup promoted to
primary turns its backup locks into locks, a primary that stays a backup turns its locks into backup locks, and
a member that lost its copy of segments forgets what it applied there."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from ...core.address import Address
from .locks import LockTable
from .messages import INFO_ACTIVE, INFO_PREPARED, TxId, TxLockInfo, TxRecordInfo, VersionedWrite
from .outputs import TxOutput, TxSend
from .records import TERMINAL, TxRecord, TxState


class LockTransfer:
    """The state-transfer part of :class:`~.participant.TxTable`, which is its only subclass: the attributes and
    steps declared here are the table's, defined in its ``__init__`` and its handlers."""

    locks: LockTable
    topology_id: int
    _txs: dict[TxId, TxRecord]
    _members: frozenset[Address] | None
    _forward: dict[int, Address]
    _dropped: set[int]
    _demoted: set[int]
    _segment_of: Callable[[bytes], int]
    _apply: Callable[[TxId, tuple[VersionedWrite, ...]], None]

    if TYPE_CHECKING:

        def _granted(self, txs: Iterable[TxId], now: float, out: list[TxOutput]) -> None: ...

        def _finish(
            self,
            rec: TxRecord,
            state: TxState,
            now: float,
            out: list[TxOutput],
            reason: str = "",
            *,
            decided: bool = False,
        ) -> None: ...

        def _release_applied(self, rec: TxRecord, now: float, out: list[TxOutput]) -> None: ...

    def block_segments(self, segments: Iterable[int]) -> None:
        """New primary of ``segments``: no lock is granted there until their lock information arrived."""
        segs = set(segments)
        self._dropped -= segs
        self._demoted -= segs
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
            floors = tuple(sorted((k, v) for k, v in rec.floors.items() if k in ks)) if prepared else ()
            state = INFO_PREPARED if prepared else INFO_ACTIVE
            records.append(TxRecordInfo(tx, rec.attempt, state, rec.in_doubt, keys, writes, versions, floors))
        return TxLockInfo(self.topology_id, tuple(sorted(segs)), tuple(records))

    def import_lock_info(self, info: TxLockInfo, now: float, out: list[TxOutput] | None = None) -> list[TxOutput]:
        """Lock information pushed for ``info.segments``: their keys stay locked by those transactions here
        (as a new primary would treat promoted backup locks), then the segments are unblocked. A transaction
        received from any pusher will be committed or rolled back here by the originator's retry."""
        out = [] if out is None else out
        for r in info.records:
            rec = self._txs.get(r.tx)
            if rec is not None and rec.attempt > r.attempt:
                # We know a newer attempt: the originator gave the pushed one up, it never commits. Also when
                # the newer one committed here: the pushed attempt's writes carry no version of the committed
                # one, and holding their keys for a version would hold them for good (a backup cut off in
                # doubt about an abandoned attempt pushes such a record when it becomes a primary again).
                continue
            if rec is not None and rec.state == TxState.COMMITTED:
                self._import_committed(rec, r, now, out)
                continue
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
                rec = rec or TxRecord(r.tx, r.attempt, r.tx.origin)
                self._txs[r.tx] = rec
                self._finish(rec, TxState.ROLLED_BACK, now, out, "originator left before prepare")
                continue
            if rec is None:
                rec = self._txs[r.tx] = TxRecord(r.tx, r.attempt, r.tx.origin)
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
            rec.floors.update(r.floors)
            self.locks.force_hold(r.tx, hold)
        self._granted(self.locks.unblock_segments(info.segments), now, out)
        self._pass_on(info, now, out)
        return out

    def _import_committed(self, rec: TxRecord, r: TxRecordInfo, now: float, out: list[TxOutput]) -> None:
        """Pushed lock information of a transaction committed here already: apply the writes it lacks, and keep
        the keys of writes pushed without a version locked until their versions come."""
        # Committed here already, maybe by a commit computed before this member owned these keys (a
        # backup of other keys): the prepared writes pushed with their versions are the transaction's,
        # apply those it lacks (the property test found a new primary that skipped them and served
        # the old value).
        vs = dict(r.versions)
        missing = tuple((k, vs[k], v) for k, v in r.writes if k in vs and (k not in rec.versions or k in rec.lost))
        if missing:
            rec.lost.difference_update(k for k, _, _ in missing)
            rec.versions.update((k, ver) for k, ver, _ in missing)
            self._apply(r.tx, missing)
        # Writes pushed without a version (the pusher was a backup) cannot be applied yet: keep their
        # keys locked for this transaction until a commit or resolution brings the versions.
        waiting = [k for k, _ in r.writes if k not in rec.versions]
        if waiting:
            rec.writes.update((k, v) for k, v in r.writes if k in waiting)
            rec.floors.update((k, v) for k, v in r.floors if k in waiting)
            self.locks.force_hold(r.tx, waiting)
        if missing:
            self._release_applied(rec, now, out)  # keys held for an earlier push have their write now

    def _pass_on(self, info: TxLockInfo, now: float, out: list[TxOutput]) -> None:
        """Forward the imported segments' lock information to where they went on, and let go of those we dropped."""
        onward: dict[Address, list[int]] = {}
        for seg in info.segments:
            dest = self._forward.pop(seg, None)
            if dest is not None:
                onward.setdefault(dest, []).append(seg)
        for dest, segs in sorted(onward.items()):
            out.append(TxSend(dest, self.export_segments(segs)))
        demoted = self._demoted.intersection(info.segments)
        if demoted:
            # Passed on to the new primary while we stay a backup: what the import made locks here goes back
            # to backup locks (see demote).
            self._demote_locks(demoted, now, out)
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
                    and all(self._segment_of(k) in self._dropped for k in (*rec.lock_keys, *rec.backup_keys))
                ):
                    del self._txs[r.tx]

    def drop_segments(self, segments: Iterable[int], now: float) -> list[TxOutput]:
        """This member owns ``segments`` no more, and their lock information was pushed: their locks and
        backup locks go (records stay until their decision; a member that no longer owns a key gets no write
        of it, so a committed record waiting for a version there would hold its lock for good)."""
        segs = set(segments)
        self._dropped |= segs
        self._demoted -= segs
        out: list[TxOutput] = []
        # Segments whose information this member still has to pass on keep their locks until it has (then
        # import_lock_info drops them): dropping first would pass on nothing (the property test found it).
        self._granted(self.locks.drop_segments(segs - set(self._forward)), now, out)
        return out

    def demote(self, segments: Iterable[int], now: float) -> list[TxOutput]:
        """The reverse of :meth:`promote`: this member was the primary of ``segments``, pushed their lock
        information to the new primary (:meth:`push_lock_info`, called first) and stays a backup owner of
        them. The new primary holds those locks now and releases them at the decision; kept as locks here they
        could wait for good for a version that no commit brings a backup (a resolved commit carries only the
        writes whose versions it knows). So they become backup locks, released with the record like any other
        backup lock, and promoted again if this member becomes the primary once more. Segments whose lock
        information is still to be passed on are demoted again once it arrived (:meth:`_pass_on`)."""
        segs = frozenset(segments)
        self._demoted |= segs
        out: list[TxOutput] = []
        self._demote_locks(segs, now, out)
        return out

    def _demote_locks(self, segments: Iterable[int], now: float, out: list[TxOutput]) -> None:
        segs = frozenset(segments)
        self._granted(self.locks.demote(segs), now, out)
        for rec in list(self._txs.values()):
            moved = tuple(k for k in rec.lock_keys if self._segment_of(k) in segs)
            if moved:
                rec.backup_keys = tuple(sorted(set(rec.backup_keys) | set(moved)))
                rec.lock_keys = tuple(k for k in rec.lock_keys if k not in moved)
            if rec.state in TERMINAL and self.locks.backup_locks(rec.tx):
                # A finished record keeps no backup lock (a lock it kept was for a write waiting for its
                # version: a later commit still applies it, and only the primary needs the key held).
                self._granted(self.locks.release(rec.tx, self.locks.held_by(rec.tx)), now, out)

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
        self._demoted -= segs
        for rec in self._txs.values():
            moved = tuple(k for k in rec.backup_keys if self._segment_of(k) in segs)
            if moved:
                rec.lock_keys = tuple(sorted(set(rec.lock_keys) | set(moved)))
                rec.backup_keys = tuple(k for k in rec.backup_keys if k not in moved)
        self.locks.promote(segs)
