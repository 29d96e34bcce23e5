"""Entry lifespans on the member HTTP API (grid/http/): ``PUT /v1/kv/{key}?lifespan=S`` and a batch put's
``{"lifespan": S}``. Good values reach the runtime as ``lifespan=`` / ``lifespans=`` exactly; every bad one is a
400 naming ``lifespan`` (or the batch operation) with nothing sent to the runtime; an invalidation cache refuses
lifespans; a ValueError the runtime raises for a lifespan (e.g. one it finds out of range) is a 400.

The runtime is a recording fake: what is tested here is the HTTP parsing and dispatch, served by the real app
(``build_app``) on 127.0.0.1."""

from __future__ import annotations

import asyncio
import base64
import math
import re
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import msgpack
import pytest
from aiohttp.test_utils import TestClient, TestServer
from groupcluster.grid.caches import InvalidationRuntime
from groupcluster.grid.http import MemberContext, build_app
from groupcluster.grid.http.parsers import BadBatch, parse_batch
from groupcluster.grid.lifespan import MAX_LIFESPAN_SECONDS, parse_lifespan
from groupcluster.grid.messages import DELETE, GET, PUT
from groupcluster.grid.node import OpResult


class FakeRuntime:
    """Records what the HTTP API asks of the grid; every write succeeds."""

    node = None

    def __init__(self, refuse_lifespans: str | None = None) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.refuse_lifespans = refuse_lifespans

    def _refuse(self, given: bool) -> None:
        if given and self.refuse_lifespans is not None:
            raise ValueError(self.refuse_lifespans)

    async def put(self, key: bytes, value: bytes, deadline: float | None = None, **kw: Any) -> OpResult:
        self._refuse("lifespan" in kw)
        self.calls.append(("put", key, value, kw))
        return OpResult(1, PUT, key, True)

    async def delete(self, key: bytes, deadline: float | None = None) -> OpResult:
        self.calls.append(("delete", key))
        return OpResult(1, DELETE, key, True)

    async def get_versioned(self, key: bytes, deadline: float | None = None) -> tuple[bytes | None, int]:
        self.calls.append(("get", key))
        return b"v", 1

    async def run_batch(
        self, ops: Sequence[tuple[int, bytes, bytes | None]], deadline: float | None = None, **kw: Any
    ) -> list[OpResult]:
        self._refuse("lifespans" in kw)
        self.calls.append(("batch", list(ops), kw))
        return [
            OpResult(i, kind, key, True, value=b"v" if kind == GET else None, version=1)
            for i, (kind, key, _) in enumerate(ops)
        ]


class FakeInvalidation(InvalidationRuntime, FakeRuntime):
    """An invalidation cache's runtime, as far as the HTTP API can tell (it dispatches on the type)."""

    def __init__(self) -> None:
        FakeRuntime.__init__(self)

    async def put(self, key: bytes, value: bytes, deadline: float | None = None) -> OpResult:  # type: ignore[override]
        return await FakeRuntime.put(self, key, value, deadline)

    async def run_batch(  # type: ignore[override]
        self, ops: Sequence[tuple[int, bytes, bytes | None]], deadline: float | None = None
    ) -> list[OpResult]:
        return await FakeRuntime.run_batch(self, ops, deadline)


class FakeCaches:
    """The parts of a CacheSet the HTTP API reads to find a named cache."""

    def __init__(self, default: FakeRuntime, named: dict[str, tuple[str, FakeRuntime]]) -> None:
        self.default = default
        self.named = named

    def get(self, name: str) -> FakeRuntime | None:
        return self.default if name == "default" else self.named.get(name, (None, None))[1]

    def mode_of(self, name: str) -> str | None:
        return "distributed" if name == "default" else self.named.get(name, (None, None))[0]

    def names(self) -> list[str]:
        return ["default", *self.named]


Scenario = Callable[[TestClient[Any, Any]], Awaitable[None]]


def serve(grid: FakeRuntime, scenario: Scenario, caches: FakeCaches | None = None) -> None:
    async def run() -> None:
        ctx = MemberContext(cluster="t", grid=grid, request_leave=lambda: None, channel=lambda: None)  # type: ignore[arg-type]
        ctx.caches = caches  # type: ignore[assignment]
        async with TestClient(TestServer(build_app(ctx), host="127.0.0.1")) as client:
            await scenario(client)

    asyncio.run(run())


