"""Views and topologies: installing a topology (dropping, clearing and keeping segments, writes across it),
merges, the coordinator's planner inputs (statuses, confirmations), and when a leaving member may go.

It holds the merge state (the topology a merge push and the command hold start from, and the other
partitions' members), owners lost without a handoff, statuses waiting for the planner, and the last topology
confirmed. The planner itself is ``grid/rebalance.py``; the node's ``view``, ``topology``, ``planner``,
``leaving`` and ``ready_to_leave`` stay on the node (the driver reads them)."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ...core.address import Address
from ..consistent_hash import segment_of
from ..messages import Confirm, Status, Topology, XferCancel
from ..rebalance import RebalancePlanner
from ..store import (
    SEQ_BITS,
    SegmentStore,
    version_seq,
)
from ..topology import (
    MAX_JOINED,
    MAX_LOST,
    Availability,
    CacheTopology,
    MemberStatus,
    Phase,
    owner_set,
)
from .events import EVENT_DEPARTED

if TYPE_CHECKING:
    from .facade import GridNode


# Topologies whose routes a member keeps for writes that span a topology change (Replication.kept_owners):
# a rebalance installs four in a row, and a write in flight spans at most a few.
_RECENT_TOPOLOGIES = 8


class Membership:
    """This member's side of views, topologies and merges."""

    def __init__(self, node: GridNode) -> None:
        self.node = node
        # The coordinators of the views we installed while we held no topology (we joined their groups), and
        # whether there were more than MAX_JOINED: any of them may have started a grid whose topology never
        # reached us, and an empty grid of our own would then be a split brain. Our status lists them, so a
        # coordinator starts an empty grid only once it can tell none did (RebalancePlanner._may_start).
        self._joined: dict[Address, None] = {}
        self._joined_overflow = False
        # Owners of our topology that left our view without handing their segments off (crashed, or cut off
        # behind a partition): until they are back, leaving "because nobody can take our segments" could
        # drop the only copy of writes they never saw (seed 591). Also view members our topology never listed that
        # left the view (they could take our segments once back, seed 536141000099; see on_view). See _no_taker.
        self._vanished_owners: set[Address] = set()
        self._confirmed_id = 0
        self.statuses_in: dict[Address, MemberStatus] = {}
        # Set by a merge view while our topology was available: our entries may conflict with what the other
        # partition wrote, so we push them to the owners of the first topology the merged group installs.
        self.merge_from: int | None = None
        # Set by any merge view to the topology id we had: until the merged group's first topology arrives
        # we hold client commands, because our topology may be the other partition's (docs/grid.md, merges).
        self.merge_hold: int | None = None
        # The members of the merge view we were not in a view with before it (the other partitions). A
        # topology of the merged group names us and some of them; one our old group's coordinator sent before
        # the merge can still arrive after the merge view, with an id above ours, and must not end the hold or
        # take our merge push: its owners are our side's, and the merged group may continue the other side's
        # topology, dropping what the push left with them (seed 19). See _merged_topology.
        self._merge_others: set[Address] = set()
        self._early_statuses: dict[Address, MemberStatus] = {}

    # ==== inputs ===========================================================================================
    def on_view(self, members: Sequence[Address], now: float, *, merge: bool = False) -> None:
        """:meth:`GridNode.on_view`."""
        self.node._now = now
        self.node._drain_deferred()
        old_coord = self.node.view[0] if self.node.view else None
        if not members:
            raise ValueError("on_view: a view has at least one member")
        old_view = set(self.node.view)
        self.node.view = tuple(members)
        self.node.replication.recent_routes = {}
        t = self.node.topology
        if t is not None:
            owners = set(owner_set(t.current)) | (set(owner_set(t.pending)) if t.pending is not None else set())
            # Also members our topology does not list at all (joiners whose status never reached the coordinator):
            # gone from the view, they may be alive behind a partition and take our segments once back (seed
            # 536141000099: the last owner, split from two such joiners under message loss, was asked to leave
            # and left at once with the only copy). A member listed without segments has handed them off
            # (a graceful leave) or has no capacity, and does not count.
            self._vanished_owners |= {
                m for m in old_view - set(members) if (m in owners or m not in t.members) and m != self.node.address
            }
            if self.node.merging:
                # Our entries have not all reached the merged group: whoever left our view meanwhile may be
                # behind a partition, without them, and would take our segments once it is back, though our
                # topology does not name it (seed 4884: a member cut off alone in allow_read_writes took writes,
                # merged, was cut off again before its push arrived, and left with the only copy).
                self._vanished_owners |= old_view - set(members) - {self.node.address}
        self._vanished_owners -= set(members)
        for gone in sorted(old_view - set(members)):
            self.node.replication.repair_after(gone)
        # Transactions learn of the view before a topology the planner makes from it is installed below: the
        # originator re-routes what the departed members had not answered to that topology.
        self.node.transactions.tx_on_view(now, merge or bool(old_view - set(members)))
        if merge and t is not None and self.node.store is not None:
            # Also from a degraded topology: it still writes the segments whose owners are all with us (seed
            # 614: a member cut off alone took a write for such a segment, never pushed it, and lost it).
            self.merge_from = t.topology_id
        if merge and t is not None:
            self.merge_hold = t.topology_id
            self._merge_others = set(members) - old_view
        elif self.merge_hold is not None:
            self._merge_others &= set(members)  # those gone are no longer awaited in the merged topology
        alive = set(self.node.view)
        if self.node.view[0] == self.node.address:
            if self.node.planner is None or merge or old_coord != self.node.address:
                mode = self.node.config.mode
                self.node.planner = RebalancePlanner(
                    self.node.view,
                    num_segments=self.node.topology.num_segments
                    if self.node.topology
                    else self.node.config.num_segments,
                    num_owners=self.node.topology.current.num_owners
                    if self.node.topology
                    else self.node.config.num_owners,
                    mode=mode,
                    recovery_timeout=self.node.config.recovery_timeout,
                    now=now,
                    initial_size=self.node.config.initial_cluster_size,
                    merge=merge,
                )
            else:
                self.planner_out(self.node.planner.on_view(self.node.view, now))
            early = {m: st for m, st in self._early_statuses.items() if m in alive}
            self._early_statuses.clear()
            self.statuses_in.update(early)
        else:
            self.node.planner = None
            self._note_joined(self.node.view[0])
            # Statuses kept for when we become coordinator belong to an older view now: their senders send
            # new ones to whoever the coordinator of their next view is.
            self._early_statuses.clear()
        # Operations whose target left wait for the topology that replaces it.
        for op in list(self.node.operations.ops.values()):
            if op.not_before is None and op.target is not None and op.target not in alive:
                op.not_before = (op.topology_id + 1, 0.0)
                self.node.operations.try_send(op)  # at once if a newer topology is here already
        for key in [k for k in self.node.provider.out_xfers if k[0] not in alive]:
            del self.node.provider.out_xfers[key]
        lost = False
        for xid in [x for x, xf in self.node.consumer.in_xfers.items() if xf.source not in alive]:
            del self.node.consumer.in_xfers[xid]
            lost = True
        if lost:
            self.node.consumer.plan_fetches()
        self.send_status()
        self.node._flush()

    def on_topology(self, src: Address, msg: Topology) -> None:
        if self.node.view and src == self.node.view[0]:
            self.install(msg.topology)
        else:
            self.node.metrics["grid.topology_not_from_coordinator"] += 1

    def on_confirm(self, src: Address, msg: Confirm) -> None:
        if self.node.planner is not None:
            self.planner_out(self.node.planner.on_confirm(src, msg.topology_id))
            self.check_ready()

    def on_status(self, src: Address, msg: Status) -> None:
        if self.node.planner is not None and src in self.node.view:
            self.statuses_in[src] = msg.status
        else:
            # From a member our view does not hold yet, or from one whose view already makes us the
            # coordinator while ours does not (seed 460: dropping it left that member out of every
            # topology): kept for the view that makes us coordinator.
            self._early_statuses[src] = msg.status

    def planner_out(self, outputs: list[tuple[Address | None, CacheTopology]]) -> None:
        for dest, topo in outputs:
            if dest is None:
                self.node._out.setdefault(None, []).append(Topology(topo))
                self.install(topo)
            elif dest == self.node.address:
                self.install(topo)
            else:
                self.node._emit(dest, Topology(topo))

    def _note_joined(self, coordinator: Address) -> None:
        """We installed a view of ``coordinator``'s: without a topology, we may be in a grid it started."""
        if self.node.topology is not None or self._joined_overflow:
            return
        self._joined[coordinator] = None
        if len(self._joined) > MAX_JOINED:
            self._joined_overflow = True
            self._joined.clear()

    def send_status(self) -> None:
        if not self.node.view:
            return
        lost = tuple(sorted(self._vanished_owners)[:MAX_LOST])
        joined: tuple[Address, ...] | None = ()
        if self.node.topology is None:  # with a topology, the coordinator continues it: no grid starts
            joined = None if self._joined_overflow else tuple(self._joined)
        status = MemberStatus(
            self.node.config.capacity,
            self.node.leaving,
            self.node.topology,
            self.node.persistence.topology_floor,
            lost,
            joined,
        )
        self.node._emit(self.node.view[0], Status(status))

    # ==== topology =========================================================================================
    def install(self, t: CacheTopology) -> None:
        old = self.node.topology
        if old is not None and t.topology_id <= old.topology_id:
            if t.topology_id < old.topology_id:
                self.node.metrics["grid.stale_topology"] += 1
            return
        self.node.topology = t
        self.node.metrics["grid.topologies_installed"] += 1
        merged_topology = self._merged_topology(t)
        if merged_topology:
            self.merge_hold = None  # the merged group's topology: commands are served again (held ones below)
        if self.node.store is None or self.node.store.num_segments != t.num_segments:
            self.node.store = self.node.hooks.new_store(t.num_segments)
        store = self.node.store
        self.node.hooks.installing(t, store)
        merged, merged_expiries = self._take_merge_push(t, store, merged_topology)
        # Tombstones stay: a member that was cut off (or a partition that wrote on its own) pushes its entries
        # after a merge, and an older value must not bring a deleted key back (see docs/grid.md, merge).
        store.keep_tombstones = True
        keep = t.segments_to_keep(self.node.address)
        dropping = t.availability == Availability.AVAILABLE and self.merge_from is None
        dropped_segments = self._drop_unowned_copies(t, store, keep, dropping)
        emptied = dropped_segments + self._steer_transfers(t, store)
        for s in keep:
            store.add_segment(s)
        if emptied:
            # Committed transactions' writes there went with the copy: a repeated commit applies them again (a
            # transfer into the emptied copy may come from an owner the commit has not reached yet).
            self.node.tx.forget_applied(emptied)
        if dropping and not self.node.tx.locks.empty():
            # Locks go with ownership, whatever the phase and whether the copy is dropped yet: a member that is no
            # write owner of a segment gets no commit carrying the versions of its keys, so a committed
            # transaction's lock still waiting for one there would be held for good (a lock promoted in a
            # partition of our own, then a merged topology that continued the other side's rebalance without us).
            gone = sorted(self.node.tx.locks.segments() - keep - set(dropped_segments))
            dropped_segments += gone
        self.node.transactions.tx_install(old, t, dropped_segments)
        self._remember_routes(t, merged_topology)
        self._carry_pending_writes(t)
        if merged:
            self.node.replication.push_entries(
                merged, merge=True, expiries=merged_expiries if merged_expiries is not None else {}
            )
        if old is None and (self.node.persistence.restored is not None or self.node.persistence.topology_floor):
            self.node.persistence.settle_restored(t)
        self._serve_held_requests(t)
        if t.phase == Phase.READ_OLD_WRITE_ALL:
            self.node.consumer.plan_fetches()
        self.maybe_confirm()
        self._resend_operations(t)
        self.check_ready()

    def _take_merge_push(
        self, t: CacheTopology, store: SegmentStore, merged_topology: bool
    ) -> tuple[list[tuple[int, bytes, int, bytes | None]], dict[tuple[int, bytes], float] | None]:
        """The entries (and expiries) to push to the merged group, taken before any drop (empty if no merge)."""
        merged: list[tuple[int, bytes, int, bytes | None]] = []
        merged_expiries: dict[tuple[int, bytes], float] | None = None
        if self.merge_from is None or not merged_topology:
            return merged, merged_expiries
        # The first topology of the merged group: take our entries (tombstones too) before any drop.
        merged = [(s, k, ver, val) for s, data in sorted(store.segments.items()) for k, (ver, val) in data.items()]
        if any(data.exp for data in store.segments.values()):
            # Their expiries too, now: the segments we do not keep are dropped below, before the push, and a
            # re-stamp below gives the entries new versions (expiries are recorded per version).
            merged_expiries = {
                (s, k): e for s, k, ver, val in merged if val is not None and (e := store.expiry_of(s, k, ver))
            }
        if t.restamp > self.merge_from:
            # The merged group joins grids that never met (topology.py, restamp): our versions and the
            # other grid's count topologies from 1 each, so they say nothing about which write came last.
            # Every member of either grid pushes its entries re-stamped under the one topology id
            # ``restamp``, above both grids' and below the merged group's, keeping each sequence: the
            # write's time. So the later write of a key wins everywhere, and any write of the merged
            # group beats them all.
            high = t.restamp << SEQ_BITS
            merged = [(s, k, high | version_seq(ver), val) for s, k, ver, val in merged]
            self.node.metrics["grid.merge_entries_restamped"] += len(merged)
        self.merge_from = None
        return merged, merged_expiries

    def _drop_unowned_copies(
        self, t: CacheTopology, store: SegmentStore, keep: frozenset[int], dropping: bool
    ) -> list[int]:
        """Drop the copies of segments ``t`` no longer gives us, once that is safe; answer the segments dropped."""
        dropped: list[int] = []
        if t.phase not in (Phase.NO_REBALANCE, Phase.READ_OLD_WRITE_ALL) or not dropping:
            return dropped
        # Old copies go only once no topology in use can still read them (see docs/grid.md). Never on a
        # degraded topology: it is provisional (owners are missing, a partition may have cut us off),
        # and the merged group may adopt another partition's topology that names us an owner of what we
        # would drop here; seed 15 lost acknowledged writes that way. Dropping waits for availability.
        # Nor while our merge push waits for the merged group's topology: a topology of our old group
        # that arrives after the merge view must not take entries the push still has to carry (seed 19).
        departed = EVENT_DEPARTED in self.node.events.event_kinds
        for s in store.held_segments() - keep:
            if departed:
                data = store.segments[s]
                if data:
                    # Snapshot the columns before the store lets go of the entries (they may be freed a
                    # slice per step from here on).
                    self.node.events.event(
                        EVENT_DEPARTED, s, list(data.ver), list(data.ver.values()), list(data.val.values())
                    )
            self.node.metrics["grid.entries_dropped"] += store.remove_segment(s)
            dropped.append(s)
        return dropped

    def _steer_transfers(self, t: CacheTopology, store: SegmentStore) -> list[int]:
        """Start, restart or cancel state transfers for ``t``'s phase; answer the segments emptied to fetch."""
        consumer = self.node.consumer
        emptied: list[int] = []
        if t.phase != Phase.READ_OLD_WRITE_ALL:
            consumer.cancel_in_xfers()
            if t.phase == Phase.NO_REBALANCE:
                self.node.provider.out_xfers.clear()
            return emptied
        if t.rebalance_id != consumer.xfer_rebalance:
            consumer.cancel_in_xfers()
            consumer.xfer_rebalance = t.rebalance_id
            consumer.fetch_started = set()
            consumer.fetched = set()
            consumer.fetch_tries.clear()
        for s in consumer.to_fetch(t) - consumer.fetch_started:
            # A new owner's old copy may be stale (it missed writes while not an owner): start empty.
            store.clear_segment(s)
            consumer.fetch_started.add(s)
            emptied.append(s)
        # Streams from sources that are no longer current owners of their segments restart elsewhere.
        for xid, xf in list(consumer.in_xfers.items()):
            if xf.source not in t.members or any(xf.source not in t.current.owners_of(s) for s in xf.remaining):
                if xf.source in self.node.view:
                    self.node._emit(xf.source, XferCancel(xid))
                del consumer.in_xfers[xid]
        return emptied

    def _remember_routes(self, t: CacheTopology, merged_topology: bool) -> None:
        """Record ``t``'s write routes, which tell later topologies whether a write reached all its owners."""
        recent = self.node.replication.recent_routes
        if t.availability == Availability.AVAILABLE and not merged_topology:
            recent[t.topology_id] = self.node._routes(t)
            while len(recent) > _RECENT_TOPOLOGIES:
                del recent[min(recent)]
        else:
            recent.clear()

    def _carry_pending_writes(self, t: CacheTopology) -> None:
        """Carry writes applied under another topology over to ``t``, or redrive them to its write owners."""
        # Writes we applied under another topology: push them to this topology's write owners, unless the write
        # went to all of them already (then its round goes on, for them only: see _kept_owners).
        replication = self.node.replication
        for wid, pw in list(replication.writes.items()):
            if pw.topology_id != t.topology_id:
                owners = replication.kept_owners(pw.topology_id, t, segment_of(pw.key, t.num_segments))
                if owners is None:
                    replication.redrive(wid, pw)
                    continue
                self.node.metrics["grid.writes_kept_across_topologies"] += 1
                pw.awaiting.intersection_update(owners)  # an owner that left the segment is not waited for
                if not pw.awaiting:
                    replication.write_done(wid, pw)

    def _serve_held_requests(self, t: CacheTopology) -> None:
        """Answer the requests held for this topology (or an older one); keep those waiting for a newer one."""
        if self.node._queued:
            held, self.node._queued = self.node._queued, deque()
            for item in held:
                if item[1] <= t.topology_id:
                    self.node._handle(item[2], item[3])
                else:
                    self.node._queued.append(item)

    def _resend_operations(self, t: CacheTopology) -> None:
        """Send again the client operations that waited for a topology or whose target left."""
        for op in list(self.node.operations.ops.values()):
            if op.not_before is not None:
                self.node.operations.try_send(op)
            elif op.target not in t.members:
                # Its target is gone: nobody will answer. Attempts to live owners under an older topology get
                # a RETRY from them (or an answer, if the owner had not moved on either).
                self.node.operations.send_op(op)

    def _merged_topology(self, t: CacheTopology) -> bool:
        """Whether ``t`` (newer than ours) is the merged group's first topology after a merge view."""
        if self.merge_hold is None and self.merge_from is None:
            return False
        hold = max(x for x in (self.merge_hold, self.merge_from) if x is not None)
        others = self._merge_others
        return (
            t.topology_id > hold and self.node.address in t.members and (not others or not others.isdisjoint(t.members))
        )

    def maybe_confirm(self) -> None:
        t = self.node.topology
        if t is None or self._confirmed_id == t.topology_id or not self.node.view:
            return
        if t.phase == Phase.READ_OLD_WRITE_ALL and not self.node.consumer.to_fetch(t) <= self.node.consumer.fetched:
            return
        self._confirmed_id = t.topology_id
        self.node._emit(self.node.view[0], Confirm(t.topology_id))

    def check_ready(self) -> None:
        if not self.node.leaving or self.node.ready_to_leave or self.node.operations.ops or self.node.txc.pending():
            return  # a graceful leave also drains this member's own client operations and transactions
        t = self.node.topology
        if t is None:
            self.node.ready_to_leave = True  # never held data
            return
        if self._no_taker(t):
            # Nobody could take our segments (we are alone): waiting would only run into the leave timeout, and
            # the data goes either way.
            # Writes still being replicated to members that are gone or own nothing cannot finish either.
            if not any(pw.op_id != 0 for pw in self.node.replication.writes.values()):
                self.node.metrics["grid.left_without_taker"] += 1
                self.node.ready_to_leave = True
            return
        if self.node.replication.writes:
            return
        if (
            t.phase == Phase.NO_REBALANCE
            and t.availability == Availability.AVAILABLE
            and self.node.address not in owner_set(t.current)
        ):
            # A leaving coordinator also waits until everyone installed that topology: were it to leave
            # first, a broadcast still in flight would arrive from a non-coordinator and be ignored, and its
            # successor would recover from an older topology that still names it as an owner.
            if self.node.planner is not None and not self.node.planner.all_installed():
                return
            self.node.ready_to_leave = True

    def _no_taker(self, t: CacheTopology) -> bool:
        """Whether no other member could take our segments: we are alone in our view.

        A member beside us at capacity 0 (client-only, or emptied by POST /v1/capacity) is no proof: any member's
        capacity can change while it runs, and once one of them has capacity again the planner gives it our
        segments (RebalancePlanner._owner_candidates keeps us an owner until then), so we wait for that, a merge,
        or the leave timeout (docs/decisions/003-leaving-beside-capacity-zero-members-waits.md). Reading such
        a member as a non-taker left the only copy of a side's data with us (grid-tx seed 857807000094).

        Only on an available, balanced topology: a degraded one may mean we are just cut off from the others,
        who would take our segments once the partition heals, so we wait for that (or the leave timeout).
        """
        if t.phase != Phase.NO_REBALANCE or t.availability != Availability.AVAILABLE:
            return False
        if self._vanished_owners:
            return False  # owners we lost without a handoff may be behind a partition: wait for them
        if any(m not in self.node.view for m in t.lost):
            # So may the owners our grid lost before we took its data over: no owner of our own topology vanished,
            # but what we hold may be the only copy of what our side acknowledged while cut off from them.
            return False
        return all(m == self.node.address for m in self.node.view)
