"""SEQUENCER unit tests: forwarding, sequencing in batches, uniform delivery, duplicates, the sync after a
view change (replays, resends in order, no second sequencing), gaps, fragments, malformed input.

The layer runs in a real Stack above the transport (no NAKACK/UNICAST below: the tests play the peers and
look at the frames it sends).
"""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from groupcluster.core import protocol_ids
from groupcluster.core.address import Address
from groupcluster.core.errors import ConfigError, WireError
from groupcluster.core.events import Backpressure, Disconnect, FlushHold, FlushRelease, Left, ViewChange
from groupcluster.core.message import NO_RELIABILITY, OOB, Message
from groupcluster.core.stack import resolve_config
from groupcluster.core.view import ViewId
from groupcluster.protocols import frag as _frag  # noqa: F401  (registers the FRAG header)
from groupcluster.protocols.frag import FragHeader
from groupcluster.protocols.sequencer import member as sequencer_member
from groupcluster.protocols.sequencer.wire import (
    ACK,
    BCAST,
    COMMIT,
    FORWARD,
    RESEND,
    SYNC,
    SYNC_REQ,
    SequencerHeader,
    decode_batch,
    decode_forward,
)
from groupcluster.protocols.state_transfer.wire import DATA, StateHeader

from .harness import ME, PEERS, LayerHarness

PID = protocol_ids.SEQUENCER
C, P1, P2 = PEERS[0], PEERS[1], PEERS[2]


def harness(**params: Any) -> LayerHarness:
    return LayerHarness([{"layer": "sequencer", **params}])


def pack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def bcast(epoch: ViewId, seq: int, commit: int, runs: list[Any], replay: tuple[ViewId, int] | None = None) -> Message:
    wire = [[origin.to_wire(), start, items] for origin, start, items in runs]
    return Message(None, pack(wire), headers={PID: SequencerHeader(BCAST, epoch, seq, commit, replay)})


def commit(epoch: ViewId, upto: int) -> Message:
    return Message(None, headers={PID: SequencerHeader(COMMIT, epoch, commit=upto)})


def sync_msg(
    epoch: ViewId,
    *,
    epochs: list[ViewId],
    batches=(),
    fwd=None,
    fwd_seq: int = 0,
    skipped: dict[Address, list[tuple[int, int]]] | None = None,
) -> Message:
    body = [[e.to_wire() for e in epochs], [[e.to_wire(), b, raw] for e, b, raw in batches], fwd, fwd_seq]
    if skipped is not None:  # without: a SYNC of four fields, announcing nothing skipped
        body.append([[origin.to_wire(), [x for r in ranges for x in r]] for origin, ranges in skipped.items()])
    return Message(ME, pack(body), headers={PID: SequencerHeader(SYNC, epoch, 0, 1)})


def ack(epoch: ViewId, seq: int) -> Message:
    return Message(ME, flags=NO_RELIABILITY, headers={PID: SequencerHeader(ACK, epoch, seq=seq)})


def forward(start: int, items: list[Any]) -> Message:
    return Message(ME, pack([start, items]), headers={PID: SequencerHeader(FORWARD)})


def sent_kind(h: LayerHarness, kind: int) -> list[tuple[tuple[str, int], Message]]:
    """What left on the wire since the last look (all of it is taken), only ``kind`` messages returned."""
    return [(ep, m) for ep, m in h.take_sent() if PID in m.headers and m.headers[PID].kind == kind]


def runs_of(msg: Message) -> list[tuple[Address, int, list[Any]]]:
    return decode_batch(msg.payload, lambda wire, field: Address(*wire))


def payloads(msgs: list[Message]) -> list[tuple[Address | None, bytes]]:
    return [(m.src, m.payload) for m in msgs]


# ---- a member: forwarding and delivery ----------------------------------------------------------------------


def member_in_view() -> tuple[LayerHarness, ViewId]:
    h = harness()
    view = h.install_view([C, ME])
    syncs = sent_kind(h, SYNC)
    assert [ep for ep, _ in syncs] == [C.endpoint]  # our SYNC goes to the coordinator at once
    return h, view.view_id


def test_a_member_forwards_the_multicasts_of_one_step_in_one_message_and_delivers_nothing_yet() -> None:
    h, _ = member_in_view()
    h.send_many([Message(None, b"a"), Message(None, b"b"), Message(None, b"c")])
    fwd = sent_kind(h, FORWARD)
    assert len(fwd) == 1 and fwd[0][0] == C.endpoint
    assert decode_forward(fwd[0][1].payload) == (1, [b"a", b"b", b"c"])
    assert h.take_delivered() == []  # nothing is delivered before the coordinator sequenced and committed it


def test_unicasts_and_unreliable_multicasts_pass_straight_through() -> None:
    h, _ = member_in_view()
    h.send(b"to-one", dest=P1)
    h.send(b"loose", flags=NO_RELIABILITY)
    sent = h.take_sent()
    assert [(m.dest, m.payload) for _, m in sent] == [(P1, b"to-one"), (None, b"loose")]
    assert all(PID not in m.headers for _, m in sent)
    assert payloads(h.take_delivered()) == [(ME, b"loose")]  # the transport's loopback, unordered
    h.receive(P1, [Message(ME, b"uni"), Message(None, b"raw", flags=NO_RELIABILITY)])
    assert payloads(h.take_delivered()) == [(P1, b"uni"), (P1, b"raw")]


def test_batches_are_delivered_only_when_committed_in_order_with_the_original_senders() -> None:
    h, epoch = member_in_view()
    h.send_many([Message(None, b"a"), Message(None, b"b")])
    h.take_sent()
    h.receive(C, [bcast(epoch, 1, 0, [(ME, 1, [b"a", b"b"]), (C, 1, [b"x"])])])
    assert h.take_delivered() == []
    acks = sent_kind(h, ACK)
    assert [(ep, m.headers[PID].seq) for ep, m in acks] == [(C.endpoint, 1)]
    h.receive(C, [bcast(epoch, 2, 1, [(P1, 1, [b"y"])])])  # commit 1 rides on batch 2
    assert payloads(h.take_delivered()) == [(ME, b"a"), (ME, b"b"), (C, b"x")]
    h.receive(C, [commit(epoch, 2)])
    assert payloads(h.take_delivered()) == [(P1, b"y")]
    assert not h.layer("sequencer").fwd_table  # our own are delivered: nothing left to resend


