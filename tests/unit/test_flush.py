"""FLUSH: latch, digests and targets, reconciliation holds, completion, failure reporting, timeouts, headers."""

from __future__ import annotations

import pytest
from groupcluster.core import protocol_ids
from groupcluster.core.digest import Digest
from groupcluster.core.errors import WireError
from groupcluster.core.events import (
    Block,
    FlushAbandoned,
    FlushCompleted,
    FlushFailed,
    FlushRequest,
    MergeDigest,
    Suspect,
    Unblock,
    ViewChange,
)
from groupcluster.core.message import NO_FLOW_CONTROL, NO_RELIABILITY, Message
from groupcluster.core.view import View, ViewId
from groupcluster.protocols import flush as _flush  # noqa: F401
from groupcluster.protocols import nakack as _nakack  # noqa: F401
from groupcluster.protocols import unicast as _unicast  # noqa: F401
from groupcluster.protocols.fd import ARE_YOU_ALIVE, HEARTBEAT, I_AM_ALIVE, FdHeader
from groupcluster.protocols.flush import FLUSH_COMPLETED, FLUSH_OK, FLUSH_TARGET, START_FLUSH, FlushHeader
from groupcluster.protocols.nakack import MSG, XMIT_RSP, NakAckHeader
from groupcluster.protocols.unicast import DATA, UnicastHeader

from .harness import ME, PEERS, LayerHarness

P1, P2, P3 = PEERS[0], PEERS[1], PEERS[2]
FID = (P1, 1)
SPEC = [
    {"layer": "nakack", "retain_delivered": True, "xmit_interval": "100ms"},
    {"layer": "unicast"},
    {"layer": "probe"},
    {"layer": "flush", "timeout": "5s", "start_flush_timeout": "1s"},
]
_conn = iter(range(1, 1_000_000))


def control(sender, hdr: FlushHeader) -> Message:
    """A flush control message from ``sender`` as it arrives: a reliable unicast (each on a fresh connection,
    so tests need not track per-sender seqnos)."""
    return Message(ME, headers={protocol_ids.FLUSH: hdr, protocol_ids.UNICAST: UnicastHeader(DATA, next(_conn), 1, 1)})


def mcast(seqno: int) -> Message:
    return Message(None, f"m{seqno}".encode(), headers={protocol_ids.NAKACK: NakAckHeader(MSG, seqno)})


def flush_sent(h: LayerHarness) -> list[tuple[tuple[str, int], FlushHeader]]:
    return [(ep, m.headers[protocol_ids.FLUSH]) for ep, m in h.take_sent() if protocol_ids.FLUSH in m.headers]


def member() -> LayerHarness:
    h = LayerHarness(SPEC)
    h.install_view([P1, ME, P2, P3])
    h.take_sent()
    h.take_events()
    return h


VID = ViewId(1, P1)  # the view member() installs


def start(h: LayerHarness, participants=(P1, ME, P2), view_id: ViewId = VID) -> None:
    h.receive(P1, [control(P1, FlushHeader(START_FLUSH, FID, participants=participants, view_id=view_id))])


def test_start_flush_blocks_reports_the_digest_and_latches_own_multicasts() -> None:
    h = member()
    h.receive(P2, [mcast(1), mcast(2)])
    h.send(b"before")
    h.take_delivered()
    start(h)
    assert any(isinstance(e, Block) for e in h.take_events())
    oks = [(ep, hdr) for ep, hdr in flush_sent(h) if hdr.kind == FLUSH_OK]
    assert len(oks) == 1 and oks[0][0] == P1.endpoint
    assert oks[0][1].digest[P2][0] == 2 and oks[0][1].digest[ME][0] == 1
    # Seed 000's open question: a multicast after block() returned waits; it is not sent in the old view.
    h.send(b"after block")
    h.send(b"a unicast passes", dest=P2)
    sent = h.take_sent()
    assert [m.payload for _, m in sent if m.payload] == [b"a unicast passes"]


