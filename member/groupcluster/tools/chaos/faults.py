"""The fault plan of a chaos run: the fault kinds, their seeded schedule (:class:`FaultSchedule`) and the
record of a fault as injected (:class:`FaultRecord`)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import NamedTuple

KINDS = ("kill", "pause", "leave", "cut")
CAPACITY = "capacity"  # the fault kind --capacity-changes adds
# The capacities a capacity fault sets (drawn from their own seeded stream: see FaultSchedule.capacity).
CAPACITY_VALUES = (0.0, 0.5, 1.0, 2.0)
FAULT_GAP = (2.0, 5.0)  # seconds between faults (seeded)
# Seconds a paused member stays stopped (seeded): past the failure detector's 4 s (+ verification) a paused
# member is suspected and excluded, and on SIGCONT it comes back through a merge; shorter pauses are
# ridden out. Both happen.
PAUSE_LENGTH = (1.0, 10.0)
# Seconds a cut-off member stays cut off (seeded): like a pause, a long cut gets it excluded (and it comes back
# through a merge), a short one is ridden out; unlike a pause, the member keeps running and serving its
# clients on its own side meanwhile.
CUT_LENGTH = (2.0, 12.0)


@dataclass
class FaultRecord:
    """One injected fault, as shown in the report."""

    number: int
    at: float  # seconds since the workload started
    kind: str
    member: str
    detail: str
    replacement: str | None = None
    length: float | None = None  # seconds a pause or a cut lasted
    recovered_after: float | None = None  # seconds from the fault until the grid was balanced again
    # A cut: frames to or from the other side that the victim's faults layer dropped, and the others' layers
    # together (their counters over the cut, read just before the heal): that the cut really cut.
    dropped: list[int] | None = None
    started: float = field(default=0.0, repr=False)  # time.monotonic() of the fault


class FaultDraw(NamedTuple):
    kind: str
    victim: str
    hold: float  # seconds a pause or a cut lasts (drawn for every kind, used by these two)


class FaultSchedule:
    """The seeded draws of a run: gaps, kinds, victims and pause/cut lengths, in the order the run asks for them.

    Victims are drawn by name from the members present (``m1``, ``m2``, ... with replacements taking the next
    number), which the schedule itself determines, so a seed replays the same faults on the same names.
    """

    def __init__(self, seed: int, *, capacity_changes: bool = False) -> None:
        self.rng = random.Random(seed)
        self.kinds = (*KINDS, CAPACITY) if capacity_changes else KINDS
        # Capacity values come from a stream of their own, so the faults' stream draws the same with or without
        # them (kinds aside) and a capacity fault's value does not shift later victims and lengths.
        self._capacity_rng = random.Random(f"capacity-{seed}")
        self._first: list[str] = []

    def gap(self) -> float:
        return self.rng.uniform(*FAULT_GAP)

    def draw(self, number: int, names: list[str]) -> FaultDraw:
        """Fault ``number`` (from 1). The first ``len(self.kinds)`` faults are each kind once, in a seeded order."""
        kinds = self.kinds
        if number == 1:
            self._first = self.rng.sample(kinds, len(kinds))
        kind = self._first[number - 1] if number <= len(kinds) else self.rng.choice(kinds)
        victim = self.rng.choice(sorted(names, key=lambda n: (len(n), n)))
        # Both lengths are drawn for every kind: later draws do not depend on which kinds came before.
        pause_for = self.rng.uniform(*PAUSE_LENGTH)
        cut_for = self.rng.uniform(*CUT_LENGTH)
        return FaultDraw(kind, victim, cut_for if kind == "cut" else pause_for)

    def capacity(self) -> float:
        """The capacity a capacity fault sets (one of :data:`CAPACITY_VALUES`)."""
        return self._capacity_rng.choice(CAPACITY_VALUES)
