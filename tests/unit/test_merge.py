"""MERGE: INFO rounds to known endpoints and to coordinators heard of, MergeNeeded at coordinators only, the
merge leader learning of every other coordinator whichever one heard first (one-sided host lists), orphans."""

from __future__ import annotations

from collections.abc import Sequence

from groupcluster.core import protocol_ids
from groupcluster.core.address import Address
from groupcluster.core.events import MergeNeeded, ViewChange
from groupcluster.core.message import NO_FLOW_CONTROL, NO_RELIABILITY, Message
from groupcluster.core.view import View, ViewId
from groupcluster.protocols.merge import MAX_HEARD, MergeHeader
from groupcluster.stacks import preset

from .harness import LayerHarness, make_view

MID = protocol_ids.MERGE
FLAGS = NO_RELIABILITY | NO_FLOW_CONTROL
# Address order is host order here: A < B < C < D.
A, B, C, D = (Address(f"10.0.0.{i}", 7800, 10 + i) for i in range(1, 5))


def ep(a: Address) -> str:
    return f"{a.host}:{a.port}"


def member(me: Address, hosts: Sequence[Address], view: Sequence[Address], seq: int = 1, **params) -> LayerHarness:
    """Discovery with ``hosts`` as its static list, MERGE on top, and ``view`` installed (down, as GMS does)."""
    h = LayerHarness(
        [{"layer": "discovery", "initial_hosts": [ep(x) for x in hosts]}, {"layer": "merge", **params}], me=me
    )
    h.install_view(view, seq, up=False)
    return h


def info(view_id: ViewId, coordinator: Address) -> Message:
    return Message(None, flags=FLAGS, headers={MID: MergeHeader(view_id, coordinator)})


def infos_sent(h: LayerHarness) -> list[tuple[tuple[str, int], Address | None, MergeHeader]]:
    """(endpoint, destination, header) of the INFOs that left since the last call."""
    return [(e, m.dest, m.headers[MID]) for e, m in h.take_sent() if MID in m.headers]


def needed(h: LayerHarness) -> list[tuple[Address, ...]]:
    return [e.coordinators for e in h.take_events(MergeNeeded)]


def run(net: dict[tuple[str, int], LayerHarness], seconds: float, step: float = 0.01) -> None:
    """Move every member's clock in steps, delivering each frame to the member at its endpoint one step later."""
    t = max(h.now for h in net.values())
    for _ in range(round(seconds / step)):
        t += step
        for h in net.values():
            h.advance_to(t)
        for h in net.values():
            for frame in h.take_frames():
                peer = net.get(frame.endpoint)
                if peer is not None:
                    peer.receive(frame.sender, frame.messages)


# -- the case of one-sided host lists ------------------------------------------------------------------------------


def test_a_coordinator_tells_a_lower_coordinator_it_heard_of_about_itself():
    # D was started with a host list naming only itself; the group of A lists D. D hears of A from A's INFO but
    # is not the merge leader (A sorts lower): it must make itself known to A, whose endpoint it does not know.
    d = member(D, [D], [D])
    vid_a = ViewId(4, A)
    d.receive(A, [info(vid_a, A)])
    sent = infos_sent(d)
    assert [(e, dest) for e, dest, _ in sent] == [(A.endpoint, A)]
    assert sent[0][2].view_id == ViewId(1, D) and sent[0][2].coordinator == D
    assert d.metric("merge.info_to_new_peer") == 1
    # It reports the other coordinator (GMS lets the lower one lead) and keeps A in its INFO rounds.
    d.advance(2.0)
    assert needed(d) == [(A,)]
    assert (A.endpoint, A) in [(e, dest) for e, dest, _ in infos_sent(d)]


