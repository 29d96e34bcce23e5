"""Time to add a member to a running group, with and without FLUSH, on real processes over loopback.

    python bench/join_latency.py [--stack vsync] [--members 4] [--rounds 5] [--transport udp] [--warm-rounds 5] [--json]

Starts ``--members`` member processes on 127.0.0.1 (each on its own free port, all multicasting a light
load), then adds one more, ``--rounds`` times (each added member leaves again before the next round).
Reports, per added member, the time from its stack's start to its first view with everyone (from its
--record history: no process start-up in it) and from its process launch to that view. ``--json`` prints one
object with the medians and every round's figures (``join_ms``, ``launch_to_view_ms``): the
``groupcluster bench`` suite reads it (workloads ``join-4`` and ``join-flush-4``). ``--warm-rounds K`` then
joins K more times from this script's own process (``Channel.connect`` .. ``leave``, the imports and first
use paid once): ``warm_join_ms`` is each one's time from ``connect`` to the view with everyone.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from groupcluster.tools.local_cluster import free_ports

HOST = "127.0.0.1"


def member_cmd(name: str, port: int, hosts: str, args: argparse.Namespace, workdir: Path) -> list[str]:
    return [
        sys.executable, "-m", "groupcluster.cli", "member", "--cluster", args.cluster, "--bind", f"{HOST}:{port}",
        "--hosts", hosts, "--stack", args.stack, "--transport", args.transport,
        "--record", str(workdir / f"{name}.jsonl"), "--status-file", str(workdir / f"{name}.json"),
        "--send-count", "1000000", "--send-rate", str(args.rate), "--payload-size", "100",
    ]  # fmt: skip


def status(workdir: Path, name: str) -> dict[str, Any] | None:
    try:
        return json.loads((workdir / f"{name}.json").read_text())
    except (OSError, ValueError):
        return None


def view_size(workdir: Path, name: str) -> int:
    return len(((status(workdir, name) or {}).get("view") or {}).get("members", []))


def wait(pred: Callable[[], bool], timeout: float, what: str) -> None:
    end = time.time() + timeout
    while time.time() < end:
        if pred():
            return
        time.sleep(0.02)
    raise SystemExit(f"join_latency: timed out waiting for {what}")


def join_time(events: list[dict[str, Any]], size: int) -> tuple[float, float]:
    """(stack start, first view with ``size`` members) from a member's recorded history, in its clock."""
    start_t = next(e["t"] for e in events if e["kind"] == "start")
    view_t = next(e["t"] for e in events if e["kind"] == "view" and len(e["members"]) == size)
    return start_t, view_t


def wait_recorded(workdir: Path, name: str, size: int, timeout: float = 10.0) -> tuple[float, float]:
    """(start, view) from ``name``'s history once it holds both (the last line may be half-written)."""
    end = time.time() + timeout
    while True:
        try:
            lines = (workdir / f"{name}.jsonl").read_text().splitlines()
            return join_time([json.loads(line) for line in lines if line.endswith("}")], size)
        except (OSError, ValueError, StopIteration):
            if time.time() > end:
                raise SystemExit(f"join_latency: {name}'s history never recorded a view of {size}") from None
            time.sleep(0.02)


async def warm_joins(args: argparse.Namespace, port: int, everyone: str, left: Callable[[], None]) -> list[float]:
    """``--warm-rounds`` joins from this one process: seconds from ``Channel.connect`` to the view with everyone.

    Each joiner leaves, and the next connects once every member has seen it go (``left``).
    """
    from groupcluster.runtime.channel import Channel

    times = []
    for _ in range(args.warm_rounds):
        t0 = time.perf_counter()
        ch = await Channel.connect(
            args.cluster,
            bind=(HOST, port),
            initial_hosts=everyone.split(","),
            stack=args.stack,
            transport=args.transport,
        )
        await ch.wait_for_view(lambda v: len(v) >= args.members + 1, timeout=30.0)
        times.append(time.perf_counter() - t0)
        await ch.leave()
        await asyncio.to_thread(left)
    return times


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stack", default="vsync", help="stack preset (default vsync: every join is flushed)")
    ap.add_argument("--members", type=int, default=4, help="members before the join")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--rate", type=int, default=200, help="multicasts per second per existing member")
    ap.add_argument("--transport", choices=("udp", "tcp"), default="udp")
    ap.add_argument("--cluster", default="joinbench")
    ap.add_argument("--warm-rounds", type=int, default=0, help="then this many joins in this one process")
    ap.add_argument("--json", action="store_true", help="print one JSON object (medians and every round)")
    args = ap.parse_args()
    for name in ("members", "rounds", "rate"):
        if getattr(args, name) <= 0:
            ap.error(f"--{name} must be positive")
    ports = free_ports(args.members + 1)
    everyone = ",".join(f"{HOST}:{p}" for p in ports)
    procs: list[subprocess.Popen[bytes]] = []
    stack_times: list[float] = []
    launch_times: list[float] = []
    warm_times: list[float] = []
    with tempfile.TemporaryDirectory(prefix="joinbench-") as tmp:
        workdir = Path(tmp)
        try:
            for i in range(args.members):
                cmd = member_cmd(f"m{i}", ports[i], everyone, args, workdir)
                procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            names = [f"m{i}" for i in range(args.members)]
            wait(lambda: all(view_size(workdir, n) == args.members for n in names), 60, "the first members' view")
            for r in range(args.rounds):
                name = f"joiner{r}"
                launched = time.time()
                p = subprocess.Popen(
                    member_cmd(name, ports[-1], everyone, args, workdir),
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
                procs.append(p)  # killed with the others if this round fails
                wait(lambda name=name: view_size(workdir, name) == args.members + 1, 30, f"{name} to join")
                joined_wall = time.time()
                # The history is written in batches (every 0.25 s): wait for the view to be on record.
                start_t, view_t = wait_recorded(workdir, name, args.members + 1)
                stack_times.append(view_t - start_t)
                launch_times.append(min(joined_wall, view_t) - launched)
                p.terminate()
                p.wait(15)
                procs.remove(p)
                wait(lambda: all(view_size(workdir, n) == args.members for n in names), 30, "the joiner to leave")
            if args.warm_rounds > 0:

                def left() -> None:
                    wait(lambda: all(view_size(workdir, n) == args.members for n in names), 30, "the joiner to leave")

                warm_times.extend(asyncio.run(warm_joins(args, ports[-1], everyone, left)))
        finally:
            for p in procs:
                p.kill()
            for p in procs:
                p.wait()
    result = {
        "stack": args.stack,
        "transport": args.transport,
        "members_before": args.members,
        "rounds": args.rounds,
        "join_ms_median": round(statistics.median(stack_times) * 1000, 1),
        "join_ms_max": round(max(stack_times) * 1000, 1),
        "launch_to_view_ms_median": round(statistics.median(launch_times) * 1000, 1),
        "join_ms": [round(t * 1000, 2) for t in stack_times],
        "launch_to_view_ms": [round(t * 1000, 2) for t in launch_times],
        "warm_join_ms": [round(t * 1000, 2) for t in warm_times],
    }
    if args.json:
        print(json.dumps(result))
    else:
        print(
            f"{args.stack} over {args.transport}: adding member {args.members + 1} took {result['join_ms_median']} "
            f"ms median (max {result['join_ms_max']} ms) from its stack's start to the view with everyone; "
            f"{result['launch_to_view_ms_median']} ms from process launch (Python start-up included); "
            f"{args.rounds} rounds"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