def test_a_lost_ack_is_sent_again_until_the_batch_is_committed() -> None:
    h, epoch = member_in_view()
    h.receive(C, [bcast(epoch, 1, 0, [(C, 1, [b"x"])])])
    assert len(sent_kind(h, ACK)) == 1
    h.advance(0.25)
    assert [m.headers[PID].seq for _, m in sent_kind(h, ACK)] == [1, 1]
    h.receive(C, [commit(epoch, 1)])
    h.advance(1.0)
    assert sent_kind(h, ACK) == []


def test_duplicates_are_discarded_by_the_received_table() -> None:
    h, epoch = member_in_view()
    h.receive(C, [bcast(epoch, 1, 0, [(P1, 1, [b"p1", b"p2"])]), bcast(epoch, 2, 1, [(P1, 2, [b"p2", b"p3"])])])
    h.receive(C, [commit(epoch, 2)])
    assert payloads(h.take_delivered()) == [(P1, b"p1"), (P1, b"p2"), (P1, b"p3")]
    assert h.metric("sequencer.duplicates") == 1
    # The same batch again (a retransmission, or a replay after failover) delivers nothing.
    h.receive(C, [bcast(epoch, 2, 1, [(P1, 2, [b"p2", b"p3"])])])
    assert h.take_delivered() == []


def test_batches_of_another_epoch_or_from_a_non_coordinator_are_ignored() -> None:
    h, epoch = member_in_view()
    h.receive(P1, [bcast(epoch, 1, 0, [(P1, 1, [b"no"])])])
    h.receive(C, [bcast(ViewId(9, C), 1, 0, [(C, 1, [b"no"])])])
    h.receive(C, [commit(epoch, 1)])
    assert h.take_delivered() == []
    assert h.metric("sequencer.foreign_batches") == 2


# ---- the coordinator: sequencing and batching ----------------------------------------------------------------


def coordinator_with(peer: Address = P1) -> tuple[LayerHarness, ViewId]:
    h = harness()
    view = h.install_view([ME, peer])
    epoch = view.view_id
    assert sent_kind(h, BCAST) == []  # nothing is sequenced before every member synced
    h.receive(peer, [sync_msg(epoch, epochs=[epoch])])
    return h, epoch


def test_the_coordinator_waits_for_every_sync_then_sequences_a_step_in_one_batch() -> None:
    h, epoch = coordinator_with()
    h.receive(P1, [forward(1, [b"p1", b"p2", b"p3"])])
    bcasts = sent_kind(h, BCAST)
    assert len(bcasts) == 1 and bcasts[0][0] == P1.endpoint
    assert runs_of(bcasts[0][1]) == [(P1, 1, [b"p1", b"p2", b"p3"])]
    h.send_many([Message(None, b"m1"), Message(None, b"m2")])
    bcasts = sent_kind(h, BCAST)
    assert [runs_of(m) for _, m in bcasts] == [[(ME, 1, [b"m1", b"m2"])]]
    assert h.take_delivered() == []  # P1 has not acknowledged yet: uniform delivery waits
    h.receive(P1, [ack(epoch, 2)])
    got = payloads(h.take_delivered())
    assert got == [(P1, b"p1"), (P1, b"p2"), (P1, b"p3"), (ME, b"m1"), (ME, b"m2")]
    commits = sent_kind(h, COMMIT)
    assert [m.headers[PID].commit for _, m in commits] == [2]


def test_a_flush_hold_freezes_the_coordinators_commits_and_sequencing_until_released() -> None:
    # FLUSH's digest is what every survivor delivers of the coordinator's stream: a commit the coordinator made
    # after it (and delivered itself) would reach nobody else in the old view.
    h, epoch = coordinator_with()
    h.receive(P1, [forward(1, [b"p1"])])
    assert len(sent_kind(h, BCAST)) == 1
    h.control(FlushHold())
    h.receive(P1, [ack(epoch, 1)])
    assert h.take_delivered() == []  # acknowledged by all, but not committed while the flush holds us
    assert sent_kind(h, COMMIT) == []
    h.receive(P1, [forward(2, [b"p2"])])
    assert sent_kind(h, BCAST) == []  # nothing sequenced either: it waits, or goes with the next view
    h.control(FlushRelease())  # the round was superseded or abandoned: carry on in this view
    assert payloads(h.take_delivered()) == [(P1, b"p1")]
    bcasts = sent_kind(h, BCAST)
    assert [runs_of(m) for _, m in bcasts] == [[(P1, 2, [b"p2"])]]
    assert bcasts[0][1].headers[PID].commit == 1


def test_a_new_view_ends_the_freeze() -> None:
    h, epoch = coordinator_with()
    h.control(FlushHold())
    view = h.install_view([ME, P1], seq=2)
    h.receive(P1, [sync_msg(view.view_id, epochs=[epoch, view.view_id])])
    h.receive(P1, [forward(1, [b"p1"])])
    assert [runs_of(m) for _, m in sent_kind(h, BCAST)] == [[(P1, 1, [b"p1"])]]


def test_batches_are_cut_at_max_batch_size() -> None:
    h = harness(max_batch_size="1KiB")
    view = h.install_view([ME, P1])
    h.receive(P1, [sync_msg(view.view_id, epochs=[view.view_id])])
    h.receive(P1, [forward(1, [bytes(300)] * 10)])
    bcasts = [m for _, m in sent_kind(h, BCAST)]
    assert len(bcasts) == 4
    assert all(len(m.payload) <= 1024 for m in bcasts)
    firsts = [runs_of(m)[0][1] for m in bcasts]
    assert firsts == [1, 4, 7, 10]  # the run continues in the next batch with the right forward seqno


def test_forwards_already_sequenced_are_not_sequenced_again() -> None:
    h, _ = coordinator_with()
    h.receive(P1, [forward(1, [b"a", b"b"])])
    h.receive(P1, [forward(2, [b"b", b"c"])])  # overlaps: only c is new
    runs = [runs_of(m) for _, m in sent_kind(h, BCAST)]
    assert runs == [[(P1, 1, [b"a", b"b"])], [(P1, 3, [b"c"])]]
    assert h.metric("sequencer.duplicate_forwards") == 1


