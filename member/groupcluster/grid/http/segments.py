"""Segment scans (``/v1/segments/{id}``) and the change feed (``/v1/changes/{id}``)."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from ..driver.grid_runtime import GridRuntime
from ..errors import GridNotOwner, GridUnavailable
from .handler_base import HandlerBase
from .parsers import accepts_msgpack, decode_cursor, encode_cursor, parse_change_version, parse_page
from .responses import b64, json_error, packed, unavailable

SCAN_PAGE_BYTES = 4 * 1024 * 1024


class SegmentHandlers(HandlerBase):
    """Pages of a segment's entries and of its change feed."""

    def _segment_request(self, request: web.Request) -> tuple[GridRuntime, bool, int, int] | web.Response:
        """What /v1/segments/{id} and /v1/changes/{id} share: (grid, msgpack answer?, segment, page limit), or
        the 4xx answer naming what is wrong."""
        grid = self.ctx.grid
        if grid is None:
            return json_error(404, "this member runs no data grid (start it with --grid)")
        binary = accepts_msgpack(request.headers.get("Accept", ""))
        try:
            seg, limit = parse_page(request.match_info["segment"], request.query)
        except ValueError as exc:
            return json_error(400, str(exc))
        return grid, binary, seg, limit

    async def segment(self, request: web.Request) -> web.Response:
        self._count("segment")
        parsed = self._segment_request(request)
        if isinstance(parsed, web.Response):
            return parsed
        grid, binary, seg, limit = parsed
        try:
            after = decode_cursor(request.query["after"]) if "after" in request.query else None
            page = grid.scan_segment(seg, after, limit, SCAN_PAGE_BYTES)
        except ValueError as exc:
            return json_error(400, str(exc))
        except GridNotOwner as exc:
            return json_error(409, str(exc), owners=exc.owners)
        except GridUnavailable as exc:
            return unavailable(exc)
        entries = page.entries if binary else [[b64(k), b64(v), ver] for k, v, ver in page.entries]
        body = {
            "segment": page.segment,
            "topology_id": page.topology_id,
            "entries": entries,
            "next": encode_cursor(page.entries[-1][0]) if page.more and page.entries else None,
        }
        return packed(body, binary)

    async def changes(self, request: web.Request) -> web.Response:
        self._count("changes")
        parsed = self._segment_request(request)
        if isinstance(parsed, web.Response):
            return parsed
        grid, binary, seg, limit = parsed
        try:
            after = parse_change_version(request.query.get("after", "0"))
            page = grid.changes(seg, after, limit, SCAN_PAGE_BYTES)
        except ValueError as exc:
            return json_error(400, str(exc))
        except GridNotOwner as exc:
            return json_error(409, str(exc), owners=exc.owners)
        except GridUnavailable as exc:
            return unavailable(exc)
        if binary:
            entries: list[list[Any]] = [[ver, k, v] for ver, k, v in page.entries]
        else:
            entries = [[ver, b64(k), None if v is None else b64(v)] for ver, k, v in page.entries]
        body = {
            "segment": page.segment,
            "topology_id": page.topology_id,
            "covered": page.covered,
            "floor": page.floor,
            "entries": entries,
            "upto": page.upto,
            "more": page.more,
        }
        return packed(body, binary)
