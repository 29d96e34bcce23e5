"""The asyncio driver: runs one sans-IO :class:`~groupcluster.core.stack.Stack` on real sockets and timers.

Every input (the frames that arrived together, a due timer, application sends, control events) becomes one call
of a Stack method with ``loop.time()`` as the current time; after it the driver drains the Stack's outputs:
:class:`~groupcluster.core.stack.Transmit` actions go to the network, everything else goes to the
``on_events`` callback (the :class:`~groupcluster.runtime.channel.Channel`). One ``loop.call_at`` handle
follows ``stack.next_deadline()``.

Two networks carry the frames:

* UDP: one non-blocking datagram socket read with ``loop.add_reader``. A readiness callback reads every
  datagram waiting (up to a bound) and hands them to the stack together, so a burst costs one trip through
  the event loop rather than one per datagram (asyncio's DatagramProtocol reads one datagram per wake-up).
  Sends go straight to ``sendto``; only when the kernel buffer is full do they queue behind ``add_writer``.
* TCP: a listener, plus one outgoing connection per peer endpoint created on first use. Frames travel as
  4-byte big-endian length + frame; all frames for one peer produced by one step are written with a single
  ``write``. Frames read from every connection in one event-loop iteration go to the stack as one step (a
  member that lags behind takes larger steps, and the layers' per-step work - acks, a sequencer's batch, the
  frames out - covers more messages, instead of one full step per frame). Frames wait (bounded) while a
  connection is being made; when the attempt fails they are dropped (the protocols retransmit), and the
  next frame starts a new attempt, at least ``TCP_RETRY_DELAY`` after the failed one. A bad length prefix
  closes that connection and is counted.

Runtime counters live in :attr:`Driver.metrics` (names start with ``runtime.``); protocol counters stay in
``stack.metrics``.
"""

from __future__ import annotations

import asyncio
import collections
import gc
import logging
import os
import socket
import time
from collections.abc import Callable, Sequence
from typing import Any

from .. import protocols as _protocols  # noqa: F401  # registers every layer by name
from ..core.address import Address
from ..core.errors import ConfigError
from ..core.events import Event
from ..core.message import Message
from ..core.stack import LayerSpec, Stack, Transmit, resolve_config
from ..protocols.auth import OVERHEAD as AUTH_OVERHEAD
from ..protocols.auth import SESSION_SIZE

log = logging.getLogger("groupcluster.runtime")

TRANSPORTS = ("udp", "tcp")
# Largest UDP payload over IPv4; a frame above it cannot be sent as one datagram.
UDP_MAX_DATAGRAM = 65507
# The transport cuts frames by an estimate of their size, so keep some room below the datagram limit.
UDP_MAX_FRAME_SETTING = 62 * 1024
# Large kernel buffers absorb bursts of bundled frames while the process waits for a CPU: several senders
# each with megabytes of flow-control credit can overrun a small receive buffer (JGroups asks for 20-25 MB).
SOCKET_BUFFER = 4 * 1024 * 1024
UDP_RECEIVE_BUFFER = 16 * 1024 * 1024
# Datagrams read per readiness callback: enough to batch a burst, few enough to let timers run.
UDP_READS_PER_WAKEUP = 128
# Frames waiting for a full UDP send buffer; beyond it they are dropped (and retransmitted by the protocols).
UDP_SEND_BACKLOG = 4096
# TCP: bytes buffered towards a peer while connecting, and in asyncio's write buffer, before frames drop.
TCP_CONNECT_BUFFER = 4 * 1024 * 1024
TCP_WRITE_BUFFER = 16 * 1024 * 1024
TCP_CONNECT_TIMEOUT = 2.0
TCP_RETRY_DELAY = 0.2
# The cyclic garbage collector's thresholds while a driver runs (see tune_gc). The interpreter's defaults collect
# the youngest generation every 700 net allocations and fully every ~100 of those: a member allocates several
# tracked objects per message (messages, header dicts and objects, decoded batches) while it holds many live
# ones (undelivered batches, the forward-table, retransmission buffers), so collections walked them over and
# over. Measured on the total-order stack (4 members, 80,000 deliveries each): 2.0 -> 1.6 CPU seconds per run
# in all (-20%). A grid member process sets them unconditionally (groupcluster.grid.driver.gc_tuning.tune_gc).
GC_THRESHOLDS = (50_000, 20, 20)
_GC_DEFAULTS = (700, 10, 10)


