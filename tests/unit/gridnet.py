"""The deterministic fake network of the grid node's unit tests, and what drives and checks runs on it.

Not a test module: test_grid_node.py and the other grid unit tests (caches, capacity, events, expiry, bounds,
persistence, transactions) import it. :class:`FakeNet` stands in for the group (per-link FIFO delivery with
random delays, views installed at every live member at once, crashes, graceful leaves), :class:`TxNet` can also
lose chosen transaction messages, and :func:`run_scenario` / :func:`final_checks` run a writer through joins,
leaves and crashes and check that no acknowledged write is lost and that replicas agree.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import random
from dataclasses import dataclass, field

from groupcluster.core.address import Address
from groupcluster.grid.consistent_hash import segment_of
from groupcluster.grid.messages import DELETE, GET, PUT
from groupcluster.grid.node import GridConfig, GridNode, OpResult, Outgoing
from groupcluster.grid.payload import decode_payload, encode_payload
from groupcluster.grid.topology import Availability, Phase, owner_set

CONFIG = GridConfig.from_dict(
    {
        "num_segments": 32,
        "num_owners": 2,
        "transfer_batch_entries": 16,
        "attempt_timeout": "1s",
        "op_timeout": "60s",
        "recovery_timeout": "1s",
    }
)


def member(i: int) -> Address:
    return Address(f"10.0.0.{i}", 7800, i)


class FakeNet:
    """Members, views and a virtual clock; messages are delivered per link in FIFO order after a delay."""

    def __init__(self, rng: random.Random, config: GridConfig = CONFIG) -> None:
        self.rng = rng
        self.config = config
        self.now = 0.0
        self.nodes: dict[Address, GridNode] = {}
        self.view: list[Address] = []
        self.events: list[tuple[float, int, str, object]] = []
        self.seq = itertools.count()
        self.link_time: dict[tuple[Address, Address], float] = {}
        self.tick_at: dict[Address, float] = {}
        self.results: dict[Address, list[OpResult]] = {}
        self.next_id = 1
        self.crashed: set[Address] = set()

    # -- membership ------------------------------------------------------------------------------------------
    def add(self, n: int = 1) -> list[Address]:
        new = []
        for _ in range(n):
            a = member(self.next_id)
            self.next_id += 1
            self.nodes[a] = GridNode(a, self.config)
            new.append(a)
        self.install_view(self.view + new)
        return new

    def install_view(self, members: list[Address]) -> None:
        self.view = list(members)
        for a in self.view:
            self.nodes[a].on_view(tuple(self.view), self.now)
        for a in self.view:
            self.collect(a)

    def crash(self, a: Address) -> None:
        self.crashed.add(a)
        node = self.nodes.pop(a)
        node.take_outbox()
        # Part of what it had in flight never arrives (no virtual synchrony in this fake).
        self.events = [e for e in self.events if not (e[2] == "msg" and e[3][0] == a and self.rng.random() < 0.5)]  # type: ignore[index]
        heapq.heapify(self.events)
        self.install_view([m for m in self.view if m != a])

    def remove_left(self) -> None:
        gone = [a for a in self.view if self.nodes[a].ready_to_leave]
        if gone:
            for a in gone:
                self.nodes.pop(a)
            self.install_view([m for m in self.view if m not in gone])

    # -- traffic ---------------------------------------------------------------------------------------------
    def collect(self, a: Address) -> None:
        node = self.nodes.get(a)
        if node is None:
            return
        for out in node.take_outbox():
            dests = [m for m in self.view if m != a] if out.dest is None else [out.dest]
            for d in dests:
                key = (a, d)
                t = max(self.link_time.get(key, 0.0), self.now + self.rng.uniform(0.0005, 0.004))
                self.link_time[key] = t
                heapq.heappush(self.events, (t, next(self.seq), "msg", (a, d, out.payload)))
        self.results.setdefault(a, []).extend(node.take_results())
        nd = node.next_deadline()
        if nd is not None and (a not in self.tick_at or nd < self.tick_at[a]):
            self.tick_at[a] = nd
            heapq.heappush(self.events, (max(nd, self.now), next(self.seq), "tick", a))

    def run_until(self, t: float) -> None:
        while self.events and self.events[0][0] <= t:
            when, _, kind, data = heapq.heappop(self.events)
            self.now = max(self.now, when)
            if kind == "msg":
                src, dst, payload = data  # type: ignore[misc]
                node = self.nodes.get(dst)
                if node is not None:
                    node.on_messages([(src, payload)], self.now)
                    self.collect(dst)
            else:
                a: Address = data  # type: ignore[assignment]
                node = self.nodes.get(a)
                if node is not None and self.tick_at.get(a) is not None and self.tick_at[a] <= self.now:
                    del self.tick_at[a]
                    node.tick(self.now)
                    self.collect(a)
        self.now = max(self.now, t)

    # -- observation -----------------------------------------------------------------------------------------
    @property
    def coordinator(self) -> GridNode:
        return self.nodes[self.view[0]]

    def crash_safe(self) -> bool:
        """A single crash now loses neither data nor the majority of the last stable owners (no degraded mode).

        Judged on every member's topology, not just the coordinator's: if the coordinator crashes, the
        topologies it was broadcasting may be lost with it, and its successor recovers from older ones.
        """
        planner = self.coordinator.planner
        if planner is None or planner.recovering or len(self.view) < 3:
            return False
        for a in self.view:
            t = self.nodes[a].topology
            if t is None or t.availability != Availability.AVAILABLE:
                return False
            if len(t.stable_members) < 3 or not set(t.stable_members) <= set(self.view):
                return False
        return True

    def stable(self) -> bool:
        """Everyone on the coordinator's topology, no rebalance, every segment fully owned by live members."""
        t = self.coordinator.topology
        if t is None or t.phase != Phase.NO_REBALANCE or t.availability != Availability.AVAILABLE:
            return False
        if self.coordinator.planner is None or self.coordinator.planner.recovering:
            return False
        for a in self.view:
            mt = self.nodes[a].topology
            if mt is None or mt.topology_id != t.topology_id:
                return False
        k = min(t.current.num_owners, len(self.view))
        return set(owner_set(t.current)) <= set(self.view) and all(len(o) == k for o in t.current.owners)


