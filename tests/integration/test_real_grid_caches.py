"""Named caches in real member processes (docs/grid.md, "Named caches and modes").

Three members declare, next to the default cache, a distributed cache ``dist``, a replicated cache ``repl`` and
an invalidation cache ``near`` (``--cache``). Through the HTTP API and :meth:`GridClient.cache`:

* the caches are independent (a key written in one is absent from the others) and ``/v1/caches`` lists them;
* an invalidation write on one member drops the copy another member held, and a member that never wrote the
  key holds nothing;
* a 4th member joins: it receives the whole replicated cache and answers every read of it from its own copy
  (``op="get_local"`` in /metrics counts them);
* the coordinator is killed with SIGKILL: nothing of the replicated (or the 2-owner distributed) cache is lost;
  then a member leaves gracefully (``POST /v1/leave``): it hands off every cache first;
* an unknown cache is a 404 naming it, a transaction on the replicated cache a 409 saying why, a member that
  declares ``near`` with another mode is reported by the others, and a bad ``--cache`` stops a member at once
  with a clear error.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys

import msgpack
import pytest
from groupcluster.grid.client import AsyncGridClient, GridClient, GridRequestError

from .grids import Grid, http, http_json
from .procs import Members, wait_until

CACHES = (
    "--cache",
    "dist:num_segments=32,num_owners=2",
    "--cache",
    "repl:mode=replicated,num_segments=32",
    "--cache",
    "near:mode=invalidation",
)
KEYS = 200
MSGPACK = "application/msgpack"
JSON = "application/json"


def _caches(grid: Grid, name: str) -> dict[str, dict]:
    code, body = http_json("GET", grid.urls[name] + "/v1/caches")
    assert code == 200, body
    return {c["name"]: c for c in body["caches"]}


def _metric(grid: Grid, name: str, pattern: str) -> float:
    code, body = http("GET", grid.urls[name] + "/metrics")
    assert code == 200
    m = re.search(r"^" + re.escape(pattern) + r" (\S+)$", body.decode(), re.M)
    assert m, f"{pattern} missing from /metrics of {name}"
    return float(m.group(1))


def _settled(grid: Grid, names: list[str]) -> bool:
    """The default cache settled and every named distributed/replicated cache ready on every member."""
    if not grid.settled(names):
        return False
    for n in names:
        for c in _caches(grid, n).values():
            if not c["ready"] or (c["mode"] != "invalidation" and c["phase"] not in (None, "NO_REBALANCE")):
                return False
    return True


def test_named_caches_with_three_modes(members: Members) -> None:
    grid = Grid(members, 5)
    for i in range(3):
        grid.start(i, *CACHES)
    names = ["m0", "m1", "m2"]
    wait_until("3 members with their caches", lambda: _settled(grid, names), 90, members)
    listed = _caches(grid, "m1")
    assert {n: c["mode"] for n, c in listed.items()} == {
        "default": "distributed",
        "dist": "distributed",
        "repl": "replicated",
        "near": "invalidation",
    }
    assert listed["dist"]["num_owners"] == 2 and listed["repl"]["num_segments"] == 32
    assert listed["repl"]["num_owners"] is None  # every member

    urls = [grid.urls[n] for n in names]
    with GridClient(urls, timeout=60.0, retries=30) as client:
        repl, dist = client.cache("repl"), client.cache("dist")
        assert (repl.mode, dist.mode) == ("replicated", "distributed")
        for i in range(KEYS):
            repl.put(b"r%d" % i, b"rv%d" % i)
            dist.put(b"d%d" % i, b"dv%d" % i)
        client.put(b"shared", b"default")
        repl.put(b"shared", b"repl")
        assert client.get(b"shared") == b"default" and repl.get(b"shared") == b"repl" and dist.get(b"shared") is None
        # Every member holds the whole replicated cache (a key each plus "shared").
        for n in names:
            assert _caches(grid, n)["repl"]["entries"] == KEYS + 1

        # Invalidation: m1 holds a copy, m0's write of the key drops it; m2 never held one.
        near = "/v1/caches/near/kv/k"
        assert http("PUT", grid.urls["m1"] + near, b"from-m1")[0] == 200
        assert http("GET", grid.urls["m1"] + near) == (200, b"from-m1")
        assert http("PUT", grid.urls["m0"] + near, b"from-m0")[0] == 200
        assert http("GET", grid.urls["m0"] + near) == (200, b"from-m0")
        assert http("GET", grid.urls["m1"] + near)[0] == 404
        assert http("GET", grid.urls["m2"] + near)[0] == 404
        dropped = 'groupcluster_cache_counter{cache="near",mode="invalidation",name="inv.dropped"}'
        assert _metric(grid, "m1", dropped) == 1

        # Batches and the asyncio client work per cache too.
        body = msgpack.packb({"ops": [["put", b"b1", b"x"], ["get", b"r1"], ["get", b"zz"]]})
        code, raw = http("POST", grid.urls["m2"] + "/v1/caches/repl/batch", body, headers={"Content-Type": MSGPACK})
        assert code == 200, raw
        assert [r["status"] for r in msgpack.unpackb(raw)["results"]] == [200, 200, 404]
        code, raw = http("POST", grid.urls["m2"] + "/v1/caches/near/batch", body, headers={"Content-Type": MSGPACK})
        assert code == 200 and [r["status"] for r in msgpack.unpackb(raw)["results"]] == [200, 404, 404]

        async def async_ops() -> tuple[bytes | None, bytes | None]:
            async with AsyncGridClient(urls, timeout=60.0) as aclient:
                arepl = aclient.cache("repl")
                await arepl.put(b"async", b"a")
                return await arepl.get(b"async"), await aclient.cache("dist").get(b"async")

        assert asyncio.run(async_ops()) == (b"a", None)

        # A joiner receives the replicated cache and reads it locally.
        grid.start(3, *CACHES)
        names4 = [*names, "m3"]
        wait_until("the 4th member holds its caches", lambda: _settled(grid, names4), 120, members)
        assert _caches(grid, "m3")["repl"]["entries"] == KEYS + 3
        # Every old member sent part of it (split by segments), not the coordinator alone.
        sent = 'groupcluster_cache_counter{cache="repl",mode="replicated",name="grid.xfer_entries_out"}'
        parts = [_metric(grid, n, sent) for n in names]
        assert all(p > 0 for p in parts) and sum(parts) >= KEYS + 3, parts
        for i in range(KEYS):
            assert http("GET", grid.urls["m3"] + f"/v1/caches/repl/kv/r{i}") == (200, b"rv%d" % i)
        label = '{cache="repl",mode="replicated",op="%s"}'
        assert _metric(grid, "m3", "groupcluster_cache_operations_total" + label % "get") == KEYS
        assert _metric(grid, "m3", "groupcluster_cache_operations_total" + label % "get_local") == KEYS
        assert http("GET", grid.urls["m3"] + near)[0] == 404  # no state transfer in invalidation mode

        # SIGKILL of the coordinator: nothing of the replicated or the 2-owner distributed cache is lost.
        coord = (grid.status("m1") or {}).get("coordinator")
        victim = next(n for n in names4 if (grid.status(n) or {}).get("address") == coord)
        grid.procs[victim].kill()
        rest = [n for n in names4 if n != victim]
        wait_until("the 3 survivors settled", lambda: _settled(grid, rest), 120, members)
        for i in range(KEYS):
            assert repl.get(b"r%d" % i) == b"rv%d" % i
            assert dist.get(b"d%d" % i) == b"dv%d" % i
        for n in rest:
            assert _caches(grid, n)["repl"]["entries"] == KEYS + 3

        # A graceful leave hands off every cache before the member leaves the group.
        leaver = rest.pop()
        assert http("POST", grid.urls[leaver] + "/v1/leave")[0] == 202
        assert grid.procs[leaver].wait(60) == 0
        assert "grid segments handed off" in grid.procs[leaver].log_text()
        wait_until("the 2 survivors settled", lambda: _settled(grid, rest), 120, members)
        for i in range(KEYS):
            assert repl.get(b"r%d" % i) == b"rv%d" % i
            assert dist.get(b"d%d" % i) == b"dv%d" % i
        for n in rest:
            assert _caches(grid, n)["repl"]["entries"] == KEYS + 3
            assert _caches(grid, n)["dist"]["entries"] == KEYS  # 2 owners, 2 members: both hold everything

        # Bad requests get clear errors.
        code, body = http_json("GET", grid.urls[rest[0]] + "/v1/caches/nope/kv/x")
        assert code == 404 and "no cache named 'nope'" in body["error"] and "repl" in body["error"]
        with pytest.raises(GridRequestError, match="no cache named 'nope'"):
            client.cache("nope")
        tx = json.dumps({"writes": {"eA==": "eQ=="}}).encode()  # x -> y
        code, body = http_json("POST", grid.urls[rest[0]] + "/v1/caches/repl/tx", tx)
        assert code == 409 and "transactions run on distributed caches only" in body["error"]
        # On a distributed named cache a transaction commits there, and only there.
        code, raw = http("POST", grid.urls[rest[0]] + "/v1/caches/dist/tx", tx, headers={"Content-Type": JSON})
        assert code == 200 and json.loads(raw)["committed"] is True, raw
        assert dist.get(b"x") == b"y" and client.get(b"x") is None

    # A member declaring "near" with another mode: the others report it, and its payloads are not mixed in.
    odd = grid.start(4, "--cache", "near:mode=replicated")

    # Its grid node reports to the coordinator, which drops the payloads and says so.
    def reported() -> dict[str, str]:
        found: dict[str, str] = {}
        for n in rest:
            found.update(_caches(grid, n)["near"]["mode_mismatch"])
        return found

    wait_until("the mode mismatch reported", lambda: bool(reported()), 60, members, [odd])
    assert list(reported().values()) == ["replicated"]
    odd.kill()


def test_bad_cache_option_stops_the_member_with_a_clear_error() -> None:
    argv = [sys.executable, "-m", "groupcluster.cli", "member", "--cluster", "x", "--bind", "127.0.0.1:0", "--grid"]
    for bad, message in (
        ("sessions:mode=replicatd", "--cache sessions: mode 'replicatd' is not one of distributed, replicated"),
        ("Sessions", "the name 'Sessions' must be 1 to 48 characters"),
    ):
        done = subprocess.run([*argv, "--cache", bad], capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and message in done.stderr, done.stderr
