"""The local data container: entries per segment, each with a version, and tombstones during transfers (pure).

Versions order the writes of one key: the primary owner stamps every write with ``(topology id << 40) | seq``
(:func:`make_version`), so a write accepted under a newer topology always beats one from an older topology,
and within one topology the single primary orders them. The sequence is a hybrid clock (:func:`next_seq`): at
least the primary's wall clock in milliseconds, so a version also dates its write, which orders the writes of
two grids that never met when they merge (grid/node/membership.py re-stamps them by it). Every apply is "newest version
wins", which gives the rule Infinispan states as "a write during a transfer wins over a transferred value": a
value that arrives by state transfer is applied only where the key is absent or holds an older version, and a
deletion during a transfer leaves a *tombstone* (its version, no value) so an older transferred value cannot
resurrect the key.
The node keeps tombstones (``keep_tombstones``) because after a merge another partition's older entries arrive
too; :meth:`SegmentStore.purge_tombstones` drops them all, :meth:`SegmentStore.expire_tombstones` those older
than a time (the node's ``tombstone_grace``; the time of a tombstone is when *this* store got it). Two different
values with the same version (possible only between partitions) resolve to the greater value, a deletion
counting least.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterable, Iterator, KeysView, Sequence
from typing import Any, cast

SEQ_BITS = 40
MAX_SEQ = (1 << SEQ_BITS) - 1
ENTRY_OVERHEAD = 24  # bytes counted per entry besides key and value (the version and framing, roughly)

# (key, version, value or None for a tombstone): the form entries travel in and come out of iteration.
TransferEntry = tuple[bytes, int, bytes | None]
# The same entries as three columns (keys, versions, values): how state transfer moves them in bulk.
Columns = tuple[list[bytes], list[int], list[bytes | None]]
# Below this many entries a chunk is applied entry by entry (the bulk path's set-up costs more).
_BULK_MIN = 16
# A dropped segment with more entries than this is freed a slice at a time (:meth:`SegmentStore.collect`).
FREE_AT_ONCE = 1024


# The clock part of a sequence counts milliseconds of wall-clock time since 2024-01-01 UTC: 40 bits last until
# 2058. A write's sequence is at least its primary's clock (:func:`clock_seq`), so the sequence of a version
# also dates it (:func:`version_seq`), which is what orders the writes of two grids that never met (docs/grid.md,
# "Grids that never met").
CLOCK_EPOCH_MS = 1_704_067_200_000
# The clock part stops 2**32 ms short of the end (in 2058), so counting on from it stays within 40 bits.
_CLOCK_MAX = MAX_SEQ - (1 << 32)


def clock_seq(wall: float) -> int:
    """The clock part of a sequence for the wall-clock time ``wall`` (seconds since the Unix epoch): whole
    milliseconds since :data:`CLOCK_EPOCH_MS`, 0 for a time before it (a node given no wall clock counts
    from 1, as versions did before they carried time)."""
    ms = int(wall * 1000.0) - CLOCK_EPOCH_MS
    return 0 if ms < 0 else min(ms, _CLOCK_MAX)


def next_seq(last: int, wall: float, held: int | None) -> int:
    """The sequence a primary stamps next: above its ``last`` one for the segment, at least its clock, and above
    the sequence of the key's ``held`` version (a hybrid logical clock: a key's sequences grow with its
    versions even when the clocks of its successive primaries disagree by a little)."""
    # clock_seq inlined: this runs for every write the primary stamps.
    seq = int(wall * 1000.0) - CLOCK_EPOCH_MS
    if seq > _CLOCK_MAX:
        seq = _CLOCK_MAX
    if seq <= last:
        seq = last + 1
    if held is not None:
        held &= MAX_SEQ
        if held >= seq:
            seq = held + 1
    return seq


def make_version(topology_id: int, seq: int) -> int:
    if not 0 <= seq <= MAX_SEQ:
        raise ValueError(f"version sequence {seq} is outside [0, {MAX_SEQ}]")
    return (topology_id << SEQ_BITS) | seq


def version_topology(version: int) -> int:
    return version >> SEQ_BITS


def version_seq(version: int) -> int:
    """The sequence part of a version: for versions stamped with a wall clock, the write's time in
    milliseconds since :data:`CLOCK_EPOCH_MS` (or a little above it, see :func:`next_seq`)."""
    return version & MAX_SEQ


def tie_wins(new: bytes | None, old: bytes | None) -> bool:
    """Two different values with one version come only from two partitions (each stamped its own writes):
    the greater value wins, a deletion counting as smallest, so every replica picks the same one."""
    return new is not None and (old is None or new > old)


class Segment:
    """One segment's entries, as the mapping ``key -> (version, value | None)`` (None: a tombstone).

    Held as two plain dicts, ``ver`` (key -> version) and ``val`` (key -> value or None), updated in step so
    they iterate in the same order. Neither holds anything the cyclic garbage collector tracks (ints, bytes,
    None), so it never walks them: with the entries as ``(version, value)`` tuples in one dict, every write made
    the dict tracked again and each collection walked whole segments, millions of entries (pauses up to
    0.6 s in a loaded member; docs/grid.md). The mapping methods serve readers outside the store (scans, merge
    pushes, the simulator's snapshots); the store itself works on the two dicts.
    """

    __slots__ = ("exp", "val", "ver")

    def __init__(self) -> None:
        self.ver: dict[bytes, int] = {}
        self.val: dict[bytes, bytes | None] = {}
        # Entries that expire, as key -> (version, expiry as a Unix time): valid only while the key still has
        # that version (a later write without an expiry leaves the record stale, dropped when it comes due), so
        # no write path has to look here. Empty for a grid without expiry.
        self.exp: dict[bytes, tuple[int, float]] = {}

    def __len__(self) -> int:
        return len(self.ver)

    def __contains__(self, key: object) -> bool:
        return key in self.ver

    def __iter__(self) -> Iterator[bytes]:
        return iter(self.ver)

    def keys(self) -> KeysView[bytes]:
        return self.ver.keys()

    def get(self, key: bytes, default: Any = None) -> tuple[int, bytes | None] | Any:
        version = self.ver.get(key)
        return default if version is None else (version, self.val[key])

    def __getitem__(self, key: bytes) -> tuple[int, bytes | None]:
        return (self.ver[key], self.val[key])

    def items(self) -> Iterator[tuple[bytes, tuple[int, bytes | None]]]:
        return zip(self.ver, zip(self.ver.values(), self.val.values(), strict=True), strict=True)

    def values(self) -> Iterator[tuple[int, bytes | None]]:
        return zip(self.ver.values(), self.val.values(), strict=True)

    def put(self, key: bytes, version: int, value: bytes | None) -> None:
        self.ver[key] = version
        self.val[key] = value

    def delete(self, key: bytes) -> None:
        del self.ver[key]
        del self.val[key]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Segment):
            return self.ver == other.ver and self.val == other.val
        if isinstance(other, dict):
            return dict(self.items()) == other
        return NotImplemented

    # Unhashable (it is mutable): Python sets __hash__ to None in a class that defines __eq__ and not __hash__.

    def __repr__(self) -> str:
        return f"Segment({dict(self.items())!r})"


def _live_bytes(data: Segment) -> int:
    """Key and value bytes of a segment's live entries (at C speed unless it holds tombstones)."""
    values = list(data.val.values())
    if None not in values:
        return sum(map(len, data.ver)) + sum(map(len, cast("list[bytes]", values)))
    return sum(len(k) + len(v) for k, v in data.val.items() if v is not None)


class SegmentStore:
    """Entries of the segments this member holds: ``segment -> Segment`` (``{key: (version, value | None)}``)."""

    __slots__ = (
        "_expiring",
        "_garbage",
        "_tomb_queue",
        "keep_tombstones",
        "nbytes",
        "num_segments",
        "segments",
        "tombstones",
    )

    def __init__(self, num_segments: int) -> None:
        self.num_segments = num_segments
        self.segments: dict[int, Segment] = {}
        # While True (a rebalance runs) a delete leaves a tombstone instead of removing the key.
        self.keep_tombstones = False
        self.tombstones = 0
        # Key and value bytes of the live entries (tombstones count nothing), kept up to date by every change
        # (the node's max_bytes bound reads it; :meth:`count_bytes` recounts it, for tests).
        self.nbytes = 0
        # (time stored, segment, key, version) of every tombstone in the order they came (times only grow):
        # entries whose key has since changed or gone are skipped when they come up for expiry.
        self._tomb_queue: deque[tuple[float, int, bytes, int]] = deque()
        # Dropped segments not yet freed: a member drops a third of a large store in one step at the end of a
        # rebalance, and freeing it at once stalled the member's event loop for hundreds of milliseconds.
        # Also the change-feed logs of dropped segments (deques of entries, see grid/feed.py's FeedStore).
        self._garbage: list[Segment | deque[Any]] = []
        # (when to look, segment, key, version) of every expiry recorded (:meth:`set_expiry`), a heap: the node
        # removes what has expired (:meth:`due_expiries`); records whose entry changed since are skipped then.
        self._expiring: list[tuple[float, int, bytes, int]] = []

    # -- segments -------------------------------------------------------------------------------------------
    def has_segment(self, segment: int) -> bool:
        return segment in self.segments

    def held_segments(self) -> frozenset[int]:
        return frozenset(self.segments)

    def add_segment(self, segment: int) -> None:
        self._check_segment(segment)
        if segment not in self.segments:
            self.segments[segment] = Segment()

    def remove_segment(self, segment: int) -> int:
        """Drop a segment and everything in it; returns the number of entries (tombstones included) dropped."""
        data = self.segments.pop(segment, None)
        if data is None:
            return 0
        if self.tombstones:
            # Counted at C speed: a member drops whole segments of thousands of entries in one step.
            self.tombstones -= list(data.val.values()).count(None)
        self.nbytes -= _live_bytes(data)
        if len(data) > FREE_AT_ONCE:
            self._garbage.append(data)
        return len(data)

    @property
    def garbage(self) -> int:
        """Entries of dropped segments still waiting to be freed (see :meth:`collect`)."""
        return sum(map(len, self._garbage))

    def collect(self, budget: int) -> int:
        """Free up to ``budget`` entries of dropped segments; returns how many were freed. The node calls it
        after each step, so a large drop is spread over many steps and other work runs in between."""
        freed = 0
        garbage = self._garbage
        while garbage and freed < budget:
            data = garbage[-1]
            left = budget - freed
            if len(data) <= left:
                freed += len(data)
                garbage.pop()  # the last reference: the segment's entries are freed here
            elif isinstance(data, deque):
                pop = data.pop
                for _ in range(left):
                    pop()
                freed += left
            else:
                pop_ver, pop_val = data.ver.popitem, data.val.popitem
                for _ in range(left):
                    pop_ver()
                    pop_val()
                freed += left
        return freed

    def reset_backing(self) -> None:
        """Forget the persistent copy of this store (grid/persist.py keeps one); the plain store has none."""

    def stash_backing(self) -> None:
        """Set the persistent copy's entries aside (kept until :meth:`drop_stash`, loaded again on a restart)."""

    def drop_stash(self) -> None:
        """Delete what :meth:`stash_backing` set aside."""

    def clear_segment(self, segment: int) -> int:
        """Empty a segment but keep holding it (a new owner starting a transfer from scratch)."""
        n = self.remove_segment(segment)
        self.segments[segment] = Segment()
        return n

    # -- reads ----------------------------------------------------------------------------------------------
    def get(self, segment: int, key: bytes) -> tuple[int, bytes | None] | None:
        """``(version, value)``; value None is a tombstone; None when the key is absent."""
        data = self.segments.get(segment)
        return None if data is None else data.get(key)

    def value(self, segment: int, key: bytes) -> bytes | None:
        data = self.segments.get(segment)
        return None if data is None else data.val.get(key)

    # -- writes ---------------------------------------------------------------------------------------------
    def write(self, segment: int, key: bytes, version: int, value: bytes | None, *, now: float = 0.0) -> bool:
        """Apply a put (value) or delete (None) if ``version`` is newer than what is stored; True if applied.
        ``now`` dates a tombstone for :meth:`expire_tombstones`."""
        # One rule for local writes and transferred entries: the newer version wins, tombstones included. The
        # common case (a value over an older value, or a new key) is inlined: every replicated write lands here.
        data = self.segments.get(segment)
        if data is not None and value is not None:
            vers = data.ver
            old = vers.get(key)
            if old is None or old < version:
                vals = data.val
                if old is None:
                    self.nbytes += len(key) + len(value)
                else:
                    held = vals[key]
                    if held is None:
                        self.tombstones -= 1
                        self.nbytes += len(key) + len(value)
                    else:
                        self.nbytes += len(value) - len(held)
                vers[key] = version
                vals[key] = value
                return True
        return self.apply_transferred(segment, ((key, version, value),), now=now) == 1

    def apply_transferred(self, segment: int, entries: Iterable[TransferEntry], *, now: float = 0.0) -> int:
        """Apply a batch of entries (received by state transfer, or one local write); a local newer version or
        tombstone wins. Returns how many were applied. ``now`` dates the tombstones kept."""
        data = self.segments.get(segment)
        if data is None:
            self._check_segment(segment)
            data = self.segments[segment] = Segment()
        applied = 0
        vers, vals = data.ver, data.val
        get = vers.get
        for key, version, value in entries:
            old = get(key)
            old_value = vals[key] if old is not None else None
            if old is not None and (old > version or (old == version and not tie_wins(value, old_value))):
                continue
            if old_value is not None:
                self.nbytes -= len(key) + len(old_value)
            if value is None:
                # A tombstone from the source: keep it only while tombstones matter, never resurrect.
                if self.keep_tombstones:
                    if old is None or old_value is not None:
                        self.tombstones += 1
                    vers[key] = version
                    vals[key] = None
                    self._tomb_queue.append((now, segment, key, version))
                elif old is not None:
                    if old_value is None:
                        self.tombstones -= 1
                    del vers[key]
                    del vals[key]
            else:
                if old is not None and old_value is None:
                    self.tombstones -= 1
                vers[key] = version
                vals[key] = value
                self.nbytes += len(key) + len(value)
            applied += 1
        return applied

    def apply_chunk(
        self,
        segment: int,
        keys: Sequence[bytes],
        versions: Sequence[int],
        values: Sequence[bytes | None],
        *,
        now: float = 0.0,
    ) -> int:
        """:meth:`apply_transferred` for a chunk given as columns with **distinct** keys (a state-transfer chunk,
        checked by its decoder); returns how many entries were applied.

        The same rule (newest version wins, tombstones kept or dropped the same way), at C speed for what
        transfers mostly bring: keys this store does not hold. Those go in with one ``dict.update``; keys it
        holds already (written during the transfer) and tombstones take the per-entry path.
        """
        n = len(keys)
        data = self.segments.get(segment)
        if data is None:
            self._check_segment(segment)
            data = self.segments[segment] = Segment()
        if n < _BULK_MIN:
            return self.apply_transferred(segment, zip(keys, versions, values, strict=True), now=now)
        vers, vals = data.ver, data.val
        clash = vers.keys() & keys if vers else set()
        tombs = values.count(None)
        if not clash and not tombs:
            vers.update(zip(keys, versions, strict=True))
            vals.update(zip(keys, values, strict=True))
            self.nbytes += sum(map(len, keys)) + sum(map(len, filter(None, values)))  # no tombstones: all counted
            return n
        if (len(clash) + tombs) * 8 > n:
            # Mostly special entries: the per-entry path is as fast and simpler.
            return self.apply_transferred(segment, zip(keys, versions, values, strict=True), now=now)
        held = {k: (vers[k], vals[k]) for k in clash}
        vers.update(zip(keys, versions, strict=True))
        vals.update(zip(keys, values, strict=True))
        for k, (version, value) in held.items():
            # What we held comes back (the key existed, so its place in both dicts is unchanged); these
            # entries are decided one by one below.
            vers[k] = version
            vals[k] = value
        pos = dict(zip(keys, range(n), strict=True))
        special = [pos[k] for k in clash]
        if tombs:
            i = -1
            for _ in range(tombs):
                i = values.index(None, i + 1)
                if keys[i] not in held:
                    data.delete(keys[i])  # the bulk update stored it; let the per-entry path decide
                    special.append(i)
        special.sort()  # in chunk order, as the per-entry path would see them
        applied = n - len(special)
        # The bulk update's own entries: new keys with values (the special ones are counted on their path).
        self.nbytes += sum(map(len, keys)) + sum(map(len, filter(None, values)))
        for i in special:
            value = values[i]
            if value is not None:
                self.nbytes -= len(keys[i]) + len(value)
            else:
                self.nbytes -= len(keys[i])
        return applied + self.apply_transferred(segment, ((keys[i], versions[i], values[i]) for i in special), now=now)

    def purge_tombstones(self) -> int:
        """Drop every tombstone (the rebalance ended); returns how many."""
        if self.tombstones == 0:
            return 0
        dropped = 0
        for data in self.segments.values():
            dead = [k for k, v in data.val.items() if v is None]
            for k in dead:
                data.delete(k)
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
            if data is not None and data.ver.get(key) == version and key in data.val and data.val[key] is None:
                data.delete(key)
                self.tombstones -= 1
                dropped += 1
        return dropped

    # -- expiry ---------------------------------------------------------------------------------------------
    def set_expiry(self, segment: int, key: bytes, version: int, expires: float) -> None:
        """Record that the entry ``key`` at ``version`` expires at ``expires`` (a Unix time), if the key holds that
        version with a value now (it was just applied, or was held already)."""
        data = self.segments.get(segment)
        if data is None or data.ver.get(key) != version or data.val[key] is None:
            return
        rec = (version, expires)
        if data.exp.get(key) == rec:
            return  # recorded already (a backup or chunk bringing a version we hold): one heap entry is enough
        data.exp[key] = rec
        heapq.heappush(self._expiring, (expires, segment, key, version))

    def set_expiries(
        self, segment: int, keys: Sequence[bytes], versions: Sequence[int], expiries: Sequence[float]
    ) -> None:
        """:meth:`set_expiry` for a transferred chunk's entries that have an expiry (0.0: none)."""
        for key, version, expires in zip(keys, versions, expiries, strict=True):
            if expires:
                self.set_expiry(segment, key, version, expires)

    def expiry_of(self, segment: int, key: bytes, version: int) -> float:
        """When the entry ``key`` at ``version`` expires (a Unix time; 0.0: never)."""
        data = self.segments.get(segment)
        if data is None or not data.exp:
            return 0.0
        rec = data.exp.get(key)
        return rec[1] if rec is not None and rec[0] == version else 0.0

    def expiries_of(self, segment: int, keys: Sequence[bytes], versions: Sequence[int]) -> list[float] | None:
        """The expiries of these entries (0.0: never), or None when none of them expires (a transfer chunk's
        column: a segment without expiring entries costs one check)."""
        data = self.segments.get(segment)
        if data is None or not data.exp:
            return None
        get = data.exp.get
        out = [0.0] * len(keys)
        found = False
        for i, (key, version) in enumerate(zip(keys, versions, strict=True)):
            rec = get(key)
            if rec is not None and rec[0] == version:
                out[i] = rec[1]
                found = True
        return out if found else None

    def next_expiry(self) -> float | None:
        """When the node must look at expiries next (a Unix time; None: nothing expires)."""
        return self._expiring[0][0] if self._expiring else None

    def due_expiries(self, wall: float, limit: int) -> list[tuple[int, bytes, int]]:
        """Up to ``limit`` entries whose expiry is at or before ``wall`` (a Unix time), as ``(segment, key,
        version)``, taken off the heap: the caller removes them or puts them back (:meth:`recheck_expiry`).
        Records of entries written or deleted since, or of segments no longer held, are dropped here."""
        heap = self._expiring
        segments = self.segments
        out: list[tuple[int, bytes, int]] = []
        while heap and heap[0][0] <= wall and len(out) < limit:
            _, segment, key, version = heapq.heappop(heap)
            data = segments.get(segment)
            if data is None:
                continue
            rec = data.exp.get(key)
            if rec is None or rec[0] != version:
                continue  # a newer expiry of the key has a record of its own
            if data.ver.get(key) != version or data.val[key] is None:
                del data.exp[key]  # written again without an expiry, or deleted
                continue
            if rec[1] > wall:
                continue  # a recheck, before the entry's own expiry: that has a heap entry of its own
            out.append((segment, key, version))
        if len(out) > 1:
            # A segment dropped and fetched again may have left a second heap entry for the same entry.
            out = list(dict.fromkeys(out))
        return out

    def recheck_expiry(self, when: float, segment: int, key: bytes, version: int) -> None:
        """Look at an expired entry again at ``when`` (a Unix time): another member is to remove it, or it
        could not be removed now."""
        heapq.heappush(self._expiring, (when, segment, key, version))

    # -- iteration ------------------------------------------------------------------------------------------
    def segment_batches(
        self, segment: int, max_entries: int, max_bytes: int, *, tombstones: bool = True
    ) -> Iterator[list[TransferEntry]]:
        """Yield the segment's entries as ``(key, version, value)`` lists bounded by ``max_entries`` and
        ``max_bytes`` (see :meth:`segment_chunks`)."""
        for keys, versions, values in self.segment_chunks(segment, max_entries, max_bytes, tombstones=tombstones):
            yield list(zip(keys, versions, values, strict=True))

    def segment_chunks(
        self, segment: int, max_entries: int, max_bytes: int, *, tombstones: bool = True
    ) -> Iterator[Columns]:
        """Yield the segment's entries as columns ``(keys, versions, values)``, each chunk at most
        ``max_entries`` entries and ``max_bytes`` bytes (keys, values and ``ENTRY_OVERHEAD`` each; a single
        entry larger than that is a chunk of its own).

        The segment is snapshotted when iteration starts: writes after that reach a new owner through the
        write-all phases, not through this iterator.
        """
        if max_entries < 1 or max_bytes < 1:
            raise ValueError("segment_chunks: max_entries and max_bytes must be at least 1")
        data = self.segments.get(segment)
        if not data:
            return
        # The two dicts iterate in the same order (Segment keeps them in step).
        keys = list(data.ver)
        all_versions = list(data.ver.values())
        all_values = list(data.val.values())
        if not tombstones and self.tombstones:
            live = [i for i, v in enumerate(all_values) if v is not None]
            keys = [keys[i] for i in live]
            all_versions = [all_versions[i] for i in live]
            all_values = [all_values[i] for i in live]
        total = len(keys)
        start = 0
        guess = max_entries  # entries that fit max_bytes, learnt from the previous chunk
        while start < total:
            end = min(total, start + guess)
            ks = keys[start:end]
            vals = all_values[start:end]
            size = sum(map(len, ks)) + sum(map(len, filter(None, vals))) + ENTRY_OVERHEAD * len(ks)
            shrunk = False
            while size > max_bytes and len(ks) > 1:
                # Shrink in proportion to the excess (at least one entry): sizes are alike, so this settles
                # in one or two rounds without a Python step per entry.
                m = max(1, min(len(ks) - 1, len(ks) * max_bytes // size))
                ks, vals = ks[:m], vals[:m]
                size = sum(map(len, ks)) + sum(map(len, filter(None, vals))) + ENTRY_OVERHEAD * m
                shrunk = True
            m = len(ks)
            yield ks, all_versions[start : start + m], vals
            start += m
            if shrunk:
                guess = m
            elif m == guess:
                guess = min(max_entries, guess + guess // 4 + 1)

    # -- statistics -----------------------------------------------------------------------------------------
    def __len__(self) -> int:
        """Live entries (tombstones not counted)."""
        return sum(len(d) for d in self.segments.values()) - self.tombstones

    def segment_size(self, segment: int) -> int:
        data = self.segments.get(segment)
        if not data:
            return 0
        return len(data) - (list(data.val.values()).count(None) if self.tombstones else 0)

    def items(self) -> Iterator[tuple[int, bytes, int, bytes]]:
        """Every live entry as (segment, key, version, value) (tests and checkers)."""
        for s, data in self.segments.items():
            for k, (ver, val) in data.items():
                if val is not None:
                    yield s, k, ver, val

    def describe(self) -> dict[str, Any]:
        return {
            "segments": len(self.segments),
            "entries": len(self),
            "tombstones": self.tombstones,
            "bytes": self.nbytes,
        }

    def count_bytes(self) -> int:
        """:attr:`nbytes` counted from scratch (tests and the simulator check the running count against it)."""
        return sum(_live_bytes(data) for data in self.segments.values())

    def _check_segment(self, segment: int) -> None:
        if not 0 <= segment < self.num_segments:
            raise ValueError(f"segment {segment} is outside [0, {self.num_segments - 1}]")
