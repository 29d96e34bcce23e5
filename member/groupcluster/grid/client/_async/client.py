"""Python clients of the grid's HTTP API: :class:`GridClient` (blocking) and :class:`AsyncGridClient` (asyncio).

::

    with GridClient(["127.0.0.11:8080", "127.0.0.12:8080"]) as grid:
        grid.put(b"user:1", b"Ada")
        grid.get(b"user:1")            # b"Ada"; None when the key is absent
        grid.delete(b"user:1")

    async with AsyncGridClient(["127.0.0.11:8080"]) as grid:
        await grid.put(b"k", b"v")

**Routing.** Any member serves any key (it forwards to the owners inside the group), but a request sent to
the owner saves a hop. The client reads the routing table from ``GET /v1/status`` (per segment, the member
to read from and the write primary, with their HTTP URLs), hashes the key exactly as the members do
(:func:`~.consistent_hash.segment_of`) and sends the request there; without a table (or an owner without a
known URL) it uses any member it knows.

**Retries** (the only ones; each refreshes the routing table first and prefers another member):

* the member cannot be reached or the connection breaks (refused, reset, timed out): it may have crashed
  or left; the endpoint is avoided for ``avoid_seconds``;
* ``503`` (member leaving, not joined yet, grid degraded) and ``504`` (the operation timed out inside the
  grid).

Up to ``retries`` retries with exponential backoff (``backoff`` doubling up to 1 s), within ``timeout``
seconds overall. A retried PUT or DELETE may be applied twice. That is harmless only while the first attempt's
operation is over when the retry starts, so every request carries a **deadline** (header ``X-Grid-Deadline``,
a Unix time): ``request_timeout`` less ``clock_skew`` after the attempt began. A member refuses a request it
reads after the deadline (a paused member, a long queue), and an operation it started before sends no attempt
to the key's owners after it (docs/grid.md, "Client deadlines"). The client gives up on an attempt only after
``request_timeout``, so with the members' clocks within ``clock_skew`` of the client's, the first attempt's
operation is over when the retry starts. A ``4xx`` is never retried and raises :class:`GridRequestError` with
the server's message.

**Lifespans.** ``put(key, value, lifespan=30)`` and ``put_many(items, lifespan=30)`` write entries the grid
removes once ``lifespan`` seconds have passed (above 0, at most :data:`MAX_LIFESPAN_SECONDS`, 10 years; None,
the default: never). A bad lifespan raises ValueError (TypeError for a non-number) before anything is sent; a
retry sends the same lifespan again. Named caches take it too, except invalidation caches (400).

**Batches.** ``put_many``/``get_many``/``delete_many`` split the keys by the member that owns them (write
primary, read owner), send one ``POST /v1/batch`` (msgpack) per owner and chunk of ``batch_size`` keys,
concurrently (``parallel`` requests at a time), and retry *per key*: keys whose operation came back 503/504,
or whose request failed on the connection, are routed again on a fresh routing table (a topology change
moved them) with the same backoff and bounds as single operations. Keys that still fail raise
:class:`GridBatchError`, which says which keys and why; the others are done. ``scan_segment`` pages through
one segment (``GET /v1/segments/{id}``) on a member that reads it, following the segment to its new owner
when a rebalance moves it; pages are in key order, so the cursor carries over between members.

**Versions.** ``scan_segment_versions`` yields ``(key, value, version)``; ``get_many_versions`` returns
``(value, version)`` per key, the version being the one the segment's primary stamped on that value
(``None`` when the answering member did not hold the key's segment, which happens only while the routing
table is out of date). ``changes`` reads one page of a segment's change feed (``GET /v1/changes/{id}``).

**Named caches** (docs/grid.md, "Named caches and modes"): ``grid.cache("sessions")`` gives ``get``,
``put`` and ``delete`` on a cache declared with ``--cache``, with the same retries, routed by its mode
(learnt from ``GET /v1/caches/{name}``): distributed by its own routing table, replicated reads on any
member and writes to the primary, invalidation always on one member (its copies are that member's).

**Transactions** (docs/grid-transactions.md, "Using transactions")::

    with grid.transaction() as tx:          # "optimistic" (default) or "pessimistic"
        v = tx.get(b"a"); tx.put(b"b", v); tx.delete(b"c")
    grid.run_transaction(fn, retries=5)     # fn(tx); re-run when the transaction is aborted

An optimistic transaction reads through the key/value API, recording each key's version, buffers its writes
and sends them with the versions read as one ``POST /v1/tx`` at the end (to the write primary of a written
key); a pessimistic one begins on some member (``POST /v1/tx/begin``), locks keys there as they are first
touched, and commits there. A failed commit raises :class:`GridTxConflict` (a key read changed) or
:class:`GridTxAborted` (rolled back for another ``reason``): safe to run again, which only
``run_transaction`` does; :class:`GridTxUnknownOutcome` when the commit got no answer (it may have committed:
never re-run on its own). The only retry inside a transaction: a one-shot commit refused with 503 (nothing of
it ran) goes to another member. A commit is sent on a connection that was used in the last
``IDLE_REFRESH_SECONDS`` or a fresh one, so the connection layer never sends it twice. A plain PUT/DELETE
answered 409 "locked" (a transaction holds the key) is retried like a 503.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import logging
import random
import threading
import time
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from itertools import repeat
from operator import itemgetter
from types import TracebackType
from typing import Any, TypeVar

import msgpack

from ...consistent_hash import segment_of, segments_of
from ...lifespan import MAX_LIFESPAN_SECONDS as MAX_LIFESPAN_SECONDS  # re-exported: the bound clients check
from ...lifespan import check_lifespan

log = logging.getLogger("groupcluster.grid.client")

DEFAULT_TIMEOUT = 60.0
DEFAULT_REQUEST_TIMEOUT = 35.0  # above the grid's default op_timeout (30 s): its 504 arrives first
RETRYABLE_STATUS = frozenset({502, 503, 504})
DEFAULT_BATCH_SIZE = 1000  # operations per batch request (the server takes up to 10,000)
BATCH_BYTES = 4 * 1024 * 1024  # keys and values per batch request, roughly
BATCH_KEY_LIMIT = 64 * 1024  # the grid's key limit; batch keys travel in the body, not the URL
VALUE_LIMIT = 4 * 1024 * 1024
MSGPACK = "application/msgpack"
JSON = "application/json"
VERSION_HEADER = "X-Grid-Version"
DEADLINE_HEADER = "X-Grid-Deadline"  # see the module docstring, "Retries"
DEFAULT_CLOCK_SKEW = 1.0  # seconds the members' clocks may differ from the client's (the deadline's margin)
# A commit goes on a fresh connection when the kept-alive one idled this long: the server may have closed it,
# and a commit is never re-sent on its own (see GridClient._tx_post).
IDLE_REFRESH_SECONDS = 10.0
T = TypeVar("T")
TX_MODES = ("optimistic", "pessimistic")


class GridClientError(Exception):
    """Base of the client's errors."""


class GridRequestError(GridClientError):
    """The request was refused (4xx): bad key, missing body, value too large, ... Never retried."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.message = message


class GridUnavailableError(GridClientError):
    """Every retry failed: the members were unreachable, or the grid kept refusing (503/504)."""

    def __init__(self, message: str, last_status: int | None = None) -> None:
        super().__init__(message)
        self.last_status = last_status


class GridBatchError(GridUnavailableError):
    """Some operations of a batch failed after every retry; the rest completed.

    ``failed`` maps each failed key to the last reason; ``completed`` counts the operations that succeeded.
    """

    def __init__(self, failed: dict[bytes, str], completed: int, last_status: int | None = None) -> None:
        sample = "; ".join(f"{k!r}: {v}" for k, v in list(failed.items())[:3])
        super().__init__(f"{len(failed)} of {len(failed) + completed} operations failed, e.g. {sample}", last_status)
        self.failed = failed
        self.completed = completed


def normalize_endpoint(ep: str) -> str:
    """``host:port`` or ``http://host:port`` -> ``http://host:port`` (no trailing slash)."""
    ep = ep.strip().rstrip("/")
    if not ep:
        raise ValueError("endpoint: empty")
    if "://" not in ep:
        ep = f"http://{ep}"
    parsed = urllib.parse.urlsplit(ep)
    if parsed.scheme != "http" or not parsed.hostname or parsed.port is None:
        raise ValueError(f"endpoint: expected host:port or http://host:port, got {ep!r}")
    return f"http://{parsed.hostname}:{parsed.port}"


def key_path(key: bytes) -> str:
    if type(key) is not bytes:
        raise TypeError(f"key: expected bytes, got {type(key).__name__}")
    try:
        text = key.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError("key: the HTTP API takes UTF-8 keys") from None
    return "/v1/kv/" + urllib.parse.quote(text, safe="")


@dataclass
class _Reply:
    status: int
    body: bytes
    version: int | None = None  # the X-Grid-Version header of a key/value GET


def _locked(body: bytes) -> bool:
    """A 409 answer saying a transaction holds the key (a plain write may be tried again)."""
    try:
        doc = json.loads(body)
    except ValueError:
        return False
    return isinstance(doc, dict) and doc.get("reason") == "locked"


def _version_header(text: str | None) -> int | None:
    return int(text) if text is not None and text.isdigit() else None


# One operation of a batch: ("get" | "put" | "delete", key, value or None).
_Op = tuple[str, bytes, bytes | None]


_BYTES = {bytes}


_OK_RESULT = {"status": 200}  # a batch's answer for a write that was done


def _check_key(key: Any) -> bytes:
    if type(key) is not bytes:
        raise TypeError(f"key: expected bytes, got {type(key).__name__}")
    if not 1 <= len(key) <= BATCH_KEY_LIMIT:
        raise ValueError(f"key: {len(key)} bytes is outside [1, {BATCH_KEY_LIMIT}]")
    return key


def _check_lifespan(lifespan: Any) -> float | None:
    """``lifespan`` (seconds, or None: the entry never expires) as a float once it is one the members take."""
    if lifespan is None:
        return None
    if isinstance(lifespan, bool) or not isinstance(lifespan, int | float):
        raise TypeError(f"lifespan: expected seconds (int or float) or None, got {type(lifespan).__name__}")
    return check_lifespan(lifespan)


