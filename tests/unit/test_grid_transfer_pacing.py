"""How a grid node schedules state-transfer work against operations (write latency during a rebalance).

* Transfer chunks and their acknowledgements are held back behind the operations of the same delivery and
  handled one per step (:attr:`GridNode.defer_transfer`), while everything else that arrives after a held
  chunk stays behind it (a topology must not overtake the chunk it follows).
* A joiner spreads its fetches over the current owners instead of asking every segment's primary.
* Dropped segments are freed a slice at a time, at most one slice per ``FREE_INTERVAL``.
"""

from __future__ import annotations

from groupcluster.core.address import Address
from groupcluster.grid.columns import BackupAckBatch, BackupBatch, EntryChunk
from groupcluster.grid.consistent_hash import ConsistentHash
from groupcluster.grid.messages import OK, BackupAck, Fetch, Topology, XferAck, XferData
from groupcluster.grid.node import FREE_INTERVAL, FREE_PER_STEP, XFER_OVERHEAD, GridConfig, GridNode
from groupcluster.grid.payload import decode_payload, encode_payload
from groupcluster.grid.store import make_version
from groupcluster.grid.topology import Availability, CacheTopology, Phase


def member(i: int) -> Address:
    return Address(f"10.0.0.{i}", 7800, i)


X, Y, Z = member(1), member(2), member(3)  # X coordinates; X and Z hold the data; Y joins


def _ch(owners: list[tuple[Address, ...]]) -> ConsistentHash:
    return ConsistentHash.from_owner_map(len(owners), len(owners[0]), owners, {X: 1.0, Y: 1.0, Z: 1.0})


def _topology(tid: int, phase: Phase, current: list[tuple[Address, ...]], pending: list[tuple[Address, ...]] | None):
    return CacheTopology(
        tid,
        1 if pending is not None else 0,
        phase,
        _ch(current),
        _ch(pending) if pending is not None else None,
        (X, Y, Z),
        Availability.AVAILABLE,
        (X, Z),
    )


def _sent(node: GridNode) -> list[tuple[Address | None, object]]:
    return [(o.dest, m) for o in node.take_outbox() for m in decode_payload(o.payload)]


def _joiner(num_segments: int) -> tuple[GridNode, list[tuple[Address | None, object]]]:
    """Y in the first rebalance phase of ``num_segments`` segments held by (X, Z) and moving to (X, Y)."""
    node = GridNode(Y, GridConfig.from_dict({"num_segments": num_segments, "num_owners": 2}))
    node.on_view((X, Y, Z), 0.0)
    node.take_outbox()
    segs = num_segments
    t = _topology(5, Phase.READ_OLD_WRITE_ALL, [(X, Z)] * segs, [(X, Y)] * segs)
    node.on_messages([(X, encode_payload([Topology(t)]))], 0.1)
    return node, _sent(node)


def test_a_backup_is_acknowledged_before_the_chunk_ahead_of_it_is_applied() -> None:
    node, sent = _joiner(1)
    fetches = [(d, m) for d, m in sent if isinstance(m, Fetch)]
    assert len(fetches) == 1 and fetches[0][0] == X
    xid = fetches[0][1].xfer_id  # type: ignore[attr-defined]
    old = make_version(4, 1)
    chunk = XferData(xid, 0, EntryChunk.of([(b"a", old, b"old-a"), (b"b", old, b"old-b")]), (0,), True)
    backup = BackupBatch(5)
    backup.add(7, make_version(5, 1), b"b", b"new-b")
    after = _topology(6, Phase.READ_ALL_WRITE_ALL, [(X, Z)], [(X, Y)])
    # One delivery: the chunk, a write's backup, then the next topology (X coordinates and sources both).
    node.on_messages([(X, encode_payload([chunk, backup, Topology(after)]))], 1.0)
    acks = [m for d, m in _sent(node) if isinstance(m, BackupAck | BackupAckBatch)]
    # Answered in the step it arrived in (a batch of one travels as its single message).
    assert len(acks) == 1 and isinstance(acks[0], BackupAck) and acks[0].code == OK
    store = node.store
    assert store is not None and store.get(0, b"a") is None  # the chunk waits ...
    assert store.value(0, b"b") == b"new-b"
    assert node.topology is not None and node.topology.topology_id == 5  # ... and the topology behind it
    assert node.next_deadline() == 1.0  # a step at once for the held-back work
    node.tick(1.0)
    assert store.value(0, b"a") == b"old-a"
    assert store.value(0, b"b") == b"new-b"  # the backup's newer version stays
    assert node.topology.topology_id == 5  # one chunk per step: the topology comes in the next
    node.tick(1.0)
    assert node.topology is not None and node.topology.topology_id == 6
    assert node.next_deadline() != 1.0 or not node._deferred


