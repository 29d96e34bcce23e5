"""The wire format: round trips, and every kind of malformed frame rejected with a WireError naming the field."""

from __future__ import annotations

import contextlib
import random

import msgpack
import pytest
from groupcluster.core import protocol_ids
from groupcluster.core.address import Address
from groupcluster.core.errors import WireError
from groupcluster.core.message import ALL_FLAGS, NO_FLOW_CONTROL, NO_RELIABILITY, OOB, Message
from groupcluster.core.validate import MAX_INT
from groupcluster.core.wire import (
    FORMAT_VERSION,
    MAX_CLUSTER_NAME,
    RUNS_VERSION,
    WireLimits,
    decode_frame,
    decode_frame_version,
    encode_items,
    encode_messages,
)
from groupcluster.protocols import discovery, fd, flow, frag  # noqa: F401  (register headers)
from groupcluster.protocols.discovery import GET_MBRS_RSP, DiscoveryHeader
from groupcluster.protocols.fd import HEARTBEAT, FdHeader
from groupcluster.protocols.flow import REPLENISH, UNICAST, FlowHeader
from groupcluster.protocols.frag import FragHeader
from groupcluster.protocols.nakack import MSG, XMIT_RSP, NakAckHeader

from .harness import ME, PEERS, LayerHarness

P1 = PEERS[0]
SENDER = Address("10.1.2.3", 7800, 42)
GOOD_MSG = [None, 0, [], b"x"]


def pack(obj) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def frame(messages=None, *, version=FORMAT_VERSION, cluster="test", sender=None) -> bytes:
    return pack(
        [version, cluster, SENDER.to_wire() if sender is None else sender, [GOOD_MSG] if messages is None else messages]
    )


def test_round_trip_keeps_every_field():
    from groupcluster.core.view import ViewId

    msgs = [
        Message(None, b"hello", flags=NO_RELIABILITY | NO_FLOW_CONTROL, headers={protocol_ids.FD: FdHeader(HEARTBEAT)}),
        Message(P1, b"", flags=OOB, headers={protocol_ids.FRAG: FragHeader(3, 1, 4)}),
        Message(
            ME,
            bytes(range(256)),
            headers={
                protocol_ids.FLOW: FlowHeader(REPLENISH, UNICAST, 77),
                protocol_ids.DISCOVERY: DiscoveryHeader(GET_MBRS_RSP, P1, ViewId(9, P1), True),
            },
        ),
    ]
    sender, out = decode_frame(encode_messages("test", SENDER, msgs), "test")
    assert sender == SENDER
    assert len(out) == 3
    for a, b in zip(msgs, out, strict=True):
        assert (b.dest, b.payload, b.flags, b.src) == (a.dest, a.payload, a.flags, SENDER)
        assert sorted(b.headers) == sorted(a.headers)
        for pid, hdr in a.headers.items():
            assert b.headers[pid].to_wire() == hdr.to_wire()


def test_empty_batch_decodes_to_no_messages():
    assert decode_frame(encode_messages("test", SENDER, []), "test") == (SENDER, [])


def test_all_flags_are_accepted():
    _, [msg] = decode_frame(frame([[None, ALL_FLAGS, [], b""]]), "test")
    assert msg.flags == ALL_FLAGS


def expect_error(data: bytes, field: str, limits: WireLimits | None = None) -> None:
    with pytest.raises(WireError) as err:
        decode_frame(data, "test", *([] if limits is None else [limits]))
    assert field in str(err.value), str(err.value)


