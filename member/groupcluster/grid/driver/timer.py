"""NodeTimer: the one event-loop timer that ticks a sans-IO node at its ``next_deadline()`` (shared by the grid
and invalidation runtimes)."""

from __future__ import annotations

import asyncio
from typing import Any, Generic, Protocol, TypeVar


class TickedNode(Protocol):
    """What the timer needs of a sans-IO node: when it next has something due, and a call to do it."""

    def next_deadline(self) -> float | None: ...

    def tick(self, now: float) -> None: ...


N = TypeVar("N", bound=TickedNode)


class NodeTimer(Generic[N]):
    """One loop timer at the driven node's ``next_deadline()`` (grid and invalidation runtimes): re-armed after
    every step, it ticks the node when due and pumps what the tick produced."""

    _closed: bool
    _loop: asyncio.AbstractEventLoop
    _timer: asyncio.TimerHandle | None
    _timer_at: float | None
    _waiting: dict[int, asyncio.Future[Any]]
    node: N | None  # None until the runtime is bound to its channel

    def _pump(self) -> None:
        raise NotImplementedError

    def _stop(self, gone: Exception) -> None:
        """Closing: no more ticks, and every single operation still waiting fails with ``gone``."""
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for fut in self._waiting.values():
            if not fut.done():
                fut.set_exception(gone)
        self._waiting.clear()

    def _tick(self, node: N, now: float) -> None:
        node.tick(now)

    def _arm(self) -> None:
        node = self.node
        if self._closed or node is None:
            return
        deadline = node.next_deadline()
        if deadline == self._timer_at:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_at = deadline
        if deadline is not None:
            self._timer = self._loop.call_at(deadline, self._on_timer)

    def _on_timer(self) -> None:
        # The loop may fire a hair before the deadline (clock resolution); ticking at the deadline itself keeps
        # the node from finding nothing due and the timer from re-arming at once in a loop.
        due = self._timer_at or 0.0
        self._timer = None
        self._timer_at = None
        node = self.node
        if node is None or self._closed:
            return
        self._tick(node, max(self._loop.time(), due))
        self._pump()
