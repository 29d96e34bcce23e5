"""Grid transactions (grid/tx.py, grid/tx_messages.py): the lock table, the participant's transaction table,
the originator's coordinator, the wire format, and property tests of many transactions over an in-memory
network with random delivery order, loss, duplication, originator crashes and rebalances that move lock
information (atomicity, no lost update, replicas equal, no lock left), plus replays of the runs that found
bugs (docs/grid-transactions.md, "Tests")."""

from __future__ import annotations

import contextlib
import os
import random
from collections.abc import Mapping, Sequence

import msgpack
import pytest
from groupcluster.core.address import Address
from groupcluster.core.errors import ConfigError, WireError
from groupcluster.grid.store import make_version
from groupcluster.grid.tx.config import LockingMode, TxConfig
from groupcluster.grid.tx.coordinator import CoordState, TxCoordinator
from groupcluster.grid.tx.locks import LockTable
from groupcluster.grid.tx.messages import (
    ACK_COMMITTED,
    ACK_OK,
    ACK_RETRY,
    ACK_ROLLED_BACK,
    INFO_ACTIVE,
    INFO_PREPARED,
    NO,
    TX_FORMAT_VERSION,
    TX_PREPARE,
    VOTE_RETRY,
    YES,
    TxAck,
    TxCommit,
    TxId,
    TxLimits,
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
    decode_tx_payload,
    encode_tx_payload,
)
from groupcluster.grid.tx.outputs import TxLocked, TxOutcome, TxOutput, TxSend
from groupcluster.grid.tx.participant import TxState, TxTable
from groupcluster.grid.tx.resolution import TxDecided, TxResolver, report_info, resolution, termination_decision
from hypothesis import given, settings
from hypothesis import strategies as st

# Derandomized and without the example database, so CI runs the same examples every time; GRID_HYPOTHESIS_SCALE=20
# multiplies the examples for a local search.
EXAMPLES_SCALE = int(os.environ.get("GRID_HYPOTHESIS_SCALE", "1"))

A = Address("10.0.0.1", 7800, 1)
B = Address("10.0.0.2", 7800, 1)
C = Address("10.0.0.3", 7800, 1)
D = Address("10.0.0.4", 7800, 1)
O1 = Address("10.0.1.1", 7800, 1)
O2 = Address("10.0.1.2", 7800, 1)
O3 = Address("10.0.1.3", 7800, 1)
RESOLVER = Address("10.0.2.1", 7800, 1)  # plays the operator's resolution tool
SEGMENTS = 8


def seg(key: bytes) -> int:
    return key[-1] % SEGMENTS


def tid(n: int, origin: Address = O1) -> TxId:
    return TxId(origin, n)


# -- lock table ----------------------------------------------------------------------------------------------------


class TestLockTable:
    def test_exclusive_fifo_and_release_hands_over(self) -> None:
        lt = LockTable(seg)
        t1, t2, t3 = tid(1), tid(2), tid(3)
        assert lt.acquire(t1, [b"k1"], 10.0)
        assert not lt.acquire(t2, [b"k1"], 10.0)
        assert not lt.acquire(t3, [b"k1"], 10.0)
        assert lt.holders(b"k1") == {t1}
        assert lt.release(t1) == [t2]  # FIFO: t2 first
        assert lt.holders(b"k1") == {t2}
        assert lt.release(t2) == [t3]
        assert lt.release(t3) == []
        assert lt.empty()

    def test_reentrant_and_ordered(self) -> None:
        lt = LockTable(seg)
        t1, t2 = tid(1), tid(2)
        assert lt.acquire(t1, [b"k2", b"k1"], 10.0)
        assert lt.acquire(t1, [b"k1", b"k3"], 10.0)  # k1 held already
        assert lt.held_by(t1) == {b"k1", b"k2", b"k3"}
        # t2 wants k3 and k4 (sorted: k3 first): it waits on k3 and does not hold k4 meanwhile, so a third
        # transaction can take k4: ordered acquisition never holds a higher key while waiting for a lower one.
        assert not lt.acquire(t2, [b"k4", b"k3"], 10.0)
        assert lt.held_by(t2) == frozenset()
        assert lt.acquire(tid(3), [b"k4"], 10.0)

    def test_no_local_deadlock_with_opposite_orders(self) -> None:
        lt = LockTable(seg)
        t1, t2 = tid(1), tid(2)
        assert lt.acquire(t1, [b"k1", b"k2"], 10.0)
        assert not lt.acquire(t2, [b"k2", b"k1"], 10.0)  # waits on k1, holds nothing
        assert lt.release(t1) == [t2]
        assert lt.held_by(t2) == {b"k1", b"k2"}

    def test_deadline_fails_the_waiter_and_keeps_what_it_got(self) -> None:
        lt = LockTable(seg)
        t1, t2 = tid(1), tid(2)
        assert lt.acquire(t1, [b"k2"], 100.0)
        assert not lt.acquire(t2, [b"k1", b"k2"], 5.0)
        assert lt.next_deadline() == 5.0
        assert lt.tick(4.9) == ([], [])
        assert lt.tick(5.0) == ([], [(t2, b"k2")])
        assert lt.held_by(t2) == {b"k1"}  # until the participant releases it
        assert not lt.waiting(t2)
        assert lt.next_deadline() is None
        lt.release(t2)
        assert lt.release(t1) == []
        assert lt.empty()

    def test_timed_out_head_wakes_the_next_waiter(self) -> None:
        lt = LockTable(seg)
        t1, t2, t3 = tid(1), tid(2), tid(3)
        assert lt.acquire(t1, [b"k1"], 100.0)
        assert not lt.acquire(t2, [b"k1"], 5.0)
        assert not lt.acquire(t3, [b"k1"], 50.0)
        assert lt.tick(6.0)[1] == [(t2, b"k1")]
        assert lt.release(t1) == [t3]

    def test_blocked_segments_park_requests_until_unblocked(self) -> None:
        lt = LockTable(seg)
        t1, t2 = tid(1), tid(2)
        lt.block_segments([seg(b"k1")])
        assert not lt.acquire(t1, [b"k1"], 10.0)
        assert lt.holders(b"k1") == frozenset()
        # the lock information arrives: t2 held k1 on the old primary
        lt.force_hold(t2, [b"k1"])
        assert lt.unblock_segments([seg(b"k1")]) == []
        assert lt.holders(b"k1") == {t2}
        assert lt.release(t2) == [t1]
        assert lt.blocked_segments == frozenset()

    def test_no_wait_request_fails_at_once_on_a_held_key_and_keeps_what_it_got(self) -> None:
        lt = LockTable(seg)
        t1, t2, t3 = tid(1), tid(2), tid(3)
        assert lt.acquire(t1, [b"k2"], 10.0)
        assert not lt.acquire(t2, [b"k1", b"k2", b"k3"], 10.0, wait=False)
        assert lt.take_failed() == [(t2, b"k2")] and lt.take_failed() == []
        # not queued, not waiting: t1's release hands k2 to nobody; t2 keeps k1 until released (rolled back)
        assert not lt.waiting(t2) and lt.held_by(t2) == {b"k1"} and lt.holders(b"k3") == frozenset()
        assert lt.release(t1) == [] and lt.holders(b"k2") == frozenset()
        assert lt.release(t2) == [] and lt.empty()
        # a waiting request's key also fails a no-wait one (it would queue behind it)
        assert lt.acquire(t1, [b"k1"], 10.0)
        assert not lt.acquire(t2, [b"k1"], 10.0)
        assert not lt.acquire(t3, [b"k1"], 10.0, wait=False)
        assert lt.take_failed() == [(t3, b"k1")]
        assert lt.release(t1) == [t2]

    def test_a_shared_key_is_acquired_only_once_the_other_holders_are_gone(self) -> None:
        lt = LockTable(seg)
        t1, t2, t3 = tid(1), tid(2), tid(3)
        lt.force_hold(t1, [b"k1"])  # promoted backup lock of a committed transaction, its commit in flight
        lt.force_hold(t2, [b"k1"])  # imported: t2's lock on the old primary
        assert not lt.acquire(t3, [b"k1"], 10.0)
        assert not lt.acquire(t2, [b"k1", b"k2"], 10.0)  # t2's prepare: not alone on k1, so it waits
        assert lt.held_by(t2) == {b"k1"} and lt.requested(t2) == {b"k1", b"k2"}
        assert lt.release(t1) == [t2]  # t2 first (t3 waits for t2 anyway), then k2
        assert lt.held_by(t2) == {b"k1", b"k2"}
        assert lt.release(t2) == [t3]
        # a no-wait request sharing a key fails like on any held key
        lt.force_hold(t1, [b"k5"])
        lt.force_hold(t2, [b"k5"])
        assert not lt.acquire(t2, [b"k5"], 10.0, wait=False) and lt.take_failed() == [(t2, b"k5")]

    def test_no_wait_request_parks_on_a_blocked_segment_then_fails_or_gets_it(self) -> None:
        lt = LockTable(seg)
        t1, t2, t3 = tid(1), tid(2), tid(3)
        lt.block_segments([seg(b"k1")])
        # the holders are not known yet: park (a NO now would refuse transactions that do not conflict)
        assert not lt.acquire(t2, [b"k1"], 10.0, wait=False)
        assert lt.take_failed() == [] and lt.waiting(t2)
        lt.force_hold(t1, [b"k1"])  # the lock information: t1 holds k1
        assert lt.unblock_segments([seg(b"k1")]) == []
        assert lt.take_failed() == [(t2, b"k1")] and not lt.waiting(t2)
        lt.release(t1)
        lt.block_segments([seg(b"k1")])
        assert not lt.acquire(t3, [b"k1"], 10.0, wait=False)
        assert lt.unblock_segments([seg(b"k1")]) == [t3]  # nothing held there: granted
        assert lt.take_failed() == []

    def test_blocked_request_keeps_its_deadline(self) -> None:
        lt = LockTable(seg)
        lt.block_segments([seg(b"k1")])
        assert not lt.acquire(tid(1), [b"k1"], 3.0)
        assert lt.tick(3.0)[1] == [(tid(1), b"k1")]
        assert lt.unblock_segments([seg(b"k1")]) == []

    def test_backup_locks_promote_to_shared_holders(self) -> None:
        lt = LockTable(seg)
        t1, t2, t3 = tid(1), tid(2), tid(3)
        lt.add_backup_locks(t1, [b"k1", b"k2"])
        lt.add_backup_locks(t2, [b"k1"])
        assert lt.acquire(t3, [b"k1"], 10.0)  # backup locks block nothing on a backup
        lt.release(t3)
        lt.promote([seg(b"k1")])
        assert lt.holders(b"k1") == {t1, t2}  # "possibly by several transactions at the same time"
        assert lt.backup_locks(t1) == {b"k2"}
        assert not lt.acquire(t3, [b"k1"], 10.0)
        assert lt.release(t1) == []  # t2 still holds it
        assert lt.release(t2) == [t3]

    def test_keys_in_segments(self) -> None:
        lt = LockTable(seg)
        t1 = tid(1)
        assert lt.acquire(t1, [b"k1"], 10.0)
        lt.add_backup_locks(t1, [b"k2"])
        assert lt.acquire(tid(2), [b"k3"], 10.0)
        assert not lt.acquire(t1, [b"k3"], 10.0)
        segs = frozenset({seg(b"k1"), seg(b"k2"), seg(b"k3")})
        assert lt.keys_in(t1, segs) == (b"k1", b"k2", b"k3")
        assert lt.keys_in(t1, frozenset({seg(b"k2")})) == (b"k2",)

    def test_one_request_at_a_time(self) -> None:
        lt = LockTable(seg)
        assert lt.acquire(tid(1), [b"k1"], 10.0)
        assert not lt.acquire(tid(2), [b"k1"], 10.0)
        with pytest.raises(ValueError, match="already waits"):
            lt.acquire(tid(2), [b"k2"], 10.0)


# -- participant ---------------------------------------------------------------------------------------------------