def test_target_makes_the_member_fetch_and_deliver_exactly_up_to_it_then_complete() -> None:
    h = member()
    h.receive(P3, [mcast(1)])
    start(h)
    h.take_sent()
    target = Digest({P1: (0, 0), ME: (0, 0), P2: (0, 0), P3: (3, 3)})  # P3 crashed; P2 holds up to 3
    h.receive(
        P1, [control(P1, FlushHeader(FLUSH_TARGET, FID, participants=(P1, ME, P2), digest=target, holders=((P3, P2),)))]
    )
    assert not [hdr for _, hdr in flush_sent(h) if hdr.kind == FLUSH_COMPLETED]
    h.advance(0.25)
    reqs = [(ep, m) for ep, m in h.take_sent() if protocol_ids.NAKACK in m.headers]
    assert reqs and all(ep == P2.endpoint for ep, _ in reqs), "missing messages are asked from the holder"
    # The holder retransmits on P3's behalf; one message beyond the target arrived from P3 and is held.
    rsp = [
        Message(ME, f"m{s}".encode(), headers={protocol_ids.NAKACK: NakAckHeader(XMIT_RSP, s, P3)}) for s in (2, 3, 4)
    ]
    h.receive(P2, rsp)
    assert [m.payload for m in h.take_delivered()] == [b"m1", b"m2", b"m3"]
    assert [hdr.kind for _, hdr in flush_sent(h)] == [FLUSH_COMPLETED]


def test_new_view_unblocks_and_sends_the_queued_multicasts() -> None:
    h = member()
    start(h)
    h.send(b"queued")
    h.take_sent()
    h.take_events()
    h.install_view([P1, ME, P2], seq=2, down=True, up=True)
    assert any(isinstance(e, Unblock) for e in h.take_events())
    assert [m.payload for _, m in h.take_sent() if m.payload] == [b"queued", b"queued"]  # to P1 and P2


def test_member_blocked_too_long_unblocks_by_itself() -> None:
    h = member()
    start(h)
    h.send(b"queued")
    h.take_events()
    h.advance(5.1)
    assert any(isinstance(e, Unblock) for e in h.take_events())
    assert h.metric("flush.block_timeouts") == 1


def test_blocked_too_long_keeps_waiting_while_gms_prepares_a_view() -> None:
    # GMS answers FlushAbandoned with True while a merge our flush prepared is open: its digest is our cut, so
    # unblocking in the old view would multicast past it. The latch holds until the view, then everything goes.
    h = member()
    probe = h.probe()
    merging = [True]
    probe.answer = lambda e: (True, merging[0]) if isinstance(e, FlushAbandoned) else (False, None)
    start(h)
    h.send(b"queued")
    h.take_sent()
    h.take_events()
    h.advance(5.1)
    assert not any(isinstance(e, Unblock) for e in h.take_events())
    assert not [m for _, m in h.take_sent() if m.payload == b"queued"]
    assert h.layer("flush").latched
    merging[0] = False  # the merge is over without a view reaching us: the next timeout unblocks
    h.advance(5.1)
    assert any(isinstance(e, Unblock) for e in h.take_events())
    assert sum(isinstance(e, FlushAbandoned) for e in probe.log.down_events) == 2
    assert h.metric("flush.block_timeouts") == 2


def test_waiting_for_the_view_gms_prepares_ends_with_that_view() -> None:
    h = member()
    h.probe().answer = lambda e: (True, True) if isinstance(e, FlushAbandoned) else (False, None)
    start(h)
    h.send(b"queued")
    h.take_sent()
    h.take_events()
    h.advance(5.1)
    h.install_view([P1, ME, P2, P3, PEERS[3]], seq=2, down=True, up=True)
    assert any(isinstance(e, Unblock) for e in h.take_events())
    assert [m.payload for _, m in h.take_sent() if m.payload].count(b"queued") == 4
    assert "blocked" not in h.timer_keys()


