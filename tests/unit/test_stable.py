"""STABLE unit tests: gossip of the digest (when, what, to whom), the round (minimum delivered, maximum
received, over every member's gossip, once each), the STABILITY message and what it tells NAKACK, and what
is ignored: other views, non-members, digests over other members, departed members.

The layer runs in a real Stack above a probe that stands in for NAKACK: it answers GetDigest and records the
Stability events that come down.
"""

from __future__ import annotations

from typing import Any

import pytest
from groupcluster.core import protocol_ids
from groupcluster.core.address import Address
from groupcluster.core.digest import Digest
from groupcluster.core.errors import WireError
from groupcluster.core.events import Event, GetDigest, Stability
from groupcluster.core.message import NO_FLOW_CONTROL, NO_RELIABILITY, Message
from groupcluster.core.view import ViewId
from groupcluster.protocols import stable as _stable  # noqa: F401  (registers the layer)
from groupcluster.protocols.stable import GOSSIP, STABILITY, StableHeader

from .harness import ME, PEERS, LayerHarness

PID = protocol_ids.STABLE
P1, P2, P3 = PEERS[0], PEERS[1], PEERS[2]
CONTROL = NO_RELIABILITY | NO_FLOW_CONTROL


def harness(members: tuple[Address, ...] = (ME, P1, P2), **params: Any) -> tuple[LayerHarness, ViewId]:
    """STABLE above a probe answering GetDigest with ``h.nakack`` (settable), in a view of ``members``."""
    h = LayerHarness([{"layer": "probe"}, {"layer": "stable", "interval": "1s", **params}])
    h.nakack = Digest({m: (0, 0) for m in members})  # type: ignore[attr-defined]

    def answer(event: Event) -> tuple[bool, Any]:
        if isinstance(event, GetDigest):
            return True, h.nakack  # type: ignore[attr-defined]
        return False, None

    h.probe().answer = answer
    view = h.install_view(list(members))
    return h, view.view_id


def msg(kind: int, view_id: ViewId, digest: Digest) -> Message:
    return Message(None, flags=CONTROL, headers={PID: StableHeader(kind, view_id, digest)})


def stable_sent(h: LayerHarness) -> list[tuple[tuple[str, int], StableHeader]]:
    """STABLE messages that left on the wire since the last look (everything sent is taken)."""
    return [(ep, m.headers[PID]) for ep, m in h.take_sent() if PID in m.headers]


def stabilities(h: LayerHarness) -> list[Stability]:
    """Stability events that went down to NAKACK so far (taken)."""
    log = h.probe().log.down_events
    got = [e for e in log if isinstance(e, Stability)]
    log[:] = [e for e in log if not isinstance(e, Stability)]
    return got


def gossip_once(h: LayerHarness) -> None:
    """Run the clock to our next gossip (it comes back to us by loopback, and is folded in like anyone's)."""
    before = h.metric("stable.gossips_sent")
    for _ in range(20):
        h.advance(0.1)
        if h.metric("stable.gossips_sent") > before:
            return
    raise AssertionError("no gossip within 2 s of a 1 s interval")


# ---- gossip ---------------------------------------------------------------------------------------------------


def test_nothing_is_gossiped_before_the_first_view() -> None:
    h = LayerHarness([{"layer": "probe"}, {"layer": "stable", "interval": "1s"}])
    h.advance(5.0)
    assert stable_sent(h) == []
    assert h.metric("stable.gossips_sent") == 0


def test_a_member_gossips_its_digest_of_view_members_about_every_interval_to_everyone() -> None:
    h, vid = harness()
    # NAKACK may still have a window of a member that left: it is not in the gossip.
    h.nakack = Digest({ME: (4, 4), P1: (2, 3), P2: (1, 1), P3: (9, 9)})  # type: ignore[attr-defined]
    h.advance(0.49)
    assert stable_sent(h) == []  # the first gossip comes after 0.5 to 1.5 intervals
    h.advance(1.02)
    sent = stable_sent(h)
    assert len(sent) == 2 and {ep for ep, _ in sent} == {P1.endpoint, P2.endpoint}
    hdr = sent[0][1]
    assert (hdr.kind, hdr.view_id) == (GOSSIP, vid)
    assert hdr.digest == Digest({ME: (4, 4), P1: (2, 3), P2: (1, 1)})
    h.advance(3.0)  # and again, every 0.5 to 1.5 intervals
    assert 2 <= h.metric("stable.gossips_sent") - 1 <= 6


def test_gossips_are_control_traffic_and_never_delivered_above() -> None:
    h, vid = harness()
    gossip_once(h)
    for _, m in h.take_sent():
        assert m.flags & CONTROL == CONTROL
    h.receive(P1, [msg(GOSSIP, vid, Digest({ME: (0, 0), P1: (0, 0), P2: (0, 0)})), Message(None, b"app")])
    assert [m.payload for m in h.take_delivered()] == [b"app"]  # the gossip stops here, the rest goes up


