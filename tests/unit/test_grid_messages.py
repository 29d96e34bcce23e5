"""The grid wire format: round trips of every message type and strict validation of bad input."""

from __future__ import annotations

import math
import random
import struct

import msgpack
import pytest
from groupcluster.core.address import Address
from groupcluster.core.errors import WireError
from groupcluster.grid.columns import BackupAckBatch, BackupBatch, CommandBatch, EntryChunk, ResponseBatch, unbatched
from groupcluster.grid.consistent_hash import balanced
from groupcluster.grid.messages import (
    DELETE,
    ERROR,
    GET,
    NOT_FOUND,
    OK,
    PUT,
    RETRY,
    Backup,
    BackupAck,
    Command,
    Confirm,
    Fetch,
    Response,
    Status,
    Topology,
    XferAck,
    XferCancel,
    XferData,
    XferFail,
)
from groupcluster.grid.payload import GRID_FORMAT_VERSION, GridLimits, decode_payload, encode_payload
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
    Command(1, 2, 3, PUT, b"key", b"value", 0.0, 1764170000.5),
    Response(1, 2, OK, 3, b"value", ""),
    Response(1, 2, RETRY, 4, None, "stale"),
    Backup(9, 3, 12345, b"k", b"v"),
    Backup(9, 3, 12345, b"k", None),
    Backup(9, 3, 12345, b"k", b"v", 1764170000.5),
    BackupAck(9, OK, 3),
    Fetch(5, 3, 1, (0, 4, 7)),
    XferData(5, 4, [(b"a", 1, b"x"), (b"b", 2, None)], (4,), True),
    XferAck(5),
    XferCancel(5),
    XferFail(5, (0, 7)),
]


def test_every_message_round_trips_in_one_payload() -> None:
    assert decode_payload(encode_payload(ALL)) == ALL


def _tx_messages() -> list[object]:
    from groupcluster.grid.tx import messages as tm

    tx = tm.TxId(A, 7)
    info = tm.TxRecordInfo(tx, 2, tm.INFO_PREPARED, True, (b"k",), ((b"k", b"v"),), ((b"k", 1 << 40),))
    return [
        tm.TxLock(tx, 1, 1, 3, (b"a", b"b")),
        tm.TxPrepare(tx, 1, 3, (b"a",), ((b"a", b"x"), (b"c", None)), ((b"a", 0),)),
        tm.TxPrepare(tx, 1, 3, (b"a",), ((b"a", b"x"), (b"c", None)), ((b"a", 0),), False),  # optimistic: no wait
        tm.TxVote(tx, 1, 0, tm.YES, 3, ((b"a", 1 << 40),), ""),
        tm.TxCommit(tx, 1, 3, ((b"a", 1 << 40, b"x"), (b"c", (1 << 40) + 1, None))),
        tm.TxRollback(tx, 1, 3),
        tm.TxAck(tx, 1, tm.ACK_OK, 3),
        tm.TxLockInfo(3, (1, 5), (info,)),
        tm.TxInfoAck(3, (1, 5)),
        tm.TxReportRequest(4, (tx,), (A,)),
        tm.TxReportAnswer(4, (tm.TxReportInfo(tx, 1, 2, True, False, ((b"k", b"v"),), ((b"k", 1 << 40),), (A,)),)),
    ]


def test_transaction_messages_share_the_grid_payload() -> None:
    # Format 4: the two-phase-commit messages travel with the grid's (one payload per destination and step),
    # and a GET's answer carries the entry's version. Format 5: the resolver's report request and answer too.
    msgs = [*ALL, *_tx_messages(), Response(4, 1, OK, 3, b"v", "", 1 << 41)]
    assert decode_payload(encode_payload(msgs)) == msgs  # type: ignore[arg-type]
    rb = ResponseBatch()
    rb.add(1, 1, OK, 3, b"v", "", 99)
    rb.add(2, 1, NOT_FOUND, 3, None, "")
    (back,) = decode_payload(encode_payload([rb]))
    assert [r.version for r in back.responses()] == [99, 0]  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ([21, [[A.host, A.port, A.incarnation], 1], 1, 3, [b"a"], [[b"a", b"x"]], [[b"b", 0]]], r"reads\[0\]\.key"),
        ([23, [[A.host, A.port, A.incarnation], 1], 1, 3, [[b"a", 0, b"x"]]], r"writes\[0\]\.version"),
        ([26, 3, [1, 1], []], r"segments: a segment is listed twice"),
        ([27, 3], r"expected 3 items"),
        ([27, -1, []], r"topology_id"),
        ([28, 1], r"expected 4 items"),
        ([29, 1, [[[[A.host, A.port, A.incarnation], 1], 9, 1, True, False, [], [], []]]], r"reports\[0\]\.state"),
        ([30, 1], r"unknown grid message type 30"),
    ],
)
def test_bad_transaction_messages_name_their_field(fields: list[object], message: str) -> None:
    with pytest.raises(WireError, match=message):
        decode_payload(raw(fields))