class Store:
    """A member's data as the participant sees it: versions for validation, a stamp counter."""

    def __init__(self, topology_id: int = 1) -> None:
        self.data: dict[bytes, tuple[int, bytes | None]] = {}
        self.topology_id = topology_id
        self.seq = 0
        self.applied: list[tuple[TxId, tuple[tuple[bytes, int, bytes | None], ...]]] = []

    def version_of(self, key: bytes) -> int:
        return self.data.get(key, (0, None))[0]

    def stamp(self, key: bytes) -> int:
        self.seq += 1
        return make_version(self.topology_id, self.seq)

    def apply(self, tx: TxId, writes: tuple[tuple[bytes, int, bytes | None], ...]) -> None:
        self.applied.append((tx, writes))
        for key, version, value in writes:
            if version > self.version_of(key):
                self.data[key] = (version, value)


def table(addr: Address = A, topology_id: int = 1, **cfg: str) -> tuple[TxTable, Store]:
    store = Store(topology_id)
    t = TxTable(
        addr,
        TxConfig.from_dict(dict(cfg)),
        segment_of=seg,
        version_of=store.version_of,
        stamp=store.stamp,
        apply=store.apply,
        topology_id=topology_id,
    )
    t.on_view([A, B, C, D, O1, O2, O3], 0.0)
    return t, store


def sends(out: list[TxOutput]) -> list[TxMessage]:
    return [o.message for o in out if isinstance(o, TxSend)]


def prepare(tx: TxId, keys: Sequence[bytes], attempt: int = 1, topology_id: int = 1, **kw: object) -> TxPrepare:
    writes = tuple((k, b"v" + k) for k in keys)
    return TxPrepare(tx, attempt, topology_id, tuple(kw.get("lock", keys)), writes, tuple(kw.get("reads", ())))  # type: ignore[arg-type]


class TestTxTable:
    def test_prepare_commit_applies_and_releases(self) -> None:
        t, store = table()
        tx = tid(1)
        out = t.on_message(O1, prepare(tx, [b"k1", b"k2"]), 0.0)
        (vote,) = sends(out)
        assert isinstance(vote, TxVote) and vote.code == YES and vote.request == 0
        assert dict(vote.versions).keys() == {b"k1", b"k2"}
        assert t.state_of(tx) == TxState.PREPARED
        assert t.locks.held_by(tx) == {b"k1", b"k2"}
        writes = tuple((k, v, b"x") for k, v in vote.versions)
        out = t.on_message(O1, TxCommit(tx, 1, 1, writes), 1.0)
        assert store.applied == [(tx, writes)]
        assert sends(out) == [TxAck(tx, 1, ACK_OK, 1)]
        assert t.state_of(tx) == TxState.COMMITTED
        assert t.locks.empty()
        # a duplicate commit: acknowledged again, not applied twice
        out = t.on_message(O1, TxCommit(tx, 1, 1, writes), 2.0)
        assert len(store.applied) == 1
        assert sends(out) == [TxAck(tx, 1, ACK_OK, 1)]
        # a late rollback after the commit is answered with what happened
        assert sends(t.on_message(O1, TxRollback(tx, 1, 1), 3.0)) == [TxAck(tx, 1, ACK_COMMITTED, 1)]
        assert t.state_of(tx) == TxState.COMMITTED

    def test_duplicate_prepare_gets_the_same_vote(self) -> None:
        t, _ = table()
        tx = tid(1)
        (v1,) = sends(t.on_message(O1, prepare(tx, [b"k1"]), 0.0))
        (v2,) = sends(t.on_message(O1, prepare(tx, [b"k1"]), 0.5))
        assert v1 == v2

    def test_backup_records_backup_locks_only(self) -> None:
        t, _ = table(B)
        tx = tid(1)
        (vote,) = sends(t.on_message(O1, prepare(tx, [b"k1"], lock=()), 0.0))
        assert isinstance(vote, TxVote) and vote.code == YES and vote.versions == ()
        assert t.locks.backup_locks(tx) == {b"k1"}
        assert t.locks.locked_keys() == frozenset()
        t.on_message(O1, TxRollback(tx, 1, 1), 1.0)
        assert t.locks.empty()

    def test_rollback_then_late_commit_and_late_prepare(self) -> None:
        t, store = table()
        tx = tid(1)
        t.on_message(O1, prepare(tx, [b"k1"]), 0.0)
        assert sends(t.on_message(O1, TxRollback(tx, 1, 1), 1.0)) == [TxAck(tx, 1, ACK_OK, 1)]
        assert t.locks.empty()
        out = t.on_message(O1, TxCommit(tx, 1, 1, ((b"k1", make_version(1, 9), b"x"),)), 2.0)
        assert store.applied == []
        assert sends(out) == [TxAck(tx, 1, ACK_ROLLED_BACK, 1)]
        # a rollback overtaking its prepare leaves a record, so the prepare does not lock for good
        tx2 = tid(2)
        t.on_message(O1, TxRollback(tx2, 1, 1), 3.0)
        (vote,) = sends(t.on_message(O1, prepare(tx2, [b"k1"]), 3.5))
        assert isinstance(vote, TxVote) and vote.code == NO
        assert t.locks.empty()

    def test_optimistic_validation(self) -> None:
        t, store = table()
        store.data[b"k1"] = (make_version(1, 1), b"old")
        tx = tid(1)
        (vote,) = sends(t.on_message(O1, prepare(tx, [b"k1"], reads=((b"k1", 0),)), 0.0))
        assert isinstance(vote, TxVote) and vote.code == NO and "changed since it was read" in vote.reason
        assert t.locks.empty()
        tx2 = tid(2)
        (vote,) = sends(t.on_message(O1, prepare(tx2, [b"k1"], reads=((b"k1", make_version(1, 1)),)), 0.0))
        assert isinstance(vote, TxVote) and vote.code == YES

    def test_old_topology_gets_retry_future_is_held(self) -> None:
        t, store = table(topology_id=5)
        tx = tid(1)
        (vote,) = sends(t.on_message(O1, prepare(tx, [b"k1"], topology_id=4), 0.0))
        assert isinstance(vote, TxVote) and vote.code == VOTE_RETRY and vote.topology_id == 5
        assert t.state_of(tx) is None and t.locks.empty()
        (vote,) = sends(t.on_message(O1, TxLock(tx, 1, 1, 4, (b"k1",)), 0.0))
        assert isinstance(vote, TxVote) and vote.code == VOTE_RETRY and vote.request == 1
        assert sends(t.on_message(O1, prepare(tx, [b"k1"], topology_id=6), 0.0)) == []
        assert t.state_of(tx) is None
        (vote,) = sends(t.on_topology(6, 1.0))
        assert isinstance(vote, TxVote) and vote.code == YES
        # a commit of an old topology is applied (the decision is final) and answered RETRY
        out = t.on_message(O1, TxCommit(tx, 1, 5, ((b"k1", make_version(6, 1), b"v"),)), 2.0)
        assert [tx for tx, _ in store.applied] == [tx]
        assert sends(out) == [TxAck(tx, 1, ACK_RETRY, 6)]

    def test_lock_timeout_votes_no(self) -> None:
        t, _ = table(lock_timeout="2s")
        t1, t2 = tid(1), tid(2)
        t.on_message(O1, prepare(t1, [b"k1"]), 0.0)
        assert sends(t.on_message(O2, prepare(t2, [b"k1", b"k0"]), 0.0)) == []
        assert t.next_deadline() == 2.0
        (vote,) = sends(t.tick(2.0))
        assert isinstance(vote, TxVote) and vote.code == NO and "lock timeout" in vote.reason
        assert t.state_of(t2) == TxState.ROLLED_BACK
        assert t.locks.held_by(t2) == frozenset()

    def test_waiting_prepare_is_voted_when_the_lock_frees(self) -> None:
        t, _ = table()
        t1, t2 = tid(1), tid(2, O2)
        t.on_message(O1, prepare(t1, [b"k1"]), 0.0)
        assert sends(t.on_message(O2, prepare(t2, [b"k1"]), 0.0)) == []
        out = t.on_message(O1, TxRollback(t1, 1, 1), 1.0)
        msgs = sends(out)
        assert TxAck(t1, 1, ACK_OK, 1) in msgs
        (vote,) = [m for m in msgs if isinstance(m, TxVote)]
        assert vote.tx == t2 and vote.code == YES
        assert [o.dest for o in out if isinstance(o, TxSend) and isinstance(o.message, TxVote)] == [O2]

    def test_pessimistic_lock_then_prepare(self) -> None:
        t, _ = table()
        tx = tid(1)
        (vote,) = sends(t.on_message(O1, TxLock(tx, 1, 1, 1, (b"k1",)), 0.0))
        assert isinstance(vote, TxVote) and vote.code == YES and vote.request == 1
        assert t.state_of(tx) == TxState.ACTIVE and t.locks.held_by(tx) == {b"k1"}
        (vote,) = sends(t.on_message(O1, prepare(tx, [b"k1"]), 1.0))
        assert isinstance(vote, TxVote) and vote.code == YES and vote.request == 0

    def test_optimistic_prepare_votes_no_at_once_on_a_held_key_pessimistic_waits(self) -> None:
        t, store = table()
        t1, t2, t3 = tid(1), tid(2), tid(3)
        t.on_message(O1, TxLock(t1, 1, 1, 1, (b"k1",)), 0.0)  # pessimistic holder
        nowait = TxPrepare(t2, 1, 1, (b"k0", b"k1"), ((b"k0", b"x"), (b"k1", b"y")), ((b"k1", 0),), False)
        (vote,) = sends(t.on_message(O1, nowait, 0.1))
        assert isinstance(vote, TxVote) and vote.code == NO and vote.request == 0
        assert vote.reason.startswith("conflict:") and str(t1) in vote.reason
        assert t.state_of(t2) == TxState.ROLLED_BACK and t.locks.held_by(t2) == frozenset()
        assert t.locks.holders(b"k0") == frozenset() and not t.locks.waiting(t2)  # nothing left waiting
        # a pessimistic (waiting) prepare queues instead, and gets the key when the holder finishes
        assert sends(t.on_message(O1, prepare(t3, [b"k1"]), 0.2)) == []
        t.on_message(O1, TxRollback(t1, 1, 1), 0.3)
        assert t.state_of(t3) == TxState.PREPARED
        assert store.applied == []

    def test_optimistic_prepare_on_a_blocked_segment_waits_for_the_lock_information(self) -> None:
        old, _ = table(B)
        new, _ = table(A)
        t1, t2, t3 = tid(1), tid(2), tid(3)
        old.on_message(O1, prepare(t1, [b"k1"]), 0.0)  # prepared on the old primary
        new.block_segments([seg(b"k1")])
        nowait = TxPrepare(t2, 1, 1, (b"k1",), ((b"k1", b"x"),), ((b"k1", 0),), False)
        assert sends(new.on_message(O1, nowait, 0.1)) == []  # parked: not NO while the holders are unknown
        (vote,) = sends(new.import_lock_info(old.export_segments([seg(b"k1")]), 0.2))
        assert isinstance(vote, TxVote) and vote.code == NO and vote.reason.startswith("conflict:")
        # the same with no holder in the information: the parked prepare goes on and votes YES
        new2, _ = table(A)
        new2.block_segments([seg(b"k2")])
        assert sends(new2.on_message(O1, TxPrepare(t3, 1, 1, (b"k2",), ((b"k2", b"x"),), (), False), 0.1)) == []
        (vote,) = sends(new2.import_lock_info(TxLockInfo(1, (seg(b"k2"),), ()), 0.2))
        assert isinstance(vote, TxVote) and vote.code == YES

    def test_view_change_rolls_back_unprepared_and_marks_prepared_in_doubt(self) -> None:
        t, store = table()
        t1, t2, t3 = tid(1), tid(2), tid(3, O2)
        t.on_message(O1, prepare(t1, [b"k1"]), 0.0)  # prepared
        t.on_message(O1, TxLock(t2, 1, 1, 1, (b"k2",)), 0.0)  # active (pessimistic lock)
        t.on_message(O2, prepare(t3, [b"k3"]), 0.0)  # another originator's
        t.on_view([A, B, O2], 1.0)
        assert t.state_of(t2) == TxState.ROLLED_BACK
        assert [d.tx for d in t.in_doubt()] == [t1]
        assert t.locks.held_by(t1) == {b"k1"}  # in doubt: still locked
        # The gone originator's late messages do not count any more; a late prepare locks nothing.
        assert sends(t.on_message(O1, TxCommit(t1, 1, 1, ()), 2.0)) == []
        assert sends(t.on_message(O1, prepare(tid(9), [b"k5"]), 2.0)) == []
        assert t.state_of(tid(9)) is None
        (doubt,) = t.in_doubt()
        t.resolve(t1, True, 3.0)
        assert store.applied == [(t1, ((b"k1", doubt.versions[0][1], b"vk1"),))]
        assert t.in_doubt() == [] and t.state_of(t1) == TxState.COMMITTED
        assert t.locks.held_by(t1) == frozenset()

    def test_resolve_needs_versions_on_a_backup(self) -> None:
        t, store = table(B)
        tx = tid(1)
        t.on_message(O1, prepare(tx, [b"k1"], lock=()), 0.0)
        t.on_view([A, B], 1.0)
        with pytest.raises(ValueError, match="no version"):
            t.resolve(tx, True, 2.0)
        v = make_version(1, 7)
        t.resolve(tx, True, 2.0, {b"k1": v})
        assert store.applied == [(tx, ((b"k1", v, b"vk1"),))]
        with pytest.raises(ValueError, match="not PREPARED"):
            t.resolve(tx, False, 3.0)

    def test_resolve_needs_no_version_for_a_key_the_member_holds_no_more(self) -> None:
        t, store = table(B)
        tx = tid(1)
        t.on_message(O1, prepare(tx, [b"k1", b"k2"], lock=()), 0.0)
        t.on_view([A, B], 1.0)
        v = make_version(1, 7)
        with pytest.raises(ValueError, match="no version"):
            t.resolve(tx, True, 2.0, {b"k1": v})  # k2 is still ours: its version is needed
        t.resolve(tx, True, 2.0, {b"k1": v}, not_held=[b"k2"])
        assert store.applied == [(tx, ((b"k1", v, b"vk1"),))]  # nothing written for k2
        assert t.state_of(tx) == TxState.COMMITTED and t.report(tx).writes == ((b"k1", b"vk1"),)
        assert t.locks.empty()

    def test_finished_records_expire(self) -> None:
        t, _ = table(completed_retention="60s")
        tx = tid(1)
        t.on_message(O1, prepare(tx, [b"k1"]), 0.0)
        t.on_message(O1, TxRollback(tx, 1, 1), 1.0)
        assert t.next_deadline() == 61.0
        t.tick(61.0)
        assert t.state_of(tx) is None and t.next_deadline() is None

    def test_new_attempt_supersedes(self) -> None:
        t, _ = table()
        tx = tid(1)
        t.on_message(O1, prepare(tx, [b"k1"]), 0.0)
        (vote,) = sends(t.on_message(O1, prepare(tx, [b"k1", b"k2"], attempt=2), 1.0))
        assert isinstance(vote, TxVote) and vote.attempt == 2 and vote.code == YES
        assert t.locks.held_by(tx) == {b"k1", b"k2"}
        assert sends(t.on_message(O1, prepare(tx, [b"k1"], attempt=1), 1.5)) == []  # stale attempt ignored
        t.on_message(O1, TxRollback(tx, 1, 1), 2.0)  # the old attempt's rollback leaves the new one alone
        assert t.state_of(tx) == TxState.PREPARED
        t.on_message(O1, TxRollback(tx, 2, 1), 3.0)
        assert t.locks.empty()

    def test_state_transfer_of_lock_information(self) -> None:
        old, _ = table(A)
        new, new_store = table(D)
        t1, t2 = tid(1), tid(2, O2)
        (vote,) = sends(old.on_message(O1, prepare(t1, [b"k1"]), 0.0))
        assert isinstance(vote, TxVote)
        old.on_message(O1, TxLock(tid(3), 1, 1, 1, (b"k2",)), 0.0)
        # D becomes the primary of k1's and k2's segments: nothing is granted there until the info arrives
        segs = [seg(b"k1"), seg(b"k2")]
        new.block_segments(segs)
        assert sends(new.on_message(O2, prepare(t2, [b"k1"]), 1.0)) == []
        info = old.export_segments(segs)
        assert [(r.tx, r.state, r.lock_keys) for r in info.records] == [
            (t1, INFO_PREPARED, (b"k1",)),
            (tid(3), INFO_ACTIVE, (b"k2",)),
        ]
        # it travels on the wire
        (info2,) = decode_tx_payload(encode_tx_payload([info]))
        assert info2 == info
        assert sends(new.on_message(A, info2, 2.0)) == []  # t2 still waits: t1 holds k1 here now
        assert new.state_of(t1) == TxState.PREPARED
        assert new.locks.holders(b"k1") == {t1}
        # the originator's commit, retried on the new owner, applies with the stamped versions and frees k1
        out = new.on_message(O1, TxCommit(t1, 1, 1, ((b"k1", dict(vote.versions)[b"k1"], b"vk1"),)), 3.0)
        assert [tx for tx, _ in new_store.applied] == [t1]
        (v2,) = [m for m in sends(out) if isinstance(m, TxVote)]
        assert v2.tx == t2 and v2.code == YES

    def test_only_the_prepares_lock_keys_are_stamped(self) -> None:
        # k1 is held here by inheritance (imported lock information); the prepare makes this member the
        # primary of k5 only, so it stamps k5 and nothing else.
        t, _ = table(C)
        tx = tid(1)
        info = TxLockInfo(1, (seg(b"k1"),), (TxRecordInfo(tx, 1, INFO_ACTIVE, False, (b"k1",), (), ()),))
        t.on_message(A, info, 0.0)
        (vote,) = sends(t.on_message(O1, prepare(tx, [b"k1", b"k5"], lock=(b"k5",)), 1.0))
        assert isinstance(vote, TxVote) and vote.code == YES
        assert [k for k, _ in vote.versions] == [b"k5"]

    def test_promoted_backup_keeps_prepared_keys_locked(self) -> None:
        backup, _ = table(B)
        t1, t2 = tid(1), tid(2, O2)
        backup.on_message(O1, prepare(t1, [b"k1"], lock=()), 0.0)
        backup.promote([seg(b"k1")])
        assert backup.locks.holders(b"k1") == {t1}
        assert sends(backup.on_message(O2, prepare(t2, [b"k1"]), 1.0)) == []
        out = backup.on_message(O1, TxRollback(t1, 1, 1), 2.0)
        assert any(isinstance(m, TxVote) and m.tx == t2 and m.code == YES for m in sends(out))

    def test_a_repeated_commit_applies_again_what_a_dropped_copy_lost(self) -> None:
        # The member's copy of a segment went (dropped, or emptied for a fresh transfer) after it applied a
        # commit there; the copy a transfer then brought may predate the commit. A repeat of the commit, or
        # pushed lock information, must apply its writes again, for the lost keys only.
        t, store = table(B)
        tx = tid(1)
        k1, k2 = b"k1", b"k2"
        writes = ((k1, make_version(1, 5), b"x1"), (k2, make_version(1, 6), b"x2"))
        t.on_message(O1, TxCommit(tx, 1, 1, writes), 0.0)
        assert len(store.applied) == 1
        t.forget_applied([seg(k1)])
        store.data[k1] = (make_version(1, 2), b"stale")  # the transfer's older copy
        out = t.on_message(O1, TxCommit(tx, 1, 1, writes), 1.0)
        assert store.applied[-1] == (tx, (writes[0],))
        assert store.data[k1] == (make_version(1, 5), b"x1")
        assert sends(out) == [TxAck(tx, 1, ACK_OK, 1)]
        t.on_message(O1, TxCommit(tx, 1, 1, writes), 2.0)
        assert len(store.applied) == 2  # applied again once, not at every repeat
        # pushed lock information of a pusher still prepared brings the write back too
        t.forget_applied([seg(k2)])
        store.data[k2] = (make_version(1, 3), b"stale")
        info = TxLockInfo(
            1, (seg(k2),), (TxRecordInfo(tx, 1, INFO_PREPARED, False, (k2,), ((k2, b"x2"),), ((k2, writes[1][1]),)),)
        )
        t.import_lock_info(info, 3.0)
        assert store.data[k2] == (make_version(1, 6), b"x2")
        assert t.state_of(tx) == TxState.COMMITTED and t.locks.empty()

    def test_an_own_completed_commit_releases_a_key_a_backup_in_doubt_pushed_without_its_version(self) -> None:
        # This member committed tx as the owner of k1 (its originator, its coordinator done); a backup of k2 that
        # was cut off in doubt pushes k2's write without a version when this member becomes k2's primary. Held
        # until a commit brings the version, k2 stayed locked for good: the originator's commit was complete
        # and nothing else sends one. settle_own releases it.
        t, store = table(A)
        tx = tid(1, A)
        k1, k2 = b"k1", b"k2"
        t.on_message(A, TxCommit(tx, 1, 1, ((k1, make_version(1, 5), b"x1"),)), 0.0)
        info = TxLockInfo(1, (seg(k2),), (TxRecordInfo(tx, 1, INFO_PREPARED, True, (k2,), ((k2, b"x2"),), ()),))
        t.import_lock_info(info, 1.0)
        assert t.locks.held_by(tx) == {k2}  # a commit of the originator may still bring k2's version
        assert t.settle_own(tx, 2.0) == []
        assert t.locks.empty() and t.state_of(tx) == TxState.COMMITTED
        assert k2 not in store.data  # nothing applied: the key's owners have the write
        assert t.report(tx).writes == ()  # the dropped write is no longer waited for


