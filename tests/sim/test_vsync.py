"""Simulation seeds on the vsync stack (FLUSH before every view change): every fault kind, every property,
virtual synchrony included; plus a check that the property is not vacuous (the fifo stack violates it)."""

from __future__ import annotations

import pytest
from groupcluster.sim.faults import FAULT_KINDS
from groupcluster.sim.runner import default_jobs, run_many
from groupcluster.sim.scenario import Scenario, SeedResult, run_seed
from groupcluster.sim.stack_checkers import check_virtual_synchrony


def run_vsync(seeds: range) -> list[SeedResult]:
    results = list(run_many(seeds, Scenario(stack="vsync"), jobs=default_jobs()))
    failed = [r for r in results if r.violations]
    lines = []
    for r in failed[:20]:
        lines.append(f"seed {r.seed} (faults: {', '.join(r.kinds)}):")
        lines.extend(f"    {v}" for v in r.violations[:5])
        lines.append(f"    replay: groupcluster sim --seeds 1 --start {r.seed} --stack vsync")
    assert not failed, f"{len(failed)} of {len(results)} seeds failed:\n" + "\n".join(lines)
    return results


def test_300_vsync_seeds_with_every_fault_kind() -> None:
    results = run_vsync(range(300))
    assert {k for r in results for k in r.kinds} == set(FAULT_KINDS)
    assert all(r.converged_at is not None for r in results)
    assert sum(r.stats["crashes"] for r in results) > 50


def test_virtual_synchrony_is_violated_without_flush(tmp_path) -> None:
    """The property has teeth: on the fifo stack (no flush) members do disagree on old-view deliveries."""
    from groupcluster.sim.history import History

    violated = 0
    for seed in range(12):
        record = tmp_path / f"fifo-{seed}.jsonl"
        run_seed(seed, Scenario(stack="fifo"), record=record)
        violated += bool(check_virtual_synchrony(History.read(record)))
    assert violated >= 3


@pytest.mark.slow
def test_1500_more_vsync_seeds() -> None:
    run_vsync(range(300, 1800))
