"""GMS's layer: :class:`Gms`, the entry points, handing events, messages and timers to the roles."""

from __future__ import annotations

from typing import Any

from ...core import protocol_ids
from ...core.address import Address
from ...core.events import (
    Connect,
    Disconnect,
    Event,
    FlushAbandoned,
    FlushCompleted,
    FlushFailed,
    FlushGroup,
    MembersFound,
    MergeNeeded,
    Suspect,
    Unsuspect,
)
from ...core.layer import register_layer
from ...core.message import Message
from .merging import MergeRole
from .state import GmsConfig
from .wire import (
    CANCEL_MERGE,
    FLUSH_REQ,
    INSTALL_MERGE_VIEW,
    JOIN_REQ,
    JOIN_RSP,
    LEAVE_REQ,
    MERGE_REQ,
    MERGE_RSP,
    SUSPECT,
    VIEW,
    VIEW_ACK,
    GmsHeader,
)


class Gms(MergeRole):
    """GMS: the entry points, dispatching events, messages and timers to the roles."""

    NAME = "gms"
    PROTO_ID = protocol_ids.GMS
    Config = GmsConfig

    # -- from above ----------------------------------------------------------------------------------
    def down(self, msg: Message) -> None:
        if self.state not in ("member", "leaving"):
            self.count("dropped_not_joined")
            return
        self.below.down(msg)

    def down_event(self, event: Event) -> Any:  # noqa: C901  one case per control event
        if isinstance(event, Connect):
            self.state = "joining"
            self.join_attempts = 0
            self._discover()
            return None
        if isinstance(event, Disconnect):
            self._leave()
            return None
        if isinstance(event, FlushCompleted):
            if event.flush_id == self.flushing:
                self.cancel_timer("flush")
                self.flushing = None
                if self.flush_for_merge:
                    self._merge_flushed()
                else:
                    self.flush_ready = True
                    self._process_queue()
            return None
        if isinstance(event, FlushGroup):
            if not self.config.use_flush or self.view is None or self.state != "member":
                return False
            if self.is_coordinator:
                self._enqueue("flush", self.local_address)
            else:
                self._send(self.view.coordinator, GmsHeader(FLUSH_REQ))
            return True
        if isinstance(event, FlushAbandoned):
            view = self.view
            alone = view is None or len(view.members) == 1
            if self.state in ("member", "leaving") and not alone and not self.is_coordinator:
                self._continue_alone("flush_abandoned", "blocked by a flush without a new view")
                if self.state == "leaving":
                    self._left("left")  # alone now: nobody is left to hand over to
                return None
            if self.merge is not None:
                # Our subgroup is flushed for a merge whose digest (ours, cut by that flush) the leader puts into
                # the merged view. Unblocking in the old view now would multicast past that cut, and the other
                # subgroups would deliver those messages in the merged view while we delivered them in the old
                # one. The merge ends within merge_timeout, with the merged view or a view of our own.
                self.count("flush_abandon_deferred")
                return True
            casting = self.casting
            if casting is not None and casting != self.abandon_deferred_for:
                # We multicast the view that ends this flush (a merge that ended in the same instant, say) and it
                # is on its way to us: the members that install it first deliver what we would send now in it.
                self.abandon_deferred_for = casting
                self.count("flush_abandon_deferred")
                return True
            return None
        if isinstance(event, FlushFailed):
            if event.flush_id == self.flushing:
                self.cancel_timer("flush")
                self.flushing = None
                self.count("flush_failures")
                if self.flush_for_merge:
                    self._merge_flush_failed()
                for m in event.missing:
                    if m != self.local_address:
                        self.suspects.add(m)
                        self._enqueue("suspect", m)
                self.set_timer("bundle", max(self.config.view_bundling, event.retry_after))
            return None
        return self.below.down_event(event)

    # -- from below ----------------------------------------------------------------------------------
    def up(self, batch: list[Message]) -> None:
        pid = protocol_ids.GMS
        for msg in batch:
            if pid in msg.headers:
                break
        else:  # the common case, application messages only: one scan, the batch passed on as it is
            if batch:
                self._deliver(batch)
            return
        # In order: messages that precede a VIEW in the stream are delivered before it is installed.
        pending: list[Message] = []
        for msg in batch:
            hdr: GmsHeader | None = msg.headers.get(pid)
            if hdr is None:
                pending.append(msg)
                continue
            if pending:
                self._deliver(pending)
                pending = []
            self._handle(msg.sender(), hdr)
        if pending:
            self._deliver(batch if len(pending) == len(batch) else pending)

    def _deliver(self, out: list[Message]) -> None:
        if self.state in ("member", "leaving"):
            self.above.up(out)
        elif self.state == "joining":
            # The coordinator installs a view with us before our JOIN_RSP arrives, and members may already
            # send to us (UNICAST has acknowledged these): keep them for when we have the view.
            room = self.config.max_early_messages - len(self.early)
            if len(out) > room:
                self.count("early_dropped", len(out) - max(room, 0))
            self.early.extend(out[: max(room, 0)])

    def up_event(self, event: Event) -> None:
        if isinstance(event, MembersFound):
            if event.purpose == "join":
                self._on_members_found(event)
            return
        if isinstance(event, Suspect):
            self._on_suspect(event.member)
            self.above.up_event(event)  # FLUSH and the application see suspicions too
            return
        if isinstance(event, Unsuspect):
            self.suspects.discard(event.member)
            self.above.up_event(event)
            return
        if isinstance(event, MergeNeeded):
            self._on_merge_needed(event)
            return
        self.above.up_event(event)

    def _handle(self, src: Address, hdr: GmsHeader) -> None:  # noqa: C901  one case per GMS message kind
        kind = hdr.kind
        if self.state == "left":
            return
        if kind == VIEW:
            assert hdr.view is not None
            self._on_view(src, hdr.view, hdr.digest)
        elif kind == VIEW_ACK:
            if self.pending is not None and hdr.view_id == self.pending.view.view_id:
                self.pending.awaiting.discard(src)
                if not self.pending.awaiting:
                    self._finish_pending()
        elif kind == JOIN_REQ:
            self._on_join_req(src, hdr.seqno)
        elif kind == JOIN_RSP:
            self._on_join_rsp(src, hdr)
        elif kind == LEAVE_REQ:
            if self.is_coordinator and self.view is not None and src in self.view.members:
                self._enqueue("leave", src)
        elif kind == SUSPECT:
            self._on_suspect_report(hdr.member)
        elif kind == FLUSH_REQ:
            if self.is_coordinator and self.config.use_flush and self.view is not None and src in self.view.members:
                self._enqueue("flush", src)  # flushed like any view change; the view it ends in keeps the members
        elif kind == MERGE_REQ:
            self._on_merge_req(src, hdr)
        elif kind == MERGE_RSP:
            self._on_merge_rsp(src, hdr)
        elif kind == INSTALL_MERGE_VIEW:
            m = self.merge
            if m is not None and m.merge_id == hdr.merge_id and hdr.view is not None:
                self._cast_view(hdr.view, hdr.digest)
                m.flushed = False  # the merged view unblocks our subgroup
                self._end_merge()
        elif kind == CANCEL_MERGE and self.merge is not None and self.merge.merge_id == hdr.merge_id:
            self._end_merge()

    # -- timers --------------------------------------------------------------------------------------
    def on_timer(self, key: object) -> None:  # noqa: C901  one case per timer
        if key == "bundle":
            self._process_queue()
        elif key == "ack":
            self._finish_pending()
        elif key == "flush":
            if self.flushing is not None:
                self.count("flush_guard_timeouts")
                self.flushing = None
                if self.flush_for_merge:
                    self._merge_flush_failed()
                else:
                    self._process_queue()
        elif key == "orphan":
            view = self.view
            if view is not None and self.state == "member" and view.coordinator in self.suspects:
                self._continue_alone("orphaned", "coordinator suspected and no new view came")
        elif key in ("join", "rediscover"):
            if self.state == "joining":
                self._discover()
        elif key == "leave":
            if self.state != "leaving" or self.view is None:
                return
            self.leave_attempts += 1
            if self.leave_attempts > self.config.max_leave_attempts:
                self._left("leave timed out")
                return
            alive = [m for m in self.view.members if m not in self.suspects and m != self.local_address]
            if alive:
                self._send(alive[0], GmsHeader(LEAVE_REQ))
            self.set_timer("leave", self.config.leave_timeout)
        elif key == "merge":
            m = self.merge
            if m is not None and m.leader == self.local_address:
                self._finish_merge()  # with the subgroups that answered, or aborted if we are not ready
            else:
                self._end_merge()

    def describe_state(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "view": None if self.view is None else str(self.view),
            "coordinator": self.is_coordinator,
            "suspects": sorted(map(str, self.suspects)),
            "merging": self.merge is not None,
        }


register_layer(Gms)