class TestAutomaticResolution:
    """The view coordinator's resolver (TxResolver) and the decision rule (resolution)."""

    T = TxId(O1, 3)

    @staticmethod
    def rep(
        state: int, in_doubt: bool = False, views: tuple[Address, ...] = (A, B, C, O1), **kw: object
    ) -> TxReportInfo:
        tx = kw.get("tx", TestAutomaticResolution.T)
        if state == -1:
            return TxReportInfo(tx, -1, 0, False, bool(kw.get("deciding")), (), (), ())  # type: ignore[arg-type]
        writes = kw.get("writes", ((b"k1", b"v1"),))
        versions = kw.get("versions", ())
        return TxReportInfo(tx, state, 1, in_doubt, bool(kw.get("deciding")), writes, versions, views)  # type: ignore[arg-type]

    def test_the_rule(self) -> None:
        P, CM, RB, UNK = int(TxState.PREPARED), int(TxState.COMMITTED), int(TxState.ROLLED_BACK), -1
        members = (A, B, C)
        r = self.rep
        # some member committed it: commit, whoever else left
        assert resolution(self.T, {A: r(P, True, (A, B, C, D, O1)), B: r(CM)}, members) is True
        # nobody committed and every member of the prepare-time view but the originator answered: roll back
        assert resolution(self.T, {A: r(P, True), B: r(RB), C: r(UNK)}, members) is False
        # a member of the prepare-time view left: it may have committed; stays in doubt, saying why
        why = resolution(self.T, {A: r(P, True, (A, B, C, D, O1)), B: r(P, True), C: r(UNK)}, members)
        assert isinstance(why, str) and "prepare-time view left" in why and str(D) in why
        # a member that has not seen the originator leave would still take its late commit: wait
        why = resolution(self.T, {A: r(P, True), B: r(P, False), C: r(UNK)}, members)
        assert isinstance(why, str) and str(B) in why and "not seen its originator leave" in why
        # the originator is back (a merge) and still deciding: wait for it
        why = resolution(self.T, {A: r(P, True), O1: r(UNK, deciding=True)}, (A, O1))
        assert isinstance(why, str) and "has not decided" in why
        why = resolution(self.T, {A: r(P, True), O1: r(P, deciding=True)}, (A, O1))
        assert isinstance(why, str)
        # the originator is back and decided rollback: roll back, even with a prepare-time member gone
        assert resolution(self.T, {A: r(P, True, (A, B, C, D, O1)), O1: r(RB)}, (A, O1)) is False
        # ... but not on a report in its name from a member that is not it
        why = resolution(self.T, {A: r(P, True, (A, D, O1)), B: r(RB)}, (A, B))
        assert isinstance(why, str)

    def answer(self, request: int, *reports: TxReportInfo) -> TxReportAnswer:
        return TxReportAnswer(request, tuple(reports))

    def test_only_the_view_coordinator_asks(self) -> None:
        res = TxResolver(A, TxConfig())
        assert res.on_view([B, A, C], 0.0, removed=True) == []
        assert res.next_deadline() is None
        res.enabled = False
        assert res.on_view([A, B], 0.0, removed=True) == [] and res.next_deadline() is None

    def test_request_answers_decide_and_rounds_repeat_while_in_doubt(self) -> None:
        res = TxResolver(A, TxConfig(resend_interval=3.0))
        out = res.on_view([A, B, C], 10.0, removed=True)
        assert out == [TxSend(m, TxReportRequest(1, (), (A, B, C))) for m in (A, B, C)]
        assert res.next_deadline() == 13.0
        P, CM = int(TxState.PREPARED), int(TxState.COMMITTED)
        # Round 1: B lists it in doubt. A round that did not name it asks every member about it at once.
        assert res.on_answer(A, self.answer(1), 10.1) == []
        assert res.on_answer(B, self.answer(1, self.rep(P, True)), 10.1) == []
        assert res.on_answer(B, self.answer(1), 10.1) == []  # a duplicate: ignored
        out = res.on_answer(C, self.answer(1), 10.1)
        assert out == [TxSend(m, TxReportRequest(2, (self.T,), (A, B, C))) for m in (A, B, C)]
        # Round 2: C committed it (with a version), B holds it in doubt with another key's version.
        assert res.on_answer(C, self.answer(1, self.rep(CM)), 10.2) == []  # an older round's answer: ignored
        res.on_answer(A, self.answer(2, self.rep(-1)), 10.2)
        v1, v2 = make_version(2, 1), make_version(2, 2)
        b_rep = self.rep(P, True, writes=((b"k2", b"v2"),), versions=((b"k2", v2),))
        res.on_answer(B, self.answer(2, b_rep), 10.2)
        (decided,) = res.on_answer(C, self.answer(2, self.rep(CM, versions=((b"k1", v1),))), 10.2)
        assert decided == TxDecided(self.T, True, 1, ((b"k1", b"v1"), (b"k2", b"v2")), ((b"k1", v1), (b"k2", v2)), (B,))
        assert res.undecided == {}
        # It was in doubt in this round: another follows after resend_interval, and says nothing is left.
        assert res.tick(12.0) == []
        out = res.tick(13.2)
        assert out == [TxSend(m, TxReportRequest(3, (self.T,), (A, B, C))) for m in (A, B, C)]
        for m in (A, B, C):
            res.on_answer(m, self.answer(3, self.rep(CM if m != A else -1)), 13.3)
        assert res.next_deadline() is None and res.rounds == 3 and res.decided == 1

    def test_undecided_stays_listed_and_is_asked_again_then_rolled_back_once_answerable(self) -> None:
        res = TxResolver(A, TxConfig(resend_interval=3.0))
        res.on_view([A, B], 0.0, removed=True)
        P = int(TxState.PREPARED)
        res.on_answer(A, self.answer(1, self.rep(P, True, (A, B, C, O1))), 0.1)
        res.on_answer(B, self.answer(1), 0.1)  # round 2 at once: it names the transaction
        res.on_answer(A, self.answer(2, self.rep(P, True, (A, B, C, O1))), 0.2)
        assert res.on_answer(B, self.answer(2, self.rep(-1)), 0.2) == []
        assert str(C) in res.undecided[self.T] and res.next_deadline() == 3.1  # round 2 began at 0.1
        # C is back (a merge), answers, and knows nothing of it: every member but the originator answered.
        out = res.on_view([A, B, C], 1.0, removed=True)
        assert out == [TxSend(m, TxReportRequest(3, (self.T,), (A, B, C))) for m in (A, B, C)]
        res.on_answer(A, self.answer(3, self.rep(P, True, (A, B, C, O1))), 1.1)
        res.on_answer(B, self.answer(3, self.rep(-1)), 1.1)
        (decided,) = res.on_answer(C, self.answer(3, self.rep(-1)), 1.1)
        assert isinstance(decided, TxDecided) and decided.commit is False and decided.members == (A,)
        assert res.undecided == {}

    def test_a_member_whose_view_is_behind_is_asked_again(self) -> None:
        # Simulation seed 446: in the round of the view change, a member that had not installed the view yet
        # had the transaction prepared, not in doubt; it reported nothing and no round followed. Now a request
        # carries the coordinator's view, and a prepared record of an originator outside it is reported.
        t, _ = table(B)
        t.on_view([A, B, O1], 0.0)  # the view at the prepare
        tx = tid(1)
        t.on_message(O1, prepare(tx, [b"k1"]), 0.0)
        assert t.unresolved() == [] and t.unresolved([A, B, O1]) == [] and t.unresolved([A, B]) == [tx]
        res = TxResolver(A, TxConfig(resend_interval=3.0))
        res.on_view([A, B], 0.0, removed=True)
        res.on_answer(A, self.answer(1), 0.1)
        out = res.on_answer(B, self.answer(1, report_info(t.report(tx))), 0.1)
        assert out == [TxSend(m, TxReportRequest(2, (tx,), (A, B))) for m in (A, B)]
        res.on_answer(A, self.answer(2, self.rep(-1, tx=tx)), 0.2)
        assert res.on_answer(B, self.answer(2, report_info(t.report(tx))), 0.2) == []
        assert "not seen its originator leave" in res.undecided[tx] and res.next_deadline() == 3.1
        t.on_view([A, B], 1.0)  # B installs the view: in doubt now; the next round decides
        res.tick(3.1)
        res.on_answer(A, self.answer(3, self.rep(-1, tx=tx)), 3.2)
        (decided,) = res.on_answer(B, self.answer(3, report_info(t.report(tx))), 3.2)
        assert isinstance(decided, TxDecided) and decided.tx == tx and decided.commit is False

    def test_a_member_that_never_answers_makes_the_round_repeat(self) -> None:
        res = TxResolver(A, TxConfig(resend_interval=3.0))
        res.on_view([A, B], 0.0, removed=True)
        res.on_answer(A, self.answer(1), 0.1)
        assert res.tick(3.0) == [TxSend(m, TxReportRequest(2, (), (A, B))) for m in (A, B)]

    def test_reports_carry_the_prepare_time_view(self) -> None:
        t, _ = table(B)
        tx = tid(1)
        t.on_message(O1, prepare(tx, [b"k1"]), 0.0)
        info = report_info(t.report(tx))
        assert info.state == TxState.PREPARED and not info.in_doubt and set(info.views) == {A, B, C, D, O1, O2, O3}
        t.on_view([A, B], 1.0)
        info = report_info(t.report(tx))
        assert info.in_doubt and set(info.views) == {A, B, C, D, O1, O2, O3}  # the view at the prepare, not now
        assert report_info(t.report(tid(2))) == TxReportInfo(tid(2), -1, 0, False, False, (), (), ())

    def test_the_current_primary_stamps_a_committed_write_whose_version_died_with_the_originator(self) -> None:
        # Seed 19's state: committed here (a resolver's commit without k1's version), k1's write from the prepare
        # (as a backup), now its primary; the originator, which stamped k1, is gone.
        t, store = table(B)
        tx = tid(1)
        t.on_message(O1, prepare(tx, [b"k1"], lock=()), 0.0)
        t.promote([seg(b"k1")])
        assert t.stamp_committed(lambda k: True, 0.5) == ([], [])  # not committed yet
        t.on_view([A, B], 1.0)
        t.on_message(RESOLVER, TxCommit(tx, 1, 1, ()), 2.0)
        assert t.state_of(tx) == TxState.COMMITTED and t.locks.held_by(tx) == {b"k1"}  # waits for a version
        assert t.stamp_committed(lambda k: False, 2.5) == ([], [])  # not its primary: nothing
        _, stamped = t.stamp_committed(lambda k: True, 3.0)
        (v,) = [v for k, v, _ in stamped[0][2]]
        assert stamped == [(tx, 1, ((b"k1", v, b"vk1"),))] and store.data[b"k1"] == (v, b"vk1")
        assert t.locks.empty() and t.report(tx).versions == ((b"k1", v),)
        assert t.stamp_committed(lambda k: True, 4.0) == ([], [])  # once

    def test_an_in_doubt_participant_takes_a_resolvers_decision_even_from_the_originators_address(self) -> None:
        t, store = table()
        tx = tid(1)
        t.on_message(O1, prepare(tx, [b"k1"]), 0.0)
        t.on_view([A, B], 1.0)
        (doubt,) = t.in_doubt()
        v = doubt.versions[0][1]
        assert sends(t.on_message(O1, TxCommit(tx, 1, 1, ((b"k1", v, b"vk1"),)), 2.0)) == []  # its late commit: no
        assert t.in_doubt() != []
        # Back after a partition and view coordinator, it resolves: that counts.
        out = t.on_message(O1, TxCommit(tx, 1, 1, ((b"k1", v, b"vk1"),), True), 3.0)
        assert sends(out) == [TxAck(tx, 1, ACK_OK, 1)] and store.data[b"k1"] == (v, b"vk1") and t.locks.empty()

    def test_no_stamp_while_the_originator_lives(self) -> None:
        t, _ = table(B)
        tx = tid(1)
        t.on_message(O1, prepare(tx, [b"k1"], lock=()), 0.0)
        t.promote([seg(b"k1")])
        t.on_message(RESOLVER, TxCommit(tx, 1, 1, ()), 2.0)
        assert t.locks.held_by(tx) == {b"k1"}
        assert t.stamp_committed(lambda k: True, 3.0) == ([], [])  # its commit will carry the version


