"""GridRuntime: the thin adapter that runs a sans-IO :class:`~..node.GridNode` on a live group channel.

It moves views, delivered batches and time into the node and the node's payloads out to the group; it turns
client operations into awaitables completed by the node's results::

    grid = GridRuntime(GridConfig(), http_url="http://127.0.0.1:8080")
    ch = await Channel.connect(..., on_view=grid.on_view, on_messages=grid.on_messages)
    grid.bind(ch)
    await grid.put(b"k", b"v"); value = await grid.get(b"k")
    grid.leave(); await grid.wait_ready_to_leave(); await ch.leave()

**Multiplexing.** Every payload it sends starts with a one-byte tag (:data:`~.runtime_base.TAG_GRID` for
node payloads, :data:`~.runtime_base.TAG_INFO` for member info); payloads with another first byte go to the
``other`` callback unchanged (the channel is shared with the member's test workload). Named caches
(:mod:`..caches`) run one more :class:`GridRuntime` each, with their own ``wire_prefix`` and the default
runtime as ``parent``.

**Binding late.** The node needs our address, which exists only once ``Channel.connect`` runs: events that
arrive before :meth:`GridRuntime.bind` are buffered in order and replayed into the node.

**Change feed.** The node runs with :class:`~..feed.ChangeFeed` as its hooks, so its store logs every write
it applies; :meth:`GridRuntime.changes` pages it up to :meth:`GridRuntime.stable_version` (docs/spark.md).

**Parts.** The class is put together from :class:`~.runtime_base.RuntimeBase` (state, member info, the step)
and its parts: :mod:`.operations` (key operations), :mod:`.transactions`, :mod:`.segments` (scans, change
feed, routing); this module holds the channel callbacks, binding, leaving and status.
"""

from __future__ import annotations

import logging
import os
import time
from typing import TYPE_CHECKING, Any

from ...core.address import Address
from ...core.message import Message
from ...core.view import View
from ..errors import GridLeaving, GridUnavailable
from ..node import GridNode
from ..topology import Availability, Phase
from .operations import RuntimeOperations
from .runtime_base import TAG_GRID, TAG_INFO
from .segments import RuntimeSegments
from .transactions import RuntimeTransactions

if TYPE_CHECKING:
    from ...runtime.channel import Channel

log = logging.getLogger("groupcluster.grid.runtime")


