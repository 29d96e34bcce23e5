"""The asyncio client's transport: one aiohttp session (a pool of kept-alive connections), concurrent batch
requests under a semaphore, ``asyncio.sleep``. The blocking twin is :mod:`._io_sync`."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from ._wire import DEADLINE_HEADER, IDLE_REFRESH_SECONDS, VERSION_HEADER, _deadline, _Reply, _version_header

T = TypeVar("T")
Result = Awaitable[T]  # what a call of the asyncio client gives (the blocking client: T itself)


class AsyncTransport:
    """HTTP requests of one :class:`~.AsyncGridClient`. Safe to share between the tasks of one event loop."""

    def __init__(
        self, request_timeout: float, clock_skew: float, token: str | None, max_connections: int = 100
    ) -> None:
        import aiohttp

        self.request_timeout = request_timeout
        self.clock_skew = clock_skew
        self.errors: tuple[type[BaseException], ...] = (TimeoutError, OSError, aiohttp.ClientError)
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=request_timeout),
            # A pooled connection idle for longer than IDLE_REFRESH_SECONDS is closed instead of reused, so a
            # commit (which aiohttp, as any POST, never re-sends) goes on a recently used or a fresh connection.
            connector=aiohttp.TCPConnector(limit=max_connections, keepalive_timeout=IDLE_REFRESH_SECONDS),
            headers={"Authorization": f"Bearer {token}"} if token else None,
        )
        self._shared: asyncio.Task[Any] | None = None

    async def request(
        self,
        ep: str,
        method: str,
        path: str,
        body: bytes | None,
        headers: dict[str, str] | None = None,
        *,
        once: bool = False,
    ) -> _Reply:
        """One request to the member at ``ep``. ``once`` (a commit: sent at most once, on a connection used in
        the last :data:`IDLE_REFRESH_SECONDS` or a fresh one) holds for every POST here: see the connector."""
        if headers is None:
            headers = {"Content-Type": "application/octet-stream"} if body is not None else {}
        headers = {**headers, DEADLINE_HEADER: _deadline(self.request_timeout, self.clock_skew)}
        async with self._session.request(method, ep + path, data=body, headers=headers) as resp:
            return _Reply(resp.status, await resp.read(), _version_header(resp.headers.get(VERSION_HEADER)))

    async def run_all(
        self, fn: Callable[[str, bytes], Awaitable[T]], calls: list[tuple[str, bytes]], parallel: int
    ) -> list[T]:
        """``fn(*call)`` for every call, ``parallel`` at a time (tasks), results in order."""
        sem = asyncio.Semaphore(parallel)

        async def one(call: tuple[str, bytes]) -> T:
            async with sem:
                return await fn(*call)

        return list(await asyncio.gather(*map(one, calls)))

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    async def shared(self, fn: Callable[[], Awaitable[T]]) -> T:
        """``await fn()``, shared: callers arriving while one runs wait for its result (many tasks failing at once
        share one routing refresh instead of each asking a member)."""
        if self._shared is None or self._shared.done():
            self._shared = asyncio.ensure_future(fn())
        result: T = await asyncio.shield(self._shared)
        return result

    def eager(self, fn: Callable[[], Awaitable[object]]) -> None:
        """Nothing: a constructor cannot await, so the asyncio client does on first use what the blocking one
        does in its constructor."""

    async def close(self) -> None:
        if self._shared is not None and not self._shared.done():
            self._shared.cancel()
        await self._session.close()
