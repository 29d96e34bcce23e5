"""Grid simulation seeds (``groupcluster sim --stack grid``): the data grid on the vsync stack under faults,
judged by the grid checkers (``scripts/test --slow`` runs more).

A failing seed prints its replay command. Seeds in :data:`KNOWN_OPEN` still fail: each names the property
and what is known; the test fails when another seed breaks a property *and* when a known one starts to
pass (then it moves to test_grid_regressions.py), so the list cannot rot.
"""

from __future__ import annotations

import pytest
from groupcluster.sim.grid import grid_scenario
from groupcluster.sim.scenario import SeedResult, check_determinism

from . import seedruns

# (seed -> what still breaks) with grid_scenario() defaults. Seeds 0-199 pass (those that once failed were diagnosed
# and fixed: test_grid_regressions.py). The open one is in the slow range: grids that never met.
NEVER_MET = (
    "; the open merge-policy question (docs/grid.md, Not done yet): two grids that never met both stamp versions from "
    "topology 1 up, so at their merge an older write can beat a later acknowledged one. initial_cluster_size keeps "
    "a member whose join failed from starting one; here restarted members (fresh incarnations) formed a majority "
    "of the slots while the first grid's members were cut off"
)
KNOWN_OPEN: dict[int, str] = {
    553: "grid-lost-write: a second grid of three restarted and late members took writes (topology 1 up); at the "
    "merge the first grid's older write (topology 10) won" + NEVER_MET,
}
# 983 (members started apart; a restart gave the second group its third member, and both groups started grids) left
# this list when transfer chunks began to wait behind operations (GridNode.defer_transfer): its schedule changed and
# it passes now, not because the cause was fixed. The kind of failure is still open (553 above).


def run_and_report(seeds: range) -> list[SeedResult]:
    return seedruns.run_and_report(seeds, grid_scenario(), "grid", KNOWN_OPEN, "test_grid_regressions.py")


def test_200_grid_seeds() -> None:
    results = run_and_report(range(200))
    # The runs did real work: operations, faults, merges, every mode and both owner counts.
    ok = [r for r in results if r.seed not in KNOWN_OPEN]
    assert all(r.converged_at is not None for r in ok)
    assert sum(r.stats["grid_ops_ok"] for r in results) > 100 * 200
    assert sum(r.stats["crashes"] for r in results) > 20
    assert sum(r.stats["frames_cut"] for r in results) > 1000
    assert {"crash", "partition", "pause", "leave", "loss"} <= {k for r in results for k in r.kinds}


def test_grid_seed_runs_twice_identically() -> None:
    report = check_determinism(3, grid_scenario())
    assert report.same, report.first_difference


@pytest.mark.slow
def test_800_more_grid_seeds() -> None:
    run_and_report(range(200, 1000))
