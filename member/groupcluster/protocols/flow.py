"""Flow control: credit-based, per receiver, for multicasts and unicasts (JGroups MFC + UFC).

A sender may have at most ``max_credits`` bytes in flight towards each receiver: a multicast needs that
much credit at every other view member, a unicast at its destination (the two pools are separate, as in
JGroups). Sending consumes ``len(payload)``; without enough credit, messages wait here in order (a multicast
queue, and one queue per unicast destination, so a unicast to an unblocked member passes). A receiver
counts the bytes delivered from each sender and, every ``max_credits * min_threshold`` bytes, returns them
as a REPLENISH. Queued messages leave when credit returns. More than ``max_queued`` bytes waiting raises
``Backpressure(True)`` once; ``Backpressure(False)`` follows when the queue drains below half of it.

Membership follows ViewChange (up): new members start with ``max_credits``; members that left stop
counting, so a crashed receiver blocks nobody beyond the view change. A sender blocked longer than
``block_timeout`` sends CREDIT_REQUEST; the receiver answers with what it owes, or — when it owes nothing,
which means the sender's count and its own drifted apart (an unreliable flow-controlled message was lost) —
with the requested amount. Messages with NO_FLOW_CONTROL bypass all of it.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, Final

from ..core import protocol_ids
from ..core.address import Address
from ..core.config import param
from ..core.errors import ConfigError
from ..core.events import Backpressure, Event, ViewChange
from ..core.layer import Layer, register_layer
from ..core.message import NO_FLOW_CONTROL, Header, Message, register_header
from ..core.validate import MAX_INT, as_int, as_list

REPLENISH: Final = 0
CREDIT_REQUEST: Final = 1
MULTICAST: Final = 0
UNICAST: Final = 1
_PID: Final = protocol_ids.FLOW
# Credit of a pool nobody limits (no other member in the view): larger than any sum of payloads.
_UNLIMITED: Final = 1 << 62


class FlowHeader(Header):
    """REPLENISH(pool, credits) | CREDIT_REQUEST(pool, credits wanted); pool is MULTICAST or UNICAST."""

    PROTO_ID = protocol_ids.FLOW
    __slots__ = ("credits", "kind", "pool")

    def __init__(self, kind: int, pool: int, credits: int) -> None:
        self.kind = kind
        self.pool = pool
        self.credits = credits

    def to_wire(self) -> list[Any]:
        return [self.kind, self.pool, self.credits]

    @classmethod
    def from_wire(cls, data: Any) -> FlowHeader:
        items = as_list(data, "flow", 3, exact=3)
        return cls(
            as_int(items[0], "flow.kind", 0, 1),
            as_int(items[1], "flow.pool", 0, 1),
            as_int(items[2], "flow.credits", 0, MAX_INT),
        )

    def __repr__(self) -> str:
        kind = "REPLENISH" if self.kind == REPLENISH else "CREDIT_REQUEST"
        return f"FlowHeader({kind}, {'mcast' if self.pool == MULTICAST else 'ucast'}, {self.credits})"


register_header(FlowHeader)


@dataclass(frozen=True)
class FlowConfig:
    max_credits: int = param("4MiB", "size", doc="bytes a sender may have in flight towards one receiver", minimum=1)
    min_threshold: float = param(
        0.4, "float", doc="fraction of max_credits a receiver consumes before replenishing (0..1)", minimum=0.0
    )
    max_queued: int = param(
        "16MiB", "size", doc="bytes waiting for credit before Backpressure(True) is raised", minimum=1
    )
    block_timeout: float = param(
        "500ms",
        "duration",
        doc="how long a blocked sender waits before asking for credits",
        minimum=0.001,
    )


class _Queue:
    """Messages waiting for credit, in order, with their byte total."""

    __slots__ = ("bytes", "msgs")

    def __init__(self) -> None:
        self.msgs: deque[Message] = deque()
        self.bytes = 0


class FlowControl(Layer):
    NAME = "flow"
    PROTO_ID = protocol_ids.FLOW
    Config = FlowConfig

    def __init__(self, config: FlowConfig, ctx: Any) -> None:
        super().__init__(config, ctx)
        if not 0.0 < config.min_threshold <= 1.0:
            raise ConfigError(f"stack[{ctx.index}] (flow).min_threshold: {config.min_threshold} is outside (0, 1]")
        self._max = config.max_credits
        self._threshold = max(1, int(config.max_credits * config.min_threshold))
        self.members: tuple[Address, ...] = ()
        # Sender, multicast: bytes multicast so far, and per receiver how far it lets us go (a limit on that
        # running total), so a multicast costs one comparison against the smallest limit, not one per member.
        self._mc_sent = 0
        self._mc_limit: dict[Address, int] = {}
        self._mc_min = _UNLIMITED
        # Sender, unicast: credits left per destination member.
        self._uc_credits: dict[Address, int] = {}
        # Sender queues.
        self._mc_queue = _Queue()
        self._uc_queues: dict[Address, _Queue] = {}
        self.queued_bytes = 0
        self.blocked = False  # Backpressure(True) raised and not yet lifted
        self._blocked_since: float | None = None
        # Receiver: bytes delivered from each sender since we last returned credits, per pool.
        self._mc_received: dict[Address, int] = {}
        self._uc_received: dict[Address, int] = {}
        # REPLENISH / CREDIT_REQUEST messages, sent at the end of the step rather than from inside an up call.
        self._to_send: list[Message] = []
        self._drain_needed = False

    # -- down (sender) ---------------------------------------------------------------------------------
    def down(self, msg: Message) -> None:
        if msg.flags & NO_FLOW_CONTROL:
            self.below.down(msg)
            return
        size = len(msg.payload)
        dest = msg.dest
        if dest is None:
            if not self._mc_queue.msgs:
                avail = self._mc_min - self._mc_sent
                # A message larger than max_credits goes out once credit is full (it could never fit).
                if avail >= size or avail >= self._max:
                    self._mc_sent += size
                    self.below.down(msg)
                    return
            self._enqueue(self._mc_queue, msg, size)
            return
        credits = self._uc_credits.get(dest)
        if credits is None:
            # Not a view member (or ourselves): nobody to protect.
            self.below.down(msg)
            return
        queue = self._uc_queues.get(dest)
        if queue is None:
            if credits >= size or credits >= self._max:
                self._uc_credits[dest] = credits - size
                self.below.down(msg)
                return
            queue = self._uc_queues[dest] = _Queue()
        self._enqueue(queue, msg, size)

    def _enqueue(self, queue: _Queue, msg: Message, size: int) -> None:
        queue.msgs.append(msg)
        queue.bytes += size
        self.queued_bytes += size
        self.count("queued")
        if self._blocked_since is None:
            self._blocked_since = self.now
            self.set_timer("credit_request", self.config.block_timeout)
        if not self.blocked and self.queued_bytes > self.config.max_queued:
            self.blocked = True
            self.count("backpressure_on")
            self.ctx.log.info("flow control: %d bytes queued; backpressure on", self.queued_bytes)
            self.above.up_event(Backpressure(True))

    def _drain(self) -> None:
        """Send queued messages that have credit now."""
        q = self._mc_queue
        if q.msgs:
            msgs = q.msgs
            sent_bytes = 0
            while msgs:
                size = len(msgs[0].payload)
                avail = self._mc_min - self._mc_sent
                if avail < size and avail < self._max:
                    break
                self._mc_sent += size
                sent_bytes += size
                self.below.down(msgs.popleft())
            q.bytes -= sent_bytes
            self.queued_bytes -= sent_bytes
        for dest in list(self._uc_queues):
            q = self._uc_queues[dest]
            credits = self._uc_credits.get(dest)
            msgs = q.msgs
            sent_bytes = 0
            while msgs:
                size = len(msgs[0].payload)
                if credits is not None:
                    if credits < size and credits < self._max:
                        break
                    credits -= size
                sent_bytes += size
                self.below.down(msgs.popleft())
            if credits is not None:
                self._uc_credits[dest] = credits
            q.bytes -= sent_bytes
            self.queued_bytes -= sent_bytes
            if not msgs:
                del self._uc_queues[dest]
        if not self._mc_queue.msgs and not self._uc_queues:
            self._blocked_since = None
            self.cancel_timer("credit_request")
        if self.blocked and self.queued_bytes < self.config.max_queued // 2:
            self.blocked = False
            self.count("backpressure_off")
            self.ctx.log.info("flow control: queue drained to %d bytes; backpressure off", self.queued_bytes)
            self.above.up_event(Backpressure(False))

    # -- up (receiver, and credits for the sender) -----------------------------------------------------
    def up(self, batch: list[Message]) -> None:
        src = batch[0].src
        me = self.local_address
        mc = uc = 0
        control = False
        mixed = False
        for msg in batch:
            if msg.flags & NO_FLOW_CONTROL:
                if _PID in msg.headers:
                    control = True
                continue
            if msg.src is not src:
                mixed = True
            if msg.dest is None:
                mc += len(msg.payload)
            else:
                uc += len(msg.payload)
        if mixed:
            # Rare: a batch with messages of several senders (retransmissions re-attributed below us).
            self._account_per_message(batch)
        elif src is not None and src != me and (mc or uc):  # like the per-message path, which skips no src
            self._account(src, mc, uc)
        if control:
            rest: list[Message] = []
            for msg in batch:
                hdr: FlowHeader | None = msg.headers.get(_PID)
                if hdr is None:
                    rest.append(msg)
                else:
                    self._on_control(msg.sender(), hdr)
            batch = rest
        if batch:
            self.above.up(batch)

    def _account_per_message(self, batch: list[Message]) -> None:
        me = self.local_address
        for msg in batch:
            if not msg.flags & NO_FLOW_CONTROL and msg.src is not None and msg.src != me:
                n = len(msg.payload)
                self._account(msg.src, n, 0) if msg.dest is None else self._account(msg.src, 0, n)

    def _account(self, src: Address, mc: int, uc: int) -> None:
        threshold = self._threshold
        if mc:
            total = self._mc_received.get(src, 0) + mc
            if total >= threshold:
                self._reply(src, REPLENISH, MULTICAST, total)
                total = 0
            self._mc_received[src] = total
        if uc:
            total = self._uc_received.get(src, 0) + uc
            if total >= threshold:
                self._reply(src, REPLENISH, UNICAST, total)
                total = 0
            self._uc_received[src] = total

    def _reply(self, dest: Address, kind: int, pool: int, credits: int) -> None:
        self._to_send.append(Message(dest, flags=NO_FLOW_CONTROL, headers={_PID: FlowHeader(kind, pool, credits)}))
        self.count("replenish_sent" if kind == REPLENISH else "credit_requests_sent")

    def _on_control(self, src: Address, hdr: FlowHeader) -> None:
        if src is None or src == self.local_address:
            return
        if hdr.kind == REPLENISH:
            self.count("replenish_received")
            if hdr.pool == MULTICAST:
                limit = self._mc_limit.get(src)
                if limit is not None:
                    self._mc_limit[src] = min(limit + hdr.credits, self._mc_sent + self._max)
                    self._mc_min = min(self._mc_limit.values())
            else:
                credits = self._uc_credits.get(src)
                if credits is not None:
                    self._uc_credits[src] = min(credits + hdr.credits, self._max)
            self._drain_needed = True
            return
        self.count("credit_requests_received")
        received = self._mc_received if hdr.pool == MULTICAST else self._uc_received
        owed = received.get(src, 0)
        if owed:
            received[src] = 0
            self._reply(src, REPLENISH, hdr.pool, owed)
        else:
            # We owe nothing, yet it is blocked on us: its count and ours drifted (lost unreliable messages).
            self.count("credits_granted_on_request")
            self._reply(src, REPLENISH, hdr.pool, min(hdr.credits, self._max))

    # -- events, timers, end of step -------------------------------------------------------------------
    def up_event(self, event: Event) -> None:
        if isinstance(event, ViewChange):
            self._on_view(event.view.members)
        self.above.up_event(event)

    def _on_view(self, members: tuple[Address, ...]) -> None:
        me = self.local_address
        others = [m for m in members if m != me]
        self.members = members
        fresh = self._mc_sent + self._max
        self._mc_limit = {m: self._mc_limit.get(m, fresh) for m in others}
        self._mc_min = min(self._mc_limit.values(), default=_UNLIMITED)
        self._uc_credits = {m: self._uc_credits.get(m, self._max) for m in others}
        keep = set(others)
        self._mc_received = {m: n for m, n in self._mc_received.items() if m in keep}
        self._uc_received = {m: n for m, n in self._uc_received.items() if m in keep}
        self._drain_needed = True

    def on_timer(self, key: Any) -> None:
        if key != "credit_request":
            return
        if not self._mc_queue.msgs and not self._uc_queues:
            self._blocked_since = None
            return
        q = self._mc_queue
        if q.msgs:
            need = len(q.msgs[0].payload)
            for m, limit in self._mc_limit.items():
                avail = limit - self._mc_sent
                if avail < need and avail < self._max:
                    self._reply(m, CREDIT_REQUEST, MULTICAST, self._max - max(avail, 0))
        for dest in self._uc_queues:
            credits = self._uc_credits.get(dest)
            if credits is not None:
                self._reply(dest, CREDIT_REQUEST, UNICAST, self._max - max(credits, 0))
        self.set_timer("credit_request", self.config.block_timeout)

    def end_of_step(self) -> bool:
        busy = False
        if self._drain_needed:
            self._drain_needed = False
            if self._mc_queue.msgs or self._uc_queues:
                self._drain()
                busy = True
        if self._to_send:
            out, self._to_send = self._to_send, []
            for msg in out:
                self.below.down(msg)
            busy = True
        return busy

    def describe_state(self) -> dict[str, Any]:
        return {
            "queued_bytes": self.queued_bytes,
            "blocked": self.blocked,
            "mc_credits": min(self._mc_min - self._mc_sent, self._max) if self._mc_limit else None,
            "uc_credits": {str(m): c for m, c in self._uc_credits.items()},
        }


register_layer(FlowControl)
