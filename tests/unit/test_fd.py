"""FD: heartbeats, silence, the verify-suspect round, Suspect/Unsuspect, membership tracking, bad input."""

from __future__ import annotations

import msgpack
import pytest
from groupcluster.core import protocol_ids
from groupcluster.core.errors import ConfigError, WireError
from groupcluster.core.events import Disconnect, Suspect, Unsuspect, VerifySuspect
from groupcluster.core.message import NO_FLOW_CONTROL, NO_RELIABILITY, Message
from groupcluster.protocols.fd import ARE_YOU_ALIVE, HEARTBEAT, I_AM_ALIVE, FdHeader

from .harness import ME, PEERS, LayerHarness, sent_with

FD = protocol_ids.FD
P1, P2, P3 = PEERS[:3]


def fd_msg(kind: int, dest=None) -> Message:
    return Message(dest, flags=NO_RELIABILITY | NO_FLOW_CONTROL, headers={FD: FdHeader(kind)})


def make(**params) -> LayerHarness:
    return LayerHarness([{"layer": "fd", **params}, {"layer": "probe"}])


def run_with_heartbeats(h: LayerHarness, seconds: float, alive, step: float = 0.5) -> None:
    """Advance ``seconds`` while the members in ``alive`` send a heartbeat every ``step``."""
    t = 0.0
    while t < seconds - 1e-9:
        h.advance(step)
        t += step
        for p in alive:
            h.receive(p, [fd_msg(HEARTBEAT)])


def test_heartbeat_multicast_every_interval_to_every_other_member():
    h = make()
    h.install_view([ME, P1, P2])
    h.advance(1.0)
    sent = sent_with(h.take_sent(), FD)
    assert sorted(ep for ep, _ in sent) == sorted([P1.endpoint, P2.endpoint])
    assert all(hdr.kind == HEARTBEAT for _, hdr in sent)
    h.advance(3.0)
    heartbeats = [hdr for _, hdr in sent_with(h.take_sent(), FD) if hdr.kind == HEARTBEAT]
    assert len(heartbeats) == 3 * 2


def test_heartbeat_flags_bypass_reliability_and_flow_control():
    h = make()
    h.install_view([ME, P1])
    h.advance(1.0)
    [(_, msg)] = h.take_sent()
    assert msg.dest is None
    assert msg.flags & NO_RELIABILITY and msg.flags & NO_FLOW_CONTROL


def test_no_heartbeats_before_a_view_or_when_alone():
    h = make()
    h.advance(10.0)
    assert h.take_frames() == []
    h.install_view([ME])
    h.advance(10.0)
    assert h.take_frames() == []
    assert h.take_events(Suspect) == []


def test_silent_member_is_verified_then_suspected_once():
    h = make()
    h.install_view([ME, P1, P2])
    run_with_heartbeats(h, 4.0, [P1])
    sent = sent_with(h.take_sent(), FD)
    probes = [(ep, hdr) for ep, hdr in sent if hdr.kind == ARE_YOU_ALIVE]
    assert probes == [(P2.endpoint, FdHeader(ARE_YOU_ALIVE))]
    assert h.take_events(Suspect) == []
    run_with_heartbeats(h, 1.0, [P1])
    assert h.take_events(Suspect) == [Suspect(P2)]
    assert h.metric("fd.suspected") == 1
    # Not repeated while the view stays the same.
    run_with_heartbeats(h, 20.0, [P1])
    assert h.take_events(Suspect) == []
    assert [hdr for _, hdr in sent_with(h.take_sent(), FD) if hdr.kind == ARE_YOU_ALIVE] == []


def test_are_you_alive_is_unicast_without_reliability():
    h = make(timeout="2s", interval="1s")
    h.install_view([ME, P1])
    h.advance(2.0)
    probes = [m for ep, m in h.take_sent() if m.headers[FD].kind == ARE_YOU_ALIVE]
    assert len(probes) == 1
    assert probes[0].dest == P1
    assert probes[0].flags & NO_RELIABILITY


def test_i_am_alive_reply_cancels_verification():
    h = make()
    h.install_view([ME, P1])
    h.advance(4.0)
    assert h.metric("fd.verify_started") == 1
    h.advance(0.5)
    h.receive(P1, [fd_msg(I_AM_ALIVE, dest=ME)])
    h.advance(5.0)
    assert h.take_events(Suspect) == []
    assert h.metric("fd.verify_cancelled") == 1


