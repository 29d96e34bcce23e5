"""Writes a member's history (see :mod:`groupcluster.sim.history`) as JSON lines, cheaply.

Deliveries are the hot path (tens of thousands per second), so their lines are built with string
formatting from cached, already-encoded pieces instead of ``json.dumps`` of a dict; they parse to the same
events. Lines are buffered and written every ``flush_interval`` seconds, when the buffer grows large, at
close, and before every batch of sends is handed to the stack (so a member killed with SIGKILL never has
delivered messages on the others' records that its own record does not show as sent). Nothing waits on the
disk per message.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterable
from json.encoder import encode_basestring_ascii as _json_str
from pathlib import Path
from typing import Any, TextIO

from ..core.address import Address
from ..core.message import Message
from ..core.view import View
from ..sim.history import HistoryEvent, payload_id, view_id_json

MsgId = Callable[[bytes], str]

_FLUSH_LINES = 20000


class Recorder:
    """One member's history file, opened for appending (a restarted member adds to its old file)."""

    def __init__(
        self,
        path: str | Path,
        member: Address,
        *,
        msg_id: MsgId = payload_id,
        flush_interval: float = 0.25,
    ) -> None:
        self.path = Path(path)
        self.member = str(member)
        self.msg_id = msg_id
        self.flush_interval = flush_interval
        self._fh: TextIO | None = open(self.path, "a", encoding="utf-8")  # noqa: SIM115  # closed by close()
        self._lines: list[str] = []
        self._member_json = _json_str(self.member)
        self._names: dict[Address | None, str] = {None: "null"}
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Flush periodically on ``loop``."""
        self._loop = loop
        self._timer = loop.call_later(self.flush_interval, self._tick)

    def _tick(self) -> None:
        self.flush()
        if self._fh is not None and self._loop is not None:
            self._timer = self._loop.call_later(self.flush_interval, self._tick)

    def _name(self, addr: Address | None) -> str:
        name = self._names.get(addr)
        if name is None:
            name = self._names[addr] = _json_str(str(addr))
        return name

    # -- events ------------------------------------------------------------------------------------------
    def event(self, kind: str, **data: Any) -> None:
        self._append(HistoryEvent(time.time(), self.member, kind, data).to_json() + "\n")

    def start_event(self) -> None:
        self.event("start")

    def sends(self, messages: Iterable[Message], view: View | None) -> None:
        t = round(time.time(), 6)
        view_json = json.dumps(view_id_json(view.view_id) if view else None)
        head = f'{{"t": {t}, "member": {self._member_json}, "kind": "send", "msg": '
        lines = self._lines
        msg_id = self.msg_id
        name = self._name
        for msg in messages:
            lines.append(f'{head}{_json_str(msg_id(msg.payload))}, "dest": {name(msg.dest)}, "view": {view_json}}}\n')
        # Written before the messages reach the stack (one write per send step, not per message): a message
        # that left the process is on record even if the process is killed right after.
        self.flush()

    def delivers(self, messages: Iterable[Message], via: str | None = None) -> None:
        """Deliveries; ``via="state"`` marks multicasts a transferred state already contained."""
        t = round(time.time(), 6)
        head = f'{{"t": {t}, "member": {self._member_json}, "kind": "deliver", "sender": '
        tail = "}\n" if via is None else f', "via": {_json_str(via)}}}\n'
        lines = self._lines
        msg_id = self.msg_id
        name = self._name
        for msg in messages:
            lines.append(
                f'{head}{name(msg.src)}, "msg": {_json_str(msg_id(msg.payload))}, "dest": {name(msg.dest)}{tail}'
            )
        if len(lines) >= _FLUSH_LINES:
            self.flush()

    def view(self, view: View) -> None:
        self.event(
            "view",
            view_id=view_id_json(view.view_id),
            members=[str(m) for m in view.members],
            merge=view.is_merge,
        )

    def _append(self, line: str) -> None:
        self._lines.append(line)
        if len(self._lines) >= _FLUSH_LINES:
            self.flush()

    # -- output ------------------------------------------------------------------------------------------
    def flush(self) -> None:
        if self._lines and self._fh is not None:
            lines, self._lines = self._lines, []
            self._fh.write("".join(lines))
            self._fh.flush()

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.flush()
        if self._fh is not None:
            self._fh.close()
            self._fh = None
