"""Operation timers of grid/node/operations.py kept as runs: one heap entry for the operations of a batch.

A batch's operations are sent in one step with consecutive ids and share one resend time, so the node keeps
one timer entry for all of them (``Operations.op_timers``). These tests check that an operation in such a run
is still resent on time, and only it, whichever of its neighbours were answered, and that a finished run
leaves no timer behind. Two real nodes; the answers are delivered (or withheld) by hand.

Client deadlines (the tests from ``test_an_operation_whose_deadline_passed``): an operation sends no attempt at
or after its client's deadline, since a client that gave up may have retried on another member, and the first
member must not land the write after that (docs/grid.md, "Client deadlines").
"""

from __future__ import annotations

from groupcluster.core.address import Address
from groupcluster.grid.columns import CommandBatch, ResponseBatch
from groupcluster.grid.messages import OK, PUT, RETRY, Command
from groupcluster.grid.node import GridConfig, GridNode
from groupcluster.grid.payload import decode_payload, encode_payload

CONFIG = GridConfig.from_dict({"num_segments": 16, "num_owners": 1, "attempt_timeout": "1s", "op_timeout": "60s"})
A = Address("10.0.0.1", 7800, 1)
B = Address("10.0.0.2", 7800, 2)


def two_nodes() -> tuple[GridNode, GridNode]:
    a, b = GridNode(A, CONFIG), GridNode(B, CONFIG)
    for n in (a, b):
        n.on_view((A, B), 0.0)
    for _ in range(10):  # settle the first topology (coordinator A to B and back)
        moved = False
        for src, dst in ((a, b), (b, a)):
            for out in src.take_outbox():
                if out.dest in (None, dst.address):
                    dst.on_messages([(src.address, out.payload)], 0.0)
                    moved = True
        if not moved:
            break
    assert a.topology is not None and b.topology is not None
    return a, b


def keys_owned_by(node: GridNode, owner: Address, n: int) -> list[bytes]:
    t = node.topology
    assert t is not None
    out = []
    i = 0
    while len(out) < n:
        k = b"key-%d" % i
        if t.write_owners(t.segment_of(k))[0] == owner:
            out.append(k)
        i += 1
    return out


def commands(node: GridNode) -> list[CommandBatch]:
    """The operations ``node`` sent, as batches (a batch of one travels as a single Command)."""
    out = []
    for payload in node.take_outbox():
        for m in decode_payload(payload.payload):
            if type(m) is Command:
                b = CommandBatch(m.topology_id)
                b.add(m.op_id, m.attempt, m.kind, m.key, m.value, m.deadline)
                m = b
            if type(m) is CommandBatch:
                out.append(m)
    return out


def answer(a: GridNode, cmd: CommandBatch, which: list[int], now: float) -> None:
    """Deliver to ``a`` a success from B for the operations at positions ``which`` of ``cmd`` only."""
    rsp = ResponseBatch()
    for i in which:
        rsp.add(cmd.op_ids[i], cmd.attempts[i], OK, cmd.topology_id, None, "")
    a.on_messages([(B, encode_payload([rsp] if len(which) > 1 else list(rsp.responses())))], now)


def test_an_unanswered_operation_inside_a_batch_is_resent_alone_at_its_time() -> None:
    a, _ = two_nodes()
    keys = keys_owned_by(a, B, 5)
    ids = a.start_batch([(PUT, k, b"v") for k in keys], 1.0)
    (cmd,) = commands(a)
    assert list(cmd.op_ids) == ids
    # The first two and the last are answered: the run's front moves past them to the third.
    answer(a, cmd, [0, 1, 4], 1.1)
    assert len(a.take_results()) == 3
    assert a.next_deadline() == 2.0  # sent at 1.0, attempt_timeout 1 s
    assert len(a.operations.op_timers) == 1
    a.tick(2.0)
    (again,) = commands(a)
    assert list(again.op_ids) == ids[2:4] and list(again.attempts) == [2, 2]
    assert list(again.keys) == keys[2:4]
    answer(a, again, [0, 1], 2.1)
    assert [r.ok for r in a.take_results()] == [True, True]
    assert a.next_deadline() is None and a.operations.op_timers == []