def test_a_gap_in_a_senders_forwards_is_held_and_the_missing_ones_are_requested() -> None:
    h, _ = coordinator_with()
    h.receive(P1, [forward(3, [b"c"])])  # 1 and 2 never arrived
    sent = [(ep, m.headers[PID]) for ep, m in h.take_sent()]
    assert [(ep, hdr.kind, hdr.seq) for ep, hdr in sent] == [(P1.endpoint, RESEND, 1)]
    h.receive(P1, [forward(1, [b"a", b"b", b"c"])])
    runs = [runs_of(m) for _, m in sent_kind(h, BCAST)]
    assert runs == [[(P1, 1, [b"a", b"b", b"c"])]]


def test_a_member_resends_its_forwards_when_the_coordinator_asks() -> None:
    h, epoch = member_in_view()
    h.send_many([Message(None, b"a"), Message(None, b"b"), Message(None, b"c")])
    h.take_sent()
    h.receive(C, [Message(ME, flags=NO_RELIABILITY, headers={PID: SequencerHeader(RESEND, epoch, seq=2)})])
    fwd = sent_kind(h, FORWARD)
    assert [decode_forward(m.payload) for _, m in fwd] == [(2, [b"b", b"c"])]


def test_the_coordinator_asks_again_for_a_missing_sync() -> None:
    h = harness(sync_retry="500ms")
    h.install_view([ME, P1])
    h.advance(0.6)
    reqs = sent_kind(h, SYNC_REQ)
    assert [ep for ep, _ in reqs] == [P1.endpoint]


# ---- view changes: sync, replays, resends -------------------------------------------------------------------


def test_after_a_coordinator_crash_the_forward_table_goes_to_the_new_one_in_order() -> None:
    h, _ = member_in_view()
    h.send_many([Message(None, b"a"), Message(None, b"b")])
    h.send(b"c")
    h.take_sent()
    # C crashed before sequencing anything; P2 is the new coordinator.
    h.install_view([P2, ME], seq=2)
    syncs = sent_kind(h, SYNC)
    assert [ep for ep, _ in syncs] == [P2.endpoint]
    epochs, batches, fwd, fwd_seq, marks = msgpack.unpackb(syncs[0][1].payload, raw=False)
    assert fwd == [1, [b"a", b"b", b"c"]] and fwd_seq == 3
    assert len(epochs) == 2 and batches == [] and marks == []


def test_a_member_reports_undelivered_batches_and_they_are_delivered_after_the_replay() -> None:
    h, epoch = member_in_view()
    h.receive(C, [bcast(epoch, 1, 0, [(C, 1, [b"x"]), (P1, 1, [b"y"])])])
    h.take_sent()
    view2 = h.install_view([P2, ME], seq=2)  # C crashed; was batch 1 committed? Nobody knows here.
    syncs = sent_kind(h, SYNC)
    _epochs, batches, _fwd, _, marks = msgpack.unpackb(syncs[0][1].payload, raw=False)
    assert marks == []  # nothing delivered yet: the received-table is empty
    assert [(b[0], b[1]) for b in batches] == [(epoch.to_wire(), 1)]
    raw = batches[0][2]
    # The new coordinator replays it as its batch 1 (and it commits): delivered, in the old order.
    replay = Message(None, raw, headers={PID: SequencerHeader(BCAST, view2.view_id, 1, 0, (epoch, 1))})
    h.receive(P2, [replay, commit(view2.view_id, 1)])
    assert payloads(h.take_delivered()) == [(C, b"x"), (P1, b"y")]


def test_a_replay_of_an_epoch_this_member_was_not_in_is_delivered_at_its_position_and_not_again_later() -> None:
    # The member joined after epoch 4, whose coordinator sequenced P2's message 30 without committing it. In
    # epoch 10 (P2 partitioned away) the coordinator replays that batch and then sequences its own message.
    h = harness()
    v10 = h.install_view([C, ME, P1], seq=10).view_id
    old = ViewId(4, C)
    replay = pack([[P2.to_wire(), 30, [b"152"]]])
    h.receive(C, [Message(None, replay, headers={PID: SequencerHeader(BCAST, v10, 1, 0, (old, 67))})])
    h.receive(C, [bcast(v10, 2, 1, [(C, 59, [b"203"])]), commit(v10, 2)])
    # Delivered where C and P1 (which were in epoch 4) deliver it: before 203.
    assert payloads(h.take_delivered()) == [(P2, b"152"), (C, b"203")]
    assert h.metric("sequencer.batches_skipped") == 0
    # P2 comes back; it never delivered 152, so its forward-table sends it again with what followed.
    v12 = h.install_view([P1, ME, C, P2], seq=12).view_id
    h.receive(P1, [bcast(v12, 1, 0, [(P2, 30, [b"152", b"160"])]), commit(v12, 1)])
    assert payloads(h.take_delivered()) == [(P2, b"160")]  # 152 is not delivered a second time, after 203
    assert h.metric("sequencer.duplicates") == 1


def test_a_replay_of_an_epoch_this_member_delivered_already_is_skipped() -> None:
    h, epoch = member_in_view()
    h.receive(C, [bcast(epoch, 1, 0, [(P1, 1, [b"p1"])]), commit(epoch, 1)])
    assert payloads(h.take_delivered()) == [(P1, b"p1")]
    v2 = h.install_view([C, ME], seq=2).view_id
    raw = pack([[P1.to_wire(), 1, [b"p1"]]])
    h.receive(C, [Message(None, raw, headers={PID: SequencerHeader(BCAST, v2, 1, 0, (epoch, 1))}), commit(v2, 1)])
    assert h.take_delivered() == []
    assert h.metric("sequencer.batches_skipped") == 1


def test_the_new_coordinator_replays_reported_batches_then_sequences_only_what_they_lack() -> None:
    h = harness()
    old = h.install_view([C, ME, P1]).view_id
    h.receive(C, [bcast(old, 1, 0, [(P1, 1, [b"p1", b"p2"])])])
    h.take_sent()
    new = h.install_view([ME, P1], seq=2).view_id  # C crashed: we are the sequencer now
    assert sent_kind(h, BCAST) == []
    # P1 was in the old epoch (so the replay delivers p1, p2 to it) and still has p1..p3 in its forward-table.
    h.receive(P1, [sync_msg(new, epochs=[old, new], fwd=[1, [b"p1", b"p2", b"p3"]], fwd_seq=3)])
    bcasts = [m for _, m in sent_kind(h, BCAST)]
    assert [m.headers[PID].replay for m in bcasts] == [(old, 1), None]
    assert runs_of(bcasts[0]) == [(P1, 1, [b"p1", b"p2"])]
    assert runs_of(bcasts[1]) == [(P1, 3, [b"p3"])]  # p1, p2 are not sequenced a second time
    h.receive(P1, [ack(new, 2)])
    assert payloads(h.take_delivered()) == [(P1, b"p1"), (P1, b"p2"), (P1, b"p3")]


