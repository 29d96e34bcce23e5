"""Deterministic multi-node tests of the grid node (grid/node/) over a small in-test fake network.

The fake network is a stand-in for the group (this is a unit test of pure logic): per-link FIFO delivery
with random delays, multicasts to the view, views installed at every live member at once, crashes that
drop a member and (randomly) part of what it had in flight, graceful leaves completed when the member
reports ``ready_to_leave``. A writer keeps writing while members join, leave and crash; the checks are:

* no operation fails (a topology change only costs internal retries);
* every read returns the latest value acknowledged before it started, or a newer one (one writer per key);
* after the run, every acknowledged write is readable, and all owners of a segment hold the same data.

Every scenario is driven by one seed; a failure prints it, and ``GRID_SEED=<n>`` replays just that seed.
"""

from __future__ import annotations

import dataclasses
import os
import random
from collections.abc import Callable

import pytest
from groupcluster.core.address import Address
from groupcluster.grid.columns import BackupAckBatch, BackupBatch, CommandBatch, ResponseBatch, unbatched
from groupcluster.grid.consistent_hash import ConsistentHash
from groupcluster.grid.messages import DELETE, GET, OK, PUT, RETRY, Backup, BackupAck, Command, Response, Topology
from groupcluster.grid.node import GridConfig, GridNode, NodeHooks
from groupcluster.grid.payload import decode_payload, encode_payload
from groupcluster.grid.store import SegmentStore
from groupcluster.grid.topology import Availability, CacheTopology, PartitionHandling, Phase, owner_set

from .gridnet import CONFIG, FakeNet, final_checks, member, run_scenario

SEEDS = [int(os.environ["GRID_SEED"])] if "GRID_SEED" in os.environ else list(range(20))
SLOW_SEEDS = list(range(20, 220))


@pytest.mark.parametrize("seed", SEEDS)
def test_no_acknowledged_write_lost_under_joins_leaves_and_crashes(seed: int) -> None:
    net, writer = run_scenario(seed)
    final_checks(seed, net, writer)
    assert writer.writes_acked > 50 and writer.reads_checked > 50


@pytest.mark.slow
@pytest.mark.parametrize("seed", SLOW_SEEDS)
def test_more_seeds(seed: int) -> None:
    net, writer = run_scenario(seed)
    final_checks(seed, net, writer)


def test_same_seed_replays_the_same_run() -> None:
    a_net, a_writer = run_scenario(7, duration=8.0)
    b_net, b_writer = run_scenario(7, duration=8.0)
    assert a_writer.acked == b_writer.acked and a_writer.issued == b_writer.issued
    assert a_net.coordinator.topology == b_net.coordinator.topology


def test_single_member_then_join_moves_data() -> None:
    net = FakeNet(random.Random(1))
    (a,) = net.add(1)
    net.run_until(1.0)
    for i in range(200):
        net.nodes[a].put(f"key{i}".encode(), b"v%d" % i, net.now)
    net.collect(a)
    net.run_until(2.0)
    assert all(r.ok for r in net.results[a]) and len(net.results[a]) == 200
    net.add(2)
    net.run_until(5.0)
    assert net.stable()
    t = net.coordinator.topology
    assert t is not None and len(owner_set(t.current)) == 3
    counts = t.current.owned_counts()
    assert all(abs(p - 32 / 3) <= 1 and abs(o - 64 / 3) <= 1 for p, o in counts.values())
    total = sum(len(net.nodes[m].store) for m in net.view)  # type: ignore[arg-type]
    assert total == 400  # two copies of each key
    assert net.nodes[a].metrics["grid.xfer_entries_out"] > 0


def test_graceful_leave_reports_ready_only_after_handoff() -> None:
    net = FakeNet(random.Random(2))
    a, b, c = net.add(3)
    net.run_until(2.0)
    for i in range(100):
        net.nodes[b].put(f"key{i}".encode(), b"x", net.now)
    net.collect(b)
    net.run_until(3.0)
    net.nodes[a].leave(net.now)  # the coordinator itself leaves
    net.collect(a)
    assert not net.nodes[a].ready_to_leave
    net.run_until(6.0)
    assert net.nodes[a].ready_to_leave
    t = net.nodes[b].topology
    assert t is not None and a not in owner_set(t.current) and t.phase == Phase.NO_REBALANCE
    net.remove_left()
    net.run_until(10.0)
    assert net.stable() and net.view == [b, c]
    t = net.coordinator.topology
    assert t is not None
    for key in (f"key{i}".encode() for i in range(100)):
        seg = t.segment_of(key)
        assert net.nodes[b].store.value(seg, key) == b"x"  # type: ignore[union-attr]
        assert net.nodes[c].store.value(seg, key) == b"x"  # type: ignore[union-attr]


def test_deny_mode_refuses_segments_missing_an_owner() -> None:
    net = FakeNet(random.Random(3))
    a, b = net.add(2)
    net.run_until(2.0)
    assert net.stable()
    net.crash(b)  # half of the stable members lost: degraded
    net.run_until(4.0)
    t = net.nodes[a].topology
    assert t is not None and t.availability == Availability.DEGRADED
    op = net.nodes[a].put(b"k", b"v", net.now)
    rop = net.nodes[a].get(b"k", net.now)
    net.collect(a)
    res = {r.op_id: r for r in net.results[a]}
    assert not res[op].ok and "unavailable" in res[op].error
    assert not res[rop].ok and "unavailable" in res[rop].error


def test_allow_reads_mode_reads_but_refuses_writes() -> None:
    cfg = GridConfig.from_dict({"num_segments": 8, "partition_handling": "allow_reads", "recovery_timeout": "1s"})
    net = FakeNet(random.Random(4), cfg)
    a, b = net.add(2)
    net.run_until(2.0)
    net.nodes[a].put(b"k", b"v", net.now)
    net.collect(a)
    net.run_until(3.0)
    net.crash(b)
    net.run_until(5.0)
    net.results[a].clear()
    w = net.nodes[a].put(b"k", b"w", net.now)
    r = net.nodes[a].get(b"k", net.now)
    net.collect(a)
    net.run_until(6.0)
    res = {x.op_id: x for x in net.results[a]}
    assert not res[w].ok
    assert res[r].ok and res[r].value == b"v"


def test_allow_read_writes_mode_keeps_serving() -> None:
    cfg = GridConfig.from_dict({"num_segments": 8, "partition_handling": "allow_read_writes", "recovery_timeout": "1s"})
    net = FakeNet(random.Random(5), cfg)
    a, b = net.add(2)
    net.run_until(2.0)
    net.crash(b)
    net.run_until(5.0)
    w = net.nodes[a].put(b"k", b"w", net.now)
    net.collect(a)
    net.run_until(6.0)
    assert {x.op_id: x for x in net.results[a]}[w].ok


def test_bad_payload_is_dropped_and_counted() -> None:
    net = FakeNet(random.Random(6))
    (a,) = net.add(1)
    net.nodes[a].on_messages([(member(99), b"\xc1garbage")], 0.0)
    assert net.nodes[a].metrics["grid.bad_payloads"] == 1


def test_merge_of_two_grids_keeps_the_newest_version_of_every_key() -> None:
    # Found by grid simulation seeds 4, 5 and 10: two members that started apart each built a grid and took
    # writes; after the merge one side's acknowledged writes were gone. Now each member pushes its entries to
    # the merged group's owners and every store keeps the newest version (a tie goes to the greater value).
    net = FakeNet(random.Random(3))
    a, b = member(1), member(2)
    net.next_id = 3
    for x in (a, b):
        net.nodes[x] = GridNode(x, CONFIG)
        net.view = [x]
        net.nodes[x].on_view((x,), net.now)
        net.collect(x)
    net.run_until(1.5)
    ops = [
        (a, net.nodes[a].put(b"both", b"from-a", net.now)),
        (b, net.nodes[b].put(b"both", b"from-b", net.now)),  # same version as a's: the tie goes to b"from-b"
        (b, net.nodes[b].put(b"only-b", b"b", net.now)),
        (a, net.nodes[a].put(b"only-a", b"a", net.now)),
    ]
    for x in (a, b):
        net.view = [x]
        net.collect(x)
    net.run_until(2.0)
    assert all(r.ok for x in (a, b) for r in net.results[x])
    net.view = [a, b]
    for x in (a, b):
        net.nodes[x].on_view((a, b), net.now, merge=True)
        assert net.nodes[x].merging
    for x in (a, b):
        net.collect(x)
    net.run_until(net.now + 10.0)
    assert net.stable()
    assert not any(net.nodes[x].merging for x in (a, b))
    expected = {b"both": b"from-b", b"only-a": b"a", b"only-b": b"b"}
    for x in (a, b):
        store = net.nodes[x].store
        assert store is not None
        got = {k: v for _s, k, _ver, v in store.items()}
        assert got == expected, (x, got)
    assert len(ops) == 4 and net.nodes[a].metrics["grid.merge_entries_pushed"] >= 2