def _with_lifespan(path: str, lifespan: float | None) -> str:
    # repr of a float reads back exactly (float() on the member): 30.0, 0.5, 1e-06.
    return path if lifespan is None else f"{path}?lifespan={urllib.parse.quote(repr(lifespan))}"


def _put_ops(items: Mapping[bytes, bytes] | Iterable[tuple[bytes, bytes]]) -> list[_Op]:
    # A dict keeps the last value of a repeated key: requests run concurrently, so two writes of one key in
    # one call would otherwise land in no defined order.
    pairs = dict(items.items() if isinstance(items, Mapping) else items)
    keys, values = list(pairs), list(pairs.values())
    # The checks below in bulk (C-level map/min/max; the Spark writer sends millions of rows through here);
    # anything off takes the loop, which names the first bad entry.
    if (
        keys
        and set(map(type, keys)) == _BYTES
        and set(map(type, values)) == _BYTES
        and min(map(len, keys)) >= 1
        and max(map(len, keys)) <= BATCH_KEY_LIMIT
        and max(map(len, values)) <= VALUE_LIMIT
    ):
        return list(zip(repeat("put"), keys, values))
    ops: list[_Op] = []
    for k, v in pairs.items():
        _check_key(k)
        if type(v) is not bytes:
            raise TypeError(f"value of {k!r}: expected bytes, got {type(v).__name__}")
        if len(v) > VALUE_LIMIT:
            raise ValueError(f"value of {k!r}: {len(v)} bytes exceed the limit of {VALUE_LIMIT}")
        ops.append(("put", k, v))
    return ops


def _key_ops(kind: str, keys: Iterable[bytes]) -> list[_Op]:
    return [(kind, _check_key(k), None) for k in dict.fromkeys(keys)]


class _BatchRun:
    """The state of one ``*_many`` call: results so far, keys still to do, keys failed for good (no I/O)."""

    def __init__(self, ops: list[_Op], timeout: float, lifespan: float | None = None) -> None:
        self.ops = ops
        # Sent with every put of the run, retries included: {"lifespan": seconds} as the op's fourth element.
        self.options = None if lifespan is None else {"lifespan": lifespan}
        self.results: list[bytes | None] = [None] * len(ops)
        self.versions: list[int | None] = [None] * len(ops)
        self.pending: list[int] = list(range(len(ops)))
        self.failed: dict[int, str] = {}
        self.retry: list[int] = []
        self.last_status: int | None = None
        self.last_error = ""
        self.deadline = time.monotonic() + timeout
        self.no_gets = all(op[0] != "get" for op in ops)

    def plan(self, router: _Router, batch_size: int, route: bool) -> list[tuple[str, list[int]]]:
        """The pending operations grouped by target member (one member for all without ``route``), cut into
        requests of ``batch_size`` operations / ~4 MiB."""
        groups: dict[str, list[int]] = {}
        ops = self.ops
        if route:
            targets = router.targets([ops[i][1] for i in self.pending], [ops[i][0] != "get" for i in self.pending])
        else:
            targets = [router.any_endpoint()] * len(self.pending)
        for i, ep in zip(self.pending, targets, strict=True):
            groups.setdefault(ep, []).append(i)
        plan: list[tuple[str, list[int]]] = []
        for ep, idxs in groups.items():
            parts = [idxs[j : j + batch_size] for j in range(0, len(idxs), batch_size)]
            if all(self._nbytes(part) <= BATCH_BYTES for part in parts):
                plan.extend((ep, part) for part in parts)  # the usual case: small entries, cut by count alone
                continue
            chunk: list[int] = []
            size = 0
            for i in idxs:
                _, key, value = self.ops[i]
                n = len(key) + (len(value) if value else 0) + 16
                if chunk and (len(chunk) >= batch_size or size + n > BATCH_BYTES):
                    plan.append((ep, chunk))
                    chunk, size = [], 0
                chunk.append(i)
                size += n
            if chunk:
                plan.append((ep, chunk))
        return plan

    def _nbytes(self, idxs: list[int]) -> int:
        """The bytes :meth:`plan` counts for these operations (key, value and 16 each)."""
        part = list(map(self.ops.__getitem__, idxs))
        keys = sum(map(len, map(itemgetter(1), part)))
        return keys + sum(map(len, filter(None, map(itemgetter(2), part)))) + 16 * len(part)

    def body(self, idxs: list[int]) -> bytes:
        ops = self.ops
        # An operation is its (kind, key, value) tuple as it is (msgpack packs a tuple as an array) for a put;
        # gets and deletes leave the value out.
        body: list[tuple[Any, ...]]
        if self.options is None:
            body = [op if op[0] == "put" else op[:2] for op in map(ops.__getitem__, idxs)]
        else:
            opts = self.options
            body = [(*op, opts) if op[0] == "put" else op[:2] for op in map(ops.__getitem__, idxs)]
        return msgpack.packb({"ops": body}, use_bin_type=True)

    def absorb(self, router: _Router, ep: str, idxs: list[int], reply: _Reply | None, error: str = "") -> None:
        """Take one request's outcome: results in, retryable keys to ``retry``; raises for a refused request."""
        if reply is None:
            router.failed(ep)
            self.retry.extend(idxs)
            self.last_error, self.last_status = f"{ep}: {error}", None
            return
        if reply.status in RETRYABLE_STATUS:
            if reply.status == 503:
                router.avoid[ep] = time.monotonic() + router.avoid_seconds
            self.retry.extend(idxs)
            self.last_error = f"{ep}: HTTP {reply.status}: {router.error_message(reply)}"
            self.last_status = reply.status
            return
        if reply.status != 200:
            raise GridRequestError(reply.status, router.error_message(reply))
        try:
            doc = msgpack.unpackb(reply.body, raw=False)
            results = doc["results"]
            if len(results) != len(idxs):
                raise ValueError(f"{len(results)} results for {len(idxs)} operations")
        except Exception as exc:
            raise GridClientError(f"{ep}: malformed batch answer: {exc}") from None
        if self.no_gets and type(results) is list and results.count(_OK_RESULT) == len(results):
            return  # every write done (the usual answer): nothing to record, results and versions stay None
        for i, res in zip(idxs, results, strict=True):
            status = res.get("status")
            if status == 200:
                self.results[i] = res.get("value")
                version = res.get("version")
                self.versions[i] = version if type(version) is int else None
            elif status == 404 and self.ops[i][0] == "get":
                self.results[i] = None
            elif status in RETRYABLE_STATUS or (status == 409 and res.get("reason") == "locked"):
                self.retry.append(i)
                self.last_error = f"{ep}: {status}: {res.get('error', '')}"
                self.last_status = status
            else:
                self.failed[i] = f"HTTP {status}: {res.get('error', '')}"

    def next_round(self) -> bool:
        """Move the keys to retry into ``pending``; False when nothing is left to do."""
        self.pending, self.retry = self.retry, []
        return bool(self.pending)

    def finish(self) -> list[bytes | None]:
        if self.pending:
            for i in self.pending:
                self.failed[i] = f"not done after the retries; last: {self.last_error}"
        if self.failed:
            failed = {self.ops[i][1]: msg for i, msg in sorted(self.failed.items())}
            raise GridBatchError(failed, len(self.ops) - len(failed), self.last_status)
        return self.results


def _changes_path(segment: int, after: int, limit: int) -> str:
    if type(segment) is not int or segment < 0:
        raise ValueError(f"segment: expected a non-negative int, got {segment!r}")
    if type(after) is not int or after < 0:
        raise ValueError(f"after: expected a version (int >= 0), got {after!r}")
    if not 1 <= limit <= 10_000:
        raise ValueError(f"limit: expected 1 to 10000, got {limit}")
    return f"/v1/changes/{segment}?after={after}&limit={limit}"


def _scan_path(segment: int, after: str | None, limit: int) -> str:
    if type(segment) is not int or segment < 0:
        raise ValueError(f"segment: expected a non-negative int, got {segment!r}")
    if not 1 <= limit <= 10_000:
        raise ValueError(f"page_size: expected 1 to 10000, got {limit}")
    query = {"limit": str(limit)}
    if after is not None:
        query["after"] = after
    return f"/v1/segments/{segment}?{urllib.parse.urlencode(query)}"


