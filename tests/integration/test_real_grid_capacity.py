"""Changing a running member's capacity over HTTP (docs/grid.md, "Capacity"): ``POST /v1/capacity
{"capacity": 0}`` on one of three real members moves every segment off it while it stays in the group, every
key reads back, and ``{"capacity": 1}`` gives it its share again. Bad bodies are 400s naming what is wrong."""

from __future__ import annotations

import asyncio
import json

import pytest
from groupcluster.grid.client import AsyncGridClient, GridClient, GridRequestError

from .grids import Grid, http, http_json
from .procs import Members, wait_until

NAMES = ["m0", "m1", "m2"]


def _post(url: str, body: bytes) -> tuple[int, dict]:
    code, raw = http("POST", url + "/v1/capacity", body, headers={"Content-Type": "application/json"})
    return code, json.loads(raw)


def _owned(grid: Grid, name: str) -> int | None:
    st = grid.status(name)
    return None if st is None or st["grid"] is None else st["grid"]["segments_owned"]


def test_capacity_zero_empties_a_member_and_one_fills_it_again(members: Members) -> None:
    grid = Grid(members, 3)
    for i in range(3):
        grid.start(i, "--grid-set", "num_owners=2")
    wait_until("three members settled", lambda: grid.settled(NAMES), 90, members)
    data = {f"c{i}".encode(): f"v{i}".encode() for i in range(3000)}
    url = grid.urls["m2"]
    with GridClient(list(grid.urls.values()), timeout=30.0, retries=20) as client:
        client.put_many(data)
        assert (_owned(grid, "m2") or 0) > 0
        code, body = _post(url, b'{"capacity": 0}')
        assert code == 202 and body["capacity"] == 0.0, body
        wait_until("m2 owns no segment", lambda: grid.settled(NAMES) and _owned(grid, "m2") == 0, 90, members)
        st = grid.status("m2")
        assert st is not None and st["grid"]["capacity"] == 0.0 and st["grid"]["store"]["entries"] == 0
        assert len(st["view"]["members"]) == 3  # still in the group
        got = client.get_many(list(data))
        assert [k for k, v in data.items() if got[k] != v] == []
        client.set_capacity(url, 1)  # the client's call for the same request
        wait_until("m2 owns segments again", lambda: grid.settled(NAMES) and (_owned(grid, "m2") or 0) > 0, 90, members)
        got = client.get_many(list(data))
        assert [k for k, v in data.items() if got[k] != v] == []
        with pytest.raises(GridRequestError) as refused:
            client.set_capacity(url, -2)
        assert refused.value.status == 400 and "capacity: expected a number" in str(refused.value)

    async def halve() -> float:
        async with AsyncGridClient([url]) as aclient:
            await aclient.set_capacity(url, 0.5)
            return (await aclient.status(url))["grid"]["capacity"]

    assert asyncio.run(halve()) == 0.5


BAD = [
    (b'{"capacity": -1}', "capacity: expected a number from 0 to 1000000, got -1"),
    (b'{"capacity": "2"}', "capacity: expected a number from 0 to 1000000, got '2'"),
    (b'{"capacity": true}', "capacity: expected a number from 0 to 1000000, got True"),
    (b'{"capacity": 1, "extra": 2}', 'body: expected {"capacity": c} and nothing else'),
    (b"[1]", 'body: expected {"capacity": c} and nothing else'),
    (b"{nope", "body: not valid JSON"),
    (b"", "missing body"),
]


def test_bad_capacity_requests_get_a_400_naming_the_problem_and_change_nothing(members: Members) -> None:
    grid = Grid(members, 1)
    grid.start(0)
    wait_until("one member settled", lambda: grid.settled(["m0"]), 90, members)
    url = grid.urls["m0"]
    for body, message in BAD:
        code, doc = _post(url, body)
        assert code == 400 and doc["error"].startswith(message), (body, doc)
    code, doc = http_json("POST", url + "/v1/caches/none/capacity", b'{"capacity": 1}')
    assert code == 404 and "no cache named 'none'" in doc["error"], doc
    st = grid.status("m0")
    assert st is not None and st["grid"]["capacity"] == 1.0
