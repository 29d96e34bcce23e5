"""STATE: header validation, numbering, the donor (cut, chunking, window, waiting for floors, refusals), the
joiner (holding, covered messages, replay in order, stale states, donor failure, buffer bounds, bad chunks).

Two real stacks (transport + state) talk through frames the test moves between them, so the layer's whole
exchange runs as it would on a network; peers that only send multicasts are fed frames directly.
"""

from __future__ import annotations

import msgpack
import pytest
from groupcluster.core import protocol_ids
from groupcluster.core.address import Address
from groupcluster.core.errors import WireError
from groupcluster.core.events import Left, Suspect, ViewChange
from groupcluster.core.message import NO_RELIABILITY, Message
from groupcluster.core.wire import FORMAT_VERSION, decode_frame, encode_messages
from groupcluster.protocols.state_transfer.events import GetState, RequestState, SetState, StateCovered, StateSnapshot
from groupcluster.protocols.state_transfer.wire import (
    ACK,
    CHUNK,
    DATA,
    MAX_CHUNKS,
    NO_STATE_YET,
    REFUSE,
    REQ,
    StateHeader,
)

from .harness import CLUSTER, PEERS, LayerHarness, make_view

PID = protocol_ids.STATE
DONOR = Address("127.0.0.1", 7900, 7)
JOINER = Address("127.0.0.1", 7901, 8)
P1, P2 = PEERS[0], PEERS[1]


def stack(me: Address, **params: object) -> LayerHarness:
    return LayerHarness([{"layer": "state", **params}], me=me)


def mcast(seq: int, payload: bytes | None = None) -> Message:
    return Message(None, payload if payload is not None else f"m{seq}".encode(), headers={PID: StateHeader(DATA, seq)})


def state_sent(h: LayerHarness) -> list[tuple[tuple[str, int], Message, StateHeader]]:
    return [(ep, m, m.headers[PID]) for ep, m in h.take_sent() if PID in m.headers]  # type: ignore[misc]


def move(src: LayerHarness, dst: LayerHarness, *, drop: bool = False) -> int:
    """Hand every frame ``src`` sent to ``dst`` (those addressed to ``dst``'s endpoint); returns how many."""
    n = 0
    for frame in src.take_frames():
        if frame.endpoint == dst.me.endpoint and not drop:
            dst.receive(frame.sender, frame.messages)
            n += 1
    return n


def req_from(tid: int, donor: Address = DONOR, floors: dict[Address, int] | None = None) -> Message:
    """A joiner's request: a multicast marker naming the donor."""
    return Message(None, headers={PID: StateHeader(REQ, tid=tid, donor=donor, vector=floors or {})})


def reqs(h: LayerHarness) -> list[StateHeader]:
    """The requests ``h`` multicast since the last call (one per request, whatever the number of targets)."""
    out: dict[int, StateHeader] = {}
    for _, _, hdr in state_sent(h):
        if hdr.kind == REQ:
            out[hdr.tid] = hdr
    return list(out.values())


def answer_gets(h: LayerHarness, state: bytes) -> list[GetState]:
    gets = h.take_events(GetState)
    for g in gets:
        h.control(StateSnapshot(g.transfer, state))
    return gets


def pair(members: list[Address] | None = None, **params: object) -> tuple[LayerHarness, LayerHarness]:
    """A donor with a view, and a joiner that asked for state and joined that view (its request is out)."""
    members = members or [DONOR, JOINER]
    d = stack(DONOR, **params)
    j = stack(JOINER, **params)
    d.install_view(members)
    d.take_events()
    j.control(RequestState())
    j.install_view(members)
    return d, j


# ---- header ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "hdr",
    [
        StateHeader(DATA, 7),
        StateHeader(REQ, tid=3, donor=P2, vector={P1: 4, P2: 0}),
        StateHeader(CHUNK, tid=3, index=0, count=2, total=10, cut={P1: (9, ((2, 3), (5, 8))), P2: (1, ())}),
        StateHeader(CHUNK, tid=3, index=1, count=2, total=10),
        StateHeader(ACK, tid=3, index=2),
        StateHeader(REFUSE, tid=3, reason="busy"),
    ],
)
def test_headers_survive_the_wire(hdr: StateHeader) -> None:
    data = encode_messages(CLUSTER, P1, [Message(None, b"x", headers={PID: hdr})])
    _, [msg] = decode_frame(data, CLUSTER)
    assert msg.headers[PID] == hdr