class _Router:
    """Endpoints, the routing table and the retry decisions shared by both clients (no I/O here)."""

    def __init__(self, endpoints: Iterable[str], retries: int, backoff: float, timeout: float, avoid: float) -> None:
        self.seeds = [normalize_endpoint(e) for e in endpoints]
        if not self.seeds:
            raise ValueError("endpoints: give at least one member's HTTP endpoint")
        self.known: list[str] = list(dict.fromkeys(self.seeds))
        self.retries = retries
        self.backoff = backoff
        self.timeout = timeout
        self.avoid_seconds = avoid
        self.avoid: dict[str, float] = {}
        self.table: dict[str, Any] | None = None
        self.rng = random.Random()
        self.stats = {"requests": 0, "retries": 0, "refreshes": 0, "connection_errors": 0}
        self.clock_warned: set[str] = set()

    def check_clock(self, endpoint: str, status: Any, sent: float, received: float, clock_skew: float) -> None:
        """Compare the member's clock (``clock`` in its status, read between ``sent`` and ``received`` by ours)
        with ours: deadlines hold only while the two are within ``clock_skew``. A member beyond it is counted in
        ``stats["clock_skew_exceeded"]`` and logged once."""
        clock = status.get("clock") if isinstance(status, dict) else None
        if isinstance(clock, bool) or not isinstance(clock, (int, float)):
            return  # a member without the field (older) or a malformed one: nothing to compare
        offset = clock - (sent + received) / 2
        if abs(offset) - (received - sent) / 2 <= clock_skew:
            return
        self.stats["clock_skew_exceeded"] = self.stats.get("clock_skew_exceeded", 0) + 1
        if endpoint not in self.clock_warned:
            self.clock_warned.add(endpoint)
            log.warning(
                "member %s: its clock is %.3f s %s this client's, more than clock_skew (%.3f s): the deadlines "
                "this client sends (X-Grid-Deadline) do not keep a late attempt from landing after a retry there",
                endpoint,
                abs(offset),
                "ahead of" if offset > 0 else "behind",
                clock_skew,
            )

    def usable(self) -> list[str]:
        now = time.monotonic()
        ok = [e for e in self.known if self.avoid.get(e, 0.0) <= now]
        return ok or list(self.known)

    def any_endpoint(self, exclude: str | None = None) -> str:
        cands = [e for e in self.usable() if e != exclude] or self.usable()
        return self.rng.choice(cands)

    def target(self, key: bytes, write: bool) -> str:
        t = self.table
        if t is not None:
            try:
                idx = (t["write"] if write else t["read"])[segment_of(key, t["num_segments"])]
                url = t["members"][idx] if idx >= 0 else None
            except (KeyError, IndexError, TypeError):
                url = None
            if url is not None and self.avoid.get(url, 0.0) <= time.monotonic():
                return url
        return self.any_endpoint()

    def targets(self, keys: list[bytes], writes: list[bool]) -> list[str]:
        """:meth:`target` of each key, with the segments hashed in one call and each member's ``avoid`` read
        once (the Spark writer routes millions of keys)."""
        t = self.table
        try:
            segs = segments_of(keys, t["num_segments"]) if t is not None else None
            by_kind = (t["read"], t["write"]) if t is not None else None
            members = t["members"] if t is not None else None
        except (KeyError, IndexError, TypeError):
            segs = None
        if segs is None or by_kind is None or members is None:
            return [self.target(k, w) for k, w in zip(keys, writes, strict=True)]
        now = time.monotonic()
        usable: dict[str, bool] = {}
        # The member each segment of these keys goes to, per kind (reads, writes), worked out once per call
        # rather than per key; None: no usable owner in the table, so any member.
        wanted = set(segs)
        per_seg: list[dict[int, str | None]] = []
        for table in by_kind:
            urls: dict[int, str | None] = {}
            for seg in wanted:
                try:
                    idx = table[seg]
                    url = members[idx] if idx >= 0 else None
                except (IndexError, TypeError, KeyError):
                    url = None
                if url is not None:
                    ok = usable.get(url)
                    if ok is None:
                        ok = usable[url] = self.avoid.get(url, 0.0) <= now
                    if not ok:
                        url = None
                urls[seg] = url
            per_seg.append(urls)
        if all(writes):
            out: list[str | None] = list(map(per_seg[1].__getitem__, segs))
        else:
            out = [per_seg[w][seg] for seg, w in zip(segs, writes, strict=True)]
        if None in out:
            out = [url if url is not None else self.any_endpoint() for url in out]
        return out  # type: ignore[return-value]

    def scan_target(self, segment: int) -> str:
        """The member to scan ``segment`` on: its read owner in the routing table, else any member."""
        t = self.table
        if t is not None:
            try:
                idx = t["read"][segment]
                url = t["members"][idx] if idx >= 0 else None
            except (KeyError, IndexError, TypeError):
                url = None
            if url is not None and self.avoid.get(url, 0.0) <= time.monotonic():
                return url
        return self.any_endpoint()

    def scan_outcome(self, ep: str, reply: _Reply) -> dict[str, Any] | None:
        """The decoded page, or None to retry elsewhere (not an owner any more, 503/504); raises for a 4xx."""
        if reply.status == 200:
            try:
                page = msgpack.unpackb(reply.body, raw=False)
                # A scan page has "next"; a change-feed page has "upto" instead.
                if not isinstance(page["entries"], list) or ("next" not in page and "upto" not in page):
                    raise ValueError("entries or next missing")
            except Exception as exc:
                raise GridClientError(f"{ep}: malformed segment page: {exc}") from None
            return page
        if reply.status == 409 or reply.status in RETRYABLE_STATUS:
            # 409: a rebalance moved the segment; the refresh before the retry finds its new owner.
            return None
        raise GridRequestError(reply.status, self.error_message(reply))

    def learn(self, status: dict[str, Any]) -> None:
        routing = status.get("routing")
        if not isinstance(routing, dict):
            return
        members = routing.get("members")
        if not isinstance(members, list):
            return
        urls = []
        for u in members:
            if isinstance(u, str):
                try:
                    urls.append(normalize_endpoint(u))
                except ValueError:
                    continue
        # Seeds stay known (a seed that left may come back); members that left the table are dropped.
        self.known = list(dict.fromkeys([*urls, *self.seeds]))
        if self.table is None or routing.get("topology_id", 0) >= self.table.get("topology_id", 0):
            self.table = routing

    def failed(self, endpoint: str) -> None:
        self.stats["connection_errors"] += 1
        self.avoid[endpoint] = time.monotonic() + self.avoid_seconds

    def delay(self, attempt: int) -> float:
        return min(1.0, self.backoff * (2**attempt)) * (0.5 + self.rng.random() / 2)

    @staticmethod
    def error_message(reply: _Reply) -> str:
        try:
            data = json.loads(reply.body)
            return str(data.get("error") or data)
        except (ValueError, AttributeError):
            return reply.body[:200].decode("utf-8", errors="replace") or http.client.responses.get(reply.status, "")

    def outcome(self, method: str, reply: _Reply) -> tuple[bool, Any]:
        """(done, result) for a reply; raises for a final error; (False, None) means retry."""
        if reply.status == 200:
            if method == "GET":
                return True, reply.body
            return True, None
        if reply.status == 404 and method == "GET" and self.error_message(reply) == "key not found":
            return True, None
        if reply.status in RETRYABLE_STATUS or (reply.status == 409 and _locked(reply.body)):
            return False, None  # a 409 "locked": a transaction holds the key for now; nothing was written
        raise GridRequestError(reply.status, self.error_message(reply))


class _CacheRoute(_Router):
    """Routing of one named cache (``client.cache(name)``): its own table and mode, learnt from ``GET
    /v1/caches/{name}``; the endpoints, the endpoints to avoid and the counters are the client's."""

    def __init__(self, base: _Router, name: str) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"cache: expected a cache name, got {name!r}")
        super().__init__(base.seeds, base.retries, base.backoff, base.timeout, base.avoid_seconds)
        self.known = list(base.known)
        self.avoid = base.avoid
        self.stats = base.stats
        self.name = name
        self.mode: str | None = None
        self.status_path = "/v1/caches/" + urllib.parse.quote(name, safe="")
        self.pinned: str | None = None

    def kv_path(self, key: bytes) -> str:
        return self.status_path + key_path(key)[len("/v1") :]

    def learn(self, status: dict[str, Any]) -> None:
        mode = status.get("mode")
        if isinstance(mode, str):
            self.mode = mode
        super().learn(status)

    def target(self, key: bytes, write: bool) -> str:
        if self.mode == "invalidation":
            # Each member holds its own copies: keep talking to one member (another only when it fails).
            if self.pinned is None or self.avoid.get(self.pinned, 0.0) > time.monotonic():
                self.pinned = self.any_endpoint()
            return self.pinned
        if self.mode == "replicated" and not write:
            return self.any_endpoint()  # every member reads its own full copy
        return super().target(key, write)


def _check_deadline_margin(request_timeout: float, clock_skew: float) -> None:
    if not request_timeout > 0:
        raise ValueError(f"request_timeout: expected seconds above 0, got {request_timeout}")
    if not 0 <= clock_skew < request_timeout:
        raise ValueError(f"clock_skew: expected 0 to below request_timeout ({request_timeout} s), got {clock_skew}")


def _deadline(request_timeout: float, clock_skew: float) -> str:
    """The ``X-Grid-Deadline`` value of an attempt starting now."""
    return f"{time.time() + request_timeout - clock_skew:.6f}"


def _check_batching(batch_size: int, parallel: int) -> None:
    if not 1 <= batch_size <= 10_000:
        raise ValueError(f"batch_size: expected 1 to 10000, got {batch_size}")
    if parallel < 1:
        raise ValueError(f"parallel: expected at least 1, got {parallel}")


