"""FRAG: splitting, reassembly in batch order, duplicates and stale ids, the memory bound, view changes, bad input."""

from __future__ import annotations

import msgpack
import pytest
from groupcluster.core import protocol_ids
from groupcluster.core.errors import ConfigError, WireError
from groupcluster.core.message import NO_FRAG, NO_RELIABILITY, OOB, Message
from groupcluster.protocols.frag import _MAX_DONE, MAX_FRAGMENTS, FragHeader, _Sender

from .harness import ME, PEERS, LayerHarness

FRAG = protocol_ids.FRAG
P1, P2, P3 = PEERS[:3]


def make(**params) -> LayerHarness:
    h = LayerHarness([{"layer": "frag", "frag_size": 1000, **params}])
    h.install_view([ME, P1, P2])
    h.take_events()
    return h


def frag(frag_id: int, index: int, count: int, payload: bytes, dest=None, flags: int = 0) -> Message:
    return Message(dest, payload, flags=flags, headers={FRAG: FragHeader(frag_id, index, count)})


def pieces(data: bytes, frag_id: int, size: int = 1000) -> list[Message]:
    chunks = [data[i : i + size] for i in range(0, len(data), size)]
    return [frag(frag_id, i, len(chunks), c) for i, c in enumerate(chunks)]


def wire_messages(h: LayerHarness, endpoint) -> list[Message]:
    return [m for ep, m in h.take_sent() if ep == endpoint]


def test_small_messages_pass_unchanged():
    h = make()
    h.send(b"x" * 1000)
    [msg] = wire_messages(h, P1.endpoint)
    assert msg.payload == b"x" * 1000 and FRAG not in msg.headers


def test_large_message_is_split_with_same_dest_and_flags():
    h = make()
    data = bytes(range(256)) * 10  # 2560 bytes -> 3 fragments
    h.send(data, dest=P1, flags=OOB | NO_RELIABILITY)
    msgs = wire_messages(h, P1.endpoint)
    assert [m.headers[FRAG].to_wire() for m in msgs] == [[0, 0, 3], [0, 1, 3], [0, 2, 3]]
    assert [len(m.payload) for m in msgs] == [1000, 1000, 560]
    assert b"".join(m.payload for m in msgs) == data
    assert all(m.dest == P1 and m.flags == OOB | NO_RELIABILITY for m in msgs)
    assert h.metric("frag.fragments_sent") == 3


def test_no_frag_flag_is_respected():
    h = make()
    h.send(b"y" * 5000, flags=NO_FRAG)
    [msg] = wire_messages(h, P1.endpoint)
    assert len(msg.payload) == 5000 and FRAG not in msg.headers


def test_frag_ids_increase_per_message():
    h = make()
    h.send(b"a" * 1500)
    h.send(b"b" * 1500, dest=P2)
    h.send(b"c" * 1500)
    ids = sorted({m.headers[FRAG].frag_id for _, m in h.take_sent()})
    assert ids == [0, 1, 2]


def test_own_multicast_is_reassembled_on_loopback():
    h = make()
    data = b"z" * 4321
    h.send(data)
    [whole] = h.take_delivered()
    assert whole.payload == data and whole.src == ME and FRAG not in whole.headers


def test_round_trip_between_two_members():
    sender = make()
    data = bytes(i % 251 for i in range(10_000))
    sender.send(data)
    wire = wire_messages(sender, P1.endpoint)
    assert len(wire) == 10
    receiver = LayerHarness([{"layer": "frag", "frag_size": 1000}], me=P1)
    receiver.receive(ME, wire[:4])
    assert receiver.take_delivered() == []
    receiver.receive(ME, wire[4:])
    [whole] = receiver.take_delivered()
    assert whole.payload == data and whole.src == ME and whole.dest is None
    assert receiver.layer("frag").pending_bytes == 0


def test_reassembled_message_takes_the_place_of_its_last_fragment():
    h = make()
    f = pieces(b"L" * 2000, 0)
    h.receive(P1, [Message(None, b"a"), f[0], Message(None, b"b"), f[1], Message(None, b"c")])
    assert [m.payload[:1] for m in h.take_delivered()] == [b"a", b"b", b"L", b"c"]


def test_out_of_order_fragments_reassemble():
    h = make()
    f = pieces(bytes(range(250)) * 12, 0)  # 3000 bytes
    h.receive(P1, [f[2], f[0]])
    h.receive(P1, [f[1]])
    [whole] = h.take_delivered()
    assert whole.payload == bytes(range(250)) * 12


def test_senders_are_kept_apart():
    h = make()
    a, b = pieces(b"A" * 2000, 0), pieces(b"B" * 2000, 0)
    h.receive(P1, [a[0]])
    h.receive(P2, [b[0]])
    h.receive(P2, [b[1]])
    h.receive(P1, [a[1]])
    got = h.take_delivered()
    assert [(m.src, m.payload) for m in got] == [(P2, b"B" * 2000), (P1, b"A" * 2000)]


def test_duplicate_fragment_is_ignored():
    h = make()
    f = pieces(b"D" * 2000, 0)
    h.receive(P1, [f[0], f[0]])
    h.receive(P1, [f[1]])
    [whole] = h.take_delivered()
    assert whole.payload == b"D" * 2000
    assert h.metric("frag.duplicate_fragments") == 1


