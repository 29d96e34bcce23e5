"""A member's persistent copy of its grid entries: one SQLite file (stdlib ``sqlite3``, WAL), written through
once per step of the node (docs/grid.md, "Persistence").

:class:`PersistentStore` is the node's in-memory store (a :class:`~.feed.FeedStore`) that also records,
without any I/O, what changed in the step: the entries it applied (or received) and the segments it dropped.
:class:`SqliteBacking` writes such a record in one transaction; the runtime calls it after every step of the
node and *before* sending that step's payloads, so every acknowledgement a member sends (an owner's BACKUP
acknowledgement, the primary's answer) follows the commit of the write it acknowledges. With
``synchronous=NORMAL`` a committed transaction survives the process being killed (it is in the WAL file);
an operating-system crash or power loss may lose the last transactions.

The file holds ``entries(key, seg, version, value, expires)``, value NULL for a tombstone, expires the entry's
expiry as a Unix time (NULL: never; docs/grid.md, "Expiry"), and ``meta`` (the highest topology id this member
installed). Writes keep the newest version in SQL as in memory, so an entry received twice, or older than what
is stored, changes nothing. A new version clears the row's expiry, and the expiry of a version is set by a
separate update guarded by that version: the store records an expiry only for the version it holds, and so
does the file. Tombstones stay in the file until their segment is dropped (their expiry in memory is not
mirrored): after a full restart they still stop an older value. Files written before the expiry column get it
when opened (NULL: nothing in them expires).
"""

from __future__ import annotations

import logging
import os
import sqlite3
from collections.abc import Sequence
from typing import Any

from ..core.errors import ConfigError
from .feed import FeedStore
from .store import TransferEntry

log = logging.getLogger("groupcluster.grid.persist")

# One record of a step: ("put", rows) with rows (key, seg, version, value); ("expire", rows) with rows
# (expires, key, version); ("drop", seg); ("clear",) (both tables); ("stash",): move the entries to ``restored``
# (a restore's old rows, until its pushes are acknowledged); ("unstash",): delete those.
Op = tuple[Any, ...]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS entries (key BLOB PRIMARY KEY, seg INTEGER NOT NULL, version INTEGER NOT NULL, value BLOB,
    expires REAL) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS entries_seg ON entries (seg);
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS restored (key BLOB NOT NULL, version INTEGER NOT NULL, value BLOB, expires REAL);
"""
_LOAD = "SELECT key, version, value, expires FROM entries UNION ALL SELECT key, version, value, expires FROM restored"
# Newest version wins; a tie of different values (two partitions) goes to the greater value, a deletion
# counting least: the rule of SegmentStore.write. SQLite compares blobs with memcmp, as Python compares bytes.
_UPSERT = """
INSERT INTO entries (key, seg, version, value) VALUES (?, ?, ?, ?)
ON CONFLICT (key) DO UPDATE SET seg = excluded.seg, version = excluded.version, value = excluded.value,
    expires = NULL
WHERE excluded.version > entries.version
   OR (excluded.version = entries.version AND excluded.value IS NOT NULL
       AND (entries.value IS NULL OR excluded.value > entries.value))
"""
# The expiry of the version the row holds (a chunk or backup may bring one for a version since overwritten).
_EXPIRE = "UPDATE entries SET expires = ? WHERE key = ? AND version = ? AND value IS NOT NULL"


class PersistentStore(FeedStore):
    """A :class:`FeedStore` that records each change for the persistent copy (pure: :meth:`take_ops` hands the
    record to the driver). Entries of a transfer chunk are recorded whether or not they were applied: the SQL
    upsert keeps the newest version, as the store did."""

    __slots__ = ("_expire_rows", "_ops", "_rows")

    def __init__(self, num_segments: int, max_entries: int, max_bytes: int) -> None:
        super().__init__(num_segments, max_entries, max_bytes)
        self._ops: list[Op] = []
        self._rows: list[tuple[bytes, int, int, bytes | None]] | None = None
        self._expire_rows: list[tuple[float, bytes, int]] | None = None

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

    def set_expiry(self, segment: int, key: bytes, version: int, expires: float) -> None:
        super().set_expiry(segment, key, version, expires)
        # Recorded whether or not the store took it: the update is guarded by the version, as the store is. It
        # runs after every put recorded so far in the step (their list comes first in the record), and a put of
        # a newer version recorded after it only clears what it set.
        rows = self._expire_rows
        if rows is None:
            rows = self._expire_rows = []
            self._ops.append(("expire", rows))
        rows.append((expires, key, version))

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
        self._rows = self._expire_rows = None  # later puts and expiries go after the drop
        self._ops.append(("drop", segment))
        return n

    def reset_backing(self) -> None:
        self._rows = self._expire_rows = None
        self._ops.append(("clear",))

    def stash_backing(self) -> None:
        self._rows = self._expire_rows = None
        self._ops.append(("stash",))

    def drop_stash(self) -> None:
        self._rows = self._expire_rows = None
        self._ops.append(("unstash",))

    def take_ops(self) -> list[Op]:
        ops, self._ops, self._rows, self._expire_rows = self._ops, [], None, None
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
            self._add_expiry_columns()
        except sqlite3.DatabaseError as exc:
            raise ConfigError(f"grid.persistence_path: {path!r} is not a usable SQLite file: {exc}") from exc
        self.topology_id = self._meta("topology_id")
        self.rows_written = 0
        self.transactions = 0

    def _add_expiry_columns(self) -> None:
        """A file written before expiries were kept gets their column (NULL: its entries never expire)."""
        for table in ("entries", "restored"):
            columns = {row[1] for row in self.db.execute(f"PRAGMA table_info({table})")}
            if "expires" not in columns:
                self.db.execute(f"ALTER TABLE {table} ADD COLUMN expires REAL")

    def _meta(self, name: str) -> int:
        row = self.db.execute("SELECT value FROM meta WHERE name = ?", (name,)).fetchone()
        return int(row[0]) if row else 0

    def load(self) -> tuple[list[TransferEntry], dict[tuple[bytes, int], float]]:
        """Every stored entry as ``(key, version, value or None)``, with those set aside by a restore whose
        pushes did not all finish (a key may come twice: the node keeps the newest), and the expiries of those
        that expire, by ``(key, version)``."""
        entries: list[TransferEntry] = []
        expiries: dict[tuple[bytes, int], float] = {}
        for k, v, val, expires in self.db.execute(_LOAD):
            key, version = bytes(k), int(v)
            entries.append((key, version, None if val is None else bytes(val)))
            if expires is not None and val is not None:
                expiries[key, version] = float(expires)
        return entries, expiries

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
                elif op[0] == "expire":
                    db.executemany(_EXPIRE, op[1])
                elif op[0] == "drop":
                    db.execute("DELETE FROM entries WHERE seg = ?", (op[1],))
                elif op[0] == "stash":
                    db.execute("INSERT INTO restored SELECT key, version, value, expires FROM entries")
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