def test_termination_decision() -> None:
    P, Cm, R, A_ = TxState.PREPARED, TxState.COMMITTED, TxState.ROLLED_BACK, TxState.ACTIVE
    assert termination_decision([]) is None
    assert termination_decision([P, P]) is False
    assert termination_decision([P, Cm]) is True
    assert termination_decision([P, R]) is False
    assert termination_decision([P, None]) is False
    assert termination_decision([A_, P]) is False


def test_config_validation() -> None:
    assert TxConfig.from_dict({"locking": "pessimistic"}).mode == LockingMode.PESSIMISTIC
    with pytest.raises(ConfigError, match=r"tx\.locking"):
        TxConfig.from_dict({"locking": "eager"})
    with pytest.raises(ConfigError, match="unknown key"):
        TxConfig.from_dict({"lock_timeuot": "1s"})
    with pytest.raises(ConfigError, match="positive"):
        TxConfig.from_dict({"lock_timeout": "0s"})


# -- coordinator ---------------------------------------------------------------------------------------------------


class StaticRouter:
    """Owners per key from a fixed list of members: primary ``members[h]``, backup the next one."""

    def __init__(self, members: Sequence[Address], owners: int = 2, topology_id: int = 1) -> None:
        self.members = list(members)
        self.owners = owners
        self.topology_id = topology_id

    def owners_of(self, key: bytes) -> tuple[Address, ...]:
        h = seg(key) % len(self.members)
        n = min(self.owners, len(self.members))
        return tuple(self.members[(h + i) % len(self.members)] for i in range(n))

    def __call__(self, keys: Sequence[bytes]) -> tuple[int, Mapping[bytes, Sequence[Address]]]:
        return self.topology_id, {k: self.owners_of(k) for k in keys}


