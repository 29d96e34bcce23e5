"""The member's HTTP API (aiohttp): health, readiness, status, key/value, transactions, graceful leave, metrics.

This module builds the application (routes, middlewares) and closes its server (:func:`close_http`); the handlers
live in one module per area (:mod:`.status`, :mod:`.admin`, :mod:`.data`, :mod:`.transactions`,
:mod:`.segments`), the pure request parsers in :mod:`.parsers`, the Prometheus text in :mod:`.metrics`.

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
:data:`~.parsers.MAX_KEY_BYTES` bytes, no control characters. Values are raw bytes, 1 byte to the grid's value limit
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
JSON (``application/json``; keys and values are base64 strings). At most :data:`~.parsers.MAX_BATCH_OPS`
operations and :data:`~.parsers.MAX_BATCH_BYTES` bytes. All operations start in one step of the grid node, so the
commands for one owner travel together. The answer, in the request's format, is ``{"topology_id": n, "results":
[{"status": 200, "value": ...}, ...]}`` in request order: per operation 200 (done; ``value`` for a get),
404 (get of an absent key), 503/504 with ``error`` (retry that operation), 507 (``full``, as above), 500 with
``error``. A malformed
body is a 400 naming the bad field (``ops[3][0]: unknown op 'pt'``), nothing of it runs.

**Lifespans** (entry expiry): ``PUT /v1/kv/{key}?lifespan=S`` (and ``/v1/caches/{cache}/kv/{key}``) writes an entry
that the grid removes, as an ordinary delete by the key's primary owner, once S seconds have passed. S is a decimal
number of seconds (``30``, ``0.5``, ``1e3``) or a duration with a unit (``250ms``, ``30s``, ``5m``, ``2h``;
:func:`~...core.units.parse_duration`): finite, above 0 and at most :data:`~..lifespan.MAX_LIFESPAN_SECONDS` (10
years). In a batch a put takes it as a fourth element, ``["put", key, value, {"lifespan": S}]`` with S a number (int
or float). Anything else is a 400 naming ``lifespan`` and nothing is written: a malformed, zero, negative or too
large value, a lifespan on a GET or DELETE (or a batch get/delete), and any lifespan for an invalidation cache (its
copies are each member's own, with no owner to expire them). Transactions take none.

**Segment scan** (``GET /v1/segments/{id}?after=CURSOR&limit=N``): the live entries of a segment, in key
order, at most ``limit`` (default 1000, at most :data:`~.parsers.MAX_SCAN_LIMIT`) and about 4 MiB per page, as
``{"segment", "topology_id", "entries": [[key, value, version], ...], "next"}``: ``next`` is the cursor of
the following page (the last key, base64url) or null at the end. msgpack with ``Accept:
application/msgpack``, else JSON (base64 keys and values). Only a member that reads the segment in its
topology serves it; others answer 409 with ``owners`` (HTTP URLs of the members that do).

**Change feed** (``GET /v1/changes/{id}?after=VERSION&limit=N``): the writes (puts and deletes, every
overwrite) this member applied to a segment with versions above ``after``, in version order, up to a
*stable* point (no write at or below it can still arrive here), as ``{"segment", "topology_id", "covered",
"floor", "entries": [[version, key, value or null], ...], "upto", "more"}``. Continue with ``after=upto``.
``covered`` false: the member's log does not reach back to ``after`` (it starts at ``floor``: a new owner,
or a log truncated at :data:`~..feed.DEFAULT_FEED_ENTRIES` entries or ``DEFAULT_FEED_BYTES``); read the
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
import hmac
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestPayloadError

from .admin import AdminHandlers
from .context import MemberContext
from .data import DataHandlers
from .parsers import DEADLINE_HEADER, MAX_BATCH_BYTES, MAX_VALUE_BYTES, parse_deadline
from .responses import LEAVING_ERROR, json_error
from .segments import SegmentHandlers
from .status import StatusHandlers
from .transactions import TxHandlers

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


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
    status, admin, data = StatusHandlers(ctx), AdminHandlers(ctx), DataHandlers(ctx)
    txs, segments = TxHandlers(ctx), SegmentHandlers(ctx)
    app.router.add_get("/healthz", status.healthz)
    app.router.add_get("/readyz", status.readyz)
    app.router.add_get("/v1/status", status.status)
    app.router.add_get("/metrics", status.metrics)
    app.router.add_post("/v1/leave", admin.leave)
    app.router.add_post("/v1/capacity", admin.capacity)
    app.router.add_post("/v1/caches/{cache}/capacity", admin.capacity)
    app.router.add_post("/v1/force-available", admin.force_available)
    app.router.add_post("/v1/batch", data.batch)
    app.router.add_post("/v1/tx", txs.tx)
    app.router.add_post("/v1/tx/begin", txs.tx_begin)
    app.router.add_get("/v1/tx/in-doubt", txs.tx_in_doubt)
    # A transaction id holds "/" and "#" ("host:port#incarnation/seq"; clients percent-encode them), so the id
    # is everything between /v1/tx/ and the action.
    app.router.add_post("/v1/tx/{tx:.+}/{action:lock|commit|rollback|resolve}", txs.tx_action)
    app.router.add_get("/v1/tx/{tx:.+}/report", txs.tx_report)
    app.router.add_get("/v1/segments/{segment}", segments.segment)
    app.router.add_get("/v1/changes/{segment}", segments.changes)
    # Named caches (grid/caches.py): the same key/value, batch and transaction forms under /v1/caches/{cache}.
    app.router.add_get("/v1/caches", status.caches)
    app.router.add_get("/v1/caches/{cache}", status.cache)
    app.router.add_post("/v1/caches/{cache}/batch", data.batch)
    app.router.add_post("/v1/caches/{cache}/tx", txs.tx)
    app.router.add_post("/v1/caches/{cache}/tx/begin", txs.tx_begin)
    app.router.add_post("/v1/caches/{cache}/tx/{tx:.+}/{action:lock|commit|rollback}", txs.tx_action)
    # ``{key:.*}`` also matches an empty key and keys with "/", so both get a precise 400 rather than a 404.
    for method in ("GET", "PUT", "DELETE"):
        app.router.add_route(method, "/v1/kv/{key:.*}", data.kv)
        app.router.add_route(method, "/v1/kv", data.kv_missing_key)
        app.router.add_route(method, "/v1/caches/{cache}/kv/{key:.*}", data.kv)
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


# A timeout parameter, not asyncio.timeout() around the call (ASYNC109): what comes after the deadline
# (closing the connections left, aiohttp's cleanup) must not be cancelled.
async def close_http(runner: web.AppRunner, ctx: MemberContext | None, timeout: float) -> bool:  # noqa: ASYNC109
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
