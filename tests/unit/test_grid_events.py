"""Entry events of the grid (docs/grid.md, "Entry events"): batches of entries that arrived by state transfer on
a new owner, that departed from an old owner at the end of a rebalance, and writes applied by an owner.

Runs in-memory nodes on the fake network of gridnet.py (virtual time, real wire payloads) and checks the
events against what the nodes did: arrivals equal the entries received, departures equal what was dropped
(every entry the old owner held and no longer holds), across a join and a graceful leave. Also: nothing is
produced while no kind is on, and a listener that raises is counted, not passed on (the runtime's dispatch).
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter

import pytest
from groupcluster.core.address import Address
from groupcluster.grid.driver.grid_runtime import GridRuntime
from groupcluster.grid.node import EVENT_KINDS, EntryEvents, GridNode

from .gridnet import FakeNet


def _events(node: GridNode, kind: str) -> list[EntryEvents]:
    """The node's batches of ``kind`` so far (kept per node: take_events hands each batch out once)."""
    kept = _taken.setdefault(id(node), [])
    kept.extend(node.take_events())
    return [e for e in kept if e.kind == kind]


_taken: dict[int, list[EntryEvents]] = {}


@pytest.fixture(autouse=True)
def _fresh_taken() -> None:
    _taken.clear()  # ids of another test's (freed) nodes may come back


def _entries(batches: list[EntryEvents]) -> Counter[tuple[bytes, int, bytes | None]]:
    return Counter(x for b in batches for x in b.entries())


def _held(node: GridNode) -> dict[bytes, tuple[int, bytes | None]]:
    assert node.store is not None
    return {k: ve for data in node.store.segments.values() for k, ve in data.items()}


def _write(net: FakeNet, a: Address, n: int, prefix: str = "key") -> None:
    for i in range(n):
        net.nodes[a].put(f"{prefix}{i}".encode(), b"v%d" % i, net.now)
    net.collect(a)


def test_join_arrivals_equal_what_the_joiners_received_and_departures_what_the_old_owner_dropped() -> None:
    net = FakeNet(random.Random(11))
    (a,) = net.add(1)
    net.nodes[a].set_event_kinds(EVENT_KINDS)
    net.run_until(1.0)
    _write(net, a, 300)
    net.run_until(2.0)
    assert all(r.ok for r in net.results[a])
    before = _held(net.nodes[a])
    assert len(before) == 300
    _taken.pop(id(net.nodes[a]), None)
    net.nodes[a].take_events()  # the writes' own events (checked in another test)
    joiners = net.add(2)
    for j in joiners:
        net.nodes[j].set_event_kinds(EVENT_KINDS)  # before any transfer message reaches them
    net.run_until(6.0)
    assert net.stable()
    for j in joiners:
        node = net.nodes[j]
        arrived = _events(node, "arrived")
        got = _entries(arrived)
        # One event per entry received, with the entry as it came (the received count is the node's own).
        assert sum(got.values()) == node.metrics["grid.xfer_entries_in"] > 0
        assert node.metrics["grid.events_arrived"] == node.metrics["grid.xfer_entries_in"]
        # Every arrival is an entry the old owner had, and every entry the joiner holds arrived (no writes ran).
        assert all(before[k] == (v, val) for k, v, val in got)
        # Two joiners in one view can take two rebalances: a joiner may fetch a segment under the first and
        # drop it under the second. What it holds is what arrived less what departed again.
        gone = _entries(_events(node, "departed"))
        assert set(gone) <= set(got)
        assert {k for k, _, _ in got} - {k for k, _, _ in gone} == set(_held(node))
        t = net.coordinator.topology
        assert t is not None
        assert all({t.segment_of(k) for k in b.keys} == {b.segment} for b in arrived)
    old = net.nodes[a]
    departed = _entries(_events(old, "departed"))
    after = _held(old)
    assert sum(departed.values()) == old.metrics["grid.entries_dropped"] > 0
    # Exactly what it held and no longer holds, once each, with the version and value it had.
    assert {(k, v, val) for k, (v, val) in before.items() if k not in after} == set(departed)
    assert max(departed.values()) == 1
    # And every departed key is now held by both new owners' union, so nothing departed into the void.
    held_now = set(after) | set(_held(net.nodes[joiners[0]])) | set(_held(net.nodes[joiners[1]]))
    assert {k for k, _, _ in departed} <= held_now


