"""Segment scans (``/v1/segments/{id}``) and the change feed (``/v1/changes/{id}``)."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from ..runtime import GridNotOwner, GridRuntime, GridUnavailable
from .handler_base import HandlerBase
from .parsers import DEFAULT_SCAN_LIMIT, MAX_SCAN_LIMIT, MSGPACK_TYPES, decode_cursor, encode_cursor
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
