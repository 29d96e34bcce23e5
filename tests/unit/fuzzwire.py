"""The input generators and decoder checks of the wire fuzzing, shared by the test and the long target.

Not a test module: tests/unit/test_fuzz_wire.py runs a small derandomized share of these inputs with
hypothesis, and scripts/fuzz_decoders.py (``run_inputs``, ``StackTarget``) millions of them. The corpus holds
real frames captured from simulated fifo, vsync and total-order groups and grid payloads of every message type;
the mutators change them byte-wise and structurally; a ``check_*`` function returns "ok" or "rejected" and lets
anything but a WireError naming the field escape.
"""

from __future__ import annotations

import copy
import functools
import random
from collections.abc import Callable
from typing import Any

import msgpack
from groupcluster import protocols as _protocols  # noqa: F401  # registers every layer and header
from groupcluster import stacks
from groupcluster.core import protocol_ids
from groupcluster.core.address import Address
from groupcluster.core.errors import WireError
from groupcluster.core.events import ViewChange
from groupcluster.core.message import HEADER_TYPES, Message
from groupcluster.core.stack import Stack
from groupcluster.core.view import View, ViewId
from groupcluster.core.wire import decode_frame, encode_messages
from groupcluster.grid import columns as grid_columns
from groupcluster.grid import messages as grid_messages
from groupcluster.grid import payload as grid_payload
from groupcluster.grid.tx import messages as tm
from groupcluster.protocols import sequencer as _sequencer  # noqa: F401  # registers the sequencer
from groupcluster.protocols.flow import MULTICAST, REPLENISH, UNICAST, FlowHeader
from groupcluster.protocols.frag import FragHeader
from groupcluster.protocols.nakack import XMIT_GONE, XMIT_REQ, NakAckHeader
from groupcluster.sim.network import Endpoint, Network
from groupcluster.sim.runner import run_many
from groupcluster.sim.scenario import Scenario

SIM_CLUSTER = Scenario().cluster

# -- corpus: real frames from simulated groups -------------------------------------------------------------


@functools.cache
def frame_corpus(limit_per_stack: int = 400) -> tuple[tuple[bytes, tuple[str, int]], ...]:
    """(frame, destination endpoint) pairs transmitted in short simulated runs of each preset."""
    captured: list[tuple[bytes, tuple[str, int]]] = []
    # Captured where the simulator puts frames on its network: the stack's own methods may be compiled (mypyc),
    # and a compiled class's methods call each other directly, past anything patched onto the class.
    original = Network.send
    for stack_name in ("fifo", "vsync", "total-order"):
        seen: set[bytes] = set()
        picked: list[tuple[bytes, tuple[str, int]]] = []
        rng = random.Random(stack_name)

        def record(
            self: Network, src: Endpoint, endpoint: Endpoint, data: bytes, seen=seen, picked=picked, rng=rng
        ) -> None:
            # Reservoir-ish sampling: keep early frames (joins, views) and a random share of the rest.
            keep = len(picked) < limit_per_stack // 2 or rng.random() < 0.05
            if keep and data not in seen and len(picked) < limit_per_stack:
                seen.add(data)
                picked.append((data, endpoint))
            original(self, src, endpoint, data)

        Network.send = record  # type: ignore[method-assign]
        try:
            list(run_many([1], Scenario(stack=stack_name, members=3, safety_time=6.0)))
        finally:
            Network.send = original  # type: ignore[method-assign]
        captured.extend(picked)
    # Messages that short runs rarely produce (credits are replenished after megabytes; XMIT_GONE needs a
    # collected seqno): built by hand between two of the simulated members, so they reach the layers too.
    dst, src = sorted({decode_frame(f, SIM_CLUSTER)[0] for f, _ in captured})[:2]  # dst: StackTarget's member
    extra = [
        Message(dst, b"", headers={protocol_ids.FLOW: FlowHeader(REPLENISH, UNICAST, 4096)}),
        Message(None, b"", headers={protocol_ids.FLOW: FlowHeader(REPLENISH, MULTICAST, 4096)}),
        Message(dst, b"", headers={protocol_ids.NAKACK: NakAckHeader(XMIT_GONE, 5, src)}),
        Message(dst, b"", headers={protocol_ids.NAKACK: NakAckHeader(XMIT_REQ, sender=dst, ranges=((1, 9),))}),
        Message(dst, b"x", headers={protocol_ids.FRAG: FragHeader(3, 0, 4)}),
    ]
    captured.extend((encode_messages(SIM_CLUSTER, src, [m]), dst.endpoint) for m in extra)
    return tuple(captured)