def test_verify_suspect_asks_at_once_and_suspects_only_the_silent() -> None:
    """FLUSH asks when a successor's flush removes members this detector has no reason to doubt yet."""
    h = make(timeout="10s", verify_timeout="500ms")
    h.install_view([P1, P2, ME, P3])
    h.advance(0.2)
    h.take_sent()
    assert h.control(VerifySuspect((P1, P2, PEERS[6]))) is None  # PEERS[6] is no member: ignored
    probes = sorted(ep for ep, hdr in sent_with(h.take_sent(), FD) if hdr.kind == ARE_YOU_ALIVE)
    assert probes == sorted([P1.endpoint, P2.endpoint])
    h.control(VerifySuspect((P1,)))  # already being verified: not asked twice
    assert [hdr for _, hdr in sent_with(h.take_sent(), FD) if hdr.kind == ARE_YOU_ALIVE] == []
    h.advance(0.2)
    h.receive(P2, [fd_msg(I_AM_ALIVE, dest=ME)])
    h.advance(0.4)
    assert h.take_events(Suspect) == [Suspect(P1)]
    assert h.metric("fd.verify_requested") == 2
    h.control(VerifySuspect((P1,)))  # suspected already: nothing more to ask
    h.advance(1.0)
    assert h.take_events(Suspect) == []
    assert [hdr for _, hdr in sent_with(h.take_sent(), FD) if hdr.kind == ARE_YOU_ALIVE] == []


def test_any_traffic_counts_as_sign_of_life_and_is_passed_up():
    h = make()
    h.install_view([ME, P1])
    for _ in range(10):
        h.advance(1.0)
        h.receive(P1, [Message(None, b"app")])
    assert h.take_events(Suspect) == []
    assert h.metric("fd.verify_started") == 0
    assert [m.payload for m in h.take_delivered()] == [b"app"] * 10


def test_traffic_during_verification_cancels_it():
    h = make()
    h.install_view([ME, P1])
    h.advance(4.0)
    h.receive(P1, [Message(None, b"late")])
    h.advance(3.0)
    assert h.take_events(Suspect) == []


def test_unsuspect_when_a_suspected_member_is_heard_again():
    h = make()
    h.install_view([ME, P1])
    h.advance(5.0)
    assert h.take_events(Suspect) == [Suspect(P1)]
    h.receive(P1, [fd_msg(HEARTBEAT)])
    assert h.take_events(Unsuspect) == [Unsuspect(P1)]
    # Heard from once more: nothing further.
    h.receive(P1, [fd_msg(HEARTBEAT)])
    assert h.take_events(Unsuspect) == [] and h.take_events(Suspect) == []


def test_new_view_still_containing_a_suspect_rearms_it():
    h = make()
    h.install_view([ME, P1, P2])
    run_with_heartbeats(h, 5.0, [P1])
    assert h.take_events(Suspect) == [Suspect(P2)]
    h.install_view([ME, P1, P2], seq=2)
    # A fresh silence of `timeout` plus verification is needed before it is suspected again.
    run_with_heartbeats(h, 4.5, [P1])
    assert h.take_events(Suspect) == []
    run_with_heartbeats(h, 1.0, [P1])
    assert h.take_events(Suspect) == [Suspect(P2)]


def test_members_removed_from_the_view_are_forgotten():
    h = make()
    h.install_view([ME, P1, P2])
    h.advance(4.0)  # both are being verified
    h.install_view([ME, P1], seq=2)
    h.take_sent()
    run_with_heartbeats(h, 10.0, [P1])
    assert h.take_events(Suspect) == []
    heartbeats = [ep for ep, hdr in sent_with(h.take_sent(), FD) if hdr.kind == HEARTBEAT]
    assert set(heartbeats) == {P1.endpoint}


def test_new_members_start_with_last_heard_now():
    h = make()
    h.install_view([ME, P1])
    run_with_heartbeats(h, 10.0, [P1])
    h.install_view([ME, P1, P3], seq=2)
    run_with_heartbeats(h, 3.5, [P1])
    assert h.metric("fd.verify_started") == 0
    run_with_heartbeats(h, 2.0, [P1])
    assert h.take_events(Suspect) == [Suspect(P3)]


def test_never_suspects_itself():
    h = make()
    h.install_view([ME, P1])
    run_with_heartbeats(h, 20.0, [P1])
    assert h.take_events(Suspect) == []
    assert all(m.dest != ME for _, m in h.take_sent())


