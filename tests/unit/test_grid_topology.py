"""Cache topology phases, routing helpers and the coordinator's pure rebalance planner."""

from __future__ import annotations

import itertools
import os
from dataclasses import replace

import msgpack
import pytest
from groupcluster.core.address import Address
from groupcluster.core.errors import WireError
from groupcluster.grid.consistent_hash import ConsistentHash, balanced
from groupcluster.grid.rebalance import RebalancePlanner
from groupcluster.grid.topology import (
    MAX_JOINED,
    MAX_LOST,
    Availability,
    CacheTopology,
    MemberStatus,
    PartitionHandling,
    Phase,
    owner_set,
)
from hypothesis import given, settings
from hypothesis import strategies as st

# Derandomized and without the example database, so CI runs the same examples every time; GRID_HYPOTHESIS_SCALE=20
# multiplies the examples for a local search for new failures.
EXAMPLES_SCALE = int(os.environ.get("GRID_HYPOTHESIS_SCALE", "1"))

SEGS = 16


def m(i: int) -> Address:
    return Address("10.0.0.1", 7000 + i, i + 1)


def joined(n: int = 3, mode: PartitionHandling = PartitionHandling.DENY_READ_WRITES) -> RebalancePlanner:
    view = [m(i) for i in range(n)]
    p = RebalancePlanner(view, num_segments=SEGS, num_owners=2, mode=mode)
    out = p.on_statuses({x: MemberStatus(1.0, False, None) for x in view}, 0.0)
    assert [d for d, _ in out] == [None]
    return p


def confirm_all(p: RebalancePlanner) -> list[CacheTopology]:
    """Every member confirms every topology until the planner stops producing new ones."""
    seen = []
    for _ in range(20):
        t = p.topology
        assert t is not None
        out = []
        for x in t.members:
            out += p.on_confirm(x, t.topology_id)
        seen += [topo for _, topo in out]
        if not out:
            return seen
    raise AssertionError("the planner never settled")


def test_bootstrap_installs_a_balanced_topology() -> None:
    p = joined(3)
    t = p.topology
    assert t is not None and t.topology_id == 1 and t.phase == Phase.NO_REBALANCE and t.pending is None
    assert set(owner_set(t.current)) == {m(0), m(1), m(2)}
    assert t.stable_members and set(t.stable_members) == {m(0), m(1), m(2)}


def test_recovery_waits_for_every_member_or_the_timeout() -> None:
    view = [m(0), m(1)]
    p = RebalancePlanner(view, num_segments=SEGS, num_owners=2, recovery_timeout=2.0, now=10.0)
    assert p.on_statuses({m(0): MemberStatus(1.0, False, None)}, 10.5) == []
    assert p.next_deadline() == 12.0
    out = p.on_tick(12.0)
    assert out and set(owner_set(out[-1][1].current)) == {m(0)}


def test_join_walks_all_phases_with_confirmations() -> None:
    p = joined(3)
    p.on_view([m(0), m(1), m(2), m(3)], 1.0)
    out = p.on_statuses({m(3): MemberStatus(1.0, False, None)}, 1.0)
    t = out[-1][1]
    assert t.phase == Phase.READ_OLD_WRITE_ALL and t.topology_id == 2 and t.rebalance_id == 1
    assert m(3) in owner_set(t.pending) and m(3) not in owner_set(t.current)  # type: ignore[arg-type]
    assert t.segments_to_fetch(m(3)) == t.pending.segments_owned(m(3))  # type: ignore[union-attr]
    # Partial or stale confirmations do not advance.
    assert p.on_confirm(m(0), 1) == []
    for x in (m(0), m(1), m(2)):
        assert p.on_confirm(x, 2) == []
    phases = [tt.phase for tt in confirm_all(p)]
    assert phases == [Phase.READ_ALL_WRITE_ALL, Phase.READ_NEW_WRITE_ALL, Phase.NO_REBALANCE]
    final = p.topology
    assert final is not None and final.current == t.pending
    assert set(final.stable_members) == set(owner_set(final.current))


def test_routing_per_phase() -> None:
    old = balanced(None, [m(0), m(1)], {}, SEGS, 2)
    new = balanced(old.owner_map(), [m(0), m(1), m(2)], {}, SEGS, 2)
    s = next(s for s in range(SEGS) if m(2) in new.owners_of(s))
    members = (m(0), m(1), m(2))
    topo = {ph: CacheTopology(5, 1, ph, old, new, members) for ph in list(Phase)[1:]}
    both = set(old.owners_of(s)) | set(new.owners_of(s))
    for t in topo.values():
        assert set(t.write_owners(s)) == both
        assert t.write_primary(s) == old.primary_of(s)
    assert topo[Phase.READ_OLD_WRITE_ALL].read_owners(s) == old.owners_of(s)
    assert topo[Phase.READ_ALL_WRITE_ALL].read_owners(s)[: len(new.owners_of(s))] == new.owners_of(s)
    assert topo[Phase.READ_NEW_WRITE_ALL].read_owners(s) == new.owners_of(s)
    steady = CacheTopology(6, 1, Phase.NO_REBALANCE, new, None, members)
    assert steady.read_owners(s) == steady.write_owners(s) == new.owners_of(s)
    with pytest.raises(ValueError, match="pending"):
        CacheTopology(7, 1, Phase.NO_REBALANCE, new, new, members)


def test_crash_mid_rebalance_continues_the_same_rebalance_without_the_dead() -> None:
    p = joined(3)
    p.on_view([m(0), m(1), m(2), m(3)], 1.0)
    t = p.on_statuses({m(3): MemberStatus(1.0, False, None)}, 1.0)[-1][1]
    out = p.on_view([m(0), m(2), m(3)], 2.0)  # m(1), a current owner, crashes while m(3) fetches
    t2 = out[0][1]
    assert t2.phase == Phase.READ_OLD_WRITE_ALL and t2.rebalance_id == t.rebalance_id
    assert t2.topology_id > t.topology_id and m(1) not in t2.members
    for s in range(SEGS):
        assert t2.current.owners_of(s) and m(1) not in t2.current.owners_of(s)
        assert t2.pending is not None and m(1) not in t2.pending.owners_of(s)
    assert p.on_confirm(m(0), t.topology_id) == []  # old confirmations do not count
    confirm_all(p)
    final = p.topology
    assert final is not None and final.phase == Phase.NO_REBALANCE
    assert set(owner_set(final.current)) == {m(0), m(2), m(3)}
    assert all(len(o) == 2 for o in final.current.owners)


def test_new_owner_crash_mid_rebalance_keeps_every_segment_owned() -> None:
    p = joined(3)
    p.on_view([m(0), m(1), m(2), m(3)], 1.0)
    p.on_statuses({m(3): MemberStatus(1.0, False, None)}, 1.0)
    t2 = p.on_view([m(0), m(1), m(2)], 2.0)[0][1]
    assert all(t2.pending.owners_of(s) for s in range(SEGS))  # type: ignore[union-attr]
    confirm_all(p)
    assert set(owner_set(p.topology.current)) == {m(0), m(1), m(2)}  # type: ignore[union-attr]


