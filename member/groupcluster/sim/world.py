"""Simulated members: stacks bound to virtual endpoints, driven on the virtual clock, recorded into a history.

A *slot* is a machine: a fixed endpoint (``("10.0.0.<i+1>", 7800)`` for slot i unless the scenario shuffles them).
At most one member runs in a slot at a time;
each member started there gets a fresh incarnation from a counter, so a restart or a rejoin after a leave is
a new :class:`~groupcluster.core.address.Address`. The world turns stack outputs into network frames and
history events, keeps each stack's next timer on the event loop, and injects member faults:

* crash — the stack is dropped without a word (its state is gone; frames to it vanish);
* pause — like a long GC pause: no input is processed, timers wait, frames queue and are handled on resume;
* leave — a graceful leave through the stack; the member is gone when the stack reports ``Left``.

When the stack carries the ``state`` layer, the simulated application keeps a state — the ordered log of the
multicasts it delivered, as ``sender msg`` lines — fetches it on start (:class:`RequestState`), serves it
when asked (:class:`GetState`, answered in the same step, before any later output), and records ``state``
events (``op`` request/get/set with the transfer, the donor, the log length and a digest of the bytes) and
the multicasts the transferred state covered (``deliver`` events with ``via: "state"``).

An *application* (:class:`SimApp`, e.g. the data grid of :mod:`groupcluster.sim.grid`) can sit on a member
instead of the test workload: it then gets the member's views and delivered batches (no ``deliver`` events
are recorded for them), its own timer on the virtual clock, and what it wants to send goes into the stack
right after the step that produced it, as a real driver would do.

An exception raised by a stack (or an application) is a bug: it is recorded as an ``exception`` violation and
the member is treated as crashed, so the run (and the other checks) can go on.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import logging
import random
import traceback
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from ..core.address import Address
from ..core.events import Backpressure, Deliver, Event, Joined, JoinFailed, Left, ViewChange
from ..core.message import Message
from ..core.stack import Stack, Transmit
from ..core.view import View
from ..protocols.state_transfer.events import GetState, RequestState, SetState, StateCovered, StateSnapshot
from .history import History, make_payload, payload_id
from .history_index import Violation
from .loop import EventLoop
from .network import Network

SIM_PORT = 7800
MAX_PAUSED_FRAMES = 20000  # a paused process's socket buffer: beyond this, frames are dropped

RUNNING = "running"
PAUSED = "paused"
LEAVING = "leaving"
GONE = "gone"

SpecFactory = Callable[[Address, Sequence[tuple[str, int]]], list[dict[str, Any]]]


class SimApp(Protocol):
    """An application driven by the world on one member (the same calls a runtime adapter gets)."""

    def on_view(self, view: View, now: float) -> None: ...

    def on_messages(self, messages: Sequence[Message], now: float) -> None: ...

    def tick(self, now: float) -> None: ...

    def next_deadline(self) -> float | None: ...

    def take_sends(self) -> list[Message]:
        """What to hand to the stack now (``Message(dest or None, payload)``)."""
        ...

    def after_step(self, now: float) -> None:
        """Called after every step of this member (results, readiness: whatever the scenario watches)."""
        ...


AppFactory = Callable[["Node"], SimApp]


def slot_endpoint(slot: int) -> tuple[str, int]:
    """The virtual endpoint of machine ``slot`` (they are only names: nothing leaves the process)."""
    return (f"10.0.0.{slot + 1}", SIM_PORT)


def _app_of(node: Node) -> SimApp:
    """The application of ``node``, which the world only steps when it has one (it armed the app's timer)."""
    app = node.app
    if app is None:
        raise RuntimeError(f"{node.name}: an application step on a member without an application")
    return app


class Node:
    """One running member (one incarnation) in a slot."""

    __slots__ = (
        "address",
        "app",
        "app_due",
        "app_log",
        "app_timer_at",
        "blocked",
        "endpoint",
        "inbox",
        "name",
        "slot",
        "stack",
        "state",
        "timer_at",
        "timer_due",
        "uses_state",
        "view",
    )

    def __init__(self, slot: int, address: Address, stack: Stack) -> None:
        self.slot = slot
        self.address = address
        self.name = str(address)
        self.endpoint = address.endpoint
        self.stack = stack
        self.state = RUNNING
        self.view: View | None = None
        self.blocked = False
        self.timer_at: float | None = None
        self.timer_due = False
        self.inbox: list[bytes] = []
        # The application's state when the stack transfers state: "sender msg" per multicast, in delivery order.
        self.uses_state = stack.layer("state") is not None
        self.app_log: list[str] = []
        # An application on this member (instead of the test workload), with its own timer.
        self.app: SimApp | None = None
        self.app_timer_at: float | None = None
        self.app_due = False

    @property
    def alive(self) -> bool:
        return self.state != GONE

    def __repr__(self) -> str:
        return f"Node({self.name}, {self.state})"


class World:
    """Members on a virtual network, recorded into one history."""

    def __init__(
        self,
        loop: EventLoop,
        network: Network,
        history: History,
        spec_for: SpecFactory,
        *,
        slots: int,
        rng: random.Random,
        cluster: str = "sim",
        logger: logging.Logger | None = None,
        app_factory: AppFactory | None = None,
        endpoints: Sequence[tuple[str, int]] | None = None,
    ) -> None:
        if slots < 1:
            raise ValueError(f"members: need at least 1, got {slots}")
        if endpoints is not None and (len(endpoints) != slots or len(set(endpoints)) != slots):
            raise ValueError(f"endpoints: need {slots} distinct endpoints, got {list(endpoints)}")
        self.loop = loop
        self.network = network
        self.history = history
        self.spec_for = spec_for
        self.app_factory = app_factory
        self.rng = rng
        self.cluster = cluster
        self.log = logger or logging.getLogger("groupcluster.sim")
        # Slot i is slot_endpoint(i) unless the scenario hands the endpoints out in another order.
        self.endpoints = list(endpoints) if endpoints is not None else [slot_endpoint(i) for i in range(slots)]
        self.nodes: list[Node | None] = [None] * slots
        self._previous: list[str | None] = [None] * slots  # the last member that ran in each slot
        self._incarnations = itertools.count(1)
        self._msg_ids = itertools.count(1)
        self._names: dict[Address, str] = {}
        self.errors: list[Violation] = []
        # Extra fields of a slot's start/restart events (the scenario records partial host lists there).
        self.start_fields: dict[int, dict[str, Any]] = {}
        self.stats: Counter[str] = Counter()
        # Hooks for the scenario: a member finished leaving (or failed to join); a message was delivered.
        self.on_gone: Callable[[Node, str], None] | None = None
        self.on_deliver: Callable[[Node, str, str], None] | None = None

    # -- queries ------------------------------------------------------------------------------------------
    def node(self, slot: int) -> Node | None:
        return self.nodes[slot]

    def live_nodes(self) -> list[Node]:
        """Members that run or are paused and are not leaving, in slot order."""
        return [n for n in self.nodes if n is not None and n.state in (RUNNING, PAUSED)]

    def _name(self, addr: Address | None) -> str | None:
        if addr is None:
            return None
        name = self._names.get(addr)
        if name is None:
            name = self._names[addr] = str(addr)
        return name

    # -- lifecycle ------------------------------------------------------------------------------------------
    def start(self, slot: int) -> Node:
        """Start a new member (a new incarnation) in an empty slot; it begins joining at once."""
        if self.nodes[slot] is not None:
            raise RuntimeError(f"slot {slot} already runs {self.nodes[slot]}")
        host, port = self.endpoints[slot]
        address = Address(host, port, next(self._incarnations))
        stack = Stack(
            self.spec_for(address, self.endpoints),
            local_address=address,
            cluster=self.cluster,
            seed=self.rng.getrandbits(64),
            now=self.loop.now,
            logger=self.log,
        )
        node = Node(slot, address, stack)
        if self.app_factory is not None:
            node.app = self.app_factory(node)
        self.nodes[slot] = node
        self.network.attach(node.endpoint, functools.partial(self._on_frame, node))
        self.stats["started"] += 1
        previous = self._previous[slot]
        extra = self.start_fields.get(slot, {})
        if previous is None:
            self.history.add(self.loop.now, node.name, "start", slot=slot, **extra)
        else:
            self.history.add(self.loop.now, node.name, "restart", slot=slot, previous=previous, **extra)
        self._previous[slot] = node.name
        self._step(node, stack.start)
        if node.uses_state and node.app is None and node.state != GONE:
            # An application brings its own state (the grid moves its data itself), like a channel created
            # without ``set_state``: it asks for no group state transfer.
            self.history.add(self.loop.now, node.name, "state", op="request")
            self._step(node, stack.control, RequestState())
        return node

    def crash(self, slot: int) -> None:
        """Kill the member in ``slot`` without warning."""
        node = self.nodes[slot]
        if node is None:
            return
        self.history.add(self.loop.now, node.name, "crash")
        self.stats["crashed"] += 1
        self._remove(node)

    def pause(self, slot: int) -> None:
        node = self.nodes[slot]
        if node is None or node.state == PAUSED:
            return
        if node.state == LEAVING:
            return  # keep leaves simple to reason about: a leaving member is not paused
        node.state = PAUSED
        self.stats["paused"] += 1
        self.history.add(self.loop.now, node.name, "pause")

    def resume(self, slot: int) -> None:
        node = self.nodes[slot]
        if node is None or node.state != PAUSED:
            return
        node.state = RUNNING
        self.history.add(self.loop.now, node.name, "resume")
        inbox, node.inbox = node.inbox, []
        for data in inbox:
            if node.state == GONE:
                return
            self._step(node, node.stack.receive, data)
        if node.state != GONE and node.timer_due:
            node.timer_due = False
            self._step(node, node.stack.fire_timers)
        if node.state != GONE and node.app_due:
            node.app_due = False
            self._app_step(node, _app_of(node).tick)

    def leave(self, slot: int) -> None:
        """Ask the member in ``slot`` to leave gracefully."""
        node = self.nodes[slot]
        if node is None or node.state != RUNNING:
            return
        node.state = LEAVING
        self.stats["leaves"] += 1
        self.history.add(self.loop.now, node.name, "leave")
        self._step(node, node.stack.leave)

    def control(self, slot: int, event: Event) -> Any:
        node = self.nodes[slot]
        if node is None or node.state in (PAUSED, GONE):
            return None
        return self._step(node, node.stack.control, event)

    def app_call(self, slot: int, fn: Callable[..., Any], *args: Any) -> Any:
        """Call ``fn(*args, now)`` on the application of the member in ``slot`` (a client operation, a leave
        request) and hand what it produced to the stack; None when the member is paused or gone."""
        node = self.nodes[slot]
        if node is None or node.app is None or node.state in (PAUSED, GONE):
            return None
        return self._app_step(node, fn, *args)

    def _app_step(self, node: Node, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            result = fn(*args, self.loop.now)
        except Exception as exc:
            self._stack_failed(node, fn, exc)
            return None
        self._app_pump(node)
        return result

    def _app_pump(self, node: Node) -> None:
        """Move the application's sends into the stack (one step) and re-arm its timer."""
        app = _app_of(node)
        while node.state != GONE:
            msgs = app.take_sends()
            if not msgs:
                break
            if node.state == LEAVING:
                # Like a channel that is leaving: nothing more goes out (the runtime counts and drops it).
                self.stats["app_sends_dropped"] += len(msgs)
                break
            # Deliveries of our own multicasts can come back in this step: loop until the app is quiet.
            self._step(node, node.stack.send_many, msgs)
        if node.state == GONE:
            return
        try:
            app.after_step(self.loop.now)
        except Exception as exc:
            self._stack_failed(node, app.after_step, exc)
            return
        deadline = app.next_deadline()
        if deadline is not None and (node.app_timer_at is None or deadline < node.app_timer_at):
            node.app_timer_at = deadline
            self.loop.at(deadline, self._on_app_timer, node, deadline)

    def _on_app_timer(self, node: Node, deadline: float) -> None:
        if node.app_timer_at != deadline or node.state == GONE:
            return
        node.app_timer_at = None
        if node.state == PAUSED:
            node.app_due = True
            return
        # At the deadline itself (the clock may be later): the node then finds what it asked for due.
        self._app_step(node, _app_of(node).tick)

    def _remove(self, node: Node) -> None:
        node.state = GONE
        node.stack.stop()
        node.inbox.clear()
        if self.nodes[node.slot] is node:
            self.nodes[node.slot] = None
            self.network.detach(node.endpoint)

    # -- application traffic -------------------------------------------------------------------------------
    def send(self, slot: int, dest: Address | None = None, count: int = 1, size: int = 0) -> list[str]:
        """Send ``count`` test messages from the member in ``slot`` in one step; returns their ids.

        Sends are recorded before they enter the stack, with the sender's current view.
        """
        node = self.nodes[slot]
        if node is None or node.state != RUNNING:
            return []
        now = self.loop.now
        ids: list[str] = []
        msgs: list[Message] = []
        dest_name = self._name(dest)
        view_json = None if node.view is None else [node.view.view_id.seq, self._name(node.view.view_id.creator)]
        add = self.history.add
        for _ in range(count):
            msg_id = str(next(self._msg_ids))
            ids.append(msg_id)
            add(now, node.name, "send", msg=msg_id, dest=dest_name, view=view_json)
            msgs.append(Message(dest, make_payload(msg_id, size)))
        self.stats["sent"] += count
        if count == 1:
            self._step(node, node.stack.send, msgs[0].payload, dest)
        else:
            self._step(node, node.stack.send_many, msgs)
        return ids

    # -- driving the stacks ----------------------------------------------------------------------------------
    def _on_frame(self, node: Node, data: bytes) -> None:
        state = node.state
        if state == PAUSED:
            if len(node.inbox) < MAX_PAUSED_FRAMES:
                node.inbox.append(data)
            else:
                self.stats["paused_frames_dropped"] += 1
            return
        if state == GONE:
            return
        self._step(node, node.stack.receive, data)

    def _on_timer(self, node: Node, deadline: float) -> None:
        if node.timer_at != deadline or node.state == GONE:
            return  # superseded by an earlier wake-up, or the member is gone
        node.timer_at = None
        if node.state == PAUSED:
            node.timer_due = True
            return
        self._step(node, node.stack.fire_timers)

    def _step(self, node: Node, fn: Callable[..., Any], *args: Any) -> Any:
        """Call one stack entry point at the current time, then route what it produced."""
        try:
            result = fn(self.loop.now, *args)
        except Exception as exc:
            self._stack_failed(node, fn, exc)
            return None
        self._drain(node)
        if node.state == GONE:
            return result
        deadline = node.stack.next_deadline()
        if deadline is not None and (node.timer_at is None or deadline < node.timer_at):
            node.timer_at = deadline
            self.loop.at(deadline, self._on_timer, node, deadline)
        return result

    def _stack_failed(self, node: Node, fn: Callable[..., Any], exc: Exception) -> None:
        frames = traceback.extract_tb(exc.__traceback__)
        where = " <- ".join(f"{f.name}:{f.lineno}" for f in reversed(frames[-4:]))
        detail = f"{type(exc).__name__}: {exc} in {getattr(fn, '__name__', fn)} (at {where})"
        self.log.error("member %s raised at t=%.6f: %s", node.name, self.loop.now, detail)
        self.errors.append(Violation("exception", node.name, f"t={self.loop.now:.6f} {detail}"))
        # Whatever it produced before failing is lost with it: treat the member as crashed.
        node.stack.drain()
        if node.state != GONE:
            self.history.add(self.loop.now, node.name, "crash", reason="exception")
            self._remove(node)
            if self.on_gone is not None:
                self.on_gone(node, "exception")

    def _state_event(self, node: Node, out: GetState | SetState | StateCovered) -> None:
        now = self.loop.now
        if type(out) is StateCovered:
            # Multicasts the transferred state already holds: delivered through the state, at this point.
            hook = self.on_deliver
            for msg in out.messages:
                sender = self._name(msg.src) or "?"
                msg_id = payload_id(msg.payload)
                self.history.add(now, node.name, "deliver", sender=sender, msg=msg_id, dest=None, via="state")
                if hook is not None:
                    hook(node, sender, msg_id)
            self.stats["covered"] += len(out.messages)
        elif type(out) is GetState:
            # Taken here, before the outputs after GetState are handled: exactly the cut the layer announced.
            data = "\n".join(node.app_log).encode()
            joiner, tid = out.transfer
            self.history.add(
                now,
                node.name,
                "state",
                op="get",
                transfer=[self._name(joiner), tid],
                size=len(node.app_log),
                digest=hashlib.sha256(data).hexdigest()[:16],
            )
            self.stats["state_gets"] += 1
            self._step(node, node.stack.control, StateSnapshot(out.transfer, data))
        else:
            assert type(out) is SetState
            if out.state is None:
                self.history.add(now, node.name, "state", op="set", donor=None, transfer=None, size=0, digest=None)
                return
            node.app_log = out.state.decode().split("\n") if out.state else []
            transfer = None if out.transfer is None else [self._name(out.transfer[0]), out.transfer[1]]
            self.history.add(
                now,
                node.name,
                "state",
                op="set",
                donor=self._name(out.donor),
                transfer=transfer,
                size=len(node.app_log),
                digest=hashlib.sha256(out.state).hexdigest()[:16],
            )
            self.stats["state_sets"] += 1

    def _drain(self, node: Node) -> None:
        outputs = node.stack.drain()
        if not outputs:
            return
        now = self.loop.now
        history = self.history
        gone: str | None = None
        for out in outputs:
            if node.state == GONE:
                break  # an application on it raised: the member is treated as crashed
            if type(out) is Transmit:
                self.network.send(node.endpoint, out.endpoint, out.data)
            elif type(out) is Deliver and node.app is not None:
                self._app_call_safe(node, node.app.on_messages, out.messages)
            elif type(out) is Deliver:
                self._record_deliveries(node, out, now)
            elif type(out) is GetState or type(out) is SetState or type(out) is StateCovered:
                self._state_event(node, out)
            elif type(out) is ViewChange or type(out) is Joined:
                self._install_view(node, out.view, now)
            elif type(out) is Backpressure:
                node.blocked = out.blocked
            elif type(out) is Left:
                history.add(now, node.name, "left", reason=out.reason)
                gone = "left"
            elif type(out) is JoinFailed:
                # It never became a member: recorded as a completed departure so that it is not live.
                history.add(now, node.name, "left", reason=f"join failed: {out.reason}")
                self.stats["join_failed"] += 1
                gone = "join-failed"
        if gone is not None and node.state != GONE:
            self._remove(node)
            if self.on_gone is not None:
                self.on_gone(node, gone)
        elif node.app is not None and node.state != GONE:
            self._app_pump(node)

    def _record_deliveries(self, node: Node, out: Deliver, now: float) -> None:
        """Record the messages delivered to a member without an application (and keep its state log)."""
        name = node.name
        hook = self.on_deliver
        log = node.app_log if node.uses_state else None
        for msg in out.messages:
            sender = self._name(msg.src) or "?"
            msg_id = payload_id(msg.payload)
            self.history.add(now, name, "deliver", sender=sender, msg=msg_id, dest=self._name(msg.dest))
            if log is not None and msg.dest is None:
                log.append(f"{sender} {msg_id}")
            if hook is not None:
                hook(node, sender, msg_id)
        self.stats["delivered"] += len(out.messages)

    def _install_view(self, node: Node, view: View, now: float) -> None:
        """Record a member's new view and tell its application; Joined and ViewChange may both carry the first
        view, which is recorded once."""
        if node.view is None or node.view.view_id != view.view_id:
            node.view = view
            self.history.view(now, node.address, view)
            if node.app is not None:
                self._app_call_safe(node, node.app.on_view, view)

    def _app_call_safe(self, node: Node, fn: Callable[..., Any], arg: Any) -> None:
        if node.state == GONE:
            return
        try:
            fn(arg, self.loop.now)
        except Exception as exc:
            self._stack_failed(node, fn, exc)
