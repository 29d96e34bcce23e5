"""Graceful leaves of real grid members (``POST /v1/leave``, SIGTERM) while clients keep writing to them.

A client sends PUTs straight to the member that leaves, on a kept-alive connection, each body a moment after
its headers as a client across a network does: every PUT gets an answer promptly, either acknowledged (and
then readable from the other members) or refused with 503, reason ``leaving`` and ``Retry-After``, until the
member stops listening. Meanwhile the blocking :class:`GridClient` writes through every member: each of its puts
succeeds (it retries a 503 on another member). The member's log holds no ERROR line and no traceback, and
each leave ends within a bound set by the timeouts involved (below), leave after leave.

Before the fix, a PUT whose headers had arrived when the member closed its HTTP server lost its body (aiohttp
drops what arrives on a connection it is closing), so it got no answer until the client gave up, the member
waited for it that long before exiting (the 15.9 s leave), and then logged aiohttp's "Error handling request
... ConnectionResetError: Connection lost" with a traceback.
"""

from __future__ import annotations

import http.client
import json
import re
import threading
import time
import urllib.parse
from dataclasses import dataclass, field

from groupcluster.grid.client import GridClient, GridRequestError, GridUnavailableError

from .grids import Grid, http_json
from .procs import MemberProcess, Members, wait_until

NAMES = ["m0", "m1", "m2", "m3"]
KEYS = 200
# The raw client's socket timeout: a PUT the member never answers shows as a wait this long.
RAW_TIMEOUT = 10.0
# The pause between a raw PUT's headers and its body (a client across a network, or a larger value).
BODY_DELAY = 0.02
# An answer (or the member's refusal to connect) comes this fast, whatever the member is doing: every refusal
# is immediate and nothing it answers while leaving waits for the grid. Half of RAW_TIMEOUT, which a PUT that
# got no answer would have waited out.
PROMPT = 5.0
# --http-close-timeout given to the members: the longest the HTTP close may wait for requests in progress.
HTTP_CLOSE_TIMEOUT = 2.0
# A leave, from the request to the process's exit. Nothing in it waits on a timeout: the hand-off and the group
# leave end on messages (0.4-2 s on a loaded 2-core machine), the HTTP close on its connections closing. The
# timeouts a stuck leave would sit out are all longer than this bound: the raw client's RAW_TIMEOUT (which the
# old code waited for), the group leave's 10 s, aiohttp's 60 s shutdown grace, the 120 s hand-off bound. The
# HTTP close's own HTTP_CLOSE_TIMEOUT fits in it, with the hand-off.
LEAVE_BOUND = 8.0


@dataclass
class Outcome:
    key: str
    value: bytes
    started: float
    elapsed: float
    status: int | None = None
    reason: str | None = None
    retry_after: str | None = None
    error: str | None = None  # a connection-level failure: the exception's class


@dataclass
class RawPutter:
    """One thread: PUT fresh keys straight to one member until it refuses connections (or ``stop``)."""

    url: str
    prefix: str
    outcomes: list[Outcome] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def acknowledged(self) -> bool:
        return any(o.status == 200 for o in self.outcomes)

    def run(self) -> None:
        u = urllib.parse.urlsplit(self.url)
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=RAW_TIMEOUT)
        j = 0
        while not self.stop.is_set():
            key, value = f"{self.prefix}-{j}", f"raw-{self.prefix}-{j}".encode()
            j += 1
            started = time.monotonic()
            out = Outcome(key, value, started, 0.0)
            try:
                conn.putrequest("PUT", "/v1/kv/" + key)
                conn.putheader("Content-Length", str(len(value)))
                conn.endheaders()
                time.sleep(BODY_DELAY)
                conn.send(value)
                resp = conn.getresponse()
                body = resp.read()
                out.status = resp.status
                out.retry_after = resp.getheader("Retry-After")
                if resp.status != 200:
                    try:
                        out.reason = json.loads(body).get("reason")
                    except ValueError:
                        out.reason = body[:100].decode(errors="replace")
            except (OSError, http.client.HTTPException) as exc:
                out.error = type(exc).__name__
                conn.close()
            out.elapsed = time.monotonic() - started
            self.outcomes.append(out)
            if out.error == "ConnectionRefusedError":
                return  # the member stopped listening: it is gone


@dataclass
class Writer:
    """One thread: the blocking client overwrites KEYS keys round after round, through whichever members."""

    client: GridClient
    acked: dict[bytes, bytes] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    writes: int = 0

    def run(self) -> None:
        i = 0
        while not self.stop.is_set():
            key, value = f"w-{i % KEYS}".encode(), f"w-value-{i}".encode()
            try:
                self.client.put(key, value)
                self.acked[key] = value
                self.writes += 1
            except (GridUnavailableError, GridRequestError) as exc:
                self.failures.append(str(exc))
            i += 1