def committing_k0(router: StaticRouter) -> tuple[TxCoordinator, TxId]:
    """A coordinator whose transaction wrote k0 and got YES from A (stamping a version) and B: committing."""
    co = TxCoordinator(O1, router)
    tx = co.begin(0.0)
    co.commit(tx, {b"k0": b"x"}, 0.0)
    co.on_message(A, TxVote(tx, 1, 0, YES, 1, ((b"k0", make_version(1, 1)),)), 1.0)
    co.on_message(B, TxVote(tx, 1, 0, YES, 1), 1.0)
    return co, tx


class TestCoordinator:
    def test_all_yes_commits_after_every_ack(self) -> None:
        router = StaticRouter([A, B])
        co = TxCoordinator(O1, router)
        tx = co.begin(0.0)
        out = co.commit(tx, {b"k0": b"x", b"k1": None}, 0.0)
        preps = {o.dest: o.message for o in out if isinstance(o, TxSend)}
        assert set(preps) == {A, B}
        pa, pb = preps[A], preps[B]
        assert isinstance(pa, TxPrepare) and isinstance(pb, TxPrepare)
        assert pa.lock_keys == (b"k0",) and pb.lock_keys == (b"k1",)  # each the primary of one key
        assert {k for k, _ in pa.writes} == {b"k0", b"k1"}  # and the backup of the other
        va, vb = make_version(1, 1), make_version(1, 2)
        assert co.on_message(A, TxVote(tx, 1, 0, YES, 1, ((b"k0", va),)), 1.0) == []
        out = co.on_message(B, TxVote(tx, 1, 0, YES, 1, ((b"k1", vb),)), 1.0)
        commits = {o.dest: o.message for o in out if isinstance(o, TxSend)}
        assert all(isinstance(m, TxCommit) for m in commits.values())
        assert set(commits[A].writes) == {(b"k0", va, b"x"), (b"k1", vb, None)}  # type: ignore[union-attr]
        assert co.on_message(A, TxAck(tx, 1, ACK_OK, 1), 2.0) == []  # not reported before every ack
        out = co.on_message(B, TxAck(tx, 1, ACK_OK, 1), 2.0)
        assert out == [TxOutcome(tx, True, "", 1)]
        assert co.pending() == []

    def test_a_commit_whose_owners_all_left_is_reported_only_once_new_owners_have_it(self) -> None:
        # Simulation seed 1171: the originator was cut off from both owners after their YES; completing on the
        # view change reported a commit nobody had applied, and the owners, in doubt, were later rolled back.
        router = StaticRouter([A, B])
        co, tx = committing_k0(router)
        assert co.state_of(tx) == CoordState.COMMITTING
        out = co.on_view([O1], 2.0)
        assert not [o for o in out if isinstance(o, TxOutcome)]  # no answer from any owner: not committed yet
        router.members, router.topology_id = [O1], 2  # the topology of the originator's side: it owns k0 now
        out = co.on_topology(3.0)
        commits = [o for o in out if isinstance(o, TxSend) and isinstance(o.message, TxCommit)]
        assert [o.dest for o in commits] == [O1]
        out = co.on_message(O1, TxAck(tx, 1, ACK_OK, 2), 3.5)
        assert out == [TxOutcome(tx, True, "", 1)]

    @staticmethod
    def _committing_then_new_owner(voter_answer: int) -> tuple[TxCoordinator, TxId, list[TxOutput], list[TxOutput]]:
        """k0 prepared and voted on by A and B; the routing then makes C an owner (by state transfer: it never
        saw the prepare), and A answers the commit with ``voter_answer``. Returns the coordinator, the
        transaction, what the new topology produced and what A's answer produced."""
        router = StaticRouter([A, B])
        co, tx = committing_k0(router)
        assert co.state_of(tx) == CoordState.COMMITTING
        router.members, router.topology_id = [A, C], 2
        on_topology = co.on_topology(2.0)
        # A's answer names its newer topology (it answers a commit routed by topology 1)
        code_topology = 2 if voter_answer != ACK_OK else 1
        answered = co.on_message(A, TxAck(tx, 1, voter_answer, code_topology), 2.5)
        return co, tx, on_topology, answered

    def test_a_new_owner_gets_a_commit_only_once_a_voter_applied_it(self) -> None:
        co, tx, on_topology, answered = self._committing_then_new_owner(ACK_OK)
        assert C not in {o.dest for o in on_topology if isinstance(o, TxSend)}  # held back: no voter answered
        to_c = [o.message for o in answered if isinstance(o, TxSend) and o.dest == C]
        assert len(to_c) == 1 and isinstance(to_c[0], TxCommit)
        assert [w[0] for w in to_c[0].writes] == [b"k0"]
        co.on_message(C, TxAck(tx, 1, ACK_OK, 2), 3.0)
        co.on_message(B, TxAck(tx, 1, ACK_OK, 2), 3.0)  # the answers to the commits routed by topology 2
        out = co.on_message(A, TxAck(tx, 1, ACK_OK, 2), 3.0)
        assert out == [TxOutcome(tx, True, "", 1)]

    def test_a_new_owner_never_gets_a_write_its_voters_rolled_back(self) -> None:
        # Simulation seed 1461: a resolver rolled the transaction back while the originator was cut off; a new
        # owner copied the key from a rolled-back owner. Sending it the late commit made the replicas differ.
        co, tx, _, answered = self._committing_then_new_owner(ACK_ROLLED_BACK)
        to_c = [o.message for o in answered if isinstance(o, TxSend) and o.dest == C]
        assert len(to_c) == 1 and isinstance(to_c[0], TxCommit) and to_c[0].writes == ()
        assert co.state_of(tx) == CoordState.COMMITTING  # A's answer counted; B and C have not answered
        out = co.on_message(C, TxAck(tx, 1, ACK_OK, 2), 3.0) + co.on_message(B, TxAck(tx, 1, ACK_ROLLED_BACK, 2), 3.0)
        (outcome,) = [o for o in out if isinstance(o, TxOutcome)]
        assert outcome.committed and outcome.mixed

    def test_a_new_owner_held_back_is_released_when_every_voter_left(self) -> None:
        router = StaticRouter([A, B])
        co, _ = committing_k0(router)
        router.members, router.topology_id = [C, D], 2
        out = co.on_topology(2.0)
        assert not {o.dest for o in out if isinstance(o, TxSend)} & {C, D}
        out = co.on_view([O1, C, D], 2.5)  # nobody left to ask: the owners get the write
        to_new = {o.dest: o.message for o in out if isinstance(o, TxSend)}
        assert set(to_new) == {C, D} and all(m.writes and m.writes[0][0] == b"k0" for m in to_new.values())  # type: ignore[union-attr]

    def test_a_resolution_sent_from_the_originators_member_overrules_its_decision(self) -> None:
        # Simulation seed 912: an operator rolled back, from every member, a commit its participants (in doubt)
        # had ignored. The answers to those rollbacks reached the originator's coordinator, which took them for
        # acknowledgements of its commit and sent the commit on to a new owner.
        router = StaticRouter([A, B])
        co, tx = committing_k0(router)
        assert co.resolved_here(tx, True, 2.0) == [] and co.state_of(tx) == CoordState.COMMITTING  # the same
        out = co.resolved_here(tx, False, 2.0)
        assert out == [TxOutcome(tx, False, "rolled back by a resolution while committing", 1, False)]
        assert co.state_of(tx) is None and co.pending() == []
        assert co.on_message(A, TxAck(tx, 1, ACK_OK, 1), 2.5) == []  # the rollback's answer: nothing to count

    def test_a_participant_gone_with_its_topology_already_routed_retries_at_once(self) -> None:
        # Simulation seed 1250: the driver installed the topology without the departed member before the
        # view; waiting for one topology more waited for good (the transaction stayed pending).
        router = StaticRouter([A, B])
        co = TxCoordinator(O1, router)
        tx = co.begin(0.0)
        co.commit(tx, {b"k0": b"x", b"k1": b"y"}, 0.0)
        router.members, router.topology_id = [A], 2
        co.on_topology(1.0)  # nothing to do while preparing
        out = co.on_view([O1, A], 1.0)
        preps = [o for o in out if isinstance(o, TxSend) and isinstance(o.message, TxPrepare)]
        assert preps and all(o.dest == A and o.message.attempt == 2 for o in preps)  # type: ignore[union-attr]
        assert co.state_of(tx) == CoordState.PREPARING

    def test_versions_only_from_the_keys_primary(self) -> None:
        co = TxCoordinator(O1, StaticRouter([A, B]))
        tx = co.begin(0.0)
        co.commit(tx, {b"k0": b"x"}, 0.0)  # primary A, backup B
        va = make_version(1, 5)
        co.on_message(A, TxVote(tx, 1, 0, YES, 1, ((b"k0", va),)), 1.0)
        out = co.on_message(B, TxVote(tx, 1, 0, YES, 1, ((b"k0", make_version(1, 9)),)), 1.0)  # not B's to stamp
        commits = [m for m in sends(out) if isinstance(m, TxCommit)]
        assert commits and all(m.writes == ((b"k0", va, b"x"),) for m in commits)

    def test_a_no_vote_rolls_back_at_once(self) -> None:
        co = TxCoordinator(O1, StaticRouter([A, B]))
        tx = co.begin(0.0)
        co.commit(tx, {b"k0": b"x"}, 0.0)
        out = co.on_message(A, TxVote(tx, 1, 0, NO, 1, (), "lock timeout"), 1.0)
        assert TxOutcome(tx, False, "lock timeout", 1) in out
        rollbacks = {o.dest for o in out if isinstance(o, TxSend) and isinstance(o.message, TxRollback)}
        assert rollbacks == {A, B}
        # a YES arriving afterwards changes nothing
        assert co.on_message(B, TxVote(tx, 1, 0, YES, 1), 1.5) == []
        co.on_message(A, TxAck(tx, 1, ACK_OK, 1), 2.0)
        co.on_message(B, TxAck(tx, 1, ACK_OK, 1), 2.0)
        assert co.pending() == []

    def test_timeout_rolls_back_and_resends_until_acked(self) -> None:
        co = TxCoordinator(O1, StaticRouter([A]), TxConfig.from_dict({"tx_timeout": "5s", "resend_interval": "1s"}))
        tx = co.begin(0.0)
        co.commit(tx, {b"k0": b"x"}, 0.0)
        assert co.next_deadline() == 1.0
        assert [type(m) for m in sends(co.tick(1.0))] == [TxPrepare]  # resent
        out = co.tick(5.0)
        assert TxOutcome(tx, False, "timed out before every participant voted", 1) in out
        assert [type(m) for m in sends(out)] == [TxRollback]
        assert [type(m) for m in sends(co.tick(6.0))] == [TxRollback]
        co.on_message(A, TxAck(tx, 1, ACK_OK, 1), 6.5)
        assert co.pending() == [] and co.next_deadline() is None

    def test_retry_vote_prepares_again_on_the_new_topology(self) -> None:
        router = StaticRouter([A, B], owners=1)
        co = TxCoordinator(O1, router)
        tx = co.begin(0.0)
        co.commit(tx, {b"k0": b"x"}, 0.0)
        out = co.on_message(A, TxVote(tx, 1, 0, VOTE_RETRY, 2), 1.0)
        assert [type(m) for m in sends(out)] == [TxRollback]  # attempt 1 given up; waits for topology 2
        router.topology_id, router.members = 2, [C, D]
        out = co.on_topology(1.5)
        (prep,) = sends(out)
        assert isinstance(prep, TxPrepare) and prep.attempt == 2 and prep.topology_id == 2
        assert [o.dest for o in out if isinstance(o, TxSend)] == [C]
        out = co.on_message(C, TxVote(tx, 2, 0, YES, 2, ((b"k0", make_version(2, 1)),)), 2.0)
        dests = sorted(o.dest for o in out if isinstance(o, TxSend))
        assert dests == [A, C]  # the commit also releases what attempt 1 may still hold on A
        co.on_message(A, TxAck(tx, 2, ACK_OK, 2), 3.0)
        assert co.on_message(C, TxAck(tx, 2, ACK_OK, 2), 3.0) == [TxOutcome(tx, True, "", 2)]

    def test_commit_ack_retry_sends_the_decision_to_the_new_owners(self) -> None:
        router = StaticRouter([A], owners=1)
        co = TxCoordinator(O1, router)
        tx = co.begin(0.0)
        co.commit(tx, {b"k0": b"x"}, 0.0)
        co.on_message(A, TxVote(tx, 1, 0, YES, 1, ((b"k0", make_version(1, 1)),)), 1.0)
        assert co.on_message(A, TxAck(tx, 1, ACK_RETRY, 2), 2.0) == []  # not done: k0 may have moved
        router.topology_id, router.members = 2, [D]
        out = co.on_topology(2.5)
        commits = {o.dest: o.message for o in out if isinstance(o, TxSend)}
        assert set(commits) == {A, D}  # D owns k0 now; A is asked again under topology 2 (it owns nothing)
        assert commits[D] == TxCommit(tx, 1, 2, ((b"k0", make_version(1, 1), b"x"),))
        assert commits[A] == TxCommit(tx, 1, 2, ())
        # an answer to the topology-1 message does not count for the topology-2 one
        assert co.on_message(A, TxAck(tx, 1, ACK_OK, 1), 2.7) == []
        assert co.on_message(A, TxAck(tx, 1, ACK_OK, 2), 2.8) == []
        assert co.on_message(D, TxAck(tx, 1, ACK_OK, 2), 3.0) == [TxOutcome(tx, True, "", 1)]

    def test_participant_leaving_before_its_vote_means_a_new_attempt(self) -> None:
        router = StaticRouter([A, B], owners=1)
        co = TxCoordinator(O1, router)
        co.on_view([A, B, O1], 0.0)
        tx = co.begin(0.0)
        co.commit(tx, {b"k0": b"x", b"k1": b"y"}, 0.0)
        co.on_view([A, O1], 1.0)  # B crashed
        router.topology_id, router.members = 2, [A]
        (p1,) = [m for m in sends(co.on_topology(1.5)) if isinstance(m, TxPrepare)]
        assert p1.attempt == 2 and p1.lock_keys == (b"k0", b"k1")

    def test_pessimistic_lock(self) -> None:
        co = TxCoordinator(O1, StaticRouter([A, B], owners=2), TxConfig.from_dict({"locking": "pessimistic"}))
        tx = co.begin(0.0)
        out = co.lock(tx, [b"k0", b"k1"], 0.0)
        # primaries one at a time, in address order: B only once A granted its keys
        assert [(o.dest, o.message) for o in out if isinstance(o, TxSend)] == [(A, TxLock(tx, 1, 1, 1, (b"k0",)))]
        with pytest.raises(ValueError, match="still waits"):
            co.commit(tx, {}, 0.0)
        out = co.on_message(A, TxVote(tx, 1, 1, YES, 1), 0.5)
        assert [(o.dest, o.message) for o in out if isinstance(o, TxSend)] == [(B, TxLock(tx, 1, 1, 1, (b"k1",)))]
        assert co.on_message(B, TxVote(tx, 1, 1, YES, 1), 0.5) == [TxLocked(tx, 1, True)]
        assert co.lock(tx, [b"k0"], 0.6) == [TxLocked(tx, 2, True)]  # held already
        out = co.commit(tx, {b"k0": b"x"}, 1.0)
        preps = {o.dest: o.message for o in out if isinstance(o, TxSend)}
        assert preps[B].lock_keys == (b"k1",)  # type: ignore[union-attr]  # read-locked keys stay locked
        # a refused lock request rolls back
        tx2 = co.begin(2.0)
        co.lock(tx2, [b"k0"], 2.0)
        out = co.on_message(A, TxVote(tx2, 1, 1, NO, 1, (), "lock timeout on key b'k0'"), 3.0)
        assert out[0] == TxLocked(tx2, 1, False, "lock timeout on key b'k0'")
        assert isinstance(out[1], TxOutcome) and not out[1].committed
        with pytest.raises(ValueError, match="optimistic"):
            co.lock(co.begin(4.0, "optimistic"), [b"k0"], 4.0)

    def test_mixed_outcome_is_reported(self) -> None:
        co = TxCoordinator(O1, StaticRouter([A], owners=1))
        tx = co.begin(0.0)
        co.commit(tx, {b"k0": b"x"}, 0.0)
        co.on_message(A, TxVote(tx, 1, 0, YES, 1, ((b"k0", make_version(1, 1)),)), 1.0)
        (outcome,) = co.on_message(A, TxAck(tx, 1, ACK_ROLLED_BACK, 1), 2.0)
        assert isinstance(outcome, TxOutcome) and outcome.committed and outcome.mixed

    def test_empty_transaction_commits_locally(self) -> None:
        co = TxCoordinator(O1, StaticRouter([A]))
        tx = co.begin(0.0)
        assert co.commit(tx, {}, 0.0) == [TxOutcome(tx, True, "", 1)]
        tx = co.begin(0.0)
        assert co.rollback(tx, 0.0) == [TxOutcome(tx, False, "rolled back by the client", 1)]
        assert co.pending() == []


