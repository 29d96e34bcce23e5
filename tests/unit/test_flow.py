"""Flow control: credits per receiver, queueing in order, replenishment, backpressure, membership, bad input."""

from __future__ import annotations

import msgpack
import pytest
from groupcluster.core import protocol_ids
from groupcluster.core.address import Address
from groupcluster.core.errors import ConfigError, WireError
from groupcluster.core.events import Backpressure
from groupcluster.core.message import NO_FLOW_CONTROL, Message
from groupcluster.protocols.flow import CREDIT_REQUEST, MULTICAST, REPLENISH, UNICAST, FlowHeader

from .harness import ME, PEERS, LayerHarness, sent_with

FLOW = protocol_ids.FLOW
P1, P2, P3 = PEERS[:3]


def make(**params) -> LayerHarness:
    cfg = {"layer": "flow", "max_credits": 10_000, "min_threshold": 0.5, "max_queued": 30_000, **params}
    h = LayerHarness([cfg])
    h.install_view([ME, P1, P2])
    h.take_events()
    return h


def app_sent(h: LayerHarness, endpoint) -> list[bytes]:
    """Payloads of application messages (no flow header) sent to ``endpoint``."""
    return [m.payload for ep, m in h.take_sent() if ep == endpoint and FLOW not in m.headers]


def replenish(pool: int, credits: int) -> Message:
    return Message(ME, flags=NO_FLOW_CONTROL, headers={FLOW: FlowHeader(REPLENISH, pool, credits)})


def payload(tag: str, size: int) -> bytes:
    return tag.encode() + b"." * (size - len(tag))


def test_multicasts_within_credit_go_out_then_queue():
    h = make()
    for i in range(5):
        h.send(payload(f"m{i}", 2000))
    assert len(app_sent(h, P1.endpoint)) == 5
    h.send(payload("m5", 2000))
    assert app_sent(h, P1.endpoint) == []
    assert h.layer("flow").queued_bytes == 2000
    assert h.metric("flow.queued") == 1


def test_credit_from_every_member_is_needed_for_a_multicast():
    h = make()
    h.send(payload("a", 10_000))
    h.send(payload("b", 1000))
    h.take_sent()
    h.receive(P1, [replenish(MULTICAST, 5000)])
    assert app_sent(h, P1.endpoint) == []
    h.receive(P2, [replenish(MULTICAST, 5000)])
    sent = h.take_sent()
    assert [m.payload[:1] for ep, m in sent if ep == P1.endpoint] == [b"b"]
    assert [m.payload[:1] for ep, m in sent if ep == P2.endpoint] == [b"b"]
    assert h.layer("flow").queued_bytes == 0


def test_queued_messages_keep_their_order_and_later_ones_wait_behind():
    h = make()
    h.send(payload("fill", 9000))
    h.send(payload("q1", 3000))  # queued
    h.send(payload("q2", 500))  # fits by credit, but must not overtake q1
    assert app_sent(h, P1.endpoint)[0][:4] == b"fill"
    for p in (P1, P2):
        h.receive(p, [replenish(MULTICAST, 10_000)])
    assert [x.rstrip(b".") for x in app_sent(h, P1.endpoint)] == [b"q1", b"q2"]


def test_unicast_pool_is_separate_and_other_destinations_pass():
    h = make()
    h.send(payload("m", 10_000))
    h.send(payload("mq", 100))  # multicast blocked
    h.send(payload("u1", 6000), dest=P1)
    h.send(payload("u2", 6000), dest=P1)  # blocked on P1's unicast credit
    h.send(payload("u3", 6000), dest=P2)  # another destination passes
    sent = h.take_sent()
    to_p1 = [m.payload.rstrip(b".") for ep, m in sent if ep == P1.endpoint and m.dest == P1]
    to_p2 = [m.payload.rstrip(b".") for ep, m in sent if ep == P2.endpoint and m.dest == P2]
    assert to_p1 == [b"u1"] and to_p2 == [b"u3"]
    h.receive(P1, [replenish(UNICAST, 6000)])
    sent = h.take_sent()
    assert [m.payload.rstrip(b".") for ep, m in sent if m.dest == P1] == [b"u2"]
    assert [m for ep, m in sent if m.dest is None] == []  # the multicast still waits


