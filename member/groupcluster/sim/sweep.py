"""``groupcluster sweep``: run simulation seeds nobody has run, across every stack and the grid's optional faults.

The test command replays fixed seeds: a regression net, not evidence. A sweep starts at a random seed (printed,
and chosen outside every range its ledger records), runs the profiles round-robin for ``--minutes`` or
``--seeds``, prints each failure with its replay command, and appends the ranges it ran to the ledger, so the
next sweep starts somewhere new and the ranges behind a correctness claim can be named.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import logging
import multiprocessing
import secrets
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from pathlib import Path
from typing import Any, TextIO

from .grid.run import GRID_DEFAULT_OPS, GRID_DEFAULT_SAFETY
from .grid.tx_run import GRID_TX_DEFAULT_OPS, GRID_TX_DEFAULT_SAFETY, GRID_TX_STACK
from .ledger import format_totals, read_ranges, read_rows, sim_code_digest, totals
from .runner import default_jobs
from .scenario import GRID_STACK, MEMBER_LOG, Scenario, SeedResult, run_seed

# Every stack, and the grid stacks once more with each optional fault the test command also runs (at its share).
DEFAULT_PROFILES: tuple[str, ...] = (
    "fifo",
    "vsync",
    "total-order",
    "grid",
    "grid-tx",
    "grid+deadlines=0.5",
    "grid+lifespans=0.3",
    "grid+max_entries=10",
    "grid+max_bytes=50",
    "grid+capacity_changes=1",
    "grid-tx+deadlines=0.5",
    "grid-tx+max_entries=10",
    "grid-tx+capacity_changes=1",
)
# Random starts are drawn from here, in steps of a million: far above the fixed seeds the tests run (below
# 100,000) and the ranges of the before-stop check (below 120,000,000).
START_LOW = 1_000_000_000
START_HIGH = 1_000_000_000_000
# The repository's ledger (committed, so every engineer's sweeps avoid each other's ranges); none when installed
# from a wheel.
_REPO_LEDGER = Path(__file__).resolve().parents[3] / "tests" / "sim" / "sweep-ledger.jsonl"
DEFAULT_LEDGER = _REPO_LEDGER if _REPO_LEDGER.parent.is_dir() else None
# Scenario fields a profile may set after '+' (the grid's optional faults and the shape of a run).
PROFILE_FIELDS = (
    "deadlines",
    "lifespans",
    "max_entries",
    "max_bytes",
    "capacity_changes",
    "members",
    "safety_time",
    "send_rate",
)


@dataclasses.dataclass(frozen=True)
class Profile:
    """One sweep target: a stack and the scenario options it runs with."""

    name: str
    scenario: Scenario

    def replay(self, seed: int) -> str:
        """The ``groupcluster sim`` command that replays ``seed`` of this profile exactly."""
        stack = self.scenario.stack_name()
        parts = ["groupcluster", "sim", "--seeds", "1", "--start", str(seed), "--stack", stack]
        base = _stack_defaults(stack)
        for name in PROFILE_FIELDS:
            value = getattr(self.scenario, name)
            if value != getattr(base, name):
                parts += ["--" + name.replace("_", "-"), f"{value:g}" if isinstance(value, float) else str(value)]
        return shlex.join(parts)


def _stack_defaults(stack: str) -> Scenario:
    if stack == GRID_STACK:
        return Scenario(stack=stack, safety_time=GRID_DEFAULT_SAFETY, send_rate=GRID_DEFAULT_OPS)
    if stack == GRID_TX_STACK:
        return Scenario(stack=stack, safety_time=GRID_TX_DEFAULT_SAFETY, send_rate=GRID_TX_DEFAULT_OPS)
    return Scenario(stack=stack)


def parse_profile(text: str) -> Profile:
    """``"grid+lifespans=0.3+max_entries=10"`` -> a :class:`Profile` (options are Scenario fields, ``-`` or
    ``_`` alike). Raises ``ValueError`` with a message naming the bad part."""
    stack, *options = text.split("+")
    if not stack:
        raise ValueError(f"profile {text!r}: starts with a stack name, e.g. grid+lifespans=0.3")
    changes: dict[str, Any] = {}
    types = {f.name: f.type for f in dataclasses.fields(Scenario)}
    for option in options:
        key, sep, raw = option.partition("=")
        name = key.replace("-", "_")
        if not sep or name not in PROFILE_FIELDS:
            raise ValueError(
                f"profile {text!r}: {option!r} is not OPTION=VALUE with OPTION one of {', '.join(PROFILE_FIELDS)}"
            )
        try:
            changes[name] = int(raw) if types[name] in ("int", int) else float(raw)
        except ValueError:
            raise ValueError(f"profile {text!r}: {option!r} needs a number") from None
    scenario = dataclasses.replace(_stack_defaults(stack), **changes)
    return Profile(text, scenario)


@dataclasses.dataclass
class ProfileRun:
    """What a sweep did with one profile: seeds ``start .. start + seeds - 1`` and the ones that failed."""

    profile: Profile
    start: int
    seeds: int = 0
    failed: list[SeedResult] = dataclasses.field(default_factory=list)


def code_version(repo: Path = _REPO_LEDGER.parents[2]) -> str | None:
    """The commit the simulated code is at (``+dirty`` when member/ has uncommitted changes), so a ledger row
    names the code its seeds judged; None outside a git checkout."""
    try:
        head = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True, check=True, timeout=10
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(repo), "diff", "--quiet", "HEAD", "--", "member"], capture_output=True, timeout=10
        ).returncode
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("+dirty" if dirty else "") if head else None


def fresh_start(used: Sequence[tuple[int, int]], span: int, draw: Callable[[int], int] = secrets.randbelow) -> int:
    """A start, a multiple of a million in [START_LOW, START_HIGH), whose ``span`` seeds miss every used range."""
    steps = (START_HIGH - START_LOW) // 1_000_000
    for _ in range(1000):
        start = START_LOW + draw(steps) * 1_000_000
        if all(start + span <= lo or start >= hi for lo, hi in used):
            return start
    raise RuntimeError("no fresh seed range left in the ledger's space")  # pragma: no cover - 10^6 slots


def _run(task: tuple[int, Scenario]) -> SeedResult:
    seed, scenario = task
    return run_seed(seed, scenario)


def sweep(
    profiles: Sequence[Profile],
    start: int,
    *,
    jobs: int,
    seeds: int | None,
    deadline: float | None,
    on_result: Callable[[ProfileRun, SeedResult], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> list[ProfileRun]:
    """Run the profiles round-robin from ``start`` until each ran ``seeds`` or ``clock()`` passes ``deadline``.

    Every profile runs a contiguous range from ``start``: seeds still running at the deadline finish, and no
    seed after them is started, so the ranges reported are exactly the seeds that ran."""
    runs = [ProfileRun(p, start) for p in profiles]
    submitted = [0] * len(runs)

    def tasks() -> Iterator[tuple[int, int]]:
        i = 0
        while True:
            k = i % len(runs)
            if seeds is not None and submitted[k] >= seeds:
                if all(n >= seeds for n in submitted):
                    return
                i += 1
                continue
            yield k, start + submitted[k]
            submitted[k] += 1
            i += 1

    def record(k: int, result: SeedResult) -> None:
        run = runs[k]
        run.seeds += 1
        if not result.ok:
            run.failed.append(result)
        if on_result is not None:
            on_result(run, result)

    source = tasks()

    def next_task() -> tuple[int, int] | None:
        if deadline is not None and clock() >= deadline:
            return None
        return next(source, None)

    if jobs <= 1:
        while (task := next_task()) is not None:
            k, seed = task
            record(k, _run((seed, runs[k].profile.scenario)))
        return runs
    _run_in_pool(jobs, runs, next_task, record)
    return runs


def _run_in_pool(
    jobs: int,
    runs: Sequence[ProfileRun],
    next_task: Callable[[], tuple[int, int] | None],
    record: Callable[[int, SeedResult], None],
) -> None:
    """Run the tasks ``next_task`` hands out on ``jobs`` worker processes, keeping each busy, until it runs dry."""
    methods = multiprocessing.get_all_start_methods()
    ctx = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
    with ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as pool:
        running: dict[Future[SeedResult], int] = {}
        while True:
            while len(running) < 2 * jobs and (task := next_task()) is not None:
                k, seed = task
                running[pool.submit(_run, (seed, runs[k].profile.scenario))] = k
            if not running:
                break
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for fut in done:
                record(running.pop(fut), fut.result())


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--minutes", type=float, default=None, metavar="M", help="run for M minutes of wall time (default 5)"
    )
    parser.add_argument("--seeds", type=int, default=None, metavar="N", help="run N seeds of each profile instead")
    parser.add_argument(
        "--start", type=int, default=None, metavar="S", help="first seed (default: random, outside the ledger)"
    )
    parser.add_argument(
        "--profile",
        action="append",
        default=[],
        metavar="STACK[+OPTION=VALUE...]",
        help="what to sweep, repeatable (default: every stack, and grid and grid-tx with each optional fault: "
        + ", ".join(DEFAULT_PROFILES)
        + ")",
    )
    parser.add_argument("--jobs", type=int, default=None, metavar="J", help="worker processes (default: the CPUs)")
    parser.add_argument(
        "--ledger",
        default=None if DEFAULT_LEDGER is None else str(DEFAULT_LEDGER),
        metavar="FILE",
        help="JSON lines of swept ranges: read to pick a fresh start, appended to (default: the repository's "
        "tests/sim/sweep-ledger.jsonl; '-' for none)",
    )
    parser.add_argument(
        "--totals",
        action="store_true",
        help="run nothing: print how many seeds of each stack and profile the ledger records on exactly the "
        "simulated code as it is now, and which failed",
    )


def _print_failure(out: TextIO, run: ProfileRun, result: SeedResult) -> None:
    out.write(f"[{run.profile.name}] seed {result.seed}: faults {', '.join(result.kinds) or 'none'}\n")
    for v in result.violations[:5]:
        out.write(f"  seed {result.seed}: {v.property}: {v.member}: {v.detail}\n")
    if len(result.violations) > 5:
        out.write(f"  seed {result.seed}: ... and {len(result.violations) - 5} more violations\n")
    out.write(f"  replay: {run.profile.replay(result.seed)}\n")
    out.flush()


def run(args: argparse.Namespace) -> int:
    out = sys.stdout
    try:
        profiles = [parse_profile(p) for p in (args.profile or DEFAULT_PROFILES)]
    except ValueError as exc:
        print(f"sweep: {exc}", file=sys.stderr)
        return 2
    if args.seeds is not None and args.minutes is not None:
        print("sweep: give --seeds or --minutes, not both", file=sys.stderr)
        return 2
    if args.seeds is not None and args.seeds < 1:
        print("sweep: --seeds must be at least 1", file=sys.stderr)
        return 2
    if args.totals:
        if args.ledger in (None, "-"):
            print("sweep: --totals reads a ledger; give --ledger FILE", file=sys.stderr)
            return 2
        current = sim_code_digest()
        by_stack, by_profile = totals(read_rows(Path(args.ledger)), current, _REPO_LEDGER.parents[2])
        out.write(format_totals(current, by_stack, by_profile))
        return 0
    minutes = 5.0 if args.seeds is None and args.minutes is None else args.minutes
    jobs = default_jobs() if args.jobs is None else max(1, args.jobs)
    ledger = None if args.ledger in (None, "-") else Path(args.ledger)
    used = read_ranges(ledger) if ledger is not None else []
    # A span of a million per profile leaves room for the longest sweeps (about 10 seeds per second per core).
    start = args.start if args.start is not None else fresh_start(used, 1_000_000)
    clash = [(lo, hi) for lo, hi in used if start < hi and lo < start + (args.seeds or 1_000_000)]
    how = "given" if args.start is not None else "random"
    out.write(
        f"sweep: seeds from {start} ({how} start), {len(profiles)} profiles, "
        + (f"{args.seeds} seeds each" if args.seeds is not None else f"{minutes:g} minutes")
        + f", {jobs} jobs\n"
    )
    if clash:
        out.write(f"sweep: note: the ledger already records seeds in this range ({clash[:3]}): not all fresh\n")
    out.flush()
    # Members warn all the time under faults; a failing seed's replay shows them with --verbose.
    MEMBER_LOG.setLevel(max(MEMBER_LOG.getEffectiveLevel(), logging.ERROR))
    # The code the seeds run is the code imported now: taken before the first seed, since the checkout may move
    # on while a long sweep runs.
    code = code_version() if ledger is not None else None
    sim_code = sim_code_digest() if ledger is not None else None
    began = time.monotonic()
    deadline = None if minutes is None else began + minutes * 60.0
    progress = {"done": 0, "last": began}

    def on_result(run_: ProfileRun, result: SeedResult) -> None:
        progress["done"] += 1
        if not result.ok:
            _print_failure(out, run_, result)
        now = time.monotonic()
        if now - progress["last"] >= 30.0:
            progress["last"] = now
            print(f"sweep: {progress['done']} seeds in {now - began:.0f}s", file=sys.stderr, flush=True)

    runs = sweep(profiles, start, jobs=jobs, seeds=args.seeds, deadline=deadline, on_result=on_result)
    elapsed = time.monotonic() - began
    out.write("\nprofile                         seeds                              failed\n")
    for r in runs:
        span = f"{r.start}..{r.start + r.seeds - 1}" if r.seeds else "-"
        out.write(f"{r.profile.name:<31} {r.seeds:>6}  {span:<27} {len(r.failed):>6}\n")
    total = sum(r.seeds for r in runs)
    failed = sum(len(r.failed) for r in runs)
    if ledger is not None:
        stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        with ledger.open("a") as fh:
            for r in runs:
                if r.seeds:
                    row = {
                        "date": stamp,
                        "profile": r.profile.name,
                        "start": r.start,
                        "seeds": r.seeds,
                        "failed": [x.seed for x in r.failed],
                        "code": code,
                        "sim_code": sim_code,
                    }
                    fh.write(json.dumps(row) + "\n")
    out.write(f"sweep: {total} seeds in {elapsed:.0f}s, {failed} failing\n")
    out.flush()
    return 0 if failed == 0 else 1
