"""GMS's configuration, its bookkeeping records and :class:`GmsState`, every field of the layer shared by the roles."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...core import protocol_ids
from ...core.address import Address
from ...core.config import param
from ...core.digest import Digest
from ...core.events import GetDigest, Left
from ...core.layer import Layer
from ...core.message import NO_FLOW_CONTROL, Message
from ...core.view import View, ViewId
from .wire import GmsHeader, MergeId


@dataclass(frozen=True)
class GmsConfig:
    join_timeout: float = param("2s", "duration", doc="wait this long for a JOIN_RSP before discovering again")
    join_retry: float = param("300ms", "duration", doc="pause before discovering again when nobody is coordinator")
    max_join_attempts: int = param(
        20, "int", doc="after this many attempts without a coordinator, start a group of our own", minimum=1
    )
    view_bundling: float = param("10ms", "duration", doc="requests arriving within this window share one view")
    view_ack_timeout: float = param("2s", "duration", doc="longest wait for members to acknowledge a view")
    leave_timeout: float = param("2s", "duration", doc="resend a leave request after this long")
    max_leave_attempts: int = param(3, "int", doc="leave anyway after this many unanswered requests", minimum=1)
    merge_timeout: float = param("5s", "duration", doc="a merge not finished by then is cancelled")
    use_flush: bool = param(False, "bool", doc="flush the old view before every view change (virtual synchrony)")
    flush_guard_timeout: float = param(
        "6s", "duration", doc="flush again if FLUSH neither completed nor failed a flush within this time"
    )
    orphan_timeout: float = param(
        "6s", "duration", doc="coordinator suspected and no new view for this long: continue alone until merged"
    )
    max_early_messages: int = param(
        100_000, "int", doc="messages kept that arrive while joining, before our view does", minimum=0
    )


@dataclass
class _PendingView:
    view: View
    joiners: tuple[Address, ...]
    join_digest: Digest
    awaiting: set[Address]


@dataclass
class _Merge:
    merge_id: MergeId
    leader: Address
    waiting: set[Address] = field(default_factory=set)
    responses: dict[Address, tuple[View, Digest]] = field(default_factory=dict)
    # use_flush: our subgroup was flushed for this merge, so its members are blocked until a view comes.
    flushed: bool = False
    # use_flush: the members of our view that take part in our subgroup's flush (the others are suspected).
    participants: tuple[Address, ...] | None = None


class GmsState(Layer):
    """The configuration and every field of the layer, shared by the roles, and the helpers they all use."""

    def __init__(self, config: GmsConfig, ctx: Any) -> None:
        super().__init__(config, ctx)
        self.state = "idle"  # idle -> joining -> member -> leaving -> left
        self.view: View | None = None
        self.max_seq = 0
        self.suspects: set[Address] = set()
        # Coordinator state.
        self.queue: list[tuple[str, Address, int]] = []  # (join|leave|suspect, member, joiner's seqno)
        self.pending: _PendingView | None = None
        self.tmp_members: tuple[Address, ...] = ()
        self.join_rsp_cache: dict[Address, tuple[View, Digest]] = {}
        self.merge: _Merge | None = None
        self.merge_counter = 0
        # Set when every member before us in the view is suspected: we act as coordinator until our view.
        self.acting_coordinator = False
        self.leave_after_pending = False
        # FLUSH (use_flush): the flush in progress, and whether the queue may now become a view.
        self.flushing: tuple[Address, int] | None = None
        self.flush_for_merge = False  # the flush in progress prepares our subgroup for self.merge
        # A view we multicast and have not installed yet (it reaches us through our own stream), and the one
        # FlushAbandoned was already deferred for (each cast view is waited for once).
        self.casting: ViewId | None = None
        self.abandon_deferred_for: ViewId | None = None
        self.flush_ready = False
        self.flush_counter = 0
        self.cancel_timer("orphan")
        # Client state.
        self.early: list[Message] = []  # messages received while joining, delivered once joined
        self.join_attempts = 0
        self.join_target: Address | None = None
        self.leave_attempts = 0

    # -- helpers -------------------------------------------------------------------------------------
    @property
    def is_coordinator(self) -> bool:
        if self.view is None or self.state not in ("member", "leaving"):
            return False
        return self.acting_coordinator or self.view.coordinator == self.local_address

    def _send(self, dest: Address | None, hdr: GmsHeader) -> None:
        self.below.down(Message(dest, flags=NO_FLOW_CONTROL, headers={protocol_ids.GMS: hdr}))

    def _own_seqno(self) -> int:
        digest = self.below.down_event(GetDigest())
        return digest.delivered(self.local_address) if isinstance(digest, Digest) else 0

    def _left(self, reason: str) -> None:
        if self.state == "left":
            return
        self.state = "left"
        for key in ("join", "rediscover", "leave", "bundle", "ack", "merge"):
            self.cancel_timer(key)
        self.above.up_event(Left(reason))