def test_a_replay_is_not_sequenced_again_from_the_forward_table_of_a_sender_whose_sync_omits_its_epoch() -> None:
    # A sender's messages are sequenced only in epochs it installed, but a SYNC names only the last MAX_EPOCHS
    # of them: whether the replay reaches the sender does not depend on that list any more.
    h = harness()
    new = h.install_view([ME, P1], seq=5).view_id
    old = ViewId(4, P2)  # P1 holds one of its batches, undelivered; its SYNC does not name it
    raw = pack([[P1.to_wire(), 1, [b"p1", b"p2"]]])
    h.receive(P1, [sync_msg(new, epochs=[new], batches=[(old, 3, raw)], fwd=[1, [b"p1", b"p2", b"p3"]], fwd_seq=3)])
    bcasts = [m for _, m in sent_kind(h, BCAST)]
    assert [m.headers[PID].replay for m in bcasts] == [(old, 3), None]
    assert runs_of(bcasts[1]) == [(P1, 3, [b"p3"])]  # the replay delivers p1, p2 to P1 as to everyone
    h.receive(P1, [ack(new, 2)])
    assert payloads(h.take_delivered()) == [(P1, b"p1"), (P1, b"p2"), (P1, b"p3")]


# ---- the received-table: senders that left ---------------------------------------------------------------


def restarted(i: int) -> Address:
    """The i-th incarnation of one endpoint: every restart is a new member."""
    return Address("127.0.0.1", 9000, 1000 + i)


def test_after_many_members_joined_and_left_the_received_table_holds_only_current_members(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sequencer_member, "_MAX_RETIRED", 8)
    h = harness()
    seq = 0
    for i in range(40):
        x = restarted(i)
        seq += 1
        vid = h.install_view([C, ME, x], seq=seq).view_id
        h.receive(C, [bcast(vid, 1, 0, [(x, 1, [b"hello"]), (C, i + 1, [b"c"])]), commit(vid, 1)])
        seq += 1
        h.install_view([C, ME], seq=seq)  # x crashed: its next incarnation joins next time
    assert len(h.take_delivered()) == 80
    layer = h.layer("sequencer")
    assert set(layer.high) == {C}
    assert list(layer.retired) == [restarted(i) for i in range(32, 40)]  # bounded: the oldest are forgotten
    assert h.metric("sequencer.retired_forgotten") == 32


def test_a_member_that_comes_back_with_its_address_finds_its_entry_again_nothing_twice() -> None:
    h = harness()
    v1 = h.install_view([C, ME, P1]).view_id
    h.receive(C, [bcast(v1, 1, 0, [(P1, 1, [b"a", b"b"])]), commit(v1, 1)])
    assert payloads(h.take_delivered()) == [(P1, b"a"), (P1, b"b")]
    h.install_view([C, ME], seq=2)  # P1 is cut off
    layer = h.layer("sequencer")
    assert layer.high == {} and layer.retired == {P1: 2}
    # The partition heals; P1 never got a and b delivered itself, so its forward-table has them sequenced again.
    v3 = h.install_view([C, ME, P1], seq=3).view_id
    assert layer.high[P1] == 2 and P1 not in layer.retired
    h.receive(C, [bcast(v3, 1, 0, [(P1, 1, [b"a", b"b", b"c"])]), commit(v3, 1)])
    assert payloads(h.take_delivered()) == [(P1, b"c")]
    assert h.metric("sequencer.duplicates") == 2


def test_a_replay_brings_nothing_twice_from_a_sender_outside_the_view() -> None:
    h = harness()
    v1 = h.install_view([C, ME, P1]).view_id
    h.receive(C, [bcast(v1, 1, 0, [(P1, 1, [b"a"])]), commit(v1, 1)])
    v2 = h.install_view([C, ME], seq=2).view_id
    # A batch of an epoch we were not in that also holds P1's a (sequenced a second time on another side).
    raw = pack([[P1.to_wire(), 1, [b"a", b"b"]]])
    replay = Message(None, raw, headers={PID: SequencerHeader(BCAST, v2, 1, 0, (ViewId(1, P2), 4))})
    h.receive(C, [replay, commit(v2, 1)])
    assert payloads(h.take_delivered()) == [(P1, b"a"), (P1, b"b")]  # a from v1, then only b
    layer = h.layer("sequencer")
    assert layer.high == {} and layer.retired == {P1: 2}


def skipped_in(sync: Message) -> dict[Address, list[int]]:
    *_, skipped = msgpack.unpackb(sync.payload, raw=False)
    return {Address(*wire): bounds for wire, bounds in skipped}


def test_a_member_announces_in_its_sync_what_it_skipped_past_but_not_what_it_skipped_when_joining() -> None:
    # We joined C's group: what we skip before our first multicast (STATE's request) is delivered, the state holds.
    h, v1 = member_in_view()
    h.send(b"request")
    h.receive(C, [bcast(v1, 1, 0, [(P1, 40, [b"a"])]), commit(v1, 1)])
    v2 = h.install_view([C, ME, P1], seq=2).view_id
    assert skipped_in(sent_kind(h, SYNC)[0][1]) == {}
    h.receive(C, [bcast(v2, 1, 0, [(P2, 7, [b"y"]), (ME, 1, [b"request"]), (P1, 41, [b"b"])]), commit(v2, 1)])
    # P1 delivered its 42..44 without us (say, on its own side of a partition): we deliver past them.
    h.receive(C, [bcast(v2, 2, 1, [(P1, 45, [b"f"]), (P2, 10, [b"x"])]), commit(v2, 2)])
    got = [(P1, b"a"), (P2, b"y"), (ME, b"request"), (P1, b"b"), (P1, b"f"), (P2, b"x")]
    assert payloads(h.take_delivered()) == got
    h.install_view([P2, ME], seq=3)  # P1 left: what we skipped of it is announced all the same
    assert skipped_in(sent_kind(h, SYNC)[0][1]) == {P1: [42, 44], P2: [8, 9]}


