"""Pure planning for the Spark data source: segments grouped into Spark partitions, and stream offsets.

Nothing here does I/O or imports Spark, so the decisions are unit-tested with plain data.

**Partitions.** The grid splits its keys into ``num_segments`` segments (docs/grid.md). A batch read is one
Spark partition per *group of segments*; the groups follow the routing table's read owner of each segment,
so a task reads from one member while the topology stays put (and follows a segment to its new owner when it
moves; see :mod:`.gridio`).

**Offsets.** A stream offset is, per segment, the highest entry version delivered so far. The grid's primary
owner stamps every write of a segment with a version ``(topology_id << 40) | seq`` that grows with each
write it orders, and every owner applies writes newest-version-first; so the versions of a segment are its
sequence numbers. A micro-batch from offset ``start`` to ``end`` holds, for each segment, the entries with
``start < version <= end``: ranges of consecutive batches do not overlap (nothing twice) and leave no hole
(nothing skipped), and a batch replayed after a restart reads the same ranges.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class SegmentGroup:
    """The segments one Spark task reads, and the member that served them as read owner when planned."""

    segments: tuple[int, ...]
    owner: str | None


class RoutingError(ValueError):
    """A member's routing table (``/v1/status`` ``routing``) is missing or malformed."""


@dataclass(frozen=True)
class Routing:
    """What the data source needs from a member's routing table."""

    topology_id: int
    num_segments: int
    members: tuple[str | None, ...]
    read: tuple[int, ...]
    write: tuple[int, ...]

    @classmethod
    def from_status(cls, status: Mapping[str, Any]) -> Routing:
        r = status.get("routing")
        if not isinstance(r, Mapping):
            raise RoutingError("the member has no grid topology yet (no routing in /v1/status)")
        try:
            n = int(r["num_segments"])
            members = tuple(None if m is None else str(m) for m in r["members"])
            read = tuple(int(i) for i in r["read"])
            write = tuple(int(i) for i in r["write"])
            tid = int(r["topology_id"])
        except (KeyError, TypeError, ValueError) as exc:
            raise RoutingError(f"malformed routing table in /v1/status: {exc!r}") from None
        if n < 1 or len(read) != n or len(write) != n:
            raise RoutingError(f"malformed routing table: {n} segments, {len(read)} read and {len(write)} write owners")
        for i in (*read, *write):
            if not -1 <= i < len(members):
                raise RoutingError(f"malformed routing table: member index {i} outside [-1, {len(members) - 1}]")
        return cls(tid, n, members, read, write)

    def read_owner(self, segment: int) -> str | None:
        i = self.read[segment]
        return self.members[i] if i >= 0 else None


def plan_groups(routing: Routing, num_partitions: int = 0) -> list[SegmentGroup]:
    """Group every segment by its read owner, cut into about ``num_partitions`` groups (0: two per owner).

    Each owner gets a share of the partitions proportional to the segments it reads (at least one), so tasks
    are about the same size and every task talks to one member while the topology stays put.
    """
    by_owner: dict[str | None, list[int]] = {}
    for s in range(routing.num_segments):
        by_owner.setdefault(routing.read_owner(s), []).append(s)
    total = routing.num_segments
    wanted = num_partitions if num_partitions > 0 else 2 * len(by_owner)
    wanted = max(1, min(wanted, total))
    groups: list[SegmentGroup] = []
    for owner, segs in by_owner.items():
        share = max(1, round(wanted * len(segs) / total))
        share = min(share, len(segs))
        base, extra = divmod(len(segs), share)
        pos = 0
        for k in range(share):
            size = base + (1 if k < extra else 0)
            groups.append(SegmentGroup(tuple(segs[pos : pos + size]), owner))
            pos += size
    return groups


# ==== stream offsets ===========================================================================================
@dataclass(frozen=True)
class Offset:
    """Per segment, the highest version delivered (0: nothing yet). Serialized as a dict Spark checkpoints."""

    num_segments: int
    versions: tuple[int, ...]

    @classmethod
    def zero(cls, num_segments: int) -> Offset:
        return cls(num_segments, (0,) * num_segments)

    def to_json(self) -> dict[str, Any]:
        # Only segments with something delivered, keys in segment order: the same offset always serializes to
        # the same JSON, which is how Spark tells "no new data" (end == start).
        return {
            "numSegments": self.num_segments,
            "versions": {str(s): v for s, v in enumerate(self.versions) if v},
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Offset:
        try:
            n = int(doc["numSegments"])
            raw = doc["versions"]
            if not isinstance(raw, Mapping):
                raise TypeError("versions is not a map")
            versions = [0] * n
            for s, v in raw.items():
                seg, ver = int(s), int(v)
                if not 0 <= seg < n or ver < 0:
                    raise ValueError(f"segment {seg} / version {ver} out of range")
                versions[seg] = ver
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"not a groupcluster stream offset: {dict(doc)!r} ({exc})") from None
        if n < 1:
            raise ValueError(f"not a groupcluster stream offset: numSegments {n}")
        return cls(n, tuple(versions))

    def advanced(self, maxima: Mapping[int, int]) -> Offset:
        """This offset moved forward to the highest versions seen (never backwards)."""
        v = list(self.versions)
        for s, m in maxima.items():
            if m > v[s]:
                v[s] = m
        return Offset(self.num_segments, tuple(v))

    def check_compatible(self, other: Offset) -> None:
        if self.num_segments != other.num_segments:
            raise ValueError(
                f"the grid now has {other.num_segments} segments but the checkpoint has {self.num_segments}: "
                "a stream cannot resume across a change of num_segments; start it with a new checkpoint"
            )


@dataclass(frozen=True)
class RangeGroup:
    """One streaming task: for each of its segments, the version range ``(start, end]`` to deliver."""

    segments: tuple[int, ...]
    starts: tuple[int, ...]
    ends: tuple[int, ...]
    owner: str | None


def plan_ranges(groups: Sequence[SegmentGroup], start: Offset, end: Offset) -> list[RangeGroup]:
    """The tasks of one micro-batch: only segments whose range is not empty."""
    start.check_compatible(end)
    out: list[RangeGroup] = []
    for g in groups:
        segs = [s for s in g.segments if end.versions[s] > start.versions[s]]
        if segs:
            out.append(
                RangeGroup(
                    tuple(segs),
                    tuple(start.versions[s] for s in segs),
                    tuple(end.versions[s] for s in segs),
                    g.owner,
                )
            )
    return out


def in_range(entries: Iterable[tuple[bytes, bytes, int]], lo: int, hi: int) -> list[tuple[bytes, bytes, int]]:
    """The entries whose version lies in ``(lo, hi]``."""
    return [e for e in entries if lo < e[2] <= hi]
