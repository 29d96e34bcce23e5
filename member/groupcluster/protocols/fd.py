"""FD: failure detection by heartbeats from every member, with a verify-suspect round (FD_ALL3 + VERIFY_SUSPECT2).

Every ``interval`` each member multicasts a HEARTBEAT. Anything that arrives from a member counts as a sign of
life (checked once per batch, by the batch's sender), so a busy member needs no heartbeats to look alive. A
view member silent for ``timeout`` is asked ARE_YOU_ALIVE directly; if nothing at all is heard from it within
``verify_timeout`` it is reported up as :class:`Suspect` — once, until a new view that still contains it has
been installed and it stayed silent for ``timeout`` again. Hearing from a suspected member reports
:class:`Unsuspect`. Heartbeats and probes bypass reliability and flow control: a retransmitted heartbeat says
nothing about the present, and flow control must never delay one. A layer above may ask for members to be
verified at once (:class:`VerifySuspect`: FLUSH does when a successor's flush says they are gone).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..core import protocol_ids
from ..core.address import Address
from ..core.config import param
from ..core.errors import ConfigError
from ..core.events import Disconnect, Event, Suspect, Unsuspect, VerifySuspect, ViewChange
from ..core.layer import Layer, register_layer
from ..core.message import NO_FLOW_CONTROL, NO_RELIABILITY, Header, Message, register_header
from ..core.validate import as_int, as_list

HEARTBEAT, ARE_YOU_ALIVE, I_AM_ALIVE = 0, 1, 2
_KIND_NAMES = ("HEARTBEAT", "ARE_YOU_ALIVE", "I_AM_ALIVE")
_FLAGS = NO_RELIABILITY | NO_FLOW_CONTROL
_PID = protocol_ids.FD


class FdHeader(Header):
    """HEARTBEAT | ARE_YOU_ALIVE | I_AM_ALIVE; the sender is the frame's sender."""

    PROTO_ID = protocol_ids.FD
    __slots__ = ("kind",)

    def __init__(self, kind: int) -> None:
        self.kind = kind

    def to_wire(self) -> list[Any]:
        return [self.kind]

    @classmethod
    def from_wire(cls, data: Any) -> FdHeader:
        items = as_list(data, "fd", 1, exact=1)
        return _HEADERS[as_int(items[0], "fd.kind", 0, len(_KIND_NAMES) - 1)]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FdHeader) and other.kind == self.kind

    def __hash__(self) -> int:
        return hash((FdHeader, self.kind))

    def __repr__(self) -> str:
        return f"FdHeader({_KIND_NAMES[self.kind]})"


# Headers are immutable: one shared instance per kind saves an allocation per heartbeat.
_HEADERS = tuple(FdHeader(k) for k in range(len(_KIND_NAMES)))


@dataclass(frozen=True)
class FdConfig:
    interval: float = param("1s", "duration", doc="how often heartbeats are sent and silence is checked", minimum=0.001)
    timeout: float = param("4s", "duration", doc="silence after which a member is verified", minimum=0.001)
    verify_timeout: float = param(
        "1s", "duration", doc="how long a silent member has to answer ARE_YOU_ALIVE", minimum=0.001
    )