def test_graceful_leave_departs_everything_the_leaver_held_and_the_others_receive_it() -> None:
    net = FakeNet(random.Random(12))
    a, b, c = net.add(3)
    net.run_until(2.0)
    _write(net, b, 200)
    net.run_until(3.0)
    for m in (a, b, c):
        net.nodes[m].set_event_kinds(("arrived", "departed"))
    held_c = _held(net.nodes[c])
    assert held_c
    net.nodes[c].leave(net.now)
    net.collect(c)
    net.run_until(6.0)
    assert net.nodes[c].ready_to_leave
    leaver = net.nodes[c]
    departed = _entries(_events(leaver, "departed"))
    assert set(departed) == {(k, v, val) for k, (v, val) in held_c.items()} and max(departed.values()) == 1
    assert not _held(leaver)
    arrived_total = 0
    for m in (a, b):
        arrived = _entries(_events(net.nodes[m], "arrived"))
        assert sum(arrived.values()) == net.nodes[m].metrics["grid.xfer_entries_in"]
        assert all(held_c.get(k, (v, val)) == (v, val) for k, v, val in arrived)
        arrived_total += sum(arrived.values())
    assert arrived_total > 0
    net.remove_left()
    net.run_until(9.0)
    assert net.stable()


def test_written_events_on_every_owner_and_nothing_when_off() -> None:
    net = FakeNet(random.Random(13))
    a, b, c = net.add(3)
    net.run_until(2.0)
    net.nodes[a].set_event_kinds(("written",))
    net.nodes[b].set_event_kinds(("written",))
    _write(net, a, 100)
    net.nodes[a].delete(b"key7", net.now)
    net.collect(a)
    net.run_until(3.0)
    assert all(r.ok for r in net.results[a])
    t = net.coordinator.topology
    assert t is not None
    for m in (a, b):
        node = net.nodes[m]
        written = _events(node, "written")
        assert all(e.segment == -1 for e in written)
        keys = [k for e in written for k in e.keys]
        mine = {f"key{i}".encode() for i in range(100) if m in t.current.owners_of(t.segment_of(f"key{i}".encode()))}
        # One event per applied write on every owner (primary or backup); the delete too, with value None.
        assert Counter(keys) == Counter(list(mine) + ([b"key7"] if b"key7" in mine else []))
        if b"key7" in mine:
            assert [val for e in written for k, _, val in e.entries() if k == b"key7"][-1] is None
    off = net.nodes[c]
    assert _events(off, "written") == [] and off.take_events() == []
    assert not any(k.startswith("grid.events_") for k in off.metrics)


def test_unknown_kind_is_refused_with_its_name() -> None:
    node = GridNode(Address("10.0.0.1", 7800, 1))
    with pytest.raises(ValueError, match="moved"):
        node.set_event_kinds(("arrived", "moved"))


def test_runtime_listener_failure_is_counted_and_others_still_called() -> None:
    async def run() -> None:
        rt = GridRuntime()
        seen: list[list[EntryEvents]] = []

        def bad(batches: list[EntryEvents]) -> None:
            raise RuntimeError("listener bug")

        rt.add_listener(bad)
        h = rt.add_listener(seen.append, kinds=("departed",))
        batch = [
            EntryEvents("arrived", 3, 5, [b"k"], [1], [b"v"]),
            EntryEvents("departed", 4, 5, [b"j", b"l"], [2, 3], [b"w", None]),
        ]
        rt._dispatch_events(batch)
        assert rt.counters["listener_errors"] == 1
        assert seen == [[batch[1]]]  # only its kind, one call for the step's batches
        assert rt.remove_listener(h) and not rt.remove_listener(h)
        with pytest.raises(ValueError, match="moved"):
            rt.add_listener(seen.append, kinds=("moved",))
        rt.close()

    asyncio.run(run())


def test_committed_transaction_writes_are_written_events_on_their_owners() -> None:
    net = FakeNet(random.Random(17))
    a, b, c = net.add(3)
    net.run_until(2.0)
    for m in (a, b, c):
        net.nodes[m].set_event_kinds(("written",))
    writes = {f"t{i}".encode(): f"v{i}".encode() for i in range(6)}
    tx = net.nodes[c].tx_begin(net.now)
    op = net.nodes[c].tx_commit(tx, writes, {}, net.now)
    net.collect(c)
    net.run_until(net.now + 3.0)
    assert [r.ok for r in net.results[c] if r.op_id == op] == [True]
    t = net.coordinator.topology
    assert t is not None
    for m in (a, b, c):
        mine = {k for k in writes if m in t.current.owners_of(t.segment_of(k))}
        seen = {k: v for e in _events(net.nodes[m], "written") for k, _, v in e.entries()}
        assert seen == {k: writes[k] for k in mine}, m