def test_multicast_traffic_past_max_bytes_triggers_a_gossip_at_once_unicasts_do_not() -> None:
    h, _ = harness(max_bytes="1KiB")
    h.receive(P1, [Message(ME, bytes(2000))])  # a unicast: not counted
    assert stable_sent(h) == []
    h.receive(P1, [Message(None, bytes(600))])
    assert stable_sent(h) == []
    h.receive(P2, [Message(None, bytes(600))])
    assert [hdr.kind for _, hdr in stable_sent(h)] == [GOSSIP, GOSSIP]  # to P1 and P2
    assert len(h.take_delivered()) == 3  # counted, and delivered all the same


# ---- the round ------------------------------------------------------------------------------------------------


def test_once_every_member_gossiped_the_round_is_the_minimum_delivered_and_maximum_received() -> None:
    h, vid = harness()
    h.nakack = Digest({ME: (10, 10), P1: (5, 6), P2: (7, 7)})  # type: ignore[attr-defined]
    gossip_once(h)
    h.receive(P1, [msg(GOSSIP, vid, Digest({ME: (8, 10), P1: (6, 6), P2: (7, 9)}))])
    h.advance(1.0)
    assert [hdr.kind for _, hdr in stable_sent(h) if hdr.kind == STABILITY] == []  # P2 has not gossiped yet
    h.receive(P2, [msg(GOSSIP, vid, Digest({ME: (9, 9), P1: (4, 6), P2: (7, 7)}))])
    h.advance(0.26)  # the STABILITY leaves after a stagger of up to a quarter interval
    sent = [hdr for _, hdr in stable_sent(h) if hdr.kind == STABILITY]
    assert len(sent) == 2  # to P1 and P2 (and to us by loopback)
    expected = Digest({ME: (8, 10), P1: (4, 6), P2: (7, 9)})
    assert sent[0].view_id == vid and sent[0].digest == expected
    assert stabilities(h) == [Stability(vid, expected)]  # our own STABILITY reached NAKACK, once
    assert h.metric("stable.stability_sent") == 1


def test_a_round_starts_afresh_after_a_stability() -> None:
    h, vid = harness()
    d = Digest({ME: (1, 1), P1: (1, 1), P2: (1, 1)})
    h.receive(P1, [msg(GOSSIP, vid, d)])
    h.receive(P2, [msg(GOSSIP, vid, d)])
    h.receive(P1, [msg(STABILITY, vid, d)])
    assert stabilities(h) == [Stability(vid, d)]
    gossip_once(h)  # only our own gossip in the new round: P1's and P2's belonged to the last one
    h.advance(0.3)
    assert [hdr for _, hdr in stable_sent(h) if hdr.kind == STABILITY] == []
    assert stabilities(h) == []


def test_a_second_gossip_from_the_same_member_does_not_stand_in_for_another() -> None:
    h, vid = harness()
    gossip_once(h)
    d = Digest({ME: (0, 0), P1: (0, 0), P2: (0, 0)})
    h.receive(P1, [msg(GOSSIP, vid, d)])
    h.receive(P1, [msg(GOSSIP, vid, d)])  # a duplicate (or P1's next gossip)
    h.advance(0.3)
    assert [hdr for _, hdr in stable_sent(h) if hdr.kind == STABILITY] == []
    h.receive(P2, [msg(GOSSIP, vid, d)])
    h.advance(0.3)
    assert len([hdr for _, hdr in stable_sent(h) if hdr.kind == STABILITY]) == 2


def test_a_later_gossip_of_a_member_never_raises_what_the_round_calls_delivered() -> None:
    h, vid = harness()
    h.nakack = Digest({ME: (5, 5), P1: (5, 5), P2: (5, 5)})  # type: ignore[attr-defined]
    h.receive(P1, [msg(GOSSIP, vid, Digest({ME: (2, 5), P1: (5, 5), P2: (5, 5)}))])
    h.receive(P1, [msg(GOSSIP, vid, Digest({ME: (5, 5), P1: (5, 5), P2: (5, 5)}))])  # P1 caught up since
    h.receive(P2, [msg(GOSSIP, vid, Digest({ME: (5, 5), P1: (5, 5), P2: (5, 5)}))])
    gossip_once(h)
    h.advance(0.3)
    (event,) = stabilities(h)
    assert event.stable[ME] == (2, 5)  # the minimum of what the round saw, never more


def test_a_stability_from_another_member_cancels_ours_and_reaches_nakack() -> None:
    h, vid = harness()
    d = Digest({ME: (3, 3), P1: (3, 3), P2: (3, 3)})
    h.nakack = d  # type: ignore[attr-defined]
    h.receive(P1, [msg(GOSSIP, vid, d)])
    h.receive(P2, [msg(GOSSIP, vid, d)])
    h.layer("stable")._gossip()  # our gossip now: the round completes when it loops back
    h.collect()
    assert h.layer("stable").stability_pending
    h.receive(P2, [msg(STABILITY, vid, d)])  # P2's stagger was shorter
    h.advance(1.0)
    assert [hdr for _, hdr in stable_sent(h) if hdr.kind == STABILITY] == []
    assert h.metric("stable.stability_sent") == 0
    assert stabilities(h) == [Stability(vid, d)]


