"""Entry events: the batches a member produces (arrived, departed, written) for its listeners."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

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
