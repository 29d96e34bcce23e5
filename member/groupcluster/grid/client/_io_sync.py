"""The blocking client's transport: ``http.client`` connections kept alive per member and per thread, a small
thread pool for the batch requests, ``time.sleep``. The asyncio twin is :mod:`._io_async`; the generated
:mod:`._sync` code calls this one where the :mod:`._async` source calls that one."""

from __future__ import annotations

import http.client
import threading
import time
import urllib.parse
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Annotated, TypeVar

from ..errors import GridError
from ._wire import DEADLINE_HEADER, IDLE_REFRESH_SECONDS, VERSION_HEADER, _deadline, _Reply, _version_header

T = TypeVar("T")
# What a call the asyncio client awaits returns here, as is (``Awaitable[T]`` in :mod:`._io_async`).
Result = Annotated[T, "returned as is"]


class SyncTransport:
    """HTTP requests of one :class:`~.GridClient`. Not thread-safe beyond its own batch workers (as the client).

    ``max_connections`` is the asyncio client's bound: here each thread keeps one connection per member."""

    errors: tuple[type[BaseException], ...] = (OSError, http.client.HTTPException)  # a request that failed

    def __init__(
        self, request_timeout: float, clock_skew: float, token: str | None, max_connections: int = 100
    ) -> None:
        self.request_timeout = request_timeout
        self.clock_skew = clock_skew
        # Sent as a bearer token with every request: members started with --kv-token-file require it.
        self._auth = {"Authorization": f"Bearer {token}"} if token else {}
        # Connections are per thread: the batch methods send from a small pool of worker threads.
        self._tls = threading.local()
        self._all_conns: list[http.client.HTTPConnection] = []
        self._conns_lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None

    def request(
        self,
        ep: str,
        method: str,
        path: str,
        body: bytes | None,
        headers: dict[str, str] | None = None,
        *,
        once: bool = False,
    ) -> _Reply:
        """One request to the member at ``ep``. ``once``: the request goes out at most once (a commit), on a
        connection used in the last :data:`IDLE_REFRESH_SECONDS` or a fresh one; otherwise a kept-alive
        connection the server had closed is replaced and the request sent again on the new one."""
        if once:
            used: dict[str, float] = self._tls.__dict__.setdefault("used", {})
            if time.monotonic() - used.get(ep, 0.0) > IDLE_REFRESH_SECONDS:
                conn = self._thread_conns().pop(ep, None)
                if conn is not None:
                    conn.close()
            return self._request_once(ep, method, path, body, headers)
        reused = ep in self._thread_conns()
        try:
            return self._request_once(ep, method, path, body, headers)
        except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
            if not reused:
                raise
        # A kept-alive connection the server had already closed (idle timeout): one fresh connection, not a
        # retry of the operation in the sense of the package docstring.
        return self._request_once(ep, method, path, body, headers)

    def _thread_conns(self) -> dict[str, http.client.HTTPConnection]:
        conns: dict[str, http.client.HTTPConnection] | None = getattr(self._tls, "conns", None)
        if conns is None:
            conns = self._tls.conns = {}
        return conns

    def _request_once(
        self, ep: str, method: str, path: str, body: bytes | None, headers: dict[str, str] | None
    ) -> _Reply:
        conns = self._thread_conns()
        conn = conns.get(ep)
        if conn is None:
            u = urllib.parse.urlsplit(ep)
            if u.hostname is None:
                raise GridError(f"endpoint {ep!r}: no host")
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

    def run_all(self, fn: Callable[[str, bytes], T], calls: list[tuple[str, bytes]], parallel: int) -> list[T]:
        """``fn(*call)`` for every call, ``parallel`` at a time (worker threads), results in order."""
        if len(calls) == 1 or parallel == 1:
            return [fn(*call) for call in calls]
        if self._pool is None:
            self._pool = ThreadPoolExecutor(parallel, thread_name_prefix="grid-batch")
        futs = [self._pool.submit(fn, *call) for call in calls]
        return [f.result() for f in futs]

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def shared(self, fn: Callable[[], T]) -> T:
        """``fn()``: the client is used by one thread, so no other caller can be running it."""
        return fn()

    def eager(self, fn: Callable[[], object]) -> None:
        """Run ``fn`` now: the blocking client does in its constructor what the asyncio one (which cannot await
        there) does on first use."""
        fn()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        with self._conns_lock:
            for conn in self._all_conns:
                conn.close()
            self._all_conns.clear()
        self._tls = threading.local()