def coordinator() -> LayerHarness:
    h = LayerHarness([*SPEC], me=ME)
    h.install_view([ME, P1, P2])
    h.take_sent()
    return h


def test_coordinator_runs_both_rounds_and_reports_completion_below() -> None:
    h = coordinator()
    h.receive(P1, [mcast(1), mcast(2)])
    h.receive(P2, [mcast(1)])
    h.probe().inject_up_event(FlushRequest((ME, 1), (ME, P1, P2)))
    h.collect()
    starts = [ep for ep, hdr in flush_sent(h) if hdr.kind == START_FLUSH]
    assert sorted(starts) == [P1.endpoint, P2.endpoint]  # and to itself by loopback
    fid = (ME, 1)
    h.receive(P1, [control(P1, FlushHeader(FLUSH_OK, fid, digest=Digest({ME: (0, 0), P1: (2, 2), P2: (0, 1)})))])
    h.receive(P2, [control(P2, FlushHeader(FLUSH_OK, fid, digest=Digest({ME: (0, 0), P1: (1, 2), P2: (1, 1)})))])
    targets = [(ep, hdr) for ep, hdr in flush_sent(h) if hdr.kind == FLUSH_TARGET]
    assert sorted(ep for ep, _ in targets) == [P1.endpoint, P2.endpoint]
    target = targets[0][1].digest
    assert (target[P1][0], target[P2][0], target[ME][0]) == (2, 1, 0)  # the most anyone has, per sender
    assert not any(isinstance(e, FlushCompleted) for e in h.probe().log.down_events)
    for p in (P1, P2):
        h.receive(p, [control(p, FlushHeader(FLUSH_COMPLETED, fid))])
    assert any(isinstance(e, FlushCompleted) and e.flush_id == fid for e in h.probe().log.down_events)


def test_coordinator_reports_silent_participants() -> None:
    h = coordinator()
    h.probe().inject_up_event(FlushRequest((ME, 1), (ME, P1, P2)))
    h.collect()
    h.receive(P1, [control(P1, FlushHeader(FLUSH_OK, (ME, 1), digest=Digest({ME: (0, 0), P1: (0, 0)})))])
    h.advance(1.1)
    failed = [e for e in h.probe().log.down_events if isinstance(e, FlushFailed)]
    assert failed and failed[0].missing == (P2,)


def test_without_reconciliation_the_target_is_empty_and_nobody_fetches() -> None:
    h = LayerHarness([*SPEC[:-1], {**SPEC[-1], "enable_reconciliation": False}], me=ME)
    h.install_view([ME, P1, P2])
    h.take_sent()
    h.probe().inject_up_event(FlushRequest((ME, 1), (ME, P1, P2)))
    h.collect()
    fid = (ME, 1)
    h.receive(P1, [control(P1, FlushHeader(FLUSH_OK, fid, digest=Digest({ME: (0, 0), P1: (2, 2), P2: (0, 1)})))])
    h.receive(P2, [control(P2, FlushHeader(FLUSH_OK, fid, digest=Digest({ME: (0, 0), P1: (1, 2), P2: (1, 1)})))])
    targets = [hdr for _, hdr in flush_sent(h) if hdr.kind == FLUSH_TARGET]
    assert targets and all(len(t.digest) == 0 and t.holders == () for t in targets)


def test_second_round_waits_end_flush_timeout_and_failure_carries_retry_timeout() -> None:
    spec = [*SPEC[:-1], {**SPEC[-1], "start_flush_timeout": "1s", "end_flush_timeout": "3s", "retry_timeout": "250ms"}]
    h = LayerHarness(spec, me=ME)
    h.install_view([ME, P1, P2])
    h.take_sent()
    h.probe().inject_up_event(FlushRequest((ME, 1), (ME, P1, P2)))
    h.collect()
    fid = (ME, 1)
    for p in (P1, P2):
        h.receive(p, [control(p, FlushHeader(FLUSH_OK, fid, digest=Digest({ME: (0, 0), P1: (0, 0), P2: (0, 0)})))])
    h.receive(P1, [control(P1, FlushHeader(FLUSH_COMPLETED, fid))])
    h.advance(2.0)  # past start_flush_timeout, within end_flush_timeout
    assert not any(isinstance(e, FlushFailed) for e in h.probe().log.down_events)
    h.advance(1.5)
    failed = [e for e in h.probe().log.down_events if isinstance(e, FlushFailed)]
    assert failed and failed[0].missing == (P2,) and failed[0].retry_after == 0.25


