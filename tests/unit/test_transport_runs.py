"""The transport's runs: multicasts travel as runs only to members that said they decode them (hello frames)."""

from __future__ import annotations

from groupcluster.core import protocol_ids
from groupcluster.core.address import Address
from groupcluster.core.message import Message
from groupcluster.core.wire import FORMAT_VERSION, RUNS_VERSION, encode_frame
from groupcluster.protocols.nakack import MSG, NakAckHeader

from .harness import CLUSTER, ME, PEERS, LayerHarness

P1, P2 = PEERS[0], PEERS[1]


def stack(**transport: object) -> LayerHarness:
    return LayerHarness([{"layer": "transport", **transport}, {"layer": "nakack"}])


def hello_from(h: LayerHarness, peer: Address) -> None:
    h.receive_raw(encode_frame(CLUSTER, peer, [], RUNS_VERSION))


def send_three(h: LayerHarness) -> list[int]:
    """Three multicasts in one step; the versions of the frames they left in (one per target)."""
    h.send_many([Message(None, b"a"), Message(None, b"b"), Message(None, b"c")])
    frames = h.take_frames()
    assert all(len(f.messages) == 3 for f in frames)
    return [f.version for f in frames]


def test_each_member_of_a_new_view_is_told_once_with_an_empty_runs_frame():
    h = stack()
    h.install_view([ME, P1, P2])
    assert sorted((f.endpoint, f.version, f.messages) for f in h.hellos) == [
        (P1.endpoint, RUNS_VERSION, []),
        (P2.endpoint, RUNS_VERSION, []),
    ]
    assert h.metric("transport.hellos_sent") == 2


def test_multicasts_go_as_runs_only_once_every_target_said_it_decodes_them():
    h = stack()
    h.install_view([ME, P1, P2])
    assert send_three(h) == [FORMAT_VERSION, FORMAT_VERSION]  # nobody said so yet
    hello_from(h, P1)
    assert send_three(h) == [FORMAT_VERSION, FORMAT_VERSION]  # P2 (maybe the previous version) did not
    hello_from(h, P2)
    assert send_three(h) == [RUNS_VERSION, RUNS_VERSION]
    # Unicasts never hold runs.
    h.send(b"u", dest=P1)
    assert [f.version for f in h.take_frames()] == [FORMAT_VERSION]


def test_a_hello_from_a_member_not_known_before_is_answered_once():
    h = stack()
    h.install_view([ME, P1])
    h.hellos.clear()
    hello_from(h, P1)  # our hello to P1 may have been lost: tell it again
    assert [f.endpoint for f in h.hellos] == [P1.endpoint]
    hello_from(h, P1)  # already known: no answer, so two new members never loop
    assert len(h.hellos) == 1


def test_a_member_restarted_at_the_same_endpoint_must_say_so_again():
    h = stack()
    h.install_view([ME, P1])
    hello_from(h, P1)
    h.hellos.clear()
    reborn = Address(P1.host, P1.port, P1.incarnation + 1)  # e.g. rolled back to the previous version
    h.install_view([ME, reborn], seq=2)
    assert [f.endpoint for f in h.hellos] == [reborn.endpoint]
    assert send_three(h) == [FORMAT_VERSION]
    hello_from(h, reborn)
    assert send_three(h) == [RUNS_VERSION]


def test_a_hello_before_our_view_counts_once_the_view_names_the_member():
    h = stack()
    h.install_view([ME, P1])
    hello_from(h, P2)  # a joiner that installed the next view first
    hello_from(h, P1)
    h.install_view([ME, P1, P2], seq=2)
    assert send_three(h) == [RUNS_VERSION, RUNS_VERSION]


def test_runs_from_a_peer_are_delivered_in_order_with_their_seqnos():
    h = stack()
    h.install_view([ME, P1])
    msgs = [Message(None, bytes([s]), headers={protocol_ids.NAKACK: NakAckHeader(MSG, s)}) for s in (1, 2, 3, 5, 4)]
    h.receive(P1, msgs, runs=True)
    got = h.take_delivered()
    assert [(m.src, m.payload) for m in got] == [(P1, bytes([s])) for s in (1, 2, 3, 4, 5)]
    assert [m.headers[protocol_ids.NAKACK].seqno for m in got] == [1, 2, 3, 4, 5]


def test_without_wire_runs_nothing_but_the_previous_format_is_sent():
    h = stack(wire_runs=False)
    h.install_view([ME, P1])
    hello_from(h, P1)
    assert h.hellos == []
    assert send_three(h) == [FORMAT_VERSION]
