"""What frame authentication costs: bench/fifo_throughput.py without a secret, with HMAC and with encryption.

    python bench/auth_throughput.py [--members 4] [--messages 25000] [--size 100] [--rounds 2] [--json]

Each round runs the three configurations one after the other (interleaved, so a busy machine slows them
alike) and the table shows the median of the rounds: messages delivered per member per second and CPU
microseconds per delivered message. A second table measures the envelope alone (seal + open per frame,
in one process) for a few frame sizes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

FIFO_BENCH = Path(__file__).with_name("fifo_throughput.py")
MODES = ("none", "hmac", "encrypt")


def stack_file(workdir: Path, mode: str, key: Path) -> str:
    if mode == "none":
        return "fifo"
    path = workdir / f"{mode}.yaml"
    overrides = {"auth_secret_file": str(key), "encrypt": mode == "encrypt"}
    path.write_text(json.dumps({"preset": "fifo", "overrides": {"transport": overrides}}))  # JSON is YAML
    return str(path)


def run_fifo(args: argparse.Namespace, stack: str) -> dict[str, Any]:
    argv = [sys.executable, str(FIFO_BENCH), "--members", str(args.members), "--messages", str(args.messages),
            "--size", str(args.size), "--stack", stack, "--json"]  # fmt: skip
    out = subprocess.run(argv, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"fifo_throughput.py failed for {stack}:\n{out.stdout}\n{out.stderr}")
    return json.loads(out.stdout)


def envelope_micro(sizes: tuple[int, ...] = (200, 4096, 60 * 1024), n: int = 5000) -> list[dict[str, Any]]:
    from groupcluster.protocols.auth import FrameAuth

    rows = []
    for size in sizes:
        frame = os.urandom(size)
        for encrypt in (False, True):
            sender = FrameAuth([b"k" * 32], "bench", session=os.urandom(16), encrypt=encrypt)
            receiver = FrameAuth([b"k" * 32], "bench", session=os.urandom(16), encrypt=encrypt, window=1 << 14)
            count = max(200, n * 200 // max(size, 200))
            t0 = time.perf_counter()
            sealed = [sender.seal(frame) for _ in range(count)]
            t1 = time.perf_counter()
            for s in sealed:
                receiver.open(s, 0.0)
            t2 = time.perf_counter()
            rows.append(
                {
                    "frame_bytes": size,
                    "mode": "encrypt" if encrypt else "hmac",
                    "seal_us": round(1e6 * (t1 - t0) / count, 2),
                    "open_us": round(1e6 * (t2 - t1) / count, 2),
                }
            )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--members", type=int, default=4)
    parser.add_argument("--messages", type=int, default=25000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="gc-auth-bench-"))
    key = workdir / "cluster.key"
    key.write_text(os.urandom(32).hex() + "\n")
    results: dict[str, list[dict[str, Any]]] = {m: [] for m in MODES}
    for r in range(args.rounds):
        for mode in MODES:
            res = run_fifo(args, stack_file(workdir, mode, key))
            results[mode].append(res)
            print(f"round {r + 1} {mode}: median {res['median_msgs_per_s']}/s", file=sys.stderr)
    summary = {
        mode: {
            "median_msgs_per_s": round(statistics.median(x["median_msgs_per_s"] for x in rs)),
            "median_cpu_us_per_delivery": round(statistics.median(x["median_cpu_us_per_delivery"] for x in rs), 2),
            "rounds": [x["median_msgs_per_s"] for x in rs],
        }
        for mode, rs in results.items()
    }
    micro = envelope_micro()
    if args.json:
        print(json.dumps({"throughput": summary, "envelope": micro}, indent=2))
        return 0
    print(f"{args.members} members, {args.messages} messages of {args.size} B each, fifo stack, udp")
    print(f"  {'auth':>8} {'msgs/s':>8} {'cpu us/msg':>10}  rounds")
    for mode, s in summary.items():
        print(f"  {mode:>8} {s['median_msgs_per_s']:>8} {s['median_cpu_us_per_delivery']:>10}  {s['rounds']}")
    print("envelope alone (one process):")
    print(f"  {'frame B':>8} {'mode':>8} {'seal us':>8} {'open us':>8}")
    for row in micro:
        print(f"  {row['frame_bytes']:>8} {row['mode']:>8} {row['seal_us']:>8} {row['open_us']:>8}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