@dataclass
class Writer:
    """One client per key at a time: values are ``key:index``; remembers what was acknowledged when."""

    net: FakeNet
    rng: random.Random
    keys: int = 200
    issued: dict[bytes, list[bytes | None]] = field(default_factory=dict)  # per key: value of write i (1-based)
    acked: dict[bytes, int] = field(default_factory=dict)  # per key: highest acknowledged write index
    busy: dict[tuple[Address, int], tuple[str, bytes, int]] = field(default_factory=dict)
    busy_keys: set[bytes] = field(default_factory=set)
    failures: list[str] = field(default_factory=list)
    reads_checked: int = 0
    writes_acked: int = 0

    def clients(self) -> list[Address]:
        return [a for a in self.net.view if not self.net.nodes[a].leaving]

    def step(self) -> None:
        clients = self.clients()
        if not clients:
            return
        key = f"k{self.rng.randrange(self.keys)}".encode()
        if key in self.busy_keys:
            return
        a = self.rng.choice(clients)
        node = self.net.nodes[a]
        r = self.rng.random()
        if r < 0.45:
            idx = self.acked.get(key, 0)
            op = node.get(key, self.net.now)
            self.busy[(a, op)] = ("get", key, idx)
        else:
            vals = self.issued.setdefault(key, [])
            value = None if r > 0.9 else f"{key.decode()}:{len(vals) + 1}".encode()
            vals.append(value)
            op = node.put(key, value, self.net.now) if value is not None else node.delete(key, self.net.now)
            self.busy[(a, op)] = ("put", key, len(vals))
        self.busy_keys.add(key)
        self.net.collect(a)

    def harvest(self) -> None:
        for a, results in self.net.results.items():
            for res in results:
                entry = self.busy.pop((a, res.op_id), None)
                if entry is None:
                    continue
                kind, key, idx = entry
                self.busy_keys.discard(key)
                if not res.ok:
                    self.failures.append(f"{kind} {key!r} at {a} failed: {res.error}")
                    continue
                if kind == "put":
                    assert res.kind in (PUT, DELETE)
                    self.acked[key] = max(self.acked.get(key, 0), idx)
                    self.writes_acked += 1
                else:
                    assert res.kind == GET
                    self.check_read(key, res.value, idx, f"read at {a}")
            results.clear()
        # Operations of crashed members are gone with them (their client saw no answer); a write of theirs
        # may or may not have happened, so the key's later reads may see it: keep it in ``issued``.
        for a, op in [k for k in self.busy if k[0] in self.net.crashed]:
            _, key, _ = self.busy.pop((a, op))
            self.busy_keys.discard(key)

    def check_read(self, key: bytes, value: bytes | None, floor: int, where: str) -> None:
        """``value`` must be write ``floor`` (the latest acknowledged when the read began) or a later one."""
        self.reads_checked += 1
        vals = self.issued.get(key, [])
        allowed = {vals[i - 1] for i in range(max(floor, 1), len(vals) + 1)}
        if floor == 0:
            allowed.add(None)
        if value not in allowed:
            self.failures.append(f"{where}: {key!r} returned {value!r}; latest acknowledged write #{floor}")