# -- the query parameter ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("raw", "seconds"),
    [
        ("30", 30.0),
        ("0.5", 0.5),
        ("1e3", 1000.0),
        ("30s", 30.0),
        ("250ms", 0.25),
        ("5m", 300.0),
        ("2h", 7200.0),
        (str(MAX_LIFESPAN_SECONDS), float(MAX_LIFESPAN_SECONDS)),
        ("1e-6", 1e-6),
    ],
)
def test_good_lifespans_parse_to_seconds(raw: str, seconds: float) -> None:
    assert parse_lifespan(raw) == seconds


BAD_PARAMS = [
    ("", r"^lifespan: expected seconds \(e\.g\. 30, 0\.5, 1e3\) or a duration .* got ''$"),
    ("abc", r"^lifespan: expected seconds .* got 'abc'$"),
    ("30d", r"^lifespan: expected seconds .*units: us, ms, s, m, h\), got '30d'$"),
    ("-5s", r"^lifespan: expected seconds .* got '-5s'$"),
    ("0", r"^lifespan: expected seconds above 0, got '0'$"),
    ("0s", r"^lifespan: expected seconds above 0, got '0s'$"),
    ("-1", r"^lifespan: expected seconds above 0, got '-1'$"),
    ("nan", r"^lifespan: expected a finite number of seconds, got 'nan'$"),
    ("inf", r"^lifespan: expected a finite number of seconds, got 'inf'$"),
    ("1e400", r"^lifespan: expected a finite number of seconds, got '1e400'$"),
    ("315360000.5", r"^lifespan: '315360000\.5' seconds exceed the limit of 315360000 \(10 years\)$"),
    ("87600h1", r"^lifespan: expected seconds"),
    ("9" * 100, r"^lifespan: '9{39}\.\.\. seconds exceed the limit"),
]


