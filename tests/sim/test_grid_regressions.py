"""Grid seeds that once broke a property replay here (``groupcluster sim --stack grid --seeds 1 --start S``).

Each entry names what the seed found; the fix is in grid/node/, grid/topology.py, grid/rebalance.py or
grid/store.py (and a unit test in tests/unit/test_grid_node.py or test_grid_store.py where the case can be built
by hand), or in the checkers (sim/grid/checkers.py, with a test in tests/sim/test_grid_checkers.py) when the run
was right and the judgement wrong, or in the scenario (sim/grid/run.py, with a test here) when its fault schedule
broke the promise it keeps.
"""

from __future__ import annotations

from typing import Any

from groupcluster.core.view import View, ViewId
from groupcluster.grid.rebalance import RebalancePlanner
from groupcluster.grid.topology import MemberStatus
from groupcluster.sim.grid.run import GridApp, GridRun, grid_scenario
from groupcluster.sim.scenario import Scenario

from . import seedruns

# Pinned, not the current defaults: a seed replays its original run only with its scenario.
GRID = Scenario(stack="grid", safety_time=12.0, send_rate=3.0, startup_faults=False)
GRID_DEADLINES = Scenario(
    stack="grid", safety_time=12.0, send_rate=3.0, deadlines=0.3, startup_faults=False
)  # ``--deadlines 0.3``
GRID_MAX_BYTES = Scenario(stack="grid", safety_time=12.0, send_rate=3.0, max_bytes=50)  # ``--max-bytes 50``

