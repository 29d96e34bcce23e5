"""GridConfig: a grid member's parameters (the ``grid.*`` keys of a stack file), checked when built."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...core.config import param, parse_params
from ..consistent_hash import DEFAULT_OWNERS, DEFAULT_SEGMENTS, MAX_OWNERS, MAX_SEGMENTS
from ..topology import PartitionHandling
from ..tx.config import LockingMode, TxConfig

MAX_CAPACITY = 1_000_000.0  # a member's capacity factor is in [0, MAX_CAPACITY]


@dataclass(frozen=True)
class GridConfig:
    num_segments: int = param(DEFAULT_SEGMENTS, "int", doc="segments of the key space (coordinator's wins)", minimum=1)
    num_owners: int = param(DEFAULT_OWNERS, "int", doc="copies of each segment (coordinator's wins)", minimum=1)
    capacity: float = param(1.0, "float", doc="this member's share of segments relative to others; 0 owns none")
    partition_handling: str = param(
        "deny_read_writes",
        "choice",
        choices=tuple(m.value for m in PartitionHandling),
        doc="what a partition that may have lost data or a majority still serves",
    )
    transfer_batch_entries: int = param(1000, "int", doc="most entries in one state-transfer batch", minimum=1)
    # Each chunk costs a round trip through both members' stacks whatever its size: 128 KiB chunks moved the same
    # data with 10-20% less CPU than 64 KiB ones, and one is still handled in well under a millisecond per step
    # (defer_transfer); a short window bounds what waits on the link (docs/grid.md, "Pacing").
    transfer_batch_bytes: int = param("128KiB", "size", doc="most bytes in one state-transfer batch", minimum=1)
    transfer_window: int = param(2, "int", doc="unacknowledged transfer batches in flight per stream", minimum=1)
    # A new owner paces what it receives by when it acknowledges chunks (docs/grid.md, "Pacing"): unpaced, the
    # transfer took every core of a 2-core machine and single writes waited 8-11x longer than on the idle grid.
    # The default is bench/grid_rebalance.py's trade-off there: 53 MB/s moved with a write p99 2.7-4.4x idle
    # (13 runs; 64 MiB/s: 57-61 MB/s, 3.7-6.2x; 48 MiB/s: 45 MB/s, 3.1-3.2x).
    transfer_rate: int = param(
        "56MiB", "size", doc="most state-transfer bytes per second into this member (0: no limit)", minimum=0
    )
    attempt_timeout: float = param("3s", "duration", doc="resend an operation not answered within this")
    op_timeout: float = param("30s", "duration", doc="fail an operation not completed within this")
    retry_backoff: float = param("20ms", "duration", doc="wait before retrying on an unchanged topology")
    recovery_timeout: float = param("3s", "duration", doc="new coordinator: wait this long for members' statuses")
    initial_cluster_size: int = param(
        1,
        "int",
        doc="members a coordinator waits for before it starts a new, empty grid (more than half of those started "
        "together: then two grids that never met cannot both start)",
        minimum=1,
    )
    max_queued: int = param(100_000, "int", doc="requests held for a topology not yet installed", minimum=1)
    max_entries: int = param(
        0,
        "int",
        doc="as a key's primary, refuse a PUT that would add a key while this member holds this many live entries "
        "or more (a soft bound: backups, state transfer and merge pushes never refuse; a transaction adding a key is "
        "rolled back); 0: no bound",
        minimum=0,
    )
    max_bytes: int = param(
        0,
        "size",
        doc="as a key's primary, refuse a PUT that would grow this member's live key and value bytes past this "
        "(a new key counts its key and value, an overwrite the growth of its value; deletes and shrinking "
        "overwrites always go through; soft, like max_entries); 0: no bound",
        minimum=0,
    )
    tombstone_grace: float = param(
        "10m",
        "duration",
        doc="keep a deletion's tombstone this long (then drop it once no rebalance or merge runs); 0 keeps them",
    )
    count_events: bool = param(
        False,
        "bool",
        doc="produce entry events (arrived, departed, written) even with no listener, to count them in /metrics "
        "(grid.events_<kind>); costs a copy of the columns per batch",
    )
    persistence: str = param(
        "none",
        "choice",
        choices=("none", "write_through"),
        doc="keep a local SQLite copy of this member's entries, written once per step (docs/grid.md, persistence)",
    )
    persistence_path: str = param(
        "",
        "str",
        doc="the SQLite file of persistence=write_through, or a directory: one file per bind address in it",
    )
    tx_locking: str = param(
        "optimistic", "choice", choices=tuple(m.value for m in LockingMode), doc="transactions' default locking mode"
    )
    tx_lock_timeout: float = param("10s", "duration", doc="a transaction's lock not granted within this fails")
    tx_timeout: float = param("30s", "duration", doc="a transaction not prepared within this rolls back")
    tx_test_hold_commit: bool = param(
        False,
        "bool",
        doc="fault injection for tests, never in production: an originator sends no commit after a unanimous YES "
        "(its participants stay prepared; kill it to make the transaction in doubt)",
    )
    tx_auto_resolve: bool = param(
        True,
        "bool",
        doc="the view coordinator resolves in-doubt transactions itself (commit if a member committed it, roll "
        "back if every member of its prepare-time view but the originator answered otherwise); off: only an "
        "operator does (groupcluster tx resolve)",
    )

    def __post_init__(self) -> None:
        from ...core.errors import ConfigError

        if not 1 <= self.num_segments <= MAX_SEGMENTS:
            raise ConfigError(f"grid.num_segments: {self.num_segments} is outside [1, {MAX_SEGMENTS}]")
        if not 1 <= self.num_owners <= MAX_OWNERS:
            raise ConfigError(f"grid.num_owners: {self.num_owners} is outside [1, {MAX_OWNERS}]")
        if not 0 <= self.capacity <= MAX_CAPACITY:
            raise ConfigError(f"grid.capacity: {self.capacity} is outside [0, 1000000]")
        if self.persistence == "write_through" and not self.persistence_path:
            raise ConfigError("grid.persistence_path: needed with persistence=write_through")
        if self.tombstone_grace < 0:
            raise ConfigError(f"grid.tombstone_grace: {self.tombstone_grace:g}s is negative (0 keeps tombstones)")

    @classmethod
    def from_dict(cls, params: dict[str, Any]) -> GridConfig:
        """Parse ``{"num_owners": 2, "attempt_timeout": "3s", ...}``; errors name the bad key."""
        return parse_params(cls, params, "grid")

    @property
    def mode(self) -> PartitionHandling:
        return PartitionHandling(self.partition_handling)

    def tx_config(self) -> TxConfig:
        """The transaction core's settings; unanswered transaction messages are re-sent after attempt_timeout."""
        return TxConfig(
            locking=self.tx_locking,
            lock_timeout=self.tx_lock_timeout,
            tx_timeout=self.tx_timeout,
            resend_interval=self.attempt_timeout,
        )