@pytest.mark.parametrize(
    ("wire", "message"),
    [
        ([FLUSH_OK, [["h", 1, 1], 1], [], None, [], None], "without a digest"),
        ([START_FLUSH, [["h", 1, 1], 1], [], None, [], [1, ["h", 1, 1]]], "without participants"),
        ([START_FLUSH, [["h", 1, 1], 1], [["h", 1, 1]], None, [], None], "without participants or view id"),
        ([9, [["h", 1, 1], 1], [], None, [], None], "flush.kind"),
        ([FLUSH_COMPLETED, [["h", 1, 1], 1], [], None, []], "flush"),
    ],
)
def test_malformed_flush_headers_are_rejected(wire: list, message: str) -> None:
    with pytest.raises(WireError, match=message):
        FlushHeader.from_wire(wire)


def test_view_change_event_reaches_the_application() -> None:
    h = member()
    h.install_view([P1, ME], seq=3)
    assert any(isinstance(e, ViewChange) and e.view.members == (P1, ME) for e in h.take_events())
    assert View(ViewId(3, P1), (P1, ME)).coordinator == P1


def completed_member() -> LayerHarness:
    """A member that completed a round of P1's (P1, ME and P2 flushed, nothing to fetch): it holds what comes next."""
    h = member()
    start(h)
    h.take_sent()
    target = Digest({P1: (0, 0), ME: (0, 0), P2: (0, 0)})
    h.receive(P1, [control(P1, FlushHeader(FLUSH_TARGET, FID, participants=(P1, ME, P2), digest=target))])
    assert [hdr.kind for _, hdr in flush_sent(h)] == [FLUSH_COMPLETED]
    return h


def test_next_view_multicasts_arriving_before_our_view_are_delivered_after_it() -> None:
    """Real-process run: a member that installed the new view first multicast before ours arrived."""
    h = completed_member()
    h.receive(P2, [mcast(1)])  # P2 is already in the next view
    assert h.take_delivered() == []
    h.take_events()
    h.install_view([P1, ME, P2], seq=2)
    events = h.take_events()
    assert any(isinstance(e, ViewChange) for e in events)
    assert [m.payload for m in h.take_delivered()] == [b"m1"]


def test_held_next_view_multicasts_of_a_sender_outside_the_view_we_install_are_dropped() -> None:
    """Sim seed 200000958 (vsync): P2 installed the view after our completed flush, which never reached us;
    we held its multicasts, later installed another view without P2 and delivered them there (the members of
    that view never had them)."""
    h = completed_member()
    h.receive(P2, [mcast(1)])  # sent in the next view
    h.receive(P1, [mcast(1)])
    assert h.take_delivered() == []
    h.install_view([P1, ME], seq=3)  # not the view P2 sent in
    assert [(m.src, m.payload) for m in h.take_delivered()] == [(P1, b"m1")]
    assert h.metric("flush.held_dropped") == 1


