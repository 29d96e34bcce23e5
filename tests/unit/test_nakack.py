"""NAKACK: FIFO delivery, gap detection and retransmission, stability GC, the lost-last-message fix."""

from __future__ import annotations

from groupcluster.core import protocol_ids
from groupcluster.core.digest import Digest
from groupcluster.core.events import FlushTarget, GetDigest, MergeDigest, SetDigest, Stability
from groupcluster.core.message import NO_RELIABILITY, Message
from groupcluster.protocols import nakack as _nakack  # noqa: F401
from groupcluster.protocols.nakack import MSG, XMIT_GONE, XMIT_REQ, XMIT_RSP, NakAckHeader

from .harness import ME, PEERS, LayerHarness, sent_with

P1, P2 = PEERS[0], PEERS[1]
PID = protocol_ids.NAKACK


def mcast(seqno: int, payload: bytes | None = None) -> Message:
    return Message(None, payload or f"m{seqno}".encode(), headers={PID: NakAckHeader(MSG, seqno)})


def make() -> LayerHarness:
    h = LayerHarness([{"layer": "nakack", "xmit_interval": "100ms"}])
    h.install_view([ME, P1, P2])
    h.take_sent()
    return h


def payloads(msgs: list[Message]) -> list[bytes]:
    return [m.payload for m in msgs]


def test_in_order_and_out_of_order_delivery_is_fifo() -> None:
    h = make()
    h.receive(P1, [mcast(1), mcast(3)])
    assert payloads(h.take_delivered()) == [b"m1"]
    h.receive(P1, [mcast(2), mcast(4)])
    assert payloads(h.take_delivered()) == [b"m2", b"m3", b"m4"]


def test_duplicates_are_dropped_and_counted() -> None:
    h = make()
    h.receive(P1, [mcast(1), mcast(1)])
    h.receive(P1, [mcast(1), mcast(3), mcast(3)])
    assert payloads(h.take_delivered()) == [b"m1"]
    assert h.metric("nakack.duplicates") == 3


def test_messages_from_senders_without_a_window_are_kept_until_their_window_exists() -> None:
    """A joiner gets multicasts from members that installed the new view before the joiner did."""
    h = make()
    stranger = PEERS[5]
    h.receive(stranger, [mcast(2), mcast(1)])
    assert h.take_delivered() == []
    h.install_view([ME, P1, P2, stranger], seq=2)
    assert payloads(h.take_delivered()) == [b"m1", b"m2"]
    assert h.metric("nakack.strangers_replayed") == 2


def test_kept_stranger_messages_are_bounded() -> None:
    h = LayerHarness([{"layer": "nakack", "max_stranger_messages": 3}])
    h.install_view([ME, P1])
    h.receive(PEERS[5], [mcast(i) for i in range(1, 6)])
    assert h.layer("nakack").stranger_count <= 3
    assert h.metric("nakack.dropped_non_member") >= 2


def test_persistent_gap_is_requested_from_the_sender_and_filled_by_retransmission() -> None:
    h = make()
    h.receive(P1, [mcast(1), mcast(4)])
    h.take_delivered()
    h.advance(0.1)  # first tick: gap seen, not yet requested (it may be reordering)
    assert sent_with(h.take_sent(), PID) == []
    h.advance(0.1)
    requests = [(ep, hdr) for ep, hdr in sent_with(h.take_sent(), PID) if hdr.kind == XMIT_REQ]
    assert requests and requests[0][0] == P1.endpoint
    assert requests[0][1].sender == P1 and requests[0][1].ranges == ((2, 3),)
    # The retransmission arrives as a unicast XMIT_RSP with the original sender in the header.
    rsp = Message(ME, b"m2", flags=NO_RELIABILITY, headers={PID: NakAckHeader(XMIT_RSP, 2, P1)})
    rsp3 = Message(ME, b"m3", flags=NO_RELIABILITY, headers={PID: NakAckHeader(XMIT_RSP, 3, P1)})
    h.receive(P2, [rsp, rsp3])  # served by anyone: the header names the original sender
    got = h.take_delivered()
    assert payloads(got) == [b"m2", b"m3", b"m4"]
    assert all(m.src == P1 and m.dest is None and not m.flags & NO_RELIABILITY for m in got)


def test_sender_serves_retransmission_requests_with_original_payload() -> None:
    h = make()
    for i in range(3):
        h.send(f"own{i}".encode())
    h.take_sent()
    req = Message(ME, flags=NO_RELIABILITY, headers={PID: NakAckHeader(XMIT_REQ, sender=ME, ranges=((2, 3),))})
    h.receive(P1, [req])
    rsps = [(ep, m) for ep, m in h.take_sent() if PID in m.headers and m.headers[PID].kind == XMIT_RSP]
    assert [(ep, m.payload, m.headers[PID].seqno) for ep, m in rsps] == [
        (P1.endpoint, b"own1", 2),
        (P1.endpoint, b"own2", 3),
    ]