def test_info_from_a_participant_makes_us_known_to_it_and_to_its_coordinator():
    # Only a participant of the other group lists us; its INFO names its coordinator: both hear from us.
    d = member(D, [D], [D])
    d.receive(B, [info(ViewId(4, A), A)])
    assert sorted((e, dest) for e, dest, _ in infos_sent(d)) == [(A.endpoint, A), (B.endpoint, B)]
    d.advance(2.0)
    assert needed(d) == [(A,)]
    assert {dest for _, dest, _ in infos_sent(d) if dest is not None} >= {A, B}


def test_a_member_left_in_a_view_its_coordinator_never_installed_hears_it_announce_another():
    # B holds a view [D, B] that D never installed (D founded a group of its own instead); D's list does not
    # name B. B's INFOs name D as its coordinator: D must answer, or B never learns it was left behind.
    b = member(B, [A, B, C, D], [D, B], seq=10)
    d = member(D, [D], [D])
    net = {B.endpoint: b, D.endpoint: d}
    run(net, 8.0)
    assert (D,) in needed(b)  # GMS continues alone, and a merge brings B and D together
    assert b.metric("merge.coordinator_moved_on") == 1


def test_the_leader_learns_of_the_other_coordinator_and_starts_the_merge():
    # A (lower) lists D; D lists only itself: on the old code A never heard of D and they never merged.
    a = member(A, [A, B, D], [A, B], seq=4)
    d = member(D, [D], [D])
    net = {A.endpoint: a, D.endpoint: d}
    run(net, 6.0)
    assert (D,) in needed(a)  # the leader reports D: GMS at A leads the merge
    assert (A,) in needed(d)


def test_three_subgroups_the_lowest_hears_of_both_others():
    # A lists everyone, B lists C, C lists nobody: A is never told anything by discovery, yet it leads the merge.
    a = member(A, [A, B, C], [A], seq=3)
    b = member(B, [B, C], [B], seq=2)
    c = member(C, [C], [C], seq=5)
    net = {A.endpoint: a, B.endpoint: b, C.endpoint: c}
    run(net, 8.0)
    reports = needed(a)
    assert reports and set(reports[-1]) == {B, C}
    assert any(A in r for r in needed(b)) and any(A in r for r in needed(c))


def test_two_members_formed_apart_merge_when_only_the_lower_one_lists_the_other():
    # Whole stacks: A's list names B, B's names only itself; they found groups of their own while cut off from
    # each other, then the network heals. B sorts higher, so A must hear of B to lead the merge.
    def stack(me: Address, hosts: Sequence[Address]) -> LayerHarness:
        spec = preset("fifo", {"discovery": {"initial_hosts": [ep(x) for x in hosts]}})
        return LayerHarness(spec, me=me)

    a, b = stack(A, [A, B]), stack(B, [B])
    net = {A.endpoint: a, B.endpoint: b}
    apart = {A.endpoint: a}
    run(apart, 4.0)  # B's frames are lost: A founds alone...
    run({B.endpoint: b}, 4.0)  # ...and so does B
    for h in (a, b):
        h.take_frames()
    views = {h.me: h.layer("gms").view for h in (a, b)}
    assert views == {A: View(views[A].view_id, (A,)), B: View(views[B].view_id, (B,))}
    run(net, 20.0)
    va, vb = a.layer("gms").view, b.layer("gms").view
    assert va == vb and set(va.members) == {A, B}
    assert a.metric("gms.merges_started") >= 1 and b.metric("gms.merges_started") == 0


# -- what a member ignores --------------------------------------------------------------------------------------------


def test_a_participant_reports_no_merge_but_points_the_other_coordinator_to_its_own():
    # Only coordinators raise MergeNeeded from INFOs; a participant that hears of another coordinator sends it
    # an INFO naming its own coordinator, so the two coordinators can meet.
    b = member(B, [A, B], [A, B])
    b.receive(D, [info(ViewId(7, D), D)])
    assert [(e, dest, hdr.coordinator) for e, dest, hdr in infos_sent(b)] == [(D.endpoint, D, A)]
    b.advance(5.0)
    assert needed(b) == []
    assert b.metric("merge.merge_needed") == 0