def test_a_round_superseding_a_completed_one_is_not_told_of_held_next_view_multicasts() -> None:
    """Sim seed 823417000067 (vsync): we completed a round, held P3's next-view multicasts (the next view never
    reached us, its coordinator crashed) and then answered a superseding round of our old view with NAKACK's
    digest, which counts them. Its coordinator fetched and delivered them in the old view; we dropped them."""
    h = member()
    h.receive(P3, [mcast(1)])
    start(h, participants=(P1, ME, P2, P3))
    h.take_sent()
    target = Digest({P1: (0, 0), ME: (0, 0), P2: (0, 0), P3: (1, 1)})
    h.receive(P1, [control(P1, FlushHeader(FLUSH_TARGET, FID, participants=(P1, ME, P2, P3), digest=target))])
    assert [hdr.kind for _, hdr in flush_sent(h)] == [FLUSH_COMPLETED]
    assert [m.payload for m in h.take_delivered()] == [b"m1"]
    h.receive(P3, [mcast(2), mcast(3)])  # sent in the next view
    assert h.take_delivered() == []
    h.receive(P1, [control(P1, FlushHeader(START_FLUSH, (P1, 2), participants=(P1, ME, P2), view_id=VID))])
    oks = [hdr for _, hdr in flush_sent(h) if hdr.kind == FLUSH_OK]
    assert len(oks) == 1 and oks[0].digest.delivered(P3) == 1
    # Its target (P3 up to 1) completes the round at once: the held messages are not old-view ones.
    target = Digest({P1: (0, 0), ME: (0, 0), P2: (0, 0), P3: (1, 1)})
    h.receive(P1, [control(P1, FlushHeader(FLUSH_TARGET, (P1, 2), participants=(P1, ME, P2), digest=target))])
    assert [hdr.kind for _, hdr in flush_sent(h)] == [FLUSH_COMPLETED]
    h.install_view([P1, ME, P2], seq=3)
    assert h.take_delivered() == [] and h.metric("flush.held_dropped") == 2


def test_a_start_flush_for_a_view_not_yet_installed_waits_for_that_view() -> None:
    """Sim seed 23 (vsync): START_FLUSH (unicast) overtook the VIEW (multicast). Joining the new view's flush
    from the old view un-held the old round and delivered next-view messages in the old view."""
    h = member()
    next_view = ViewId(2, P1)
    start(h, view_id=next_view)
    assert not any(isinstance(e, Block) for e in h.take_events())
    assert flush_sent(h) == []
    h.install_view([P1, ME, P2], seq=2)
    assert any(isinstance(e, Block) for e in h.take_events())
    assert [hdr.kind for _, hdr in flush_sent(h)] == [FLUSH_OK]


def test_a_start_flush_for_an_older_view_is_dropped_at_the_next_view() -> None:
    h = member()
    start(h, view_id=ViewId(7, P2))  # not ours, and the next view is not it either
    h.install_view([P1, ME, P2], seq=2)
    assert not any(isinstance(e, Block) for e in h.take_events())
    assert flush_sent(h) == []


def test_completion_counts_only_what_reached_the_application() -> None:
    """Sim seed 79 (vsync): a batch passed up in parts (GMS splits at a VIEW) let the flush complete on
    NAKACK's count while the rest of the batch was still on its way, and those old-view messages were then
    held as next-view ones. Completion is now judged at the end of the step."""
    h = member()
    start(h)
    h.take_sent()
    target = Digest({P1: (0, 0), ME: (0, 0), P2: (2, 2)})
    h.receive(P1, [control(P1, FlushHeader(FLUSH_TARGET, FID, participants=(P1, ME, P2), digest=target))])
    assert flush_sent(h) == []
    h.receive(P2, [mcast(1), mcast(2)])
    assert [m.payload for m in h.take_delivered()] == [b"m1", b"m2"]
    assert [hdr.kind for _, hdr in flush_sent(h)] == [FLUSH_COMPLETED]


# With failure detection below (as in the vsync stack): slow to suspect on its own (timeout 4 s), quick to verify.
WITH_FD = [{"layer": "fd", "interval": "1s", "timeout": "4s", "verify_timeout": "500ms"}, *SPEC]
SUCCESSION_VIEW = ViewId(1, P1)  # [P1, P2, ME]: P1 coordinates, P2 is next


