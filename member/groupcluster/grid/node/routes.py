"""Per-segment routing answers of one topology, computed once per topology."""

from __future__ import annotations

from ...core.address import Address
from ..topology import CacheTopology


class _Routes:
    """Per-segment routing answers of one topology, computed once: a topology never changes, and every
    operation asks them on the originator, the primary and each backup (they showed up in profiles)."""

    __slots__ = ("can_read", "can_write", "i_read", "i_write", "primary", "read", "topology", "write")

    def __init__(self, t: CacheTopology, me: Address) -> None:
        self.topology = t
        table = t.routing_table(me)
        self.read = [r.read for r in table]
        self.write = [r.write for r in table]
        self.can_read = [r.can_read for r in table]
        self.can_write = [r.can_write for r in table]
        # This member's part per segment (asked per operation; address comparisons are Python calls).
        self.i_read = [r.i_read for r in table]
        self.i_write = [r.i_write for r in table]
        self.primary = [r.primary for r in table]


def _fetching(t: CacheTopology, seg: int) -> set[Address]:
    """Owners that pull ``seg`` in ``t`` (pending but not current owners): their copy starts empty."""
    if t.pending is None:
        return set()
    return set(t.pending.owners_of(seg)) - set(t.current.owners_of(seg))
