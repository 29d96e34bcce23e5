"""MERGE: notice that the group is split (several coordinators) and tell GMS, which runs the merge.

Every member (as in JGroups MERGE3) sends an INFO — its view id and its coordinator — at random intervals to
every endpoint discovery knows, members of other partitions included, and to every member of another view it
heard from or of lately (the senders of such INFOs and the coordinators they name; the first time at once).
Host lists can be one-sided — a member started with a list that does not name us — and whichever side hears
first, the other must hear back: the merge leader (the lowest coordinator) must learn of every other
coordinator, and a member must hear its coordinator announce a view without it. JGroups gets the same from
INFOs teaching the receiver the sender's physical address.

A coordinator that hears of another coordinator whose view differs from its own reports it with
:class:`MergeNeeded` at the next check; GMS lets the lowest coordinator lead the merge. Participants report
nothing of other groups: their coordinator hears of them through the INFOs they make others send. A
participant whose own coordinator keeps announcing a different view (for ``orphan_after``) was dropped without
hearing of it — the view that excluded it was lost, or its coordinator never installed the view that made it
coordinator — so it reports its coordinator, and GMS continues alone until a merge brings it back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..core import protocol_ids
from ..core.address import Address
from ..core.config import param
from ..core.events import Event, GetHosts, MergeNeeded, ViewChange
from ..core.layer import Layer, register_layer, split_batch
from ..core.message import NO_FLOW_CONTROL, NO_RELIABILITY, Header, Message, register_header
from ..core.validate import as_address, as_list
from ..core.view import View, ViewId


class MergeHeader(Header):
    """INFO: the sender's view id and coordinator."""

    PROTO_ID = protocol_ids.MERGE
    __slots__ = ("coordinator", "view_id")

    def __init__(self, view_id: ViewId, coordinator: Address) -> None:
        self.view_id = view_id
        self.coordinator = coordinator

    def to_wire(self) -> list[Any]:
        return [self.view_id.to_wire(), self.coordinator.to_wire()]

    @classmethod
    def from_wire(cls, data: Any) -> MergeHeader:
        items = as_list(data, "merge", 2, exact=2)
        return cls(ViewId.from_wire(items[0], "merge.view_id"), as_address(items[1], "merge.coordinator"))


@dataclass(frozen=True)
class MergeConfig:
    min_interval: float = param("500ms", "duration", doc="shortest time between two INFO rounds of a member")
    max_interval: float = param("1500ms", "duration", doc="longest time between two INFO rounds of a member")
    check_interval: float = param("2s", "duration", doc="how often collected INFOs are checked for other groups")
    orphan_after: float = param(
        "2s", "duration", doc="our coordinator announced another view for this long: we were dropped"
    )
    forget_after: float = param(
        "6s", "duration", doc="stop sending INFO to a member of another view not heard from or of for this long"
    )


# Bound on the members of other views we send INFO to: peers must not make us remember an unbounded set.
MAX_HEARD = 256