def corpus_frames() -> list[bytes]:
    return [f for f, _ in frame_corpus()]


@functools.cache
def grid_corpus() -> tuple[bytes, ...]:
    """Valid grid payloads of every message type."""
    gm, gc = grid_messages, grid_columns
    msgs: list[Any] = [
        gm.Command(1, 0, 3, gm.PUT, b"key", b"value"),
        gm.Command(2, 1, 3, gm.GET, b"key", None),
        gm.Response(1, 0, gm.OK, 3, b"value", ""),
        gm.Response(2, 0, gm.ERROR, 3, None, "bad"),
        gm.Backup(5, 3, 7, b"k", b"v"),
        gm.Backup(6, 3, 8, b"k", None),
        gm.BackupAck(5, gm.OK, 3),
        gm.Fetch(9, 3, 2, (1, 2, 3)),
        gm.XferData(9, 1, [(b"a", 1, b"x"), (b"b", 2, None)], (1,), False),
        gm.XferAck(9),
        gm.XferCancel(9),
        gm.XferFail(9, (4, 5)),
        gm.Confirm(3),
    ]
    cb, rb, bb, ab = gc.CommandBatch(3), gc.ResponseBatch(), gc.BackupBatch(3), gc.BackupAckBatch()
    cb.add(1, 1, gm.PUT, b"key", b"value")
    cb.add(2, 1, gm.GET, b"key", None)
    rb.add(1, 1, gm.OK, 3, b"value", "")
    rb.add(2, 1, gm.ERROR, 3, None, "bad")
    bb.add(5, 7, b"k", b"v")
    bb.add(6, 8, b"k", None)
    ab.add(5, gm.OK, 3)
    msgs += [cb, rb, bb, ab]
    # Format 4: answers with versions, and the transaction messages that share the payload.
    rb2 = gc.ResponseBatch()
    rb2.add(1, 1, gm.OK, 3, b"value", "", 1 << 40)
    rb2.add(2, 1, gm.NOT_FOUND, 3, None, "", 0)
    msgs += [gm.Response(3, 1, gm.OK, 3, b"v", "", 1 << 40), rb2]
    tx = tm.TxId(Address("10.0.0.1", 7800, 3), 9)
    record = tm.TxRecordInfo(tx, 1, tm.INFO_PREPARED, False, (b"k",), ((b"k", b"v"),), ((b"k", 1 << 40),))
    msgs += [
        tm.TxLock(tx, 1, 1, 3, (b"a", b"b")),
        tm.TxPrepare(tx, 1, 3, (b"a",), ((b"a", b"x"), (b"c", None)), ((b"a", 0),)),
        tm.TxPrepare(tx, 1, 3, (b"a",), ((b"a", b"x"), (b"c", None)), ((b"a", 0),), False),  # optimistic: no wait
        tm.TxVote(tx, 1, 0, tm.YES, 3, ((b"a", 1 << 40),), ""),
        tm.TxVote(tx, 1, 2, tm.NO, 3, (), "lock timeout"),
        tm.TxCommit(tx, 1, 3, ((b"a", 1 << 40, b"x"), (b"c", 1 << 41, None))),
        tm.TxRollback(tx, 1, 3),
        tm.TxAck(tx, 1, tm.ACK_RETRY, 4),
        tm.TxLockInfo(3, (1, 2), (record,)),
        tm.TxInfoAck(3, (1, 2)),
    ]
    out = [grid_payload.encode_payload([m]) for m in msgs]
    out.append(grid_payload.encode_payload(msgs))
    return tuple(out)