# -- wire format ---------------------------------------------------------------------------------------------------

T1 = TxId(O1, 7)
ALL: list[TxMessage] = [
    TxLock(T1, 1, 2, 3, (b"a", b"b")),
    TxPrepare(T1, 1, 3, (b"a",), ((b"a", b"x"), (b"b", None)), ((b"a", 0),)),
    TxPrepare(T1, 2, 3, (), (), ()),
    TxPrepare(T1, 2, 3, (b"a",), ((b"a", b"x"),), ((b"a", 0),), False),  # optimistic: never waits
    TxVote(T1, 1, 0, YES, 3, ((b"a", make_version(3, 1)),), ""),
    TxVote(T1, 1, 2, NO, 3, (), "lock timeout"),
    TxCommit(T1, 1, 3, ((b"a", make_version(3, 1), b"x"), (b"b", make_version(3, 2), None))),
    TxRollback(T1, 1, 3),
    TxCommit(T1, 2, 3, (), True),  # a resolver's
    TxRollback(T1, 2, 3, True),
    TxAck(T1, 1, ACK_RETRY, 4),
    TxLockInfo(
        3,
        (1, 5),
        (
            TxRecordInfo(T1, 1, INFO_PREPARED, True, (b"a",), ((b"a", b"x"),), ((b"a", make_version(3, 1)),)),
            TxRecordInfo(TxId(O2, 1), 1, INFO_ACTIVE, False, (b"c",), (), ()),
        ),
    ),
    TxReportRequest(5, (T1, TxId(O2, 1)), (A, B)),
    TxReportRequest(6),
    TxReportAnswer(
        5,
        (
            TxReportInfo(T1, 1, 2, True, False, ((b"a", b"x"), (b"b", None)), ((b"a", make_version(3, 1)),), (A, O1)),
            TxReportInfo(TxId(O2, 1), -1, 0, False, False, (), (), ()),
            TxReportInfo(TxId(O2, 2), 2, 1, False, True, (), (), (B,)),
        ),
    ),
]


def raw_payload(*messages: list[object]) -> bytes:
    return msgpack.packb([TX_FORMAT_VERSION, list(messages)], use_bin_type=True)


class TestWire:
    def test_round_trip(self) -> None:
        assert decode_tx_payload(encode_tx_payload(ALL)) == ALL

    def test_prepare_without_the_wait_field_waits_and_long_reasons_are_cut(self) -> None:
        # an older sender's prepare (7 items) keeps the old, waiting behaviour
        (msg,) = decode_tx_payload(raw_payload([TX_PREPARE, T1.to_wire(), 1, 3, [b"a"], [], [[b"a", 0]]]))
        assert isinstance(msg, TxPrepare) and msg.wait is True
        # a reason naming a long key is cut to what a receiver accepts instead of making it refuse the payload
        (vote,) = decode_tx_payload(encode_tx_payload([TxVote(T1, 1, 0, NO, 3, (), "conflict: " + "k" * 5000)]))
        assert isinstance(vote, TxVote) and len(vote.reason) == 512 and vote.reason.startswith("conflict: k")

    @pytest.mark.parametrize(
        ("raw", "field"),
        [
            ([TX_PREPARE, T1.to_wire(), 1, 3, [b"a"], [[b"a", b"x"]], [[b"b", 0]]], r"messages\[0\].reads\[0\].key"),
            ([TX_PREPARE, T1.to_wire(), 1, 3, [b"a", b"a"], [], []], r"messages\[0\].lock_keys: a key is listed twice"),
            ([TX_PREPARE, T1.to_wire(), 1, 3, [], [[b"a", 5]], []], r"messages\[0\].writes\[0\].value"),
            ([TX_PREPARE, T1.to_wire(), -1, 3, [], [], []], r"messages\[0\].attempt"),
            ([TX_PREPARE, [["h", 1, 1], "x"], 1, 3, [], [], []], r"messages\[0\].tx.seq"),
            ([TX_PREPARE, [["h", 70000, 1], 1], 1, 3, [], [], []], r"messages\[0\].tx.origin.port"),
            ([21, T1.to_wire(), 1, 3], r"messages\[0\]: expected 7 or 8 items"),
            ([TX_PREPARE, T1.to_wire(), 1, 3, [], [], [], 1], r"messages\[0\].wait"),
            ([TX_PREPARE, T1.to_wire(), 1, 3, [], [], [], True, 0], r"messages\[0\]: 9 items exceed"),
            ([22, T1.to_wire(), 1, 0, 7, 3, [], ""], r"messages\[0\].code"),
            ([22, T1.to_wire(), 1, 0, 0, 3, [[b"a", 0]], ""], r"messages\[0\].versions\[0\].version"),
            ([22, T1.to_wire(), 1, 0, 0, 3, [], "x" * 600], r"messages\[0\].reason"),
            ([23, T1.to_wire(), 1, 3, [[b"a", 1, b"x"], [b"a", 2, b"y"]]], r"messages\[0\].writes: a key is written"),
            ([23, T1.to_wire(), 1, 3, [[b"a", 2**63, b"x"]]], r"messages\[0\].writes\[0\].version"),
            ([23, T1.to_wire(), 1, 3, [], 1], r"messages\[0\].resolved"),
            ([23, T1.to_wire(), 1, 3], r"messages\[0\]: expected 5 or 6 items"),
            ([24, T1.to_wire(), 1, 3, "yes"], r"messages\[0\].resolved"),
            ([24, T1.to_wire(), 1, 3, True, 0], r"messages\[0\]: 6 items exceed"),
            ([25, T1.to_wire(), 1, 1, 3], r"messages\[0\].code: 1 is not an acknowledgement code"),
            ([20, T1.to_wire(), 1, 0, 3, [b"a"]], r"messages\[0\].request"),
            ([26, 3, [1, 1], []], r"messages\[0\].segments: a segment is listed twice"),
            (
                [26, 3, [1], [[T1.to_wire(), 1, 0, False, [b"a"], [[b"a", b"x"]], []]]],
                r"records\[0\].writes: an active",
            ),
            ([26, 3, [1], [[T1.to_wire(), 1, 1, 1, [b"a"], [], []]]], r"records\[0\].in_doubt"),
            ([28, 1, [T1.to_wire(), T1.to_wire()], []], r"messages\[0\].txs: a transaction is listed twice"),
            ([28, -1, [], []], r"messages\[0\].request_id"),
            ([28, 1, [[["h", 1, 1], -2]], []], r"messages\[0\].txs\[0\].seq"),
            ([28, 1, [], [A.to_wire(), A.to_wire()]], r"messages\[0\].members: a member is listed twice"),
            ([28, 1, []], r"messages\[0\]: expected 4 items"),
            ([29, 1, [[T1.to_wire(), 7, 1, True, False, [], [], []]]], r"reports\[0\].state"),
            ([29, 1, [[T1.to_wire(), -1, 0, False, False, [[b"a", b"x"]], [], []]]], r"reports\[0\].state: a trans"),
            ([29, 1, [[T1.to_wire(), 1, 1, True, 0, [], [], []]]], r"reports\[0\].deciding"),
            ([29, 1, [[T1.to_wire(), 1, 1, True, False, [], [], [A.to_wire(), A.to_wire()]]]], r"views: a member is"),
            ([29, 1, [[T1.to_wire(), 1, 1, True, False, [], [], [["h", 70000, 1]]]]], r"reports\[0\].views\[0\]"),
            ([29, 1, [[T1.to_wire(), 1, 1, True, False, [], [[b"a", 0]], []]]], r"reports\[0\].versions\[0\]"),
            ([29, 1, [[T1.to_wire(), 1, 1, True, False, [], [], []]] * 2], r"reports: a transaction is reported"),
            ([29, 1, [[T1.to_wire(), 1, 1, True, False, [], []]]], r"reports\[0\]: expected 8 items"),
            ([99], r"messages\[0\].type: unknown"),
            ("x", r"messages\[0\]: expected a non-empty list"),
        ],
    )
    def test_bad_fields_are_named(self, raw: list[object], field: str) -> None:
        with pytest.raises(WireError, match=field):
            decode_tx_payload(raw_payload(raw))

    def test_frame_level_errors(self) -> None:
        with pytest.raises(WireError, match=r"tx\.version"):
            decode_tx_payload(msgpack.packb([99, []]))
        with pytest.raises(WireError, match="not valid msgpack"):
            decode_tx_payload(b"\xc1")
        with pytest.raises(WireError, match="exceed the limit"):
            decode_tx_payload(encode_tx_payload(ALL), TxLimits(max_payload_bytes=10))
        with pytest.raises(WireError, match=rf"tx\.messages: {len(ALL)} items exceed"):
            decode_tx_payload(encode_tx_payload(ALL), TxLimits(max_messages=8))
        with pytest.raises(WireError, match=r"keys\[0\]: 1 bytes exceed"):
            decode_tx_payload(encode_tx_payload([ALL[0]]), TxLimits(max_key_bytes=0))
        with pytest.raises(WireError, match="tx: expected bytes"):
            decode_tx_payload("text")  # type: ignore[arg-type]

    @given(st.data())
    @settings(max_examples=300 * EXAMPLES_SCALE, deadline=None, derandomize=True, database=None)
    def test_mutated_payloads_raise_only_wire_errors(self, data: st.DataObject) -> None:
        blob = bytearray(encode_tx_payload(ALL))
        for _ in range(data.draw(st.integers(1, 4))):
            i = data.draw(st.integers(0, len(blob) - 1))
            blob[i] = data.draw(st.integers(0, 255))
        with contextlib.suppress(WireError):  # anything else escaping fails the test
            decode_tx_payload(bytes(blob))