def tune_gc(thresholds: tuple[int, int, int] | None = GC_THRESHOLDS) -> bool:
    """Raise the collector's thresholds to ``thresholds``, unless the application set its own (they differ from
    the interpreter's defaults) or ``thresholds`` is None. Process-wide, once: True when it changed them."""
    if thresholds is None or gc.get_threshold() != _GC_DEFAULTS:
        return False
    gc.set_threshold(*thresholds)
    return True


def new_incarnation() -> int:
    """A non-zero incarnation that fits in 63 bits, different for every start of a member."""
    return (time.time_ns() & (2**63 - 1)) or 1


def parse_endpoint(text: str, what: str = "endpoint") -> tuple[str, int]:
    """Parse ``host:port`` into a tuple, with an error naming ``what``."""
    host, sep, port = text.strip().rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{what}: expected HOST:PORT, got {text!r}")
    return host, int(port)


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


FrameSink = Callable[[list[bytes]], None]


def _enlarge_buffer(sock: socket.socket, option: int, force_option: int | None, size: int) -> None:
    """Ask for a ``size`` byte kernel buffer; the kernel caps it at net.core.[rw]mem_max unless the process may
    override that (CAP_NET_ADMIN, the ``*FORCE`` options). A smaller buffer only costs retransmissions."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, option, size)
        # Linux reports twice the requested size (bookkeeping overhead included) when it granted it.
        if sock.getsockopt(socket.SOL_SOCKET, option) >= size or force_option is None:
            return
        sock.setsockopt(socket.SOL_SOCKET, force_option, size)
    except OSError as exc:
        log.debug("UDP socket buffer stays at %d bytes: %s", sock.getsockopt(socket.SOL_SOCKET, option), exc)


class UdpNetwork:
    """Frames as datagrams on one socket bound to the member's endpoint."""

    def __init__(self, loop: asyncio.AbstractEventLoop, bind: tuple[str, int], on_frames: FrameSink, metrics: Any):
        self._loop = loop
        self._bind = bind
        self._on_frames = on_frames
        self.metrics = metrics
        self.sock: socket.socket | None = None
        self.endpoint = bind
        self._backlog: collections.deque[tuple[tuple[str, int], bytes]] = collections.deque()
        self._send_errors_logged = 0

    async def open(self) -> None:
        sock = socket.socket(_family(self._bind[0]), socket.SOCK_DGRAM)
        try:
            _enlarge_buffer(sock, socket.SO_RCVBUF, getattr(socket, "SO_RCVBUFFORCE", None), UDP_RECEIVE_BUFFER)
            _enlarge_buffer(sock, socket.SO_SNDBUF, getattr(socket, "SO_SNDBUFFORCE", None), SOCKET_BUFFER)
            sock.bind(self._bind)
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        self.sock = sock
        self.endpoint = sock.getsockname()[:2]
        self._loop.add_reader(sock.fileno(), self._read_ready)

    def _read_ready(self) -> None:
        sock = self.sock
        if sock is None:
            return
        recv = sock.recv
        frames: list[bytes] = []
        try:
            for _ in range(UDP_READS_PER_WAKEUP):
                frames.append(recv(65536))
        except (BlockingIOError, InterruptedError):
            pass
        except OSError as exc:
            # E.g. ECONNREFUSED reported for an earlier send on some systems: not fatal for a datagram socket.
            self.metrics["runtime.udp_receive_errors"] += 1
            log.debug("UDP receive error: %s", exc)
        if frames:
            self._on_frames(frames)

    def send(self, endpoint: tuple[str, int], data: bytes) -> None:
        sock = self.sock
        if sock is None:
            return
        if self._backlog:
            self._queue(endpoint, data)
            return
        try:
            sock.sendto(data, endpoint)
        except (BlockingIOError, InterruptedError):
            self._queue(endpoint, data)
            self._loop.add_writer(sock.fileno(), self._write_ready)
        except OSError as exc:
            self._send_error(endpoint, data, exc)

    def _queue(self, endpoint: tuple[str, int], data: bytes) -> None:
        if len(self._backlog) >= UDP_SEND_BACKLOG:
            self.metrics["runtime.udp_send_dropped"] += 1
            return
        self._backlog.append((endpoint, data))

    def _send_error(self, endpoint: tuple[str, int], data: bytes, exc: OSError) -> None:
        self.metrics["runtime.udp_send_errors"] += 1
        self._send_errors_logged += 1
        if self._send_errors_logged <= 10 or self._send_errors_logged % 1000 == 0:
            log.warning("UDP send of %d bytes to %s:%d failed: %s", len(data), endpoint[0], endpoint[1], exc)

    def _write_ready(self) -> None:
        sock = self.sock
        if sock is None:
            return
        backlog = self._backlog
        while backlog:
            endpoint, data = backlog[0]
            try:
                sock.sendto(data, endpoint)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                self._send_error(endpoint, data, exc)
            backlog.popleft()
        self._loop.remove_writer(sock.fileno())

    def flush(self) -> None:
        """Datagrams leave as they are sent; nothing to coalesce."""

    def close(self) -> None:
        sock, self.sock = self.sock, None
        if sock is not None:
            self._loop.remove_reader(sock.fileno())
            self._loop.remove_writer(sock.fileno())
            sock.close()
        self._backlog.clear()