def run_scenario(seed: int, duration: float = 20.0, config: GridConfig = CONFIG) -> tuple[FakeNet, Writer]:
    rng = random.Random(seed)
    net = FakeNet(random.Random(rng.random()), config)
    writer = Writer(net, random.Random(rng.random()))
    net.add(3)
    net.run_until(2.0)
    assert net.stable(), f"seed {seed}: the first 3 members did not settle"
    crash_ok = True
    crash_at: float | None = None  # a crash planned a few milliseconds after a join or leave: mid-rebalance
    next_action = net.now + rng.uniform(0.5, 2.0)
    end = net.now + duration
    while net.now < end:
        for _ in range(rng.randint(1, 3)):
            writer.step()
        net.run_until(net.now + 0.005)
        writer.harvest()
        net.remove_left()
        if net.stable():
            crash_ok = True
        if crash_at is not None and net.now >= crash_at:
            crash_at = None
            if crash_ok and net.crash_safe():
                crash_ok = False
                net.crash(rng.choice(net.view))
        if net.now >= next_action:
            next_action = net.now + rng.uniform(0.3, 2.5)
            live = [a for a in net.view if not net.nodes[a].leaving]
            choice = rng.random()
            if choice < 0.4 and len(net.view) < 6:
                net.add(rng.choice((1, 1, 2)))
                if rng.random() < 0.4:
                    crash_at = net.now + rng.uniform(0.0, 0.03)
            elif choice < 0.7 and len(live) > 3:
                a = rng.choice(live)
                net.nodes[a].leave(net.now)
                net.collect(a)
                if rng.random() < 0.4:
                    crash_at = net.now + rng.uniform(0.0, 0.03)
            elif crash_ok and net.crash_safe():
                # At most owners-1 crashes before rebalancing completes, mid-rebalance included (the
                # coordinator and members that are leaving are fair game too).
                crash_ok = False
                net.crash(rng.choice(net.view))
    # Liveness: no more faults; everything settles, every operation finishes.
    deadline = net.now + 120.0
    while net.now < deadline and (writer.busy or not net.stable() or any(net.nodes[a].leaving for a in net.view)):
        net.run_until(net.now + 0.05)
        writer.harvest()
        net.remove_left()
    assert not writer.busy, f"seed {seed}: operations never finished: {list(writer.busy.values())[:5]}"
    assert net.stable(), f"seed {seed}: the grid did not settle: {net.coordinator.status()}"
    return net, writer


def final_checks(seed: int, net: FakeNet, writer: Writer) -> None:
    assert not writer.failures, f"seed {seed}: {writer.failures[:5]}"
    # Every key ever written reads back as its latest acknowledged value (or a later unacknowledged one).
    reader = net.nodes[net.view[-1]]
    pending = {}
    for key in writer.issued:
        pending[reader.get(key, net.now)] = key
    net.collect(reader.address)
    net.run_until(net.now + 5.0)
    got = {r.op_id: r for r in net.results.get(reader.address, [])}
    for op_id, key in pending.items():
        res = got.get(op_id)
        assert res is not None and res.ok, f"seed {seed}: final read of {key!r}: {res}"
        writer.check_read(key, res.value, writer.acked.get(key, 0), "final read")
    assert not writer.failures, f"seed {seed}: {writer.failures[:5]}"
    # Replicas agree: every owner of a segment holds the same live entries; non-owners hold nothing.
    t = net.coordinator.topology
    assert t is not None
    for s in range(t.num_segments):
        copies = []
        for a in t.current.owners_of(s):
            store = net.nodes[a].store
            assert store is not None
            copies.append({k: v for k, (_, v) in store.segments.get(s, {}).items() if v is not None})
        assert all(c == copies[0] for c in copies), f"seed {seed}: replicas of segment {s} differ"
        for a in net.view:
            if a not in t.current.owners_of(s):
                assert not net.nodes[a].store.segments.get(s), f"seed {seed}: {a} kept segment {s}"  # type: ignore[union-attr]


