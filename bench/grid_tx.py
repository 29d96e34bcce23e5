"""Transaction benchmark: transfers between counters on a 3-member grid, idle and while a 4th member joins.

    .venv/bin/python bench/grid_tx.py [--keys 2,10] [--accounts 10000] [--clients 3] [--threads 4]
        [--seconds 10] [--mode optimistic|pessimistic] [--filler 1000000] [--grid-set KEY=VALUE ...] [--json]

For each transaction size K in ``--keys``:

1. Starts 3 members (``groupcluster local`` machinery, 127.0.0.1, a temporary directory), writes
   ``--accounts`` counters of 1000 each and ``--filler`` entries of 100 B (so the rebalance below moves data
   for a while).
2. ``--clients`` client *processes* with ``--threads`` threads each run transfers back to back: a transaction
   (:meth:`GridClient.transaction`) reads K distinct random counters (one batch read; pessimistic mode locks
   them first), takes K-1 from the first and gives 1 to each other one, and commits. Each transfer is
   recorded with its start time, duration and outcome (committed, conflict, other abort, unknown outcome).
3. After ``--seconds`` on the idle grid a 4th member starts; the rebalance runs from its first view until every
   member is back to a balanced ``NO_REBALANCE`` topology; transfers go on for 2 s more.
4. Reported per K: committed transactions per second (by the time they ended), aborts and their share,
   latency p50/p99, the longest transaction overlapping the window, on the idle grid and during the rebalance;
   a timeline per 0.5 s around the join; and the check that the counters still sum to ``accounts x 1000`` (a
   transfer is all or nothing). The machine's load average is printed with the figures.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from groupcluster.grid.client import GridClient, GridClientError, GridTxAborted, GridTxConflict, GridTxUnknownOutcome
from groupcluster.tools.local import ProgressBar
from groupcluster.tools.local_cluster import LocalCluster

START = 1000  # every counter's initial value


def account(i: int) -> bytes:
    return f"acct-{i:06d}".encode()


def transfer(c: GridClient, rng: random.Random, k: int, accounts: int, mode: str) -> str:
    keys = [account(i) for i in rng.sample(range(accounts), k)]
    try:
        with c.transaction(mode) as tx:
            vals = tx.get_many(keys)
            tx.put(keys[0], str(int(vals[keys[0]] or b"0") - (k - 1)).encode())
            for key in keys[1:]:
                tx.put(key, str(int(vals[key] or b"0") + 1).encode())
        return "committed"
    except GridTxConflict:
        return "conflict"
    except GridTxAborted as exc:
        return f"aborted:{exc.reason}"
    except GridTxUnknownOutcome:
        return "unknown"
    except GridClientError as exc:
        return f"error:{type(exc).__name__}"


def client_process(
    urls: list[str], k: int, accounts: int, mode: str, threads: int, seed: int, stop: Any, out: Any
) -> None:
    """``threads`` threads doing transfers until ``stop``; sends [(start wall time, seconds, outcome), ...]."""
    samples: list[tuple[float, float, str]] = []
    lock = threading.Lock()

    def loop(i: int) -> None:
        rng = random.Random(seed * 1000 + i)
        mine: list[tuple[float, float, str]] = []
        with GridClient(urls, timeout=60.0, retries=40) as c:
            while not stop.is_set():
                t0 = time.time()
                p0 = time.perf_counter()
                outcome = transfer(c, rng, k, accounts, mode)
                mine.append((t0, time.perf_counter() - p0, outcome))
        with lock:
            samples.extend(mine)

    ts = [threading.Thread(target=loop, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    out.send(samples)


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, int(p / 100 * len(xs)))] * 1000, 2) if xs else float("nan")


def summarize(samples: list[tuple[float, float, str]], lo: float, hi: float) -> dict[str, Any]:
    """Transactions that *ended* in ``[lo, hi)`` (a rate over the window), and the longest one that overlapped
    it (a transaction stuck through the whole window ends after it)."""
    window = [s for s in samples if lo <= s[0] + s[1] < hi]
    done = [d for _, d, o in window if o == "committed"]
    outcomes: dict[str, int] = {}
    for _, _, o in window:
        outcomes[o] = outcomes.get(o, 0) + 1
    secs = max(1e-9, hi - lo)
    overlapping = [d for t0, d, _ in samples if t0 < hi and t0 + d >= lo]
    return {
        "seconds": round(secs, 2),
        "committed": len(done),
        "committed_per_s": round(len(done) / secs, 1),
        "ended": len(window),
        "abort_share": round(1 - len(done) / len(window), 4) if window else None,
        "outcomes": outcomes,
        "p50_ms": pct(done, 50),
        "p99_ms": pct(done, 99),
        "longest_overlapping_ms": round(max(overlapping, default=0.0) * 1000, 1),
    }


def timeline(samples: list[tuple[float, float, str]], start: float, end: float) -> list[dict[str, Any]]:
    """Per 0.5 s: transactions ended (committed, aborted) and the slowest of those."""
    out = []
    t = start
    while t < end:
        ended = [(d, o) for t0, d, o in samples if t <= t0 + d < t + 0.5]
        out.append(
            {
                "t": round(t - start, 1),
                "committed": sum(1 for _, o in ended if o == "committed"),
                "aborted": sum(1 for _, o in ended if o != "committed"),
                "slowest_ms": round(max((d for d, _ in ended), default=0.0) * 1000, 1),
            }
        )
        t += 0.5
    return out


def run_one(args: argparse.Namespace, k: int, bar: ProgressBar) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="grid-tx-"))
    cluster = LocalCluster(work)
    stop = mp.Event()
    procs: list[tuple[mp.Process, Any]] = []
    try:
        cluster.start(3, grid_params=args.grid_set, progress=bar.update)
        bar.finish()
        urls = [m.http for m in cluster.members]
        with GridClient(urls, timeout=120.0, batch_size=2000) as c:
            c.put_many({account(i): str(START).encode() for i in range(args.accounts)})
            value = b"f" * 100
            for start in range(0, args.filler, 50_000):
                end = min(args.filler, start + 50_000)
                c.put_many({f"filler-{i:07d}".encode(): value for i in range(start, end)})
                bar.update(end / max(1, args.filler), f"loading {end:,}/{args.filler:,} filler entries")
        bar.finish(f"K={k}: {args.accounts} counters and {args.filler:,} filler entries loaded")
        for n in range(args.clients):
            parent, child = mp.Pipe(duplex=False)
            p = mp.Process(
                target=client_process,
                args=(urls, k, args.accounts, args.mode, args.threads, n + 1, stop, child),
                daemon=True,
            )
            p.start()
            procs.append((p, parent))
        t_idle = time.time() + 2.0  # let the clients connect and warm up first
        time.sleep(2.0 + args.seconds)
        # What `groupcluster local scale 4` does, with the join time observed here.
        _new, t_spawn, t_joined = cluster.spawn_and_wait_joined()
        cluster.wait_settled("the rebalance", 900, bar.update)
        t_done = time.time()
        bar.finish()
        time.sleep(2.0)
        stop.set()
        samples: list[tuple[float, float, str]] = []
        for p, parent in procs:
            samples.extend(parent.recv())
            p.join(timeout=30)
        with GridClient([m.http for m in cluster.members], timeout=120.0) as c:
            got = c.get_many([account(i) for i in range(args.accounts)])
        total = sum(int(v or b"0") for v in got.values())
    finally:
        stop.set()
        for p, _ in procs:
            if p.is_alive():
                p.kill()
        cluster.stop(grace=5.0)
        cluster.kill_all()
        shutil.rmtree(work, ignore_errors=True)
    return {
        "keys": k,
        "mode": args.mode,
        "clients": args.clients * args.threads,
        "idle": summarize(samples, t_idle, t_spawn),
        "rebalance": summarize(samples, t_joined, t_done),
        "rebalance_seconds_from_join": round(t_done - t_joined, 2),
        # from 2 s before the 4th member started to 2 s after the rebalance ended (the join is at +2 s)
        "timeline": timeline(samples, t_spawn - 2.0, t_done + 2.0),
        "total_expected": args.accounts * START,
        "total_found": total,
        "conserved": total == args.accounts * START,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keys", default="2,10", help="transaction sizes to run, comma-separated (default 2,10)")
    ap.add_argument("--accounts", type=int, default=10_000, help="counters (fewer: more conflicts)")
    ap.add_argument("--clients", type=int, default=3, help="client processes")
    ap.add_argument("--threads", type=int, default=4, help="threads per client process")
    ap.add_argument("--seconds", type=float, default=10.0, help="idle-grid measurement")
    ap.add_argument("--mode", choices=("optimistic", "pessimistic"), default="optimistic")
    ap.add_argument("--filler", type=int, default=1_000_000, help="100-byte entries loaded so a rebalance lasts")
    ap.add_argument("--grid-set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    sizes = [int(x) for x in args.keys.split(",") if x.strip()]
    if any(not 1 <= k <= args.accounts for k in sizes):
        ap.error(f"--keys: each size must be 1 to --accounts ({args.accounts})")
    bar = ProgressBar(sys.stderr)
    results = []
    for k in sizes:
        load_before = os.getloadavg()
        res = run_one(args, k, bar)
        res["loadavg_before"] = [round(x, 2) for x in load_before]
        res["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
        results.append(res)
    out = {"benchmark": "grid_tx", "members": 3, "results": results}
    if args.json:
        print(json.dumps(out, indent=2))
        return 0 if all(r["conserved"] for r in results) else 1
    for r in results:
        i, b = r["idle"], r["rebalance"]
        print(
            f"{r['keys']}-key {r['mode']} transfers, {r['clients']} client threads in {args.clients} processes "
            f"(load {r['loadavg_before'][0]} -> {r['loadavg_after'][0]}):"
        )
        print(
            f"  idle:      {i['committed_per_s']:8.1f} tx/s committed, p50 {i['p50_ms']} ms p99 {i['p99_ms']} ms, "
            f"aborted {i['abort_share']} ({i['outcomes']})"
        )
        print(
            f"  rebalance: {b['committed_per_s']:8.1f} tx/s committed, p50 {b['p50_ms']} ms p99 {b['p99_ms']} ms, "
            f"aborted {b['abort_share']} ({b['outcomes']}); rebalance {r['rebalance_seconds_from_join']} s"
        )
        print(f"  total {r['total_found']} (expected {r['total_expected']}): {'OK' if r['conserved'] else 'LOST'}")
        print("  per 0.5 s from 2 s before the join: committed/aborted (slowest ms)")
        print("   " + " ".join(f"{x['committed']}/{x['aborted']}({x['slowest_ms']:.0f})" for x in r["timeline"]))
    return 0 if all(r["conserved"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
