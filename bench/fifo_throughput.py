"""Multicast throughput: N member processes on loopback, all sending, fixed-size messages.

    python bench/fifo_throughput.py [--members 4] [--messages 25000] [--size 100] [--transport udp] [--json]
    python bench/fifo_throughput.py --stack total-order     # total order (SEQUENCER), same measurement

Every member multicasts ``--messages`` messages as fast as flow control allows once the view is complete;
each member reports when it delivered its first and its last message. The figure per member is the
messages it delivered divided by that span (the JGroups 2.12 peer figure is measured the same way: about
40k messages per member per second on our 2-core machines; the target is 60k). ``--profile DIR`` runs
member 1 under cProfile and prints its hottest functions. The ``e2e/s`` column divides by the time from the
first send of any member to the member's last delivery instead (start-up latency included); ``1st dlv s`` is
when the member delivered its first message, after that first send (a late one means the stack delivered in a
burst at the end). ``--json`` includes every member's protocol counters (``metrics``: retransmissions,
duplicates, the sequencer's forwards and windows, ...).
"""

from __future__ import annotations

import argparse
import json
import os
import pstats
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# Peer figures and targets per stack (../shared/ANCHORS.md and the issues).
PEERS = {
    "fifo": "JGroups 2.12 on this machine: ~40k/s; target >= 60k/s",
    "total-order": "JGroups 2.12 SEQUENCER on our machines: 16k-24k/s; target >= 40k/s",
}

# ``groupcluster`` with every layer registered (the total-order stack needs the sequencer).
LAUNCHER = Path(__file__).with_name("member_launcher.py")


def free_port(hosts: list[str], transport: str) -> int:
    kind = socket.SOCK_DGRAM if transport == "udp" else socket.SOCK_STREAM
    for _ in range(50):
        with socket.socket(socket.AF_INET, kind) as s:
            s.bind((hosts[0], 0))
            port = s.getsockname()[1]
        try:
            for host in hosts[1:]:
                with socket.socket(socket.AF_INET, kind) as s:
                    s.bind((host, port))
        except OSError:
            continue
        return port
    raise RuntimeError("no free port")


