"""The member's HTTP API (aiohttp): health, readiness, status, key/value, transactions, graceful leave, metrics.

=========================  ==============================================================================
``GET /healthz``           200 while the process and its event loop run
``GET /readyz``            200 when joined, holding a topology, not leaving and nothing of ours in transfer;
                           503 with the reasons otherwise
``GET /v1/status``         view, coordinator, topology id, phase, segments owned, rebalance progress, routing
``GET /v1/kv/{key}``       200 with the value as the body (``application/octet-stream``); 404 if absent
``PUT /v1/kv/{key}``       the body is the value; 200 once every owner holds it (acknowledged);
                           ``?lifespan=S``: the entry expires S seconds after the write (below)
``DELETE /v1/kv/{key}``    200 once every owner removed it (deleting an absent key is not an error)
``POST /v1/batch``         many get/put/delete operations in one request (msgpack or JSON); a result each;
                           a put may carry a lifespan (below)
``GET /v1/segments/{id}``  one page of the entries of a segment this member reads (``after``, ``limit``)
``GET /v1/changes/{id}``   one page of the change feed of a segment this member reads (``after``, ``limit``)
``POST /v1/tx``            a one-shot transaction: reads (key -> version), writes (key -> value or null), lock
``POST /v1/tx/begin``      an interactive transaction on this member; then ``/v1/tx/{id}/lock``, ``/commit``,
                           ``/rollback`` (POST)
``GET /v1/tx/in-doubt``    this member's in-doubt transactions; ``GET /v1/tx/{id}/report`` one's state here;
                           ``POST /v1/tx/{id}/resolve`` ``{"commit": bool}`` (all three need the admin token);
                           ``{"cluster": true, "commit": bool or null}`` resolves on every member from this one
``POST /v1/leave``         202: hand our segments to new owners, then leave the group and exit (below)
``POST /v1/force-available`` on the coordinator: leave degraded mode with the members present (operator's
                           override after members are known dead, not cut off; 409 on other members)
``GET /metrics``           Prometheus text format
``GET /v1/caches``         every cache of the member (``--cache``): name, mode, segments, owners, status
``/v1/caches/{cache}/...`` a named cache: ``GET`` its description and routing; ``kv/{key}``, ``batch`` and,
                           for distributed caches, ``tx``, ``tx/begin``, ``tx/{id}/...`` as above (404 for a
                           cache the member lacks, 409 for a transaction on another mode)
=========================  ==============================================================================

Keys are the URL path after ``/v1/kv/``, percent-decoded and UTF-8 encoded to bytes: 1 to
:data:`MAX_KEY_BYTES` bytes, no control characters. Values are raw bytes, 1 byte to the grid's value limit
(4 MiB by default). Every error is JSON ``{"error": "...", ...}``: 400 for a bad request, 404 for an
absent key or an unknown path, 405 for a wrong method, 413 for a value too large, 503 with a ``reason`` when
the grid refuses for now (degraded partition, not joined yet, member leaving; ``Retry-After`` says when to
try again, on any member), 504 when an operation timed out, 507 with ``reason`` ``full`` for a PUT that would
add a key to a primary at its ``max_entries`` bound, or grow its bytes past ``max_bytes`` (nothing written; not
retried by the clients).

**Leaving.** From the moment the member is asked to stop (``MemberContext.leaving``), new data requests
(key/value, batches, scans, change feed, ``/v1/tx`` and ``/v1/tx/begin``, the same under ``/v1/caches``) are
answered 503 ``{"error", "reason": "leaving"}`` with ``Retry-After`` and nothing runs; requests that go on
with a transaction begun here still run. Every answer then closes its connection. :func:`close_http` closes
the server so that every request it read is answered (docs/grid.md, "Leaving").

**Deadlines.** A request may carry ``X-Grid-Deadline``, the client's deadline for this attempt as a Unix time
in seconds (the clients send one with every request). A request read after it is answered 504 with ``reason``
``deadline`` and nothing done; an operation started before it sends no attempt after it and fails 504 then.
A malformed value is a 400. So a client that retries elsewhere after its deadline cannot see the first
attempt land after the retry (docs/grid.md, "Client deadlines").

**Batches** (``POST /v1/batch``): the body is ``{"ops": [[op, key, value?], ...]}`` with op ``"get"``,
``"put"`` or ``"delete"``, in msgpack (``Content-Type: application/msgpack``; keys and values are bytes) or
JSON (``application/json``; keys and values are base64 strings). At most :data:`MAX_BATCH_OPS` operations
and :data:`MAX_BATCH_BYTES` bytes. All operations start in one step of the grid node, so the commands for
one owner travel together. The answer, in the request's format, is ``{"topology_id": n, "results":
[{"status": 200, "value": ...}, ...]}`` in request order: per operation 200 (done; ``value`` for a get),
404 (get of an absent key), 503/504 with ``error`` (retry that operation), 507 (``full``, as above), 500 with
``error``. A malformed
body is a 400 naming the bad field (``ops[3][0]: unknown op 'pt'``), nothing of it runs.

**Lifespans** (entry expiry): ``PUT /v1/kv/{key}?lifespan=S`` (and ``/v1/caches/{cache}/kv/{key}``) writes an
entry that the grid removes, as an ordinary delete by the key's primary owner, once S seconds have passed. S
is a decimal number of seconds (``30``, ``0.5``, ``1e3``) or a duration with a unit (``250ms``, ``30s``,
``5m``, ``2h``; :func:`~...core.units.parse_duration`): finite, above 0 and at most :data:`MAX_LIFESPAN_SECONDS`
(10 years). In a batch a put takes it as a fourth element, ``["put", key, value, {"lifespan": S}]`` with S a
number (int or float). Anything else is a 400 naming ``lifespan`` and nothing is written: a malformed, zero,
negative or too large value, a lifespan on a GET or DELETE (or a batch get/delete), and any lifespan for an
invalidation cache (its copies are each member's own, with no owner to expire them). Transactions take none.

**Segment scan** (``GET /v1/segments/{id}?after=CURSOR&limit=N``): the live entries of a segment, in key
order, at most ``limit`` (default 1000, at most :data:`MAX_SCAN_LIMIT`) and about 4 MiB per page, as
``{"segment", "topology_id", "entries": [[key, value, version], ...], "next"}``: ``next`` is the cursor of
the following page (the last key, base64url) or null at the end. msgpack with ``Accept:
application/msgpack``, else JSON (base64 keys and values). Only a member that reads the segment in its
topology serves it; others answer 409 with ``owners`` (HTTP URLs of the members that do).

**Change feed** (``GET /v1/changes/{id}?after=VERSION&limit=N``): the writes (puts and deletes, every
overwrite) this member applied to a segment with versions above ``after``, in version order, up to a
*stable* point (no write at or below it can still arrive here), as ``{"segment", "topology_id", "covered",
"floor", "entries": [[version, key, value or null], ...], "upto", "more"}``. Continue with ``after=upto``.
``covered`` false: the member's log does not reach back to ``after`` (it starts at ``floor``: a new owner,
or a log truncated at :data:`~..runtime.DEFAULT_FEED_ENTRIES` entries or ``DEFAULT_FEED_BYTES``); read the
segment by scan instead.
Same formats, 409 and 503 answers as the segment scan.

Batch ``get`` results carry ``version`` (the version of the value returned). ``GET /v1/kv/{key}`` answers the
version in the ``X-Grid-Version`` header (0: absent), which an optimistic transaction passes back as its read.

**Transactions** (docs/grid-transactions.md, "Using transactions"): bodies in JSON (keys and values base64,
also as map keys) or msgpack, as for batches; a map key given twice is a 400. ``POST /v1/tx`` begins, locks
``lock`` (pessimistic), and commits ``writes`` after validating ``reads``: 200 ``{"tx", "committed": true,
"attempts"}`` in the request's format; 409 aborted (``reason`` ``conflict``, ``lock_timeout``,
``rolled_back``...), 503 unavailable and 504 timed out (rolled back too), 500 with ``committed`` null when the
outcome is unknown; failures are JSON ``{"error", "tx", "committed", "reason"}``. An interactive transaction
(``/v1/tx/begin``) lives on the member that began it (elsewhere: 404 naming that) and is rolled back after
the grid's ``tx_timeout`` without a request. A plain PUT/DELETE of a key a transaction holds is 409
``{"reason": "locked"}``: nothing was written, try again.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hmac
import json
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from typing import TYPE_CHECKING, Any

import msgpack
from aiohttp import web
from aiohttp.web_protocol import RequestPayloadError

from ...sim.history import view_id_json
from ..caches import DEFAULT_CACHE, DISTRIBUTED, INVALIDATION, CacheSet, InvalidationRuntime, runtime_for
from ..invalidation import InvalidationNode
from ..lifespan import LIFESPAN_PARAM, check_lifespan, parse_lifespan
from ..messages import DEFAULT_LIMITS, DELETE, GET, PUT
from ..node import OpResult
from ..runtime import (
    GridError,
    GridFull,
    GridLeaving,
    GridLocked,
    GridNotOwner,
    GridRuntime,
    GridTimeout,
    GridTxBusy,
    GridTxError,
    GridTxNotFound,
    GridTxTimeout,
    GridTxUnavailable,
    GridTxUnknown,
    GridUnavailable,
)
from ..tx_messages import TxId

if TYPE_CHECKING:
    from ...runtime.channel import Channel

# A key travels in the URL: keep it well inside the request-line limit of servers and proxies (8 KiB).
MAX_KEY_BYTES = 4096
MAX_VALUE_BYTES = DEFAULT_LIMITS.max_value_bytes
# Keys in a batch travel in the body, so they may be any bytes up to the grid's own key limit.
MAX_BATCH_KEY_BYTES = DEFAULT_LIMITS.max_key_bytes
MAX_BATCH_OPS = 10_000
MAX_BATCH_BYTES = 32 * 1024 * 1024
MAX_SCAN_LIMIT = 10_000
DEFAULT_SCAN_LIMIT = 1000
SCAN_PAGE_BYTES = 4 * 1024 * 1024
RETRY_AFTER_SECONDS = "1"
MSGPACK_TYPES = frozenset({"application/msgpack", "application/x-msgpack", "application/vnd.msgpack"})
MSGPACK = "application/msgpack"
OP_KINDS = {"get": GET, "put": PUT, "delete": DELETE}
_NO_VALUE_KINDS = {"get": GET, "delete": DELETE}
# Keys one transaction may name (reads, writes and locks together): the grid's per-message limit (TxLimits).
MAX_TX_KEYS = 4096
MAX_VERSION = (1 << 63) - 1
TX_MODES = ("optimistic", "pessimistic")
VERSION_HEADER = "X-Grid-Version"
# The client's deadline for this attempt, a Unix time in seconds ("1764170000.250"): the member refuses to start
# the request after it, and operations started before it send no attempt after it (docs/grid.md, "Client
# deadlines"). The clients send it with every request.
DEADLINE_HEADER = "X-Grid-Deadline"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class MemberContext:
    """What the HTTP API reads from the running member (the channel appears once joined)."""

    cluster: str
    grid: GridRuntime | None
    request_leave: Callable[[], None]
    channel: Callable[[], Channel | None]
    # The default cache and the named ones (--cache); None when the member declares no named cache.
    caches: CacheSet | None = None
    started: float = field(default_factory=time.time)
    http_requests: dict[str, int] = field(default_factory=dict)
    # Bearer tokens: ``admin_token`` guards POST /v1/leave; ``kv_token`` guards the data endpoints (/v1/kv,
    # /v1/batch, /v1/segments, /v1/changes). None leaves them open. Probes, status and metrics stay open so
    # Kubernetes and Prometheus need no secret.
    admin_token: str | None = None
    kv_token: str | None = None
    # Set when the member begins to stop (before its grid hand-off): new data requests are refused with 503,
    # reason "leaving", and every answer closes its connection (see _leaving_middleware and close_http).
    leaving: bool = False


def json_error(status: int, message: str, **extra: Any) -> web.Response:
    headers = {"Retry-After": RETRY_AFTER_SECONDS} if status == 503 else None
    return web.json_response({"error": message, **extra}, status=status, headers=headers)


LEAVING_ERROR = "this member is leaving the grid: send the request to another member"


def unavailable(exc: GridError) -> web.Response:
    """The 503 for a grid that refuses for now: ``reason`` ``leaving`` when this member is leaving (the client
    goes to another member), else the refusal's text (degraded partition, not joined yet)."""
    return json_error(503, str(exc), reason="leaving" if isinstance(exc, GridLeaving) else str(exc))


