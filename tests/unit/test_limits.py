"""Bounded resources: what a peer can make a member allocate (or loop over), each with its limit, the drop and
the counter. The state-transfer limits are in test_state_transfer.py (held messages and bytes, announced state
size), flow control in test_flow.py, the replay state of authentication in test_auth.py."""

from __future__ import annotations

from groupcluster.core import protocol_ids
from groupcluster.core.address import Address
from groupcluster.core.digest import Digest
from groupcluster.core.events import Stability
from groupcluster.core.message import Message
from groupcluster.core.view import ViewId
from groupcluster.core.wire import encode_messages
from groupcluster.protocols import frag as frag_module
from groupcluster.protocols.frag import MAX_FRAGMENTS, FragHeader
from groupcluster.protocols.nakack import MSG, XMIT_GONE, XMIT_REQ, XMIT_RSP, NakAckHeader
from groupcluster.protocols.unicast import DATA, UnicastHeader

from .harness import CLUSTER, ME, PEERS, LayerHarness, sent_with

P1, P2 = PEERS[0], PEERS[1]
HUGE = 2**62


# -- frames ------------------------------------------------------------------------------------------------
def test_frames_above_max_receive_frame_and_too_many_messages_are_dropped_and_counted() -> None:
    h = LayerHarness([], seed=1)
    h.stack.layers[0].limits = type(h.stack.layers[0].limits)(max_frame_bytes=2048, max_messages=10)
    h.receive_raw(encode_messages(CLUSTER, P1, [Message(None, b"x" * 4096)]))
    h.receive_raw(encode_messages(CLUSTER, P1, [Message(None, b"x")] * 11))
    assert h.metric("transport.bad_frames") == 2
    assert h.take_delivered() == []
    h.receive(P1, [Message(None, b"fits")])
    assert [m.payload for m in h.take_delivered()] == [b"fits"]


def test_max_receive_frame_is_a_transport_parameter() -> None:
    h = LayerHarness([{"layer": "transport", "max_receive_frame": "1KiB", "max_messages_per_frame": 5}])
    h.receive_raw(encode_messages(CLUSTER, P1, [Message(None, b"x" * 2000)]))
    h.receive_raw(encode_messages(CLUSTER, P1, [Message(None, b"")] * 6))
    assert h.metric("transport.bad_frames") == 2


# -- fragments ---------------------------------------------------------------------------------------------
def fragment(frag_id: int, index: int, count: int, payload: bytes = b"f") -> Message:
    return Message(None, payload, headers={protocol_ids.FRAG: FragHeader(frag_id, index, count)})


def test_bogus_fragments_announcing_many_pieces_are_bounded_by_max_pending() -> None:
    # Each first fragment of a message announced as 65536 pieces costs a 65536-slot list: counted.
    h = LayerHarness([{"layer": "frag", "max_pending": "4MiB"}])
    h.install_view([ME, P1])
    layer = h.layer("frag")
    for frag_id in range(300):
        h.receive(P1, [fragment(frag_id, 0, MAX_FRAGMENTS)])
        assert layer.pending_bytes + layer.overhead_bytes <= 4 * 1024 * 1024
    assert len(layer._pending) <= 8  # 4 MiB / (65536 slots * 8 bytes)
    assert h.metric("frag.dropped_partial") >= 292
    assert h.take_delivered() == []
    # A real message still gets through.
    h.receive(P1, [fragment(1000, 0, 2, b"ab"), fragment(1000, 1, 2, b"cd")])
    assert [m.payload for m in h.take_delivered()] == [b"abcd"]


def test_fragment_bookkeeping_of_many_senders_is_bounded() -> None:
    h = LayerHarness([{"layer": "frag"}])
    layer = h.layer("frag")
    n = frag_module.MAX_SENDERS + 300
    for i in range(n):
        sender = Address("10.9.0.1", 1 + i % 60000, 1 + i)
        h.receive(sender, [fragment(0, 0, 2)])
        h.receive(sender, [fragment(0, 1, 2)])  # completes: only the per-sender bookkeeping stays
    assert len(layer._senders) <= frag_module.MAX_SENDERS
    assert h.metric("frag.forgot_sender") >= 300
    assert h.metric("frag.reassembled") == n


# -- NAKACK --------------------------------------------------------------------------------------------------
def nakack(**params: object) -> LayerHarness:
    h = LayerHarness([{"layer": "nakack", "xmit_interval": "100ms", **params}])
    h.install_view([ME, P1, P2])
    h.take_sent()
    return h


def mcast(seqno: int, payload: bytes = b"m") -> Message:
    return Message(None, payload, headers={protocol_ids.NAKACK: NakAckHeader(MSG, seqno)})


