"""What the seed sweeps and regression lists of tests/sim share: run seeds and report failures with their replay
commands, judged against a list of known-open seeds, and replay a list of once-failing seeds."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from groupcluster.sim.runner import default_jobs, run_many
from groupcluster.sim.scenario import Scenario, SeedResult, run_seed


def run_and_report(
    seeds: range,
    scenario: Scenario,
    stack: str,
    known_open: Mapping[int, str] | None = None,
    regressions: str = "test_regressions.py",
) -> list[SeedResult]:
    """Run ``seeds``; fail when a seed outside ``known_open`` breaks a property (listing the first 20 with their
    replay commands) and when a known-open seed passes (it belongs in ``regressions`` then, so the list cannot
    rot)."""
    known = known_open or {}
    results = list(run_many(seeds, scenario, jobs=default_jobs()))
    failed = [r for r in results if r.violations and r.seed not in known]
    fixed = [r.seed for r in results if not r.violations and r.seed in known]
    lines = []
    for r in failed[:20]:
        lines.append(f"seed {r.seed} (faults: {', '.join(r.kinds)}):")
        lines.extend(f"    {v}" for v in r.violations[:5])
        lines.append(f"    replay: groupcluster sim --seeds 1 --start {r.seed} --stack {stack}")
    assert not failed, f"{len(failed)} of {len(results)} {stack} seeds failed:\n" + "\n".join(lines)
    assert not fixed, f"known-open {stack} seeds now pass (move them to {regressions}): {fixed}"
    return results


def replay_regressions(regressions: Iterable[tuple[int, Scenario, str]]) -> None:
    """Replay each ``(seed, scenario, what it found)``; fail naming every seed that breaks a property again."""
    failures = []
    for seed, scenario, note in regressions:
        result = run_seed(seed, scenario)
        if result.violations:
            failures.append(f"seed {seed} ({note}): " + "; ".join(str(v) for v in result.violations[:3]))
    assert not failures, "\n".join(failures)
