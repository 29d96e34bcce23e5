"""A small pure harness to unit-test protocol layers through a real :class:`Stack`.

Build a stack from a bottom-first spec (a transport is added at the bottom when missing), feed it frames
encoded with the real wire codec from fake peer addresses, move time forward, and look at what came out:
frames the transport put on the wire (decoded back into messages), messages delivered at the top and
events that reached the top. Nothing is mocked except the network and the clock, which the test drives.

Typical use::

    h = LayerHarness([{"layer": "fd", "interval": "1s"}])
    h.install_view([h.me, PEER])           # ViewChange down (transport targets) and, optionally, up
    h.receive(PEER, [Message(None, b"x")])  # a frame from PEER
    h.advance(2.5)                          # fire every timer due in the next 2.5 s, in order
    sent = h.take_sent()                    # [(endpoint, Message), ...] that left on the wire
    got = h.take_delivered()                # messages that came out of the top
    events = h.take_events()                # up events that came out of the top (Suspect, MembersFound, ...)

After calling a layer directly (``h.layer("fd").up(batch)``), ``h.collect()`` picks up what it produced.

A :class:`Probe` layer (``{"layer": "probe"}``) can be placed anywhere in the spec to record what passes it
and to answer down events (e.g. stand in for discovery or NAKACK below the layer under test).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from groupcluster.core import protocol_ids
from groupcluster.core.address import Address
from groupcluster.core.events import Deliver, Event, ViewChange
from groupcluster.core.layer import LAYER_TYPES, Layer, NoConfig, register_layer
from groupcluster.core.message import Message
from groupcluster.core.stack import Stack, Transmit
from groupcluster.core.view import View, ViewId
from groupcluster.core.wire import FORMAT_VERSION, decode_frame_version, encode_messages
from groupcluster.protocols import transport as _transport  # noqa: F401  (registers "transport")

CLUSTER = "test"
ME = Address("127.0.0.1", 7800, 1)
PEERS = tuple(Address("127.0.0.1", 7801 + i, 100 + i) for i in range(8))


def addr(port: int, incarnation: int = 1, host: str = "127.0.0.1") -> Address:
    return Address(host, port, incarnation)


def make_view(members: Sequence[Address], seq: int = 1, creator: Address | None = None) -> View:
    members = tuple(members)
    return View(ViewId(seq, creator or members[0]), members)


@dataclass(frozen=True, slots=True)
class Frame:
    """One Transmit output decoded: where it went, who sent it, and its messages."""

    endpoint: tuple[str, int]
    sender: Address
    messages: list[Message]
    version: int = FORMAT_VERSION  # RUNS_VERSION: the frame may hold runs


@dataclass
class ProbeLog:
    """What a :class:`Probe` saw."""

    down: list[Message] = field(default_factory=list)
    up: list[list[Message]] = field(default_factory=list)
    down_events: list[Event] = field(default_factory=list)
    up_events: list[Event] = field(default_factory=list)


class Probe(Layer):
    """Pass-through layer that records traffic; ``answer`` may intercept down events.

    ``answer(event)`` returns ``(True, value)`` to consume the event with ``value`` as its result, or
    ``(False, None)`` to pass it on. Set ``Probe.log`` / ``Probe.answer`` through :meth:`LayerHarness.probe`.
    """

    NAME = "probe"
    PROTO_ID = 0
    Config = NoConfig

    def __init__(self, config: Any, ctx: Any) -> None:
        super().__init__(config, ctx)
        self.log = ProbeLog()
        self.answer: Callable[[Event], tuple[bool, Any]] | None = None
        self.swallow_down = False  # True: messages stop here (a fake bottom that records what came down)

    def down(self, msg: Message) -> None:
        self.log.down.append(msg)
        if not self.swallow_down:
            self.below.down(msg)

    def up(self, batch: list[Message]) -> None:
        self.log.up.append(batch)  # the list object itself: tests can check that a layer did not copy it
        self.above.up(batch)

    def down_event(self, event: Event) -> Any:
        self.log.down_events.append(event)
        if self.answer is not None:
            handled, value = self.answer(event)
            if handled:
                return value
        return self.below.down_event(event)

    def up_event(self, event: Event) -> None:
        self.log.up_events.append(event)
        self.above.up_event(event)

    def inject_up(self, batch: list[Message]) -> None:
        """Pass ``batch`` up from here, as if the layers below had delivered it."""
        self.above.up(batch)

    def inject_up_event(self, event: Event) -> None:
        self.above.up_event(event)


if "probe" not in LAYER_TYPES:
    register_layer(Probe)


class LayerHarness:
    """Drive a real Stack with a fake network and a manual clock."""

    def __init__(
        self,
        spec: Sequence[dict[str, Any]],
        *,
        me: Address = ME,
        cluster: str = CLUSTER,
        seed: int = 0,
        now: float = 0.0,
        start: bool = True,
    ) -> None:
        spec = [dict(s) for s in spec]
        if not spec or spec[0].get("layer") != "transport":
            spec.insert(0, {"layer": "transport"})
        self.me = me
        self.cluster = cluster
        self.now = now
        self.stack = Stack(spec, local_address=me, cluster=cluster, seed=seed, now=now)
        self.frames: list[Frame] = []
        self.hellos: list[Frame] = []
        self.delivered: list[Message] = []
        self.events: list[Event] = []
        if start:
            self.start()

    # -- access ------------------------------------------------------------------------------------
    def layer(self, name: str) -> Any:
        layer = self.stack.layer(name)
        if layer is None:
            raise KeyError(f"no layer {name!r} in this stack")
        return layer

    def probe(self, index: int = 0) -> Probe:
        """The ``index``-th probe layer, bottom first."""
        probes = [la for la in self.stack.layers if isinstance(la, Probe)]
        return probes[index]

    @property
    def metrics(self) -> dict[str, int]:
        return dict(self.stack.metrics)

    def metric(self, name: str) -> int:
        return self.stack.metrics.get(name, 0)

    # -- driving -----------------------------------------------------------------------------------
    def start(self) -> None:
        self.stack.start(self.now)
        self._collect()

    def receive(
        self, sender: Address, messages: Iterable[Message], *, cluster: str | None = None, runs: bool = False
    ) -> None:
        """A frame from ``sender`` carrying ``messages`` (encoded with the real codec, in runs if ``runs``) arrives."""
        data = encode_messages(cluster or self.cluster, sender, list(messages), runs)
        self.receive_raw(data)

    def receive_raw(self, data: bytes) -> None:
        self.stack.receive(self.now, data)
        self._collect()

    def send(self, payload: bytes = b"", dest: Address | None = None, flags: int = 0) -> None:
        """The application sends one message."""
        self.stack.send(self.now, payload, dest, flags)
        self._collect()

    def send_many(self, messages: Sequence[Message]) -> None:
        self.stack.send_many(self.now, messages)
        self._collect()

    def control(self, event: Event) -> Any:
        """A down event from the application, through the whole stack; returns the layers' answer."""
        result = self.stack.control(self.now, event)
        self._collect()
        return result

    def up_event_from_bottom(self, event: Event) -> None:
        """An up event entering just above the transport (as if a lower layer had raised it)."""
        self.stack._advance(self.now)
        self.stack.layers[0].up_event(event)
        self.stack._end_step()
        self._collect()

    def install_view(self, members: Sequence[Address], seq: int = 1, *, down: bool = True, up: bool = True) -> View:
        """Make ``members`` the view: ViewChange down (as GMS does below itself) and up (above GMS)."""
        view = make_view(members, seq)
        if down:
            self.control(ViewChange(view))
        if up:
            self.up_event_from_bottom(ViewChange(view))
        return view

    def fire(self) -> None:
        """Fire timers due at the current time."""
        self.stack.fire_timers(self.now)
        self._collect()

    def advance(self, seconds: float) -> None:
        """Move the clock forward, firing every timer on its own deadline (re-armed timers included)."""
        target = self.now + seconds
        for _ in range(1_000_000):
            deadline = self.stack.next_deadline()
            if deadline is None or deadline > target:
                break
            self.now = max(self.now, deadline)
            self.fire()
        else:
            raise RuntimeError(f"timers keep firing at t={self.now}: a layer re-arms a timer without delay")
        self.now = target
        self.fire()

    def advance_to(self, t: float) -> None:
        self.advance(max(0.0, t - self.now))

    def timer_keys(self) -> list[Hashable]:
        """Live timer keys of every layer (for asserting that a layer armed or cancelled a timer)."""
        return [key for (_index, key) in self.stack._timer_index]

    # -- outputs -----------------------------------------------------------------------------------
    def collect(self) -> LayerHarness:
        """Pick up outputs produced outside the harness's own calls (e.g. after calling a layer directly),
        ending the step first as a driver would (bundled frames go out)."""
        self.stack._end_step()
        self._collect()
        return self

    def _collect(self) -> None:
        for out in self.stack.drain():
            if isinstance(out, Transmit):
                sender, msgs, version = decode_frame_version(out.data, self.cluster)
                if msgs:
                    self.frames.append(Frame(out.endpoint, sender, msgs, version))
                else:  # the transport's "I decode runs" hello: no message, kept apart
                    self.hellos.append(Frame(out.endpoint, sender, msgs, version))
            elif isinstance(out, Deliver):
                self.delivered.extend(out.messages)
            else:
                self.events.append(out)

    def take_frames(self) -> list[Frame]:
        out, self.frames = self.frames, []
        return out

    def take_sent(self) -> list[tuple[tuple[str, int], Message]]:
        """Every message that left on the wire since the last call, as (endpoint, message)."""
        return [(f.endpoint, m) for f in self.take_frames() for m in f.messages]

    def take_delivered(self) -> list[Message]:
        out, self.delivered = self.delivered, []
        return out

    def take_events(self, kind: type | None = None) -> list[Any]:
        """Up events that reached the top since the last call (only those of ``kind`` are taken, if given)."""
        if kind is None:
            out, self.events = self.events, []
            return out
        out = [e for e in self.events if isinstance(e, kind)]
        self.events = [e for e in self.events if not isinstance(e, kind)]
        return out


def with_header(msg: Message, header: Any) -> Message:
    msg.headers[header.PROTO_ID] = header
    return msg


def headers_of(messages: Iterable[Message], pid: int) -> list[Any]:
    """Headers with protocol id ``pid`` of the messages that have one."""
    return [m.headers[pid] for m in messages if pid in m.headers]


def sent_with(sent: Iterable[tuple[tuple[str, int], Message]], pid: int) -> list[tuple[tuple[str, int], Any]]:
    """(endpoint, header) for sent messages carrying protocol ``pid``'s header."""
    return [(ep, m.headers[pid]) for ep, m in sent if pid in m.headers]


__all__ = [
    "CLUSTER",
    "ME",
    "PEERS",
    "Frame",
    "LayerHarness",
    "Probe",
    "ProbeLog",
    "addr",
    "headers_of",
    "make_view",
    "protocol_ids",
    "sent_with",
    "with_header",
]
