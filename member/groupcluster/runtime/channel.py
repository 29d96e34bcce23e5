"""The Channel: the application's handle on one member of a group.

::

    ch = await Channel.connect("orders", bind=("127.0.0.1", 7800), initial_hosts=["127.0.0.1:7801"])
    ch.on_message(lambda msg: print(msg.src, msg.payload))
    ch.on_view(lambda view: print("view", view))
    ch.send(b"hello")                  # to everyone (the group view), including ourselves
    ch.send(b"hi", dest=ch.view.members[1])
    await ch.send_async(b"more")       # waits while flow control asks senders to hold back
    await ch.leave()

Design: callbacks, run on the event loop thread in delivery order. Pass them to :meth:`Channel.connect` to
see everything from the first view on (registering them after ``connect`` returns misses what was delivered
in between). ``on_message`` is called once per
message, ``on_messages`` once per delivered batch (cheaper at high rates), ``on_view`` once per installed
view, ``on_event`` for other stack events (backpressure, flush Block/Unblock, ...). A callback must not
block; an exception in a callback is logged and does not disturb the member.

State transfer (stacks with the ``state`` layer, e.g. "vsync" and "total-order")::

    ch = await Channel.connect("orders", stack="vsync", get_state=lambda: db.dump(), set_state=db.load, ...)
    await ch.wait_state(timeout=30)    # the state arrived (at once for the member that founded the group)

``get_state()`` must return the application's state as bytes, at once: it is called between deliveries, and
the state must be exactly what the deliveries so far made it. ``set_state(data)`` replaces the state; the
messages delivered after it continue from it (multicasts already in the state are not delivered again). A
member that passes ``set_state`` holds its deliveries (and view notifications) until the state is set; the
group does not stop meanwhile. Without ``get_state`` a member serves an empty state.

``send`` never blocks: messages sent within one event-loop iteration are handed to the stack together in
one step (``loop.call_soon``), so they share frames. ``send_async`` first waits while the stack reports
``Backpressure(True)``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..core.address import Address
from ..core.errors import ConfigError, GroupClusterError
from ..core.events import (
    Backpressure,
    Deliver,
    Event,
    FlushGroup,
    Joined,
    JoinFailed,
    Left,
    UpdateHosts,
    ViewChange,
)
from ..core.layer import LAYER_TYPES
from ..core.message import Message
from ..core.view import View
from ..protocols.state_transfer.events import GetState, RequestState, SetState, StateCovered, StateSnapshot
from ..stacks import PRESETS, preset
from .driver import GC_THRESHOLDS, Driver, parse_endpoint
from .file_discovery import FileDiscovery
from .recorder import Recorder

log = logging.getLogger("groupcluster.channel")

StackSpec = str | Sequence[Mapping[str, Any]]
HostsArg = Iterable[str | tuple[str, int]]


class ChannelError(GroupClusterError):
    """Connecting, joining or leaving failed; the message says why."""


class ChannelClosed(ChannelError):
    """The channel was closed (or has left); it cannot send any more."""


def build_spec(stack: StackSpec, overrides: Mapping[str, Mapping[str, Any]] | None = None) -> list[dict[str, Any]]:
    """A bottom-first layer list from a preset name or a list, with ``{layer: {key: value}}`` overrides."""
    if isinstance(stack, str):
        if stack not in PRESETS:
            raise ConfigError(f"stack: unknown preset {stack!r}; allowed values: {', '.join(sorted(PRESETS))}")
        return preset(stack, {k: dict(v) for k, v in (overrides or {}).items()})
    if not isinstance(stack, Sequence) or not stack:
        raise ConfigError("stack: expected a preset name or a non-empty list of layers, bottom first")
    spec: list[dict[str, Any]] = []
    for i, entry in enumerate(stack):
        if not isinstance(entry, Mapping):  # as resolve_config says it, before the hosts are injected
            raise ConfigError(f"stack[{i}]: expected a mapping with a 'layer' key, got {entry!r}")
        spec.append(dict(entry))
    for layer_name, params in (overrides or {}).items():
        found = next((e for e in spec if e.get("layer") == layer_name), None)
        if found is None:
            listed = ", ".join(str(e.get("layer")) for e in spec)
            raise ConfigError(f"stack overrides: layer {layer_name!r} is not in the stack; allowed values: {listed}")
        found.update(params)
    return spec


def parse_hosts(hosts: HostsArg) -> tuple[tuple[str, int], ...]:
    out: list[tuple[str, int]] = []
    for h in hosts:
        if isinstance(h, str):
            out.append(parse_endpoint(h, "initial_hosts"))
        elif isinstance(h, tuple) and len(h) == 2 and isinstance(h[0], str) and isinstance(h[1], int):
            out.append(h)
        else:
            raise ConfigError(f"initial_hosts: expected 'host:port' strings or (host, port) tuples, got {h!r}")
    return tuple(dict.fromkeys(out))


def _inject_hosts(spec: list[dict[str, Any]], hosts: tuple[tuple[str, int], ...]) -> bool:
    """Give the discovery layer its static host list unless the configuration already sets one."""
    for entry in spec:
        name = entry.get("layer")
        cls = LAYER_TYPES.get(name) if isinstance(name, str) else None
        if cls is None or not dataclasses.is_dataclass(cls.Config):
            continue
        for f in dataclasses.fields(cls.Config):
            if f.metadata.get("kind") == "hosts":
                if f.name not in entry:
                    entry[f.name] = [f"{h}:{p}" for h, p in hosts]
                return True
    return False


class Channel:
    """One member of a group. Create with :meth:`connect`."""

    def __init__(self, driver: Driver, *, recorder: Recorder | None = None) -> None:
        self.driver = driver
        self.cluster = driver.cluster
        self.recorder = recorder
        self.view: View | None = None
        self.joined = False
        self.blocked = False
        self.closed = False
        self.leaving = False
        self.left_reason: str | None = None
        self.sent = 0
        self.delivered = 0
        self.views_installed = 0
        self._loop = asyncio.get_running_loop()
        self._outbox: list[Message] = []
        self._send_scheduled = False
        self._unblocked = asyncio.Event()
        self._unblocked.set()
        self._joined: asyncio.Future[View | None] = self._loop.create_future()
        self._left: asyncio.Future[str] = self._loop.create_future()
        self._view_changed = asyncio.Event()
        self._on_message: list[Callable[[Message], Any]] = []
        self._on_messages: list[Callable[[list[Message]], Any]] = []
        self._on_view: list[Callable[[View], Any]] = []
        self._on_event: list[Callable[[Event], Any]] = []
        self.file_discovery: FileDiscovery | None = None
        self.discovery: Any = None  # an adapter from connect(discovery=...), e.g. KubeDiscovery
        self.has_membership = driver.stack.layer("gms") is not None
        # State transfer: callbacks, and whether (and when) our state was set.
        self.has_state_layer = driver.stack.layer("state") is not None
        self._get_state: Callable[[], bytes] | None = None
        self._set_state: Callable[[bytes], Any] | None = None
        self._state_ready: asyncio.Future[Address | None] = self._loop.create_future()
        self.state_requested = False
        self.state_donor: Address | None = None
        self.covered = 0  # multicasts received that the transferred state already contained
        driver.on_events = self._on_events

    # -- creation --------------------------------------------------------------------------------------
    @classmethod
    async def connect(
        cls,
        cluster: str,
        bind: tuple[str, int] = ("127.0.0.1", 7800),
        initial_hosts: HostsArg = (),
        stack: StackSpec = "fifo",
        transport: str = "udp",
        record: str | Path | None = None,
        hosts_file: str | Path | None = None,
        stack_overrides: Mapping[str, Mapping[str, Any]] | None = None,
        *,
        join_timeout: float = 30.0,
        incarnation: int | None = None,
        seed: int | None = None,
        on_message: Callable[[Message], Any] | None = None,
        on_messages: Callable[[list[Message]], Any] | None = None,
        on_view: Callable[[View], Any] | None = None,
        on_event: Callable[[Event], Any] | None = None,
        get_state: Callable[[], bytes] | None = None,
        set_state: Callable[[bytes], Any] | None = None,
        discovery: Callable[[Callable[[UpdateHosts], object], tuple[str, int]], Any] | None = None,
        gc_thresholds: tuple[int, int, int] | None = GC_THRESHOLDS,
    ) -> Channel:
        """Bind, start the stack and return once joined (a ChannelError says why if not within ``join_timeout``).

        ``stack`` is a preset name ("fifo") or a bottom-first list of ``{"layer": name, **params}``;
        ``initial_hosts`` go to the discovery layer; ``hosts_file`` is a shared file of endpoints polled every
        second (our endpoint is added to it); ``record`` is a history file (JSON lines) to append to.
        Callbacks given here are registered before the stack starts, so they see every delivery and view,
        including those that happen between joining and this coroutine returning (callbacks registered later
        with :meth:`on_message` etc. only see what comes after). ``get_state``/``set_state`` need a stack
        with the ``state`` layer; with ``set_state`` the member fetches the group's state after joining
        (see :meth:`wait_state`). ``discovery(control, endpoint)`` builds a discovery adapter (e.g.
        :func:`groupcluster.runtime.kube_discovery.factory`) whose ``await start()`` feeds ``UpdateHosts`` before
        the stack starts and whose ``stop()`` is called on close. ``gc_thresholds``: the cyclic garbage
        collector's thresholds, raised process-wide when the channel opens unless the application already set
        its own (:func:`~groupcluster.runtime.driver.tune_gc`); None leaves the collector alone.
        Configuration errors raise :class:`~groupcluster.core.errors.ConfigError` naming the key.
        """
        if not isinstance(cluster, str) or not cluster:
            raise ConfigError(f"cluster: expected a non-empty name, got {cluster!r}")
        spec = build_spec(stack, stack_overrides)
        hosts = parse_hosts(initial_hosts)
        hosts_in_config = _inject_hosts(spec, hosts) if hosts else True
        driver = Driver(
            spec,
            cluster=cluster,
            bind=bind,
            transport=transport,
            incarnation=incarnation,
            seed=seed,
            gc_thresholds=gc_thresholds,
        )
        try:
            await driver.open()
        except OSError as exc:
            raise ChannelError(f"cannot bind {transport} {bind[0]}:{bind[1]}: {exc.strerror or exc}") from None
        try:
            recorder = Recorder(record, driver.address) if record is not None else None
        except OSError as exc:
            driver.close()
            raise ChannelError(f"cannot open the history file {record}: {exc.strerror or exc}") from None
        ch = cls(driver, recorder=recorder)
        if (get_state is not None or set_state is not None) and not ch.has_state_layer:
            driver.close()
            if recorder is not None:
                recorder.close()
            raise ConfigError(
                "get_state/set_state: the stack has no 'state' layer (use a preset that has one, e.g. 'vsync' or "
                "'total-order', or add {'layer': 'state'} at the top)"
            )
        ch._get_state = get_state
        ch._set_state = set_state
        if on_message is not None:
            ch.on_message(on_message)
        if on_messages is not None:
            ch.on_messages(on_messages)
        if on_view is not None:
            ch.on_view(on_view)
        if on_event is not None:
            ch.on_event(on_event)
        try:
            if discovery is not None:
                ch.discovery = discovery(driver.control, driver.address.endpoint)
                await ch.discovery.start()
            ch._start(hosts if not hosts_in_config else (), hosts_file)
            await ch._wait_joined(join_timeout, hosts, hosts_file)
        except OSError as exc:  # the hosts file could not be written or read
            ch.close()
            raise ChannelError(f"hosts file {hosts_file}: {exc.strerror or exc}") from None
        except BaseException:
            ch.close()
            raise
        return ch

    def _start(self, extra_hosts: tuple[tuple[str, int], ...], hosts_file: str | Path | None) -> None:
        if self.recorder is not None:
            self.recorder.start(self._loop)
            self.recorder.start_event()
        # Hosts go to the stack before it starts, so the very first discovery round already probes them.
        if hosts_file is not None:
            self.file_discovery = FileDiscovery(
                hosts_file, self.address.endpoint, self.driver.control, extra_hosts=extra_hosts
            )
            self.file_discovery.start()
        elif extra_hosts:
            self.driver.control(UpdateHosts(extra_hosts))
        self.driver.start()
        if self._set_state is not None:
            # Before any view can arrive (joining takes network round trips): the layer holds from the first on.
            self.state_requested = True
            if self.recorder is not None:
                self.recorder.event("state", op="request")
            self.driver.control(RequestState())

    async def _wait_joined(
        self, timeout: float, hosts: tuple[tuple[str, int], ...], hosts_file: str | Path | None
    ) -> None:
        if not self.has_membership:
            return  # nothing to join: a bare stack is usable as soon as it runs
        try:
            await asyncio.wait_for(asyncio.shield(self._joined), timeout)
        except TimeoutError:
            where = ", ".join(f"{h}:{p}" for h, p in hosts) or "none"
            raise ChannelError(
                f"{self.address} did not join cluster {self.cluster!r} within {timeout:g}s "
                f"(initial hosts: {where}; hosts file: {hosts_file or 'none'})"
            ) from None

    # -- identity and state ------------------------------------------------------------------------------
    @property
    def address(self) -> Address:
        return self.driver.address

    @property
    def members(self) -> tuple[Address, ...]:
        return self.view.members if self.view is not None else ()

    @property
    def is_coordinator(self) -> bool:
        return self.view is not None and self.view.coordinator == self.address

    def metrics(self) -> dict[str, int]:
        """Protocol and runtime counters (e.g. ``transport.bad_frames``, ``runtime.udp_send_errors``)."""
        return self.driver.all_metrics()

    # -- callbacks -------------------------------------------------------------------------------------
    def on_message(self, fn: Callable[[Message], Any]) -> None:
        """Call ``fn(message)`` for every delivered message (``message.src`` is the sender)."""
        self._on_message.append(fn)

    def on_messages(self, fn: Callable[[list[Message]], Any]) -> None:
        """Call ``fn(batch)`` for every delivered batch of messages."""
        self._on_messages.append(fn)

    def on_view(self, fn: Callable[[View], Any]) -> None:
        """Call ``fn(view)`` for every view installed (the first is the view we joined)."""
        self._on_view.append(fn)

    def on_event(self, fn: Callable[[Event], Any]) -> None:
        """Call ``fn(event)`` for other stack events (Backpressure, Block, Unblock, ...)."""
        self._on_event.append(fn)

    async def wait_for_view(self, predicate: Callable[[View], bool], timeout: float) -> View:
        """Wait until the installed view satisfies ``predicate``; TimeoutError after ``timeout`` seconds."""

        async def waiter() -> View:
            while self.view is None or not predicate(self.view):
                if self.closed:
                    raise ChannelClosed("the channel is closed")
                self._view_changed.clear()
                await self._view_changed.wait()
            return self.view

        return await asyncio.wait_for(waiter(), timeout)

    # -- state transfer --------------------------------------------------------------------------------
    @property
    def state_ready(self) -> bool:
        """True once our state was set (or we founded the group and had none to fetch)."""
        return self._state_ready.done() and not self._state_ready.cancelled()

    async def wait_state(self, timeout: float) -> Address | None:
        """Wait until the state transferred at join was set; returns the donor (None: we founded the group).

        TimeoutError after ``timeout`` seconds; ChannelError if this channel did not ask for state (no
        ``set_state`` given to :meth:`connect`).
        """
        if not self.state_requested:
            raise ChannelError("no state transfer was requested: pass set_state to Channel.connect")
        return await asyncio.wait_for(asyncio.shield(self._state_ready), timeout)

    def _serve_state(self, ev: GetState) -> None:
        # Called in delivery order: the state now is exactly what the deliveries before this event made it.
        try:
            data = self._get_state() if self._get_state is not None else b""
            if not isinstance(data, bytes | bytearray | memoryview):
                raise TypeError(f"get_state must return bytes, got {type(data).__name__}")
        except Exception:
            # No answer: the joiner's request times out and it asks another member.
            log.exception("%s: get_state raised; not serving state to %s", self.address, ev.transfer[0])
            return
        if self.recorder is not None:
            self.recorder.event("state", op="get", transfer=[str(ev.transfer[0]), ev.transfer[1]], size=len(data))
        self.driver.control(StateSnapshot(ev.transfer, bytes(data)))

    def _on_set_state(self, ev: SetState) -> None:
        self.state_donor = ev.donor
        if self.recorder is not None:
            transfer = None if ev.transfer is None else [str(ev.transfer[0]), ev.transfer[1]]
            donor = None if ev.donor is None else str(ev.donor)
            size = 0 if ev.state is None else len(ev.state)
            self.recorder.event("state", op="set", donor=donor, transfer=transfer, size=size)
        if ev.state is not None and self._set_state is not None:
            try:
                self._set_state(ev.state)
            except Exception:
                log.exception("%s: set_state raised", self.address)
        if not self._state_ready.done():
            self._state_ready.set_result(ev.donor)

    def _on_covered(self, msgs: list[Message]) -> None:
        self.covered += len(msgs)
        if self.recorder is not None:
            self.recorder.delivers(msgs, via="state")

    # -- sending ---------------------------------------------------------------------------------------
    def send(self, payload: bytes, dest: Address | None = None, flags: int = 0) -> None:
        """Queue ``payload`` for the group (``dest`` None) or one member; it leaves in this loop iteration."""
        if self.closed or self.leaving:
            raise ChannelClosed("the channel is closed" if self.closed else "the channel is leaving")
        if type(payload) is not bytes:
            if not isinstance(payload, bytes | bytearray | memoryview):
                raise TypeError(f"payload: expected bytes, got {type(payload).__name__}")
            payload = bytes(payload)
        self._outbox.append(Message(dest, payload, flags=flags))
        if not self._send_scheduled:
            self._send_scheduled = True
            self._loop.call_soon(self._flush_sends)

    def send_many(self, payloads: Iterable[bytes], dest: Address | None = None) -> None:
        """Queue several payloads at once (same as calling :meth:`send` for each)."""
        if self.closed or self.leaving:
            raise ChannelClosed("the channel is closed" if self.closed else "the channel is leaving")
        self._outbox.extend(Message(dest, p) for p in payloads)
        if not self._send_scheduled:
            self._send_scheduled = True
            self._loop.call_soon(self._flush_sends)

    async def send_async(self, payload: bytes, dest: Address | None = None, flags: int = 0) -> None:
        """Like :meth:`send`, but first waits while flow control holds senders back."""
        while self.blocked and not self.closed:
            await self._unblocked.wait()
        self.send(payload, dest, flags)

    async def wait_unblocked(self) -> None:
        """Return once flow control lets senders go on (at once if it does already)."""
        while self.blocked and not self.closed:
            await self._unblocked.wait()

    def _flush_sends(self) -> None:
        self._send_scheduled = False
        if not self._outbox or self.closed:
            self._outbox.clear()
            return
        msgs, self._outbox = self._outbox, []
        if self.recorder is not None:
            self.recorder.sends(msgs, self.view)
        self.sent += len(msgs)
        self.driver.send_many(msgs)

    # -- events from the stack -------------------------------------------------------------------------
    def _on_events(self, events: list[Event]) -> None:  # noqa: C901  the stack's event dispatch: one case per event type
        for ev in events:
            if type(ev) is Deliver:
                self._deliver(ev.messages)
            elif type(ev) is ViewChange:
                self._install(ev.view)
            elif type(ev) is Joined:
                self._install(ev.view)
                self.joined = True
                if not self._joined.done():
                    self._joined.set_result(ev.view)
            elif type(ev) is JoinFailed:
                log.warning("%s: join failed: %s", self.address, ev.reason)
                if not self._joined.done():
                    self._joined.set_exception(
                        ChannelError(f"{self.address} could not join {self.cluster!r}: {ev.reason}")
                    )
            elif type(ev) is GetState:
                self._serve_state(ev)
            elif type(ev) is SetState:
                self._on_set_state(ev)
            elif type(ev) is StateCovered:
                self._on_covered(ev.messages)
            elif type(ev) is Left:
                self.left_reason = ev.reason
                if self.recorder is not None:
                    self.recorder.event("left", reason=ev.reason)
                if not self._left.done():
                    self._left.set_result(ev.reason)
            else:
                if type(ev) is Backpressure:
                    self.blocked = ev.blocked
                    if self.blocked:
                        self._unblocked.clear()
                    else:
                        self._unblocked.set()
                for fn in self._on_event:
                    self._call(fn, ev)

    def _deliver(self, msgs: list[Message]) -> None:
        self.delivered += len(msgs)
        if self.recorder is not None:
            self.recorder.delivers(msgs)
        for batch_fn in self._on_messages:
            self._call(batch_fn, msgs)
        for fn in self._on_message:
            try:
                for msg in msgs:
                    fn(msg)
            except Exception:
                log.exception("%s: on_message callback raised", self.address)

    def _install(self, view: View) -> None:
        if self.view is not None and self.view.view_id == view.view_id:
            return
        self.view = view
        self.views_installed += 1
        if self.recorder is not None:
            self.recorder.view(view)
        self._view_changed.set()
        for fn in self._on_view:
            self._call(fn, view)

    def _call(self, fn: Callable[[Any], Any], arg: Any) -> None:
        try:
            fn(arg)
        except Exception:
            log.exception("%s: callback %r raised", self.address, fn)

    # -- leaving ---------------------------------------------------------------------------------------
    async def flush(self, timeout: float = 10.0) -> View:
        """Flush the whole group and return the view that ends the flush (same members, new view id).

        Every member blocks, delivers the same multicasts of the current view, and is unblocked by the new view
        (virtual synchrony, as for any view change). Needs a flushing stack (``vsync``); any member may ask.
        """
        if self.closed:
            raise ChannelClosed("the channel is closed")
        before = self.view
        if not self.driver.control(FlushGroup()):
            raise ChannelError("flush: the stack does not flush (use the 'vsync' preset or set gms.use_flush)")
        return await self.wait_for_view(lambda v: before is None or v.view_id != before.view_id, timeout)

    async def leave(self, timeout: float = 10.0) -> bool:
        """Leave the group gracefully and close; returns False if the leave did not complete in time."""
        if self.closed:
            return self._left.done()
        self._flush_sends()
        self.leaving = True
        if self.recorder is not None:
            self.recorder.event("leave")
        ok = True
        if self.has_membership:
            self.driver.leave()
            try:
                await asyncio.wait_for(asyncio.shield(self._left), timeout)
            except TimeoutError:
                ok = False
                log.warning("%s: leave did not complete within %gs; closing anyway", self.address, timeout)
        self.close()
        return ok

    def close(self) -> None:
        """Stop at once: no leave protocol, sockets closed, the history flushed."""
        if self.closed:
            return
        self.closed = True
        if self.file_discovery is not None:
            self.file_discovery.stop()
        if self.discovery is not None:
            self.discovery.stop()
        self.driver.close()
        if self.recorder is not None:
            self.recorder.close()
        self._unblocked.set()
        self._view_changed.set()
        for fut in (self._joined, self._left, self._state_ready):
            if not fut.done():
                fut.set_exception(ChannelClosed("the channel was closed"))
                with contextlib.suppress(BaseException):
                    fut.exception()  # mark retrieved: nobody may be waiting

    async def __aenter__(self) -> Channel:
        return self

    async def __aexit__(self, *exc: object) -> None:
        if not self.closed:
            await self.leave()