# -- many transactions over an in-memory network --------------------------------------------------------------------

OWNERS = [A, B, C, D]
ORIGINATORS = [O1, O2, O3]
KEYS = [b"k%d" % i for i in range(6)]


class Cluster:
    """Owners with a TxTable each, originators with a TxCoordinator each, and a network that delivers in a
    random order, may lose and duplicate messages (resends make up for losses), encodes every message."""

    def __init__(self, rng: random.Random, *, loss: float = 0.0, dup: float = 0.0, owners: int = 2) -> None:
        self.rng = rng
        self.loss = loss
        self.dup = dup
        self.now = 0.0
        self.router = StaticRouter(OWNERS, owners)
        cfg = TxConfig.from_dict({"lock_timeout": "4s", "tx_timeout": "20s", "resend_interval": "1s"})
        self.stores = {a: Store() for a in OWNERS}
        self.tables = {
            a: TxTable(a, cfg, segment_of=seg, version_of=s.version_of, stamp=s.stamp, apply=s.apply, topology_id=1)
            for a, s in self.stores.items()
        }
        self.coords = {o: TxCoordinator(o, self.router, cfg) for o in ORIGINATORS}
        self.view = OWNERS + ORIGINATORS
        for t in self.tables.values():
            t.on_view(self.view, 0.0)
        for co in self.coords.values():
            co.on_view(self.view, 0.0)
        self.flight: list[tuple[Address, Address, bytes]] = []
        self.outcomes: dict[TxId, TxOutcome] = {}
        self.plans: dict[TxId, tuple[bytes, ...]] = {}  # the keys each transaction increments
        self.crashed: set[Address] = set()
        self.rebalances = 0

    def applied_on(self, tx: TxId) -> set[Address]:
        return {a for a, s in self.stores.items() if any(t == tx for t, _ in s.applied)}

    # -- clients: each transaction increments its keys by one

    def start(self, origin: Address, keys: Sequence[bytes], mode: LockingMode) -> None:
        co = self.coords[origin]
        tx = co.begin(self.now, mode)
        self.plans[tx] = tuple(keys)
        if mode == LockingMode.PESSIMISTIC:
            self.process(origin, co.lock(tx, keys, self.now))
        else:
            self.finish_client(origin, tx)

    def finish_client(self, origin: Address, tx: TxId) -> None:
        """Read each key from its primary and write it plus one, with the versions read."""
        writes: dict[bytes, bytes | None] = {}
        reads: dict[bytes, int] = {}
        for key in self.plans[tx]:
            version, value = self.stores[self.router.owners_of(key)[0]].data.get(key, (0, b"0"))
            reads[key] = version
            writes[key] = b"%d" % (int(value or b"0") + 1)
        self.process(origin, self.coords[origin].commit(tx, writes, self.now, reads))

    # -- the network

    def process(self, src: Address, outputs: list[TxOutput]) -> None:
        for o in outputs:
            if isinstance(o, TxSend):
                if self.rng.random() < self.loss and not isinstance(o.message, TxLockInfo):
                    continue
                blob = encode_tx_payload([o.message])
                self.flight.append((src, o.dest, blob))
                if self.rng.random() < self.dup:
                    self.flight.append((src, o.dest, blob))
            elif isinstance(o, TxOutcome):
                assert o.tx not in self.outcomes, f"two outcomes for {o.tx}"
                assert not o.mixed, o
                self.outcomes[o.tx] = o
            elif isinstance(o, TxLocked) and o.ok:
                self.finish_client(src, o.tx)

    def deliver(self, i: int) -> None:
        src, dest, blob = self.flight.pop(i)
        if dest in self.crashed or dest == RESOLVER:
            return
        (msg,) = decode_tx_payload(blob)
        if dest in self.tables:
            self.process(dest, self.tables[dest].on_message(src, msg, self.now))
        else:
            self.process(dest, self.coords[dest].on_message(src, msg, self.now))

    def advance(self, dt: float) -> None:
        self.now += dt
        for a, t in self.tables.items():
            d = t.next_deadline()
            if d is not None and d <= self.now:
                self.process(a, t.tick(self.now))
        for o, co in self.coords.items():
            d = co.next_deadline()
            if o not in self.crashed and d is not None and d <= self.now:
                self.process(o, co.tick(self.now))

    def next_deadline(self) -> float | None:
        ds = [t.next_deadline() for t in self.tables.values()]
        ds += [co.next_deadline() for o, co in self.coords.items() if o not in self.crashed]
        return min((d for d in ds if d is not None), default=None)

    def crash(self, origin: Address) -> None:
        """The originator dies: each of its messages in flight arrives or not, then everyone sees the view."""
        self.crashed.add(origin)
        self.flight = [f for f in self.flight if f[0] != origin or self.rng.random() < 0.5]
        self.view = [m for m in self.view if m != origin]
        for a, t in self.tables.items():
            self.process(a, t.on_view(self.view, self.now))
        for o, co in self.coords.items():
            if o not in self.crashed:
                self.process(o, co.on_view(self.view, self.now))

    def rebalance(self) -> None:
        """A new topology with the owners shuffled, installed everywhere at once (the skew between members'
        installs and the grid's phases are for the grid-tx simulation). As GridNode will do it: each member
        installs it (old-topology waits answer RETRY), new owners copy the data of their new keys, each new
        primary blocks its new segments until the old primary's lock information arrives (a message, in
        flight like any other, never lost: the real transfer is reliable), a promoted backup promotes, and
        members that no longer own a segment drop its locks."""
        old = {k: self.router.owners_of(k) for k in KEYS}
        self.router.members = self.rng.sample(OWNERS, len(OWNERS))
        self.router.topology_id += 1
        t = self.router.topology_id
        for a, tab in self.tables.items():
            self.stores[a].topology_id = t
            self.process(a, tab.on_topology(t, self.now))
        for key in KEYS:
            new = self.router.owners_of(key)
            source = self.stores[old[key][0]]
            entry = source.data.get(key)
            for o in new:
                if o not in old[key] and entry is not None:
                    self.stores[o].data[key] = max(self.stores[o].data.get(key, (0, None)), entry)
        moved: dict[tuple[Address, Address], set[int]] = {}
        for key in KEYS:
            old_p, new_p = old[key][0], self.router.owners_of(key)[0]
            if old_p != new_p:
                moved.setdefault((old_p, new_p), set()).add(seg(key))
        for (old_p, new_p), segs in sorted(moved.items()):
            self.tables[new_p].block_segments(segs)
            if new_p in {o for k in KEYS if seg(k) in segs for o in old[k]}:
                self.tables[new_p].promote(segs)
            self.process(old_p, self.tables[old_p].push_lock_info(segs, new_p))
        # Then members drop the locks of segments they own no more (their information was just pushed).
        for a, tab in self.tables.items():
            lost = {seg(k) for k in KEYS if a in old[k] and a not in self.router.owners_of(k)}
            self.process(a, tab.drop_segments(lost, self.now))
        for o, co in self.coords.items():
            if o not in self.crashed:
                self.process(o, co.on_topology(self.now))
        self.rebalances += 1

    def settle(self) -> None:
        """Heal the network and run until nothing is in flight and no coordinator has work left."""
        self.loss = self.dup = 0.0
        for _ in range(100_000):
            if self.flight:
                self.deliver(self.rng.randrange(len(self.flight)))
                continue
            if any(co.pending() for o, co in self.coords.items() if o not in self.crashed):
                d = self.next_deadline()
                assert d is not None, "a coordinator has work but no deadline"
                self.advance(max(d - self.now, 0.0))
                continue
            return
        raise AssertionError("the cluster did not settle")

    def resolve_in_doubt(self) -> None:
        """Play the resolver: decide each in-doubt transaction from every member's report, then send one
        self-contained decision to every current owner of its keys and every member that knows it. (Only
        resolving the prepared records misses owners that got the keys by a rebalance after the prepare:
        the property test found such a replica without the committed write.)"""
        doubtful = sorted({d.tx for t in self.tables.values() for d in t.in_doubt()})
        for tx in doubtful:
            reports = [t.report(tx) for t in self.tables.values()]
            # Every member's report, not only the current owners': after a rebalance the participants of the
            # prepare may have moved on (a member that never knew it reports None, which changes nothing).
            decision = termination_decision([r.state for r in reports])
            assert decision is not None
            writes: dict[bytes, bytes | None] = {}
            versions: dict[bytes, int] = {}
            for r in reports:
                writes.update(r.writes)
                versions.update(r.versions)
            attempt = max(r.attempt for r in reports)
            knows = {a for a, t in self.tables.items() if t.state_of(tx) is not None}
            for dest in sorted(knows | {o for k in writes for o in self.router.owners_of(k)}):
                if decision:
                    mine = tuple(
                        (k, versions[k], v) for k, v in sorted(writes.items()) if dest in self.router.owners_of(k)
                    )
                    msg: TxMessage = TxCommit(tx, attempt, self.router.topology_id, mine)
                else:
                    msg = TxRollback(tx, attempt, self.router.topology_id)
                self.process(dest, self.tables[dest].on_message(RESOLVER, msg, self.now))
        self.settle()

    # -- the checks

    def check(self) -> None:
        for tx, keys in self.plans.items():
            owners = {o for k in keys for o in self.router.owners_of(k)}
            applied_on = self.applied_on(tx)
            outcome = self.outcomes.get(tx)
            if tx.origin not in self.crashed:
                assert outcome is not None, f"{tx}: no outcome"
            # Atomicity: on every owner of its keys or on none (with rebalances, owners that got the keys later
            # have the writes by copy, and the values below tell).
            if not self.rebalances:
                assert applied_on in (set(), owners), f"{tx}: applied on {applied_on} of {owners}"
            if outcome is not None:
                assert bool(applied_on) == outcome.committed, f"{tx}: outcome {outcome}, applied on {applied_on}"
            # Each write applied at most once per member.
            for s in self.stores.values():
                keys_applied = [k for t, ws in s.applied if t == tx for k, _, _ in ws]
                assert len(keys_applied) == len(set(keys_applied)), f"{tx}: applied twice: {keys_applied}"
        # Isolation (no lost update): each key's value counts the committed transactions that incremented it,
        # and every owner holds the same version and value.
        for key in KEYS:
            committed = sum(1 for tx, keys in self.plans.items() if key in keys and self.applied_on(tx))
            if not committed:
                continue
            entries = {self.stores[o].data.get(key, (0, b"0")) for o in self.router.owners_of(key)}
            assert len(entries) == 1, f"{key!r}: owners differ: {entries}"
            ((_, value),) = entries
            assert int(value or b"0") == committed, f"{key!r}: {value!r} after {committed} committed increments"
        # No lock left, nothing unfinished.
        for a, t in self.tables.items():
            assert t.locks.empty(), f"{a}: locks left"
            assert t.active() == [], f"{a}: unfinished {t.active()}"
            assert t.in_doubt() == []


