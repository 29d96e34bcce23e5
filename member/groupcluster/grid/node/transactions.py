"""The node's transaction glue (docs/grid-transactions.md): the ``tx_*`` calls, the participant table's and the
originator's callbacks and outputs, lock information handed between primaries, and in-doubt resolution.

The state machines are in ``grid/tx/`` (:class:`~..tx.participant.TxTable`,
:class:`~..tx.coordinator.TxCoordinator`, :class:`~..tx.resolution.TxResolver`, held by the node as ``tx``,
``txc``, ``txr``); this part holds what ties them to the node: pending calls by transaction, finished
transactions kept for late calls, lock information pushed and awaited, and ``tx_resolve_all`` queries."""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ...core.address import Address
from ..consistent_hash import segment_of
from ..store import (
    make_version,
    next_seq,
)
from ..topology import (
    CacheTopology,
)
from ..tx.coordinator import CoordState
from ..tx.messages import (
    NO,
    TxAck,
    TxCommit,
    TxId,
    TxInfoAck,
    TxLock,
    TxLockInfo,
    TxPrepare,
    TxReportAnswer,
    TxReportInfo,
    TxReportRequest,
    TxRollback,
    TxVote,
    VersionedWrite,
)
from ..tx.outputs import TxLocked, TxOutcome, TxOutput, TxSend
from ..tx.reasons import (
    REASON_CONFLICT,
    REASON_FULL,
    REASON_LOCK_TIMEOUT,
    REASON_MIXED,
    REASON_ROLLED_BACK,
    REASON_TIMEOUT,
    REASON_UNAVAILABLE,
)
from ..tx.records import InDoubt, TxReport, TxState
from ..tx.resolution import ResolverOutput, TxDecided, decision, report_info, resolution
from .results import TX_COMMIT_OP, TX_LOCK_OP, TX_RESOLVE_OP, TX_ROLLBACK_OP, OpResult

if TYPE_CHECKING:
    from .facade import GridNode

log = logging.getLogger("groupcluster.grid")


# Request ids of tx_resolve_all's report requests: apart from the resolver's rounds, which count from 1.
_QUERY_IDS = 1 << 48


_TX_DONE_KEPT = 10_000  # finished transactions remembered for late calls (tx_commit after a rollback)


def _tx_reason(text: str) -> str:
    """The stable reason for the core's rollback explanation (its texts are for people)."""
    if "changed since it was read" in text or text.startswith("conflict:"):
        return REASON_CONFLICT
    if text.startswith(f"{REASON_FULL}:"):
        return REASON_FULL
    if "lock timeout" in text:
        return REASON_LOCK_TIMEOUT
    if "timed out" in text:
        return REASON_TIMEOUT
    if "unavailable" in text:
        return REASON_UNAVAILABLE
    return REASON_ROLLED_BACK