@pytest.mark.parametrize(("raw", "message"), BAD_PARAMS)
def test_bad_lifespans_say_what_is_wrong(raw: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_lifespan(raw)


def test_a_put_with_a_lifespan_hands_it_to_the_runtime_and_one_without_does_not() -> None:
    grid = FakeRuntime()

    async def scenario(client: TestClient[Any, Any]) -> None:
        resp = await client.put("/v1/kv/a", data=b"1", params={"lifespan": "30"})
        assert resp.status == 200, await resp.text()
        resp = await client.put("/v1/kv/b", data=b"2", params={"lifespan": "1.5m"})
        assert resp.status == 200
        resp = await client.put("/v1/kv/c", data=b"3")
        assert resp.status == 200

    serve(grid, scenario)
    assert grid.calls == [
        ("put", b"a", b"1", {"lifespan": 30.0}),
        ("put", b"b", b"2", {"lifespan": 90.0}),
        ("put", b"c", b"3", {}),  # the common path: put called exactly as before
    ]


def test_a_bad_lifespan_is_a_400_and_nothing_reaches_the_runtime() -> None:
    grid = FakeRuntime()

    async def scenario(client: TestClient[Any, Any]) -> None:
        for raw, message in BAD_PARAMS:
            resp = await client.put("/v1/kv/a", data=b"1", params={"lifespan": raw})
            assert resp.status == 400
            doc = await resp.json()
            assert set(doc) == {"error"}
            assert re.match(message, doc["error"]), (raw, doc)
        resp = await client.put("/v1/kv/a?lifespan=30&lifespan=60", data=b"1")
        assert resp.status == 400
        assert (await resp.json())["error"] == "lifespan: given 2 times; give it once"
        for method in ("GET", "DELETE"):
            resp = await client.request(method, "/v1/kv/a", params={"lifespan": "30"})
            assert resp.status == 400
            assert (await resp.json())["error"] == f"lifespan: only a PUT takes a lifespan, not a {method}"
        # A lifespan does not excuse a missing body.
        resp = await client.put("/v1/kv/a", params={"lifespan": "30"})
        assert resp.status == 400 and "missing body" in (await resp.json())["error"]

    serve(grid, scenario)
    assert grid.calls == []


def test_a_runtime_that_cannot_take_a_lifespan_answers_400_with_its_message() -> None:
    why = "lifespan: expected a positive, finite number of seconds, got inf"
    grid = FakeRuntime(refuse_lifespans=why)

    async def scenario(client: TestClient[Any, Any]) -> None:
        resp = await client.put("/v1/kv/a", data=b"1", params={"lifespan": "30"})
        assert resp.status == 400 and (await resp.json()) == {"error": why}
        resp = await client.post("/v1/batch", json={"ops": [["put", b64(b"k"), b64(b"v"), {"lifespan": 5}]]})
        assert resp.status == 400 and (await resp.json()) == {"error": why}
        resp = await client.put("/v1/kv/a", data=b"1")  # without one: written as always
        assert resp.status == 200

    serve(grid, scenario)
    assert grid.calls == [("put", b"a", b"1", {})]


# -- batches -------------------------------------------------------------------------------------------------
def b64(b: bytes) -> str:
    return base64.b64encode(b).decode()


def test_batch_puts_with_lifespans_parse_to_one_lifespan_per_operation() -> None:
    spans: list[float | None] = []
    ops = [["get", b"a"], ["put", b"b", b"1"], ["put", b"c", b"2", {"lifespan": 30}], ["delete", b"d"]]
    ops.append(["put", b"e", b"3", {"lifespan": 0.5}])
    parsed = parse_batch({"ops": ops}, True, spans)
    assert parsed == [(GET, b"a", None), (PUT, b"b", b"1"), (PUT, b"c", b"2"), (DELETE, b"d", None), (PUT, b"e", b"3")]
    assert spans == [None, None, 30.0, None, 0.5]
    assert all(type(s) is float for s in spans if s is not None)
    # Without any lifespan the list stays empty (msgpack per-column path and per-operation loop alike).
    for body in ([["put", b"x", b"1"], ["put", b"y", b"2"]], [["get", b"x"], ["put", b"y", b"2"]]):
        spans = []
        parse_batch({"ops": body}, True, spans)
        assert spans == []
    spans = []
    parse_batch({"ops": [["put", b64(b"k"), b64(b"v"), {"lifespan": MAX_LIFESPAN_SECONDS}]]}, False, spans)
    assert spans == [float(MAX_LIFESPAN_SECONDS)]


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"lifespan": 0}, r"^ops\[2\]\[3\]\.lifespan: expected seconds above 0, got 0$"),
        ({"lifespan": -3.5}, r"^ops\[2\]\[3\]\.lifespan: expected seconds above 0, got -3\.5$"),
        ({"lifespan": math.nan}, r"^ops\[2\]\[3\]\.lifespan: expected a finite number of seconds, got nan$"),
        ({"lifespan": math.inf}, r"^ops\[2\]\[3\]\.lifespan: expected a finite number of seconds, got inf$"),
        ({"lifespan": MAX_LIFESPAN_SECONDS + 1}, r"^ops\[2\]\[3\]\.lifespan: 315360001 seconds exceed the limit"),
        ({"lifespan": 10**400}, r"^ops\[2\]\[3\]\.lifespan: 1{1}0{39}\.\.\. seconds exceed the limit"),
        ({"lifespan": True}, r"^ops\[2\]\[3\]\.lifespan: expected a number of seconds, got bool$"),
        ({"lifespan": "30"}, r"^ops\[2\]\[3\]\.lifespan: expected a number of seconds, got str$"),
        ({"lifespan": None}, r"^ops\[2\]\[3\]\.lifespan: expected a number of seconds, got NoneType$"),
        ({}, r'^ops\[2\]\[3\]: missing "lifespan"'),
        ({"lifespan": 5, "ttl": 5}, r'^ops\[2\]\[3\]: unknown field\(s\) ttl \(only "lifespan"\)$'),
        (30, r'^ops\[2\]\[3\]: expected a map \{"lifespan": seconds\}, got int$'),
    ],
)
def test_a_bad_batch_lifespan_names_the_operation(bad: object, message: str) -> None:
    ops = [["put", b"a", b"1", {"lifespan": 5}], ["put", b"b", b"2"], ["put", b"c", b"3", bad]]
    with pytest.raises(BadBatch, match=message):
        parse_batch({"ops": ops}, True, [])


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (["get", b"k", {"lifespan": 5}], r"^ops\[1\]: get takes no lifespan \(only a put does\)$"),
        (["delete", b"k", {"lifespan": 5}], r"^ops\[1\]: delete takes no lifespan \(only a put does\)$"),
        (["delete", b"k", None, {"lifespan": 5}], r"^ops\[1\]: delete takes no lifespan"),
        (["get", b"k", {"other": 5}], r"^ops\[1\]: get takes no value"),
        (["put", b"k", b"v", {"lifespan": 5}, 1], r"^ops\[1\]: expected \[op, key\]"),
    ],
)
def test_a_lifespan_on_a_get_or_delete_is_refused(bad: list[object], message: str) -> None:
    with pytest.raises(BadBatch, match=message):
        parse_batch({"ops": [["put", b"a", b"1"], bad]}, True, [])


