"""GMS: founding a group, joins with a race-free digest, bundling, crash removal, takeover, leave, headers."""

from __future__ import annotations

import pytest
from groupcluster.core import protocol_ids
from groupcluster.core.digest import Digest
from groupcluster.core.errors import WireError
from groupcluster.core.events import (
    Disconnect,
    DiscoveryResponse,
    FindMembers,
    FlushAbandoned,
    FlushCompleted,
    FlushGroup,
    FlushRequest,
    Joined,
    Left,
    MembersFound,
    MergeNeeded,
    Suspect,
    ViewChange,
)
from groupcluster.core.message import Message
from groupcluster.core.view import View, ViewId
from groupcluster.protocols import gms as _gms  # noqa: F401
from groupcluster.protocols import nakack as _nakack  # noqa: F401
from groupcluster.protocols import unicast as _unicast  # noqa: F401
from groupcluster.protocols.gms.wire import (
    FLUSH_REQ,
    JOIN_REQ,
    JOIN_RSP,
    LEAVE_REQ,
    MERGE_RSP,
    VIEW,
    VIEW_ACK,
    GmsHeader,
)
from groupcluster.protocols.nakack import MSG, NakAckHeader
from groupcluster.protocols.unicast import DATA, UnicastHeader

from .harness import ME, PEERS, LayerHarness, sent_with

P1, P2, P3, P4 = PEERS[0], PEERS[1], PEERS[2], PEERS[3]
GID = protocol_ids.GMS
SPEC = [
    {"layer": "probe"},
    {"layer": "nakack"},
    {"layer": "unicast"},
    {"layer": "gms", "view_bundling": "20ms", "view_ack_timeout": "500ms"},
]


def founded() -> LayerHarness:
    """A member that found nobody and founded the group (it is coordinator of [ME])."""
    h = LayerHarness(SPEC)
    assert any(isinstance(e, FindMembers) for e in h.probe().log.down_events)
    h.probe().inject_up_event(MembersFound("join", ()))
    h.stack._end_step()
    h._collect()
    # Nobody answered once: it asks again before founding (members started together must not split).
    assert not h.layer("gms").view
    h.advance(1.0)
    assert sum(isinstance(e, FindMembers) for e in h.probe().log.down_events) == 2
    h.probe().inject_up_event(MembersFound("join", ()))
    h.stack._end_step()
    h._collect()
    return h


def unicast_to(seqno: int, hdr: GmsHeader, conn: int = 5) -> Message:
    return Message(ME, headers={GID: hdr, protocol_ids.UNICAST: UnicastHeader(DATA, conn, seqno, seqno)})


def gms_sent(h: LayerHarness) -> list[tuple[tuple[str, int], GmsHeader]]:
    return sent_with(h.take_sent(), GID)


def test_first_member_founds_the_group() -> None:
    h = founded()
    joined = h.take_events(Joined)
    assert len(joined) == 1 and joined[0].view.members == (ME,)
    assert h.layer("gms").is_coordinator


def test_join_response_digest_counts_the_view_message_itself() -> None:
    """Seed 002's race: the joiner's digest must include the coordinator's view message (no '+1' kludge)."""
    h = founded()
    h.send(b"before")  # coordinator seqno 1
    h.take_sent()
    h.receive(P1, [unicast_to(1, GmsHeader(JOIN_REQ, seqno=0))])
    h.advance(0.03)  # view bundling
    rsps = [hdr for ep, hdr in gms_sent(h) if hdr.kind == JOIN_RSP and ep == P1.endpoint]
    assert len(rsps) == 1
    # The view went out as NAKACK multicast number 2 (to the old view, i.e. only looped back here).
    nakack = h.layer("nakack")
    view_seqno = nakack.seqno
    assert view_seqno == 2 and nakack.sent[2].headers[GID].kind == VIEW
    assert rsps[0].view.members == (ME, P1)
    assert rsps[0].digest[ME] == (view_seqno, view_seqno)
    assert rsps[0].digest[P1] == (0, 0)


def test_concurrent_joins_are_bundled_into_one_view() -> None:
    h = founded()
    h.receive(P1, [unicast_to(1, GmsHeader(JOIN_REQ))])
    h.receive(P2, [unicast_to(1, GmsHeader(JOIN_REQ), conn=6)])
    h.advance(0.03)
    rsps = [(ep, hdr.view.members) for ep, hdr in gms_sent(h) if hdr.kind == JOIN_RSP]
    assert sorted(rsps) == [(P1.endpoint, (ME, P1, P2)), (P2.endpoint, (ME, P1, P2))]
    assert h.metric("gms.views_sent") == 1