def test_new_owner_crash_mid_rebalance_keeps_num_owners_owners_that_hold_the_data() -> None:
    # Simulation seed 4100076: with the dead new owner removed, the pending CH named one owner for its segments;
    # the rebalance ended there and the current owners it replaced dropped the data. Live current owners stay.
    p = joined(3)
    p.on_view([m(0), m(1), m(2), m(3)], 1.0)
    t = p.on_statuses({m(3): MemberStatus(1.0, False, None)}, 1.0)[-1][1]
    fetched = t.segments_to_fetch(m(3))
    assert fetched
    t2 = p.on_view([m(0), m(1), m(2)], 2.0)[0][1]
    assert t2.pending is not None
    for s in range(SEGS):
        assert len(t2.pending.owners_of(s)) == 2, s
        assert set(t2.pending.owners_of(s)) <= set(t.current.owners_of(s)) | set(t.pending.owners_of(s)), s  # type: ignore[union-attr]
    seen = confirm_all(p)
    ended = next(tt for tt in seen if tt.phase == Phase.NO_REBALANCE)
    for s in fetched:  # the copies the rebalance ends with are the current owners', who had the data
        assert set(ended.current.owners_of(s)) == set(t.current.owners_of(s)), s


def test_leave_request_moves_the_members_segments_away() -> None:
    p = joined(4)
    out = p.on_statuses({m(2): MemberStatus(1.0, True, p.topology)}, 1.0)
    t = out[-1][1]
    assert t.phase == Phase.READ_OLD_WRITE_ALL and m(2) not in owner_set(t.pending)  # type: ignore[arg-type]
    confirm_all(p)
    final = p.topology
    assert final is not None and m(2) not in owner_set(final.current) and m(2) in final.members


def test_everyone_leaving_keeps_the_data_somewhere() -> None:
    p = joined(2)
    out = p.on_statuses({x: MemberStatus(1.0, True, p.topology) for x in (m(0), m(1))}, 1.0)
    assert out == [] or all(owner_set(t.current) for _, t in out)
    assert set(owner_set(p.topology.current)) == {m(0), m(1)}  # type: ignore[union-attr]


def test_joiner_during_rebalance_gets_the_topology_and_waits() -> None:
    p = joined(3)
    p.on_view([m(0), m(1), m(2), m(3), m(4)], 1.0)
    t = p.on_statuses({m(3): MemberStatus(1.0, False, None)}, 1.0)[-1][1]
    out = p.on_statuses({m(4): MemberStatus(1.0, False, None)}, 1.1)
    assert out == [(m(4), t)]
    seen = confirm_all(p)
    assert any(tt.rebalance_id == t.rebalance_id + 1 for tt in seen)  # the next rebalance took m(4) in
    assert m(4) in owner_set(p.topology.current)  # type: ignore[arg-type, union-attr]


def test_takeover_recovers_from_the_newest_reported_topology() -> None:
    old = joined(3)
    old.on_view([m(0), m(1), m(2), m(3)], 1.0)
    t_old = old.on_statuses({m(3): MemberStatus(1.0, False, None)}, 1.0)[-1][1]  # READ_OLD, id 2
    for x in t_old.members:
        old.on_confirm(x, t_old.topology_id)
    t_new = old.topology  # READ_ALL, id 3, which only m(1) received before m(0) crashed
    assert t_new is not None and t_new.phase == Phase.READ_ALL_WRITE_ALL
    view = [m(1), m(2), m(3)]
    p = RebalancePlanner(view, num_segments=SEGS, num_owners=2)
    out = p.on_statuses(
        {
            m(1): MemberStatus(1.0, False, t_new),
            m(2): MemberStatus(1.0, False, t_old),
            m(3): MemberStatus(1.0, False, t_old),
        },
        5.0,
    )
    t = out[0][1]
    assert t.topology_id > t_new.topology_id and t.phase == Phase.READ_ALL_WRITE_ALL
    assert m(0) not in t.members and all(m(0) not in t.current.owners_of(s) for s in range(SEGS))
    confirm_all(p)
    final = p.topology
    assert final is not None and final.phase == Phase.NO_REBALANCE and set(owner_set(final.current)) == set(view)


def test_a_view_member_whose_status_comes_after_the_recovery_timeout_stays_an_owner() -> None:
    # Seed 1440: after a merge view two members installed it only after the new coordinator's recovery timed
    # out. They were dropped as owners, a segment went down to one owner, and that owner's crash lost writes.
    t0 = joined(5).topology
    assert t0 is not None and t0.phase == Phase.NO_REBALANCE
    view = [m(0), m(1), m(2), m(3), m(4)]
    p = RebalancePlanner(view, num_segments=SEGS, num_owners=2, recovery_timeout=1.0, now=10.0)
    assert p.on_statuses({x: MemberStatus(1.0, False, t0) for x in view[:4]}, 10.5) == []
    out = p.on_tick(11.0)  # m(4) has not reported: the recovery ends without its status
    assert out
    t = p.topology
    assert t is not None and t.topology_id > t0.topology_id and t.availability == Availability.AVAILABLE
    for s in range(SEGS):
        assert set(t.current.owners_of(s)) == set(t0.current.owners_of(s)), s  # nobody lost a segment
    # Its status arrives late: nothing to rebalance, and it stays an owner.
    p.on_statuses({m(4): MemberStatus(1.0, False, t0)}, 11.5)
    confirm_all(p)
    final = p.topology
    assert final is not None and final.phase == Phase.NO_REBALANCE
    assert all(len(final.current.owners_of(s)) == 2 for s in range(SEGS))
    assert set(owner_set(final.current)) == set(view)


def test_status_from_a_member_ahead_bumps_the_id() -> None:
    p = joined(3)
    t = p.topology
    assert t is not None
    ahead = replace(t, topology_id=40)
    out = p.on_statuses({m(1): MemberStatus(1.0, False, ahead)}, 1.0)
    assert out and out[-1][1].topology_id == 41