class Merge(Layer):
    NAME = "merge"
    PROTO_ID = protocol_ids.MERGE
    Config = MergeConfig

    def __init__(self, config: MergeConfig, ctx: Any) -> None:
        super().__init__(config, ctx)
        self.view: View | None = None
        self.seen: dict[Address, ViewId] = {}
        # Members of other views (INFO senders, the coordinators they named) -> when last heard from or of; our
        # INFO rounds go to them too.
        self.heard: dict[Address, float] = {}
        # (our view id, first time) when our coordinator announced another view while we are a participant.
        self.coord_moved: tuple[ViewId, float] | None = None

    def start(self) -> None:
        self._schedule_info()
        self.set_timer("check", self.config.check_interval)

    def _schedule_info(self) -> None:
        lo, hi = self.config.min_interval, max(self.config.max_interval, self.config.min_interval)
        self.set_timer("info", lo + (hi - lo) * self.ctx.rng.random())

    @property
    def _is_coordinator(self) -> bool:
        return self.view is not None and self.view.coordinator == self.local_address

    def down_event(self, event: Event) -> Any:
        if isinstance(event, ViewChange):
            self.view = event.view
            self.seen.clear()
            self.coord_moved = None
        return self.below.down_event(event)

    def up(self, batch: list[Message]) -> None:
        rest, own = split_batch(batch, protocol_ids.MERGE)
        for msg, hdr in own:
            self._on_info(msg.sender(), hdr)
        if rest:
            self.above.up(rest)

    def _on_info(self, sender: Address, hdr: MergeHeader) -> None:
        view = self.view
        if view is None or hdr.view_id == view.view_id:
            return
        if sender != self.local_address:
            self._heard_of(sender)
        coord = hdr.coordinator
        if coord != self.local_address and coord != view.coordinator and coord != sender:
            self._heard_of(coord)
        if self._is_coordinator:
            if hdr.coordinator != self.local_address:
                self.seen[hdr.coordinator] = hdr.view_id
        elif sender == view.coordinator:
            moved = self.coord_moved
            self.coord_moved = moved if moved is not None and moved[0] == view.view_id else (view.view_id, self.now)

    def _heard_of(self, member: Address) -> None:
        """Remember ``member`` (of another view) as a target of our INFO rounds; the first time, if discovery
        does not know its endpoint, tell it about us right away.

        Whoever of two members hears of the other first, both then know of each other: of two coordinators the
        lower one leads the merge, and it may be the one whose host list did not name the other.
        """
        heard = self.heard
        first = member not in heard
        if first and len(heard) >= MAX_HEARD:
            del heard[min(heard, key=heard.__getitem__)]
            self.count("heard_evicted")
        heard[member] = self.now
        if first and self.view is not None and member.endpoint not in self._hosts():
            self.count("info_to_new_peer")
            self._send_to(member, MergeHeader(self.view.view_id, self.view.coordinator))

    def on_timer(self, key: object) -> None:
        if key == "info":
            self._send_info()
            self._schedule_info()
        elif key == "check":
            if self._is_coordinator and self.seen:
                coords = tuple(sorted(self.seen))
                self.count("merge_needed")
                self.above.up_event(MergeNeeded(coords))
            moved = self.coord_moved
            if (
                moved is not None
                and self.view is not None
                and not self._is_coordinator
                and moved[0] == self.view.view_id
                and self.now - moved[1] >= self.config.orphan_after
            ):
                self.count("coordinator_moved_on")
                self.coord_moved = None
                self.above.up_event(MergeNeeded((self.view.coordinator,)))
            self.seen.clear()
            horizon = self.now - self.config.forget_after
            for coord in [c for c, t in self.heard.items() if t < horizon]:
                del self.heard[coord]
            self.set_timer("check", self.config.check_interval)

    def _hosts(self) -> tuple[tuple[str, int], ...]:
        return self.below.down_event(GetHosts()) or ()

    def _send_to(self, dest: Address, hdr: MergeHeader) -> None:
        self.below.down(Message(dest, flags=NO_RELIABILITY | NO_FLOW_CONTROL, headers={protocol_ids.MERGE: hdr}))

    def _send_info(self) -> None:
        view = self.view
        if view is None:
            return
        hosts = self._hosts()
        me = self.local_address.endpoint
        hdr = MergeHeader(view.view_id, view.coordinator)
        for host, port in hosts:
            if (host, port) != me:
                self._send_to(Address(host, port), hdr)
        # Members of other views whose endpoints discovery does not know (it knows whom our host list names, who
        # asked us and our view): without this a coordinator that sorts below us would never hear of us, nor a
        # member still in a view of ours that we never installed hear us announce another.
        known = set(hosts)
        for member in sorted(self.heard):
            if member.endpoint not in known and member.endpoint != me:
                self._send_to(member, hdr)
        self.count("info_sent")


register_header(MergeHeader)
register_layer(Merge)
