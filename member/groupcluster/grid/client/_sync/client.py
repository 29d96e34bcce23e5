# Generated from ../_async/client.py by scripts/unasync_client.py: do not edit. Change the asyncio source, then run
# .venv/bin/python scripts/unasync_client.py (scripts/test checks that this file is current).
"""The grid clients, written once for asyncio (``_async/client.py``: ``AsyncGridClient``, ``AsyncCacheClient``)
and generated for blocking use (``_sync/client.py``: ``GridClient``, ``CacheClient``) by ``scripts/unasync_client.py``.
Usage, routing, retries and batches: the package docstring."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from types import TracebackType
from typing import Any, TypeVar

import msgpack

from ...errors import GridRequestError, GridTxAborted, GridTxUnavailable, GridTxUnknownOutcome, GridUnavailableError
from .._batch import _BatchRun, _key_ops, _Op, _put_ops
from .._io_sync import Result, SyncTransport
from .._routing import _CacheRoute, _Router
from .._txcore import _TxCore
from .._wire import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_CLOCK_SKEW,
    DEFAULT_REQUEST_TIMEOUT,
    DEFAULT_TIMEOUT,
    JSON,
    MSGPACK,
    RETRYABLE_STATUS,
    _changes_path,
    _check_batching,
    _check_deadline_margin,
    _check_lifespan,
    _check_reruns,
    _check_value,
    _decode_ok,
    _Reply,
    _scan_path,
    _tx_failure,
    _with_lifespan,
    key_path,
    normalize_endpoint,
)
from .transaction import Transaction

T = TypeVar("T")


class GridClient:
    """A client of the grid's HTTP API. The asyncio client (aiohttp) is safe to share between the tasks of one
    event loop; the blocking one is not thread-safe: one client per thread (it keeps one connection per
    member; its batch requests go out from a few worker threads). ``max_connections`` bounds the asyncio
    client's connection pool (the blocking client ignores it)."""

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
        _check_batching(batch_size, parallel)
        _check_deadline_margin(request_timeout, clock_skew)
        self._r = _Router(endpoints, retries, backoff, timeout, avoid_seconds)
        self.request_timeout = request_timeout
        self.clock_skew = clock_skew
        self.route = route
        self.batch_size = batch_size
        self.parallel = parallel
        self._io = SyncTransport(request_timeout, clock_skew, token, max_connections)
        if route:
            # The blocking client learns the routing table now; the asyncio one before its first request.
            self._io.eager(self.refresh)

    @property
    def stats(self) -> dict[str, int]:
        """Counters: requests, retries, routing refreshes, connection errors."""
        return self._r.stats

    def get(self, key: bytes) -> bytes | None:
        return self._call("GET", key, None)

    def put(self, key: bytes, value: bytes, *, lifespan: float | None = None) -> None:
        """Write ``key``; with ``lifespan`` (seconds, above 0, at most 10 years) the grid removes the entry once
        that time has passed."""
        self._call("PUT", key, _check_value(value), lifespan=_check_lifespan(lifespan))

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
        """``(value, version)`` of every key (value None: absent; version None: not known, see the package)."""
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
            for entry in page["entries"]:
                yield entry[0], entry[1], entry[2]  # as a tuple (msgpack decodes lists)
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
        if self.route and r.table is None:
            self.refresh()
        deadline = time.monotonic() + r.timeout
        last, last_status = "no attempt made", None
        for attempt in range(r.retries + 1):
            ep = r.scan_target(segment) if self.route else r.any_endpoint()
            r.stats["requests"] += 1
            try:
                reply = self._io.request(ep, "GET", path, None, {"Accept": MSGPACK})
            except self._io.errors as exc:
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
            self._io.sleep(min(r.delay(attempt), max(0.0, deadline - time.monotonic())))
            if self.route:
                self.refresh(avoid=ep)
        raise GridUnavailableError(
            f"scan of segment {segment} failed after {attempt + 1} attempts; last: {last}", last_status
        )

    def _many(
        self, ops: list[_Op], versions: list[int | None] | None = None, lifespan: float | None = None
    ) -> list[bytes | None]:
        r = self._r
        if not ops:
            return []
        if self.route and r.table is None:
            self.refresh()
        run = _BatchRun(ops, r.timeout, lifespan)
        for attempt in range(r.retries + 1):
            plan = run.plan(r, self.batch_size, self.route)
            r.stats["requests"] += len(plan)
            outcomes = self._io.run_all(self._send_batch, [(ep, run.body(idxs)) for ep, idxs in plan], self.parallel)
            for (ep, idxs), (reply, error) in zip(plan, outcomes, strict=True):
                run.absorb(r, ep, idxs, reply, error)
            if not run.next_round() or attempt == r.retries or time.monotonic() >= run.deadline:
                break
            r.stats["retries"] += 1
            self._io.sleep(min(r.delay(attempt), max(0.0, run.deadline - time.monotonic())))
            if self.route:
                self.refresh()
        results = run.finish()
        if versions is not None:
            versions.extend(run.versions)
        return results

    def _send_batch(self, ep: str, body: bytes) -> tuple[_Reply | None, str]:
        try:
            return self._io.request(ep, "POST", "/v1/batch", body, {"Content-Type": MSGPACK}), ""
        except self._io.errors as exc:
            return None, str(exc) or type(exc).__name__

    def status(self, endpoint: str | None = None, path: str = "/v1/status") -> dict[str, Any]:
        """``GET /v1/status`` of one member (any known member by default)."""
        ep = normalize_endpoint(endpoint) if endpoint else self._r.any_endpoint()
        sent = time.time()
        reply = self._io.request(ep, "GET", path, None)
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
        reply = self._io.request(normalize_endpoint(endpoint), "POST", "/v1/capacity", body, {"Content-Type": JSON})
        if reply.status != 202:
            raise GridRequestError(reply.status, self._r.error_message(reply))

    def cache(self, name: str) -> CacheClient:
        """The named cache ``name`` (``GET /v1/caches`` lists them): get/put/delete routed by its mode. An unknown
        name raises :class:`GridRequestError` (404): from here in the blocking client, from the first operation
        in the asyncio one (which looks the cache up on first use)."""
        return CacheClient(self, name)

    def caches(self) -> list[dict[str, Any]]:
        """``GET /v1/caches`` of some member: every cache with its mode, segments, owners and status."""
        return (self.status(path="/v1/caches"))["caches"]

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
            except ValueError:  # a malformed answer
                route.failed(ep)
            except self._io.errors:
                route.failed(ep)
        return False

    def refresh(self, avoid: str | None = None) -> bool:
        """Reload the routing table from some member; False if none answered. (Callers of the asyncio client
        that ask while a refresh runs share it.)"""
        return self._io.shared(lambda: self._refresh(avoid))

    def _refresh(self, avoid: str | None) -> bool:
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
            except (GridRequestError, ValueError):  # refused, or a malformed answer
                self._r.failed(ep)
            except self._io.errors:
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
        # Without a routing table (none learnt yet: the members were unreachable so far, or the asyncio client's
        # first request) the first attempt would go to any member: learn it first.
        if cache is not None and cache.mode is None:
            self._learn_cache(cache)
        elif cache is None and self.route and r.table is None:
            self.refresh()
        deadline = time.monotonic() + r.timeout
        last = "no attempt made"
        last_status = None
        for attempt in range(r.retries + 1):
            ep = r.target(key, write=method != "GET") if self.route or cache is not None else r.any_endpoint()
            r.stats["requests"] += 1
            try:
                reply = self._io.request(ep, method, path, value)
            except self._io.errors as exc:
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
            self._io.sleep(min(r.delay(attempt), max(0.0, deadline - time.monotonic())))
            if cache is not None:
                self._learn_cache(cache, avoid=ep)
            elif self.route:
                self.refresh(avoid=ep)
        raise GridUnavailableError(f"{method} failed after {attempt + 1} attempts; last: {last}", last_status)

    # ==== transactions ====================================================================================
    def transaction(self, mode: str = "optimistic") -> Transaction:
        """A transaction (``"optimistic"`` or ``"pessimistic"``), committed on leaving its ``with`` (asyncio:
        ``async with``) block, rolled back on an exception; see the package docstring."""
        return Transaction(self, mode)

    def run_transaction(
        self, fn: Callable[[Transaction], Result[T]], *, retries: int = 5, mode: str = "optimistic"
    ) -> T:
        """Run ``fn(tx)`` (asyncio: a coroutine function) in a transaction and commit; when the transaction is
        aborted (a conflict, a lock timeout, the grid unavailable: it was rolled back, nothing of it took
        effect) run ``fn`` again in a new one, up to ``retries`` times. ``fn`` must have no effects outside the
        transaction. An unknown outcome (:class:`GridTxUnknownOutcome`) is never re-run. Returns what the last
        ``fn`` returned."""
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
            self._io.sleep(self._r.delay(attempt))
            attempt += 1

    def _tx_post(self, ep: str, path: str, body: bytes | None, commit: bool = False) -> _Reply:
        # A commit is never sent twice by the connection layer (once=True): see the transports.
        headers = {"Content-Type": MSGPACK, "Accept": MSGPACK}
        return self._io.request(ep, "POST", path, body, headers, once=commit)

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
            except self._io.errors as exc:
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
            self._io.sleep(min(r.delay(attempt), max(0.0, deadline - time.monotonic())))
            if self.route:
                self.refresh(avoid=ep)
        raise GridTxUnavailable(
            f"could not begin a transaction after {attempt + 1} attempts; last: {last}", "unavailable"
        )

    def _tx_oneshot(self, t: _TxCore) -> str:
        """Send an optimistic transaction's reads and writes as one ``POST /v1/tx``; its id once committed.
        A 503 (refused or rolled back because owners were unavailable) is sent again, elsewhere."""
        r = self._r
        if self.route and r.table is None:
            self.refresh()
        deadline = time.monotonic() + r.timeout
        body = t.body(True)
        for attempt in range(r.retries + 1):
            ep = t.commit_target(r) if self.route else r.any_endpoint()
            r.stats["requests"] += 1
            try:
                reply = self._tx_post(ep, "/v1/tx", body, commit=True)
            except self._io.errors as exc:
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
            self._io.sleep(min(r.delay(attempt), max(0.0, deadline - time.monotonic())))
            if self.route:
                self.refresh(avoid=ep)
        raise AssertionError("unreachable")

    def close(self) -> None:
        self._io.close()

    def __enter__(self) -> GridClient:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


