"""Operation timers of grid/node.py kept as runs: one heap entry for the operations of a batch.

A batch's operations are sent in one step with consecutive ids and share one resend time, so the node keeps
one timer entry for all of them (``GridNode._op_timers``). These tests check that an operation in such a run
is still resent on time, and only it, whichever of its neighbours were answered, and that a finished run
leaves no timer behind. Two real nodes; the answers are delivered (or withheld) by hand.
"""

from __future__ import annotations

from groupcluster.core.address import Address
from groupcluster.grid.messages import OK, PUT, Command, CommandBatch, ResponseBatch, decode_payload, encode_payload
from groupcluster.grid.node import GridConfig, GridNode

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
                b.add(m.op_id, m.attempt, m.kind, m.key, m.value)
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
    assert len(a._op_timers) == 1
    a.tick(2.0)
    (again,) = commands(a)
    assert list(again.op_ids) == ids[2:4] and list(again.attempts) == [2, 2]
    assert list(again.keys) == keys[2:4]
    answer(a, again, [0, 1], 2.1)
    assert [r.ok for r in a.take_results()] == [True, True]
    assert a.next_deadline() is None and a._op_timers == []


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