@pytest.mark.parametrize(
    ("data", "field"),
    [
        (b"", "not valid msgpack"),
        (b"\xc1", "not valid msgpack"),  # a reserved byte
        (pack([1, "test"])[:-1], "not valid msgpack"),
        (frame() + b"\x00", "not valid msgpack"),  # trailing bytes
        (pack({"a": 1}), "not valid msgpack"),  # maps are not part of the format
        (pack("frame"), "frame: expected a list"),
        (pack([1, "test", SENDER.to_wire()]), "frame: expected 4 items"),
        (frame(version=3), "frame.version: unsupported"),
        (frame(version="1"), "frame.version"),
        (frame(version=True), "frame.version"),
        (frame(cluster="other"), "frame.cluster: frame belongs to cluster 'other'"),
        (frame(cluster=b"test"), "frame.cluster"),
        (frame(cluster="x" * (MAX_CLUSTER_NAME + 1)), "frame.cluster"),
        (frame(sender=["h", 1]), "frame.sender"),
        (frame(sender=["h", 70000, 1]), "frame.sender.port"),
        (frame(sender=[5, 1, 1]), "frame.sender.host"),
        (frame(sender=["h", 1, -1]), "frame.sender.incarnation"),
        (frame(sender=["h" * 300, 1, 1]), "frame.sender.host"),
        (pack([1, "test", None, []]), "frame.sender"),
        (pack([1, "test", SENDER.to_wire(), "msgs"]), "frame.messages"),
        (frame(["m"]), "frame.messages[0]"),
        (frame([[None, 0, []]]), "frame.messages[0]"),
        (frame([GOOD_MSG, [["h", 1], 0, [], b""]]), "frame.messages[1].dest"),
        (frame([[None, -1, [], b""]]), "frame.messages[0].flags"),
        (frame([[None, 1 << 10, [], b""]]), "frame.messages[0].flags"),
        (frame([[None, True, [], b""]]), "frame.messages[0].flags"),
        (frame([[None, "0", [], b""]]), "frame.messages[0].flags"),
        (frame([[None, 0, [], "text"]]), "frame.messages[0].payload"),
        (frame([[None, 0, [], None]]), "frame.messages[0].payload"),
        (frame([[None, 0, [4], b""]]), "frame.messages[0].headers"),
        (frame([[None, 0, "h", b""]]), "frame.messages[0].headers"),
        (frame([[None, 0, [999, []], b""]]), "unknown protocol id 999"),
        (frame([[None, 0, ["4", [0]], b""]]), "unknown protocol id '4'"),
        (frame([[None, 0, [protocol_ids.FD, [7]], b""]]), "frame.messages[0].headers[FdHeader]: fd.kind"),
        (frame([[None, 0, [protocol_ids.FD, [0]] * 17, b""]]), "frame.messages[0].headers"),
    ],
)
def test_malformed_frames_are_rejected_naming_the_field(data, field):
    expect_error(data, field)


def test_invalid_utf8_in_a_string_is_rejected():
    good = frame(cluster="tesu")
    bad = good.replace(b"tesu", b"te\xff\xfe")
    expect_error(bad, "not valid msgpack")


def test_ext_types_are_rejected():
    data = pack([1, "test", SENDER.to_wire(), [[None, 0, [], msgpack.ExtType(1, b"x")]]])
    expect_error(data, "not valid msgpack")


def test_deep_nesting_is_rejected_without_a_crash():
    nested = b"\x91" * 100_000 + b"\xc0"  # [[[[...nil...]]]]
    with pytest.raises(WireError):
        decode_frame(nested, "test")


def test_size_limits():
    msgs = [GOOD_MSG] * 10
    expect_error(frame(msgs), "frame.messages: 10 items exceed the limit of 5", WireLimits(max_messages=5))
    big = frame([[None, 0, [], b"x" * 5000]])
    expect_error(big, "exceed the limit of 1000", WireLimits(max_frame_bytes=1000))
    too_many_headers = frame([[None, 0, [protocol_ids.FD, [0], protocol_ids.FRAG, [0, 0, 1]], b""]])
    expect_error(too_many_headers, "headers", WireLimits(max_headers=1))


def test_declared_huge_lengths_do_not_allocate():
    # An array header claiming 2**32-1 items with nothing behind it.
    expect_error(b"\x94\x01\xa4test\x93\xa1h\x01\x01\xdd\xff\xff\xff\xff", "not valid msgpack")
    # A bin header claiming 4 GiB.
    expect_error(b"\x94\x01\xa4test\x93\xa1h\x01\x01\x91\x94\xc0\x00\x90\xc6\xff\xff\xff\xff", "not valid msgpack")


def test_random_corruption_never_raises_anything_but_wire_error():
    msgs = [
        Message(None, b"payload-" * 5, headers={protocol_ids.FD: FdHeader(HEARTBEAT)}),
        Message(P1, b"abc", flags=OOB, headers={protocol_ids.FRAG: FragHeader(1, 0, 2)}),
        Message(ME, b"", headers={protocol_ids.DISCOVERY: DiscoveryHeader(GET_MBRS_RSP, P1, None, False)}),
        Message(ME, b"", headers={protocol_ids.FLOW: FlowHeader(REPLENISH, UNICAST, 5)}),
    ]
    good = encode_messages("test", SENDER, msgs)
    rng = random.Random(1234)
    outcomes = {"ok": 0, "rejected": 0}
    for _ in range(3000):
        data = bytearray(good)
        for _ in range(rng.randint(1, 4)):
            action = rng.random()
            pos = rng.randrange(len(data))
            if action < 0.6:
                data[pos] = rng.randrange(256)
            elif action < 0.8:
                del data[pos]
            else:
                data.insert(pos, rng.randrange(256))
        try:
            decode_frame(bytes(data), "test")
            outcomes["ok"] += 1
        except WireError:
            outcomes["rejected"] += 1
    assert outcomes["rejected"] > 1000


