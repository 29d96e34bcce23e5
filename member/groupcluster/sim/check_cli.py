"""``groupcluster check FILE...``: run the safety checkers over histories recorded by real member processes.

The files are JSON lines written by ``groupcluster member --record FILE`` (one per member); they are merged
by time into one history and judged by the same checkers as simulated runs (``--stack vsync`` or
``--stack total-order`` adds the properties those stacks promise). Each violation prints on its
own line; the last line of standard output is ``check: <E> events, <V> violations``; the exit status is 0
only when V is 0 (2 when a file cannot be read).
"""

from __future__ import annotations

import argparse
import json
import sys

from .checkers import SAFETY_CHECKERS, check_merge_convergence, check_safety
from .grid import checkers, tx_checkers  # noqa: F401  (register --stack grid and grid-tx)
from .history import History, HistoryEvent
from .history_index import HistoryFormatError, HistoryIndex
from .stack_checkers import STACK_CHECKERS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("files", nargs="+", metavar="FILE", help="history files (JSON lines), one per member")
    parser.add_argument(
        "--skip",
        action="append",
        default=[],
        choices=sorted(SAFETY_CHECKERS),
        metavar="PROPERTY",
        help=f"leave out one checker (repeatable); one of: {', '.join(SAFETY_CHECKERS)}",
    )
    parser.add_argument(
        "--converged",
        action="store_true",
        help="also require that the members alive at the end ended in one view holding exactly them",
    )
    parser.add_argument(
        "--stack",
        choices=sorted(STACK_CHECKERS),
        help="also check what this stack preset promises (vsync: virtual synchrony; total-order: one order)",
    )
    parser.add_argument("--json", action="store_true", help="print violations as JSON objects")


def read_histories(paths: list[str]) -> History:
    """Like :meth:`History.read_many`, but a bad line is reported with its file and line number."""
    events: list[HistoryEvent] = []
    for path in paths:
        with open(path) as fh:
            for lineno, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    events.append(HistoryEvent.from_json(line))
                except (ValueError, TypeError) as exc:
                    raise HistoryFormatError(f"{path}:{lineno}: not a history event: {exc}") from None
    events.sort(key=lambda e: e.t)
    return History(events)


def run(args: argparse.Namespace) -> int:
    try:
        history = read_histories(args.files)
        index = HistoryIndex(history)
        violations = check_safety(index, skip=args.skip)
        if args.converged:
            violations.extend(check_merge_convergence(index))
        for checker in STACK_CHECKERS.get(args.stack or "", {}).values():
            violations.extend(checker(index))
    except (OSError, HistoryFormatError) as exc:
        print(f"check: {exc}", file=sys.stderr)
        return 2
    for v in violations:
        print(json.dumps(v.to_json()) if args.json else str(v))
    print(f"check: {len(history)} events, {len(violations)} violations")
    return 0 if not violations else 1
