"""RuntimeOperations: a grid runtime's key operations (get, put, delete, batches) as awaitables."""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter
from collections.abc import Sequence
from operator import attrgetter

from ..consistent_hash import segment_of
from ..errors import GridLeaving
from ..messages import DELETE, GET, PUT
from ..node import OpResult
from .outcomes import BatchWait, error_for
from .runtime_base import RuntimeBase

KIND_NAMES = {GET: "get", PUT: "put", DELETE: "delete"}

_KIND_OF = attrgetter("kind")
_OK_OF = attrgetter("ok")
_ATTEMPTS_OF = attrgetter("attempts")


class RuntimeOperations(RuntimeBase):
    """Single operations and batches: each starts in the node and completes when the node reports it."""

    # ``deadline``: the client's deadline as a Unix time (the X-Grid-Deadline header), or None. After it the
    # operation sends no further attempt and fails with GridTimeout (docs/grid.md, "Client deadlines").
    async def get(self, key: bytes, deadline: float | None = None) -> bytes | None:
        """The value of ``key`` (None: absent). Raises :class:`GridError` subclasses."""
        res = await self._run(GET, key, None, deadline)
        return res.value

    async def put(
        self, key: bytes, value: bytes, deadline: float | None = None, lifespan: float | None = None
    ) -> OpResult:
        """Write ``key``; with a ``lifespan`` (seconds) the entry expires that long after now, this member's
        clock (docs/grid.md, "Expiry"). Raises ValueError for a lifespan this member cannot take."""
        return await self._run(PUT, key, value, deadline, self._expires(lifespan))

    def _expires(self, lifespan: float | None) -> float:
        """The expiry (a Unix time; 0.0: never) of an entry written now with ``lifespan`` seconds."""
        if lifespan is None:
            return 0.0
        if type(lifespan) not in (int, float) or not 0 < lifespan < math.inf:
            raise ValueError(f"lifespan: expected a positive, finite number of seconds, got {lifespan!r}")
        return time.time() + float(lifespan)

    async def delete(self, key: bytes, deadline: float | None = None) -> OpResult:
        return await self._run(DELETE, key, None, deadline)

    def _node_time(self, now: float, deadline: float | None) -> float | None:
        """A Unix-time deadline on the node's clock (the event loop's), read against the wall clock now (not a
        stored offset: the wall clock may have been stepped since)."""
        return None if deadline is None else now + (deadline - time.time())

    async def _run(
        self, kind: int, key: bytes, value: bytes | None, deadline: float | None = None, expires: float = 0.0
    ) -> OpResult:
        node = self._require_node()
        if node.leaving:
            raise GridLeaving("this member is leaving the grid; use another member")
        now = self._loop.time()
        cutoff = self._node_time(now, deadline)
        if kind == GET:
            if self._parent is not None and node.reads_locally(key):
                # Named caches count reads answered from our own copy (no hop: what replicated mode is for); the
                # default cache skips the extra key hash on its hot path.
                self.counters["ops_get_local"] += 1
            op = node.get(key, now, cutoff)
        elif kind == PUT:
            if value is None:
                raise TypeError("put: value must be bytes, got None")
            op = node.put(key, value, now, cutoff, expires)
        else:
            op = node.delete(key, now, cutoff)
        fut: asyncio.Future[OpResult] = self._loop.create_future()
        self._waiting[op] = fut
        self._pump()
        res = await fut
        self.counters[f"ops_{'get' if kind == GET else 'put' if kind == PUT else 'delete'}"] += 1
        if not res.ok:
            self.counters["ops_failed"] += 1
            raise error_for(res)
        if res.attempts > 1:
            self.counters["ops_retried"] += 1
        return res

    async def run_batch(
        self,
        ops: Sequence[tuple[int, bytes, bytes | None]],
        deadline: float | None = None,
        lifespans: Sequence[float | None] | None = None,
    ) -> list[OpResult]:
        """Run ``(kind, key, value)`` operations together; one :class:`OpResult` each, in order, failures included.

        All start in one step of the node. The whole batch is refused (:class:`GridUnavailable`) only when
        this member cannot take operations at all (not joined, leaving); a segment that is unavailable or an
        operation that times out fails that operation alone. Bad kinds, keys or values raise ValueError or
        TypeError before anything starts (:meth:`GridNode.start_batch` checks every operation first).
        ``lifespans`` (None: none) gives each PUT's lifespan in seconds (None: never expires), one per operation.
        """
        node = self._require_node()
        if node.leaving:
            raise GridLeaving("this member is leaving the grid; use another member")
        expiries = None
        if lifespans is not None:
            if len(lifespans) != len(ops):
                raise ValueError(f"lifespans: {len(lifespans)} for {len(ops)} operations")
            expiries = [self._expires(x) for x in lifespans]
        now = self._loop.time()
        ids = node.start_batch(ops, now, self._node_time(now, deadline), expiries)
        if not ids:
            return []
        fut: asyncio.Future[list[OpResult]] = self._loop.create_future()
        wait = BatchWait(ids, fut)
        self._in_batch.update(dict.fromkeys(ids, wait))
        self._pump()
        results: list[OpResult] = await fut
        # Counted per kind in one pass (a counter update per operation showed in profiles of batch writes),
        # with C-level passes over the columns where they say the same.
        kinds = Counter(map(_KIND_OF, results))
        counters = self.counters
        for kind, n in kinds.items():
            counters[f"ops_{KIND_NAMES[kind]}"] += n
        failed = list(map(_OK_OF, results)).count(False)
        if failed:
            counters["ops_failed"] += failed
            retried = sum(1 for res in results if res.ok and res.attempts > 1)
        else:
            retried = len(results) - list(map(_ATTEMPTS_OF, results)).count(1)
        if retried:
            counters["ops_retried"] += retried
        counters["batches"] += 1
        return results

    def versions_of(
        self, ops: Sequence[tuple[int, bytes, bytes | None]], results: Sequence[OpResult]
    ) -> list[int | None]:
        """For each successful get of ``ops`` that found a value, its version when this member holds the key's
        segment and still has that value (a client routes gets to a read owner, so it usually does); None
        otherwise. The node's answers carry values only, so the version comes from the local copy."""
        node = self.node
        store = node.store if node is not None else None
        t = node.topology if node is not None else None
        out: list[int | None] = []
        for (kind, key, _), res in zip(ops, results, strict=True):
            version = None
            if kind == GET and res.ok and res.value is not None and store is not None and t is not None:
                entry = store.get(segment_of(key, t.num_segments), key)
                if entry is not None and entry[1] == res.value:
                    version = entry[0]
            out.append(version)
        return out

    async def get_versioned(self, key: bytes, deadline: float | None = None) -> tuple[bytes | None, int]:
        """``(value, version)`` of ``key``: value None and version 0 when absent. The version is what an
        optimistic transaction passes as its read of the key."""
        res = await self._run(GET, key, None, deadline)
        return res.value, res.version
