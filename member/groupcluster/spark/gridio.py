"""The data source's I/O against grid members: routing tables, segment scans with versions, batched writes.

This runs inside Spark tasks (executors) and on the driver, with blocking sockets: one :class:`GridIO` per
task, closed when the task ends.

**Segment scans follow the segment.** ``GET /v1/segments/{id}?after=CURSOR`` pages through the live entries
of a segment in key order, and only a member that reads the segment in its installed topology (it holds a
complete copy) serves it; any other member answers 409. When a rebalance moves the segment in the middle of
a scan, the next page comes from its new read owner, *continuing after the same key*. Since pages are in key
order, every key present during the whole scan is returned exactly once: keys before the cursor were read
from the old owner, keys after it from the new one, which holds every acknowledged write (a member becomes a
read owner only after it received all of the segment's data, and writes go to old and new owners meanwhile).
A key written or deleted during the scan may or may not be seen, as in any non-snapshot read. As a last guard
a page entry whose key does not follow the cursor is dropped and counted, so no key is ever returned twice.

**Writes** use :meth:`GridClient.put_many` / ``delete_many`` (``POST /v1/batch`` to each write primary,
retried per key on topology changes, 503 and 504). A batch that still fails raises :class:`GridWriteError`.
"""

from __future__ import annotations

import http.client
import json
import random
import time
import urllib.parse
from collections.abc import Iterable, Iterator
from typing import Any

import msgpack

from ..grid.client import GridClient, GridClientError, normalize_endpoint
from .options import GridOptions
from .plan import Routing, RoutingError

MSGPACK = "application/msgpack"
RETRYABLE = frozenset({502, 503, 504})
Entry = tuple[bytes, bytes, int]  # key, value, version


class GridSourceError(RuntimeError):
    """Reading from the grid failed after every retry, or a member answered something unexpected."""


class GridWriteError(RuntimeError):
    """A batch of rows could not be written to the grid; the message says which rows and why."""