def raw(msg: list[object]) -> bytes:
    return msgpack.packb([GRID_FORMAT_VERSION, [msg]], use_bin_type=True)


def chunk(keys: object, versions: object, values: object, tombs: object = (), expiries: object = None) -> bytes:
    """A packed XFER_DATA chunk built by hand (possibly wrong)."""
    return msgpack.packb([keys, versions, values, list(tombs), expiries], use_bin_type=True)  # type: ignore[call-overload]


def le64(*versions: int) -> bytes:
    return b"".join(v.to_bytes(8, "little") for v in versions)


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (b"\xc1", "not valid msgpack"),
        (msgpack.packb([1, []]), "unsupported grid format 1"),
        (msgpack.packb({"a": 1}), "grid"),
        (raw([99]), "unknown grid message type"),
        (raw([4, 1, 1, 1, 1, b"k", None, 0.0, 0.0]), "a PUT carries a value"),
        (raw([4, 1, 1, 1, 0, b"k", b"v", 0.0, 0.0]), "a PUT carries a value"),
        (raw([4, 1, 1, 1, 7, b"k", None, 0.0, 0.0]), r"messages\[0\]\.kind"),
        (raw([4, -1, 1, 1, 0, b"k", None, 0.0, 0.0]), r"messages\[0\]\.op_id"),
        (raw([4, 1, 1, 1, 0, "text", None, 0.0, 0.0]), r"messages\[0\]\.key"),
        (raw([4, 1, 1, 1, 0, b"k", None]), r"messages\[0\]: expected 9 items, got 7"),
        (raw([4, 1, 1, 1, 0, b"k", None, "soon", 0.0]), r"messages\[0\]\.deadline: expected a Unix time as a float"),
        (raw([4, 1, 1, 1, 0, b"k", None, 5, 0.0]), r"messages\[0\]\.deadline: .*got 5$"),
        (raw([4, 1, 1, 1, 0, b"k", None, -1.0, 0.0]), r"messages\[0\]\.deadline: .*got -1\.0"),
        (raw([4, 1, 1, 1, 0, b"k", None, math.nan, 0.0]), r"messages\[0\]\.deadline: .*got nan"),
        (raw([4, 1, 1, 1, 0, b"k", None, math.inf, 0.0]), r"messages\[0\]\.deadline: .*got inf"),
        (raw([5, 1, 1, 9, 1, None, "", 0]), r"messages\[0\]\.code"),
        (raw([5, 1, 1, 0, 1, b"v", "", -1]), r"messages\[0\]\.version"),
        (raw([5, 1, 1, 0, 1, b"v", ""]), r"messages\[0\]: expected 8 items"),
        (raw([8, 1, 1, 1, [1, 1]]), "listed twice"),
        (raw([8, 1, 1, 1, [70000]]), r"segments\[0\]"),
        (raw([9, 1, 0, [[b"k", 1, b"x"]], [], False]), r"entries: expected bytes \(a packed chunk\)"),
        (raw([9, 1, 0, b"\xc1", [], False]), r"entries: not valid msgpack"),
        (raw([9, 1, 0, msgpack.packb([[b"k"], le64(1), [b"x"]]), [], False]), r"entries: expected 5 items"),
        (raw([9, 1, 0, chunk([b"k"], le64(1), [b"x"], [])[:-1], [], False]), r"entries: not valid msgpack"),
        (
            raw([9, 1, 0, chunk([b"k", "s"], le64(1, 2), [b"x", b"y"]), [], False]),
            r"entries\.keys\[1\]: expected bytes",
        ),
        (raw([9, 1, 0, chunk([b"k", None], le64(1, 2), [b"x", b"y"]), [], False]), r"entries\.keys\[1\]"),
        (raw([9, 1, 0, chunk([b"k"], le64(1), [7]), [], False]), r"entries\.values\[0\]: expected bytes, got int"),
        (raw([9, 1, 0, chunk([b"k"], le64(1), [b"x", b"y"]), [], False]), r"entries\.values: 2 values for 1 keys"),
        (raw([9, 1, 0, chunk([b"k"], [1], [b"x"]), [], False]), r"entries\.versions: expected 8 bytes"),
        (raw([9, 1, 0, chunk([b"k"], le64(1)[:7], [b"x"]), [], False]), r"entries\.versions: expected 8 bytes"),
        (raw([9, 1, 0, chunk([b"a", b"k"], le64(1, 2**63), [b"x", b"y"]), [], False]), r"entries\.versions\[1\]"),
        (raw([9, 1, 0, chunk([b"k", b"k"], le64(1, 2), [b"x", b"y"]), [], False]), r"entries\.keys: a key is listed"),
        (raw([9, 1, 0, chunk([b"k"], le64(1), [b""], [1]), [], False]), r"entries\.tombstones\[0\]"),
        (raw([9, 1, 0, chunk([b"k"], le64(1), [b"x"], [0]), [], False]), r"values\[0\]: a tombstone carries no"),
        (raw([9, 1, 0, chunk([b"a", b"k"], le64(1, 2), [b"", b""], [0, 0]), [], False]), r"index 0 is listed"),
        (raw([9, 1, 0, chunk([b"k"], le64(1), [b"x"], ["0"]), [], False]), r"entries\.tombstones\[0\]"),
        (raw([9, 1, 0, chunk([], b"", []), [], "yes"]), r"\.last"),
        (raw([3]), "expected 2 items"),
        (raw([2, [3, 1, 0, 0, 0, [], [], [8, 2, [], [], []], None, 0, 0, 0, []]]), "members"),
        (raw([2, [3, 1, 0, 0, 0, [], [], [8, 2, [], [], []], None]]), r"topology: expected 13 items, got 9"),
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
    # A chunk has its own limits: per key and value, and entries per chunk.
    with pytest.raises(WireError, match=r"entries\.keys\[1\]: 7 bytes exceed the limit of 4"):
        decode_payload(encode_payload([XferData(1, 0, [(b"k", 1, b"v"), (b"toolong", 2, b"v")], (), False)]), limits)
    with pytest.raises(WireError, match=r"entries\.values\[0\]: 9 bytes exceed the limit of 8"):
        decode_payload(encode_payload([XferData(1, 0, [(b"k", 1, b"x" * 9)], (), False)]), limits)
    few = GridLimits(max_batch_entries=2)
    with pytest.raises(WireError, match="entries"):
        decode_payload(encode_payload([XferData(1, 0, [(b"%d" % i, 1, b"v") for i in range(3)], (), False)]), few)