def fd_msg(kind: int) -> Message:
    return Message(ME, flags=NO_RELIABILITY | NO_FLOW_CONTROL, headers={protocol_ids.FD: FdHeader(kind)})


def survivor() -> LayerHarness:
    """ME, third in [P1, P2, ME]; P1 (the coordinator) has just crashed and ME has not noticed."""
    h = LayerHarness(WITH_FD)
    h.install_view([P1, P2, ME])
    h.advance(1.5)
    h.receive(P2, [fd_msg(HEARTBEAT)])
    h.take_sent()
    h.take_events()
    return h


def successor_start(h: LayerHarness, fid: tuple = (P2, 1)) -> None:
    # P2 suspected P1 first and took over: its flush leaves P1 out.
    hdr = FlushHeader(START_FLUSH, fid, participants=(P2, ME), view_id=SUCCESSION_VIEW)
    h.receive(P2, [control(P2, hdr)])


def probes_and_flush(h: LayerHarness) -> tuple[list, list[tuple[tuple[str, int], FlushHeader]]]:
    """What left since the last look: endpoints asked ARE_YOU_ALIVE, and flush control."""
    sent = h.take_sent()
    fd = protocol_ids.FD
    probes = [ep for ep, m in sent if fd in m.headers and m.headers[fd].kind == ARE_YOU_ALIVE]
    return probes, [(ep, m.headers[protocol_ids.FLUSH]) for ep, m in sent if protocol_ids.FLUSH in m.headers]


def test_the_successor_of_a_crashed_coordinator_is_followed_before_we_suspect_the_coordinator() -> None:
    """Real processes, SIGKILL of the coordinator: the next member's START_FLUSH came 0.2-0.8 s before the
    other survivor's detector suspected the coordinator. It was refused, the flush failed, the successor
    excluded the survivor and each went on in a view of one until a merge. Now the survivor verifies the
    coordinator at once and joins the successor's flush when it suspects it too."""
    h = survivor()
    successor_start(h)
    assert probes_and_flush(h) == ([P1.endpoint], [])  # P1 verified now, not after our own 4 s of silence
    assert h.metric("flush.flushes_refused") == 0
    assert h.layer("flush").describe_state()["awaiting_successor"] == str(P2)
    h.advance(0.5)  # P1 does not answer
    events = h.take_events()
    assert Suspect(P1) in events and any(isinstance(e, Block) for e in events)
    oks = [(ep, hdr) for ep, hdr in flush_sent(h) if hdr.kind == FLUSH_OK]
    assert [ep for ep, _ in oks] == [P2.endpoint] and oks[0][1].flush_id == (P2, 1)
    # P2 coordinates the round from here: its target completes it, and its view (without P1) ends it.
    target = Digest({P2: (0, 0), ME: (0, 0)})
    h.receive(P2, [control(P2, FlushHeader(FLUSH_TARGET, (P2, 1), participants=(P2, ME), digest=target))])
    assert [hdr.kind for _, hdr in flush_sent(h)] == [FLUSH_COMPLETED]
    h.install_view([P2, ME], seq=2)
    assert any(isinstance(e, Unblock) for e in h.take_events())
    assert h.metric("flush.flushes_refused") == 0 and h.metric("flush.successor_starts_verified") == 1


def test_a_successor_acting_on_a_false_suspicion_is_refused_and_the_coordinator_still_flushes_us() -> None:
    """P2 alone thinks P1 is dead (a link between them is down). We hear P1, so following P2 would split a
    healthy group: P2's flush is refused once the wait ends, and P1's own flush goes on."""
    h = survivor()
    successor_start(h)
    assert probes_and_flush(h) == ([P1.endpoint], [])
    h.advance(0.2)
    h.receive(P1, [fd_msg(I_AM_ALIVE)])
    h.advance(1.5)
    assert not any(isinstance(e, Block | Suspect) for e in h.take_events())
    assert flush_sent(h) == [] and h.metric("flush.flushes_refused") == 1
    start(h, participants=(P1, P2, ME), view_id=SUCCESSION_VIEW)
    assert [(ep, hdr.kind) for ep, hdr in flush_sent(h)] == [(P1.endpoint, FLUSH_OK)]