@web.middleware
async def _errors_as_json(request: web.Request, handler: Handler) -> web.StreamResponse:
    """aiohttp answers unknown paths, wrong methods and oversized bodies in HTML; clients want JSON."""
    try:
        return await handler(request)
    except ConnectionResetError:
        # The client closed the connection while its body was still being read: nobody is left to answer.
        # An answer all the same (aiohttp drops it quietly); raised on, aiohttp logs a traceback at ERROR.
        return json_error(400, "request body: the connection was closed before the body arrived")
    except RequestPayloadError as exc:
        # The body could not be read as sent: a Content-Encoding that does not decode, a chunked body cut short.
        # The request is at fault, so the answer is a 400 that says why (aiohttp would answer 500).
        return json_error(400, f"request body: {_payload_error_text(exc)}")
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        if exc.status == 405:
            allowed = sorted(getattr(exc, "allowed_methods", ()) or ())
            return json_error(405, f"method {request.method} is not allowed on {request.path}", allowed=allowed)
        if exc.status == 404:
            return json_error(404, f"no such endpoint: {request.path}")
        if exc.status == 413:
            limit = (
                MAX_BATCH_BYTES
                if request.path.endswith("/batch")
                or (request.path.startswith(("/v1/tx", "/v1/caches/")) and "/tx" in request.path)
                else MAX_VALUE_BYTES
            )
            return json_error(413, f"request body too large (limit {limit} bytes)")
        return json_error(exc.status, exc.reason)


def _payload_error_text(exc: RequestPayloadError) -> str:
    """aiohttp's payload errors read '400, message:\n  <text>'; keep the text."""
    text = " ".join(str(exc).split())
    head, sep, rest = text.partition("message: ")
    if sep and head.rstrip(", ").isdigit():
        text = rest
    return text or "could not be read"


_DATA_PREFIXES = ("/v1/kv", "/v1/batch", "/v1/segments", "/v1/changes", "/v1/tx")


def _data_path(path: str) -> bool:
    """Paths guarded by the data token: the default cache's data endpoints and every named cache's
    (``/v1/caches/{cache}/kv|batch|tx...``; the listing and a cache's description stay open, like status)."""
    if path.startswith(_DATA_PREFIXES):
        return True
    return path.startswith("/v1/caches/") and path.count("/") >= 4


def _admin_path(path: str) -> bool:
    """Paths guarded by the admin token: leaving, forcing availability, in-doubt transactions."""
    if path in ("/v1/leave", "/v1/force-available", "/v1/tx/in-doubt"):
        return True
    return path.startswith("/v1/tx/") and path.endswith(("/resolve", "/report"))


def _refused_when_leaving(path: str) -> bool:
    """Data requests a leaving member refuses: everything that starts new work. Requests that go on with, or
    resolve, a transaction this member holds (``/v1/tx/{id}/lock|commit|rollback|resolve|report``, the
    in-doubt list) still run: that transaction lives here and ends here."""
    if not _data_path(path):
        return False
    rest = path
    if path.startswith("/v1/caches/"):
        parts = path.split("/", 4)  # "", "v1", "caches", name, rest
        rest = "/v1/" + parts[4] if len(parts) == 5 else path
    return not rest.startswith("/v1/tx/") or rest == "/v1/tx/begin"


def _leaving_middleware(ctx: MemberContext) -> Any:
    @web.middleware
    async def refuse_when_leaving(request: web.Request, handler: Handler) -> web.StreamResponse:
        """Once the member is leaving, new data requests get 503 with reason ``leaving`` and nothing runs: the
        clients retry on another member at once (a member still taking work would never drain)."""
        if ctx.leaving and ctx.grid is not None and _refused_when_leaving(request.path):
            ctx.http_requests["refused_leaving"] = ctx.http_requests.get("refused_leaving", 0) + 1
            extra: dict[str, Any] = {"committed": False, "tx": None} if "/tx" in request.path else {}
            return json_error(503, LEAVING_ERROR, reason="leaving", **extra)
        return await handler(request)

    return refuse_when_leaving


def _close_when_leaving(ctx: MemberContext) -> Any:
    @web.middleware
    async def close_when_leaving(request: web.Request, handler: Handler) -> web.StreamResponse:
        """Once the member is leaving, every answer closes its connection (``Connection: close``): by the time
        the member closes its HTTP server no client still sends on a kept-alive connection to it, and a
        client's next request finds the member gone (refused) instead of racing its close (close_http)."""
        resp = await handler(request)
        if ctx.leaving:
            resp.force_close()
        return resp

    return close_when_leaving


def parse_deadline(raw: str) -> float:
    """The value of an ``X-Grid-Deadline`` header as a Unix time; ValueError says what is wrong with it."""
    try:
        deadline = float(raw)
    except ValueError:
        deadline = math.nan
    if not math.isfinite(deadline) or deadline <= 0:
        shown = raw if len(raw) <= 40 else raw[:40] + "..."
        raise ValueError(f"{DEADLINE_HEADER}: expected a Unix time in seconds (e.g. 1764170000.25), got {shown!r}")
    return deadline


def _deadline_middleware(ctx: MemberContext) -> Any:
    @web.middleware
    async def check_deadline(request: web.Request, handler: Handler) -> web.StreamResponse:
        """Refuse a request whose client deadline passed before this member read it: the client has given up on
        it and may have retried elsewhere, so running it now could land a write over a later one (a member that
        was paused, or a request that waited long in a queue). Counted as ``deadline_expired``. Stores the
        deadline for the handlers as ``request["deadline"]``."""
        raw = request.headers.get(DEADLINE_HEADER)
        if raw is None:
            return await handler(request)
        try:
            deadline = parse_deadline(raw)
        except ValueError as exc:
            return json_error(400, str(exc))
        now = time.time()
        if now >= deadline:
            ctx.http_requests["deadline_expired"] = ctx.http_requests.get("deadline_expired", 0) + 1
            return json_error(
                504,
                f"{DEADLINE_HEADER}: the request's deadline passed {now - deadline:.3f} s before this member read "
                f"it (its clock reads {now:.3f}); nothing was done",
                reason="deadline",
            )
        request["deadline"] = deadline
        return await handler(request)

    return check_deadline


def _token_middleware(ctx: MemberContext) -> Any:
    @web.middleware
    async def check_token(request: web.Request, handler: Handler) -> web.StreamResponse:
        path = request.path
        if _admin_path(path):
            expected, what = ctx.admin_token, "the admin token (--admin-token-file)"
        elif _data_path(path):
            expected, what = ctx.kv_token, "the data token (--kv-token-file)"
        else:
            return await handler(request)
        if expected is not None:
            given = request.headers.get("Authorization", "")
            scheme, _, token = given.partition(" ")
            # Constant-time comparison: the time a wrong token takes says nothing about the right one.
            if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), expected.encode()):
                problem = "missing" if not given else "wrong"
                resp = json_error(401, f"{problem} bearer token: {path} needs 'Authorization: Bearer' with {what}")
                resp.headers["WWW-Authenticate"] = 'Bearer realm="groupcluster"'
                return resp
        return await handler(request)

    return check_token


