"""``groupcluster sim``: run simulation seeds, check every property, print the seeds that break one.

Each seed is a complete run (see :mod:`groupcluster.sim.scenario`). A violation prints the seed, the
property, what happened and the command that replays exactly that run. The last line of standard output is
always ``sim: <N> seeds, <E> events, <V> violations``; the exit status is 0 only when V is 0. Progress goes
to standard error.
"""

from __future__ import annotations

import argparse
import json
import logging
import shlex
import sys
import time
from typing import Any, TextIO

import yaml

from ..core.errors import ConfigError
from ..core.stack import resolve_config
from .grid.run import GRID_DEFAULT_OPS, GRID_DEFAULT_SAFETY
from .grid.tx_run import GRID_TX_DEFAULT_OPS, GRID_TX_DEFAULT_SAFETY, GRID_TX_STACK
from .runner import default_jobs, run_many
from .scenario import GRID_STACK, MEMBER_LOG, Scenario, SeedResult, build_spec
from .world import slot_endpoint

MAX_PRINTED_PER_PROPERTY = 5
DEFAULTS = Scenario()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seeds", type=int, default=100, metavar="N", help="how many seeds to run (default 100)")
    parser.add_argument("--start", type=int, default=0, metavar="S", help="first seed (default 0)")
    parser.add_argument(
        "--members", type=int, default=DEFAULTS.members, metavar="M", help="members per run (default 5)"
    )
    parser.add_argument(
        "--stack",
        default="fifo",
        metavar="NAME|FILE",
        help="stack preset, YAML stack file, 'grid' (the data grid on the vsync stack, with its checkers) or "
        "'grid-tx' (the grid with transactions and their checkers; default fifo)",
    )
    parser.add_argument(
        "--jobs", type=int, default=None, metavar="J", help="worker processes (default: number of CPUs)"
    )
    parser.add_argument("--json", action="store_true", help="one JSON object per seed instead of text lines")
    parser.add_argument("--verbose", action="store_true", help="a line for every seed, not only failing ones")
    parser.add_argument("--record", metavar="DIR", help="write each seed's history to DIR/seed-<seed>.jsonl")
    parser.add_argument(
        "--check-determinism", action="store_true", help="run every seed twice and compare the histories"
    )
    parser.add_argument(
        "--safety-time",
        type=float,
        default=None,
        metavar="SECONDS",
        help=f"virtual seconds of faults before the network heals (default {DEFAULTS.safety_time:g}; "
        f"grid: {GRID_DEFAULT_SAFETY:g})",
    )
    parser.add_argument(
        "--send-rate",
        type=float,
        default=None,
        metavar="PER_SECOND",
        help=f"test messages (grid: client operations) per member per virtual second "
        f"(default {DEFAULTS.send_rate:g}; grid: {GRID_DEFAULT_OPS:g})",
    )
    parser.add_argument("--no-faults", action="store_true", help="a clean network and no member faults")
    parser.add_argument(
        "--no-startup-faults",
        action="store_true",
        help="leave out the startup faults (partial host lists, staggered starts, shuffled endpoints): the "
        "other faults of a seed stay as they are",
    )
    parser.add_argument(
        "--deadlines",
        type=float,
        default=0.0,
        metavar="SHARE",
        help="grid stacks: the share (0 to 1) of client operations that carry a client deadline, 0.02-3 virtual "
        "seconds ahead; a failed write must then have taken effect before its deadline or never (default 0)",
    )
    parser.add_argument(
        "--lifespans",
        type=float,
        default=0.0,
        metavar="SHARE",
        help="grid stacks: the share (0 to 1) of PUTs whose entry expires, 0.05-4 virtual seconds after the "
        "write; the key may then read absent, and must be gone from every store once converged (default 0)",
    )
    parser.add_argument(
        "--max-entries",
        type=int,
        default=0,
        metavar="N",
        help="grid stacks: every member's max_entries bound (of the scenario's 24 keys); PUTs of new keys at a full "
        "primary are refused (default 0: no bound)",
    )
    parser.add_argument(
        "--max-bytes",
        type=int,
        default=0,
        metavar="N",
        help="grid stacks: every member's max_bytes bound on its live key and value bytes (the scenario's entries "
        "take 5-8 bytes each); PUTs that would grow a primary past it are refused (default 0: no bound)",
    )
    parser.add_argument(
        "--capacity-changes",
        type=float,
        default=0.0,
        metavar="RATE",
        help="grid stacks: capacity changes per virtual second during the faults (a member's capacity becomes 0, "
        "0.5, 1 or 2; num_owners members, at least two, keep a capacity above 0) (default 0)",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="LAYER.KEY=VALUE",
        help="override a layer parameter for every member, e.g. --set fd.timeout=2s (repeatable)",
    )


