"""The local data container: entries per segment, each with a version, and tombstones during transfers (pure).

Versions order the writes of one key: the primary owner stamps every write with ``(topology id << 40) | seq``
(:func:`make_version`), so a write accepted under a newer topology always beats one from an older topology,
and within one topology the single primary orders them. Every apply is "newest version wins", which gives the
rule Infinispan states as "a write during a transfer wins over a transferred value": a value that arrives by
state transfer is applied only where the key is absent or holds an older version, and a deletion during a
transfer leaves a *tombstone* (its version, no value) so an older transferred value cannot resurrect the key.
The node keeps tombstones (``keep_tombstones``) because after a merge another partition's older entries arrive
too; :meth:`SegmentStore.purge_tombstones` drops them all, :meth:`SegmentStore.expire_tombstones` those older
than a time (the node's ``tombstone_grace``; the time of a tombstone is when *this* store got it). Two different
values with the same version (possible only between partitions) resolve to the greater value, a deletion
counting least.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from typing import Any

SEQ_BITS = 40
MAX_SEQ = (1 << SEQ_BITS) - 1
ENTRY_OVERHEAD = 24  # bytes counted per entry besides key and value (the version and framing, roughly)

# (key, version, value or None for a tombstone): the form entries travel in and come out of iteration.
TransferEntry = tuple[bytes, int, bytes | None]


def make_version(topology_id: int, seq: int) -> int:
    if not 0 <= seq <= MAX_SEQ:
        raise ValueError(f"version sequence {seq} is outside [0, {MAX_SEQ}]")
    return (topology_id << SEQ_BITS) | seq


def version_topology(version: int) -> int:
    return version >> SEQ_BITS


def _tie_wins(new: bytes | None, old: bytes | None) -> bool:
    """Two different values with one version come only from two partitions (each stamped its own writes):
    the greater value wins, a deletion counting as smallest, so every replica picks the same one."""
    return new is not None and (old is None or new > old)


class SegmentStore:
    """Entries of the segments this member holds: ``segment -> {key: (version, value | None)}``."""

    __slots__ = ("_tomb_queue", "keep_tombstones", "num_segments", "segments", "tombstones")

    def __init__(self, num_segments: int) -> None:
        self.num_segments = num_segments
        self.segments: dict[int, dict[bytes, tuple[int, bytes | None]]] = {}
        # While True (a rebalance runs) a delete leaves a tombstone instead of removing the key.
        self.keep_tombstones = False
        self.tombstones = 0
        # (time stored, segment, key, version) of every tombstone in the order they came (times only grow):
        # entries whose key has since changed or gone are skipped when they come up for expiry.
        self._tomb_queue: deque[tuple[float, int, bytes, int]] = deque()

    # -- segments -------------------------------------------------------------------------------------------
    def has_segment(self, segment: int) -> bool:
        return segment in self.segments

    def held_segments(self) -> frozenset[int]:
        return frozenset(self.segments)

    def add_segment(self, segment: int) -> None:
        self._check_segment(segment)
        self.segments.setdefault(segment, {})

    def remove_segment(self, segment: int) -> int:
        """Drop a segment and everything in it; returns the number of entries (tombstones included) dropped."""
        data = self.segments.pop(segment, None)
        if data is None:
            return 0
        self.tombstones -= sum(1 for _, v in data.values() if v is None)
        return len(data)

    def clear_segment(self, segment: int) -> int:
        """Empty a segment but keep holding it (a new owner starting a transfer from scratch)."""
        n = self.remove_segment(segment)
        self.segments[segment] = {}
        return n

    # -- reads ----------------------------------------------------------------------------------------------
    def get(self, segment: int, key: bytes) -> tuple[int, bytes | None] | None:
        """``(version, value)``; value None is a tombstone; None when the key is absent."""
        data = self.segments.get(segment)
        return None if data is None else data.get(key)

    def value(self, segment: int, key: bytes) -> bytes | None:
        data = self.segments.get(segment)
        if data is None:
            return None
        entry = data.get(key)
        return None if entry is None else entry[1]

    # -- writes ---------------------------------------------------------------------------------------------
    def write(self, segment: int, key: bytes, version: int, value: bytes | None, *, now: float = 0.0) -> bool:
        """Apply a put (value) or delete (None) if ``version`` is newer than what is stored; True if applied.
        ``now`` dates a tombstone for :meth:`expire_tombstones`."""
        # One rule for local writes and transferred entries: the newer version wins, tombstones included.
        return self.apply_transferred(segment, ((key, version, value),), now=now) == 1

    def apply_transferred(self, segment: int, entries: Iterable[TransferEntry], *, now: float = 0.0) -> int:
        """Apply a batch of entries (received by state transfer, or one local write); a local newer version or
        tombstone wins. Returns how many were applied. ``now`` dates the tombstones kept."""
        data = self.segments.get(segment)
        if data is None:
            self._check_segment(segment)
            data = self.segments[segment] = {}
        applied = 0
        get = data.get
        for key, version, value in entries:
            old = get(key)
            if old is not None and (old[0] > version or (old[0] == version and not _tie_wins(value, old[1]))):
                continue
            if value is None:
                # A tombstone from the source: keep it only while tombstones matter, never resurrect.
                if self.keep_tombstones:
                    if old is None or old[1] is not None:
                        self.tombstones += 1
                    data[key] = (version, None)
                    self._tomb_queue.append((now, segment, key, version))
                elif old is not None:
                    if old[1] is None:
                        self.tombstones -= 1
                    del data[key]
            else:
                if old is not None and old[1] is None:
                    self.tombstones -= 1
                data[key] = (version, value)
            applied += 1
        return applied

    def purge_tombstones(self) -> int:
        """Drop every tombstone (the rebalance ended); returns how many."""
        if self.tombstones == 0:
            return 0
        dropped = 0
        for data in self.segments.values():
            dead = [k for k, (_, v) in data.items() if v is None]
            for k in dead:
                del data[k]
            dropped += len(dead)
        self.tombstones = 0
        self._tomb_queue.clear()
        return dropped

    def oldest_tombstone(self) -> float | None:
        """When the oldest tombstone still queued for expiry was stored (None: none)."""
        return self._tomb_queue[0][0] if self._tomb_queue else None

    def expire_tombstones(self, now: float, grace: float) -> int:
        """Drop the tombstones stored at least ``grace`` seconds before ``now``; returns how many were dropped."""
        queue = self._tomb_queue
        dropped = 0
        # The same sum as the caller's deadline (oldest + grace), so a due tombstone always goes (no rounding
        # gap that would leave the deadline in the past and a driver ticking in a loop).
        while queue and queue[0][0] + grace <= now:
            _, segment, key, version = queue.popleft()
            data = self.segments.get(segment)
            if data is not None and data.get(key) == (version, None):
                del data[key]
                self.tombstones -= 1
                dropped += 1
        return dropped

    # -- iteration ------------------------------------------------------------------------------------------
    def segment_batches(
        self, segment: int, max_entries: int, max_bytes: int, *, tombstones: bool = True
    ) -> Iterator[list[TransferEntry]]:
        """Yield the segment's entries in batches bounded by ``max_entries`` and ``max_bytes``.

        The segment is snapshotted when iteration starts: writes after that reach a new owner through the
        write-all phases, not through this iterator.
        """
        if max_entries < 1 or max_bytes < 1:
            raise ValueError("segment_batches: max_entries and max_bytes must be at least 1")
        data = self.segments.get(segment)
        if not data:
            return
        snapshot = list(data.items())
        batch: list[TransferEntry] = []
        size = 0
        for key, (version, value) in snapshot:
            if value is None and not tombstones:
                continue
            n = len(key) + (len(value) if value is not None else 0) + ENTRY_OVERHEAD
            if batch and (len(batch) >= max_entries or size + n > max_bytes):
                yield batch
                batch, size = [], 0
            batch.append((key, version, value))
            size += n
        if batch:
            yield batch

    # -- statistics -----------------------------------------------------------------------------------------
    def __len__(self) -> int:
        """Live entries (tombstones not counted)."""
        return sum(len(d) for d in self.segments.values()) - self.tombstones

    def segment_size(self, segment: int) -> int:
        data = self.segments.get(segment)
        return 0 if data is None else sum(1 for _, v in data.values() if v is not None)

    def items(self) -> Iterator[tuple[int, bytes, int, bytes]]:
        """Every live entry as (segment, key, version, value) (tests and checkers)."""
        for s, data in self.segments.items():
            for k, (ver, val) in data.items():
                if val is not None:
                    yield s, k, ver, val

    def describe(self) -> dict[str, Any]:
        return {"segments": len(self.segments), "entries": len(self), "tombstones": self.tombstones}

    def _check_segment(self, segment: int) -> None:
        if not 0 <= segment < self.num_segments:
            raise ValueError(f"segment {segment} is outside [0, {self.num_segments - 1}]")