class _Inbound(asyncio.Protocol):
    """One accepted TCP connection: cuts the byte stream into length-prefixed frames."""

    def __init__(self, network: TcpNetwork) -> None:
        self.network = network
        self.transport: asyncio.BaseTransport | None = None  # what it is used for (peer name, close) is there
        self.buf = bytearray()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.network.inbound.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.network.inbound.discard(self)
        self.buf = bytearray()

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        if not buf and len(data) >= 4 and int.from_bytes(data[:4], "big") == len(data) - 4:
            # The common case: exactly one whole frame arrived; no copy through the buffer.
            size = len(data) - 4
            if 0 < size <= self.network.max_frame:
                self.network.on_frames([data[4:]])
                return
        buf += data
        frames: list[bytes] = []
        pos = 0
        end = len(buf)
        limit = self.network.max_frame
        bad: int | None = None
        with memoryview(buf) as view:
            while end - pos >= 4:
                size = int.from_bytes(view[pos : pos + 4], "big")
                if size == 0 or size > limit:
                    bad = size
                    break
                if end - pos - 4 < size:
                    break
                frames.append(view[pos + 4 : pos + 4 + size].tobytes())
                pos += 4 + size
        if bad is not None:
            self.buf = bytearray()
            self.network.bad_length(self, bad)
        elif pos:
            del buf[:pos]
        if frames:
            self.network.on_frames(frames)


class _Outbound(asyncio.Protocol):
    def __init__(self, peer: _Peer) -> None:
        self.peer = peer
        self.transport: asyncio.BaseTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.peer.lost(self.transport, exc)


