"""Simulation seeds on the fifo stack: every fault kind, every property (``scripts/test --slow`` runs more).

A failing seed prints its replay command; add it to ``test_regressions.py`` once understood.
"""

from __future__ import annotations

import pytest
from groupcluster.sim.faults import FAULT_KINDS
from groupcluster.sim.runner import default_jobs, run_many
from groupcluster.sim.scenario import Scenario, SeedResult


def run_and_report(seeds: range) -> list[SeedResult]:
    results = list(run_many(seeds, Scenario(), jobs=default_jobs()))
    failed = [r for r in results if r.violations]
    lines = []
    for r in failed[:20]:
        lines.append(f"seed {r.seed} (faults: {', '.join(r.kinds)}):")
        lines.extend(f"    {v}" for v in r.violations[:5])
        lines.append(f"    replay: groupcluster sim --seeds 1 --start {r.seed} --stack fifo")
    assert not failed, f"{len(failed)} of {len(results)} seeds failed:\n" + "\n".join(lines)
    return results


def test_500_seeds_with_every_fault_kind() -> None:
    results = run_and_report(range(500))
    seen = {k for r in results for k in r.kinds}
    assert seen == set(FAULT_KINDS)
    # The runs did real work: messages flowed, faults fired, and every seed converged after healing.
    assert all(r.converged_at is not None for r in results)
    assert sum(r.stats["delivered"] for r in results) > 100 * 500
    assert sum(r.stats["crashes"] for r in results) > 100
    assert sum(r.stats["frames_lost"] for r in results) > 1000


@pytest.mark.slow
def test_2000_more_seeds() -> None:
    run_and_report(range(500, 2500))