def test_member_alone_is_ready_to_leave_at_once() -> None:
    # Nobody could take its segments: before, ready_to_leave never turned True and the member waited out
    # the whole leave timeout.
    net = FakeNet(random.Random(7))
    (a,) = net.add(1)
    net.run_until(1.0)
    net.nodes[a].put(b"k", b"v", net.now)
    net.collect(a)
    net.run_until(2.0)
    assert not net.nodes[a].ready_to_leave
    net.nodes[a].leave(net.now)
    assert net.nodes[a].ready_to_leave
    assert net.nodes[a].metrics["grid.left_without_taker"] == 1


def test_member_whose_peers_have_no_capacity_waits_until_one_has_and_hands_off() -> None:
    # A client-only peer (capacity 0 from its start) can be given capacity while it runs (POST /v1/capacity),
    # so it is no proof that nobody could take our segments: the last member with capacity keeps its data until
    # one can, then hands it off.
    net = FakeNet(random.Random(8))
    (a,) = net.add(1)
    client_cfg = GridConfig.from_dict({**_config_dict(CONFIG), "capacity": 0.0})
    b = member(net.next_id)
    net.next_id += 1
    net.nodes[b] = GridNode(b, client_cfg)
    net.install_view([a, b])
    net.run_until(2.0)
    net.nodes[a].put(b"k", b"v", net.now)
    net.collect(a)
    net.run_until(3.0)
    assert all(r.ok for r in net.results[a])
    t = net.nodes[b].topology
    assert t is not None and b in t.members and b not in owner_set(t.current)
    net.nodes[a].leave(net.now)
    net.collect(a)
    net.run_until(5.0)
    assert not net.nodes[a].ready_to_leave
    net.nodes[b].set_capacity(1.0, net.now)
    net.collect(b)
    _step_until(net, lambda: net.nodes[a].ready_to_leave, limit=5.0)
    assert net.nodes[a].metrics["grid.left_without_taker"] == 0
    store = net.nodes[b].store
    assert store is not None and [(k, v) for _s, k, _ver, v in store.items()] == [(b"k", b"v")]


def test_member_beside_a_peer_emptied_at_runtime_does_not_leave_with_the_only_copy() -> None:
    # Simulation seed 857807000094 (grid-tx, capacity changes): b set its capacity to 0, the rebalance moved
    # every segment to a, then a was asked to leave. a read b's capacity 0 in the CH as "nobody could take my
    # segments" and left at once with the only copy of every acknowledged write. b's capacity may change again
    # (and a merge may bring members with capacity): a keeps the data until someone can take it.
    net = FakeNet(random.Random(16))
    a, b = net.add(2)
    net.run_until(2.0)
    keys = [f"key{i}".encode() for i in range(50)]
    for k in keys:
        net.nodes[a].put(k, b"x", net.now)
    net.collect(a)
    net.run_until(3.0)
    assert all(r.ok for r in net.results[a])
    net.nodes[b].set_capacity(0.0, net.now)
    net.collect(b)
    net.run_until(6.0)
    t = net.nodes[a].topology
    assert t is not None and t.phase == Phase.NO_REBALANCE and owner_set(t.current) == (a,)
    net.nodes[a].leave(net.now)
    net.collect(a)
    net.run_until(8.0)
    assert not net.nodes[a].ready_to_leave
    assert net.nodes[a].metrics["grid.left_without_taker"] == 0
    net.nodes[b].set_capacity(1.0, net.now)
    net.collect(b)
    _step_until(net, lambda: net.nodes[a].ready_to_leave, limit=5.0)
    assert net.nodes[a].metrics["grid.left_without_taker"] == 0
    store = net.nodes[b].store
    assert store is not None and {k for _s, k, _ver, _v in store.items()} == set(keys)


def test_leaving_member_with_a_peer_that_has_capacity_waits_for_handoff() -> None:
    net = FakeNet(random.Random(9))
    a, _b = net.add(2)
    net.run_until(2.0)
    net.nodes[a].leave(net.now)
    net.collect(a)
    assert not net.nodes[a].ready_to_leave  # b can take the segments: hand off first
    net.run_until(5.0)
    assert net.nodes[a].ready_to_leave
    assert net.nodes[a].metrics["grid.left_without_taker"] == 0


def _step_until(net: FakeNet, cond: Callable[[], bool], limit: float = 2.0) -> None:
    """Deliver events a tenth of a millisecond at a time until ``cond()`` holds (at most ``limit`` seconds)."""
    end = net.now + limit
    while not cond():
        assert net.now < end, "the condition never held"
        net.run_until(net.now + 0.0001)


def _two_members_with_keys(seed: int, writer: int) -> tuple[FakeNet, tuple[Address, Address], list[bytes]]:
    """Two members, and 100 keys written through the ``writer``-th of them (all acknowledged)."""
    net = FakeNet(random.Random(seed))
    a, b = net.add(2)
    net.run_until(2.0)
    src = (a, b)[writer]
    keys = [f"key{i}".encode() for i in range(100)]
    for k in keys:
        net.nodes[src].put(k, b"x", net.now)
    net.collect(src)
    net.run_until(3.0)
    assert all(r.ok for r in net.results[src])
    return net, (a, b), keys


def _hand_off_to_joiners(net: FakeNet, leavers: tuple[Address, ...], keys: list[bytes]) -> None:
    """Two members join; run until every leaver left (each only once ready, none without a taker), then check
    that the joiners, the only members left, hold every key."""
    joiners = net.add(2)
    for _ in range(200):
        for x in leavers:
            node = net.nodes.get(x)
            if node is not None and node.ready_to_leave:
                assert node.metrics["grid.left_without_taker"] == 0, f"{x} left with the only copy"
        net.remove_left()
        if net.view == joiners and net.stable():
            break
        net.run_until(net.now + 0.05)
    assert net.view == joiners and net.stable()
    t = net.coordinator.topology
    assert t is not None
    for j in joiners:
        store = net.nodes[j].store
        assert store is not None
        assert all(store.value(t.segment_of(k), k) == b"x" for k in keys), j


def test_holder_that_leaves_waits_for_members_that_joined_during_its_last_rebalance() -> None:
    # Seed 2801: a's co-owner b left, so the rebalance gave a every segment; a asked to leave and two members
    # joined during that rebalance. Its last topology lists them as cache members, but its CH is the one
    # planned when the rebalance started: it lists a alone. a read "nobody could take my segments" from it and
    # left with the only copy, a step before the next topology handed everything to the joiners. Now a member
    # the CH does not list counts as a possible taker, and a hands off first.
    net, (a, b), keys = _two_members_with_keys(12, writer=0)
    net.nodes[b].leave(net.now)
    net.collect(b)
    _step_until(net, lambda: net.nodes[a].topology.phase != Phase.NO_REBALANCE)  # type: ignore[union-attr]
    net.nodes[a].leave(net.now)
    net.collect(a)
    _hand_off_to_joiners(net, (a, b), keys)


def test_holder_that_leaves_after_its_peer_waits_while_the_peer_could_take_its_segments() -> None:
    # Seed 3413: coordinator a left first and its segments went to b. b asked to leave before the topology
    # ending that rebalance reached it (that CH lists b alone: a was leaving, b staying), so on installing it b
    # found that nobody could take its segments and left with the only copy. The coordinator, told that both
    # were leaving, had just made a an owner again, and two members joined 4 ms later. Now b waits while a,
    # a member with capacity, is in its view; the joiners then take the data from both.
    net, (a, b), keys = _two_members_with_keys(13, writer=1)
    net.nodes[a].leave(net.now)
    net.collect(a)
    _step_until(net, lambda: net.nodes[b].topology.phase == Phase.READ_NEW_WRITE_ALL)  # type: ignore[union-attr]
    last = net.nodes[b].topology
    assert last is not None and owner_set(last.pending) == (b,)  # type: ignore[arg-type]
    net.nodes[b].leave(net.now)
    net.collect(b)
    # Next comes the balanced topology that lists b alone, then the coordinator's answer to b's leave.
    _step_until(net, lambda: net.nodes[b].topology.topology_id > last.topology_id)  # type: ignore[union-attr]
    assert not net.nodes[b].ready_to_leave
    _hand_off_to_joiners(net, (a, b), keys)


