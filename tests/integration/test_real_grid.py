"""Real grid members (``groupcluster member --grid --http``) on loopback, driven through the HTTP API.

The main test starts 3 members and keeps a writer running (the blocking :class:`GridClient`, one thread,
overwriting a few hundred keys round after round and reading back keys it wrote) while

(a) a 4th member joins and receives its segments,
(b) a member leaves gracefully with ``POST /v1/leave`` (it exits only after its segments have new owners),
(c) the coordinator is killed with SIGKILL (2 owners: nothing acknowledged may be lost).

A second writer does the same with batches (``put_many``/``get_many``, ``POST /v1/batch``), so batches
are split by owner and retried per key across the same topology changes. Afterwards every acknowledged write
must be readable with its last acknowledged value, a scan of every segment (``GET /v1/segments/{id}``) must
return exactly the acknowledged data, no operation may have failed (the client's documented retries are
allowed and counted), and operations must have completed during every phase. Finally one more member is
killed, which leaves a degraded partition: the grid answers 503 with a reason, per operation in a batch.
Other tests send bad requests (key/value, batch, segment scan) and expect clear 4xx JSON errors.
"""

from __future__ import annotations

import asyncio
import base64
import json
import signal
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import msgpack
import pytest
from groupcluster.grid.client import (
    AsyncGridClient,
    GridBatchError,
    GridClient,
    GridRequestError,
    GridUnavailableError,
)

from .grids import Grid, http, http_json
from .procs import Members, free_port, wait_until

KEYS = 300
BATCH_KEYS = 200


@dataclass
class Writer:
    """One thread: overwrite KEYS keys round after round; read back a key written earlier after each write."""

    client: GridClient
    acked: dict[bytes, bytes] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    stale_reads: list[str] = field(default_factory=list)
    ops_by_phase: dict[str, int] = field(default_factory=dict)
    phase: str = "start"
    stop: threading.Event = field(default_factory=threading.Event)
    writes: int = 0

    def run(self) -> None:
        i = 0
        while not self.stop.is_set():
            key = f"key-{i % KEYS}".encode()
            value = f"value-{i}".encode()
            try:
                self.client.put(key, value)
                self.acked[key] = value
                self.writes += 1
                self._done()
                probe = f"key-{(i * 7) % KEYS}".encode()
                if probe in self.acked:
                    got = self.client.get(probe)
                    # One writer: nothing wrote this key since its last acknowledged write.
                    if got != self.acked[probe]:
                        self.stale_reads.append(f"{probe!r}: read {got!r}, last acknowledged {self.acked[probe]!r}")
                    self._done()
            except (GridUnavailableError, GridRequestError) as exc:
                # The write may or may not have been applied: it is not acknowledged, so it is not checked
                # (a later write of the same key overwrites it anyway).
                self.failures.append(f"{self.phase}: {exc}")
            i += 1

    def _done(self) -> None:
        self.ops_by_phase[self.phase] = self.ops_by_phase.get(self.phase, 0) + 1


@dataclass
class BatchWriter:
    """One thread: rewrite BATCH_KEYS keys with ``put_many`` round after round; ``get_many`` them all back."""

    client: GridClient
    acked: dict[bytes, bytes] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    stale_reads: list[str] = field(default_factory=list)
    rounds_by_phase: dict[str, int] = field(default_factory=dict)
    phase: str = "start"
    stop: threading.Event = field(default_factory=threading.Event)
    rounds: int = 0

    def run(self) -> None:
        keys = [f"b-{i}".encode() for i in range(BATCH_KEYS)]
        r = 0
        while not self.stop.is_set():
            # Each round writes every other key, so a round's batch mixes fresh values and untouched keys.
            items = {k: f"round-{r}-{k.decode()}".encode() for i, k in enumerate(keys) if i % 2 == r % 2}
            started_in = self.phase
            try:
                self.client.put_many(items)
                self.acked.update(items)
                got = self.client.get_many(keys)
                stale = [k for k in keys if got[k] != self.acked.get(k)]
                if stale:
                    k = stale[0]
                    self.stale_reads.append(f"{len(stale)} keys, e.g. {k!r}: {got[k]!r} != {self.acked.get(k)!r}")
                self.rounds += 1
                # A round counts for the phase it began in and the one it ended in: one that spans a crash
                # (blocked until the view change) is the interesting case, not a gap.
                for phase in {started_in, self.phase}:
                    self.rounds_by_phase[phase] = self.rounds_by_phase.get(phase, 0) + 1
            except (GridUnavailableError, GridRequestError) as exc:
                self.failures.append(f"{self.phase}: {exc}")
            r += 1
            # Leave the (2-core) machine to the members and the single-key writer most of the time.
            self.stop.wait(0.1)


def scan_all(client: GridClient, num_segments: int) -> dict[bytes, bytes]:
    out: dict[bytes, bytes] = {}
    for s in range(num_segments):
        for k, v in client.scan_segment(s, page_size=7):  # small pages: the cursor is exercised too
            assert k not in out, f"segment scan returned {k!r} twice"
            out[k] = v
    return out