class GridClient:
    """Blocking client. Not thread-safe: one client per thread (it keeps one connection per member)."""

    def __init__(
        self,
        endpoints: Iterable[str],
        *,
        retries: int = 10,
        backoff: float = 0.05,
        timeout: float = DEFAULT_TIMEOUT,
        request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
        avoid_seconds: float = 2.0,
        route: bool = True,
        batch_size: int = DEFAULT_BATCH_SIZE,
        parallel: int = 8,
        token: str | None = None,
        clock_skew: float = DEFAULT_CLOCK_SKEW,
    ) -> None:
        _check_batching(batch_size, parallel)
        _check_deadline_margin(request_timeout, clock_skew)
        self._r = _Router(endpoints, retries, backoff, timeout, avoid_seconds)
        self.request_timeout = request_timeout
        self.clock_skew = clock_skew
        # Sent as a bearer token with every request: members started with --kv-token-file require it.
        self._auth = {"Authorization": f"Bearer {token}"} if token else {}
        self.route = route
        self.batch_size = batch_size
        self.parallel = parallel
        # Connections are per thread: the batch methods send from a small pool of worker threads.
        self._tls = threading.local()
        self._all_conns: list[http.client.HTTPConnection] = []
        self._conns_lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        if route:
            self.refresh()

    @property
    def stats(self) -> dict[str, int]:
        """Counters: requests, retries, routing refreshes, connection errors."""
        return self._r.stats

    def get(self, key: bytes) -> bytes | None:
        return self._call("GET", key, None)

    def put(self, key: bytes, value: bytes, *, lifespan: float | None = None) -> None:
        """Write ``key``; with ``lifespan`` (seconds, above 0, at most 10 years) the grid removes the entry once
        that time has passed."""
        if type(value) is not bytes:
            raise TypeError(f"value: expected bytes, got {type(value).__name__}")
        self._call("PUT", key, value, lifespan=_check_lifespan(lifespan))

    def delete(self, key: bytes) -> None:
        self._call("DELETE", key, None)

    def put_many(
        self, items: Mapping[bytes, bytes] | Iterable[tuple[bytes, bytes]], *, lifespan: float | None = None
    ) -> None:
        """Write many keys (a mapping or ``(key, value)`` pairs; the last value of a repeated key wins), each
        with ``lifespan`` when given (as :meth:`put`)."""
        span = _check_lifespan(lifespan)
        self._many(_put_ops(items), lifespan=span)

    def get_many(self, keys: Iterable[bytes]) -> dict[bytes, bytes | None]:
        """The value of every key (None: absent)."""
        ops = _key_ops("get", keys)
        return {op[1]: v for op, v in zip(ops, self._many(ops), strict=True)}

    def get_many_versions(self, keys: Iterable[bytes]) -> dict[bytes, tuple[bytes | None, int | None]]:
        """``(value, version)`` of every key (value None: absent; version None: not known, see the module)."""
        ops = _key_ops("get", keys)
        versions: list[int | None] = []
        values = self._many(ops, versions)
        return {op[1]: (v, ver) for op, v, ver in zip(ops, values, versions, strict=True)}

    def delete_many(self, keys: Iterable[bytes]) -> None:
        self._many(_key_ops("delete", keys))

    def scan_segment(self, segment: int, *, page_size: int = 1000) -> Iterator[tuple[bytes, bytes]]:
        """Every entry ``(key, value)`` of ``segment``, in key order, page by page from a member that reads it."""
        for k, v, _ in self.scan_segment_versions(segment, page_size=page_size):
            yield k, v

    def scan_segment_versions(self, segment: int, *, page_size: int = 1000) -> Iterator[tuple[bytes, bytes, int]]:
        """Every entry ``(key, value, version)`` of ``segment``, in key order (as :meth:`scan_segment`)."""
        after: str | None = None
        while True:
            page = self._scan_page(segment, after, page_size)
            yield from ((k, v, ver) for k, v, ver in page["entries"])
            after = page["next"]
            if after is None:
                return

    def changes(self, segment: int, after: int = 0, *, limit: int = 1000) -> dict[str, Any]:
        """One page of the change feed of ``segment`` after version ``after``, from a member that reads it:
        ``{"covered", "floor", "entries": [[version, key, value or None], ...], "upto", "more", ...}``."""
        return self._scan_page(segment, None, limit, _changes_path(segment, after, limit))

    def _scan_page(self, segment: int, after: str | None, limit: int, path: str | None = None) -> dict[str, Any]:
        r = self._r
        path = path or _scan_path(segment, after, limit)
        deadline = time.monotonic() + r.timeout
        last, last_status = "no attempt made", None
        for attempt in range(r.retries + 1):
            ep = r.scan_target(segment) if self.route else r.any_endpoint()
            r.stats["requests"] += 1
            try:
                reply = self._request(ep, "GET", path, None, {"Accept": MSGPACK})
            except (OSError, http.client.HTTPException) as exc:
                r.failed(ep)
                last, last_status = f"{ep}: {exc or type(exc).__name__}", None
            else:
                page = r.scan_outcome(ep, reply)
                if page is not None:
                    return page
                last, last_status = f"{ep}: HTTP {reply.status}: {r.error_message(reply)}", reply.status
            if attempt == r.retries or time.monotonic() >= deadline:
                break
            r.stats["retries"] += 1
            time.sleep(min(r.delay(attempt), max(0.0, deadline - time.monotonic())))
            if self.route:
                self.refresh(avoid=ep)
        raise GridUnavailableError(
            f"scan of segment {segment} failed after {attempt + 1} attempts; last: {last}", last_status
        )

    def _many(
        self, ops: list[_Op], versions: list[int | None] | None = None, lifespan: float | None = None
    ) -> list[bytes | None]:
        r = self._r
        run = _BatchRun(ops, r.timeout, lifespan)
        if not ops:
            return []
        for attempt in range(r.retries + 1):
            plan = run.plan(r, self.batch_size, self.route)
            r.stats["requests"] += len(plan)
            if len(plan) == 1 or self.parallel == 1:
                outcomes = [self._send_batch(ep, run.body(idxs)) for ep, idxs in plan]
            else:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(self.parallel, thread_name_prefix="grid-batch")
                futs = [self._pool.submit(self._send_batch, ep, run.body(idxs)) for ep, idxs in plan]
                outcomes = [f.result() for f in futs]
            for (ep, idxs), (reply, error) in zip(plan, outcomes, strict=True):
                run.absorb(r, ep, idxs, reply, error)
            if not run.next_round() or attempt == r.retries or time.monotonic() >= run.deadline:
                break
            r.stats["retries"] += 1
            time.sleep(min(r.delay(attempt), max(0.0, run.deadline - time.monotonic())))
            if self.route:
                self.refresh()
        results = run.finish()
        if versions is not None:
            versions.extend(run.versions)
        return results

    def _send_batch(self, ep: str, body: bytes) -> tuple[_Reply | None, str]:
        try:
            return self._request(ep, "POST", "/v1/batch", body, {"Content-Type": MSGPACK}), ""
        except (OSError, http.client.HTTPException) as exc:
            return None, str(exc) or type(exc).__name__

    def status(self, endpoint: str | None = None, path: str = "/v1/status") -> dict[str, Any]:
        """``GET /v1/status`` of one member (any known member by default)."""
        ep = normalize_endpoint(endpoint) if endpoint else self._r.any_endpoint()
        sent = time.time()
        reply = self._request(ep, "GET", path, None)
        received = time.time()
        if reply.status != 200:
            raise GridRequestError(reply.status, self._r.error_message(reply))
        doc = json.loads(reply.body)
        self._r.check_clock(ep, doc, sent, received, self.clock_skew)
        return doc

    def set_capacity(self, endpoint: str, capacity: float) -> None:
        """``POST /v1/capacity`` on the member at ``endpoint``: its new capacity factor (0 to 1000000; at 0 it
        owns no segment and stays in the group). The coordinator rebalances to it (docs/grid.md, "Capacity").
        Raises :class:`GridRequestError` when the member refuses (a bad value: 400)."""
        body = json.dumps({"capacity": capacity}).encode()
        reply = self._request(normalize_endpoint(endpoint), "POST", "/v1/capacity", body, {"Content-Type": JSON})
        if reply.status != 202:
            raise GridRequestError(reply.status, self._r.error_message(reply))

    def cache(self, name: str) -> CacheClient:
        """The named cache ``name`` (``GET /v1/caches`` lists them): get/put/delete routed by its mode.
        Raises :class:`GridRequestError` (404) when the members have no cache of that name."""
        return CacheClient(self, name)

    def caches(self) -> list[dict[str, Any]]:
        """``GET /v1/caches`` of some member: every cache with its mode, segments, owners and status."""
        return self.status(path="/v1/caches")["caches"]

    def _learn_cache(self, route: _CacheRoute, avoid: str | None = None) -> bool:
        """Reload a named cache's mode and routing table from some member; a 404 (no such cache) raises."""
        route.stats["refreshes"] += 1
        tried: set[str] = set()
        for _ in range(len(route.known)):
            ep = route.any_endpoint(exclude=avoid)
            if ep in tried:
                continue
            tried.add(ep)
            try:
                route.learn(self.status(ep, route.status_path))
                return True
            except GridRequestError as exc:
                if exc.status == 404:
                    raise
                route.failed(ep)
            except (OSError, http.client.HTTPException, ValueError):
                route.failed(ep)
        return False

    def refresh(self, avoid: str | None = None) -> bool:
        """Reload the routing table from some member; False if none answered."""
        self._r.stats["refreshes"] += 1
        tried: set[str] = set()
        for _ in range(len(self._r.known)):
            ep = self._r.any_endpoint(exclude=avoid)
            if ep in tried:
                continue
            tried.add(ep)
            try:
                self._r.learn(self.status(ep))
                return True
            except (OSError, http.client.HTTPException, GridRequestError, ValueError):
                self._r.failed(ep)
        return False

    def _call(
        self,
        method: str,
        key: bytes,
        value: bytes | None,
        versioned: bool = False,
        cache: _CacheRoute | None = None,
        lifespan: float | None = None,
    ) -> Any:
        path = _with_lifespan(key_path(key) if cache is None else cache.kv_path(key), lifespan)
        r = self._r if cache is None else cache
        deadline = time.monotonic() + r.timeout
        last = "no attempt made"
        last_status = None
        for attempt in range(r.retries + 1):
            ep = r.target(key, write=method != "GET") if self.route or cache is not None else r.any_endpoint()
            r.stats["requests"] += 1
            try:
                reply = self._request(ep, method, path, value)
            except (OSError, http.client.HTTPException) as exc:
                r.failed(ep)
                last, last_status = f"{ep}: {exc or type(exc).__name__}", None
            else:
                done, result = r.outcome(method, reply)
                if done:
                    return (result, reply.version or 0) if versioned else result
                last, last_status = f"{ep}: HTTP {reply.status}: {r.error_message(reply)}", reply.status
                if reply.status == 503:
                    r.avoid[ep] = time.monotonic() + r.avoid_seconds
            if attempt == r.retries or time.monotonic() >= deadline:
                break
            r.stats["retries"] += 1
            time.sleep(min(r.delay(attempt), max(0.0, deadline - time.monotonic())))
            if cache is not None:
                self._learn_cache(cache, avoid=ep)
            elif self.route:
                self.refresh(avoid=ep)
        raise GridUnavailableError(f"{method} failed after {attempt + 1} attempts; last: {last}", last_status)

    def _thread_conns(self) -> dict[str, http.client.HTTPConnection]:
        conns: dict[str, http.client.HTTPConnection] | None = getattr(self._tls, "conns", None)
        if conns is None:
            conns = self._tls.conns = {}
        return conns

    def _request(
        self, ep: str, method: str, path: str, body: bytes | None, headers: dict[str, str] | None = None
    ) -> _Reply:
        reused = ep in self._thread_conns()
        try:
            return self._request_once(ep, method, path, body, headers)
        except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
            if not reused:
                raise
        # A kept-alive connection the server had already closed (idle timeout): one fresh connection, not a
        # retry of the operation in the sense of the module docstring.
        return self._request_once(ep, method, path, body, headers)

    def _request_once(
        self, ep: str, method: str, path: str, body: bytes | None, headers: dict[str, str] | None
    ) -> _Reply:
        conns = self._thread_conns()
        conn = conns.get(ep)
        if conn is None:
            u = urllib.parse.urlsplit(ep)
            if u.hostname is None:
                raise GridClientError(f"endpoint {ep!r}: no host")
            conn = conns[ep] = http.client.HTTPConnection(u.hostname, u.port, timeout=self.request_timeout)
            with self._conns_lock:
                self._all_conns.append(conn)
        if headers is None:
            headers = {"Content-Type": "application/octet-stream"} if body is not None else {}
        headers = {**headers, **self._auth, DEADLINE_HEADER: _deadline(self.request_timeout, self.clock_skew)}
        try:
            conn.request(method, path, body=body, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
        except (OSError, http.client.HTTPException):
            conn.close()
            conns.pop(ep, None)
            raise
        if resp.getheader("Connection", "").lower() == "close":
            conn.close()
            conns.pop(ep, None)
        self._tls.__dict__.setdefault("used", {})[ep] = time.monotonic()
        return _Reply(resp.status, data, _version_header(resp.getheader(VERSION_HEADER)))

    # ==== transactions ====================================================================================
    def transaction(self, mode: str = "optimistic") -> Transaction:
        """A transaction: ``with grid.transaction() as tx: v = tx.get(k); tx.put(k2, v2)`` commits on leaving
        the block (see :class:`Transaction` and the module docstring)."""
        return Transaction(self, mode)

    def run_transaction(self, fn: Callable[[Transaction], T], *, retries: int = 5, mode: str = "optimistic") -> T:
        """Run ``fn(tx)`` in a transaction and commit; when the transaction is aborted (a conflict, a lock
        timeout, the grid unavailable: it was rolled back, nothing of it took effect) run ``fn`` again in a new
        one, up to ``retries`` times. ``fn`` must have no effects outside the transaction. An unknown outcome
        (:class:`GridTxUnknownOutcome`) is never re-run. Returns what the last ``fn`` returned."""
        _check_reruns(retries)
        attempt = 0
        while True:
            try:
                with self.transaction(mode) as tx:
                    result = fn(tx)
                return result
            except GridTxAborted as exc:
                # A member at its max_entries bound ("full") refuses again until keys are deleted: not re-run.
                if attempt >= retries or exc.reason == "full":
                    raise
            self._r.stats["tx_reruns"] = self._r.stats.get("tx_reruns", 0) + 1
            time.sleep(self._r.delay(attempt))
            attempt += 1

    def _tx_post(self, ep: str, path: str, body: bytes | None, commit: bool = False) -> _Reply:
        headers = {"Content-Type": MSGPACK, "Accept": MSGPACK}
        if not commit:
            return self._request(ep, "POST", path, body, headers)
        # A commit is never sent twice by the connection layer (_request re-sends once on a connection the
        # server closed while idle): a connection idle for long is replaced before, instead.
        used: dict[str, float] = self._tls.__dict__.setdefault("used", {})
        if time.monotonic() - used.get(ep, 0.0) > IDLE_REFRESH_SECONDS:
            conn = self._thread_conns().pop(ep, None)
            if conn is not None:
                conn.close()
        return self._request_once(ep, "POST", path, body, headers)

    def _tx_begin(self, mode: str) -> tuple[str, str]:
        """Begin an interactive transaction on some member: (id, member URL). Safe to retry: nothing is
        locked or written by a begin (one whose answer was lost is rolled back by its member later)."""
        r = self._r
        deadline = time.monotonic() + r.timeout
        last = "no attempt made"
        body = msgpack.packb({"mode": mode}, use_bin_type=True)
        for attempt in range(r.retries + 1):
            ep = r.any_endpoint()
            r.stats["requests"] += 1
            try:
                reply = self._tx_post(ep, "/v1/tx/begin", body)
            except (OSError, http.client.HTTPException) as exc:
                r.failed(ep)
                last = f"{ep}: {exc or type(exc).__name__}"
            else:
                if reply.status == 200:
                    return str(_decode_ok(reply, "begin")["tx"]), ep
                if reply.status not in RETRYABLE_STATUS:
                    raise _tx_failure(reply, None)
                last = f"{ep}: HTTP {reply.status}: {r.error_message(reply)}"
                r.avoid[ep] = time.monotonic() + r.avoid_seconds
            if attempt == r.retries or time.monotonic() >= deadline:
                break
            r.stats["retries"] += 1
            time.sleep(min(r.delay(attempt), max(0.0, deadline - time.monotonic())))
            if self.route:
                self.refresh(avoid=ep)
        raise GridTxAborted(f"could not begin a transaction after {attempt + 1} attempts; last: {last}", "unavailable")

    def _tx_oneshot(self, t: _TxCore) -> str:
        """Send an optimistic transaction's reads and writes as one ``POST /v1/tx``; its id once committed.
        A 503 (refused or rolled back because owners were unavailable) is sent again, elsewhere."""
        r = self._r
        deadline = time.monotonic() + r.timeout
        body = t.body(True)
        for attempt in range(r.retries + 1):
            ep = t.commit_target(r) if self.route else r.any_endpoint()
            r.stats["requests"] += 1
            try:
                reply = self._tx_post(ep, "/v1/tx", body, commit=True)
            except (OSError, http.client.HTTPException) as exc:
                r.failed(ep)
                t.state = "failed"
                raise GridTxUnknownOutcome(
                    f"no answer to the commit from {ep} ({exc or type(exc).__name__}); it may or may not have "
                    "committed",
                    "connection",
                ) from None
            if reply.status == 200:
                return str(_decode_ok(reply, "commit")["tx"])
            err = _tx_failure(reply, None)
            if reply.status != 503 or attempt == r.retries or time.monotonic() >= deadline:
                t.state = "failed"
                raise err
            r.avoid[ep] = time.monotonic() + r.avoid_seconds
            r.stats["retries"] += 1
            time.sleep(min(r.delay(attempt), max(0.0, deadline - time.monotonic())))
            if self.route:
                self.refresh(avoid=ep)
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        with self._conns_lock:
            for conn in self._all_conns:
                conn.close()
            self._all_conns.clear()
        self._tls = threading.local()

    def __enter__(self) -> GridClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncGridClient:
    """asyncio client (aiohttp). Safe to share between the tasks of one event loop."""

    def __init__(
        self,
        endpoints: Iterable[str],
        *,
        retries: int = 10,
        backoff: float = 0.05,
        timeout: float = DEFAULT_TIMEOUT,
        request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
        avoid_seconds: float = 2.0,
        route: bool = True,
        max_connections: int = 100,
        batch_size: int = DEFAULT_BATCH_SIZE,
        parallel: int = 8,
        token: str | None = None,
        clock_skew: float = DEFAULT_CLOCK_SKEW,
    ) -> None:
        import aiohttp

        _check_batching(batch_size, parallel)
        _check_deadline_margin(request_timeout, clock_skew)
        self.request_timeout = request_timeout
        self.clock_skew = clock_skew
        self._aiohttp = aiohttp
        self._r = _Router(endpoints, retries, backoff, timeout, avoid_seconds)
        self.route = route
        self.batch_size = batch_size
        self.parallel = parallel
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=request_timeout),
            connector=aiohttp.TCPConnector(limit=max_connections),
            headers={"Authorization": f"Bearer {token}"} if token else None,
        )
        self._refreshing: asyncio.Task[bool] | None = None

    @property
    def stats(self) -> dict[str, int]:
        return self._r.stats

    async def get(self, key: bytes) -> bytes | None:
        return await self._call("GET", key, None)

    async def put(self, key: bytes, value: bytes, *, lifespan: float | None = None) -> None:
        """Write ``key``; with ``lifespan`` (seconds, above 0, at most 10 years) the grid removes the entry once
        that time has passed."""
        if type(value) is not bytes:
            raise TypeError(f"value: expected bytes, got {type(value).__name__}")
        await self._call("PUT", key, value, lifespan=_check_lifespan(lifespan))

    async def delete(self, key: bytes) -> None:
        await self._call("DELETE", key, None)

    async def put_many(
        self, items: Mapping[bytes, bytes] | Iterable[tuple[bytes, bytes]], *, lifespan: float | None = None
    ) -> None:
        """Write many keys (a mapping or ``(key, value)`` pairs; the last value of a repeated key wins), each
        with ``lifespan`` when given (as :meth:`put`)."""
        span = _check_lifespan(lifespan)
        await self._many(_put_ops(items), lifespan=span)

    async def get_many(self, keys: Iterable[bytes]) -> dict[bytes, bytes | None]:
        ops = _key_ops("get", keys)
        return {op[1]: v for op, v in zip(ops, await self._many(ops), strict=True)}

    async def delete_many(self, keys: Iterable[bytes]) -> None:
        await self._many(_key_ops("delete", keys))

    async def get_many_versions(self, keys: Iterable[bytes]) -> dict[bytes, tuple[bytes | None, int | None]]:
        """``(value, version)`` of every key (see :meth:`GridClient.get_many_versions`)."""
        ops = _key_ops("get", keys)
        versions: list[int | None] = []
        values = await self._many(ops, versions)
        return {op[1]: (v, ver) for op, v, ver in zip(ops, values, versions, strict=True)}

    async def scan_segment(self, segment: int, *, page_size: int = 1000) -> AsyncIterator[tuple[bytes, bytes]]:
        """Every entry ``(key, value)`` of ``segment``, in key order (see :meth:`GridClient.scan_segment`)."""
        async for k, v, _ in self.scan_segment_versions(segment, page_size=page_size):
            yield k, v

    async def scan_segment_versions(
        self, segment: int, *, page_size: int = 1000
    ) -> AsyncIterator[tuple[bytes, bytes, int]]:
        """Every entry ``(key, value, version)`` of ``segment``, in key order."""
        after: str | None = None
        while True:
            page = await self._scan_page(segment, after, page_size)
            for k, v, ver in page["entries"]:
                yield k, v, ver
            after = page["next"]
            if after is None:
                return

    async def changes(self, segment: int, after: int = 0, *, limit: int = 1000) -> dict[str, Any]:
        """One page of the change feed of ``segment`` (see :meth:`GridClient.changes`)."""
        return await self._scan_page(segment, None, limit, _changes_path(segment, after, limit))

    async def _scan_page(self, segment: int, after: str | None, limit: int, path: str | None = None) -> dict[str, Any]:
        r = self._r
        path = path or _scan_path(segment, after, limit)
        if self.route and r.table is None:
            await self.refresh()
        deadline = time.monotonic() + r.timeout
        last, last_status = "no attempt made", None
        for attempt in range(r.retries + 1):
            ep = r.scan_target(segment) if self.route else r.any_endpoint()
            r.stats["requests"] += 1
            try:
                reply = await self._request(ep, "GET", path, None, {"Accept": MSGPACK})
            except (TimeoutError, OSError, self._aiohttp.ClientError) as exc:
                r.failed(ep)
                last, last_status = f"{ep}: {exc or type(exc).__name__}", None
            else:
                page = r.scan_outcome(ep, reply)
                if page is not None:
                    return page
                last, last_status = f"{ep}: HTTP {reply.status}: {r.error_message(reply)}", reply.status
            if attempt == r.retries or time.monotonic() >= deadline:
                break
            r.stats["retries"] += 1
            await asyncio.sleep(min(r.delay(attempt), max(0.0, deadline - time.monotonic())))
            if self.route:
                await self.refresh(avoid=ep)
        raise GridUnavailableError(
            f"scan of segment {segment} failed after {attempt + 1} attempts; last: {last}", last_status
        )

    async def _many(
        self, ops: list[_Op], versions: list[int | None] | None = None, lifespan: float | None = None
    ) -> list[bytes | None]:
        r = self._r
        if not ops:
            return []
        if self.route and r.table is None:
            await self.refresh()
        run = _BatchRun(ops, r.timeout, lifespan)
        sem = asyncio.Semaphore(self.parallel)

        async def send(ep: str, body: bytes) -> tuple[_Reply | None, str]:
            async with sem:
                try:
                    return await self._request(ep, "POST", "/v1/batch", body, {"Content-Type": MSGPACK}), ""
                except (TimeoutError, OSError, self._aiohttp.ClientError) as exc:
                    return None, str(exc) or type(exc).__name__

        for attempt in range(r.retries + 1):
            plan = run.plan(r, self.batch_size, self.route)
            r.stats["requests"] += len(plan)
            outcomes = await asyncio.gather(*(send(ep, run.body(idxs)) for ep, idxs in plan))
            for (ep, idxs), (reply, error) in zip(plan, outcomes, strict=True):
                run.absorb(r, ep, idxs, reply, error)
            if not run.next_round() or attempt == r.retries or time.monotonic() >= run.deadline:
                break
            r.stats["retries"] += 1
            await asyncio.sleep(min(r.delay(attempt), max(0.0, run.deadline - time.monotonic())))
            if self.route:
                await self.refresh()
        results = run.finish()
        if versions is not None:
            versions.extend(run.versions)
        return results

    async def status(self, endpoint: str | None = None, path: str = "/v1/status") -> dict[str, Any]:
        ep = normalize_endpoint(endpoint) if endpoint else self._r.any_endpoint()
        sent = time.time()
        reply = await self._request(ep, "GET", path, None)
        received = time.time()
        if reply.status != 200:
            raise GridRequestError(reply.status, self._r.error_message(reply))
        doc = json.loads(reply.body)
        self._r.check_clock(ep, doc, sent, received, self.clock_skew)
        return doc

    async def set_capacity(self, endpoint: str, capacity: float) -> None:
        """See :meth:`GridClient.set_capacity`."""
        body = json.dumps({"capacity": capacity}).encode()
        reply = await self._request(normalize_endpoint(endpoint), "POST", "/v1/capacity", body, {"Content-Type": JSON})
        if reply.status != 202:
            raise GridRequestError(reply.status, self._r.error_message(reply))

    def cache(self, name: str) -> AsyncCacheClient:
        """The named cache ``name``: get/put/delete routed by its mode (see :meth:`GridClient.cache`; here the
        cache is looked up on first use, so a 404 for an unknown name comes from the first operation)."""
        return AsyncCacheClient(self, name)

    async def caches(self) -> list[dict[str, Any]]:
        """``GET /v1/caches`` of some member."""
        return (await self.status(path="/v1/caches"))["caches"]

    async def _learn_cache(self, route: _CacheRoute, avoid: str | None = None) -> bool:
        route.stats["refreshes"] += 1
        tried: set[str] = set()
        for _ in range(len(route.known)):
            ep = route.any_endpoint(exclude=avoid)
            if ep in tried:
                continue
            tried.add(ep)
            try:
                route.learn(await self.status(ep, route.status_path))
                return True
            except GridRequestError as exc:
                if exc.status == 404:
                    raise
                route.failed(ep)
            except (TimeoutError, OSError, self._aiohttp.ClientError, ValueError):
                route.failed(ep)
        return False

    async def refresh(self, avoid: str | None = None) -> bool:
        # Many tasks failing at once share one refresh instead of each asking a member.
        if self._refreshing is None or self._refreshing.done():
            self._refreshing = asyncio.ensure_future(self._refresh(avoid))
        return await asyncio.shield(self._refreshing)

    async def _refresh(self, avoid: str | None) -> bool:
        self._r.stats["refreshes"] += 1
        tried: set[str] = set()
        for _ in range(len(self._r.known)):
            ep = self._r.any_endpoint(exclude=avoid)
            if ep in tried:
                continue
            tried.add(ep)
            try:
                self._r.learn(await self.status(ep))
                return True
            except (TimeoutError, OSError, self._aiohttp.ClientError, GridRequestError, ValueError):
                self._r.failed(ep)
        return False

    async def _call(
        self,
        method: str,
        key: bytes,
        value: bytes | None,
        versioned: bool = False,
        cache: _CacheRoute | None = None,
        lifespan: float | None = None,
    ) -> Any:
        path = _with_lifespan(key_path(key) if cache is None else cache.kv_path(key), lifespan)
        r = self._r if cache is None else cache
        if cache is not None and cache.mode is None:
            await self._learn_cache(cache)
        elif cache is None and self.route and r.table is None:
            await self.refresh()
        deadline = time.monotonic() + r.timeout
        last = "no attempt made"
        last_status = None
        for attempt in range(r.retries + 1):
            ep = r.target(key, write=method != "GET") if self.route or cache is not None else r.any_endpoint()
            r.stats["requests"] += 1
            try:
                reply = await self._request(ep, method, path, value)
            except (TimeoutError, OSError, self._aiohttp.ClientError) as exc:
                r.failed(ep)
                last, last_status = f"{ep}: {exc or type(exc).__name__}", None
            else:
                done, result = r.outcome(method, reply)
                if done:
                    return (result, reply.version or 0) if versioned else result
                last, last_status = f"{ep}: HTTP {reply.status}: {r.error_message(reply)}", reply.status
                if reply.status == 503:
                    r.avoid[ep] = time.monotonic() + r.avoid_seconds
            if attempt == r.retries or time.monotonic() >= deadline:
                break
            r.stats["retries"] += 1
            await asyncio.sleep(min(r.delay(attempt), max(0.0, deadline - time.monotonic())))
            if cache is not None:
                await self._learn_cache(cache, avoid=ep)
            elif self.route:
                await self.refresh(avoid=ep)
        raise GridUnavailableError(f"{method} failed after {attempt + 1} attempts; last: {last}", last_status)

    async def _request(
        self, ep: str, method: str, path: str, body: bytes | None, headers: dict[str, str] | None = None
    ) -> _Reply:
        if headers is None:
            headers = {"Content-Type": "application/octet-stream"} if body is not None else {}
        headers = {**headers, DEADLINE_HEADER: _deadline(self.request_timeout, self.clock_skew)}
        async with self._session.request(method, ep + path, data=body, headers=headers) as resp:
            return _Reply(resp.status, await resp.read(), _version_header(resp.headers.get(VERSION_HEADER)))

    # ==== transactions ====================================================================================
    def transaction(self, mode: str = "optimistic") -> AsyncTransaction:
        """``async with grid.transaction() as tx: v = await tx.get(k); await tx.put(k2, v2)``."""
        return AsyncTransaction(self, mode)

    async def run_transaction(
        self, fn: Callable[[AsyncTransaction], Awaitable[T]], *, retries: int = 5, mode: str = "optimistic"
    ) -> T:
        """As :meth:`GridClient.run_transaction`, with a coroutine function ``fn``."""
        _check_reruns(retries)
        attempt = 0
        while True:
            try:
                async with self.transaction(mode) as tx:
                    result = await fn(tx)
                return result
            except GridTxAborted as exc:
                # A member at its max_entries bound ("full") refuses again until keys are deleted: not re-run.
                if attempt >= retries or exc.reason == "full":
                    raise
            self._r.stats["tx_reruns"] = self._r.stats.get("tx_reruns", 0) + 1
            await asyncio.sleep(self._r.delay(attempt))
            attempt += 1

    async def _tx_post(self, ep: str, path: str, body: bytes | None) -> _Reply:
        return await self._request(ep, "POST", path, body, {"Content-Type": MSGPACK, "Accept": MSGPACK})

    async def _tx_begin(self, mode: str) -> tuple[str, str]:
        r = self._r
        deadline = time.monotonic() + r.timeout
        last = "no attempt made"
        body = msgpack.packb({"mode": mode}, use_bin_type=True)
        for attempt in range(r.retries + 1):
            ep = r.any_endpoint()
            r.stats["requests"] += 1
            try:
                reply = await self._tx_post(ep, "/v1/tx/begin", body)
            except (TimeoutError, OSError, self._aiohttp.ClientError) as exc:
                r.failed(ep)
                last = f"{ep}: {exc or type(exc).__name__}"
            else:
                if reply.status == 200:
                    return str(_decode_ok(reply, "begin")["tx"]), ep
                if reply.status not in RETRYABLE_STATUS:
                    raise _tx_failure(reply, None)
                last = f"{ep}: HTTP {reply.status}: {r.error_message(reply)}"
                r.avoid[ep] = time.monotonic() + r.avoid_seconds
            if attempt == r.retries or time.monotonic() >= deadline:
                break
            r.stats["retries"] += 1
            await asyncio.sleep(min(r.delay(attempt), max(0.0, deadline - time.monotonic())))
            if self.route:
                await self.refresh(avoid=ep)
        raise GridTxAborted(f"could not begin a transaction after {attempt + 1} attempts; last: {last}", "unavailable")

    async def _tx_oneshot(self, t: _TxCore) -> str:
        r = self._r
        if self.route and r.table is None:
            await self.refresh()
        deadline = time.monotonic() + r.timeout
        body = t.body(True)
        for attempt in range(r.retries + 1):
            ep = t.commit_target(r) if self.route else r.any_endpoint()
            r.stats["requests"] += 1
            try:
                reply = await self._tx_post(ep, "/v1/tx", body)
            except (TimeoutError, OSError, self._aiohttp.ClientError) as exc:
                r.failed(ep)
                t.state = "failed"
                raise GridTxUnknownOutcome(
                    f"no answer to the commit from {ep} ({exc or type(exc).__name__}); it may or may not have "
                    "committed",
                    "connection",
                ) from None
            if reply.status == 200:
                return str(_decode_ok(reply, "commit")["tx"])
            err = _tx_failure(reply, None)
            if reply.status != 503 or attempt == r.retries or time.monotonic() >= deadline:
                t.state = "failed"
                raise err
            r.avoid[ep] = time.monotonic() + r.avoid_seconds
            r.stats["retries"] += 1
            await asyncio.sleep(min(r.delay(attempt), max(0.0, deadline - time.monotonic())))
            if self.route:
                await self.refresh(avoid=ep)
        raise AssertionError("unreachable")

    async def close(self) -> None:
        if self._refreshing is not None and not self._refreshing.done():
            self._refreshing.cancel()
        await self._session.close()

    async def __aenter__(self) -> AsyncGridClient:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()


