"""CPU a state-transfer chunk costs in the group stack alone: two stacks in one process, no sockets, no grid.

    .venv/bin/python bench/stack_chunk_cost.py [--rounds 500] [--size 112000] [--preset vsync] [--profile]

Two stacks of the grid members' preset (``vsync``) form a view over an in-memory exchange of their frames.
Then, per round, the first sends one ``--size``-byte unicast to the second (fragmented as a real chunk is), the
second answers with a 20-byte unicast (as ``XFER_ACK`` does), and both run their due timers; every frame is
handed to its receiver at once. The figure is the process CPU time per round and per MB, both stacks
together: what the stack path of a chunk costs without the event loop, the sockets and the grid's data work.
``--profile`` prints the hottest functions of a second pass.

On stop 22's machine a 112 KB round took 0.31-0.52 ms (2.7-4.6 ms per MB), a small part of the 39-58 ms of CPU per MB
that ``bench/grid_rebalance.py`` measures for a whole move (docs/grid.md, stop 22).
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import time

from groupcluster.core.address import Address
from groupcluster.core.events import ViewChange
from groupcluster.core.stack import Stack, Transmit
from groupcluster.stacks import PRESETS, preset

ENDPOINTS = [("127.0.0.1", 7801), ("127.0.0.1", 7802)]
STEP = 0.001  # virtual seconds per round


class Pair:
    """Two stacks that hand each other's frames over at once, on a virtual clock."""

    def __init__(self, preset_name: str) -> None:
        hosts = ",".join(f"{h}:{p}" for h, p in ENDPOINTS)
        self.now = 0.0
        self.stacks: list[Stack] = []
        for i, (host, port) in enumerate(ENDPOINTS):
            spec = preset(preset_name)
            for layer in spec:
                if layer["layer"] == "discovery":
                    layer["initial_hosts"] = hosts
            self.stacks.append(Stack(spec, local_address=Address(host, port, i + 1), cluster="bench", seed=i))
        self.by_endpoint = dict(zip(ENDPOINTS, self.stacks, strict=True))
        self.view_sizes = [0, 0]

    def exchange(self) -> None:
        """Hand every frame to its receiver until no stack has output left (deliveries are dropped)."""
        moved = True
        while moved:
            moved = False
            for i, stack in enumerate(self.stacks):
                for out in stack.drain():
                    if type(out) is Transmit:
                        self.by_endpoint[out.endpoint].receive(self.now, out.data)
                        moved = True
                    elif isinstance(out, ViewChange):
                        self.view_sizes[i] = len(out.view.members)

    def fire_due_timers(self) -> None:
        for stack in self.stacks:
            deadline = stack.next_deadline()
            if deadline is not None and deadline <= self.now:
                stack.fire_timers(self.now)
        self.exchange()

    def form_view(self) -> None:
        for stack in self.stacks:
            stack.start(self.now)
        while self.view_sizes != [2, 2]:
            if self.now > 60.0:
                raise SystemExit("the two stacks did not form a view within 60 virtual seconds")
            self.now += 0.01
            self.fire_due_timers()

    def rounds(self, n: int, payload: bytes) -> None:
        a, b = self.stacks
        reply = b"x" * 20
        for _ in range(n):
            self.now += STEP
            a.send(self.now, payload, dest=b.local_address)
            self.exchange()
            b.send(self.now, reply, dest=a.local_address)
            self.exchange()
            self.fire_due_timers()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=500)
    ap.add_argument("--size", type=int, default=112_000, help="bytes per chunk message")
    ap.add_argument("--preset", default="vsync", choices=sorted(PRESETS))
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    if args.rounds < 1 or args.size < 1:
        ap.error("--rounds and --size must be at least 1")
    pair = Pair(args.preset)
    pair.form_view()
    payload = os.urandom(args.size)
    pair.rounds(50, payload)  # warm up: connections, fragment buffers
    t = time.process_time()
    pair.rounds(args.rounds, payload)
    cpu = time.process_time() - t
    per_round = cpu / args.rounds
    print(
        f"{args.rounds} rounds of {args.size:,} B there and 20 B back ({args.preset}): "
        f"{per_round * 1e3:.3f} ms of CPU per round, {per_round / (args.size / 1e6) * 1e3:.1f} ms per MB"
    )
    if args.profile:
        prof = cProfile.Profile()
        prof.enable()
        pair.rounds(args.rounds, payload)
        prof.disable()
        pstats.Stats(prof, stream=sys.stdout).sort_stats("tottime").print_stats(25)
    return 0


if __name__ == "__main__":
    sys.exit(main())