def test_a_run_whose_front_is_still_waiting_keeps_its_time_when_later_ones_finish() -> None:
    a, _ = two_nodes()
    keys = keys_owned_by(a, B, 4)
    ids = a.start_batch([(PUT, k, b"v") for k in keys], 1.0)
    (cmd,) = commands(a)
    answer(a, cmd, [1, 2, 3], 1.2)
    assert a.next_deadline() == 2.0
    a.tick(1.5)  # not yet due: nothing is resent
    assert commands(a) == []
    a.tick(2.0)
    (again,) = commands(a)
    assert list(again.op_ids) == ids[:1]
    # A second batch started meanwhile forms its own run, with its own time.
    more = keys_owned_by(a, B, 6)[4:]
    later = a.start_batch([(PUT, k, b"w") for k in more], 2.5)
    (cmd2,) = commands(a)
    assert list(cmd2.op_ids) == later
    answer(a, again, [0], 2.6)
    assert a.next_deadline() == 3.5
    answer(a, cmd2, [0, 1], 2.7)
    assert len(a.take_results()) == 6 and a.next_deadline() is None


# ==== client deadlines ===================================================================================
def results(node: GridNode) -> dict[int, tuple[bool, str]]:
    return {r.op_id: (r.ok, r.error) for r in node.take_results()}


def test_an_operation_whose_deadline_passed_before_it_started_sends_nothing() -> None:
    a, b = two_nodes()
    (key,) = keys_owned_by(a, b.address, 1)
    op = a.put(key, b"late", 5.0, deadline=4.9)
    assert commands(a) == []
    ok, error = results(a)[op]
    assert not ok and error.startswith("timed out") and "before any attempt was sent" in error
    assert a.metrics["grid.ops_deadline_expired"] == 1
    assert a.pending_ops == 0


def test_a_batch_past_its_deadline_sends_nothing_and_fails_every_operation() -> None:
    a, b = two_nodes()
    keys = keys_owned_by(a, b.address, 3)
    ids = a.start_batch([(PUT, k, b"v") for k in keys], 5.0, deadline=5.0)
    assert commands(a) == []
    got = results(a)
    assert sorted(got) == ids and not any(ok for ok, _ in got.values())


def test_an_unanswered_operation_is_not_resent_after_its_deadline() -> None:
    a, b = two_nodes()
    (key,) = keys_owned_by(a, b.address, 1)
    op = a.put(key, b"v", 1.0, deadline=2.5)  # attempt_timeout is 1 s: resends due at 2.0 and 3.0
    assert len(commands(a)) == 1
    assert a.next_deadline() == 2.0
    a.tick(2.0)
    assert [c.attempts[0] for c in commands(a)] == [2]  # before the deadline: resent
    assert a.next_deadline() == 2.5  # the deadline, not the next resend
    a.tick(2.5)
    assert commands(a) == []
    ok, error = results(a)[op]
    assert not ok and error == "timed out: the request's deadline passed after 2 attempts"
    # Nothing of it is left to time: the node's next step is not for this operation.
    assert a.pending_ops == 0
    nd = a.next_deadline()
    assert nd is None or nd > 3.0


def test_a_retry_answer_arriving_after_the_deadline_sends_no_new_attempt() -> None:
    # The owner asks for a retry (RETRY, e.g. it moved to another topology) after the client's deadline, before
    # the node's timer for the deadline ran: no new attempt, and the operation fails at the next step.
    a, b = two_nodes()
    (key,) = keys_owned_by(a, b.address, 1)
    op = a.put(key, b"v", 1.0, deadline=1.5)
    (cmd,) = commands(a)
    rsp = ResponseBatch()
    rsp.add(cmd.op_ids[0], cmd.attempts[0], RETRY, cmd.topology_id, None, "")
    a.on_messages([(b.address, encode_payload(list(rsp.responses())))], 1.6)
    assert a.next_deadline() == 1.5
    a.tick(1.6)
    assert commands(a) == []
    ok, error = results(a)[op]
    assert not ok and error.endswith("after 1 attempts")


