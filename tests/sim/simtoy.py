"""A toy stack for testing the simulator's plumbing without the real protocol layers.

``toy_members`` sits on the transport: it says hello to every endpoint in ``initial_hosts`` every
``hello_interval`` and installs a view of everyone it has heard from. A view's id encodes its member set
(seq = bitmask of incarnations), so equal ids always mean equal members and a member's seqs only grow: the
checkers accept its views. It has no reliability and no failure detection, so
it only converges and delivers everything on a clean network; ``toy_duplicator`` delivers every message
twice when ``enabled`` (a broken layer for checking that failures are caught and replayed).
"""

from __future__ import annotations

import random as _global_random
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

from groupcluster.core.address import Address
from groupcluster.core.config import param
from groupcluster.core.events import Connect, Disconnect, Event, Joined, Left, ViewChange
from groupcluster.core.layer import LAYER_TYPES, Layer, register_layer
from groupcluster.core.message import NO_RELIABILITY, Message
from groupcluster.core.view import View, ViewId

HELLO = b"\x00toy-hello"


@dataclass(frozen=True)
class ToyMembersConfig:
    initial_hosts: tuple[tuple[str, int], ...] = param((), "hosts", doc="endpoints to greet")
    hello_interval: float = param("200ms", "duration", doc="how often to greet")


class ToyMembers(Layer):
    NAME = "toy_members"
    Config = ToyMembersConfig

    def __init__(self, config: ToyMembersConfig, ctx: Any) -> None:
        super().__init__(config, ctx)
        self.known: dict[tuple[str, int], Address] = {}
        self.view: View | None = None
        self.connected = False

    def down_event(self, event: Event) -> Any:
        if isinstance(event, Connect):
            self.connected = True
            self.known[self.local_address.endpoint] = self.local_address
            self._install()
            self.on_timer("hello")
            return None
        if isinstance(event, Disconnect):
            self.connected = False
            self.cancel_timer("hello")
            self.above.up_event(Left("toy leave"))
            return None
        return self.below.down_event(event)

    def on_timer(self, key: Hashable) -> None:
        if key != "hello" or not self.connected:
            return
        for host, port in self.config.initial_hosts:
            if (host, port) != self.local_address.endpoint:
                self.below.down(Message(Address(host, port, 0), HELLO, flags=NO_RELIABILITY))
        self.set_timer("hello", self.config.hello_interval)

    def up(self, batch: list[Message]) -> None:
        app = []
        changed = False
        for msg in batch:
            if msg.payload == HELLO:
                assert msg.src is not None
                if self.known.get(msg.src.endpoint) != msg.src:
                    self.known[msg.src.endpoint] = msg.src
                    changed = True
            else:
                app.append(msg)
        if changed and self.connected:
            self._install()
        if app:
            self.above.up(app)

    def _install(self) -> None:
        members = tuple(sorted(self.known.values()))
        # Incarnations are unique, so this seq names the member set, and it grows as members are added
        # or replaced by newer incarnations.
        seq = sum(1 << m.incarnation for m in members)
        view = View(ViewId(seq, members[0]), members)
        first = self.view is None
        self.view = view
        self.below.down_event(ViewChange(view))
        self.above.up_event(ViewChange(view))
        if first:
            self.above.up_event(Joined(view))


@dataclass(frozen=True)
class ToyDuplicatorConfig:
    enabled: bool = param(True, "bool", doc="deliver every message twice")


class ToyDuplicator(Layer):
    NAME = "toy_duplicator"
    Config = ToyDuplicatorConfig

    def up(self, batch: list[Message]) -> None:
        self.above.up(batch + batch if self.config.enabled else batch)


@dataclass(frozen=True)
class ToyCrasherConfig:
    after: int = param(3, "int", doc="raise on the n-th application message sent")


class ToyCrasher(Layer):
    """Raises on the n-th message sent: stands in for a protocol bug that throws."""

    NAME = "toy_crasher"
    Config = ToyCrasherConfig

    def __init__(self, config: ToyCrasherConfig, ctx: Any) -> None:
        super().__init__(config, ctx)
        self.sent = 0

    def down(self, msg: Message) -> None:
        self.sent += 1
        if self.sent == self.config.after:
            raise RuntimeError("toy crasher fired")
        self.below.down(msg)


class ToyUnseeded(Layer):
    """Drops half the messages it passes up using the *global* random generator: a determinism bug."""

    NAME = "toy_unseeded"

    def up(self, batch: list[Message]) -> None:
        self.above.up([m for m in batch if _global_random.random() < 0.5])


for _cls in (ToyMembers, ToyDuplicator, ToyCrasher, ToyUnseeded):
    if _cls.NAME not in LAYER_TYPES:
        register_layer(_cls)

TOY_STACK: list[dict[str, Any]] = [{"layer": "transport"}, {"layer": "toy_members"}]