def test_stack_drops_and_counts_bad_frames_and_keeps_working():
    h = LayerHarness([])
    for data in (b"", b"\xc1", frame(cluster="other"), frame([[None, 0, [999, []], b""]])):
        h.receive_raw(data)
    assert h.metric("transport.bad_frames") == 4
    assert h.take_delivered() == []
    h.receive(P1, [Message(None, b"fine")])
    assert [m.payload for m in h.take_delivered()] == [b"fine"]


def test_a_decoded_message_names_its_sender_and_one_without_a_sender_is_refused():
    sender, msgs = decode_frame(frame(), "test")
    assert sender == SENDER and msgs[0].sender() is msgs[0].src
    # A message a layer made and passed up without a sender is a bug: named, not a None handed to the layer.
    with pytest.raises(ValueError, match="no src"):
        Message(None, b"x").sender()


# -- runs: consecutive NAKACK multicasts as one item ------------------------------------------------------------


def nak(seqno: int, payload: bytes = b"p", flags: int = 0, dest: Address | None = None) -> Message:
    return Message(dest, payload, flags=flags, headers={protocol_ids.NAKACK: NakAckHeader(MSG, seqno)})


def fields(msgs: list[Message]) -> list[tuple]:
    return [
        (m.dest, m.payload, m.flags, m.src, sorted((pid, h.to_wire()) for pid, h in m.headers.items())) for m in msgs
    ]


def test_runs_fold_only_consecutive_nakack_multicasts_of_one_flags_value():
    msgs = [
        nak(5, b"a"),
        nak(6, b"b"),
        nak(7, b"c"),
        nak(9, b"d"),  # a gap: a new run
        nak(10, b"e", flags=OOB),  # other flags: a new run
        nak(11, b"f", dest=P1),  # a unicast: a message of its own
        Message(None, b"g", headers={protocol_ids.FD: FdHeader(HEARTBEAT)}),  # not NAKACK
        nak(12, b"h"),
        with_flow(nak(13, b"i")),  # a second header: a message of its own
        Message(None, b"j", headers={protocol_ids.NAKACK: NakAckHeader(XMIT_RSP, 14, P1)}),  # not MSG
    ]
    items, any_run = encode_items(msgs, runs=True)
    assert any_run
    assert [len(it) for it in items] == [3, 3, 3, 4, 4, 3, 4, 4]
    assert items[:3] == [[5, 0, [b"a", b"b", b"c"]], [9, 0, [b"d"]], [10, OOB, [b"e"]]]
    assert encode_items(msgs, runs=False) == ([it for m in msgs for it in encode_items([m], False)[0]], False)


def with_flow(msg: Message) -> Message:
    msg.headers[protocol_ids.FLOW] = FlowHeader(REPLENISH, UNICAST, 1)
    return msg


def test_a_frame_with_runs_decodes_to_the_same_messages_as_without():
    msgs = [nak(1, b"x"), nak(2, b""), nak(3, bytes(300)), nak(4, flags=NO_FLOW_CONTROL), nak(7, dest=P1), nak(8)]
    with_runs = encode_messages("test", SENDER, msgs, runs=True)
    without = encode_messages("test", SENDER, msgs)
    assert len(with_runs) < len(without)
    sender, out, version = decode_frame_version(with_runs, "test")
    assert (sender, version) == (SENDER, RUNS_VERSION)
    assert decode_frame_version(without, "test")[2] == FORMAT_VERSION
    assert fields(out) == fields(decode_frame(without, "test")[1])


def test_a_frame_without_runs_keeps_the_previous_format():
    # Nothing to fold: the bytes are those a member of the previous version sends and reads.
    msgs = [Message(None, b"x"), nak(3, dest=P1)]
    assert encode_messages("test", SENDER, msgs, runs=True) == encode_messages("test", SENDER, msgs)
    assert msgpack.unpackb(encode_messages("test", SENDER, msgs, runs=True))[0] == FORMAT_VERSION == 1