@pytest.mark.parametrize(
    ("view", "src", "participants"),
    [
        ((P1, P2, ME), P2, (P1, P2, ME)),  # it still flushes P1 itself: P1 outranks it
        ((P1, ME, P2), P2, (P2, ME)),  # we come before it and are alive
        ((P1, P2, ME), P3, (P3, ME)),  # not in our view
    ],
)
def test_a_flush_from_a_member_that_would_not_coordinate_is_refused_at_once(view, src, participants) -> None:
    h = LayerHarness(WITH_FD)
    h.install_view(list(view))
    h.take_sent()
    hdr = FlushHeader(START_FLUSH, (src, 1), participants=participants, view_id=ViewId(1, view[0]))
    h.receive(src, [control(src, hdr)])
    assert h.metric("flush.flushes_refused") == 1
    assert probes_and_flush(h) == ([], [])


def test_round_completes_when_the_last_fetched_message_is_consumed_below_flush() -> None:
    h = member()
    start(h)
    h.take_sent()
    probe = h.probe()
    consumed: list[Message] = []

    def keep_control(batch: list[Message]) -> None:
        # Stands in for a layer between NAKACK and FLUSH (GMS) that keeps its own multicasts (a VIEW).
        consumed.extend(m for m in batch if m.payload == b"view")
        rest = [m for m in batch if m.payload != b"view"]
        if rest:
            probe.above.up(rest)

    probe.up = keep_control  # type: ignore[method-assign]
    target = Digest({P1: (0, 0), ME: (0, 0), P2: (1, 1), P3: (0, 0)})
    h.receive(P1, [control(P1, FlushHeader(FLUSH_TARGET, FID, participants=(P1, ME, P2), digest=target))])
    assert not [hdr for _, hdr in flush_sent(h) if hdr.kind == FLUSH_COMPLETED]
    h.receive(P2, [Message(None, b"view", headers={protocol_ids.NAKACK: NakAckHeader(MSG, 1)})])
    assert [m.payload for m in consumed] == [b"view"]
    assert [hdr.kind for _, hdr in flush_sent(h)] == [FLUSH_COMPLETED]


def test_a_member_back_through_a_merge_is_reported_as_the_merge_digest_starts_it() -> None:
    """What we delivered of a member in an earlier view, before it left it, is not counted for the merged view.

    Our FLUSH_OK digest is what the coordinator builds the target from: counted, it would make the members of
    the subgroup that had the member at 0 fetch messages they were never owed, which nobody may hold any more
    (our copies went with its window), and every round would fail at them.
    """
    h = member()
    h.receive(P3, [mcast(1), mcast(2), mcast(3)])
    assert [m.payload for m in h.take_delivered()] == [b"m1", b"m2", b"m3"]
    h.install_view([P1, ME, P2], seq=2)  # P3 left our view; it stayed in another one that merges with ours
    h.control(MergeDigest(Digest({P1: (0, 0), ME: (0, 0), P2: (0, 0), P3: (0, 0)}), cut=True))
    merged = h.install_view([P1, ME, P2, P3], seq=3)
    h.take_sent()
    h.take_events()
    start(h, participants=(P1, ME, P2), view_id=merged.view_id)
    oks = [hdr for _, hdr in flush_sent(h) if hdr.kind == FLUSH_OK]
    assert len(oks) == 1 and oks[0].digest is not None
    assert oks[0].digest[P3] == (0, 0)
    target = Digest({P1: (0, 0), ME: (0, 0), P2: (0, 0), P3: (0, 0)})
    h.receive(P1, [control(P1, FlushHeader(FLUSH_TARGET, FID, participants=(P1, ME, P2), digest=target))])
    assert [hdr.kind for _, hdr in flush_sent(h)] == [FLUSH_COMPLETED]
    h.install_view([P1, ME, P2, P3], seq=4)
    # Its stream goes on from where the merge digest starts it; what we had delivered is not delivered again.
    h.receive(P3, [mcast(1), mcast(2), mcast(3), mcast(4)])
    assert [m.payload for m in h.take_delivered()] == [b"m4"]