# -- mutators (shared with scripts/fuzz_decoders.py) ---------------------------------------------------------
INTERESTING_BYTES = bytes([0x00, 0x7F, 0x80, 0x90, 0x9F, 0xA0, 0xC0, 0xC1, 0xC2, 0xC3, 0xC4, 0xC5, 0xC6, 0xCA, 0xCB,
                           0xCC, 0xCD, 0xCE, 0xCF, 0xD0, 0xD3, 0xD4, 0xD9, 0xDA, 0xDB, 0xDC, 0xDD, 0xDE, 0xDF, 0xE0,
                           0xFF])  # fmt: skip
INTERESTING_VALUES: list[Any] = [
    None, True, False, 0, -1, 1, 2**31, 2**63 - 1, 2**64 - 1, -(2**63), 1.5, float("nan"),
    "", "x" * 300, b"", b"\x00" * 70000, [], [None] * 5, [[[]]], list(range(100)),
]  # fmt: skip
INTERESTING_INTS = [0, 1, 2, 3, 7, 255, 4096, 65535, 65536, 2**31 - 1, 2**31, 2**32, 2**62, 2**63 - 1]


def mutate_bytes(data: bytes, rng: random.Random, other: bytes | None = None) -> bytes:
    """One to four random byte-level edits of ``data`` (``other``: a second input to splice from)."""
    buf = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(8)
        pos = rng.randrange(len(buf) + 1)
        if op == 0 and buf:
            buf[min(pos, len(buf) - 1)] ^= 1 << rng.randrange(8)
        elif op == 1 and buf:
            buf[min(pos, len(buf) - 1)] = rng.choice(INTERESTING_BYTES)
        elif op == 2:
            buf[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        elif op == 3 and buf:
            del buf[pos : pos + rng.randint(1, 16)]
        elif op == 4:
            del buf[pos:]  # truncation
        elif op == 5 and buf:
            end = min(len(buf), pos + rng.randint(1, 64))
            buf[pos:pos] = buf[pos:end]  # duplicate a range
        elif op == 6 and other:
            cut = rng.randrange(len(other) + 1)
            buf = buf[:pos] + bytearray(other[cut:])  # splice
        elif op == 7 and buf:
            i = min(pos, len(buf) - 1)
            buf[i] = (buf[i] + rng.choice((1, -1, 16, -16))) & 0xFF
    return bytes(buf)


def random_value(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(9 if depth < 3 else 7)
    if kind == 0:
        # A copy: the mutators edit lists in place, and a shared list could end up inside itself.
        return copy.deepcopy(rng.choice(INTERESTING_VALUES))
    if kind == 1:
        return rng.randint(-(2**63), 2**64 - 1)
    if kind == 2:
        return rng.randint(-2, 70000)
    if kind == 3:
        return rng.randbytes(rng.randint(0, 40))
    if kind == 4:
        return "".join(chr(rng.randint(0, 0x2FF)) for _ in range(rng.randint(0, 20)))
    if kind == 5:
        return rng.choice((None, True, False, 0.25))
    if kind == 6:
        return rng.randint(0, 40)
    return [random_value(rng, depth + 1) for _ in range(rng.randint(0, 6))]


def mutate_structure(data: bytes, rng: random.Random) -> bytes:
    """Decode a valid frame/payload, replace one random node with a random value, encode again."""
    try:
        obj = msgpack.unpackb(data, raw=False, use_list=True, strict_map_key=False)
    except Exception:
        return data
    paths: list[tuple[list[Any], int]] = []

    def walk(node: Any) -> None:
        if isinstance(node, list):
            for i, child in enumerate(node):
                paths.append((node, i))
                walk(child)

    walk(obj)
    for _ in range(rng.randint(1, 3)):
        if not paths:
            break
        parent, i = rng.choice(paths)
        op = rng.randrange(4)
        if op == 0:
            parent[i] = random_value(rng)
        elif op == 1:
            parent.insert(i, random_value(rng))
        elif op == 2:
            del parent[i]
            paths = []
            walk(obj)
        else:
            parent[i] = [parent[i]] if rng.random() < 0.5 else parent[i]  # wrap one level deeper
    return msgpack.packb(obj, use_bin_type=True)


def mutate_header_ints(data: bytes, rng: random.Random) -> bytes:
    """Replace a few integers inside the messages of a valid frame (seqnos, ids, counts, kinds, ports) with
    extreme but well-typed values: such frames mostly pass the decoder and test the layers' own bounds."""
    try:
        obj = msgpack.unpackb(data, raw=False, use_list=True, strict_map_key=False)
        messages = obj[3]
    except Exception:
        return data
    slots: list[tuple[list[Any], int]] = []

    def walk(node: Any) -> None:
        for i, child in enumerate(node):
            if type(child) is int:
                slots.append((node, i))
            elif isinstance(child, list):
                walk(child)

    if isinstance(messages, list):
        walk(messages)
    for _ in range(rng.randint(1, 3)):
        if slots:
            parent, i = rng.choice(slots)
            parent[i] = rng.choice(INTERESTING_INTS) if rng.random() < 0.8 else parent[i] + rng.randint(-3, 3)
    return msgpack.packb(obj, use_bin_type=True)


def check_frame_decoder(data: bytes) -> str:
    """Decode; return "ok" or "rejected"; anything but a WireError naming the frame field fails."""
    try:
        decode_frame(data, SIM_CLUSTER)
    except WireError as exc:
        rejection = str(exc)
    else:
        return "ok"
    assert rejection.startswith("frame"), f"rejection does not name the field: {rejection}"
    return "rejected"


def check_grid_decoder(data: bytes) -> str:
    try:
        grid_payload.decode_payload(data)
    except WireError as exc:
        rejection = str(exc)
    else:
        return "ok"
    assert rejection.startswith("grid"), f"rejection does not name the field: {rejection}"
    return "rejected"


def check_header_decoder(pid: int, value: Any) -> str:
    """A header class's from_wire on an arbitrary decoded value: a result or a WireError, nothing else."""
    try:
        HEADER_TYPES[pid].from_wire(value)
    except WireError:
        return "rejected"
    return "ok"


class StackTarget:
    """A member (fifo/vsync/total-order) whose view holds every sender of the corpus: frames that decode reach
    every layer, which must drop or handle them without raising."""

    def __init__(self, preset: str) -> None:
        senders = sorted({decode_frame(f, SIM_CLUSTER)[0] for f in corpus_frames()})
        self.me = senders[0]
        self.stack = Stack(stacks.preset(preset), local_address=self.me, cluster=SIM_CLUSTER, seed=7)
        self.stack.start(0.0)
        view = View(ViewId(5, self.me), tuple(senders))
        self.stack.control(0.0, ViewChange(view))
        self.now = 0.0
        self.stack.drain()

    def feed(self, data: bytes) -> None:
        self.now += 0.01
        self.stack.receive(self.now, data)
        if len(self.stack._outputs) > 10000:
            self.stack.drain()
        if int(self.now * 100) % 50 == 0:
            self.stack.fire_timers(self.now)
            self.stack.drain()


def run_inputs(
    n: int, seed: int, report: Callable[[str, dict[str, int]], None] | None = None
) -> dict[str, dict[str, int]]:
    """``n`` generated inputs per target, for scripts/fuzz_decoders.py: returns outcome counts per target."""
    rng = random.Random(seed)
    frames = corpus_frames()
    payloads = grid_corpus()
    pids = sorted(HEADER_TYPES)
    targets = {"frame": {"ok": 0, "rejected": 0}, "grid": {"ok": 0, "rejected": 0}, "header": {"ok": 0, "rejected": 0}}
    for i in range(n):
        r = rng.random()
        if r < 0.2:
            data = rng.randbytes(rng.randint(0, 300))
            targets["frame"][check_frame_decoder(data)] += 1
            targets["grid"][check_grid_decoder(data)] += 1
        elif r < 0.55:
            base = rng.choice(frames)
            data = mutate_bytes(base, rng, rng.choice(frames)) if rng.random() < 0.5 else mutate_structure(base, rng)
            targets["frame"][check_frame_decoder(data)] += 1
        elif r < 0.8:
            base = rng.choice(payloads)
            data = mutate_bytes(base, rng, rng.choice(payloads)) if rng.random() < 0.5 else mutate_structure(base, rng)
            targets["grid"][check_grid_decoder(data)] += 1
        else:
            targets["header"][check_header_decoder(rng.choice(pids), random_value(rng))] += 1
        if report is not None and (i + 1) % 100_000 == 0:
            report(f"{i + 1} inputs", {k: sum(v.values()) for k, v in targets.items()})
    return targets