def test_a_sync_with_much_skipped_is_cut_into_parts_and_taken_whole() -> None:
    h = harness(max_batch_size="1KiB")
    layer = h.layer("sequencer")
    many = [restarted(i) for i in range(100)]
    layer.gaps = {x: [(1, 5), (9, 9)] for x in many}
    h.install_view([C, ME])
    parts = [m for _, m in sent_kind(h, SYNC)]
    assert len(parts) > 1
    got: dict[Address, list[int]] = {}
    for part in parts:
        got.update(skipped_in(part))
    assert got == {x: [1, 5, 9, 9] for x in many}
    # As coordinator, the parts of a peer's SYNC are put together: its skipped ranges count.
    c = harness()
    v = c.install_view([ME, P1]).view_id
    raw = pack([[P2.to_wire(), 1, [b"p%d" % i for i in range(1, 11)]]])
    wire_parts = [msgpack.unpackb(p.payload, raw=False) for p in parts]
    wire_parts[0][1] = [[ViewId(1, P2).to_wire(), 1, raw]]
    wire_parts[0][4].append([P2.to_wire(), [2, 9]])
    c.receive(
        P1,
        [
            Message(ME, pack(body), headers={PID: SequencerHeader(SYNC, v, i, len(parts))})
            for i, body in enumerate(wire_parts)
        ],
    )
    assert [runs_of(m) for _, m in sent_kind(c, BCAST)] == [[(P2, 1, [b"p1"]), (P2, 10, [b"p10"])]]


def departed_sender_replay(
    skipped: dict[Address, list[tuple[int, int]]] | None,
) -> tuple[LayerHarness, list[Message]]:
    """We delivered P2's forwards 1..6 in epoch 2, then its 7..9 were sequenced there but not committed before
    P2 left; we coordinate view 3 with P1, whose SYNC says it ``skipped`` these. The replays sent."""
    h = harness()
    h.install_view([C, ME])
    v2 = h.install_view([C, ME, P2], seq=2).view_id
    h.receive(C, [bcast(v2, 1, 0, [(P2, 1, [b"p%d" % i for i in range(1, 7)])]), commit(v2, 1)])
    assert len(h.take_delivered()) == 6
    h.receive(C, [bcast(v2, 2, 1, [(P2, 7, [b"p7", b"p8", b"p9"]), (C, 1, [b"c1"])])])
    h.take_sent()
    v3 = h.install_view([ME, P1], seq=3).view_id
    h.receive(P1, [sync_msg(v3, epochs=[v3], skipped=skipped)])
    bcasts = [m for _, m in sent_kind(h, BCAST)]
    assert [m.headers[PID].replay for m in bcasts] == [(v2, 2)]
    h.receive(P1, [ack(v3, 1)])
    return h, bcasts


def test_a_replay_leaves_out_what_another_member_skipped_past_so_every_member_delivers_the_same() -> None:
    # P1 delivered P2's forwards from 104 on, on the other side of a partition, having never seen 7..103: it
    # cannot deliver them any more (it drops what its received-table holds), so we must not either.
    h, bcasts = departed_sender_replay({P2: [(7, 103)]})
    assert runs_of(bcasts[0]) == [(C, 1, [b"c1"])]
    assert payloads(h.take_delivered()) == [(C, b"c1")]
    assert h.metric("sequencer.replays_trimmed") == 1


def test_a_replay_cut_by_what_was_skipped_keeps_the_rest_of_the_run() -> None:
    h, bcasts = departed_sender_replay({P2: [(8, 8), (40, 50)], C: [(3, 4)]})
    assert runs_of(bcasts[0]) == [(P2, 7, [b"p7"]), (P2, 9, [b"p9"]), (C, 1, [b"c1"])]
    assert payloads(h.take_delivered()) == [(P2, b"p7"), (P2, b"p9"), (C, b"c1")]


@pytest.mark.parametrize("skipped", [None, {}, {P2: [(1, 6)]}])
def test_a_replay_keeps_what_no_member_skipped(skipped: dict[Address, list[tuple[int, int]]] | None) -> None:
    h, bcasts = departed_sender_replay(skipped)  # None: a peer whose SYNC has four fields
    assert runs_of(bcasts[0]) == [(P2, 7, [b"p7", b"p8", b"p9"]), (C, 1, [b"c1"])]
    assert payloads(h.take_delivered()) == [(P2, b"p7"), (P2, b"p8"), (P2, b"p9"), (C, b"c1")]
    assert h.metric("sequencer.replays_trimmed") == 0


def test_a_forward_table_is_sequenced_without_what_another_member_skipped_past() -> None:
    h = harness()
    v = h.install_view([ME, P1, P2]).view_id
    h.receive(P1, [sync_msg(v, epochs=[v], fwd=[1, [b"a", b"b", b"c"]], fwd_seq=3, skipped={})])
    h.receive(P2, [sync_msg(v, epochs=[v], skipped={P1: [(2, 2)]})])
    bcasts = [m for ep, m in sent_kind(h, BCAST) if ep == P1.endpoint]  # a multicast: one copy per peer
    assert [runs_of(m) for m in bcasts] == [[(P1, 1, [b"a"]), (P1, 3, [b"c"])]]
    h.receive(P1, [forward(2, [b"b", b"c", b"d"])])  # b comes again: it is not sequenced either
    assert [runs_of(m) for ep, m in sent_kind(h, BCAST) if ep == P1.endpoint] == [[(P1, 4, [b"d"])]]


def test_a_sync_that_overtakes_the_view_is_kept_for_it() -> None:
    h = harness()
    h.install_view([C, ME, P1])
    future = ViewId(2, ME)
    h.receive(P1, [sync_msg(future, epochs=[future])])
    h.install_view([ME, P1], seq=2)
    h.send(b"mine")
    bcasts = sent_kind(h, BCAST)  # P1's early SYNC counted: the epoch opened at once
    assert [runs_of(m) for _, m in bcasts] == [[(ME, 1, [b"mine"])]]