def test_writes_survive_join_graceful_leave_and_sigkill(members: Members) -> None:
    grid = Grid(members, 4)
    for i in range(3):
        grid.start(i)
    first3 = ["m0", "m1", "m2"]
    wait_until("3 members with a balanced grid", lambda: grid.settled(first3), 60, members)

    # A segment m0 does not read (3 members, 2 owners: about a third) is refused with its owners' URLs.
    st = grid.status("m0")
    assert st is not None
    routing = st["routing"]
    me = routing["addresses"].index(st["address"])
    elsewhere = next(s for s, owners in enumerate(routing["owners"]) if me not in owners)
    code, body = http_json("GET", grid.urls["m0"] + f"/v1/segments/{elsewhere}")
    assert code == 409 and "not readable on this member" in body["error"], body
    assert routing["members"][routing["read"][elsewhere]] in body["owners"], body

    client = GridClient([grid.urls[n] for n in first3], timeout=60.0, retries=40)
    writer = Writer(client)
    batch_client = GridClient([grid.urls[n] for n in first3], timeout=60.0, retries=40, batch_size=64)
    bwriter = BatchWriter(batch_client)
    thread = threading.Thread(target=writer.run, daemon=True)
    bthread = threading.Thread(target=bwriter.run, daemon=True)
    thread.start()
    bthread.start()

    def set_phase(name: str) -> None:
        writer.phase = bwriter.phase = name

    def worked_in(phase: str) -> bool:
        # A phase lasts until both writers did some work in it (a loaded machine may settle the grid before
        # the writers got far), so "operations completed during every phase" does not depend on timing.
        return writer.ops_by_phase.get(phase, 0) > 20 and bwriter.rounds_by_phase.get(phase, 0) >= 1

    try:
        wait_until("the writers to get going", lambda: writer.writes >= 200 and bwriter.rounds >= 3, 30, members)

        # (a) a fourth member joins while the writer runs.
        set_phase("join")
        grid.start(3)
        all4 = [*first3, "m3"]
        wait_until("the joiner to receive its segments", lambda: grid.settled(all4) and worked_in("join"), 60, members)
        joiner = grid.status("m3")
        assert joiner is not None and joiner["grid"]["segments_owned"] > 0
        status, metrics = http("GET", grid.urls["m3"] + "/metrics")
        assert status == 200
        received = _metric(metrics.decode(), "groupcluster_grid_rebalance_entries_received_total")
        assert received > 0, "the joiner received no entries by state transfer"

        # (b) a graceful leave through the HTTP API: the member exits after handing its segments off.
        set_phase("leave")
        leaver = grid.procs["m1"]
        code, body = http_json("POST", grid.urls["m1"] + "/v1/leave")
        assert code == 202 and body["leaving"] is True
        wait_until("the leaver to exit", lambda: not leaver.alive(), 60, members)
        assert leaver.wait(5) == 0
        assert "grid segments handed off" in leaver.log_text()
        rest = ["m0", "m2", "m3"]
        wait_until("3 members balanced after the leave", lambda: grid.settled(rest) and worked_in("leave"), 60, members)

        # (c) SIGKILL of the coordinator: with 2 owners per segment nothing acknowledged is lost.
        set_phase("kill")
        grid.procs["m0"].kill()
        survivors = ["m2", "m3"]
        wait_until(
            "2 members balanced after the crash", lambda: grid.settled(survivors) and worked_in("kill"), 60, members
        )
        set_phase("after")
        before, bbefore = writer.writes, bwriter.rounds
        wait_until(
            "writes after the crash",
            lambda: writer.writes >= before + 100 and bwriter.rounds >= bbefore + 3,
            30,
            members,
        )
    finally:
        writer.stop.set()
        bwriter.stop.set()
        thread.join(timeout=90)
        bthread.join(timeout=90)
    assert not thread.is_alive(), "the writer did not stop"
    assert not bthread.is_alive(), "the batch writer did not stop"
    print(f"writer: {writer.writes} writes acknowledged, operations by phase {writer.ops_by_phase}, {client.stats}")
    print(f"batch writer: {bwriter.rounds} rounds, by phase {bwriter.rounds_by_phase}, {batch_client.stats}")
    batch_client.close()

    assert bwriter.failures == [], f"{len(bwriter.failures)} batches failed: {bwriter.failures[:3]}"
    assert bwriter.stale_reads == [], bwriter.stale_reads[:3]
    for phase in ("start", "join", "leave", "kill", "after"):
        assert bwriter.rounds_by_phase.get(phase, 0) >= 1, f"no batch round during {phase}: {bwriter.rounds_by_phase}"

    assert writer.failures == [], f"{len(writer.failures)} operations failed: {writer.failures[:5]}"
    assert writer.stale_reads == [], writer.stale_reads[:5]
    for phase in ("start", "join", "leave", "kill", "after"):
        assert writer.ops_by_phase.get(phase, 0) > 20, (
            f"too few operations completed during {phase}: {writer.ops_by_phase}"
        )

    # Every acknowledged write, with its last acknowledged value, from both survivors.
    assert len(writer.acked) == KEYS
    for name in survivors:
        with GridClient([grid.urls[name]], route=False) as reader:
            lost = {k: v for k, v in writer.acked.items() if reader.get(k) != v}
        assert not lost, f"{len(lost)} acknowledged writes not read back through {name}, e.g. {list(lost.items())[:3]}"
    client.close()

    # Segment scans (each segment from a member that reads it) return exactly what was acknowledged.
    expected = {**writer.acked, **bwriter.acked}
    assert len(expected) == KEYS + BATCH_KEYS
    with GridClient([grid.urls[n] for n in survivors]) as scanner:
        scanned = scan_all(scanner, 256)
        assert scanned == expected, (
            f"scan: {len(set(expected) - set(scanned))} keys missing, {len(set(scanned) - set(expected))} extra, "
            f"{sum(1 for k in expected if k in scanned and scanned[k] != expected[k])} with another value"
        )

    # A degraded partition: one of the last two owners crashes, so every segment misses an owner.
    grid.procs["m2"].kill()

    def refused() -> bool:
        return http("PUT", grid.urls["m3"] + "/v1/kv/key-1", b"x", timeout=40)[0] == 503

    wait_until("the survivor to refuse writes", refused, 60, members)
    code, body = http_json("PUT", grid.urls["m3"] + "/v1/kv/key-1", b"x")
    assert code == 503 and "unavailable" in body["reason"], body
    code, body = http_json("GET", grid.urls["m3"] + "/readyz")
    assert code == 503 and any("degraded" in r for r in body["reasons"]), body
    # In a batch, the refusal is per operation; the client gives up on those keys and names them.
    with GridClient([grid.urls["m3"]], retries=1, backoff=0.01, route=False) as c, pytest.raises(GridBatchError) as err:
        c.put_many({b"key-1": b"x", b"key-2": b"y"})
    assert set(err.value.failed) == {b"key-1", b"key-2"} and err.value.completed == 0
    assert all("unavailable" in why for why in err.value.failed.values()), err.value.failed


