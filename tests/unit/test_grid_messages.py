"""The grid wire format: round trips of every message type and strict validation of bad input."""

from __future__ import annotations

import msgpack
import pytest
from groupcluster.core.address import Address
from groupcluster.core.errors import WireError
from groupcluster.grid.consistent_hash import balanced
from groupcluster.grid.messages import (
    GET,
    OK,
    PUT,
    RETRY,
    Backup,
    BackupAck,
    Command,
    Confirm,
    Fetch,
    GridLimits,
    Response,
    Status,
    Topology,
    XferAck,
    XferCancel,
    XferData,
    XferFail,
    decode_payload,
    encode_payload,
)
from groupcluster.grid.topology import CacheTopology, MemberStatus, Phase

A = Address("10.0.0.1", 7800, 1)
B = Address("10.0.0.2", 7800, 2)


def topo() -> CacheTopology:
    ch = balanced(None, [A, B], {}, 8, 2)
    return CacheTopology(3, 1, Phase.NO_REBALANCE, ch, None, (A, B), stable_members=(A, B))


ALL = [
    Status(MemberStatus(1.5, False, topo())),
    Status(MemberStatus(0.0, True, None)),
    Topology(topo()),
    Confirm(4),
    Command(1, 2, 3, PUT, b"key", b"value"),
    Command(1, 1, 3, GET, b"key", None),
    Response(1, 2, OK, 3, b"value", ""),
    Response(1, 2, RETRY, 4, None, "stale"),
    Backup(9, 3, 12345, b"k", b"v"),
    Backup(9, 3, 12345, b"k", None),
    BackupAck(9, OK, 3),
    Fetch(5, 3, 1, (0, 4, 7)),
    XferData(5, 4, [(b"a", 1, b"x"), (b"b", 2, None)], (4,), True),
    XferAck(5),
    XferCancel(5),
    XferFail(5, (0, 7)),
]


def test_every_message_round_trips_in_one_payload() -> None:
    assert decode_payload(encode_payload(ALL)) == ALL


def raw(msg: list[object]) -> bytes:
    return msgpack.packb([1, [msg]], use_bin_type=True)


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (b"\xc1", "not valid msgpack"),
        (msgpack.packb([2, []]), "unsupported grid format"),
        (msgpack.packb({"a": 1}), "grid"),
        (raw([99]), "unknown grid message type"),
        (raw([4, 1, 1, 1, 1, b"k", None]), "a PUT carries a value"),
        (raw([4, 1, 1, 1, 0, b"k", b"v"]), "a PUT carries a value"),
        (raw([4, 1, 1, 1, 7, b"k", None]), r"messages\[0\]\.kind"),
        (raw([4, -1, 1, 1, 0, b"k", None]), r"messages\[0\]\.op_id"),
        (raw([4, 1, 1, 1, 0, "text", None]), r"messages\[0\]\.key"),
        (raw([5, 1, 1, 9, 1, None, ""]), r"messages\[0\]\.code"),
        (raw([8, 1, 1, 1, [1, 1]]), "listed twice"),
        (raw([8, 1, 1, 1, [70000]]), r"segments\[0\]"),
        (raw([9, 1, 0, [[b"k", "v1", b"x"]], [], False]), r"entries\[0\]\.version"),
        (raw([9, 1, 0, [[b"k", 1]], [], False]), r"entries\[0\]"),
        (raw([9, 1, 0, [], [], "yes"]), r"\.last"),
        (raw([3]), "expected 2 items"),
        (raw([2, [3, 1, 0, 0, 0, [], [], [8, 2, [], [], []], None]]), "members"),
    ],
)
def test_bad_payloads_are_rejected_with_the_field_named(payload: bytes, message: str) -> None:
    with pytest.raises(WireError, match=message):
        decode_payload(payload)


def test_size_limits() -> None:
    limits = GridLimits(max_payload_bytes=1000, max_messages=2, max_key_bytes=4, max_value_bytes=8)
    with pytest.raises(WireError, match="exceed the limit"):
        decode_payload(b"\x90" * 1001, limits)
    with pytest.raises(WireError, match="messages"):
        decode_payload(encode_payload([Confirm(1)] * 3), limits)
    with pytest.raises(WireError, match="key"):
        decode_payload(encode_payload([Command(1, 1, 1, GET, b"toolong", None)]), limits)
    with pytest.raises(WireError, match="value"):
        decode_payload(encode_payload([Backup(1, 1, 1, b"k", b"x" * 9)]), limits)
