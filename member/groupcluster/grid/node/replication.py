"""A key's owners: serving commands (reads, and writes stamped by the primary), primary/backup replication,
writes re-driven across topology changes, entries pushed after a merge or to repair a vanished member's writes.

It holds the writes this member stamped and applied that are not yet on every write owner, the last sequence
stamped per segment, which members made us apply writes recently (for repair), and the routes of the
topologies installed since the last view change (writes that span a topology change)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from ...core.address import Address
from ..columns import BackupAckBatch, BackupBatch, CommandBatch
from ..consistent_hash import segment_of, segments_of
from ..messages import ERROR, GET, NOT_FOUND, OK, PUT, RETRY, Backup, BackupAck, Command
from ..store import (
    SEQ_BITS,
    next_seq,
)
from ..topology import (
    CacheTopology,
)
from ..tx.reasons import REASON_LOCKED
from .operations import _PRIMARY_CUTOFF_ERROR
from .routes import _fetching, _Routes

if TYPE_CHECKING:
    from .facade import GridNode


class _PendingWrite:
    """A write this member stamped and applied, not yet on every write owner (see :meth:`Replication.redrive`)."""

    __slots__ = (
        "attempt",
        "awaiting",
        "expires",
        "key",
        "merge",
        "op_id",
        "origin",
        "topology_id",
        "value",
        "version",
    )

    def __init__(
        self,
        origin: Address,
        op_id: int,
        attempt: int,
        topology_id: int,
        awaiting: set[Address],
        key: bytes,
        version: int,
        value: bytes | None,
        *,
        merge: bool = False,
        expires: float = 0.0,
    ) -> None:
        self.origin = origin
        self.op_id = op_id
        self.attempt = attempt
        self.topology_id = topology_id  # 0: re-send under the next topology installed
        self.awaiting = awaiting
        self.key = key
        self.version = version
        self.value = value
        # A merge push (:meth:`Replication.push_entries`). Like a write whose client was already answered (op_id
        # 0), nobody waits for it; unlike that one, it keeps ``GridNode.merging`` True until it is done.
        self.merge = merge
        self.expires = expires  # the entry's expiry as a Unix time (0.0: none), sent with every copy


class Replication:
    """This member as an owner: commands served, writes stamped and replicated until every owner has them."""

    def __init__(self, node: GridNode) -> None:
        self.node = node
        # member -> segment -> [lowest version, last time] of the Backups it made us apply (see _repair_after).
        self._stamped_by: dict[Address, dict[int, list[float]]] = {}
        self.seq: dict[int, int] = {}  # segment -> the last sequence we stamped for it
        self.next_write = 1
        self.writes: dict[int, _PendingWrite] = {}
        # Routes of the topologies installed since the last view change (available ones only, the last few):
        # a write of a segment whose write owners a later one left unchanged stays in its round (see
        # _kept_owners). Cleared by every view change, so the rule never spans one (merges included).
        self.recent_routes: dict[int, _Routes] = {}

    def repair_after(self, gone: Address) -> None:
        """``gone`` left our view: finish the writes it may have left half replicated.

        The member that stamps a write applies it, then sends it to the other write owners and stays
        responsible until all of them have it (:meth:`redrive`). If it dies in between, some copies have the
        write and some do not, and nobody finishes it: the owners would serve different values for good
        (simulation seeds 24 and 581: a primary died; 716: a former primary re-driving a write died). So
        every member that applied writes from ``gone`` recently (within ``op_timeout`` of the last one)
        re-drives its entries of those segments from the lowest such version up to the write owners, each at
        its own version, as a write of its own; every store keeps the newest version, so the copies agree.
        """
        recs = self._stamped_by.pop(gone, None)
        if not recs or self.node.store is None or self.node.topology is None:
            return
        store, horizon = self.node.store, self.node._now - self.node.config.op_timeout
        entries: list[tuple[int, bytes, int, bytes | None]] = []
        for seg, (floor, last) in sorted(recs.items()):
            if last < horizon or not store.has_segment(seg):
                continue
            entries.extend((seg, k, ver, val) for k, (ver, val) in store.segments[seg].items() if ver >= floor)
        if entries:
            self.push_entries(entries, merge=False)
            self.node.metrics["grid.repair_entries_pushed"] += len(entries)

    def kept_owners(self, tid: int, t: CacheTopology, seg: int) -> tuple[Address, ...] | None:
        """``t``'s write owners of ``seg`` if a write sent under our earlier topology ``tid`` reached all of
        them: ``t`` has the same primary and no owner that ``tid`` lacked, and no view change came between.
        None otherwise.

        Then the topology change says nothing new about that write: a backup still an owner under ``t``
        applies a Backup of ``tid`` and acknowledges it as of ``tid``, and the primary keeps waiting for that
        round (for ``t``'s owners only) instead of re-driving it. No new owner appeared, nor an owner that starts
        fetching the segment, so no state-transfer snapshot can miss the write. The phase changes that end a
        rebalance keep the write owners (read old, read all, read new: write all in each) or drop the old ones
        (the balanced topology), and each re-drove every write in flight: a second round trip behind members
        busy installing the next topology, the slowest writes of a rebalance. A topology that adds an
        owner (a joiner's first), makes an owner fetch the segment, or changes the primary re-drives as before;
        so does a write whose topology we did not install since the last view change."""
        old = self.recent_routes.get(tid)
        if old is None:
            return None
        before, now = old.write[seg], self.node._routes(t).write[seg]
        if not now or not before or now[0] != before[0]:
            return None
        if _fetching(t, seg) - (_fetching(old.topology, seg) if old.topology.rebalance_id == t.rebalance_id else set()):
            # An owner that fetches ``seg`` under ``t`` but did not under ``tid`` clears its copy when it installs
            # the topology that makes it fetch, which may be after it acknowledged our write (an owner under
            # ``tid``, dropped in between, owner again), and its snapshot source may not have the write yet: that
            # acknowledgement says nothing, so the write is re-driven to ``t``'s owners.
            return None
        if now == before or set(now) <= set(before):
            return now
        return None

    def write_done(self, wid: int, pw: _PendingWrite) -> None:
        """Every write owner has write ``wid``: forget it and answer its originator."""
        del self.writes[wid]
        if self.node.persistence.restore_wids:
            self.node.persistence.restore_done(wid)
        self.node._respond(pw.origin, pw.op_id, pw.attempt, OK, pw.topology_id)

    def on_command_batch(self, src: Address, b: CommandBatch) -> None:
        tid = b.topology_id
        command = self._command
        t = self.node.topology
        if t is None:
            segs: Iterable[int] = [-1] * len(b)
        elif src == self.node.address:
            # Our own operations (the originator is their primary, as clients route writes): each one's
            # segment was computed when it started, so the keys are not hashed a second time here.
            nseg = t.num_segments
            ops = self.node.operations.ops
            segs = [
                op.seg if (op := ops.get(i)) is not None and op.nseg == nseg and op.key is k else segment_of(k, nseg)
                for i, k in zip(b.op_ids, b.keys, strict=True)
            ]
        else:
            segs = segments_of(b.keys, t.num_segments)  # one call for the batch
        for op_id, attempt, kind, key, value, seg, deadline, expires in zip(
            b.op_ids, b.attempts, b.kinds, b.keys, b.values, segs, b.deadlines, b.expiries, strict=True
        ):
            command(src, op_id, attempt, tid, kind, key, value, seg, deadline, expires)

    def on_command(self, src: Address, cmd: Command) -> None:
        self._command(
            src, cmd.op_id, cmd.attempt, cmd.topology_id, cmd.kind, cmd.key, cmd.value, -1, cmd.deadline, cmd.expires
        )

    def _command(  # noqa: C901  every command's path: the topology gate, then the read or write rule, inline
        self,
        src: Address,
        op_id: int,
        attempt: int,
        tid: int,
        kind: int,
        key: bytes,
        value: bytes | None,
        seg: int = -1,  # segment_of(key) when the caller knows it (a batch computes them in one call)
        deadline: float = 0.0,  # the client's, as a Unix time (0.0: none)
        expires: float = 0.0,  # a PUT's expiry, as a Unix time (0.0: none)
    ) -> None:
        t = self.node.topology
        if t is None or tid > t.topology_id:
            self.node._hold(tid, src, Command(op_id, attempt, tid, kind, key, value, deadline, expires))
            return
        if tid < t.topology_id:
            self.node._respond(src, op_id, attempt, RETRY, t.topology_id)
            return
        if seg < 0:
            seg = segment_of(key, t.num_segments)
        store = self.node.store
        assert store is not None
        if self.node.membership.merge_hold is not None:
            # A merge view came and the merged group's first topology has not: ours may be the topology of a
            # partition whose data the merged group does not continue. A read from it would miss what the
            # other side acknowledged long ago (seeds 20, 70), and a write stamped with its version could lose
            # the merge to an older value of the other side (seed 607). Hold both until that topology comes.
            self.node.metrics["grid.ops_held_merging"] += 1
            self.node._hold(t.topology_id + 1, src, Command(op_id, attempt, tid, kind, key, value, deadline, expires))
            return
        r = self.node._routes(t)
        if kind == GET:
            if not r.can_read[seg]:
                self.node._respond(src, op_id, attempt, ERROR, tid, error=f"segment {seg} unavailable")
            elif not r.i_read[seg]:
                self.node._respond(src, op_id, attempt, RETRY, tid)
            else:
                data = store.segments.get(seg)  # the two dicts directly: this is every read's path
                if data is None or (val := data.val.get(key)) is None:
                    self.node._respond(src, op_id, attempt, NOT_FOUND, tid)
                else:
                    self.node._respond(src, op_id, attempt, OK, tid, val, version=data.ver[key])
            return
        if not r.can_write[seg]:
            self.node._respond(src, op_id, attempt, ERROR, tid, error=f"segment {seg} unavailable")
            return
        if not r.primary[seg]:
            self.node._respond(src, op_id, attempt, RETRY, tid)
            return
        locks = self.node.tx.locks
        if locks.any_locked() and locks.is_held(key):
            # A transaction holds the key (prepared, or locked pessimistically): a plain write now could slip
            # under it, so it fails at once rather than queue behind a lock that may be in doubt for long.
            self.node.metrics["grid.writes_refused_locked"] += 1
            holders = ", ".join(str(x) for x in locks.holder_list(key)[:3])
            error = f"{REASON_LOCKED}: key is held by transaction {holders}"
            self.node._respond(src, op_id, attempt, ERROR, tid, error=error)
            return
        if locks.any_blocked() and locks.is_blocked(seg):
            # New primary, the old one's lock information not here yet: which keys are locked is unknown. The
            # wait is short (one message), so the originator retries after its backoff, as for any RETRY.
            self.node._respond(src, op_id, attempt, RETRY, tid)
            return
        if deadline and self.node._now + self.node.wall_offset >= deadline:
            # Its client has given up and may have written the key again through another member since: applying
            # this now could put the older value over that one (docs/grid.md, "Client deadlines").
            self.node.metrics["grid.writes_refused_deadline"] += 1
            self.node._respond(src, op_id, attempt, ERROR, tid, error=_PRIMARY_CUTOFF_ERROR)
            return
        if (
            kind == PUT
            and (self.node.config.max_entries or self.node.config.max_bytes)
            and self.node.bounds.full(seg, key, value)
        ):
            self.node.metrics["grid.writes_refused_full"] += 1
            # A first attempt refused wrote nothing; an earlier attempt, unanswered, may have been applied (by a
            # primary before a topology change) and still be replicated.
            written = "nothing was written" if attempt == 1 else "this attempt wrote nothing (an earlier may have)"
            error = self.node.bounds.full_error(f"{written} (delete keys, add members or raise the bound)")
            self.node._respond(src, op_id, attempt, ERROR, tid, error=error)
            return
        owners = r.write[seg]
        if kind != PUT:
            value = None
            expires = 0.0
        self.stamp_write(seg, key, value, expires, tid, owners[1:], src, op_id, attempt)
        if len(owners) == 1:
            self.node._respond(src, op_id, attempt, OK, tid)

    def stamp_write(
        self,
        seg: int,
        key: bytes,
        value: bytes | None,
        expires: float,
        tid: int,
        backups: Sequence[Address],
        origin: Address,
        op_id: int,
        attempt: int,
    ) -> None:
        """As the segment's primary under topology ``tid``: stamp a write with the segment's next version, apply
        it, and send it to the ``backups`` as a pending write answered to ``origin`` once all acknowledge
        (``op_id`` 0: nobody waits). A client's PUT or DELETE, and the removal of an expired entry."""
        store = self.node.store
        assert store is not None
        data = store.segments.get(seg)
        seq = self.seq[seg] = next_seq(
            self.seq.get(seg, 0),
            self.node._now + self.node.wall_offset,
            data.ver.get(key) if data is not None else None,
        )
        version = (tid << SEQ_BITS) | seq
        if store.write(seg, key, version, value, now=self.node._now):
            if expires:
                store.set_expiry(seg, key, version, expires)
            if self.node.events.written is not None:
                self.node.events.note_written(key, version, value)
        if not backups:
            return
        wid = self.next_write
        self.next_write += 1
        self.writes[wid] = _PendingWrite(
            origin, op_id, attempt, tid, set(backups), key, version, value, expires=expires
        )
        for b in backups:
            self.node._emit_backup(b, wid, tid, version, key, value, expires)

    def redrive(self, wid: int, pw: _PendingWrite) -> None:
        """Finish a write we applied whose replication a topology change interrupted.

        Answering RETRY instead would leave our copy diverged from the others for good if the originator
        died before retrying. So the stamping member stays responsible: it sends the *same* version to the
        write owners of the topology now installed, and answers the originator once all of them have it.
        Stores keep the newest version, so this never overwrites a later write; and a write owner of the
        current topology includes any new owner still fetching, so no snapshot can miss it.
        """
        self.node.hooks.redriving(pw.version)
        t = self.node.topology
        assert t is not None and self.node.store is not None
        seg = segment_of(pw.key, t.num_segments)
        r = self.node._routes(t)
        if not r.can_write[seg]:
            # This (degraded) topology cannot write the segment. The client, if one waits, hears the error
            # now; the write itself stays, to be re-driven by the next topology that can write the segment:
            # we applied it already (and maybe some backups did), so dropping it would leave the copies
            # differing for good once the grid is available again (seed 24). Merge pushes wait the same way.
            if pw.op_id != 0:
                self.node._respond(
                    pw.origin, pw.op_id, pw.attempt, ERROR, t.topology_id, error=f"segment {seg} unavailable"
                )
                pw.op_id = 0
                self.node.metrics["grid.writes_kept_degraded"] += 1
            pw.topology_id = t.topology_id
            pw.awaiting = set()
            return
        owners = r.write[seg]
        applied = self.node.address in owners and self.node.store.write(
            seg, pw.key, pw.version, pw.value, now=self.node._now
        )
        if applied and pw.expires:
            self.node.store.set_expiry(seg, pw.key, pw.version, pw.expires)
        if applied and self.node.events.written is not None:
            self.node.events.note_written(pw.key, pw.version, pw.value)
        pw.topology_id = t.topology_id
        pw.awaiting = {m for m in owners if m != self.node.address}
        self.node.metrics["grid.writes_redriven"] += 1
        if not pw.awaiting:
            self.write_done(wid, pw)
            return
        for b in sorted(pw.awaiting):  # sorted: address hashes (so set order) differ between processes
            self.node._emit_backup(b, wid, t.topology_id, pw.version, pw.key, pw.value, pw.expires)

    def push_entries(
        self,
        entries: list[tuple[int, bytes, int, bytes | None]],
        *,
        merge: bool,
        expiries: Mapping[tuple[int, bytes], float] | None = None,
    ) -> None:
        """Send our entries to the keys' write owners now: after a merge view (``merge``, the merge policy: every
        entry we held goes), or to finish the writes of a member that vanished (:meth:`_repair_after`).

        Each travels as a write of its own version (a :class:`_PendingWrite` with no client waiting), so it
        survives topology changes like any write, and every store keeps the newest version: the partition
        whose write is newest wins, a tie of different values (two partitions that stamped the same version)
        goes to the greater value, a deletion counting as smallest (:meth:`SegmentStore.write`).
        """
        t = self.node.topology
        store = self.node.store
        assert t is not None and store is not None
        for s, key, version, value in entries:
            wid = self.next_write
            self.next_write += 1
            # Each entry keeps its expiry (``expiries``: taken by segment and key before the entries were re-stamped
            # or their segments dropped; else read from the store now).
            if value is None:
                expires = 0.0
            elif expiries is not None:
                expires = expiries.get((s, key), 0.0)
            else:
                expires = store.expiry_of(s, key, version)
            pw = _PendingWrite(self.node.address, 0, 0, 0, set(), key, version, value, merge=merge, expires=expires)
            self.writes[wid] = pw
            self.redrive(wid, pw)
        if merge:
            self.node.metrics["grid.merge_entries_pushed"] += len(entries)

    def on_backup_batch(self, src: Address, b: BackupBatch) -> None:
        tid = b.topology_id
        t = self.node.topology
        if t is None or tid != t.topology_id:
            for one in b.backups():  # held or refused one by one, as single backups are
                self.on_backup(src, one)
            return
        # The common case, under our own topology: the checks of _on_backup, per entry, in one loop.
        store = self.node.installed_store()
        write = store.write
        ack = self.node._emit_ack
        mine = self.node._routes(t).i_write
        now = self.node._now
        written = self.node.events.written
        lows: dict[int, int] = {}
        segs = segments_of(b.keys, t.num_segments)
        for wid, version, key, value, seg in zip(b.write_ids, b.versions, b.keys, b.values, segs, strict=True):
            if not mine[seg]:
                ack(src, wid, RETRY, tid)
            else:
                if write(seg, key, version, value, now=now) and written is not None:
                    written[0].append(key)
                    written[1].append(version)
                    written[2].append(value)
                ack(src, wid, OK, tid)
                low = lows.get(seg)
                if low is None or version < low:
                    lows[seg] = version
        if any(b.expiries):
            # Some entries expire: recorded after the loop (the common batch has no expiry to look at), for the
            # entries whose version is the key's now (applied here, or already held).
            set_expiry = store.set_expiry
            for version, key, seg, expires in zip(b.versions, b.keys, segs, b.expiries, strict=True):
                if expires and mine[seg]:
                    set_expiry(seg, key, version, expires)
        if lows:
            self.note_stamped(src, lows)

    def on_backup(self, src: Address, b: Backup) -> None:
        t = self.node.topology
        if t is None or b.topology_id > t.topology_id:
            self.node._hold(b.topology_id, src, b)
            return
        seg = segment_of(b.key, t.num_segments)
        if not self.node._routes(t).i_write[seg] or (
            b.topology_id < t.topology_id and self.kept_owners(b.topology_id, t, seg) is None
        ):
            self.node._emit_ack(src, b.write_id, RETRY, t.topology_id)
            return
        store = self.node.installed_store()
        applied = store.write(seg, b.key, b.version, b.value, now=self.node._now)
        if applied and b.expires:
            store.set_expiry(seg, b.key, b.version, b.expires)
        if applied and self.node.events.written is not None:
            self.node.events.note_written(b.key, b.version, b.value)
        # Named as the Backup's own round: the primary matches it to the round it waits for.
        self.node._emit_ack(src, b.write_id, OK, b.topology_id)
        if b.topology_id < t.topology_id:
            self.node.metrics["grid.backups_kept_across_topologies"] += 1
        self.note_stamped(src, {seg: b.version})

    def note_stamped(self, src: Address, lows: dict[int, int]) -> None:
        """``src`` made us apply writes of these segments, the lowest version of each given (see _repair_after)."""
        recs = self._stamped_by.setdefault(src, {})
        now, window = self.node._now, self.node.config.op_timeout
        for seg, low in lows.items():
            rec = recs.get(seg)
            if rec is None or now - rec[1] > window:
                recs[seg] = [low, now]
            else:
                rec[0] = min(rec[0], low)
                rec[1] = now

    def on_backup_ack_batch(self, src: Address, b: BackupAckBatch) -> None:
        ack = self._backup_ack
        for wid, code, tid in zip(b.write_ids, b.codes, b.topology_ids, strict=True):
            ack(src, wid, code, tid)

    def on_backup_ack(self, src: Address, ack: BackupAck) -> None:
        self._backup_ack(src, ack.write_id, ack.code, ack.topology_id)

    def _backup_ack(self, src: Address, wid: int, code: int, tid: int) -> None:
        pw = self.writes.get(wid)
        if pw is None:
            return
        if code == OK:
            # A backup acknowledges as of the Backup's own topology, so the id names the round it answers.
            if tid == pw.topology_id:
                pw.awaiting.discard(src)
                if not pw.awaiting:
                    self.write_done(wid, pw)
            return
        if src not in pw.awaiting:
            return  # it has this round already, or is no longer an owner (see _kept_owners): nothing to redo
        if tid > pw.topology_id:
            # The backup moved on: re-send under its topology once we have it (at once if we do).
            pw.topology_id = 0
            if self.node.topology is not None and self.node.topology.topology_id >= tid:
                self.redrive(wid, pw)
        elif tid < pw.topology_id and src in pw.awaiting:
            # It held our Backup too long waiting for this round's topology: offer it again.
            self.node._emit_backup(src, wid, pw.topology_id, pw.version, pw.key, pw.value, pw.expires)