class Transactions:
    """The transaction side of one member: calls, callbacks of the core, lock information, resolution."""

    def __init__(self, node: GridNode) -> None:
        self.node = node
        self._tx_lock_ops: dict[TxId, int] = {}  # transaction -> the op id of its pending tx_lock
        self._tx_end_ops: dict[TxId, tuple[int, int]] = {}  # transaction -> (op id, kind) of tx_commit/tx_rollback
        self._tx_done: OrderedDict[TxId, tuple[bool, str]] = OrderedDict()  # finished here: (committed, reason)
        # Lock information this member pushed, re-sent until the new primary acknowledges it:
        # (dest, topology id, segments) -> [message, next resend time].
        self.tx_pushes: dict[tuple[Address, int, tuple[int, ...]], list[Any]] = {}
        # Segments this member became the write primary of and whose lock information it waits for, with the
        # member expected to push it (the previous primary) and since when; unblocked when any push for them
        # arrives, or at once if that member leaves the view.
        self.tx_awaiting: dict[int, tuple[Address, float]] = {}
        self._tx_info_held: list[tuple[Address, TxLockInfo]] = []  # pushed for a topology not installed yet
        self._tx_info_seen: OrderedDict[tuple[Address, int, tuple[int, ...]], None] = OrderedDict()
        self._tx_reason_override: dict[TxId, tuple[str, str]] = {}  # rolled back by the node itself: why
        self._tx_extra_rollbacks: dict[TxId, int] = {}  # tx_rollback during a commit: its op id
        # tx_resolve_all in progress: request id -> [op id, tx, forced decision or None, members not answered
        # yet, reports so far, deadline]
        self._tx_queries: dict[int, list[Any]] = {}
        self._tx_query_seq = 0

    # ==== transactions =====================================================================================
    # The client's calls (docs/grid-transactions.md, "Using transactions"); results come out of take_results.
    def tx_begin(self, now: float, mode: str | None = None) -> TxId:
        """:meth:`GridNode.tx_begin`."""
        if mode is not None and mode not in ("optimistic", "pessimistic"):
            raise ValueError(f"mode: {mode!r} is not 'optimistic' or 'pessimistic'")
        self.node._now = now
        return self.node.txc.begin(now, mode)

    def tx_lock(self, tx: TxId, keys: Sequence[bytes], now: float) -> int:
        """:meth:`GridNode.tx_lock`."""
        ks = list(keys)
        for i, key in enumerate(ks):
            self._check_key(key, f"keys[{i}]")
        c_state = self.node.txc.state_of(tx)
        if c_state is None and tx not in self._tx_done:
            raise ValueError(f"transaction {tx}: unknown on this member")
        self.node._now = now
        op_id = self.node.operations.new_op_id()
        if c_state != CoordState.ACTIVE:
            self._tx_result(op_id, TX_LOCK_OP, tx, False, self._tx_done_reason(tx), "the transaction is not running")
            self.node._flush()
            return op_id
        out = self.node.txc.lock(tx, ks, now)  # ValueError for an optimistic transaction, before anything is recorded
        self._tx_lock_ops[tx] = op_id
        unavailable = self._tx_unavailable(ks)
        if unavailable:
            out += self.node.txc.rollback(tx, now)
            self._tx_reason_override[tx] = (REASON_UNAVAILABLE, unavailable)
        self._tx_out(out)
        self.node._flush()
        return op_id

    def tx_commit(self, tx: TxId, writes: Mapping[bytes, bytes | None], reads: Mapping[bytes, int], now: float) -> int:
        """:meth:`GridNode.tx_commit`."""
        if not isinstance(writes, Mapping) or not isinstance(reads, Mapping):
            raise TypeError("writes and reads: expected mappings of key -> value and key -> version")
        lim = self.node.limits
        for key, value in writes.items():
            self._check_key(key, "writes key")
            if value is not None:
                if type(value) is not bytes:
                    raise TypeError(f"writes[{key!r}]: expected bytes or None, got {type(value).__name__}")
                if len(value) > lim.max_value_bytes:
                    raise ValueError(f"writes[{key!r}]: {len(value)} bytes exceed the limit of {lim.max_value_bytes}")
        for key, version in reads.items():
            self._check_key(key, "reads key")
            if type(version) is not int or version < 0:
                raise ValueError(f"reads[{key!r}]: expected a version (an integer >= 0), got {version!r}")
        c_state = self.node.txc.state_of(tx)
        if c_state is None and tx not in self._tx_done:
            raise ValueError(f"transaction {tx}: unknown on this member")
        if c_state in (CoordState.PREPARING, CoordState.WAITING, CoordState.COMMITTING):
            raise ValueError(f"transaction {tx} is already being committed")
        if tx in self._tx_lock_ops:
            raise ValueError(f"transaction {tx} still waits for a lock request")
        self.node._now = now
        op_id = self.node.operations.new_op_id()
        if c_state != CoordState.ACTIVE:
            self._tx_result(op_id, TX_COMMIT_OP, tx, False, self._tx_done_reason(tx), "the transaction was rolled back")
            self.node._flush()
            return op_id
        self._tx_end_ops[tx] = (op_id, TX_COMMIT_OP)
        unavailable = self._tx_unavailable(list(writes) + list(reads))
        if unavailable:
            self._tx_reason_override[tx] = (REASON_UNAVAILABLE, unavailable)
            out = self.node.txc.rollback(tx, now)
        else:
            out = self.node.txc.commit(tx, writes, now, reads)
        self._tx_out(out)
        self.node._flush()
        return op_id

    def tx_rollback(self, tx: TxId, now: float) -> int:
        """:meth:`GridNode.tx_rollback`."""
        c_state = self.node.txc.state_of(tx)
        if c_state is None and tx not in self._tx_done:
            raise ValueError(f"transaction {tx}: unknown on this member")
        self.node._now = now
        op_id = self.node.operations.new_op_id()
        if c_state is None or c_state in (CoordState.ROLLING_BACK, CoordState.COMMITTING):
            committed = c_state == CoordState.COMMITTING or self._tx_done.get(tx, (False, ""))[0]
            why = "the transaction is committed" if committed else ""
            self._tx_result(op_id, TX_ROLLBACK_OP, tx, not committed, "committed" if committed else "", why)
            self.node._flush()
            return op_id
        self._tx_end_ops.setdefault(tx, (op_id, TX_ROLLBACK_OP))
        if self._tx_end_ops[tx][0] != op_id:
            # A commit is in flight (preparing): the rollback decides it; both calls hear the outcome.
            self._tx_extra_rollbacks[tx] = op_id
        self._tx_out(self.node.txc.rollback(tx, now))
        self.node._flush()
        return op_id

    def tx_in_doubt(self) -> list[InDoubt]:
        """:meth:`GridNode.tx_in_doubt`."""
        return self.node.tx.in_doubt()

    def tx_report(self, tx: TxId) -> TxReport:
        """:meth:`GridNode.tx_report`."""
        return self.node.tx.report(tx)

    def tx_resolve(self, tx: TxId, commit: bool, now: float, versions: Mapping[bytes, int] | None = None) -> bool:
        """:meth:`GridNode.tx_resolve`."""
        if not any(d.tx == tx for d in self.node.tx.in_doubt()):
            return False
        self.node._now = now
        rep = self.node.tx.report(tx)
        vs = dict(rep.versions)
        vs.update(versions or {})
        t = self.node.topology
        keys = sorted(
            {k for k, _ in rep.writes} | set(self.node.tx.locks.held_by(tx)) | set(self.node.tx.locks.backup_locks(tx))
        )
        not_held: list[bytes] = []
        if commit:
            missing = [k for k, _ in rep.writes if k not in vs]
            if missing and t is not None:
                r = self.node._routes(t)
                for k in missing:
                    if r.primary[segment_of(k, t.num_segments)]:
                        vs[k] = self.node.tx.late_version(tx, k)
            # A written key whose segment we hold no more is not written here: its owners have it, and its
            # version may have left with the members that knew it (the originator's decision reached us only
            # after we were in doubt, and was ignored then, while the key moved on by state transfer).
            store = self.node.store
            n = t.num_segments if t is not None else 0
            not_held = [
                k for k, _ in rep.writes if k not in vs and (store is None or not store.has_segment(segment_of(k, n)))
            ]
            still = sorted(k for k, _ in rep.writes if k not in vs and k not in not_held)
            if still:
                raise ValueError(
                    f"transaction {tx}: no version for written keys {still!r}: resolve on their write primary "
                    "first, or pass the versions other members report"
                )
        out = self.node.tx.resolve(tx, commit, now, vs if commit else None, not_held=not_held)
        out += self.node.txc.resolved_here(tx, commit, now)
        if t is not None:
            r = self.node._routes(t)
            per_dest: dict[Address, list[VersionedWrite]] = {}
            dests: set[Address] = set()
            writes = dict(rep.writes)
            for k in keys:
                for owner in r.write[segment_of(k, t.num_segments)]:
                    if owner == self.node.address:
                        continue
                    dests.add(owner)
                    if commit and k in writes and k in vs:
                        per_dest.setdefault(owner, []).append((k, vs[k], writes[k]))
            for dest in sorted(dests):
                if commit:
                    msg: Any = TxCommit(tx, rep.attempt, t.topology_id, tuple(sorted(per_dest.get(dest, ()))), True)
                else:
                    msg = TxRollback(tx, rep.attempt, t.topology_id, True)
                out.append(TxSend(dest, msg))
        self.node.metrics["grid.tx_resolved_commit" if commit else "grid.tx_resolved_rollback"] += 1
        self._tx_out(out)
        self._tx_gauge()
        self.node._flush()
        return True

    def tx_resolve_all(self, tx: TxId, commit: bool | None, now: float) -> int:
        """:meth:`GridNode.tx_resolve_all`."""
        self.node._now = now
        op_id = self.node.operations.new_op_id()
        if not self.node.view:
            self._tx_query_done(op_id, tx, False, REASON_UNAVAILABLE, "not in a group yet")
            return op_id
        self._tx_query_seq += 1
        rid = _QUERY_IDS + self._tx_query_seq
        self._tx_queries[rid] = [op_id, tx, commit, set(self.node.view), {}, now + self.node.config.op_timeout]
        msg = TxReportRequest(rid, (tx,), tuple(self.node.view))
        for m in self.node.view:
            self.node._emit(m, msg)
        self.node._flush()
        return op_id

    def tx_prepared_count(self) -> int:
        """:meth:`GridNode.tx_prepared_count`."""
        return sum(1 for t in self.node.tx.active() if self.node.tx.state_of(t) == TxState.PREPARED)

    # -- helpers of the calls
    def _check_key(self, key: object, what: str) -> None:
        if type(key) is not bytes:
            raise TypeError(f"{what}: expected bytes, got {type(key).__name__}")
        if len(key) > self.node.limits.max_key_bytes:
            raise ValueError(f"{what}: {len(key)} bytes exceed the limit of {self.node.limits.max_key_bytes}")

    def _tx_unavailable(self, keys: Iterable[bytes]) -> str:
        """Why a transaction over ``keys`` cannot run now ("" when it can): no topology, or a segment this
        topology cannot write (degraded) or with no live owner."""
        t = self.node.topology
        if t is None:
            return "no topology installed yet"
        r = self.node._routes(t)
        for k in keys:
            seg = segment_of(k, t.num_segments)
            if not r.can_write[seg] or not r.write[seg]:
                return f"segment {seg} is unavailable for writes ({t.mode.value})"
        return ""

    def _tx_done_reason(self, tx: TxId) -> str:
        done = self._tx_done.get(tx)
        return done[1] if done is not None and done[1] else REASON_ROLLED_BACK

    def _tx_result(self, op_id: int, kind: int, tx: TxId, ok: bool, reason: str, error: str = "") -> None:
        self.node._results.append(OpResult(op_id, kind, b"", ok, None, error, 1, 0, "" if ok else reason, tx))

    # -- the core's callbacks
    def tx_segment(self, key: bytes) -> int:
        t = self.node.topology
        return segment_of(key, t.num_segments if t is not None else self.node.config.num_segments)

    def tx_version(self, key: bytes) -> int:
        """The version a read of ``key`` here returns (0: absent or deleted), which a transaction validates."""
        if self.node.store is None:
            return 0
        entry = self.node.store.get(self.tx_segment(key), key)
        return 0 if entry is None or entry[1] is None else entry[0]

    def tx_room(self, puts: list[tuple[bytes, bytes]]) -> str:
        """Why a transaction's ``puts`` (key, value; we are the keys' primary) do not fit under max_entries or
        max_bytes ("": they do): counted as :meth:`_full` counts plain PUTs."""
        store = self.node.store
        assert store is not None
        adds = grow = 0
        for k, v in puts:
            held = store.value(self.tx_segment(k), k)
            adds += held is None
            grow += len(k) + len(v) if held is None else len(v) - len(held)
        if self.node.bounds.fits(adds, grow):
            return ""
        self.node.metrics["grid.tx_refused_full"] += 1
        what = f"{adds} keys" if self.node.bounds.full_bound == "max_entries" else f"{grow} bytes"
        return self.node.bounds.full_error(f"the transaction would add {what}")

    def tx_stamp(self, key: bytes) -> int:
        # The sequence plain writes use: one primary orders a key's versions, whichever kind of write.
        t = self.node.topology
        seg = self.tx_segment(key)
        entry = self.node.store.get(seg, key) if self.node.store is not None else None
        held = entry[0] if entry is not None else None
        seq = self.node.replication.seq[seg] = next_seq(
            self.node.replication.seq.get(seg, 0), self.node._now + self.node.wall_offset, held
        )
        return make_version(t.topology_id if t is not None else 0, seq)

    def tx_apply(self, tx: TxId, writes: tuple[VersionedWrite, ...]) -> None:
        store = self.node.store
        if store is None:
            return
        now = self.node._now
        lows: dict[int, int] = {}
        for key, version, value in writes:
            seg = self.tx_segment(key)
            if store.has_segment(seg):
                if store.write(seg, key, version, value, now=now) and self.node.events.written is not None:
                    self.node.events.note_written(key, version, value)
                low = lows.get(seg)
                if low is None or version < low:
                    lows[seg] = version
        self.node.metrics["grid.tx_writes_applied"] += len(writes)
        if lows and tx.origin != self.node.address:
            # The originator drives the commit to every owner and stays responsible until all acknowledged; if
            # it dies in between, an owner that joined by state transfer (its copy taken before the commit came
            # here) may never get it. So the commit counts as a write ``tx.origin`` made us apply: when it
            # leaves the view, _repair_after re-drives these segments' recent entries to the write owners
            # (random search seed 9745: a committed write missing on k4's new owner for good).
            self.node.replication.note_stamped(tx.origin, lows)

    def tx_route(self, keys: Sequence[bytes]) -> tuple[int, Mapping[bytes, Sequence[Address]]]:
        """The originator's routing: the write owners of each key's segment, write primary first. A segment
        without a live write owner routes to its current owners (they do not answer, so the transaction times
        out rather than committing somewhere that does not own the key)."""
        t = self.node.topology
        if t is None:
            return 0, {k: (self.node.address,) for k in keys}
        r = self.node._routes(t)
        n = t.num_segments
        out: dict[bytes, Sequence[Address]] = {}
        for k in keys:
            seg = segment_of(k, n)
            out[k] = r.write[seg] or t.current.owners_of(seg)
        return t.topology_id, out

    # -- inputs
    def on_tx(self, src: Address, msg: Any) -> None:
        now = self.node._now
        kind = type(msg)
        if kind is TxVote or kind is TxAck:
            self._tx_out(self.node.txc.on_message(src, msg, now))
            return
        if kind is TxInfoAck:
            self.tx_pushes.pop((src, msg.topology_id, msg.segments), None)
            return
        if kind is TxLockInfo:
            self._on_lock_info(src, msg)
            return
        if kind is TxReportRequest:
            self._tx_on_report_request(src, msg)
            return
        if kind is TxReportAnswer:
            if msg.request_id > _QUERY_IDS:
                self._tx_on_query_answer(src, msg)
            else:
                self._tx_resolver_out(self.node.txr.on_answer(src, msg, now))
            return
        t = self.node.topology
        if kind is TxPrepare or kind is TxLock:
            if t is not None and self.node.membership.merge_hold is not None and msg.topology_id >= t.topology_id:
                # As for commands: our topology may be the other partition's until the merged one arrives.
                self.node._hold(t.topology_id + 1, src, msg)
                return
            if t is not None and msg.topology_id == t.topology_id:
                keys = msg.keys if kind is TxLock else tuple(msg.lock_keys) + tuple(k for k, _ in msg.writes)
                r = self.node._routes(t)
                for k in keys:
                    seg = segment_of(k, t.num_segments)
                    if not r.can_write[seg]:
                        request = msg.request if kind is TxLock else 0
                        reason = f"segment {seg} unavailable"
                        self.node._emit(src, TxVote(msg.tx, msg.attempt, request, NO, t.topology_id, (), reason))
                        return
            out = self.node.tx.on_message(src, msg, now)
            if self.node.tx.locks.waiting(msg.tx):
                self.node.metrics["grid.tx_lock_waits"] += 1
            self._tx_out(out)
            return
        self._tx_out(self.node.tx.on_message(src, msg, now))
        if kind is TxCommit and (msg.resolved or src != msg.tx.origin):
            self._tx_stamp_orphans()  # a resolver's commit may leave a write waiting for its version here

    def _on_lock_info(self, src: Address, info: TxLockInfo) -> None:
        t = self.node.topology
        if t is None or info.topology_id > t.topology_id:
            # Pushed under a topology we have not installed: imported once we have it (and know which of its
            # segments we wait for); acknowledged then, so the pusher re-sends it if we never get there.
            if len(self._tx_info_held) < self.node.config.max_queued:
                self._tx_info_held.append((src, info))
            return
        key = (src, info.topology_id, info.segments)
        self.node._emit(src, TxInfoAck(info.topology_id, info.segments))
        if key in self._tx_info_seen:
            return  # a re-send: importing twice could lock for transactions long finished
        self._tx_info_seen[key] = None
        while len(self._tx_info_seen) > _TX_DONE_KEPT:
            self._tx_info_seen.popitem(last=False)
        for seg in info.segments:
            self.tx_awaiting.pop(seg, None)
        self.node.metrics["grid.tx_lock_info_in"] += 1
        self._tx_out(self.node.tx.on_message(src, info, self.node._now))
        for r in info.records:
            if r.tx.origin == self.node.address and self.node.txc.state_of(r.tx) is None:
                # Our own commit, completed: no commit of ours brings a version any more (TxTable.settle_own).
                self._tx_out(self.node.tx.settle_own(r.tx, self.node._now))
        self._tx_stamp_orphans()
        self._tx_gauge()

    def tx_install(self, old: CacheTopology | None, t: CacheTopology, dropped: list[int]) -> None:
        """The transaction side of installing ``t`` (after ``old``): where the write primary of a segment
        changed, the new primary blocks it (and promotes its backup locks) until the old primary's lock
        information arrives, and the old primary pushes it (and demotes its locks to backup locks where it stays
        an owner); then the core answers waits of older topologies, runs what it held for ``t``, drops the locks
        of segments gone, and the originator re-routes."""
        now = self.node._now
        me = self.node.address
        alive = set(self.node.view)
        block: list[int] = []
        promote: list[int] = []
        push: dict[Address, list[int]] = {}
        demote: list[int] = []
        if old is not None and old.num_segments == t.num_segments:
            ro, rn = self.node._routes(old), self.node._routes(t)
            for s in range(t.num_segments):
                wo, wn = ro.write[s], rn.write[s]
                op = wo[0] if wo else None
                np = wn[0] if wn else None
                if op == np:
                    continue
                if np == me:
                    promote.append(s)
                    if op is not None and op != me and op in alive:
                        block.append(s)
                        self.tx_awaiting[s] = (op, now)
                elif op == me and np is not None:
                    push.setdefault(np, []).append(s)
                    if me in wn:
                        demote.append(s)
        out: list[TxOutput] = []
        if block:
            self.node.tx.block_segments(block)
        if promote:
            self.node.tx.promote(promote)
        out += self.node.tx.on_topology(t.topology_id, now)
        for dest, segs in sorted(push.items()):
            self.node.metrics["grid.tx_lock_info_pushed"] += 1
            out += self.node.tx.push_lock_info(segs, dest)
        if demote:
            # After the push (which carries them): the new primary holds these locks now and releases them at
            # the decision; kept as locks here they could wait for good for a version no commit brings a backup.
            out += self.node.tx.demote(demote, now)
        if dropped:
            out += self.node.tx.drop_segments(dropped, now)
        self._tx_out(out)
        self._tx_out(self.node.txc.on_topology(now))
        if self._tx_info_held:
            held, self._tx_info_held = self._tx_info_held, []
            for src, info in held:
                self._on_lock_info(src, info)
        self._tx_stamp_orphans()

    def tx_on_view(self, now: float, removed: bool) -> None:
        members = self.node.view
        alive = set(members)
        self._tx_out(self.node.tx.on_view(members, now))
        self._tx_out(self.node.txc.on_view(members, now))
        self._tx_resolver_out(self.node.txr.on_view(members, now, removed=removed))
        for rid, q in list(self._tx_queries.items()):
            if q[3] - alive:  # a member it waits for left: its answer never comes
                del self._tx_queries[rid]
                self._tx_query_done(q[0], q[1], False, REASON_UNAVAILABLE, "the view changed meanwhile: ask again")
        for key in [k for k in self.tx_pushes if k[0] not in alive]:
            del self.tx_pushes[key]  # the new primary is gone; its successor promotes its own records
        self._tx_info_held = [(s, i) for s, i in self._tx_info_held if s in alive]
        gone = sorted(s for s, (pusher, _) in self.tx_awaiting.items() if pusher not in alive)
        if gone:
            self._tx_unblock(gone, "grid.tx_lock_info_pusher_gone")
        self._tx_gauge()

    def _tx_unblock(self, segments: list[int], metric: str) -> None:
        """Stop waiting for lock information of ``segments`` (its pusher is gone: the backup locks promoted at
        install are what is known). An empty import unblocks them and passes on what we have."""
        for s in segments:
            self.tx_awaiting.pop(s, None)
        self.node.metrics[metric] += len(segments)
        t = self.node.topology
        tid = t.topology_id if t is not None else 0
        self._tx_out(self.node.tx.import_lock_info(TxLockInfo(tid, tuple(segments), ()), self.node._now))
        self._tx_stamp_orphans()

    def tx_tick(self, now: float) -> None:
        out = self.node.tx.tick(now)
        out += self.node.txc.tick(now)
        self._tx_out(out)
        self._tx_resolver_out(self.node.txr.tick(now))
        for rid, q in list(self._tx_queries.items()):
            if q[5] <= now:
                del self._tx_queries[rid]
                missing = ", ".join(sorted(str(m) for m in q[3]))
                self._tx_query_done(q[0], q[1], False, REASON_TIMEOUT, f"no report from {missing} in time")
        interval = self.node.config.attempt_timeout
        for key, entry in self.tx_pushes.items():
            if entry[1] <= now:
                entry[1] = now + interval
                self.node.metrics["grid.tx_lock_info_resent"] += 1
                self.node._emit(key[0], entry[0])
        # Last resort: a segment blocked for a whole transaction timeout with its pusher alive never got the
        # information (members that skipped a topology can disagree on who the previous primary was). Locks
        # there wait no longer; counted, as it means lock information may have been lost.
        limit = self.node.config.tx_timeout
        # The same expression as _tx_next_deadline's: ``now - since >= limit`` can be false at that very
        # deadline (floating point), and the driver then steps at it for ever (grid-tx simulation seed 814).
        stale = sorted(s for s, (_, since) in self.tx_awaiting.items() if since + limit <= now)
        if stale:
            self._tx_unblock(stale, "grid.tx_lock_info_given_up")

    def tx_next_deadline(self) -> float | None:
        times = [
            x
            for x in (self.node.tx.next_deadline(), self.node.txc.next_deadline(), self.node.txr.next_deadline())
            if x is not None
        ]
        if self.tx_pushes:
            times.append(min(e[1] for e in self.tx_pushes.values()))
        if self.tx_awaiting:
            times.append(min(since for _, since in self.tx_awaiting.values()) + self.node.config.tx_timeout)
        if self._tx_queries:
            times.append(min(q[5] for q in self._tx_queries.values()))
        return min(times) if times else None

    # -- outputs of the core
    def _tx_out(self, outputs: Iterable[TxOutput]) -> None:
        for o in outputs:
            if isinstance(o, TxSend):
                msg = o.message
                if (
                    type(msg) is TxCommit
                    and self.node.config.tx_test_hold_commit
                    and msg.tx.origin == self.node.address
                ):
                    continue  # fault injection (GridConfig.tx_test_hold_commit)
                if type(msg) is TxLockInfo and o.dest != self.node.address:
                    key = (o.dest, msg.topology_id, msg.segments)
                    self.tx_pushes[key] = [msg, self.node._now + self.node.config.attempt_timeout]
                self.node._emit(o.dest, msg)
            elif isinstance(o, TxOutcome):
                self._tx_outcome(o)
            elif isinstance(o, TxLocked):
                op_id = self._tx_lock_ops.pop(o.tx, None)
                if op_id is not None:
                    reason = "" if o.ok else _tx_reason(o.reason)
                    self._tx_result(op_id, TX_LOCK_OP, o.tx, o.ok, reason, o.reason)

    def _tx_outcome(self, o: TxOutcome) -> None:
        # ok False from tx_commit means: not committed, and never will be (a rollback is only ever decided
        # before a commit, and a commit is reported only once every owner acknowledged it). A commit that a
        # participant answered with ROLLED_BACK (resolved the other way while this originator was cut off) is
        # ok with reason "mixed": committed here and on the others, not there.
        committed = o.committed
        override = self._tx_reason_override.pop(o.tx, None)
        if committed:
            reason, error = (REASON_MIXED, o.reason) if o.mixed else ("", "")
            self.node.metrics["grid.tx_commits"] += 1
            if o.mixed:
                self.node.metrics["grid.tx_mixed"] += 1
        else:
            reason = override[0] if override else _tx_reason(o.reason)
            error = override[1] if override else o.reason
            self.node.metrics["grid.tx_rollbacks"] += 1
            self.node.metrics[f"grid.tx_rollbacks.{reason}"] += 1
        self._tx_done[o.tx] = (committed, reason)
        while len(self._tx_done) > _TX_DONE_KEPT:
            self._tx_done.popitem(last=False)
        lock_op = self._tx_lock_ops.pop(o.tx, None)
        if lock_op is not None:
            self._tx_result(lock_op, TX_LOCK_OP, o.tx, False, reason or REASON_ROLLED_BACK, error)
        end = self._tx_end_ops.pop(o.tx, None)
        extra = self._tx_extra_rollbacks.pop(o.tx, None)
        for op_id, kind in ([end] if end else []) + ([(extra, TX_ROLLBACK_OP)] if extra else []):
            if kind == TX_COMMIT_OP:
                self.node._results.append(
                    OpResult(op_id, kind, b"", committed, None, error, o.attempts, 0, reason, o.tx)
                )
            else:  # a rollback asked for: done unless it committed after all
                ok = not o.committed
                self._tx_result(op_id, kind, o.tx, ok, "" if ok else "committed", "" if ok else "committed")

    def _tx_gauge(self) -> None:
        self.node.metrics["grid.tx_in_doubt"] = len(self.node.tx.in_doubt())

    # -- automatic resolution of in-doubt transactions (TxResolver on the view coordinator)
    def _tx_on_report_request(self, src: Address, req: TxReportRequest) -> None:
        """Answer the coordinator's report request: the reports of the transactions it names and of every one
        in doubt here. Writes waiting for a version this member can stamp now are stamped first, so the
        report carries the version (seed 19's gap)."""
        self._tx_stamp_orphans()
        ids = set(req.txs).union(self.node.tx.unresolved(req.members))
        self.node._emit(src, TxReportAnswer(req.request_id, tuple(self._tx_report_info(tx) for tx in sorted(ids))))

    def _tx_report_info(self, tx: TxId) -> TxReportInfo:
        """This member's report of ``tx`` for a resolver; on its originator, what the originator decided."""
        rep = self.node.tx.report(tx)
        if tx.origin != self.node.address:
            return report_info(rep)
        decided = self.node.txc.decided(tx)
        if decided is not None:  # COMMITTING: the commit's writes and versions; ROLLING_BACK: rolled back
            return report_info(decided if decided.state == TxState.COMMITTED or rep.state != TxState.COMMITTED else rep)
        if self.node.txc.state_of(tx) is not None:
            return report_info(rep, deciding=True)
        done = self._tx_done.get(tx)
        if done is not None and rep.state != TxState.COMMITTED:
            state = TxState.COMMITTED if done[0] else TxState.ROLLED_BACK
            return report_info(TxReport(tx, state, rep.attempt, rep.writes, rep.versions, False, rep.views))
        return report_info(rep)

    def _tx_on_query_answer(self, src: Address, answer: TxReportAnswer) -> None:
        q = self._tx_queries.get(answer.request_id)
        if q is None or src not in q[3]:
            return
        op_id, tx, commit, waiting, reports, _ = q
        waiting.discard(src)
        for r in answer.reports:
            if r.tx == tx:
                reports[src] = r
        if waiting:
            return
        del self._tx_queries[answer.request_id]
        present = set(self.node.view)
        if not any(r.in_doubt or (r.state == TxState.PREPARED and tx.origin not in present) for r in reports.values()):
            self._tx_query_done(op_id, tx, False, "not_in_doubt", f"transaction {tx} is in doubt on no member")
            return
        verdict = resolution(tx, reports, self.node.view) if commit is None else commit
        if isinstance(verdict, str):
            self._tx_query_done(op_id, tx, False, "undecided", f"transaction {tx} stays in doubt: {verdict}")
            return
        if self.node.membership.merge_hold is not None or self.node.topology is None:
            self._tx_query_done(op_id, tx, False, REASON_UNAVAILABLE, "a merge is in progress: ask again")
            return
        self._tx_send_decision(decision(tx, verdict, reports))
        self.node._results.append(
            OpResult(op_id, TX_RESOLVE_OP, b"", True, b"commit" if verdict else b"rollback", "", 1, 0, "", tx)
        )

    def _tx_query_done(self, op_id: int, tx: TxId, ok: bool, reason: str, error: str) -> None:
        self.node._results.append(OpResult(op_id, TX_RESOLVE_OP, b"", ok, None, error, 1, 0, reason, tx))

    def _tx_resolver_out(self, outputs: Iterable[ResolverOutput]) -> None:
        for o in outputs:
            if isinstance(o, TxSend):
                self.node._emit(o.dest, o.message)
            else:
                self._tx_send_decision(o)

    def _tx_send_decision(self, d: TxDecided) -> None:
        """Send the resolver's decision, self-contained, to the write owners of its keys (current and pending:
        owners that get them by state transfer never saw the prepare) and to every member that reported it
        unfinished. Not during a merge hold (our topology may be the other side's): the next round decides
        again."""
        t = self.node.topology
        if t is None or self.node.membership.merge_hold is not None:
            return
        r = self.node._routes(t)
        n = t.num_segments
        writes = dict(d.writes)
        versions = dict(d.versions)
        dests: set[Address] = set(d.members)
        per_dest: dict[Address, list[VersionedWrite]] = {}
        for k in sorted(writes):
            for owner in r.write[segment_of(k, n)]:
                dests.add(owner)
                if d.commit and k in versions:
                    per_dest.setdefault(owner, []).append((k, versions[k], writes[k]))
        for dest in sorted(dests):
            if d.commit:
                msg: Any = TxCommit(d.tx, d.attempt, t.topology_id, tuple(per_dest.get(dest, ())), True)
            else:
                msg = TxRollback(d.tx, d.attempt, t.topology_id, True)
            self.node._emit(dest, msg)
        self._tx_out(self.node.txc.resolved_here(d.tx, d.commit, self.node._now))
        self.node.metrics["grid.tx_auto_resolved_commit" if d.commit else "grid.tx_auto_resolved_rollback"] += 1
        log.info(
            "%s: resolved in-doubt transaction %s: %s", self.node.address, d.tx, "commit" if d.commit else "rollback"
        )

    def _tx_stamp_orphans(self) -> None:
        """Committed here with a write still waiting for a version only the dead originator knew: as the key's
        current write primary, stamp one, apply it, and send it to the other write owners (TxTable.stamp_committed)."""
        t = self.node.topology
        if t is None or not self.node.tx.locks.any_held():
            return
        r = self.node._routes(t)
        n = t.num_segments

        def is_primary(key: bytes) -> bool:
            seg = segment_of(key, n)
            return r.primary[seg] and r.can_write[seg]

        out, stamped = self.node.tx.stamp_committed(is_primary, self.node._now)
        self._tx_out(out)
        for tx, attempt, writes in stamped:
            per_dest: dict[Address, list[VersionedWrite]] = {}
            for w in writes:
                for owner in r.write[segment_of(w[0], n)]:
                    if owner != self.node.address:
                        per_dest.setdefault(owner, []).append(w)
            for dest, ws in sorted(per_dest.items()):
                self.node._emit(dest, TxCommit(tx, attempt, t.topology_id, tuple(ws), True))
            self.node.metrics["grid.tx_versions_stamped_late"] += len(writes)

    def tx_undecided(self) -> dict[TxId, str]:
        """:meth:`GridNode.tx_undecided`."""
        return dict(self.node.txr.undecided)