@pytest.mark.parametrize("mode", list(PartitionHandling))
def test_losing_half_the_stable_members(mode: PartitionHandling) -> None:
    p = joined(2, mode)
    out = p.on_view([m(0)], 1.0)
    t = out[-1][1]
    if mode == PartitionHandling.ALLOW_READ_WRITES:
        assert t.availability == Availability.AVAILABLE
        assert all(t.can_read(s) and t.can_write(s) for s in range(SEGS))
        return
    assert t.availability == Availability.DEGRADED and t.phase == Phase.NO_REBALANCE
    missing = [s for s in range(SEGS) if t.missing_owner(s)]
    assert missing == list(range(SEGS))  # with 2 owners on 2 members, m(1) owned everything
    for s in missing:
        assert not t.can_write(s)
        assert t.can_read(s) == (mode == PartitionHandling.ALLOW_READS)
    # Joins do not rebalance while degraded.
    p.on_view([m(0), m(5)], 2.0)
    out = p.on_statuses({m(5): MemberStatus(1.0, False, None)}, 2.0)
    assert all(tt.availability == Availability.DEGRADED and not tt.rebalancing for _, tt in out)
    # The partition heals (merge): every stable member is back, availability returns.
    p.on_view([m(0), m(1), m(5)], 3.0)
    out = p.on_statuses({m(1): MemberStatus(1.0, False, t)}, 3.0)
    assert out and out[-1][1].availability == Availability.AVAILABLE
    confirm_all(p)
    assert set(owner_set(p.topology.current)) == {m(0), m(1), m(5)}  # type: ignore[union-attr]


def _planner(n: int, owners: int) -> RebalancePlanner:
    view = [m(i) for i in range(n)]
    p = RebalancePlanner(view, num_segments=SEGS, num_owners=owners)
    p.on_statuses({x: MemberStatus(1.0, False, None) for x in view}, 0.0)
    return p


def _recover(view: list[Address], tops: dict[Address, CacheTopology], *, owners: int = 2) -> RebalancePlanner:
    """A coordinator of ``view`` recovering from the topologies its members report (after a merge view)."""
    p = RebalancePlanner(view, num_segments=SEGS, num_owners=owners, merge=True)
    p.on_statuses({x: MemberStatus(1.0, False, tops[x]) for x in view}, 1.0)
    return p


def test_crash_of_one_of_three_degrades_only_a_side_without_a_majority() -> None:
    # A view of the two survivors is a majority of the stable topology and holds every segment: available.
    p = joined(3)
    t0 = p.topology
    assert t0 is not None
    t = p.on_view([m(0), m(1)], 1.0)[0][1]
    assert t.availability == Availability.AVAILABLE
    # A survivor alone (its view lost the other one too): half of the stable members or more are missing,
    # and they may go on without it, so it degrades, as does the other one on its own.
    for x in (m(0), m(1)):
        alone = RebalancePlanner([x], num_segments=SEGS, num_owners=2)
        t = alone.on_statuses({x: MemberStatus(1.0, False, t0)}, 1.0)[-1][1]
        assert t.availability == Availability.DEGRADED and set(t.stable_members) == {m(0), m(1), m(2)}


def test_merge_of_two_degraded_singletons_after_a_crash_is_available_by_itself() -> None:
    # The coordinator of three members (2 owners) is killed; the two survivors each form a view of one, degrade,
    # then merge. No segment lost both owners and the two are a majority of the stable three: available again
    # without the operator, then rebalanced to two owners per segment on the survivors.
    t0 = joined(3).topology
    assert t0 is not None
    a, b = (RebalancePlanner([x], num_segments=SEGS, num_owners=2) for x in (m(1), m(2)))
    ta = a.on_statuses({m(1): MemberStatus(1.0, False, t0)}, 1.0)[-1][1]
    tb = b.on_statuses({m(2): MemberStatus(1.0, False, t0)}, 1.0)[-1][1]
    assert ta.availability == tb.availability == Availability.DEGRADED
    p = _recover([m(1), m(2)], {m(1): ta, m(2): tb})
    t = p.topology
    assert t is not None and t.availability == Availability.AVAILABLE
    assert t.topology_id > max(ta.topology_id, tb.topology_id)
    assert p.segments_lost == 0
    for s in range(SEGS):
        assert set(t.current.owners_of(s)) <= set(t0.current.owners_of(s)) - {m(0)}  # who holds the data
    confirm_all(p)
    final = p.topology
    assert final is not None and final.phase == Phase.NO_REBALANCE and final.availability == Availability.AVAILABLE
    assert all(set(o) == {m(1), m(2)} for o in final.current.owner_map())
    assert set(final.stable_members) == {m(1), m(2)} and final.stable_id == final.topology_id


def test_a_minority_never_becomes_available_by_itself() -> None:
    # 3 owners on 3 members: the one left alone holds every segment, but it is a minority of the stable set;
    # the other two may be a majority going on without it. Joiners do not make up for the missing members.
    p = _planner(3, owners=3)
    t0 = p.topology
    assert t0 is not None
    alone = RebalancePlanner([m(0)], num_segments=SEGS, num_owners=3)
    t = alone.on_statuses({m(0): MemberStatus(1.0, False, t0)}, 1.0)[-1][1]
    assert t.availability == Availability.DEGRADED and not any(t.missing_owner(s) is False for s in range(SEGS))
    view = [m(0)]
    for j in (5, 6, 7):
        view.append(m(j))
        out = alone.on_view(view, 2.0) + alone.on_statuses({m(j): MemberStatus(1.0, False, None)}, 2.0)
        assert all(x.availability == Availability.DEGRADED and not x.rebalancing for _, x in out)
    assert alone.topology is not None and alone.topology.availability == Availability.DEGRADED
    # One more of the stable members back makes a majority: available, and rebalanced over everyone.
    view.append(m(1))
    alone.on_view(view, 3.0)
    out = alone.on_statuses({m(1): MemberStatus(1.0, False, t0)}, 3.0)
    assert out and alone.topology.availability == Availability.AVAILABLE  # type: ignore[union-attr]


def test_a_segment_that_lost_every_owner_stays_degraded() -> None:
    # Five members, 2 owners: the two owners of one segment crash. The other three are a majority, but that
    # segment's data is gone until one of them comes back: degraded, also after joins and merges of others.
    p = joined(5)
    t0 = p.topology
    assert t0 is not None
    lost = t0.current.owners_of(0)
    rest = [x for x in t0.members if x not in lost]
    t = p.on_view(rest, 1.0)[-1][1]
    assert t.availability == Availability.DEGRADED
    view = [*rest, m(9)]
    p.on_view(view, 2.0)
    p.on_statuses({m(9): MemberStatus(1.0, False, None)}, 2.0)
    assert p.topology is not None and p.topology.availability == Availability.DEGRADED
    merged = _recover(view, {x: p.topology for x in view})
    assert merged.topology is not None and merged.topology.availability == Availability.DEGRADED
    # One of the segment's owners is back (the partition healed): available again.
    merged.on_view([*view, lost[1]], 3.0)
    out = merged.on_statuses({lost[1]: MemberStatus(1.0, False, t0)}, 3.0)
    assert out and merged.topology.availability == Availability.AVAILABLE  # type: ignore[union-attr]


