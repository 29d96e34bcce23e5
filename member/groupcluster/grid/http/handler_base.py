"""What every group of request handlers shares: the member context, request counting, the cache a request
is for, and the decoded request body."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from ..caches import DEFAULT_CACHE, DISTRIBUTED, INVALIDATION, runtime_for
from .context import MemberContext
from .parsers import MAX_BATCH_BYTES, MSGPACK_TYPES, BadBatch, accepts_msgpack, body_is_msgpack, decode_body
from .responses import json_error


class HandlerBase:
    """The member context and the helpers the handlers of every area use."""

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
                return None, ctype in MSGPACK_TYPES or accepts_msgpack(request.headers.get("Accept", ""))
            return json_error(400, f"missing body: {shape}")
        try:
            binary = body_is_msgpack(ctype)
        except ValueError as exc:
            return json_error(415, str(exc))
        try:
            return decode_body(raw, binary, strict=strict), binary
        except BadBatch as exc:
            return json_error(400, str(exc))
