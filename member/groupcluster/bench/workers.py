"""Benchmark member processes in Python: our stack, and raw asyncio TCP (the physical limit).

    python -m groupcluster.bench.workers groupcluster --rank 0 --ports 7801,7802,7803,7804 --stack fifo ...
    python -m groupcluster.bench.workers raw --rank 0 --ports ... [--relay]

Both run the workload of the JGroups harness (bench/peers/jgroups/src/main/java/io/groupcluster/bench/Core.java):
members ``0 .. senders-1`` multicast ``--count`` payloads of ``--size`` bytes each (a payload starts with the
send time in CLOCK_MONOTONIC nanoseconds, the sender's rank and a sequence number), unpaced or at ``--rate``
messages per second; once a member has delivered every message it prints ``RESULT {json}`` (see
:func:`groupcluster.bench.model.parse_result_line`) and waits for the runner to kill it, so no member leaves
while others still need it.

The raw worker carries the same payloads with the same batching (``SEND_CHUNK`` messages per event-loop
iteration, one frame per chunk and peer) over a full mesh of TCP connections with no protocol work: no
headers beyond lengths, no acknowledgements, no retransmission table, no flow control beyond TCP's. With
``--relay`` every sender sends to member 0, which delivers and forwards each frame to the others: the
shape of a sequencer's total order without its bookkeeping.

Our members run with failure detection of 40 s (``BENCH_FD``), as the JGroups configurations do: a member
starved of CPU by other work on the machine must not be excluded mid-run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import json
import struct
import sys
import time
from collections.abc import Callable
from typing import Any

# Chunk of messages handed over per event-loop iteration when unpaced: the same as `groupcluster member`.
SEND_CHUNK = 200
# Failure detection in benchmark runs: the suite shares a 2-core machine with other work, and a member starved
# of CPU for a few seconds must not be suspected and excluded (a run cannot finish across that view change:
# fifo-1of4x1KB once stalled so with the default 4 s). Every system gets 40 s of silence before a suspicion,
# then a 1.5 s verification: JGroups 5's FD_ALL3/VERIFY_SUSPECT2 in bench/peers/jgroups/conf, and JGroups
# 2.12's FD (10 s x 4 tries) there too. No member crashes in these workloads, so this costs nothing.
BENCH_FD = {"timeout": "40s", "verify_timeout": "1500ms"}
HEADER = struct.Struct(">qii")  # send time (ns), sender rank, sequence number
FRAME = struct.Struct(">II")  # frame length after this header, message count
LEN = struct.Struct(">I")


def make_payload(rank: int, seq: int, size: int) -> bytes:
    head = HEADER.pack(time.monotonic_ns(), rank, seq)
    return head + bytes(max(size - HEADER.size, 0))


class Accounting:
    """Delivery counting and latency sampling, the same as the Java harness."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.expected = args.senders * args.count
        self.count = args.count
        self.sample = args.rate > 0
        self.delivered = 0
        self.first: float | None = None
        self.last: float | None = None
        self.send_start: float | None = None
        self.send_end: float | None = None
        self.latencies: list[int] = []
        self.done = asyncio.Event()
        self.rank = args.rank

    def deliver(self, payloads: list[bytes]) -> None:
        now_ns = time.monotonic_ns()
        now = now_ns / 1e9
        if self.first is None:
            self.first = now
        self.last = now
        self.delivered += len(payloads)
        if self.sample:
            # Latency only in paced runs, past each sender's first tenth (connection set-up).
            skip = self.count // 10
            unpack = HEADER.unpack_from
            lat = self.latencies
            for p in payloads:
                sent, _rank, seq = unpack(p)
                if seq >= skip:
                    lat.append(now_ns - sent)
        if self.delivered >= self.expected:
            self.done.set()

    def result(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "rank": self.rank,
            "delivered": self.delivered,
            "first": self.first,
            "last": self.last,
            "send_start": self.send_start,
            "send_end": self.send_end,
        }
        if self.latencies:
            lat = sorted(self.latencies)
            n = len(lat)
            out.update(latency_samples=n, p50_us=lat[int(0.50 * (n - 1))] / 1e3, p99_us=lat[int(0.99 * (n - 1))] / 1e3)
        return out


async def send_workload(
    args: argparse.Namespace, acc: Accounting, send: Callable[[list[bytes]], Any], wait: Callable[[], Any]
) -> None:
    """Send our share: chunks of SEND_CHUNK unpaced, or on schedule at ``--rate``; ``wait`` applies backpressure."""
    if args.rank >= args.senders:
        return
    loop = asyncio.get_running_loop()
    start = loop.time()
    acc.send_start = time.monotonic()
    sent = 0
    total, size, rank, rate = args.count, args.size, args.rank, args.rate
    while sent < total:
        await wait()
        if rate <= 0:
            n = min(SEND_CHUNK, total - sent)
        else:
            due = min(total, int((loop.time() - start) * rate) + 1)
            n = min(SEND_CHUNK, due - sent)
            if n <= 0:
                await asyncio.sleep(min(0.002, max(0.0002, (sent + 1) / rate - (loop.time() - start))))
                continue
        result = send([make_payload(rank, i, size) for i in range(sent, sent + n)])
        if asyncio.iscoroutine(result):
            await result
        sent += n
        await asyncio.sleep(0)
    acc.send_end = time.monotonic()