# ---- what is ignored ------------------------------------------------------------------------------------------


def test_gossip_and_stability_of_another_view_are_ignored() -> None:
    h, vid = harness()
    other = ViewId(vid.seq + 1, P1)
    d = Digest({ME: (1, 1), P1: (1, 1), P2: (1, 1)})
    h.receive(P1, [msg(GOSSIP, other, d)])
    h.receive(P2, [msg(GOSSIP, other, d)])
    h.receive(P1, [msg(STABILITY, other, d)])
    gossip_once(h)
    h.advance(0.3)
    assert [hdr for _, hdr in stable_sent(h) if hdr.kind == STABILITY] == []  # P1 and P2 still count as unheard
    assert stabilities(h) == []
    assert h.metric("stable.gossip_other_view") == 2


def test_a_gossip_from_a_non_member_is_ignored() -> None:
    h, vid = harness()
    h.receive(P3, [msg(GOSSIP, vid, Digest({ME: (0, 0), P1: (0, 0), P2: (0, 0)}))])
    assert h.metric("stable.gossip_other_view") == 1
    assert h.layer("stable").round is None


def test_a_digest_over_other_members_resets_the_round() -> None:
    h, vid = harness()
    d = Digest({ME: (4, 4), P1: (4, 4), P2: (4, 4)})
    h.receive(P1, [msg(GOSSIP, vid, d)])
    # P2 gossips a digest without P1 (its NAKACK had no window for it yet): it must not be combined with ours.
    h.receive(P2, [msg(GOSSIP, vid, Digest({ME: (0, 0), P2: (4, 4)}))])
    assert h.metric("stable.round_resets") == 1
    h.nakack = d  # type: ignore[attr-defined]
    gossip_once(h)
    h.receive(P2, [msg(GOSSIP, vid, d)])
    h.advance(0.3)
    assert [hdr for _, hdr in stable_sent(h) if hdr.kind == STABILITY] == []  # P1's gossip was thrown away
    h.receive(P1, [msg(GOSSIP, vid, d)])
    h.advance(0.3)
    assert stabilities(h) == [Stability(vid, d)]


def test_a_view_change_drops_the_round_and_a_member_that_left_is_neither_waited_for_nor_heard() -> None:
    h, vid = harness()
    old = Digest({ME: (1, 1), P1: (1, 1), P2: (1, 1)})
    h.receive(P1, [msg(GOSSIP, vid, old)])
    h.receive(P2, [msg(GOSSIP, vid, old)])
    # P2 leaves before our gossip completes the round: the round (and its pending STABILITY) are gone.
    vid2 = h.install_view([ME, P1], seq=2).view_id
    h.receive(P2, [msg(STABILITY, vid, old)])  # late, from the old view
    assert stabilities(h) == []
    h.nakack = Digest({ME: (7, 7), P1: (6, 7), P2: (1, 1)})  # type: ignore[attr-defined]
    gossip_once(h)
    h.receive(P2, [msg(GOSSIP, vid2, Digest({ME: (7, 7), P1: (6, 7)}))])  # not a member any more
    h.advance(0.3)
    assert stabilities(h) == []  # P1 has not gossiped in the new view
    h.receive(P1, [msg(GOSSIP, vid2, Digest({ME: (5, 7), P1: (6, 7)}))])
    h.advance(0.3)
    assert stabilities(h) == [Stability(vid2, Digest({ME: (5, 7), P1: (6, 7)}))]  # P2 in nothing


def test_a_member_alone_finds_its_own_digest_stable() -> None:
    h, vid = harness(members=(ME,))
    h.nakack = Digest({ME: (3, 3)})  # type: ignore[attr-defined]
    gossip_once(h)
    h.advance(0.3)
    assert stabilities(h) == [Stability(vid, Digest({ME: (3, 3)}))]


# ---- wire -----------------------------------------------------------------------------------------------------


def test_headers_round_trip() -> None:
    hdr = StableHeader(STABILITY, ViewId(3, P1), Digest({ME: (1, 2), P1: (0, 5)}))
    back = StableHeader.from_wire(hdr.to_wire())
    assert (back.kind, back.view_id, back.digest) == (hdr.kind, hdr.view_id, hdr.digest)


@pytest.mark.parametrize(
    "wire",
    [
        None,
        [],
        [0, [1, ME.to_wire()]],
        [2, [1, ME.to_wire()], []],  # no such kind
        [0, "view", []],
        [0, [1, ME.to_wire()], [[ME.to_wire(), 5, 4]]],  # delivered above received
        [0, [1, ME.to_wire()], [[ME.to_wire(), -1, 4]]],
    ],
)
def test_malformed_headers_are_rejected(wire: Any) -> None:
    with pytest.raises(WireError):
        StableHeader.from_wire(wire)
