"""Multicast latency at a fixed offered load: p50/p99 from send to delivery, 4 member processes on loopback.

    python bench/latency.py --stack total-order --rate 1000 --seconds 4 --repeat 3
    python bench/latency.py --stack fifo --rate 2000 --json

Every member sends ``--rate`` messages per second (all members send, so the offered load is
``members * rate``) of ``--size`` bytes for ``--seconds``, through the same worker as ``groupcluster bench``
(:mod:`groupcluster.bench.workers`: the payload carries its send time, one clock for all processes, each
sender's first tenth skipped). Unlike the peers suite, the load is fixed rather than half of a peak measured
just before, so runs before and after a change are paced identically and compare directly. The figure of a
run is the median over members of each member's p50/p99; the repeats are reported with their median, and
the first delivery's delay after the first send (start-up latency, counted in the issue) alongside.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from typing import Any

from groupcluster.bench.model import GROUPCLUSTER, Workload, latency
from groupcluster.bench.runner import Runner, Settings


def run(args: argparse.Namespace) -> dict[str, Any]:
    order = "fifo" if args.stack == "fifo" else "total-order"
    w = Workload(f"{order}-latency", order, args.members, args.members, args.size, kind="latency")
    runner = Runner(Settings(timeout=args.timeout), progress=lambda s: print(s, file=sys.stderr))
    count = max(int(args.rate * args.seconds), 100)
    runs = []
    for i in range(args.repeat):
        reports = runner.run_once(GROUPCLUSTER, w, count, args.rate)
        p50, p99 = latency(reports)
        first_send = min(r.send_start for r in reports if r.send_start is not None)
        first_delay = statistics.median((r.first or first_send) - first_send for r in reports)
        runs.append({"p50_ms": p50, "p99_ms": p99, "first_delivery_s": first_delay})
        print(
            f"  run {i + 1}/{args.repeat}: p50 {p50:.2f} ms, p99 {p99:.2f} ms, first delivery "
            f"{first_delay:.3f} s after the first send",
            file=sys.stderr,
        )
    return {
        "stack": args.stack,
        "members": args.members,
        "rate_per_member": args.rate,
        "offered_msgs_per_s": args.rate * args.members,
        "size": args.size,
        "runs": runs,
        "p50_ms": statistics.median(r["p50_ms"] for r in runs),
        "p99_ms": statistics.median(r["p99_ms"] for r in runs),
        "first_delivery_s": statistics.median(r["first_delivery_s"] for r in runs),
        "loadavg": os.getloadavg(),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stack", choices=("fifo", "total-order"), default="total-order")
    parser.add_argument("--members", type=int, default=4)
    parser.add_argument("--rate", type=float, default=1000.0, help="messages per second per member")
    parser.add_argument("--seconds", type=float, default=4.0, help="how long each member sends")
    parser.add_argument("--size", type=int, default=100, help="payload bytes")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args()
    result = run(args)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(
            f"{args.stack}, {args.members} members x {args.rate:g} msgs/s of {args.size} B "
            f"({result['offered_msgs_per_s']:g} msgs/s offered): p50 {result['p50_ms']:.2f} ms, "
            f"p99 {result['p99_ms']:.2f} ms, first delivery {result['first_delivery_s']:.3f} s "
            f"(medians of {args.repeat}; load average {' / '.join(f'{x:.1f}' for x in result['loadavg'])})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
