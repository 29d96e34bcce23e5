"""One PySyncObj node of the replicated-counter benchmark (the Raft peer of ``groupcluster bench``).

    python -m groupcluster.bench.pysyncobj_worker --rank 0 --ports 7801,7802,7803 --count 5000

Every node increments a replicated counter (pysyncobj.batteries.ReplCounter) ``--count`` times, keeping at
most ``--window`` increments in flight; followers' increments travel through the leader as Raft requires.
An increment is done at a node when the node has applied it, so a node is done when its counter reaches
``nodes * count`` per round. Rounds run on command (``round K`` on standard input, as the other workers of
:mod:`groupcluster.bench.workers`), and each prints ``RESULT {json}`` with ``delivered`` = increments applied
at this node in the round and ``value`` = its counter (checked by the runner on every node).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--ports", required=True, type=lambda s: [int(p) for p in s.split(",")])
    parser.add_argument("--count", type=int, default=5000, help="increments per node")
    parser.add_argument("--window", type=int, default=1000, help="increments in flight per node")
    parser.add_argument("--timeout", type=float, default=300.0)
    args = parser.parse_args(argv)
    try:
        from pysyncobj import SyncObj, SyncObjConf
        from pysyncobj.batteries import ReplCounter
    except ImportError:
        print("pysyncobj is not installed: pip install 'groupcluster[bench]'", file=sys.stderr)
        return 2

    nodes = [f"127.0.0.1:{p}" for p in args.ports]
    me = nodes[args.rank]
    counter = ReplCounter()
    # Batching on (the library's own default for throughput); no snapshots during a short run.
    conf = SyncObjConf(appendEntriesUseBatch=True, logCompactionMinEntries=10**9, logCompactionMinTime=10**9)
    obj = SyncObj(me, [n for n in nodes if n != me], conf=conf, consumers=[counter])
    deadline = time.monotonic() + args.timeout
    while obj._getLeader() is None or not obj.isReady():
        if time.monotonic() > deadline:
            print(f"pysyncobj {args.rank}: no leader", file=sys.stderr)
            return 3
        time.sleep(0.01)

    total = len(nodes) * args.count  # per round
    slots = threading.Semaphore(args.window)
    failures = [0]

    def done(_result: object, error: object) -> None:
        if error:  # FAIL_REASON.SUCCESS is 0
            failures[0] += 1
        slots.release()

    def submit() -> None:
        for _ in range(args.count):
            slots.acquire()
            counter.inc(callback=done)

    print("READY", flush=True)
    for line in sys.stdin:
        line = line.strip()
        if line == "exit":
            break
        if not line.startswith("round "):
            continue
        round_no = int(line.split()[1])
        target = round_no * total
        deadline = time.monotonic() + args.timeout
        send_start = time.monotonic()
        sender = threading.Thread(target=submit, daemon=True)
        sender.start()
        first: float | None = None
        value = counter.get()
        # Polling the applied value from another thread: reads only, and 0.5 ms granularity is plenty at ~10k/s.
        while value < target and time.monotonic() < deadline:
            value = counter.get()
            if value > target - total and first is None:
                first = time.monotonic()
            time.sleep(0.0005)
        last = time.monotonic()
        if value < target:
            print(f"FAILED {round_no} applied {value - target + total} of {total} (failed {failures[0]})", flush=True)
            return 4
        sender.join()
        result = {
            "rank": args.rank,
            "round": round_no,
            "delivered": total,
            "value": value,
            "first": first,
            "last": last,
            "send_start": send_start,
            "send_end": None,  # submission is paced by the window, not a figure of its own
            "failed": failures[0],
        }
        print("RESULT " + json.dumps(result), flush=True)
    while True:  # stay in the cluster until the runner kills us
        time.sleep(1)


if __name__ == "__main__":
    sys.exit(main())
