"""The pure request parsers of the member HTTP API (grid/http/parsers.py) that the batch and transaction tests do
not cover: keys, deadlines, transaction ids, cursors, body formats and decoding, the key/value lifespan
parameter, segment pages and change-feed versions. Good input parses to what the handlers take; bad input raises
with a message naming what is wrong. Then, through the real app, that each of them answers bad input with a 400
(415 for an unknown body type) whose JSON ``error`` is that message, and nothing reaches the grid."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import msgpack
import pytest
from aiohttp.test_utils import TestClient, TestServer
from groupcluster.grid.http import MemberContext, build_app
from groupcluster.grid.http.parsers import (
    MAX_BATCH_OPS,
    MAX_KEY_BYTES,
    MAX_SCAN_LIMIT,
    BadBatch,
    accepts_msgpack,
    body_is_msgpack,
    decode_body,
    decode_cursor,
    encode_cursor,
    parse_batch,
    parse_change_version,
    parse_deadline,
    parse_key,
    parse_kv_lifespan,
    parse_page,
    parse_tx_id,
)


# -- keys ----------------------------------------------------------------------------------------------------------
def test_keys_are_utf8_bytes_of_the_path_segment() -> None:
    assert parse_key("k") == b"k"
    assert parse_key("a/b c") == b"a/b c"
    assert parse_key("ключ") == "ключ".encode()
    assert parse_key("k" * MAX_KEY_BYTES) == b"k" * MAX_KEY_BYTES


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("", r"^missing key: use /v1/kv/\{key\}$"),
        ("a\x01b", r"^bad key: control characters are not allowed$"),
        ("a\x7fb", r"^bad key: control characters are not allowed$"),
        ("\ud800", r"^bad key: not valid UTF-8$"),
        ("k" * (MAX_KEY_BYTES + 1), rf"^bad key: {MAX_KEY_BYTES + 1} bytes exceed the limit of {MAX_KEY_BYTES}$"),
        ("é" * (MAX_KEY_BYTES // 2 + 1), rf"^bad key: {MAX_KEY_BYTES + 2} bytes exceed the limit"),
    ],
)
def test_bad_keys_say_what_is_wrong(raw: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_key(raw)


# -- deadlines -----------------------------------------------------------------------------------------------------
def test_deadlines_are_unix_times_in_seconds() -> None:
    assert parse_deadline("1764170000.25") == 1764170000.25
    assert parse_deadline(" 1764170000 ") == 1764170000.0
    assert parse_deadline("1e-3") == 0.001


@pytest.mark.parametrize("raw", ["", "soon", "0", "-1", "nan", "inf", "-inf", "1e400", "0x10"])
def test_bad_deadlines_name_the_header_and_the_value(raw: str) -> None:
    with pytest.raises(ValueError, match=r"^X-Grid-Deadline: expected a Unix time in seconds .*, got '") as err:
        parse_deadline(raw)
    assert repr(raw) in str(err.value)


def test_a_long_bad_deadline_is_shortened_in_the_message() -> None:
    with pytest.raises(ValueError, match=r"got 'x{40}\.\.\.'$"):
        parse_deadline("x" * 500)


# -- transaction ids -----------------------------------------------------------------------------------------------
def test_transaction_ids_parse_back_from_their_text() -> None:
    tx = parse_tx_id("127.0.0.1:7800#123/4")
    assert str(tx) == "127.0.0.1:7800#123/4"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("nonsense", r"expected originator/sequence"),
        ("127.0.0.1:7800#1/x", r"the sequence 'x' is not a non-negative integer"),
        ("/4", r"expected originator/sequence"),
        ("no-port/4", r"bad originator"),
    ],
)
def test_bad_transaction_ids_say_what_an_id_looks_like(text: str, message: str) -> None:
    with pytest.raises(BadBatch, match=message) as err:
        parse_tx_id(text)
    assert str(err.value).startswith(f"transaction id {text!r}: ")
    assert str(err.value).endswith("(ids look like 127.0.0.1:7800#123/4)")


# -- scan cursors --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("key", [b"k", b"\x00\xff", b"a" * 100, bytes(range(256))])
def test_cursors_round_trip_without_padding(key: bytes) -> None:
    cursor = encode_cursor(key)
    assert "=" not in cursor and "+" not in cursor and "/" not in cursor
    assert decode_cursor(cursor) == key


@pytest.mark.parametrize("text", ["", "!!", "a b", "YQ==", "a+b/", "A"])
def test_bad_cursors_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match=r"^after: not a cursor from a previous page \(base64url\)$"):
        decode_cursor(text)


# -- body formats and decoding -------------------------------------------------------------------------------------
def test_the_accept_header_asks_for_msgpack_by_any_of_its_names() -> None:
    assert accepts_msgpack("application/msgpack")
    assert accepts_msgpack("text/html, application/x-msgpack;q=0.9")
    assert accepts_msgpack(" application/vnd.msgpack ")
    assert not accepts_msgpack("")
    assert not accepts_msgpack("application/json")
    assert not accepts_msgpack("*/*")


def test_the_content_type_says_msgpack_or_json_and_nothing_else() -> None:
    assert body_is_msgpack("application/msgpack") is True
    assert body_is_msgpack("application/x-msgpack") is True
    assert body_is_msgpack("application/json") is False
    with pytest.raises(ValueError, match=r"^Content-Type text/plain is not supported: use application/msgpack or"):
        body_is_msgpack("text/plain")
    with pytest.raises(ValueError, match=r"^Content-Type \(none\) is not supported"):
        body_is_msgpack("")


def test_bodies_decode_in_both_formats() -> None:
    doc = {"ops": [["get", b"k"]]}
    assert decode_body(msgpack.packb(doc, use_bin_type=True), True, strict=False) == doc
    assert decode_body(b'{"ops": [["get", "aw=="]]}', False, strict=True) == {"ops": [["get", "aw=="]]}


@pytest.mark.parametrize(
    ("raw", "binary", "strict", "message"),
    [
        (b"{nope", False, False, r"^body: not valid JSON \("),
        (b"\xc1", True, False, r"^body: not valid msgpack \("),
        (b"\x92\x01", True, False, r"^body: not valid msgpack \("),  # an array cut short
        (b'{"a": 1, "a": 2}', False, True, r"^body: not valid JSON \(the map key 'a' is given twice\)$"),
        (msgpack.packb({"ops": [0] * (2 * MAX_BATCH_OPS + 1)}), True, False, r"^body: not valid msgpack \("),
    ],
)
def test_bad_bodies_say_which_format_failed(raw: bytes, binary: bool, strict: bool, message: str) -> None:
    with pytest.raises(BadBatch, match=message):
        decode_body(raw, binary, strict=strict)


def test_a_repeated_map_key_is_taken_when_not_strict() -> None:
    assert decode_body(b'{"a": 1, "a": 2}', False, strict=False) == {"a": 2}


# -- the key/value lifespan parameter ------------------------------------------------------------------------------
def test_a_put_takes_one_lifespan() -> None:
    assert parse_kv_lifespan("PUT", ["30"]) == 30.0
    assert parse_kv_lifespan("PUT", ["250ms"]) == 0.25


@pytest.mark.parametrize(
    ("method", "given", "message"),
    [
        ("GET", ["30"], r"^lifespan: only a PUT takes a lifespan, not a GET$"),
        ("DELETE", ["30"], r"^lifespan: only a PUT takes a lifespan, not a DELETE$"),
        ("PUT", ["30", "40"], r"^lifespan: given 2 times; give it once$"),
        ("PUT", ["0"], r"^lifespan: expected seconds above 0, got '0'$"),
    ],
)
def test_bad_lifespan_parameters_say_what_is_wrong(method: str, given: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_kv_lifespan(method, given)


# -- segment pages and change-feed versions ------------------------------------------------------------------------
def test_pages_take_a_segment_and_a_limit() -> None:
    assert parse_page("0", {}) == (0, 1000)
    assert parse_page("17", {"limit": "5", "after": "x"}) == (17, 5)
    assert parse_page("3", {"limit": str(MAX_SCAN_LIMIT)}) == (3, MAX_SCAN_LIMIT)


@pytest.mark.parametrize(
    ("segment", "query", "message"),
    [
        ("x", {}, r"^segment: expected a segment number, got 'x'$"),
        ("-1", {}, r"^segment: expected a segment number, got '-1'$"),
        ("²", {}, r"^segment: expected a segment number, got '²'$"),
        ("0", {"page": "2", "size": "1"}, r"^unknown query parameter\(s\) page, size \(after, limit\)$"),
        ("0", {"limit": "0"}, rf"^limit: expected 1 to {MAX_SCAN_LIMIT}, got '0'$"),
        ("0", {"limit": str(MAX_SCAN_LIMIT + 1)}, rf"^limit: expected 1 to {MAX_SCAN_LIMIT}, got '10001'$"),
        ("0", {"limit": "ten"}, r"^limit: expected 1 to \d+, got 'ten'$"),
        ("0", {"limit": "³"}, r"^limit: expected 1 to \d+, got '³'$"),
    ],
)
def test_bad_pages_say_what_is_wrong(segment: str, query: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_page(segment, query)


def test_change_versions_are_integers_below_2_to_the_63() -> None:
    assert parse_change_version("0") == 0
    assert parse_change_version(str((1 << 63) - 1)) == (1 << 63) - 1
    for bad in ("", "-1", "1.5", "x", "²", str(1 << 63)):
        with pytest.raises(ValueError, match=r"^after: expected a version \(an integer >= 0\), got "):
            parse_change_version(bad)


# -- batch bodies as a whole (operations: test_grid_http_batch.py) -------------------------------------------------
@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ([["get", b"k"]], r'^body: expected a map \{"ops": '),
        ({}, r'^body: expected a map \{"ops": '),
        ({"ops": [], "extra": 1, "more": 2}, r'^body: unknown field\(s\) extra, more \(only "ops"\)$'),
        ({"ops": {"get": b"k"}}, r"^ops: expected a list, got dict$"),
        ({"ops": []}, r"^ops: empty \(give at least one operation\)$"),
        ({"ops": [["get", b"k"]] * (MAX_BATCH_OPS + 1)}, rf"^ops: {MAX_BATCH_OPS + 1} operations exceed the limit"),
        ({"ops": [["put", b"k", b"v", {"lifespan": 5}]]}, r"^ops\[0\]\[3\]\.lifespan: lifespans are not accepted"),
    ],
)
def test_bad_batch_bodies_name_the_field(doc: Any, message: str) -> None:
    with pytest.raises(BadBatch, match=message):
        parse_batch(doc, True)


# -- through the app: bad input is a 400 (or 415) with the parser's message, and the grid is not asked ------------
class UntouchedGrid:
    """A grid that fails the test if a request gets as far as asking it anything."""

    node = None

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the grid was asked for {name!r} on a request that should have been refused")


BAD_REQUESTS = [
    ("GET", "/v1/kv/a%01b", {}, None, 400, "bad key: control characters are not allowed"),
    ("GET", "/v1/kv/" + "k" * (MAX_KEY_BYTES + 1), {}, None, 400, "bad key: 4097 bytes exceed the limit of 4096"),
    ("GET", "/v1/kv/k?lifespan=30", {}, None, 400, "lifespan: only a PUT takes a lifespan, not a GET"),
    ("PUT", "/v1/kv/k?lifespan=30&lifespan=4", {}, b"v", 400, "lifespan: given 2 times; give it once"),
    ("PUT", "/v1/kv/k?lifespan=-1", {}, b"v", 400, "lifespan: expected seconds above 0, got '-1'"),
    ("GET", "/v1/kv/k", {"X-Grid-Deadline": "soon"}, None, 400, "X-Grid-Deadline: expected a Unix time"),
    ("GET", "/v1/segments/x", {}, None, 400, "segment: expected a segment number, got 'x'"),
    ("GET", "/v1/segments/%C2%B2", {}, None, 400, "segment: expected a segment number, got '²'"),
    ("GET", "/v1/segments/0?limit=0", {}, None, 400, "limit: expected 1 to 10000, got '0'"),
    ("GET", "/v1/segments/0?limit=%C2%B3", {}, None, 400, "limit: expected 1 to 10000, got '³'"),
    ("GET", "/v1/segments/0?after=%21%21", {}, None, 400, "after: not a cursor from a previous page"),
    ("GET", "/v1/changes/0?after=-1", {}, None, 400, "after: expected a version (an integer >= 0), got '-1'"),
    ("GET", "/v1/changes/0?after=%C2%B2", {}, None, 400, "after: expected a version (an integer >= 0), got '²'"),
    ("GET", "/v1/changes/0?page=1", {}, None, 400, "unknown query parameter(s) page (after, limit)"),
    ("POST", "/v1/batch", {"Content-Type": "text/plain"}, b"x", 415, "Content-Type text/plain is not supported"),
    ("POST", "/v1/batch", {"Content-Type": "application/json"}, b"{nope", 400, "body: not valid JSON ("),
    ("POST", "/v1/batch", {"Content-Type": "application/json"}, b'{"ops": []}', 400, "ops: empty"),
    ("POST", "/v1/tx", {"Content-Type": "application/json"}, b'{"a": 1, "a": 2}', 400, "is given twice"),
    ("POST", "/v1/tx", {"Content-Type": "application/json"}, b"{}", 400, "body: an empty transaction"),
    ("POST", "/v1/tx/nonsense/commit", {}, None, 400, "transaction id 'nonsense': expected originator/sequence"),
]


@pytest.mark.parametrize(("method", "path", "headers", "body", "status", "message"), BAD_REQUESTS)
def test_bad_requests_get_the_parsers_message_as_a_json_error(
    method: str, path: str, headers: dict[str, str], body: bytes | None, status: int, message: str
) -> None:
    async def run() -> None:
        ctx = MemberContext(cluster="t", grid=UntouchedGrid(), request_leave=lambda: None, channel=lambda: None)  # type: ignore[arg-type]
        async with TestClient(TestServer(build_app(ctx), host="127.0.0.1")) as client:
            resp = await client.request(method, path, headers=headers, data=body)
            text = await resp.text()
            assert resp.status == status, text
            assert resp.content_type == "application/json"
            assert message in json.loads(text)["error"], text

    asyncio.run(run())