STARTUP_SPLIT = (
    "members that started apart formed two grids that both took writes; on the merge the other grid's "
    "acknowledged writes vanished (now: merge policy, each member pushes its entries, newest version wins)"
)
STARTUP_SPLIT_TIE = STARTUP_SPLIT + " (two singleton grids stamped the same version: the tie goes to the greater value)"
PUSH_DEGRADED = (
    "a merge push for a segment the first merged topology could not write (degraded) was dropped, losing an "
    "acknowledged write (now: kept until a topology can write it)"
)
MERGE_READ = (
    "a read right after a merge, before the merged-in member's push arrived, was judged stale: the checker "
    "now treats writes as concurrent until every merging member's push is acknowledged (grid_merge events)"
)
MERGE_HOLD = (
    "a member that had formed a grid of its own served a read from it after the merge view, before the merged "
    "group's first topology reached it, missing a write the other grid acknowledged seconds earlier (now: reads "
    "wait for the merged group's topology after a merge view)"
)
MERGE_HOLD_WRITE = (
    "a member acknowledged a delete in the gap between the merge view and the merged group's first topology, "
    "stamped with its old partition's version; the other side's older value won the merge (now: writes are held "
    "in that gap too, and stamped under the merged topology)"
)
SEPARATE_GRIDS = (
    "a read through a member whose grid had never been in one view with the writer's grid was judged stale: the "
    "checker now treats writes acknowledged through a grid the reader has not met as writes that may have happened"
)
ARW_EMPTY_SIDE = (
    "allow_read_writes: a side left without any owner of a segment starts it empty, so a read overlapping the "
    "split returned absent; the checker now allows absent for reads overlapping a split in that mode"
)
DEGRADED_WRITE_KEPT = (
    "a write applied by the primary whose backup was cut off by a degraded topology was dropped (error to the "
    "client), leaving the replicas different for good after force_available (now: kept and re-driven)"
)
DEGRADED_NO_DROP = (
    "members cut off into partitions of their own dropped their copies on installing degraded topologies that "
    "did not name them owners; the merged group adopted a topology naming them owners and acknowledged writes "
    "were lost (now: copies are dropped only on available topologies)"
)
NO_TAKER_DEGRADED = (
    "found while making a member that nobody can take over from ready to leave at once: a degraded topology's "
    "CH does not list every member that could take segments, so members left with data (now: only on an "
    "available, balanced topology)"
)
STATUS_BEFORE_VIEW = (
    "a member's status reached the next coordinator before that member installed the view making it so; it was "
    "dropped, the planner recovered without the member, and the member stayed out of every topology: the grid "
    "never converged (now: kept for the view that makes us coordinator)"
)
JOINED_EMPTY_GRID = (
    "a member joined a group, never received its topology, was cut off and, coordinator of a view of its own, "
    "started an empty grid whose reads answered absent (now: a member that joined a group never starts an empty "
    "grid; it waits for a member with a topology, or for force-available)"
)
CUT_OFF_LEAVE = (
    "allow_read_writes: a member cut off alone acknowledged a write with the only copy, was asked to leave and, "
    "seeing nobody to take its segments, left at once with it (now: not while owners that vanished without a "
    "handoff may come back)"
)
INITIAL_SIZE = (
    "a restarted member whose join failed formed a group of its own and started a grid there; at the merge an "
    "older write of the main grid, stamped under a higher topology id, beat a write it had acknowledged (now: "
    "a new grid starts only with initial_cluster_size members; the scenario uses a majority of its slots)"
)
LATE_OLD_TOPOLOGY = (
    "a topology the old group's coordinator sent before a merge reached members after the merge view; they took "
    "it for the merged group's, pushed their entries to its owners (their own side) and dropped their copies "
    "when the merged group continued the other partition's topology (now: the merged topology names us and a "
    "member of the other side, and no copy is dropped while the merge push waits for it)"
)
HALF_REPLICATED = (
    "the member that stamped a write (a primary, or a former primary re-driving it) died after some owners "
    "applied it and before the others did: the copies differed for good (now: the owners that applied writes "
    "from a vanished member re-drive those segments' recent entries at their versions)"
)
DEGRADED_PUSH = (
    "a member cut off alone, sole owner of a segment in its degraded topology, took a write there; merge pushes "
    "came only from available topologies, so the write was lost at the merge (now: every member pushes)"
)
NEVER_MET = (
    "grids that never met (a second grid of restarted and late members, topology 1 up) both took writes; at the "
    "merge the first grid's older write, stamped under a higher topology id, beat a later acknowledged one (now: "
    "sequences carry the write's wall-clock time, and the merged group re-stamps both grids' entries under one "
    "topology id by that time: the later write wins; 983 is of the same kind, its schedule changed before the fix)"
)
LATE_STATUS = (
    "two members installed a merge view only after the new coordinator's recovery timed out; the planner dropped "
    "them as owners although they were in the view with their data, a segment was left with one owner, which "
    "took acknowledged writes and crashed (now: a view member that holds segments of the recovered topology "
    "stays an owner when its status is late)"
)
LEAVE_STALE_CH = (
    "a leaving member that held the only copy of segments judged from its topology's CH that nobody could take "
    "them (the CH did not list the others) and left at once: 2801 and 4872, the topology ending a rebalance "
    "carried the CH planned at its start and not the two members that joined meanwhile; 3413, a CH built while "
    "the other member was leaving and we were not, whom the coordinator made an owner again once both were "
    "leaving (two members joined 4 ms later). Now only members listed with capacity 0 cannot take: the planner "
    "lists client-only members, and any other member of the view keeps a leaving holder waiting for the handoff; "
    "the topology ending a rebalance also lists the members that joined during it, with their capacity"
)
MERGE_PUSH_CUT_OFF = (
    "allow_read_writes: a member cut off alone took writes, merged back, was asked to leave and was cut off alone "
    "again before its merge push reached anyone; its own grid took the push and, nobody in its view able to take "
    "its segments, it left with the only copy (now: members that leave our view while our merge push is "
    "unfinished count as owners that vanished without a handoff)"
)
EVERY_HOLDER_LEFT = (
    "the scenario asked members to leave while it counted, among the two data holders it keeps, members that had "
    "never been in the grid (no topology: cut off since their start, or in a group of their own); every member "
    "with a topology left, taking the acknowledged writes with it, and the members left over rightly started no "
    "empty grid (7524: they had been in the grid coordinator's view, _may_start; 9271: two members below "
    "initial_cluster_size), so the grid never converged (now: only members with a topology count as holders)"
)
PENDING_ONE_OWNER = (
    "a joiner, new owner of a segment in the rebalance taking it in, was cut off mid-rebalance (message loss) and "
    "came back; the planner had removed it from the pending CH, which named one owner for the segment. The "
    "rebalance ended with that CH, the current owner it replaced dropped its copy, and the one owner left had "
    "crashed: an acknowledged write was lost (now: live current owners stay in a pending CH short of num_owners)"
)
MERGED_MAJORITY = (
    "grid-liveness: one owner of five crashed, and the four survivors came apart into groups of one to three that "
    "each degraded (a minority of the stable five); they merged, but stayed degraded until the simulated operator "
    "forced the grid available, though they held a copy of every segment and were a majority of the stable five "
    "(now: such a merge is available by itself, as in Infinispan's PreferConsistency strategy)"
)
LIVENESS_LAST_CONVERGENCE = (
    "grid-liveness judged wrongly: after the heal the group converged and the grid was available at once, then a "
    "member was suspected and split off alone, rightly degraded until it merged back; the checker counted its bound "
    "from the first convergence (now: from the group's last one)"
)
LOST_OWNERS_TAKEN_OVER = (
    "allow_read_writes, every member in a group of its own: one acknowledged writes alone, knew owners had "
    "vanished without a handoff and rightly waited when asked to leave, then handed its data to a restarted member "
    "that joined its side and left. That member, asked to leave, was alone and no owner of its own topology had "
    "vanished, so it left at once with the only copy (now: topologies carry the owners the grid lost without a "
    "handoff, and it waits for the merge; the seed no longer reached this schedule on main once the vsync and "
    "sequencer changes landed, the unit tests build it by hand)"
)
LEAVE_FROM_UNLISTED_JOINERS = (
    "the last owner of every segment (its co-owners had left gracefully) had two joiners in its view whose statuses "
    "never reached it (message loss), so its topologies did not list them; the group split them off, and asked to "
    "leave it was alone with no vanished owner, so it left at once with the only copy of every acknowledged write, "
    "while the joiners went on and later formed the grid (found with --max-bytes 50, which only shaped the timing; "
    "now: view members our topology does not list that leave the view count as vanished, so it waits for the merge)"
)