def _config_dict(cfg: GridConfig) -> dict[str, object]:
    import dataclasses

    return {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}


def _topology(
    tid: int,
    owners: list[tuple[Address, ...]],
    members: tuple[Address, ...],
    *,
    degraded: bool = False,
    stable: tuple[Address, ...] | None = None,
) -> CacheTopology:
    k = max(len(o) for o in owners)
    ch = ConsistentHash.from_owner_map(
        len(owners), k, owners, {m: 1.0 for m in {*members, *(o for own in owners for o in own)}}
    )
    avail = Availability.DEGRADED if degraded else Availability.AVAILABLE
    stable = members if stable is None else stable
    return CacheTopology(tid, 0, Phase.NO_REBALANCE, ch, None, members, avail, stable, PartitionHandling.ALLOW_READS)


def test_degraded_topology_does_not_drop_copies() -> None:
    # Found by grid simulation seed 15: members cut off into partitions of their own installed degraded
    # topologies that did not name them owners and dropped their (complete) copies; the merged group then
    # adopted another partition's topology naming them owners, and acknowledged writes were gone. A degraded
    # topology is provisional: copies go only once an available topology says they are not ours.
    coord, x = member(1), member(2)
    node = GridNode(x, GridConfig.from_dict({"num_segments": 2, "num_owners": 1}))
    node.on_view((coord, x), 0.0)

    def install(t: CacheTopology, now: float) -> None:
        node.on_messages([(coord, encode_payload([Topology(t)]))], now)

    install(_topology(5, [(x,), (coord,)], (coord, x)), 0.1)
    assert node.store is not None
    node.store.write(0, b"k", 1, b"v")
    install(_topology(6, [(coord,), (coord,)], (coord, x), degraded=True), 0.2)
    assert node.store.has_segment(0) and node.store.value(0, b"k") == b"v"
    install(_topology(7, [(coord,), (coord,)], (coord, x)), 0.3)
    assert not node.store.has_segment(0)  # available, and not ours: dropped now


def test_reads_wait_for_the_merged_topology_after_a_merge_view() -> None:
    # Found by grid simulation seeds 20 and 70: a member that had formed its own grid served a read from
    # it after the merge view, before the merged group's topology reached it, and missed a write the other
    # grid had acknowledged seconds earlier. Reads now wait for the merged group's first topology.
    coord, x = member(1), member(2)
    node = GridNode(x, GridConfig.from_dict({"num_segments": 2, "num_owners": 1, "attempt_timeout": "1s"}))
    node.on_view((x,), 0.0)
    assert node.topology is not None and node.topology.topology_id == 1
    first = node.get(b"k", 0.1)
    assert [r.op_id for r in node.take_results()] == [first]  # served locally at once, before the merge
    node.on_view((coord, x), 0.2, merge=True)
    op = node.get(b"k", 0.3)
    node.tick(0.35)
    assert node.take_results() == [] and node.metrics["grid.ops_held_merging"] >= 1
    # The merged group's topology (the other grid's, whose member coord owns everything) arrives: the read
    # goes to coord now instead of being answered from x's own grid.
    node.take_outbox()
    t = _topology(9, [(coord,), (coord,)], (coord, x))
    node.on_messages([(coord, encode_payload([Topology(t)]))], 0.4)
    assert node.take_results() == []
    sent = [m for o in node.take_outbox() if o.dest == coord for m in unbatched(decode_payload(o.payload))]
    cmds = [m for m in sent if isinstance(m, Command) and m.op_id == op]
    assert len(cmds) == 1 and cmds[0].topology_id == 9
    reply = Response(op, cmds[0].attempt, OK, 9, b"from-the-other-grid", "")
    node.on_messages([(coord, encode_payload([reply]))], 0.45)
    res = node.take_results()
    assert [(r.op_id, r.ok, r.value) for r in res] == [(op, True, b"from-the-other-grid")]


def test_write_cut_off_by_a_degraded_topology_is_redriven_once_available() -> None:
    # Found by grid simulation seed 24: the primary applied a write whose backup never arrived, then a
    # degraded topology (the backup's side gone) made the segment unwritable; the write was dropped with an
    # error to the client, so primary and backup held different values for good once the operator forced
    # the grid available. Now the client still hears the error, but the write is kept and re-driven.
    x, y, z = member(1), member(2), member(3)
    node = GridNode(x, GridConfig.from_dict({"num_segments": 1, "num_owners": 2}))
    node.on_view((x, y), 0.0)
    node.on_messages([(x, encode_payload([Topology(_topology(5, [(x, y)], (x, y)))]))], 0.1)
    node.take_outbox()
    op = node.put(b"k", b"v", 0.2)
    backups = [m for o in node.take_outbox() if o.dest == y for m in unbatched(decode_payload(o.payload))]
    assert len(backups) == 1 and isinstance(backups[0], Backup)
    version = backups[0].version
    node.on_view((x, z), 1.0)  # y is gone before acknowledging
    node.on_messages([(x, encode_payload([Topology(_topology(6, [(x, y)], (x, z), degraded=True))]))], 1.1)
    res = node.take_results()
    assert [(r.op_id, r.ok) for r in res] == [(op, False)] and "unavailable" in res[0].error
    assert node.metrics["grid.writes_kept_degraded"] == 1
    node.take_outbox()
    # The operator forces the grid available: z takes y's place and receives the write, same version.
    node.on_messages([(x, encode_payload([Topology(_topology(7, [(x, z)], (x, z)))]))], 2.0)
    sent = [m for o in node.take_outbox() if o.dest == z for m in unbatched(decode_payload(o.payload))]
    redriven = [m for m in sent if isinstance(m, Backup)]
    assert [(b.key, b.version, b.value) for b in redriven] == [(b"k", version, b"v")]


def _phase_topology(
    tid: int, phase: Phase, cur: tuple[Address, ...], new: tuple[Address, ...] | None, rebalance_id: int = 1
) -> CacheTopology:
    """A one-segment topology: ``cur`` owns it, ``new`` will (None: no rebalance)."""
    members = tuple(dict.fromkeys((*cur, *(new or ()))))
    caps = {m: 1.0 for m in members}
    cur_ch = ConsistentHash.from_owner_map(1, 2, [cur], caps)
    new_ch = ConsistentHash.from_owner_map(1, 2, [new], caps) if new is not None else None
    return CacheTopology(
        tid, rebalance_id, phase, cur_ch, new_ch, members, Availability.AVAILABLE, cur, PartitionHandling.ALLOW_READS
    )


def _sent(node: GridNode, dest: Address) -> list[object]:
    return [m for o in node.take_outbox() if o.dest == dest for m in unbatched(decode_payload(o.payload))]