@pytest.mark.parametrize(
    ("wire", "error"),
    [
        ([], "state.kind"),
        ([9, 1], "state.kind"),
        ([DATA], "needs 2 fields"),
        ([DATA, 0], "state.seq"),
        ([DATA, -1], "state.seq"),
        ([DATA, "1"], "state.seq"),
        ([REQ, 1, ["h", 1, 1], [[["h", 1, 1], 2], [["h", 1, 1], 3]]], "appears twice"),
        ([REQ, 1, ["h", 1, 1], [[["h", 1, 1]]]], "expected 2 items"),
        ([REQ, -5, ["h", 1, 1], []], "state.tid"),
        ([REQ, 1, None, []], "state.donor"),
        ([REQ, 1, []], "needs 4 fields"),
        ([CHUNK, 1, 2, 2, 10, None], "state.index"),
        ([CHUNK, 1, 0, 0, 10, []], "state.count"),
        ([CHUNK, 1, 0, MAX_CHUNKS + 1, 10, []], "state.count"),
        ([CHUNK, 1, 0, 1, 10, None], "without the cut"),
        ([CHUNK, 1, 1, 2, 10, []], "carries a cut"),
        ([CHUNK, 1, 0, 1, -1, []], "state.total"),
        ([CHUNK, 1, 0, 1, 10, [[["h", 1, 1], 5, [[3, 9]]]]], "gaps\\[0\\].hi"),
        ([CHUNK, 1, 0, 1, 10, [[["h", 1, 1], 9, [[3, 4], [2, 2]]]]], "gaps\\[1\\].lo"),
        ([CHUNK, 1, 0, 1, 10, [[["h", 1, 1], 9, [[4, 3]]]]], "gaps\\[0\\].hi"),
        ([CHUNK, 1, 0, 1, 10, [[["h", 1, 1], 9, [[0, 3]]]]], "gaps\\[0\\].lo"),
        ([CHUNK, 1, 0, 1, 10, [[["h", 1, 1], 0, [[1, 1]]]]], "gaps\\[0\\].lo"),
        ([ACK, 1, -1], "state.next_index"),
        ([REFUSE, 1, "x" * 1000], "exceeds the limit"),
        ([REFUSE, 1, 5], "expected a string"),
        ("DATA", "expected a list"),
    ],
)
def test_malformed_headers_are_rejected_with_a_clear_error(wire: object, error: str) -> None:
    with pytest.raises(WireError, match=error):
        StateHeader.from_wire(wire)


def test_a_frame_with_a_malformed_state_header_is_dropped_and_counted() -> None:
    h = stack(DONOR)
    h.install_view([DONOR, P1])
    bad = msgpack.packb([FORMAT_VERSION, CLUSTER, P1.to_wire(), [[None, 0, [PID, [CHUNK, 1, 5, 2, 10, None]], b""]]])
    h.receive_raw(bad)
    assert h.metric("transport.bad_frames") == 1
    assert h.take_delivered() == [] and h.take_events(GetState) == []
    h.receive(P1, [mcast(1)])  # the member goes on
    assert [m.payload for m in h.take_delivered()] == [b"m1"]


# ---- numbering ------------------------------------------------------------------------------------------


def test_reliable_multicasts_are_numbered_per_sender_unicasts_and_unreliable_ones_are_not() -> None:
    h = stack(DONOR)
    h.install_view([DONOR, P1])
    h.send(b"a")
    h.send(b"u", dest=P1)
    h.send(b"b")
    h.send(b"raw", flags=NO_RELIABILITY)
    sent = {m.payload: m.headers.get(PID) for _, m in h.take_sent()}
    assert sent[b"a"] == StateHeader(DATA, 1) and sent[b"b"] == StateHeader(DATA, 2)
    assert sent[b"u"] is None and sent[b"raw"] is None


# ---- donor ----------------------------------------------------------------------------------------------