class GridIO:
    """Blocking access to the members for one Spark task (or the driver). Not thread-safe."""

    def __init__(self, opts: GridOptions) -> None:
        self.opts = opts
        self.known: list[str] = list(opts.members)
        self.routing: Routing | None = None
        self.avoid: dict[str, float] = {}
        self.stats = {"pages": 0, "retries": 0, "refreshes": 0, "moved": 0, "out_of_order_dropped": 0}
        self._conns: dict[str, http.client.HTTPConnection] = {}
        self._client: GridClient | None = None
        self._rng = random.Random()

    # ==== plumbing ==============================================================================================
    def _request(self, ep: str, path: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        for fresh in (False, True):
            conn = self._conns.get(ep)
            if conn is None:
                u = urllib.parse.urlsplit(ep)
                if u.hostname is None:
                    raise ValueError(f"grid endpoint {ep!r}: no host")
                conn = self._conns[ep] = http.client.HTTPConnection(u.hostname, u.port, timeout=self.opts.timeout)
            try:
                conn.request("GET", path, headers=headers or {})
                resp = conn.getresponse()
                return resp.status, resp.read()
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                conn.close()
                self._conns.pop(ep, None)
                if fresh:
                    raise
            except (OSError, http.client.HTTPException):
                conn.close()
                self._conns.pop(ep, None)
                raise
        raise AssertionError("unreachable")

    def _usable(self, exclude: str | None = None) -> list[str]:
        now = time.monotonic()
        ok = [e for e in self.known if self.avoid.get(e, 0.0) <= now and e != exclude]
        return ok or [e for e in self.known if e != exclude] or list(self.known)

    def _backoff(self, attempt: int) -> None:
        time.sleep(min(1.0, 0.05 * 2**attempt) * (0.5 + self._rng.random() / 2))

    @staticmethod
    def _error_text(body: bytes) -> str:
        try:
            doc = json.loads(body)
            return str(doc.get("error") or doc)
        except (ValueError, AttributeError):
            return body[:200].decode("utf-8", errors="replace")

    # ==== routing ==============================================================================================
    def refresh(self, avoid: str | None = None) -> Routing:
        """Load the routing table from some member (each known one in turn); GridSourceError if none answers."""
        self.stats["refreshes"] += 1
        errors: list[str] = []
        cands = self._usable(exclude=avoid)
        self._rng.shuffle(cands)
        for ep in cands:
            try:
                status, body = self._request(ep, "/v1/status")
                if status != 200:
                    raise GridSourceError(f"HTTP {status}: {self._error_text(body)}")
                routing = Routing.from_status(json.loads(body))
            except (OSError, http.client.HTTPException, ValueError, GridSourceError, RoutingError) as exc:
                self.avoid[ep] = time.monotonic() + 2.0
                errors.append(f"{ep}: {exc}")
                continue
            urls = []
            for u in routing.members:
                if u is not None:
                    try:
                        urls.append(normalize_endpoint(u))
                    except ValueError:
                        continue
            self.known = list(dict.fromkeys([*urls, *self.opts.members]))
            if self.routing is None or routing.topology_id >= self.routing.topology_id:
                self.routing = routing
            return self.routing
        raise GridSourceError("no grid member answered /v1/status with a routing table: " + "; ".join(errors))

    def current_routing(self) -> Routing:
        return self.routing if self.routing is not None else self.refresh()

    # ==== segment scans ========================================================================================
    def scan_segment(self, segment: int, prefer: str | None = None) -> Iterator[list[Entry]]:
        """The entries of ``segment`` page by page, each key once, following the segment when it moves."""
        after: str | None = None
        last_key: bytes | None = None
        target = prefer
        while True:
            page, served_by = self._page(segment, after, target)
            target = served_by
            entries: list[Entry] = []
            for k, v, ver in page["entries"]:
                if last_key is not None and k <= last_key:
                    self.stats["out_of_order_dropped"] += 1
                    continue
                entries.append((k, v, ver))
                last_key = k
            self.stats["pages"] += 1
            if entries:
                yield entries
            after = page["next"]
            if after is None:
                return

    def read_segment(self, segment: int, prefer: str | None = None) -> list[Entry]:
        return [e for page in self.scan_segment(segment, prefer) for e in page]

    def _page(self, segment: int, after: str | None, target: str | None) -> tuple[dict[str, Any], str]:
        query = {"limit": str(self.opts.page_size)}
        if after is not None:
            query["after"] = after
        return self._get_page(segment, f"/v1/segments/{segment}?{urllib.parse.urlencode(query)}", target, "next")

    def changes(self, segment: int, after: int, target: str | None = None) -> tuple[dict[str, Any], str]:
        """One page of the segment's change feed after version ``after`` (``GET /v1/changes/{id}``) from a
        member that reads the segment, and the member that served it."""
        path = f"/v1/changes/{segment}?after={after}&limit={self.opts.page_size}"
        page, ep = self._get_page(segment, path, target, "upto")
        for name, kind in (("covered", bool), ("floor", int), ("upto", int), ("more", bool)):
            if type(page.get(name)) is not kind:
                raise GridSourceError(f"{ep}: malformed change page of segment {segment}: {name} missing")
        self.stats["change_pages"] = self.stats.get("change_pages", 0) + 1
        return page, ep

    def _get_page(self, segment: int, path: str, target: str | None, marker: str) -> tuple[dict[str, Any], str]:
        deadline = time.monotonic() + self.opts.timeout
        last = "no attempt"
        for attempt in range(self.opts.retries + 1):
            ep = target if target is not None and self.avoid.get(target, 0.0) <= time.monotonic() else None
            if ep is None:
                owner = self.current_routing().read_owner(segment)
                ep = owner if owner is not None else self._rng.choice(self._usable())
            target = None
            try:
                status, body = self._request(ep, path, {"Accept": MSGPACK})
            except (OSError, http.client.HTTPException) as exc:
                self.avoid[ep] = time.monotonic() + 2.0
                last = f"{ep}: {exc or type(exc).__name__}"
            else:
                if status == 200:
                    try:
                        page = msgpack.unpackb(body, raw=False)
                        if not isinstance(page.get("entries"), list) or marker not in page:
                            raise ValueError(f"entries or {marker} missing")
                    except Exception as exc:
                        raise GridSourceError(f"{ep}: malformed page of segment {segment}: {exc}") from None
                    return page, ep
                if status == 409:
                    # The segment moved (a rebalance): its owners are named in the answer; the cursor carries on.
                    self.stats["moved"] += 1
                    last = f"{ep}: not a read owner of segment {segment} any more"
                    try:
                        owners = [o for o in json.loads(body).get("owners", []) if o]
                    except (ValueError, AttributeError):
                        owners = []
                    if owners:
                        target = normalize_endpoint(owners[0])
                        continue
                elif status in RETRYABLE:
                    last = f"{ep}: HTTP {status}: {self._error_text(body)}"
                    if status == 503:
                        self.avoid[ep] = time.monotonic() + 2.0
                else:
                    raise GridSourceError(
                        f"{ep}: scan of segment {segment} refused: HTTP {status}: {self._error_text(body)}"
                    )
            if attempt == self.opts.retries or time.monotonic() >= deadline:
                break
            self.stats["retries"] += 1
            self._backoff(attempt)
            try:
                self.refresh(avoid=ep)
            except GridSourceError as exc:  # no member answered this time; the next attempt tries again
                last = f"{last}; {exc}"
        raise GridSourceError(f"scan of segment {segment} failed after {attempt + 1} attempts; last: {last}")

    # ==== key lookups and writes ==============================================================================
    @property
    def client(self) -> GridClient:
        if self._client is None:
            o = self.opts
            self._client = GridClient(
                o.members, retries=o.retries, timeout=o.timeout, batch_size=o.batch_size, parallel=o.parallel
            )
        return self._client

    def get_many(self, keys: Iterable[bytes]) -> dict[bytes, bytes | None]:
        try:
            return self.client.get_many(keys)
        except GridClientError as exc:
            raise GridSourceError(f"key lookup failed: {exc}") from exc

    def get_many_versions(self, keys: Iterable[bytes]) -> dict[bytes, tuple[bytes | None, int | None]]:
        try:
            return self.client.get_many_versions(keys)
        except GridClientError as exc:
            raise GridSourceError(f"key lookup failed: {exc}") from exc

    def put_many(self, pairs: dict[bytes, bytes]) -> None:
        self.client.put_many(pairs, lifespan=self.opts.lifespan)

    def delete_many(self, keys: Iterable[bytes]) -> None:
        self.client.delete_many(keys)

    def close(self) -> None:
        for conn in self._conns.values():
            conn.close()
        self._conns.clear()
        if self._client is not None:
            self._client.close()
            self._client = None
