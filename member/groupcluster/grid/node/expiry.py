"""Expiry: entries whose lifespan passed removed by their primary, and tombstones dropped after their grace.

The expiry times themselves live in the store (``SegmentStore``); this part decides when and where they go."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ..topology import (
    Availability,
    Phase,
)

if TYPE_CHECKING:
    from .facade import GridNode


# Expiry (docs/grid.md, "Expiry"): entries removed per step at most (a mass expiry is spread over steps, as a
# large drop is), and when a member that is not an expired entry's primary looks again (the primary removes
# it; if the primary died first, we may be the new one by then).
EXPIRE_PER_STEP = 500


EXPIRY_RECHECK = 1.0


def _check_expires(expires: object, field: str) -> None:
    if type(expires) is not float or not 0.0 <= expires < math.inf:
        raise ValueError(f"{field}: expected a Unix time as a float (0.0: never), got {expires!r}")


class Expiry:
    """Removal of expired entries (as the primary's deletes) and of old tombstones."""

    def __init__(self, node: GridNode) -> None:
        self.node = node

    def tombstone_expiry(self) -> float | None:
        """When the oldest tombstone may go, or None while none may (see docs/grid.md, tombstones).

        Tombstones stop a deleted key from coming back when an older value arrives: by state transfer during a
        rebalance, or pushed by another partition after a merge. So none goes while a rebalance or a merge
        runs, or while our topology is degraded (a partition may still have older values to push when it
        merges back); otherwise a tombstone goes ``tombstone_grace`` after this member stored it.
        """
        grace = self.node.config.tombstone_grace
        t = self.node.topology
        if grace <= 0 or self.node.store is None or t is None:
            return None
        oldest = self.node.store.oldest_tombstone()
        # ``merging`` scans the pending writes: asked last, and only when a tombstone waits.
        if oldest is None or t.phase != Phase.NO_REBALANCE or t.availability != Availability.AVAILABLE:
            return None
        return None if self.node.merging else oldest + grace

    def _remove_expired(self) -> None:
        """Remove the entries whose expiry has passed, for the segments we are the primary of: each as a delete
        stamped now, which reaches the other write owners as any write does (backups, re-driven across
        topologies), so the copies, the change feed and transactions all see one ordinary delete. An entry whose
        primary is another member is looked at again after ``EXPIRY_RECHECK`` (its primary removes it; if that
        member dies first, we may be the new primary by then); so is one we cannot delete now (a transaction
        holds the key, the segment cannot be written, a merge is pending)."""
        store = self.node.store
        assert store is not None
        wall = self.node._now + self.node.wall_offset
        if store._expiring[0][0] > wall:
            return
        due = store.due_expiries(wall, EXPIRE_PER_STEP)
        t = self.node.topology
        r = self.node._routes(t) if t is not None else None
        locks = self.node.tx.locks
        for seg, key, version in due:
            if (
                r is None
                or t is None
                or not r.primary[seg]
                or not r.can_write[seg]
                or self.node.membership.merge_hold is not None
                or (locks.any_locked() and locks.is_held(key))
                or (locks.any_blocked() and locks.is_blocked(seg))
            ):
                store.recheck_expiry(wall + EXPIRY_RECHECK, seg, key, version)
                continue
            self.node.replication.stamp_write(
                seg, key, None, 0.0, t.topology_id, r.write[seg][1:], self.node.address, 0, 0
            )
            self.node.metrics["grid.entries_expired"] += 1

    def tick(self, now: float) -> None:
        """Drop the tombstones past their grace, remove the entries whose expiry passed."""
        expiry = self.tombstone_expiry()
        if expiry is not None and now >= expiry:
            assert self.node.store is not None
            self.node.metrics["grid.tombstones_expired"] += self.node.store.expire_tombstones(
                now, self.node.config.tombstone_grace
            )
        if self.node.store is not None and self.node.store._expiring:
            self._remove_expired()