def test_donor_takes_the_snapshot_at_its_cut_and_streams_it_in_a_window_of_chunks() -> None:
    d = stack(DONOR, chunk_size=1000, window=3)
    d.install_view([DONOR, JOINER, P1])
    d.receive(P1, [mcast(1), mcast(2)])
    d.take_delivered()
    d.receive(JOINER, [req_from(tid=1)])
    [get] = d.take_events(GetState)
    assert get.transfer == (JOINER, 1)
    d.receive(P1, [mcast(3)])  # after the cut: not in the vector
    state = bytes(range(256)) * 20  # 5120 bytes: 6 chunks
    d.control(StateSnapshot(get.transfer, state))
    chunks = [(m, hdr) for _, m, hdr in state_sent(d) if hdr.kind == CHUNK]
    assert [hdr.index for _, hdr in chunks] == [0, 1, 2]  # the window
    assert chunks[0][1].cut == {P1: (2, ())} and chunks[0][1].count == 6 and chunks[0][1].total == len(state)
    assert all(len(m.payload) == 1000 and m.dest == JOINER for m, _ in chunks)
    d.receive(JOINER, [Message(DONOR, headers={PID: StateHeader(ACK, tid=1, index=2)})])
    assert [hdr.index for _, _, hdr in state_sent(d) if hdr.kind == CHUNK] == [3, 4]
    d.receive(JOINER, [Message(DONOR, headers={PID: StateHeader(ACK, tid=1, index=5)})])
    [(_, last, hdr)] = state_sent(d)
    assert hdr.index == 5 and last.payload == state[5000:]
    d.receive(JOINER, [Message(DONOR, headers={PID: StateHeader(ACK, tid=1, index=6)})])
    assert d.metric("state.transfers_done") == 1 and d.layer("state").outgoing == {}


def test_requests_naming_another_donor_are_ignored() -> None:
    d = stack(DONOR)
    d.install_view([DONOR, JOINER, P1])
    d.receive(JOINER, [req_from(tid=1, donor=P1)])
    assert d.take_events(GetState) == [] and state_sent(d) == []


def test_donor_refuses_a_requester_outside_its_view_and_too_many_transfers() -> None:
    d = stack(DONOR, max_transfers=1)
    d.install_view([DONOR, P1, P2])
    d.receive(JOINER, [req_from(tid=1)])
    [(ep, _, hdr)] = state_sent(d)
    assert ep == JOINER.endpoint and hdr.kind == REFUSE and "not in my view" in hdr.reason
    d.receive(P1, [req_from(tid=1)])
    d.receive(P2, [req_from(tid=1)])
    refusals = [(ep, hdr) for ep, _, hdr in state_sent(d) if hdr.kind == REFUSE]
    assert refusals == [(P2.endpoint, StateHeader(REFUSE, tid=1, reason="serving 1 transfers already"))]
    assert len(d.take_events(GetState)) == 1


def test_donor_waits_until_its_cut_reaches_the_joiners_floors() -> None:
    d = stack(DONOR)
    d.install_view([DONOR, JOINER, P1])
    d.receive(P1, [mcast(1)])
    d.receive(JOINER, [req_from(tid=1, floors={P1: 3})])
    assert d.take_events(GetState) == []
    d.receive(P1, [mcast(2)])
    assert d.take_events(GetState) == []
    d.receive(P1, [mcast(3), mcast(4)])
    # The snapshot follows the whole batch that reached the floor: the cut counts all of it.
    assert len(d.take_events(GetState)) == 1
    d.control(StateSnapshot((JOINER, 1), b"s"))
    [chunk] = [hdr for _, _, hdr in state_sent(d) if hdr.kind == CHUNK]
    assert chunk.cut == {P1: (4, ())}


def test_a_request_in_the_same_batch_as_multicasts_is_served_after_they_went_up() -> None:
    d = stack(DONOR)
    d.install_view([DONOR, JOINER, P1])
    d.receive(P1, [mcast(1), req_from(tid=1), mcast(2)])
    [get] = d.take_events(GetState)
    d.control(StateSnapshot(get.transfer, b""))
    [(_, msg, chunk)] = state_sent(d)
    # The cut is where the request sits in the stream: m1 is in the state, m2 is not.
    assert chunk.cut == {P1: (1, ())} and chunk.count == 1 and chunk.total == 0 and msg.payload == b""