def test_multicasts_sent_before_the_first_view_wait_and_travel_with_the_first_sync() -> None:
    h = harness(max_queued="100B")
    h.send(bytes(60))
    h.send(bytes(60))
    assert h.take_events(Backpressure) == [Backpressure(True)]
    assert sent_kind(h, FORWARD) == []
    h.install_view([C, ME])
    syncs = sent_kind(h, SYNC)
    _e, _b, fwd, _, _marks = msgpack.unpackb(syncs[0][1].payload, raw=False)
    assert fwd == [1, [bytes(60), bytes(60)]]
    view = h.layer("sequencer").view
    h.receive(C, [bcast(view.view_id, 1, 0, [(ME, 1, [bytes(60), bytes(60)])]), commit(view.view_id, 1)])
    assert h.take_events(Backpressure) == [Backpressure(False)]


def test_upper_headers_and_flags_travel_with_the_message() -> None:
    h = LayerHarness([{"layer": "sequencer"}])
    view = h.install_view([ME])
    msg = Message(None, b"part", flags=OOB, headers={protocol_ids.FRAG: FragHeader(5, 0, 1)})
    h.send_many([msg])
    got = h.take_delivered()
    assert len(got) == 1
    assert got[0].flags == OOB and got[0].headers[protocol_ids.FRAG] == FragHeader(5, 0, 1)
    assert got[0].src == ME and view.members == (ME,)


def test_a_fragmented_message_is_delivered_in_one_piece_even_across_a_view_change() -> None:
    h, epoch = member_in_view()
    frag = protocol_ids.FRAG

    def item(i: int) -> list[Any]:
        return [0, [frag, FragHeader(7, i, 3).to_wire()], f"f{i}".encode()]

    h.receive(C, [bcast(epoch, 1, 0, [(P1, 1, [item(0), item(1)])]), bcast(epoch, 2, 1, [(P1, 3, [item(2)])])])
    assert h.take_delivered() == []  # fragments 0 and 1 are committed, 2 is not yet
    view2 = h.install_view([P2, ME], seq=2)
    h.take_sent()
    raw = pack([[P1.to_wire(), 3, [item(2)]]])
    h.receive(P2, [Message(None, raw, headers={PID: SequencerHeader(BCAST, view2.view_id, 1, 0, (epoch, 2))})])
    h.receive(P2, [commit(view2.view_id, 1)])
    assert [m.payload for m in h.take_delivered()] == [b"f0", b"f1", b"f2"]


def test_a_singleton_sequences_and_delivers_its_own_messages_at_once() -> None:
    h = harness()
    h.install_view([ME])
    h.send_many([Message(None, b"1"), Message(None, b"2")])
    assert payloads(h.take_delivered()) == [(ME, b"1"), (ME, b"2")]


def test_leaving_waits_for_own_multicasts_then_goes() -> None:
    h, epoch = member_in_view()
    h.send(b"last")
    h.take_sent()
    h.control(Disconnect())
    seq = h.layer("sequencer")
    assert seq.leave_pending
    h.receive(C, [bcast(epoch, 1, 0, [(ME, 1, [b"last"])]), commit(epoch, 1)])
    assert payloads(h.take_delivered()) == [(ME, b"last")]
    assert not seq.leave_pending


def test_after_left_nothing_is_forwarded() -> None:
    h, _ = member_in_view()
    h.up_event_from_bottom(Left("left"))
    h.send(b"late")
    assert sent_kind(h, FORWARD) == []
    assert h.metric("sequencer.dropped_after_leaving") == 1


def test_view_changes_pass_up() -> None:
    h = harness()
    view = h.install_view([C, ME])
    assert [e.view for e in h.take_events(ViewChange)] == [view]


# ---- malformed input ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "wire",
    [
        [],
        "x",
        [9],
        [FORWARD, 1],
        [BCAST, [1, ["h", 1, 1]], 1, 0],
        [BCAST, [1, ["h", 1, 1]], 0, 0, None],
        [BCAST, [1, ["h", 1, 1]], 2, 2, None],
        [BCAST, [1, ["h", 1, 1]], 2, 0, [1, 2]],
        [BCAST, [1, "h"], 1, 0, None],
        [COMMIT, [1, ["h", 1, 1]], -1],
        [ACK, [1, ["h", 1, 1]], "1"],
        [SYNC, [1, ["h", 1, 1]], 3, 2],
        [SYNC, [1, ["h", 1, 1]], 0, 0],
        [RESEND, [1, ["h", 1, 1]], 0],
        [SYNC_REQ, [1, ["h", 1, 1]], 0],
    ],
)
def test_malformed_headers_are_rejected(wire: Any) -> None:
    with pytest.raises(WireError):
        SequencerHeader.from_wire(wire)


def test_headers_round_trip() -> None:
    epoch = ViewId(3, C)
    for hdr in (
        SequencerHeader(FORWARD),
        SequencerHeader(BCAST, epoch, 4, 3, (ViewId(2, P1), 9)),
        SequencerHeader(BCAST, epoch, 1, 0),
        SequencerHeader(COMMIT, epoch, commit=7),
        SequencerHeader(ACK, epoch, seq=5),
        SequencerHeader(SYNC, epoch, 1, 2),
        SequencerHeader(SYNC_REQ, epoch),
        SequencerHeader(RESEND, epoch, seq=4),
    ):
        back = SequencerHeader.from_wire(hdr.to_wire())
        assert (back.kind, back.epoch, back.seq, back.commit, back.replay) == (
            hdr.kind,
            hdr.epoch,
            hdr.seq,
            hdr.commit,
            hdr.replay,
        )


UNIFORM_FRAG = FragHeader(3, 0, 1).to_wire()