def _check_raw(putter: RawPutter, name: str) -> dict[str, bytes]:
    """Every raw PUT was answered promptly: 200, or 503 reason leaving with Retry-After; after the member's
    last answer only connection failures: it stopped listening, so connections are refused, and one the kernel
    had completed but the member not yet taken when it stopped listening is reset (nothing of it was read).
    Returns the acknowledged ones."""
    outs = putter.outcomes
    shown = [(round(o.elapsed, 3), o.status, o.reason, o.error) for o in outs]
    slow = [o for o in outs if o.elapsed > PROMPT]
    assert not slow, f"{name}: PUTs answered after more than {PROMPT}s: {[(o.key, o.elapsed, o.error) for o in slow]}"
    bad = [o for o in outs if o.status is not None and o.status != 200 and o.status != 503]
    assert not bad, f"{name}: PUTs answered neither 200 nor 503: {[(o.key, o.status, o.reason) for o in bad]}"
    refused = [o for o in outs if o.status == 503]
    assert refused, f"{name}: no PUT was refused while the member left: {shown[-20:]}"
    wrong = [o for o in refused if o.reason != "leaving" or o.retry_after is None]
    assert not wrong, f"{name}: 503s lacking reason leaving or Retry-After:{[(o.reason, o.retry_after) for o in wrong]}"
    first_failure = next((i for i, o in enumerate(outs) if o.error is not None), len(outs))
    answered_after = [o for o in outs[first_failure:] if o.error is None]
    assert not answered_after, (
        f"{name}: a connection failed while the member still answered (only its exit may end connections): "
        f"{shown[first_failure - 3 :]}"
    )
    assert outs[-1].error == "ConnectionRefusedError", f"{name}: the raw client did not see the exit: {shown[-5:]}"
    return {o.key: o.value for o in outs if o.status == 200}


def _leave_and_time(leaver: MemberProcess, how: str, url: str, members: Members) -> float:
    started = time.monotonic()
    if how == "http":
        code, body = http_json("POST", url + "/v1/leave")
        assert code == 202 and body["leaving"] is True, body
    else:
        leaver.terminate()
    wait_until(f"{leaver.name} to exit", lambda: not leaver.alive(), 120, members)
    took = time.monotonic() - started
    assert leaver.wait(5) == 0
    return took


def _phases(log: str) -> str:
    """The leaver's own account of its leave: hand-off and group leave durations."""
    return "; ".join(re.findall(r"(handed off in [0-9.]+s|left \([^)]*\) in [0-9.]+s)", log))


def _run_leaves(members: Members, rounds: list[tuple[str, str]]) -> list[tuple[str, float, str]]:
    """Four members and a writer; each round one member leaves (``http`` or ``sigterm``) while a raw client PUTs
    to it, and is started again. Checks every raw PUT, the leaver's log, and afterwards every write."""
    grid = Grid(members, 4)
    extra = ("--http-close-timeout", str(HTTP_CLOSE_TIMEOUT))
    for i in range(4):
        grid.start(i, *extra)
    wait_until("4 members with a balanced grid", lambda: grid.settled(NAMES), 90, members)
    client = GridClient([grid.urls[n] for n in NAMES], timeout=60.0, retries=40)
    writer = Writer(client)
    thread = threading.Thread(target=writer.run, daemon=True)
    thread.start()
    raw_acked: dict[str, bytes] = {}
    leaves: list[tuple[str, float, str]] = []
    try:
        wait_until("the writer to get going", lambda: writer.writes >= 100, 30, members)
        for r, (name, how) in enumerate(rounds):
            leaver = grid.procs[name]
            putter = RawPutter(grid.urls[name], f"r{r}")
            pthread = threading.Thread(target=putter.run, daemon=True)
            pthread.start()
            wait_until("raw PUTs acknowledged", putter.acknowledged, 30, members)
            took = _leave_and_time(leaver, how, grid.urls[name], members)
            pthread.join(timeout=RAW_TIMEOUT + 5)
            putter.stop.set()
            assert not pthread.is_alive(), f"{name}: the raw client is stuck"
            log = leaver.log_text()
            leaves.append((f"{name} ({how})", took, _phases(log)))
            assert "grid segments handed off" in log, log[-2000:]
            assert "Traceback" not in log and " ERROR " not in log, f"{name} logged an error:\n{log[-3000:]}"
            assert "HTTP requests still in progress" not in log, log[-2000:]
            raw_acked.update(_check_raw(putter, name))
            # Back to four members for the next round.
            i = NAMES.index(name)
            grid.start(i, *extra)
            wait_until("4 members balanced again", lambda: grid.settled(NAMES), 90, members)
    finally:
        writer.stop.set()
        thread.join(timeout=90)
    print(f"leaves (name, seconds, phases): {leaves}; writer: {writer.writes} writes, {client.stats}")
    assert not thread.is_alive(), "the writer did not stop"
    assert writer.failures == [], f"{len(writer.failures)} puts failed: {writer.failures[:3]}"
    assert client.stats["retries"] >= 1, f"the writer never had to retry elsewhere: {client.stats}"
    assert raw_acked, "no raw PUT was acknowledged"
    for name in NAMES:
        with GridClient([grid.urls[name]], route=False) as reader:
            lost = {k: v for k, v in writer.acked.items() if reader.get(k) != v}
            lost.update({k: v for k, v in raw_acked.items() if reader.get(k.encode()) != v})
        assert not lost, f"{len(lost)} acknowledged writes not read back through {name}: {list(lost.items())[:3]}"
    client.close()
    return leaves


def test_a_leaving_member_answers_every_put_and_the_client_retries_elsewhere(members: Members) -> None:
    leaves = _run_leaves(members, [("m1", "http"), ("m2", "http")])
    assert len(leaves) == 2


def test_leaves_by_request_and_by_sigterm_end_within_a_bound_set_by_the_timeouts(members: Members) -> None:
    leaves = _run_leaves(members, [("m0", "sigterm"), ("m1", "http"), ("m2", "sigterm"), ("m0", "http")])
    slow = [leave for leave in leaves if leave[1] > LEAVE_BOUND]
    assert not slow, f"leaves over {LEAVE_BOUND}s (name, seconds, phases): {slow}; all: {leaves}"
