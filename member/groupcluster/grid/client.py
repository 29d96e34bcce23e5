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
seconds overall. A retried PUT or DELETE may be applied twice, which is harmless: the same value is written
again. A ``4xx`` is never retried and raises :class:`GridRequestError` with the server's message.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import random
import time
import urllib.parse
from collections.abc import Iterable
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from .consistent_hash import segment_of

DEFAULT_TIMEOUT = 60.0
DEFAULT_REQUEST_TIMEOUT = 35.0  # above the grid's default op_timeout (30 s): its 504 arrives first
RETRYABLE_STATUS = frozenset({502, 503, 504})


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
        if reply.status in RETRYABLE_STATUS:
            return False, None
        raise GridRequestError(reply.status, self.error_message(reply))


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
    ) -> None:
        self._r = _Router(endpoints, retries, backoff, timeout, avoid_seconds)
        self.request_timeout = request_timeout
        self.route = route
        self._conns: dict[str, http.client.HTTPConnection] = {}
        if route:
            self.refresh()

    @property
    def stats(self) -> dict[str, int]:
        """Counters: requests, retries, routing refreshes, connection errors."""
        return self._r.stats

    def get(self, key: bytes) -> bytes | None:
        return self._call("GET", key, None)  # type: ignore[no-any-return]

    def put(self, key: bytes, value: bytes) -> None:
        if type(value) is not bytes:
            raise TypeError(f"value: expected bytes, got {type(value).__name__}")
        self._call("PUT", key, value)

    def delete(self, key: bytes) -> None:
        self._call("DELETE", key, None)

    def status(self, endpoint: str | None = None) -> dict[str, Any]:
        """``GET /v1/status`` of one member (any known member by default)."""
        ep = normalize_endpoint(endpoint) if endpoint else self._r.any_endpoint()
        reply = self._request(ep, "GET", "/v1/status", None)
        if reply.status != 200:
            raise GridRequestError(reply.status, self._r.error_message(reply))
        return json.loads(reply.body)  # type: ignore[no-any-return]

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

    def _call(self, method: str, key: bytes, value: bytes | None) -> Any:
        path = key_path(key)
        r = self._r
        deadline = time.monotonic() + r.timeout
        last = "no attempt made"
        last_status = None
        for attempt in range(r.retries + 1):
            ep = r.target(key, write=method != "GET") if self.route else r.any_endpoint()
            r.stats["requests"] += 1
            try:
                reply = self._request(ep, method, path, value)
            except (OSError, http.client.HTTPException) as exc:
                r.failed(ep)
                last, last_status = f"{ep}: {exc or type(exc).__name__}", None
            else:
                done, result = r.outcome(method, reply)
                if done:
                    return result
                last, last_status = f"{ep}: HTTP {reply.status}: {r.error_message(reply)}", reply.status
                if reply.status == 503:
                    r.avoid[ep] = time.monotonic() + r.avoid_seconds
            if attempt == r.retries or time.monotonic() >= deadline:
                break
            r.stats["retries"] += 1
            time.sleep(min(r.delay(attempt), max(0.0, deadline - time.monotonic())))
            if self.route:
                self.refresh(avoid=ep)
        raise GridUnavailableError(f"{method} failed after {attempt + 1} attempts; last: {last}", last_status)

    def _request(self, ep: str, method: str, path: str, body: bytes | None) -> _Reply:
        reused = ep in self._conns
        try:
            return self._request_once(ep, method, path, body)
        except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
            if not reused:
                raise
        # A kept-alive connection the server had already closed (idle timeout): one fresh connection, not a
        # retry of the operation in the sense of the module docstring.
        return self._request_once(ep, method, path, body)

    def _request_once(self, ep: str, method: str, path: str, body: bytes | None) -> _Reply:
        conn = self._conns.get(ep)
        if conn is None:
            u = urllib.parse.urlsplit(ep)
            conn = self._conns[ep] = http.client.HTTPConnection(u.hostname, u.port, timeout=self.request_timeout)
        headers = {"Content-Type": "application/octet-stream"} if body is not None else {}
        try:
            conn.request(method, path, body=body, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
        except (OSError, http.client.HTTPException):
            conn.close()
            self._conns.pop(ep, None)
            raise
        if resp.getheader("Connection", "").lower() == "close":
            conn.close()
            self._conns.pop(ep, None)
        return _Reply(resp.status, data)

    def close(self) -> None:
        for conn in self._conns.values():
            conn.close()
        self._conns.clear()

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
    ) -> None:
        import aiohttp

        self._aiohttp = aiohttp
        self._r = _Router(endpoints, retries, backoff, timeout, avoid_seconds)
        self.route = route
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=request_timeout),
            connector=aiohttp.TCPConnector(limit=max_connections),
        )
        self._refreshing: asyncio.Task[bool] | None = None

    @property
    def stats(self) -> dict[str, int]:
        return self._r.stats

    async def get(self, key: bytes) -> bytes | None:
        return await self._call("GET", key, None)  # type: ignore[no-any-return]

    async def put(self, key: bytes, value: bytes) -> None:
        if type(value) is not bytes:
            raise TypeError(f"value: expected bytes, got {type(value).__name__}")
        await self._call("PUT", key, value)

    async def delete(self, key: bytes) -> None:
        await self._call("DELETE", key, None)

    async def status(self, endpoint: str | None = None) -> dict[str, Any]:
        ep = normalize_endpoint(endpoint) if endpoint else self._r.any_endpoint()
        reply = await self._request(ep, "GET", "/v1/status", None)
        if reply.status != 200:
            raise GridRequestError(reply.status, self._r.error_message(reply))
        return json.loads(reply.body)  # type: ignore[no-any-return]

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

    async def _call(self, method: str, key: bytes, value: bytes | None) -> Any:
        path = key_path(key)
        r = self._r
        if self.route and r.table is None:
            await self.refresh()
        deadline = time.monotonic() + r.timeout
        last = "no attempt made"
        last_status = None
        for attempt in range(r.retries + 1):
            ep = r.target(key, write=method != "GET") if self.route else r.any_endpoint()
            r.stats["requests"] += 1
            try:
                reply = await self._request(ep, method, path, value)
            except (TimeoutError, OSError, self._aiohttp.ClientError) as exc:
                r.failed(ep)
                last, last_status = f"{ep}: {exc or type(exc).__name__}", None
            else:
                done, result = r.outcome(method, reply)
                if done:
                    return result
                last, last_status = f"{ep}: HTTP {reply.status}: {r.error_message(reply)}", reply.status
                if reply.status == 503:
                    r.avoid[ep] = time.monotonic() + r.avoid_seconds
            if attempt == r.retries or time.monotonic() >= deadline:
                break
            r.stats["retries"] += 1
            await asyncio.sleep(min(r.delay(attempt), max(0.0, deadline - time.monotonic())))
            if self.route:
                await self.refresh(avoid=ep)
        raise GridUnavailableError(f"{method} failed after {attempt + 1} attempts; last: {last}", last_status)

    async def _request(self, ep: str, method: str, path: str, body: bytes | None) -> _Reply:
        headers = {"Content-Type": "application/octet-stream"} if body is not None else None
        async with self._session.request(method, ep + path, data=body, headers=headers) as resp:
            return _Reply(resp.status, await resp.read())

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


__all__ = [
    "AsyncGridClient",
    "GridClient",
    "GridClientError",
    "GridRequestError",
    "GridUnavailableError",
    "normalize_endpoint",
]