async def finish(acc: Accounting, timeout: float) -> int:
    try:
        await asyncio.wait_for(acc.done.wait(), timeout)
    except TimeoutError:
        print(f"worker {acc.rank}: delivered {acc.delivered} of {acc.expected} before the timeout", file=sys.stderr)
        return 4
    print("RESULT " + json.dumps(acc.result()), flush=True)
    await asyncio.Event().wait()  # stay a member until the runner kills us
    return 0


# -- our stack -----------------------------------------------------------------------------------------------
async def run_groupcluster(args: argparse.Namespace) -> int:
    # The sequencer layer registers itself on import; the protocols package may not import it yet.
    with contextlib.suppress(ModuleNotFoundError):
        importlib.import_module("groupcluster.protocols.sequencer")
    from ..runtime.channel import Channel

    acc = Accounting(args)
    hosts = [f"127.0.0.1:{p}" for p in args.ports]

    def on_messages(msgs: list[Any]) -> None:
        acc.deliver([m.payload for m in msgs] if acc.sample else msgs)

    ch = await Channel.connect(
        f"bench-{args.cluster}",
        bind=("127.0.0.1", args.ports[args.rank]),
        initial_hosts=hosts,
        stack=args.stack,
        transport=args.transport,
        join_timeout=60.0,
        on_messages=on_messages,
        stack_overrides={"fd": BENCH_FD},
    )
    await ch.wait_for_view(lambda v: len(v) >= args.members, timeout=60.0)
    sender = asyncio.ensure_future(send_workload(args, acc, ch.send_many, ch.wait_unblocked))
    code = await finish(acc, args.timeout)
    sender.cancel()
    return code


# -- raw asyncio TCP ----------------------------------------------------------------------------------------
def encode_frame(payloads: list[bytes]) -> bytes:
    parts = [b""]
    for p in payloads:
        parts.append(LEN.pack(len(p)))
        parts.append(p)
    body = b"".join(parts)
    return FRAME.pack(len(body), len(payloads)) + body


def decode_frame(body: bytes, count: int) -> list[bytes]:
    out = []
    pos = 0
    unpack = LEN.unpack_from
    for _ in range(count):
        (n,) = unpack(body, pos)
        pos += 4
        out.append(body[pos : pos + n])
        pos += n
    return out


async def run_raw(args: argparse.Namespace) -> int:
    acc = Accounting(args)
    peers = [r for r in range(args.members) if r != args.rank]
    relay = args.relay
    incoming = asyncio.Queue[int]()
    writers: dict[int, asyncio.StreamWriter] = {}
    connected = asyncio.Event()  # member 0 relays only once it has a connection to everyone

    async def forward(frame: bytes, targets: list[int]) -> None:
        for r in targets:
            writers[r].write(frame)
        for r in targets:
            await writers[r].drain()

    async def on_conn(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        (peer,) = struct.unpack(">i", await reader.readexactly(4))
        incoming.put_nowait(peer)
        try:
            while True:
                head = await reader.readexactly(FRAME.size)
                length, count = FRAME.unpack(head)
                body = await reader.readexactly(length)
                acc.deliver(decode_frame(body, count))
                if relay and args.rank == 0:
                    await connected.wait()
                    await forward(head + body, peers)  # the sender too: it delivers its own from here
        except (asyncio.IncompleteReadError, ConnectionError):
            pass

    server = await asyncio.start_server(on_conn, "127.0.0.1", args.ports[args.rank])
    # Outgoing connections: to everyone, or in relay mode from members to member 0 and from 0 to everyone.
    targets = peers if (not relay or args.rank == 0) else [0]
    for r in targets:
        for _ in range(600):
            try:
                _, w = await asyncio.open_connection("127.0.0.1", args.ports[r])
                break
            except OSError:
                await asyncio.sleep(0.05)
        else:
            raise SystemExit(f"raw worker {args.rank}: cannot connect to member {r}")
        w.write(struct.pack(">i", args.rank))
        writers[r] = w
    connected.set()
    expect_in = len(peers) if (not relay or args.rank == 0) else 1
    for _ in range(expect_in):
        await asyncio.wait_for(incoming.get(), 60.0)

    async def send(payloads: list[bytes]) -> None:
        frame = encode_frame(payloads)
        if relay and args.rank != 0:
            await forward(frame, [0])  # delivered when member 0 relays it back
            return
        acc.deliver(payloads)  # our own messages, as a group stack delivers them to us
        await forward(frame, peers)

    async def no_wait() -> None:
        return None

    sender = asyncio.ensure_future(send_workload(args, acc, send, no_wait))
    code = await finish(acc, args.timeout)
    sender.cancel()
    server.close()
    return code


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("system", choices=("groupcluster", "raw"))
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--ports", required=True, type=lambda s: [int(p) for p in s.split(",")])
    parser.add_argument("--senders", type=int, default=0, help="members 0..S-1 send (default: all)")
    parser.add_argument("--count", type=int, default=10000, help="messages per sender")
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--rate", type=float, default=0.0, help="messages per second per sender (0: unpaced)")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--cluster", default="peers")
    parser.add_argument("--stack", default="fifo")
    parser.add_argument("--transport", default="tcp")
    parser.add_argument("--relay", action="store_true", help="raw: everything through member 0")
    args = parser.parse_args(argv)
    args.members = len(args.ports)
    args.senders = args.senders or args.members
    args.size = max(args.size, HEADER.size)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    runner = run_groupcluster if args.system == "groupcluster" else run_raw
    try:
        return asyncio.run(runner(args))
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
