"""Cache topologies and rebalance phases: the data the coordinator broadcasts, its routing and its wire form.

A :class:`CacheTopology` is what the coordinator broadcasts: an id (strictly increasing, also across
coordinator changes), the current CH, during a rebalance the pending (balanced target) CH and the phase, the
cache members, and the availability under partition handling. Phases follow Infinispan::

    NO_REBALANCE -> READ_OLD_WRITE_ALL -> READ_ALL_WRITE_ALL -> READ_NEW_WRITE_ALL -> NO_REBALANCE

``READ_OLD_WRITE_ALL``: new owners pull their segments while every write goes to old and new owners.
``READ_ALL_WRITE_ALL``: every new owner holds its data; reads may use either (new owners first).
``READ_NEW_WRITE_ALL``: reads use the new owners only; writes still reach the old ones.
Then the pending CH becomes current and old owners drop what they no longer own.

Each phase change waits for every member to confirm the previous one (for the transfer phase: "I hold all my
new segments"), so at most two *adjacent* topologies are in use at once, and any two adjacent ones are
compatible: what one reads, the other writes.

:class:`MemberStatus` is what a member reports to the coordinator. The coordinator's planner that turns
statuses into topologies is :mod:`.rebalance`; its rules are this module's invariants (phase order, adjacent
topologies compatible, the stable set, the lost owners) stated as decisions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum, IntEnum
from typing import Any, NamedTuple

from ..core.address import Address
from ..core.errors import WireError
from ..core.validate import MAX_INT, as_address_list, as_bool, as_int, as_list
from .consistent_hash import MAX_MEMBERS, ConsistentHash

# The most lost owners a topology remembers (CacheTopology.lost; the newest are kept). A leave asks only whether
# any of them is still away: dropping one for room could matter only once more than this many were lost and
# every newer one came back.
MAX_LOST = 256
# The most coordinators a status lists as joined without a topology (MemberStatus.joined); a member that joined
# more sends None instead (too many to list), and never counts as having joined no grid.
MAX_JOINED = 64


class Phase(IntEnum):
    NO_REBALANCE = 0
    READ_OLD_WRITE_ALL = 1
    READ_ALL_WRITE_ALL = 2
    READ_NEW_WRITE_ALL = 3


class Availability(IntEnum):
    AVAILABLE = 0
    DEGRADED = 1


class PartitionHandling(Enum):
    """What a partition that may have lost data or a majority still serves (Infinispan's three modes)."""

    DENY_READ_WRITES = "deny_read_writes"
    ALLOW_READS = "allow_reads"
    ALLOW_READ_WRITES = "allow_read_writes"

    @property
    def code(self) -> int:
        return _MODE_CODES[self]


_MODE_CODES = {
    PartitionHandling.DENY_READ_WRITES: 0,
    PartitionHandling.ALLOW_READS: 1,
    PartitionHandling.ALLOW_READ_WRITES: 2,
}
_CODE_MODES = {v: k for k, v in _MODE_CODES.items()}


def owner_set(ch: ConsistentHash) -> tuple[Address, ...]:
    """Members that own at least one segment, in CH order."""
    used = {i for own in ch.owners for i in own}
    return tuple(m for i, m in enumerate(ch.members) if i in used)


class SegmentRoute(NamedTuple):
    """One segment's routing answers in a topology (see :meth:`CacheTopology.routing_table`)."""

    read: tuple[Address, ...]  # read_owners
    write: tuple[Address, ...]  # write_owners
    can_read: bool
    can_write: bool
    i_read: bool  # the asking member is among ``read``
    i_write: bool  # ... among ``write``
    primary: bool  # ... first of ``write`` (the write primary)


@dataclass(frozen=True, slots=True)
class CacheTopology:
    topology_id: int
    rebalance_id: int
    phase: Phase
    current: ConsistentHash
    pending: ConsistentHash | None
    members: tuple[Address, ...]  # cache members (in the view and joined), owners or not
    availability: Availability = Availability.AVAILABLE
    stable_members: tuple[Address, ...] = ()  # owners of the last balanced, available CH (partition detection)
    mode: PartitionHandling = PartitionHandling.DENY_READ_WRITES
    # Which grid this is: fixed by the coordinator that starts an empty grid (:func:`new_grid_id`) and kept by
    # every later topology, through splits and their merges. Two ids in one recovery mean grids that never met
    # are merging; the merged grid gets a new id.
    grid_id: int = 0
    # The topology id under which the members re-stamp what they held before the last merge of grids that never
    # met (0: none so far): above every id either grid used, below the merged group's. See Membership.install.
    restamp: int = 0
    # The id of the topology that fixed ``stable_members`` (the end of a rebalance, a new grid, or the operator's
    # forced availability). After a merge of partitions that all degraded, the coordinator counts the majority
    # against the newest stable set any of them reports (the highest id), as Infinispan's PreferConsistency
    # strategy does: a side that went on alone fixed a newer one.
    stable_id: int = 0
    # Owners this grid lost without a handoff (crashed, or cut off behind a partition) that have not been back
    # in a view with it since, oldest first. From the inside a crash and a partition look the same: while one
    # of them may be alive elsewhere with a diverged copy of the grid, what we hold may be the only copy of the
    # writes acknowledged on our side. The set travels with every topology, so a member that took our data
    # over knows it too, although no owner of its own topology ever vanished: alone in its view and asked to
    # leave, it waits for a merge instead of leaving with the only copy (Membership._no_taker).
    lost: tuple[Address, ...] = ()
    _member_set: frozenset[Address] = field(default=frozenset(), init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        if (self.phase == Phase.NO_REBALANCE) != (self.pending is None):
            raise ValueError(f"topology {self.topology_id}: a pending CH exists exactly while rebalancing")
        if self.pending is not None and (
            self.pending.num_segments != self.current.num_segments or self.pending.num_owners != self.current.num_owners
        ):
            raise ValueError(f"topology {self.topology_id}: current and pending CH differ in segments or owners")
        object.__setattr__(self, "_member_set", frozenset(self.members))

    @property
    def num_segments(self) -> int:
        return self.current.num_segments

    @property
    def rebalancing(self) -> bool:
        return self.phase != Phase.NO_REBALANCE

    def segment_of(self, key: bytes) -> int:
        return self.current.segment_of(key)

    # -- routing -------------------------------------------------------------------------------------------
    def _candidates(
        self, cur: tuple[Address, ...], new: tuple[Address, ...] | None
    ) -> tuple[tuple[Address, ...], tuple[Address, ...], tuple[Address, ...]]:
        """The phase's rules for one segment with current owners ``cur`` and new owners ``new`` (None: no
        rebalance): who may serve a read (preferred first), who a write must reach (primary first) and who is
        guaranteed to hold the data, live or not. The per-segment queries and :meth:`routing_table` share them."""
        if new is None:
            return cur, cur, cur
        write = cur + tuple(m for m in new if m not in cur)
        if self.phase == Phase.READ_OLD_WRITE_ALL:
            return cur, write, cur
        if self.phase == Phase.READ_NEW_WRITE_ALL:
            return new, write, write
        # READ_ALL prefers the new owners too, so it is compatible with both of its neighbours.
        return new + tuple(m for m in cur if m not in new), write, write

    def _segment_candidates(self, segment: int) -> tuple[tuple[Address, ...], ...]:
        new = self.pending.owners_of(segment) if self.pending is not None else None
        return self._candidates(self.current.owners_of(segment), new)

    def read_owners(self, segment: int) -> tuple[Address, ...]:
        """Live members that may serve a read of ``segment``, preferred first."""
        ms = self._member_set
        return tuple(m for m in self._segment_candidates(segment)[0] if m in ms)

    def write_owners(self, segment: int) -> tuple[Address, ...]:
        """Live members a write of ``segment`` must reach: current owners (primary first), then new ones."""
        ms = self._member_set
        return tuple(m for m in self._segment_candidates(segment)[1] if m in ms)

    def write_primary(self, segment: int) -> Address | None:
        owners = self.write_owners(segment)
        return owners[0] if owners else None

    def data_holders(self, segment: int) -> tuple[Address, ...]:
        """Owners guaranteed to hold the segment's data in this phase (live or not)."""
        return self._segment_candidates(segment)[2]

    def segments_to_fetch(self, member: Address) -> frozenset[int]:
        """Segments ``member`` must pull in this rebalance (new owner, not a current one)."""
        if self.pending is None:
            return frozenset()
        return self.pending.segments_owned(member) - self.current.segments_owned(member)

    def segments_to_keep(self, member: Address) -> frozenset[int]:
        owned = self.current.segments_owned(member)
        return owned | self.pending.segments_owned(member) if self.pending is not None else owned

    # -- partition handling ---------------------------------------------------------------------------------
    def missing_owner(self, segment: int) -> bool:
        ms = self._member_set
        return any(m not in ms for m in self.data_holders(segment))

    @property
    def _reads_freely(self) -> bool:
        """Reads need only a live owner (available, or a mode that serves reads in a partition); otherwise no
        data holder of the segment may be missing. ALLOW_READS reads like an available topology."""
        return self.availability == Availability.AVAILABLE or self.mode != PartitionHandling.DENY_READ_WRITES

    @property
    def _writes_freely(self) -> bool:
        """As :attr:`_reads_freely`, for writes: only ALLOW_READ_WRITES writes in a partition."""
        return self.availability == Availability.AVAILABLE or self.mode == PartitionHandling.ALLOW_READ_WRITES

    def can_read(self, segment: int) -> bool:
        return bool(self.read_owners(segment)) if self._reads_freely else not self.missing_owner(segment)

    def can_write(self, segment: int) -> bool:
        return bool(self.write_owners(segment)) if self._writes_freely else not self.missing_owner(segment)

    def routing_table(self, me: Address) -> list[SegmentRoute]:
        """Every segment's answers of :meth:`read_owners`, :meth:`write_owners`, :meth:`can_read` and
        :meth:`can_write`, and ``me``'s part in them, at once.

        A member computes this once per topology it installs, on every member at the same moment: per segment,
        with a Python address comparison per owner, it cost 1.3-2.5 ms of CPU per topology with 256 segments,
        and a single write during a rebalance crossed several members each busy with it. Segments
        with the same owner indexes share one answer, so the work is per distinct owner combination (a few
        dozen), not per segment. The phase rules are the per-segment methods' own (:meth:`_candidates`); a unit
        test checks that both give the same answers."""
        ms = self._member_set
        cur_ch, new_ch = self.current, self.pending
        cm = cur_ch.members
        nm = new_ch.members if new_ch is not None else ()
        any_read, any_write = self._reads_freely, self._writes_freely
        memo: dict[tuple[tuple[int, ...], tuple[int, ...] | None], SegmentRoute] = {}
        out: list[SegmentRoute] = []
        new_owners = new_ch.owners if new_ch is not None else None
        for s, co in enumerate(cur_ch.owners):
            no = new_owners[s] if new_owners is not None else None
            route = memo.get((co, no))
            if route is None:
                new = tuple(nm[i] for i in no) if no is not None else None
                read_cand, write_cand, holders = self._candidates(tuple(cm[i] for i in co), new)
                read = tuple(m for m in read_cand if m in ms)
                write = tuple(m for m in write_cand if m in ms)
                intact = all(m in ms for m in holders)
                route = memo[(co, no)] = SegmentRoute(
                    read,
                    write,
                    bool(read) if any_read else intact,
                    bool(write) if any_write else intact,
                    me in read,
                    me in write,
                    bool(write) and write[0] == me,
                )
            out.append(route)
        return out

    # -- wire -----------------------------------------------------------------------------------------------
    def to_wire(self) -> list[Any]:
        return [
            self.topology_id,
            self.rebalance_id,
            int(self.phase),
            int(self.availability),
            self.mode.code,
            [m.to_wire() for m in self.members],
            [m.to_wire() for m in self.stable_members],
            self.current.to_wire(),
            None if self.pending is None else self.pending.to_wire(),
            self.grid_id,
            self.restamp,
            self.stable_id,
            [m.to_wire() for m in self.lost],
        ]

    @classmethod
    def from_wire(cls, data: Any, field_name: str = "topology") -> CacheTopology:
        items = as_list(data, field_name, 13, exact=13)
        tid = as_int(items[0], f"{field_name}.topology_id", 1, MAX_INT)
        rid = as_int(items[1], f"{field_name}.rebalance_id", 0, MAX_INT)
        phase = Phase(as_int(items[2], f"{field_name}.phase", 0, 3))
        avail = Availability(as_int(items[3], f"{field_name}.availability", 0, 1))
        mode = _CODE_MODES[as_int(items[4], f"{field_name}.mode", 0, 2)]
        members = as_address_list(items[5], f"{field_name}.members", MAX_MEMBERS)
        stable = as_address_list(items[6], f"{field_name}.stable_members", MAX_MEMBERS)
        current = ConsistentHash.from_wire(items[7], f"{field_name}.current")
        pending = None if items[8] is None else ConsistentHash.from_wire(items[8], f"{field_name}.pending")
        if (phase == Phase.NO_REBALANCE) != (pending is None):
            raise WireError(f"{field_name}.pending: must be present exactly while rebalancing (phase {phase.name})")
        if pending is not None and (
            pending.num_segments != current.num_segments or pending.num_owners != current.num_owners
        ):
            raise WireError(f"{field_name}.pending: segments or owners differ from the current CH")
        if len(set(members)) != len(members):
            raise WireError(f"{field_name}.members: a member is listed twice")
        grid_id = as_int(items[9], f"{field_name}.grid_id", 0, MAX_INT)
        restamp = as_int(items[10], f"{field_name}.restamp", 0, tid - 1)
        stable_id = as_int(items[11], f"{field_name}.stable_id", 0, tid)
        lost = as_address_list(items[12], f"{field_name}.lost", MAX_LOST)
        if len(set(lost)) != len(lost):
            raise WireError(f"{field_name}.lost: a member is listed twice")
        return cls(tid, rid, phase, current, pending, members, avail, stable, mode, grid_id, restamp, stable_id, lost)

    def summary(self) -> dict[str, Any]:
        return {
            "topology_id": self.topology_id,
            "rebalance_id": self.rebalance_id,
            "phase": self.phase.name,
            "availability": self.availability.name,
            "members": [str(m) for m in self.members],
            "grid_id": self.grid_id,
        }


@dataclass(frozen=True, slots=True)
class MemberStatus:
    """What a member tells the coordinator after every view change (its join, on the first one)."""

    capacity: float
    leaving: bool
    topology: CacheTopology | None
    # The highest topology id of the member's persistent store (0: none): a new grid starts above it. Sent
    # only when set (or when ``lost`` follows it), so statuses without persistence keep their three fields.
    floor: int = 0
    # Owners the member lost without a handoff (Membership._vanished_owners): the coordinator adds them to the
    # topology's ``lost``, so they reach every member that takes our data over. Sent only when set.
    lost: tuple[Address, ...] = ()
    # The coordinators of the views the member installed while it held no topology (Membership.send_status),
    # oldest first; None: more than MAX_JOINED. Any of them may have started a grid whose topology never
    # reached the member, so the planner starts an empty grid only once it can tell none did
    # (RebalancePlanner._may_start). Sent only when set.
    joined: tuple[Address, ...] | None = ()

    def to_wire(self) -> list[Any]:
        out = [self.capacity, self.leaving, None if self.topology is None else self.topology.to_wire()]
        if self.floor or self.lost or self.joined != ():
            out.append(self.floor)
        if self.lost or self.joined != ():
            out.append([m.to_wire() for m in self.lost])
        if self.joined != ():
            out.append(None if self.joined is None else [m.to_wire() for m in self.joined])
        return out

    @classmethod
    def from_wire(cls, data: Any, field_name: str = "status") -> MemberStatus:
        items = as_list(data, field_name, 6)
        if len(items) < 3:
            raise WireError(f"{field_name}: expected 3 to 6 items, got {len(items)}")
        cap = items[0]
        if type(cap) not in (int, float) or not (math.isfinite(cap) and 0 <= cap <= 1_000_000):
            raise WireError(f"{field_name}.capacity: expected a number in [0, 1000000], got {cap!r}")
        leaving = as_bool(items[1], f"{field_name}.leaving")
        topo = None if items[2] is None else CacheTopology.from_wire(items[2], f"{field_name}.topology")
        # A floor of 0 (none) is written only in front of a lost list.
        floor = as_int(items[3], f"{field_name}.floor", 0 if len(items) >= 5 else 1, MAX_INT) if len(items) > 3 else 0
        lost = as_address_list(items[4], f"{field_name}.lost", MAX_LOST) if len(items) >= 5 else ()
        joined: tuple[Address, ...] | None = ()
        if len(items) == 6:
            joined = None if items[5] is None else as_address_list(items[5], f"{field_name}.joined", MAX_JOINED)
            if joined == ():
                raise WireError(f"{field_name}.joined: an empty list is not written")
        return cls(float(cap), leaving, topo, floor, lost, joined)