def build_app(ctx: MemberContext) -> web.Application:
    # The largest body any route takes (a batch); the key/value route checks its own, smaller limit first.
    middlewares = [
        _close_when_leaving(ctx),
        _errors_as_json,
        _token_middleware(ctx),
        _leaving_middleware(ctx),
        _deadline_middleware(ctx),
    ]
    app = web.Application(middlewares=middlewares, client_max_size=MAX_BATCH_BYTES + 1024)
    api = _Api(ctx)
    app.router.add_get("/healthz", api.healthz)
    app.router.add_get("/readyz", api.readyz)
    app.router.add_get("/v1/status", api.status)
    app.router.add_get("/metrics", api.metrics)
    app.router.add_post("/v1/leave", api.leave)
    app.router.add_post("/v1/capacity", api.capacity)
    app.router.add_post("/v1/caches/{cache}/capacity", api.capacity)
    app.router.add_post("/v1/force-available", api.force_available)
    app.router.add_post("/v1/batch", api.batch)
    app.router.add_post("/v1/tx", api.tx)
    app.router.add_post("/v1/tx/begin", api.tx_begin)
    app.router.add_get("/v1/tx/in-doubt", api.tx_in_doubt)
    # A transaction id holds "/" and "#" ("host:port#incarnation/seq"; clients percent-encode them), so the id
    # is everything between /v1/tx/ and the action.
    app.router.add_post("/v1/tx/{tx:.+}/{action:lock|commit|rollback|resolve}", api.tx_action)
    app.router.add_get("/v1/tx/{tx:.+}/report", api.tx_report)
    app.router.add_get("/v1/segments/{segment}", api.segment)
    app.router.add_get("/v1/changes/{segment}", api.changes)
    # Named caches (grid/caches.py): the same key/value, batch and transaction forms under /v1/caches/{cache}.
    app.router.add_get("/v1/caches", api.caches)
    app.router.add_get("/v1/caches/{cache}", api.cache)
    app.router.add_post("/v1/caches/{cache}/batch", api.batch)
    app.router.add_post("/v1/caches/{cache}/tx", api.tx)
    app.router.add_post("/v1/caches/{cache}/tx/begin", api.tx_begin)
    app.router.add_post("/v1/caches/{cache}/tx/{tx:.+}/{action:lock|commit|rollback}", api.tx_action)
    # ``{key:.*}`` also matches an empty key and keys with "/", so both get a precise 400 rather than a 404.
    for method in ("GET", "PUT", "DELETE"):
        app.router.add_route(method, "/v1/kv/{key:.*}", api.kv)
        app.router.add_route(method, "/v1/kv", api.kv_missing_key)
        app.router.add_route(method, "/v1/caches/{cache}/kv/{key:.*}", api.kv)
    return app


# A connection waiting for its next request this long is closed while the server closes; a client that has just
# connected gets that long to send its request (which is then answered) before its connection goes.
CLOSE_IDLE_AFTER = 0.1
# What aiohttp's cleanup may still wait for a request that close_http's own wait gave up on (then cancelled).
SHUTDOWN_TIMEOUT = 1.0


def _waiting_for_request(conn: Any) -> bool:
    """True when ``conn`` has no request being read, queued or handled: it waits for the next one. aiohttp's own
    test before it closes an idle kept-alive connection (``RequestHandler._process_keepalive``); a request whose
    first bytes arrive ends the wait at once, on the same loop step. False when this aiohttp has no such field:
    the connection is then left to aiohttp's cleanup."""
    waiter = getattr(conn, "_waiter", None)
    return waiter is not None and not waiter.done()


async def close_http(runner: web.AppRunner, ctx: MemberContext | None, timeout: float) -> bool:
    """Close the member's HTTP server so that every request it read is answered: stop listening, let each
    connection finish its request (its answer closes it, ``ctx.leaving``), close the connections that wait for a
    next request, and only then run aiohttp's cleanup. True when every connection ended within ``timeout``.

    aiohttp's cleanup alone is not enough: it marks every connection as closing and from then on drops the bytes
    that arrive on it, the rest of a body included, so a PUT whose headers came just before and whose body just
    after waits for that body until the client gives up, and the cleanup waits for that request (up to its
    shutdown timeout, 60 s by default); then aiohttp logs the handler's "Connection lost" with a traceback."""
    if ctx is not None:
        ctx.leaving = True
    for site in list(runner.sites):
        await site.stop()
    server = runner.server
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    idle_since: dict[Any, float] = {}
    live: list[Any] = []
    while server is not None:
        now = loop.time()
        live = [c for c in server.connections if c.transport is not None]
        if not live or now >= deadline:
            break
        for conn in live:
            if not _waiting_for_request(conn):
                idle_since.pop(conn, None)
            elif now - idle_since.setdefault(conn, now) >= CLOSE_IDLE_AFTER:
                conn.force_close()
        await asyncio.sleep(0.01)
    await runner.cleanup()
    return not live


def _default_only(grid: GridRuntime) -> dict[str, Any]:
    """``/v1/caches`` entry of the default cache on a member without named caches."""
    t = grid.node.topology if grid.node is not None else None
    return {
        "name": DEFAULT_CACHE,
        "mode": DISTRIBUTED,
        "ready": grid.ready,
        "not_ready": grid.not_ready_reasons(),
        "num_segments": t.num_segments if t is not None else grid.config.num_segments,
        "num_owners": t.current.num_owners if t is not None else grid.config.num_owners,
        "topology_id": t.topology_id if t is not None else None,
        "entries": len(grid.node.store) if grid.node is not None and grid.node.store is not None else 0,
        "mode_mismatch": {},
    }


def parse_key(raw: str) -> bytes:
    """The key bytes of a decoded URL path segment, or ValueError saying what is wrong with it."""
    if not raw:
        raise ValueError("missing key: use /v1/kv/{key}")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in raw):
        raise ValueError("bad key: control characters are not allowed")
    try:
        key = raw.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("bad key: not valid UTF-8") from None
    if len(key) > MAX_KEY_BYTES:
        raise ValueError(f"bad key: {len(key)} bytes exceed the limit of {MAX_KEY_BYTES}")
    return key


class BadBatch(ValueError):
    """A malformed batch body; the message names the field."""


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _field_bytes(value: Any, where: str, binary: bool) -> bytes:
    """A key or value from a decoded body: raw bytes in msgpack, a base64 string in JSON."""
    if binary:
        if type(value) is not bytes:
            raise BadBatch(f"{where}: expected bytes (msgpack bin), got {type(value).__name__}")
        return value
    if type(value) is not str:
        raise BadBatch(f"{where}: expected a base64 string, got {type(value).__name__}")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise BadBatch(f"{where}: not valid base64") from None


def _batch_lifespan(options: Any, where: str) -> float:
    """The lifespan of a batch put from its options map (``{"lifespan": seconds}``), or :class:`BadBatch`."""
    if not isinstance(options, dict):
        raise BadBatch(f'{where}: expected a map {{"lifespan": seconds}}, got {type(options).__name__}')
    unknown = sorted(str(k) for k in options if k != LIFESPAN_PARAM)
    if unknown:
        raise BadBatch(f'{where}: unknown field(s) {", ".join(unknown)} (only "lifespan")')
    if LIFESPAN_PARAM not in options:
        raise BadBatch(f'{where}: missing "lifespan" (leave the map out for an entry that never expires)')
    seconds = options[LIFESPAN_PARAM]
    if type(seconds) not in (int, float):
        raise BadBatch(f"{where}.lifespan: expected a number of seconds, got {type(seconds).__name__}")
    try:
        return check_lifespan(seconds, f"{where}.lifespan")
    except ValueError as exc:
        raise BadBatch(str(exc)) from None


def parse_batch(
    doc: Any, binary: bool, lifespans: list[float | None] | None = None
) -> list[tuple[int, bytes, bytes | None]]:
    """``(kind, key, value)`` for every operation of a decoded batch body, or :class:`BadBatch`.

    A put may carry a fourth element ``{"lifespan": seconds}``. ``lifespans`` receives one entry per operation
    (seconds, or None for no lifespan) when at least one put carries one, and stays empty otherwise; without
    that list a lifespan is refused (:class:`BadBatch`)."""
    if not isinstance(doc, dict) or "ops" not in doc:
        raise BadBatch('body: expected a map {"ops": [[op, key, value?], ...]}')
    unknown = sorted(str(k) for k in doc if k != "ops")
    if unknown:
        raise BadBatch(f'body: unknown field(s) {", ".join(unknown)} (only "ops")')
    ops = doc["ops"]
    if not isinstance(ops, list):
        raise BadBatch(f"ops: expected a list, got {type(ops).__name__}")
    if not ops:
        raise BadBatch("ops: empty (give at least one operation)")
    if len(ops) > MAX_BATCH_OPS:
        raise BadBatch(f"ops: {len(ops)} operations exceed the limit of {MAX_BATCH_OPS}")
    if binary:
        fast = _parse_uniform(ops)
        if fast is not None:
            return fast
    out: list[tuple[int, bytes, bytes | None]] = []
    # Filled from the first put with a lifespan on (None for the operations before it): a batch without any
    # builds no list.
    spans: list[float | None] | None = None
    for i, op in enumerate(ops):
        if not isinstance(op, list) or not 2 <= len(op) <= 4:
            raise BadBatch(
                f'ops[{i}]: expected [op, key], ["put", key, value] or ["put", key, value, {{"lifespan": s}}]'
            )
        kind = OP_KINDS.get(op[0]) if isinstance(op[0], str) else None
        if kind is None:
            raise BadBatch(f"ops[{i}][0]: unknown op {op[0]!r} (expected get, put or delete)")
        key = _field_bytes(op[1], f"ops[{i}][1] (key)", binary)
        if not 1 <= len(key) <= MAX_BATCH_KEY_BYTES:
            raise BadBatch(f"ops[{i}][1] (key): {len(key)} bytes is outside [1, {MAX_BATCH_KEY_BYTES}]")
        value = None
        if kind == PUT:
            if len(op) < 3:
                raise BadBatch(f'ops[{i}]: put needs a value: ["put", key, value]')
            value = _field_bytes(op[2], f"ops[{i}][2] (value)", binary)
            if len(value) > MAX_VALUE_BYTES:
                raise BadBatch(f"ops[{i}][2] (value): {len(value)} bytes exceed the limit of {MAX_VALUE_BYTES}")
            if len(op) == 4:
                if lifespans is None:
                    raise BadBatch(f"ops[{i}][3].lifespan: lifespans are not accepted here")
                if spans is None:
                    spans = [None] * i
                spans.append(_batch_lifespan(op[3], f"ops[{i}][3]"))
            elif spans is not None:
                spans.append(None)
        else:
            if len(op) != 2:
                if isinstance(op[-1], dict) and LIFESPAN_PARAM in op[-1]:
                    raise BadBatch(f"ops[{i}]: {op[0]} takes no lifespan (only a put does)")
                raise BadBatch(f"ops[{i}]: {op[0]} takes no value: [{op[0]!r}, key]")
            if spans is not None:
                spans.append(None)
        out.append((kind, key, value))
    if spans is not None and lifespans is not None:
        lifespans.extend(spans)
    return out


