"""``parse_batch`` of grid/http/parsers.py: the per-column path for uniform msgpack batches (only puts, or only
gets and deletes) gives what the per-operation loop gives, and anything off still gets the loop's error
naming the operation and the field."""

from __future__ import annotations

import pytest
from groupcluster.grid.http.parsers import MAX_BATCH_KEY_BYTES, MAX_VALUE_BYTES, BadBatch, parse_batch
from groupcluster.grid.messages import DELETE, GET, PUT


def test_uniform_batches_parse_to_kind_key_value() -> None:
    puts = [["put", b"k%d" % i, b"v%d" % i] for i in range(50)] + [["put", b"e", b""]]
    assert parse_batch({"ops": puts}, True) == [(PUT, op[1], op[2]) for op in puts]
    reads = [["get", b"a"], ["delete", b"b"], ["get", b"c"]]
    assert parse_batch({"ops": reads}, True) == [(GET, b"a", None), (DELETE, b"b", None), (GET, b"c", None)]
    mixed = [["get", b"a"], ["put", b"b", b"1"], ["delete", b"c"]]
    assert parse_batch({"ops": mixed}, True) == [(GET, b"a", None), (PUT, b"b", b"1"), (DELETE, b"c", None)]
    # JSON bodies (base64) take the per-operation loop.
    assert parse_batch({"ops": [["put", "YQ==", "Yg=="]]}, False) == [(PUT, b"a", b"b")]


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (["put", b"x", "text"], r"^ops\[3\]\[2\] \(value\): expected bytes \(msgpack bin\), got str$"),
        (["put", b"x", None], r"^ops\[3\]\[2\] \(value\): expected bytes"),
        (["put", b"", b"v"], r"^ops\[3\]\[1\] \(key\): 0 bytes is outside \[1, "),
        (["put", b"k" * (MAX_BATCH_KEY_BYTES + 1), b"v"], r"^ops\[3\]\[1\] \(key\): 65537 bytes is outside"),
        (["put", b"x", b"v" * (MAX_VALUE_BYTES + 1)], r"^ops\[3\]\[2\] \(value\): \d+ bytes exceed the limit"),
        (["putt", b"x", b"v"], r"^ops\[3\]\[0\]: unknown op 'putt'"),
        ([["put"], b"x", b"v"], r"^ops\[3\]\[0\]: unknown op \['put'\]"),  # unhashable: no TypeError
        (["get", b"x", b"v"], r"^ops\[3\]: get takes no value"),
        (["put", b"x"], r"^ops\[3\]: put needs a value"),
        (("put", b"x", b"v"), r"^ops\[3\]: expected \[op, key\]"),
    ],
)
def test_one_bad_operation_in_a_batch_of_puts_is_named(bad: list[object], message: str) -> None:
    ops = [["put", b"k%d" % i, b"v"] for i in range(3)] + [bad] + [["put", b"z", b"v"]]
    with pytest.raises(BadBatch, match=message):
        parse_batch({"ops": ops}, True)


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (["get", "text"], r"^ops\[1\]\[1\] \(key\): expected bytes"),
        ([{"get": 1}, b"x"], r"^ops\[1\]\[0\]: unknown op"),
        (["put", b"x"], r"^ops\[1\]: put needs a value"),
    ],
)
def test_one_bad_operation_in_a_batch_of_reads_is_named(bad: list[object], message: str) -> None:
    with pytest.raises(BadBatch, match=message):
        parse_batch({"ops": [["get", b"a"], bad, ["delete", b"b"]]}, True)
