"""Real grid members (``groupcluster member --grid --http``) on loopback, driven through the HTTP API.

The main test starts 3 members and keeps a writer running (the blocking :class:`GridClient`, one thread,
overwriting a few hundred keys round after round and reading back keys it wrote) while

(a) a 4th member joins and receives its segments,
(b) a member leaves gracefully with ``POST /v1/leave`` (it exits only after its segments have new owners),
(c) the coordinator is killed with SIGKILL (2 owners: nothing acknowledged may be lost).

Afterwards every acknowledged write must be readable with its last acknowledged value, no operation may have
failed (the client's documented retries are allowed and counted), and operations must have completed during
every phase. Finally one more member is killed, which leaves a degraded partition: the grid answers 503
with a reason. A second test sends bad requests and expects clear 4xx JSON errors.
"""

from __future__ import annotations

import asyncio
import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from groupcluster.grid.client import AsyncGridClient, GridClient, GridRequestError, GridUnavailableError

from .procs import FD_FLAGS, MemberProcess, Members, free_port, loopback_hosts, wait_until

KEYS = 300


def http(method: str, url: str, body: bytes | None = None, timeout: float = 10.0) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=body, method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def http_json(method: str, url: str, body: bytes | None = None) -> tuple[int, Any]:
    status, data = http(method, url, body)
    return status, json.loads(data)


class Grid:
    """The members of one test and the HTTP URL of each."""

    def __init__(self, members: Members, n_hosts: int) -> None:
        self.members = members
        self.hosts = loopback_hosts(n_hosts)
        self.port = free_port(self.hosts, "udp")
        self.http_port = free_port(self.hosts, "tcp")
        self.urls: dict[str, str] = {}
        self.procs: dict[str, MemberProcess] = {}

    def start(self, i: int, *extra: str) -> MemberProcess:
        host = self.hosts[i]
        everyone = ",".join(f"{h}:{self.port}" for h in self.hosts)
        name = f"m{i}"
        proc = self.members.start(
            name,
            f"{host}:{self.port}",
            "--hosts",
            everyone,
            "--grid",
            "--http",
            f"{host}:{self.http_port}",
            *FD_FLAGS,
            *extra,
            record=False,
        )
        self.procs[name] = proc
        self.urls[name] = f"http://{host}:{self.http_port}"
        return proc

    def status(self, name: str) -> dict[str, Any] | None:
        try:
            code, body = http_json("GET", self.urls[name] + "/v1/status")
        except (OSError, ValueError):
            return None
        return body if code == 200 else None

    def ready(self, name: str) -> bool:
        try:
            return http("GET", self.urls[name] + "/readyz", timeout=2.0)[0] == 200
        except OSError:
            return False

    def settled(self, names: list[str]) -> bool:
        """Every named member is ready, sees exactly these members, and they agree on a balanced topology."""
        tops = set()
        for n in names:
            st = self.status(n)
            if st is None or st["grid"] is None or not self.ready(n):
                return False
            if len(st["view"]["members"]) != len(names):
                return False
            g = st["grid"]
            if g["phase"] != "NO_REBALANCE" or g["availability"] != "AVAILABLE":
                return False
            tops.add(g["topology_id"])
        return len(tops) == 1


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


def test_writes_survive_join_graceful_leave_and_sigkill(members: Members) -> None:
    grid = Grid(members, 4)
    for i in range(3):
        grid.start(i)
    first3 = ["m0", "m1", "m2"]
    wait_until("3 members with a balanced grid", lambda: grid.settled(first3), 60, members)

    client = GridClient([grid.urls[n] for n in first3], timeout=60.0, retries=40)
    writer = Writer(client)
    thread = threading.Thread(target=writer.run, daemon=True)
    thread.start()
    try:
        wait_until("the writer to get going", lambda: writer.writes >= 200, 30, members)

        # (a) a fourth member joins while the writer runs.
        writer.phase = "join"
        grid.start(3)
        all4 = [*first3, "m3"]
        wait_until("the joiner to receive its segments", lambda: grid.settled(all4), 60, members)
        joiner = grid.status("m3")
        assert joiner is not None and joiner["grid"]["segments_owned"] > 0
        status, metrics = http("GET", grid.urls["m3"] + "/metrics")
        assert status == 200
        received = _metric(metrics.decode(), "groupcluster_grid_rebalance_entries_received_total")
        assert received > 0, "the joiner received no entries by state transfer"

        # (b) a graceful leave through the HTTP API: the member exits after handing its segments off.
        writer.phase = "leave"
        leaver = grid.procs["m1"]
        code, body = http_json("POST", grid.urls["m1"] + "/v1/leave")
        assert code == 202 and body["leaving"] is True
        wait_until("the leaver to exit", lambda: not leaver.alive(), 60, members)
        assert leaver.wait(5) == 0
        assert "grid segments handed off" in leaver.log_text()
        rest = ["m0", "m2", "m3"]
        wait_until("3 members balanced after the leave", lambda: grid.settled(rest), 60, members)

        # (c) SIGKILL of the coordinator: with 2 owners per segment nothing acknowledged is lost.
        writer.phase = "kill"
        grid.procs["m0"].kill()
        survivors = ["m2", "m3"]
        wait_until("2 members balanced after the crash", lambda: grid.settled(survivors), 60, members)
        writer.phase = "after"
        before = writer.writes
        wait_until("writes after the crash", lambda: writer.writes >= before + 100, 30, members)
    finally:
        writer.stop.set()
        thread.join(timeout=90)
    assert not thread.is_alive(), "the writer did not stop"
    print(f"writer: {writer.writes} writes acknowledged, operations by phase {writer.ops_by_phase}, {client.stats}")

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

    # A degraded partition: one of the last two owners crashes, so every segment misses an owner.
    grid.procs["m2"].kill()

    def refused() -> bool:
        return http("PUT", grid.urls["m3"] + "/v1/kv/key-1", b"x", timeout=40)[0] == 503

    wait_until("the survivor to refuse writes", refused, 60, members)
    code, body = http_json("PUT", grid.urls["m3"] + "/v1/kv/key-1", b"x")
    assert code == 503 and "unavailable" in body["reason"], body
    code, body = http_json("GET", grid.urls["m3"] + "/readyz")
    assert code == 503 and any("degraded" in r for r in body["reasons"]), body


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