def test_the_snapshot_is_asked_for_between_the_deliveries_around_the_request() -> None:
    d = stack(DONOR)
    d.install_view([DONOR, JOINER, P1])
    d.stack.receive(d.now, encode_messages(CLUSTER, P1, [mcast(1), req_from(tid=1), mcast(2)]))
    outs = [o for o in d.stack.drain() if type(o).__name__ != "Transmit"]
    assert [type(o).__name__ for o in outs] == ["Deliver", "GetState", "Deliver"]
    assert [m.payload for m in outs[0].messages] == [b"m1"] and [m.payload for m in outs[2].messages] == [b"m2"]


# ---- joiner ---------------------------------------------------------------------------------------------


def test_end_to_end_the_joiner_sets_the_state_drops_what_it_covers_and_delivers_the_rest_in_order() -> None:
    d, j = pair([DONOR, JOINER, P1], chunk_size=4, window=2)
    d.receive(P1, [mcast(k) for k in range(1, 6)])
    j.receive(P1, [mcast(k) for k in range(4, 8)])  # the joiner's stream from P1 starts at 4
    assert j.take_delivered() == []  # held
    move(j, d)  # the request
    answer_gets(d, b"state-at-5")  # the donor's cut: P1 up to 5
    for _ in range(10):
        if not (move(d, j) + move(j, d)):
            break
    events = j.take_events()
    kinds = [type(e) for e in events if isinstance(e, SetState | StateCovered)]
    assert kinds == [SetState, StateCovered]
    [setstate] = [e for e in events if isinstance(e, SetState)]
    assert setstate.state == b"state-at-5" and setstate.donor == DONOR
    [covered] = [e for e in events if isinstance(e, StateCovered)]
    assert [m.payload for m in covered.messages] == [b"m4", b"m5"]
    assert [m.payload for m in j.take_delivered()] == [b"m6", b"m7"]
    # Afterwards: normal delivery; a late copy of a covered message is not delivered again.
    j.receive(P1, [mcast(5), mcast(8)])
    assert [m.payload for m in j.take_delivered()] == [b"m8"]
    assert [m.payload for e in j.take_events(StateCovered) for m in e.messages] == [b"m5"]
    assert j.metric("state.chunks_sent") == 0 and d.metric("state.chunks_sent") == 3


def test_view_changes_during_the_transfer_reach_the_application_in_order_with_the_held_messages() -> None:
    d, j = pair([DONOR, JOINER, P1])
    j.take_events()
    j.receive(P1, [mcast(1)])
    view2 = make_view([DONOR, JOINER, P1, P2], seq=2)
    j.up_event_from_bottom(ViewChange(view2))
    j.receive(P1, [mcast(2)])
    assert j.take_events(ViewChange) == []  # held with the messages
    move(j, d)
    answer_gets(d, b"s")  # cut {}: nothing from P1 yet
    move(d, j)
    events = j.take_events()
    assert [type(e).__name__ for e in events] == ["SetState", "ViewChange"]
    assert events[1].view == view2
    assert [m.payload for m in j.take_delivered()] == [b"m1", b"m2"]
    assert j.layer("state").phase == "done"


def test_replay_keeps_messages_and_views_in_their_order() -> None:
    d, j = pair([DONOR, JOINER, P1])
    j.take_events()
    outputs: list[object] = []
    j.receive(P1, [mcast(1)])
    j.up_event_from_bottom(ViewChange(make_view([DONOR, JOINER, P1, P2], seq=2)))
    j.receive(P1, [mcast(2)])
    move(j, d)
    answer_gets(d, b"s")
    for frame in d.take_frames():
        j.stack.receive(j.now, encode_messages(CLUSTER, frame.sender, frame.messages))
        for out in j.stack.drain():
            outputs.append(out)
    names = [type(o).__name__ for o in outputs if type(o).__name__ != "Transmit"]
    assert names == ["SetState", "Deliver", "ViewChange", "Deliver"]