def test_no_flow_control_messages_bypass_a_blocked_queue():
    h = make()
    h.send(payload("m", 10_000))
    h.send(payload("q", 100))
    h.take_sent()
    h.send(b"ctl", flags=NO_FLOW_CONTROL)
    assert app_sent(h, P1.endpoint) == [b"ctl"]


def test_unicast_to_a_non_member_or_to_self_is_not_limited():
    h = make()
    stranger = Address("127.0.0.9", 9, 9)
    for _ in range(5):
        h.send(payload("s", 9000), dest=stranger)
    assert len(app_sent(h, stranger.endpoint)) == 5
    for _ in range(3):
        h.send(payload("me", 9000), dest=ME)
    assert len(h.take_delivered()) == 3


def test_message_larger_than_max_credits_goes_out_with_full_credit():
    h = make()
    h.send(payload("huge", 25_000))
    assert len(app_sent(h, P1.endpoint)) == 1
    h.send(payload("next", 10))
    assert app_sent(h, P1.endpoint) == []  # credit is now negative until replenished


def test_receiver_replenishes_after_threshold_per_pool():
    h = make()  # threshold = 10_000 * 0.5
    h.receive(P1, [Message(None, payload("a", 3000)), Message(None, payload("b", 1000))])
    assert sent_with(h.take_sent(), FLOW) == []
    h.receive(P1, [Message(None, payload("c", 1500))])
    [(ep, hdr)] = sent_with(h.take_sent(), FLOW)
    assert ep == P1.endpoint
    assert (hdr.kind, hdr.pool, hdr.credits) == (REPLENISH, MULTICAST, 5500)
    h.receive(P1, [Message(ME, payload("u", 5000))])
    [(ep, hdr)] = sent_with(h.take_sent(), FLOW)
    assert (hdr.kind, hdr.pool, hdr.credits) == (REPLENISH, UNICAST, 5000)
    assert len(h.take_delivered()) == 4


def test_replenish_is_unicast_without_flow_control():
    h = make()
    h.receive(P2, [Message(None, payload("x", 6000))])
    [(ep, msg)] = [(ep, m) for ep, m in h.take_sent() if FLOW in m.headers]
    assert ep == P2.endpoint and msg.dest == P2 and msg.flags & NO_FLOW_CONTROL


def test_no_flow_control_traffic_and_own_loopback_are_not_counted():
    h = make()
    h.receive(P1, [Message(None, payload("c", 9000), flags=NO_FLOW_CONTROL)])
    h.send(payload("own", 9000))  # loops back to us
    assert sent_with(h.take_sent(), FLOW) == []
    assert h.metric("flow.replenish_sent") == 0


def test_flow_messages_are_consumed_and_order_of_the_rest_kept():
    h = make()
    h.receive(P1, [Message(None, b"a"), replenish(MULTICAST, 1), Message(None, b"b")])
    assert [m.payload for m in h.take_delivered()] == [b"a", b"b"]


def test_mixed_sender_batch_is_accounted_per_sender():
    h = make()
    flow = h.layer("flow")
    batch = [Message(None, payload("a", 3000), src=P1), Message(None, payload("b", 3000), src=P2)]
    batch += [Message(None, payload("c", 3000), src=P1)]
    flow.up(batch)
    h.fire()
    sent = sent_with(h.take_sent(), FLOW)
    assert sent == [(P1.endpoint, sent[0][1])]
    assert sent[0][1].credits == 6000
    assert flow._mc_received[P2] == 3000


