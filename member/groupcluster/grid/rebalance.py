"""The coordinator's pure rebalance planner: statuses, views and confirmations in, topologies out.

:class:`RebalancePlanner` is a pure state machine: statuses (the join with its capacity, a leave request, and
on takeover the member's last topology), views and confirmations go in; the topologies to broadcast (or to
send to one member) come out. It recovers after the coordinator crashed from what the members report,
continues a rebalance whose members crash (same phase, the dead removed) and enters degraded mode when a
partition may have cost it data or a majority.

Its rules are the invariants of :mod:`.topology` (phase order, adjacent topologies compatible, the stable set,
the lost owners) stated as decisions: read each with the other at hand.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ..core.address import Address
from .consistent_hash import ConsistentHash, balanced
from .topology import MAX_LOST, Availability, CacheTopology, MemberStatus, PartitionHandling, Phase, owner_set


@dataclass(slots=True)
class _Info:
    capacity: float
    leaving: bool
    joined: tuple[Address, ...] | None = ()  # MemberStatus.joined


def new_grid_id(coordinator: Address, now: float) -> int:
    """The id of a grid ``coordinator`` starts at ``now``: a hash of both (63 bits, never 0), so two grids
    started apart get different ids without any random source in the planner."""
    digest = hashlib.blake2b(f"{coordinator}|{now!r}".encode(), digest_size=8).digest()
    return (int.from_bytes(digest, "big") >> 1) or 1


# An output of the planner: (None, topology) to broadcast, (member, topology) to send to one member.
Output = tuple[Address | None, CacheTopology]


class RebalancePlanner:
    """The coordinator's rebalance state machine (pure: no I/O, time comes in as ``now``).

    Create one when a member becomes coordinator (or after a merge); it first *recovers*: it waits for a
    status from every view member (or ``recovery_timeout``) and continues from the newest topology any of
    them had, preferring one from an available partition.
    """

    def __init__(
        self,
        view: Sequence[Address],
        *,
        num_segments: int,
        num_owners: int,
        mode: PartitionHandling = PartitionHandling.DENY_READ_WRITES,
        recovery_timeout: float = 3.0,
        now: float = 0.0,
        initial_size: int = 1,
        merge: bool = False,
    ) -> None:
        self.view: tuple[Address, ...] = tuple(view)
        # Set by the operator's force_available(): start a new, empty grid even if a member may belong to one
        # that exists elsewhere (see _may_start).
        self.forced_start = False
        # Infinispan's initial cluster size: a new, empty grid starts only once this many members reported.
        # Two grids that never met stamp versions from the same topology ids, so at their merge an older write
        # of one can beat a later acknowledged write of the other (seed 513: a member whose join failed and
        # that restarted alone formed a grid of its own). With a size above half of the members that start
        # together, only one grid can ever start.
        self.initial_size = initial_size
        # Created for a merge view: only then may two grid ids among the reported topologies start a re-stamp
        # (see _finish_recovery). After a coordinator change, every member that merged has pushed already, or
        # pushes under the re-stamp id its topology names: a new one would put a straggler's old entries above
        # what the merged group wrote since.
        self.merge = merge
        self.num_segments = num_segments
        self.num_owners = num_owners
        self.mode = mode
        self.recovering = True
        self.recovery_deadline = now + recovery_timeout
        self.statuses: dict[Address, MemberStatus] = {}
        self.members: dict[Address, _Info] = {}
        self.topology: CacheTopology | None = None
        self.confirmed: set[Address] = set()
        self.max_seen_id = 0
        self.max_rebalance_id = 0
        self.segments_lost = 0  # segments left with no owner holding their data (degraded or allow mode)
        self.rebalances_started = 0
        self.now = now  # the latest time given: a new grid's id is made from it
        self.grid_id = 0  # of the grid we continue (or start); given to every topology we make
        self.restamp = 0  # see CacheTopology.restamp
        # Owners lost without a handoff and not back in our view since, oldest first (CacheTopology.lost): those
        # of the topologies and statuses reported to us, and every owner of our topology that leaves the view.
        self.lost: dict[Address, None] = {}

    # -- inputs ---------------------------------------------------------------------------------------------
    def on_view(self, view: Sequence[Address], now: float) -> list[Output]:
        self.view = tuple(view)
        self.now = now
        self._forget_lost_in_view()
        if self.recovering:
            for m in [m for m in self.statuses if m not in self.view]:
                del self.statuses[m]
            return self._maybe_finish_recovery(now)
        for m in [m for m in self.members if m not in self.view]:
            del self.members[m]
        return self._update()

    def on_statuses(self, statuses: Mapping[Address, MemberStatus], now: float) -> list[Output]:
        """Statuses received (a batch): joins, leave requests and, while recovering, topologies."""
        statuses = {m: st for m, st in statuses.items() if m in self.view}
        self.now = now
        for st in statuses.values():
            # A member's persistent store saw topologies up to st.floor: number ours above them (versions).
            if st.floor > self.max_seen_id:
                self.max_seen_id = st.floor
        if self.recovering:
            self.statuses.update(statuses)
            return self._maybe_finish_recovery(now)
        if self.topology is None and any(st.topology is not None for st in statuses.values()):
            # A member with a topology whose status came after our recovery, which found none: continue its
            # topology as if the status had come in time. An empty grid beside it would drop its data.
            known = self.members.items()
            self.statuses = {m: MemberStatus(i.capacity, i.leaving, None, joined=i.joined) for m, i in known}
            self.statuses.update(statuses)
            return self._finish_recovery()
        out: list[Output] = []
        changed = ahead = False
        for m, st in statuses.items():
            if st.topology is not None and st.topology.topology_id > self.max_seen_id:
                # A member is ahead of us (a topology we never saw); re-announce ours above it.
                self.max_seen_id = st.topology.topology_id
                changed = ahead = True
            elif st.topology is not None and self._collides(st.topology):
                # A member installed a topology of another coordinator under the id of ours (one it made alone in
                # a split, reported after our recovery ended on an older status of it): it ignores ours as not
                # newer and never confirms, so the rebalance would stall. Re-announce ours above it.
                changed = ahead = True
            grew = self._note_lost(st.lost)
            if st.topology is not None:
                grew = self._note_lost(st.topology.lost) or grew
            if grew:
                # The member lost owners our topology does not name (Membership._vanished_owners: those gone while
                # its merge push was unfinished): every member must know before it might leave alone.
                changed = ahead = True
            changed = self._note_member(m, st) or changed
        if changed:
            out = self._update()
            if not out and self.topology is not None:
                t = self.topology
                # Nothing to rebalance now: make sure joiners know the topology, and re-announce it when a
                # member was ahead of the id we would use.
                if ahead:
                    out.append((None, self._set(self._bump(t, members=self._member_tuple()))))
                else:
                    out.extend((m, t) for m in statuses if m not in t.members)
        return out

    def _note_member(self, m: Address, st: MemberStatus) -> bool:
        """Take ``m``'s status into its member info; whether that changes what the planner would do."""
        info = self.members.get(m)
        if info is None:
            self.members[m] = _Info(st.capacity, st.leaving, st.joined)
            return True
        changed = False
        if st.joined != info.joined:
            info.joined = st.joined
            changed = self.topology is None  # only an empty grid's start depends on it
        if st.leaving and not info.leaving:
            info.leaving = True
            changed = True
        if st.capacity != info.capacity:
            # A running member's new capacity (GridNode.set_capacity): the next rebalance gives it its new
            # share (none at 0). While every member's is 0, nothing moves: the owners keep the data.
            info.capacity = st.capacity
            changed = True
        return changed

    def on_confirm(self, member: Address, topology_id: int) -> list[Output]:
        """``member`` installed ``topology_id`` (and, in the transfer phase, holds all its new segments)."""
        t = self.topology
        if self.recovering or t is None or topology_id != t.topology_id:
            return []
        self.confirmed.add(member)
        if not t.rebalancing or t.availability != Availability.AVAILABLE or not set(t.members) <= self.confirmed:
            return []
        return self._advance()

    def all_installed(self) -> bool:
        """Every member confirmed the current topology (a leaving coordinator waits for this)."""
        t = self.topology
        return not self.recovering and t is not None and set(t.members) <= self.confirmed

    def on_tick(self, now: float) -> list[Output]:
        self.now = now
        if self.recovering and now >= self.recovery_deadline:
            return self._finish_recovery()
        return []

    def next_deadline(self) -> float | None:
        return self.recovery_deadline if self.recovering else None

    def force_available(self) -> list[Output]:
        """Operator's override: accept the losses and leave degraded mode with the members present."""
        t = self.topology
        if t is None and not self.recovering:
            # Nobody holds a topology: accept that the grid starts empty, with the members present.
            self.forced_start = True
            self.initial_size = 1
            return self._update()
        if t is None or t.availability == Availability.AVAILABLE or not self.members:
            return []
        # The members present become the stable set (fixed by the topology made here): counted against the old
        # one, a majority of it missing for good would keep any later split of this grid degraded.
        return self._available_again(t, tuple(m for m in t.stable_members if m in self.members))

    # -- recovery -------------------------------------------------------------------------------------------
    def _maybe_finish_recovery(self, now: float) -> list[Output]:
        if all(m in self.statuses for m in self.view) or now >= self.recovery_deadline:
            return self._finish_recovery()
        return []

    def _finish_recovery(self) -> list[Output]:
        self.recovering = False
        reported = self.statuses
        self.members = {m: _Info(st.capacity, st.leaving, st.joined) for m, st in reported.items() if m in self.view}
        tops = [st.topology for st in reported.values() if st.topology is not None]
        self.statuses = {}
        for _m, st in sorted(reported.items()):
            # Whatever side a member comes from, its owners lost elsewhere stay lost here: the data it brings
            # may be the only copy of what its side acknowledged (Membership._no_taker).
            self._note_lost(st.topology.lost if st.topology is not None else ())
            self._note_lost(st.lost)
        if tops:
            self.max_seen_id = max(self.max_seen_id, *(t.topology_id for t in tops))
            self.max_rebalance_id = max(t.rebalance_id for t in tops)
            # Prefer what an available partition had (it may have taken writes); newest first.
            base = max(tops, key=lambda t: (t.availability == Availability.AVAILABLE, t.topology_id))
            self.grid_id = base.grid_id
            self.restamp = max(t.restamp for t in tops)
            if self.merge and len({t.grid_id for t in tops}) > 1:
                # Grids that never met: their versions count topologies from 1 each. One id above all of theirs
                # is kept for re-stamping their entries by write time (Membership.install); the merged group's
                # topologies come after it. The merged grid is a new one: a member of either grid that missed
                # this merge and meets the merged group later is told apart again, and re-stamps too.
                self.restamp = self._next_id()
                self.grid_id = new_grid_id(self.view[0], self.now)
            # A view member whose status came too late but that holds segments of the topology we continue
            # stays an owner: it is alive (the view says so) and keeps receiving writes as one. Dropping it
            # would leave its segments with fewer owners until its status arrives and a rebalance restores
            # them, and one crash in that window loses acknowledged writes (seed 1440: two members installed
            # the merge view after the recovery timeout; a segment went down to one owner, which then crashed).
            # Its status, when it arrives, only updates its leave flag.
            for ch in (base.current, base.pending):
                if ch is None:
                    continue
                for m, cap in zip(ch.members, ch.capacities, strict=True):
                    if m in self.view and m not in self.members:
                        self.members[m] = _Info(cap, False)
            stable: CacheTopology = base
            if base.availability == Availability.DEGRADED:
                # Every partition degraded: count the majority against the newest stable set any member of this
                # grid reports (Infinispan's maxStableTopology), not the one of the topology we continue. A side
                # that stayed available fixed a newer one before it split again, and a majority of an older set
                # could be a minority of the newer one, while a majority of that goes on elsewhere. (With an
                # available partition its topology and stable set are the newest: only a majority stays so.)
                same = [t for t in tops if t.grid_id == base.grid_id]
                stable = max(same, key=lambda t: (t.stable_id, t.topology_id))
            corrected = self.topology = replace(
                base,
                grid_id=self.grid_id,
                restamp=self.restamp,
                stable_members=stable.stable_members,
                stable_id=stable.stable_id,
                lost=tuple(self.lost),
            )
            out = self._update()
            if not out:
                # Announce even an unchanged topology under a new id above every id anyone reported, so all
                # members (those that missed the last broadcast included) install the same one.
                # Bump the corrected topology, not ``base``: that one may carry an older stable set.
                out.append((None, self._set(self._bump(corrected, members=self._member_tuple()))))
            return out
        return self._update()

    # -- the core transition --------------------------------------------------------------------------------
    def _update(self) -> list[Output]:
        """Bring the topology in line with the members; start a rebalance when idle and unbalanced."""
        live = set(self.members)
        t = self.topology
        if not live:
            return []
        if t is None:
            owners = self._owner_candidates()
            if not owners or len(live) < self.initial_size or not (self.forced_start or self._may_start()):
                return []
            ch = self._with_clients(balanced(None, owners, self._caps(), self.num_segments, self.num_owners))
            self.grid_id = new_grid_id(self.view[0], self.now)
            return [(None, self._set(self._new(0, Phase.NO_REBALANCE, ch, None, stable=owner_set(ch))))]
        out: list[Output] = []
        holders = set(t.current.members) | (set(t.pending.members) if t.pending is not None else set())
        dead = {m for m in holders | set(t.members) if m not in live}
        # An owner that leaves the view still owning segments hands nothing off (a graceful leave ends only once
        # a topology without it as an owner is installed).
        owning = owner_set(t.current) + (owner_set(t.pending) if t.pending is not None else ())
        self._note_lost(m for m in owning if m not in live)
        if t.availability == Availability.DEGRADED:
            if self._stays_degraded(t, live):
                if set(t.members) != live:
                    out.append((None, self._set(self._bump(t, members=self._member_tuple()))))
                return out
            return self._available_again(t, t)
        if dead:
            if self._loses_partition(t, dead):
                cur_ch = t.current if t.phase in (Phase.NO_REBALANCE, Phase.READ_OLD_WRITE_ALL) else t.pending
                assert cur_ch is not None
                deg = self._new(
                    t.rebalance_id, Phase.NO_REBALANCE, cur_ch, None, stable=t, availability=Availability.DEGRADED
                )
                return [(None, self._set(deg))]
            cur_map, pend_map = self._fill(
                t.current.without(dead), t.pending.without(dead) if t.pending is not None else None, t.phase
            )
            t = self._set(self._new(t.rebalance_id, t.phase, cur_map, pend_map, stable=t))
            self.confirmed = set()  # confirmations name a topology id: members confirm the new one again
            out.append((None, t))
        if t.phase == Phase.NO_REBALANCE and t.availability == Availability.AVAILABLE:
            nxt = self._start_rebalance(t)
            if nxt is not None:
                out.append((None, nxt))
        return out

    def _advance(self) -> list[Output]:
        t = self.topology
        assert t is not None and t.pending is not None
        self.confirmed = set()
        if t.phase == Phase.READ_OLD_WRITE_ALL:
            return [(None, self._set(self._bump(t, phase=Phase.READ_ALL_WRITE_ALL)))]
        if t.phase == Phase.READ_ALL_WRITE_ALL:
            return [(None, self._set(self._bump(t, phase=Phase.READ_NEW_WRITE_ALL)))]
        # The pending CH lists the owner candidates of the rebalance's start; members that joined since are taken
        # in by the next rebalance, but are listed already, so the CH names every cache member with its capacity
        # (a coordinator recovering from it takes the capacity of a member whose status comes late from there).
        cur = self._listing(t.pending, self._owner_candidates())
        done = self._set(self._new(t.rebalance_id, Phase.NO_REBALANCE, cur, None, stable=owner_set(cur)))
        out: list[Output] = [(None, done)]
        nxt = self._start_rebalance(done)
        if nxt is not None:
            out.append((None, nxt))
        return out

    def _start_rebalance(self, t: CacheTopology) -> CacheTopology | None:
        owners = self._owner_candidates()
        if not owners:
            return None
        caps = self._caps()
        members = self._member_tuple()
        cur = t.current
        want = {m: float(caps.get(m, 1.0)) for m in owners} | dict.fromkeys(self._clients(), 0.0)
        if cur.is_balanced(owners, caps) and dict(zip(cur.members, cur.capacities, strict=True)) == want:
            # Exactly what balanced() would return (same owners, same members listed with the same capacities):
            # the common case, after every rebalance, without balanced()'s full pass.
            target = cur
        else:
            target = self._with_clients(
                balanced(t.current.owner_map(), owners, caps, self.num_segments, self.num_owners)
            )
        if target.owner_map() == t.current.owner_map():
            listed = dict(zip(target.members, target.capacities, strict=True))
            if set(members) != set(t.members) or listed != dict(
                zip(t.current.members, t.current.capacities, strict=True)
            ):
                # Nothing moves, but the CH lists every member that could own segments (with its capacity),
                # even one whose share rounds down to none, and every member at capacity 0, as soon as we know.
                return self._set(self._bump(t, members=members, current=target))
            return None
        self.rebalances_started += 1
        self.max_rebalance_id = max(self.max_rebalance_id, t.rebalance_id) + 1
        self.confirmed = set()
        nt = self._new(self.max_rebalance_id, Phase.READ_OLD_WRITE_ALL, t.current, target, stable=t)
        return self._set(nt)

    # -- helpers --------------------------------------------------------------------------------------------
    def _may_start(self) -> bool:
        """Whether we may start a new, empty grid (asked while no member reported a topology): no grid can exist
        that we belong to without knowing it.

        A member that joined another member's view without receiving a topology may belong to a grid that
        coordinator started (its topology lost in transit, or cut off before it arrived): an empty grid of its
        own would answer reads with "absent" and take writes that an older value beats at the merge (seed 590).
        Each status lists the coordinators its member joined so (MemberStatus.joined). One of them that is in
        our view, reported no topology and is itself clean in this sense never started a grid; one that is
        missing may have, behind a partition. So we (the coordinator) start one only if every coordinator we
        joined is such a member, transitively: members that only ever joined each other and us, and none of
        which holds a topology, have no grid anywhere (seed 339000037: every member of a merge had joined a
        group below the initial cluster size, so the merge coordinator, who had too, waited for good)."""
        # The greatest set of members none of which joined a coordinator outside it (a cycle of members that
        # joined each other is clean: none of them started a grid, or it would hold its topology).
        clean = {m for m, i in self.members.items() if i.joined is not None}
        shrunk = True
        while shrunk:
            shrunk = False
            for m in list(clean):
                joined = self.members[m].joined
                if joined is not None and any(c not in clean for c in joined):
                    clean.discard(m)
                    shrunk = True
        return bool(self.view) and self.view[0] in clean

    def _collides(self, reported: CacheTopology) -> bool:
        """Whether ``reported`` carries the id of our topology but is not it."""
        t = self.topology
        return t is not None and reported.topology_id == t.topology_id and reported != t

    def _note_lost(self, members: Iterable[Address]) -> bool:
        """Add ``members`` not in our view to the lost owners (the newest MAX_LOST kept); whether any was new."""
        lost, view = self.lost, self.view
        grew = False
        for m in members:
            if m not in lost and m not in view:
                lost[m] = None
                grew = True
        while len(lost) > MAX_LOST:
            del lost[next(iter(lost))]
        return grew

    def _forget_lost_in_view(self) -> None:
        """Lost owners back in our view are lost no more: a merge brings our data and theirs together."""
        if any(m in self.lost for m in self.view):
            self.lost = {m: None for m in self.lost if m not in self.view}

    def _stays_degraded(self, t: CacheTopology, live: set[Address]) -> bool:
        """Whether the degraded ``t`` must stay so with the members ``live`` (Infinispan's PreferConsistency
        after a merge): some segment has no member holding its data here (what it held is lost until one comes
        back), or half or more of the last stable topology's members are missing (from the inside a crash and
        a partition look the same: the missing ones may be a majority going on without us). Otherwise no
        data is lost, and no other side can be available too (two majorities of one stable set overlap, and
        a member that left for another side reports a newer stable set, see _finish_recovery): the grid
        is available again by itself, and a rebalance brings every segment back to num_owners."""
        if self.mode == PartitionHandling.ALLOW_READ_WRITES:
            return False
        stable = set(t.stable_members)
        missing = stable - live
        if missing and 2 * len(missing) >= len(stable):
            return True  # the same count as _loses_partition: what degrades a grid keeps it so
        return any(not any(m in live for m in t.data_holders(s)) for s in range(t.num_segments))

    def _available_again(self, t: CacheTopology, stable: CacheTopology | tuple[Address, ...]) -> list[Output]:
        """Leave degraded mode with the members present (``stable``: ``t`` to keep its stable set, or the new
        one), then rebalance."""
        live = set(self.members)
        holders = set(t.current.members) | (set(t.pending.members) if t.pending is not None else set())
        dead = {m for m in holders | set(t.members) if m not in live}
        cur = self._fill(t.current.without(dead), None, Phase.NO_REBALANCE)[0]
        t = self._set(self._new(t.rebalance_id, Phase.NO_REBALANCE, cur, None, stable=stable))
        out: list[Output] = [(None, t)]
        nxt = self._start_rebalance(t)
        if nxt is not None:
            out.append((None, nxt))
        return out

    def _loses_partition(self, t: CacheTopology, dead: set[Address]) -> bool:
        if self.mode == PartitionHandling.ALLOW_READ_WRITES:
            return False
        stable = set(t.stable_members)
        lost = stable & dead | (stable - set(self.members))
        if lost and 2 * len(lost) >= len(stable):
            return True  # a minority (or half) cannot know whether the rest goes on without it
        return any(all(m in dead for m in t.data_holders(s)) for s in range(t.num_segments))

    def _fill(
        self, cur: list[tuple[Address, ...]], pend: list[tuple[Address, ...]] | None, phase: Phase
    ) -> tuple[ConsistentHash, ConsistentHash | None]:
        """Give every segment at least one owner after removing the dead, preferring members with the data."""
        live = [m for m in self.members if self.members[m].capacity > 0] or list(self.members)
        keepers = set(self._owner_candidates())
        for s in range(len(cur)):
            if pend is not None and len(pend[s]) < self.num_owners:
                # A new owner died: the rebalance would end with fewer copies than num_owners, and the current
                # owners it replaced would drop theirs, so one more crash before the next rebalance completes
                # loses acknowledged writes (a new owner cut off mid-rebalance and back: the other one crashed).
                # Live current owners hold the data (every phase writes to them): they stay owners instead.
                room = self.num_owners - len(pend[s])
                pend[s] += tuple(x for x in cur[s] if x not in pend[s] and x in keepers)[:room]
            if pend is not None and not pend[s]:
                pend[s] = cur[s]
            if not cur[s]:
                if pend is not None and pend[s]:
                    cur[s] = pend[s]
                    if phase == Phase.READ_OLD_WRITE_ALL:
                        self.segments_lost += 1  # new owners had only part of it
                else:
                    cur[s] = (live[s % len(live)],)
                    self.segments_lost += 1
                    if pend is not None:
                        pend[s] = cur[s]
        caps = self._caps()
        c = ConsistentHash.from_owner_map(self.num_segments, self.num_owners, cur, caps)
        p = ConsistentHash.from_owner_map(self.num_segments, self.num_owners, pend, caps) if pend is not None else None
        return c, p

    def _clients(self) -> list[Address]:
        """Cache members with capacity 0 (client-only, or emptied by a capacity change): given no segments."""
        return [m for m, i in self.members.items() if i.capacity == 0]

    def _with_clients(self, ch: ConsistentHash) -> ConsistentHash:
        """``ch`` (from :func:`balanced`, which lists the owner candidates only) also listing every member with
        capacity 0, so the CH names every cache member with its capacity."""
        return self._listing(ch, self._clients())

    def _owner_candidates(self) -> list[Address]:
        staying = [m for m, i in self.members.items() if i.capacity > 0 and not i.leaving]
        if staying:
            return staying
        # Everyone with capacity is leaving: someone must keep the data, so nobody is released.
        return [m for m, i in self.members.items() if i.capacity > 0]

    def _listing(self, ch: ConsistentHash, members: list[Address]) -> ConsistentHash:
        """``ch`` with those of ``members`` it does not list appended, with their capacities and no segments."""
        missing = tuple(m for m in members if m not in ch.members)
        if not missing:
            return ch
        caps = self._caps()
        return replace(
            ch, members=ch.members + missing, capacities=ch.capacities + tuple(float(caps[m]) for m in missing)
        )

    def _caps(self) -> dict[Address, float]:
        return {m: i.capacity for m, i in self.members.items()}

    def _member_tuple(self) -> tuple[Address, ...]:
        return tuple(m for m in self.view if m in self.members)

    def _next_id(self) -> int:
        cur = self.topology.topology_id if self.topology is not None else 0
        self.max_seen_id = max(self.max_seen_id, cur) + 1
        return self.max_seen_id

    def _new(
        self,
        rebalance_id: int,
        phase: Phase,
        current: ConsistentHash,
        pending: ConsistentHash | None,
        *,
        stable: CacheTopology | Iterable[Address],
        availability: Availability = Availability.AVAILABLE,
    ) -> CacheTopology:
        """A topology with the next id; ``stable``: a topology whose stable set (and its id) it keeps, or the
        members of a stable set this topology fixes."""
        tid = self._next_id()
        if isinstance(stable, CacheTopology):
            stable_members, stable_id = stable.stable_members, stable.stable_id
        else:
            stable_members, stable_id = tuple(stable), tid
        return CacheTopology(
            tid,
            rebalance_id,
            phase,
            current,
            pending,
            self._member_tuple(),
            availability,
            stable_members,
            self.mode,
            self.grid_id,
            self.restamp,
            stable_id,
            tuple(self.lost),
        )

    def _bump(self, t: CacheTopology, **changes: Any) -> CacheTopology:
        return replace(
            t,
            topology_id=self._next_id(),
            mode=self.mode,
            grid_id=self.grid_id,
            restamp=self.restamp,
            lost=tuple(self.lost),
            **changes,
        )

    def _set(self, t: CacheTopology) -> CacheTopology:
        if self.topology is None or t.topology_id != self.topology.topology_id:
            self.confirmed = set()  # confirmations name a topology id
        self.topology = t
        return t
