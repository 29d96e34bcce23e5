"""Time to add a member to a running group, with and without FLUSH, on real processes over loopback.

    python bench/join_latency.py [--stack vsync] [--members 4] [--rounds 5] [--json]

Starts ``--members`` member processes on 127.0.0.11.. (all multicasting a light load), then adds one more,
``--rounds`` times (each added member leaves again before the next round). Reports, per added member, the
time from its stack's start to its first view with everyone (from its --record history: no process start-up
in it) and from its process launch to that view.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def member_cmd(name: str, host: str, port: int, hosts: str, stack: str, workdir: Path, rate: int) -> list[str]:
    return [
        sys.executable, "-m", "groupcluster.cli", "member", "--cluster", "joinbench", "--bind", f"{host}:{port}",
        "--hosts", hosts, "--stack", stack, "--record", str(workdir / f"{name}.jsonl"),
        "--status-file", str(workdir / f"{name}.json"), "--send-count", "1000000", "--send-rate", str(rate),
        "--payload-size", "100",
    ]  # fmt: skip


def status(workdir: Path, name: str) -> dict | None:
    try:
        return json.loads((workdir / f"{name}.json").read_text())
    except (OSError, ValueError):
        return None


def wait(pred, timeout: float, what: str) -> None:
    end = time.time() + timeout
    while time.time() < end:
        if pred():
            return
        time.sleep(0.02)
    raise SystemExit(f"join_latency: timed out waiting for {what}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stack", default="vsync", help="stack preset (default vsync: every join is flushed)")
    ap.add_argument("--members", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--rate", type=int, default=200, help="multicasts per second per existing member")
    ap.add_argument("--port", type=int, default=7900)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    hosts = [f"127.0.0.{11 + i}" for i in range(args.members + 1)]
    everyone = ",".join(f"{h}:{args.port}" for h in hosts)
    procs: list[subprocess.Popen] = []
    stack_times: list[float] = []
    launch_times: list[float] = []
    with tempfile.TemporaryDirectory(prefix="joinbench-") as tmp:
        workdir = Path(tmp)
        try:
            for i in range(args.members):
                cmd = member_cmd(f"m{i}", hosts[i], args.port, everyone, args.stack, workdir, args.rate)
                procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            names = [f"m{i}" for i in range(args.members)]
            wait(lambda: all(len(((status(workdir, n) or {}).get("view") or {}).get("members", [])) == args.members
                             for n in names), 60, "the first members to form one view")  # fmt: skip
            for r in range(args.rounds):
                name = f"joiner{r}"
                launched = time.time()
                p = subprocess.Popen(
                    member_cmd(name, hosts[-1], args.port, everyone, args.stack, workdir, args.rate),
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )

                def joined(name: str = name) -> bool:
                    view = (status(workdir, name) or {}).get("view") or {}
                    return len(view.get("members", [])) == args.members + 1

                wait(joined, 30, f"{name} to join")
                joined_wall = time.time()
                events = [json.loads(line) for line in (workdir / f"{name}.jsonl").read_text().splitlines()]
                start_t = next(e["t"] for e in events if e["kind"] == "start")
                view_t = next(e["t"] for e in events if e["kind"] == "view" and len(e["members"]) == args.members + 1)
                stack_times.append(view_t - start_t)
                launch_times.append(min(joined_wall, view_t) - launched)
                p.terminate()
                p.wait(15)
                wait(lambda: all(len(((status(workdir, n) or {}).get("view") or {}).get("members", [])) == args.members
                                 for n in names), 30, "the joiner to leave")  # fmt: skip
        finally:
            for p in procs:
                p.kill()
            for p in procs:
                p.wait()
    result = {
        "stack": args.stack,
        "members_before": args.members,
        "rounds": args.rounds,
        "join_ms_median": round(statistics.median(stack_times) * 1000, 1),
        "join_ms_max": round(max(stack_times) * 1000, 1),
        "launch_to_view_ms_median": round(statistics.median(launch_times) * 1000, 1),
    }
    if args.json:
        print(json.dumps(result))
    else:
        print(
            f"{args.stack}: adding member {args.members + 1} took {result['join_ms_median']} ms median "
            f"(max {result['join_ms_max']} ms) from its stack's start to the view with everyone; "
            f"{result['launch_to_view_ms_median']} ms from process launch (Python start-up included); "
            f"{args.rounds} rounds"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
