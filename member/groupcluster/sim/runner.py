"""Running many seeds, in this process or in worker processes, with results in seed order.

A seed's result depends only on the seed and the scenario, so running with one job or eight gives the same
results; workers only make it faster.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from .history_index import Violation
from .scenario import Scenario, SeedResult, run_seed


def default_jobs() -> int:
    """Worker processes to use by default: the CPUs this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def _run_one(task: tuple[int, Scenario, str | None, bool]) -> SeedResult:
    seed, scenario, record_dir, determinism = task
    record = None if record_dir is None else Path(record_dir) / f"seed-{seed}.jsonl"
    result = run_seed(seed, scenario, record=record, digest=determinism)
    if determinism:
        again = run_seed(seed, scenario, digest=True)
        if again.digest != result.digest or again.events != result.events:
            result.violations.append(
                Violation(
                    "determinism",
                    "-",
                    f"two runs of the seed differ: history {result.digest} vs {again.digest}, "
                    f"{result.events} vs {again.events} events",
                )
            )
    return result


def run_many(
    seeds: Iterable[int],
    scenario: Scenario,
    *,
    jobs: int = 1,
    record_dir: str | Path | None = None,
    determinism: bool = False,
    on_result: Callable[[SeedResult], None] | None = None,
) -> Iterator[SeedResult]:
    """Yield one :class:`SeedResult` per seed, in the order of ``seeds``.

    ``determinism`` runs every seed twice and adds a ``determinism`` violation when the histories differ.
    """
    seed_list = list(seeds)
    if record_dir is not None:
        Path(record_dir).mkdir(parents=True, exist_ok=True)
    tasks = [(s, scenario, None if record_dir is None else str(record_dir), determinism) for s in seed_list]
    if jobs <= 1 or len(tasks) <= 1:
        for task in tasks:
            result = _run_one(task)
            if on_result is not None:
                on_result(result)
            yield result
        return
    # fork keeps whatever layers the parent registered (tests register toy layers); spawn where fork is missing.
    methods = multiprocessing.get_all_start_methods()
    ctx = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
    workers = min(jobs, len(tasks))
    # Small chunks keep the workers balanced: seeds differ a lot in cost (crash-heavy seeds run longer).
    chunksize = max(1, min(8, len(tasks) // (workers * 8)))
    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
        for result in pool.map(_run_one, tasks, chunksize=chunksize):
            if on_result is not None:
                on_result(result)
            yield result