def test_backpressure_on_once_and_off_below_half():
    h = make(max_queued=5000)
    h.send(payload("fill", 10_000))
    for i in range(4):
        h.send(payload(f"q{i}", 2000))
    assert h.take_events(Backpressure) == [Backpressure(True)]
    h.send(payload("more", 2000))
    assert h.take_events(Backpressure) == []
    # 10000 bytes queued; give credit for 8000: 2000 left < 2500 = max_queued / 2.
    for p in (P1, P2):
        h.receive(p, [replenish(MULTICAST, 8000)])
    assert h.layer("flow").queued_bytes == 2000
    assert h.take_events(Backpressure) == [Backpressure(False)]


def test_backpressure_stays_on_until_below_half():
    h = make(max_queued=5000)
    h.send(payload("fill", 10_000))
    for i in range(4):
        h.send(payload(f"q{i}", 2000))
    h.take_events()
    for p in (P1, P2):
        h.receive(p, [replenish(MULTICAST, 4000)])  # 4000 bytes left queued: above 2500
    assert h.layer("flow").queued_bytes == 4000
    assert h.take_events(Backpressure) == []


def test_a_receiver_that_left_the_view_blocks_nobody():
    h = make()
    h.send(payload("fill", 10_000))
    h.send(payload("q", 1000), dest=None)
    h.send(payload("u", 10_000), dest=P2)
    h.send(payload("uq", 10), dest=P2)
    h.take_sent()
    h.receive(P1, [replenish(MULTICAST, 10_000)])
    assert app_sent(h, P1.endpoint) == []  # still waiting for P2
    h.install_view([ME, P1], seq=2)  # P2 crashed and was removed
    sent = h.take_sent()
    assert [m.payload.rstrip(b".") for ep, m in sent if ep == P1.endpoint] == [b"q"]
    assert h.layer("flow").queued_bytes == 0  # the unicast to P2 was handed down too


def test_new_members_start_with_full_credit():
    h = make()
    h.send(payload("fill", 10_000))
    h.install_view([ME, P1, P2, P3], seq=2)
    h.send(payload("q", 10))
    assert app_sent(h, P3.endpoint) == []
    for p in (P1, P2):
        h.receive(p, [replenish(MULTICAST, 10_000)])
    assert [x.rstrip(b".") for x in app_sent(h, P3.endpoint)] == [b"q"]
    h.send(payload("u", 10_000), dest=P3)
    assert len(app_sent(h, P3.endpoint)) == 1


def test_blocked_sender_requests_credits_after_block_timeout():
    h = make(block_timeout="500ms")
    h.send(payload("fill", 10_000))
    h.receive(P1, [replenish(MULTICAST, 10_000)])
    h.send(payload("q", 100))
    h.take_sent()
    h.advance(0.49)
    assert sent_with(h.take_sent(), FLOW) == []
    h.advance(0.02)
    [(ep, hdr)] = sent_with(h.take_sent(), FLOW)
    assert ep == P2.endpoint and (hdr.kind, hdr.pool) == (CREDIT_REQUEST, MULTICAST)
    assert hdr.credits == 10_000
    h.advance(0.5)  # asks again while still blocked
    assert len(sent_with(h.take_sent(), FLOW)) == 1
    h.receive(P2, [replenish(MULTICAST, 10_000)])
    h.take_sent()
    h.advance(2.0)
    assert sent_with(h.take_sent(), FLOW) == []


def test_credit_request_for_unicast_goes_to_the_destination():
    h = make(block_timeout="100ms")
    h.send(payload("u", 10_000), dest=P1)
    h.send(payload("uq", 100), dest=P1)
    h.take_sent()
    h.advance(0.1)
    [(ep, hdr)] = sent_with(h.take_sent(), FLOW)
    assert ep == P1.endpoint and (hdr.kind, hdr.pool) == (CREDIT_REQUEST, UNICAST)


