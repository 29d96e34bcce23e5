"""Our side of the grid peers' client processes: the line protocol of the JVM harness's clients, over HTTP.

    python -m groupcluster.bench.gridpeers_client URL [URL ...]

Reads one command per line on stdin and answers on stdout exactly as ``GridPeer client`` does
(bench/peers/grid), so :mod:`groupcluster.bench.gridpeers_run` drives our clients and the peers' the same way:

* ``WRITE rate size``: single PUTs of keys ``lat-0..lat-9999`` through :class:`GridClient`, one at a time,
  ``rate`` per second, until ``STOPWRITE``, which answers ``SAMPLES [[start_epoch_ms, ms, ok], ...]``;
* ``OPS step n size inflight batch prefix``: ``single-put``/``single-get`` through :class:`AsyncGridClient`
  with ``inflight`` requests in flight, or ``batch-put``/``batch-get`` (``batch`` keys per request, ``inflight``
  requests in flight); answers ``DONE {json}`` (start/end epoch ms, ops, errors, request p50/p99 ms);
* ``QUIT``.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys
import threading
import time

from ..grid.client import AsyncGridClient, GridClient


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


class Writer:
    """The paced single-PUT writer of the rebalance workload, in a thread."""

    def __init__(self, urls: list[str], rate: float, size: int) -> None:
        self.urls, self.rate, self.size = urls, rate, size
        self.samples: list[tuple[float, float, int]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        value = os.urandom(self.size)
        rng = random.Random(1)
        with GridClient(self.urls, timeout=60.0, retries=40) as c:
            next_at = time.monotonic()
            while not self.stop.is_set():
                now = time.monotonic()
                if now < next_at:
                    time.sleep(next_at - now)
                next_at += 1.0 / self.rate
                # A writer more than a second behind its schedule (a stall) starts afresh instead of sending
                # the missed writes in a burst into the next window.
                if time.monotonic() - next_at > 1.0:
                    next_at = time.monotonic()
                key = f"lat-{rng.randrange(10_000)}".encode()
                t0 = time.time()
                p0 = time.perf_counter()
                ok = 1
                try:
                    c.put(key, value)
                except Exception:
                    ok = 0
                self.samples.append((t0 * 1000, (time.perf_counter() - p0) * 1000, ok))


def _pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))] if xs else 0.0


async def ops(
    client: AsyncGridClient, step: str, n: int, size: int, inflight: int, batch: int, prefix: str
) -> dict[str, float]:
    value = os.urandom(size)
    put = step.endswith("put")
    lat: list[float] = []
    errors = 0
    sem = asyncio.Semaphore(inflight)
    keys = [f"{prefix}{i}".encode() for i in range(n)]

    async def single(k: bytes) -> None:
        nonlocal errors
        async with sem:
            t0 = time.perf_counter()
            try:
                if put:
                    await client.put(k, value)
                elif await client.get(k) is None:
                    errors += 1
            except Exception:
                errors += 1
            lat.append((time.perf_counter() - t0) * 1000)

    async def chunk(ks: list[bytes]) -> None:
        nonlocal errors
        async with sem:
            t0 = time.perf_counter()
            try:
                if put:
                    await client.put_many(dict.fromkeys(ks, value))
                else:
                    got = await client.get_many(ks)
                    errors += sum(1 for v in got.values() if v is None)
            except Exception:
                errors += len(ks)
            lat.append((time.perf_counter() - t0) * 1000)

    start = time.time()
    if step.startswith("single"):
        await asyncio.gather(*(single(k) for k in keys))
    else:
        await asyncio.gather(*(chunk(keys[i : i + batch]) for i in range(0, n, batch)))
    end = time.time()
    return {
        "start": start * 1000,
        "end": end * 1000,
        "ops": n,
        "requests": len(lat),
        "errors": errors,
        "p50_ms": _pct(lat, 50),
        "p99_ms": _pct(lat, 99),
    }


async def serve(urls: list[str]) -> None:
    # One request per chunk of 1000 keys: a chunk is one put_many/get_many (split by owner inside it), the
    # same unit of work as the JVM clients' putAll/getAll of 1000 keys.
    client = AsyncGridClient(urls, max_connections=64, batch_size=1000, parallel=8)
    await client.refresh()
    await client.put(b"warm-up", b"x")
    writer: Writer | None = None
    _say("READY")
    loop = asyncio.get_running_loop()
    try:
        while True:
            line = await loop.run_in_executor(None, sys.stdin.readline)
            if not line:
                break
            w = line.split()
            if not w:
                continue
            if w[0] == "QUIT":
                break
            if w[0] == "WRITE":
                writer = Writer(urls, float(w[1]), int(w[2]))
                writer.thread.start()
                _say("WRITING")
            elif w[0] == "STOPWRITE":
                samples: list[tuple[float, float, int]] = []
                if writer is not None:
                    writer.stop.set()
                    writer.thread.join()
                    samples = writer.samples
                _say("SAMPLES " + json.dumps([[round(a, 3), round(b, 4), c] for a, b, c in samples]))
            elif w[0] == "OPS":
                done = await ops(client, w[1], int(w[2]), int(w[3]), int(w[4]), int(w[5]), w[6])
                _say("DONE " + json.dumps(done))
            else:
                _say(f"ERROR unknown command {w[0]}")
    finally:
        await client.close()
    _say("BYE")


def main() -> int:
    asyncio.run(serve(sys.argv[1:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