# (seed, scenario, what the seed found)
REGRESSIONS: list[tuple[int, Scenario, str]] = [
    (5, GRID, STARTUP_SPLIT),
    (4, GRID, STARTUP_SPLIT),
    (10, GRID, STARTUP_SPLIT_TIE),
    (29, GRID, PUSH_DEGRADED),
    (54, GRID, MERGE_READ),
    (11, GRID, MERGE_READ),
    (47, GRID, MERGE_READ),
    (20, GRID, MERGE_HOLD),
    (70, GRID, MERGE_HOLD),
    (68, GRID, SEPARATE_GRIDS),
    (126, GRID, SEPARATE_GRIDS),
    (50, GRID, ARW_EMPTY_SIDE),
    (81, GRID, ARW_EMPTY_SIDE),
    (24, GRID, DEGRADED_WRITE_KEPT),
    (15, GRID, DEGRADED_NO_DROP),
    (41, GRID, NO_TAKER_DEGRADED),
    (607, GRID, MERGE_HOLD_WRITE),
    (460, GRID, STATUS_BEFORE_VIEW),
    (590, GRID, JOINED_EMPTY_GRID),
    (591, GRID, CUT_OFF_LEAVE),
    (513, GRID, INITIAL_SIZE),
    (19, GRID, LATE_OLD_TOPOLOGY),
    (264, GRID, LATE_OLD_TOPOLOGY),
    (24, GRID, HALF_REPLICATED),
    (581, GRID, HALF_REPLICATED),
    (716, GRID, HALF_REPLICATED),
    (614, GRID, DEGRADED_PUSH),
    (553, GRID, NEVER_MET),
    (983, GRID, NEVER_MET),
    (1440, GRID, LATE_STATUS),
    (2801, GRID, LEAVE_STALE_CH),
    (3413, GRID, LEAVE_STALE_CH),
    (4872, GRID, LEAVE_STALE_CH),
    (4884, GRID, MERGE_PUSH_CUT_OFF),
    (7524, GRID, EVERY_HOLDER_LEFT),
    (9271, GRID, EVERY_HOLDER_LEFT),
    (4100076, GRID, PENDING_ONE_OWNER),
    (38, GRID, MERGED_MAJORITY),
    (116, GRID, MERGED_MAJORITY),
    (222, GRID, MERGED_MAJORITY),
    (133, GRID, LIVENESS_LAST_CONVERGENCE),
    (203002143, GRID_DEADLINES, LOST_OWNERS_TAKEN_OVER),
    (536141000099, GRID_MAX_BYTES, LEAVE_FROM_UNLISTED_JOINERS),
]


def test_grid_regression_seeds_pass() -> None:
    seedruns.replay_regressions(REGRESSIONS)