def run_random(
    rng: random.Random,
    *,
    txs: int,
    loss: float,
    dup: float,
    crash: bool,
    pessimistic: float,
    jumps: Sequence[float] = (0.01, 0.3, 1.0, 5.0),
    rebalances: int = 0,
) -> Cluster:
    """Start ``txs`` transactions at random steps from random originators, deliver in random order, jump
    time (lock and transaction timeouts fire when a jump beats the deliveries), maybe crash an originator;
    then heal, settle, resolve what is in doubt, and check."""
    cl = Cluster(rng, loss=loss, dup=dup)
    todo = txs
    crash_at = rng.randrange(txs * 6 + 1) if crash else -1
    rebalance_at = {rng.randrange(txs * 20 + 1) for _ in range(rebalances)}
    for step in range(txs * 40):
        if step == crash_at:
            cl.crash(rng.choice(ORIGINATORS))
        if step in rebalance_at:
            cl.rebalance()
        r = rng.random()
        alive = [o for o in ORIGINATORS if o not in cl.crashed]
        if todo and r < 0.15 and alive:
            todo -= 1
            keys = rng.sample(KEYS, rng.randint(1, 3))
            mode = LockingMode.PESSIMISTIC if rng.random() < pessimistic else LockingMode.OPTIMISTIC
            cl.start(rng.choice(alive), keys, mode)
        elif cl.flight and r < 0.9:
            cl.deliver(rng.randrange(len(cl.flight)))
        else:
            cl.advance(rng.choice(jumps))
    cl.settle()
    cl.resolve_in_doubt()
    cl.check()
    return cl


class TestManyTransactions:
    # A seed for the run's own generator: hypothesis' randoms() draws every call from its data, which is
    # slow at this length; the seed still shrinks the transaction count and the fault switch.
    @given(st.integers(0, 2**32 - 1), st.integers(1, 12), st.booleans())
    @settings(max_examples=100 * EXAMPLES_SCALE, deadline=None, derandomize=True, database=None)
    def test_property_atomic_isolated_no_lock_left(self, seed: int, txs: int, faulty: bool) -> None:
        run_random(
            random.Random(seed),
            txs=txs,
            loss=0.1 if faulty else 0.0,
            dup=0.1 if faulty else 0.0,
            crash=False,
            pessimistic=0.5,
        )

    @given(st.integers(0, 2**32 - 1), st.integers(1, 10))
    @settings(max_examples=100 * EXAMPLES_SCALE, deadline=None, derandomize=True, database=None)
    def test_property_originator_crash_resolves_consistently(self, seed: int, txs: int) -> None:
        run_random(random.Random(seed), txs=txs, loss=0.05, dup=0.05, crash=True, pessimistic=0.3)

    @given(st.integers(0, 2**32 - 1), st.integers(1, 10), st.integers(1, 3), st.booleans())
    @settings(max_examples=100 * EXAMPLES_SCALE, deadline=None, derandomize=True, database=None)
    def test_property_rebalancing_keeps_locks_and_writes(self, seed: int, txs: int, moves: int, crash: bool) -> None:
        run_random(random.Random(seed), txs=txs, loss=0.05, dup=0.05, crash=crash, pessimistic=0.4, rebalances=moves)

    # Runs of the rebalancing property test that found bugs (docs/grid-transactions.md, "Tests"), replayed:
    # (seed, transactions, rebalances, originator crash).
    @pytest.mark.parametrize(
        ("seed", "txs", "moves", "crash"),
        [
            (0, 1, 1, False),  # a repeated commit did not apply the keys a new topology gave the member
            (3, 4, 1, True),  # the decision skipped the new primary holding a failed lock request's keys
            (780, 2, 3, False),  # late lock information at a member that was no longer primary
            (26667210, 5, 1, False),  # a new attempt reused an inherited, shared lock: lost update
            (20674, 4, 2, False),  # a prepare arriving after its attempt's rollback re-opened it
            (196436, 3, 2, True),  # resolution skipped an owner gained by a rebalance
            (809379, 3, 3, True),  # versions stamped for inherited keys: two commits, one version
            (23325, 3, 3, False),  # a new owner refused a commit after an earlier failed lock request
            (10425805, 9, 3, True),  # a crashed originator's late request re-opened a rolled-back record
            (433541, 7, 3, True),  # a RETRY answer counted as an ack under the newer topology
            (140990, 2, 1, True),  # an old-topology commit released an imported lock without its write
            (159, 4, 3, True),  # a forwarded push of backup locks let four requests of one attempt share a key
            (4611027, 3, 3, False),  # a key locked here once, dropped with its segment, not held when pushed back
        ],
    )
    def test_regressions(self, seed: int, txs: int, moves: int, crash: bool) -> None:
        run_random(random.Random(seed), txs=txs, loss=0.05, dup=0.05, crash=crash, pessimistic=0.4, rebalances=moves)

    # Found by a longer random search (seeds with their own fault mix), replayed the same way:
    # (seed, transactions, rebalances, crash, loss and duplication, share of pessimistic transactions).
    @pytest.mark.parametrize(
        ("seed", "txs", "moves", "crash", "loss", "pessimistic"),
        [
            # found by the scale-100 search; fixed by the import and forwarding rules below
            pytest.param(896, 2, 3, True, 0.05, 0.4, id="896"),
            # a committed record released an imported lock without its write
            pytest.param(561, 8, 3, True, 0.15, 0.6422206272677251, id="561"),
            # import skipped for a record committed as a backup of other keys
            pytest.param(2301, 10, 2, True, 0.15, 0.041283574420537206, id="2301"),
            # an old primary pushed a segment it still waited for
            pytest.param(4824, 11, 2, True, 0.05, 0.9353853682494977, id="4824"),
            # locks dropped before they were passed on
            pytest.param(12500, 4, 3, True, 0.05, 0.86856516486987, id="12500"),
            # a lock held for a write without version, kept after a later push brought the version
            pytest.param(6375, 11, 3, False, 0.05, 0.18389413160029788, id="6375"),
            # a record known only from a forwarded push, of a later topology, left prepared for good
            pytest.param(8957, 12, 3, False, 0.0, 0.6849043544634881, id="8957"),
            # a too broad fix of 159 (ignore every pushed record of an attempt the importer takes part in)
            pytest.param(42, 5, 3, False, 0.15, 0.3967153333030232, id="42"),
            pytest.param(648, 8, 3, False, 0.0, 0.6122396215812252, id="648"),
            # a promoted backup lock (a commit not arrived yet) shared with an imported pessimistic lock: the
            # prepare counted the shared key as held and validated against the old value (lost update)
            pytest.param(641, 2, 2, True, 0.15, 0.951683155335479, id="641"),
        ],
    )
    def test_search_regressions(
        self, seed: int, txs: int, moves: int, crash: bool, loss: float, pessimistic: float
    ) -> None:
        run_random(
            random.Random(seed), txs=txs, loss=loss, dup=loss, crash=crash, pessimistic=pessimistic, rebalances=moves
        )

    def test_search_seed_9745(self) -> None:
        """Was known open: the originator crashed while its commit was in flight, after a rebalance gave k4 a
        new owner whose copy was taken before the old primary applied the commit; the other owners committed,
        nobody was in doubt, and the new owner lacked the committed write for good. Since new owners that
        voted on none of a commit's keys get it only once a voter answered (TxCoordinator._send_completion,
        simulation seed 1461) the run takes another path and the owners agree. The gap it showed (resolution
        after an originator's departure does not cover committed transactions, docs/grid-transactions.md,
        "Next") is not closed by that in general; this seed stays as a replay."""
        run_random(
            random.Random(9745), txs=7, loss=0.0, dup=0.0, crash=True, pessimistic=0.3676201226539725, rebalances=3
        )

    @pytest.mark.slow
    def test_search(self) -> None:
        """The longer random search (scripts/test --slow): each seed draws its own mix of transactions,
        rebalances, crash, loss and duplication. GRID_TX_SEARCH=N sets how many seeds (default 3000)."""
        failures = []
        for seed in range(int(os.environ.get("GRID_TX_SEARCH", "3000"))):
            r = random.Random(seed * 7919)
            txs, moves, crash = r.randint(1, 12), r.randint(0, 3), r.random() < 0.5
            loss, pessimistic = r.choice([0, 0.05, 0.15]), r.random()
            try:
                run_random(
                    random.Random(seed),
                    txs=txs,
                    loss=loss,
                    dup=loss,
                    crash=crash,
                    pessimistic=pessimistic,
                    rebalances=moves,
                )
            except AssertionError as exc:
                failures.append(f"seed {seed} ({txs}, {moves}, {crash}, {loss}, {pessimistic}): {exc}")
        assert not failures, "\n".join(failures[:10])

    def test_fixed_seeds_commit_most_transactions(self) -> None:
        # Not only rollbacks: with deliveries faster than the timeouts, most transactions commit although they
        # contend for 6 keys (the losers are validation failures and cross-member lock cycles broken by timeouts).
        committed = total = 0
        for seed in range(20):
            cl = run_random(
                random.Random(seed), txs=8, loss=0.0, dup=0.0, crash=False, pessimistic=0.5, jumps=(0.01, 0.1)
            )
            committed += sum(o.committed for o in cl.outcomes.values())
            total += len(cl.outcomes)
        assert total == 160
        assert committed * 5 >= total * 2, f"{committed} of {total} committed"

    def test_crash_between_prepare_and_commit_leaves_in_doubt_until_resolved(self) -> None:
        cl = Cluster(random.Random(1))
        cl.start(O1, [b"k0", b"k1"], LockingMode.OPTIMISTIC)
        # deliver the prepares and the votes, but not the commits
        while cl.flight:
            _, _, blob = cl.flight[0]
            if isinstance(decode_tx_payload(blob)[0], TxCommit):
                break
            cl.deliver(0)
        assert cl.flight and all(isinstance(decode_tx_payload(b)[0], TxCommit) for _, _, b in cl.flight)
        cl.flight.clear()  # O1 dies before any commit leaves
        cl.crash(O1)
        doubt = {a: [d.tx for d in t.in_doubt()] for a, t in cl.tables.items()}
        (tx,) = cl.plans
        participants = {o for k in cl.plans[tx] for o in cl.router.owners_of(k)}
        assert {a for a, txs in doubt.items() if txs == [tx]} == participants
        # another transaction on k0 cannot get the lock meanwhile: the in-doubt one holds it
        cl.start(O2, [b"k0"], LockingMode.OPTIMISTIC)
        cl.settle()
        (other,) = [t for t in cl.plans if t != tx]
        assert cl.outcomes[other].committed is False and cl.outcomes[other].reason.startswith("conflict:")
        cl.resolve_in_doubt()  # all prepared, none committed: rolled back everywhere
        assert cl.applied_on(tx) == set()
        cl.check()