def test_majority_after_repeated_splits_counts_against_the_newest_stable_set() -> None:
    # 3 owners on five members. {3, 4} split off (degraded, stable: all five); {0, 1, 2}, a majority, rebalance
    # and fix the stable set {0, 1, 2}; then 0 splits off alone (degraded). 0 merges with {3, 4}: a majority
    # of the first stable set, but a minority of the newest one, whose majority {1, 2} is available right now.
    # So the merged side stays degraded, although it continues the topology of {3, 4} (the highest id).
    p = _planner(5, owners=3)
    t0 = p.topology
    assert t0 is not None
    assert p.on_view([m(0), m(1), m(2)], 1.0)[0][1].availability == Availability.AVAILABLE
    confirm_all(p)
    ta = p.topology
    assert ta is not None and set(ta.stable_members) == {m(0), m(1), m(2)} and ta.stable_id > t0.stable_id
    side = RebalancePlanner([m(3), m(4)], num_segments=SEGS, num_owners=3)
    side.on_statuses({x: MemberStatus(1.0, False, t0) for x in (m(3), m(4))}, 1.0)
    for i in range(ta.topology_id):  # members come and go on that side: its ids run past the other side's
        side.on_view([m(3), m(4), m(8)] if i % 2 == 0 else [m(3), m(4)], 1.0)
        side.on_statuses({m(8): MemberStatus(1.0, False, None)}, 1.0)
    tb = side.topology
    assert tb is not None and tb.availability == Availability.DEGRADED and tb.topology_id > ta.topology_id + 1
    assert p.on_view([m(1), m(2)], 2.0)[0][1].availability == Availability.AVAILABLE
    alone = RebalancePlanner([m(0)], num_segments=SEGS, num_owners=3)
    t = alone.on_statuses({m(0): MemberStatus(1.0, False, ta)}, 2.0)[-1][1]
    assert t.availability == Availability.DEGRADED
    merged = _recover([m(0), m(3), m(4)], {m(0): t, m(3): tb, m(4): tb}, owners=3)
    tm = merged.topology
    assert tm is not None and tm.availability == Availability.DEGRADED
    assert set(tm.stable_members) == {m(0), m(1), m(2)} and tm.stable_id == ta.stable_id
    # The whole group merges: available.
    everyone = [m(i) for i in range(5)]
    tops = {m(0): t, m(1): p.topology, m(2): p.topology, m(3): tb, m(4): tb}
    assert _recover(everyone, tops, owners=3).topology.availability == Availability.AVAILABLE  # type: ignore[union-attr]


def test_owners_lost_without_a_handoff_travel_with_every_topology_until_they_are_back() -> None:
    # Simulation seed 203002143 (allow_read_writes): m(1), cut off alone, took writes; m(5) joined its side and
    # took them over, then m(1) left. m(5)'s topologies named only the two of them, so alone and asked to leave,
    # m(5) saw nobody who could take its segments and left with the only copy. The owners lost without a
    # handoff (m(0), m(2): crashed or behind a partition, nobody can tell) now go with every topology, through
    # joins, graceful leaves and coordinator changes, so m(5) knows too (Membership._no_taker).
    mode = PartitionHandling.ALLOW_READ_WRITES
    t0 = joined(3, mode).topology
    assert t0 is not None and t0.lost == ()
    side = RebalancePlanner([m(1)], num_segments=SEGS, num_owners=2, mode=mode)
    t1 = side.on_statuses({m(1): MemberStatus(1.0, False, t0)}, 1.0)[0][1]
    assert set(t1.lost) == {m(0), m(2)} and t1.availability == Availability.AVAILABLE
    side.on_view([m(1), m(5)], 2.0)
    joining = side.on_statuses({m(5): MemberStatus(1.0, False, None)}, 2.0)
    assert joining and all(set(t.lost) == {m(0), m(2)} for _, t in joining)
    confirm_all(side)
    side.on_statuses({m(1): MemberStatus(1.0, True, side.topology)}, 3.0)  # m(1) leaves gracefully
    handed = confirm_all(side)
    assert handed and owner_set(handed[-1].current) == (m(5),) and set(handed[-1].lost) == {m(0), m(2)}
    # m(1) leaves the view: it handed its segments off, so it is not lost; m(5) takes over as coordinator.
    alone = RebalancePlanner([m(5)], num_segments=SEGS, num_owners=2, mode=mode)
    t5 = alone.on_statuses({m(5): MemberStatus(1.0, False, handed[-1])}, 4.0)[0][1]
    assert set(t5.lost) == {m(0), m(2)}
    # A member's own lost owners (those gone while its merge push was unfinished, Membership._vanished_owners)
    # reach the coordinator in its status and every member in the next topology, rebalancing or not.
    out = alone.on_statuses({m(5): MemberStatus(1.0, False, t5, 0, (m(9),))}, 4.5)
    assert out and set(out[-1][1].lost) == {m(0), m(2), m(9)}
    assert alone.on_statuses({m(5): MemberStatus(1.0, False, out[-1][1], 0, (m(9),))}, 4.6) == []
    # The other side, where m(1) is the lost one: at the merge the lost owners back in the view are lost no
    # more. m(1) stays: it left m(5)'s side gracefully, but from m(0)'s side it vanished, and nobody can tell
    # it from an owner that is still away.
    other = joined(3, mode)
    t_other = other.on_view([m(0), m(2)], 1.0)[0][1]
    assert t_other.lost == (m(1),)
    merged = _recover(
        [m(0), m(2), m(5)],
        {m(0): t_other, m(2): t_other, m(5): alone.topology},  # type: ignore[dict-item]
    )
    assert merged.topology is not None and set(merged.topology.lost) == {m(1), m(9)}
    # A graceful leave adds nothing.
    p = joined(4, mode)
    p.on_statuses({m(3): MemberStatus(1.0, True, p.topology)}, 1.0)
    confirm_all(p)
    p.on_view([m(0), m(1), m(2)], 2.0)
    assert p.topology is not None and p.topology.lost == ()
    # At most MAX_LOST are kept, the newest.
    p.on_statuses({m(0): MemberStatus(1.0, False, None, 0, tuple(m(100 + i) for i in range(MAX_LOST)))}, 3.0)
    out = p.on_statuses({m(0): MemberStatus(1.0, False, None, 0, (m(99),))}, 3.1)
    assert len(out[-1][1].lost) == MAX_LOST and out[-1][1].lost[-1] == m(99) and m(100) not in out[-1][1].lost


def test_force_available_accepts_the_loss() -> None:
    p = joined(2)
    p.on_view([m(0)], 1.0)
    out = p.force_available()
    assert out and out[-1][1].availability == Availability.AVAILABLE
    assert set(owner_set(p.topology.current)) == {m(0)}  # type: ignore[union-attr]


def no_topology(joined: tuple[Address, ...] | None = (), capacity: float = 1.0) -> MemberStatus:
    """The status of a member without a topology that joined the groups of ``joined``."""
    return MemberStatus(capacity, False, None, joined=joined)