def test_chunk_round_trip_keeps_tombstones_empty_values_and_large_versions() -> None:
    entries = [(b"a", 0, b"x"), (b"b", 2**63 - 1, None), (b"c", 5, b""), (b"d", 1 << 40, None), (b"e", 7, b"y" * 300)]
    (msg,) = decode_payload(encode_payload([XferData(3, 1, EntryChunk.of(entries), (1,), True)]))
    assert isinstance(msg, XferData) and isinstance(msg.entries, EntryChunk)
    assert list(msg.entries) == entries and msg.entries == entries
    assert msg.entries.values == [b"x", None, b"", None, b"y" * 300]
    assert msg.entries.nbytes == 5 + 1 + 300
    assert len(EntryChunk([], [], [])) == 0 and decode_payload(encode_payload([XferData(1, 0, [], (), False)]))
    with pytest.raises(ValueError, match="2 keys, 1 versions"):
        EntryChunk([b"a", b"b"], [1], [b"x", b"y"])


def test_expiries_round_trip_in_commands_backups_and_chunks() -> None:
    """Wire format 7: a PUT's expiry (a Unix time) travels with it to the primary, to the backups and in state
    transfer; a column of none is nil on the wire."""
    cmds = CommandBatch(3)
    cmds.add(1, 1, PUT, b"a", b"x", 0.0, 1764170000.5)
    cmds.add(2, 1, PUT, b"b", b"y")
    cmds.add(3, 1, GET, b"c", None)
    backups = BackupBatch(3)
    backups.add(1, 7, b"a", b"x", 1764170000.5)
    backups.add(2, 8, b"b", None)
    (c, b) = decode_payload(encode_payload([cmds, backups]))
    assert unbatched([c, b]) == [
        Command(1, 1, 3, PUT, b"a", b"x", 0.0, 1764170000.5),
        Command(2, 1, 3, PUT, b"b", b"y"),
        Command(3, 1, 3, GET, b"c", None),
        Backup(1, 3, 7, b"a", b"x", 1764170000.5),
        Backup(2, 3, 8, b"b", None),
    ]
    plain = CommandBatch(3)
    plain.add(1, 1, PUT, b"a", b"x")
    plain.add(2, 1, PUT, b"b", b"y")
    assert plain.to_wire()[8] is None  # no expiry: nil, not a column of zeros
    chunk_in = EntryChunk([b"a", b"b"], [1, 2], [b"x", None], [1764170000.5, 0.0])
    (msg,) = decode_payload(encode_payload([XferData(3, 1, chunk_in, (1,), True)]))
    assert isinstance(msg, XferData) and list(msg.entries.expiries) == [1764170000.5, 0.0]  # type: ignore[arg-type]
    assert msg.entries == chunk_in
    (msg,) = decode_payload(encode_payload([XferData(3, 1, EntryChunk([b"a"], [1], [b"x"]), (1,), True)]))
    assert msg.entries.expiries is None  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="1 expiries for 2 keys"):
        EntryChunk([b"a", b"b"], [1, 2], [b"x", b"y"], [0.0])
    with pytest.raises(WireError, match=r"messages\[0\]\.expires: only a PUT carries an expiry"):
        decode_payload(raw([4, 1, 1, 1, GET, b"k", None, 0.0, 1764170000.5]))
    with pytest.raises(WireError, match=r"messages\[0\]\.expires: expected a Unix time as a float"):
        decode_payload(raw([6, 1, 3, 7, b"k", b"v", "later"]))
    with pytest.raises(WireError, match=r"entries\.expiries\[0\]: expected a Unix time"):
        decode_payload(raw([9, 1, 0, chunk([b"k"], le64(1), [b"x"], [], f64(math.inf)), [], False]))
    with pytest.raises(WireError, match=r"entries\.expiries: expected nil or 8 bytes"):
        decode_payload(raw([9, 1, 0, chunk([b"k"], le64(1), [b"x"], [], b"\x00"), [], False]))