class _Peer:
    """The outgoing connection to one peer endpoint: idle, connecting or open."""

    def __init__(self, network: TcpNetwork, endpoint: tuple[str, int]) -> None:
        self.network = network
        self.endpoint = endpoint
        self.transport: asyncio.Transport | None = None
        self.connecting: asyncio.Task[None] | None = None
        self.pending: list[bytes] = []  # length-prefixed frames waiting for the connection
        self.pending_bytes = 0
        self.pending_frames = 0
        self.retry_at = 0.0

    def write(self, frames: list[bytes]) -> None:
        parts: list[bytes] = []
        for frame in frames:
            parts.append(len(frame).to_bytes(4, "big"))
            parts.append(frame)
        data = b"".join(parts)
        transport = self.transport
        metrics = self.network.metrics
        if transport is not None and transport.is_closing():
            # Closed under us (the peer went away); connection_lost follows. Reconnect for these frames.
            transport = self.transport = None
        if transport is not None:
            if transport.get_write_buffer_size() > TCP_WRITE_BUFFER:
                metrics["runtime.tcp_frames_dropped"] += len(frames)
                return
            transport.write(data)
            return
        if self.pending_bytes + len(data) > TCP_CONNECT_BUFFER:
            metrics["runtime.tcp_frames_dropped"] += len(frames)
            return
        self.pending.append(data)
        self.pending_bytes += len(data)
        self.pending_frames += len(frames)
        if self.connecting is None:
            # Right after a failed attempt, wait a little before the next one (no connect storm towards a dead
            # peer), but keep what is sent meanwhile: a peer that was merely starting up gets it.
            delay = max(0.0, self.retry_at - self.network.loop.time())
            self.connecting = self.network.loop.create_task(self._connect(delay))

    async def _connect(self, delay: float) -> None:
        network = self.network
        host, port = self.endpoint
        try:
            if delay:
                await asyncio.sleep(delay)
            transport, _ = await asyncio.wait_for(
                network.loop.create_connection(lambda: _Outbound(self), host, port), TCP_CONNECT_TIMEOUT
            )
        except (OSError, TimeoutError) as exc:
            network.metrics["runtime.tcp_connect_failures"] += 1
            network.metrics["runtime.tcp_frames_dropped"] += self.pending_frames
            log.debug("TCP connect to %s:%d failed: %s", host, port, exc)
            self.pending, self.pending_bytes, self.pending_frames = [], 0, 0
            self.retry_at = network.loop.time() + TCP_RETRY_DELAY
            return
        finally:
            self.connecting = None
        if network.closed:
            transport.close()
            return
        sock = transport.get_extra_info("socket")
        if sock is not None:
            # Frames are already coalesced per step; Nagle would only add latency.
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.transport = transport
        network.metrics["runtime.tcp_connects"] += 1
        if self.pending:
            transport.write(b"".join(self.pending))
            self.pending, self.pending_bytes, self.pending_frames = [], 0, 0

    def lost(self, transport: asyncio.BaseTransport | None, exc: Exception | None) -> None:
        if transport is not self.transport:
            return  # an older connection, already replaced
        self.transport = None
        # Reconnect on the next send, but not in a tight loop if the peer keeps closing on us.
        self.retry_at = self.network.loop.time() + (TCP_RETRY_DELAY if exc is not None else 0.0)
        if exc is not None:
            self.network.metrics["runtime.tcp_connections_lost"] += 1

    def close(self) -> None:
        if self.connecting is not None:
            self.connecting.cancel()
            self.connecting = None
        if self.transport is not None:
            self.transport.close()
            self.transport = None