_LIST_TYPE = {list}
_BYTES_TYPE = {bytes}
_STR_TYPE = {str}
_PUT_KIND = {"put"}
_LEN_3 = {3}
_LEN_2 = {2}


def _parse_uniform(ops: list[Any]) -> list[tuple[int, bytes, bytes | None]] | None:
    """:func:`parse_batch` of a msgpack batch of only puts, or of only gets and deletes, with every check done
    per column (C-level ``map``/``set``/``min``/``max``) instead of per operation: what clients send (the
    Spark writer sends millions of puts). None when anything is off or mixed; the per-operation loop then
    runs and names the first bad operation."""
    if set(map(type, ops)) != _LIST_TYPE:
        return None
    lens = set(map(len, ops))
    if lens == _LEN_3:
        kinds, keys, values = zip(*ops, strict=True)
        if (
            set(map(type, kinds)) != _STR_TYPE  # first: set() of unhashable names would raise
            or set(kinds) != _PUT_KIND
            or set(map(type, keys)) != _BYTES_TYPE
            or set(map(type, values)) != _BYTES_TYPE
            or max(map(len, values)) > MAX_VALUE_BYTES
        ):
            return None
        out: list[tuple[int, bytes, bytes | None]] = list(zip(repeat(PUT), keys, values))
    elif lens == _LEN_2:
        names, keys = zip(*ops, strict=True)
        if (
            set(map(type, names)) != _STR_TYPE
            or not set(names) <= _NO_VALUE_KINDS.keys()
            or set(map(type, keys)) != _BYTES_TYPE
        ):
            return None
        out = list(zip(map(_NO_VALUE_KINDS.__getitem__, names), keys, repeat(None)))
    else:
        return None
    if min(map(len, keys)) < 1 or max(map(len, keys)) > MAX_BATCH_KEY_BYTES:
        return None
    return out


@dataclass(frozen=True, slots=True)
class TxRequest:
    """A parsed transaction body: ``writes`` (value None deletes), ``reads`` (key -> version read, 0 = absent),
    ``lock`` (keys to lock first; pessimistic only) and ``mode`` (None: the grid's default)."""

    mode: str | None
    reads: dict[bytes, int]
    writes: dict[bytes, bytes | None]
    lock: tuple[bytes, ...]


def _tx_key(value: Any, where: str, binary: bool) -> bytes:
    key = _field_bytes(value, where, binary)
    if not 1 <= len(key) <= MAX_BATCH_KEY_BYTES:
        raise BadBatch(f"{where}: {len(key)} bytes is outside [1, {MAX_BATCH_KEY_BYTES}]")
    return key


def _key_label(raw: Any) -> str:
    """A map key as it appears in an error message (shortened)."""
    text = repr(raw)
    return text if len(text) <= 40 else text[:37] + "..."


def _tx_map(doc: dict[str, Any], name: str) -> dict[Any, Any]:
    value = doc.get(name, {})
    if value is None:
        return {}
    if not isinstance(value, dict):
        kind = "{key: version}" if name == "reads" else "{key: value or null}"
        raise BadBatch(f"{name}: expected a map {kind}, got {type(value).__name__}")
    if len(value) > MAX_TX_KEYS:
        raise BadBatch(f"{name}: {len(value)} keys exceed the limit of {MAX_TX_KEYS}")
    return value


def parse_mode(doc: dict[str, Any]) -> str | None:
    mode = doc.get("mode")
    if mode is None:
        return None
    if not isinstance(mode, str) or mode not in TX_MODES:
        raise BadBatch(f"mode: expected {' or '.join(repr(m) for m in TX_MODES)}, got {mode!r}")
    return mode


def _check_fields(doc: Any, allowed: tuple[str, ...], shape: str) -> dict[str, Any]:
    if not isinstance(doc, dict):
        raise BadBatch(f"body: expected a map {shape}, got {type(doc).__name__}")
    unknown = sorted(str(k) for k in doc if k not in allowed)
    if unknown:
        raise BadBatch(f"body: unknown field(s) {', '.join(unknown)} (expected {', '.join(allowed)})")
    return doc


def parse_tx(doc: Any, binary: bool, *, interactive: bool = False) -> TxRequest:
    """The transaction in a decoded ``POST /v1/tx`` body (``interactive``: a ``/v1/tx/{id}/commit`` body, which
    takes no ``mode`` or ``lock``), or :class:`BadBatch` naming the field. Keys are bytes in msgpack and base64
    strings in JSON (map keys too)."""
    allowed = ("reads", "writes") if interactive else ("mode", "reads", "writes", "lock")
    doc = _check_fields(doc, allowed, '{"reads": {key: version}, "writes": {key: value or null}}')
    mode = None if interactive else parse_mode(doc)
    reads: dict[bytes, int] = {}
    for raw, version in _tx_map(doc, "reads").items():
        where = f"reads[{_key_label(raw)}]"
        key = _tx_key(raw, f"{where} (key)", binary)
        if type(version) is not int or not 0 <= version <= MAX_VERSION:
            raise BadBatch(f"{where}: expected a version (an integer 0 to 2^63-1; 0 = read as absent), got {version!r}")
        if key in reads:
            raise BadBatch(f"{where}: the key is given twice")
        reads[key] = version
    writes: dict[bytes, bytes | None] = {}
    for raw, value in _tx_map(doc, "writes").items():
        where = f"writes[{_key_label(raw)}]"
        key = _tx_key(raw, f"{where} (key)", binary)
        if key in writes:
            raise BadBatch(f"{where}: the key is given twice")
        if value is None:
            writes[key] = None
            continue
        data = _field_bytes(value, f"{where} (value)", binary)
        if len(data) > MAX_VALUE_BYTES:
            raise BadBatch(f"{where} (value): {len(data)} bytes exceed the limit of {MAX_VALUE_BYTES}")
        writes[key] = data
    lock: tuple[bytes, ...] = ()
    if not interactive:
        lock = parse_keys(doc.get("lock", []), "lock", binary)
        if lock:
            if mode == "optimistic":
                raise BadBatch('lock: an optimistic transaction locks nothing ahead (give "mode": "pessimistic")')
            mode = "pessimistic"
    if not writes and not reads and not lock and not interactive:
        raise BadBatch('body: an empty transaction (give "writes", "reads" or "lock")')
    if len(reads.keys() | writes.keys() | set(lock)) > MAX_TX_KEYS:
        raise BadBatch(f"body: the transaction names more than {MAX_TX_KEYS} distinct keys")
    return TxRequest(mode, reads, writes, lock)


def parse_keys(value: Any, name: str, binary: bool) -> tuple[bytes, ...]:
    """A list of keys (``lock``, ``keys``): at least one when given, no duplicates."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise BadBatch(f"{name}: expected a list of keys, got {type(value).__name__}")
    if len(value) > MAX_TX_KEYS:
        raise BadBatch(f"{name}: {len(value)} keys exceed the limit of {MAX_TX_KEYS}")
    keys: list[bytes] = []
    seen: set[bytes] = set()
    for i, raw in enumerate(value):
        key = _tx_key(raw, f"{name}[{i}]", binary)
        if key in seen:
            raise BadBatch(f"{name}[{i}]: the key is given twice")
        seen.add(key)
        keys.append(key)
    return tuple(keys)


def parse_tx_begin(doc: Any) -> str | None:
    """The mode of a ``POST /v1/tx/begin`` body (None for an empty body: the grid's default)."""
    if doc is None:
        return None
    return parse_mode(_check_fields(doc, ("mode",), '{"mode": "optimistic" or "pessimistic"}'))


def parse_tx_lock(doc: Any, binary: bool) -> tuple[bytes, ...]:
    doc = _check_fields(doc, ("keys",), '{"keys": [key, ...]}')
    if "keys" not in doc:
        raise BadBatch('keys: missing (give {"keys": [key, ...]})')
    keys = parse_keys(doc["keys"], "keys", binary)
    if not keys:
        raise BadBatch("keys: empty (give at least one key)")
    return keys


def parse_tx_resolve(doc: Any, binary: bool) -> tuple[bool | None, dict[bytes, int], bool]:
    """``{"commit": bool, "versions": {key: version}}`` (versions optional: other members' stamped versions,
    which a commit may need), or ``{"cluster": true, "commit": bool or null}`` (resolve on every member from
    this one; null: the grid's own rule decides) -> (commit, versions, cluster)."""
    doc = _check_fields(doc, ("commit", "versions", "cluster"), '{"commit": true or false}')
    cluster = doc.get("cluster", False)
    if type(cluster) is not bool:
        raise BadBatch(f"cluster: expected true (resolve on every member from this one) or false, got {cluster!r}")
    commit = doc.get("commit")
    if cluster and "versions" in doc:
        raise BadBatch("versions: not with cluster (the member collects every member's versions itself)")
    if cluster and commit is None:
        return None, {}, True
    if type(commit) is not bool:
        also = ", or null with cluster" if cluster else ""
        raise BadBatch(f"commit: expected true (commit) or false (roll back){also}, got {commit!r}")
    versions: dict[bytes, int] = {}
    for raw, version in _tx_map(doc, "versions").items():
        where = f"versions[{_key_label(raw)}]"
        key = _tx_key(raw, f"{where} (key)", binary)
        if type(version) is not int or not 1 <= version <= MAX_VERSION:
            raise BadBatch(f"{where}: expected a version (an integer 1 to 2^63-1), got {version!r}")
        versions[key] = version
    return commit, versions, cluster


def parse_tx_id(text: str) -> TxId:
    """A transaction id from a URL (``host:port#incarnation/seq``), or :class:`BadBatch`."""
    try:
        return TxId.parse(text)
    except (ValueError, TypeError) as exc:
        raise BadBatch(f"transaction id {text[:80]!r}: {exc} (ids look like 127.0.0.1:7800#123/4)") from None


def _no_duplicates(pairs: list[tuple[Any, Any]]) -> dict[Any, Any]:
    out: dict[Any, Any] = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"the map key {_key_label(k)} is given twice")
        out[k] = v
    return out


