"""The grid node's own cost per operation and per transferred entry, in one process (no sockets, no HTTP).

    .venv/bin/python bench/grid_node_ops.py [--batch 1000] [--rounds 20] [--entries 200000] [--profile] [--json]

Three members (``GridNode`` with ``ChangeFeed`` hooks, as a real member runs it: batching and the change-feed
store) on an in-process
"network" that hands every payload to its destination at once, encoded and decoded as on the wire:

* ``batch put`` / ``batch get``: ``--batch`` operations per round, keys spread over all segments, each key's
  operation started (one step per member, as ``POST /v1/batch`` does) on the member the client library sends
  it to, run until every result is back; microseconds per operation over all three members (the whole path:
  command, stamp, backup, acknowledgement, response, encoding and decoding, and the node's next timer asked
  after every step, as a member's runtime does);
* ``transfer``: a member holding ``--entries`` entries of 100 bytes streams them to a new owner as state
  transfer does (chunks built, encoded, decoded, validated and applied); microseconds and MB/s per entry.

This separates the node's work from the transport and HTTP layers that ``grid_throughput.py`` and
``grid_rebalance.py`` measure end to end; ``--profile`` prints the functions that take the time (cProfile).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import sys
import time
from typing import Any

from groupcluster.core.address import Address
from groupcluster.grid.columns import EntryChunk
from groupcluster.grid.feed import ChangeFeed
from groupcluster.grid.messages import GET, PUT, XferData
from groupcluster.grid.node import GridConfig, GridNode
from groupcluster.grid.payload import decode_payload, encode_payload
from groupcluster.grid.store import SegmentStore


class Net:
    """Members whose payloads are delivered at once (encoded bytes, as the group carries them)."""

    def __init__(self, n: int) -> None:
        self.now = 1.0
        self.addrs = [Address("10.0.0.1", 7800 + i, i + 1) for i in range(n)]
        cfg = GridConfig.from_dict({"num_owners": 2})
        self.nodes = {a: GridNode(a, cfg, hooks=ChangeFeed()) for a in self.addrs}
        for a in self.addrs:
            self.nodes[a].on_view(self.addrs, self.now)
        self.settle()

    def settle(self) -> int:
        """Deliver until nothing is in flight; returns how many results came back."""
        got = 0
        moved = True
        while moved:
            moved = False
            for a, node in self.nodes.items():
                got += len(node.take_results())
                for out in node.take_outbox():
                    moved = True
                    dests = [m for m in self.addrs if m != a] if out.dest is None else [out.dest]
                    for d in dests:
                        self.nodes[d].on_messages([(a, out.payload)], self.now)
                        # After every step, as the member's runtime does to arm its timer.
                        self.nodes[d].next_deadline()
        return got


def run_batches(net: Net, kind: int, batch: int, rounds: int, value: bytes) -> float:
    """Seconds per operation over ``rounds`` batches of ``batch`` operations, each started on the member the
    client library sends it to (the key's write primary for puts, its first read owner for gets)."""
    t = net.nodes[net.addrs[0]].topology
    assert t is not None
    total = 0.0
    for r in range(rounds):
        groups: dict[Address, list[tuple[int, bytes, bytes | None]]] = {}
        for i in range(batch):
            key = b"key-%d-%d" % (r, i)
            seg = t.segment_of(key)
            target = t.write_primary(seg) if kind == PUT else t.read_owners(seg)[0]
            groups.setdefault(target, []).append((kind, key, value if kind == PUT else None))  # type: ignore[arg-type]
        t0 = time.perf_counter()
        for target, ops in groups.items():
            net.nodes[target].start_batch(ops, net.now)
            net.nodes[target].next_deadline()
        done = net.settle()
        total += time.perf_counter() - t0
        assert done == batch, f"{done} of {batch} operations finished"
    return total / (rounds * batch)


def run_transfer(entries: int, value: bytes) -> tuple[float, int]:
    """Seconds per entry to chunk, encode, decode and apply ``entries`` entries; and the key+value bytes."""
    src = SegmentStore(256)
    per = entries // 256
    for s in range(256):
        src.apply_chunk(
            s, [b"bulk-%03d-%07d" % (s, i) for i in range(per)], [(7 << 40) + i for i in range(per)], [value] * per
        )
    dst = SegmentStore(256)
    nbytes = 0
    t0 = time.perf_counter()
    for s in range(256):
        for keys, versions, values in src.segment_chunks(s, 1000, 256 * 1024):
            payload = encode_payload([XferData(1, s, EntryChunk(keys, versions, values), (), False)])
            (msg,) = decode_payload(payload)
            chunk = msg.entries  # type: ignore[union-attr]
            dst.apply_chunk(s, chunk.keys, chunk.versions, chunk.values)
            nbytes += chunk.nbytes
    took = time.perf_counter() - t0
    assert len(dst) == 256 * per
    return took / (256 * per), nbytes


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=1000, help="operations per batch")
    ap.add_argument("--rounds", type=int, default=20, help="batches per step (put, then get of the same keys)")
    ap.add_argument("--entries", type=int, default=200_000, help="entries moved in the transfer step")
    ap.add_argument("--value-size", type=int, default=100)
    ap.add_argument("--profile", action="store_true", help="print the top functions of each step (cProfile)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    value = b"v" * args.value_size
    net = Net(3)
    prof = cProfile.Profile() if args.profile else None
    res: dict[str, Any] = {}
    steps = [
        ("batch put", lambda: run_batches(net, PUT, args.batch, args.rounds, value)),
        ("batch get", lambda: run_batches(net, GET, args.batch, args.rounds, value)),
    ]
    for name, fn in steps:
        if prof is not None:
            prof.enable()
        per_op = fn()
        if prof is not None:
            prof.disable()
        res[name] = {"us_per_op": round(per_op * 1e6, 2), "ops_per_s": round(1 / per_op)}
    if prof is not None:
        prof.enable()
    per_entry, nbytes = run_transfer(args.entries, value)
    if prof is not None:
        prof.disable()
    res["transfer"] = {
        "us_per_entry": round(per_entry * 1e6, 3),
        "entries_per_s": round(1 / per_entry),
        "mb_per_s": round(nbytes / args.entries / per_entry / 1e6, 1),
    }
    if args.json:
        print(json.dumps(res, indent=2))
    else:
        for name in ("batch put", "batch get"):
            r = res[name]
            print(f"{name:<10} {r['us_per_op']:8.2f} us/op  ({r['ops_per_s']:,} ops/s, all three members' work)")
        r = res["transfer"]
        print(f"transfer   {r['us_per_entry']:8.3f} us/entry ({r['entries_per_s']:,} entries/s, {r['mb_per_s']} MB/s)")
    if prof is not None:
        pstats.Stats(prof, stream=sys.stdout).sort_stats("tottime").print_stats(25)
    return 0


if __name__ == "__main__":
    sys.exit(main())