def test_out_of_order_buffer_is_bounded_in_bytes_and_messages() -> None:
    h = nakack(max_buffered_bytes="100KiB", max_buffered=50)
    # Seqno 1 never arrives; 2.. each 10 KiB: at most ~100 KiB (and 50 messages) are held.
    for s in range(2, 40):
        h.receive(P1, [mcast(s, b"x" * 10240)])
    w = h.layer("nakack").windows[P1]
    assert w.buffered_bytes <= 110 * 1024 and len(w.buffer) <= 11
    assert h.metric("nakack.dropped_buffer_full") >= 27
    for s in range(40, 200):
        h.receive(P1, [mcast(s, b"")])
    assert len(h.layer("nakack").windows[P1].buffer) <= 50
    # Filling the gap delivers what was kept (2-12); the dropped ones (13-) are requested again.
    kept = len(w.buffer)
    h.receive(P1, [mcast(1)])
    assert len(h.take_delivered()) == 1 + kept
    assert w.delivered == kept + 1 and w.buffered_bytes == 0 and not w.buffer
    h.advance(0.25)
    requests = [hdr for _, hdr in sent_with(h.take_sent(), protocol_ids.NAKACK) if hdr.kind == XMIT_REQ]
    assert requests and requests[0].ranges[0][0] == kept + 2


def test_xmit_gone_with_a_huge_seqno_does_no_unbounded_work_and_only_the_sender_may_say_it() -> None:
    h = nakack()
    h.receive(P1, [mcast(5)])  # buffered: 1-4 missing
    # From someone else about P1: ignored (only a sender collects its own messages).
    gone = Message(ME, b"", headers={protocol_ids.NAKACK: NakAckHeader(XMIT_GONE, HUGE, P1)})
    h.receive(P2, [gone])
    assert h.metric("nakack.xmit_gone_ignored") == 1
    assert h.layer("nakack").windows[P1].delivered == 0
    # From P1 itself: the window skips (a range of 2**62 seqnos, handled without walking it).
    h.receive(P1, [Message(ME, b"", headers={protocol_ids.NAKACK: NakAckHeader(XMIT_GONE, HUGE, P1)})])
    w = h.layer("nakack").windows[P1]
    assert w.delivered == HUGE and not w.buffer and w.buffered_bytes == 0


def test_stability_beyond_what_we_sent_is_capped() -> None:
    h = nakack()
    for i in range(5):
        h.send(f"m{i}".encode())
    layer = h.layer("nakack")
    assert len(layer.sent) == 5
    h.control(Stability(ViewId(1, ME), Digest({ME: (HUGE, HUGE), P1: (0, 0), P2: (0, 0)})))
    assert layer.gone_upto == 5 and layer.sent == {}


def test_a_retransmission_request_is_served_up_to_max_xmit_batch() -> None:
    h = nakack(max_xmit_batch=16)
    h.send_many([Message(None, f"m{i}".encode()) for i in range(100)])
    h.take_sent()
    ranges = tuple((1, HUGE) for _ in range(256))
    h.receive(P1, [Message(ME, b"", headers={protocol_ids.NAKACK: NakAckHeader(XMIT_REQ, sender=ME, ranges=ranges)})])
    rsps = [hdr for _, hdr in sent_with(h.take_sent(), protocol_ids.NAKACK) if hdr.kind == XMIT_RSP]
    assert len(rsps) == 16


def test_kept_stranger_multicasts_are_bounded() -> None:
    h = nakack(max_stranger_messages=100)
    for i in range(50):
        h.receive(Address("10.9.9.9", 1000 + i, 7), [mcast(s) for s in range(1, 5)])
    assert h.layer("nakack").stranger_count <= 100
    assert h.metric("nakack.dropped_non_member") >= 100


# -- UNICAST -------------------------------------------------------------------------------------------------
def udata(seqno: int, payload: bytes = b"u", conn: int = 7, low: int = 1) -> Message:
    return Message(ME, payload, headers={protocol_ids.UNICAST: UnicastHeader(DATA, conn, seqno, low)})


def unicast(**params: object) -> LayerHarness:
    h = LayerHarness([{"layer": "unicast", "xmit_interval": "100ms", **params}])
    h.install_view([ME, P1])
    h.take_sent()
    return h


def test_unicast_out_of_order_buffer_is_bounded() -> None:
    h = unicast(max_buffered=20, max_buffered_bytes="64KiB")
    for s in range(2, 200):
        h.receive(P1, [udata(s, b"y" * 1024)])
    conn = h.layer("unicast").recv_conns[P1]
    assert len(conn.buffer) <= 20 and conn.buffered_bytes <= 65 * 1024
    assert h.metric("unicast.dropped_buffer_full") >= 178
    h.receive(P1, [udata(1)])
    assert len(h.take_delivered()) == 1 + 20  # the gap filled: what was kept goes up, in order
    assert h.layer("unicast").recv_conns[P1].buffered_bytes == 0


def test_unicast_receive_state_of_many_strangers_is_bounded() -> None:
    from groupcluster.protocols import unicast as unicast_module

    h = unicast()
    n = unicast_module._MAX_RECV_CONNS + 200
    for i in range(n):
        h.receive(Address("10.8.0.1", 1 + i % 60000, 1 + i), [udata(2)])  # buffered, never completed
    assert len(h.layer("unicast").recv_conns) <= unicast_module._MAX_RECV_CONNS
    assert h.metric("unicast.dropped_connections") >= 200
    # The member in the view keeps its connection.
    h.receive(P1, [udata(1)])
    assert [m.payload for m in h.take_delivered()] == [b"u"]