def test_a_batch_hands_lifespans_to_the_runtime_only_when_some_put_has_one() -> None:
    grid = FakeRuntime()

    async def scenario(client: TestClient[Any, Any]) -> None:
        body = {"ops": [["put", b"a", b"1", {"lifespan": 30}], ["get", b"b"], ["put", b"c", b"2"]]}
        resp = await client.post("/v1/batch", data=msgpack.packb(body), headers={"Content-Type": "application/msgpack"})
        assert resp.status == 200
        assert msgpack.unpackb(await resp.read())["results"][0] == {"status": 200}
        resp = await client.post("/v1/batch", json={"ops": [["put", b64(b"d"), b64(b"3"), {"lifespan": 0.25}]]})
        assert resp.status == 200
        resp = await client.post(
            "/v1/batch",
            data=msgpack.packb({"ops": [["put", b"e", b"4"]]}),
            headers={"Content-Type": "application/msgpack"},
        )
        assert resp.status == 200

    serve(grid, scenario)
    assert grid.calls == [
        ("batch", [(PUT, b"a", b"1"), (GET, b"b", None), (PUT, b"c", b"2")], {"lifespans": [30.0, None, None]}),
        ("batch", [(PUT, b"d", b"3")], {"lifespans": [0.25]}),
        ("batch", [(PUT, b"e", b"4")], {}),  # the common path: run_batch called exactly as before
    ]


def test_a_bad_batch_lifespan_is_a_400_and_nothing_runs() -> None:
    grid = FakeRuntime()

    async def scenario(client: TestClient[Any, Any]) -> None:
        ops = [["put", b64(b"a"), b64(b"1")], ["put", b64(b"b"), b64(b"2"), {"lifespan": -1}]]
        resp = await client.post("/v1/batch", json={"ops": ops})
        assert resp.status == 400
        assert (await resp.json()) == {"error": "ops[1][3].lifespan: expected seconds above 0, got -1"}
        resp = await client.post("/v1/batch", json={"ops": [["get", b64(b"a"), {"lifespan": 5}]]})
        assert resp.status == 400
        assert (await resp.json()) == {"error": "ops[0]: get takes no lifespan (only a put does)"}

    serve(grid, scenario)
    assert grid.calls == []


# -- named caches ----------------------------------------------------------------------------------------------
def test_named_caches_take_lifespans_except_invalidation_caches() -> None:
    default, dist, inv = FakeRuntime(), FakeRuntime(), FakeInvalidation()
    caches = FakeCaches(default, {"sessions": ("distributed", dist), "local": ("invalidation", inv)})

    async def scenario(client: TestClient[Any, Any]) -> None:
        resp = await client.put("/v1/caches/sessions/kv/a", data=b"1", params={"lifespan": "10s"})
        assert resp.status == 200
        body = msgpack.packb({"ops": [["put", b"b", b"2", {"lifespan": 7}]]})
        resp = await client.post(
            "/v1/caches/sessions/batch", data=body, headers={"Content-Type": "application/msgpack"}
        )
        assert resp.status == 200
        resp = await client.put("/v1/caches/local/kv/a", data=b"1", params={"lifespan": "10"})
        assert resp.status == 400
        assert (await resp.json()) == {
            "error": "lifespan: lifespans are not supported for invalidation caches (cache 'local' is one); "
            "nothing was written",
            "cache": "local",
        }
        ops = [["put", b"x", b"1"], ["put", b"y", b"2", {"lifespan": 7}]]
        resp = await client.post(
            "/v1/caches/local/batch", data=msgpack.packb({"ops": ops}), headers={"Content-Type": "application/msgpack"}
        )
        assert resp.status == 400
        assert (await resp.json())["error"].startswith(
            "ops[1][3].lifespan: lifespans are not supported for invalidation caches"
        )
        # Without a lifespan an invalidation cache writes as always.
        resp = await client.put("/v1/caches/local/kv/a", data=b"1")
        assert resp.status == 200
        resp = await client.put("/v1/caches/nope/kv/a", data=b"1", params={"lifespan": "10"})
        assert resp.status == 404

    serve(default, scenario, caches)
    assert dist.calls == [
        ("put", b"a", b"1", {"lifespan": 10.0}),
        ("batch", [(PUT, b"b", b"2")], {"lifespans": [7.0]}),
    ]
    assert inv.calls == [("put", b"a", b"1", {})]
    assert default.calls == []
