"""Typed control events that travel between layers (messages travel separately, in batches).

Down events go from the application or an upper layer towards the transport; up events go towards the
application. Events that reach the top of the stack become outputs of the stack for its driver.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .address import Address
from .digest import Digest
from .message import Message
from .view import View


class Event:
    """Base of all control events."""

    __slots__ = ()


# ---- down events --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Connect(Event):
    """Join the group (sent down by the stack on start)."""


@dataclass(frozen=True, slots=True)
class Disconnect(Event):
    """Leave the group gracefully."""


@dataclass(frozen=True, slots=True)
class FindMembers(Event):
    """Ask discovery for the members it can find; answered later by :class:`MembersFound` going up."""

    purpose: str = "join"  # "join" or "merge"


@dataclass(frozen=True, slots=True)
class UpdateHosts(Event):
    """New candidate endpoints from a discovery source outside the stack (a file, the Kubernetes API)."""

    hosts: tuple[tuple[str, int], ...]


@dataclass(frozen=True, slots=True)
class GetDigest(Event):
    """Returns NAKACK's current :class:`Digest` synchronously."""


@dataclass(frozen=True, slots=True)
class SetDigest(Event):
    """Replace NAKACK's receive windows with ``digest`` (a joiner's start points)."""

    digest: Digest


@dataclass(frozen=True, slots=True)
class MergeDigest(Event):
    """Add windows for members new to us after a merge, starting after their digest entries.

    ``cut``: the digest is the flushed cut of every subgroup (FLUSH ran before the merge), so a window that
    lags behind its entry moves up to it too: what lies between was sent in a view we were not in, or was not
    delivered by our own subgroup's flush. Without a flush the entries are only what the subgroup
    coordinators had delivered, and a lagging window keeps its place to fetch what it still misses.
    """

    digest: Digest
    cut: bool = False


@dataclass(frozen=True, slots=True)
class Stability(Event):
    """STABLE found seqnos delivered everywhere (GC) and the highest seqnos anyone received (find lost tails)."""

    view_id: object
    stable: Digest


@dataclass(frozen=True, slots=True)
class FlushHold(Event):
    """FLUSH: hold delivery at what has been delivered so far; returns NAKACK's digest (the member's report)."""


@dataclass(frozen=True, slots=True)
class FlushTarget(Event):
    """FLUSH: deliver exactly up to ``target`` per sender; fetch what is missing from ``holders[sender]``."""

    target: Digest
    holders: tuple[tuple[Address, Address], ...]


@dataclass(frozen=True, slots=True)
class FlushRelease(Event):
    """FLUSH: lift the delivery holds of ``members`` (all members when empty)."""

    members: tuple[Address, ...] = ()


@dataclass(frozen=True, slots=True)
class FlushRequest(Event):
    """GMS asks FLUSH (above it) to quiet ``participants`` before a view change; answered by FlushCompleted."""

    flush_id: tuple[Address, int]
    participants: tuple[Address, ...]


@dataclass(frozen=True, slots=True)
class FlushCompleted(Event):
    """FLUSH tells GMS (below it) that every participant delivered the same old-view messages."""

    flush_id: tuple[Address, int]


@dataclass(frozen=True, slots=True)
class FlushFailed(Event):
    """FLUSH tells GMS that ``missing`` did not answer in time (they are suspected; GMS flushes again)."""

    flush_id: tuple[Address, int]
    missing: tuple[Address, ...]
    retry_after: float = 0.0  # flush again no sooner than this (FLUSH's retry_timeout)


@dataclass(frozen=True, slots=True)
class FlushGroup(Event):
    """The application asks for a flush of the whole group (``Channel.flush()``): the coordinator runs one and
    installs a new view with the same members, so every member delivered the same multicasts before it.
    GMS answers True when the stack flushes (``gms.use_flush``), False otherwise."""


@dataclass(frozen=True, slots=True)
class FlushAbandoned(Event):
    """FLUSH tells GMS that this member stayed blocked past its timeout without a new view.

    The rest of the group may have moved on to a view this member never received: multicasts it sends now
    must not count as old-view messages. GMS moves a participant into a view of its own (MERGE brings it
    back); if the member stays in its view, FLUSH unblocks it there — unless GMS answers True: a view is on its
    way (our subgroup is flushed for a merge, which ends by its own timeout, or we multicast the view and it has not
    reached us yet), and FLUSH keeps waiting for it.
    """


@dataclass(frozen=True, slots=True)
class BlockOk(Event):
    """The application finished its block() work (sent down after a :class:`Block` output)."""


@dataclass(frozen=True, slots=True)
class GetHosts(Event):
    """Returns the endpoints discovery knows (used by MERGE to probe members outside the view)."""


# ---- events both ways -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ViewChange(Event):
    """A new view: sent down by GMS before it is installed above, and up to the application."""

    view: View


@dataclass(frozen=True, slots=True)
class SetLocalAddress(Event):
    address: Address


# ---- up events ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DiscoveryResponse:
    """One answer to discovery: who answered, whom it considers coordinator, and its view id if joined."""

    address: Address
    coordinator: Address | None
    view_id: object | None
    is_coordinator: bool


@dataclass(frozen=True, slots=True)
class MembersFound(Event):
    purpose: str
    responses: tuple[DiscoveryResponse, ...]


@dataclass(frozen=True, slots=True)
class Suspect(Event):
    """Failure detection believes ``member`` crashed (after verification)."""

    member: Address


@dataclass(frozen=True, slots=True)
class Unsuspect(Event):
    member: Address


@dataclass(frozen=True, slots=True)
class VerifySuspect(Event):
    """Down to failure detection: verify ``members`` now (ARE_YOU_ALIVE), without waiting for their silence.

    Another member acts on their death (a successor's flush): our own detector, on a longer timeout, would
    take seconds to agree. Those that do not answer are reported as :class:`Suspect`; answering ones are not.
    """

    members: tuple[Address, ...]


@dataclass(frozen=True, slots=True)
class MergeNeeded(Event):
    """MERGE saw several coordinators (or inconsistent views); GMS decides whether to lead a merge."""

    coordinators: tuple[Address, ...]
    views: tuple[View, ...] = field(default=())


@dataclass(frozen=True, slots=True)
class Joined(Event):
    view: View


@dataclass(frozen=True, slots=True)
class JoinFailed(Event):
    reason: str


@dataclass(frozen=True, slots=True)
class Left(Event):
    """The member has left the group (its leave completed, or it stopped)."""

    reason: str


@dataclass(frozen=True, slots=True)
class Backpressure(Event):
    """Flow control: ``blocked`` True means the application should stop sending until it turns False."""

    blocked: bool


@dataclass(frozen=True, slots=True)
class Block(Event):
    """FLUSH: stop sending (the application may still send during the callback)."""


@dataclass(frozen=True, slots=True)
class Unblock(Event):
    """FLUSH: sending may resume."""


@dataclass(frozen=True, slots=True)
class Deliver(Event):
    """A batch of application messages delivered, in order."""

    messages: list[Message]