def test_a_write_keeps_its_round_across_phase_changes_that_add_no_owner() -> None:
    # The phase changes that end a rebalance keep every segment's write owners (write all) or drop the
    # old ones, yet each re-drove every write in flight (a second round trip, behind members busy installing):
    # the slowest writes of a rebalance. Now the round goes on; a topology that adds an owner still re-drives.
    x, y, z, w = member(1), member(2), member(3), member(4)
    node = GridNode(x, GridConfig.from_dict({"num_segments": 1, "num_owners": 2}))
    node.on_view((x, y, z, w), 0.0)

    def install(t: CacheTopology, now: float) -> None:
        node.on_messages([(x, encode_payload([Topology(t)]))], now)

    def put(key: bytes, now: float) -> tuple[int, int, dict[Address, int]]:
        op = node.put(key, b"v", now)
        sent = [(o.dest, m) for o in node.take_outbox() for m in unbatched(decode_payload(o.payload))]
        backups = {d: m for d, m in sent if isinstance(m, Backup)}
        return op, next(iter(backups.values())).write_id, {d: b.topology_id for d, b in backups.items()}

    def ack(src: Address, wid: int, code: int, tid: int, now: float) -> None:
        node.on_messages([(src, encode_payload([BackupAck(wid, code, tid)]))], now)

    install(_phase_topology(5, Phase.READ_OLD_WRITE_ALL, (x, y), (x, z)), 0.1)
    node.take_outbox()
    op, wid, rounds = put(b"k", 0.2)
    assert rounds == {y: 5, z: 5}
    install(_phase_topology(6, Phase.READ_ALL_WRITE_ALL, (x, y), (x, z)), 0.3)
    install(_phase_topology(7, Phase.READ_NEW_WRITE_ALL, (x, y), (x, z)), 0.35)
    assert not [m for m in _sent(node, y) + _sent(node, z) if isinstance(m, Backup)]  # nothing re-sent
    assert node.metrics["grid.writes_kept_across_topologies"] == 2 and node.metrics["grid.writes_redriven"] == 0
    for b in (y, z):  # the backups answer the round of topology 5, under topology 7
        ack(b, wid, OK, 5, 0.4)
    assert [(r.op_id, r.ok) for r in node.take_results()] == [(op, True)]
    # The balanced topology drops y: a write in flight waits for z alone, and y's refusal changes nothing.
    op, wid, rounds = put(b"k2", 0.5)
    assert rounds == {y: 7, z: 7}
    install(_phase_topology(8, Phase.NO_REBALANCE, (x, z), None), 0.6)
    ack(y, wid, RETRY, 8, 0.65)
    assert not [m for m in _sent(node, z) if isinstance(m, Backup)] and node.take_results() == []
    ack(z, wid, OK, 7, 0.7)
    assert [(r.op_id, r.ok) for r in node.take_results()] == [(op, True)]
    assert node.metrics["grid.writes_kept_across_topologies"] == 3 and node.metrics["grid.writes_redriven"] == 0
    # A new rebalance adds w: a write in flight goes to the write owners of the new topology again.
    op, wid, rounds = put(b"k3", 0.8)
    assert rounds == {z: 8}
    install(_phase_topology(9, Phase.READ_OLD_WRITE_ALL, (x, z), (x, w)), 0.9)
    sent = {
        o.dest: m for o in node.take_outbox() for m in unbatched(decode_payload(o.payload)) if isinstance(m, Backup)
    }
    assert {d: b.topology_id for d, b in sent.items()} == {z: 9, w: 9}
    assert node.metrics["grid.writes_redriven"] == 1 and node.take_results() == []


def test_a_write_is_redriven_when_an_owner_that_acknowledged_it_starts_fetching_the_segment() -> None:
    # Found by grid simulation seed 439946000233 (capacity changes): y acknowledged a write as an old owner,
    # the balanced topology dropped y, and a new rebalance made y an owner again. y cleared its copy to fetch
    # it from a source the write had not reached yet; the primary kept the round (no write owner was new) and
    # the acknowledged write was lost on y. An owner that starts fetching makes the write go out again.
    x, y, z = member(1), member(2), member(3)
    node = GridNode(x, GridConfig.from_dict({"num_segments": 1, "num_owners": 2}))
    node.on_view((x, y, z), 0.0)

    def install(t: CacheTopology, now: float) -> None:
        node.on_messages([(x, encode_payload([Topology(t)]))], now)

    install(_phase_topology(5, Phase.READ_NEW_WRITE_ALL, (x, y), (x, z)), 0.1)
    node.take_outbox()
    node.put(b"k", b"v", 0.2)
    rounds = {o.dest: m.topology_id for o in node.take_outbox() for m in unbatched(decode_payload(o.payload))}
    assert rounds == {y: 5, z: 5}
    install(_phase_topology(6, Phase.NO_REBALANCE, (x, z), None), 0.3)  # drops y: the round goes on for z
    assert node.metrics["grid.writes_redriven"] == 0
    install(_phase_topology(7, Phase.READ_OLD_WRITE_ALL, (x, z), (x, y), rebalance_id=2), 0.4)  # y fetches
    sent = {
        o.dest: m for o in node.take_outbox() for m in unbatched(decode_payload(o.payload)) if isinstance(m, Backup)
    }
    assert {d: b.topology_id for d, b in sent.items()} == {y: 7, z: 7}
    assert node.metrics["grid.writes_redriven"] == 1