# ==== transactions ======================================================================================


class CacheClient:
    """One named cache through a :class:`GridClient` (``client.cache("sessions")``): the same get/put/delete
    and retries as the client's own, routed by the cache's mode: a distributed cache like the default one
    (owners from its routing table), a replicated one reads on any member and writes to the key's primary,
    an invalidation cache always talks to the same member (its copies are that member's)."""

    def __init__(self, client: GridClient, name: str) -> None:
        self._c = client
        self._route = _CacheRoute(client._r, name)
        if not client._learn_cache(self._route):
            raise GridUnavailableError(f"cache {name!r}: no member answered GET {self._route.status_path}")

    @property
    def name(self) -> str:
        return self._route.name

    @property
    def mode(self) -> str | None:
        return self._route.mode

    def get(self, key: bytes) -> bytes | None:
        return self._c._call("GET", key, None, cache=self._route)

    def put(self, key: bytes, value: bytes, *, lifespan: float | None = None) -> None:
        """As :meth:`GridClient.put`; an invalidation cache refuses a lifespan (:class:`GridRequestError`, 400)."""
        if type(value) is not bytes:
            raise TypeError(f"value: expected bytes, got {type(value).__name__}")
        self._c._call("PUT", key, value, cache=self._route, lifespan=_check_lifespan(lifespan))

    def delete(self, key: bytes) -> None:
        self._c._call("DELETE", key, None, cache=self._route)

    def status(self) -> dict[str, Any]:
        """``GET /v1/caches/{name}`` of the member this cache talks to."""
        ep = self._route.pinned or self._route.any_endpoint()
        return self._c.status(ep, self._route.status_path)


