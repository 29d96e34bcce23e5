"""Member administration: ``/v1/leave``, ``/v1/force-available`` and ``/v1/capacity``."""

from __future__ import annotations

from aiohttp import web

from ..errors import GridUnavailable
from .handler_base import HandlerBase
from .responses import json_error


class AdminHandlers(HandlerBase):
    """Leave, force availability, change capacity."""

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
