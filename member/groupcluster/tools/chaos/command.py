"""``groupcluster chaos``: its arguments, and the command that runs one :class:`Chaos` and prints its report."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import TextIO

from ..local_cluster import DEFAULT_OWNERS, MAX_MEMBERS
from .errors import ChaosError
from .report import ChaosResult, format_report
from .runner import Chaos


def _minutes(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        v = -1.0
    if not 0 < v <= 24 * 60:
        raise argparse.ArgumentTypeError(f"expected minutes between 0 and 1440 (e.g. 1 or 0.5), got {text!r}")
    return v


def _seed(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        v = -1
    if v < 0:
        raise argparse.ArgumentTypeError(f"expected a seed: a whole number >= 0, got {text!r}")
    return v


def _members(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        v = 0
    if not DEFAULT_OWNERS + 1 <= v <= MAX_MEMBERS:
        raise argparse.ArgumentTypeError(
            f"expected {DEFAULT_OWNERS + 1} to {MAX_MEMBERS} members (more than num_owners {DEFAULT_OWNERS}, "
            f"so a replacement always has a surviving copy to take over), got {text!r}"
        )
    return v


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--minutes", type=_minutes, required=True, metavar="N", help="how long faults are injected (e.g. 1, 0.5)"
    )
    parser.add_argument(
        "--seed", type=_seed, required=True, metavar="S", help="seeds the fault schedule (same seed, same faults)"
    )
    parser.add_argument("--members", type=_members, default=4, metavar="M", help="members of the cluster (default 4)")
    parser.add_argument(
        "--dir", metavar="D", help="keep the cluster's state, logs and history here (default: a temp dir)"
    )
    parser.add_argument(
        "--capacity-changes",
        action="store_true",
        help="capacity changes are faults too: POST /v1/capacity 0, 0.5, 1 or 2 to a member (num_owners keep some)",
    )
    parser.add_argument("--json", action="store_true", help="the report as one JSON line (before the last line)")


def run(args: argparse.Namespace) -> int:
    if args.dir:
        directory = Path(args.dir).resolve()
        if (directory / "cluster.json").exists():
            print(
                f"groupcluster chaos: error: --dir {directory} already holds a cluster; use an empty directory",
                file=sys.stderr,
            )
            return 2
        directory.mkdir(parents=True, exist_ok=True)
    else:
        directory = Path(tempfile.mkdtemp(prefix="groupcluster-chaos-"))
    out: TextIO = sys.stderr if args.json else sys.stdout

    def say(line: str) -> None:
        out.write(line + "\n")
        out.flush()

    chaos = Chaos(
        directory,
        minutes=args.minutes,
        seed=args.seed,
        members=args.members,
        capacity_changes=args.capacity_changes,
        say=say,
    )
    result: ChaosResult | None = None
    try:
        result = chaos.run()
    except ChaosError as exc:
        print(f"groupcluster chaos: error (seed {args.seed}): {exc}", file=sys.stderr)
        print(f"groupcluster chaos: logs kept in {directory}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"groupcluster chaos: interrupted (seed {args.seed}); logs in {directory}", file=sys.stderr)
        return 130
    finally:
        chaos.cluster.stop(grace=5.0)
        chaos.cluster.kill_all()
    if result.ok and not args.dir:
        result.history = "not kept (a clean run in a temporary directory; --dir D keeps it)"
    if args.json:
        print(json.dumps(result.to_json()))
    else:
        print(format_report(result))
    if result.ok and not args.dir:
        shutil.rmtree(directory, ignore_errors=True)
    elif not result.ok:
        again = " --capacity-changes" if args.capacity_changes else ""
        print(f"replay: groupcluster chaos --minutes {args.minutes:g} --seed {args.seed}{again}; logs in {directory}")
    print(result.summary(), flush=True)
    return 0 if result.ok else 1