class AsyncCacheClient:
    """:class:`CacheClient` for :class:`AsyncGridClient`."""

    def __init__(self, client: AsyncGridClient, name: str) -> None:
        self._c = client
        self._route = _CacheRoute(client._r, name)

    @property
    def name(self) -> str:
        return self._route.name

    @property
    def mode(self) -> str | None:
        return self._route.mode

    async def get(self, key: bytes) -> bytes | None:
        return await self._c._call("GET", key, None, cache=self._route)

    async def put(self, key: bytes, value: bytes, *, lifespan: float | None = None) -> None:
        """As :meth:`AsyncGridClient.put`; an invalidation cache refuses a lifespan (:class:`GridRequestError`)."""
        if type(value) is not bytes:
            raise TypeError(f"value: expected bytes, got {type(value).__name__}")
        await self._c._call("PUT", key, value, cache=self._route, lifespan=_check_lifespan(lifespan))

    async def delete(self, key: bytes) -> None:
        await self._c._call("DELETE", key, None, cache=self._route)


class GridTxError(GridClientError):
    """A transaction did not commit. ``reason`` is the member's machine-readable cause (``"conflict"``,
    ``"lock_timeout"``, ``"timeout"``, ``"unavailable"``, ``"rolled_back"``, ``"not_found"``, ``"connection"``,
    ...), ``tx`` the transaction id when one was assigned, ``status`` the HTTP status (None: no answer)."""

    def __init__(self, message: str, reason: str, tx: str | None = None, status: int | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.tx = tx
        self.status = status


class GridTxAborted(GridTxError):
    """The transaction was rolled back: none of its writes took effect, so running it again is safe."""


class GridTxConflict(GridTxAborted):
    """Rolled back because a key the transaction read changed before it committed."""


class GridTxUnknownOutcome(GridTxError):
    """The commit was sent but no answer came (the member died, the connection broke): the transaction may
    have committed or not. Never retried on its own; read the keys to find out."""


def _tx_path(tx: str, action: str) -> str:
    return "/v1/tx/" + urllib.parse.quote(tx, safe="") + "/" + action


def _tx_failure(reply: _Reply, tx: str | None) -> GridClientError:
    """The exception for a transaction request the member did not answer with 200."""
    try:
        doc = json.loads(reply.body)
        if not isinstance(doc, dict):
            raise ValueError("not a map")
    except ValueError:
        doc = {}
    message = str(doc.get("error") or _Router.error_message(reply))
    reason = doc.get("reason") if isinstance(doc.get("reason"), str) else ""
    tx = doc.get("tx") if isinstance(doc.get("tx"), str) else tx
    status = reply.status
    if status == 409:
        cls: type[GridTxError] = GridTxConflict if reason == "conflict" else GridTxAborted
        return cls(f"transaction {tx} aborted ({reason}): {message}", reason or "aborted", tx, status)
    if status in (503, 504):
        reason = reason or ("unavailable" if status == 503 else "timeout")
        return GridTxAborted(f"transaction {tx} aborted ({reason}): {message}", reason, tx, status)
    if status == 404 and tx is not None and "runs no data grid" not in message:
        # An interactive transaction the member no longer knows: rolled back (timeout, member restarted).
        return GridTxAborted(f"transaction {tx} aborted: {message}", "not_found", tx, status)
    if status == 500 and doc.get("committed", False) is None:
        return GridTxUnknownOutcome(f"transaction {tx}: outcome unknown: {message}", reason or "unknown", tx, status)
    return GridRequestError(status, message)


def _decode_ok(reply: _Reply, what: str) -> dict[str, Any]:
    try:
        doc = msgpack.unpackb(reply.body, raw=False)
        if not isinstance(doc, dict):
            raise ValueError("not a map")
    except Exception as exc:
        raise GridClientError(f"malformed answer to {what}: {exc}") from None
    return doc


class _TxCore:
    """A client-side transaction's bookkeeping, shared by the blocking and asyncio forms (no I/O here).

    ``reads``: key -> version first read (0: absent), checked by the primary at commit; ``values``: what was
    read (read again in the transaction, a key gives the same answer); ``writes``: key -> value (None
    deletes), buffered until the commit; ``locked``: keys a pessimistic transaction holds on their primaries;
    ``tx``/``member``: the id and the member (originator) of a pessimistic transaction once begun there.
    """

    def __init__(self, mode: str) -> None:
        if mode not in TX_MODES:
            raise ValueError(f"mode: expected 'optimistic' or 'pessimistic', got {mode!r}")
        self.mode = mode
        self.reads: dict[bytes, int] = {}
        self.values: dict[bytes, bytes | None] = {}
        self.writes: dict[bytes, bytes | None] = {}
        self.locked: set[bytes] = set()
        self.tx: str | None = None
        self.member: str | None = None
        self.state = "active"  # active | committed | rolled_back | failed
        self.commit_sent = False

    def needs_rollback(self) -> bool:
        """A rollback is due unless the transaction finished, or a commit was sent (whose outcome stands): a
        failed lock request may leave the transaction open on its member, holding the locks it got."""
        return self.state in ("active", "failed") and not self.commit_sent

    @property
    def pessimistic(self) -> bool:
        return self.mode == "pessimistic"

    def check_active(self) -> None:
        if self.state != "active":
            raise GridClientError(f"the transaction is {self.state.replace('_', ' ')}: start a new one")

    def lookup(self, key: bytes) -> tuple[bool, bytes | None]:
        if key in self.writes:
            return True, self.writes[key]
        if key in self.values:
            return True, self.values[key]
        return False, None

    def read(self, key: bytes, value: bytes | None, version: int) -> None:
        self.values[key] = value
        self.reads[key] = version

    def write(self, key: bytes, value: bytes | None) -> None:
        _check_key(key)
        if value is not None:
            if type(value) is not bytes:
                raise TypeError(f"value of {key!r}: expected bytes, got {type(value).__name__}")
            if len(value) > VALUE_LIMIT:
                raise ValueError(f"value of {key!r}: {len(value)} bytes exceed the limit of {VALUE_LIMIT}")
        self.writes[key] = value

    def to_lock(self, keys: Iterable[bytes]) -> list[bytes]:
        if not self.pessimistic:
            raise ValueError("lock: an optimistic transaction locks nothing ahead (use mode='pessimistic')")
        return [_check_key(k) for k in dict.fromkeys(keys) if k not in self.locked]

    def empty(self) -> bool:
        return not self.reads and not self.writes and not self.locked

    def body(self, oneshot: bool) -> bytes:
        doc: dict[str, Any] = {"reads": self.reads, "writes": self.writes}
        if oneshot:
            doc["mode"] = self.mode
        return msgpack.packb(doc, use_bin_type=True)

    def commit_target(self, router: _Router) -> str:
        """Where a one-shot commit goes: the write primary of a written key (it coordinates from there, one
        hop less), else of a read key."""
        key = next(iter(self.writes), None) or next(iter(self.reads))
        return router.target(key, write=True)


class _TxHandle:
    """What the blocking and the asyncio transaction share: their state, kept in a :class:`_TxCore`."""

    def __init__(self, mode: str) -> None:
        self._t = _TxCore(mode)

    @property
    def mode(self) -> str:
        return self._t.mode

    @property
    def id(self) -> str | None:
        """The member's transaction id (pessimistic: once begun; optimistic: after the commit)."""
        return self._t.tx

    @property
    def state(self) -> str:
        return self._t.state


class Transaction(_TxHandle):
    """A transaction of the blocking client (:meth:`GridClient.transaction`); commit on leaving the ``with``
    block, roll back on an exception. Not thread-safe (as the client)."""

    def __init__(self, client: GridClient, mode: str = "optimistic") -> None:
        super().__init__(mode)
        self._c = client

    def get(self, key: bytes) -> bytes | None:
        """The value of ``key`` as this transaction sees it (its own writes first); records the version read.
        Pessimistic: locks the key first."""
        t = self._t
        t.check_active()
        _check_key(key)
        hit, value = t.lookup(key)
        if hit:
            return value
        if t.pessimistic:
            self.lock([key])
        value, version = self._c._call("GET", key, None, versioned=True)
        t.read(key, value, version)
        return value

    def get_many(self, keys: Iterable[bytes]) -> dict[bytes, bytes | None]:
        """Several keys in one round of batch requests (pessimistic: one lock request for all first)."""
        t = self._t
        t.check_active()
        keys = [_check_key(k) for k in dict.fromkeys(keys)]
        todo = [k for k in keys if not t.lookup(k)[0]]
        if todo:
            if t.pessimistic:
                self.lock(todo)
            for key, (value, version) in self._c.get_many_versions(todo).items():
                if version is None and value is not None:
                    value, version = self._c._call("GET", key, None, versioned=True)
                t.read(key, value, version or 0)
        return {k: t.lookup(k)[1] for k in keys}

    def put(self, key: bytes, value: bytes) -> None:
        self._t.check_active()
        if type(value) is not bytes:
            raise TypeError(f"value: expected bytes, got {type(value).__name__}")
        if self._t.pessimistic:
            self.lock([key])
        self._t.write(key, value)

    def delete(self, key: bytes) -> None:
        self._t.check_active()
        if self._t.pessimistic:
            self.lock([key])
        self._t.write(key, None)

    def lock(self, keys: Iterable[bytes]) -> None:
        """Pessimistic mode: lock ``keys`` on their primaries now (they stay locked until the end)."""
        t = self._t
        t.check_active()
        todo = t.to_lock(keys)
        if not todo:
            return
        if t.tx is None:
            t.tx, t.member = self._c._tx_begin(t.mode)
        body = msgpack.packb({"keys": todo}, use_bin_type=True)
        try:
            reply = self._c._tx_post(t.member, _tx_path(t.tx, "lock"), body)  # type: ignore[arg-type]
        except (OSError, http.client.HTTPException) as exc:
            # Nothing was committed; the member rolls the transaction back on its own (timeout, or it died).
            t.state = "failed"
            raise GridTxAborted(f"transaction {t.tx}: lock request failed: {exc}", "connection", t.tx) from None
        if reply.status != 200:
            t.state = "failed"
            raise _tx_failure(reply, t.tx)
        t.locked.update(todo)

    def commit(self) -> None:
        """Commit: raises :class:`GridTxConflict` / :class:`GridTxAborted` (rolled back, safe to run again) or
        :class:`GridTxUnknownOutcome` (no answer to the commit)."""
        t = self._t
        t.check_active()
        if t.empty():
            t.state = "committed"
            return
        t.commit_sent = True
        if t.tx is None:
            t.tx = self._c._tx_oneshot(t)
        else:
            try:
                reply = self._c._tx_post(t.member, _tx_path(t.tx, "commit"), t.body(False), commit=True)  # type: ignore[arg-type]
            except (OSError, http.client.HTTPException) as exc:
                t.state = "failed"
                raise GridTxUnknownOutcome(
                    f"transaction {t.tx}: no answer to the commit ({exc}); it may or may not have committed",
                    "connection",
                    t.tx,
                ) from None
            if reply.status != 200:
                t.state = "failed"
                raise _tx_failure(reply, t.tx)
        t.state = "committed"

    def rollback(self) -> None:
        """Roll back (idempotent). A pessimistic transaction's locks are released on its member now."""
        t = self._t
        if not t.needs_rollback():
            return
        t.state = "rolled_back"
        if t.tx is not None and t.member is not None:
            # Best effort: a member that cannot be told rolls it back by itself after its tx_timeout.
            with contextlib.suppress(OSError, http.client.HTTPException):
                self._c._tx_post(t.member, _tx_path(t.tx, "rollback"), None)

    def __enter__(self) -> Transaction:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        if et is not None:
            self.rollback()
        elif self._t.state == "active":
            self.commit()


class AsyncTransaction(_TxHandle):
    """A transaction of the asyncio client (:meth:`AsyncGridClient.transaction`): ``async with``; every
    operation is a coroutine (a pessimistic put locks the key first)."""

    def __init__(self, client: AsyncGridClient, mode: str = "optimistic") -> None:
        super().__init__(mode)
        self._c = client

    async def get(self, key: bytes) -> bytes | None:
        t = self._t
        t.check_active()
        _check_key(key)
        hit, value = t.lookup(key)
        if hit:
            return value
        if t.pessimistic:
            await self.lock([key])
        value, version = await self._c._call("GET", key, None, versioned=True)
        t.read(key, value, version)
        return value

    async def get_many(self, keys: Iterable[bytes]) -> dict[bytes, bytes | None]:
        t = self._t
        t.check_active()
        keys = [_check_key(k) for k in dict.fromkeys(keys)]
        todo = [k for k in keys if not t.lookup(k)[0]]
        if todo:
            if t.pessimistic:
                await self.lock(todo)
            for key, (value, version) in (await self._c.get_many_versions(todo)).items():
                if version is None and value is not None:
                    value, version = await self._c._call("GET", key, None, versioned=True)
                t.read(key, value, version or 0)
        return {k: t.lookup(k)[1] for k in keys}

    async def put(self, key: bytes, value: bytes) -> None:
        self._t.check_active()
        if type(value) is not bytes:
            raise TypeError(f"value: expected bytes, got {type(value).__name__}")
        if self._t.pessimistic:
            await self.lock([key])
        self._t.write(key, value)

    async def delete(self, key: bytes) -> None:
        self._t.check_active()
        if self._t.pessimistic:
            await self.lock([key])
        self._t.write(key, None)

    async def lock(self, keys: Iterable[bytes]) -> None:
        t = self._t
        t.check_active()
        todo = t.to_lock(keys)
        if not todo:
            return
        if t.tx is None:
            t.tx, t.member = await self._c._tx_begin(t.mode)
        body = msgpack.packb({"keys": todo}, use_bin_type=True)
        try:
            reply = await self._c._tx_post(t.member, _tx_path(t.tx, "lock"), body)  # type: ignore[arg-type]
        except (TimeoutError, OSError, self._c._aiohttp.ClientError) as exc:
            t.state = "failed"
            raise GridTxAborted(f"transaction {t.tx}: lock request failed: {exc}", "connection", t.tx) from None
        if reply.status != 200:
            t.state = "failed"
            raise _tx_failure(reply, t.tx)
        t.locked.update(todo)

    async def commit(self) -> None:
        t = self._t
        t.check_active()
        if t.empty():
            t.state = "committed"
            return
        t.commit_sent = True
        if t.tx is None:
            t.tx = await self._c._tx_oneshot(t)
        else:
            try:
                reply = await self._c._tx_post(t.member, _tx_path(t.tx, "commit"), t.body(False))  # type: ignore[arg-type]
            except (TimeoutError, OSError, self._c._aiohttp.ClientError) as exc:
                t.state = "failed"
                raise GridTxUnknownOutcome(
                    f"transaction {t.tx}: no answer to the commit ({exc}); it may or may not have committed",
                    "connection",
                    t.tx,
                ) from None
            if reply.status != 200:
                t.state = "failed"
                raise _tx_failure(reply, t.tx)
        t.state = "committed"

    async def rollback(self) -> None:
        t = self._t
        if not t.needs_rollback():
            return
        t.state = "rolled_back"
        if t.tx is not None and t.member is not None:
            with contextlib.suppress(TimeoutError, OSError, self._c._aiohttp.ClientError):
                await self._c._tx_post(t.member, _tx_path(t.tx, "rollback"), None)

    async def __aenter__(self) -> AsyncTransaction:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        if et is not None:
            await self.rollback()
        elif self._t.state == "active":
            await self.commit()


def _check_reruns(retries: int) -> None:
    if type(retries) is not int or retries < 0:
        raise ValueError(f"retries: expected an int >= 0, got {retries!r}")


__all__ = [
    "AsyncGridClient",
    "AsyncTransaction",
    "GridBatchError",
    "GridClient",
    "GridClientError",
    "GridRequestError",
    "GridTxAborted",
    "GridTxConflict",
    "GridTxError",
    "GridTxUnknownOutcome",
    "GridUnavailableError",
    "Transaction",
    "normalize_endpoint",
]
