"""Benchmark member processes in Python: our stack, and raw asyncio TCP (the physical limit).

    python -m groupcluster.bench.workers groupcluster --rank 0 --ports 7801,7802,7803,7804 --stack fifo ...
    python -m groupcluster.bench.workers raw --rank 0 --ports ... [--relay]

Both run the workload of the JGroups harness (bench/peers/jgroups/src/main/java/io/groupcluster/bench/Core.java):
members ``0 .. senders-1`` multicast ``--count`` payloads of ``--size`` bytes each (a payload starts with the
send time in CLOCK_MONOTONIC nanoseconds, the sender's rank and a sequence number), unpaced or at ``--rate``
messages per second, in rounds that standard input commands (``round K``; see :func:`serve_rounds`): the same
processes run the warm-up rounds and the measured ones. Once a member has delivered every message of a round it
prints ``RESULT {json}`` (see :func:`groupcluster.bench.model.parse_result_line`) and waits for the next
command; the runner kills the members after the last round, so no member leaves while others still need it.
Every delivered message is touched (its length and last byte), as in the Java harness. ``--window`` makes the
messages increments of a replicated counter (the ``replicated-counter-3`` workload).

The raw worker carries the same payloads with the same batching (``SEND_CHUNK`` messages per event-loop
iteration, one frame per chunk and peer) over a full mesh of TCP connections with no protocol work: no
headers beyond lengths, no acknowledgements, no retransmission table, no flow control beyond TCP's. With
``--relay`` every sender sends to member 0, which delivers and forwards each frame to the others: the
shape of a sequencer's total order without its bookkeeping.

Our members run with failure detection of 40 s and a 1.5 s verification (``BENCH_FD``), the values of the
FD_ALL3 and VERIFY_SUSPECT2 lines of JGroups' own shipped ``tcp.xml``/``tcp-new.xml``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import json
import struct
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

# Chunk of messages handed over per event-loop iteration when unpaced: the same as `groupcluster member`.
SEND_CHUNK = 200
# Failure detection in benchmark runs: the suite shares a 2-core machine with other work, and a member starved
# of CPU for a few seconds must not be suspected and excluded (a run cannot finish across that view change:
# fifo-1of4x1KB once stalled so with the default 4 s). Every system gets 40 s of silence before a suspicion,
# then a 1.5 s verification: JGroups 5's FD_ALL3/VERIFY_SUSPECT2 in its own shipped tcp.xml, and JGroups
# 2.12's FD (10 s x 4 tries) there too. No member crashes in these workloads, so this costs nothing.
BENCH_FD = {"timeout": "40s", "verify_timeout": "1500ms"}
HEADER = struct.Struct(">qii")  # send time (ns), sender rank, sequence number
FRAME = struct.Struct(">II")  # frame length after this header, message count
LEN = struct.Struct(">I")


def make_payload(rank: int, seq: int, size: int) -> bytes:
    head = HEADER.pack(time.monotonic_ns(), rank, seq)
    return head + bytes(max(size - HEADER.size, 0))


class Accounting:
    """Delivery counting, latency sampling and the per-message touch, the same as the Java harness (Core.java).

    Deliveries are counted over the process's life; round ``K`` is complete when ``K`` rounds' worth have been
    delivered, so a message of round K that arrives before this member read its own ``round K`` counts for K.
    With ``--window`` (the replicated counter) every payload is an increment applied to :attr:`value`, and at
    most ``window`` of this member's own increments are in flight (sent, not yet delivered back in total order).
    """

    def __init__(self, args: argparse.Namespace) -> None:
        self.expected = args.senders * args.count  # per round
        self.count = args.count
        self.sample = args.rate > 0
        self.rank = args.rank
        self.window = getattr(args, "window", 0)
        self.total = 0
        self.base = 0
        self.target = 0
        self.active = False
        self.first: float | None = None
        self.last: float | None = None
        self.send_start: float | None = None
        self.send_end: float | None = None
        self.latencies: list[int] = []
        self.touched_bytes = 0
        self.check = 0
        self.value = 0  # the replicated counter (window mode)
        self.inflight = 0  # own increments sent and not yet delivered (window mode)
        self.room = asyncio.Event()
        self.done = asyncio.Event()

    def start_round(self, round_no: int) -> None:
        self.base = (round_no - 1) * self.expected
        self.target = round_no * self.expected
        self.first = self.last = self.send_start = self.send_end = None
        self.latencies = []
        self.done.clear()
        self.active = self.total < self.target
        if not self.active:
            self.last = time.monotonic()
            self.done.set()

    def deliver(self, payloads: list[bytes]) -> None:
        now_ns = time.monotonic_ns()
        now = now_ns / 1e9
        # Touch every message as the Java harness does: its length and its last byte.
        nbytes, check = 0, self.check
        for p in payloads:
            nbytes += len(p)
            check ^= p[-1]
        self.touched_bytes += nbytes
        self.check = check
        if self.window:
            self._apply(payloads)
        self.total += len(payloads)
        if not self.active:
            return
        if self.first is None:
            self.first = now
        if self.sample:
            # Latency only in paced runs, past each sender's first tenth (connection set-up).
            skip = self.count // 10
            unpack = HEADER.unpack_from
            lat = self.latencies
            for p in payloads:
                sent, _rank, seq = unpack(p)
                if seq >= skip:
                    lat.append(now_ns - sent)
        if self.total >= self.target:
            self.last = now
            self.active = False
            self.done.set()

    def _apply(self, payloads: list[bytes]) -> None:
        """Apply increments (the byte after the header) and retire our own from the in-flight window."""
        unpack = HEADER.unpack_from
        at = HEADER.size
        mine = 0
        value = self.value
        for p in payloads:
            value += p[at]
            if unpack(p)[1] == self.rank:
                mine += 1
        self.value = value
        if mine:
            self.inflight -= mine
            if self.inflight < self.window:
                self.room.set()

    async def wait_room(self) -> None:
        while self.window and self.inflight >= self.window:
            self.room.clear()
            await self.room.wait()

    def result(self, round_no: int) -> dict[str, Any]:
        out: dict[str, Any] = {
            "rank": self.rank,
            "round": round_no,
            "delivered": self.expected,
            "first": self.first,
            "last": self.last,
            "send_start": self.send_start,
            "send_end": self.send_end,
            "touched_bytes": self.touched_bytes,
            "check": self.check,
        }
        if self.window:
            out["value"] = self.value
        if self.latencies:
            lat = sorted(self.latencies)
            n = len(lat)
            out.update(latency_samples=n, p50_us=lat[int(0.50 * (n - 1))] / 1e3, p99_us=lat[int(0.99 * (n - 1))] / 1e3)
        return out


async def send_workload(
    args: argparse.Namespace, acc: Accounting, send: Callable[[list[bytes]], Any], wait: Callable[[], Any]
) -> None:
    """Send our share: chunks of SEND_CHUNK unpaced, or on schedule at ``--rate``; ``wait`` applies backpressure.

    With ``--window`` a chunk never takes more than the room left in the window of increments in flight.
    """
    if args.rank >= args.senders:
        return
    loop = asyncio.get_running_loop()
    start = loop.time()
    acc.send_start = time.monotonic()
    sent = 0
    total, size, rank, rate = args.count, args.size, args.rank, args.rate
    make = make_increment if acc.window else make_payload
    while sent < total:
        await wait()
        if acc.window:
            await acc.wait_room()
        if rate <= 0:
            n = min(SEND_CHUNK, total - sent)
        else:
            due = min(total, int((loop.time() - start) * rate) + 1)
            n = min(SEND_CHUNK, due - sent)
            if n <= 0:
                await asyncio.sleep(min(0.002, max(0.0002, (sent + 1) / rate - (loop.time() - start))))
                continue
        if acc.window:
            n = min(n, acc.window - acc.inflight)
            acc.inflight += n
        result = send([make(rank, i, size) for i in range(sent, sent + n)])
        if asyncio.iscoroutine(result):
            await result
        sent += n
        await asyncio.sleep(0)
    acc.send_end = time.monotonic()


def make_increment(rank: int, seq: int, size: int) -> bytes:
    """A counter increment: the usual header, then the amount (1)."""
    return HEADER.pack(time.monotonic_ns(), rank, seq) + b"\x01"


def stdin_commands() -> asyncio.Queue[str | None]:
    """Lines of standard input as they come (None at its end), read by a thread so the event loop never blocks."""
    loop = asyncio.get_running_loop()
    out: asyncio.Queue[str | None] = asyncio.Queue()

    def pump() -> None:
        for line in sys.stdin:
            loop.call_soon_threadsafe(out.put_nowait, line.strip())
        loop.call_soon_threadsafe(out.put_nowait, None)

    threading.Thread(target=pump, daemon=True, name="commands").start()
    return out


async def serve_rounds(
    args: argparse.Namespace, acc: Accounting, send: Callable[[list[bytes]], Any], wait: Callable[[], Any]
) -> int:
    """Run rounds as standard input commands them (``round K``), until ``exit`` or its end.

    Prints ``READY`` once, then per round ``RESULT {json}`` (see :func:`groupcluster.bench.model.parse_result_line`)
    or ``FAILED K ...`` when the round did not complete within ``--timeout``; the process stays a member in
    between, so warm-up rounds warm exactly the process that is measured next.
    """
    commands = stdin_commands()
    print("READY", flush=True)
    while True:
        line = await commands.get()
        if line is None or line == "exit":
            return 0
        if not line.startswith("round "):
            continue
        round_no = int(line.split()[1])
        acc.start_round(round_no)
        sender = asyncio.ensure_future(send_workload(args, acc, send, wait))
        try:
            await asyncio.wait_for(acc.done.wait(), args.timeout)
        except TimeoutError:
            sender.cancel()
            got = acc.total - acc.base
            print(f"FAILED {round_no} delivered {got} of {acc.expected} in {args.timeout:g} s", flush=True)
            return 4
        await sender
        print("RESULT " + json.dumps(acc.result(round_no)), flush=True)


# -- our stack -----------------------------------------------------------------------------------------------
async def run_groupcluster(args: argparse.Namespace) -> int:
    # The sequencer layer registers itself on import; the protocols package may not import it yet.
    with contextlib.suppress(ModuleNotFoundError):
        importlib.import_module("groupcluster.protocols.sequencer")
    from ..runtime.channel import Channel

    acc = Accounting(args)
    hosts = [f"127.0.0.1:{p}" for p in args.ports]

    def on_messages(msgs: list[Any]) -> None:
        acc.deliver([m.payload for m in msgs])

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
    return await serve_rounds(args, acc, ch.send_many, ch.wait_unblocked)


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

    code = await serve_rounds(args, acc, send, no_wait)
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
    parser.add_argument(
        "--window", type=int, default=0, help="replicated counter: apply increments, at most this many own in flight"
    )
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