class RecordingHooks(NodeHooks):
    """Node hooks that record every call, to check where the node calls them."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []
        self.stores: list[SegmentStore] = []

    def new_store(self, num_segments: int) -> SegmentStore:
        self.calls.append(("new_store", num_segments))
        self.stores.append(super().new_store(num_segments))
        return self.stores[-1]

    def installing(self, t: CacheTopology, store: SegmentStore) -> None:
        assert store is self.stores[-1]  # the store this hook made, in place before the install changes it
        self.calls.append(("installing", t.topology_id))

    def redriving(self, version: int) -> None:
        self.calls.append(("redriving", version))


def test_the_node_calls_its_hooks_for_its_store_each_newer_topology_and_each_redrive() -> None:
    # The change feed (grid/feed.py) relies on these three points: its store is the node's, it learns each
    # topology before the install clears segments for fetches, and it hears of every re-driven write.
    x, y, z = member(1), member(2), member(3)
    hooks = RecordingHooks()
    node = GridNode(x, GridConfig.from_dict({"num_segments": 1, "num_owners": 2}), hooks=hooks)
    node.on_view((x, y, z), 0.0)

    def install(t: CacheTopology, now: float) -> None:
        node.on_messages([(x, encode_payload([Topology(t)]))], now)

    install(_phase_topology(5, Phase.READ_NEW_WRITE_ALL, (x, y), (x, z)), 0.1)
    node.take_outbox()
    node.put(b"k", b"v", 0.2)
    sent = [m for o in node.take_outbox() for m in unbatched(decode_payload(o.payload)) if isinstance(m, Backup)]
    version = sent[0].version
    install(_phase_topology(6, Phase.NO_REBALANCE, (x, z), None), 0.3)
    install(_phase_topology(4, Phase.NO_REBALANCE, (x, z), None), 0.35)  # stale: not installed, no call
    install(_phase_topology(7, Phase.READ_OLD_WRITE_ALL, (x, z), (x, y), rebalance_id=2), 0.4)  # y fetches
    assert hooks.calls == [
        ("new_store", 1),
        ("installing", 5),
        ("installing", 6),
        ("installing", 7),
        ("redriving", version),
    ]
    assert node.metrics["grid.writes_redriven"] == 1 and node.store is hooks.stores[0]


def test_a_backup_applies_an_earlier_round_only_while_its_owners_and_view_are_unchanged() -> None:
    x, y, z = member(1), member(2), member(3)
    node = GridNode(y, GridConfig.from_dict({"num_segments": 1, "num_owners": 2}))
    node.on_view((x, y, z), 0.0)

    def install(t: CacheTopology, now: float) -> None:
        node.on_messages([(x, encode_payload([Topology(t)]))], now)

    def backup(tid: int, key: bytes, version: int, now: float) -> list[tuple[int, int]]:
        node.on_messages([(x, encode_payload([Backup(1, tid, version, key, b"v")]))], now)
        return [(a.code, a.topology_id) for a in _sent(node, x) if isinstance(a, BackupAck)]  # type: ignore[attr-defined]

    install(_phase_topology(5, Phase.READ_OLD_WRITE_ALL, (x, y), (x, z)), 0.1)
    install(_phase_topology(6, Phase.READ_ALL_WRITE_ALL, (x, y), (x, z)), 0.2)
    node.take_outbox()
    version = (5 << 40) | 1
    assert backup(5, b"a", version, 0.3) == [(OK, 5)]  # same owners in 5 and 6: applied, answered as of 5
    assert node.store.value(0, b"a") == b"v" and node.metrics["grid.backups_kept_across_topologies"] == 1  # type: ignore[union-attr]
    assert backup(4, b"b", version, 0.31) == [(RETRY, 6)]  # a topology this member never installed
    node.on_view((x, y, z), 0.4)  # a view change: nothing spans it
    install(_phase_topology(7, Phase.READ_NEW_WRITE_ALL, (x, y), (x, z)), 0.5)
    node.take_outbox()
    assert backup(6, b"c", version, 0.6) == [(RETRY, 7)]
    assert node.store.value(0, b"c") is None  # type: ignore[union-attr]
    # Owners that differ (a joiner's first topology adds z; the balanced one drops y) refuse as before.
    install(_phase_topology(8, Phase.NO_REBALANCE, (x, y), None), 0.7)
    install(_phase_topology(9, Phase.READ_OLD_WRITE_ALL, (x, y), (y, z)), 0.8)
    node.take_outbox()
    assert backup(8, b"d", version, 0.9) == [(RETRY, 9)]


def test_a_backup_that_stays_an_owner_applies_a_round_of_the_phase_before_the_balanced_topology() -> None:
    x, y, z = member(1), member(2), member(3)
    node = GridNode(z, GridConfig.from_dict({"num_segments": 1, "num_owners": 2}))
    node.on_view((x, y, z), 0.0)
    for tid, t in (
        (5, _phase_topology(5, Phase.READ_OLD_WRITE_ALL, (x, y), (x, z))),
        (6, _phase_topology(6, Phase.READ_NEW_WRITE_ALL, (x, y), (x, z))),
        (7, _phase_topology(7, Phase.NO_REBALANCE, (x, z), None)),
    ):
        node.on_messages([(x, encode_payload([Topology(t)]))], tid / 10)
    node.take_outbox()
    node.on_messages([(x, encode_payload([Backup(1, 6, (6 << 40) | 1, b"a", b"v")]))], 1.0)
    acks = [(a.code, a.topology_id) for a in _sent(node, x) if isinstance(a, BackupAck)]  # type: ignore[attr-defined]
    assert acks == [(OK, 6)] and node.store.value(0, b"a") == b"v"  # type: ignore[union-attr]
    # A topology that makes z the primary: a round of the primary of the topology before is refused.
    node.on_messages([(x, encode_payload([Topology(_phase_topology(8, Phase.NO_REBALANCE, (z, x), None))]))], 1.1)
    node.take_outbox()
    node.on_messages([(x, encode_payload([Backup(2, 7, (7 << 40) | 1, b"b", b"v")]))], 1.2)
    acks = [(a.code, a.topology_id) for a in _sent(node, x) if isinstance(a, BackupAck)]  # type: ignore[attr-defined]
    assert acks == [(RETRY, 8)]


def _tombstones(net: FakeNet) -> dict[Address, int]:
    return {a: net.nodes[a].store.tombstones for a in net.view}  # type: ignore[union-attr]


def test_tombstones_expire_after_the_grace_period() -> None:
    cfg = GridConfig.from_dict({**_config_dict(CONFIG), "tombstone_grace": "5s"})
    net = FakeNet(random.Random(10), cfg)
    a, b = net.add(2)
    net.run_until(2.0)
    net.nodes[a].put(b"k", b"v", net.now)
    net.collect(a)
    net.run_until(3.0)
    net.nodes[a].delete(b"k", net.now)
    net.collect(a)
    net.run_until(4.0)
    assert _tombstones(net) == {a: 1, b: 1}  # both owners keep the deletion
    net.run_until(7.9)
    assert _tombstones(net) == {a: 1, b: 1}
    net.run_until(8.1)  # ~5 s after each stored it, with no rebalance running
    assert _tombstones(net) == {a: 0, b: 0}
    assert sum(net.nodes[x].metrics["grid.tombstones_expired"] for x in (a, b)) == 2


def test_tombstones_stay_while_degraded_and_with_grace_zero() -> None:
    for grace, crash in (("5s", True), ("0s", False)):
        cfg = GridConfig.from_dict({**_config_dict(CONFIG), "tombstone_grace": grace})
        net = FakeNet(random.Random(11), cfg)
        a, b = net.add(2)
        net.run_until(2.0)
        net.nodes[a].delete(b"k", net.now)
        net.collect(a)
        net.run_until(2.5)
        if crash:
            net.crash(b)  # half of the stable owners gone: degraded, a partition may push old values later
        net.run_until(30.0)
        t = net.nodes[a].topology
        assert t is not None and (t.availability == Availability.DEGRADED) == crash
        assert net.nodes[a].store.tombstones == 1, grace  # type: ignore[union-attr]
        assert net.nodes[a].next_deadline() is None or not crash


def test_a_batch_sees_its_own_earlier_writes_in_order() -> None:
    """Operations of one batch on one key run in batch order, also when the member reads the key itself (a
    shortcut that served such gets at once overtook the put queued before them; the real-grid batch test
    found it, and simulation seed 574 then showed the shortcut also read too early inside a step)."""
    from groupcluster.grid.feed import ChangeFeed

    a = member(1)
    node = GridNode(a, CONFIG, hooks=ChangeFeed())
    node.on_view((a,), 0.0)
    assert node.topology is not None
    ids = node.start_batch(
        [(PUT, b"k", b"one"), (GET, b"k", None), (DELETE, b"k", None), (GET, b"k", None), (GET, b"other", None)],
        1.0,
    )
    results = {r.op_id: r for r in node.take_results()}
    assert [(results[i].ok, results[i].value) for i in ids] == [
        (True, None),
        (True, b"one"),
        (True, None),
        (True, None),
        (True, None),
    ]
    # A batch of gets alone reads the same values.
    node.start_batch([(PUT, b"k", b"two")], 2.0)
    ids = node.start_batch([(GET, b"k", None), (GET, b"k", None)], 3.0)
    got = {r.op_id: r.value for r in node.take_results()}
    assert [got[i] for i in ids] == [b"two", b"two"]


def cut_off_alone_with_a_write(seed: int) -> tuple[FakeNet, Address, Address]:
    """Two members of an allow_read_writes grid; ``a`` is cut off alone and acknowledges a write of k (the only
    copy); ``b`` is alive behind the partition."""
    cfg = GridConfig.from_dict({"num_segments": 8, "partition_handling": "allow_read_writes", "recovery_timeout": "1s"})
    net = FakeNet(random.Random(seed), cfg)
    a, b = net.add(2)
    net.run_until(2.0)
    assert net.stable()
    net.view = [a]  # a partition: b is alive but a no longer sees it
    net.nodes[a].on_view((a,), net.now)
    net.collect(a)
    net.run_until(4.0)
    w = net.nodes[a].put(b"k", b"only-on-a", net.now)
    net.collect(a)
    net.run_until(5.0)
    assert {x.op_id: x for x in net.results[a]}[w].ok
    return net, a, b


def heal_and_check_handoff(net: FakeNet, a: Address, b: Address, until: float) -> None:
    """Both back in one merge view: by ``until`` ``a`` (asked to leave) is ready and ``b`` holds a's write."""
    net.view = [a, b]
    for x in (a, b):
        net.nodes[x].on_view((a, b), net.now, merge=True)
    for x in (a, b):
        net.collect(x)
    net.run_until(until)
    assert net.nodes[a].ready_to_leave
    store = net.nodes[b].store
    assert store is not None and (b"k", b"only-on-a") in {(k, v) for _s, k, _ver, v in store.items()}


def test_member_cut_off_alone_does_not_leave_with_the_only_copy() -> None:
    # Seed 591 (allow_read_writes): a member cut off alone took a write (the only copy), was asked to leave and
    # left at once because nobody in its view could take its segments. The owners it lost without a handoff
    # may be alive behind the partition: it now waits for them (or the leave timeout).
    net, a, b = cut_off_alone_with_a_write(11)
    net.nodes[a].leave(net.now)
    net.collect(a)
    assert not net.nodes[a].ready_to_leave
    assert net.nodes[a].metrics["grid.left_without_taker"] == 0
    # The partition heals: b is back in a merge view and takes the segments; then a is ready.
    heal_and_check_handoff(net, a, b, 15.0)


@pytest.mark.parametrize("seed", range(6))
def test_last_owners_leaving_wait_for_members_that_joined_during_the_handoff(seed: int) -> None:
    # Simulation seeds 2801, 4872: both members holding data were leaving, one handing its segments to the other, and
    # two members joined during that rebalance. The topology ending it lists the owners that rebalance settled
    # on; the joiners are taken in by the next one, broadcast right behind it. The last owner installed the
    # first, read from it that nobody could take its segments (Membership._no_taker), and left with the only
    # copy. The planner lists the joiners in that topology now. (Which of the two leaves first depends on the
    # delays: the seeds cover both orders.)
    net = FakeNet(random.Random(seed))
    a, b = net.add(2)
    net.run_until(2.0)
    assert net.stable()
    w = net.nodes[a].put(b"k", b"v", net.now)
    net.collect(a)
    net.run_until(2.5)
    assert {r.op_id: r.ok for r in net.results[a]}[w]
    net.nodes[b].leave(net.now)
    net.collect(b)
    net.run_until(net.now + 0.003)
    net.nodes[a].leave(net.now)
    net.collect(a)
    c, d = net.add(2)
    left: dict[Address, int] = {}
    while net.now < 10.0 and len(net.view) > 2:
        net.run_until(net.now + 0.001)
        for x in net.view:
            if net.nodes[x].ready_to_leave:
                left[x] = net.nodes[x].metrics["grid.left_without_taker"]
        net.remove_left()
    assert net.view == [c, d] and left == {a: 0, b: 0}
    net.run_until(net.now + 2.0)
    assert net.stable()
    for x in (c, d):
        store = net.nodes[x].store
        assert store is not None and [(k, v) for _s, k, _ver, v in store.items()] == [(b"k", b"v")]