def test_covered_and_fresh_messages_of_one_batch_go_up_in_stream_order() -> None:
    # The donor never had P1's 3 (a hole in its cut: P1 sent it in an epoch the donor was not in), so the joiner
    # applies 3 on top of the state while 4 is covered: 3, then 4 as covered, then 6, as the stream has them.
    d, j = pair([DONOR, JOINER, P1])
    d.receive(P1, [mcast(1), mcast(2), mcast(4), mcast(5)])
    move(j, d)
    answer_gets(d, b"s")
    for _ in range(4):
        if not (move(d, j) + move(j, d)):
            break
    assert j.take_events(SetState)
    j.take_delivered()
    j.stack.receive(j.now, encode_messages(CLUSTER, P1, [mcast(3), mcast(4), mcast(6)]))
    outs = [o for o in j.stack.drain() if type(o).__name__ in ("Deliver", "StateCovered")]
    assert [(type(o).__name__, [m.payload for m in o.messages]) for o in outs] == [
        ("Deliver", [b"m3"]),
        ("StateCovered", [b"m4"]),
        ("Deliver", [b"m6"]),
    ]


def test_the_founder_has_no_state_to_fetch() -> None:
    h = stack(DONOR)
    h.control(RequestState())
    h.install_view([DONOR])
    [s] = h.take_events(SetState)
    assert s.state is None and s.donor is None
    assert state_sent(h) == []
    h.receive(P1, [mcast(1)])
    assert len(h.take_delivered()) == 1


def test_without_a_request_nothing_is_held() -> None:
    h = stack(JOINER)
    h.install_view([DONOR, JOINER])
    h.receive(P1, [mcast(3)])
    assert len(h.take_delivered()) == 1 and state_sent(h) == []


def test_a_stale_state_is_asked_for_again_and_the_donor_then_waits_for_the_floors() -> None:
    d, j = pair([DONOR, JOINER, P1], retry_delay="100ms")
    d.receive(P1, [mcast(1), mcast(2)])
    move(j, d)  # request without floors: the joiner held nothing yet
    [get] = answer_gets(d, b"old")  # cut P1: 2
    j.receive(P1, [mcast(5), mcast(6)])  # the joiner's stream starts at 5: 3 and 4 are in neither
    move(d, j)
    assert j.take_events(SetState) == [] and j.metric("state.stale_states") == 1
    j.advance(0.1)
    [req] = reqs(j)
    assert req.tid == 2 and req.vector == {P1: 4} and req.donor == DONOR  # the same donor: it will wait
    d.receive(JOINER, [Message(None, headers={PID: req})])
    assert d.take_events(GetState) == []  # its cut (2) is below the floor (4): it waits
    d.receive(P1, [mcast(3), mcast(4), mcast(5)])
    [get2] = answer_gets(d, b"new")
    assert get2.transfer == (JOINER, 2) and get.transfer == (JOINER, 1)
    move(d, j)
    [s] = j.take_events(SetState)
    assert s.state == b"new"
    assert [m.payload for m in j.take_delivered()] == [b"m6"]


def test_the_joiner_restarts_from_the_next_member_when_the_donor_crashes_mid_transfer() -> None:
    d, j = pair([DONOR, JOINER, P1], chunk_size=2, window=2)
    move(j, d)
    answer_gets(d, b"0123456789")
    frames = d.take_frames()
    j.receive(frames[0].sender, frames[0].messages)  # chunks 0 and 1 only, then the donor dies
    assert j.layer("state").incoming.next_index == 2
    state_sent(j)
    j.up_event_from_bottom(Suspect(DONOR))
    [req] = reqs(j)
    assert req.donor == P1 and req.tid == 2
    # A new donor sends the whole state again; chunks of the old transfer are ignored.
    p1 = stack(P1, chunk_size=4)
    p1.install_view([DONOR, JOINER, P1])
    p1.receive(JOINER, [Message(None, headers={PID: req})])
    answer_gets(p1, b"abcdefgh")
    j.receive(DONOR, [Message(JOINER, b"zz", headers={PID: StateHeader(CHUNK, tid=1, index=2, count=5, total=10)})])
    assert j.metric("state.stray_chunks") == 1
    for _ in range(5):
        if not (move(p1, j) + move(j, p1)):
            break
    [s] = j.take_events(SetState)
    assert s.state == b"abcdefgh" and s.donor == P1