def test_chunk_decoder_accepts_exactly_what_the_encoder_makes() -> None:
    """Hypothesis: any chunk of distinct keys, versions in [0, 2**63 - 1] and values or tombstones round-trips."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    entry_lists = st.dictionaries(
        st.binary(max_size=12), st.tuples(st.integers(0, 2**63 - 1), st.none() | st.binary(max_size=20)), max_size=40
    )

    @settings(max_examples=300, deadline=None, derandomize=True, database=None)
    @given(entry_lists)
    def check(d: dict[bytes, tuple[int, bytes | None]]) -> None:
        entries = [(k, ver, val) for k, (ver, val) in d.items()]
        (msg,) = decode_payload(encode_payload([XferData(1, 2, entries, (), False)]))
        assert list(msg.entries) == entries  # type: ignore[union-attr]

    check()


def _mutations(blob: bytes, rng: random.Random) -> bytes:
    """Byte flips, inserts, deletes and truncations of a packed chunk (the generic fuzzers mutate whole
    payloads; this aims at the chunk decoder with its own bulk checks)."""
    data = bytearray(blob)
    for _ in range(rng.randint(1, 4)):
        r = rng.random()
        pos = rng.randrange(len(data) + 1)
        if r < 0.4 and data:
            data[min(pos, len(data) - 1)] = rng.choice((0x00, 0x7F, 0x80, 0x90, 0xC0, 0xC2, 0xC4, 0xCF, 0xDC, 0xFF))
        elif r < 0.6:
            data[pos:pos] = bytes([rng.randrange(256)])
        elif r < 0.8 and data:
            del data[min(pos, len(data) - 1)]
        else:
            data = data[:pos]
    return bytes(data)


def test_fuzzed_chunks_decode_or_are_rejected_naming_the_field() -> None:
    rng = random.Random(4)
    bases = [
        chunk([b"k%d" % i for i in range(6)], le64(*range(6)), [b"v" * i for i in range(6)]),
        chunk([b"a", b"b", b"c"], le64(1, 2, 3), [b"x", b"", b""], [1, 2]),
        chunk([], b"", []),
    ]
    outcomes = {"ok": 0, "rejected": 0}
    for _ in range(20_000):
        data = _mutations(rng.choice(bases), rng)
        try:
            (msg,) = decode_payload(raw([9, 1, 0, data, [], False]))
        except WireError as exc:
            assert str(exc).startswith("grid.messages[0].entries"), exc  # noqa: PT017  a mutation may decode or not
            outcomes["rejected"] += 1
            continue
        c = msg.entries  # type: ignore[union-attr]
        # What decodes satisfies every promise the store relies on.
        assert len(set(c.keys)) == len(c.keys) == len(c.versions) == len(c.values)
        assert all(type(k) is bytes for k in c.keys) and all(v is None or type(v) is bytes for v in c.values)
        assert all(0 <= v <= 2**63 - 1 for v in c.versions)
        outcomes["ok"] += 1
    assert outcomes["ok"] > 100 and outcomes["rejected"] > 10_000, outcomes


def test_fast_decoder_accepts_only_what_the_validating_decoder_accepts() -> None:
    """The inline checks for CMD/RSP/BACKUP/BACKUP_ACK/XFER_ACK agree with the named-field validators: whatever
    the fast path returns, the slow path returns too; what it passes on, the slow path decides."""
    from groupcluster.grid.payload import DEFAULT_LIMITS, _decode_fast, _decode_one
    from hypothesis import given, settings
    from hypothesis import strategies as st

    field = st.one_of(
        st.integers(-2, 5),
        st.sampled_from([2**63 - 1, 2**63, -(2**63)]),
        st.none(),
        st.booleans(),
        st.binary(max_size=3),
        st.text(max_size=3),
        st.floats(max_value=9, min_value=-1),
        st.sampled_from([math.nan, math.inf, 1764170000.25]),
    )

    @settings(max_examples=1500, deadline=None, derandomize=True, database=None)
    @given(st.sampled_from([4, 5, 6, 7, 10, 4.0]), st.lists(field, min_size=1, max_size=7))
    def check(kind: object, fields: list[object]) -> None:
        raw = [kind, *fields]
        fast = _decode_fast(raw, DEFAULT_LIMITS)
        try:
            slow = _decode_one(raw, "m", DEFAULT_LIMITS)
        except WireError:
            assert fast is None, (raw, fast)
            return
        assert fast is None or fast == slow

    check()


# ==== batches (grid format 3) ==============================================================================
def _batches() -> list[object]:
    c = CommandBatch(3)
    c.add(1, 1, PUT, b"k", b"v")
    c.add(2, 4, GET, b"k2", None, 1764170000.25)
    c.add(2**63 - 1, 1, DELETE, b"k", None)
    c.add(4, 1, PUT, b"e", b"")
    r = ResponseBatch()
    r.add(1, 1, OK, 3, b"v", "")
    r.add(2, 1, ERROR, 3, None, "segment 4 unavailable")
    r.add(3, 2, NOT_FOUND, 2**63 - 1, None, "")
    b = BackupBatch(3)
    b.add(5, 123, b"k", b"v")
    b.add(6, 124, b"k", None)  # a key twice: entries apply in order
    a = BackupAckBatch()
    a.add(5, OK, 3)
    a.add(6, RETRY, 4)
    return [c, r, b, a, CommandBatch(9), ResponseBatch()]


def test_batches_round_trip_and_expand_to_the_single_messages() -> None:
    msgs = _batches()
    assert decode_payload(encode_payload(msgs)) == msgs  # type: ignore[arg-type]
    # A batch of one travels as its single message.
    one = CommandBatch(3)
    one.add(1, 1, DELETE, b"k", None)
    assert decode_payload(encode_payload([one])) == [Command(1, 1, 3, DELETE, b"k", None)]
    assert unbatched(decode_payload(encode_payload(msgs[:4]))) == [  # type: ignore[arg-type]
        Command(1, 1, 3, PUT, b"k", b"v"),
        Command(2, 4, 3, GET, b"k2", None, 1764170000.25),
        Command(2**63 - 1, 1, 3, DELETE, b"k", None),
        Command(4, 1, 3, PUT, b"e", b""),
        Response(1, 1, OK, 3, b"v", ""),
        Response(2, 1, ERROR, 3, None, "segment 4 unavailable"),
        Response(3, 2, NOT_FOUND, 2**63 - 1, None, ""),
        Backup(5, 3, 123, b"k", b"v"),
        Backup(6, 3, 124, b"k", None),
        BackupAck(5, OK, 3),
        BackupAck(6, RETRY, 4),
    ]


def rsp_batch(*fields: object, versions: object = None) -> bytes:
    """An RSP_BATCH ``[14, *fields, versions]`` (versions default: one 0 per value)."""
    n = len(fields[4]) if isinstance(fields[4], list) else 1  # type: ignore[arg-type]
    return raw([14, *fields, le64(*([0] * n)) if versions is None else versions])


def cmd_batch(
    ids: object = None,
    attempts: object = None,
    kinds: object = b"\x01\x00",
    keys: object = None,
    puts: object = None,
    deadlines: object = None,
    expiries: object = None,
) -> bytes:
    """A CMD_BATCH of a PUT of a and a GET of b, with one field replaced (possibly wrong)."""
    ids = le64(1, 2) if ids is None else ids
    attempts = le64(1, 1) if attempts is None else attempts
    keys = [b"a", b"b"] if keys is None else keys
    return raw([13, 3, ids, attempts, kinds, keys, [b"v"] if puts is None else puts, deadlines, expiries])


def f64(*values: float) -> bytes:
    return struct.pack(f"<{len(values)}d", *values)


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (cmd_batch(), ""),  # the well-formed base case the others break
        (raw([13, 3, le64(1), le64(1), b"\x00"]), r"messages\[0\]: expected 9 items"),
        (raw([13, 3, le64(1), le64(1), b"\x00", [b"a"], [], None]), r"messages\[0\]: expected 9 items, got 8"),
        (raw([13, -3, le64(1), le64(1), b"\x00", [b"a"], [], None, None]), r"messages\[0\]\.topology_id"),
        (cmd_batch(expiries=f64(1.0)), r"messages\[0\]\.expiries: expected nil or 16 bytes \(8 per operation\)"),
        (cmd_batch(expiries=f64(1.0, math.nan)), r"messages\[0\]\.expiries\[1\]: expected a Unix time"),
        (cmd_batch(deadlines=f64(1.0)), r"messages\[0\]\.deadlines: expected nil or 16 bytes \(8 per operation\)"),
        (cmd_batch(deadlines=[1.0, 2.0]), r"messages\[0\]\.deadlines: expected nil or 16 bytes .*got list"),
        (cmd_batch(deadlines=f64(1.0, math.nan)), r"messages\[0\]\.deadlines\[1\]: expected a Unix time"),
        (cmd_batch(deadlines=f64(-1.0, 2.0)), r"messages\[0\]\.deadlines\[0\]: expected a Unix time"),
        (cmd_batch(deadlines=f64(math.inf, 2.0)), r"messages\[0\]\.deadlines\[0\]: .*got inf"),
        (cmd_batch(ids=le64(1)), r"messages\[0\]\.op_ids: expected 16 bytes \(8 per entry\), got 8 bytes"),
        (cmd_batch(ids=[1, 2]), r"messages\[0\]\.op_ids: expected 16 bytes \(8 per entry\), got list"),
        (cmd_batch(attempts=le64(1, 2**63)), r"messages\[0\]\.attempts\[1\]: above the limit"),
        (cmd_batch(kinds=b"\x01\x07"), r"messages\[0\]\.kinds\[1\]: 7 is not one of \[0, 1, 2\]"),
        (cmd_batch(kinds=b"\x01"), r"messages\[0\]\.kinds: expected 2 bytes"),
        (cmd_batch(kinds="ab"), r"messages\[0\]\.kinds: expected 2 bytes \(1 per entry\), got str"),
        (cmd_batch(keys=[b"a", "b"]), r"messages\[0\]\.keys\[1\]: expected bytes, got str"),
        (cmd_batch(keys=b"ab"), r"messages\[0\]\.keys: expected a list"),
        (cmd_batch(puts=[]), r"messages\[0\]\.values: expected a list of 1 items, got 0 items"),
        (cmd_batch(puts=[b"v", b"w"]), r"messages\[0\]\.values: expected a list of 1 items, got 2"),
        (cmd_batch(puts=[None]), r"messages\[0\]\.values\[0\]: expected bytes, got NoneType"),
        (
            raw([14, le64(1), le64(1), b"\x09", le64(3), [None], [], le64(0)]),
            r"messages\[0\]\.codes\[0\]: 9 is not one of",
        ),
        (
            raw([14, le64(1), le64(1), b"\x00", le64(3), [7], [], le64(0)]),
            r"messages\[0\]\.values\[0\]: expected bytes, got",
        ),
        (rsp_batch(le64(1), le64(1), b"\x00", le64(3), [None], [[1, "x"]]), r"errors\[0\]\.index"),
        (
            raw([14, le64(1, 2), le64(1, 1), b"\x03\x03", le64(3, 3), [None, None], [[0, "x"], [0, "y"]], le64(0, 0)]),
            "twice",
        ),
        (rsp_batch(le64(1), le64(1), b"\x03", le64(3), [None], [[0, 5]]), r"errors\[0\]\.text"),
        (rsp_batch(le64(1), le64(1), b"\x03", le64(3), [None], [[0, "x" * 513]]), r"errors\[0\]\.text"),
        (
            raw([14, le64(1), le64(1), b"\x00", le64(3, 4), [None], [], le64(0)]),
            r"messages\[0\]\.topology_ids: expected 8",
        ),
        (rsp_batch(le64(1), le64(1), b"\x00", le64(3), [None], [], versions=le64(1, 2)), r"\.versions: expected 8"),
        (raw([15, 3, le64(1), le64(1), [b"k"], [b"v", None], None]), r"messages\[0\]\.values: expected a list of 1"),
        (raw([15, 3, le64(1), le64(2**63), [b"k"], [b"v"], None]), r"messages\[0\]\.versions\[0\]: above the limit"),
        (raw([15, 3, le64(1), le64(1), [b"k"], [True], None]), r"messages\[0\]\.values\[0\]: expected bytes, got bool"),
        (raw([15, 3, le64(1), le64(1), [b"k"], [b"v"]]), r"messages\[0\]: expected 7 items, got 6"),
        (raw([15, 3, le64(1), le64(1), [b"k"], [b"v"], f64(-2.0)]), r"messages\[0\]\.expiries\[0\]: expected a Unix"),
        (raw([16, le64(1), b"\x00\x00", le64(3, 3)]), r"messages\[0\]\.write_ids: expected 16 bytes"),
        (raw([16, le64(1), 0, le64(3)]), r"messages\[0\]\.codes: expected at most"),
        (raw([16, le64(1), b"\x05", le64(3)]), r"messages\[0\]\.codes\[0\]: 5 is not one of"),
    ],
)
def test_bad_batches_are_rejected_with_the_field_named(payload: bytes, message: str) -> None:
    if not message:
        (b,) = decode_payload(payload)
        assert unbatched([b]) == [Command(1, 1, 3, PUT, b"a", b"v"), Command(2, 1, 3, GET, b"b", None)]
        return
    with pytest.raises(WireError, match=message):
        decode_payload(payload)


def test_batch_size_limits() -> None:
    limits = GridLimits(max_key_bytes=4, max_value_bytes=8, max_batch_entries=3)
    c = CommandBatch(1)
    c.add(1, 1, PUT, b"k", b"x" * 9)
    c.add(2, 1, GET, b"k", None)
    with pytest.raises(WireError, match=r"values\[0\]: 9 bytes exceed the limit of 8"):
        decode_payload(encode_payload([c]), limits)
    b = BackupBatch(1)
    b.add(1, 1, b"k", None)
    b.add(2, 1, b"toolong", b"v")
    with pytest.raises(WireError, match=r"keys\[1\]: 7 bytes exceed the limit of 4"):
        decode_payload(encode_payload([b]), limits)
    r = ResponseBatch()
    for i in range(4):
        r.add(i, 1, OK, 1, None, "")
    with pytest.raises(WireError, match=r"values"):
        decode_payload(encode_payload([r]), limits)
    a = BackupAckBatch()
    for i in range(4):
        a.add(i, OK, 1)
    with pytest.raises(WireError, match=r"codes: expected at most 3 bytes"):
        decode_payload(encode_payload([a]), limits)


def test_fuzzed_batches_decode_or_are_rejected_naming_the_field() -> None:
    rng = random.Random(7)
    good = encode_payload(_batches())  # type: ignore[arg-type]
    for _ in range(3000):
        data = bytearray(good)
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        try:
            decode_payload(bytes(data))
        except WireError as exc:
            assert str(exc).startswith("grid"), exc  # noqa: PT017  a mutation may decode or not