def test_requests_during_an_installation_use_the_temporary_membership() -> None:
    """Seed 002: a join processed before the previous view is acknowledged must not drop earlier joiners."""
    h = founded()
    h.receive(P1, [unicast_to(1, GmsHeader(JOIN_REQ))])
    h.advance(0.03)
    h.take_sent()
    # P1 has not acknowledged yet (it is a joiner: it is not awaited); P2 joins now.
    h.receive(P2, [unicast_to(1, GmsHeader(JOIN_REQ), conn=6)])
    h.advance(0.03)
    views = [hdr.view for _, hdr in gms_sent(h) if hdr.kind == VIEW]
    assert views and views[-1].members == (ME, P1, P2)


def coordinator_of(members: tuple) -> LayerHarness:
    h = founded()
    for i, p in enumerate(members, start=1):
        h.receive(p, [unicast_to(1, GmsHeader(JOIN_REQ), conn=10 + i)])
        h.advance(0.03)
        pending = h.layer("gms").pending
        # Acknowledge the view so the coordinator is free for the next request.
        for q in sorted(pending.awaiting) if pending else ():
            ack = GmsHeader(VIEW_ACK, view_id=pending.view.view_id)
            h.receive(q, [unicast_to(i, ack, conn=100 + members.index(q))])
        assert h.layer("gms").pending is None
    h.take_events()
    h.take_sent()
    return h


def test_suspected_member_is_removed_by_the_coordinator() -> None:
    h = coordinator_of((P1, P2))
    assert h.layer("gms").view.members == (ME, P1, P2)
    h.probe().inject_up_event(Suspect(P2))
    h.stack._end_step()
    h.advance(0.03)
    views = [e.view for e in h.take_events(ViewChange)]
    assert views and views[-1].members == (ME, P1)


def joining(spec: list | None = None) -> LayerHarness:
    """A member that found P1 as coordinator and sent its JOIN_REQ; it has no view yet."""
    h = LayerHarness(spec or SPEC)
    h.probe().inject_up_event(MembersFound("join", (DiscoveryResponse(P1, P1, None, True),)))
    h.stack._end_step()
    h._collect()
    return h


def participant(view_members: tuple, spec: list | None = None) -> LayerHarness:
    """A member that joined a group whose coordinator is view_members[0]."""
    h = joining(spec)
    reqs = [(ep, hdr) for ep, hdr in gms_sent(h) if hdr.kind == JOIN_REQ]
    assert reqs and reqs[0][0] == P1.endpoint
    view = View(ViewId(3, P1), view_members)
    digest = Digest({m: (0, 0) for m in view_members})
    h.receive(P1, [unicast_to(1, GmsHeader(JOIN_RSP, view=view, digest=digest))])
    assert h.take_events(Joined)
    h.take_events()
    return h


def test_next_member_takes_over_when_the_coordinator_is_suspected() -> None:
    h = participant((P1, ME, P2))
    h.probe().inject_up_event(Suspect(P1))
    h.stack._end_step()
    h.advance(0.03)
    views = [hdr.view for _, hdr in gms_sent(h) if hdr.kind == VIEW]
    assert views and views[-1].members == (ME, P2)
    assert views[-1].view_id.seq == 4 and views[-1].view_id.creator == ME


def test_graceful_leave_completes_when_the_view_without_us_arrives() -> None:
    h = participant((P1, ME, P2))
    h.control(Disconnect())
    assert [ep for ep, hdr in gms_sent(h) if hdr.kind == LEAVE_REQ] == [P1.endpoint]
    view = View(ViewId(4, P1), (P1, P2))
    msg = Message(None, headers={GID: GmsHeader(VIEW, view=view), protocol_ids.NAKACK: NakAckHeader(MSG, 1)})
    h.receive(P1, [msg])
    left = h.take_events(Left)
    assert len(left) == 1 and left[0].reason == "left"


def test_excluded_member_continues_as_a_singleton() -> None:
    h = participant((P1, ME, P2))
    view = View(ViewId(4, P1), (P1, P2))
    msg = Message(None, headers={GID: GmsHeader(VIEW, view=view), protocol_ids.NAKACK: NakAckHeader(MSG, 1)})
    h.receive(P1, [msg])
    views = [e.view for e in h.take_events(ViewChange)]
    assert views[-1].members == (ME,) and views[-1].view_id.seq == 5
    assert not h.take_events(Left)