def _unpack_body(raw: bytes, pairs_hook: Callable[[list[tuple[Any, Any]]], Any] | None = None) -> Any:
    """A msgpack batch body with every length bounded (as :func:`~...core.wire.unpack_bounded` does for peers,
    but a map is allowed at the top). Arrays get twice the operation limit, so a list just over the limit
    still decodes and :func:`parse_batch` says which limit it broke."""
    return msgpack.unpackb(
        raw,
        raw=False,
        strict_map_key=True,
        max_bin_len=MAX_VALUE_BYTES + MAX_BATCH_KEY_BYTES,
        max_str_len=MAX_BATCH_KEY_BYTES,
        max_array_len=2 * MAX_BATCH_OPS,
        # A transaction's reads and writes are maps of keys; a batch body is a map of one field.
        max_map_len=2 * MAX_TX_KEYS if pairs_hook is not None else 8,
        max_ext_len=0,
        object_pairs_hook=pairs_hook,
    )


_OK_DOC: dict[str, Any] = {"status": 200}  # a write's answer in a batch; shared, so never changed


def result_doc(res: OpResult, binary: bool, version: int | None = None) -> dict[str, Any]:
    """One operation's entry in a batch answer (``version``: of a get's value, when known)."""
    if res.ok:
        if res.kind == GET:
            if res.value is None:
                return {"status": 404}
            doc: dict[str, Any] = {"status": 200, "value": res.value if binary else _b64(res.value)}
            if version is not None:
                doc["version"] = version
            return doc
        return {"status": 200}
    if res.reason == "locked":
        return {"status": 409, "error": res.error, "reason": "locked"}
    if res.reason == "full":
        return {"status": 507, "error": res.error, "reason": "full"}
    if "unavailable" in res.error:
        return {"status": 503, "error": res.error}
    if "timed out" in res.error:
        return {"status": 504, "error": res.error}
    return {"status": 500, "error": res.error or "operation failed"}


def committed_doc(tx: TxId, res: OpResult) -> dict[str, Any]:
    doc: dict[str, Any] = {"tx": str(tx), "committed": True, "attempts": res.attempts}
    if res.reason:
        doc["reason"] = res.reason  # e.g. "mixed": committed, but a participant had been resolved the other way
    return doc


def tx_failure(exc: GridError) -> web.Response:
    """The answer for a transaction that did not commit: 409 aborted (conflict, lock timeout, rolled back),
    503 unavailable, 504 timed out (both rolled back: safe to run again), 404 unknown interactive transaction,
    500 outcome unknown. Always JSON ``{"error", "tx", "committed", "reason"}``."""
    tx = getattr(exc, "tx", None)
    reason = getattr(exc, "reason", None)
    committed: bool | None = False
    if isinstance(exc, GridTxNotFound):
        status = 404
    elif isinstance(exc, GridTxBusy):
        status = 409
    elif isinstance(exc, GridTxUnknown):
        status, committed = 500, None
    elif isinstance(exc, GridLeaving):
        status, reason = 503, "leaving"
    elif isinstance(exc, GridTxUnavailable | GridUnavailable):
        status, reason = 503, "unavailable"
    elif isinstance(exc, GridTxTimeout | GridTimeout):
        status, reason = 504, "timeout"
    elif isinstance(exc, GridTxError):
        status = 409
    else:
        status = 500
    return json_error(
        status, str(exc), tx=str(tx) if tx is not None else None, committed=committed, reason=reason or "error"
    )


def _packed(doc: dict[str, Any], binary: bool, status: int = 200) -> web.Response:
    if binary:
        return web.Response(body=msgpack.packb(doc, use_bin_type=True), status=status, content_type=MSGPACK)
    return web.json_response(doc, status=status)


_B64URL = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"


def _decode_cursor(text: str) -> bytes:
    # The cursor is base64url without padding; the decoder silently skips foreign characters, so check first.
    bad = ValueError("after: not a cursor from a previous page (base64url)")
    if not text or text.strip(_B64URL):
        raise bad
    try:
        key = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        raise bad from None
    if not key:
        raise bad
    return key


def encode_cursor(key: bytes) -> str:
    return base64.urlsafe_b64encode(key).decode("ascii").rstrip("=")


def _no_lifespan_here(request: web.Request, where: str = LIFESPAN_PARAM) -> web.Response:
    """The 400 for a lifespan on an invalidation cache: each member holds its own copies, so no owner could
    expire an entry everywhere."""
    name = request.match_info.get("cache")
    return json_error(
        400,
        f"{where}: lifespans are not supported for invalidation caches (cache {name!r} is one); nothing was written",
        cache=name,
    )