def test_a_member_that_joined_a_group_never_starts_an_empty_grid_of_its_own() -> None:
    # Seed 590: a member joined a group, never received its topology, was cut off and, as coordinator of a
    # view of its own, started an empty grid that answered reads with "absent".
    p = RebalancePlanner([m(3)], num_segments=SEGS, num_owners=2)
    assert p.on_statuses({m(3): no_topology((m(0),))}, 0.0) == []
    assert p.topology is None
    # It waits for a member that holds a topology: after a merge view the node recovers with a new planner.
    held = joined(2).topology
    assert held is not None
    merged = RebalancePlanner([m(3), m(0)], num_segments=SEGS, num_owners=2)
    statuses = {m(3): no_topology((m(0),)), m(0): MemberStatus(1.0, False, held)}
    out = merged.on_statuses(statuses, 1.0)
    assert out and merged.topology is not None and merged.topology.topology_id > held.topology_id
    # ... or for the operator, who accepts that the grid starts empty.
    q = RebalancePlanner([m(3)], num_segments=SEGS, num_owners=2)
    q.on_statuses({m(3): no_topology((m(0),))}, 0.0)
    out = q.force_available()
    assert out and q.topology is not None and set(owner_set(q.topology.current)) == {m(3)}


def test_an_empty_grid_starts_once_every_group_its_coordinator_joined_is_known_to_have_none() -> None:
    # Seed 339000037: five members started apart; some joined groups that never reached the initial cluster
    # size (so never started a grid), and the merge of all five made one of those joiners the coordinator. It
    # waited for a member with a topology that nobody had: the grid never started.
    view = [m(3), m(1), m(4), m(2), m(5)]
    statuses = {
        m(3): no_topology((m(2),)),  # joined m(2)'s group of two
        m(2): no_topology((m(3),)),  # a coordinator before, joined m(3)'s group at the merge
        m(1): no_topology((m(3),)),
        m(4): no_topology((m(1), m(3))),  # joined m(1)'s group of two, then the merge
        m(5): no_topology((m(2), m(3))),
    }
    p = RebalancePlanner(view, num_segments=SEGS, num_owners=2, initial_size=3, merge=True)
    out = p.on_statuses(statuses, 1.0)
    assert [d for d, _ in out] == [None] and p.topology is not None
    assert set(p.topology.members) == set(view) and set(owner_set(p.topology.current)) == set(view)


def test_no_empty_grid_while_a_coordinator_joined_on_the_way_is_missing() -> None:
    view = [m(3), m(1), m(2)]
    # m(3) joined m(1), which is here, but m(1) joined m(0), which is not: m(0) may run a grid m(1) is in.
    p = RebalancePlanner(view, num_segments=SEGS, num_owners=2, initial_size=3)
    statuses = {m(3): no_topology((m(1),)), m(1): no_topology((m(0), m(3))), m(2): no_topology((m(3),))}
    assert p.on_statuses(statuses, 0.0) == [] and p.topology is None
    # m(0) comes back (a partition healed) and reports no topology: every coordinator met on the way is here
    # and has no grid.
    assert p.on_view([*view, m(0)], 1.0) == []
    out = p.on_statuses({m(0): no_topology()}, 1.0)
    assert out and p.topology is not None and set(p.topology.members) == {*view, m(0)}
    # A member that joined more groups than a status lists cannot tell: it never counts as clean.
    q = RebalancePlanner(view, num_segments=SEGS, num_owners=2, initial_size=3)
    assert q.on_statuses({m(3): no_topology((m(1),)), m(1): no_topology(None), m(2): no_topology((m(3),))}, 0.0) == []
    # Members the coordinator did not join do not stop it: it starts with them as it always did.
    r = RebalancePlanner(view, num_segments=SEGS, num_owners=2, initial_size=3)
    assert r.on_statuses({m(3): no_topology(), m(1): no_topology((m(0),)), m(2): no_topology((m(3),))}, 0.0)


def test_a_topology_reported_after_the_recovery_is_continued_not_replaced_by_an_empty_grid() -> None:
    # The recovery timed out before the status of m(2), which holds a topology; the others have none and are too
    # few to start a grid. When m(2)'s status comes, the coordinator continues its grid: an empty one beside it
    # would make m(2) drop what it holds.
    other = RebalancePlanner([m(2), m(7)], num_segments=SEGS, num_owners=2)
    other.on_statuses({m(2): no_topology(), m(7): no_topology()}, 0.0)
    held = other.topology
    assert held is not None
    view = [m(0), m(1), m(2)]
    p = RebalancePlanner(view, num_segments=SEGS, num_owners=2, initial_size=3, recovery_timeout=1.0, now=1.0)
    assert p.on_statuses({m(0): no_topology(), m(1): no_topology((m(0),))}, 1.0) == []
    assert p.on_tick(2.0) == [] and not p.recovering and p.topology is None
    out = p.on_statuses({m(2): MemberStatus(1.0, False, held, joined=())}, 2.5)
    assert out and p.topology is not None
    assert p.topology.grid_id == held.grid_id and p.topology.topology_id > held.topology_id
    assert set(p.topology.members) == set(view)


def test_an_empty_grid_starts_once_a_member_has_capacity() -> None:
    # Every member at capacity 0: nobody could own a segment, so no grid starts; the first member to get a
    # capacity above 0 starts it, whoever the coordinator is (here one that joined another group on the way).
    view = [m(3), m(1), m(2)]
    p = RebalancePlanner(view, num_segments=SEGS, num_owners=2, initial_size=3)
    statuses = {m(3): no_topology((m(1),), 0.0), m(1): no_topology((m(3),), 0.0), m(2): no_topology((m(3),), 0.0)}
    assert p.on_statuses(statuses, 0.0) == [] and p.topology is None
    out = p.on_statuses({m(2): no_topology((m(3),), 2.0)}, 1.0)
    assert out and p.topology is not None and set(owner_set(p.topology.current)) == {m(2)}
    assert set(p.topology.members) == set(view)


def test_no_new_grid_starts_below_the_initial_cluster_size() -> None:
    # Seed 513: a restarted member whose join failed formed a group of its own and started a grid there; at
    # the merge an older write of the main grid, stamped under a higher topology id, beat a write it had
    # acknowledged. With an initial cluster size above half of the members, a lone member never starts one.
    lone = RebalancePlanner([m(3)], num_segments=SEGS, num_owners=2, initial_size=3)
    assert lone.on_statuses({m(3): MemberStatus(1.0, False, None)}, 0.0) == []
    assert lone.topology is None
    # Two members are still too few; the third one's status starts the grid, with all three as owners.
    p = RebalancePlanner([m(0), m(1), m(2)], num_segments=SEGS, num_owners=2, initial_size=3)
    assert p.on_statuses({m(0): MemberStatus(1.0, False, None), m(1): MemberStatus(1.0, False, None)}, 0.0) == []
    assert p.topology is None
    out = p.on_statuses({m(2): MemberStatus(1.0, False, None)}, 0.1)
    assert out and p.topology is not None
    assert set(owner_set(p.topology.current)) == {m(0), m(1), m(2)}
    # A member that leaves the view before the grid started no longer counts.
    q = RebalancePlanner([m(0), m(1), m(2)], num_segments=SEGS, num_owners=2, initial_size=3)
    q.on_statuses({m(0): MemberStatus(1.0, False, None), m(1): MemberStatus(1.0, False, None)}, 0.0)
    q.on_view([m(0), m(1)], 0.5)
    assert q.on_statuses({m(2): MemberStatus(1.0, False, None)}, 0.6) == [] and q.topology is None
    # The operator's force-available accepts a grid of the members present.
    out = q.force_available()
    assert out and q.topology is not None and set(owner_set(q.topology.current)) == {m(0), m(1)}


