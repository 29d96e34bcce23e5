"""Entry lifespans in the Python clients (grid/client.py): ``put(..., lifespan=S)`` sends ``?lifespan=S`` on its
PUT, ``put_many(..., lifespan=S)`` a ``{"lifespan": S}`` on every put of its batches, both resent unchanged on a
retry; a bad lifespan raises before anything is sent. A small aiohttp server on 127.0.0.1 records the requests
as they arrive and reads them with the member's own parsers (``parse_lifespan``, ``parse_batch``), so client
and member agree on the format."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable
from typing import Any

import msgpack
import pytest
from aiohttp import web
from groupcluster.grid.client import (
    MAX_LIFESPAN_SECONDS,
    AsyncGridClient,
    GridClient,
    GridRequestError,
)
from groupcluster.grid.client._batch import _BatchRun
from groupcluster.grid.http.parsers import parse_batch
from groupcluster.grid.lifespan import MAX_LIFESPAN_SECONDS as MEMBER_MAX_LIFESPAN
from groupcluster.grid.lifespan import parse_lifespan
from groupcluster.grid.messages import DELETE, PUT


class Recorder:
    """A member stand-in: records each key/value PUT (path, query string, lifespan as the member reads it) and
    each batch (its ops and lifespans as the member parses them). ``fail`` holds statuses to answer first."""

    def __init__(self) -> None:
        self.puts: list[tuple[str, str, float | None]] = []
        self.batches: list[tuple[list[tuple[int, bytes, bytes | None]], list[float | None]]] = []
        self.fail: list[int] = []
        self.mode = "distributed"

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_put("/v1/kv/{key}", self.put)
        app.router.add_put("/v1/caches/{cache}/kv/{key}", self.put)
        app.router.add_post("/v1/batch", self.batch)
        app.router.add_get("/v1/caches/{cache}", self.cache)
        return app

    def _failure(self) -> web.Response | None:
        if self.fail:
            return web.json_response({"error": "not now"}, status=self.fail.pop(0))
        return None

    async def put(self, request: web.Request) -> web.Response:
        await request.read()
        raw = request.query.get("lifespan")
        self.puts.append((request.path, request.query_string, None if raw is None else parse_lifespan(raw)))
        if request.match_info.get("cache") == "local" and raw is not None:
            return web.json_response({"error": "lifespan: not for invalidation caches"}, status=400)
        return self._failure() or web.json_response({"ok": True, "attempts": 1})

    async def batch(self, request: web.Request) -> web.Response:
        doc = msgpack.unpackb(await request.read(), raw=False)
        spans: list[float | None] = []
        ops = parse_batch(doc, True, spans)
        self.batches.append((ops, spans))
        failed = self._failure()
        if failed is not None:
            return failed
        return web.Response(
            body=msgpack.packb({"topology_id": 1, "results": [{"status": 200}] * len(ops)}),
            content_type="application/msgpack",
        )

    async def cache(self, request: web.Request) -> web.Response:
        return web.json_response({"name": request.match_info["cache"], "mode": self.mode})


def serving(scenario: Callable[[Recorder, str], Awaitable[None]]) -> Recorder:
    rec = Recorder()

    async def run() -> None:
        runner = web.AppRunner(rec.app(), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        try:
            await scenario(rec, f"127.0.0.1:{port}")
        finally:
            await runner.cleanup()

    asyncio.run(run())
    return rec


def sync_client(ep: str) -> GridClient:
    return GridClient([ep], route=False, retries=3, backoff=0.01, timeout=10.0)


def test_the_clients_bound_is_the_members() -> None:
    assert MAX_LIFESPAN_SECONDS == MEMBER_MAX_LIFESPAN == 10 * 365 * 24 * 3600


def test_put_sends_the_lifespan_as_a_query_parameter() -> None:
    def calls(ep: str) -> None:
        with sync_client(ep) as grid:
            grid.put(b"a", b"1", lifespan=30)
            grid.put(b"b", b"2", lifespan=0.5)
            grid.put(b"c", b"3", lifespan=1e-6)
            grid.put(b"d", b"4", lifespan=MAX_LIFESPAN_SECONDS)
            grid.put(b"e", b"5")
            grid.put(b"f", b"6", lifespan=None)

    async def scenario(rec: Recorder, ep: str) -> None:
        await asyncio.to_thread(calls, ep)

    rec = serving(scenario)
    assert rec.puts == [
        ("/v1/kv/a", "lifespan=30.0", 30.0),
        ("/v1/kv/b", "lifespan=0.5", 0.5),
        ("/v1/kv/c", "lifespan=1e-06", 1e-6),
        ("/v1/kv/d", "lifespan=315360000.0", float(MAX_LIFESPAN_SECONDS)),
        ("/v1/kv/e", "", None),
        ("/v1/kv/f", "", None),
    ]


def test_a_retried_put_sends_the_same_lifespan_again() -> None:
    def calls(ep: str) -> None:
        with sync_client(ep) as grid:
            grid.put(b"a", b"1", lifespan=12.5)

    async def scenario(rec: Recorder, ep: str) -> None:
        rec.fail = [503, 504]
        await asyncio.to_thread(calls, ep)

    rec = serving(scenario)
    assert rec.puts == [("/v1/kv/a", "lifespan=12.5", 12.5)] * 3


def test_put_many_sends_the_lifespan_on_every_put_and_resends_it_on_a_retry() -> None:
    def calls(ep: str) -> None:
        with sync_client(ep) as grid:
            grid.put_many({b"a": b"1", b"b": b"2"}, lifespan=60)
            grid.put_many({b"c": b"3"})

    async def scenario(rec: Recorder, ep: str) -> None:
        rec.fail = [503]
        await asyncio.to_thread(calls, ep)

    rec = serving(scenario)
    with_span = ([(PUT, b"a", b"1"), (PUT, b"b", b"2")], [60.0, 60.0])
    assert rec.batches == [with_span, with_span, ([(PUT, b"c", b"3")], [])]


def test_a_batch_body_carries_the_lifespan_on_puts_only() -> None:
    run = _BatchRun([("put", b"k", b"v"), ("delete", b"d", None)], 10.0, 2.5)
    assert msgpack.unpackb(run.body([0, 1])) == {"ops": [["put", b"k", b"v", {"lifespan": 2.5}], ["delete", b"d"]]}
    spans: list[float | None] = []
    assert parse_batch(msgpack.unpackb(run.body([1, 0]), raw=False), True, spans) == [
        (DELETE, b"d", None),
        (PUT, b"k", b"v"),
    ]
    assert spans == [None, 2.5]
    plain = _BatchRun([("put", b"k", b"v")], 10.0)
    assert msgpack.unpackb(plain.body([0])) == {"ops": [["put", b"k", b"v"]]}


def test_the_async_client_sends_lifespans_the_same_way() -> None:
    async def scenario(rec: Recorder, ep: str) -> None:
        async with AsyncGridClient([ep], route=False, retries=3, backoff=0.01, timeout=10.0) as grid:
            await grid.put(b"a", b"1", lifespan=45)
            await grid.put(b"b", b"2")
            await grid.put_many([(b"c", b"3"), (b"d", b"4")], lifespan=0.25)
            rec.fail = [503]
            await grid.put(b"e", b"5", lifespan=7)

    rec = serving(scenario)
    assert rec.puts == [
        ("/v1/kv/a", "lifespan=45.0", 45.0),
        ("/v1/kv/b", "", None),
        ("/v1/kv/e", "lifespan=7.0", 7.0),
        ("/v1/kv/e", "lifespan=7.0", 7.0),
    ]
    assert rec.batches == [([(PUT, b"c", b"3"), (PUT, b"d", b"4")], [0.25, 0.25])]


def test_named_cache_puts_take_a_lifespan() -> None:
    def calls(ep: str) -> None:
        with sync_client(ep) as grid:
            grid.cache("sessions").put(b"a", b"1", lifespan=3)
            grid.cache("sessions").put(b"b", b"2")
            with pytest.raises(GridRequestError, match="not for invalidation caches") as info:
                grid.cache("local").put(b"c", b"3", lifespan=3)
            assert info.value.status == 400

    async def scenario(rec: Recorder, ep: str) -> None:
        await asyncio.to_thread(calls, ep)
        async with AsyncGridClient([ep], route=False, retries=3, backoff=0.01, timeout=10.0) as grid:
            await grid.cache("sessions").put(b"d", b"4", lifespan=0.5)

    rec = serving(scenario)
    assert rec.puts == [
        ("/v1/caches/sessions/kv/a", "lifespan=3.0", 3.0),
        ("/v1/caches/sessions/kv/b", "", None),
        ("/v1/caches/local/kv/c", "lifespan=3.0", 3.0),  # a 400 is never retried
        ("/v1/caches/sessions/kv/d", "lifespan=0.5", 0.5),
    ]


BAD_LIFESPANS: list[tuple[Any, type[Exception], str]] = [
    (0, ValueError, r"^lifespan: expected seconds above 0, got 0$"),
    (-1.5, ValueError, r"^lifespan: expected seconds above 0, got -1\.5$"),
    (math.nan, ValueError, r"^lifespan: expected a finite number of seconds, got nan$"),
    (math.inf, ValueError, r"^lifespan: expected a finite number of seconds, got inf$"),
    (MAX_LIFESPAN_SECONDS + 0.5, ValueError, r"^lifespan: 315360000\.5 seconds exceed the limit of 315360000"),
    ("30", TypeError, r"^lifespan: expected seconds \(int or float\) or None, got str$"),
    (True, TypeError, r"^lifespan: expected seconds \(int or float\) or None, got bool$"),
]


@pytest.mark.parametrize(("bad", "error", "message"), BAD_LIFESPANS)
def test_a_bad_lifespan_raises_before_anything_is_sent(bad: Any, error: type[Exception], message: str) -> None:
    def calls(ep: str) -> None:
        with sync_client(ep) as grid:
            with pytest.raises(error, match=message):
                grid.put(b"a", b"1", lifespan=bad)
            with pytest.raises(error, match=message):
                grid.put_many({b"a": b"1"}, lifespan=bad)
            cache = grid.cache("sessions")
            with pytest.raises(error, match=message):
                cache.put(b"a", b"1", lifespan=bad)

    async def scenario(rec: Recorder, ep: str) -> None:
        await asyncio.to_thread(calls, ep)
        async with AsyncGridClient([ep], route=False) as grid:
            with pytest.raises(error, match=message):
                await grid.put(b"a", b"1", lifespan=bad)
            with pytest.raises(error, match=message):
                await grid.put_many({b"a": b"1"}, lifespan=bad)
            with pytest.raises(error, match=message):
                await grid.cache("sessions").put(b"a", b"1", lifespan=bad)

    rec = serving(scenario)
    assert rec.puts == [] and rec.batches == []