@pytest.mark.parametrize(
    "payload",
    [
        b"\xc1",
        pack([1]),
        pack([0, [b"x"]]),
        pack([1, []]),
        pack([1, ["text"]]),
        pack([1, [[0, [], "text"]]]),
        pack([1, [[99, [], b"x"]]]),
        pack([1, [[0, [protocol_ids.SEQUENCER, [0]], b"x"]]]),
        pack([1, [[0, [12345, [0]], b"x"]]]),
        pack([1, [[0, [protocol_ids.FRAG, [1, 5, 2]], b"x"]]]),
        # the uniform form: [start, payloads, flags, protocol id, header wire forms]
        pack([1, [b"a"], 0, protocol_ids.FRAG]),  # four fields
        pack([1, [], 0, protocol_ids.FRAG, []]),  # empty
        pack([1, [b"a", b"b"], 0, protocol_ids.FRAG, [UNIFORM_FRAG]]),  # a header short
        pack([1, ["text"], 0, protocol_ids.FRAG, [UNIFORM_FRAG]]),
        pack([1, [b"a"], 99, protocol_ids.FRAG, [UNIFORM_FRAG]]),
        pack([1, [b"a"], 0, protocol_ids.SEQUENCER, [[0]]]),
        pack([1, [b"a"], 0, 12345, [[0]]]),
        pack([1, [b"a"], 0, protocol_ids.FRAG, [[1, 5, 2]]]),
        pack([1, [b"a"], 0, protocol_ids.FRAG, "no list"]),
    ],
)
def test_malformed_forwards_are_dropped_and_counted(payload: bytes) -> None:
    with pytest.raises(WireError):
        decode_forward(payload)
    h, _ = coordinator_with()
    h.receive(P1, [Message(ME, payload, headers={PID: SequencerHeader(FORWARD)})])
    assert sent_kind(h, BCAST) == []
    assert h.metric("sequencer.bad_forwards") == 1


def test_a_malformed_batch_is_acknowledged_but_delivers_nothing() -> None:
    h, epoch = member_in_view()
    bad = Message(None, pack([["not", "an", "address"]]), headers={PID: SequencerHeader(BCAST, epoch, 1, 0)})
    h.receive(C, [bad, bcast(epoch, 2, 1, [(C, 1, [b"ok"])]), commit(epoch, 2)])
    assert payloads(h.take_delivered()) == [(C, b"ok")]
    assert h.metric("sequencer.bad_batches") == 1


def test_a_malformed_sync_is_ignored_and_asked_for_again() -> None:
    h = harness()
    view = h.install_view([ME, P1])
    h.receive(P1, [Message(ME, pack([1, 2]), headers={PID: SequencerHeader(SYNC, view.view_id, 0, 1)})])
    assert h.metric("sequencer.bad_syncs") == 1
    h.send(b"waits")
    assert sent_kind(h, BCAST) == []


@pytest.mark.parametrize(
    "skipped",
    [
        [[P2.to_wire(), [3]]],  # a range without its end
        [[P2.to_wire(), [0, 4]]],  # forward seqnos start at 1
        [["not", "an", "address"]],
        "nope",
    ],
)
def test_a_sync_with_a_malformed_skipped_field_is_ignored(skipped: Any) -> None:
    h = harness()
    view = h.install_view([ME, P1]).view_id
    body = [[view.to_wire()], [], None, 0, skipped]
    h.receive(P1, [Message(ME, pack(body), headers={PID: SequencerHeader(SYNC, view, 0, 1)})])
    assert h.metric("sequencer.bad_syncs") == 1
    h.send(b"waits")
    assert sent_kind(h, BCAST) == []


def test_bad_configuration_names_the_key() -> None:
    with pytest.raises(ConfigError, match="max_batch_size"):
        resolve_config([{"layer": "transport"}, {"layer": "sequencer", "max_batch_size": "1B"}])
    with pytest.raises(ConfigError, match="unknown key 'batch'"):
        resolve_config([{"layer": "transport"}, {"layer": "sequencer", "batch": 1}])


def test_the_coordinator_delivers_its_own_batches_with_upper_headers_decoded() -> None:
    # The coordinator takes its own BCAST's runs from what it packed (no second unpack): the messages it
    # delivers must still carry header objects, for forwarded items and its own alike.
    h, epoch = coordinator_with()
    frag = protocol_ids.FRAG
    h.receive(P1, [forward(1, [[0, [frag, FragHeader(3, 0, 1).to_wire()], b"p1"], b"p2"])])
    h.send_many([Message(None, b"m1", flags=OOB, headers={frag: FragHeader(4, 0, 1)})])
    h.take_sent()
    h.receive(P1, [ack(epoch, 2)])
    got = h.take_delivered()
    assert payloads(got) == [(P1, b"p1"), (P1, b"p2"), (ME, b"m1")]
    assert got[0].headers == {frag: FragHeader(3, 0, 1)} and got[1].headers == {}
    assert got[2].flags == OOB and got[2].headers == {frag: FragHeader(4, 0, 1)}


def test_a_bad_item_after_good_ones_is_named_in_the_error() -> None:
    frag = protocol_ids.FRAG
    good = [0, [frag, FragHeader(3, 0, 1).to_wire()], b"ok"]
    with pytest.raises(WireError, match=r"items\[2\]\.headers\[FragHeader\]"):
        decode_forward(pack([1, [b"a", good, [0, [frag, [1, 5, 2]], b"x"]]]))
    with pytest.raises(WireError, match=r"items\[1\]\.headers: protocol id 10 appears twice"):
        decode_forward(pack([1, [good, [0, [frag, [3, 0, 1], frag, [3, 0, 1]], b"x"]]]))


# ---- the uniform form of runs (one header per message), the forward window ------------------------------------


def frag_msgs(n: int) -> list[Message]:
    frag = protocol_ids.FRAG
    return [Message(None, f"m{i}".encode(), flags=OOB, headers={frag: FragHeader(i, 0, 1)}) for i in range(n)]


def test_messages_with_one_header_each_are_forwarded_in_the_uniform_form() -> None:
    frag = protocol_ids.FRAG
    h, _ = member_in_view()
    h.send_many(frag_msgs(3))
    ((_, fwd),) = sent_kind(h, FORWARD)
    wires = [FragHeader(i, 0, 1).to_wire() for i in range(3)]
    # Four lists for the whole run instead of three per message.
    assert msgpack.unpackb(fwd.payload) == [1, [b"m0", b"m1", b"m2"], OOB, frag, wires]
    assert decode_forward(fwd.payload) == (1, [[OOB, [frag, w], f"m{i}".encode()] for i, w in enumerate(wires)])