def test_operations_answered_before_their_deadline_succeed_and_their_deadline_entry_is_dropped() -> None:
    a, b = two_nodes()
    keys = keys_owned_by(a, b.address, 2)
    ids = a.start_batch([(PUT, k, b"v") for k in keys], 1.0, deadline=9.0)
    (cmd,) = commands(a)
    answer(a, cmd, [0, 1], 1.2)
    assert results(a) == {i: (True, "") for i in ids}
    a.tick(9.0)  # the batch's deadline entry comes due with nothing left: no effect
    assert results(a) == {} and a.metrics["grid.ops_deadline_expired"] == 0
    assert a.next_deadline() is None or a.next_deadline() > 9.0  # type: ignore[operator]


def test_deadlines_out_of_start_order_each_expire_at_their_own_time() -> None:
    a, b = two_nodes()
    k1, k2 = keys_owned_by(a, b.address, 2)
    late = a.put(k1, b"1", 1.0, deadline=1.8)
    early = a.put(k2, b"2", 1.1, deadline=1.3)  # started later, due earlier
    commands(a)
    assert a.next_deadline() == 1.3
    a.tick(1.3)
    assert set(results(a)) == {early}
    assert a.next_deadline() == 1.8
    a.tick(1.8)
    assert set(results(a)) == {late}


def test_without_a_deadline_an_operation_keeps_the_grid_timeout() -> None:
    a, b = two_nodes()
    (key,) = keys_owned_by(a, b.address, 1)
    a.put(key, b"v", 1.0)
    commands(a)
    for t in (2.0, 3.0, 4.0):
        a.tick(t)
        assert len(commands(a)) == 1  # resent every attempt_timeout
    assert results(a) == {}


def deliver(src: GridNode, dst: GridNode, now: float) -> None:
    """Everything ``src`` has sent to ``dst`` (or to all), handed over at ``now``."""
    for out in src.take_outbox():
        if out.dest in (None, dst.address):
            dst.on_messages([(src.address, out.payload)], now)


def test_the_primary_does_not_apply_a_write_that_reaches_it_after_the_deadline() -> None:
    # The command left in time but reached the owner late (the owner was paused, or the network slow): the
    # owner refuses it, so it cannot land over what the client wrote after giving up.
    a, b = two_nodes()
    k_late, k_ok = keys_owned_by(a, b.address, 2)
    late = a.put(k_late, b"late", 1.0, deadline=1.5)
    ok = a.put(k_ok, b"in time", 1.0, deadline=9.0)
    deliver(a, b, 1.6)  # B's clock is past the first deadline when it reads the commands
    assert b.store is not None and b.store.get(b.topology.segment_of(k_late), k_late) is None  # type: ignore[union-attr]
    assert b.store.get(b.topology.segment_of(k_ok), k_ok)[1] == b"in time"  # type: ignore[union-attr,index]
    assert b.metrics["grid.writes_refused_deadline"] == 1
    deliver(b, a, 1.6)
    got = results(a)
    assert got[ok] == (True, "")
    assert got[late] == (
        False,
        "timed out: the request's deadline passed before the key's primary owner could apply it",
    )


def test_the_deadline_travels_as_the_originators_wall_clock_time() -> None:
    # Each member's clock (its event loop's) has its own origin: the deadline crosses as a Unix time.
    a, b = two_nodes()
    a.wall_offset, b.wall_offset = 1000.0, 990.0  # B's loop clock reads 10 s more than A's for the same instant
    (key,) = keys_owned_by(a, b.address, 1)
    a.put(key, b"v", 1.0, deadline=1.5)  # Unix time 1001.5
    (cmd,) = commands(a)
    assert list(cmd.deadlines) == [1001.5]
    a.put(key, b"v2", 1.0, deadline=1.5)
    deliver(a, b, 11.4)  # Unix time 1001.4 on B: still in time
    assert b.metrics["grid.writes_refused_deadline"] == 0
    a.put(key, b"v3", 1.0, deadline=1.5)
    deliver(a, b, 11.5)  # Unix time 1001.5: too late
    assert b.metrics["grid.writes_refused_deadline"] == 1
