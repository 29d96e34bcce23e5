"""Histories: what members did, recorded as events, read by the property checkers.

The simulator and real member processes (``groupcluster member --record FILE``) write the same events as
JSON lines, so one set of checkers judges both. Each event is a JSON object with at least ``t`` (seconds),
``member`` (address string) and ``kind``:

=========  ===================================================================================
kind       other fields
=========  ===================================================================================
start      (a member process/stack started)
send       ``msg`` (id, unique per sender), ``dest`` (null for multicast, else address),
           ``view`` (the sender's view id as ``[seq, creator]`` or null before joining)
deliver    ``sender`` (address), ``msg``, ``dest`` (null for multicast)
view       ``view_id`` (``[seq, creator]``), ``members`` (addresses in order), ``merge`` (bool)
crash      (killed without warning; a ``restart`` is a new member with a new incarnation)
leave      (asked to leave gracefully)
left       (leave completed)
pause      / ``resume`` (stopped processing for a while)
=========  ===================================================================================

Application test traffic carries its id at the start of the payload (see :func:`make_payload`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from ..core.address import Address
from ..core.view import View, ViewId


def view_id_json(view_id: ViewId | None) -> list[Any] | None:
    return None if view_id is None else [view_id.seq, str(view_id.creator)]


def make_payload(msg_id: str, size: int = 0) -> bytes:
    """Test payload: the id, then ``|`` and padding up to ``size`` bytes."""
    head = msg_id.encode()
    if size <= len(head) + 1:
        return head
    return head + b"|" + b"x" * (size - len(head) - 1)


def payload_id(payload: bytes) -> str:
    """The id :func:`make_payload` put at the start of ``payload``."""
    head, _, _ = payload.partition(b"|")
    return head.decode("utf-8", errors="replace")


@dataclass(frozen=True, slots=True)
class HistoryEvent:
    t: float
    member: str
    kind: str
    data: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps({"t": round(self.t, 6), "member": self.member, "kind": self.kind, **self.data})

    @classmethod
    def from_json(cls, line: str) -> HistoryEvent:
        obj = json.loads(line)
        if not isinstance(obj, dict) or not {"t", "member", "kind"} <= obj.keys():
            raise ValueError(f"history line lacks t/member/kind: {line[:200]!r}")
        t, member, kind = obj.pop("t"), obj.pop("member"), obj.pop("kind")
        return cls(float(t), str(member), str(kind), obj)


class History:
    """An append-only list of events with helpers to record the common kinds."""

    def __init__(self, events: Iterable[HistoryEvent] = ()) -> None:
        self.events: list[HistoryEvent] = list(events)
        self._sink: TextIO | None = None

    def stream_to(self, sink: TextIO) -> None:
        """Also write every new event to ``sink`` as a JSON line (flushed by the caller)."""
        self._sink = sink

    def add(self, t: float, member: Address | str, kind: str, **data: Any) -> None:
        ev = HistoryEvent(t, str(member), kind, data)
        self.events.append(ev)
        if self._sink is not None:
            self._sink.write(ev.to_json() + "\n")

    # Recording helpers used by drivers -----------------------------------------------------------------
    def send(self, t: float, member: Address, msg_id: str, dest: Address | None, view: View | None) -> None:
        self.add(
            t,
            member,
            "send",
            msg=msg_id,
            dest=None if dest is None else str(dest),
            view=view_id_json(view.view_id if view else None),
        )

    def deliver(self, t: float, member: Address, sender: Address, msg_id: str, dest: Address | None) -> None:
        self.add(t, member, "deliver", sender=str(sender), msg=msg_id, dest=None if dest is None else str(dest))

    def view(self, t: float, member: Address, view: View) -> None:
        self.add(
            t,
            member,
            "view",
            view_id=view_id_json(view.view_id),
            members=[str(m) for m in view.members],
            merge=view.is_merge,
        )

    def __iter__(self) -> Iterator[HistoryEvent]:
        return iter(self.events)

    def __len__(self) -> int:
        return len(self.events)

    def to_lines(self) -> list[str]:
        return [e.to_json() for e in self.events]

    @classmethod
    def read(cls, path: str | Path) -> History:
        with open(path) as fh:
            return cls(HistoryEvent.from_json(line) for line in fh if line.strip())

    @classmethod
    def read_many(cls, paths: Iterable[str | Path]) -> History:
        """Merge several members' files into one history ordered by time (stable within a file)."""
        events: list[HistoryEvent] = []
        for p in paths:
            events.extend(cls.read(p).events)
        events.sort(key=lambda e: e.t)
        return cls(events)