def test_the_coordinator_sequences_uniform_forwards_in_uniform_runs_and_delivers_them_with_headers() -> None:
    frag = protocol_ids.FRAG
    h, epoch = coordinator_with()
    body = [1, [b"p0", b"p1"], OOB, frag, [FragHeader(7, 0, 1).to_wire(), FragHeader(8, 0, 1).to_wire()]]
    h.receive(P1, [Message(ME, pack(body), headers={PID: SequencerHeader(FORWARD)})])
    ((_, batch),) = sent_kind(h, BCAST)
    assert msgpack.unpackb(batch.payload) == [[P1.to_wire(), *body]]
    h.receive(P1, [ack(epoch, 1)])
    got = h.take_delivered()
    assert payloads(got) == [(P1, b"p0"), (P1, b"p1")]
    assert [m.headers for m in got] == [{frag: FragHeader(7, 0, 1)}, {frag: FragHeader(8, 0, 1)}]
    assert all(m.flags == OOB for m in got)


def test_a_member_delivers_a_uniform_run_with_its_headers() -> None:
    frag = protocol_ids.FRAG
    h, epoch = member_in_view()
    run = [C.to_wire(), 1, [b"x", b"y"], 0, frag, [FragHeader(7, 0, 1).to_wire(), FragHeader(8, 0, 1).to_wire()]]
    h.receive(C, [Message(None, pack([run]), headers={PID: SequencerHeader(BCAST, epoch, 1, 0)}), commit(epoch, 1)])
    got = h.take_delivered()
    assert payloads(got) == [(C, b"x"), (C, b"y")]
    assert [m.headers for m in got] == [{frag: FragHeader(7, 0, 1)}, {frag: FragHeader(8, 0, 1)}]


def test_a_member_delivers_a_uniform_run_decoded_into_messages_minus_what_it_delivered_already() -> None:
    # STATE's header on every message: the run is decoded straight into the messages it delivers.
    state = protocol_ids.STATE
    h, epoch = member_in_view()
    h.receive(C, [bcast(epoch, 1, 0, [(C, 1, [b"a"])]), commit(epoch, 1)])
    assert payloads(h.take_delivered()) == [(C, b"a")]
    run = [C.to_wire(), 1, [b"a", b"b", b"c"], OOB, state, [[0, 1], [0, 2], [0, 3]]]
    runs = decode_batch(pack([run]), lambda wire, field: Address(*wire))
    assert [(m.src, m.dest, m.payload, m.flags, m.headers) for m in runs[0][2]] == [
        (C, None, p, OOB, {state: StateHeader(DATA, i)}) for i, p in enumerate([b"a", b"b", b"c"], 1)
    ]
    h.receive(C, [Message(None, pack([run]), headers={PID: SequencerHeader(BCAST, epoch, 2, 1)}), commit(epoch, 2)])
    got = h.take_delivered()
    assert payloads(got) == [(C, b"b"), (C, b"c")]  # the first was delivered by batch 1
    assert [m.headers for m in got] == [{state: StateHeader(DATA, 2)}, {state: StateHeader(DATA, 3)}]
    assert h.metric("sequencer.duplicates") == 1


def test_a_malformed_uniform_run_is_acknowledged_but_delivers_nothing() -> None:
    h, epoch = member_in_view()
    run = [C.to_wire(), 1, [b"x", b"y"], 0, protocol_ids.FRAG, [UNIFORM_FRAG]]
    bad = Message(None, pack([run]), headers={PID: SequencerHeader(BCAST, epoch, 1, 0)})
    h.receive(C, [bad, bcast(epoch, 2, 1, [(C, 1, [b"ok"])]), commit(epoch, 2)])
    assert payloads(h.take_delivered()) == [(C, b"ok")]
    assert h.metric("sequencer.bad_batches") == 1


def forwarded(h: LayerHarness) -> list[tuple[int, int]]:
    return [(start, len(items)) for start, items in (decode_forward(m.payload) for _, m in sent_kind(h, FORWARD))]


def test_a_member_forwards_no_more_than_its_window_until_it_sees_its_forwards_sequenced() -> None:
    # Everything forwarded at once queues at the coordinator, and our ACKs travel behind it: no batch could
    # commit before the coordinator had read all of it.
    h = harness(forward_window=4, max_batch_size="1KiB")
    epoch = h.install_view([C, ME]).view_id
    h.take_sent()
    msgs = [Message(None, bytes([i]) * 300) for i in range(10)]
    h.send_many(msgs)
    assert forwarded(h) == [(1, 3), (4, 1)]  # 3 fit in 1 KiB; the window of 4 messages is used
    h.send(b"later")
    assert forwarded(h) == []  # waits in the forward-table
    assert h.metric("sequencer.forwards_windowed") >= 1
    h.receive(C, [bcast(epoch, 1, 0, [(ME, 1, [m.payload for m in msgs[:3]])])])
    assert forwarded(h) == [(5, 3)]  # the first FORWARD left the window: room for three more
    # The coordinator holds what came after a gap and asks again: the window must not keep those back.
    h.receive(C, [Message(ME, flags=NO_RELIABILITY, headers={PID: SequencerHeader(RESEND, epoch, seq=2)})])
    assert forwarded(h) == [(2, 3), (5, 1)]


def test_a_full_window_without_progress_forwards_again_from_the_first_unseen() -> None:
    # What we forwarded may be lost (a coordinator-to-be drops strays beyond max_stray); with the window full,
    # no later FORWARD would show the coordinator the gap. After sync_retry without progress we forward again.
    h = harness(forward_window=4, max_batch_size="1KiB", sync_retry="500ms")
    epoch = h.install_view([C, ME]).view_id
    h.take_sent()
    msgs = [Message(None, bytes([i]) * 300) for i in range(6)]
    h.send_many(msgs)
    assert forwarded(h) == [(1, 3), (4, 1)]
    h.advance(0.3)
    assert forwarded(h) == []
    h.receive(C, [bcast(epoch, 1, 0, [(ME, 1, [m.payload for m in msgs[:3]])])])  # progress: no resend
    assert forwarded(h) == [(5, 2)]
    h.advance(0.3)
    assert forwarded(h) == [] and h.metric("sequencer.window_stalls") == 0
    h.send_many([Message(None, bytes([9]) * 300) for _ in range(3)])  # waits: 3 in flight, room for 1
    assert forwarded(h) == [(7, 1)]
    h.advance(0.6)  # no progress since the window filled: forward again from 4, the first unseen
    assert h.metric("sequencer.window_stalls") == 1
    assert forwarded(h) == [(4, 3), (7, 1)]