class TcpNetwork:
    """Frames over TCP: a listener for incoming frames and one lazy outgoing connection per peer."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        bind: tuple[str, int],
        on_frames: FrameSink,
        metrics: Any,
        max_frame: int = 4 * 1024 * 1024,
    ) -> None:
        self.loop = loop
        self._bind = bind
        self._sink = on_frames
        # Frames read from all connections in one event-loop iteration, handed to the stack together (one
        # step) by a callback at the end of it.
        self._inbox: list[bytes] = []
        self.metrics = metrics
        self.max_frame = max_frame
        self.endpoint = bind
        self.server: asyncio.Server | None = None
        self.peers: dict[tuple[str, int], _Peer] = {}
        self.inbound: set[_Inbound] = set()
        self._pending: dict[tuple[str, int], list[bytes]] = {}
        self.closed = False

    async def open(self) -> None:
        self.server = await self.loop.create_server(
            lambda: _Inbound(self), self._bind[0], self._bind[1], reuse_address=True, family=_family(self._bind[0])
        )
        self.endpoint = self.server.sockets[0].getsockname()[:2]

    def on_frames(self, frames: list[bytes]) -> None:
        """Frames from one connection: gathered with those of the other connections read in this iteration."""
        inbox = self._inbox
        if not inbox:
            self.loop.call_soon(self._hand_over)
        inbox.extend(frames)

    def _hand_over(self) -> None:
        frames, self._inbox = self._inbox, []
        if frames and not self.closed:
            self._sink(frames)

    def send(self, endpoint: tuple[str, int], data: bytes) -> None:
        frames = self._pending.get(endpoint)
        if frames is None:
            self._pending[endpoint] = [data]
        else:
            frames.append(data)

    def flush(self) -> None:
        if not self._pending or self.closed:
            return
        pending, self._pending = self._pending, {}
        for endpoint, frames in pending.items():
            peer = self.peers.get(endpoint)
            if peer is None:
                peer = self.peers[endpoint] = _Peer(self, endpoint)
            peer.write(frames)

    def bad_length(self, conn: _Inbound, size: int) -> None:
        self.metrics["runtime.tcp_bad_length"] += 1
        peer = conn.transport.get_extra_info("peername") if conn.transport else None
        log.warning("closing TCP connection from %s: bad frame length %d (limit %d)", peer, size, self.max_frame)
        if conn.transport is not None:
            conn.transport.close()

    def close(self) -> None:
        self.closed = True
        if self.server is not None:
            self.server.close()
        for peer in self.peers.values():
            peer.close()
        for conn in list(self.inbound):
            if conn.transport is not None:
                conn.transport.close()
        self._pending.clear()


class Driver:
    """Runs one Stack on asyncio: sockets in, timers, sends, and outputs to ``on_events``."""

    # Set by open(), which binds the sockets first (the address is the bound endpoint); every other method but
    # close() and all_metrics() is for an opened driver.
    stack: Stack
    address: Address
    _loop: asyncio.AbstractEventLoop

    def __init__(
        self,
        spec: Sequence[LayerSpec],
        *,
        cluster: str,
        bind: tuple[str, int],
        transport: str = "udp",
        incarnation: int | None = None,
        seed: int | None = None,
        logger: logging.Logger | None = None,
        gc_thresholds: tuple[int, int, int] | None = GC_THRESHOLDS,
    ) -> None:
        if transport not in TRANSPORTS:
            raise ConfigError(f"transport: {transport!r} is not allowed; allowed values: {', '.join(TRANSPORTS)}")
        if incarnation is not None and not 0 < incarnation < 2**63:
            raise ConfigError(f"incarnation: must be in [1, 2**63), got {incarnation}")
        self.spec = list(spec)
        resolve_config(self.spec)  # fail on a bad configuration before binding anything
        self.cluster = cluster
        self.bind = bind
        self.transport = transport
        self.incarnation = incarnation or new_incarnation()
        self.seed = self.incarnation if seed is None else seed
        self.logger = logger
        # Applied at open() (see tune_gc): None leaves the collector alone, as do thresholds the application
        # set itself before.
        self.gc_thresholds = gc_thresholds
        self.metrics: collections.Counter[str] = collections.Counter()
        self.on_events: Callable[[list[Event]], None] | None = None
        self._opened = False  # the stack was built
        self._net: UdpNetwork | TcpNetwork | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_when = 0.0
        self._started = False
        self.closed = False

    async def open(self) -> Address:
        """Bind the sockets and build the Stack on the bound endpoint; returns the member's address."""
        loop = self._loop = asyncio.get_running_loop()
        tune_gc(self.gc_thresholds)
        if self.transport == "udp":
            net: UdpNetwork | TcpNetwork = UdpNetwork(loop, self.bind, self._on_frames, self.metrics)
        else:
            net = TcpNetwork(loop, self.bind, self._on_frames, self.metrics)
        await net.open()
        self._net = net
        host, port = net.endpoint
        self.address = Address(host, port, self.incarnation)
        try:
            self.stack = Stack(
                self.spec,
                local_address=self.address,
                cluster=self.cluster,
                seed=self.seed,
                now=loop.time(),
                logger=self.logger,
            )
            self._opened = True
            cfg = self.stack.layers[0].config
            reseed = getattr(self.stack.layers[0], "reseed_session", None)
            if reseed is not None:
                # Frame authentication: the sender session (the nonce space of encryption) must be fresh
                # random bytes, never the seeded RNG the simulator uses, or a restart could reuse nonces.
                reseed(os.urandom(SESSION_SIZE))
            if isinstance(net, UdpNetwork):
                max_frame = getattr(cfg, "max_frame_size", 0)
                if max_frame > UDP_MAX_FRAME_SETTING:
                    raise ConfigError(
                        f"stack[0] (transport).max_frame_size: {max_frame} bytes is too large for UDP "
                        f"(a datagram holds at most {UDP_MAX_DATAGRAM} bytes; use at most 62KiB, or --transport tcp)"
                    )
            else:
                net.max_frame = getattr(cfg, "max_receive_frame", net.max_frame) + AUTH_OVERHEAD
        except BaseException:
            net.close()
            self._net = None
            raise
        return self.address

    # -- inputs ------------------------------------------------------------------------------------------
    def start(self) -> None:
        self.stack.start(self._loop.time())
        self._started = True
        self._flush()

    def _on_frames(self, frames: list[bytes]) -> None:
        if not self._started or self.closed:
            self.metrics["runtime.frames_before_start"] += len(frames)
            return
        try:
            self.stack.receive_many(self._loop.time(), frames)
        except Exception:
            self._step_failed("receive")
        self._flush()

    def _on_timer(self) -> None:
        self._timer = None
        if self.closed:
            return
        # asyncio may run a handle a hair before its deadline; the stack must still see it as due.
        now = max(self._loop.time(), self._timer_when)
        try:
            self.stack.fire_timers(now)
        except Exception:
            self._step_failed("timer")
        self._flush()

    def send_many(self, messages: Sequence[Message]) -> None:
        """Send application messages in one step (they share frames)."""
        self.stack.send_many(self._loop.time(), messages)
        self._flush()

    def control(self, event: Event) -> Any:
        """Pass a control event down the stack (e.g. UpdateHosts) and return the layers' answer."""
        result = self.stack.control(self._loop.time(), event)
        self._flush()
        return result

    def leave(self) -> None:
        """Begin a graceful leave; the stack reports Left when it is done."""
        self.stack.leave(self._loop.time())
        self._flush()

    def close(self) -> None:
        """Stop the stack at once and release the sockets and the timer."""
        if self.closed:
            return
        self.closed = True
        if self._opened:
            self.stack.stop()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._net is not None:
            self._net.close()

    # -- outputs -----------------------------------------------------------------------------------------
    def _step_failed(self, what: str) -> None:
        # A layer raised: that is a bug, but one bad step must not take the whole member down silently.
        self.metrics["runtime.errors"] += 1
        log.exception("%s: the stack raised while handling %s", self.address, what)

    def _flush(self) -> None:
        out = self.stack.drain()
        if out:
            net = self._net
            events: list[Event] = []
            if net is not None:
                send = net.send
                for item in out:
                    if type(item) is Transmit:
                        send(item.endpoint, item.data)
                    else:
                        events.append(item)
                net.flush()
            else:
                events = [item for item in out if type(item) is not Transmit]
            if events and self.on_events is not None:
                self.on_events(events)
        self._arm_timer()

    def _arm_timer(self) -> None:
        if self.closed:
            return
        deadline = self.stack.next_deadline()
        timer = self._timer
        if deadline is None:
            return  # an armed handle may fire early; that is a harmless empty step
        if timer is not None:
            if self._timer_when <= deadline:
                return  # it fires first and re-arms then: no handle churn per step
            timer.cancel()
        self._timer_when = deadline
        self._timer = self._loop.call_at(deadline, self._on_timer)

    def all_metrics(self) -> dict[str, int]:
        """Protocol and runtime counters together."""
        merged = dict(self.stack.metrics) if self._opened else {}
        merged.update(self.metrics)
        return merged