class FailureDetection(Layer):
    NAME = "fd"
    PROTO_ID = protocol_ids.FD
    Config = FdConfig

    def __init__(self, config: FdConfig, ctx: Any) -> None:
        super().__init__(config, ctx)
        if config.timeout < config.interval:
            raise ConfigError(
                f"stack[{ctx.index}] (fd).timeout: {config.timeout}s is shorter than interval {config.interval}s; "
                "members would be suspected between two heartbeats"
            )
        self.members: tuple[Address, ...] = ()
        self.in_view = False
        # Other view members -> when we last heard anything from them.
        self.last_heard: dict[Address, float] = {}
        # Members being verified -> when verification started.
        self.verifying: dict[Address, float] = {}
        # Members reported as Suspect and not heard from since.
        self.suspected: set[Address] = set()
        # Suspected members that may not be verified again (until a new view re-arms them).
        self._reported: set[Address] = set()
        # verifying | suspected: the per-batch check is one set lookup.
        self._watch: set[Address] = set()

    # -- traffic -------------------------------------------------------------------------------------
    def up(self, batch: list[Message]) -> None:
        src = batch[0].src
        last = self.last_heard
        if src in last:
            last[src] = self.now
            if src in self._watch:
                self._alive_again(src)
        pid = _PID  # a local: compiled, a module global is looked up (and boxed) on every message
        for msg in batch:
            if pid in msg.headers:
                break
        else:
            self.above.up(batch)
            return
        rest: list[Message] = []
        for msg in batch:
            hdr: FdHeader | None = msg.headers.get(pid)
            if hdr is None:
                rest.append(msg)
            elif hdr.kind == ARE_YOU_ALIVE:
                if msg.src is not None and msg.src != self.local_address:
                    self.count("are_you_alive_received")
                    self.below.down(Message(msg.src, flags=_FLAGS, headers={_PID: _HEADERS[I_AM_ALIVE]}))
            else:
                self.count("heartbeats_received" if hdr.kind == HEARTBEAT else "i_am_alive_received")
        if rest:
            self.above.up(rest)

    def _alive_again(self, member: Address) -> None:
        if self.verifying.pop(member, None) is not None:
            self.cancel_timer(("verify", member))
            self.count("verify_cancelled")
        if member in self.suspected:
            self.suspected.discard(member)
            self._reported.discard(member)
            self.count("unsuspected")
            self.ctx.log.info("heard from suspected member %s again", member)
            self.above.up_event(Unsuspect(member))
        self._watch.discard(member)

    # -- events ----------------------------------------------------------------------------------------
    def down_event(self, event: Event) -> Any:
        if isinstance(event, ViewChange):
            self._on_view(event.view.members)
        elif isinstance(event, Disconnect):
            self._leave_view()
        elif isinstance(event, VerifySuspect):
            for m in event.members:
                if m in self.last_heard and m not in self.verifying and m not in self._reported:
                    self.count("verify_requested")
                    self._start_verify(m)
            return None
        return self.below.down_event(event)

    def _on_view(self, members: tuple[Address, ...]) -> None:
        me = self.local_address
        if me not in members:
            self._leave_view()
            return
        now = self.now
        old = self.last_heard
        self.members = members
        self.last_heard = {m: old.get(m, now) for m in members if m != me}
        for m in list(self.verifying):
            if m not in self.last_heard:
                del self.verifying[m]
                self.cancel_timer(("verify", m))
        self.suspected &= self.last_heard.keys()
        # A new view still containing a suspected member: it may be suspected again after a fresh silence.
        for m in self._reported & self.last_heard.keys():
            self.last_heard[m] = now
        self._reported.clear()
        self._watch = set(self.verifying) | self.suspected
        if not self.in_view:
            self.in_view = True
            self.set_timer("tick", self.config.interval)

    def _leave_view(self) -> None:
        self.in_view = False
        self.members = ()
        for m in self.verifying:
            self.cancel_timer(("verify", m))
        self.last_heard.clear()
        self.verifying.clear()
        self.suspected.clear()
        self._reported.clear()
        self._watch.clear()
        self.cancel_timer("tick")

    # -- timers ----------------------------------------------------------------------------------------
    def on_timer(self, key: Any) -> None:
        if key == "tick":
            if not self.in_view:
                return
            if self.last_heard:
                self.count("heartbeats_sent")
                self.below.down(Message(None, flags=_FLAGS, headers={_PID: _HEADERS[HEARTBEAT]}))
                self._check()
            self.set_timer("tick", self.config.interval)
        elif type(key) is tuple and key[0] == "verify":
            self._verify_expired(key[1])

    def _check(self) -> None:
        deadline = self.now - self.config.timeout
        verifying, reported = self.verifying, self._reported
        for m, heard in self.last_heard.items():
            if heard <= deadline and m not in verifying and m not in reported:
                self.ctx.log.info("no sign of life from %s for %.3fs; verifying", m, self.now - heard)
                self._start_verify(m)

    def _start_verify(self, m: Address) -> None:
        self.verifying[m] = self.now
        self._watch.add(m)
        self.count("verify_started")
        self.below.down(Message(m, flags=_FLAGS, headers={_PID: _HEADERS[ARE_YOU_ALIVE]}))
        self.set_timer(("verify", m), self.config.verify_timeout)

    def _verify_expired(self, member: Address) -> None:
        started = self.verifying.pop(member, None)
        if started is None:
            return
        if self.last_heard.get(member, self.now) > started:  # pragma: no cover - up() cancels first
            self._watch.discard(member)
            return
        self.suspected.add(member)
        self._reported.add(member)
        self._watch.add(member)
        self.count("suspected")
        self.ctx.log.warning("suspecting %s: no answer to ARE_YOU_ALIVE", member)
        self.above.up_event(Suspect(member))

    def stop(self) -> None:
        self._leave_view()

    def describe_state(self) -> dict[str, Any]:
        return {
            "in_view": self.in_view,
            "members": len(self.members),
            "verifying": sorted(map(str, self.verifying)),
            "suspected": sorted(map(str, self.suspected)),
        }


register_header(FdHeader)
register_layer(FailureDetection)
