"""A history indexed for the group's checkers: sends, deliveries, views and ends by member, in one pass.

Also what every checker shares: :class:`Violation` (a checker's verdict), :class:`HistoryFormatError` and the
field readers that name a malformed event. The checkers are :mod:`groupcluster.sim.checkers` (what every stack
promises), :mod:`groupcluster.sim.stack_checkers` (what only some promise) and :mod:`groupcluster.sim.grid`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from .history import History, HistoryEvent

# A view id as a hashable value: (seq, creator address string).
VidKey = tuple[int, str]

# Kinds that end a member (an address is one incarnation; a restart is a new address).
_ENDING_KINDS = frozenset({"crash", "leave", "left"})


class HistoryFormatError(ValueError):
    """A history event lacks a field a checker needs, or the field has the wrong type."""


@dataclass(frozen=True, slots=True)
class Violation:
    """One broken property: which, seen at which member, and what exactly."""

    property: str
    member: str
    detail: str

    def __str__(self) -> str:
        return f"{self.property}: {self.member}: {self.detail}"

    def to_json(self) -> dict[str, str]:
        return {"property": self.property, "member": self.member, "detail": self.detail}


def event_field(ev: HistoryEvent, pos: int, name: str) -> Any:
    try:
        return ev.data[name]
    except KeyError:
        raise HistoryFormatError(f"history event #{pos} ({ev.kind} by {ev.member}): missing field {name!r}") from None


def _vid(ev: HistoryEvent, pos: int, name: str) -> VidKey | None:
    raw = event_field(ev, pos, name)
    if raw is None:
        return None
    if (
        not isinstance(raw, list | tuple)
        or len(raw) != 2
        or not isinstance(raw[0], int)
        or isinstance(raw[0], bool)
        or not isinstance(raw[1], str)
    ):
        raise HistoryFormatError(
            f"history event #{pos} ({ev.kind} by {ev.member}): {name} must be [seq, creator], got {raw!r}"
        )
    return (raw[0], raw[1])


def _opt_str(ev: HistoryEvent, pos: int, name: str) -> str | None:
    raw = event_field(ev, pos, name)
    if raw is not None and not isinstance(raw, str):
        raise HistoryFormatError(f"history event #{pos} ({ev.kind} by {ev.member}): {name} must be a string or null")
    return raw


def event_str(ev: HistoryEvent, pos: int, name: str) -> str:
    raw = event_field(ev, pos, name)
    if not isinstance(raw, str):
        raise HistoryFormatError(f"history event #{pos} ({ev.kind} by {ev.member}): {name} must be a string")
    return raw


def fmt_vid(vid: VidKey | None) -> str:
    return "none" if vid is None else f"{vid[1]}|{vid[0]}"


@dataclass(slots=True)
class _Send:
    pos: int
    t: float
    sender: str
    msg: str
    dest: str | None
    view: VidKey | None
    ordinal: int  # position among this sender's sends


@dataclass(slots=True)
class _Deliver:
    pos: int
    t: float
    receiver: str
    sender: str
    msg: str
    dest: str | None


class HistoryIndex:
    """One pass over a history, shared by the checkers: sends, deliveries, views and ends by member."""

    def __init__(self, history: History | Iterable[HistoryEvent]) -> None:
        self.events: list[HistoryEvent] = list(history.events if isinstance(history, History) else history)
        self.sends: dict[tuple[str, str], _Send] = {}
        self.duplicate_sends: list[_Send] = []
        self.deliveries: list[_Deliver] = []
        # member -> [(pos, view id, members)] in the order installed
        self.views: dict[str, list[tuple[int, VidKey, tuple[str, ...]]]] = {}
        self.view_positions: dict[str, list[int]] = {}
        self.members: dict[str, int] = {}  # every member that recorded something -> first position
        self.ended: dict[str, int] = {}  # member -> position of its first crash/leave/left
        self.last_t = 0.0
        ordinals: dict[str, int] = {}
        for pos, ev in enumerate(self.events):
            member = ev.member
            if member not in self.members:
                self.members[member] = pos
            if ev.t > self.last_t:
                self.last_t = ev.t
            kind = ev.kind
            if kind == "deliver":
                self.deliveries.append(
                    _Deliver(
                        pos,
                        ev.t,
                        member,
                        event_str(ev, pos, "sender"),
                        event_str(ev, pos, "msg"),
                        _opt_str(ev, pos, "dest"),
                    )
                )
            elif kind == "send":
                n = ordinals.get(member, 0)
                ordinals[member] = n + 1
                send = _Send(
                    pos, ev.t, member, event_str(ev, pos, "msg"), _opt_str(ev, pos, "dest"), _vid(ev, pos, "view"), n
                )
                key = (member, send.msg)
                if key in self.sends:
                    self.duplicate_sends.append(send)
                else:
                    self.sends[key] = send
            elif kind == "view":
                vid = _vid(ev, pos, "view_id")
                members = event_field(ev, pos, "members")
                if vid is None or not isinstance(members, list) or not all(isinstance(m, str) for m in members):
                    raise HistoryFormatError(
                        f"history event #{pos} (view by {member}): needs view_id [seq, creator] and members [str]"
                    )
                self.views.setdefault(member, []).append((pos, vid, tuple(members)))
                self.view_positions.setdefault(member, []).append(pos)
            elif kind in _ENDING_KINDS and member not in self.ended:
                self.ended[member] = pos
        self._suffix: dict[str, list[frozenset[str]]] = {}

    def live_members(self) -> set[str]:
        """Members that recorded something and never crashed, left or asked to leave."""
        return {m for m in self.members if m not in self.ended}

    def suffix_common(self, member: str) -> list[frozenset[str]]:
        """For each of ``member``'s views k: the members present in every view it installed from k on."""
        cached = self._suffix.get(member)
        if cached is None:
            views = self.views.get(member, [])
            cached = [frozenset()] * len(views)
            acc: frozenset[str] | None = None
            for k in range(len(views) - 1, -1, -1):
                members = frozenset(views[k][2])
                acc = members if acc is None else acc & members
                cached[k] = acc
            self._suffix[member] = cached
        return cached


def index_of(history: History | HistoryIndex | Iterable[HistoryEvent]) -> HistoryIndex:
    return history if isinstance(history, HistoryIndex) else HistoryIndex(history)


Checker = Callable[[HistoryIndex], list[Violation]]
