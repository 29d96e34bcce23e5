"""Python clients of the grid's HTTP API: :class:`GridClient` (blocking) and :class:`AsyncGridClient` (asyncio).

The asyncio code (``_async/``) is the source; the blocking code (``_sync/``) is generated from it by
``scripts/unasync_client.py`` (CONTRIBUTING.md). Pure parts: ``_wire`` (paths, limits, answers), ``_routing``,
``_batch``, ``_txcore``; the two transports: ``_io_async`` (aiohttp), ``_io_sync`` (http.client). Errors:
:mod:`groupcluster.grid.errors`, one hierarchy with the members'.

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
(:func:`~..consistent_hash.segment_of`) and sends the request there; without a table (or an owner without a
known URL) it uses any member it knows.

**Retries** (the only ones; each refreshes the routing table first and prefers another member):

* the member cannot be reached or the connection breaks (refused, reset, timed out): it may have crashed
  or left; the endpoint is avoided for ``avoid_seconds``;
* ``503`` (member leaving, not joined yet, grid degraded) and ``504`` (the operation timed out inside the
  grid).

Without a routing table (none learnt yet) a call learns it before its first attempt.

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
never re-run on its own). The exceptions are the ones a member raises in-process for the same cause
(:mod:`groupcluster.grid.errors`): an abort because the grid was unavailable is a ``GridTxUnavailable``, one
that timed out a ``GridTxTimeout``, both ``GridTxAborted``. The only retry inside a transaction: a one-shot
commit refused with 503 (nothing of it ran) goes to another member. A commit is sent on a connection that was
used in the last ``IDLE_REFRESH_SECONDS`` or a fresh one, so the connection layer never sends it twice (both
clients). A plain PUT/DELETE answered 409 "locked" (a transaction holds the key) is retried like a 503.
"""

from __future__ import annotations

from ..errors import (
    GridBatchError,
    GridClientError,
    GridError,
    GridRequestError,
    GridTxAborted,
    GridTxConflict,
    GridTxError,
    GridTxTimeout,
    GridTxUnavailable,
    GridTxUnknownOutcome,
    GridUnavailable,
    GridUnavailableError,
)
from ..lifespan import MAX_LIFESPAN_SECONDS
from ._async.client import AsyncCacheClient, AsyncGridClient
from ._async.transaction import AsyncTransaction
from ._sync.client import CacheClient, GridClient
from ._sync.transaction import Transaction
from ._wire import (
    BATCH_BYTES,
    BATCH_KEY_LIMIT,
    DEADLINE_HEADER,
    DEFAULT_BATCH_SIZE,
    DEFAULT_CLOCK_SKEW,
    DEFAULT_REQUEST_TIMEOUT,
    DEFAULT_TIMEOUT,
    IDLE_REFRESH_SECONDS,
    JSON,
    MSGPACK,
    RETRYABLE_STATUS,
    TX_MODES,
    VALUE_LIMIT,
    VERSION_HEADER,
    key_path,
    normalize_endpoint,
)

__all__ = [
    "BATCH_BYTES",
    "BATCH_KEY_LIMIT",
    "DEADLINE_HEADER",
    "DEFAULT_BATCH_SIZE",
    "DEFAULT_CLOCK_SKEW",
    "DEFAULT_REQUEST_TIMEOUT",
    "DEFAULT_TIMEOUT",
    "IDLE_REFRESH_SECONDS",
    "JSON",
    "MAX_LIFESPAN_SECONDS",
    "MSGPACK",
    "RETRYABLE_STATUS",
    "TX_MODES",
    "VALUE_LIMIT",
    "VERSION_HEADER",
    "AsyncCacheClient",
    "AsyncGridClient",
    "AsyncTransaction",
    "CacheClient",
    "GridBatchError",
    "GridClient",
    "GridClientError",
    "GridError",
    "GridRequestError",
    "GridTxAborted",
    "GridTxConflict",
    "GridTxError",
    "GridTxTimeout",
    "GridTxUnavailable",
    "GridTxUnknownOutcome",
    "GridUnavailable",
    "GridUnavailableError",
    "Transaction",
    "key_path",
    "normalize_endpoint",
]
