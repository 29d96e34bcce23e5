"""Persistence restore: the entries a member's persistent store brought back, merged into a new grid or discarded.

It holds those entries until the first topology, the highest topology id the store saw (the floor new
topologies start above), the outcome, and the pushes of restored entries not yet acknowledged."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

from ..consistent_hash import segment_of
from ..store import (
    TransferEntry,
    tie_wins,
)
from ..topology import (
    CacheTopology,
    Phase,
    owner_set,
)

if TYPE_CHECKING:
    from .facade import GridNode

log = logging.getLogger("groupcluster.grid")


class Restore:
    """What the persistent store brought back, until the first topology settles it."""

    def __init__(self, node: GridNode) -> None:
        self.node = node
        # -- persistence (docs/grid.md): entries a persistent store brought back, waiting for our first topology
        self.restored: list[TransferEntry] | None = None
        self._restored_expiries: dict[tuple[bytes, int], float] = {}
        self.topology_floor = 0  # the highest topology id the store saw; a new grid must start above it
        self.restore_outcome = ""  # "", "merged" (formed a new grid: pushed as a merge) or "discarded"
        self.restore_wids: set[int] = set()  # pushes of restored entries not yet acknowledged by every owner

    def restore(
        self,
        entries: list[TransferEntry],
        topology_floor: int,
        expiries: Mapping[tuple[bytes, int], float] | None = None,
    ) -> None:
        """:meth:`GridNode.restore`."""
        if self.node.topology is not None:
            raise RuntimeError("GridNode.restore: only before the first topology")
        self.restored = list(entries)
        self._restored_expiries = dict(expiries or {})
        self.topology_floor = max(0, topology_floor)

    def settle_restored(self, t: CacheTopology) -> None:
        """Our first topology: merge what the persistent store brought back, or discard it (see :meth:`restore`)."""
        entries, self.restored = self.restored or [], None
        expiries, self._restored_expiries = self._restored_expiries, {}
        store = self.node.store
        assert store is not None
        if self.node.address in owner_set(t.current) and t.phase == Phase.NO_REBALANCE:
            self.restore_outcome = "merged"
            # The persistent copy restarts from what this member holds from now on: kept entries come back to
            # it through their owners' writes (ours included). The old rows are set aside, not deleted, until
            # every push is acknowledged: a member killed during the push brings them back at its next start.
            store.stash_backing()
            n = t.num_segments
            first = self.node.replication.next_write
            # A key may come twice (the rows a killed restore had set aside, and the new ones): push the one the
            # stores would keep (the rule of SegmentStore.write), so the expiry by key is that version's.
            newest: dict[bytes, TransferEntry] = {}
            for e in entries:
                old = newest.get(e[0])
                if old is None or old[1] < e[1] or (old[1] == e[1] and tie_wins(e[2], old[2])):
                    newest[e[0]] = e
            self.node.replication.push_entries(
                [(segment_of(k, n), k, v, val) for k, v, val in newest.values()],
                merge=False,
                expiries={(segment_of(k, n), k): expiries[k, v] for k, v, _ in newest.values() if (k, v) in expiries},
            )
            self.restore_wids = {
                w for w in range(first, self.node.replication.next_write) if w in self.node.replication.writes
            }
            if not self.restore_wids:
                store.drop_stash()
            self.node.metrics["grid.restored_entries_pushed"] += len(entries)
        else:
            # Joined a running grid: nothing of the old file may linger (it may be stale).
            store.reset_backing()
            self.restore_outcome = "discarded"
            self.node.metrics["grid.restored_entries_discarded"] += len(entries)
        # A warning when there was something, so it shows at the default log level: an operator should know a
        # store was emptied or merged.
        log.log(
            logging.WARNING if entries else logging.INFO,
            "%s: persistent store %s: %d entries (%s)",
            self.node.address,
            self.restore_outcome,
            len(entries),
            "formed a new grid with the other members: pushed to their owners, newest version wins"
            if self.restore_outcome == "merged"
            else "joined a running grid: the store is cleared, its entries may be stale",
        )

    def restore_done(self, wid: int) -> None:
        wids = self.restore_wids
        wids.discard(wid)
        if not wids and self.node.store is not None:
            self.node.store.drop_stash()  # every restored entry is with its owners now
