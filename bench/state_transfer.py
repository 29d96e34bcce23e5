"""State-transfer throughput between real processes: ``--members`` processes (default 1) hold a large state
(default 50 MB), a joiner in this process joins and fetches it; prints the time and MB/s.

    .venv/bin/python bench/state_transfer.py [--size-mb 50] [--members 1] [--stack vsync] [--chunk-size 56KiB]
    .venv/bin/python bench/state_transfer.py --members 4 --size-mb 10   # time to add a 5th member (issue 3)

The clock runs from the joiner's connect (join, with a flush on the vsync stack, included) and, separately,
from its first view to ``set_state``; MB/s is the state size over the latter. Members run on loopback
(127.0.0.21 and up; the joiner takes the next address).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import time

from groupcluster.runtime.channel import Channel

DONOR_CODE = """
import asyncio, signal, sys
from groupcluster.runtime.channel import Channel
async def main():
    size, window = int(sys.argv[1]), int(sys.argv[6])
    bind, hosts, stack, chunk = sys.argv[2:6]
    state = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
    host, port = bind.rsplit(":", 1)
    ch = await Channel.connect("bench-state", bind=(host, int(port)), initial_hosts=hosts.split(","), stack=stack,
                               stack_overrides={"state": {"chunk_size": chunk, "window": window}},
                               get_state=lambda: state)
    print("ready", flush=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await ch.leave()
asyncio.run(main())
"""


def free_port(hosts: list[str]) -> int:
    for _ in range(50):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.bind((hosts[0], 0))
            port = s.getsockname()[1]
        try:
            for h in hosts[1:]:
                with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                    s.bind((h, port))
            return port
        except OSError:
            continue
    raise RuntimeError("no free port")


async def run(args: argparse.Namespace) -> None:
    hosts = [f"127.0.0.{21 + i}" for i in range(args.members + 1)]
    port = free_port(hosts)
    everyone = ",".join(f"{h}:{port}" for h in hosts)
    size = int(args.size_mb * 1_000_000)
    donors: list[subprocess.Popen[bytes]] = []
    try:
        for host in hosts[:-1]:  # one after the other: each has joined when it prints "ready"
            donor = subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    DONOR_CODE,
                    str(size),
                    f"{host}:{port}",
                    everyone,
                    args.stack,
                    args.chunk_size,
                    str(args.window),
                ],
                stdout=subprocess.PIPE,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
            donors.append(donor)
            assert donor.stdout is not None
            line = await asyncio.to_thread(donor.stdout.readline)
            if line.strip() != b"ready":
                raise RuntimeError(f"member {host} did not start: {line!r}")
        received: list[int] = []
        t_view: list[float] = []
        t0 = time.perf_counter()
        ch = await Channel.connect(
            "bench-state",
            bind=(hosts[-1], port),
            initial_hosts=everyone.split(","),
            stack=args.stack,
            stack_overrides={"state": {"chunk_size": args.chunk_size, "window": args.window}},
            set_state=lambda data: received.append(len(data)),
            on_view=lambda v: t_view.append(time.perf_counter()) if not t_view else None,
        )
        await ch.wait_state(timeout=600)
        t1 = time.perf_counter()
        assert received == [size], f"received {received}, expected [{size}]"
        transfer = t1 - t_view[0]
        print(
            f"state transfer: {size / 1e6:.1f} MB over {args.stack}, chunk {args.chunk_size}, window {args.window}, "
            f"joining a group of {args.members}"
        )
        print(f"  join + transfer: {t1 - t0:.2f} s; transfer after the first view: {transfer:.2f} s")
        print(f"  throughput: {size / 1e6 / transfer:.1f} MB/s")
        await ch.leave()
    finally:
        for donor in donors:
            donor.terminate()
        for donor in donors:
            try:
                donor.wait(10)
            except subprocess.TimeoutExpired:
                donor.kill()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mb", type=float, default=50.0)
    ap.add_argument("--members", type=int, default=1, help="members already in the group (each can be donor)")
    ap.add_argument("--stack", default="vsync")
    ap.add_argument("--chunk-size", default="56KiB")
    ap.add_argument("--window", type=int, default=8)
    asyncio.run(run(ap.parse_args()))


if __name__ == "__main__":
    main()
