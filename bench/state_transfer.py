"""State-transfer throughput between real processes: ``--members`` processes (default 1) hold a large state
(default 50 MB), a joiner in this process joins and fetches it; prints the time and MB/s.

    .venv/bin/python bench/state_transfer.py [--size-mb 50] [--members 1] [--stack vsync] [--chunk-size 56KiB]
        [--transport udp] [--json]
    .venv/bin/python bench/state_transfer.py --members 4 --size-mb 10   # time to add a 5th member

The clock runs from the joiner's connect (join, with a flush on the vsync stack, included) and, separately,
from its first view to ``set_state``; MB/s (10^6 bytes) is the state size over the latter. Members run on
127.0.0.1, each on its own free port. ``--json`` prints one object (``size_bytes``, ``transfer_s``,
``join_and_transfer_s``, ``mb_per_s``, the settings): the ``groupcluster bench`` suite reads it
(workloads ``state-transfer-*``). ``--repeat N`` fetches N times from this one process (join, fetch, leave):
the first is the figure above, ``transfer_s_all`` has them all (2..N: warm). With ``--launch-wall-ms`` (the
launcher's wall clock just before it started this process) ``launch_to_state_ms`` is the joiner's time from its
launch to the state in place: this process's start-up (interpreter and imports) plus the first fetch's join
and transfer, leaving out the time spent starting the donors, which a joiner launched into a running group
would not wait for.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time

from groupcluster.runtime.channel import Channel
from groupcluster.tools.local_cluster import free_ports

STARTED_WALL = time.time()  # after the imports: what a joiner process pays before it can connect

DONOR_CODE = """
import asyncio, signal, sys
from groupcluster.runtime.channel import Channel
async def main():
    size, window = int(sys.argv[1]), int(sys.argv[6])
    bind, hosts, stack, chunk = sys.argv[2:6]
    transport = sys.argv[7]
    state = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
    host, port = bind.rsplit(":", 1)
    ch = await Channel.connect("bench-state", bind=(host, int(port)), initial_hosts=hosts.split(","), stack=stack,
                               transport=transport,
                               stack_overrides={"state": {"chunk_size": chunk, "window": window}},
                               get_state=lambda: state)
    print("ready", flush=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await ch.leave()
asyncio.run(main())
"""


HOST = "127.0.0.1"
REJOIN_PAUSE_S = 1.0


async def fetch(args: argparse.Namespace, port: int, everyone: str, size: int) -> tuple[float, float]:
    """Join, fetch the state, leave: (seconds from connect to set_state, seconds from the first view to it)."""
    received: list[int] = []
    t_view: list[float] = []
    t0 = time.perf_counter()
    ch = await Channel.connect(
        "bench-state",
        bind=(HOST, port),
        initial_hosts=everyone.split(","),
        stack=args.stack,
        transport=args.transport,
        stack_overrides={"state": {"chunk_size": args.chunk_size, "window": args.window}},
        set_state=lambda data: received.append(len(data)),
        on_view=lambda v: t_view.append(time.perf_counter()) if not t_view else None,
    )
    await ch.wait_state(timeout=600)
    t1 = time.perf_counter()
    assert received == [size], f"received {received}, expected [{size}]"
    await ch.leave()
    return t1 - t0, t1 - t_view[0]


async def run(args: argparse.Namespace) -> None:
    ports = free_ports(args.members + 1)
    everyone = ",".join(f"{HOST}:{p}" for p in ports)
    size = int(args.size_mb * 1_000_000)
    donors: list[subprocess.Popen[bytes]] = []
    try:
        for port in ports[:-1]:  # one after the other: each has joined when it prints "ready"
            # A blocking Popen (ASYNC220): nothing else runs on the loop yet, and it returns once the child exists.
            donor = subprocess.Popen(  # noqa: ASYNC220
                [
                    sys.executable,
                    "-c",
                    DONOR_CODE,
                    str(size),
                    f"{HOST}:{port}",
                    everyone,
                    args.stack,
                    args.chunk_size,
                    str(args.window),
                    args.transport,
                ],
                stdout=subprocess.PIPE,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
            donors.append(donor)
            assert donor.stdout is not None
            line = await asyncio.to_thread(donor.stdout.readline)
            if line.strip() != b"ready":
                raise RuntimeError(f"member {HOST}:{port} did not start: {line!r}")
        times: list[tuple[float, float]] = []  # (join + transfer, transfer) per fetch
        for i in range(args.repeat):
            if i:
                # The donor must have seen the last fetcher leave before the same address joins again.
                await asyncio.sleep(REJOIN_PAUSE_S)
            times.append(await fetch(args, ports[-1], everyone, size))
        (t_both, transfer) = times[0]
        if args.json:
            doc = {
                "size_bytes": size,
                "stack": args.stack,
                "transport": args.transport,
                "chunk_size": args.chunk_size,
                "window": args.window,
                "members": args.members,
                "join_and_transfer_s": round(t_both, 4),
                "transfer_s": round(transfer, 4),
                "mb_per_s": round(size / 1e6 / transfer, 3),
                # Every fetch of this process, the first included (``--repeat``): the warm ones are 2..N.
                "transfer_s_all": [round(t, 4) for _, t in times],
                "join_and_transfer_s_all": [round(b, 4) for b, _ in times],
            }
            if args.launch_wall_ms is not None:
                startup_ms = STARTED_WALL * 1000 - args.launch_wall_ms
                doc["startup_ms"] = round(startup_ms, 1)
                doc["launch_to_state_ms"] = round(startup_ms + t_both * 1000, 1)
            print(json.dumps(doc))
        else:
            print(
                f"state transfer: {size / 1e6:.1f} MB over {args.stack} ({args.transport}), chunk {args.chunk_size}, "
                f"window {args.window}, joining a group of {args.members}"
            )
            print(f"  join + transfer: {t_both:.2f} s; transfer after the first view: {transfer:.2f} s")
            print(f"  throughput: {size / 1e6 / transfer:.1f} MB/s")
            for i, (_, t) in enumerate(times[1:], 2):
                print(f"  fetch {i} from this process: {size / 1e6 / t:.1f} MB/s")
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
    ap.add_argument("--transport", choices=("udp", "tcp"), default="udp")
    ap.add_argument("--repeat", type=int, default=1, help="fetches from this one process (2..N are warm)")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of the text")
    ap.add_argument(
        "--launch-wall-ms", type=float, default=None, help="the launcher's wall clock (ms) when it started us"
    )
    args = ap.parse_args()
    if args.size_mb <= 0 or args.members <= 0 or args.window <= 0 or args.repeat <= 0:
        ap.error("--size-mb, --members, --window and --repeat must be positive")
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