def test_member_cut_off_again_before_its_merge_push_arrived_does_not_leave_with_the_only_copy() -> None:
    # Simulation seed 4884 (allow_read_writes): a member cut off alone took a write (the only copy), merged
    # back, was asked to leave, and was cut off alone again before its merge push reached anyone. Its own grid
    # (only itself) took the push, and since nobody in its view could take its segments it left with them: the
    # members it had just merged with were not owners of its topology, so they did not count as vanished
    # owners (seed 591's rule). Whoever leaves our view while our merge push is unfinished counts now.
    net, a, b = cut_off_alone_with_a_write(14)
    node = net.nodes[a]
    node.on_view((a, b), net.now, merge=True)  # the partition heals for a moment...
    assert node.merging
    node.leave(net.now)
    node.take_outbox()  # ...but nothing a sends reaches b
    node.on_view((a,), net.now)  # cut off alone again
    net.collect(a)
    net.run_until(8.0)
    assert not node.merging  # its own grid took the push
    assert not node.ready_to_leave
    assert node.metrics["grid.left_without_taker"] == 0
    # The partition heals for good: the push reaches b's side, b takes the segments, then a is ready.
    heal_and_check_handoff(net, a, b, 18.0)


def test_member_that_took_over_the_data_of_a_cut_off_member_does_not_leave_alone_with_the_only_copy() -> None:
    # Simulation seed 203002143 (allow_read_writes): a member cut off alone acknowledged writes (the only copy),
    # handed them to a restarted member that joined its side, and left. That member, asked to leave, was alone:
    # no owner of its own topology had ever vanished (its topologies named only the two of them), so it left at
    # once with the only copy. The owners the grid lost without a handoff now travel with every topology
    # (CacheTopology.lost): it waits for the merge, hands its data off, and only then leaves.
    net, a, b = cut_off_alone_with_a_write(15)
    behind = net.nodes[b]
    behind.on_view((b,), net.now)  # b notices the partition too; what it sends stays on its side
    behind.take_outbox()
    (c,) = net.add(1)  # joins a's side (the net's view is [a])
    net.run_until(net.now + 2.0)
    assert net.stable() and c in owner_set(net.nodes[c].topology.current)  # type: ignore[union-attr]
    net.nodes[a].leave(net.now)
    net.collect(a)
    _step_until(net, lambda: net.nodes[a].ready_to_leave, limit=5.0)
    assert net.nodes[a].metrics["grid.left_without_taker"] == 0  # c could take a's segments: a handed off
    net.remove_left()
    assert net.view == [c]
    net.run_until(net.now + 1.0)
    node = net.nodes[c]
    t = node.topology
    assert t is not None and t.lost == (b,)  # a left after handing off: not lost; b is behind the partition
    assert set(owner_set(t.current)) == {c}
    node.leave(net.now)
    net.collect(c)
    net.run_until(net.now + 1.0)
    assert not node.ready_to_leave
    assert node.metrics["grid.left_without_taker"] == 0
    # The partition heals: c's push reaches b, b takes the segments, then c is ready to leave.
    net.view = [b, c]
    for x in (b, c):
        net.nodes[x].on_view((b, c), net.now, merge=True)
    for x in (b, c):
        net.collect(x)
    _step_until(net, lambda: node.ready_to_leave, limit=10.0)
    assert node.metrics["grid.left_without_taker"] == 0
    store = behind.store
    assert store is not None and (b"k", b"only-on-a") in {(k, v) for _s, k, _ver, v in store.items()}


def test_last_owner_cut_off_from_joiners_its_grid_never_took_in_does_not_leave_with_the_only_copy() -> None:
    # Simulation seed 536141000099 (grid, deny_read_writes, heavy message loss): a's co-owners had left
    # gracefully and a held every segment. Two joiners were in a's group view, but none of their statuses reached
    # a, so no topology of a's named them; they then dropped out of a's view (the group split under message loss)
    # and ran on behind it. Asked to leave, a was alone: no owner of its topology had vanished (the joiners owned
    # nothing), so it left at once with the only copy of every acknowledged write, and the grid the joiners went
    # on with (merged with restarted members) had lost them all. A view member our topology does not list that
    # drops out of the view without a handoff may come back and take our segments: it counts as vanished too.
    net = FakeNet(random.Random(17))
    (a,) = net.add(1)
    net.run_until(2.0)
    w = net.nodes[a].put(b"k", b"only-on-a", net.now)
    net.collect(a)
    net.run_until(3.0)
    assert {x.op_id: x for x in net.results[a]}[w].ok
    b = member(net.next_id)  # a joiner that never reaches a: a's view holds it, nothing of it arrives
    net.next_id += 1
    net.nodes[b] = GridNode(b, CONFIG)
    node = net.nodes[a]
    node.on_view((a, b), net.now)
    node.take_outbox()  # nothing a sends reaches b either
    net.run_until(4.0)
    t = node.topology
    assert t is not None and b not in t.members and owner_set(t.current) == (a,)
    node.on_view((a,), net.now)  # b drops out of a's view (split by the group), alive behind it
    net.collect(a)
    net.run_until(5.0)
    node.leave(net.now)
    net.collect(a)
    net.run_until(6.0)
    assert not node.ready_to_leave
    assert node.metrics["grid.left_without_taker"] == 0
    # The split heals: b is back in a merge view, takes the segments, then a is ready.
    heal_and_check_handoff(net, a, b, 12.0)


def test_member_that_joined_a_group_never_starts_an_empty_grid_alone() -> None:
    # Seed 590: a joiner that never received the grid's topology was cut off and, coordinator of its own view,
    # started an empty grid whose reads answered "absent" for keys the grid held.
    net = FakeNet(random.Random(12))
    (a,) = net.add(1)
    net.run_until(1.0)
    b = member(net.next_id)
    net.next_id += 1
    net.nodes[b] = GridNode(b, CONFIG)
    net.view = [a, b]
    net.nodes[b].on_view((a, b), net.now)  # b joined a's group; a's topology never reaches it
    net.nodes[b].take_outbox()
    net.nodes[b].on_view((b,), net.now)  # cut off: b is coordinator of a view of its own
    net.view = [b]
    net.collect(b)
    net.run_until(10.0)
    assert net.nodes[b].topology is None  # no empty grid of its own
    r = net.nodes[b].get(b"k", net.now)
    net.collect(b)
    net.run_until(10.5)
    assert not any(x.op_id == r and x.ok for x in net.results.get(b, []))  # not answered "absent"


def test_merge_of_groups_that_never_started_a_grid_starts_one_whoever_coordinates_it() -> None:
    # Seed 339000037: members that started apart formed groups below the initial cluster size (no grid). At
    # the merge of all of them, the coordinator was a member that had joined another's group before: it
    # took that for a grid it might belong to and waited, for good, for a member with a topology.
    net = FakeNet(random.Random(21), dataclasses.replace(CONFIG, initial_cluster_size=3))
    a, b, c = (member(i) for i in (1, 2, 3))
    for x in (a, b, c):
        net.nodes[x] = GridNode(x, net.config)

    def install(view: tuple[Address, ...], *, merge: bool = False) -> None:
        net.view = list(view)
        for x in view:
            net.nodes[x].on_view(view, net.now, merge=merge)
        for x in view:
            net.collect(x)
        net.run_until(net.now + 3.0)

    install((a, b))  # b joins a's group: two members, below the initial cluster size
    install((c,))  # c alone (started apart, or cut off)
    assert all(net.nodes[x].topology is None for x in (a, b, c))
    install((b, a, c), merge=True)  # the merge makes b the coordinator
    net.run_until(net.now + 5.0)
    t = net.nodes[b].topology
    assert t is not None and set(t.members) == {a, b, c} and set(owner_set(t.current)) == {a, b, c}
    assert all(net.nodes[x].topology == t for x in (a, c))
    # The grid works: a write is acknowledged and read back.
    put = net.nodes[c].put(b"k", b"v", net.now)
    net.collect(c)
    net.run_until(net.now + 2.0)
    assert any(r.op_id == put and r.ok for r in net.results[c])