def test_stale_views_are_ignored() -> None:
    h = participant((P1, ME, P2))
    old = View(ViewId(2, P1), (P1, ME))
    msg = Message(None, headers={GID: GmsHeader(VIEW, view=old), protocol_ids.NAKACK: NakAckHeader(MSG, 1)})
    h.receive(P1, [msg])
    assert h.take_events(ViewChange) == []
    assert h.metric("gms.views_ignored") == 1


def test_a_view_that_adds_us_as_a_joiner_is_ignored_once_we_are_a_member() -> None:
    """Sim seed 817 (vsync): a late JOIN_REQ of ours reached another coordinator, whose view listed us as a
    joiner; we moved into it from our group without that group's flush."""
    h = participant((P1, ME, P2))
    other = View(ViewId(3, P2), (P2, ME))  # P2 is in our view, so its seq-3 view would otherwise be accepted
    hdr = GmsHeader(VIEW, view=other, digest=Digest({ME: (0, 0)}))
    h.receive(P2, [Message(None, headers={GID: hdr, protocol_ids.NAKACK: NakAckHeader(MSG, 1)})])
    assert h.take_events(ViewChange) == []
    assert h.metric("gms.views_ignored_as_joiner") == 1


@pytest.mark.parametrize(
    ("wire", "message"),
    [
        ([VIEW, None, None, None, None, None, None, 0], "without a view"),
        ([99, None, None, None, None, None, None, 0], "gms.kind"),
        ([VIEW, [[1, ["h", 1, 1]], [], []], None, None, None, None, None, 0], "cannot be empty"),
        ([JOIN_REQ, None, None, None, None, None, None, -1], "gms.seqno"),
    ],
)
def test_malformed_gms_headers_are_rejected_with_the_field_named(wire: list, message: str) -> None:
    with pytest.raises(WireError, match=message):
        GmsHeader.from_wire(wire)


def test_gms_header_round_trip() -> None:
    view = View(ViewId(7, P1), (P1, ME), ((P1,), (ME,)))
    hdr = GmsHeader(JOIN_RSP, view=view, digest=Digest({P1: (3, 4), ME: (0, 0)}), seqno=2)
    back = GmsHeader.from_wire(hdr.to_wire())
    assert back.view == view and back.digest == hdr.digest and back.seqno == 2


def test_messages_that_arrive_before_our_join_response_are_delivered_once_joined() -> None:
    """Seed 22 of the simulator: the coordinator unicast to a joiner that had not yet installed the view."""
    h = joining()
    early = Message(ME, b"early", headers={protocol_ids.UNICAST: UnicastHeader(DATA, 5, 1, 1)})
    h.receive(P1, [early])
    assert h.take_delivered() == []
    view = View(ViewId(3, P1), (P1, ME))
    h.receive(P1, [unicast_to(2, GmsHeader(JOIN_RSP, view=view, digest=Digest({P1: (0, 0), ME: (0, 0)})))])
    assert [m.payload for m in h.take_delivered()] == [b"early"]


def test_early_unicasts_from_a_member_outside_our_first_view_are_delivered_once_joined() -> None:
    """Fifo seed 962349000201: our JOIN_RSP came late, with a view older than the merge view that added P2, and
    P2 had already sent to us in the merge view; UNICAST acknowledged those, so dropping them loses them."""
    h = joining()
    h.receive(P2, [Message(ME, b"from P2", headers={protocol_ids.UNICAST: UnicastHeader(DATA, 7, 1, 1)})])
    assert h.take_delivered() == []
    acks = [hdr for ep, hdr in sent_with(h.take_sent(), protocol_ids.UNICAST) if ep == P2.endpoint]
    assert [(a.conn_id, a.seqno) for a in acks] == [(7, 1)]  # acknowledged: P2 never resends it
    view = View(ViewId(3, P1), (P1, ME))
    h.receive(P1, [unicast_to(1, GmsHeader(JOIN_RSP, view=view, digest=Digest({P1: (0, 0), ME: (0, 0)})))])
    assert [m.payload for m in h.take_delivered()] == [b"from P2"]