def test_a_silent_donor_is_replaced_after_the_request_timeout() -> None:
    _d, j = pair([DONOR, JOINER, P1], request_timeout="2s")
    assert [r.donor for r in reqs(j)] == [DONOR]
    j.advance(1.9)
    assert reqs(j) == []
    j.advance(0.2)
    [req] = reqs(j)
    assert req.donor == P1 and j.metric("state.donor_timeouts") == 1


def test_a_donor_leaving_the_view_makes_the_joiner_ask_the_next_member() -> None:
    _d, j = pair([DONOR, JOINER, P1])
    state_sent(j)
    j.up_event_from_bottom(ViewChange(make_view([JOINER, P1], seq=2)))
    [req] = reqs(j)
    assert req.donor == P1 and req.tid == 2


def test_a_joiner_left_alone_starts_from_an_empty_state_and_delivers_what_it_held() -> None:
    """Sim seed 173 (total-order): every member that could give a state crashed."""
    _d, j = pair([DONOR, JOINER, P1])
    j.receive(P1, [mcast(1)])
    assert j.take_delivered() == []
    j.up_event_from_bottom(ViewChange(make_view([JOINER], seq=3)))
    [s] = j.take_events(SetState)
    assert s.state is None
    assert [m.payload for m in j.take_delivered()] == [b"m1"]


def test_a_joiner_that_left_before_its_state_delivers_nothing_more() -> None:
    """Sim seed 287 (total-order): its own last multicasts were delivered after Left, before any state."""
    _d, j = pair([DONOR, JOINER, P1])
    j.receive(P1, [mcast(1)])
    j.up_event_from_bottom(Left("left"))
    j.receive(P1, [mcast(2)])
    assert j.take_delivered() == [] and j.take_events(SetState) == []


def test_refusals_move_on_to_the_next_member_then_wait_before_a_new_round() -> None:
    _d, j = pair([DONOR, JOINER, P1], retry_delay="300ms")
    state_sent(j)
    j.receive(DONOR, [Message(JOINER, headers={PID: StateHeader(REFUSE, tid=1, reason="no")})])
    [req] = reqs(j)
    assert req.donor == P1
    j.receive(P1, [Message(JOINER, headers={PID: StateHeader(REFUSE, tid=req.tid, reason="no")})])
    assert reqs(j) == []  # everyone refused: no ping-pong, a pause first
    j.advance(0.3)
    assert [r.donor for r in reqs(j)] == [DONOR]


def test_multicasts_after_a_refusal_that_founds_the_group_count_in_the_next_cut() -> None:
    """Sim seed 311000063 (total-order): the refusal that made us found the group came in one batch with the
    refuser's multicasts 1 and 2; they were counted in the vector the founding replaced, so our next cut showed
    them as a hole and the refuser, taking that state, applied its own 1 and 2 a second time."""
    h = stack(DONOR)
    h.control(RequestState())
    h.install_view([DONOR, P1])
    [req] = reqs(h)
    assert req.donor == P1
    refusal = Message(DONOR, headers={PID: StateHeader(REFUSE, tid=req.tid, reason=NO_STATE_YET)})
    h.receive(P1, [refusal, mcast(1), mcast(2)])
    [s] = h.take_events(SetState)
    assert s.state is None
    h.receive(P1, [mcast(3)])
    assert [m.payload for m in h.take_delivered()] == [b"m1", b"m2", b"m3"]
    h.receive(P1, [req_from(tid=2)])
    answer_gets(h, b"s")
    [chunk] = [hdr for _, _, hdr in state_sent(h) if hdr.kind == CHUNK]
    assert chunk.cut == {P1: (3, ())}


def test_multicasts_in_the_batch_of_the_last_chunk_are_judged_against_the_new_state() -> None:
    # The state arrives in the middle of a batch: what follows it in the batch and the state has is covered,
    # not delivered again, and the next cut has no hole where the state's multicasts were.
    _d, j = pair([DONOR, JOINER, P1])
    chunk = StateHeader(CHUNK, tid=1, index=0, count=1, total=1, cut={DONOR: (2, ())})
    j.receive(DONOR, [Message(JOINER, b"s", headers={PID: chunk}), mcast(1), mcast(2), mcast(3)])
    assert [e.state for e in j.take_events(SetState)] == [b"s"]
    assert [m.payload for e in j.take_events(StateCovered) for m in e.messages] == [b"m1", b"m2"]
    assert [m.payload for m in j.take_delivered()] == [b"m3"]
    j.receive(P1, [req_from(tid=1, donor=JOINER)])
    answer_gets(j, b"t")
    [cut] = [hdr.cut for _, _, hdr in state_sent(j) if hdr.kind == CHUNK]
    assert cut == {DONOR: (3, ())}


