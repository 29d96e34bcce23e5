"""The simulator's virtual clock: a heap of timed callbacks that runs in time order, jumping over idle time.

Nothing here reads the real clock. Two callbacks due at the same instant run in the order they were
scheduled (a sequence number breaks ties), so a run is a pure function of its inputs and its seed.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any


class EventLoop:
    """Virtual time and the queue of everything that will happen."""

    __slots__ = ("_heap", "_seq", "now", "processed")

    def __init__(self, start: float = 0.0) -> None:
        self.now = start
        self.processed = 0
        self._heap: list[tuple[float, int, Callable[..., Any], tuple[Any, ...]]] = []
        self._seq = 0

    def at(self, t: float, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` at virtual time ``t`` (never earlier than now: the past cannot be changed)."""
        if t < self.now:
            t = self.now
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, fn, args))

    def after(self, delay: float, fn: Callable[..., Any], *args: Any) -> None:
        self.at(self.now + delay, fn, *args)

    def pending(self) -> int:
        return len(self._heap)

    def next_time(self) -> float | None:
        return self._heap[0][0] if self._heap else None

    def run_until(self, end: float, stop: Callable[[], bool] | None = None) -> None:
        """Process events due up to ``end`` (inclusive); the clock then reads ``end``.

        ``stop`` is polled after each event; when it returns True the loop returns early with the clock at
        the time of the last event.
        """
        heap = self._heap
        pop = heapq.heappop
        while heap and heap[0][0] <= end:
            t, _, fn, args = pop(heap)
            self.now = t
            self.processed += 1
            fn(*args)
            if stop is not None and stop():
                return
        if end > self.now:
            self.now = end