def test_the_initial_cluster_size_does_not_hold_back_a_grid_that_exists() -> None:
    # A new coordinator of a running grid recovers the topology its members report, however few they are.
    held = joined(2).topology
    assert held is not None
    p = RebalancePlanner([m(1)], num_segments=SEGS, num_owners=2, initial_size=3)
    out = p.on_statuses({m(1): MemberStatus(1.0, False, held)}, 0.0)
    assert out and p.topology is not None and p.topology.topology_id > held.topology_id


def test_topology_and_status_wire_round_trip_and_validation() -> None:
    p = joined(3)
    p.on_view([m(0), m(1), m(2), m(3)], 1.0)
    t = p.on_statuses({m(3): MemberStatus(2.0, False, None)}, 1.0)[-1][1]
    wire = msgpack.unpackb(msgpack.packb(MemberStatus(2.0, True, t).to_wire()), raw=False)
    st2 = MemberStatus.from_wire(wire)
    assert st2.topology == t and st2.capacity == 2.0 and st2.leaving
    bad = msgpack.unpackb(msgpack.packb(t.to_wire()), raw=False)
    bad[8] = None  # a rebalancing topology without its pending CH
    with pytest.raises(WireError, match="pending"):
        CacheTopology.from_wire(bad)
    bad = msgpack.unpackb(msgpack.packb(t.to_wire()), raw=False)
    bad[2] = 9
    with pytest.raises(WireError, match="phase"):
        CacheTopology.from_wire(bad)
    with pytest.raises(WireError, match="capacity"):
        MemberStatus.from_wire([-1, False, None])
    assert t.grid_id != 0 and CacheTopology.from_wire(t.to_wire()).grid_id == t.grid_id
    bad = msgpack.unpackb(msgpack.packb(t.to_wire()), raw=False)
    bad[9] = -1
    with pytest.raises(WireError, match=r"topology\.grid_id"):
        CacheTopology.from_wire(bad)
    bad[9], bad[10] = 1, t.topology_id  # the re-stamp id lies below the topology's own
    with pytest.raises(WireError, match=r"topology\.restamp"):
        CacheTopology.from_wire(bad)
    with pytest.raises(WireError, match="expected 13 items, got 9"):
        CacheTopology.from_wire(t.to_wire()[:9])
    assert t.stable_id and CacheTopology.from_wire(t.to_wire()).stable_id == t.stable_id
    bad = msgpack.unpackb(msgpack.packb(t.to_wire()), raw=False)
    bad[11] = t.topology_id + 1  # a stable set fixed after the topology that carries it
    with pytest.raises(WireError, match=r"topology\.stable_id"):
        CacheTopology.from_wire(bad)
    lost = replace(t, lost=(m(7), m(8)))
    assert CacheTopology.from_wire(msgpack.unpackb(msgpack.packb(lost.to_wire()), raw=False)).lost == (m(7), m(8))
    bad = msgpack.unpackb(msgpack.packb(lost.to_wire()), raw=False)
    bad[12] = [m(7).to_wire(), m(7).to_wire()]
    with pytest.raises(WireError, match=r"topology\.lost: a member is listed twice"):
        CacheTopology.from_wire(bad)
    bad[12] = [m(7).to_wire()] * (MAX_LOST + 1)
    with pytest.raises(WireError, match=r"topology\.lost"):
        CacheTopology.from_wire(bad)
    # A status carries its member's lost owners only when it has some (a floor of 0 in front of them).
    st = MemberStatus(1.0, False, None, 0, (m(7),))
    assert st.to_wire()[3:] == [0, [m(7).to_wire()]] and MemberStatus.from_wire(st.to_wire()) == st
    assert len(MemberStatus(1.0, False, None).to_wire()) == 3
    with pytest.raises(WireError, match=r"status\.lost\[0\]"):
        MemberStatus.from_wire([1.0, False, None, 0, ["x"]])
    # The coordinators a member joined without a topology follow its lost owners; None: too many to list.
    for joined_ in ((m(3), m(1)), None):
        st = MemberStatus(1.0, False, None, joined=joined_)
        assert len(st.to_wire()) == 6 and MemberStatus.from_wire(st.to_wire()) == st
    with pytest.raises(WireError, match=r"status\.joined"):
        MemberStatus.from_wire([1.0, False, None, 0, [], [m(1).to_wire()] * (MAX_JOINED + 1)])
    with pytest.raises(WireError, match=r"status\.joined"):
        MemberStatus.from_wire([1.0, False, None, 0, [], []])


def _grid(first: int, n: int, now: float) -> RebalancePlanner:
    view = [m(i) for i in range(first, first + n)]
    p = RebalancePlanner(view, num_segments=SEGS, num_owners=2, now=now)
    p.on_statuses({x: MemberStatus(1.0, False, None) for x in view}, now)
    return p


def test_grids_started_apart_get_different_ids_and_their_merge_a_restamp_topology() -> None:
    a, b = _grid(0, 2, 1.0), _grid(2, 2, 1.0)  # same time, other coordinators
    ta, tb = a.topology, b.topology
    assert ta is not None and tb is not None
    assert ta.grid_id and tb.grid_id and ta.grid_id != tb.grid_id
    assert ta.restamp == tb.restamp == 0
    assert _grid(0, 2, 2.0).topology.grid_id != ta.grid_id  # type: ignore[union-attr]  # the same one, later
    # A split of one grid that heals: one id, nothing to re-stamp.
    p = RebalancePlanner([m(0), m(1)], num_segments=SEGS, num_owners=2, now=3.0)
    t = p.on_statuses({m(0): MemberStatus(1.0, False, ta), m(1): MemberStatus(1.0, False, ta)}, 3.0)[-1][1]
    assert (t.grid_id, t.restamp) == (ta.grid_id, 0)
    # The merge of the two grids: one id above both grids' ids is kept for re-stamping, the merged group's
    # topologies come after it and carry it on; the merged grid is a new one (a member of either grid that
    # missed the merge is told apart when it comes back).
    view = [m(i) for i in range(4)]
    p = RebalancePlanner(view, num_segments=SEGS, num_owners=2, now=4.0, merge=True)
    statuses = {x: MemberStatus(1.0, False, ta if x in ta.members else tb) for x in view}
    out = p.on_statuses(statuses, 4.0)
    merged = out[0][1]
    top = max(ta.topology_id, tb.topology_id)
    assert merged.restamp == top + 1 and merged.topology_id > merged.restamp
    assert merged.grid_id not in (0, ta.grid_id, tb.grid_id)
    later = confirm_all(p)
    assert later and all((x.grid_id, x.restamp) == (merged.grid_id, merged.restamp) for x in later)
    # A coordinator change after it, one member still on its old grid's topology (it missed the merged one):
    # no new re-stamp id. The straggler pushes under the merged group's (above its own topology), and what the
    # merged group wrote since, under higher ids, still beats its old entries.
    final = p.topology
    assert final is not None
    q = RebalancePlanner(view[1:], num_segments=SEGS, num_owners=2, now=9.0)
    lag = {x: MemberStatus(1.0, False, final) for x in view[1:]} | {m(3): MemberStatus(1.0, False, tb)}
    t = q.on_statuses(lag, 9.0)[-1][1]
    assert (t.grid_id, t.restamp) == (final.grid_id, merged.restamp) and t.topology_id > final.topology_id