def test_status_that_arrives_before_the_view_making_us_coordinator_is_kept() -> None:
    # Seed 460: the coordinator left; a member installed the next view first and sent its status to the new
    # coordinator, which had not installed that view yet and dropped it: the member stayed out of every
    # topology and the grid never converged.
    net = FakeNet(random.Random(13))
    a, b, c = net.add(3)
    net.run_until(3.0)
    assert net.stable()
    nodes = net.nodes
    nodes.pop(a)
    net.view = [b, c]
    nodes[c].on_view((b, c), net.now)  # c first: its status goes to b, still in the old view under a
    net.collect(c)
    net.run_until(net.now + 0.05)
    nodes[b].on_view((b, c), net.now)
    net.collect(b)
    net.run_until(net.now + 10.0)
    t = nodes[b].topology
    assert t is not None and set(t.members) == {b, c}
    assert net.stable()


# ==== batches (grid format 3) ==============================================================================
def _answers(node: GridNode, dest: Address) -> list[Response]:
    return [m for m in unbatched(_sent(node, dest)) if isinstance(m, Response)]


def _sent(node: GridNode, dest: Address) -> list[object]:
    """What ``node`` sent ``dest`` since the last call (the rest of its outbox is kept for the next one)."""
    out = getattr(node, "_test_outbox", []) + node.take_outbox()
    node._test_outbox = [o for o in out if o.dest != dest]  # type: ignore[attr-defined]
    return [m for o in out if o.dest == dest for m in decode_payload(o.payload)]


def test_a_batch_leaves_as_one_command_per_owner_and_one_backup_batch_per_backup() -> None:
    # One segment, x the originator, y the primary and z its backup: a batch of puts is one CommandBatch to
    # y, y applies them and sends z one BackupBatch, z answers one BackupAckBatch, y one ResponseBatch.
    x, y, z = member(1), member(2), member(3)
    cfg = GridConfig.from_dict({"num_segments": 1, "num_owners": 2})
    nodes = {a: GridNode(a, cfg) for a in (x, y, z)}
    t = _topology(4, [(y, z)], (x, y, z))
    for n in nodes.values():
        n.on_view((x, y, z), 0.0)
        n.on_messages([(x, encode_payload([Topology(t)]))], 0.1)
        n.take_outbox()
    ops = [(PUT, b"k%d" % i, b"v%d" % i) for i in range(50)] + [(DELETE, b"k0", None), (GET, b"k1", None)]
    ids = nodes[x].start_batch(ops, 1.0)
    cmds = _sent(nodes[x], y)
    assert len(cmds) == 1 and isinstance(cmds[0], CommandBatch) and len(cmds[0]) == 52
    assert cmds[0].topology_id == 4 and list(cmds[0].op_ids) == ids
    nodes[y].on_messages([(x, encode_payload(cmds))], 1.1)  # type: ignore[arg-type]
    backups = _sent(nodes[y], z)
    assert len(backups) == 1 and isinstance(backups[0], BackupBatch) and len(backups[0]) == 51
    versions = list(backups[0].versions)
    assert versions == sorted(versions) and len(set(versions)) == 51  # stamped in batch order
    nodes[z].on_messages([(y, encode_payload(backups))], 1.2)  # type: ignore[arg-type]
    acks = _sent(nodes[z], y)
    assert len(acks) == 1 and isinstance(acks[0], BackupAckBatch) and set(acks[0].codes) == {OK}
    nodes[y].on_messages([(z, encode_payload(acks))], 1.3)  # type: ignore[arg-type]
    answers = _sent(nodes[y], x)
    # The get was answered at once (before the writes were acknowledged), the writes once z acknowledged.
    assert any(isinstance(a, ResponseBatch) and len(a) == 51 for a in answers)
    assert len([r for r in unbatched(answers) if isinstance(r, Response)]) == 52
    nodes[x].on_messages([(y, encode_payload(answers))], 1.4)  # type: ignore[arg-type]
    res = {r.op_id: r for r in nodes[x].take_results()}
    assert [res[i].ok for i in ids] == [True] * 52 and res[ids[-1]].value == b"v1"
    for a in (y, z):
        store = nodes[a].store
        assert store is not None and store.get(0, b"k0") is not None and store.get(0, b"k0")[1] is None  # type: ignore[index]
        assert store.value(0, b"k49") == b"v49"
    assert nodes[y].store.segments[0].ver == nodes[z].store.segments[0].ver  # type: ignore[union-attr]


def test_a_command_batch_of_another_topology_is_held_or_retried_per_operation() -> None:
    # A batch from an originator ahead of us is held until that topology arrives, then served; one from an
    # originator behind us is answered RETRY for every operation, each with its own attempt.
    x, y = member(1), member(2)
    cfg = GridConfig.from_dict({"num_segments": 1, "num_owners": 1})
    node = GridNode(y, cfg)
    node.on_view((x, y), 0.0)
    node.on_messages([(x, encode_payload([Topology(_topology(4, [(y,)], (x, y)))]))], 0.1)
    node.take_outbox()
    ahead = CommandBatch(5)
    ahead.add(1, 1, PUT, b"a", b"1")
    ahead.add(2, 3, GET, b"a", None)
    node.on_messages([(x, encode_payload([ahead]))], 0.2)
    assert _answers(node, x) == []
    node.on_messages([(x, encode_payload([Topology(_topology(5, [(y,)], (x, y)))]))], 0.3)
    got = _answers(node, x)
    assert [(r.op_id, r.attempt, r.code, r.topology_id, r.value) for r in got] == [
        (1, 1, OK, 5, None),
        (2, 3, OK, 5, b"1"),
    ]
    behind = CommandBatch(4)
    behind.add(7, 2, PUT, b"b", b"2")
    behind.add(8, 1, DELETE, b"a", None)
    node.on_messages([(x, encode_payload([behind]))], 0.4)
    got = _answers(node, x)
    assert [(r.op_id, r.attempt, r.code, r.topology_id) for r in got] == [(7, 2, RETRY, 5), (8, 1, RETRY, 5)]
    assert node.store is not None and node.store.value(0, b"b") is None


def test_start_batch_checks_every_operation_before_starting_any() -> None:
    a = member(1)
    node = GridNode(a, CONFIG)
    node.on_view((a,), 0.0)
    with pytest.raises(TypeError, match=r"ops\[1\].value"):
        node.start_batch([(PUT, b"k", b"v"), (PUT, b"k2", "text")], 1.0)  # type: ignore[list-item]
    with pytest.raises(ValueError, match=r"ops\[0\]: unknown operation kind"):
        node.start_batch([(9, b"k", None)], 1.0)
    assert node.pending_ops == 0 and node.take_results() == [] and node.store.value(0, b"k") is None  # type: ignore[union-attr]


def test_batches_give_the_same_grid_as_single_operations() -> None:
    # The same operations, once as batches from random members and once one by one, under a rebalance
    # (a member joins midway): every result and every replica's final entries agree.
    def run(batched: bool) -> tuple[list[tuple[bool, bytes | None]], dict[bytes, bytes | None]]:
        rng = random.Random(5)
        net = FakeNet(random.Random(6))
        net.add(3)
        net.run_until(2.0)
        out: list[tuple[bool, bytes | None]] = []
        ids: list[tuple[Address, int]] = []
        for r in range(6):
            if r == 3:
                net.add(1)
            ops = []
            for _ in range(40):
                key = b"k%d" % rng.randrange(30)
                kind = rng.choice([PUT, PUT, GET, DELETE])
                ops.append((kind, key, b"v%d-%d" % (r, rng.randrange(1000)) if kind == PUT else None))
            origin = net.view[r % len(net.view)]
            if batched:
                ids += [(origin, i) for i in net.nodes[origin].start_batch(ops, net.now)]
            else:
                for kind, key, value in ops:
                    n = net.nodes[origin]
                    i = (
                        n.get(key, net.now)
                        if kind == GET
                        else n.delete(key, net.now)
                        if kind == DELETE
                        else n.put(key, value, net.now)
                    )  # type: ignore[arg-type]
                    ids.append((origin, i))
            net.collect(origin)
            net.run_until(net.now + 0.5)
        net.run_until(net.now + 10.0)
        res = {(a, r.op_id): r for a, rs in net.results.items() for r in rs}
        out = [(res[i].ok, res[i].value) for i in ids]
        final: dict[bytes, bytes | None] = {}
        for a in net.view:
            store = net.nodes[a].store
            assert store is not None
            for data in store.segments.values():
                for k in data:
                    final.setdefault(k, data.val[k])
                    assert final[k] == data.val[k]
        return out, final

    assert run(True) == run(False)