class CacheClient:
    """One named cache through a client (``client.cache("sessions")``): the same get/put/delete and retries as
    the client's own, routed by the cache's mode: a distributed cache like the default one (owners from its
    routing table), a replicated one reads on any member and writes to the key's primary, an invalidation
    cache always talks to the same member (its copies are that member's)."""

    def __init__(self, client: GridClient, name: str) -> None:
        self._c = client
        self._route = _CacheRoute(client._r, name)
        # The blocking client looks the cache up now; the asyncio one on first use.
        client._io.eager(self._learn)

    def _learn(self) -> None:
        if not self._c._learn_cache(self._route):
            raise GridUnavailableError(f"cache {self.name!r}: no member answered GET {self._route.status_path}")

    @property
    def name(self) -> str:
        return self._route.name

    @property
    def mode(self) -> str | None:
        return self._route.mode

    def get(self, key: bytes) -> bytes | None:
        return self._c._call("GET", key, None, cache=self._route)

    def put(self, key: bytes, value: bytes, *, lifespan: float | None = None) -> None:
        """As the client's ``put``; an invalidation cache refuses a lifespan (:class:`GridRequestError`, 400)."""
        self._c._call("PUT", key, _check_value(value), cache=self._route, lifespan=_check_lifespan(lifespan))

    def delete(self, key: bytes) -> None:
        self._c._call("DELETE", key, None, cache=self._route)

    def status(self) -> dict[str, Any]:
        """``GET /v1/caches/{name}`` of the member this cache talks to."""
        ep = self._route.pinned or self._route.any_endpoint()
        return self._c.status(ep, self._route.status_path)