class _Api:
    def __init__(self, ctx: MemberContext) -> None:
        self.ctx = ctx

    def _count(self, name: str) -> None:
        self.ctx.http_requests[name] = self.ctx.http_requests.get(name, 0) + 1

    def _runtime(self, request: web.Request, *, tx: bool = False) -> Any:
        """The cache a data request is for (``/v1/caches/{cache}/...``; the default cache otherwise), or the
        error response: 404 without a grid or for a cache this member does not have, 409 for a transaction on a
        cache that is not distributed."""
        name = request.match_info.get("cache")
        grid = self.ctx.grid
        if grid is None:
            return json_error(404, "this member runs no data grid (start it with --grid)")
        if name is None:
            return grid
        rt = runtime_for(self.ctx.caches, grid, name)
        if rt is None:
            known = self.ctx.caches.names() if self.ctx.caches is not None else [DEFAULT_CACHE]
            return json_error(
                404, f"no cache named {name!r} on this member (its caches: {', '.join(known)})", cache=name
            )
        mode = self.ctx.caches.mode_of(name) if self.ctx.caches is not None else DISTRIBUTED
        if tx and mode != DISTRIBUTED:
            return json_error(
                409,
                f"cache {name!r} is {mode}: transactions run on distributed caches only (a {mode} cache has "
                + (
                    "no owners to lock on: each member holds its own copies)"
                    if mode == INVALIDATION
                    else "its own write path to every member; use single writes or a distributed cache)"
                ),
                cache=name,
                reason="mode",
            )
        return rt

    async def caches(self, request: web.Request) -> web.Response:
        """``GET /v1/caches``: every cache of this member with its mode, segments, owners and status."""
        if self.ctx.grid is None:
            return json_error(404, "this member runs no data grid (start it with --grid)")
        if self.ctx.caches is None:
            return web.json_response({"caches": [_default_only(self.ctx.grid)], "unknown_payloads": {}})
        return web.json_response(self.ctx.caches.listing())

    async def cache(self, request: web.Request) -> web.Response:
        """``GET /v1/caches/{cache}``: one cache's description and its routing table (clients route with it)."""
        rt = self._runtime(request)
        if isinstance(rt, web.Response):
            return rt
        name = request.match_info["cache"]
        caches = self.ctx.caches
        doc = caches.describe(name) if caches is not None else _default_only(rt)
        return web.json_response({**(doc or {}), "routing": rt.routing()})

    async def healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"ok": True, "uptime_seconds": round(time.time() - self.ctx.started, 3)})

    async def readyz(self, request: web.Request) -> web.Response:
        ch = self.ctx.channel()
        grid = self.ctx.grid
        if ch is None or not ch.joined:
            reasons = ["not joined to the group yet"]
        elif grid is None:
            reasons = ["leaving the group"] if ch.leaving else []
        else:
            reasons = (self.ctx.caches or grid).not_ready_reasons()
        if reasons:
            return web.json_response({"ready": False, "reasons": reasons}, status=503)
        return web.json_response({"ready": True})

    async def status(self, request: web.Request) -> web.Response:
        ch = self.ctx.channel()
        grid = self.ctx.grid
        view = ch.view if ch is not None else None
        body: dict[str, Any] = {
            "cluster": self.ctx.cluster,
            "address": str(ch.address) if ch is not None else None,
            "joined": ch is not None and ch.joined,
            "view": None
            if view is None
            else {"id": view_id_json(view.view_id), "members": [str(m) for m in view.members]},
            "coordinator": str(view.coordinator) if view is not None else None,
            # Every view after a member's first follows a flush that blocked it (on the flushed presets): the
            # two counts tell whether this member's view changes were flushed.
            "views_installed": ch.views_installed if ch is not None else 0,
            "flushed_view_changes": ch.metrics().get("flush.unblocked", 0) if ch is not None else 0,
            "grid": None,
            "routing": None,
            # This member's clock (Unix time): clients compare it with theirs, since deadlines assume the two
            # agree within the client's clock_skew.
            "clock": time.time(),
        }
        if grid is not None and grid.node is not None:
            st = grid.status()
            t = st.get("topology") or {}
            body["grid"] = {
                "topology_id": t.get("topology_id"),
                "rebalance_id": t.get("rebalance_id"),
                "phase": t.get("phase"),
                "availability": t.get("availability"),
                "topology_installed_at": st.get("topology_installed_at"),
                "capacity": st.get("capacity"),
                "segments_owned": st.get("segments_owned", 0),
                "segments_primary": st.get("segments_primary", 0),
                "rebalance": st.get("rebalance"),
                "store": st.get("store"),
                "leaving": st.get("leaving"),
                "ready_to_leave": st.get("ready_to_leave"),
                "ready": grid.ready,
                "endpoints": st.get("endpoints"),
                "transactions": st.get("transactions"),
                "persistence": st.get("persistence"),
            }
            body["routing"] = grid.routing()
        return web.json_response(body)

    async def force_available(self, request: web.Request) -> web.Response:
        self._count("force_available")
        grid = self.ctx.grid
        if grid is None:
            return json_error(404, "this member runs no data grid (start it with --grid)")
        ch = self.ctx.channel()
        if ch is None or not ch.joined or grid.node is None:
            return json_error(409, "not joined to the group yet")
        before = (grid.status().get("topology") or {}).get("availability")
        if not grid.force_available():
            view = ch.view
            return json_error(
                409,
                "only the coordinator can force availability: ask it",
                coordinator=str(view.coordinator) if view is not None else None,
            )
        return web.json_response(
            {
                "forced": before != "AVAILABLE",
                "availability_before": before,
                "detail": "segments whose owners are all gone start empty; the others keep their data",
            }
        )

    async def leave(self, request: web.Request) -> web.Response:
        self._count("leave")
        ch = self.ctx.channel()
        if ch is None or not ch.joined:
            return json_error(409, "not joined to the group yet: nothing to leave")
        self.ctx.request_leave()
        return web.json_response(
            {"leaving": True, "detail": "handing segments to new owners; the member leaves the group after"},
            status=202,
        )

    async def capacity(self, request: web.Request) -> web.Response:
        """``POST /v1/capacity {"capacity": c}``: this member's new capacity factor (0 to 1000000; 0 owns no
        segments). 202: the coordinator rebalances to it (docs/grid.md, "Capacity")."""
        self._count("capacity")
        grid = self._runtime(request)
        if isinstance(grid, web.Response):
            return grid
        if not hasattr(grid, "set_capacity"):
            name = request.match_info.get("cache")
            return json_error(409, f"cache {name!r} is an invalidation cache: its members own no segments")
        parsed = await self._body(request, shape='{"capacity": c}')
        if isinstance(parsed, web.Response):
            return parsed
        doc, _ = parsed
        if not isinstance(doc, dict) or set(doc) != {"capacity"}:
            return json_error(400, 'body: expected {"capacity": c} and nothing else')
        value = doc["capacity"]
        try:
            grid.set_capacity(value)  # checks the value (type included): a ValueError names what is wrong
        except ValueError as exc:
            return json_error(400, str(exc))
        except GridUnavailable as exc:
            return json_error(409, str(exc))
        return web.json_response(
            {"capacity": float(value), "detail": "the coordinator rebalances the segments to the new capacity"},
            status=202,
        )

    async def kv_missing_key(self, request: web.Request) -> web.Response:
        return json_error(400, "missing key: use /v1/kv/{key}")

    async def kv(self, request: web.Request) -> web.Response:
        self._count(request.method.lower())
        try:
            key = parse_key(request.match_info["key"])
        except ValueError as exc:
            return json_error(400, str(exc))
        lifespan: float | None = None
        if LIFESPAN_PARAM in request.query:
            given = request.query.getall(LIFESPAN_PARAM)
            if request.method != "PUT":
                return json_error(400, f"{LIFESPAN_PARAM}: only a PUT takes a lifespan, not a {request.method}")
            if len(given) > 1:
                return json_error(400, f"{LIFESPAN_PARAM}: given {len(given)} times; give it once")
            try:
                lifespan = parse_lifespan(given[0])
            except ValueError as exc:
                return json_error(400, str(exc))
        grid = self._runtime(request)
        if isinstance(grid, web.Response):
            return grid
        if lifespan is not None and isinstance(grid, InvalidationRuntime):
            return _no_lifespan_here(request)
        value: bytes | None = None
        if request.method == "PUT":
            length = request.content_length
            if length is not None and length > MAX_VALUE_BYTES:
                return json_error(413, f"value: {length} bytes exceed the limit of {MAX_VALUE_BYTES}")
            value = await request.read()
            if not value:
                return json_error(400, "missing body: PUT needs the value as the request body")
            if len(value) > MAX_VALUE_BYTES:
                return json_error(413, f"value: {len(value)} bytes exceed the limit of {MAX_VALUE_BYTES}")
        try:
            if request.method == "GET":
                found, version = await grid.get_versioned(key, request.get("deadline"))
                # The version lets a client read optimistically: a transaction passes it back as its read.
                headers = {VERSION_HEADER: str(version)}
                if found is None:
                    resp = json_error(404, "key not found", key=request.match_info["key"], version=version)
                    resp.headers.update(headers)
                    return resp
                return web.Response(body=found, content_type="application/octet-stream", headers=headers)
            if request.method == "PUT":
                # The lifespan goes only with a PUT that has one: the common path calls put as before.
                extra = {} if lifespan is None else {"lifespan": lifespan}
                res = await grid.put(key, value, request.get("deadline"), **extra)
            else:
                res = await grid.delete(key, request.get("deadline"))
            return web.json_response({"ok": True, "attempts": res.attempts})
        except GridUnavailable as exc:
            return unavailable(exc)
        except GridTimeout as exc:
            return json_error(504, str(exc))
        except GridLocked as exc:
            return json_error(409, str(exc), reason="locked")
        except GridFull as exc:
            return json_error(507, str(exc), reason="full")
        except GridError as exc:
            return json_error(500, str(exc))
        except ValueError as exc:
            # What the grid refuses before it starts anything (e.g. a lifespan it cannot take); nothing was written.
            return json_error(400, str(exc))

    async def batch(self, request: web.Request) -> web.Response:
        self._count("batch")
        grid = self._runtime(request)
        if isinstance(grid, web.Response):
            return grid
        parsed = await self._body(request, shape='{"ops": [[op, key, value?], ...]}', strict=False)
        if isinstance(parsed, web.Response):
            return parsed
        doc, binary = parsed
        lifespans: list[float | None] = []
        try:
            ops = parse_batch(doc, binary, lifespans)
        except BadBatch as exc:
            return json_error(400, str(exc))
        if lifespans and isinstance(grid, InvalidationRuntime):
            first = next(i for i, span in enumerate(lifespans) if span is not None)
            return _no_lifespan_here(request, f"ops[{first}][3].lifespan")
        try:
            if lifespans:
                results = await grid.run_batch(ops, request.get("deadline"), lifespans=lifespans)
            else:
                results = await grid.run_batch(ops, request.get("deadline"))
        except GridUnavailable as exc:
            return unavailable(exc)
        except (ValueError, TypeError) as exc:
            return json_error(400, str(exc))
        t = getattr(grid.node, "topology", None)  # an invalidation cache has none
        # A write that succeeded answers {"status": 200}: one shared document for all of them (a document
        # built per write showed in profiles of Spark's writes); gets and failures get their own.
        docs: list[dict[str, Any] | None] = [_OK_DOC if r.ok and r.kind != GET else None for r in results]
        if None in docs:
            # The node reports the version of what a get read; the local copy's is the fallback (older peers).
            versions: list[int | None] = [r.version or None for r in results]
            if any(not r.version and r.kind == GET and r.ok and r.value is not None for r in results):
                local = grid.versions_of(ops, results)
                versions = [v if v is not None else lv for v, lv in zip(versions, local, strict=True)]
            docs = [
                d if d is not None else result_doc(r, binary, v)
                for d, r, v in zip(docs, results, versions, strict=True)
            ]
        body = {"topology_id": t.topology_id if t is not None else 0, "results": docs}
        return _packed(body, binary)

    # ==== transactions =====================================================================================
    async def _body(
        self, request: web.Request, *, shape: str, optional: bool = False, strict: bool = True
    ) -> tuple[Any, bool] | web.Response:
        """The decoded body of a request and whether it (and so the answer) is msgpack; or the 4xx that says what
        is wrong. ``optional``: an empty body decodes as None. ``strict``: a map that names a key twice is a 400
        (transactions); batches skip that check, which would slow msgpack decoding on the write path."""
        ctype = request.content_type
        length = request.content_length
        if length is not None and length > MAX_BATCH_BYTES:
            return json_error(413, f"body: {length} bytes exceed the limit of {MAX_BATCH_BYTES}")
        raw = await request.read()
        if not raw:
            if optional:
                accept_msgpack = any(
                    t.strip().split(";")[0] in MSGPACK_TYPES for t in request.headers.get("Accept", "").split(",")
                )
                return None, ctype in MSGPACK_TYPES or accept_msgpack
            return json_error(400, f"missing body: {shape}")
        if ctype in MSGPACK_TYPES:
            binary = True
        elif ctype == "application/json":
            binary = False
        else:
            return json_error(
                415, f"Content-Type {ctype or '(none)'} is not supported: use application/msgpack or application/json"
            )
        hook = _no_duplicates if strict else None
        try:
            doc = _unpack_body(raw, hook) if binary else json.loads(raw, object_pairs_hook=hook)
        except (ValueError, msgpack.UnpackException) as exc:
            return json_error(400, f"body: not valid {'msgpack' if binary else 'JSON'} ({exc})")
        except Exception as exc:  # msgpack raises assorted errors on hostile input; all of them mean "bad body"
            return json_error(400, f"body: not valid {'msgpack' if binary else 'JSON'} ({type(exc).__name__})")
        return doc, binary

    async def tx(self, request: web.Request) -> web.Response:
        """``POST /v1/tx``: a one-shot transaction (begin, lock, commit) on this member."""
        self._count("tx")
        grid = self._runtime(request, tx=True)
        if isinstance(grid, web.Response):
            return grid
        parsed = await self._body(
            request, optional=False, shape='{"reads": {key: version}, "writes": {key: value or null}}'
        )
        if isinstance(parsed, web.Response):
            return parsed
        doc, binary = parsed
        try:
            req = parse_tx(doc, binary)
        except BadBatch as exc:
            return json_error(400, str(exc))
        try:
            tx, res = await grid.transact(req.writes, req.reads, mode=req.mode, lock=req.lock)
        except (ValueError, TypeError) as exc:
            return json_error(400, str(exc))
        except GridError as exc:
            return tx_failure(exc)
        return _packed(committed_doc(tx, res), binary)

    async def tx_begin(self, request: web.Request) -> web.Response:
        """``POST /v1/tx/begin``: an interactive transaction, driven by later requests to this member."""
        self._count("tx_begin")
        grid = self._runtime(request, tx=True)
        if isinstance(grid, web.Response):
            return grid
        parsed = await self._body(request, optional=True, shape='{"mode": "optimistic" or "pessimistic"}')
        if isinstance(parsed, web.Response):
            return parsed
        doc, binary = parsed
        try:
            mode = parse_tx_begin(doc)
            tx = await grid.tx_begin(mode, interactive=True)
        except (BadBatch, ValueError) as exc:
            return json_error(400, str(exc))
        except GridError as exc:
            return tx_failure(exc)
        return _packed({"tx": str(tx), "mode": grid.interactive[tx].mode, "timeout": grid.tx_timeout}, binary)

    async def tx_action(self, request: web.Request) -> web.Response:
        """``POST /v1/tx/{id}/lock|commit|rollback|resolve``."""
        action = request.match_info["action"]
        self._count(f"tx_{action}")
        grid = self._runtime(request, tx=True)
        if isinstance(grid, web.Response):
            return grid
        shapes = {
            "lock": '{"keys": [key, ...]}',
            "commit": '{"reads": {key: version}, "writes": {key: value or null}}',
            "rollback": "(none)",
            "resolve": '{"commit": true or false}',
        }
        try:
            tx = parse_tx_id(request.match_info["tx"])
        except BadBatch as exc:
            return json_error(400, str(exc))
        parsed = await self._body(request, optional=action in ("commit", "rollback"), shape=shapes[action])
        if isinstance(parsed, web.Response):
            return parsed
        doc, binary = parsed
        try:
            if action == "resolve":
                commit, versions, cluster = parse_tx_resolve(doc, binary)
                if cluster:
                    return await self._tx_resolve_all(grid, tx, commit)
                assert commit is not None
                return self._tx_resolve(grid, tx, commit, versions)
            if action == "rollback":
                return await self._tx_rollback(grid, tx, doc, binary)
            grid.check_interactive(tx)
            if action == "lock":
                keys = parse_tx_lock(doc, binary)
                await grid.tx_lock(tx, keys)
                return _packed({"tx": str(tx), "locked": len(keys)}, binary)
            req = parse_tx(doc if doc is not None else {}, binary, interactive=True)
            res = await grid.tx_commit(tx, req.writes, req.reads)
            return _packed(committed_doc(tx, res), binary)
        except BadBatch as exc:
            return json_error(400, str(exc))
        except (ValueError, TypeError) as exc:
            return json_error(400, f"transaction {tx}: {exc}")
        except GridError as exc:
            return tx_failure(exc)

    async def _tx_rollback(self, grid: GridRuntime, tx: TxId, doc: Any, binary: bool) -> web.Response:
        if doc is not None:
            return json_error(400, "body: a rollback takes no body")
        if tx not in grid.interactive:
            ended = grid.tx_ended(tx)
            if ended is None:
                grid.check_interactive(tx)  # raises GridTxNotFound with the explanation
            if ended is not None and ended.startswith("commit"):
                return json_error(409, f"transaction {tx} cannot be rolled back: {ended}", tx=str(tx), reason=ended)
            # Rolling back what already rolled back is harmless: answer as if it had been now.
            return _packed({"tx": str(tx), "rolled_back": True, "detail": ended}, binary)
        await grid.tx_rollback(tx)
        return _packed({"tx": str(tx), "rolled_back": True}, binary)

    def _tx_resolve(self, grid: GridRuntime, tx: TxId, commit: bool, versions: dict[bytes, int]) -> web.Response:
        if not grid.tx_resolve(tx, commit, versions):
            return json_error(
                404,
                f"transaction {tx} is not in doubt on this member (GET /v1/tx/in-doubt lists the ones that are)",
                tx=str(tx),
            )
        return web.json_response({"tx": str(tx), "resolved": "commit" if commit else "rollback"})

    async def _tx_resolve_all(self, grid: GridRuntime, tx: TxId, commit: bool | None) -> web.Response:
        res = await grid.tx_resolve_all(tx, commit)
        if res.ok:
            return web.json_response({"tx": str(tx), "resolved": (res.value or b"").decode(), "cluster": True})
        status = {"not_in_doubt": 404, "undecided": 409, "timeout": 504}.get(res.reason, 503)
        return json_error(status, res.error, tx=str(tx), reason=res.reason)

    async def tx_report(self, request: web.Request) -> web.Response:
        """``GET /v1/tx/{id}/report``: this member's state of a transaction, for a resolver
        (``groupcluster tx resolve --auto`` decides from every member's)."""
        self._count("tx_report")
        grid = self.ctx.grid
        if grid is None:
            return json_error(404, "this member runs no data grid (start it with --grid)")
        try:
            tx = parse_tx_id(request.match_info["tx"])
            rep = grid.tx_report(tx)
        except BadBatch as exc:
            return json_error(400, str(exc))
        except GridUnavailable as exc:
            return unavailable(exc)
        in_doubt = any(d.tx == tx for d in grid.tx_in_doubt())
        return web.json_response(
            {
                "tx": str(tx),
                "state": rep.state.name if rep.state is not None else None,
                "in_doubt": in_doubt,
                "attempt": rep.attempt,
                "writes": [[_b64(k), None if v is None else _b64(v)] for k, v in rep.writes],
                "versions": [[_b64(k), ver] for k, ver in rep.versions],
                # the members of the view at its prepare here: one gone for good may have committed it
                "views": [str(m) for m in rep.views],
            }
        )

    async def tx_in_doubt(self, request: web.Request) -> web.Response:
        """``GET /v1/tx/in-doubt``: this member's prepared transactions whose originator is gone."""
        self._count("tx_in_doubt")
        grid = self.ctx.grid
        if grid is None:
            return json_error(404, "this member runs no data grid (start it with --grid)")
        binary = any(t.strip().split(";")[0] in MSGPACK_TYPES for t in request.headers.get("Accept", "").split(","))
        try:
            found = grid.tx_in_doubt()
        except GridUnavailable as exc:
            return unavailable(exc)
        ch = self.ctx.channel()

        def enc(b: bytes) -> Any:
            return b if binary else _b64(b)

        body = {
            "member": str(ch.address) if ch is not None else None,
            "in_doubt": [
                {
                    "tx": str(d.tx),
                    "attempt": d.attempt,
                    "keys": [enc(k) for k in d.keys],
                    "writes": [[enc(k), None if v is None else enc(v)] for k, v in d.writes],
                    "versions": [[enc(k), ver] for k, ver in d.versions],
                }
                for d in found
            ],
        }
        return _packed(body, binary)

    def _segment_request(self, request: web.Request) -> tuple[GridRuntime, bool, int, int] | web.Response:
        """What /v1/segments/{id} and /v1/changes/{id} share: (grid, msgpack answer?, segment, page limit), or
        the 4xx answer naming what is wrong."""
        grid = self.ctx.grid
        if grid is None:
            return json_error(404, "this member runs no data grid (start it with --grid)")
        binary = any(t.strip().split(";")[0] in MSGPACK_TYPES for t in request.headers.get("Accept", "").split(","))
        raw_seg = request.match_info["segment"]
        if not raw_seg.isdigit():
            return json_error(400, f"segment: expected a segment number, got {raw_seg!r}")
        q = request.query
        unknown = sorted(set(q) - {"after", "limit"})
        if unknown:
            return json_error(400, f"unknown query parameter(s) {', '.join(unknown)} (after, limit)")
        limit_text = q.get("limit", str(DEFAULT_SCAN_LIMIT))
        if not limit_text.isdigit() or not 1 <= int(limit_text) <= MAX_SCAN_LIMIT:
            return json_error(400, f"limit: expected 1 to {MAX_SCAN_LIMIT}, got {limit_text!r}")
        return grid, binary, int(raw_seg), int(limit_text)

    async def segment(self, request: web.Request) -> web.Response:
        self._count("segment")
        parsed = self._segment_request(request)
        if isinstance(parsed, web.Response):
            return parsed
        grid, binary, seg, limit = parsed
        try:
            after = _decode_cursor(request.query["after"]) if "after" in request.query else None
            page = grid.scan_segment(seg, after, limit, SCAN_PAGE_BYTES)
        except ValueError as exc:
            return json_error(400, str(exc))
        except GridNotOwner as exc:
            return json_error(409, str(exc), owners=exc.owners)
        except GridUnavailable as exc:
            return unavailable(exc)
        entries = page.entries if binary else [[_b64(k), _b64(v), ver] for k, v, ver in page.entries]
        body = {
            "segment": page.segment,
            "topology_id": page.topology_id,
            "entries": entries,
            "next": encode_cursor(page.entries[-1][0]) if page.more and page.entries else None,
        }
        return _packed(body, binary)

    async def changes(self, request: web.Request) -> web.Response:
        self._count("changes")
        parsed = self._segment_request(request)
        if isinstance(parsed, web.Response):
            return parsed
        grid, binary, seg, limit = parsed
        after_text = request.query.get("after", "0")
        if not after_text.isdigit() or int(after_text) >= 1 << 63:
            return json_error(400, f"after: expected a version (an integer >= 0), got {after_text!r}")
        try:
            page = grid.changes(seg, int(after_text), limit, SCAN_PAGE_BYTES)
        except ValueError as exc:
            return json_error(400, str(exc))
        except GridNotOwner as exc:
            return json_error(409, str(exc), owners=exc.owners)
        except GridUnavailable as exc:
            return unavailable(exc)
        if binary:
            entries: list[list[Any]] = [[ver, k, v] for ver, k, v in page.entries]
        else:
            entries = [[ver, _b64(k), None if v is None else _b64(v)] for ver, k, v in page.entries]
        body = {
            "segment": page.segment,
            "topology_id": page.topology_id,
            "covered": page.covered,
            "floor": page.floor,
            "entries": entries,
            "upto": page.upto,
            "more": page.more,
        }
        return _packed(body, binary)

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(
            text=render_metrics(self.ctx),
            content_type="text/plain",
            charset="utf-8",
            headers={"X-Prometheus-Format": "0.0.4"},
        )


