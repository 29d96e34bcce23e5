"""The Layer interface: one sans-IO protocol state machine in a stack.

Messages travel down one at a time (``down``) and up as batches from one sender (``up``); control events
travel with ``down_event`` (which may return a value, e.g. a digest) and ``up_event``. A layer never does
I/O or reads the clock: it gets ``now``, a seeded RNG and timers from its :class:`LayerContext`.
"""

from __future__ import annotations

import dataclasses
import logging
import random
from collections import Counter
from collections.abc import Hashable
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from .address import Address
from .events import Event
from .message import Message
from .native import mypyc_attr

if TYPE_CHECKING:
    from .stack import Stack


@dataclasses.dataclass(frozen=True)
class NoConfig:
    """For layers without parameters."""


class LayerContext:
    """What the stack lends a layer: identity, time, a seeded RNG, timers and counters."""

    __slots__ = ("_stack", "index", "log", "metrics", "rng")

    def __init__(self, stack: Stack, index: int, rng: random.Random, log: logging.Logger) -> None:
        self._stack = stack
        self.index = index
        self.rng = rng
        self.metrics: Counter[str] = stack.metrics
        self.log = log

    @property
    def now(self) -> float:
        return self._stack.now

    @property
    def local_address(self) -> Address:
        return self._stack.local_address

    @property
    def cluster(self) -> str:
        return self._stack.cluster

    def set_timer(self, key: Hashable, delay: float) -> None:
        self._stack._set_timer(self.index, key, self._stack.now + delay)

    def cancel_timer(self, key: Hashable) -> None:
        self._stack._cancel_timer(self.index, key)

    def has_timer(self, key: Hashable) -> bool:
        return (self.index, key) in self._stack._timer_index

    def transmit(self, endpoint: tuple[str, int], data: bytes) -> None:
        """Bottom layer only: hand bytes to the driver for sending."""
        self._stack._transmit(endpoint, data)

    def output(self, event: Event) -> None:
        """Hand an event to the driver (used by the top of the stack)."""
        self._stack._outputs.append(event)


# Compiled, the layers above NAKACK..FRAG (and tests' probes) still subclass it as Python classes.
@mypyc_attr(allow_interpreted_subclasses=True)
class Layer:
    """Base class: by default every call passes straight through."""

    NAME: ClassVar[str] = ""
    PROTO_ID: ClassVar[int] = 0
    Config: ClassVar[type] = NoConfig
    IS_TRANSPORT: ClassVar[bool] = False

    # The neighbours, set by the Stack when it wires the layers (never None once the stack exists: the bottom
    # layer's ``below`` and the top layer's ``above`` are the Stack's own end pieces).
    above: Layer
    below: Layer

    def __init__(self, config: Any, ctx: LayerContext) -> None:
        self.config = config
        self.ctx = ctx

    # -- lifecycle -------------------------------------------------------------------------------------
    def start(self) -> None:
        """Called once, bottom-up, when the stack starts."""

    def stop(self) -> None:
        """Called once, top-down, when the stack stops."""

    def end_of_step(self) -> bool:
        """Called after every driver step, top-down: flush what was batched during the step.

        Return True if this produced work for other layers (the stack then runs another round).
        """
        return False

    # -- traffic ---------------------------------------------------------------------------------------
    def down(self, msg: Message) -> None:
        self.below.down(msg)

    def up(self, batch: list[Message]) -> None:
        self.above.up(batch)

    def down_event(self, event: Event) -> Any:
        return self.below.down_event(event)

    def up_event(self, event: Event) -> None:
        self.above.up_event(event)

    def on_timer(self, key: Hashable) -> None:
        """A timer set with :meth:`set_timer` fired."""

    def receive(self, data: bytes) -> None:
        """Bottom layer only (``IS_TRANSPORT``): bytes arrived from the network."""
        raise NotImplementedError(f"{self.NAME or type(self).__name__} is not a transport: it cannot receive bytes")

    # -- helpers ---------------------------------------------------------------------------------------
    @property
    def now(self) -> float:
        return self.ctx._stack.now

    @property
    def local_address(self) -> Address:
        return self.ctx._stack.local_address

    def set_timer(self, key: Hashable, delay: float) -> None:
        self.ctx.set_timer(key, delay)

    def cancel_timer(self, key: Hashable) -> None:
        self.ctx.cancel_timer(key)

    def count(self, name: str, n: int = 1) -> None:
        self.ctx.metrics[f"{self.NAME}.{name}"] += n

    def describe_state(self) -> dict[str, Any]:
        """A small JSON-able summary for status pages and debugging."""
        return {}


LAYER_TYPES: dict[str, type[Layer]] = {}
L = TypeVar("L", bound=type[Layer])


def register_layer(cls: L) -> L:
    """Make a layer available to stack configurations under ``cls.NAME``.

    Called after the class (``register_layer(Cls)``) rather than as a decorator where the module is compiled
    with mypyc: a decorated class would be compiled as a plain Python class, not a native one."""
    if not cls.NAME:
        raise RuntimeError(f"{cls.__qualname__} has no NAME")
    existing = LAYER_TYPES.get(cls.NAME)
    if existing is not None and existing is not cls:
        raise RuntimeError(f"layer name {cls.NAME!r} is claimed by {existing.__qualname__} and {cls.__qualname__}")
    LAYER_TYPES[cls.NAME] = cls
    return cls


def split_batch(batch: list[Message], pid: int) -> tuple[list[Message], list[tuple[Message, Any]]]:
    """Split ``batch`` into the messages for the layers above and (message, header) pairs carrying ``pid``.

    The common case — no message of this protocol — costs one scan and returns ``batch`` itself. Use it where
    the relative order of the two kinds does not matter (control messages that change nothing the
    application sees in between); GMS, whose views must be delivered in order, keeps its own loop.
    """
    # A plain loop: compiled, a generator expression is an object and a call per message.
    first = -1
    for k in range(len(batch)):
        if pid in batch[k].headers:
            first = k
            break
    if first < 0:
        return batch, []
    rest = batch[:first]
    own: list[tuple[Message, Any]] = []
    for msg in batch[first:]:
        hdr = msg.headers.get(pid)
        if hdr is None:
            rest.append(msg)
        else:
            own.append((msg, hdr))
    return rest, own