class GridRuntime(RuntimeOperations, RuntimeTransactions, RuntimeSegments):
    """Drives one :class:`GridNode` from a channel's callbacks and the event loop's clock."""

    # ==== channel callbacks (register them with Channel.connect) ============================================
    def on_view(self, view: View) -> None:
        if self.node is None:
            self._early.append(("view", view))
            return
        self.node.on_view(view.members, self._loop.time(), merge=view.is_merge)
        members = set(view.members)
        for gone in [a for a in self.endpoints if a not in members]:
            del self.endpoints[gone]  # in place: named caches share this map
        self.unfinished = {a: v for a, v in self.unfinished.items() if a in view.members}
        self.peer_clock_ahead = {a: v for a, v in self.peer_clock_ahead.items() if a in members}
        self._announced_low = None  # new members need to hear it
        self._announce()
        self._pump()

    def on_messages(self, msgs: list[Message]) -> None:
        grid: list[tuple[Address, bytes]] = []
        others: list[Message] = []
        me = self.ch.address if self.ch is not None else None
        for m in msgs:
            p = m.payload
            tag = p[0] if p else -1
            if tag == TAG_GRID:
                # Our own copy of a multicast: the node already handled what it sent to itself.
                if m.dest is None and m.src == me:
                    continue
                grid.append((m.sender(), p[1:]))
            elif tag == TAG_INFO:
                self._on_info(m.sender(), p)
            else:
                others.append(m)
        if others and self.other is not None:
            self.other(others)
        if grid:
            self.deliver(grid)

    def deliver(self, grid: list[tuple[Address, bytes]]) -> None:
        """Payloads for our node, tag already stripped and our own multicast copies already left out."""
        if self.node is None:
            # Before bind we cannot tell our own multicast copies apart; bind() filters them.
            self._early.append(("msgs", grid))
            return
        self.node.on_messages(grid, self._loop.time())
        self._pump()

    def bind(self, ch: Channel) -> None:
        """Create the node now that the channel (and so our address) exists, and replay what came before."""
        self.ch = ch
        self.node = GridNode(ch.address, self.config, hooks=self.feed)
        # The node is given the loop's (monotonic) time; versions carry wall-clock time (store.next_seq).
        self.node.wall_offset = time.time() - self._loop.time()
        self._sync_event_kinds()
        if self.config.persistence == "write_through" and self._backing is None:
            from ..persist import SqliteBacking

            a = ch.address
            # Named caches (grid/caches.py) keep a file of their own beside the default cache's.
            suffix = "" if self._parent is None else f"-{self.name}"
            name = f"grid-{a.host}-{a.port}{suffix}.sqlite"
            self._backing = SqliteBacking(os.path.join(self.config.persistence_path, name))
        if self._backing is not None:
            entries, expiries = self._backing.load()
            self.node.restore(entries, self._backing.topology_id, expiries)
            log.info(
                "persistent store %s: %d entries, topology id up to %d (merged if this member forms a new grid with "
                "the others, cleared if it joins a running grid)",
                self._backing.path,
                len(entries),
                self._backing.topology_id,
            )
        early, self._early = self._early, []
        for kind, item in early:
            if kind == "view":
                self.on_view(item)
            else:
                batch = [(src, p) for src, p in item if src != ch.address]
                if batch:
                    self.node.on_messages(batch, self._loop.time())
                    self._pump()
        if ch.view is not None and (self.node.view != ch.view.members):
            self.on_view(ch.view)
        self._announce()
        self._pump()

    # ==== leaving =========================================================================================
    def leave(self) -> None:
        """Ask the coordinator to move our segments away; :meth:`wait_ready_to_leave` returns when done."""
        node = self.node
        if node is None:
            self._ready_to_leave.set()
            return
        node.leave(self._loop.time())
        self._pump()

    def set_capacity(self, capacity: float) -> None:
        """This member's new capacity (GridNode.set_capacity); raises ValueError for a bad value and
        GridUnavailable before the grid started here."""
        node = self.node
        if node is None:
            raise GridUnavailable("no grid node yet (not joined)")
        node.set_capacity(capacity, self._loop.time())
        self._pump()

    def force_available(self) -> bool:
        """Operator's override, on the coordinator only (False elsewhere): leave degraded mode with the members
        present, accepting that segments whose owners are all gone lost their data (see GridNode)."""
        node = self.node
        if node is None:
            return False
        forced = node.force_available(self._loop.time())
        self._pump()
        return forced

    async def wait_ready_to_leave(self) -> None:
        await self._ready_to_leave.wait()

    @property
    def leaving(self) -> bool:
        return self.node is not None and self.node.leaving

    def close(self) -> None:
        """Stop timers and fail the operations still waiting (the member is going away)."""
        gone = GridLeaving(
            "this member left the grid before the operation completed (a write may or may not have been applied)"
        )
        self._stop(gone)
        for wait in self._in_batch.values():
            if not wait.done.done():
                wait.done.set_exception(gone)
        self._in_batch.clear()
        for entry in self.interactive.values():
            if entry.handle is not None:
                entry.handle.cancel()
        self.interactive.clear()
        if self._backing is not None:
            node = self.node
            if node is not None:
                self._persist(node)
            self._backing.close()
            self._backing = None

    # ==== status ============================================================================================
    @property
    def ready(self) -> bool:
        """Joined, holding a topology, not leaving and no segment of ours still being fetched (``/readyz``)."""
        return not self.not_ready_reasons()

    def not_ready_reasons(self) -> list[str]:
        node = self.node
        out = []
        if node is None or self.ch is None or not self.ch.joined:
            return ["not joined to the group yet"]
        t = node.topology
        if t is None:
            out.append("no grid topology installed yet")
        elif t.availability != Availability.AVAILABLE:
            out.append("the grid is degraded (a partition may have lost owners)")
        if node.transfer_pending:
            out.append("segments of this member are still being transferred")
        if node.leaving:
            out.append("leaving the grid")
        return out

    def status(self) -> dict[str, Any]:
        node = self.node
        if node is None:
            return {"joined": False}
        st = node.status()
        t = node.topology
        if t is not None and t.phase == Phase.READ_OLD_WRITE_ALL:
            # Grid-wide progress is the coordinator's; per member, what it still has to fetch.
            st["rebalance"]["in_progress"] = True
        elif "rebalance" in st:
            st["rebalance"]["in_progress"] = t is not None and t.rebalancing
        st["endpoints"] = {str(a): u for a, u in self.endpoints.items()}
        st["topology_installed_at"] = self.topology_installed_at
        if self.config.persistence != "none":
            b = self._backing
            st["persistence"] = {
                "mode": self.config.persistence,
                "path": self.config.persistence_path,
                "restore": node.restore_outcome or "pending",
                "rows_written": b.rows_written if b is not None else None,
                "steps": self.counters["persist_steps"],
                "errors": self.counters["persist_errors"],
            }
        st["transactions"] = {
            "originated_pending": node.tx_pending,  # begun here, not finished
            "interactive": len(self.interactive),  # of those, driven over HTTP (rolled back when abandoned)
            "prepared": node.tx_prepared_count(),  # prepared here as a participant, waiting for the decision
            "in_doubt": len(node.tx_in_doubt()),  # prepared here, originator gone: see GET /v1/tx/in-doubt
            "auto_resolve": node.config.tx_auto_resolve,
            # On the view coordinator: in doubt, and the grid cannot tell the outcome (an operator decides).
            "undecided": {str(t): why for t, why in sorted(node.tx_undecided().items())},
        }
        return st
