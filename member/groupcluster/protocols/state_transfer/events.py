"""STATE's events, between the layer and the application: they live here, not in core.events, because only
this layer and its drivers use them."""

from __future__ import annotations

from dataclasses import dataclass

from ...core.address import Address
from ...core.events import Event
from ...core.message import Message
from .wire import TransferId


@dataclass(frozen=True, slots=True)
class RequestState(Event):
    """Down, from the application: fetch the group's state once joined (``donor`` None: the coordinator)."""

    donor: Address | None = None


@dataclass(frozen=True, slots=True)
class GetState(Event):
    """Up, to the application (donor side): answer at once with :class:`StateSnapshot` for ``transfer``.

    The state must be the one reached after every delivery output before this event and none after it.
    """

    transfer: TransferId


@dataclass(frozen=True, slots=True)
class StateSnapshot(Event):
    """Down, from the application: the state asked for by :class:`GetState` (``b""`` if it keeps none)."""

    transfer: TransferId
    state: bytes


@dataclass(frozen=True, slots=True)
class SetState(Event):
    """Up, to the application (joiner side): replace your state with ``state``; deliveries that follow continue
    from it. ``state`` is None (and ``donor`` None) for the member that founded the group: it starts empty."""

    state: bytes | None
    donor: Address | None
    transfer: TransferId | None = None


@dataclass(frozen=True, slots=True)
class StateCovered(Event):
    """Up (joiner side): multicasts received that the transferred state already contains — not to be applied
    again. Recorders count them as delivered through the state, at this position of the stream."""

    messages: list[Message]
