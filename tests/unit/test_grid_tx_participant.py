"""The participant's transaction table (grid/tx/participant.py): prepare, votes, decisions and their
duplicates, validation, topologies, views and in-doubt transactions, resolution, expiry, lock information."""

from __future__ import annotations

import pytest
from groupcluster.grid.store import make_version
from groupcluster.grid.tx.coordinator import TxCoordinator
from groupcluster.grid.tx.messages import (
    ACK_COMMITTED,
    ACK_OK,
    ACK_RETRY,
    ACK_ROLLED_BACK,
    INFO_ACTIVE,
    INFO_PREPARED,
    NO,
    VOTE_RETRY,
    YES,
    TxAck,
    TxCommit,
    TxLock,
    TxLockInfo,
    TxPrepare,
    TxRecordInfo,
    TxRollback,
    TxVote,
    decode_tx_payload,
    encode_tx_payload,
)
from groupcluster.grid.tx.outputs import TxOutcome, TxSend
from groupcluster.grid.tx.records import TxState

from .grid_tx_support import O1, O2, RESOLVER, A, B, C, D, StaticRouter, prepare, seg, sends, table, tid


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

    def test_an_in_doubt_participant_takes_the_originators_late_rollback(self) -> None:
        # The vote was lost and the participant's side formed a view without the originator (in doubt); the
        # views merged again and the originator, timed out, rolled back. Ignored as a late decision, its
        # rollback was resent unanswered until an operator resolved the member: the originator stayed pending.
        co = TxCoordinator(O1, StaticRouter([A], owners=1))
        t, _ = table(A)
        tx = co.begin(0.0)
        (prep,) = sends(co.commit(tx, {b"k1": b"x"}, 0.0))
        (vote,) = sends(t.on_message(O1, prep, 0.1))
        assert isinstance(vote, TxVote) and vote.code == YES  # lost on its way
        t.on_view([A, B], 1.0)
        t.on_view([A, B, O1], 2.0)
        assert [d.tx for d in t.in_doubt()] == [tx]
        out = co.tick(31.0)
        assert [o.committed for o in out if isinstance(o, TxOutcome)] == [False]
        (rollback,) = sends(out)
        assert isinstance(rollback, TxRollback) and not rollback.resolved
        (ack,) = sends(t.on_message(O1, rollback, 31.1))
        assert ack == TxAck(tx, 1, ACK_OK, 1)
        assert t.in_doubt() == [] and t.state_of(tx) == TxState.ROLLED_BACK
        assert t.locks.empty()
        assert co.on_message(A, ack, 31.2) == [] and co.pending() == []
        # A prepare of that attempt arriving late (duplicated) locks nothing.
        (late,) = sends(t.on_message(O1, prep, 32.0))
        assert isinstance(late, TxVote) and late.code == NO
        assert t.locks.empty()

    def test_an_in_doubt_participant_keeps_a_later_attempt_on_an_earlier_attempts_rollback(self) -> None:
        t, _ = table(A)
        tx = tid(1)
        t.on_message(O1, prepare(tx, [b"k1"], attempt=2), 0.0)
        t.on_view([A, B], 1.0)
        # the rollback of the attempt the originator gave up before this one: acknowledged, nothing undone
        assert sends(t.on_message(O1, TxRollback(tx, 1, 1), 2.0)) == [TxAck(tx, 1, ACK_OK, 1)]
        assert [d.tx for d in t.in_doubt()] == [tx]
        assert t.locks.held_by(tx) == {b"k1"}
        # and its commit still does not count (a resolver may have rolled it back everywhere)
        assert sends(t.on_message(O1, TxCommit(tx, 2, 1, ((b"k1", make_version(1, 1), b"x"),)), 3.0)) == []
        assert [d.tx for d in t.in_doubt()] == [tx]

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

    def test_a_primary_that_stays_a_backup_demotes_its_locks_after_the_push(self) -> None:
        # A backup in doubt about tx became the primary of k1's and k2's segments (its backup locks promoted),
        # then a new primary took k2's segment while it stayed a backup there: it pushes the lock information
        # and keeps k2 as a backup lock only. A resolved commit that knows k1's version only (k2's primary has
        # it) then leaves nothing locked; kept as a lock, k2 waited for a version that never comes here.
        t, store = table(B)
        tx = tid(1)
        k1, k2 = b"k1", b"k2"
        t.on_message(O1, prepare(tx, [k1, k2], lock=()), 0.0)
        t.on_view([A, B, C, D], 1.0)  # the originator is gone: in doubt
        t.promote([seg(k1), seg(k2)])
        assert t.locks.held_by(tx) == {k1, k2}
        (push,) = sends(t.push_lock_info([seg(k2)], A))
        assert isinstance(push, TxLockInfo) and [r.lock_keys for r in push.records] == [(k2,)]
        assert t.demote([seg(k2)], 2.0) == []
        assert t.locks.held_by(tx) == {k1} and t.locks.backup_locks(tx) == {k2}
        assert [d.keys for d in t.in_doubt()] == [(k1, k2)]  # still known
        t.on_message(RESOLVER, TxCommit(tx, 1, 1, ((k1, make_version(1, 5), b"x1"),), resolved=True), 3.0)
        assert t.state_of(tx) == TxState.COMMITTED and t.locks.empty()
        assert k2 not in store.data  # k2's owners get it from its primary

    def test_a_demoted_segment_awaiting_its_lock_information_is_demoted_again_once_passed_on(self) -> None:
        # C became the primary of k1's segment and waits for A's lock information; before it comes, D becomes
        # the primary and C a backup: C passes the information on when it arrives, and keeps only backup locks.
        t, _ = table(C)
        tx = tid(1)
        k1 = b"k1"
        t.block_segments([seg(k1)])
        t.promote([seg(k1)])
        assert t.push_lock_info([seg(k1)], D) == []  # nothing to push yet: passed on once it arrives
        t.demote([seg(k1)], 1.0)
        info = TxLockInfo(1, (seg(k1),), (TxRecordInfo(tx, 1, INFO_PREPARED, False, (k1,), ((k1, b"x"),), ()),))
        out = t.import_lock_info(info, 2.0)
        assert [m.segments for m in sends(out) if isinstance(m, TxLockInfo)] == [(seg(k1),)]
        assert t.locks.held_by(tx) == frozenset() and t.locks.backup_locks(tx) == {k1}
        t.on_message(O1, TxRollback(tx, 1, 1), 3.0)
        assert t.locks.empty()

    def test_a_demoted_committed_record_keeps_no_lock(self) -> None:
        # Committed here with k2's write waiting for its version (pushed without one): the primary keeps the key
        # held until the version comes; once the segment's primary is another member, nothing here is locked.
        t, store = table(A)
        tx = tid(1, O2)
        k1, k2 = b"k1", b"k2"
        t.on_message(O2, TxCommit(tx, 1, 1, ((k1, make_version(1, 5), b"x1"),)), 0.0)
        info = TxLockInfo(1, (seg(k2),), (TxRecordInfo(tx, 1, INFO_PREPARED, True, (k2,), ((k2, b"x2"),), ()),))
        t.import_lock_info(info, 1.0)
        assert t.locks.held_by(tx) == {k2}
        t.demote([seg(k2)], 2.0)
        assert t.locks.empty() and t.state_of(tx) == TxState.COMMITTED
        # a later commit with the version still applies the write
        t.on_message(O2, TxCommit(tx, 1, 1, ((k2, make_version(1, 6), b"x2"),)), 3.0)
        assert store.data[k2] == (make_version(1, 6), b"x2")

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

    def test_a_pushed_record_of_an_abandoned_attempt_locks_nothing_where_a_later_one_committed(self) -> None:
        # tx prepared attempt 1 (k1 on this member as primary, k2 on a backup), gave it up and committed attempt
        # 2, which this member applied for k1 only (it owned no copy of k2 then). The backup of k2, cut off in
        # doubt about attempt 1, later pushes that attempt's k2 write without a version to this member as k2's
        # new primary. Attempt 1 never commits and attempt 2 brings no version for k2 here: locking k2 for a
        # version held it for good.
        t, store = table(A)
        tx = tid(1)
        k1, k2 = b"k1", b"k2"
        t.on_message(O1, prepare(tx, [k1], attempt=1), 0.0)
        t.on_message(O1, TxRollback(tx, 1, 1), 0.5)
        t.on_message(O1, prepare(tx, [k1], attempt=2), 0.6)
        t.on_message(O1, TxCommit(tx, 2, 1, ((k1, make_version(1, 7), b"x1"),)), 1.0)
        assert t.state_of(tx) == TxState.COMMITTED and t.locks.empty()
        info = TxLockInfo(1, (seg(k2),), (TxRecordInfo(tx, 1, INFO_PREPARED, True, (k2,), ((k2, b"x2"),), ()),))
        t.import_lock_info(info, 2.0)
        assert t.locks.empty()
        assert t.state_of(tx) == TxState.COMMITTED
        assert k2 not in store.data
        # a push of the committed attempt still keeps a versionless write's key until its version comes
        info2 = TxLockInfo(1, (seg(k2),), (TxRecordInfo(tx, 2, INFO_PREPARED, True, (k2,), ((k2, b"x2"),), ()),))
        t.import_lock_info(info2, 3.0)
        assert t.locks.held_by(tx) == {k2}
