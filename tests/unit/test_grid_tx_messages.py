"""The grid transaction wire format (grid/tx/messages.py): round trips of every message, malformed messages
naming their field, frame limits, and a fuzz of mutated payloads."""

from __future__ import annotations

import contextlib

import msgpack
import pytest
from groupcluster.core.errors import WireError
from groupcluster.grid.store import make_version
from groupcluster.grid.tx.messages import (
    ACK_RETRY,
    INFO_ACTIVE,
    INFO_PREPARED,
    NO,
    TX_FORMAT_VERSION,
    TX_PREPARE,
    YES,
    TxAck,
    TxCommit,
    TxId,
    TxLimits,
    TxLock,
    TxLockInfo,
    TxMessage,
    TxPrepare,
    TxRecordInfo,
    TxReportAnswer,
    TxReportInfo,
    TxReportRequest,
    TxRollback,
    TxVote,
    decode_tx_payload,
    encode_tx_payload,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from .grid_tx_support import EXAMPLES_SCALE, O1, O2, A, B

T1 = TxId(O1, 7)
ALL: list[TxMessage] = [
    TxLock(T1, 1, 2, 3, (b"a", b"b")),
    TxPrepare(T1, 1, 3, (b"a",), ((b"a", b"x"), (b"b", None)), ((b"a", 0),)),
    TxPrepare(T1, 2, 3, (), (), ()),
    TxPrepare(T1, 2, 3, (b"a",), ((b"a", b"x"),), ((b"a", 0),), False),  # optimistic: never waits
    TxPrepare(T1, 2, 3, (), ((b"b", b"y"),), (), True, ((b"b", make_version(2, 9)),)),  # a backup, with its floor
    TxVote(T1, 1, 0, YES, 3, ((b"a", make_version(3, 1)),), ""),
    TxVote(T1, 1, 2, NO, 3, (), "lock timeout"),
    TxCommit(T1, 1, 3, ((b"a", make_version(3, 1), b"x"), (b"b", make_version(3, 2), None))),
    TxRollback(T1, 1, 3),
    TxCommit(T1, 2, 3, (), True),  # a resolver's
    TxRollback(T1, 2, 3, True),
    TxAck(T1, 1, ACK_RETRY, 4),
    TxLockInfo(
        3,
        (1, 5),
        (
            TxRecordInfo(T1, 1, INFO_PREPARED, True, (b"a",), ((b"a", b"x"),), ((b"a", make_version(3, 1)),)),
            TxRecordInfo(TxId(O2, 1), 1, INFO_ACTIVE, False, (b"c",), (), ()),
            TxRecordInfo(TxId(O2, 2), 1, INFO_PREPARED, True, (b"d",), ((b"d", b"z"),), (), ((b"d", 5),)),
        ),
    ),
    TxReportRequest(5, (T1, TxId(O2, 1)), (A, B)),
    TxReportRequest(6),
    TxReportAnswer(
        5,
        (
            TxReportInfo(T1, 1, 2, True, False, ((b"a", b"x"), (b"b", None)), ((b"a", make_version(3, 1)),), (A, O1)),
            TxReportInfo(TxId(O2, 1), -1, 0, False, False, (), (), ()),
            TxReportInfo(TxId(O2, 2), 2, 1, False, True, (), (), (B,)),
        ),
    ),
]


def raw_payload(*messages: list[object]) -> bytes:
    return msgpack.packb([TX_FORMAT_VERSION, list(messages)], use_bin_type=True)


class TestWire:
    def test_round_trip(self) -> None:
        assert decode_tx_payload(encode_tx_payload(ALL)) == ALL

    def test_prepare_without_the_wait_field_waits_and_long_reasons_are_cut(self) -> None:
        # an older sender's prepare (7 items) keeps the old, waiting behaviour
        (msg,) = decode_tx_payload(raw_payload([TX_PREPARE, T1.to_wire(), 1, 3, [b"a"], [], [[b"a", 0]]]))
        assert isinstance(msg, TxPrepare) and msg.wait is True
        # a reason naming a long key is cut to what a receiver accepts instead of making it refuse the payload
        (vote,) = decode_tx_payload(encode_tx_payload([TxVote(T1, 1, 0, NO, 3, (), "conflict: " + "k" * 5000)]))
        assert isinstance(vote, TxVote) and len(vote.reason) == 512 and vote.reason.startswith("conflict: k")

    @pytest.mark.parametrize(
        ("raw", "field"),
        [
            ([TX_PREPARE, T1.to_wire(), 1, 3, [b"a"], [[b"a", b"x"]], [[b"b", 0]]], r"messages\[0\].reads\[0\].key"),
            ([TX_PREPARE, T1.to_wire(), 1, 3, [b"a", b"a"], [], []], r"messages\[0\].lock_keys: a key is listed twice"),
            ([TX_PREPARE, T1.to_wire(), 1, 3, [], [[b"a", 5]], []], r"messages\[0\].writes\[0\].value"),
            ([TX_PREPARE, T1.to_wire(), -1, 3, [], [], []], r"messages\[0\].attempt"),
            ([TX_PREPARE, [["h", 1, 1], "x"], 1, 3, [], [], []], r"messages\[0\].tx.seq"),
            ([TX_PREPARE, [["h", 70000, 1], 1], 1, 3, [], [], []], r"messages\[0\].tx.origin.port"),
            ([21, T1.to_wire(), 1, 3], r"messages\[0\]: expected 7 to 9 items"),
            ([TX_PREPARE, T1.to_wire(), 1, 3, [], [], [], 1], r"messages\[0\].wait"),
            ([TX_PREPARE, T1.to_wire(), 1, 3, [], [], [], True, [], 0], r"messages\[0\]: 10 items exceed"),
            ([TX_PREPARE, T1.to_wire(), 1, 3, [], [[b"a", b"x"]], [], True, [[b"b", 5]]], r"floors\[0\].key: a floor"),
            ([TX_PREPARE, T1.to_wire(), 1, 3, [b"a"], [[b"a", b"x"]], [], True, [[b"a", 5]]], r"floors\[0\].key: a fl"),
            ([TX_PREPARE, T1.to_wire(), 1, 3, [], [[b"a", b"x"]], [], True, [[b"a", -1]]], r"floors\[0\].version"),
            ([22, T1.to_wire(), 1, 0, 7, 3, [], ""], r"messages\[0\].code"),
            ([22, T1.to_wire(), 1, 0, 0, 3, [[b"a", 0]], ""], r"messages\[0\].versions\[0\].version"),
            ([22, T1.to_wire(), 1, 0, 0, 3, [], "x" * 600], r"messages\[0\].reason"),
            ([23, T1.to_wire(), 1, 3, [[b"a", 1, b"x"], [b"a", 2, b"y"]]], r"messages\[0\].writes: a key is written"),
            ([23, T1.to_wire(), 1, 3, [[b"a", 2**63, b"x"]]], r"messages\[0\].writes\[0\].version"),
            ([23, T1.to_wire(), 1, 3, [], 1], r"messages\[0\].resolved"),
            ([23, T1.to_wire(), 1, 3], r"messages\[0\]: expected 5 or 6 items"),
            ([24, T1.to_wire(), 1, 3, "yes"], r"messages\[0\].resolved"),
            ([24, T1.to_wire(), 1, 3, True, 0], r"messages\[0\]: 6 items exceed"),
            ([25, T1.to_wire(), 1, 1, 3], r"messages\[0\].code: 1 is not an acknowledgement code"),
            ([20, T1.to_wire(), 1, 0, 3, [b"a"]], r"messages\[0\].request"),
            ([26, 3, [1, 1], []], r"messages\[0\].segments: a segment is listed twice"),
            (
                [26, 3, [1], [[T1.to_wire(), 1, 0, False, [b"a"], [[b"a", b"x"]], []]]],
                r"records\[0\].writes: an active",
            ),
            ([26, 3, [1], [[T1.to_wire(), 1, 1, 1, [b"a"], [], []]]], r"records\[0\].in_doubt"),
            ([26, 3, [1], [[T1.to_wire(), 1, 1, True, [b"a"], [], [], [[b"a", 5]]]]], r"records\[0\].floors\[0\].key"),
            ([26, 3, [1], [[T1.to_wire(), 1, 1, True, [b"a"], [], [], [], 0]]], r"records\[0\]: 9 items exceed"),
            ([28, 1, [T1.to_wire(), T1.to_wire()], []], r"messages\[0\].txs: a transaction is listed twice"),
            ([28, -1, [], []], r"messages\[0\].request_id"),
            ([28, 1, [[["h", 1, 1], -2]], []], r"messages\[0\].txs\[0\].seq"),
            ([28, 1, [], [A.to_wire(), A.to_wire()]], r"messages\[0\].members: a member is listed twice"),
            ([28, 1, []], r"messages\[0\]: expected 4 items"),
            ([29, 1, [[T1.to_wire(), 7, 1, True, False, [], [], []]]], r"reports\[0\].state"),
            ([29, 1, [[T1.to_wire(), -1, 0, False, False, [[b"a", b"x"]], [], []]]], r"reports\[0\].state: a trans"),
            ([29, 1, [[T1.to_wire(), 1, 1, True, 0, [], [], []]]], r"reports\[0\].deciding"),
            ([29, 1, [[T1.to_wire(), 1, 1, True, False, [], [], [A.to_wire(), A.to_wire()]]]], r"views: a member is"),
            ([29, 1, [[T1.to_wire(), 1, 1, True, False, [], [], [["h", 70000, 1]]]]], r"reports\[0\].views\[0\]"),
            ([29, 1, [[T1.to_wire(), 1, 1, True, False, [], [[b"a", 0]], []]]], r"reports\[0\].versions\[0\]"),
            ([29, 1, [[T1.to_wire(), 1, 1, True, False, [], [], []]] * 2], r"reports: a transaction is reported"),
            ([29, 1, [[T1.to_wire(), 1, 1, True, False, [], []]]], r"reports\[0\]: expected 8 items"),
            ([99], r"messages\[0\].type: unknown"),
            ("x", r"messages\[0\]: expected a non-empty list"),
        ],
    )
    def test_bad_fields_are_named(self, raw: list[object], field: str) -> None:
        with pytest.raises(WireError, match=field):
            decode_tx_payload(raw_payload(raw))

    def test_frame_level_errors(self) -> None:
        with pytest.raises(WireError, match=r"tx\.version"):
            decode_tx_payload(msgpack.packb([99, []]))
        with pytest.raises(WireError, match="not valid msgpack"):
            decode_tx_payload(b"\xc1")
        with pytest.raises(WireError, match="exceed the limit"):
            decode_tx_payload(encode_tx_payload(ALL), TxLimits(max_payload_bytes=10))
        with pytest.raises(WireError, match=rf"tx\.messages: {len(ALL)} items exceed"):
            decode_tx_payload(encode_tx_payload(ALL), TxLimits(max_messages=8))
        with pytest.raises(WireError, match=r"keys\[0\]: 1 bytes exceed"):
            decode_tx_payload(encode_tx_payload([ALL[0]]), TxLimits(max_key_bytes=0))
        with pytest.raises(WireError, match="tx: expected bytes"):
            decode_tx_payload("text")  # type: ignore[arg-type]

    @given(st.data())
    @settings(max_examples=300 * EXAMPLES_SCALE, deadline=None, derandomize=True, database=None)
    def test_mutated_payloads_raise_only_wire_errors(self, data: st.DataObject) -> None:
        blob = bytearray(encode_tx_payload(ALL))
        for _ in range(data.draw(st.integers(1, 4))):
            i = data.draw(st.integers(0, len(blob) - 1))
            blob[i] = data.draw(st.integers(0, 255))
        with contextlib.suppress(WireError):  # anything else escaping fails the test
            decode_tx_payload(bytes(blob))