def test_fragments_of_a_finished_id_are_ignored():
    h = make()
    f = pieces(b"F" * 2000, 5)
    h.receive(P1, f)
    assert len(h.take_delivered()) == 1
    h.receive(P1, [f[0]])
    h.receive(P1, f)
    assert h.take_delivered() == []
    assert h.metric("frag.stale_fragments") == 3
    assert h.layer("frag").pending_bytes == 0


def test_inconsistent_fragment_count_is_counted_and_ignored():
    h = make()
    h.receive(P1, [frag(0, 0, 3, b"x" * 1000), frag(0, 1, 2, b"y" * 1000)])
    assert h.metric("frag.inconsistent_fragments") == 1
    assert h.take_delivered() == []


def test_memory_bound_drops_the_oldest_partial():
    h = make(max_pending=2500)
    old = pieces(b"O" * 3000, 0)
    new = pieces(b"N" * 3000, 1)
    h.receive(P1, old[:2])
    h.receive(P2, new[:1])  # 3000 bytes pending > 2500: the oldest (P1's) goes
    assert h.metric("frag.dropped_partial") == 1
    assert h.layer("frag").pending_bytes == 1000
    h.receive(P1, old[2:])  # the rest of a dropped message is ignored
    assert h.take_delivered() == []
    h.receive(P2, new[1:])
    [whole] = h.take_delivered()
    assert whole.payload == b"N" * 3000
    assert h.layer("frag").pending_bytes == 0


def test_message_larger_than_the_bound_is_dropped_not_held():
    h = make(max_pending=1500)
    big = pieces(b"B" * 5000, 0)
    h.receive(P1, big)
    assert h.take_delivered() == []
    assert h.layer("frag").pending_bytes <= 1500
    assert h.metric("frag.dropped_partial") >= 1


def test_state_of_senders_that_left_is_dropped():
    h = make()
    h.receive(P2, pieces(b"P" * 3000, 0)[:2])
    assert h.layer("frag").pending_bytes == 2000
    h.install_view([ME, P1], seq=2)
    assert h.layer("frag").pending_bytes == 0
    assert h.metric("frag.dropped_partial_left") == 1
    assert P2 not in h.layer("frag")._senders


def test_view_change_is_passed_up():
    h = make()
    h.install_view([ME, P1], seq=2)
    assert len(h.take_events()) == 1


def test_finished_ids_with_gaps_stay_bounded():
    s = _Sender()
    for i in range(0, 10 * _MAX_DONE, 2):  # every other id never arrives (unicasts to someone else)
        s.finish(i)
    assert len(s.done) <= _MAX_DONE
    assert s.floor > 0
    # Contiguous ids collapse into the floor.
    t = _Sender()
    for i in range(100):
        t.finish(i)
    assert t.floor == 100 and not t.done


def test_too_many_fragments_is_an_error_naming_the_limit():
    h = make(frag_size=64)
    with pytest.raises(ValueError, match=str(MAX_FRAGMENTS)):
        h.send(b"x" * (64 * MAX_FRAGMENTS + 1))


@pytest.mark.parametrize(
    "bad",
    [None, [], [0, 0], [0, 0, 0], [0, 3, 3], [-1, 0, 1], [0, -1, 2], ["0", 0, 1], [0, 0, MAX_FRAGMENTS + 1]],
)
def test_header_from_wire_rejects_malformed(bad):
    with pytest.raises(WireError):
        FragHeader.from_wire(bad)


def test_header_round_trip():
    hdr = FragHeader(2**40, 3, 9)
    assert FragHeader.from_wire(msgpack.unpackb(msgpack.packb(hdr.to_wire()))) == hdr


def test_malformed_header_drops_the_frame_and_is_counted():
    h = make()
    frame = msgpack.packb([1, "test", P1.to_wire(), [[None, 0, [FRAG, [0, 5, 2]], b"x"]]])
    h.receive_raw(frame)
    assert h.metric("transport.bad_frames") == 1
    assert h.take_delivered() == []


@pytest.mark.parametrize(
    ("params", "key"),
    [
        ({"frag_size": "big"}, "stack[1] (frag).frag_size"),
        ({"frag_size": 10}, "stack[1] (frag).frag_size"),
        ({"max_pending": -5}, "stack[1] (frag).max_pending"),
        ({"max_pending": "1 parsec"}, "stack[1] (frag).max_pending"),
        ({"size": 100}, "unknown key 'size'"),
    ],
)
def test_bad_configuration_names_the_key(params, key):
    with pytest.raises(ConfigError) as err:
        LayerHarness([{"layer": "frag", **params}])
    assert key in str(err.value)


def test_a_partial_message_joins_only_once_every_fragment_is_there():
    from groupcluster.protocols.frag import _Partial

    partial = _Partial(3)
    partial.chunks[0], partial.chunks[2] = b"ab", b""
    with pytest.raises(RuntimeError, match="misses a fragment"):
        partial.joined()
    partial.chunks[1] = b"cd"
    assert partial.joined() == b"abcd"  # an empty fragment is a fragment, not a missing one
