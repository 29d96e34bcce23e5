"""A Stack: layers built from a bottom-first configuration, driven by one of two thin drivers.

Drivers (the asyncio runtime and the simulator) call ``start``, ``receive``, ``fire_timers``, ``send``,
``leave`` and ``control`` with the current time, then ``drain`` the outputs: :class:`Transmit` actions
(bytes to an endpoint) and events for the application (:class:`~groupcluster.core.events.Deliver`,
view changes, joined/left, backpressure). Everything inside is deterministic given the seed and the inputs.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import random
from collections import Counter
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .address import Address
from .config import parse_params
from .errors import ConfigError
from .events import Connect, Deliver, Disconnect, Event
from .layer import LAYER_TYPES, Layer, LayerContext
from .message import Message

log = logging.getLogger("groupcluster.stack")


@dataclass(frozen=True, slots=True)
class Transmit:
    """Send ``data`` to the member listening at ``endpoint``."""

    endpoint: tuple[str, int]
    data: bytes


LayerSpec = Mapping[str, Any]


def resolve_config(spec: Sequence[LayerSpec]) -> list[tuple[type[Layer], Any]]:
    """Validate a bottom-first list of ``{"layer": name, **params}`` into layer classes and configs."""
    if not isinstance(spec, Sequence) or isinstance(spec, str) or not spec:
        raise ConfigError("stack: expected a non-empty list of layers, bottom first")
    resolved: list[tuple[type[Layer], Any]] = []
    allowed = ", ".join(sorted(LAYER_TYPES))
    for i, entry in enumerate(spec):
        if not isinstance(entry, Mapping):
            raise ConfigError(f"stack[{i}]: expected a mapping with a 'layer' key, got {entry!r}")
        name = entry.get("layer")
        cls = LAYER_TYPES.get(name) if isinstance(name, str) else None
        if cls is None:
            raise ConfigError(f"stack[{i}].layer: unknown layer {name!r}; allowed values: {allowed}")
        params = {k: v for k, v in entry.items() if k != "layer"}
        resolved.append((cls, parse_params(cls.Config, params, f"stack[{i}] ({name})")))
    if not resolved[0][0].IS_TRANSPORT:
        raise ConfigError(f"stack[0].layer: the bottom layer must be a transport, got {resolved[0][0].NAME!r}")
    names = [cls.NAME for cls, _ in resolved]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ConfigError(f"stack: layer(s) listed twice: {', '.join(dupes)}")
    return resolved


class _Top(Layer):
    """Above the top layer: turns what arrives into outputs for the driver."""

    NAME = "_top"

    def up(self, batch: list[Message]) -> None:
        if batch:
            self.ctx.output(Deliver(batch))

    def up_event(self, event: Event) -> None:
        self.ctx.output(event)


class _Bottom(Layer):
    """Below the transport: absorbs events nobody handled."""

    NAME = "_bottom"

    def down(self, msg: Message) -> None:  # pragma: no cover - the transport never passes messages down
        raise RuntimeError("a message fell off the bottom of the stack")

    def down_event(self, event: Event) -> Any:
        return None


class Stack:
    """One member's protocol stack."""

    def __init__(
        self,
        spec: Sequence[LayerSpec],
        *,
        local_address: Address,
        cluster: str,
        seed: int = 0,
        now: float = 0.0,
        logger: logging.Logger | None = None,
    ) -> None:
        if local_address.is_placeholder():
            raise ConfigError("local_address: incarnation must be non-zero (0 is reserved for discovery)")
        self.local_address = local_address
        self.cluster = cluster
        self.seed = seed
        self.now = now
        self.metrics: Counter[str] = Counter()
        self._outputs: list[Any] = []
        self._timers: list[list[Any]] = []
        self._timer_index: dict[tuple[int, Hashable], list[Any]] = {}
        self._timer_seq = 0
        self.started = False
        self.stopped = False
        base_log = logger or log
        resolved = resolve_config(spec)
        self.layers: list[Layer] = []
        for index, (cls, cfg) in enumerate(resolved):
            rng = random.Random(f"{seed}/{local_address}/{index}/{cls.NAME}")
            ctx = LayerContext(self, index, rng, base_log.getChild(cls.NAME))
            self.layers.append(cls(cfg, ctx))
        n = len(self.layers)
        self._top = _Top(None, LayerContext(self, n, random.Random(0), base_log))
        self._bottom = _Bottom(None, LayerContext(self, -1, random.Random(0), base_log))
        chain = [self._bottom, *self.layers, self._top]
        for lower, upper in itertools.pairwise(chain):
            lower.above = upper
            upper.below = lower
        self._step_enders = [
            layer for layer in reversed(self.layers) if type(layer).end_of_step is not Layer.end_of_step
        ]

    # -- lookup ---------------------------------------------------------------------------------------
    def layer(self, name: str) -> Layer | None:
        for layer in self.layers:
            if layer.NAME == name:
                return layer
        return None

    # -- driver entry points ----------------------------------------------------------------------------
    def start(self, now: float) -> None:
        """Start every layer and begin joining the group."""
        self._advance(now)
        self.started = True
        for layer in self.layers:
            layer.start()
        self.layers[-1].down_event(Connect())
        self._end_step()

    def receive(self, now: float, data: bytes) -> None:
        """Bytes arrived from the network."""
        if self.stopped:
            return
        self._advance(now)
        self.layers[0].receive(data)
        self._end_step()

    def receive_many(self, now: float, frames: Sequence[bytes]) -> None:
        """Several frames arrived together: one step for all of them, so what the layers batch per step (acks,
        a sequencer's batch, frames out) covers them all. The more a member lags behind, the larger its steps
        and the less it spends per message, instead of one full step per frame. A frame whose handling raises
        does not keep the others from being handled; the first such error is raised after the step ends."""
        if self.stopped:
            return
        self._advance(now)
        receive = self.layers[0].receive
        error: Exception | None = None
        for data in frames:
            try:
                receive(data)
            except Exception as exc:
                error = error or exc
        self._end_step()
        if error is not None:
            raise error

    def fire_timers(self, now: float) -> None:
        """Run every timer whose deadline is at or before ``now``."""
        if self.stopped:
            return
        self._advance(now)
        timers = self._timers
        while timers and timers[0][0] <= now:
            _deadline, _, index, key, alive = heapq.heappop(timers)
            if not alive:
                continue
            del self._timer_index[(index, key)]
            self.layers[index].on_timer(key)
        self._end_step()

    def send(self, now: float, payload: bytes, dest: Address | None = None, flags: int = 0) -> None:
        """Send an application message to the group (``dest`` None) or to one member."""
        self.send_many(now, [Message(dest, payload, flags=flags)])

    def send_many(self, now: float, messages: Sequence[Message]) -> None:
        """Send several application messages in one step (they share frames)."""
        if self.stopped:
            raise RuntimeError("the stack is stopped")
        self._advance(now)
        top = self.layers[-1]
        for msg in messages:
            top.down(msg)
        self._end_step()

    def control(self, now: float, event: Event) -> Any:
        """Pass a control event down from the application (e.g. UpdateHosts); returns the layers' answer."""
        self._advance(now)
        result = self.layers[-1].down_event(event)
        self._end_step()
        return result

    def leave(self, now: float) -> None:
        """Leave gracefully; a :class:`~groupcluster.core.events.Left` output says when it is done."""
        self.control(now, Disconnect())

    def stop(self) -> None:
        """Stop at once (the process is going away); nothing more is sent."""
        if self.stopped:
            return
        for layer in reversed(self.layers):
            layer.stop()
        self.stopped = True
        self._timers.clear()
        self._timer_index.clear()

    def next_deadline(self) -> float | None:
        """When ``fire_timers`` should next be called, or None without timers."""
        timers = self._timers
        while timers and not timers[0][4]:
            heapq.heappop(timers)
        return timers[0][0] if timers else None

    def drain(self) -> list[Any]:
        """Take the outputs produced since the last call, in order."""
        out, self._outputs = self._outputs, []
        return out

    def describe(self) -> dict[str, Any]:
        return {layer.NAME: layer.describe_state() for layer in self.layers}

    # -- used by LayerContext -----------------------------------------------------------------------------
    def _advance(self, now: float) -> None:
        if now > self.now:
            self.now = now

    def _end_step(self) -> None:
        # Rounds until quiet: e.g. loopback deliveries in the transport make upper layers queue acks,
        # which must still leave in this step's frames.
        for _ in range(1000):
            busy = False
            for layer in self._step_enders:
                if layer.end_of_step():
                    busy = True
            if not busy:
                return
        raise RuntimeError("the stack did not settle after 1000 rounds of end-of-step work")

    def _set_timer(self, index: int, key: Hashable, deadline: float) -> None:
        old = self._timer_index.get((index, key))
        if old is not None:
            old[4] = False
        self._timer_seq += 1
        entry = [deadline, self._timer_seq, index, key, True]
        self._timer_index[(index, key)] = entry
        heapq.heappush(self._timers, entry)

    def _cancel_timer(self, index: int, key: Hashable) -> None:
        old = self._timer_index.pop((index, key), None)
        if old is not None:
            old[4] = False

    def _transmit(self, endpoint: tuple[str, int], data: bytes) -> None:
        if not self.stopped:
            self._outputs.append(Transmit(endpoint, data))
