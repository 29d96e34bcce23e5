"""Where a client sends each request: the endpoints it knows, the routing table it learnt from the members, the
endpoints to avoid for now and the retry decisions (no I/O here; both clients share it)."""

from __future__ import annotations

import logging
import random
import time
import urllib.parse
from collections.abc import Iterable
from typing import Any, TypeGuard

import msgpack

from ..consistent_hash import segment_of, segments_of
from ..errors import GridError, GridRequestError
from ._wire import RETRYABLE_STATUS, _locked, _Reply, error_message, key_path, normalize_endpoint

log = logging.getLogger("groupcluster.grid.client")


def _all_set(urls: list[str | None]) -> TypeGuard[list[str]]:
    """Whether every segment found a member (checked in C: the writer routes millions of keys)."""
    return None not in urls


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
        by_kind = members = None
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
        if _all_set(out):
            return out
        return [url if url is not None else self.any_endpoint() for url in out]

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
                raise GridError(f"{ep}: malformed segment page: {exc}") from None
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

    error_message = staticmethod(error_message)

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
