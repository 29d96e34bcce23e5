"""Discovery: find the members reachable at a static host list and at endpoints learned at run time (PING/TCPPING).

``FindMembers(purpose)`` sends GET_MBRS_REQ to every known endpoint except our own and collects GET_MBRS_RSP
answers until ``timeout`` passes, a coordinator answered (``break_on_coord_rsp``) or ``num_initial_members``
answered; then :class:`MembersFound` goes up. Every member answers every request, joined or not, with whom
it considers coordinator and its view id, so joiners find the group and MERGE finds other coordinators.

Known endpoints are the static ``initial_hosts``, endpoints pushed by the runtime with ``UpdateHosts``
(a hosts file, the Kubernetes API), endpoints of members that asked us (so members started with only a seed
list learn each other) and the current view's members. Requests are sent to the placeholder address
``host:port#0``, which the transport accepts for whoever listens there; the answer carries the real address
as its frame sender.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..core import protocol_ids
from ..core.address import ANY_INCARNATION, Address
from ..core.config import param
from ..core.errors import WireError
from ..core.events import (
    Disconnect,
    DiscoveryResponse,
    Event,
    FindMembers,
    GetHosts,
    MembersFound,
    UpdateHosts,
    ViewChange,
)
from ..core.layer import Layer, register_layer
from ..core.message import NO_FLOW_CONTROL, NO_RELIABILITY, Header, Message, register_header
from ..core.validate import as_bool, as_int, as_list, as_optional_address
from ..core.view import View, ViewId

GET_MBRS_REQ, GET_MBRS_RSP = 0, 1
_FLAGS = NO_RELIABILITY | NO_FLOW_CONTROL
_PID = protocol_ids.DISCOVERY
# Bound on endpoints learned from requests: a peer must not make us remember an unbounded set.
MAX_LEARNED_HOSTS = 1024

Endpoint = tuple[str, int]


class DiscoveryHeader(Header):
    """GET_MBRS_REQ | GET_MBRS_RSP(coordinator, view_id, is_coordinator); the sender is the frame's sender."""

    PROTO_ID = protocol_ids.DISCOVERY
    __slots__ = ("coordinator", "is_coordinator", "kind", "view_id")

    def __init__(
        self,
        kind: int,
        coordinator: Address | None = None,
        view_id: ViewId | None = None,
        is_coordinator: bool = False,
    ) -> None:
        self.kind = kind
        self.coordinator = coordinator
        self.view_id = view_id
        self.is_coordinator = is_coordinator

    def to_wire(self) -> list[Any]:
        if self.kind == GET_MBRS_REQ:
            return [GET_MBRS_REQ]
        return [
            GET_MBRS_RSP,
            None if self.coordinator is None else self.coordinator.to_wire(),
            None if self.view_id is None else self.view_id.to_wire(),
            self.is_coordinator,
        ]

    @classmethod
    def from_wire(cls, data: Any) -> DiscoveryHeader:
        if type(data) is not list or not data:
            raise WireError("discovery: expected a non-empty list")
        kind = as_int(data[0], "discovery.kind", 0, 1)
        if kind == GET_MBRS_REQ:
            as_list(data, "discovery", 1, exact=1)
            return cls(GET_MBRS_REQ)
        items = as_list(data, "discovery", 4, exact=4)
        coordinator = as_optional_address(items[1], "discovery.coordinator")
        view_id = None if items[2] is None else ViewId.from_wire(items[2], "discovery.view_id")
        is_coord = as_bool(items[3], "discovery.is_coordinator")
        if is_coord and coordinator is None:
            raise WireError("discovery.is_coordinator: true without a coordinator")
        if (coordinator is None) != (view_id is None):
            raise WireError("discovery.view_id: coordinator and view id must both be set or both be nil")
        return cls(GET_MBRS_RSP, coordinator, view_id, is_coord)

    def __repr__(self) -> str:
        if self.kind == GET_MBRS_REQ:
            return "DiscoveryHeader(GET_MBRS_REQ)"
        return f"DiscoveryHeader(GET_MBRS_RSP, coord={self.coordinator}, view={self.view_id}, {self.is_coordinator})"


_REQUEST = DiscoveryHeader(GET_MBRS_REQ)


@dataclass(frozen=True)
class DiscoveryConfig:
    initial_hosts: tuple[Endpoint, ...] = param((), "hosts", doc="static endpoints to probe, e.g. 'h1:7800,h2:7800'")
    timeout: float = param("500ms", "duration", doc="how long a discovery round waits for answers", minimum=0.001)
    break_on_coord_rsp: bool = param(True, "bool", doc="finish a round as soon as a coordinator answered")
    num_initial_members: int = param(10, "int", doc="finish a round once this many members answered", minimum=1)


class _Round:
    """One FindMembers round: answers so far, keyed by responder (a later answer replaces an earlier one)."""

    __slots__ = ("purpose", "responses")

    def __init__(self, purpose: str) -> None:
        self.purpose = purpose
        self.responses: dict[Address, DiscoveryResponse] = {}


