"""Simulation seeds on the fifo stack: every fault kind, every property (``scripts/test --slow`` runs more).

A failing seed prints its replay command; add it to ``test_regressions.py`` once understood.
"""

from __future__ import annotations

import pytest
from groupcluster.sim.faults import FAULT_KINDS
from groupcluster.sim.scenario import Scenario, SeedResult

from . import seedruns


def run_and_report(seeds: range) -> list[SeedResult]:
    return seedruns.run_and_report(seeds, Scenario(), "fifo")


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