def test_info_of_our_own_view_is_ignored():
    a = member(A, [A, B], [A, B], seq=2)
    b_info = info(ViewId(2, A), A)
    a.receive(B, [b_info])
    assert infos_sent(a) == []
    a.advance(5.0)
    assert needed(a) == []
    assert a.layer("merge").heard == {}


def test_info_naming_ourselves_as_coordinator_of_another_view_is_no_other_coordinator():
    # A stale INFO from a member still in an older view of ours: nobody to merge with, nobody to tell.
    a = member(A, [A, B], [A, B], seq=3)
    a.receive(B, [info(ViewId(2, A), A)])
    assert infos_sent(a) == []
    a.advance(5.0)
    assert needed(a) == []


def test_no_info_before_a_view():
    h = LayerHarness([{"layer": "discovery", "initial_hosts": [ep(A), ep(B)]}, {"layer": "merge"}], me=A)
    h.receive(B, [info(ViewId(3, C), C)])
    h.advance(5.0)
    assert infos_sent(h) == [] and needed(h) == []


# -- rounds, forgetting, bounds ----------------------------------------------------------------------------------------


def test_info_rounds_go_to_every_known_endpoint_but_our_own():
    a = member(A, [A, B, C], [A], min_interval="500ms", max_interval="1500ms")
    a.advance(1.6)
    sent = infos_sent(a)
    assert {e for e, _, _ in sent} == {B.endpoint, C.endpoint}
    assert all(dest.incarnation == 0 for _, dest, _ in sent)  # whoever listens there
    assert all(hdr.view_id == ViewId(1, A) and hdr.coordinator == A for _, _, hdr in sent)


def test_a_coordinator_no_longer_heard_of_is_forgotten():
    d = member(D, [D], [D], forget_after="4s")
    d.receive(A, [info(ViewId(4, A), A)])
    d.advance(3.0)
    assert A in d.layer("merge").heard
    d.advance(4.0)  # a check after forget_after passed without news of A
    assert d.layer("merge").heard == {}
    infos_sent(d)
    d.advance(3.0)
    assert all(e != A.endpoint for e, _, _ in infos_sent(d))


def test_news_of_a_coordinator_keeps_it_remembered():
    d = member(D, [D], [D], forget_after="4s")
    for _ in range(8):
        d.receive(A, [info(ViewId(4, A), A)])
        d.advance(1.0)
    assert A in d.layer("merge").heard
    assert d.metric("merge.info_to_new_peer") == 1  # told right away only once


def test_the_coordinators_heard_of_are_bounded():
    d = member(D, [D], [D])
    for i in range(MAX_HEARD + 5):
        other = Address("10.1.0.1", 9000 + i, 1)
        d.receive(other, [info(ViewId(1, other), other)])
    heard = d.layer("merge").heard
    assert len(heard) == MAX_HEARD
    assert d.metric("merge.heard_evicted") == 5


def test_a_coordinator_we_merged_with_is_forgotten():
    d = member(D, [D], [D], forget_after="4s")
    d.receive(A, [info(ViewId(4, A), A)])
    merged = make_view([A, D], 5)
    d.control(ViewChange(merged))
    d.advance(8.0)
    # A is in our view now: it is a known host (discovery knows view members) and no longer "another view".
    assert d.layer("merge").heard == {}
    assert needed(d) == []


# -- orphans -----------------------------------------------------------------------------------------------------------


def test_a_participant_whose_coordinator_announces_another_view_reports_it():
    b = member(B, [A, B], [A, B], seq=2, orphan_after="2s")
    moved_on = ViewId(3, A)  # A installed a view without B, and B never heard of it
    for _ in range(6):
        b.receive(A, [info(moved_on, A)])
        b.advance(0.5)
    assert (A,) in needed(b)
    assert b.metric("merge.coordinator_moved_on") == 1
    # Its own coordinator is not "another coordinator": no INFO is aimed at it beyond the usual rounds.
    assert b.metric("merge.info_to_new_peer") == 0