def test_stability_collects_sent_messages_and_answers_gone_for_them() -> None:
    h = make()
    for i in range(4):
        h.send(f"own{i}".encode())
    layer = h.layer("nakack")
    assert len(layer.sent) == 4
    h.control(Stability(None, Digest({ME: (3, 4), P1: (0, 0), P2: (0, 0)})))
    assert sorted(layer.sent) == [4]
    h.take_sent()
    req = Message(ME, flags=NO_RELIABILITY, headers={PID: NakAckHeader(XMIT_REQ, sender=ME, ranges=((1, 4),))})
    h.receive(P1, [req])
    kinds = [hdr.kind for _, hdr in sent_with(h.take_sent(), PID)]
    assert XMIT_RSP in kinds and XMIT_GONE in kinds


def test_gone_is_not_said_to_a_requester_outside_our_view() -> None:
    """Sim seed 246 (vsync): an excluded member, alone, saw its messages stable in its singleton view and told
    a member of its old view "gone"; that member skipped messages the rest of its view had delivered, and the
    flush could no longer fetch them for it. Only members of our view may be told to skip."""
    h = make()
    for i in range(3):
        h.send(f"own{i}".encode())
    h.install_view([ME])  # excluded: we carry on alone, and everything we sent is stable here
    h.control(Stability(None, Digest({ME: (3, 3)})))
    h.take_sent()
    req = Message(ME, flags=NO_RELIABILITY, headers={PID: NakAckHeader(XMIT_REQ, sender=ME, ranges=((1, 3),))})
    h.receive(P1, [req])
    assert [hdr.kind for _, hdr in sent_with(h.take_sent(), PID)] == []
    assert h.layer("nakack").ctx.metrics["nakack.xmit_gone_withheld"] == 1


def test_gone_notice_lets_a_late_member_skip_what_it_can_never_get() -> None:
    h = make()
    h.receive(P1, [mcast(5)])
    assert h.take_delivered() == []
    gone = Message(ME, flags=NO_RELIABILITY, headers={PID: NakAckHeader(XMIT_GONE, 4, P1)})
    h.receive(P1, [gone])
    assert payloads(h.take_delivered()) == [b"m5"]


def test_lost_last_message_is_found_through_the_stability_digest() -> None:
    """Seed 002: P1's last message never reached us; only the stability vector reveals it."""
    h = make()
    h.receive(P1, [mcast(1), mcast(2)])
    h.take_delivered()
    h.control(Stability(None, Digest({ME: (0, 0), P1: (2, 3), P2: (0, 0)})))
    h.advance(0.25)
    requests = [hdr for _, hdr in sent_with(h.take_sent(), PID) if hdr.kind == XMIT_REQ]
    assert requests and requests[-1].ranges == ((3, 3),)


def test_digest_reports_own_sent_seqno_and_set_digest_sets_start_points() -> None:
    h = make()
    h.send(b"a")
    h.send(b"b")
    assert payloads(h.take_delivered()) == [b"a", b"b"]  # own multicasts loop back
    digest = h.control(GetDigest())
    assert digest[ME] == (2, 2)
    h.control(SetDigest(Digest({ME: (2, 2), P1: (10, 10), P2: (0, 0)})))
    h.receive(P1, [mcast(11)])
    assert payloads(h.take_delivered()) == [b"m11"]
    h.receive(P1, [mcast(9)])  # older than the start point: not ours to deliver
    assert h.take_delivered() == []


def test_malformed_nakack_header_drops_the_frame_without_crashing() -> None:
    from groupcluster.core.wire import encode_frame

    h = make()
    bad = encode_frame(h.cluster, P1, [[None, 0, [PID, [0, -5]], b"x"]])
    h.receive_raw(bad)
    assert h.take_delivered() == []
    assert h.metric("transport.bad_frames") == 1
    h.receive(P1, [mcast(1)])
    assert payloads(h.take_delivered()) == [b"m1"]


def test_a_member_that_comes_back_is_not_redelivered_what_we_already_delivered() -> None:
    """Simulator seed 5504: a merge digest started a returning member's window below what we had delivered."""
    h = make()
    h.receive(P1, [mcast(1), mcast(2), mcast(3)])
    assert payloads(h.take_delivered()) == [b"m1", b"m2", b"m3"]
    h.install_view([ME, P2], seq=2)  # P1 excluded
    h.control(MergeDigest(Digest({P1: (1, 1)})))  # its subgroup had delivered only up to 1
    h.install_view([ME, P2, P1], seq=3)
    h.receive(P1, [mcast(2), mcast(3), mcast(4)])
    assert payloads(h.take_delivered()) == [b"m4"]