def test_answers_are_you_alive_with_i_am_alive():
    h = make()
    h.install_view([ME, P1])
    h.receive(P1, [fd_msg(ARE_YOU_ALIVE, dest=ME)])
    [(ep, msg)] = h.take_sent()
    assert ep == P1.endpoint and msg.dest == P1
    assert msg.headers[FD] == FdHeader(I_AM_ALIVE)
    assert msg.flags & NO_RELIABILITY and msg.flags & NO_FLOW_CONTROL
    # Also answered for a member outside our view (it may be verifying us from another partition).
    h.receive(P3, [fd_msg(ARE_YOU_ALIVE, dest=ME)])
    assert [ep for ep, _ in h.take_sent()] == [P3.endpoint]


def test_fd_messages_are_removed_from_batches_and_order_is_kept():
    h = make()
    h.install_view([ME, P1])
    h.receive(P1, [Message(None, b"a"), fd_msg(HEARTBEAT), Message(None, b"b"), fd_msg(HEARTBEAT)])
    assert [m.payload for m in h.take_delivered()] == [b"a", b"b"]
    h.receive(P1, [fd_msg(HEARTBEAT)])
    assert h.take_delivered() == []
    assert h.probe().log.up[-1] is not None


def test_batch_without_fd_messages_is_passed_up_uncopied():
    h = make()
    h.install_view([ME, P1])
    batch = [Message(None, b"x", src=P1), Message(None, b"y", src=P1)]
    h.layer("fd").up(batch)
    assert h.probe().log.up[-1] is batch


def test_heartbeats_stop_after_disconnect_and_when_not_in_view():
    h = make()
    h.install_view([ME, P1])
    h.advance(1.0)
    assert h.take_frames()
    h.control(Disconnect())
    h.advance(10.0)
    assert h.take_frames() == []
    assert h.take_events(Suspect) == []
    h.install_view([ME, P1], seq=2)
    h.advance(1.0)
    assert h.take_frames()
    h.install_view([P1, P2], seq=3)  # a view without us
    h.take_frames()
    h.advance(10.0)
    assert h.take_frames() == []


def test_own_loopback_heartbeat_is_not_delivered():
    h = make()
    h.install_view([ME, P1])
    h.advance(1.0)
    assert h.take_delivered() == []
    assert h.metric("fd.heartbeats_received") >= 1


@pytest.mark.parametrize("bad", [[], [3], [-1], ["0"], [0, 1], 0, None, [True]])
def test_header_from_wire_rejects_malformed(bad):
    with pytest.raises(WireError):
        FdHeader.from_wire(bad)


def test_malformed_header_drops_the_frame_and_is_counted():
    h = make()
    h.install_view([ME, P1])
    frame = msgpack.packb([1, "test", P1.to_wire(), [[None, 3, [FD, [9]], b""], [None, 0, [], b"app"]]])
    h.receive_raw(frame)
    assert h.metric("transport.bad_frames") == 1
    assert h.take_delivered() == []
    # The bad frame was no sign of life either.
    h.advance(5.0)
    assert h.take_events(Suspect) == [Suspect(P1)]


def test_header_round_trip():
    for kind in (HEARTBEAT, ARE_YOU_ALIVE, I_AM_ALIVE):
        assert FdHeader.from_wire(FdHeader(kind).to_wire()) == FdHeader(kind)


def test_custom_timing():
    h = make(interval="100ms", timeout="300ms", verify_timeout="200ms")
    h.install_view([ME, P1])
    h.advance(0.45)
    assert h.take_events(Suspect) == []
    h.advance(0.2)
    assert h.take_events(Suspect) == [Suspect(P1)]


@pytest.mark.parametrize(
    ("params", "key"),
    [
        ({"interval": "soon"}, "stack[1] (fd).interval"),
        ({"timeout": -1}, "stack[1] (fd).timeout"),
        ({"verify_timeout": "0s"}, "stack[1] (fd).verify_timeout"),
        ({"interval": "2s", "timeout": "1s"}, "stack[1] (fd).timeout"),
        ({"intervall": "1s"}, "unknown key 'intervall'"),
    ],
)
def test_bad_configuration_names_the_key(params, key):
    with pytest.raises(ConfigError) as err:
        LayerHarness([{"layer": "fd", **params}])
    assert key in str(err.value)