def test_a_view_change_first_handles_what_was_held_back() -> None:
    node, sent = _joiner(1)
    xid = next(m.xfer_id for _, m in sent if isinstance(m, Fetch))  # type: ignore[attr-defined]
    chunk = XferData(xid, 0, EntryChunk.of([(b"a", make_version(4, 1), b"v")]), (0,), True)
    node.on_messages([(X, encode_payload([chunk]))], 1.0)
    assert node.store is not None and node.store.get(0, b"a") is None
    # Z leaves: the chunk from X arrived in the old view, so it is applied before the view is.
    node.on_view((X, Y), 1.1)
    assert node.store.value(0, b"a") == b"v" and not node._deferred


def test_a_source_answers_a_backup_before_it_produces_the_next_chunk() -> None:
    cfg = GridConfig.from_dict({"num_segments": 1, "num_owners": 2, "transfer_batch_entries": 1})
    node = GridNode(X, cfg)
    node.on_view((X, Y, Z), 0.0)
    t = _topology(5, Phase.READ_OLD_WRITE_ALL, [(X, Z)], [(X, Y)])
    node.on_messages([(X, encode_payload([Topology(t)]))], 0.1)
    assert node.store is not None
    for i in range(6):
        node.store.write(0, b"k%d" % i, make_version(4, i + 1), b"v")
    node.take_outbox()
    node.on_messages([(Y, encode_payload([Fetch(9, 5, 1, (0,))]))], 0.2)
    first = [m for d, m in _sent(node) if isinstance(m, XferData)]
    assert len(first) == 1  # one chunk per step ...
    assert node.next_deadline() == 0.2
    node.tick(0.2)
    assert [type(m) for _, m in _sent(node)] == [XferData]  # ... the window's second in the next step
    node.tick(0.2)
    assert _sent(node) == []  # the window (2) is full
    backup = BackupBatch(5)
    backup.add(3, make_version(5, 1), b"z", b"new")
    node.on_messages([(Y, encode_payload([XferAck(9)])), (Z, encode_payload([backup]))], 0.3)
    now = _sent(node)
    assert [type(m) for _, m in now] == [BackupAck]
    node.tick(0.3)
    assert [type(m) for _, m in _sent(node)] == [XferData]


def test_a_joiner_fetches_from_every_current_owner_alike() -> None:
    _, sent = _joiner(8)
    fetches = [(d, m) for d, m in sent if isinstance(m, Fetch)]
    by_source = {d: len(m.segments) for d, m in fetches}  # type: ignore[attr-defined]
    assert by_source == {X: 4, Z: 4}  # not all 8 from the primary X


