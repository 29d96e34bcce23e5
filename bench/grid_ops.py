"""Grid benchmark on loopback: operations per second through the client, and rebalance MB/s when a member joins.

    .venv/bin/python bench/grid_ops.py [--ops 5000] [--concurrency 32] [--value-size 100] [--rebalance-mb 20]

1. Starts 3 ``groupcluster member --grid --http`` processes (127.0.0.31 and up).
2. PUT then GET ``--ops`` keys through :class:`~groupcluster.grid.client.AsyncGridClient` (routing to owners)
   with ``--concurrency`` requests in flight; prints operations per second and latency percentiles.
3. Loads ``--rebalance-mb`` MB of data (values of ``--rebalance-value-size`` bytes, batched), starts a 4th member and
   times from its start until every member reports a balanced topology with 4 members; MB/s is what the
   joiner received (key and value bytes, from its ``/metrics``) over the time from its join to the end of
   the rebalance (polled every 50 ms, so short rebalances read a little slow).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from groupcluster.grid.client import AsyncGridClient

HOSTS = [f"127.0.0.{31 + i}" for i in range(4)]


def free_port(kind: int) -> int:
    for _ in range(50):
        with socket.socket(socket.AF_INET, kind) as s:
            s.bind((HOSTS[0], 0))
            port = s.getsockname()[1]
        ok = True
        for h in HOSTS[1:]:
            with socket.socket(socket.AF_INET, kind) as s:
                try:
                    s.bind((h, port))
                except OSError:
                    ok = False
        if ok:
            return port
    raise RuntimeError("no free port")


def get_json(url: str) -> Any:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return json.loads(r.read())
    except Exception:
        return None


def metric(url: str, name: str) -> float:
    with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    return 0.0


def settled(urls: list[str]) -> bool:
    tops = set()
    for u in urls:
        st = get_json(u + "/v1/status")
        if not st or not st.get("grid") or len(st["view"]["members"]) != len(urls):
            return False
        g = st["grid"]
        if g["phase"] != "NO_REBALANCE" or g["availability"] != "AVAILABLE" or not g["ready"]:
            return False
        tops.add(g["topology_id"])
    return len(tops) == 1


def wait(what: str, pred: Any, timeout: float, poll: float = 0.1) -> float:
    start = time.monotonic()
    while not pred():
        if time.monotonic() - start > timeout:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(poll)
    return time.monotonic()


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))] * 1000 if xs else 0.0


async def run_ops(urls: list[str], n: int, conc: int, size: int, prefix: str) -> dict[str, Any]:
    value = os.urandom(size)
    out: dict[str, Any] = {}
    async with AsyncGridClient(urls, max_connections=conc) as c:
        for op in ("put", "get"):
            lat: list[float] = []
            sem = asyncio.Semaphore(conc)

            async def one(i: int, op: str = op, lat: list[float] = lat, sem: asyncio.Semaphore = sem) -> None:
                async with sem:
                    t0 = time.perf_counter()
                    key = f"{prefix}{i}".encode()
                    if op == "put":
                        await c.put(key, value)
                    else:
                        assert await c.get(key) == value
                    lat.append(time.perf_counter() - t0)

            t0 = time.perf_counter()
            await asyncio.gather(*(one(i) for i in range(n)))
            dt = time.perf_counter() - t0
            out[op] = {"ops_per_s": n / dt, "p50_ms": pct(lat, 50), "p99_ms": pct(lat, 99)}
        out["client"] = dict(c.stats)
    return out


async def load(urls: list[str], total_bytes: int, size: int, conc: int) -> int:
    n = max(1, total_bytes // size)
    value = b"v" * size
    # Batched (POST /v1/batch): the load is set-up, not what this step measures.
    async with AsyncGridClient(urls, max_connections=conc, batch_size=max(1, min(1000, (1 << 22) // size))) as c:
        for start in range(0, n, 20_000):
            await c.put_many({f"bulk-{i}".encode(): value for i in range(start, min(n, start + 20_000))})
    return n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", type=int, default=5000)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--value-size", type=int, default=100)
    ap.add_argument("--rebalance-mb", type=float, default=20.0)
    ap.add_argument("--rebalance-value-size", type=int, default=10_000)
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = ap.parse_args()

    port, http_port = free_port(socket.SOCK_DGRAM), free_port(socket.SOCK_STREAM)
    everyone = ",".join(f"{h}:{port}" for h in HOSTS)
    urls = [f"http://{h}:{http_port}" for h in HOSTS]
    work = Path(tempfile.mkdtemp(prefix="grid-bench-"))
    procs: list[subprocess.Popen[bytes]] = []

    def start(i: int) -> None:
        argv = [sys.executable, "-m", "groupcluster.cli", "member", "--cluster", f"bench-{os.getpid()}"]
        argv += ["--bind", f"{HOSTS[i]}:{port}", "--hosts", everyone, "--grid", "--http", f"{HOSTS[i]}:{http_port}"]
        with open(work / f"m{i}.log", "wb") as log:
            procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))

    try:
        for i in range(3):
            start(i)
        wait("3 members", lambda: settled(urls[:3]), 60)
        ops = asyncio.run(run_ops(urls[:3], args.ops, args.concurrency, args.value_size, "k"))
        n = asyncio.run(load(urls[:3], int(args.rebalance_mb * 1024 * 1024), args.rebalance_value_size, 16))
        t_start = time.monotonic()
        start(3)
        t_joined = wait("the joiner's view", lambda: (get_json(urls[3] + "/v1/status") or {}).get("joined"), 60, 0.02)
        t_done = wait("the rebalance", lambda: settled(urls), 300, 0.05)
        moved = metric(urls[3], "groupcluster_grid_rebalance_bytes_received_total")
        entries = metric(urls[3], "groupcluster_grid_rebalance_entries_received_total")
        reb = {
            "entries_loaded": n,
            "entries_moved": int(entries),
            "mb_moved": moved / 1e6,
            "seconds_from_start": t_done - t_start,
            "seconds_from_join": t_done - t_joined,
            "mb_per_s": moved / 1e6 / max(1e-9, t_done - t_joined),
            "entries_per_s": entries / max(1e-9, t_done - t_joined),
        }
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
    if args.json:
        print(json.dumps({"ops": ops, "rebalance": reb}, indent=2))
        return 0
    print(f"3 members, {args.ops} keys, {args.value_size}-byte values, {args.concurrency} requests in flight:")
    for op in ("put", "get"):
        o = ops[op]
        print(f"  {op.upper():4} {o['ops_per_s']:8.0f} ops/s   p50 {o['p50_ms']:6.1f} ms   p99 {o['p99_ms']:6.1f} ms")
    print(f"  client: {ops['client']}")
    print(
        f"4th member joins a grid holding {reb['entries_loaded']} entries ({args.rebalance_mb:g} MB): "
        f"moved {reb['entries_moved']} entries, {reb['mb_moved']:.1f} MB in {reb['seconds_from_join']:.2f} s "
        f"after its join ({reb['seconds_from_start']:.2f} s from process start): "
        f"{reb['mb_per_s']:.1f} MB/s, {reb['entries_per_s']:.0f} entries/s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
