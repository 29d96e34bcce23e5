"""Grid seeds that once broke a property replay here (``groupcluster sim --stack grid --seeds 1 --start S``).

Each entry names what the seed found; the fix is in grid/node.py or grid/store.py (and a unit test in
tests/unit/test_grid_node.py or test_grid_store.py where the case can be built by hand).
"""

from __future__ import annotations

from groupcluster.sim.scenario import Scenario, run_seed

# Pinned, not the current defaults: a seed replays its original run only with its scenario.
GRID = Scenario(stack="grid", safety_time=12.0, send_rate=3.0)

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

# (seed, scenario, what the seed found)
REGRESSIONS: list[tuple[int, Scenario, str]] = [
    (5, GRID, STARTUP_SPLIT),
    (4, GRID, STARTUP_SPLIT),
    (10, GRID, STARTUP_SPLIT_TIE),
    (29, GRID, PUSH_DEGRADED),
    (54, GRID, MERGE_READ),
    (11, GRID, MERGE_READ),
    (47, GRID, MERGE_READ),
]


def test_grid_regression_seeds_pass() -> None:
    failures = []
    for seed, scenario, note in REGRESSIONS:
        result = run_seed(seed, scenario)
        if result.violations:
            failures.append(f"seed {seed} ({note}): " + "; ".join(str(v) for v in result.violations[:3]))
    assert not failures, "\n".join(failures)