class Discovery(Layer):
    NAME = "discovery"
    PROTO_ID = protocol_ids.DISCOVERY
    Config = DiscoveryConfig

    def __init__(self, config: DiscoveryConfig, ctx: Any) -> None:
        super().__init__(config, ctx)
        self.static_hosts: frozenset[Endpoint] = frozenset(config.initial_hosts)
        self.updated_hosts: frozenset[Endpoint] = frozenset()  # from UpdateHosts (replaced as a whole)
        self.learned_hosts: dict[Endpoint, None] = {}  # from requests; insertion order = eviction order
        self.view: View | None = None
        self.rounds: dict[str, _Round] = {}

    # -- traffic -------------------------------------------------------------------------------------
    def up(self, batch: list[Message]) -> None:
        pid = _PID  # a local: compiled, a module global is looked up (and boxed) on every message
        for msg in batch:
            if pid in msg.headers:
                break
        else:
            self.above.up(batch)
            return
        rest: list[Message] = []
        for msg in batch:
            hdr: DiscoveryHeader | None = msg.headers.get(pid)
            if hdr is None:
                rest.append(msg)
            elif msg.src is None or msg.src == self.local_address:
                self.count("own_messages_ignored")
            elif hdr.kind == GET_MBRS_REQ:
                self._answer(msg.src)
            else:
                self._collect(msg.src, hdr)
        if rest:
            self.above.up(rest)

    def _answer(self, requester: Address) -> None:
        self.count("requests_received")
        self._learn(requester.endpoint)
        view = self.view
        if view is None:
            hdr = DiscoveryHeader(GET_MBRS_RSP)
        else:
            coord = view.coordinator
            hdr = DiscoveryHeader(GET_MBRS_RSP, coord, view.view_id, coord == self.local_address)
        self.below.down(Message(requester, flags=_FLAGS, headers={_PID: hdr}))

    def _learn(self, endpoint: Endpoint) -> None:
        if endpoint == self.local_address.endpoint or endpoint in self.static_hosts:
            return
        learned = self.learned_hosts
        if endpoint in learned:
            return
        if len(learned) >= MAX_LEARNED_HOSTS:
            del learned[next(iter(learned))]
            self.count("learned_hosts_evicted")
        learned[endpoint] = None

    def _collect(self, responder: Address, hdr: DiscoveryHeader) -> None:
        if responder.incarnation == ANY_INCARNATION:
            self.count("malformed_responses")
            return
        if not self.rounds:
            self.count("late_responses")
            return
        self.count("responses_received")
        rsp = DiscoveryResponse(responder, hdr.coordinator, hdr.view_id, hdr.is_coordinator)
        for purpose, rnd in list(self.rounds.items()):
            rnd.responses[responder] = rsp
            if (self.config.break_on_coord_rsp and rsp.is_coordinator) or len(
                rnd.responses
            ) >= self.config.num_initial_members:
                self._finish(purpose)

    # -- events ----------------------------------------------------------------------------------------
    def down_event(self, event: Event) -> Any:
        if isinstance(event, FindMembers):
            self._find(event.purpose)
            return None
        if isinstance(event, GetHosts):
            return self.known_hosts()
        if isinstance(event, UpdateHosts):
            self.updated_hosts = frozenset(event.hosts)
            self.count("host_updates")
            return None
        if isinstance(event, ViewChange):
            self.view = event.view if self.local_address in event.view.members else None
        elif isinstance(event, Disconnect):
            # A member on its way out must not tell joiners it belongs to (or coordinates) a view.
            self.view = None
        return self.below.down_event(event)

    def known_hosts(self) -> tuple[Endpoint, ...]:
        """Every endpoint we know of (static, pushed, learned, current view), sorted."""
        hosts = set(self.static_hosts) | self.updated_hosts | self.learned_hosts.keys()
        if self.view is not None:
            hosts.update(m.endpoint for m in self.view.members)
        return tuple(sorted(hosts))

    def _find(self, purpose: str) -> None:
        if purpose in self.rounds:
            # A second request for the same purpose joins the running round.
            self.count("rounds_joined")
            return
        self.rounds[purpose] = _Round(purpose)
        self.count("rounds_started")
        me = self.local_address.endpoint
        targets = [ep for ep in self.known_hosts() if ep != me]
        for host, port in targets:
            self.below.down(Message(Address(host, port, ANY_INCARNATION), flags=_FLAGS, headers={_PID: _REQUEST}))
        self.count("requests_sent", len(targets))
        # Nobody to ask: answer at the next timer firing instead of waiting out the timeout.
        self.set_timer(("round", purpose), self.config.timeout if targets else 0.0)

    def on_timer(self, key: Any) -> None:
        if type(key) is tuple and key[0] == "round":
            self._finish(key[1])

    def _finish(self, purpose: str) -> None:
        rnd = self.rounds.pop(purpose, None)
        if rnd is None:
            return
        self.cancel_timer(("round", purpose))
        responses = tuple(sorted(rnd.responses.values(), key=lambda r: r.address))
        self.ctx.log.debug("discovery (%s): %d answers", purpose, len(responses))
        self.above.up_event(MembersFound(purpose, responses))

    def describe_state(self) -> dict[str, Any]:
        return {
            "hosts": [f"{h}:{p}" for h, p in self.known_hosts()],
            "rounds": sorted(self.rounds),
            "view": None if self.view is None else str(self.view.view_id),
        }


register_header(DiscoveryHeader)
register_layer(Discovery)