# ---- property: any sequence of joins, leaves, single crashes and confirmations -----------------------------

EVENTS = st.lists(
    st.tuples(st.sampled_from(["join", "leave", "crash", "confirm", "confirm_some", "takeover"]), st.integers(0, 99)),
    max_size=40,
)


def _compatible(t1: CacheTopology, t2: CacheTopology) -> None:
    """Adjacent topologies: what either reads, the other writes (minus members that died in between)."""
    alive = set(t2.members)
    for s in range(t1.num_segments):
        assert set(t2.read_owners(s)) <= set(t1.write_owners(s)) | (alive - set(t1.members)), (t1.phase, t2.phase)
        assert set(t1.read_owners(s)) & alive <= set(t2.write_owners(s)), (t1.phase, t2.phase)


@settings(max_examples=200 * EXAMPLES_SCALE, deadline=None, derandomize=True, database=None)
@given(events=EVENTS, n=st.integers(3, 5))
def test_property_planner_invariants(events: list[tuple[str, int]], n: int) -> None:
    view = [m(i) for i in range(n)]
    next_id = n
    p = RebalancePlanner(view, num_segments=SEGS, num_owners=2)
    out = p.on_statuses({x: MemberStatus(1.0, False, None) for x in view}, 0.0)
    history = [t for _, t in out]
    crash_ok = True
    for kind, pick in events:
        t = p.topology
        assert t is not None
        if kind == "join" and len(view) < 8:
            x = m(next_id)
            next_id += 1
            view.append(x)
            out = p.on_view(view, 0.0) + p.on_statuses({x: MemberStatus(1.0, False, None)}, 0.0)
        elif kind == "leave":
            x = view[pick % len(view)]
            out = p.on_statuses({x: MemberStatus(1.0, True, t)}, 0.0)
        elif kind in ("crash", "takeover") and crash_ok and len(t.stable_members) >= 3:
            # One crash until a rebalance completes; never the last holders of any segment.
            victim = view[0] if kind == "takeover" else view[pick % len(view)]
            if any(t.data_holders(s) == (victim,) for s in range(SEGS)):
                continue
            crash_ok = False
            view = [x for x in view if x != victim]
            if kind == "takeover":
                last = {x: (history[-1] if history else None) for x in view}
                p = RebalancePlanner(view, num_segments=SEGS, num_owners=2)
                out = p.on_statuses({x: MemberStatus(1.0, False, last[x]) for x in view}, 0.0)
            else:
                out = p.on_view(view, 0.0)
        elif kind == "confirm":
            out = []
            for x in t.members:
                out += p.on_confirm(x, t.topology_id)
        elif kind == "confirm_some":
            out = p.on_confirm(t.members[pick % len(t.members)], t.topology_id)
        else:
            out = []
        for dest, topo in out:
            if dest is None:
                history.append(topo)
        t = p.topology
        assert t is not None and t.availability == Availability.AVAILABLE
        if not t.rebalancing and set(owner_set(t.current)) <= set(view):
            crash_ok = True
    # Settle: confirmations until the planner stops; the result is balanced over the staying members.
    history += confirm_all(p)
    final = p.topology
    assert final is not None and final.phase == Phase.NO_REBALANCE
    ids = [t.topology_id for t in history]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    for t in history:
        for s in range(SEGS):
            assert t.current.owners_of(s), f"segment {s} without an owner in topology {t.topology_id}"
    for a, b in itertools.pairwise(history):
        _compatible(a, b)
    staying = {x for x in view if not p.members[x].leaving} or set(view)
    assert set(owner_set(final.current)) == staying
    k = min(2, len(staying))
    assert all(len(o) == k for o in final.current.owners)


def test_ch_lists_a_member_with_capacity_even_when_nothing_moves_to_it() -> None:
    # One segment, one owner: a joiner's share rounds down to nothing and no data moves, but the current CH
    # must still list it with its capacity: the CH names every cache member with its capacity.
    a, b = m(0), m(1)
    p = RebalancePlanner([a], num_segments=1, num_owners=1)
    p.on_statuses({a: MemberStatus(1.0, False, None)}, 0.0)
    p.on_view([a, b], 1.0)
    out = p.on_statuses({b: MemberStatus(1.0, False, None)}, 1.0)
    t = p.topology
    assert t is not None and t.phase == Phase.NO_REBALANCE and out
    assert t.current.owner_map() == [(a,)] and b in t.members
    assert t.current.capacity_of(b) == 1.0


def test_ch_lists_client_only_members_with_capacity_zero() -> None:
    # The CH names every cache member with its capacity: client-only members are listed, in the first CH and
    # in every CH after, though they own nothing.
    a, c, d = m(0), m(1), m(2)
    p = RebalancePlanner([a, c], num_segments=SEGS, num_owners=2)
    p.on_statuses({a: MemberStatus(1.0, False, None), c: MemberStatus(0.0, False, None)}, 0.0)
    t = p.topology
    assert t is not None and owner_set(t.current) == (a,) and t.current.capacity_of(c) == 0.0
    p.on_view([a, c, d], 1.0)
    out = p.on_statuses({d: MemberStatus(1.0, False, None)}, 1.0)
    history = [topo for _, topo in out] + confirm_all(p)
    assert history[0].phase == Phase.READ_OLD_WRITE_ALL
    for t in history:
        assert t.current.capacity_of(c) == 0.0 and c not in owner_set(t.current)
        assert t.pending is None or t.pending.capacity_of(c) == 0.0
    final = p.topology
    assert final is not None and final.phase == Phase.NO_REBALANCE and set(owner_set(final.current)) == {a, d}