def parse_overrides(items: list[str]) -> dict[str, dict[str, Any]]:
    """``["fd.timeout=2s", ...]`` -> ``{"fd": {"timeout": "2s"}}`` (values read as YAML scalars)."""
    out: dict[str, dict[str, Any]] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        layer, dot, name = key.partition(".")
        if not sep or not dot or not layer or not name:
            raise ConfigError(f"--set {item!r}: expected LAYER.KEY=VALUE, e.g. fd.timeout=2s")
        try:
            value = yaml.safe_load(raw) if raw else ""
        except yaml.YAMLError as exc:
            raise ConfigError(f"--set {item!r}: bad value: {exc}") from None
        out.setdefault(layer, {})[name] = value
    return out


def _defaults(stack: str) -> tuple[float, float]:
    """(safety time, send rate) a stack runs with unless told otherwise."""
    if stack == GRID_STACK:
        return GRID_DEFAULT_SAFETY, GRID_DEFAULT_OPS
    if stack == GRID_TX_STACK:
        return GRID_TX_DEFAULT_SAFETY, GRID_TX_DEFAULT_OPS
    return DEFAULTS.safety_time, DEFAULTS.send_rate


def _fill_defaults(args: argparse.Namespace) -> None:
    safety, rate = _defaults(args.stack)
    if args.safety_time is None:
        args.safety_time = safety
    if args.send_rate is None:
        args.send_rate = rate


def replay_command(args: argparse.Namespace, seed: int) -> str:
    """The command line that replays ``seed`` with the same scenario."""
    _fill_defaults(args)
    safety, rate = _defaults(args.stack)
    parts = ["groupcluster", "sim", "--seeds", "1", "--start", str(seed), "--stack", args.stack]
    if args.members != DEFAULTS.members:
        parts += ["--members", str(args.members)]
    if args.safety_time != safety:
        parts += ["--safety-time", f"{args.safety_time:g}"]
    if args.send_rate != rate:
        parts += ["--send-rate", f"{args.send_rate:g}"]
    if args.no_faults:
        parts.append("--no-faults")
    if args.no_startup_faults:
        parts.append("--no-startup-faults")
    if args.deadlines:
        parts += ["--deadlines", f"{args.deadlines:g}"]
    if args.lifespans:
        parts += ["--lifespans", f"{args.lifespans:g}"]
    if args.max_entries:
        parts += ["--max-entries", str(args.max_entries)]
    if args.max_bytes:
        parts += ["--max-bytes", str(args.max_bytes)]
    if args.capacity_changes:
        parts += ["--capacity-changes", f"{args.capacity_changes:g}"]
    for item in args.set:
        parts += ["--set", item]
    return shlex.join(parts)


class _Progress:
    """Progress on stderr: a rewritten line on a terminal, an occasional line otherwise."""

    def __init__(self, total: int, stream: TextIO) -> None:
        self.total = total
        self.stream = stream
        self.tty = stream.isatty()
        self.done = 0
        self.failed = 0
        self.started = time.monotonic()
        self.last = 0.0

    def update(self, result: SeedResult) -> None:
        self.done += 1
        self.failed += 0 if result.ok else 1
        now = time.monotonic()
        if now - self.last < (0.3 if self.tty else 10.0) and self.done < self.total:
            return
        self.last = now
        rate = self.done / max(now - self.started, 1e-9)
        line = f"sim: {self.done}/{self.total} seeds, {self.failed} failing, {rate:.1f} seeds/s"
        if self.tty:
            self.stream.write("\r" + line + ("\n" if self.done == self.total else ""))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()


