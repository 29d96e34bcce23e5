"""Read-only endpoints: probes (``/healthz``, ``/readyz``), ``/v1/status``, the cache listing and ``/metrics``."""

from __future__ import annotations

import time
from typing import Any

from aiohttp import web

from ...sim.history import view_id_json
from ..caches import DEFAULT_CACHE, DISTRIBUTED
from ..driver.grid_runtime import GridRuntime
from .handler_base import HandlerBase
from .metrics import render_metrics
from .responses import json_error


def default_only(grid: GridRuntime) -> dict[str, Any]:
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


class StatusHandlers(HandlerBase):
    """Probes, status, caches and metrics."""

    async def caches(self, request: web.Request) -> web.Response:
        """``GET /v1/caches``: every cache of this member with its mode, segments, owners and status."""
        if self.ctx.grid is None:
            return json_error(404, "this member runs no data grid (start it with --grid)")
        if self.ctx.caches is None:
            return web.json_response({"caches": [default_only(self.ctx.grid)], "unknown_payloads": {}})
        return web.json_response(self.ctx.caches.listing())

    async def cache(self, request: web.Request) -> web.Response:
        """``GET /v1/caches/{cache}``: one cache's description and its routing table (clients route with it)."""
        rt = self._runtime(request)
        if isinstance(rt, web.Response):
            return rt
        name = request.match_info["cache"]
        caches = self.ctx.caches
        doc = caches.describe(name) if caches is not None else default_only(rt)
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

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(
            text=render_metrics(self.ctx),
            content_type="text/plain",
            charset="utf-8",
            headers={"X-Prometheus-Format": "0.0.4"},
        )
