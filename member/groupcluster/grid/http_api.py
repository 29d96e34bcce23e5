"""The member's HTTP API (aiohttp): health, readiness, status, the key/value API, graceful leave, metrics.

=========================  ==============================================================================
``GET /healthz``           200 while the process and its event loop run
``GET /readyz``            200 when joined, holding a topology, not leaving and nothing of ours in transfer;
                           503 with the reasons otherwise
``GET /v1/status``         view, coordinator, topology id, phase, segments owned, rebalance progress, routing
``GET /v1/kv/{key}``       200 with the value as the body (``application/octet-stream``); 404 if absent
``PUT /v1/kv/{key}``       the body is the value; 200 once every owner holds it (acknowledged)
``DELETE /v1/kv/{key}``    200 once every owner removed it (deleting an absent key is not an error)
``POST /v1/leave``         202: hand our segments to new owners, then leave the group and exit
``GET /metrics``           Prometheus text format
=========================  ==============================================================================

Keys are the URL path after ``/v1/kv/``, percent-decoded and UTF-8 encoded to bytes: 1 to
:data:`MAX_KEY_BYTES` bytes, no control characters. Values are raw bytes, 1 byte to the grid's value limit
(4 MiB by default). Every error is JSON ``{"error": "...", ...}``: 400 for a bad request, 404 for an
absent key or an unknown path, 405 for a wrong method, 413 for a value too large, 503 with a ``reason`` when
the grid refuses for now (degraded partition, not joined yet, member leaving; ``Retry-After`` says when to
try again, on any member), 504 when an operation timed out.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from aiohttp import web

from ..sim.history import view_id_json
from .messages import DEFAULT_LIMITS
from .runtime import GridError, GridRuntime, GridTimeout, GridUnavailable

if TYPE_CHECKING:
    from ..runtime.channel import Channel

# A key travels in the URL: keep it well inside the request-line limit of servers and proxies (8 KiB).
MAX_KEY_BYTES = 4096
MAX_VALUE_BYTES = DEFAULT_LIMITS.max_value_bytes
RETRY_AFTER_SECONDS = "1"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class MemberContext:
    """What the HTTP API reads from the running member (the channel appears once joined)."""

    cluster: str
    grid: GridRuntime | None
    request_leave: Callable[[], None]
    channel: Callable[[], Channel | None]
    started: float = field(default_factory=time.time)
    http_requests: dict[str, int] = field(default_factory=dict)


def json_error(status: int, message: str, **extra: Any) -> web.Response:
    headers = {"Retry-After": RETRY_AFTER_SECONDS} if status == 503 else None
    return web.json_response({"error": message, **extra}, status=status, headers=headers)


@web.middleware
async def _errors_as_json(request: web.Request, handler: Handler) -> web.StreamResponse:
    """aiohttp answers unknown paths, wrong methods and oversized bodies in HTML; clients want JSON."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        if exc.status == 405:
            allowed = sorted(getattr(exc, "allowed_methods", ()) or ())
            return json_error(405, f"method {request.method} is not allowed on {request.path}", allowed=allowed)
        if exc.status == 404:
            return json_error(404, f"no such endpoint: {request.path}")
        if exc.status == 413:
            return json_error(413, f"request body too large (limit {MAX_VALUE_BYTES} bytes)")
        return json_error(exc.status, exc.reason)


def build_app(ctx: MemberContext) -> web.Application:
    # A little headroom over the value limit: the size check below gives the precise message.
    app = web.Application(middlewares=[_errors_as_json], client_max_size=MAX_VALUE_BYTES + 1024)
    api = _Api(ctx)
    app.router.add_get("/healthz", api.healthz)
    app.router.add_get("/readyz", api.readyz)
    app.router.add_get("/v1/status", api.status)
    app.router.add_get("/metrics", api.metrics)
    app.router.add_post("/v1/leave", api.leave)
    # ``{key:.*}`` also matches an empty key and keys with "/", so both get a precise 400 rather than a 404.
    for method in ("GET", "PUT", "DELETE"):
        app.router.add_route(method, "/v1/kv/{key:.*}", api.kv)
        app.router.add_route(method, "/v1/kv", api.kv_missing_key)
    return app


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


class _Api:
    def __init__(self, ctx: MemberContext) -> None:
        self.ctx = ctx

    def _count(self, name: str) -> None:
        self.ctx.http_requests[name] = self.ctx.http_requests.get(name, 0) + 1

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
            reasons = grid.not_ready_reasons()
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
            "grid": None,
            "routing": None,
        }
        if grid is not None and grid.node is not None:
            st = grid.status()
            t = st.get("topology") or {}
            body["grid"] = {
                "topology_id": t.get("topology_id"),
                "rebalance_id": t.get("rebalance_id"),
                "phase": t.get("phase"),
                "availability": t.get("availability"),
                "segments_owned": st.get("segments_owned", 0),
                "segments_primary": st.get("segments_primary", 0),
                "rebalance": st.get("rebalance"),
                "store": st.get("store"),
                "leaving": st.get("leaving"),
                "ready_to_leave": st.get("ready_to_leave"),
                "ready": grid.ready,
                "endpoints": st.get("endpoints"),
            }
            body["routing"] = grid.routing()
        return web.json_response(body)

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

    async def kv_missing_key(self, request: web.Request) -> web.Response:
        return json_error(400, "missing key: use /v1/kv/{key}")

    async def kv(self, request: web.Request) -> web.Response:
        self._count(request.method.lower())
        try:
            key = parse_key(request.match_info["key"])
        except ValueError as exc:
            return json_error(400, str(exc))
        grid = self.ctx.grid
        if grid is None:
            return json_error(404, "this member runs no data grid (start it with --grid)")
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
                found = await grid.get(key)
                if found is None:
                    return json_error(404, "key not found", key=request.match_info["key"])
                return web.Response(body=found, content_type="application/octet-stream")
            if request.method == "PUT":
                res = await grid.put(key, value)  # type: ignore[arg-type]
            else:
                res = await grid.delete(key)
            return web.json_response({"ok": True, "attempts": res.attempts})
        except GridUnavailable as exc:
            return json_error(503, str(exc), reason=str(exc))
        except GridTimeout as exc:
            return json_error(504, str(exc))
        except GridError as exc:
            return json_error(500, str(exc))

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(
            text=render_metrics(self.ctx),
            content_type="text/plain",
            charset="utf-8",
            headers={"X-Prometheus-Format": "0.0.4"},
        )


def _metric(lines: list[str], name: str, kind: str, help_text: str, samples: list[tuple[str, float]]) -> None:
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
            "groupcluster_grid_operations_failed_total",
            "counter",
            "client operations that failed",
            [("", ops["ops_failed"])],
        )
        _metric(
            lines,
            "groupcluster_grid_counter",
            "counter",
            "every grid node counter, by name",
            [(f'{{name="{_label(k)}"}}', v) for k, v in sorted(gm.items())],
        )
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
        "key/value and leave requests served",
        [(f'{{kind="{k}"}}', v) for k, v in sorted(ctx.http_requests.items())],
    )
    return "\n".join(lines) + "\n"


def _label(text: str) -> str:
    return json.dumps(text)[1:-1]