def test_a_superseding_round_delivers_old_view_multicasts_of_a_sender_with_nothing_held_in_the_old_view() -> None:
    """Sim seed 354000073 (vsync): we completed a round that did not flush P3 (its coordinator suspected it) and
    held P2's next-view multicasts; that view never reached us. A new coordinator's round of the old view, with
    P3, delivered P3's old-view multicasts up to its target, but they queued behind P2's held ones and reached
    the application only in the next view, while P3 and the others had them in the old one."""
    h = member()
    start(h)  # P3 is not flushed
    h.take_sent()
    target = Digest({P1: (0, 0), ME: (0, 0), P2: (0, 0), P3: (0, 0)})
    h.receive(P1, [control(P1, FlushHeader(FLUSH_TARGET, FID, participants=(P1, ME, P2), digest=target))])
    assert [hdr.kind for _, hdr in flush_sent(h)] == [FLUSH_COMPLETED]
    h.receive(P2, [mcast(1)])  # sent in the next view
    h.receive(P3, [mcast(1)])  # sent in the old view: P3 never flushed, never installed the next one
    assert h.take_delivered() == []
    h.receive(P1, [control(P1, FlushHeader(START_FLUSH, (P1, 2), participants=(P1, ME, P3), view_id=VID))])
    h.take_sent()
    target = Digest({P1: (0, 0), ME: (0, 0), P2: (0, 0), P3: (1, 1)})
    h.receive(P1, [control(P1, FlushHeader(FLUSH_TARGET, (P1, 2), participants=(P1, ME, P3), digest=target))])
    assert [(m.src, m.payload) for m in h.take_delivered()] == [(P3, b"m1")]  # in the old view
    assert [hdr.kind for _, hdr in flush_sent(h)] == [FLUSH_COMPLETED]
    h.install_view([P1, ME, P2, P3], seq=3)
    assert [(m.src, m.payload) for m in h.take_delivered()] == [(P2, b"m1")]


def test_held_multicasts_that_a_superseding_round_puts_in_the_old_view_are_delivered_in_it() -> None:
    """Sim seed 702210000638 (vsync): we completed a round and held the coordinator's multicasts as next-view
    ones, but its own round had timed out and it unblocked in the old view and sent them there (it delivered
    them there itself). Its next round of the same view reported them in its digest; we completed that round
    at once (NAKACK counts them delivered) and delivered them only after the next view."""
    h = completed_member()
    h.receive(P1, [mcast(1), mcast(2), mcast(3)])  # P1 unblocked in the old view by its timeout
    assert h.take_delivered() == []
    h.receive(P1, [control(P1, FlushHeader(START_FLUSH, (P1, 2), participants=(P1, ME, P2), view_id=VID))])
    oks = [hdr for _, hdr in flush_sent(h) if hdr.kind == FLUSH_OK]
    assert len(oks) == 1 and oks[0].digest.delivered(P1) == 0
    target = Digest({P1: (2, 2), ME: (0, 0), P2: (0, 0)})  # P1 delivered m1 and m2 in this view
    h.receive(P1, [control(P1, FlushHeader(FLUSH_TARGET, (P1, 2), participants=(P1, ME, P2), digest=target))])
    assert [m.payload for m in h.take_delivered()] == [b"m1", b"m2"]  # in the old view, before completing
    assert [hdr.kind for _, hdr in flush_sent(h)] == [FLUSH_COMPLETED]
    assert h.metric("flush.held_delivered_in_view") == 2
    h.install_view([P1, ME, P2], seq=3)
    assert [m.payload for m in h.take_delivered()] == [b"m3"]
