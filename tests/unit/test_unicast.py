"""UNICAST: reliable FIFO unicast, cumulative acks per step, retransmission until acknowledged."""

from __future__ import annotations

from groupcluster.core import protocol_ids
from groupcluster.core.message import Message
from groupcluster.protocols import unicast as _unicast  # noqa: F401
from groupcluster.protocols.unicast import ACK, DATA, UnicastHeader

from .harness import ME, PEERS, LayerHarness, sent_with

P1 = PEERS[0]
PID = protocol_ids.UNICAST


def data(seqno: int, conn: int = 7, low: int = 1) -> Message:
    return Message(ME, f"u{seqno}".encode(), headers={PID: UnicastHeader(DATA, conn, seqno, low)})


def make() -> LayerHarness:
    h = LayerHarness([{"layer": "unicast", "xmit_interval": "100ms"}])
    h.install_view([ME, P1])
    h.take_sent()
    return h


def test_fifo_delivery_and_one_cumulative_ack_per_step() -> None:
    h = make()
    h.receive(P1, [data(2), data(1), data(3)])
    assert [m.payload for m in h.take_delivered()] == [b"u1", b"u2", b"u3"]
    acks = [hdr for _, hdr in sent_with(h.take_sent(), PID) if hdr.kind == ACK]
    assert len(acks) == 1 and acks[0].seqno == 3 and acks[0].conn_id == 7


def test_duplicates_are_dropped_but_reacknowledged() -> None:
    h = make()
    h.receive(P1, [data(1)])
    h.take_sent()
    h.receive(P1, [data(1)])
    assert [m.payload for m in h.take_delivered()] == [b"u1"]
    assert h.metric("unicast.duplicates") == 1
    assert [hdr.kind for _, hdr in sent_with(h.take_sent(), PID)] == [ACK]


def test_new_connection_starts_at_the_senders_lowest_unacknowledged_seqno() -> None:
    h = make()
    h.receive(P1, [data(41, conn=9, low=40), data(40, conn=9, low=40)])
    assert [m.payload for m in h.take_delivered()] == [b"u40", b"u41"]


def test_unacknowledged_messages_are_resent_until_acked() -> None:
    h = make()
    h.send(b"hello", dest=P1)
    first = sent_with(h.take_sent(), PID)
    assert [(ep, hdr.kind, hdr.seqno) for ep, hdr in first] == [(P1.endpoint, DATA, 1)]
    conn = first[0][1].conn_id
    h.advance(0.1)
    assert [hdr.seqno for _, hdr in sent_with(h.take_sent(), PID)] == [1]
    h.receive(P1, [Message(ME, headers={PID: UnicastHeader(ACK, conn, 1)})])
    h.advance(0.3)
    assert sent_with(h.take_sent(), PID) == []


def test_connection_state_of_a_member_that_left_the_view_is_dropped() -> None:
    h = make()
    h.send(b"x", dest=P1)
    h.install_view([ME], seq=2)
    assert P1 not in h.layer("unicast").send_conns


def test_a_late_retransmission_of_an_older_connection_is_not_redelivered() -> None:
    h = make()
    h.receive(P1, [data(1, conn=3)])
    h.receive(P1, [data(1, conn=4)])  # P1 started a new connection (e.g. after a view change)
    assert [m.payload for m in h.take_delivered()] == [b"u1", b"u1"]
    h.receive(P1, [data(2, conn=3, low=1)])  # stale, from the old connection
    h.receive(P1, [data(2, conn=4)])
    assert [m.payload for m in h.take_delivered()] == [b"u2"]
    assert h.metric("unicast.stale_connection") == 1


def test_receive_side_remembers_a_departed_member_so_old_messages_stay_delivered() -> None:
    h = make()
    h.receive(P1, [data(1, conn=3), data(2, conn=3)])
    h.take_delivered()
    h.install_view([ME], seq=2)
    h.receive(P1, [data(2, conn=3, low=1)])  # late duplicate after P1 left our view
    assert h.take_delivered() == []


def test_after_a_partial_ack_headers_and_retransmissions_start_at_the_lowest_unacknowledged() -> None:
    h = make()
    for i in range(5):
        h.send(f"m{i}".encode(), dest=P1)
    sent = sent_with(h.take_sent(), PID)
    assert [(hdr.seqno, hdr.low) for _, hdr in sent] == [(1, 1), (2, 1), (3, 1), (4, 1), (5, 1)]
    conn = sent[0][1].conn_id
    h.receive(P1, [Message(ME, headers={PID: UnicastHeader(ACK, conn, 3)})])  # 1..3 arrived
    h.send(b"m5", dest=P1)
    assert [(hdr.seqno, hdr.low) for _, hdr in sent_with(h.take_sent(), PID)] == [(6, 4)]
    h.advance(0.1)  # resent: 4, 5, 6, each with the current low
    assert [(hdr.seqno, hdr.low) for _, hdr in sent_with(h.take_sent(), PID)] == [(4, 4), (5, 4), (6, 4)]
    # A stale ack changes nothing; an ack beyond what was sent clears everything.
    h.receive(P1, [Message(ME, headers={PID: UnicastHeader(ACK, conn, 2)})])
    h.advance(0.1)
    assert [hdr.seqno for _, hdr in sent_with(h.take_sent(), PID)] == [4, 5, 6]
    h.receive(P1, [Message(ME, headers={PID: UnicastHeader(ACK, conn, 99)})])
    h.advance(0.1)
    assert sent_with(h.take_sent(), PID) == []
    h.send(b"m6", dest=P1)
    assert [(hdr.seqno, hdr.low) for _, hdr in sent_with(h.take_sent(), PID)] == [(7, 7)]