def _metric(lines: list[str], name: str, kind: str, help_text: str, samples: Sequence[tuple[str, float]]) -> None:
    lines.append(f"# HELP {name} {help_text}")
    lines.append(f"# TYPE {name} {kind}")
    for labels, value in samples:
        v = int(value) if float(value).is_integer() else value
        lines.append(f"{name}{labels} {v}")


def _sum(metrics: dict[str, int], suffix: str) -> int:
    return sum(v for k, v in metrics.items() if k.endswith(suffix))


def render_metrics(ctx: MemberContext) -> str:
    """The Prometheus exposition: named gauges and counters, then every raw counter with a ``name`` label."""
    ch = ctx.channel()
    grid = ctx.grid
    lines: list[str] = []
    view = ch.view if ch is not None else None
    proto = ch.metrics() if ch is not None else {}
    _metric(lines, "groupcluster_members", "gauge", "members in the installed view", [("", len(view) if view else 0)])
    _metric(
        lines,
        "groupcluster_view_id",
        "gauge",
        "sequence number of the installed view",
        [("", view.view_id.seq if view else 0)],
    )
    _metric(lines, "groupcluster_joined", "gauge", "1 once joined", [("", 1 if ch is not None and ch.joined else 0)])
    _metric(
        lines,
        "groupcluster_views_installed_total",
        "counter",
        "views this member installed (each after its first follows a flush on the flushed presets)",
        [("", ch.views_installed if ch is not None else 0)],
    )
    _metric(
        lines,
        "groupcluster_messages_sent_total",
        "counter",
        "messages the application sent",
        [("", ch.sent if ch else 0)],
    )
    _metric(
        lines,
        "groupcluster_messages_delivered_total",
        "counter",
        "messages delivered to the application",
        [("", ch.delivered if ch else 0)],
    )
    _metric(
        lines,
        "groupcluster_retransmissions_total",
        "counter",
        "messages retransmitted by this member",
        [("", _sum(proto, "xmit_sent") + _sum(proto, "xmit_sent_for_others"))],
    )
    _metric(
        lines,
        "groupcluster_retransmission_requests_total",
        "counter",
        "retransmissions this member asked for",
        [("", _sum(proto, "xmit_requests"))],
    )
    if grid is not None and grid.node is not None:
        node = grid.node
        gm = node.metrics
        t = node.topology
        _metric(
            lines,
            "groupcluster_grid_topology_id",
            "gauge",
            "installed grid topology id",
            [("", t.topology_id if t else 0)],
        )
        _metric(
            lines,
            "groupcluster_grid_rebalancing",
            "gauge",
            "1 while a rebalance is in progress",
            [("", 1 if t is not None and t.rebalancing else 0)],
        )
        _metric(
            lines,
            "groupcluster_grid_degraded",
            "gauge",
            "1 while the topology is degraded (partition)",
            [("", 1 if t is not None and t.availability.name != "AVAILABLE" else 0)],
        )
        owned = len(t.current.segments_owned(node.address)) if t else 0
        _metric(lines, "groupcluster_grid_segments_owned", "gauge", "segments this member owns", [("", owned)])
        _metric(
            lines,
            "groupcluster_grid_peer_clock_ahead_seconds",
            "gauge",
            "how far the clock of the member most ahead of ours is ahead, at least (from its last member info)",
            [("", round(grid.max_peer_clock_ahead(), 6))],
        )
        entries = len(node.store) if node.store is not None else 0
        _metric(lines, "groupcluster_grid_entries", "gauge", "entries held by this member", [("", entries)])
        _metric(
            lines,
            "groupcluster_grid_rebalance_entries_received_total",
            "counter",
            "entries received by state transfer",
            [("", gm["grid.xfer_entries_in"])],
        )
        _metric(
            lines,
            "groupcluster_grid_rebalance_entries_sent_total",
            "counter",
            "entries sent by state transfer",
            [("", gm["grid.xfer_entries_out"])],
        )
        _metric(
            lines,
            "groupcluster_grid_rebalance_bytes_received_total",
            "counter",
            "key and value bytes received by state transfer",
            [("", gm["grid.xfer_bytes_in"])],
        )
        _metric(
            lines,
            "groupcluster_grid_entries_expired_total",
            "counter",
            "entries this member removed as their primary owner because their lifespan ended",
            [("", gm["grid.entries_expired"])],
        )
        _metric(
            lines,
            "groupcluster_grid_writes_refused_full_total",
            "counter",
            "PUTs this member refused as their primary owner at its max_entries or max_bytes bound",
            [("", gm["grid.writes_refused_full"])],
        )
        _metric(
            lines,
            "groupcluster_grid_max_entries",
            "gauge",
            "this member's max_entries bound (0: none)",
            [("", node.config.max_entries)],
        )
        _metric(
            lines,
            "groupcluster_grid_max_bytes",
            "gauge",
            "this member's max_bytes bound on its live key and value bytes (0: none)",
            [("", node.config.max_bytes)],
        )
        if node.store is not None:
            _metric(
                lines,
                "groupcluster_grid_store_bytes",
                "gauge",
                "key and value bytes of the live entries this member holds",
                [("", node.store.nbytes)],
            )
        ops = grid.counters
        _metric(
            lines,
            "groupcluster_grid_operations_total",
            "counter",
            "client operations completed here",
            [(f'{{op="{op}"}}', ops[f"ops_{op}"]) for op in ("get", "put", "delete")],
        )
        _metric(
            lines,
            "groupcluster_grid_entry_events_total",
            "counter",
            "entry events produced here (only while a listener or grid.count_events wants them; docs/grid.md)",
            [(f'{{kind="{k}"}}', gm[f"grid.events_{k}"]) for k in ("arrived", "departed", "written")],
        )
        _metric(
            lines,
            "groupcluster_grid_listener_errors_total",
            "counter",
            "entry listener calls that raised (logged)",
            [("", ops["listener_errors"])],
        )
        _metric(
            lines,
            "groupcluster_grid_persist_steps_total",
            "counter",
            "steps written to the persistent store (one SQLite transaction each); errors: failed writes",
            [("", ops["persist_steps"]), ('{result="error"}', ops["persist_errors"])],
        )
        _metric(
            lines,
            "groupcluster_grid_persist_seconds_total",
            "counter",
            "time spent writing the persistent store, on the event loop",
            [("", ops["persist_us"] / 1e6)],
        )
        _metric(
            lines,
            "groupcluster_grid_batches_total",
            "counter",
            "batch requests (POST /v1/batch) completed here",
            [("", ops["batches"])],
        )
        _metric(
            lines,
            "groupcluster_grid_operations_failed_total",
            "counter",
            "client operations that failed",
            [("", ops["ops_failed"])],
        )
        _metric(
            lines,
            "groupcluster_grid_transactions_total",
            "counter",
            "transactions this member originated, by outcome (conflict: aborted by validation; expired: interactive, "
            "rolled back after tx_timeout without a request)",
            [
                (f'{{outcome="{o}"}}', ops[f"tx_{o}"])
                for o in ("committed", "aborted", "conflicts", "rolled_back", "expired")
            ],
        )
        _metric(
            lines,
            "groupcluster_grid_transactions_in_doubt",
            "gauge",
            "transactions in doubt on this member (prepared, originator gone): groupcluster tx in-doubt",
            [("", len(node.tx_in_doubt()))],
        )
        _metric(
            lines,
            "groupcluster_grid_counter",
            "counter",
            "every grid node counter, by name",
            [(f'{{name="{_label(k)}"}}', v) for k, v in sorted(gm.items())],
        )
    if ctx.caches is not None:
        _cache_metrics(lines, ctx.caches)
    _metric(
        lines,
        "groupcluster_protocol_counter",
        "counter",
        "every protocol and runtime counter, by name",
        [(f'{{name="{_label(k)}"}}', v) for k, v in sorted(proto.items())],
    )
    _metric(
        lines,
        "groupcluster_http_requests_total",
        "counter",
        "key/value and leave requests served (deadline_expired: refused, read after the client's deadline)",
        [(f'{{kind="{k}"}}', v) for k, v in sorted(ctx.http_requests.items())],
    )
    return "\n".join(lines) + "\n"