def test_receiver_answers_credit_request_with_what_it_owes_or_a_grant():
    h = make()
    h.receive(P1, [Message(None, payload("a", 1200))])
    h.receive(P1, [Message(ME, flags=NO_FLOW_CONTROL, headers={FLOW: FlowHeader(CREDIT_REQUEST, MULTICAST, 9000)})])
    [(ep, hdr)] = sent_with(h.take_sent(), FLOW)
    assert ep == P1.endpoint and (hdr.kind, hdr.pool, hdr.credits) == (REPLENISH, MULTICAST, 1200)
    # Owes nothing now: the counts drifted apart, so it grants what was asked (at most max_credits).
    h.receive(P1, [Message(ME, flags=NO_FLOW_CONTROL, headers={FLOW: FlowHeader(CREDIT_REQUEST, MULTICAST, 99_999)})])
    [(ep, hdr)] = sent_with(h.take_sent(), FLOW)
    assert (hdr.kind, hdr.credits) == (REPLENISH, 10_000)
    assert h.metric("flow.credits_granted_on_request") == 1


def test_replenish_never_exceeds_max_credits():
    h = make()
    for p in (P1, P2):
        h.receive(p, [replenish(MULTICAST, 1_000_000)])
    h.send(payload("a", 10_000))
    h.send(payload("b", 1))
    assert len(app_sent(h, P1.endpoint)) == 1


def test_replenish_from_a_stranger_is_ignored():
    h = make()
    h.send(payload("fill", 10_000))
    h.send(payload("q", 10))
    h.take_sent()
    h.receive(Address("127.0.0.9", 1, 1), [replenish(MULTICAST, 10_000)])
    h.receive(P1, [replenish(MULTICAST, 10_000)])
    assert app_sent(h, P1.endpoint) == []


def test_before_any_view_nothing_is_limited():
    h = LayerHarness([{"layer": "flow", "max_credits": 1000}])
    for _ in range(10):
        h.send(payload("x", 900))
    assert h.layer("flow").queued_bytes == 0
    assert len(h.take_delivered()) == 10


@pytest.mark.parametrize("bad", [None, [], [0, 0], [2, 0, 1], [0, 2, 1], [0, 0, -1], [0, 0, "1"], [0, 0, 1.5]])
def test_header_from_wire_rejects_malformed(bad):
    with pytest.raises(WireError):
        FlowHeader.from_wire(bad)


def test_header_round_trip():
    hdr = FlowHeader(CREDIT_REQUEST, UNICAST, 123456)
    back = FlowHeader.from_wire(msgpack.unpackb(msgpack.packb(hdr.to_wire())))
    assert (back.kind, back.pool, back.credits) == (CREDIT_REQUEST, UNICAST, 123456)


def test_malformed_header_drops_the_frame_and_is_counted():
    h = make()
    frame = msgpack.packb([1, "test", P1.to_wire(), [[ME.to_wire(), 2, [FLOW, [0, 0, -3]], b""]]])
    h.receive_raw(frame)
    assert h.metric("transport.bad_frames") == 1


@pytest.mark.parametrize(
    ("params", "key"),
    [
        ({"min_threshold": 1.5}, "stack[1] (flow).min_threshold"),
        ({"min_threshold": 0}, "stack[1] (flow).min_threshold"),
        ({"min_threshold": "half"}, "stack[1] (flow).min_threshold"),
        ({"max_credits": "lots"}, "stack[1] (flow).max_credits"),
        ({"max_credits": 0}, "stack[1] (flow).max_credits"),
        ({"max_queued": "-1MiB"}, "stack[1] (flow).max_queued"),
        ({"block_timeout": "0s"}, "stack[1] (flow).block_timeout"),
        ({"credits": 5}, "unknown key 'credits'"),
    ],
)
def test_bad_configuration_names_the_key(params, key):
    with pytest.raises(ConfigError) as err:
        LayerHarness([{"layer": "flow", **params}])
    assert key in str(err.value)