def _metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"metric {name} missing from /metrics")


@pytest.fixture(scope="module")
def one_member(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One grid member shared by the request tests (each would otherwise pay for a start)."""
    group = Members(tmp_path_factory.mktemp("grid-one"))
    try:
        grid = Grid(group, 1)
        grid.start(0)
        wait_until("a one-member grid", lambda: grid.settled(["m0"]), 60, group)
        yield grid.urls["m0"]
    finally:
        group.kill_all()


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "message"),
    [
        ("PUT", "/v1/kv/k", None, 400, "missing body"),
        ("PUT", "/v1/kv/k", b"", 400, "missing body"),
        ("GET", "/v1/kv/", None, 400, "missing key"),
        ("GET", "/v1/kv", None, 400, "missing key"),
        ("GET", "/v1/kv/a%01b", None, 400, "control characters"),
        ("GET", "/v1/kv/" + "k" * 5000, None, 400, "exceed the limit"),
        ("PUT", "/v1/kv/big", b"x" * (4 * 1024 * 1024 + 1), 413, "exceed the limit"),
        ("POST", "/v1/kv/k", b"v", 405, "not allowed"),
        ("GET", "/v1/nothing", None, 404, "no such endpoint"),
        ("GET", "/v1/kv/absent", None, 404, "key not found"),
    ],
)
def test_bad_requests_get_clear_json_errors(
    one_member: str, method: str, path: str, body: bytes | None, status: int, message: str
) -> None:
    code, data = http(method, one_member + path, body)
    assert code == status, data
    assert message in json.loads(data)["error"]


def test_client_round_trip_and_errors(one_member: str) -> None:
    with GridClient([one_member]) as c:
        assert c.get(b"nope") is None
        c.put(b"a/b c", b"\x00\xffbinary")
        assert c.get(b"a/b c") == b"\x00\xffbinary"
        c.delete(b"a/b c")
        assert c.get(b"a/b c") is None
        with pytest.raises(GridRequestError) as err:
            c.put(b"k", b"")
        assert err.value.status == 400 and "missing body" in err.value.message
        assert c.stats["retries"] == 0
    # Nobody listening: the client gives up with GridUnavailableError after its retries.
    dead = f"127.0.0.1:{free_port(['127.0.0.1'], 'tcp')}"
    with GridClient([dead], retries=2, backoff=0.01, route=False) as c, pytest.raises(GridUnavailableError):
        c.get(b"k")


def test_async_client_round_trip(one_member: str) -> None:
    async def main() -> None:
        async with AsyncGridClient([one_member]) as c:
            await asyncio.gather(*(c.put(f"k{i}".encode(), f"v{i}".encode()) for i in range(50)))
            values = await asyncio.gather(*(c.get(f"k{i}".encode()) for i in range(50)))
            assert values == [f"v{i}".encode() for i in range(50)]
            await c.delete(b"k0")
            assert await c.get(b"k0") is None
            with pytest.raises(GridRequestError) as err:
                await c.get(b"a\x01")
            assert err.value.status == 400

    asyncio.run(main())


def _mp(doc: object) -> bytes:
    return msgpack.packb(doc, use_bin_type=True)  # type: ignore[no-any-return]


MP = {"Content-Type": "application/msgpack"}
JS = {"Content-Type": "application/json"}


@pytest.mark.parametrize(
    ("headers", "body", "status", "message"),
    [
        ({"Content-Type": "text/plain"}, b"x", 415, "not supported"),
        ({}, b"x", 415, "not supported"),
        (MP, b"", 400, "missing body"),
        (MP, b"\xc1\xc1", 400, "not valid msgpack"),
        (JS, b"{nope", 400, "not valid JSON"),
        (MP, _mp([1, 2]), 400, "expected a map"),
        (MP, _mp({"ops": [], "x": 1}), 400, "unknown field(s) x"),
        (MP, _mp({"ops": []}), 400, "ops: empty"),
        (MP, _mp({"ops": "get"}), 400, "ops: expected a list"),
        (MP, _mp({"ops": [["pt", b"k", b"v"]]}), 400, "ops[0][0]: unknown op 'pt'"),
        (MP, _mp({"ops": [["get", b"k"], ["put", b"k"]]}), 400, "ops[1]: put needs a value"),
        (MP, _mp({"ops": [["get", b"k", b"v"]]}), 400, "get takes no value"),
        (MP, _mp({"ops": [["get", "k"]]}), 400, "ops[0][1] (key): expected bytes"),
        (MP, _mp({"ops": [["get", b""]]}), 400, "ops[0][1] (key): 0 bytes is outside"),
        (MP, _mp({"ops": [["get", b"k" * 70_000]]}), 400, "70000 bytes is outside"),
        (MP, _mp({"ops": [["put", b"k", b"v" * (4 * 1024 * 1024 + 1)]]}), 400, "exceed the limit"),
        (MP, _mp({"ops": [["get", b"k"]] * 10_001}), 400, "10001 operations exceed the limit of 10000"),
        (JS, json.dumps({"ops": [["get", "not base64!"]]}).encode(), 400, "not valid base64"),
        (MP, b"\x00" * (32 * 1024 * 1024 + 2048), 413, "exceed the limit of 33554432"),
    ],
)
def test_bad_batches_get_clear_json_errors(
    one_member: str, headers: dict[str, str], body: bytes, status: int, message: str
) -> None:
    code, data = http("POST", one_member + "/v1/batch", body, headers=headers, timeout=30)
    assert code == status, data
    assert message in json.loads(data)["error"]


@pytest.mark.parametrize(
    ("path", "status", "message"),
    [
        ("/v1/segments/x", 400, "expected a segment number"),
        ("/v1/segments/-1", 400, "expected a segment number"),
        ("/v1/segments/256", 400, "outside [0, 255]"),
        ("/v1/segments/0?limit=0", 400, "limit: expected 1 to 10000"),
        ("/v1/segments/0?limit=10001", 400, "limit: expected 1 to 10000"),
        ("/v1/segments/0?after=%21%21", 400, "not a cursor"),
        ("/v1/segments/0?page=2", 400, "unknown query parameter(s) page"),
        ("/v1/segments/", 404, "no such endpoint"),
    ],
)
def test_bad_segment_scans_get_clear_json_errors(one_member: str, path: str, status: int, message: str) -> None:
    code, data = http("GET", one_member + path)
    assert code == status, data
    assert message in json.loads(data)["error"]


def test_batch_json_round_trip_and_segment_pages(one_member: str) -> None:
    def b64(b: bytes) -> str:
        return base64.b64encode(b).decode()

    ops = [["put", b64(b"j1"), b64(b"\x00one")], ["put", b64(b"j2"), b64(b"")], ["get", b64(b"j1")]]
    code, body = http_json_h("POST", one_member + "/v1/batch", json.dumps({"ops": ops}).encode(), JS)
    assert code == 200, body
    # A get carries the version of its value (this member owns every segment).
    assert type(body["results"][2].pop("version")) is int
    assert body["results"] == [{"status": 200}, {"status": 200}, {"status": 200, "value": b64(b"\x00one")}]
    assert body["topology_id"] >= 1
    ops = [["get", b64(b"j2")], ["delete", b64(b"j1")], ["get", b64(b"j1")], ["get", b64(b"never")]]
    code, body = http_json_h("POST", one_member + "/v1/batch", json.dumps({"ops": ops}).encode(), JS)
    assert type(body["results"][0].pop("version")) is int
    assert body["results"] == [{"status": 200, "value": ""}, {"status": 200}, {"status": 404}, {"status": 404}]

    # msgpack answers in msgpack, with raw bytes.
    code, raw = http(
        "POST", one_member + "/v1/batch", _mp({"ops": [["get", b"j2"], ["put", b"m\xff", b"\xfe"]]}), headers=MP
    )
    assert code == 200
    results = msgpack.unpackb(raw)["results"]
    assert type(results[0].pop("version")) is int
    assert results == [{"status": 200, "value": b""}, {"status": 200}]

    # Pages of one segment: every key once, in key order, the cursor from one page opening the next.
    with GridClient([one_member]) as c:
        keys = [f"page-{i:04d}".encode() for i in range(3000)]
        c.put_many({k: k[::-1] for k in keys})
        seg = c.status()["routing"]
        from groupcluster.grid.consistent_hash import segment_of

        target = segment_of(keys[0], seg["num_segments"])
        mine = sorted(k for k in keys if segment_of(k, seg["num_segments"]) == target)
        code, page = http_json_h("GET", one_member + f"/v1/segments/{target}?limit=5", None, {})
        assert code == 200 and page["segment"] == target and page["next"] is not None
        first = [base64.b64decode(e[0]) for e in page["entries"]]
        # Other tests share this member: compare against everything the segment holds.
        everything = [k for k, _ in c.scan_segment(target, page_size=3)]
        assert everything == sorted(set(everything)), "pages out of key order or a key twice"
        assert first == everything[:5]
        assert [k for k in everything if k.startswith(b"page-")] == mine
        assert all(v == k[::-1] for k, v in c.scan_segment(target, page_size=1000) if k.startswith(b"page-"))


def test_client_batches_round_trip(one_member: str) -> None:
    items = {f"bk{i}".encode(): f"bv{i}".encode() * 3 for i in range(2500)}
    with GridClient([one_member], batch_size=300, parallel=3) as c:
        c.put_many(items)
        c.put_many([(b"dup", b"first"), (b"dup", b"last")])  # the last value of a repeated key wins
        got = c.get_many([*items, b"dup", b"absent-key"])
        assert got == {**items, b"dup": b"last", b"absent-key": None}
        c.delete_many(list(items)[:1000])
        got = c.get_many(items)
        assert sum(v is None for v in got.values()) == 1000
        assert all(got[k] == items[k] for k in list(items)[1000:])
        assert c.stats["retries"] == 0
        assert c.get_many([]) == {}
        with pytest.raises(TypeError):
            c.put_many({b"k": "text"})  # type: ignore[dict-item]
        with pytest.raises(ValueError, match="outside"):
            c.get_many([b""])

    # Without routing, batches are still cut to batch_size (the server takes at most 10,000 per request).
    with GridClient([one_member], route=False, batch_size=100) as c:
        c.put_many({f"nr{i}".encode(): b"x" for i in range(250)})
        assert c.stats["requests"] == 3
        assert set(c.get_many([f"nr{i}".encode() for i in range(250)]).values()) == {b"x"}

    async def main() -> None:
        async with AsyncGridClient([one_member], batch_size=500) as ac:
            await ac.put_many({k: v + b"!" for k, v in items.items()})
            got = await ac.get_many(items)
            assert got == {k: v + b"!" for k, v in items.items()}
            await ac.delete_many(items)
            assert set((await ac.get_many(items)).values()) == {None}
            seen = [k async for k, _ in ac.scan_segment(0)]
            assert seen == sorted(seen)

    asyncio.run(main())


def http_json_h(method: str, url: str, body: bytes | None, headers: dict[str, str]) -> tuple[int, Any]:
    code, data = http(method, url, body, headers=headers)
    return code, json.loads(data)


@pytest.mark.parametrize(
    ("path", "status", "message"),
    [
        ("/v1/changes/x", 400, "expected a segment number"),
        ("/v1/changes/256", 400, "outside [0, 255]"),
        ("/v1/changes/0?after=-1", 400, "after: expected a version"),
        ("/v1/changes/0?after=abc", 400, "after: expected a version"),
        ("/v1/changes/0?limit=0", 400, "limit: expected 1 to 10000"),
        ("/v1/changes/0?since=3", 400, "unknown query parameter(s) since"),
    ],
)
def test_bad_change_feed_requests_get_clear_json_errors(one_member: str, path: str, status: int, message: str) -> None:
    code, data = http("GET", one_member + path)
    assert code == status, data
    assert message in json.loads(data)["error"]


def _same_segment_keys(prefix: str, n: int, num_segments: int) -> tuple[int, list[bytes]]:
    from groupcluster.grid.consistent_hash import segment_of

    first = f"{prefix}-0".encode()
    seg = segment_of(first, num_segments)
    keys = [first]
    i = 1
    while len(keys) < n:
        k = f"{prefix}-{i}".encode()
        if segment_of(k, num_segments) == seg:
            keys.append(k)
        i += 1
    return seg, keys


def test_change_feed_gives_every_put_overwrite_and_delete_in_version_order(one_member: str) -> None:
    with GridClient([one_member]) as c:
        seg, (a, b) = _same_segment_keys("feed", 2, c.status()["routing"]["num_segments"])
        # Where the feed stands now (other tests share this member and may have written to the segment).
        after = 0
        while True:
            page = c.changes(seg, after)
            assert page["covered"], page
            after = page["upto"]
            if not page["more"]:
                break
        c.put(a, b"1")
        c.put(a, b"2")
        c.delete(a)
        c.put(b, b"x")
        c.put(a, b"3")
        got: list[list[Any]] = []
        cursor = after

        def caught_up() -> bool:
            nonlocal cursor
            page = c.changes(seg, cursor, limit=2)  # small pages: the cursor carries over between them
            assert page["covered"] and page["upto"] >= cursor
            got.extend(page["entries"])
            cursor = page["upto"]
            return len(got) >= 5

        deadline = time.monotonic() + 20
        while not caught_up():
            assert time.monotonic() < deadline, f"the feed showed only {got} after 20 s"
            time.sleep(0.05)
        assert [(k, v) for _, k, v in got] == [(a, b"1"), (a, b"2"), (a, None), (b, b"x"), (a, b"3")]
        versions = [ver for ver, _, _ in got]
        assert versions == sorted(versions) and len(set(versions)) == 5 and versions[0] > after
        # Nothing more, and the same range read again gives the same entries (a restarted reader).
        assert c.changes(seg, cursor)["entries"] == []
        again = c.changes(seg, after)["entries"]
        assert [tuple(e) for e in again] == [tuple(e) for e in got]

        # Batch gets and scans carry the version the feed shows for the value.
        assert c.get_many_versions([a, b, b"feed-absent"]) == {
            a: (b"3", versions[4]),
            b: (b"x", versions[3]),
            b"feed-absent": (None, None),
        }
        scanned = {k: ver for k, _, ver in c.scan_segment_versions(seg)}
        assert scanned[a] == versions[4] and scanned[b] == versions[3]

    # JSON: keys and values in base64, a delete as null.
    code, body = http_json("GET", one_member + f"/v1/changes/{seg}?after={after}")
    assert code == 200 and body["covered"] is True and body["segment"] == seg
    b64 = [base64.b64encode(b"1").decode(), base64.b64encode(b"2").decode(), None]
    assert [e[2] for e in body["entries"]][:3] == b64
    assert body["entries"][0][1] == base64.b64encode(a).decode()


def test_change_feed_across_a_join_misses_no_write_and_repeats_none(members: Members) -> None:
    """A writer overwrites and deletes keys one operation at a time while a second member joins (segments
    move, primaries change, writes are re-driven with their old versions); a follower reads the change feed
    of the keys' segments meanwhile, from each of a segment's read owners in turn (one cursor: versions are
    comparable across owners and primaries). Per key, what the feed gave after the last point where a log
    did not reach back to the cursor (a new owner's floor) must be exactly the tail of the writer's
    acknowledged operations: none missing (a re-driven write overtaken by the cursor would be), none twice,
    in order."""
    from groupcluster.grid.consistent_hash import segment_of

    grid = Grid(members, 2)
    grid.start(0)
    wait_until("a one-member grid", lambda: grid.settled(["m0"]), 60, members)
    keys = [f"fj-{i}".encode() for i in range(60)]
    client = GridClient([grid.urls["m0"]], timeout=60.0, retries=40)
    n_seg = client.status()["routing"]["num_segments"]
    segments = sorted({segment_of(k, n_seg) for k in keys})
    acked: dict[bytes, list[bytes | None]] = {k: [] for k in keys}
    stop = threading.Event()
    failures: list[str] = []

    def write() -> None:
        i = 0
        while not stop.is_set():
            k = keys[i % len(keys)]
            try:
                if i % 7 == 3:
                    client.delete(k)
                    acked[k].append(None)
                else:
                    v = f"v{i}".encode()
                    client.put(k, v)
                    acked[k].append(v)
            except Exception as exc:  # any failure is a test failure; the writer's retries cover topology changes
                failures.append(f"{k!r}: {exc}")
            i += 1

    cursor = dict.fromkeys(segments, 0)
    fed: dict[bytes, list[tuple[int, bytes | None]]] = {k: [] for k in keys}
    restarts: dict[int, int] = {}  # segment -> the floor the follower last jumped to
    served: Counter[str] = Counter()
    rounds = iter(range(1_000_000))

    def follow_once() -> None:
        turn = next(rounds)
        st = grid.status("m0") or grid.status("m1")
        assert st is not None
        routing = st["routing"]
        for seg in segments:
            urls = [routing["members"][i] for i in routing["owners"][seg] if routing["members"][i]]
            if not urls:
                continue
            url = urls[turn % len(urls)]
            path = f"/v1/changes/{seg}?after={cursor[seg]}"
            code, raw = http("GET", url + path, headers={"Accept": "application/msgpack"})
            if code in (409, 503):
                continue  # routing moved on between our status read and this request; next round
            assert code == 200, raw
            page = msgpack.unpackb(raw)
            served[url] += 1
            if not page["covered"]:
                # A log that begins after our cursor (a new owner): history before its floor is not in it.
                restarts[seg] = page["floor"]
                for k in keys:
                    if segment_of(k, n_seg) == seg:
                        fed[k] = []
                cursor[seg] = page["floor"]
                continue
            for ver, k, v in page["entries"]:
                if k in fed:
                    fed[k].append((ver, v))
            assert page["upto"] >= cursor[seg]
            cursor[seg] = page["upto"]

    thread = threading.Thread(target=write, daemon=True)
    thread.start()
    try:
        for _ in range(5):
            follow_once()
        grid.start(1)
        deadline = time.monotonic() + 90
        while not grid.settled(["m0", "m1"]):
            assert time.monotonic() < deadline, f"no settled 2-member grid\n{members.describe()}"
            follow_once()
        for _ in range(5):
            follow_once()
    finally:
        stop.set()
        thread.join(30)
    for _ in range(4):
        follow_once()
        time.sleep(0.3)

    assert not failures, failures[:5]
    assert len(served) == 2 and min(served.values()) > len(segments), f"not read from both owners: {served}"
    for k in keys:
        versions = [ver for ver, _ in fed[k]]
        assert versions == sorted(set(versions)), f"{k!r}: feed out of order or repeated: {versions}"
        values = [v for _, v in fed[k]]
        ops = acked[k]
        assert values, f"{k!r}: nothing in the feed after its segment's last restart"
        assert ops[len(ops) - len(values) :] == values, (
            f"{k!r}: the feed is not the tail of the acknowledged writes (a write missed or repeated):\n"
            f"feed {values[-8:]}\nacked {ops[-8:]}"
        )
    client.close()


# ==== client deadlines (docs/grid.md, "Client deadlines") ==================================================
@pytest.mark.parametrize("value", ["soon", "", "nan", "inf", "-5", "0", "1e400"])
def test_a_malformed_deadline_header_is_a_400_naming_it(one_member: str, value: str) -> None:
    code, data = http("PUT", one_member + "/v1/kv/dl-bad", b"v", headers={"X-Grid-Deadline": value})
    assert code == 400, data
    assert "X-Grid-Deadline: expected a Unix time in seconds" in json.loads(data)["error"]
    assert http("GET", one_member + "/v1/kv/dl-bad")[0] == 404  # nothing was written


def test_a_request_read_after_its_deadline_is_refused_and_runs_nothing(one_member: str) -> None:
    status, body = http("PUT", one_member + "/v1/kv/dl-key", b"before")
    assert status == 200, body
    past = {"X-Grid-Deadline": f"{time.time() - 0.5:.3f}"}
    batch = _mp({"ops": [["put", b"dl-key", b"late"]]})
    for method, path, data, headers in [
        ("PUT", "/v1/kv/dl-key", b"late", past),
        ("DELETE", "/v1/kv/dl-key", None, past),
        ("POST", "/v1/batch", batch, {**past, "Content-Type": "application/msgpack"}),
    ]:
        code, answer = http(method, one_member + path, data, headers=headers)
        doc = json.loads(answer)
        assert code == 504 and doc["reason"] == "deadline", doc
        assert "deadline passed" in doc["error"] and "nothing was done" in doc["error"]
    assert http("GET", one_member + "/v1/kv/dl-key")[1] == b"before"
    # A deadline ahead: served as usual.
    ahead = {"X-Grid-Deadline": f"{time.time() + 30:.3f}"}
    assert http("PUT", one_member + "/v1/kv/dl-key", b"after", headers=ahead)[0] == 200
    assert http("GET", one_member + "/v1/kv/dl-key", headers=ahead)[1] == b"after"
    metrics = http("GET", one_member + "/metrics")[1].decode()
    assert _metric(metrics, 'groupcluster_http_requests_total{kind="deadline_expired"}') >= 3


def test_the_clients_send_a_deadline_with_every_request(one_member: str) -> None:
    # A deadline a microsecond after the attempt starts has passed when the member reads it: every attempt is
    # refused, which only happens if the header was sent.
    late = GridClient([one_member], request_timeout=1.0, clock_skew=1.0 - 1e-6, retries=1, backoff=0.01)
    with late as c, pytest.raises(GridUnavailableError, match="deadline passed"):
        c.put(b"dl-client", b"v")

    async def main() -> None:
        async with AsyncGridClient([one_member], request_timeout=1.0, clock_skew=1.0 - 1e-6, retries=1) as c:
            with pytest.raises(GridUnavailableError, match="deadline passed"):
                await c.get(b"dl-client")

    asyncio.run(main())
    assert http("GET", one_member + "/v1/kv/dl-client")[0] == 404
    # The member reports its clock; on one machine it agrees with the client's, so nothing is flagged.
    with GridClient([one_member]) as c:
        before = time.time()
        clock = c.status()["clock"]
        assert before - 1 < clock < time.time() + 1
        assert "clock_skew_exceeded" not in c.stats
    with pytest.raises(ValueError, match="clock_skew: expected 0 to below request_timeout"):
        GridClient([one_member], request_timeout=1.0, clock_skew=1.0)


def _raw_put(url: str, key: str, value: bytes, headers: dict[str, str]) -> socket.socket:
    """Send a PUT on a fresh connection and return the socket unread: its client has stopped waiting."""
    u = urllib.parse.urlsplit(url)
    sock = socket.create_connection((u.hostname, u.port), timeout=5.0)
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    sock.sendall(
        f"PUT /v1/kv/{key} HTTP/1.1\r\nHost: {u.netloc}\r\nContent-Length: {len(value)}\r\n{head}\r\n".encode() + value
    )
    return sock


def test_a_write_read_by_a_paused_member_after_its_deadline_cannot_land_over_a_later_one(members: Members) -> None:
    """The hazard the deadline closes: a PUT waits in the socket of a paused member (SIGSTOP) while its client
    gives up and writes a newer value through another member. When the member resumes it reads the PUT. Without
    a deadline the old PUT lands over the newer value (the control key shows the hazard is real here); with one
    the member refuses it (504) and the newer value stays, on every member."""
    from groupcluster.grid.consistent_hash import segment_of

    grid = Grid(members, 3)
    names = ["m0", "m1", "m2"]
    for i in range(3):
        grid.start(i)
    wait_until("3 members settled", lambda: grid.settled(names), 90, members)
    paused = grid.procs["m2"]
    purl = grid.urls["m2"]
    n_seg = int(grid.status("m2")["routing"]["num_segments"])  # type: ignore[index]
    # Keys m2 does not own (it answers 409 for their segment's scan), so writes through the others never wait
    # for m2 while it is paused: it stays in the view (the pause is well under the failure detector's timeout).
    keys = [
        k
        for k in (f"dl-{i}" for i in range(200))
        if http("GET", f"{purl}/v1/segments/{segment_of(k.encode(), n_seg)}?limit=1")[0] == 409
    ][:2]
    assert len(keys) == 2
    guarded, control = keys
    others = [grid.urls["m0"], grid.urls["m1"]]
    socks: list[socket.socket] = []
    with GridClient(others) as c:
        for k in keys:
            c.put(k.encode(), b"first")
        paused.popen.send_signal(signal.SIGSTOP)
        try:
            socks.append(_raw_put(purl, guarded, b"stale", {"X-Grid-Deadline": f"{time.time() + 0.3:.3f}"}))
            socks.append(_raw_put(purl, control, b"stale", {}))
            time.sleep(0.5)  # both clients gave up; the deadline passed
            for k in keys:
                c.put(k.encode(), b"newer")  # acknowledged while m2 is paused
        finally:
            paused.popen.send_signal(signal.SIGCONT)
        try:
            answers = []
            for s in socks:
                s.settimeout(20.0)
                answers.append(s.recv(65536).decode(errors="replace"))
        finally:
            for s in socks:
                s.close()
        assert answers[0].startswith("HTTP/1.1 504") and '"reason": "deadline"' in answers[0], answers[0]
        assert answers[1].startswith("HTTP/1.1 200"), answers[1]
        # The control PUT (no deadline) ran on resume and overwrote the acknowledged newer value.
        assert c.get(control.encode()) == b"stale"
    for url in grid.urls.values():
        with GridClient([url], route=False) as one:
            assert one.get(guarded.encode()) == b"newer", url
    metrics = http("GET", purl + "/metrics")[1].decode()
    assert _metric(metrics, 'groupcluster_http_requests_total{kind="deadline_expired"}') == 1
    # The members compared their clocks through their member info: one machine, one clock (a delivery delay,
    # such as the pause's, only makes a peer look behind, which is not reported).
    for url in grid.urls.values():
        ahead = _metric(http("GET", url + "/metrics")[1].decode(), "groupcluster_grid_peer_clock_ahead_seconds")
        assert 0.0 <= ahead < 0.5, (url, ahead)


def _held(url: str, segment: int) -> dict[bytes, bytes] | None:
    """The entries of ``segment`` in this member's own copy (None: it holds no copy, a 409)."""
    code, body = http("GET", f"{url}/v1/segments/{segment}?limit=1000")
    if code == 409:
        return None
    assert code == 200, (url, segment, code, body)
    return {base64.b64decode(e[0]): base64.b64decode(e[1]) for e in json.loads(body)["entries"]}


def test_entries_expire_on_every_copy_across_a_join_and_a_crashed_primary(members: Members) -> None:
    """PUT with a lifespan: the entry is there until its lifespan ends, then gone from every copy, including
    those a joiner received by state transfer and those whose primary was SIGKILLed before the end (a former
    backup, now primary, removes them). A key written again without a lifespan, and a plain key, stay."""
    from groupcluster.grid.consistent_hash import segment_of

    grid = Grid(members, 4)
    names = ["m0", "m1", "m2"]
    for i in range(3):
        grid.start(i)
    wait_until("3 members settled", lambda: grid.settled(names), 90, members)
    lifespan = 6.0
    expiring = [f"ttl-{i}".encode() for i in range(40)]
    with GridClient([grid.urls[n] for n in names]) as c:
        start = time.time()
        c.put(expiring[0], b"one", lifespan=lifespan)
        c.put_many({k: b"many" for k in expiring[1:]}, lifespan=lifespan)
        c.put(b"kept", b"first", lifespan=lifespan)
        c.put(b"kept", b"again")  # written again without a lifespan: never expires
        c.put(b"plain", b"x")
        assert c.get(expiring[0]) == b"one" and all(c.get(k) == b"many" for k in expiring[1:])
    # A 4th member joins: it receives its segments, expiries included, by state transfer.
    grid.start(3)
    names.append("m3")
    wait_until("4 members settled", lambda: grid.settled(names), 90, members)
    # Kill the primary of the first expiring key, before the lifespan ends: its former backup removes it.
    routing = grid.status("m0")["routing"]  # type: ignore[index]
    n_seg = int(routing["num_segments"])
    victim_url = routing["members"][routing["write"][segment_of(expiring[0], n_seg)]]
    victim = next(n for n, u in grid.urls.items() if u == victim_url)
    assert time.time() - start < lifespan - 1.0, "the set-up took too long to test expiry before the end"
    grid.procs[victim].popen.kill()
    names.remove(victim)
    wait_until("3 members settled", lambda: grid.settled(names), 90, members)
    urls = [grid.urls[n] for n in names]
    with GridClient(urls) as c:
        if time.time() - start < lifespan - 0.5:
            assert c.get(expiring[0]) == b"one"  # not before its lifespan ends
        wait_until("every expiring key gone", lambda: all(c.get(k) is None for k in expiring), lifespan + 30, members)
        assert time.time() - start >= lifespan - 0.05  # the primary removed nothing early (one clock here)
        assert c.get(b"kept") == b"again" and c.get(b"plain") == b"x"
    # Gone from every copy, not only from what the primaries answer; the kept keys are on every copy.
    for k, present in [(k, False) for k in expiring] + [(b"kept", True), (b"plain", True)]:
        seg = segment_of(k, n_seg)
        copies = [held for url in urls if (held := _held(url, seg)) is not None]
        assert len(copies) == 2 and all((k in held) == present for held in copies), (k, copies)
    removed = [
        _metric(http("GET", u + "/metrics")[1].decode(), "groupcluster_grid_entries_expired_total") for u in urls
    ]
    assert sum(removed) >= len(expiring), removed  # each by its primary of the time