def test_a_leave_keeps_two_members_that_hold_data() -> None:
    """Seeds 7524 and 9271 by hand: two members hold the grid, two more are in no grid (no topology). The
    scenario's leave fault must not take one of the two holders away; with a third holder it may."""
    run = GridRun(0, grid_scenario(), None)
    nodes = [run.world.start(slot) for slot in range(4)]
    apps: list[GridApp] = [n.app for n in nodes]  # type: ignore[misc]
    holders = [n.address for n in nodes[:2]]
    planner = RebalancePlanner(holders, num_segments=8, num_owners=2)
    ((_, topology),) = planner.on_statuses({m: MemberStatus(1.0, False, None) for m in holders}, 0.0)
    for n in nodes:
        n.view = View(ViewId(1, n.address), (n.address,))
    for app in apps[:2]:
        app.grid.topology = topology
    asked: list[int] = []

    def app_call(slot: int, fn: Any, *args: Any) -> None:
        asked.append(slot)

    run.world.app_call = app_call  # type: ignore[method-assign]
    for _ in range(20):
        run._leave()
    assert asked == []
    apps[2].grid.topology = topology  # a third member of the grid: one may leave now
    run._leave()
    assert len(asked) == 1 and asked[0] in (0, 1, 2)


# Seeds with lifespans (docs/grid.md, "Expiry"; ``--deadlines 0.5 --lifespans 0.3``), found by the first sweep
# of seeds 200-1199 with expiry in place.
LIFESPANS = Scenario(stack="grid", safety_time=12.0, send_rate=3.0, deadlines=0.5, lifespans=0.3, startup_faults=False)
EXPIRY_OF_DROPPED_SEGMENTS = (
    "a member cut off alone wrote an entry with a lifespan, and on the merge pushed it without its expiry: the "
    "segment was dropped before the push read the expiry back (now: expiries are taken with the entries); the "
    "entry never expired (grid-expired)"
)
EXPIRY_IN_WRITE_WINDOW = (
    "allow_read_writes: two singleton groups; one wrote the key, the other removed its expired older entry later "
    "with a newer version, which won the merge; the checker held the removal to be hidden by the other side's "
    "write (now: a removal that may run while two groups take writes is concurrent with their writes)"
)
LIFESPAN_REGRESSIONS = [
    (264, LIFESPANS, EXPIRY_OF_DROPPED_SEGMENTS),
    (428, LIFESPANS, EXPIRY_OF_DROPPED_SEGMENTS),
    (503, LIFESPANS, EXPIRY_IN_WRITE_WINDOW),
]


def test_grid_lifespan_regression_seeds_pass() -> None:
    seedruns.replay_regressions(LIFESPAN_REGRESSIONS)


# Seeds with capacity changes (docs/grid.md, "Capacity"; ``--capacity-changes 1``), found by the first sweep of
# seeds 0-49: the scenario, not the grid. Members at capacity 0 own nothing, so a grid with fewer members with
# capacity than num_owners has fewer copies of each segment; the scenario's convergence check still expected
# num_owners owners per segment and the grid never "converged" (now: min(num_owners, members with capacity)).
CAPACITIES = Scenario(stack="grid", safety_time=12.0, send_rate=3.0, capacity_changes=1.0, startup_faults=False)
FEWER_COPIES = "fewer members with capacity than owners: the check expected num_owners copies (grid-convergence)"
CAPACITY_REGRESSIONS = [(35, CAPACITIES, FEWER_COPIES), (44, CAPACITIES, FEWER_COPIES)]


def test_grid_capacity_regression_seeds_pass() -> None:
    seedruns.replay_regressions(CAPACITY_REGRESSIONS)


# Capacity changes with startup faults on (the default).
CAPACITIES_STARTUP = Scenario(stack="grid", safety_time=12.0, send_rate=3.0, capacity_changes=1.0)
REFETCHING_OWNER = (
    "an old owner acknowledged a write, was dropped by the balanced topology and made an owner again by the next "
    "rebalance; it cleared its copy to fetch it from a source the write had not reached yet, and the primary kept "
    "the write's round (no write owner was new) instead of re-driving it (grid-lost-write, grid-replicas-equal)"
)
CAPACITY_STARTUP_REGRESSIONS = [(439946000233, CAPACITIES_STARTUP, REFETCHING_OWNER)]


def test_grid_capacity_startup_regression_seeds_pass() -> None:
    seedruns.replay_regressions(CAPACITY_STARTUP_REGRESSIONS)