def test_messages_kept_while_joining_are_bounded_by_max_early_messages() -> None:
    """A joiner keeps what arrives before its view up to ``max_early_messages``; beyond it they are dropped and
    counted, so a peer cannot make a joining member hold unbounded memory."""
    h = joining([*SPEC[:-1], {**SPEC[-1], "max_early_messages": 2}])
    for seqno in (1, 2, 3):
        payload = b"early %d" % seqno
        h.receive(P1, [Message(ME, payload, headers={protocol_ids.UNICAST: UnicastHeader(DATA, 5, seqno, 1)})])
    assert h.take_delivered() == []
    assert h.metric("gms.early_dropped") == 1
    view = View(ViewId(3, P1), (P1, ME))
    h.receive(P1, [unicast_to(4, GmsHeader(JOIN_RSP, view=view, digest=Digest({P1: (0, 0), ME: (0, 0)})))])
    assert [m.payload for m in h.take_delivered()] == [b"early 1", b"early 2"]


FLUSHING = [*SPEC[:-1], {**SPEC[-1], "use_flush": True}]


def test_explicit_flush_asked_by_a_member_goes_to_the_coordinator() -> None:
    h = participant((P1, ME, P2), FLUSHING)
    assert h.control(FlushGroup()) is True
    assert [ep for ep, hdr in gms_sent(h) if hdr.kind == FLUSH_REQ] == [P1.endpoint]


def test_explicit_flush_needs_a_flushing_stack() -> None:
    h = participant((P1, ME, P2))
    assert h.control(FlushGroup()) is False


def test_explicit_flush_at_the_coordinator_flushes_then_installs_a_view_of_the_same_members() -> None:
    h = participant((ME, P1, P2), FLUSHING)
    h.take_sent()
    assert h.control(FlushGroup()) is True
    h.advance(0.03)
    [req] = h.take_events(FlushRequest)
    assert set(req.participants) == {ME, P1, P2}
    assert [hdr for _, hdr in gms_sent(h) if hdr.kind == VIEW] == []  # no view before the flush completed
    h.control(FlushCompleted(req.flush_id))
    views = [hdr.view for _, hdr in gms_sent(h) if hdr.kind == VIEW]
    assert views and views[-1].members == (ME, P1, P2) and views[-1].view_id.seq == 4


@pytest.mark.parametrize(("spec", "start"), [(FLUSHING, 6), (SPEC, 0)])
def test_a_flushed_merge_view_moves_windows_up_to_its_digest(spec: list, start: int) -> None:
    """Sim seed 4100000 (vsync): P3's JOIN_REQ reached our coordinator and another one; it joined the other
    group, sent 1..6 there, and the merge listed it in both subgroups. After a flushed merge we must start at
    its subgroup's cut, not at our stale window (a later flush would fetch and deliver 1..6 in the merged
    view); without a flush the digest is no cut and our window keeps its place."""
    h = participant((P1, ME, P2, P3), spec)
    assert h.layer("nakack").windows[P3].delivered == 0
    merged = View(ViewId(5, P1), (P1, ME, P2, P3, P4), ((P1, ME, P2, P3), (P4, P3)))
    digest = Digest({P1: (0, 0), ME: (0, 0), P2: (0, 0), P3: (6, 6), P4: (2, 2)})
    hdr = GmsHeader(VIEW, view=merged, digest=digest)
    h.receive(P1, [Message(None, headers={GID: hdr, protocol_ids.NAKACK: NakAckHeader(MSG, 1)})])
    assert [e.view for e in h.take_events(ViewChange)] == [merged]
    assert h.layer("nakack").windows[P3].delivered == start


def test_answers_naming_us_as_coordinator_do_not_make_us_ask_ourselves_to_join() -> None:
    """A member that was named successor in a view it never installed (its coordinator left) hears, when it
    rediscovers, that it is coordinator; asking itself to join was rejected forever. It founds its own group
    instead, and MERGE brings the members holding that view back."""
    h = LayerHarness(SPEC)
    h.probe().inject_up_event(MembersFound("join", (DiscoveryResponse(P3, ME, None, False),)))
    h.stack._end_step()
    h._collect()
    assert not [ep for ep, hdr in gms_sent(h) if hdr.kind == JOIN_REQ]
    joined = h.take_events(Joined)
    assert len(joined) == 1 and joined[0].view.members == (ME,)