def test_dropped_segments_are_freed_one_slice_per_interval() -> None:
    cfg = GridConfig.from_dict({"num_segments": 2, "num_owners": 1})
    node = GridNode(Y, cfg)
    node.on_view((X, Y), 0.0)
    caps = {X: 1.0, Y: 1.0}
    t1 = CacheTopology(3, 0, Phase.NO_REBALANCE, ConsistentHash.from_owner_map(2, 1, [(Y,), (Y,)], caps), None, (X, Y))
    node.on_messages([(X, encode_payload([Topology(t1)]))], 0.1)
    store = node.store
    assert store is not None
    n = FREE_PER_STEP * 4
    for i in range(n):
        store.write(0, b"k%d" % i, make_version(3, i + 1), b"v")
    t2 = CacheTopology(4, 0, Phase.NO_REBALANCE, ConsistentHash.from_owner_map(2, 1, [(X,), (Y,)], caps), None, (X, Y))
    node.on_messages([(X, encode_payload([Topology(t2)]))], 1.0)
    assert not store.has_segment(0) and store.garbage == n - FREE_PER_STEP  # one slice in the step of the drop
    node.on_messages([], 1.0 + FREE_INTERVAL / 2)  # another step before the interval: nothing freed
    assert store.garbage == n - FREE_PER_STEP
    assert node.next_deadline() == 1.0 + FREE_INTERVAL
    now = 1.0
    while store.garbage:
        now = node.next_deadline()  # type: ignore[assignment]
        node.tick(now)
    assert abs(now - (1.0 + 3 * FREE_INTERVAL)) < 1e-9


def _chunk(xid: int, first: int, n: int, size: int, last: bool = False) -> XferData:
    entries = [(b"k%06d" % i, make_version(4, i + 1), b"v" * size) for i in range(first, first + n)]
    return XferData(xid, 0, EntryChunk.of(entries), (0,) if last else (), last)


def test_a_new_owner_acknowledges_chunks_no_faster_than_its_transfer_rate() -> None:
    rate = 10_000  # bytes per second
    node = GridNode(Y, GridConfig.from_dict({"num_segments": 1, "num_owners": 2, "transfer_rate": rate}))
    node.on_view((X, Y, Z), 0.0)
    node.take_outbox()
    t = _topology(5, Phase.READ_OLD_WRITE_ALL, [(X, Z)], [(X, Y)])
    node.on_messages([(X, encode_payload([Topology(t)]))], 0.1)
    xid = next(m.xfer_id for _, m in _sent(node) if isinstance(m, Fetch))  # type: ignore[attr-defined]
    chunks = [_chunk(xid, 10 * i, 10, 100) for i in range(3)]
    cost = len(chunks[0].entries.blob) + XFER_OVERHEAD  # about 1.2 KB: 0.12 s at 10 KB/s
    node.on_messages([(X, encode_payload(chunks))], 1.0)
    node.tick(1.0)
    assert [type(m) for _, m in _sent(node)] == [XferAck]  # the first at once
    node.tick(1.0)
    node.tick(1.0)
    assert _sent(node) == []  # the second and third wait for the rate ...
    assert node.store is not None and len(node.store) == 30  # ... though applied at once: only acks wait
    due = node.next_deadline()
    assert due is not None and abs(due - (1.0 + cost / rate)) < 1e-9
    node.tick(due - 0.001)
    assert _sent(node) == []
    node.tick(due)
    assert [type(m) for _, m in _sent(node)] == [XferAck]  # ... and go when due
    third = node.next_deadline()
    assert third is not None and abs(third - (1.0 + 2 * cost / rate)) < 1e-9
    # The stream is cancelled before its acknowledgement is due (its source left): nothing is sent for it.
    node.on_view((Y, Z), third - 0.01)
    node.tick(third)
    assert not [m for _, m in _sent(node) if isinstance(m, XferAck)]


def test_without_a_transfer_rate_every_chunk_is_acknowledged_when_applied() -> None:
    node = GridNode(Y, GridConfig.from_dict({"num_segments": 1, "num_owners": 2, "transfer_rate": 0}))
    node.on_view((X, Y, Z), 0.0)
    node.take_outbox()
    t = _topology(5, Phase.READ_OLD_WRITE_ALL, [(X, Z)], [(X, Y)])
    node.on_messages([(X, encode_payload([Topology(t)]))], 0.1)
    xid = next(m.xfer_id for _, m in _sent(node) if isinstance(m, Fetch))  # type: ignore[attr-defined]
    node.on_messages([(X, encode_payload([_chunk(xid, 10 * i, 10, 1000) for i in range(3)]))], 1.0)
    for _ in range(3):
        node.tick(1.0)
        assert [type(m) for _, m in _sent(node)] == [XferAck]
