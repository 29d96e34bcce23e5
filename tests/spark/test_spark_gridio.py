"""GridIO's scan rules against a scripted member on a real socket: answers a real member cannot be made to give.

A real grid never sends a page whose keys go back behind the cursor, nor a malformed page; the guards for
those cases are checked here with a small HTTP server that answers from a script. Everything a real member
does (409 and following the segment, pages, retries) is checked against real members in test_spark_grid.py.
"""

from __future__ import annotations

import json
import threading
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import msgpack
import pytest
from groupcluster.spark.gridio import GridIO, GridSourceError
from groupcluster.spark.options import parse_options


class Script:
    """What the fake member answers: a routing table, and scan pages by ``after`` cursor."""

    def __init__(self) -> None:
        self.url = ""
        self.pages: dict[str | None, tuple[int, bytes, str]] = {}
        self.requests: list[str] = []


def _handler(script: Script) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            script.requests.append(self.path)
            u = urllib.parse.urlsplit(self.path)
            if u.path == "/v1/status":
                routing = {
                    "topology_id": 3,
                    "num_segments": 2,
                    "members": [script.url],
                    "read": [0, 0],
                    "write": [0, 0],
                }
                self._send(200, json.dumps({"routing": routing}).encode(), "application/json")
                return
            after = urllib.parse.parse_qs(u.query).get("after", [None])[0]
            status, body, ctype = script.pages[after]
            self._send(status, body, ctype)

        def _send(self, status: int, body: bytes, ctype: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    return Handler


@pytest.fixture
def member() -> Iterator[Script]:
    script = Script()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(script))
    script.url = f"http://127.0.0.1:{server.server_address[1]}"
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        yield script
    finally:
        server.shutdown()
        server.server_close()


def page(entries: list[list[Any]], nxt: str | None) -> tuple[int, bytes, str]:
    doc = {"segment": 1, "topology_id": 3, "entries": entries, "next": nxt}
    return 200, msgpack.packb(doc, use_bin_type=True), "application/msgpack"


def io_for(script: Script, **opts: str) -> GridIO:
    return GridIO(parse_options({"members": script.url, "retries": "1", "timeout": "5", **opts}))


def test_keys_behind_the_cursor_are_dropped_never_returned_twice(member: Script) -> None:
    member.pages = {
        None: page([[b"a", b"1", 10], [b"c", b"3", 12]], "Yw"),
        "Yw": page([[b"b", b"2", 11], [b"c", b"3", 12], [b"d", b"4", 13]], None),
    }
    io = io_for(member)
    entries = io.read_segment(1)
    assert [k for k, _, _ in entries] == [b"a", b"c", b"d"]
    assert io.stats["out_of_order_dropped"] == 2
    assert any("after=Yw" in r for r in member.requests), "the cursor was not sent"


def test_refused_and_malformed_pages_fail_with_the_reason(member: Script) -> None:
    member.pages = {None: (400, json.dumps({"error": "after: empty cursor"}).encode(), "application/json")}
    with pytest.raises(GridSourceError, match="scan of segment 1 refused: HTTP 400: after: empty cursor"):
        io_for(member).read_segment(1)
    member.pages = {None: (200, msgpack.packb({"entries": "nope"}), "application/msgpack")}
    with pytest.raises(GridSourceError, match="malformed page of segment 1"):
        io_for(member).read_segment(1)


def test_a_member_that_keeps_refusing_exhausts_the_retries(member: Script) -> None:
    member.pages = {None: (503, json.dumps({"error": "not joined yet"}).encode(), "application/json")}
    with pytest.raises(
        GridSourceError, match=r"scan of segment 1 failed after 2 attempts; last: .*503: not joined yet"
    ):
        io_for(member).read_segment(1)


def test_no_member_reachable_is_a_clear_error() -> None:
    io = GridIO(parse_options({"members": "127.0.0.1:9", "retries": "0", "timeout": "2"}))
    with pytest.raises(GridSourceError, match="no grid member answered /v1/status"):
        io.refresh()