def test_a_topology_of_the_old_group_arriving_after_a_merge_view_is_not_the_merged_one() -> None:
    # Found by grid simulation seed 19: the old group's coordinator broadcast a topology just before the
    # merge, and members handled it after the merge view. Its id was above theirs, so they took it for the
    # merged group's first topology: they served commands again, pushed their entries to its owners (their
    # own side) and called the merge done; the merged group then continued the other partition's topology,
    # and the copies went with the next drop. The merged topology names us and a member of the other side.
    c, x, o = member(1), member(2), member(3)
    node = GridNode(x, GridConfig.from_dict({"num_segments": 1, "num_owners": 1}))
    node.on_view((c, x), 0.0)
    node.on_messages([(c, encode_payload([Topology(_topology(4, [(x,)], (c, x)))]))], 0.1)
    put = node.put(b"k", b"v", 0.2)
    assert [(r.op_id, r.ok) for r in node.take_results()] == [(put, True)]
    node.on_view((c, x, o), 1.0, merge=True)  # o was on the other side of a partition
    node.take_outbox()
    # A late topology of our old group (o is not in it): c owns the segment now.
    node.on_messages([(c, encode_payload([Topology(_topology(5, [(c,)], (c, x)))]))], 1.1)
    assert node.topology is not None and node.topology.topology_id == 5
    assert node.store is not None and node.store.value(0, b"k") == b"v"  # kept for the merge push
    assert not [
        m for out in node.take_outbox() for m in unbatched(decode_payload(out.payload)) if isinstance(m, Backup)
    ]
    # Commands are still held: this is not the topology the merged group serves from.
    node.on_messages([(c, encode_payload([Command(7, 1, 5, GET, b"k", None)]))], 1.2)
    assert node.metrics["grid.ops_held_merging"] == 1
    assert not [
        m for out in node.take_outbox() for m in unbatched(decode_payload(out.payload)) if isinstance(m, Response)
    ]
    # The merged group's topology (the other side's CH: o owns everything) takes the push.
    node.on_messages([(c, encode_payload([Topology(_topology(9, [(o,)], (c, x, o)))]))], 1.3)
    sent = [m for out in node.take_outbox() if out.dest == o for m in unbatched(decode_payload(out.payload))]
    assert [(m.key, m.value) for m in sent if isinstance(m, Backup)] == [(b"k", b"v")]
    assert not node.store.has_segment(0)  # dropped once the merged topology took the push


def _backups_to(node: GridNode, dest: Address) -> list[tuple[bytes, int, bytes | None]]:
    return [
        (m.key, m.version, m.value)
        for out in node.take_outbox()
        if out.dest == dest
        for m in unbatched(decode_payload(out.payload))
        if isinstance(m, Backup)
    ]


def test_writes_of_a_member_that_vanished_are_finished_by_the_copies_that_have_them() -> None:
    # Found by grid simulation seeds 24, 581 (a primary died after some backups applied its write) and 716
    # (a former primary re-driving a write died after one new owner applied it): the copies differed for
    # good. A member that applied writes from one that vanished re-drives its entries of those segments.
    p, x, y = member(1), member(2), member(3)
    node = GridNode(x, GridConfig.from_dict({"num_segments": 2, "num_owners": 3, "op_timeout": "30s"}))
    node.on_view((p, x, y), 0.0)
    node.on_messages([(p, encode_payload([Topology(_topology(5, [(p, x, y), (p, x, y)], (p, x, y)))]))], 0.1)
    # Two backups from p, each applied by us; y may have missed them.
    keys = [b"a", b"b"]
    v1, v2 = (5 << 40) | 7, (5 << 40) | 8
    node.on_messages([(p, encode_payload([Backup(1, 5, v1, keys[0], b"one"), Backup(2, 5, v2, keys[1], b"two")]))], 0.2)
    node.take_outbox()
    node.on_view((x, y), 5.0)  # p is gone: y may lack what p sent us
    assert sorted(_backups_to(node, y)) == sorted([(keys[0], v1, b"one"), (keys[1], v2, b"two")])
    assert node.metrics["grid.repair_entries_pushed"] == 2


def test_nothing_is_repaired_for_a_member_whose_writes_are_long_finished() -> None:
    p, x, y = member(1), member(2), member(3)
    node = GridNode(x, GridConfig.from_dict({"num_segments": 1, "num_owners": 3, "op_timeout": "30s"}))
    node.on_view((p, x, y), 0.0)
    node.on_messages([(p, encode_payload([Topology(_topology(5, [(p, x, y)], (p, x, y)))]))], 0.1)
    node.on_messages([(p, encode_payload([Backup(1, 5, (5 << 40) | 1, b"k", b"v")]))], 0.2)
    node.take_outbox()
    node.on_view((p, x), 10.0)  # y vanished: it sent us nothing
    assert _backups_to(node, p) == []
    node.on_view((x,), 40.0)  # p vanished more than op_timeout after its last write reached us
    assert node.metrics["grid.repair_entries_pushed"] == 0


def test_a_degraded_partition_pushes_what_it_wrote_at_the_merge() -> None:
    # Found by grid simulation seed 614: a member cut off alone held a degraded topology in which it was the
    # only owner of a segment, so it still took writes for that segment; at the merge only members with an
    # available topology pushed their entries, and its acknowledged write was lost to the other side's copy.
    c, x, z = member(1), member(2), member(3)
    node = GridNode(x, GridConfig.from_dict({"num_segments": 1, "num_owners": 1}))
    node.on_view((x,), 0.0)
    degraded = _topology(4, [(x,)], (x,), degraded=True, stable=(x, z))
    node.on_messages([(x, encode_payload([Topology(degraded)]))], 0.1)
    put = node.put(b"k", b"new", 0.2)
    assert [(r.op_id, r.ok) for r in node.take_results()] == [(put, True)]
    node.on_view((c, x), 1.0, merge=True)
    node.take_outbox()
    node.on_messages([(c, encode_payload([Topology(_topology(9, [(c,)], (c, x)))]))], 1.1)
    assert [(k, v) for k, _ver, v in _backups_to(node, c)] == [(b"k", b"new")]


@pytest.mark.parametrize(
    "phase", [Phase.READ_OLD_WRITE_ALL, Phase.READ_ALL_WRITE_ALL, Phase.READ_NEW_WRITE_ALL], ids=lambda p: p.name
)
def test_a_new_owner_that_dies_mid_rebalance_leaves_every_key_with_two_copies(phase: Phase) -> None:
    # Simulation seed 4100076: a joiner, new owner of a segment in the rebalance taking it in, was cut off
    # mid-rebalance; the planner removed it from the pending CH, which then named one owner for that segment.
    # The rebalance ended there, the current owner it replaced dropped its copy, and the one owner left (already
    # crashed, not yet out of the view) took the acknowledged writes with it. The live current owners, which
    # hold the data, now stay in the pending CH: no key is down to one copy while the grid heals.
    net = FakeNet(random.Random(5))
    a, _, _ = net.add(3)
    net.run_until(2.0)
    assert net.stable()
    keys = [f"k{i}".encode() for i in range(64)]
    ops = {net.nodes[a].put(k, k + b"!", net.now): k for k in keys}
    net.collect(a)
    net.run_until(3.0)
    assert {r.op_id for r in net.results[a] if r.ok} >= set(ops)
    (d,) = net.add(1)
    while (t := net.nodes[d].topology) is None or t.phase != phase:  # d is a new owner, in this phase
        assert net.now < 5.0
        net.run_until(net.now + 0.0005)
    assert t.segments_to_fetch(d)
    net.crash(d)
    fewest = 2
    while net.now < 20.0 and not net.stable():
        net.run_until(net.now + 0.001)
        for k in keys:
            s = net.coordinator.topology.segment_of(k)  # type: ignore[union-attr]
            held = [x for x in net.view if net.nodes[x].store.value(s, k) == k + b"!"]  # type: ignore[union-attr]
            fewest = min(fewest, len(held))
    assert net.stable() and fewest == 2


def test_a_node_has_a_store_only_from_its_first_topology_on() -> None:
    node = GridNode(Address("10.0.0.1", 7800, 1), GridConfig())
    with pytest.raises(RuntimeError, match="no store before the first topology"):
        node.installed_store()