def test_held_messages_are_bounded_dropping_them_raises_the_floors() -> None:
    d, j = pair([DONOR, JOINER, P1], max_buffered_messages=3)
    j.receive(P1, [mcast(k) for k in range(1, 5)])  # 4 > 3: dropped
    st = j.layer("state")
    assert st.held_messages == 0 and st.floors == {P1: 4}
    assert j.metric("state.buffer_overflows") == 1 and j.metric("state.held_dropped") == 4
    # The request went out before the overflow without floors: it was sent again with the raised ones.
    last = reqs(j)[-1]
    assert last.vector == {P1: 4} and last.donor == DONOR
    j.receive(P1, [mcast(5)])
    d.receive(JOINER, [Message(None, headers={PID: last})])
    d.receive(P1, [mcast(k) for k in range(1, 6)])
    answer_gets(d, b"s")
    move(d, j)
    assert [e.state for e in j.take_events(SetState)] == [b"s"]
    assert [m.payload for m in j.take_delivered()] == []  # 5 is in the state (cut 5)
    assert [m.payload for e in j.take_events(StateCovered) for m in e.messages] == [b"m5"]


def test_held_bytes_are_bounded_too() -> None:
    _d, j = pair([DONOR, JOINER, P1], max_buffered=100)
    j.receive(P1, [mcast(1, b"x" * 60), mcast(2, b"x" * 60)])
    assert j.layer("state").floors == {P1: 2} and j.metric("state.buffer_overflows") == 1


@pytest.mark.parametrize(
    ("hdr", "payload", "why"),
    [
        (StateHeader(CHUNK, tid=1, index=0, count=1, total=10**12, cut={}), b"", "max_state_size"),
        (StateHeader(CHUNK, tid=1, index=0, count=50, total=10, cut={}), b"", "chunks announced"),
        (StateHeader(CHUNK, tid=1, index=0, count=1, total=3, cut={}), b"toolong", "ends at byte"),
        (StateHeader(CHUNK, tid=1, index=0, count=1, total=8, cut={}), b"short", "ends at byte"),
        (StateHeader(CHUNK, tid=1, index=1, count=2, total=8), b"late", "was due"),
    ],
)
def test_bad_chunks_abort_the_transfer_and_the_joiner_asks_another_member(
    hdr: StateHeader, payload: bytes, why: str, caplog: pytest.LogCaptureFixture
) -> None:
    _d, j = pair([DONOR, JOINER, P1], max_state_size="1MiB")
    state_sent(j)
    j.receive(DONOR, [Message(JOINER, payload, headers={PID: hdr})])
    assert j.metric("state.bad_transfers") == 1 and why in caplog.text
    [req] = reqs(j)
    assert req.donor == P1
    assert j.take_events(SetState) == []


def test_a_member_still_fetching_refuses_to_be_a_donor() -> None:
    _d, j = pair([DONOR, JOINER, P1])
    state_sent(j)
    j.receive(P1, [req_from(tid=1, donor=JOINER)])
    [(ep, _, hdr)] = state_sent(j)
    assert ep == P1.endpoint and hdr.kind == REFUSE and "no state yet" in hdr.reason


def test_configuration_is_validated_with_units() -> None:
    from groupcluster.core.errors import ConfigError

    h = stack(DONOR, chunk_size="1KiB", request_timeout="250ms", max_state_size="2MB")
    cfg = h.layer("state").config
    assert (cfg.chunk_size, cfg.request_timeout, cfg.max_state_size) == (1024, 0.25, 2_000_000)
    with pytest.raises(ConfigError, match="window"):
        stack(DONOR, window=0)
    with pytest.raises(ConfigError, match="unknown key 'chunk'"):
        stack(DONOR, chunk=5)
