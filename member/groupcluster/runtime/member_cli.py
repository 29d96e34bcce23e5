"""``groupcluster member``: run one member process, optionally with a built-in multicast test workload.

The member joins ``--cluster`` at ``--bind`` (finding the others through ``--hosts`` and/or a shared
``--hosts-file``), then optionally multicasts ``--send-count`` test messages (ids ``0``, ``1``, ... at the
start of each payload, see :func:`groupcluster.sim.history.make_payload`) once the view has
``--start-when-members`` members. ``--status-file`` is rewritten about every 0.5 s with the view, counts and
counters as JSON, for scripts, tests and the demo. ``--record`` appends the member's history as JSON lines.

SIGTERM or SIGINT, ``--exit-after-delivered`` and ``--run-for`` end the member with a graceful leave (exit
status 0). A bad stack configuration prints one line naming the key and exits with status 2.

``--faults-control PATH`` puts a ``faults`` layer above the transport (unless the stack has one) and, once
joined, applies the JSON in ``PATH`` to it whenever the file changes (:mod:`groupcluster.runtime.faults_control`):
how ``groupcluster chaos`` cuts a member off the network.

``--grid`` runs a data-grid member on the channel (:mod:`groupcluster.grid.driver.grid_runtime`;
``--grid-set KEY=VALUE`` sets :class:`~groupcluster.grid.node.GridConfig` parameters) and ``--http HOST:PORT``
serves the member HTTP API (:mod:`groupcluster.grid.http`). A grid member that is asked to stop (SIGTERM,
``POST /v1/leave``) refuses new data requests over HTTP from then on (503, reason ``leaving``), first hands its segments
to new owners (at most ``--grid-leave-timeout`` seconds), then leaves the group, then closes its HTTP server once
the requests in progress are answered (at most ``--http-close-timeout`` seconds). A second SIGTERM or SIGINT during
the hand-off skips the rest of it (the member leaves the group at once): when a whole cluster stops, nobody is left
to take the segments.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

from ..core.address import Address
from ..core.errors import ConfigError
from ..core.message import Message
from ..core.stack import resolve_config
from ..core.view import View
from ..grid.caches import CacheSet, CacheSpec, parse_cache_specs
from ..grid.driver.grid_runtime import GridRuntime
from ..grid.node import GridConfig
from ..sim.history import make_payload, view_id_json
from ..stacks import PRESETS, load_stack_file
from . import kube_discovery
from .channel import Channel, ChannelError, build_spec
from .driver import TRANSPORTS, parse_endpoint
from .faults_control import FaultsControl, with_faults_layer

log = logging.getLogger("groupcluster.member")

STATUS_INTERVAL = 0.5
# Messages handed to the stack per event-loop iteration by an unlimited-rate workload: large enough to fill
# frames, small enough that receiving and timers interleave with sending.
SEND_CHUNK = 200


def _endpoint_arg(text: str) -> tuple[str, int]:
    try:
        return parse_endpoint(text, "HOST:PORT")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _hosts_arg(text: str) -> tuple[tuple[str, int], ...]:
    try:
        return tuple(parse_endpoint(h, "host") for h in text.split(",") if h.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{exc} (expected h:p,h:p)") from None


def _rate_arg(text: str) -> float | None:
    if text == "unlimited":
        return None
    try:
        rate = float(text)
    except ValueError:
        rate = -1.0
    if not rate > 0:
        raise argparse.ArgumentTypeError(f"expected messages per second (> 0) or 'unlimited', got {text!r}")
    return rate


def _count_arg(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {text!r}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


def _set_arg(text: str) -> tuple[str, str, Any]:
    key, sep, value = text.partition("=")
    layer, dot, name = key.partition(".")
    if not sep or not dot or not layer or not name:
        raise argparse.ArgumentTypeError(f"expected LAYER.KEY=VALUE (e.g. fd.timeout=2s), got {text!r}")
    try:
        parsed = yaml.safe_load(value) if value else ""
    except yaml.YAMLError:
        parsed = value
    return layer, name, parsed


def _grid_set_arg(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE (e.g. num_owners=2), got {text!r}")
    try:
        parsed = yaml.safe_load(value) if value else ""
    except yaml.YAMLError:
        parsed = value
    return key, parsed


def _token_file(path: str) -> str:
    """The bearer token in ``path`` (surrounding whitespace stripped); a clear argparse error otherwise."""
    try:
        token = Path(path).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise argparse.ArgumentTypeError(f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}") from None
    if len(token) < 16 or any(c.isspace() for c in token):
        raise argparse.ArgumentTypeError(f"{path}: the token must be one word of at least 16 characters")
    return token


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cluster", required=True, help="cluster name (members of other clusters are ignored)")
    parser.add_argument("--bind", required=True, type=_endpoint_arg, metavar="HOST:PORT", help="our endpoint")
    parser.add_argument("--hosts", type=_hosts_arg, default=(), metavar="H:P,H:P", help="initial members to probe")
    parser.add_argument("--hosts-file", metavar="PATH", help="shared hosts file: we add ourselves and poll it")
    parser.add_argument("--transport", choices=TRANSPORTS, default="udp", help="udp (default) or tcp")
    parser.add_argument(
        "--stack",
        default="fifo",
        metavar="fifo|PATH.yaml",
        help=f"preset ({', '.join(sorted(PRESETS))}) or a YAML stack file (default fifo)",
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        type=_set_arg,
        action="append",
        default=[],
        metavar="LAYER.KEY=VALUE",
        help="override one layer parameter, e.g. fd.timeout=2s (repeatable)",
    )
    parser.add_argument("--record", metavar="FILE", help="append our history (JSON lines) to FILE")
    parser.add_argument(
        "--faults-control",
        metavar="PATH",
        help="add a faults layer and apply the JSON in PATH to it whenever the file changes (polled every 0.2 s)",
    )
    parser.add_argument("--status-file", metavar="PATH", help="rewrite a JSON status here about every 0.5 s")
    parser.add_argument(
        "--join-timeout", type=_positive_float, default=60.0, metavar="SECONDS", help="give up joining after this long"
    )
    grid = parser.add_argument_group("data grid and HTTP API")
    grid.add_argument("--grid", action="store_true", help="run a data-grid member (see docs/grid.md)")
    grid.add_argument(
        "--grid-set",
        dest="grid_params",
        type=_grid_set_arg,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="grid parameter, e.g. num_owners=2, capacity=0, op_timeout=30s (repeatable)",
    )
    grid.add_argument(
        "--cache",
        dest="caches",
        action="append",
        default=[],
        metavar="NAME:KEY=VALUE,...",
        help="one more cache on this member, e.g. sessions:mode=replicated or near:mode=invalidation or "
        "orders:num_segments=64,num_owners=3 (modes: distributed, replicated, invalidation; repeatable; "
        "declare the same caches on every member; docs/grid.md, named caches)",
    )
    grid.add_argument(
        "--grid-leave-timeout",
        type=_positive_float,
        default=120.0,
        metavar="SECONDS",
        help="when stopping, wait at most this long for our segments to move (default 120)",
    )
    grid.add_argument(
        "--http",
        type=_endpoint_arg,
        metavar="HOST:PORT",
        help="serve /healthz, /readyz, /v1/status, /v1/kv/{key}, /v1/leave and /metrics here",
    )
    grid.add_argument(
        "--http-close-timeout",
        type=_positive_float,
        default=5.0,
        metavar="SECONDS",
        help="when stopping, wait at most this long for HTTP requests in progress to be answered (default 5)",
    )
    grid.add_argument(
        "--admin-token-file",
        dest="admin_token",
        type=_token_file,
        metavar="PATH",
        help="POST /v1/leave requires 'Authorization: Bearer TOKEN' with the token in this file",
    )
    grid.add_argument(
        "--kv-token-file",
        dest="kv_token",
        type=_token_file,
        metavar="PATH",
        help="the data endpoints (/v1/kv, /v1/batch, /v1/segments, /v1/changes) require this bearer token",
    )
    kube_discovery.add_arguments(parser)
    work = parser.add_argument_group("test workload")
    work.add_argument("--send-count", type=_count_arg, default=0, metavar="N", help="multicast N test messages")
    work.add_argument("--payload-size", type=_count_arg, default=100, metavar="BYTES", help="default 100")
    work.add_argument(
        "--send-rate", type=_rate_arg, default=None, metavar="MSGS/S", help="messages per second or 'unlimited'"
    )
    work.add_argument(
        "--start-when-members", type=_count_arg, default=1, metavar="K", help="send once the view has K members"
    )
    work.add_argument(
        "--exit-after-delivered", type=_count_arg, metavar="N", help="leave after sending and delivering N messages"
    )
    work.add_argument("--run-for", type=_positive_float, metavar="SECONDS", help="leave after this long")


def load_spec(stack: str, overrides: list[tuple[str, str, Any]]) -> list[dict[str, Any]]:
    """The stack configuration from a preset name or a YAML file, plus ``--set`` overrides, validated."""
    by_layer: dict[str, dict[str, Any]] = {}
    for layer, key, value in overrides:
        by_layer.setdefault(layer, {})[key] = value
    if stack in PRESETS:
        spec = build_spec(stack, by_layer)
        where = f"preset {stack}"
    else:
        if not Path(stack).is_file():
            raise ConfigError(
                f"--stack: {stack!r} is neither a preset ({', '.join(sorted(PRESETS))}) nor a readable file"
            )
        spec = build_spec(load_stack_file(stack), by_layer)
        where = stack
    try:
        resolve_config(spec)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    return spec


class Member:
    """The running member: its channel, workload, status file and exit conditions."""

    def __init__(self, args: argparse.Namespace, spec: list[dict[str, Any]]) -> None:
        self.args = args
        self.spec = spec
        self.ch: Channel | None = None
        self.stop = asyncio.Event()
        self.hurry = asyncio.Event()  # a second stop signal: skip the rest of the grid hand-off
        self.stop_reason = ""
        self.sent = 0
        self.send_done = args.send_count == 0
        self.delivered: Counter[Address] = Counter()
        self.delivered_total = 0
        self.first_delivery: float | None = None
        self.last_delivery: float | None = None
        # CPU seconds of this process at the first and last delivery: what delivering cost, whatever the load.
        self.cpu_at_first_delivery: float | None = None
        self.cpu_at_last_delivery: float | None = None
        self.send_started: float | None = None
        self.send_finished: float | None = None
        self.left = False
        self.started = time.time()
        self.grid: GridRuntime | None = None
        self.faults_control: FaultsControl | None = None
        self.grid_config: GridConfig | None = (
            GridConfig.from_dict(dict(args.grid_params)) if getattr(args, "grid", False) else None
        )
        if self.grid_config is None and getattr(args, "grid_params", None):
            raise ConfigError("--grid-set: only with --grid")
        self.cache_specs: list[CacheSpec] = parse_cache_specs(getattr(args, "caches", None) or [])
        if self.grid_config is None and self.cache_specs:
            raise ConfigError("--cache: only with --grid")
        self.caches: CacheSet | None = None
        self.http_ctx: Any = None  # the HTTP API's MemberContext, with --http

    # -- deliveries ------------------------------------------------------------------------------------
    def on_batch(self, msgs: list[Message]) -> None:
        now = time.time()
        cpu = time.process_time()
        if self.first_delivery is None:
            self.first_delivery = now
            self.cpu_at_first_delivery = cpu
        self.last_delivery = now
        self.cpu_at_last_delivery = cpu
        counts = self.delivered
        # The transport decodes a frame's sender once, so runs of one sender share one Address object.
        if msgs:
            src = msgs[0].sender()
            n = 0
            for msg in msgs:
                if msg.src is not src:
                    counts[src] += n
                    src, n = msg.sender(), 0
                n += 1
            counts[src] += n
        self.delivered_total += len(msgs)
        self._check_done()

    @property
    def done(self) -> bool:
        target = self.args.exit_after_delivered
        return self.send_done and (target is None or self.delivered_total >= target)

    def _check_done(self) -> None:
        if self.args.exit_after_delivered is not None and self.done and not self.stop.is_set():
            self.stop_reason = f"delivered {self.delivered_total} messages"
            self.stop.set()

    def on_view(self, view: View) -> None:
        if self.ch is not None:  # the first view is printed as "joined"
            print(f"member {self.ch.address}: view {view}", flush=True)

    # -- workload --------------------------------------------------------------------------------------
    async def workload(self, ch: Channel) -> None:
        args = self.args
        if args.send_count == 0:
            return
        want = args.start_when_members
        await ch.wait_for_view(lambda v: len(v) >= want, timeout=10**9)
        loop = asyncio.get_running_loop()
        size = args.payload_size
        total = args.send_count
        rate = args.send_rate
        start = loop.time()
        self.send_started = time.time()
        while self.sent < total:
            await ch.wait_unblocked()
            if rate is None:
                n = min(SEND_CHUNK, total - self.sent)
            else:
                due = min(total, int((loop.time() - start) * rate) + 1)
                n = min(SEND_CHUNK, due - self.sent)
                if n <= 0:
                    await asyncio.sleep(min(0.01, max(0.001, (self.sent + 1) / rate - (loop.time() - start))))
                    continue
            first = self.sent
            ch.send_many([make_payload(str(i), size) for i in range(first, first + n)])
            self.sent += n
            await asyncio.sleep(0)
        self.send_done = True
        self.send_finished = time.time()
        self._check_done()

    # -- status ----------------------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        ch = self.ch
        view = ch.view if ch is not None else None
        return {
            "time": time.time(),
            "pid": os.getpid(),
            "cpu_seconds": round(time.process_time(), 3),
            "cluster": self.args.cluster,
            "transport": self.args.transport,
            "address": str(ch.address) if ch is not None else None,
            "joined": ch is not None and ch.joined,
            "view": None
            if view is None
            else {
                "id": view_id_json(view.view_id),
                "members": [str(m) for m in view.members],
                "coordinator": str(view.coordinator),
            },
            "views_installed": ch.views_installed if ch is not None else 0,
            "sent": self.sent,
            "send_count": self.args.send_count,
            "send_done": self.send_done,
            "delivered": {str(a): n for a, n in sorted(self.delivered.items())},
            "delivered_total": self.delivered_total,
            "first_delivery": self.first_delivery,
            "last_delivery": self.last_delivery,
            "cpu_at_first_delivery": self.cpu_at_first_delivery,
            "cpu_at_last_delivery": self.cpu_at_last_delivery,
            "send_started": self.send_started,
            "send_finished": self.send_finished,
            "blocked": ch.blocked if ch is not None else False,
            "done": self.done,
            "left": self.left,
            "metrics": ch.metrics() if ch is not None else {},
            "grid": self._grid_summary(),
            "faults_control": self.faults_control.status() if self.faults_control is not None else None,
        }

    def _grid_summary(self) -> dict[str, Any] | None:
        grid = self.grid
        if grid is None or grid.node is None:
            return None
        node = grid.node
        t = node.topology
        return {
            "ready": grid.ready,
            "topology_id": t.topology_id if t else None,
            "phase": t.phase.name if t else None,
            "leaving": node.leaving,
            "ready_to_leave": node.ready_to_leave,
            "http": grid.http_url,
        }

    def write_status(self) -> None:
        path = self.args.status_file
        if not path:
            return
        tmp = f"{path}.tmp{os.getpid()}"
        try:
            with open(tmp, "w", encoding="utf-8") as fh:
                json.dump(self.status(), fh)
            os.replace(tmp, path)
        except OSError as exc:
            log.warning("cannot write status file %s: %s", path, exc)

    async def status_loop(self) -> None:
        while True:
            self.write_status()
            await asyncio.sleep(STATUS_INTERVAL)

    # -- main ------------------------------------------------------------------------------------------
    async def main(self) -> int:
        args = self.args
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal, sig)
        http_url = None
        if args.http is not None:
            host, port = args.http
            # Peers and clients need an address they can reach: a wildcard bind is announced as our bind host.
            shown = args.bind[0] if host in ("0.0.0.0", "::", "") else host
            http_url = f"http://{shown}:{port}"
        on_messages = self.on_batch
        on_view = self.on_view
        if self.grid_config is not None:
            grid = self.grid = GridRuntime(self.grid_config, http_url=http_url, other=self.on_batch)
            on_messages = grid.on_messages
            # Without named caches the default runtime demultiplexes alone (no extra pass over each batch).
            caches = self.caches = CacheSet(grid, self.cache_specs) if self.cache_specs else None
            if caches is not None:
                on_messages = caches.on_messages

            def on_view(view: View) -> None:
                if caches is not None:
                    caches.on_view(view)
                else:
                    grid.on_view(view)
                self.on_view(view)

        runner = await self._start_http(http_url) if args.http is not None else None
        try:
            return await self._run_member(on_messages, on_view)
        finally:
            # The grid first: operations still waiting fail (503, reason leaving), so their requests are answered
            # before the HTTP server closes.
            if self.caches is not None:
                self.caches.close()
            elif self.grid is not None:
                self.grid.close()
            if runner is not None:
                await self._close_http(runner)

    async def _close_http(self, runner: Any) -> None:
        from ..grid.http import close_http

        started = time.monotonic()
        if not await close_http(runner, self.http_ctx, self.args.http_close_timeout):
            log.warning(
                "HTTP requests still in progress after %gs (--http-close-timeout); their connections were closed",
                self.args.http_close_timeout,
            )
        log.info("HTTP server closed in %.3fs", time.monotonic() - started)

    async def _start_http(self, url: str | None) -> Any:
        from aiohttp import web

        from ..grid.http import SHUTDOWN_TIMEOUT, MemberContext, build_app

        ctx = MemberContext(
            cluster=self.args.cluster,
            grid=self.grid,
            caches=self.caches,
            request_leave=self.request_leave,
            channel=lambda: self.ch,
            admin_token=self.args.admin_token,
            kv_token=self.args.kv_token,
        )
        self.http_ctx = ctx
        # close_http answers the requests in progress first; what aiohttp's cleanup may wait after that is short.
        runner = web.AppRunner(build_app(ctx), access_log=None, shutdown_timeout=SHUTDOWN_TIMEOUT)
        await runner.setup()
        host, port = self.args.http
        try:
            await web.TCPSite(runner, host, port).start()
        except OSError as exc:
            await runner.cleanup()
            raise ChannelError(f"cannot serve HTTP on {host}:{port}: {exc.strerror or exc}") from None
        print(f"member: serving HTTP on {url}", flush=True)
        return runner

    def request_leave(self) -> None:
        """``POST /v1/leave``: the same graceful stop as SIGTERM (grid hand-off first, then the group leave)."""
        if not self.stop.is_set():
            self.stop_reason = "leave requested over HTTP"
            self.stop.set()

    async def _grid_handoff(self) -> None:
        grid = self.grid
        if grid is None or grid.node is None or self.ch is None or self.ch.closed:
            return
        # Every cache hands its segments off (a named cache's leave is its own rebalance, run side by side).
        waiter: Any = self.caches if self.caches is not None else grid
        started = time.monotonic()
        waiter.leave()
        handed = asyncio.ensure_future(waiter.wait_ready_to_leave())
        hurry = asyncio.ensure_future(self.hurry.wait())
        try:
            await asyncio.wait(
                {handed, hurry}, timeout=self.args.grid_leave_timeout, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            hurry.cancel()
            handed.cancel()
        handed_off = self.caches.ready_to_leave if self.caches is not None else grid.node.ready_to_leave
        if handed_off:
            took = time.monotonic() - started
            print(f"member {self.ch.address}: grid segments handed off in {took:.3f}s", flush=True)
        elif self.hurry.is_set():
            print(f"member {self.ch.address}: grid hand-off skipped (second stop signal)", flush=True)
        else:
            log.warning("grid segments not handed off within %gs; leaving anyway", self.args.grid_leave_timeout)

    async def _run_member(self, on_messages: Any, on_view: Any) -> int:
        args = self.args
        loop = asyncio.get_running_loop()
        connect = asyncio.ensure_future(
            Channel.connect(
                args.cluster,
                bind=args.bind,
                initial_hosts=args.hosts,
                stack=self.spec,
                transport=args.transport,
                record=args.record,
                hosts_file=args.hosts_file,
                join_timeout=args.join_timeout,
                on_messages=on_messages,
                on_view=on_view,
                discovery=kube_discovery.from_args(args),
            )
        )
        stopper = asyncio.ensure_future(self.stop.wait())
        await asyncio.wait({connect, stopper}, return_when=asyncio.FIRST_COMPLETED)
        if not connect.done():
            connect.cancel()
            with contextlib.suppress(asyncio.CancelledError, ChannelError):
                await connect
            print(f"member: stopped before joining ({self.stop_reason})", flush=True)
            return 0
        stopper.cancel()
        ch = self.ch = connect.result()  # raises ChannelError / ConfigError to run()
        if self.caches is not None:
            self.caches.bind(ch)
        elif self.grid is not None:
            self.grid.bind(ch)
        print(f"member {ch.address}: joined {ch.view}", flush=True)
        if getattr(args, "faults_control", None):
            self.faults_control = FaultsControl(args.faults_control, ch.driver.control)
            self.faults_control.start()
        tasks = [loop.create_task(self.status_loop()), loop.create_task(self.workload(ch))]
        if args.run_for is not None:
            loop.call_later(args.run_for, self._time_up)
        try:
            await self.stop.wait()
            if self.http_ctx is not None:
                # From now on new data requests are refused (503, reason leaving) and every answer closes its
                # connection: clients move to other members while the segments are handed off.
                self.http_ctx.leaving = True
            await self._grid_handoff()
        finally:
            for task in tasks:
                task.cancel()
            if self.faults_control is not None:
                self.faults_control.stop()
            leave_started = time.monotonic()
            ok = await ch.leave()
            self.left = ok
            self.write_status()
        took = time.monotonic() - leave_started
        print(
            f"member {ch.address}: left ({self.stop_reason}{'' if ok else '; leave timed out'}) in {took:.3f}s",
            flush=True,
        )
        return 0

    def _on_signal(self, sig: signal.Signals) -> None:
        if not self.stop.is_set():
            self.stop_reason = f"{sig.name}"
            self.stop.set()
        else:
            self.hurry.set()

    def _time_up(self) -> None:
        if not self.stop.is_set():
            self.stop_reason = f"ran for {self.args.run_for:g}s"
            self.stop.set()


def run(args: argparse.Namespace) -> int:
    if args.hosts_file is None and not args.hosts and not getattr(args, "kube_discovery", False):
        log.info("no --hosts and no --hosts-file: this member can only start a group of its own")
    try:
        spec = load_spec(args.stack, args.overrides)
        if getattr(args, "faults_control", None):
            spec = with_faults_layer(spec)
        return asyncio.run(Member(args, spec).main())
    except ConfigError as exc:
        # One line, even when the message quotes a multi-line YAML parser error.
        print(f"groupcluster member: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    except ChannelError as exc:
        print(f"groupcluster member: error: {exc}", file=sys.stderr)
        return 1
