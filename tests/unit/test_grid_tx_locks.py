"""The grid transaction lock table (grid/tx/locks.py): exclusive locks, FIFO hand-over, ordered acquisition,
deadlines, no-wait requests, blocked segments, shared holders, backup locks and their promotion."""

from __future__ import annotations

import pytest
from groupcluster.grid.tx.locks import LockTable

from .grid_tx_support import seg, tid


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

    def test_demoted_locks_become_backup_locks(self) -> None:
        # The primary's locks of a segment whose lock information went to a new primary, this member staying a
        # backup: known still (exported, promoted again), locking nothing, released with the transaction.
        lt = LockTable(seg)
        t1, t2 = tid(1), tid(2)
        assert lt.acquire(t1, [b"k1", b"k2"], 10.0)
        assert not lt.acquire(t2, [b"k1"], 10.0)
        assert lt.demote([seg(b"k1")]) == [t2]
        assert lt.held_by(t1) == {b"k2"} and lt.backup_locks(t1) == {b"k1"}
        assert lt.holders(b"k1") == {t2}
        assert lt.keys_in(t1, frozenset({seg(b"k1")})) == (b"k1",)
        assert lt.release(t2) == []
        lt.promote([seg(b"k1")])  # the primary once more
        assert lt.holders(b"k1") == {t1} and lt.backup_locks(t1) == frozenset()
        lt.demote([seg(b"k1")])
        assert lt.release(t1) == [] and lt.empty()

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
