"""Grid transactions on real member processes (``groupcluster member --grid --http``) on loopback.

* **Transfers conserve the total.** Threads move amounts between a few counters with transactions, optimistic
  and pessimistic at once (so they contend). Each transfer also writes a *marker* key of its own in the same
  transaction. Afterwards: every committed transfer's marker is there, every aborted one's is not, and each
  counter equals its start value plus the amounts of exactly the transfers whose marker is there (all or
  nothing, and no lost update), so the total holds.
* **Interrupted by a join, then by SIGKILL.** The same transfers run while a 4th member joins and while a member
  (primary of some segments, backup of others, originator of some transfers) is killed. Transfers whose commit
  got no answer are "unknown"; their marker says what happened, and the same checks hold. Transactions left
  in doubt by the killed originator are resolved by the grid itself (automatic resolution) before the checks.
* **An in-doubt transaction, deterministically.** The originator runs with the grid's fault-injection setting
  ``tx_test_hold_commit=true`` (it sends no commit after a unanimous YES): once every participant reports the
  transaction prepared (``/v1/status``), the originator is SIGKILLed. With automatic resolution (the default)
  the grid's coordinator rolls it back by itself within seconds (nobody committed it) and the keys are usable
  again. With ``tx_auto_resolve=false`` the participants list the transaction in doubt (HTTP and
  ``groupcluster tx in-doubt``), keep its keys locked (a plain write gets 409 "locked"), and
  ``groupcluster tx resolve --commit`` applies its writes everywhere.
* The HTTP surface: versions on GET, one-shot conflicts, interactive transactions (begin/lock/commit/rollback,
  unknown ids, an abandoned transaction rolled back after ``tx_timeout``), clear 4xx errors.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import threading
import time
import urllib.parse
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from groupcluster.grid.client import (
    AsyncGridClient,
    GridClient,
    GridClientError,
    GridTxAborted,
    GridTxConflict,
    GridTxUnknownOutcome,
)
from groupcluster.grid.consistent_hash import segment_of

from .grids import Grid, http
from .procs import Members, wait_until

ACCOUNTS = 8
START = 100
# Short transaction timeouts: contended transfers deadlock across members now and then (two primaries, each
# granting one of the keys); the lock timeout breaks the cycle, and a test should not wait 10 s for it.
TX_FLAGS = ("--grid-set", "tx_lock_timeout=1s", "--grid-set", "tx_timeout=3s")


def acct(i: int) -> bytes:
    return f"acct-{i}".encode()


def b64(b: bytes) -> str:
    return base64.b64encode(b).decode()


def post_json(url: str, doc: Any, timeout: float = 30.0) -> tuple[int, Any]:
    code, body = http("POST", url, json.dumps(doc).encode(), timeout, {"Content-Type": "application/json"})
    return code, json.loads(body) if body else None


def tx_url(base: str, tx: str, action: str) -> str:
    return f"{base}/v1/tx/{urllib.parse.quote(tx, safe='')}/{action}"


@dataclass
class Transfer:
    marker: bytes
    deltas: dict[bytes, int]
    mode: str
    outcome: str = ""
    phase: str = ""


@dataclass
class Bank:
    """Threads doing transfers between ACCOUNTS counters until ``stop``; every transfer is recorded."""

    urls: list[str]
    transfers: list[Transfer] = field(default_factory=list)
    phase: str = "start"
    stop: threading.Event = field(default_factory=threading.Event)
    errors: list[str] = field(default_factory=list)
    threads: list[threading.Thread] = field(default_factory=list)

    def start(self, modes: list[str]) -> None:
        for i, mode in enumerate(modes):
            t = threading.Thread(target=self._run, args=(i, mode), daemon=True)
            t.start()
            self.threads.append(t)

    def join(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=120)
            assert not t.is_alive(), "a transfer thread did not stop"

    def count(self, outcome: str, phase: str | None = None) -> int:
        return sum(1 for t in self.transfers if t.outcome == outcome and (phase is None or t.phase == phase))

    def _run(self, seed: int, mode: str) -> None:
        import random

        rng = random.Random(seed)
        with GridClient(self.urls, timeout=60.0, retries=40) as c:
            while not self.stop.is_set():
                a, b = rng.sample(range(ACCOUNTS), 2)
                amount = rng.randint(1, 9)
                t = Transfer(f"marker-{uuid.uuid4().hex}".encode(), {acct(a): -amount, acct(b): amount}, mode)
                t.phase = self.phase
                try:
                    with c.transaction(mode) as tx:
                        vals = tx.get_many([acct(a), acct(b)])
                        for k, d in t.deltas.items():
                            tx.put(k, str(int(vals[k] or b"0") + d).encode())
                        tx.put(t.marker, b"1")
                    t.outcome = "committed"
                except GridTxAborted:
                    t.outcome = "aborted"  # rolled back: nothing of it may be visible
                except GridTxUnknownOutcome:
                    t.outcome = "unknown"  # its marker tells
                except GridClientError as exc:
                    # A read failed before the commit (the grid unavailable for longer than the retries):
                    # the transaction never committed anything.
                    t.outcome = "aborted"
                    self.errors.append(f"{self.phase}: {exc}")
                self.transfers.append(t)


def verify(urls: list[str], transfers: list[Transfer]) -> None:
    """The all-or-nothing and no-lost-update checks described in the module docstring."""
    with GridClient(urls, timeout=60.0, retries=40) as c:
        markers = c.get_many([t.marker for t in transfers]) if transfers else {}
        expected = {acct(i): START for i in range(ACCOUNTS)}
        for t in transfers:
            present = markers[t.marker] == b"1"
            if t.outcome == "committed":
                assert present, f"committed transfer {t} is not visible"
            elif t.outcome == "aborted":
                assert not present, f"aborted transfer {t} is visible"
            if present:
                for k, d in t.deltas.items():
                    expected[k] += d
        got = {k: int(v or b"-1") for k, v in c.get_many(list(expected)).items()}
    assert got == expected, f"counters {got} != expected {expected}"
    assert sum(got.values()) == ACCOUNTS * START


def poll(what: str, predicate: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {timeout}s waiting for {what}"
        time.sleep(0.1)


def in_doubt(url: str) -> list[dict[str, Any]]:
    code, body = http("GET", url + "/v1/tx/in-doubt")
    assert code == 200, body
    return json.loads(body)["in_doubt"]  # type: ignore[no-any-return]


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "groupcluster.cli", "tx", *args], capture_output=True, text=True, timeout=60
    )


# ==== a shared 3-member grid for the surface tests and the contention test ====================================
@pytest.fixture(scope="module")
def three(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    group = Members(tmp_path_factory.mktemp("grid-tx"))
    try:
        grid = Grid(group, 3)
        for i in range(3):
            grid.start(i, *TX_FLAGS)
        names = ["m0", "m1", "m2"]
        wait_until("3 members with a balanced grid", lambda: grid.settled(names), 60, group)
        yield [grid.urls[n] for n in names]
    finally:
        group.kill_all()


def test_concurrent_transfers_conserve_the_total(three: list[str]) -> None:
    with GridClient(three) as c:
        c.put_many({acct(i): str(START).encode() for i in range(ACCOUNTS)})
    bank = Bank(three)
    bank.start(["optimistic", "optimistic", "pessimistic", "pessimistic"])
    deadline = time.monotonic() + 30
    # Until both modes committed a fair number (a loaded machine gets there later, not differently).
    while time.monotonic() < deadline:
        done = {
            m: sum(1 for t in bank.transfers if t.mode == m and t.outcome == "committed")
            for m in ("optimistic", "pessimistic")
        }
        if min(done.values()) >= 40:
            break
        time.sleep(0.2)
    bank.join()
    assert bank.count("unknown") == 0, "no member died: every commit must have been answered"
    for mode in ("optimistic", "pessimistic"):
        assert sum(1 for t in bank.transfers if t.mode == mode and t.outcome == "committed") >= 40, mode
    # Contention was real: some optimistic transfers failed validation (else the test proves little).
    assert bank.count("aborted") > 0
    verify(three, bank.transfers)
    # The members count what they originated: every committed transfer, and the aborts among the others.
    totals: dict[str, float] = {}
    for url in three:
        for line in http("GET", url + "/metrics")[1].decode().splitlines():
            if line.startswith("groupcluster_grid_transactions_total{"):
                outcome = line.split('"')[1]
                totals[outcome] = totals.get(outcome, 0) + float(line.split()[-1])
    assert totals["committed"] >= bank.count("committed") and totals["aborted"] > 0, totals


def test_run_transaction_reruns_on_conflict_and_async_form(three: list[str]) -> None:
    with GridClient(three) as c:
        c.put(b"counter", b"0")
        conflicts = []

        def increment(tx: Any) -> int:
            n = int(tx.get(b"counter") or b"0")
            if not conflicts:
                # Someone else writes the key after our read: our commit must fail validation, then re-run.
                with GridClient(three) as other:
                    other.put(b"counter", b"10")
                conflicts.append(1)
            tx.put(b"counter", str(n + 1).encode())
            return n + 1

        assert c.run_transaction(increment, retries=3) == 11
        assert c.get(b"counter") == b"11"
        assert c.stats.get("tx_reruns") == 1
        # A conflict is not retried silently outside run_transaction: it raises with the reason.
        with pytest.raises(GridTxConflict) as err, c.transaction() as tx:  # noqa: PT012  the commit at the block's end raises
            tx.get(b"counter")
            c.put(b"counter", b"99")
            tx.put(b"counter", b"stale")
        assert err.value.reason == "conflict" and err.value.status == 409 and err.value.tx
        assert c.get(b"counter") == b"99"
        # An exception inside the block rolls back: nothing written.
        with pytest.raises(RuntimeError), c.transaction("pessimistic") as tx:  # noqa: PT012  rolled back as the error leaves the block
            tx.put(b"counter", b"never")
            raise RuntimeError("boom")
        assert c.get(b"counter") == b"99"
        # The pessimistic locks of the rolled-back transaction are gone: a plain write goes through at once.
        c.put(b"counter", b"100")
        # A deleted key reads as absent (version 0), and that read validates (the tombstone is "absent" too).
        c.put(b"tomb", b"x")
        c.delete(b"tomb")
        with c.transaction() as tx:
            assert tx.get(b"tomb") is None
            tx.put(b"tomb", b"y")
        assert c.get(b"tomb") == b"y"
        # Reading a key absent in a transaction, then someone creating it: a conflict.
        with pytest.raises(GridTxConflict), c.transaction() as tx:  # noqa: PT012  the commit at the block's end raises
            assert tx.get(b"fresh") is None
            c.put(b"fresh", b"first")
            tx.put(b"fresh", b"second")
        assert c.get(b"fresh") == b"first"

    async def main() -> None:
        async with AsyncGridClient(three) as ac:
            async with ac.transaction("pessimistic") as tx:
                v = await tx.get(b"counter")
                await tx.put(b"counter", str(int(v or b"0") + 1).encode())
                await tx.delete(b"gone")

            async def bump(tx: Any) -> None:
                got = await tx.get_many([b"counter"])
                await tx.put(b"counter", str(int(got[b"counter"] or b"0") + 1).encode())

            await ac.run_transaction(bump)
            assert await ac.get(b"counter") == b"102"

    import asyncio

    asyncio.run(main())


def test_http_versions_one_shot_and_interactive(three: list[str]) -> None:
    url = three[0]
    assert http("PUT", url + "/v1/kv/h1", b"one")[0] == 200
    # GET carries the version (header and, for an absent key, the JSON body).
    import urllib.request

    with urllib.request.urlopen(url + "/v1/kv/h1", timeout=10) as resp:
        version = int(resp.headers["X-Grid-Version"])
    assert version > 0
    code, body = http("GET", url + "/v1/kv/h-absent")
    assert code == 404 and json.loads(body)["version"] == 0

    # One-shot, JSON: a read of the right version commits; the same read again is stale -> 409 conflict.
    doc = {"reads": {b64(b"h1"): version}, "writes": {b64(b"h1"): b64(b"two"), b64(b"h2"): None}}
    code, body = post_json(url + "/v1/tx", doc)
    assert code == 200 and body["committed"] is True and body["tx"], body
    code, body = post_json(url + "/v1/tx", doc)
    assert code == 409 and body["committed"] is False and body["reason"] == "conflict", body
    assert "changed" in body["error"]
    assert http("GET", url + "/v1/kv/h1")[1] == b"two"
    # One-shot with "lock": pessimistic, the keys locked before the commit validates the reads.
    code, body = post_json(url + "/v1/tx", {"lock": [b64(b"h1"), b64(b"h3")], "writes": {b64(b"h3"): b64(b"x")}})
    assert code == 200 and body["committed"] is True, body
    code, body = post_json(url + "/v1/tx", {"mode": "optimistic", "lock": [b64(b"h1")], "writes": {}})
    assert code == 400 and body["error"].startswith("lock: an optimistic transaction"), body

    # Interactive, pessimistic: begin, lock, a plain write of the locked key is refused (409 locked), commit.
    code, body = post_json(url + "/v1/tx/begin", {"mode": "pessimistic"})
    assert code == 200, body
    tx = body["tx"]
    code, body = post_json(tx_url(url, tx, "lock"), {"keys": [b64(b"h1")]})
    assert code == 200 and body["locked"] == 1, body
    for other in three:
        code, body = http("PUT", other + "/v1/kv/h1", b"sneaky", 30)
        assert code == 409 and json.loads(body)["reason"] == "locked", body
    code, body = post_json(tx_url(url, tx, "commit"), {"writes": {b64(b"h1"): b64(b"three")}})
    assert code == 200 and body["committed"] is True, body
    assert http("GET", three[1] + "/v1/kv/h1")[1] == b"three"
    # The transaction has ended: a second commit is 404 naming how it ended; a rollback now is refused.
    code, body = post_json(tx_url(url, tx, "commit"), {})
    assert code == 404 and "has ended (committed)" in body["error"], body
    code, body = post_json(tx_url(url, tx, "rollback"), None)
    assert code == 409 and "cannot be rolled back: committed" in body["error"], body

    # It lives on the member that began it; elsewhere it is unknown.
    code, body = post_json(url + "/v1/tx/begin", {})
    assert code == 200 and body["mode"] == "optimistic" and body["timeout"] == 3.0, body  # the grid's defaults
    tx2 = body["tx"]
    code, body = post_json(tx_url(three[1], tx2, "commit"), {})
    assert code == 404 and "a transaction lives on the member that began it" in body["error"], body
    assert http("POST", tx_url(url, tx2, "rollback"))[0] == 200
    assert http("POST", tx_url(url, tx2, "rollback"))[0] == 200  # again: harmless

    # Abandoned: begun and locked, never committed -> rolled back after tx_timeout (3 s), locks released.
    code, body = post_json(url + "/v1/tx/begin", {"mode": "pessimistic"})
    tx3 = body["tx"]
    assert post_json(tx_url(url, tx3, "lock"), {"keys": [b64(b"h1")]})[0] == 200
    assert http("PUT", url + "/v1/kv/h1", b"x")[0] == 409
    poll("the abandoned transaction to roll back", lambda: http("PUT", url + "/v1/kv/h1", b"x")[0] == 200, 15)
    code, body = post_json(tx_url(url, tx3, "commit"), {})
    assert code == 404 and "without a request" in body["error"], body


@pytest.mark.parametrize(
    ("path", "body", "status", "message"),
    [
        ("/v1/tx", {"writes": []}, 400, "writes: expected a map"),
        ("/v1/tx", {}, 400, "empty transaction"),
        ("/v1/tx", {"mode": "fast", "writes": {b64(b"k"): None}}, 400, "mode: expected"),
        ("/v1/tx", {"reads": {b64(b"k"): "1"}}, 400, "expected a version"),
        ("/v1/tx/begin", {"mode": "x"}, 400, "mode: expected"),
        ("/v1/tx/begin", {"keys": []}, 400, "unknown field(s) keys"),
        ("/v1/tx/nonsense/commit", {}, 400, "transaction id 'nonsense'"),
        ("/v1/tx/127.0.0.1:1%235/9/lock", {"keys": [b64(b"k")]}, 404, "no open transaction"),
        ("/v1/tx/127.0.0.1:1%235/9/resolve", {"commit": True}, 404, "not in doubt on this member"),
        ("/v1/tx/127.0.0.1:1%235/9/resolve", {"commit": "yes"}, 400, "commit: expected true"),
    ],
)
def test_bad_transaction_requests_name_the_field(
    three: list[str], path: str, body: Any, status: int, message: str
) -> None:
    code, doc = post_json(three[0] + path, body)
    assert code == status, doc
    assert message in doc["error"], doc


def test_http_415_and_msgpack(three: list[str]) -> None:
    import msgpack

    code, body = http("POST", three[0] + "/v1/tx", b"{}", 10, {"Content-Type": "text/plain"})
    assert code == 415 and b"not supported" in body
    raw = msgpack.packb({"writes": {b"mp": b"\x00\x01"}}, use_bin_type=True)
    code, body = http("POST", three[0] + "/v1/tx", raw, 10, {"Content-Type": "application/msgpack"})
    assert code == 200 and msgpack.unpackb(body)["committed"] is True
    assert http("GET", three[2] + "/v1/kv/mp")[1] == b"\x00\x01"


# ==== join and SIGKILL under transfers ==========================================================================
def test_transfers_across_a_join_and_a_sigkill(members: Members) -> None:
    grid = Grid(members, 4)
    for i in range(3):
        grid.start(i, *TX_FLAGS)
    first3 = ["m0", "m1", "m2"]
    wait_until("3 members with a balanced grid", lambda: grid.settled(first3), 60, members)
    urls = [grid.urls[n] for n in first3]
    with GridClient(urls) as c:
        c.put_many({acct(i): str(START).encode() for i in range(ACCOUNTS)})
    bank = Bank(urls)
    bank.start(["optimistic", "optimistic", "pessimistic"])

    def committed_in(phase: str, n: int) -> bool:
        return bank.count("committed", phase) >= n

    try:
        wait_until("transfers to get going", lambda: committed_in("start", 10), 30, members)
        bank.phase = "join"
        grid.start(3, *TX_FLAGS)
        all4 = [*first3, "m3"]
        wait_until("the join to settle", lambda: grid.settled(all4) and committed_in("join", 5), 90, members)
        bank.phase = "kill"
        grid.procs["m1"].kill()  # primary of some segments, backup of others, originator of some transfers
        survivors = ["m0", "m2", "m3"]
        wait_until("the grid to recover", lambda: grid.settled(survivors) and committed_in("kill", 5), 90, members)
        bank.phase = "after"
        wait_until("transfers after the recovery", lambda: committed_in("after", 5), 60, members)
    finally:
        bank.join()
    live = [grid.urls[n] for n in survivors]
    # Transactions the killed member originated may have been in doubt on the survivors: the grid resolves them.
    wait_until("the grid to resolve what is in doubt", lambda: all(not in_doubt(u) for u in live), 30, members)
    verify(live, bank.transfers)
    print(
        {
            p: (bank.count("committed", p), bank.count("aborted", p), bank.count("unknown", p))
            for p in ("start", "join", "kill", "after")
        }
    )


# ==== an in-doubt transaction, made deterministic by a fault hook =============================================
@dataclass
class Doubt:
    grid: Grid
    keys: list[bytes]
    survivors: list[str]
    live: list[str]  # their URLs
    killed_at: float


def _in_doubt_made(members: Members, *flags: str) -> Doubt:
    """Four members; m0 originates a transaction writing two keys it does not own, its commit never leaves it
    (``tx_test_hold_commit``, fault injection for tests only); once every participant prepared, m0 is killed."""
    grid = Grid(members, 4)
    grid.start(0, *TX_FLAGS, *flags, "--grid-set", "tx_test_hold_commit=true")
    for i in range(1, 4):
        grid.start(i, *TX_FLAGS, *flags)
    names = ["m0", "m1", "m2", "m3"]

    def routed() -> bool:
        # Settled, and m0 knows every member's HTTP URL (announced after each view change).
        st = grid.status("m0")
        return grid.settled(names) and st is not None and None not in st["routing"]["members"]

    wait_until("4 members with a balanced grid", routed, 60, members)
    st = grid.status("m0")
    assert st is not None
    routing = st["routing"]
    me = routing["addresses"].index(st["address"])
    # Two keys m0 does not own: every participant is another member, which m0's death leaves in doubt.
    keys = [
        k
        for k in (f"doubt-{i}".encode() for i in range(1000))
        if me not in routing["owners"][segment_of(k, routing["num_segments"])]
    ][:2]
    owners = {routing["members"][i] for k in keys for i in routing["owners"][segment_of(k, routing["num_segments"])]}
    with GridClient([grid.urls["m1"]]) as c:
        c.put_many({k: b"before" for k in keys})

    answer: list[Any] = []

    def commit() -> None:
        try:
            answer.append(post_json(grid.urls["m0"] + "/v1/tx", {"writes": {b64(k): b64(b"after") for k in keys}}, 60))
        except OSError as exc:
            answer.append(exc)

    thread = threading.Thread(target=commit, daemon=True)
    thread.start()

    def prepared() -> bool:
        # Every participant voted YES and waits for the decision (which m0 holds back).
        for url in owners:
            code, body = http("GET", url + "/v1/status")
            if code != 200 or json.loads(body)["grid"]["transactions"]["prepared"] != 1:
                return False
        return True

    wait_until("every participant to prepare", prepared, 30, members)
    grid.procs["m0"].kill()
    killed_at = time.monotonic()
    thread.join(timeout=60)
    assert answer and isinstance(answer[0], OSError), f"the killed originator answered {answer}"
    survivors = ["m1", "m2", "m3"]
    return Doubt(grid, keys, survivors, [grid.urls[n] for n in survivors], killed_at)


def test_in_doubt_transaction_resolved_by_the_grid_itself(members: Members) -> None:
    d = _in_doubt_made(members)
    grid, keys, live = d.grid, d.keys, d.live

    def view_without_m0() -> bool:
        st = grid.status("m1")
        return st is not None and len(st["view"]["members"]) == 3

    wait_until("the survivors' view without the originator", view_without_m0, 60, members)
    seen_at = time.monotonic()
    # Every participant had prepared and nobody committed: the coordinator rolls it back, by itself.
    wait_until("the grid to resolve it", lambda: not any(in_doubt(u) for u in live), 15, members)
    resolved_at = time.monotonic()
    print(f"view change {seen_at - d.killed_at:.1f} s after the kill, resolved {resolved_at - seen_at:.1f} s after it")
    metrics = "".join(http("GET", u + "/metrics")[1].decode() for u in live)
    assert 'name="grid.tx_auto_resolved_rollback"' in metrics, metrics[:2000]
    for u in live:
        with GridClient([u], route=False) as c:
            assert c.get_many(keys) == {k: b"before" for k in keys}, u
    # The keys are usable again: a plain write and a transaction.
    assert http("PUT", live[0] + "/v1/kv/" + keys[0].decode(), b"later", 30)[0] == 200
    code, body = post_json(live[1] + "/v1/tx", {"writes": {b64(k): b64(b"tx-after") for k in keys}})
    assert code == 200 and body["committed"] is True, body


def test_in_doubt_transaction_listed_and_resolved_by_the_operator_with_auto_resolve_off(members: Members) -> None:
    d = _in_doubt_made(members, "--grid-set", "tx_auto_resolve=false")
    grid, keys, survivors, live = d.grid, d.keys, d.survivors, d.live
    wait_until(
        "the survivors to list it in doubt",
        lambda: any(in_doubt(u) for u in live) and grid.settled(survivors),
        60,
        members,
    )
    listed = {d["tx"] for u in live for d in in_doubt(u)}
    assert len(listed) == 1, listed
    tx = listed.pop()
    holders = [u for u in live if in_doubt(u)]
    for d in in_doubt(holders[0]):
        assert {base64.b64decode(k) for k in d["keys"]} <= set(keys)
    # Its keys are not usable meanwhile: a plain write is refused, a transaction does not commit.
    code, body = http("PUT", live[0] + "/v1/kv/" + keys[0].decode(), b"meanwhile", 30)
    assert code == 409 and json.loads(body)["reason"] == "locked", body
    code, body = post_json(live[0] + "/v1/tx", {"writes": {b64(keys[0]): b64(b"meanwhile")}})
    assert code in (409, 504) and body["committed"] is False, body

    out = cli("in-doubt", "--all", "--member", live[0])
    assert out.returncode == 0 and tx in out.stdout, out.stdout + out.stderr
    print(out.stdout)
    out = cli("in-doubt", "--json", "--member", holders[0])
    assert out.returncode == 0 and json.loads(out.stdout)["in_doubt"][0]["tx"] == tx
    out = cli("resolve", "127.0.0.1:1#1/1", "--commit", "--member", live[0])
    assert out.returncode == 1 and "not in doubt" in out.stderr, out.stderr
    # The cluster-wide form: the member asks every member over the group (no member knows this one).
    out = cli("resolve", "127.0.0.1:1#1/1", "--auto", "--cluster", "--member", live[0])
    assert out.returncode == 1 and "in doubt on no member" in out.stderr, out.stderr
    out = cli("resolve", tx, "--commit", "--member", live[0])
    assert out.returncode == 0 and "committed" in out.stdout, out.stdout + out.stderr
    print(out.stdout)

    wait_until("no member to hold it in doubt", lambda: not any(in_doubt(u) for u in live), 30, members)
    for u in live:
        with GridClient([u], route=False) as c:
            assert c.get_many(keys) == {k: b"after" for k in keys}, u
    # The keys are free again.
    assert http("PUT", live[0] + "/v1/kv/" + keys[0].decode(), b"later", 30)[0] == 200


def test_tokens_guard_transactions_and_in_doubt(members: Members, tmp_path: Any) -> None:
    admin, kv = "admin-" + "a" * 24, "kv-" + "k" * 24
    (tmp_path / "admin").write_text(admin)
    (tmp_path / "kv").write_text(kv)
    grid = Grid(members, 1)
    grid.start(0, "--admin-token-file", str(tmp_path / "admin"), "--kv-token-file", str(tmp_path / "kv"))
    wait_until("a one-member grid", lambda: grid.settled(["m0"]), 60, members)
    url = grid.urls["m0"]
    body = json.dumps({"writes": {b64(b"t"): b64(b"1")}}).encode()
    json_ct = {"Content-Type": "application/json"}
    assert http("POST", url + "/v1/tx", body, headers=json_ct)[0] == 401
    assert http("POST", url + "/v1/tx", body, headers={**json_ct, "Authorization": "Bearer " + kv})[0] == 200
    # The in-doubt endpoints take the admin token, not the data token.
    assert http("GET", url + "/v1/tx/in-doubt", headers={"Authorization": "Bearer " + kv})[0] == 401
    assert http("GET", url + "/v1/tx/in-doubt", headers={"Authorization": "Bearer " + admin})[0] == 200
    resolve = url + "/v1/tx/127.0.0.1:1%231/1/resolve"
    assert http("POST", resolve, b'{"commit": true}', headers={**json_ct, "Authorization": "Bearer " + kv})[0] == 401
    out = cli("in-doubt", "--member", url)
    assert out.returncode == 1 and "give --admin-token-file" in out.stderr, out.stderr
    out = cli("in-doubt", "--member", url, "--admin-token-file", str(tmp_path / "admin"))
    assert out.returncode == 0 and "no in-doubt transactions" in out.stdout, out.stdout + out.stderr
    with GridClient([url], token=kv) as c:
        with c.transaction() as tx:
            tx.put(b"t", str(int(tx.get(b"t") or b"0") + 1).encode())
        assert c.get(b"t") == b"2"


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_transfers_through_repeated_kills_and_joins(members: Members) -> None:
    """Longer: 6 transfer threads while, three times, a random member is SIGKILLed and a new one joins."""
    import random

    rng = random.Random(7)
    grid = Grid(members, 7)
    for i in range(3):
        grid.start(i, *TX_FLAGS)
    alive = ["m0", "m1", "m2"]
    wait_until("3 members with a balanced grid", lambda: grid.settled(alive), 60, members)
    with GridClient([grid.urls[n] for n in alive]) as c:
        c.put_many({acct(i): str(START).encode() for i in range(ACCOUNTS)})
    bank = Bank([grid.urls[n] for n in alive])
    bank.start(["optimistic", "optimistic", "optimistic", "pessimistic", "pessimistic", "pessimistic"])
    try:
        for r in range(3):
            bank.phase = f"join{r}"
            name = f"m{3 + r}"
            grid.start(3 + r, *TX_FLAGS)
            alive.append(name)
            wait_until(
                f"join {r}", lambda: grid.settled(alive) and bank.count("committed", bank.phase) >= 5, 120, members
            )
            victim = rng.choice(alive)
            bank.phase = f"kill{r}"
            grid.procs[victim].kill()
            alive.remove(victim)
            wait_until(
                f"kill {r}", lambda: grid.settled(alive) and bank.count("committed", bank.phase) >= 5, 120, members
            )
    finally:
        bank.join()
    live = [grid.urls[n] for n in alive]
    doubtful = {d["tx"] for u in live for d in in_doubt(u)}
    for tx in doubtful:
        out = cli("resolve", tx, "--auto", "--member", live[0])
        assert out.returncode == 0, out.stderr
    verify(live, bank.transfers)
    print({o: bank.count(o) for o in ("committed", "aborted", "unknown")}, f"{len(doubtful)} resolved in doubt")