def test_topology_ending_a_rebalance_lists_the_members_that_joined_during_it() -> None:
    # Simulation seeds 2801, 4872: the topology that ends a rebalance takes the pending CH, made when the rebalance
    # started; members that joined meanwhile are taken in by the next rebalance, broadcast right behind it. The
    # last owner, leaving, read from the first that nobody could take its segments and left with the only copy
    # (then Membership._no_taker read capacities from the CH). Both topologies list the joiners with their capacity.
    a, b, c, d = m(0), m(1), m(2), m(3)
    p = joined(2)
    b_status = MemberStatus(1.0, True, p.topology)
    (_, started), *_ = p.on_statuses({b: b_status}, 1.0)  # b leaves: its segments move to a
    assert started.phase == Phase.READ_OLD_WRITE_ALL and owner_set(started.pending) == (a,)
    p.on_statuses({a: MemberStatus(1.0, True, started)}, 1.1)  # a is leaving too: nobody else can own yet
    p.on_view([a, b, c, d], 1.2)
    out = p.on_statuses({c: MemberStatus(1.0, False, None), d: MemberStatus(2.0, False, None)}, 1.2)
    assert all(dest in (c, d) for dest, _ in out)  # mid-rebalance: the joiners just get the topology
    done, nxt = confirm_all(p)[2:4]
    assert done.phase == Phase.NO_REBALANCE and owner_set(done.current) == (a,)
    assert {x: done.current.capacity_of(x) for x in (c, d)} == {c: 1.0, d: 2.0}
    assert nxt.phase == Phase.READ_OLD_WRITE_ALL and set(owner_set(nxt.pending)) == {c, d}
    assert nxt.current == done.current


@settings(max_examples=150 * EXAMPLES_SCALE, derandomize=True, database=None, deadline=None)
@given(
    st.data(),
    st.sampled_from(list(Phase)),
    st.sampled_from(list(Availability)),
    st.sampled_from(list(PartitionHandling)),
)
def test_routing_table_matches_the_per_segment_answers(
    data: st.DataObject, phase: Phase, avail: Availability, mode: PartitionHandling
) -> None:
    """The node's route cache (CacheTopology.routing_table, computed per owner combination) gives exactly
    what read_owners, write_owners, can_read and can_write give segment by segment, in every phase,
    availability and partition mode, with members missing from the topology's member list."""
    pool = [m(i) for i in range(6)]
    n_owners = data.draw(st.integers(1, 3))

    def owner_map() -> list[tuple[Address, ...]]:
        return [
            tuple(data.draw(st.lists(st.sampled_from(pool), min_size=1, max_size=n_owners, unique=True)))
            for _ in range(SEGS)
        ]

    caps = {x: 1.0 for x in pool}
    current = ConsistentHash.from_owner_map(SEGS, n_owners, owner_map(), caps)
    pending = None if phase == Phase.NO_REBALANCE else ConsistentHash.from_owner_map(SEGS, n_owners, owner_map(), caps)
    members = tuple(data.draw(st.lists(st.sampled_from(pool), unique=True)))
    t = CacheTopology(7, 1, phase, current, pending, members, avail, (), mode)
    me = data.draw(st.sampled_from(pool))
    table = t.routing_table(me)
    assert len(table) == SEGS
    for s, r in enumerate(table):
        assert r.read == t.read_owners(s)
        assert r.write == t.write_owners(s)
        assert r.can_read == t.can_read(s)
        assert r.can_write == t.can_write(s)
        assert r.i_read == (me in t.read_owners(s))
        assert r.i_write == (me in t.write_owners(s))
        assert r.primary == (t.write_primary(s) == me)


def test_an_unchanged_topology_announced_after_recovery_keeps_the_newest_stable_set() -> None:
    # As above, but the merged side holds exactly the members of the topology it continues, so recovery has
    # nothing to change and only re-announces it under a new id. That announcement must keep the newest
    # stable set ({0, 1, 2}, reported by another member), not the older one of the topology it continues.
    p = _planner(5, owners=3)
    t0 = p.topology
    assert t0 is not None
    p.on_view([m(0), m(1), m(2)], 1.0)
    confirm_all(p)
    ta = p.topology
    assert ta is not None
    side = RebalancePlanner([m(3), m(4)], num_segments=SEGS, num_owners=3)
    side.on_statuses({x: MemberStatus(1.0, False, t0) for x in (m(3), m(4))}, 1.0)
    for i in range(ta.topology_id):
        side.on_view([m(3), m(4), m(8)] if i % 2 == 0 else [m(3), m(4)], 1.0)
        side.on_statuses({m(8): MemberStatus(1.0, False, None)}, 1.0)
    tb = side.topology
    assert tb is not None and set(tb.members) == {m(3), m(4)} and tb.stable_id < ta.stable_id
    alone = RebalancePlanner([m(0)], num_segments=SEGS, num_owners=3)
    t = alone.on_statuses({m(0): MemberStatus(1.0, False, ta)}, 2.0)[-1][1]
    merged = _recover([m(3), m(4)], {m(3): tb, m(4): t}, owners=3)
    tm = merged.topology
    assert tm is not None and tm.topology_id > tb.topology_id and tm.availability == Availability.DEGRADED
    assert set(tm.stable_members) == {m(0), m(1), m(2)} and tm.stable_id == ta.stable_id


def test_status_reporting_another_topology_under_our_id_bumps_the_id() -> None:
    # A member cut off alone made topologies of its own; its status from before that reached the coordinator
    # of the merge view, whose recovery ended on it and announced an id its own topology already had. The
    # member ignored ours as not newer and never confirmed it: the rebalance stalled for good.
    old = joined(3)
    old.on_view([m(0), m(1), m(2), m(3)], 1.0)
    old.on_statuses({m(3): MemberStatus(1.0, False, None)}, 1.0)
    confirm_all(old)
    t_before = old.topology
    assert t_before is not None and t_before.phase == Phase.NO_REBALANCE and m(3) in owner_set(t_before.current)
    alone = RebalancePlanner([m(3)], num_segments=SEGS, num_owners=2, mode=PartitionHandling.ALLOW_READ_WRITES)
    alone.on_statuses({m(3): MemberStatus(1.0, False, t_before)}, 2.0)
    confirm_all(alone)
    t_alone = alone.topology
    assert t_alone is not None and set(owner_set(t_alone.current)) == {m(3)}
    view = [m(0), m(1), m(2), m(3)]
    p = RebalancePlanner(view, num_segments=SEGS, num_owners=2, mode=PartitionHandling.ALLOW_READ_WRITES, merge=True)
    p.on_statuses({x: MemberStatus(1.0, False, t_before) for x in view}, 3.0)  # m(3)'s from before its split
    ours = p.topology
    assert ours is not None and ours.topology_id > t_before.topology_id
    clash = replace(t_alone, topology_id=ours.topology_id)
    out = p.on_statuses({m(3): MemberStatus(1.0, False, clash)}, 3.5)
    assert out and out[-1][1].topology_id > ours.topology_id and m(3) in out[-1][1].members
    # The same topology reported again (a member that installed ours) changes nothing.
    assert p.on_statuses({m(1): MemberStatus(1.0, False, p.topology)}, 3.6) == []
