"""Key/value requests (``/v1/kv/{key}``) and batches (``/v1/batch``), of the default cache or a named one."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from ..caches import InvalidationRuntime
from ..errors import GridError, GridFull, GridLocked, GridTimeout, GridUnavailable
from ..lifespan import LIFESPAN_PARAM
from ..messages import GET
from .handler_base import HandlerBase
from .parsers import MAX_VALUE_BYTES, BadBatch, parse_batch, parse_key, parse_kv_lifespan
from .responses import OK_DOC, json_error, no_lifespan_here, packed, result_doc, unavailable

VERSION_HEADER = "X-Grid-Version"


class DataHandlers(HandlerBase):
    """GET/PUT/DELETE of one key, and batches."""

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
            try:
                lifespan = parse_kv_lifespan(request.method, request.query.getall(LIFESPAN_PARAM))
            except ValueError as exc:
                return json_error(400, str(exc))
        grid = self._runtime(request)
        if isinstance(grid, web.Response):
            return grid
        if lifespan is not None and isinstance(grid, InvalidationRuntime):
            return no_lifespan_here(request)
        value: bytes | None = None
        if request.method == "PUT":
            body = await self._put_value(request)
            if isinstance(body, web.Response):
                return body
            value = body
        return await self._kv_call(request, grid, key, value, lifespan)

    async def _put_value(self, request: web.Request) -> bytes | web.Response:
        """A PUT's value: its non-empty body, within the size limit (or the error response)."""
        length = request.content_length
        if length is not None and length > MAX_VALUE_BYTES:
            return json_error(413, f"value: {length} bytes exceed the limit of {MAX_VALUE_BYTES}")
        value = await request.read()
        if not value:
            return json_error(400, "missing body: PUT needs the value as the request body")
        if len(value) > MAX_VALUE_BYTES:
            return json_error(413, f"value: {len(value)} bytes exceed the limit of {MAX_VALUE_BYTES}")
        return value

    async def _kv_call(
        self, request: web.Request, grid: Any, key: bytes, value: bytes | None, lifespan: float | None
    ) -> web.Response:
        """Run one key's GET, PUT or DELETE on the grid, and map its outcome to the response."""
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
            return no_lifespan_here(request, f"ops[{first}][3].lifespan")
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
        docs: list[dict[str, Any] | None] = [OK_DOC if r.ok and r.kind != GET else None for r in results]
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
        return packed(body, binary)
