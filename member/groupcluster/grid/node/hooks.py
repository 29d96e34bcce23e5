"""NodeHooks: the points where an extension of the driver (the change feed, ``grid/feed.py``) takes part in a
node's step without subclassing it: the store the node creates, a topology being installed, a write re-driven.

The node calls them synchronously inside the step, so an implementation stays sans-IO and deterministic like
the node. The defaults do nothing and give the plain :class:`~..store.SegmentStore`."""

from __future__ import annotations

from ..store import SegmentStore
from ..topology import CacheTopology


class NodeHooks:
    """Called by a :class:`~.facade.GridNode` (its ``hooks``); override what you need."""

    def new_store(self, num_segments: int) -> SegmentStore:
        """The store for a topology of ``num_segments`` segments (the first one, or one with another count)."""
        return SegmentStore(num_segments)

    def installing(self, t: CacheTopology, store: SegmentStore) -> None:
        """``t``, newer than the installed topology, is being installed; ``store`` is the node's store for it,
        before any segment is added, cleared or dropped."""

    def redriving(self, version: int) -> None:
        """A write this member applied (stamped ``version``) is being sent again to the write owners of the
        installed topology: re-driven across a topology change, or pushed after a merge or a repair."""


NO_HOOKS = NodeHooks()