def test_a_flushed_merge_leaves_out_the_suspects_its_subgroup_flush_left_out() -> None:
    """Sim seed 819821000339 (vsync): P2 is in our view, but its JOIN_REQ also reached another coordinator and
    it joined that group instead; it never answers our flush, so we suspect it and flush our subgroup
    without it. Our digest entry for P2 is then no cut of its stream (it sent 1..16 in the other group, and a
    member of that group, dropped there and merged in, starts P2 at 16): a merged view listing P2 at our
    entry made every flush of that view wait for 1..16, which nobody in it could retransmit, and the
    coordinator's flush failed forever. Only the members we flushed go into the merge."""
    h = participant((ME, P1, P2), FLUSHING)
    h.take_sent()
    h.probe().inject_up_event(Suspect(P2))
    h.probe().inject_up_event(MergeNeeded((P3,)))
    h.collect()
    [req] = h.take_events(FlushRequest)
    assert req.participants == (ME, P1)
    h.control(FlushCompleted(req.flush_id))
    assert [hdr for _, hdr in gms_sent(h) if hdr.kind == VIEW] == []  # waiting for P3's answer
    merge_id = h.layer("gms").merge.merge_id
    other = View(ViewId(7, P3), (P3, P4))
    rsp = GmsHeader(MERGE_RSP, merge_id=merge_id, view=other, digest=Digest({P3: (9, 9), P4: (4, 4)}))
    h.receive(P3, [unicast_to(1, rsp, conn=30)])
    views = [hdr for _, hdr in gms_sent(h) if hdr.kind == VIEW]
    assert views and all(hdr.view == views[0].view for hdr in views)
    merged = views[0]
    assert merged.view.members == (ME, P1, P3, P4)
    assert merged.view.subgroups == ((ME, P1), (P3, P4))
    assert P2 not in merged.digest and merged.digest[P3] == (9, 9)


def _subgroup_flushed_for_a_merge() -> LayerHarness:
    """We coordinate (ME, P1), hear of P3's group, and our subgroup's flush for the merge has completed."""
    h = participant((ME, P1), FLUSHING)
    h.take_sent()
    h.probe().inject_up_event(MergeNeeded((P3,)))
    h.collect()
    [req] = h.take_events(FlushRequest)
    h.control(FlushCompleted(req.flush_id))
    return h


def test_a_coordinator_flushed_for_a_merge_keeps_its_subgroup_blocked_until_the_merge_ends() -> None:
    """Sim seed 347160119 (vsync, flush.timeout=4s < merge_timeout): our subgroup was flushed for a merge and
    its digest sent; FLUSH's blocked timeout came first and, GMS keeping a coordinator in its view, unblocked
    us in the old view. Our multicasts went past the cut the merged view carries, so the other subgroup
    delivered them in the merged view and we in the old one. GMS answers FlushAbandoned with True (a view is
    coming) while the merge is open; once it ends, the subgroup gets a view and the answer is None again."""
    h = _subgroup_flushed_for_a_merge()
    assert h.layer("gms").merge is not None  # waiting for P3's answer
    h.take_sent()
    assert h.control(FlushAbandoned()) is True
    assert not h.take_events(ViewChange)  # no view of our own: we stay coordinator of (ME, P1)
    assert h.layer("gms").view.members == (ME, P1)
    assert h.metric("gms.flush_abandon_deferred") == 1
    h.advance(5.1)  # merge_timeout: P3 never answered; the flushed subgroup gets a view of its own
    views = [hdr.view for _, hdr in gms_sent(h) if hdr.kind == VIEW]
    assert views and views[0].members == (ME, P1)
    assert h.layer("gms").merge is None
    assert h.control(FlushAbandoned()) is None


def test_a_coordinator_whose_view_is_on_its_way_to_itself_waits_for_it_once() -> None:
    """Sim seed 347680001 (total-order, flush.timeout=5s = merge_timeout): the merge timed out in the same
    instant as FLUSH's blocked timeout; GMS had just multicast the subgroup's new view, not installed yet, and
    FLUSH unblocked the coordinator in the old view, which delivered its own multicasts there while the other
    member delivered them in the new view. A view we cast and have not installed is waited for (once: a view
    that never reaches us cannot keep us blocked)."""
    h = _subgroup_flushed_for_a_merge()
    h.probe().swallow_down = True  # our VIEW goes out but never comes back to us
    h.advance(5.1)  # merge_timeout: the subgroup's new view is cast
    gms = h.layer("gms")
    assert gms.merge is None
    assert [m for m in h.probe().log.down if GID in m.headers and m.headers[GID].kind == VIEW]
    assert gms.view.members == (ME, P1) and gms.view.view_id == ViewId(3, P1)  # not installed
    assert h.control(FlushAbandoned()) is True
    assert h.control(FlushAbandoned()) is None
