"""Grid throughput: puts and gets per second from 4 client processes, one key per request and batched.

    .venv/bin/python bench/grid_throughput.py [--clients 4] [--members 3] [--single-ops 3000]
        [--concurrency 16] [--batch-ops 50000] [--batch-size 1000] [--value-size 100] [--grid-set K=V] [--json]

Starts ``--members`` grid members (``groupcluster local`` machinery, 127.0.0.1) and ``--clients`` client
*processes* (so the clients do not share one interpreter lock). All clients run each step at the same time,
between barriers:

* ``single put`` / ``single get``: ``--single-ops`` keys per client through :class:`AsyncGridClient`, one
  key per HTTP request (``/v1/kv/{key}``), ``--concurrency`` requests in flight per client;
* ``batch put`` / ``batch get``: ``--batch-ops`` keys per client through ``put_many``/``get_many``
  (``POST /v1/batch``, ``--batch-size`` keys per request, split by owner, 8 requests in flight).

Reported per step: operations per second of all clients together (total operations over the time from the
first client's start to the last one's end) and the per-request latency p50/p99 of the single steps.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from groupcluster.grid.client import AsyncGridClient, GridClient
from groupcluster.tools.local import ProgressBar
from groupcluster.tools.local_cluster import LocalCluster

STEPS = ("single put", "single get", "batch put", "batch get")


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))] * 1000 if xs else float("nan")


async def single(urls: list[str], keys: list[bytes], value: bytes, conc: int, put: bool) -> list[float]:
    lat: list[float] = []
    sem = asyncio.Semaphore(conc)
    async with AsyncGridClient(urls, max_connections=conc) as c:
        await c.refresh()

        async def one(k: bytes) -> None:
            async with sem:
                t0 = time.perf_counter()
                if put:
                    await c.put(k, value)
                else:
                    got = await c.get(k)
                    assert got == value, f"{k!r}: read {got!r:.40}"
                lat.append(time.perf_counter() - t0)

        await asyncio.gather(*(one(k) for k in keys))
    return lat


def client(n: int, urls: list[str], args: argparse.Namespace, barrier: Any, out: Any) -> None:
    value = os.urandom(args.value_size)
    single_keys = [f"s{n}-{i}".encode() for i in range(args.single_ops)]
    batch_keys = [f"b{n}-{i}".encode() for i in range(args.batch_ops)]
    results: dict[str, Any] = {}
    for step in STEPS:
        barrier.wait()
        t0 = time.time()
        lat: list[float] = []
        if step == "single put":
            lat = asyncio.run(single(urls, single_keys, value, args.concurrency, True))
            ops = len(single_keys)
        elif step == "single get":
            lat = asyncio.run(single(urls, single_keys, value, args.concurrency, False))
            ops = len(single_keys)
        else:
            with GridClient(urls, batch_size=args.batch_size) as c:
                if step == "batch put":
                    c.put_many(dict.fromkeys(batch_keys, value))
                else:
                    got = c.get_many(batch_keys)
                    bad = sum(1 for v in got.values() if v != value)
                    assert bad == 0, f"{bad} keys read back wrong"
            ops = len(batch_keys)
        results[step] = {"start": t0, "end": time.time(), "ops": ops, "lat": lat}
    out.put((n, results))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--members", type=int, default=3)
    ap.add_argument("--single-ops", type=int, default=3000, help="keys per client, one per request")
    ap.add_argument("--concurrency", type=int, default=16, help="requests in flight per client (single steps)")
    ap.add_argument("--batch-ops", type=int, default=50_000, help="keys per client in the batch steps")
    ap.add_argument("--batch-size", type=int, default=1000, help="keys per batch request")
    ap.add_argument("--value-size", type=int, default=100)
    ap.add_argument(
        "--grid-set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="grid parameter for every member, e.g. persistence=write_through (repeatable); "
        "persistence_path=DIR is filled in with a temporary directory when persistence is set without it",
    )
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="grid-throughput-"))
    cluster = LocalCluster(work)
    bar = ProgressBar(sys.stderr)
    procs: list[mp.Process] = []
    try:
        params = list(args.grid_set)
        if any(p.startswith("persistence=") for p in params) and not any(
            p.startswith("persistence_path=") for p in params
        ):
            (work / "stores").mkdir()
            params.append(f"persistence_path={work / 'stores'}")
        cluster.start(args.members, grid_params=params, progress=bar.update)
        bar.finish()
        urls = [m.http for m in cluster.members]
        barrier = mp.Barrier(args.clients)
        out: Any = mp.Queue()
        for n in range(args.clients):
            p = mp.Process(target=client, args=(n, urls, args, barrier, out), daemon=True)
            p.start()
            procs.append(p)
        per_client = dict(out.get(timeout=1800) for _ in procs)
        for p in procs:
            p.join(timeout=30)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
        cluster.stop(grace=5.0)
        cluster.kill_all()
        shutil.rmtree(work, ignore_errors=True)

    res: dict[str, Any] = {"clients": args.clients, "members": args.members, "value_size": args.value_size}
    res["grid_set"] = args.grid_set
    for step in STEPS:
        runs = [r[step] for r in per_client.values()]
        span = max(r["end"] for r in runs) - min(r["start"] for r in runs)
        ops = sum(r["ops"] for r in runs)
        lat = [x for r in runs for x in r["lat"]]
        res[step] = {"ops": ops, "seconds": round(span, 2), "ops_per_s": round(ops / max(1e-9, span))}
        if lat:
            res[step] |= {"p50_ms": round(pct(lat, 50), 2), "p99_ms": round(pct(lat, 99), 2)}
    if args.json:
        print(json.dumps(res, indent=2))
        return 0
    print(
        f"{args.clients} client processes, {args.members} members, {args.value_size}-byte values "
        f"(single: {args.concurrency} requests in flight per client; batch: {args.batch_size} keys per request)"
    )
    for step in STEPS:
        r = res[step]
        lat = f"   p50 {r['p50_ms']:6.1f} ms  p99 {r['p99_ms']:6.1f} ms" if "p50_ms" in r else ""
        print(f"  {step:<11} {r['ops_per_s']:>8,} ops/s  ({r['ops']:,} ops in {r['seconds']:.1f} s){lat}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
