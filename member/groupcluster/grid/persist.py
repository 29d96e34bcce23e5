"""A member's persistent copy of its grid entries: one SQLite file (stdlib ``sqlite3``, WAL), written through
once per step of the node (docs/grid.md, "Persistence").

:class:`PersistentStore` is the node's in-memory store (a :class:`~.runtime.FeedStore`) that also records,
without any I/O, what changed in the step: the entries it applied (or received) and the segments it dropped.
:class:`SqliteBacking` writes such a record in one transaction; the runtime calls it after every step of the
node and *before* sending that step's payloads, so every acknowledgement a member sends (an owner's BACKUP
acknowledgement, the primary's answer) follows the commit of the write it acknowledges. With
``synchronous=NORMAL`` a committed transaction survives the process being killed (it is in the WAL file);
an operating-system crash or power loss may lose the last transactions.

The file holds ``entries(key, seg, version, value)``, value NULL for a tombstone, and ``meta`` (the highest
topology id this member installed). Writes keep the newest version in SQL as in memory, so an entry received
twice, or older than what is stored, changes nothing. Tombstones stay in the file until their segment is
dropped (their expiry in memory is not mirrored): after a full restart they still stop an older value.
"""

from __future__ import annotations

import logging
import os
import sqlite3
from collections.abc import Sequence
from typing import Any

from ..core.errors import ConfigError
from .runtime import FeedStore
from .store import TransferEntry

log = logging.getLogger("groupcluster.grid.persist")

# One record of a step: ("put", rows) with rows (key, seg, version, value); ("drop", seg); ("clear",) (both
# tables); ("stash",): move the entries to ``restored`` (a restore's old rows, until its pushes are
# acknowledged); ("unstash",): delete those.
Op = tuple[Any, ...]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS entries (key BLOB PRIMARY KEY, seg INTEGER NOT NULL, version INTEGER NOT NULL, value BLOB)
    WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS entries_seg ON entries (seg);
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS restored (key BLOB NOT NULL, version INTEGER NOT NULL, value BLOB);
"""
_LOAD = "SELECT key, version, value FROM entries UNION ALL SELECT key, version, value FROM restored"
# Newest version wins; a tie of different values (two partitions) goes to the greater value, a deletion
# counting least: the rule of SegmentStore.write. SQLite compares blobs with memcmp, as Python compares bytes.
_UPSERT = """
INSERT INTO entries (key, seg, version, value) VALUES (?, ?, ?, ?)
ON CONFLICT (key) DO UPDATE SET seg = excluded.seg, version = excluded.version, value = excluded.value
WHERE excluded.version > entries.version
   OR (excluded.version = entries.version AND excluded.value IS NOT NULL
       AND (entries.value IS NULL OR excluded.value > entries.value))
"""


class PersistentStore(FeedStore):
    """A :class:`FeedStore` that records each change for the persistent copy (pure: :meth:`take_ops` hands the
    record to the driver). Entries of a transfer chunk are recorded whether or not they were applied: the SQL
    upsert keeps the newest version, as the store did."""

    __slots__ = ("_ops", "_rows")

    def __init__(self, num_segments: int, max_entries: int, max_bytes: int) -> None:
        super().__init__(num_segments, max_entries, max_bytes)
        self._ops: list[Op] = []
        self._rows: list[tuple[bytes, int, int, bytes | None]] | None = None

    def _put_rows(self) -> list[tuple[bytes, int, int, bytes | None]]:
        rows = self._rows
        if rows is None:
            rows = self._rows = []
            self._ops.append(("put", rows))
        return rows

    def write(self, segment: int, key: bytes, version: int, value: bytes | None, *, now: float = 0.0) -> bool:
        applied = super().write(segment, key, version, value, now=now)
        if applied:
            self._put_rows().append((key, segment, version, value))
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
        applied = super().apply_chunk(segment, keys, versions, values, now=now)
        self._put_rows().extend(zip(keys, [segment] * len(keys), versions, values, strict=True))
        return applied

    def remove_segment(self, segment: int) -> int:
        n = super().remove_segment(segment)
        self._rows = None  # later puts go after the drop
        self._ops.append(("drop", segment))
        return n

    def reset_backing(self) -> None:
        self._rows = None
        self._ops.append(("clear",))

    def stash_backing(self) -> None:
        self._rows = None
        self._ops.append(("stash",))

    def drop_stash(self) -> None:
        self._rows = None
        self._ops.append(("unstash",))

    def take_ops(self) -> list[Op]:
        ops, self._ops, self._rows = self._ops, [], None
        return ops


class SqliteBacking:
    """The SQLite file of one member. Not thread-safe: the runtime uses it from the event loop only."""

    def __init__(self, path: str) -> None:
        if not path:
            raise ConfigError("grid.persistence_path: empty (write_through needs a file path)")
        parent = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(parent):
            raise ConfigError(f"grid.persistence_path: directory {parent!r} does not exist")
        self.path = path
        try:
            self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=NORMAL")
            self.db.executescript(_SCHEMA)
        except sqlite3.DatabaseError as exc:
            raise ConfigError(f"grid.persistence_path: {path!r} is not a usable SQLite file: {exc}") from exc
        self.topology_id = self._meta("topology_id")
        self.rows_written = 0
        self.transactions = 0

    def _meta(self, name: str) -> int:
        row = self.db.execute("SELECT value FROM meta WHERE name = ?", (name,)).fetchone()
        return int(row[0]) if row else 0

    def load(self) -> list[TransferEntry]:
        """Every stored entry as ``(key, version, value or None)``, with those set aside by a restore whose
        pushes did not all finish (a key may come twice: the node keeps the newest)."""
        return [(bytes(k), int(v), None if val is None else bytes(val)) for k, v, val in self.db.execute(_LOAD)]

    def count(self) -> int:
        return int(self.db.execute("SELECT count(*) FROM entries").fetchone()[0])

    def apply(self, ops: list[Op], topology_id: int) -> None:
        """Write one step's record (and the installed topology id, when it grew) in one transaction."""
        if not ops and topology_id <= self.topology_id:
            return
        db = self.db
        db.execute("BEGIN")
        try:
            for op in ops:
                if op[0] == "put":
                    # A version above SQLite's signed 64 bits (a topology id beyond 2**23) raises OverflowError
                    # here: the transaction rolls back and the runtime logs and counts it.
                    db.executemany(_UPSERT, op[1])
                    self.rows_written += len(op[1])
                elif op[0] == "drop":
                    db.execute("DELETE FROM entries WHERE seg = ?", (op[1],))
                elif op[0] == "stash":
                    db.execute("INSERT INTO restored SELECT key, version, value FROM entries")
                    db.execute("DELETE FROM entries")
                elif op[0] == "unstash":
                    db.execute("DELETE FROM restored")
                else:
                    db.execute("DELETE FROM entries")
                    db.execute("DELETE FROM restored")
            if topology_id > self.topology_id:
                db.execute(
                    "INSERT INTO meta (name, value) VALUES ('topology_id', ?) "
                    "ON CONFLICT (name) DO UPDATE SET value = excluded.value",
                    (topology_id,),
                )
                self.topology_id = topology_id
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        self.transactions += 1

    def close(self) -> None:
        self.db.close()
