"""The stream's reads of the grid's member-side change feed (``GET /v1/changes/{segment}``).

A member logs, per segment, every write it applies (puts, deletes, each overwrite) and answers the writes
after a version, in version order, up to a *stable* point (``upto``) below which no write can still arrive
there. Its log starts at a ``floor`` (a segment it fetched starts at the topology it fetched under; a full
log drops its oldest entries): a reader whose offset lies below the floor is told ``covered: false``.

* :func:`segment_end` (driver, ``latestOffset``): how far the stream may advance a segment now: the feed's
  ``upto``. Where the log does not reach back to the offset, the part below the floor is read by scan and the
  feed continues from the floor, so the end is still the feed's ``upto`` from there.
* :func:`segment_range` (task): the writes in ``(lo, hi]`` in version order. The part the log covers comes
  from the log, entry by entry; a part below the log's floor comes from a scan of the segment (entries whose
  current version lies in the range: the state at that point, not every change; documented in
  docs/spark.md). A member whose feed has not reached ``hi`` yet (a backup owner a little behind the one the
  driver asked) is asked again until it has, within the ``timeout`` option.

The same ``(lo, hi]`` read twice gives the same writes while the serving member's log still covers ``lo``,
which is what makes a micro-batch replayed after a restart deliver what the first attempt did.
"""

from __future__ import annotations

import time

from .gridio import GridIO, GridSourceError

# (key, value or None for a deletion, version): a change as the stream delivers it.
Change = tuple[bytes, bytes | None, int]
NO_LOG = 1 << 62  # a floor this high: the member holds no log for the segment (read it all by scan)


def _scan_max(io: GridIO, segment: int, owner: str | None) -> int:
    top = 0
    for page in io.scan_segment(segment, prefer=owner):
        top = max(top, max(e[2] for e in page))
    return top


def segment_end(io: GridIO, segment: int, lo: int, owner: str | None) -> int:
    """The version up to which segment ``segment`` can be delivered now, starting from offset ``lo``."""
    after = lo
    target = owner
    for _ in range(4):  # a floor that moves while we page (a busy, truncating log) is re-read a few times
        page, target = io.changes(segment, after, target)
        if not page["covered"]:
            floor = page["floor"]
            if floor >= NO_LOG:
                return max(lo, _scan_max(io, segment, target))
            after = max(after, floor)
            continue
        while True:
            after = max(after, page["upto"])
            if not page["more"]:
                return after
            page, target = io.changes(segment, after, target)
            if not page["covered"]:
                break  # truncated under us: start over from the new floor
    raise GridSourceError(f"segment {segment}: the change feed's log kept moving past the reader; try again")


def segment_range(io: GridIO, segment: int, lo: int, hi: int, owner: str | None) -> list[Change]:
    """The changes of ``segment`` with versions in ``(lo, hi]``, in version order."""
    out: list[Change] = []
    cursor = lo
    target = owner
    deadline = time.monotonic() + io.opts.timeout
    while cursor < hi:
        page, target = io.changes(segment, cursor, target)
        if not page["covered"]:
            floor = min(page["floor"], hi)
            # Below the log: what the segment holds now with a version in the gap (the state at the floor).
            snap = [(k, v, ver) for p in io.scan_segment(segment, prefer=target) for k, v, ver in p]
            part = sorted((e for e in snap if cursor < e[2] <= floor), key=lambda e: e[2])
            out.extend(part)
            io.stats["feed_scanned"] = io.stats.get("feed_scanned", 0) + 1
            cursor = floor
            continue
        moved = False
        for ver, key, value in page["entries"]:
            if ver > hi:
                break
            if ver > cursor:
                out.append((key, value, ver))
                cursor = ver
                moved = True
        upto = min(page["upto"], hi)
        if upto > cursor:
            cursor = upto
            moved = True
        if not moved and not page["more"]:
            # This owner has not applied (or not yet declared stable) what the driver saw elsewhere.
            if time.monotonic() >= deadline:
                raise GridSourceError(
                    f"segment {segment}: the change feed of {target} stayed at version {cursor} below the "
                    f"batch's end {hi} for {io.opts.timeout} s"
                )
            time.sleep(0.05)
    return out