def test_a_flushed_merge_cut_moves_a_lagging_window_up_and_an_unflushed_one_keeps_it() -> None:
    """Simulator seed 4100000 (vsync): a member listed in two subgroups (its JOIN_REQ reached both
    coordinators) sent 1..3 in the other subgroup's view; our window for it stayed at its join point, and the
    next flush fetched those messages for us and delivered them in the merged view."""
    flushed = make()
    flushed.receive(P1, [mcast(5)])  # sent in the merged view, overtook the view
    flushed.control(MergeDigest(Digest({P1: (3, 3), P2: (0, 0)}), cut=True))
    assert flushed.control(GetDigest())[P1] == (3, 5)
    assert payloads(flushed.take_delivered()) == []
    flushed.receive(P1, [mcast(2), mcast(4)])
    assert payloads(flushed.take_delivered()) == [b"m4", b"m5"]
    assert flushed.metric("nakack.merge_windows_raised") == 1

    # Without a flush the cut is only what the subgroup coordinators had delivered: we fetch the rest.
    plain = make()
    plain.control(MergeDigest(Digest({P1: (3, 3)})))
    plain.receive(P1, [mcast(1), mcast(2), mcast(3)])
    assert payloads(plain.take_delivered()) == [b"m1", b"m2", b"m3"]


def test_a_member_that_comes_back_starts_where_the_digest_says_and_skips_what_we_had() -> None:
    """Our counters for a returning member agree with the other members' (FLUSH compares them), while what we
    delivered of it in an earlier view is passed over, in order, and never delivered twice."""
    h = make()
    h.receive(P1, [mcast(1), mcast(2), mcast(3)])
    assert payloads(h.take_delivered()) == [b"m1", b"m2", b"m3"]
    h.install_view([ME, P2], seq=2)  # P1 excluded
    h.control(MergeDigest(Digest({P1: (1, 1)})))  # its subgroup had delivered only up to 1
    h.install_view([ME, P2, P1], seq=3)
    digest = h.control(GetDigest())
    assert digest[P1] == (1, 1)
    h.receive(P1, [mcast(4), mcast(3)])
    assert payloads(h.take_delivered()) == []  # 4 waits for 2, which we had but is still part of the stream
    h.receive(P1, [mcast(2)])
    assert payloads(h.take_delivered()) == [b"m4"]
    assert h.control(GetDigest())[P1] == (4, 4)


def test_a_flush_holder_relays_gone_for_what_it_passed_over_and_the_requester_passes_over_it_too() -> None:
    """Simulator seed 496794000248 (vsync): P1 (in its own view too, with us but not the coordinator) said
    "gone up to 4" to us for messages stable in its view, so our counter for it read 4 while we held none of
    them. FLUSH named us the holder of P1's 1..4 for P2; we could not retransmit them and P1 would not answer
    P2, so every flush round failed on P2's own target and the group stayed blocked for good."""
    holder = LayerHarness([{"layer": "nakack", "xmit_interval": "100ms", "retain_delivered": True}])
    holder.install_view([ME, P1, P2])
    holder.receive(P1, [mcast(1), mcast(5)])
    holder.receive(P1, [Message(ME, flags=NO_RELIABILITY, headers={PID: NakAckHeader(XMIT_GONE, 4, P1)})])
    assert payloads(holder.take_delivered()) == [b"m1", b"m5"]
    holder.take_sent()

    def ask(lo: int) -> list[tuple[tuple[str, int], int, int]]:
        req = Message(ME, flags=NO_RELIABILITY, headers={PID: NakAckHeader(XMIT_REQ, sender=P1, ranges=((lo, 5),))})
        holder.receive(P2, [req])
        return [(ep, hdr.kind, hdr.seqno) for ep, hdr in sent_with(holder.take_sent(), PID) if hdr.sender == P1]

    # What we delivered is retransmitted first; only a requester that has it is told the part after it is gone.
    assert ask(1) == [(P2.endpoint, XMIT_RSP, 1), (P2.endpoint, XMIT_RSP, 5)]
    assert ask(2) == [(P2.endpoint, XMIT_GONE, 4), (P2.endpoint, XMIT_RSP, 5)]
    assert holder.metric("nakack.xmit_gone_relayed") == 1

    # The requester, as P2: a "gone" from anyone but the sender is ignored, but from the holder its flush named.
    req_h = make()
    relayed = Message(ME, flags=NO_RELIABILITY, headers={PID: NakAckHeader(XMIT_GONE, 4, P1)})
    req_h.receive(P2, [relayed])
    assert req_h.control(GetDigest())[P1] == (0, 0)
    assert req_h.metric("nakack.xmit_gone_ignored") == 1
    req_h.control(FlushTarget(Digest({P1: (3, 3)}), ((P1, P2),)))
    req_h.advance(0.1)
    req_h.advance(0.1)
    requests = [(ep, hdr) for ep, hdr in sent_with(req_h.take_sent(), PID) if hdr.kind == XMIT_REQ]
    assert requests and requests[-1][0] == P2.endpoint and requests[-1][1].ranges == ((1, 3),)
    req_h.receive(P2, [relayed])
    # Passed over up to the flush target only: the holder vouches for the flushed part of the stream.
    assert req_h.control(GetDigest())[P1] == (3, 3)
    assert req_h.take_delivered() == []