def run(args: argparse.Namespace) -> dict[str, Any]:
    hosts = [f"127.0.0.{11 + i}" for i in range(args.members)]
    port = free_port(hosts, args.transport)
    everyone = ",".join(f"{h}:{port}" for h in hosts)
    workdir = Path(tempfile.mkdtemp(prefix="gc-bench-"))
    total = args.members * args.messages
    procs: list[subprocess.Popen[bytes]] = []
    status_files = []
    profile = Path(args.profile) / "member1.prof" if args.profile else None
    try:
        for i, host in enumerate(hosts):
            status = workdir / f"m{i + 1}.json"
            status_files.append(status)
            prefix = [sys.executable]
            if profile is not None and i == 0:
                profile.parent.mkdir(parents=True, exist_ok=True)
                prefix += ["-m", "cProfile", "-o", str(profile)]
            argv = [
                *prefix,
                str(LAUNCHER),
                "member",
                "--cluster",
                f"bench-{os.getpid()}",
                "--bind",
                f"{host}:{port}",
                "--hosts",
                everyone,
                "--transport",
                args.transport,
                "--stack",
                args.stack,
                "--send-count",
                str(args.messages),
                "--payload-size",
                str(args.size),
                "--start-when-members",
                str(args.members),
                "--exit-after-delivered",
                str(total),
                "--status-file",
                str(status),
            ]
            log = open(workdir / f"m{i + 1}.log", "wb")  # noqa: SIM115  # closed with the process
            procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT))
        start = time.monotonic()
        for i, p in enumerate(procs):
            remaining = args.timeout - (time.monotonic() - start)
            try:
                code = p.wait(timeout=max(remaining, 1))
            except subprocess.TimeoutExpired:
                msg = f"member {i + 1} did not finish within {args.timeout:g}s (logs in {workdir})"
                raise SystemExit(msg) from None
            if code != 0:
                log_text = (workdir / f"m{i + 1}.log").read_text()
                raise SystemExit(f"member {i + 1} exited with {code}; log:\n{log_text}")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    rows = []
    statuses = [json.loads(path.read_text()) for path in status_files]
    # The first send anywhere: the end-to-end figure counts the start-up latency too (a stack that delivers
    # in large late bursts, like a uniform total order, looks better from first to last delivery alone).
    first_send = min(st["send_started"] for st in statuses if st.get("send_started"))
    for i, st in enumerate(statuses):
        span = (st["last_delivery"] or 0) - (st["first_delivery"] or 0)
        rate = st["delivered_total"] / span if span > 0 else 0.0
        m = st["metrics"]
        rows.append(
            {
                "member": i + 1,
                "delivered": st["delivered_total"],
                "seconds": round(span, 3),
                "msgs_per_s": round(rate),
                "e2e_msgs_per_s": round(st["delivered_total"] / max((st["last_delivery"] or 0) - first_send, 1e-9)),
                "cpu_seconds": st.get("cpu_seconds"),
                "cpu_us_per_delivery": round(
                    1e6 * (st["cpu_at_last_delivery"] - st["cpu_at_first_delivery"]) / max(st["delivered_total"], 1), 2
                ),
                "send_seconds": round(st["send_finished"] - st["send_started"], 3),
                # How long after the first send anywhere this member delivered its first message.
                "first_delivery_after_s": round((st["first_delivery"] or first_send) - first_send, 3),
                "frames_sent": m.get("transport.frames_sent", 0),
                "frames_received": m.get("transport.frames_received", 0),
                "retransmissions": m.get("nakack.xmit_sent", 0),
                "metrics": m,
            }
        )
    shutil.rmtree(workdir, ignore_errors=True)  # kept only when a member failed (the error names it)
    rates = [r["msgs_per_s"] for r in rows]
    result = {
        "members": args.members,
        "messages_per_member": args.messages,
        "size": args.size,
        "transport": args.transport,
        "stack": args.stack,
        "per_member": rows,
        "min_msgs_per_s": min(rates),
        "median_msgs_per_s": round(statistics.median(rates)),
        "max_msgs_per_s": max(rates),
        "median_e2e_msgs_per_s": round(statistics.median(r["e2e_msgs_per_s"] for r in rows)),
        "min_e2e_msgs_per_s": min(r["e2e_msgs_per_s"] for r in rows),
    }
    # What the CPU cost allows when every core works for the members (the measured rate is lower when other
    # processes share the machine): cores / (members * CPU seconds per delivered message).
    cpu_us = statistics.median(r["cpu_us_per_delivery"] for r in rows)
    cores = min(os.cpu_count() or 1, args.members)
    result["median_cpu_us_per_delivery"] = cpu_us
    result["cpu_bound_msgs_per_s"] = round(cores * 1e6 / (args.members * cpu_us)) if cpu_us > 0 else None
    if profile is not None:
        result["profile"] = str(profile)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--members", type=int, default=4)
    parser.add_argument("--messages", type=int, default=25000, help="messages each member multicasts")
    parser.add_argument("--size", type=int, default=100, help="payload bytes")
    parser.add_argument("--transport", choices=("udp", "tcp"), default="udp")
    parser.add_argument("--stack", default="fifo", help="preset or YAML stack file")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--profile", metavar="DIR", help="run member 1 under cProfile, write DIR/member1.prof")
    args = parser.parse_args()
    result = run(args)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(
            f"{args.members} members, {args.messages} messages of {args.size} B each, {args.transport}, "
            f"stack {args.stack}: delivered messages per member per second"
        )
        print(
            f"  {'member':>6} {'delivered':>10} {'seconds':>8} {'msgs/s':>8} {'e2e/s':>8} {'send s':>7} "
            f"{'1st dlv s':>9} {'cpu us/msg':>10} {'frames out':>10} {'frames in':>10} {'xmits':>6}"
        )
        for r in result["per_member"]:
            print(
                f"  {r['member']:>6} {r['delivered']:>10} {r['seconds']:>8.2f} {r['msgs_per_s']:>8} "
                f"{r['e2e_msgs_per_s']:>8} {r['send_seconds']:>7.2f} {r['first_delivery_after_s']:>9.2f} "
                f"{r['cpu_us_per_delivery']:>10} "
                f"{r['frames_sent']:>10} {r['frames_received']:>10} {r['retransmissions']:>6}"
            )
        print(
            f"  min {result['min_msgs_per_s']}/s, median {result['median_msgs_per_s']}/s, "
            f"max {result['max_msgs_per_s']}/s ({PEERS.get(args.stack, 'no peer figure for this stack')})"
        )
        print(
            f"  end to end (from the first send anywhere to the member's last delivery): "
            f"min {result['min_e2e_msgs_per_s']}/s, median {result['median_e2e_msgs_per_s']}/s"
        )
        print(
            f"  CPU: {result['median_cpu_us_per_delivery']} us per delivered message (median); with "
            f"{min(os.cpu_count() or 1, args.members)} cores free for the members that allows "
            f"~{result['cpu_bound_msgs_per_s']}/s per member"
        )
    if args.profile:
        print(f"\nProfile of member 1 ({result['profile']}), top functions by own time:")
        pstats.Stats(result["profile"]).sort_stats("tottime").print_stats(25)
    return 0


if __name__ == "__main__":
    sys.exit(main())
