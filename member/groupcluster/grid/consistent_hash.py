"""The consistent hash: which members own each segment of the key space (pure, computed on the coordinator).

A key (bytes) maps to one of ``num_segments`` segments by a stable hash: the first 8 bytes of BLAKE2b of the
key, little-endian, modulo the number of segments. Python's ``hash()`` is salted per process and would route
the same key differently on every member, so it is never used. Clients in other languages compute the same.

Each segment has an ordered owner list: the first is the *primary* (it orders writes), the rest are backups.
:func:`balanced` computes a CH from the previous one and the current members with their capacity factors
(a member with capacity 2 owns about twice the segments of a member with capacity 1; capacity 0 owns nothing):

* every member primary-owns, and owns, exactly its quota, and each quota is the floor or the ceiling of the
  member's fair share (capacity-weighted; a member's share is capped at one copy of every segment and the
  excess spread over the others), so counts are within ±1 of the fair share;
* movement is minimal: an owner keeps a segment while it is under its quota, a lost primary is replaced
  first by one of the segment's surviving backups (no data moves), and only the remaining slots go to the
  members furthest below their quota.

The wire form lists members once and owners as member indexes; :meth:`ConsistentHash.from_wire` checks
every field (counts, ranges, duplicates) and raises :class:`~groupcluster.core.errors.WireError` naming it.
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Any, NoReturn

from ..core.address import Address
from ..core.errors import WireError
from ..core.validate import as_address_list, as_int, as_list

DEFAULT_SEGMENTS = 256
DEFAULT_OWNERS = 2
MAX_SEGMENTS = 65536
MAX_OWNERS = 16
MAX_MEMBERS = 4096
MAX_CAPACITY = 1_000_000.0


def segment_of(key: bytes, num_segments: int) -> int:
    """The segment of ``key``: BLAKE2b-64 of the key bytes (little-endian) modulo ``num_segments``."""
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") % num_segments


def segments_of(keys: Iterable[bytes], num_segments: int) -> list[int]:
    """:func:`segment_of` for a batch of keys (one call per batch on hot paths)."""
    b2 = hashlib.blake2b
    frm = int.from_bytes
    return [frm(b2(k, digest_size=8).digest(), "little") % num_segments for k in keys]


@dataclass(frozen=True, slots=True)
class ConsistentHash:
    """Owners per segment. ``owners[s]`` holds indexes into ``members``; the first is the primary."""

    num_segments: int
    num_owners: int
    members: tuple[Address, ...]
    capacities: tuple[float, ...]
    owners: tuple[tuple[int, ...], ...]

    def __post_init__(self) -> None:
        # The same checks guard wire input (from_wire) and local construction, so a bug cannot build a CH a
        # peer would refuse.
        _check(self, "ch", ValueError)

    # -- queries -------------------------------------------------------------------------------------------
    def segment_of(self, key: bytes) -> int:
        return segment_of(key, self.num_segments)

    def owners_of(self, segment: int) -> tuple[Address, ...]:
        m = self.members
        return tuple(m[i] for i in self.owners[segment])

    def primary_of(self, segment: int) -> Address:
        return self.members[self.owners[segment][0]]

    def segments_owned(self, member: Address) -> frozenset[int]:
        """Segments where ``member`` is primary or backup."""
        try:
            idx = self.members.index(member)
        except ValueError:
            return frozenset()
        return frozenset(s for s, own in enumerate(self.owners) if idx in own)

    def segments_primary(self, member: Address) -> frozenset[int]:
        try:
            idx = self.members.index(member)
        except ValueError:
            return frozenset()
        return frozenset(s for s, own in enumerate(self.owners) if own[0] == idx)

    def owned_counts(self) -> dict[Address, tuple[int, int]]:
        """``{member: (primary segments, owned segments)}`` for every member (status pages, tests)."""
        prim = [0] * len(self.members)
        owned = [0] * len(self.members)
        for own in self.owners:
            prim[own[0]] += 1
            for i in own:
                owned[i] += 1
        return {m: (prim[i], owned[i]) for i, m in enumerate(self.members)}

    def is_balanced(self, members: Sequence[Address], capacities: Mapping[Address, float]) -> bool:
        """Whether :func:`balanced` would keep this CH as it is for ``members``: every segment has as many
        owners as the members allow, and every member is primary of, and owner of, exactly its quotas of
        segments (nobody else owns any).

        The coordinator asks after every rebalance whether another one is due; :func:`balanced`'s full pass
        cost it 0.65 ms there, in the step where every member installs the rebalance's last topology. This
        counts with C-level counters over member indexes (a Python step per segment and an address hash per
        owner cost 0.3 ms)."""
        prim_q, owner_q, k = quotas(members, capacities, self.num_segments, self.num_owners)
        owners = self.owners
        if any(len(own) != k for own in owners):
            return False
        index = {m: i for i, m in enumerate(self.members)}
        want_prim: dict[int, int] = {}
        want_owned: dict[int, int] = {}
        for m in members:
            i = index.get(m)
            if i is None:
                if owner_q[m]:
                    return False  # a member with a quota owns nothing here
                continue
            if prim_q[m]:
                want_prim[i] = prim_q[m]
            if owner_q[m]:
                want_owned[i] = owner_q[m]
        # Counters hold only members that own something, so a departed or unlisted owner makes them differ.
        return Counter(own[0] for own in owners) == want_prim and Counter(chain.from_iterable(owners)) == want_owned

    def capacity_of(self, member: Address) -> float:
        return self.capacities[self.members.index(member)]

    def owner_map(self) -> list[tuple[Address, ...]]:
        """Owner addresses per segment (the form the planner edits)."""
        return [self.owners_of(s) for s in range(self.num_segments)]

    # -- construction ---------------------------------------------------------------------------------------
    @classmethod
    def from_owner_map(
        cls,
        num_segments: int,
        num_owners: int,
        owner_map: Sequence[Sequence[Address]],
        capacities: Mapping[Address, float],
    ) -> ConsistentHash:
        """Build from owner addresses per segment; ``members`` are listed in order of first appearance.

        Members with capacity that own nothing are listed too (so the CH remembers their capacity).
        """
        members: dict[Address, int] = {}
        for own in owner_map:
            for m in own:
                if m not in members:
                    members[m] = len(members)
        for m in sorted(capacities):
            if m not in members:
                members[m] = len(members)
        member_list = tuple(members)
        return cls(
            num_segments,
            num_owners,
            member_list,
            tuple(float(capacities.get(m, 1.0)) for m in member_list),
            tuple(tuple(members[m] for m in own) for own in owner_map),
        )

    def without(self, gone: Iterable[Address]) -> list[tuple[Address, ...]]:
        """The owner map with ``gone`` removed (segments may be left with fewer owners, or none)."""
        gone_set = set(gone)
        return [tuple(m for m in own if m not in gone_set) for own in self.owner_map()]

    # -- wire ---------------------------------------------------------------------------------------------
    def to_wire(self) -> list[Any]:
        return [
            self.num_segments,
            self.num_owners,
            [m.to_wire() for m in self.members],
            list(self.capacities),
            [list(own) for own in self.owners],
        ]

    @classmethod
    def from_wire(cls, data: Any, field: str = "ch") -> ConsistentHash:
        items = as_list(data, field, 5, exact=5)
        num_segments = as_int(items[0], f"{field}.num_segments", 1, MAX_SEGMENTS)
        num_owners = as_int(items[1], f"{field}.num_owners", 1, MAX_OWNERS)
        members = as_address_list(items[2], f"{field}.members", MAX_MEMBERS)
        if not members:
            raise WireError(f"{field}.members: a consistent hash needs at least one member")
        raw_caps = as_list(items[3], f"{field}.capacities", MAX_MEMBERS)
        caps = []
        for i, c in enumerate(raw_caps):
            if type(c) not in (float, int):
                raise WireError(f"{field}.capacities[{i}]: expected a number, got {type(c).__name__}")
            caps.append(float(c))
        raw_owners = as_list(items[4], f"{field}.owners", MAX_SEGMENTS)
        n = len(members)
        # A CH has a few dozen distinct owner lists over its segments, so each is checked once (every member
        # decodes each topology of a rebalance at about the same moment, two CHs of 256 segments each; a Python
        # step per segment was half of a 0.2 ms decode). The types are checked in bulk first (True == 1 and
        # 1.0 == 1: the set of distinct lists would not tell them apart); any doubt goes the slow way.
        owners: list[tuple[int, ...]] = []
        first_bad: int | None = 0
        if set(map(type, raw_owners)) <= {list} and set(map(type, chain.from_iterable(raw_owners))) <= {int}:
            owners = list(map(tuple, raw_owners))
            bad = {own for own in set(owners) if not (1 <= len(own) <= num_owners and 0 <= min(own) and max(own) < n)}
            first_bad = next(s for s, own in enumerate(owners) if own in bad) if bad else None
        if first_bad is not None:
            _refuse_owners(raw_owners, first_bad, num_owners, n, field)
        ch = object.__new__(cls)
        for name, value in (
            ("num_segments", num_segments),
            ("num_owners", num_owners),
            ("members", members),
            ("capacities", tuple(caps)),
            ("owners", tuple(owners)),
        ):
            object.__setattr__(ch, name, value)
        _check(ch, field, WireError)
        return ch


def _refuse_owners(raw_owners: list[Any], start: int, num_owners: int, n: int, field: str) -> NoReturn:
    """Raise the :class:`WireError` of the first malformed owner list at or after segment ``start``."""
    for s in range(start, len(raw_owners)):
        own = raw_owners[s]
        if type(own) is not list or not 1 <= len(own) <= num_owners:
            raise WireError(f"{field}.owners[{s}]: expected a list of 1 to {num_owners} member indexes")
        for i in own:
            if type(i) is not int or not 0 <= i < n:
                raise WireError(f"{field}.owners[{s}]: member index {i!r} is outside [0, {n - 1}]")
    raise AssertionError(f"{field}.owners: no malformed owner list from segment {start}")  # pragma: no cover


def _check(ch: ConsistentHash, field: str, exc: type[Exception]) -> None:
    if not 1 <= ch.num_segments <= MAX_SEGMENTS:
        raise exc(f"{field}.num_segments: {ch.num_segments} is outside [1, {MAX_SEGMENTS}]")
    if not 1 <= ch.num_owners <= MAX_OWNERS:
        raise exc(f"{field}.num_owners: {ch.num_owners} is outside [1, {MAX_OWNERS}]")
    if not ch.members or len(ch.members) > MAX_MEMBERS:
        raise exc(f"{field}.members: expected 1 to {MAX_MEMBERS} members, got {len(ch.members)}")
    if len(set(ch.members)) != len(ch.members):
        raise exc(f"{field}.members: a member is listed twice")
    if len(ch.capacities) != len(ch.members):
        raise exc(f"{field}.capacities: {len(ch.capacities)} values for {len(ch.members)} members")
    for i, c in enumerate(ch.capacities):
        if not (math.isfinite(c) and 0.0 <= c <= MAX_CAPACITY):
            raise exc(f"{field}.capacities[{i}]: {c!r} is outside [0, {MAX_CAPACITY:g}]")
    if len(ch.owners) != ch.num_segments:
        raise exc(f"{field}.owners: {len(ch.owners)} segments listed, expected {ch.num_segments}")
    n = len(ch.members)
    k = ch.num_owners
    # Distinct owner lists only (a CH has a few dozen); the first segment with a bad one is named.
    distinct = set(ch.owners)
    bad = {own for own in distinct if not (1 <= len(own) <= k and len(set(own)) == len(own))}
    bad |= {own for own in distinct - bad if not (0 <= min(own) and max(own) < n)}
    for s, own in enumerate(ch.owners if bad else ()):
        if own not in bad:
            continue
        if not 1 <= len(own) <= k:
            raise exc(f"{field}.owners[{s}]: {len(own)} owners, expected 1 to {k}")
        if len(set(own)) != len(own):
            raise exc(f"{field}.owners[{s}]: a member owns the segment twice")
        i = next(i for i in own if not 0 <= i < n)
        raise exc(f"{field}.owners[{s}]: member index {i} is outside [0, {n - 1}]")


# ---- balancing ------------------------------------------------------------------------------------------


def _fair_shares(weights: Sequence[float], total: int, cap: int) -> list[float]:
    """Capacity-proportional shares of ``total`` with no share above ``cap`` (excess spread over the rest)."""
    shares = [0.0] * len(weights)
    free = [i for i, w in enumerate(weights) if w > 0]
    remaining = float(total)
    while free:
        wsum = sum(weights[i] for i in free)
        over = [i for i in free if remaining * weights[i] / wsum > cap]
        if not over:
            for i in free:
                shares[i] = remaining * weights[i] / wsum
            break
        for i in over:
            shares[i] = float(cap)
            remaining -= cap
        free = [i for i in free if i not in over]
    return shares


def _quotas(shares: Sequence[float], total: int, upper: Sequence[int]) -> list[int]:
    """Largest-remainder rounding of ``shares`` to integers summing to ``total``, each at most ``upper``."""
    q = [min(math.floor(s + 1e-9), u) for s, u in zip(shares, upper, strict=True)]
    short = total - sum(q)
    # Ties break by index (member order), so every coordinator computes the same CH.
    order = sorted(range(len(shares)), key=lambda i: (-(shares[i] - math.floor(shares[i] + 1e-9)), i))
    while short > 0:
        progressed = False
        for i in order:
            if short == 0:
                break
            if q[i] < upper[i] and shares[i] > 0:
                q[i] += 1
                short -= 1
                progressed = True
        if not progressed:
            raise ValueError(f"cannot place {total} slots within the members' limits")
    return q


def quotas(
    members: Sequence[Address], capacities: Mapping[Address, float], num_segments: int, num_owners: int
) -> tuple[dict[Address, int], dict[Address, int], int]:
    """(primary quota, owner quota, effective owners per segment) for each member."""
    weights = [float(capacities.get(m, 1.0)) for m in members]
    positive = sum(1 for w in weights if w > 0)
    if positive == 0:
        raise ValueError("no member has a capacity above 0: nobody can own segments")
    k = min(num_owners, positive)
    cap = [num_segments if w > 0 else 0 for w in weights]
    owner_q = _quotas(_fair_shares(weights, num_segments * k, num_segments), num_segments * k, cap)
    prim_q = _quotas(_fair_shares(weights, num_segments, num_segments), num_segments, owner_q)
    return dict(zip(members, prim_q, strict=True)), dict(zip(members, owner_q, strict=True)), k


def balanced(
    previous: Sequence[Sequence[Address]] | None,
    members: Sequence[Address],
    capacities: Mapping[Address, float],
    num_segments: int = DEFAULT_SEGMENTS,
    num_owners: int = DEFAULT_OWNERS,
) -> ConsistentHash:
    """A balanced CH for ``members`` that moves as little as possible from ``previous`` (an owner map).

    ``previous`` may name members that are gone (they are ignored) and may have any number of owners per
    segment; ``None`` starts from scratch. Deterministic: the same input gives the same CH on any member.
    """
    if not members:
        raise ValueError("members: cannot build a consistent hash without members")
    if len(set(members)) != len(members):
        raise ValueError("members: a member is listed twice")
    if previous is not None and len(previous) != num_segments:
        raise ValueError(f"previous: {len(previous)} segments, expected {num_segments}")
    prim_q, owner_q, k = quotas(members, capacities, num_segments, num_owners)
    member_set = set(members)
    order = {m: i for i, m in enumerate(members)}
    prev = [[m for m in own if m in member_set] for own in previous] if previous is not None else None
    pcount = dict.fromkeys(members, 0)
    primary = _assign_primaries(prev, members, prim_q, pcount, order, num_segments)
    ocount = dict(pcount)
    owners: list[list[Address]] = [[p] for p in primary]
    if previous is not None and prev is not None:
        _keep_previous_backups(previous, prev, owners, members, owner_q, ocount, order, k)
    _fill_backups(owners, members, owner_q, ocount, order, k)
    return ConsistentHash.from_owner_map(
        num_segments, num_owners, owners, {m: float(capacities.get(m, 1.0)) for m in members}
    )


def _assign_primaries(
    prev: list[list[Address]] | None,
    members: Sequence[Address],
    prim_q: Mapping[Address, int],
    pcount: dict[Address, int],
    order: Mapping[Address, int],
    num_segments: int,
) -> list[Address]:
    """Phase A of :func:`balanced`: each segment's primary; counts them in ``pcount``.

    Keep a live primary while under quota, then promote a surviving backup (no data moves), then give the rest
    to whoever is furthest below quota.
    """
    primary: list[Address | None] = [None] * num_segments
    if prev is not None:
        for s, own in enumerate(prev):
            if own and pcount[own[0]] < prim_q[own[0]]:
                primary[s] = own[0]
                pcount[own[0]] += 1
        for s, own in enumerate(prev):
            if primary[s] is None:
                for m in own[1:]:
                    if pcount[m] < prim_q[m]:
                        primary[s] = m
                        pcount[m] += 1
                        break
    out: list[Address] = []
    for kept in primary:
        if kept is None:
            kept = max(members, key=lambda x: (prim_q[x] - pcount[x], -order[x]))
            pcount[kept] += 1
        out.append(kept)
    return out


def _keep_previous_backups(
    previous: Sequence[Sequence[Address]],
    prev: list[list[Address]],
    owners: list[list[Address]],
    members: Sequence[Address],
    owner_q: Mapping[Address, int],
    ocount: dict[Address, int],
    order: Mapping[Address, int],
    k: int,
) -> None:
    """Phase B of :func:`balanced`: keep every previous owner, then shed the excess of members above quota.

    The removals are spread so a segment loses at most one owner where possible (co-owners that are both above
    quota would otherwise shed the same segments, and the second freed slot would move data between old members).
    """
    num_segments = len(owners)
    for s, own in enumerate(prev):
        seg = owners[s]
        for m in own:
            if m not in seg and owner_q[m] > 0:
                seg.append(m)
                ocount[m] += 1
    # Where a new primary leaves more previous owners than slots, one of them must go (a *mandatory*
    # removal); a segment that kept all its previous owners may lose one (an *optional* removal: the new
    # owner filling it is the one data move the change needs anyway). A segment that already lost an
    # owner (it left) gets a new owner regardless; shedding there too would make it take a second one.
    # Every removal given to a member above its quota is free; a mandatory removal from a member at quota,
    # or an excess shed from a segment that already changed, costs one extra move. So the removals are
    # chosen together as a maximum matching of members' excess to segments, not greedily in segment order
    # (which would spend a member's removals where another member's excess had nowhere else to go).
    excess = {m: ocount[m] - owner_q[m] for m in members}
    for seg in owners:
        # Segments more than one owner over (the owner count shrank) shed the surplus beyond one first.
        while len(seg) > k + 1:
            surplus = max(seg[1:], key=lambda x: (excess[x], order[x]))
            seg.remove(surplus)
            ocount[surplus] -= 1
            excess[surplus] -= 1
    mandatory = [len(seg) > k for seg in owners]
    optional = [not mandatory[s] and set(previous[s]) <= set(owners[s]) for s in range(num_segments)]
    chosen = _removals(owners, mandatory, optional, members, excess)
    for s in range(num_segments):
        seg = owners[s]
        drop = chosen.get(s)
        if drop is None and mandatory[s]:
            # Nobody above quota owns it: drop the one furthest above (it takes a copy elsewhere later).
            drop = max(seg[1:], key=lambda x: (excess[x], order[x]))
        if drop is not None:
            seg.remove(drop)
            ocount[drop] -= 1
            excess[drop] -= 1
    for m in members:
        for s in range(num_segments):
            if excess[m] <= 0:
                break
            seg = owners[s]
            if m in seg and seg[0] != m:
                seg.remove(m)
                ocount[m] -= 1
                excess[m] -= 1


def _fill_backups(
    owners: list[list[Address]],
    members: Sequence[Address],
    owner_q: Mapping[Address, int],
    ocount: dict[Address, int],
    order: Mapping[Address, int],
    k: int,
) -> None:
    """Phase C of :func:`balanced`: fill every segment up to ``k`` owners from the members under quota."""
    for s in range(len(owners)):
        seg = owners[s]
        while len(seg) < k:
            cands = [m for m in members if m not in seg and ocount[m] < owner_q[m]]
            if cands:
                m = max(cands, key=lambda x: (owner_q[x] - ocount[x], -order[x]))
                seg.append(m)
                ocount[m] += 1
                continue
            # Everyone still under quota already owns this segment. Make progress elsewhere: each step below
            # places one more copy, and while a segment is short some member is under quota (quotas sum to
            # segments x k and nobody is above quota after shedding), so the loop ends.
            needy_all = [m for m in members if ocount[m] < owner_q[m]]
            if _fill_other_short_segment(owners, s, k, needy_all, ocount):
                continue
            # Every short segment holds every needy member. A needy member owns fewer than all segments
            # (quota <= segments), and a segment it lacks is therefore *full*: its k - 1 backups cannot all
            # be among the at most k - 2 co-owners of the short segment, so one of them moves here and the
            # needy member takes its slot. (The earlier code swapped with the first segment lacking the first
            # needy member even when that segment was itself short; its backups could then all co-own this
            # segment and no swap was found.)
            if not _swap_into(owners, seg, k, needy_all, ocount):  # pragma: no cover - impossible, see above
                raise AssertionError("consistent hash: no swap found while filling owners")


def _removals(
    owners: list[list[Address]],
    mandatory: Sequence[bool],
    optional: Sequence[bool],
    members: Sequence[Address],
    excess: Mapping[Address, int],
) -> dict[int, Address]:
    """Segment -> the backup that leaves it: at most one per eligible segment, members within their excess.

    A bipartite b-matching, as large as possible: a greedy pass (mandatory segments first), then augmenting
    paths for the members still above quota. Candidate lists put mandatory segments first, so paths prefer
    them. The search is iterative (no recursion limit for large segment counts) and visits members and
    segments in a fixed order, so every coordinator computes the same result.
    """
    cands: dict[Address, list[int]] = {m: [] for m in members if excess[m] > 0}
    for pass_mandatory in (True, False):
        for s, seg in enumerate(owners):
            if mandatory[s] if pass_mandatory else optional[s]:
                for m in seg[1:]:
                    if m in cands:
                        cands[m].append(s)
    assign: dict[int, Address] = {}
    load = dict.fromkeys(cands, 0)
    for pass_mandatory in (True, False):
        for m, segs in cands.items():
            for s in segs:
                if load[m] >= excess[m]:
                    break
                if s not in assign and mandatory[s] == pass_mandatory:
                    assign[s] = m
                    load[m] += 1
    for m in cands:
        while load[m] < excess[m] and _augment(m, cands, assign):
            load[m] += 1
    return assign


def _augment(start: Address, cands: Mapping[Address, list[int]], assign: dict[int, Address]) -> bool:
    """Find a free segment for ``start`` by moving other members' sheds along an alternating path."""
    visited: set[int] = set()
    # Each frame: (member, index of its next candidate, the segment that led to it or -1 for the start).
    stack: list[tuple[Address, int, int]] = [(start, 0, -1)]
    while stack:
        m, i, via = stack[-1]
        segs = cands[m]
        while i < len(segs) and segs[i] in visited:
            i += 1
        if i == len(segs):
            stack.pop()
            continue
        s = segs[i]
        stack[-1] = (m, i + 1, via)
        visited.add(s)
        holder = assign.get(s)
        if holder is None:
            # Free segment: shift every segment on the path to the member that reached it.
            assign[s] = m
            for depth in range(len(stack) - 1, 0, -1):
                assign[stack[depth][2]] = stack[depth - 1][0]
            return True
        stack.append((holder, 0, s))
    return False


def _fill_other_short_segment(
    owners: list[list[Address]], current: int, k: int, needy: Sequence[Address], ocount: dict[Address, int]
) -> bool:
    """Give a needy member a slot in some other short segment that lacks it (the cheapest progress)."""
    for s2, other in enumerate(owners):
        if s2 == current or len(other) >= k:
            continue
        for m in needy:
            if m not in other:
                other.append(m)
                ocount[m] += 1
                return True
    return False


def _swap_into(
    owners: list[list[Address]], seg: list[Address], k: int, needy: Sequence[Address], ocount: dict[Address, int]
) -> bool:
    """Move a backup of a full segment into ``seg``; a needy member that lacks that segment takes its place."""
    for m in needy:
        for other in owners:
            if len(other) < k or m in other:
                continue
            for j in range(1, len(other)):
                x = other[j]
                if x not in seg:
                    other[j] = m
                    seg.append(x)
                    ocount[m] += 1
                    return True
    return False