class TxNet(FakeNet):
    """The fake network, able to lose chosen transaction messages (``drop(src, type)`` returns True to lose)."""

    def __init__(self, seed: int = 1, *, auto_resolve: bool = True) -> None:
        super().__init__(random.Random(seed), dataclasses.replace(CONFIG, tx_auto_resolve=auto_resolve))
        self.lost: list[tuple[Address, object]] = []
        self.drop = lambda src, msg: False
        # Also lose by destination: (src, dest, msg) -> True to lose (dest None: a multicast).
        self.drop_to = lambda src, dest, msg: False

    def collect(self, a: Address) -> None:
        node = self.nodes.get(a)
        if node is not None:
            kept = []
            for out in node.take_outbox():
                msgs = decode_payload(out.payload)
                keep = []
                for m in msgs:
                    if self.drop(a, m) or self.drop_to(a, out.dest, m):
                        self.lost.append((a, m))
                    else:
                        keep.append(m)
                if keep:
                    kept.append(Outgoing(out.dest, encode_payload(keep)))
            node._outbox = kept
        super().collect(a)

    # -- helpers
    def call(self, a: Address, fn: str, *args: object) -> object:
        node = self.nodes[a]
        # tx_begin takes the time first (the contract's signature); every other call takes it last
        result = node.tx_begin(self.now, *args) if fn == "tx_begin" else getattr(node, fn)(*args, self.now)  # type: ignore[arg-type]
        self.collect(a)
        return result

    def wait(self, a: Address, op_id: object, limit: float = 30.0) -> OpResult:
        end = self.now + limit
        while self.now < end:
            for r in self.results.get(a, []):
                if r.op_id == op_id:
                    return r
            self.run_until(self.now + 0.05)
        raise AssertionError(f"operation {op_id} on {a} never finished")

    def get(self, a: Address, key: bytes) -> OpResult:
        return self.wait(a, self.call(a, "get", key))

    def put(self, a: Address, key: bytes, value: bytes) -> OpResult:
        return self.wait(a, self.call(a, "put", key, value))

    def primary(self, key: bytes) -> Address:
        t = self.coordinator.topology
        assert t is not None
        p = t.write_primary(segment_of(key, t.num_segments))
        assert p is not None
        return p

    def owners(self, key: bytes) -> tuple[Address, ...]:
        t = self.coordinator.topology
        assert t is not None
        return t.write_owners(segment_of(key, t.num_segments))

    def stored(self, key: bytes) -> dict[Address, tuple[int, bytes | None] | None]:
        out = {}
        for a in self.owners(key):
            node = self.nodes[a]
            assert node.store is not None
            out[a] = node.store.get(segment_of(key, node.store.num_segments), key)
        return out


# -- single operations on a settled net (the max_entries / max_bytes tests) -----------------------------------
def do_op(net: FakeNet, op: str, key: bytes, value: bytes = b"v") -> OpResult:
    """A ``put`` or ``delete`` of ``key`` at the first member of the view, run until it has its result."""
    a = net.view[0]
    node: GridNode = net.nodes[a]
    op_id = node.put(key, value, net.now) if op == "put" else node.delete(key, net.now)
    net.collect(a)
    net.run_until(net.now + 1.0)
    (res,) = [r for r in net.results[a] if r.op_id == op_id]
    return res


def held(net: FakeNet, key: bytes) -> list[bytes | None]:
    """The value of ``key`` in every member's store, in view order (None: not held)."""
    out = []
    for a in net.view:
        store = net.nodes[a].store
        assert store is not None
        entry = store.get(segment_of(key, store.num_segments), key)
        out.append(None if entry is None else entry[1])
    return out
