"""A leaving member's HTTP API (grid/http/): new data requests get 503 with reason ``leaving`` (JSON, with
``Retry-After``) and nothing runs; every answer closes its connection; requests already running finish; and
:func:`close_http` answers every request it has read before the server goes, closes idle kept-alive connections,
and logs nothing at ERROR, also when a client goes away in the middle of its body.

The runtime is a recording fake served by the real app (``build_app``) on 127.0.0.1; the close tests speak raw
HTTP over sockets, so the timing of headers and body is the test's."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from groupcluster.grid.errors import GridLeaving, GridUnavailable
from groupcluster.grid.http import MemberContext, build_app, close_http
from groupcluster.grid.http.app import _refused_when_leaving
from groupcluster.grid.http.responses import LEAVING_ERROR, tx_failure
from groupcluster.grid.messages import GET, PUT
from groupcluster.grid.node import OpResult


class FakeRuntime:
    """Records what the HTTP API asks of the grid. ``hold``: puts wait for it; ``refuse``: raised by puts."""

    node = None

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.hold: asyncio.Event | None = None
        self.refuse: Exception | None = None

    async def put(self, key: bytes, value: bytes, deadline: float | None = None, **kw: Any) -> OpResult:
        self.calls.append(("put", key, value))
        if self.hold is not None:
            await self.hold.wait()
        if self.refuse is not None:
            raise self.refuse
        return OpResult(1, PUT, key, True)

    async def get_versioned(self, key: bytes, deadline: float | None = None) -> tuple[bytes | None, int]:
        self.calls.append(("get", key))
        return b"v", 1

    async def run_batch(
        self, ops: Sequence[tuple[int, bytes, bytes | None]], deadline: float | None = None, **kw: Any
    ) -> list[OpResult]:
        self.calls.append(("batch", list(ops)))
        return [
            OpResult(i, kind, key, True, value=b"v" if kind == GET else None) for i, (kind, key, _) in enumerate(ops)
        ]

    def status(self) -> dict[str, Any]:
        return {}

    def routing(self) -> None:
        return None


def context(grid: FakeRuntime) -> MemberContext:
    return MemberContext(cluster="t", grid=grid, request_leave=lambda: None, channel=lambda: None)  # type: ignore[arg-type]


Scenario = Callable[[TestClient[Any, Any], MemberContext], Awaitable[None]]


def serve(grid: FakeRuntime, scenario: Scenario) -> None:
    async def run() -> None:
        ctx = context(grid)
        async with TestClient(TestServer(build_app(ctx), host="127.0.0.1")) as client:
            await scenario(client, ctx)

    asyncio.run(run())


BATCH = json.dumps({"ops": [["put", "YQ==", "MQ=="]]}).encode()
DATA_REQUESTS = [
    ("PUT", "/v1/kv/a", b"1"),
    ("GET", "/v1/kv/a", None),
    ("DELETE", "/v1/kv/a", None),
    ("POST", "/v1/batch", BATCH),
    ("GET", "/v1/segments/0", None),
    ("GET", "/v1/changes/0", None),
    ("POST", "/v1/tx", b'{"writes": {"YQ==": "MQ=="}}'),
    ("POST", "/v1/tx/begin", None),
    ("PUT", "/v1/caches/sessions/kv/a", b"1"),
    ("POST", "/v1/caches/sessions/batch", BATCH),
    ("POST", "/v1/caches/sessions/tx/begin", None),
]


@pytest.mark.parametrize(("method", "path", "body"), DATA_REQUESTS)
def test_a_leaving_member_refuses_new_data_requests_with_503_leaving_and_runs_nothing(
    method: str, path: str, body: bytes | None
) -> None:
    grid = FakeRuntime()

    async def scenario(client: TestClient[Any, Any], ctx: MemberContext) -> None:
        ctx.leaving = True
        headers = {"Content-Type": "application/json"} if path.endswith(("/batch", "/tx")) else {}
        resp = await client.request(method, path, data=body, headers=headers)
        assert resp.status == 503, await resp.text()
        doc = await resp.json()
        assert doc["reason"] == "leaving" and doc["error"] == LEAVING_ERROR, doc
        if "/tx" in path:
            # The shape of the transaction answers, so the clients read it as "rolled back, retry elsewhere".
            assert doc["committed"] is False and doc["tx"] is None, doc
        assert resp.headers["Retry-After"] == "1"
        assert resp.headers["Connection"].lower() == "close"
        assert ctx.http_requests["refused_leaving"] == 1

    serve(grid, scenario)
    assert grid.calls == []


def test_before_leaving_the_same_requests_run_on_kept_alive_connections() -> None:
    grid = FakeRuntime()

    async def scenario(client: TestClient[Any, Any], ctx: MemberContext) -> None:
        resp = await client.put("/v1/kv/a", data=b"1")
        assert resp.status == 200 and "close" not in resp.headers.get("Connection", "").lower()
        resp = await client.post("/v1/batch", data=BATCH, headers={"Content-Type": "application/json"})
        assert resp.status == 200

    serve(grid, scenario)
    assert [c[0] for c in grid.calls] == ["put", "batch"]


def test_while_leaving_status_and_probes_answer_and_close_their_connections() -> None:
    async def scenario(client: TestClient[Any, Any], ctx: MemberContext) -> None:
        ctx.leaving = True
        for path in ("/healthz", "/v1/status"):
            resp = await client.get(path)
            assert resp.status == 200, (path, await resp.text())
            assert resp.headers["Connection"].lower() == "close"
        resp = await client.get("/no/such/path")
        assert resp.status == 404 and resp.headers["Connection"].lower() == "close"

    serve(FakeRuntime(), scenario)


@pytest.mark.parametrize(
    ("path", "refused"),
    [
        ("/v1/kv/a", True),
        ("/v1/kv/x/commit", True),  # a key that ends like a transaction action is still a key
        ("/v1/batch", True),
        ("/v1/segments/3", True),
        ("/v1/changes/3", True),
        ("/v1/tx", True),
        ("/v1/tx/begin", True),
        ("/v1/caches/c/kv/a", True),
        ("/v1/caches/c/tx", True),
        ("/v1/caches/c/tx/begin", True),
        # A transaction begun here lives here: it can still be finished, rolled back or resolved.
        ("/v1/tx/127.0.0.1:7800#1/2/lock", False),
        ("/v1/tx/127.0.0.1:7800#1/2/commit", False),
        ("/v1/tx/127.0.0.1:7800#1/2/rollback", False),
        ("/v1/tx/127.0.0.1:7800#1/2/resolve", False),
        ("/v1/tx/127.0.0.1:7800#1/2/report", False),
        ("/v1/tx/in-doubt", False),
        ("/v1/caches/c/tx/127.0.0.1:7800#1/2/commit", False),
        # Not data: status, probes, metrics, the listing of caches, admin requests.
        ("/v1/status", False),
        ("/readyz", False),
        ("/metrics", False),
        ("/v1/caches", False),
        ("/v1/caches/c", False),
        ("/v1/leave", False),
        ("/v1/capacity", False),
    ],
)
def test_which_requests_a_leaving_member_refuses(path: str, refused: bool) -> None:
    assert _refused_when_leaving(path) is refused


def test_a_put_running_when_the_leave_begins_is_answered_and_closes_its_connection() -> None:
    grid = FakeRuntime()

    async def scenario(client: TestClient[Any, Any], ctx: MemberContext) -> None:
        grid.hold = asyncio.Event()
        put = asyncio.ensure_future(client.put("/v1/kv/a", data=b"1"))
        while not grid.calls:  # noqa: ASYNC110  the fake runtime records calls in a list; nothing to await
            await asyncio.sleep(0.001)
        ctx.leaving = True
        grid.hold.set()
        resp = await put
        assert resp.status == 200, await resp.text()
        assert resp.headers["Connection"].lower() == "close"

    serve(grid, scenario)
    assert grid.calls == [("put", b"a", b"1")]


@pytest.mark.parametrize(
    ("refusal", "reason"),
    [
        (GridLeaving("this member is leaving the grid; use another member"), "leaving"),
        (GridLeaving("this member left the grid before the operation completed"), "leaving"),
        (GridUnavailable("segment 5 is unavailable for writes (deny_read_writes)"), "segment 5 is unavailable"),
    ],
)
def test_the_runtimes_refusals_give_503_with_their_reason(refusal: Exception, reason: str) -> None:
    # A PUT that got past the leaving check just before the leave began reaches the runtime, which refuses it.
    grid = FakeRuntime()
    grid.refuse = refusal

    async def scenario(client: TestClient[Any, Any], ctx: MemberContext) -> None:
        resp = await client.put("/v1/kv/a", data=b"1")
        assert resp.status == 503 and resp.headers["Retry-After"] == "1"
        doc = await resp.json()
        assert doc["reason"].startswith(reason) and doc["error"] == str(refusal), doc

    serve(grid, scenario)


def test_a_transaction_refused_because_the_member_is_leaving_says_so() -> None:
    resp = tx_failure(GridLeaving("this member is leaving the grid; use another member"))
    doc = json.loads(resp.body)  # type: ignore[arg-type]
    assert resp.status == 503 and doc["reason"] == "leaving" and doc["committed"] is False
    resp = tx_failure(GridUnavailable("segment 5 is unavailable for writes"))
    assert resp.status == 503 and json.loads(resp.body)["reason"] == "unavailable"  # type: ignore[arg-type]


# -- closing the server -------------------------------------------------------------------------------------------
async def _start(grid: FakeRuntime) -> tuple[web.AppRunner, MemberContext, int]:
    ctx = context(grid)
    runner = web.AppRunner(build_app(ctx), access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    return runner, ctx, port


async def _connect(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", port)


async def _answer(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    lines = head.decode().split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
    body = await asyncio.wait_for(reader.readexactly(int(headers.get("content-length", "0"))), 5)
    return status, headers, body


def _put_head(key: str, length: int) -> bytes:
    return f"PUT /v1/kv/{key} HTTP/1.1\r\nHost: t\r\nContent-Length: {length}\r\n\r\n".encode()


def test_closing_answers_a_put_whose_body_arrives_after_the_close_began(caplog: pytest.LogCaptureFixture) -> None:
    """aiohttp's own cleanup drops the bytes that reach a connection it is closing: this PUT's body, so the PUT
    would wait for it, unanswered, until the client gave up (and the cleanup with it)."""
    grid = FakeRuntime()

    async def run() -> None:
        runner, ctx, port = await _start(grid)
        idle_r, idle_w = await _connect(port)  # a kept-alive connection, idle once its request is answered
        idle_w.write(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
        assert (await _answer(idle_r))[0] == 200
        put_r, put_w = await _connect(port)
        put_w.write(_put_head("a", 5))
        await asyncio.sleep(0.05)  # the member has read the headers and waits for the body
        closing = asyncio.ensure_future(close_http(runner, ctx, 5.0))
        await asyncio.sleep(0.05)
        assert ctx.leaving and not closing.done()
        put_w.write(b"value")
        status, headers, _ = await _answer(put_r)
        assert status == 200 and headers["connection"].lower() == "close"
        assert await asyncio.wait_for(put_r.read(), 5) == b""  # then the member closes the connection
        assert await asyncio.wait_for(idle_r.read(), 5) == b""  # closed as it waited for a next request
        assert await asyncio.wait_for(closing, 5) is True
        with pytest.raises(ConnectionRefusedError):
            await _connect(port)
        for w in (idle_w, put_w):
            w.close()

    with caplog.at_level(logging.WARNING):
        asyncio.run(run())
    assert grid.calls == [("put", b"a", b"value")]
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []


def test_a_new_put_during_the_close_is_refused_once_its_body_arrives() -> None:
    grid = FakeRuntime()

    async def run() -> None:
        runner, ctx, port = await _start(grid)
        r, w = await _connect(port)
        ctx.leaving = True
        w.write(_put_head("b", 1))
        await asyncio.sleep(0.05)
        closing = asyncio.ensure_future(close_http(runner, ctx, 5.0))
        status, headers, body = await _answer(r)
        assert status == 503 and json.loads(body)["reason"] == "leaving"
        assert headers["connection"].lower() == "close" and headers["retry-after"] == "1"
        w.write(b"x")  # the rest of the request still goes in: the member reads it before it closes
        assert await asyncio.wait_for(r.read(), 5) == b""
        assert await asyncio.wait_for(closing, 5) is True
        w.close()

    asyncio.run(run())
    assert grid.calls == []


def test_a_client_that_leaves_mid_body_or_never_sends_it_logs_no_error(caplog: pytest.LogCaptureFixture) -> None:
    grid = FakeRuntime()

    async def run() -> None:
        runner, ctx, port = await _start(grid)
        # One client goes away in the middle of its body: its request ends with nobody to answer.
        _, gone_w = await _connect(port)
        gone_w.write(_put_head("c", 10) + b"half")
        await asyncio.sleep(0.05)
        gone_w.close()
        await asyncio.sleep(0.05)
        # Another never sends its body: the close waits for it no longer than its timeout.
        stuck_r, stuck_w = await _connect(port)
        stuck_w.write(_put_head("d", 10))
        await asyncio.sleep(0.05)
        loop = asyncio.get_running_loop()
        started = loop.time()
        assert await close_http(runner, ctx, 0.3) is False
        # Its timeout, then aiohttp's shutdown_timeout (1 s here) for the cleanup: not the 60 s aiohttp waits by
        # default for a request in progress, nor until the client gives up.
        assert loop.time() - started < 0.3 + 1.0 + 5.0
        assert await asyncio.wait_for(stuck_r.read(), 5) == b""
        stuck_w.close()

    with caplog.at_level(logging.DEBUG, logger="aiohttp"):
        asyncio.run(run())
    assert grid.calls == []
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [], [r.getMessage() for r in errors]