def test_an_empty_runs_frame_is_a_frame_of_no_messages():
    assert decode_frame_version(pack([RUNS_VERSION, "test", SENDER.to_wire(), []]), "test") == (SENDER, [], 2)


def runs_frame(items) -> bytes:
    return frame(items, version=RUNS_VERSION)


@pytest.mark.parametrize(
    ("data", "field"),
    [
        (frame([[1, 0, [b"x"]]]), "frame.messages[0]: expected 4 items"),  # a run in a frame of the old version
        (runs_frame([[0, 0, [b"x"]]]), "frame.messages[0].first_seqno: 0 is outside"),
        (runs_frame([[-3, 0, [b"x"]]]), "frame.messages[0].first_seqno"),
        (runs_frame([["1", 0, [b"x"]]]), "frame.messages[0].first_seqno: expected an integer"),
        (runs_frame([[True, 0, [b"x"]]]), "frame.messages[0].first_seqno: expected an integer"),
        (runs_frame([[None, 0, [b"x"]]]), "frame.messages[0].first_seqno"),
        (runs_frame([GOOD_MSG, [1, -1, [b"x"]]]), "frame.messages[1].flags"),
        (runs_frame([[1, 1 << 10, [b"x"]]]), "frame.messages[0].flags"),
        (runs_frame([[1, True, [b"x"]]]), "frame.messages[0].flags"),
        (runs_frame([[1, 0, b"x"]]), "frame.messages[0].payloads: expected a non-empty list"),
        (runs_frame([[1, 0, []]]), "frame.messages[0].payloads: expected a non-empty list"),
        (runs_frame([[1, 0, [b"x", "text"]]]), "frame.messages[0].payloads[1]: expected bytes, got str"),
        (runs_frame([[1, 0, [None]]]), "frame.messages[0].payloads[0]: expected bytes"),
        (runs_frame([[1, 0, [[b"x"]]]]), "frame.messages[0].payloads[0]: expected bytes, got list"),
        (runs_frame([[MAX_INT, 0, [b"x", b"y"]]]), "frame.messages[0]: a run of 2 from seqno"),
        (runs_frame([[MAX_INT + 1, 0, [b"x"]]]), "from seqno 9223372036854775808 overflows the seqno range"),
        (runs_frame([[1, 0, [b"x"], 4]]), "frame.messages[0].dest"),  # four items: read as a message
        (runs_frame([[1, 0]]), "frame.messages[0]: expected 4 items"),
    ],
)
def test_malformed_runs_are_rejected_naming_the_field(data, field):
    expect_error(data, field)


def test_a_run_at_the_top_of_the_seqno_range_is_accepted():
    _, out = decode_frame(runs_frame([[MAX_INT - 1, 0, [b"x", b"y"]]]), "test")
    assert [m.headers[protocol_ids.NAKACK].seqno for m in out] == [MAX_INT - 1, MAX_INT]


def test_runs_count_every_message_against_the_frame_limit():
    limits = WireLimits(max_messages=5)
    decode_frame(runs_frame([[1, 0, [b"x"] * 3], GOOD_MSG, [9, 0, [b"y"]]]), "test", limits)  # 5: accepted
    expect_error(runs_frame([[1, 0, [b"x"] * 6]]), "a run of 6 messages exceeds the limit of 5", limits)
    expect_error(runs_frame([[1, 0, [b"x"] * 3], [9, 0, [b"y"] * 3]]), "frame.messages[1]: a run of 3", limits)
    expect_error(runs_frame([[1, 0, [b"x"] * 5], GOOD_MSG]), "frame.messages: 6 messages exceed the limit", limits)


def test_a_run_declaring_a_huge_payload_list_does_not_allocate_it():
    head = pack([RUNS_VERSION, "test", SENDER.to_wire()])
    # [2, "test", sender, [[1, 0, <array of 2**32-1 items> ...]]] with the items missing.
    data = b"\x94" + head[1:] + b"\x91\x93\x01\x00\xdd\xff\xff\xff\xff"
    expect_error(data, "not valid msgpack")


def test_random_corruption_of_runs_frames_never_raises_anything_but_wire_error():
    rng = random.Random(7)
    good = encode_messages("test", SENDER, [nak(s, bytes([s]) * s) for s in range(1, 40)], runs=True)
    for _ in range(3000):
        data = bytearray(good)
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        with contextlib.suppress(WireError):
            decode_frame(bytes(data), "test")