def run(args: argparse.Namespace) -> int:
    out = sys.stdout
    if args.seeds < 1:
        print("sim: --seeds must be at least 1", file=sys.stderr)
        return 2
    if args.start < 0:
        print("sim: --start must be 0 or more", file=sys.stderr)
        return 2
    _fill_defaults(args)
    jobs = default_jobs() if args.jobs is None else args.jobs
    if jobs < 1:
        print("sim: --jobs must be at least 1", file=sys.stderr)
        return 2
    try:
        scenario = Scenario(
            members=args.members,
            stack=args.stack,
            overrides=parse_overrides(args.set),
            faults=not args.no_faults,
            startup_faults=not args.no_startup_faults,
            safety_time=args.safety_time,
            send_rate=args.send_rate,
            deadlines=args.deadlines,
            lifespans=args.lifespans,
            max_entries=args.max_entries,
            max_bytes=args.max_bytes,
            capacity_changes=args.capacity_changes,
        )
        # Fail on a bad stack before starting workers: one clear message instead of one per seed.
        resolve_config(build_spec(scenario.stack, [slot_endpoint(0)], scenario.overrides))
    except (ConfigError, ValueError) as exc:
        print(f"sim: {exc}", file=sys.stderr)
        return 2

    if not args.verbose:
        # Under faults, members warn all the time (suspicions, timeouts); errors still show.
        MEMBER_LOG.setLevel(max(MEMBER_LOG.getEffectiveLevel(), logging.ERROR))
    seeds = range(args.start, args.start + args.seeds)
    progress = _Progress(len(seeds), sys.stderr)
    total_events = 0
    total_violations = 0
    for result in run_many(
        seeds,
        scenario,
        jobs=jobs,
        record_dir=args.record,
        determinism=args.check_determinism,
        on_result=progress.update,
    ):
        total_events += result.events
        total_violations += len(result.violations)
        if args.json:
            doc = result.to_json()
            if not result.ok:
                doc["replay"] = replay_command(args, result.seed)
            out.write(json.dumps(doc) + "\n")
        elif not result.ok:
            _print_failure(out, args, result)
        elif args.verbose:
            conv = "never" if result.converged_at is None else f"t={result.converged_at:.3f}"
            st = result.stats
            work = (
                f"{st['grid_ops']} grid operations ({st['grid_ops_failed']} failed)"
                if "grid_ops" in st
                else f"{st['sent']} sent, {st['delivered']} delivered"
            )
            if "grid_tx" in st:
                work += f", {st['grid_tx']} transactions ({st['grid_tx_ok']} committed)"
            out.write(
                f"seed {result.seed}: ok, {result.events} events, {work}, converged {conv}; faults: "
                f"{', '.join(result.kinds) or 'none'}\n"
            )
        out.flush()
    out.write(f"sim: {len(seeds)} seeds, {total_events} events, {total_violations} violations\n")
    out.flush()
    return 0 if total_violations == 0 else 1


def _print_failure(out: TextIO, args: argparse.Namespace, result: SeedResult) -> None:
    n = len(result.violations)
    out.write(
        f"seed {result.seed}: {n} violation{'s' if n != 1 else ''} "
        f"(faults: {', '.join(result.kinds) or 'none'}; {result.plan})\n"
    )
    # A few of each property, so one flood (say, thousands of FIFO breaks) does not hide the others.
    shown: dict[str, int] = {}
    for v in result.violations:
        k = shown.get(v.property, 0)
        shown[v.property] = k + 1
        if k < MAX_PRINTED_PER_PROPERTY:
            out.write(f"  seed {result.seed}: {v.property}: {v.member}: {v.detail}\n")
    for prop, k in shown.items():
        if k > MAX_PRINTED_PER_PROPERTY:
            out.write(f"  seed {result.seed}: ... and {k - MAX_PRINTED_PER_PROPERTY} more {prop} violations\n")
    out.write(f"  replay: {replay_command(args, result.seed)}\n")
