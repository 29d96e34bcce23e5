"""Entry events: the batches a member produces (arrived, departed, written) for its listeners.

:class:`EntryEventLog` holds the kinds asked for, the batches not collected yet and the columns of the
writes applied in the current step."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .facade import GridNode


# Entry event kinds (docs/grid.md, "Entry events"): entries that came here by state transfer, entries of
# segments this member dropped at the end of a rebalance, and writes this member applied as an owner.
EVENT_ARRIVED, EVENT_DEPARTED, EVENT_WRITTEN = "arrived", "departed", "written"
EVENT_KINDS = frozenset((EVENT_ARRIVED, EVENT_DEPARTED, EVENT_WRITTEN))


@dataclass(frozen=True, slots=True)
class EntryEvents:
    """A batch of entry events of one kind, as columns (one object per batch, never one per entry).

    ``keys[i]``, ``versions[i]``, ``values[i]`` describe one entry; a value None is a deletion (a tombstone moved
    or dropped, or a removal written). ``segment`` is the one segment of an ``arrived``/``departed`` batch and -1
    for ``written`` (keys of any segment). ``topology_id``: the topology installed when it happened. The columns
    may be the node's own lists: listeners must not change them.
    """

    kind: str
    segment: int
    topology_id: int
    keys: Sequence[bytes]
    versions: Sequence[int]
    values: Sequence[bytes | None]

    def __len__(self) -> int:
        return len(self.keys)

    def entries(self) -> Iterator[tuple[bytes, int, bytes | None]]:
        """``(key, version, value or None)`` per entry."""
        return zip(self.keys, self.versions, self.values, strict=True)


class EntryEventLog:
    """The entry events of one member: off until :meth:`set_event_kinds`, then batches pile up for take_events."""

    def __init__(self, node: GridNode) -> None:
        self.node = node
        # -- entry events (off until set_event_kinds: then batches pile up for take_events)
        self.event_kinds: frozenset[str] = frozenset()
        self.events: list[EntryEvents] = []
        # Columns of the writes applied in this step while "written" is on; one EntryEvents per step (_flush).
        self.written: tuple[list[bytes], list[int], list[bytes | None]] | None = None

    # ==== entry events =====================================================================================
    def set_event_kinds(self, kinds: Iterable[str]) -> None:
        """:meth:`GridNode.set_event_kinds`."""
        wanted = frozenset(kinds)
        bad = wanted - EVENT_KINDS
        if bad:
            raise ValueError(f"set_event_kinds: unknown kind(s) {sorted(bad)}; known: {sorted(EVENT_KINDS)}")
        self.event_kinds = wanted
        self.written = ([], [], []) if EVENT_WRITTEN in wanted else None
        self.events = [e for e in self.events if e.kind in wanted]

    def take_events(self) -> list[EntryEvents]:
        """:meth:`GridNode.take_events`."""
        events, self.events = self.events, []
        return events

    def event(
        self, kind: str, segment: int, keys: Sequence[bytes], versions: Sequence[int], values: Sequence[bytes | None]
    ) -> None:
        t = self.node.topology
        self.events.append(EntryEvents(kind, segment, t.topology_id if t else 0, keys, versions, values))
        self.node.metrics[f"grid.events_{kind}"] += len(keys)

    def note_written(self, key: bytes, version: int, value: bytes | None) -> None:
        written = self.written
        assert written is not None
        written[0].append(key)
        written[1].append(version)
        written[2].append(value)