def _cache_metrics(lines: list[str], caches: CacheSet) -> None:
    """Per named cache: entries, operations and every node counter, labelled with the cache's name and mode."""
    entries, ops, counters, mismatched = [], [], [], []
    for name, rt in caches.named.items():
        lab = f'cache="{_label(name)}",mode="{caches.mode_of(name)}"'
        node = rt.node
        n = 0
        if isinstance(node, InvalidationNode):
            n = len(node.entries)
        elif node is not None and node.store is not None:
            n = len(node.store)
        entries.append((f"{{{lab}}}", n))
        for op in ("get", "get_local", "put", "delete", "failed"):
            ops.append((f'{{{lab},op="{op}"}}', rt.counters[f"ops_{op}"]))
        if node is not None:
            counters += [(f'{{{lab},name="{_label(k)}"}}', v) for k, v in sorted(node.metrics.items())]
        mismatched.append((f"{{{lab}}}", len(caches.mismatches.get(name, {}))))
    _metric(lines, "groupcluster_cache_entries", "gauge", "entries held here, per named cache", entries)
    _metric(
        lines,
        "groupcluster_cache_operations_total",
        "counter",
        "client operations per named cache (get_local: gets answered from this member's own copy)",
        ops,
    )
    _metric(
        lines,
        "groupcluster_cache_mode_mismatch_members",
        "gauge",
        "members declaring the cache with another mode (their payloads are dropped)",
        mismatched,
    )
    _metric(
        lines,
        "groupcluster_cache_payloads_dropped_total",
        "counter",
        "named-cache payloads dropped: for a cache this member lacks, with another mode, or malformed",
        [(f'{{reason="{r}"}}', caches.counters[f"cache_{r}"]) for r in ("unknown", "mode_mismatch", "bad_payloads")],
    )
    _metric(lines, "groupcluster_cache_counter", "counter", "every named cache's node counter, by name", counters)


def _label(text: str) -> str:
    return json.dumps(text)[1:-1]
