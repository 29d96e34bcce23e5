"""One grid member as a sans-IO state machine: routing, replication, state transfer, rebalancing, leaving.

The node never touches sockets, threads, real time or the global random: the driver hands it views
(:meth:`GridNode.on_view`), delivered payloads (:meth:`GridNode.on_messages`), the time (``now`` on every
call, :meth:`GridNode.tick` at :meth:`GridNode.next_deadline`) and client operations
(:meth:`GridNode.get`/``put``/``delete``); it answers with payloads to send (:meth:`GridNode.take_outbox`:
``dest`` None is a multicast to the view) and finished operations (:meth:`GridNode.take_results`).

What happens on the wire (see docs/grid.md for the full picture):

* after every view change each member sends its STATUS (capacity, leave request, last topology) to the
  coordinator; the coordinator's :class:`~.topology.RebalancePlanner` turns statuses, views and
  confirmations into topologies it multicasts;
* a client operation becomes a CMD tagged with the originator's topology id, sent to the write primary
  (PUT/DELETE) or a read owner (GET). An owner whose topology is newer answers RETRY and the originator tries
  again on the owners of the newer topology; an owner whose topology is older holds the command until it
  catches up. The primary stamps a version, applies, sends BACKUP to every other write owner and answers
  only when all acknowledged, so an acknowledged write is on every owner. Operations started in one step
  (:meth:`GridNode.start_batch`) travel as one CMD_BATCH per owner, and their backups, acknowledgements and
  answers as one batch message per destination too, each entry handled as its single message would be;
* a new owner pulls each segment from a current owner (FETCH, then XFER_DATA batches with a window of
  acknowledgements), applies batches "newest version wins", and confirms to the coordinator once it holds
  all its new segments; old owners drop segments only once a topology without them is installed.

Transactions (docs/grid-transactions.md): the node owns one participant table (:class:`~.tx.TxTable`, on
its store) and one originator (:class:`~.tx.TxCoordinator`, routed by the write owners of its topology); the
seven two-phase-commit messages and TX_INFO_ACK share the grid payload. Where the write primary of a segment
changes between two topologies the new primary blocks lock acquisition there (and promotes its backup locks)
until the old primary's lock information arrives, which the old primary re-sends until it is acknowledged. A
plain PUT/DELETE on a key a transaction holds fails at once (reason ``locked``).
"""

from __future__ import annotations

import dataclasses
import heapq
import logging
import math
from collections import Counter, OrderedDict, deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..core.address import Address
from ..core.config import param, parse_params
from ..core.errors import WireError
from .consistent_hash import DEFAULT_OWNERS, DEFAULT_SEGMENTS, MAX_OWNERS, MAX_SEGMENTS, segment_of, segments_of
from .messages import (
    BATCH_MAX_ENTRIES,
    DEFAULT_LIMITS,
    DELETE,
    ERROR,
    GET,
    NOT_FOUND,
    OK,
    PUT,
    RETRY,
    Backup,
    BackupAck,
    BackupAckBatch,
    BackupBatch,
    Command,
    CommandBatch,
    Confirm,
    EntryChunk,
    Fetch,
    GridLimits,
    GridMessage,
    Response,
    ResponseBatch,
    Status,
    Topology,
    XferAck,
    XferCancel,
    XferData,
    XferFail,
    decode_payload,
    encode_payload,
)
from .store import (
    SEQ_BITS,
    Columns,
    SegmentStore,
    TransferEntry,
    make_version,
    next_seq,
    tie_wins,
    version_seq,
)
from .topology import (
    MAX_LOST,
    Availability,
    CacheTopology,
    MemberStatus,
    PartitionHandling,
    Phase,
    RebalancePlanner,
    owner_set,
)
from .tx import (
    REASON_CONFLICT,
    REASON_ERROR,
    REASON_FULL,
    REASON_LOCK_TIMEOUT,
    REASON_LOCKED,
    REASON_MIXED,
    REASON_ROLLED_BACK,
    REASON_TIMEOUT,
    REASON_UNAVAILABLE,
    CoordState,
    InDoubt,
    LockingMode,
    ResolverOutput,
    TxConfig,
    TxCoordinator,
    TxDecided,
    TxLocked,
    TxOutcome,
    TxOutput,
    TxReport,
    TxResolver,
    TxSend,
    TxState,
    TxTable,
    decision,
    report_info,
    resolution,
)
from .tx_messages import (
    NO,
    TxAck,
    TxCommit,
    TxId,
    TxInfoAck,
    TxLock,
    TxLockInfo,
    TxPrepare,
    TxReportAnswer,
    TxReportInfo,
    TxReportRequest,
    TxRollback,
    TxVote,
    VersionedWrite,
)
from .tx_messages import approx_size as _tx_approx_size

log = logging.getLogger("groupcluster.grid")

MAX_PAYLOAD_SPLIT = 1024 * 1024  # a payload is cut near this size (the transport fragments beyond its MTU)
# Entries of dropped segments freed per slice (SegmentStore.collect), at most one slice per FREE_INTERVAL.
# A slice of 2,048 cost ~1 ms of CPU; freed on every step, back to back, the three old owners of a 1M-entry
# rebalance each spent ~80 ms of CPU in a row after the last topology, on a 2-core machine with the joiner
# and the writer, and single writes there took 10-25 ms (issue 4). Paced, freeing takes ~10% of a core
# (~1.2 s for a member's ~250,000 entries and feed-log entries) and operations find the CPUs free.
FREE_PER_STEP = 1024
FREE_INTERVAL = 0.005
# Topologies whose routes a member keeps for writes that span a topology change (GridNode._kept_owners):
# a rebalance installs four in a row, and a write in flight spans at most a few.
_RECENT_TOPOLOGIES = 8
# Transfer chunks applied or produced per step while operations may be waiting (see GridNode.defer_transfer).
DEFERRED_CHUNKS_PER_STEP = 1
XFER_OVERHEAD = 64  # bytes a chunk's message costs beyond its packed entries (pacing; approximate)

# OpResult.kind of the transaction calls (never on the wire: operations on the wire are GET, PUT, DELETE).
TX_LOCK_OP, TX_COMMIT_OP, TX_ROLLBACK_OP = 16, 17, 18
TX_RESOLVE_OP = 19  # tx_resolve_all: value b"commit" or b"rollback" when ok
# Request ids of tx_resolve_all's report requests: apart from the resolver's rounds, which count from 1.
_QUERY_IDS = 1 << 48
_TX_DONE_KEPT = 10_000  # finished transactions remembered for late calls (tx_commit after a rollback)
_TX_KINDS: frozenset[type] = frozenset(
    (TxLock, TxPrepare, TxVote, TxCommit, TxRollback, TxAck, TxLockInfo, TxInfoAck, TxReportRequest, TxReportAnswer)
)


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
        from ..core.errors import ConfigError

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


# Entry event kinds (docs/grid.md, "Entry events"): entries that came here by state transfer, entries of
# segments this member dropped at the end of a rebalance, and writes this member applied as an owner.
EVENT_ARRIVED, EVENT_DEPARTED, EVENT_WRITTEN = "arrived", "departed", "written"
EVENT_KINDS = frozenset((EVENT_ARRIVED, EVENT_DEPARTED, EVENT_WRITTEN))


@dataclass(frozen=True, slots=True)
class EntryEvents:
    """A batch of entry events of one kind, as columns (one object per batch, never one per entry).

    ``keys[i]``, ``versions[i]``, ``values[i]`` describe one entry; a value None is a deletion (a tombstone moved
    or dropped, or a removal written). ``segment`` is the one segment of an ``arrived``/``departed`` batch and -1
    for ``written`` (keys of any segment). ``topology_id``: the topology installed when it happened. The columns
    may be the node's own lists: listeners must not change them.
    """

    kind: str
    segment: int
    topology_id: int
    keys: Sequence[bytes]
    versions: Sequence[int]
    values: Sequence[bytes | None]

    def __len__(self) -> int:
        return len(self.keys)

    def entries(self) -> Iterator[tuple[bytes, int, bytes | None]]:
        """``(key, version, value or None)`` per entry."""
        return zip(self.keys, self.versions, self.values, strict=True)


@dataclass(frozen=True, slots=True)
class Outgoing:
    """A payload for the group: ``dest`` None is a multicast to the view (the sender may ignore its copy)."""

    dest: Address | None
    payload: bytes


# Not frozen, to be treated as read-only: one is made per operation, and a frozen dataclass's __init__ cost
# ~1.1 us against ~0.2 us (its field assignments go through object.__setattr__), ~6% of a member's CPU in
# Spark batch writes (issue 7).
@dataclass(slots=True)
class OpResult:
    """A finished client operation. ``ok`` False carries ``error``; a GET of an absent key is ok, value None."""

    op_id: int
    kind: int
    key: bytes
    ok: bool
    value: bytes | None = None
    error: str = ""
    attempts: int = 1
    # GET: the version of the entry read (0 when absent); a transaction's read version for optimistic checks.
    version: int = 0
    # ok False: a stable machine-readable reason (the REASON_* strings above).
    reason: str = ""
    tx: TxId | None = None  # the transaction of a TX_*_OP result


# Expiry (docs/grid.md, "Expiry"): entries removed per step at most (a mass expiry is spread over steps, as a
# large drop is), and when a member that is not an expired entry's primary looks again (the primary removes
# it; if the primary died first, we may be the new one by then).
EXPIRE_PER_STEP = 500
EXPIRY_RECHECK = 1.0


def _check_expires(expires: object, field: str) -> None:
    if type(expires) is not float or not 0.0 <= expires < math.inf:
        raise ValueError(f"{field}: expected a Unix time as a float (0.0: never), got {expires!r}")


_NO_CUTOFF = float("inf")
_CUTOFF_ERROR = "timed out: the request's deadline passed"
_PRIMARY_CUTOFF_ERROR = _CUTOFF_ERROR + " before the key's primary owner could apply it"


class _Op:
    __slots__ = (
        "attempt",
        "cutoff",
        "deadline",
        "expires",
        "key",
        "kind",
        "not_before",
        "nseg",
        "op_id",
        "resend_at",
        "seg",
        "target",
        "topology_id",
        "value",
    )

    def __init__(self, op_id: int, kind: int, key: bytes, value: bytes | None, deadline: float) -> None:
        self.op_id = op_id
        self.kind = kind
        self.key = key
        self.deadline = deadline
        self.attempt = 0
        self.target: Address | None = None
        self.topology_id = 0  # the topology of the attempt in flight; 0 while waiting
        self.resend_at = 0.0
        # Waiting to be (re)sent: until our topology id reaches ``not_before[0]`` and time ``not_before[1]``.
        self.not_before: tuple[int, float] | None = (0, 0.0)
        self.value = value
        self.seg = 0  # segment_of(key, nseg), computed for the first topology that routes the operation
        self.nseg = 0
        # The client's deadline (node time; inf: none): no attempt is sent at or after it (see _send_op).
        self.cutoff = _NO_CUTOFF
        self.expires = 0.0  # a PUT's expiry as a Unix time (0.0: none), stamped by its originator


class _PendingWrite:
    """A write this member stamped and applied, not yet on every write owner (see :meth:`GridNode._redrive`)."""

    __slots__ = (
        "attempt",
        "awaiting",
        "expires",
        "key",
        "merge",
        "op_id",
        "origin",
        "topology_id",
        "value",
        "version",
    )

    def __init__(
        self,
        origin: Address,
        op_id: int,
        attempt: int,
        topology_id: int,
        awaiting: set[Address],
        key: bytes,
        version: int,
        value: bytes | None,
        *,
        merge: bool = False,
        expires: float = 0.0,
    ) -> None:
        self.origin = origin
        self.op_id = op_id
        self.attempt = attempt
        self.topology_id = topology_id  # 0: re-send under the next topology installed
        self.awaiting = awaiting
        self.key = key
        self.version = version
        self.value = value
        # A merge push (:meth:`GridNode._push_entries`). Like a write whose client was already answered (op_id
        # 0), nobody waits for it; unlike that one, it keeps ``GridNode.merging`` True until it is done.
        self.merge = merge
        self.expires = expires  # the entry's expiry as a Unix time (0.0: none), sent with every copy


class _Routes:
    """Per-segment routing answers of one topology, computed once: a topology never changes, and every
    operation asks them on the originator, the primary and each backup (they showed up in profiles)."""

    __slots__ = ("can_read", "can_write", "i_read", "i_write", "primary", "read", "topology", "write")

    def __init__(self, t: CacheTopology, me: Address) -> None:
        self.topology = t
        table = t.routing_table(me)
        self.read = [r.read for r in table]
        self.write = [r.write for r in table]
        self.can_read = [r.can_read for r in table]
        self.can_write = [r.can_write for r in table]
        # This member's part per segment (asked per operation; address comparisons are Python calls).
        self.i_read = [r.i_read for r in table]
        self.i_write = [r.i_write for r in table]
        self.primary = [r.primary for r in table]


def _fetching(t: CacheTopology, seg: int) -> set[Address]:
    """Owners that pull ``seg`` in ``t`` (pending but not current owners): their copy starts empty."""
    if t.pending is None:
        return set()
    return set(t.pending.owners_of(seg)) - set(t.current.owners_of(seg))


class _InXfer:
    __slots__ = ("remaining", "source")

    def __init__(self, source: Address, segments: Iterable[int]) -> None:
        self.source = source
        self.remaining = set(segments)


class _OutXfer:
    __slots__ = ("batches", "unacked")

    def __init__(self, batches: Iterator[XferData]) -> None:
        self.batches = batches
        self.unacked = 0


# Client operations, backups and their answers: handled at once even while transfer messages are held back
# (see GridNode.defer_transfer).
_OPERATION_KINDS = frozenset(
    {Command, CommandBatch, Response, ResponseBatch, Backup, BackupBatch, BackupAck, BackupAckBatch}
)


class GridNode:
    """A grid member. Feed it views, payloads, time and operations; collect payloads and results."""

    def __init__(
        self,
        address: Address,
        config: GridConfig | None = None,
        *,
        limits: GridLimits = DEFAULT_LIMITS,
    ) -> None:
        self.address = address
        self.config = config or GridConfig()
        self.limits = limits
        self.view: tuple[Address, ...] = ()
        self.topology: CacheTopology | None = None
        self.store: SegmentStore | None = None
        self.planner: RebalancePlanner | None = None
        self.leaving = False
        self.ready_to_leave = False
        # Set once we are in a view another member created (we joined its group): from then on an empty grid
        # of our own would be a split brain, so our planner may not start one (RebalancePlanner.may_start_grid).
        self._joined_others = False
        # Owners of our topology that left our view without handing their segments off (crashed, or cut off
        # behind a partition): until they are back, leaving "because nobody can take our segments" could
        # drop the only copy of writes they never saw (seed 591). See _no_taker.
        self._vanished_owners: set[Address] = set()
        # member -> segment -> [lowest version, last time] of the Backups it made us apply (see _repair_after).
        self._stamped_by: dict[Address, dict[int, list[float]]] = {}
        self.metrics: Counter[str] = Counter()
        self._now = 0.0
        # max_entries and max_bytes: the live entries and their key and value bytes counted at ``_entries_at`` (a
        # step's time), plus what PUTs added since; ``_full_bound`` names the bound the last refusal met.
        self._entries = 0
        self._bytes = 0
        self._entries_at = -1.0
        self._full_bound = "max_entries"
        # Wall-clock seconds minus the ``now`` we are given (the driver's clock may be monotonic): the sequence
        # part of the versions we stamp is at least the wall clock in milliseconds (store.next_seq), so a
        # version dates its write and the merge of two grids that never met keeps the later write (docs/grid.md).
        # 0 (unit tests): sequences count from 1.
        self.wall_offset = 0.0
        self._seq: dict[int, int] = {}  # segment -> the last sequence we stamped for it
        self._next_op = 1
        self._next_write = 1
        self._next_xfer = 1
        self._ops: dict[int, _Op] = {}
        self._writes: dict[int, _PendingWrite] = {}
        self._queued: deque[tuple[float, int, Address, GridMessage]] = deque()
        self._in_xfers: dict[int, _InXfer] = {}
        self._out_xfers: dict[tuple[Address, int], _OutXfer] = {}
        self._xfer_rebalance = -1  # the rebalance our fetch state belongs to
        self._fetch_started: set[int] = set()  # segments cleared and (being) fetched in that rebalance
        self._fetched: set[int] = set()
        self._fetch_tries: Counter[int] = Counter()
        self._refetch_at: float | None = None
        # Pacing (transfer_rate): when the next chunk may be acknowledged, and acknowledgements held until then
        # as (due time, source, transfer id); streams whose window has room for another chunk in a later step.
        self._ack_at = 0.0
        self._acks_due: deque[tuple[float, Address, int]] = deque()
        self._pumps: deque[tuple[Address, int]] = deque()
        self._collect_at = 0.0  # when the next slice of dropped segments may be freed (see FREE_INTERVAL)
        self._confirmed_id = 0
        self._statuses_in: dict[Address, MemberStatus] = {}
        # Set by a merge view while our topology was available: our entries may conflict with what the other
        # partition wrote, so we push them to the owners of the first topology the merged group installs.
        self._merge_from: int | None = None
        # Set by any merge view to the topology id we had: until the merged group's first topology arrives
        # we hold client commands, because our topology may be the other partition's (docs/grid.md, merges).
        self._merge_hold: int | None = None
        # The members of the merge view we were not in a view with before it (the other partitions). A
        # topology of the merged group names us and some of them; one our old group's coordinator sent before
        # the merge can still arrive after the merge view, with an id above ours, and must not end the hold or
        # take our merge push: its owners are our side's, and the merged group may continue the other side's
        # topology, dropping what the push left with them (seed 19). See _merged_topology.
        self._merge_others: set[Address] = set()
        self._early_statuses: dict[Address, MemberStatus] = {}
        self._routes_cache: _Routes | None = None
        # Routes of the topologies installed since the last view change (available ones only, the last few):
        # a write of a segment whose write owners a later one left unchanged stays in its round (see
        # _kept_owners). Cleared by every view change, so the rule never spans one (merges included).
        self._recent_routes: dict[int, _Routes] = {}
        self._to_fetch_cache: tuple[CacheTopology, frozenset[int]] | None = None
        # Resend and retry-backoff times of operations, as set (stale entries are skipped): runs
        # ``[time, seq, first op id, last op id]`` of operations sharing one time. The operations of a batch
        # are sent in one step with consecutive ids, so a batch is one heap entry, not one per operation (a
        # push and a pop per operation were ~4% of a member's CPU under batch writes). ``seq`` orders runs
        # of one time; ``first`` moves up as the run's front operations finish (see next_deadline).
        self._op_timers: list[list[Any]] = []
        self._timer_seq = 0
        self._timer_run: list[Any] | None = None  # the run last pushed by _send_op, which the next may extend
        # Client deadlines of operations started with one, as ``(deadline, first op id, last op id)``: a batch
        # shares one entry. Entries of operations that finished earlier are skipped when due.
        self._cutoffs: list[tuple[float, int, int]] = []
        self._loop: deque[tuple[Address, GridMessage]] = deque()
        # Transfer work waits behind operations. With ``defer_transfer``, :meth:`on_messages` handles client
        # operations, backups and their answers at once and holds back transfer chunks (XFER_DATA, applied
        # later) and their acknowledgements (XFER_ACK, which produce the next chunk); :meth:`next_deadline`
        # asks for a step at once and each :meth:`tick` handles them in arrival order until one chunk was
        # applied or produced. So a write's backup or answer leaves before the transfer work of its step, and
        # a driver's other inputs (the next delivered batch, HTTP requests) wait behind one chunk, not all
        # chunks of a delivered batch: with 4 members on 2 cores, single writes during a rebalance waited
        # behind 1-2 ms of chunk work per hop (issue 4). Every other message that arrives while some are held
        # back queues behind them, in order, so a chunk is never overtaken by a topology, a fetch or a cancel
        # (see _pump, seed 39); a view change first handles everything held back. Operations may overtake
        # chunks: stores keep the newest version whichever comes first, and an operation sent after a
        # topology carries its id, so it waits for that topology (_hold) as if it had arrived before it.
        self.defer_transfer = True
        self._deferred: deque[tuple[Address, GridMessage]] = deque()
        self._out: dict[Address | None, list[GridMessage]] = {}
        self._outbox: list[Outgoing] = []
        self._results: list[OpResult] = []
        # -- transactions (docs/grid-transactions.md)
        tcfg = self.tx_config = self.config.tx_config()
        self.tx = TxTable(
            address,
            tcfg,
            segment_of=self._tx_segment,
            version_of=self._tx_version,
            stamp=self._tx_stamp,
            apply=self._tx_apply,
            room=self._tx_room if self.config.max_entries or self.config.max_bytes else None,
        )
        self.txc = TxCoordinator(address, self._tx_route, tcfg)
        self.txr = TxResolver(address, tcfg)  # automatic resolution of in-doubt transactions, on the coordinator
        self.txr.enabled = self.config.tx_auto_resolve
        # The lock table's own containers (never replaced, only changed in place), for the plain write path's
        # checks: one truth test each while no transaction runs here.
        self._tx_locked = self.tx.locks._locks
        self._tx_blocked = self.tx.locks._blocked
        self._tx_lock_ops: dict[TxId, int] = {}  # transaction -> the op id of its pending tx_lock
        self._tx_end_ops: dict[TxId, tuple[int, int]] = {}  # transaction -> (op id, kind) of tx_commit/tx_rollback
        self._tx_done: OrderedDict[TxId, tuple[bool, str]] = OrderedDict()  # finished here: (committed, reason)
        # Lock information this member pushed, re-sent until the new primary acknowledges it:
        # (dest, topology id, segments) -> [message, next resend time].
        self._tx_pushes: dict[tuple[Address, int, tuple[int, ...]], list[Any]] = {}
        # Segments this member became the write primary of and whose lock information it waits for, with the
        # member expected to push it (the previous primary) and since when; unblocked when any push for them
        # arrives, or at once if that member leaves the view.
        self._tx_awaiting: dict[int, tuple[Address, float]] = {}
        self._tx_info_held: list[tuple[Address, TxLockInfo]] = []  # pushed for a topology not installed yet
        self._tx_info_seen: OrderedDict[tuple[Address, int, tuple[int, ...]], None] = OrderedDict()
        self._tx_reason_override: dict[TxId, tuple[str, str]] = {}  # rolled back by the node itself: why
        self._tx_extra_rollbacks: dict[TxId, int] = {}  # tx_rollback during a commit: its op id
        # tx_resolve_all in progress: request id -> [op id, tx, forced decision or None, members not answered
        # yet, reports so far, deadline]
        self._tx_queries: dict[int, list[Any]] = {}
        self._tx_query_seq = 0
        # -- entry events (off until set_event_kinds: then batches pile up for take_events)
        self._event_kinds: frozenset[str] = frozenset()
        self._events: list[EntryEvents] = []
        # Columns of the writes applied in this step while "written" is on; one EntryEvents per step (_flush).
        self._written: tuple[list[bytes], list[int], list[bytes | None]] | None = None
        # -- persistence (docs/grid.md): entries a persistent store brought back, waiting for our first topology
        self._restored: list[TransferEntry] | None = None
        self._restored_expiries: dict[tuple[bytes, int], float] = {}
        self._topology_floor = 0  # the highest topology id the store saw; a new grid must start above it
        self.restore_outcome = ""  # "", "merged" (formed a new grid: pushed as a merge) or "discarded"
        self._restore_wids: set[int] = set()  # pushes of restored entries not yet acknowledged by every owner

    # ==== entry events =====================================================================================
    def set_event_kinds(self, kinds: Iterable[str]) -> None:
        """Which entry events to produce (empty: none, the default, at no cost). The driver collects them with
        :meth:`take_events` after every step; each batch is also counted in ``grid.events_<kind>``."""
        wanted = frozenset(kinds)
        bad = wanted - EVENT_KINDS
        if bad:
            raise ValueError(f"set_event_kinds: unknown kind(s) {sorted(bad)}; known: {sorted(EVENT_KINDS)}")
        self._event_kinds = wanted
        self._written = ([], [], []) if EVENT_WRITTEN in wanted else None
        self._events = [e for e in self._events if e.kind in wanted]

    def restore(
        self,
        entries: list[TransferEntry],
        topology_floor: int,
        expiries: Mapping[tuple[bytes, int], float] | None = None,
    ) -> None:
        """Entries of this member's persistent store (before its first view), and the highest topology id the
        store had seen. On the first topology installed they are either pushed to their owners as after a merge
        (we are an owner in a new grid's first topology: the members are forming a grid together, e.g. after
        a full restart; every store keeps the newest version, tombstones count) or discarded (we join a running
        grid: what we stored may be stale, so the store is cleared, the seed's advice). Our STATUS carries the
        floor so the coordinator numbers new topologies above it: versions are ``(topology id << 40) | seq``,
        and a new write must beat every stored one. ``expiries`` (by ``(key, version)``) go with the pushed
        entries: an entry pushed after its expiry is removed by its primary as any expired entry is."""
        if self.topology is not None:
            raise RuntimeError("GridNode.restore: only before the first topology")
        self._restored = list(entries)
        self._restored_expiries = dict(expiries or {})
        self._topology_floor = max(0, topology_floor)

    @property
    def event_kinds(self) -> frozenset[str]:
        return self._event_kinds

    def take_events(self) -> list[EntryEvents]:
        """The entry event batches produced since the last call, in the order they happened."""
        events, self._events = self._events, []
        return events

    def _event(
        self, kind: str, segment: int, keys: Sequence[bytes], versions: Sequence[int], values: Sequence[bytes | None]
    ) -> None:
        t = self.topology
        self._events.append(EntryEvents(kind, segment, t.topology_id if t else 0, keys, versions, values))
        self.metrics[f"grid.events_{kind}"] += len(keys)

    def _note_written(self, key: bytes, version: int, value: bytes | None) -> None:
        written = self._written
        assert written is not None
        written[0].append(key)
        written[1].append(version)
        written[2].append(value)

    # ==== inputs ===========================================================================================
    def on_view(self, members: Sequence[Address], now: float, *, merge: bool = False) -> None:
        """A new group view (``merge`` True for a merge view)."""
        self._now = now
        self._drain_deferred()
        old_coord = self.view[0] if self.view else None
        if not members:
            raise ValueError("on_view: a view has at least one member")
        old_view = set(self.view)
        self.view = tuple(members)
        self._recent_routes = {}
        t = self.topology
        if t is not None:
            owners = set(owner_set(t.current)) | (set(owner_set(t.pending)) if t.pending is not None else set())
            self._vanished_owners |= {m for m in old_view - set(members) if m in owners and m != self.address}
            if self.merging:
                # Our entries have not all reached the merged group: whoever left our view meanwhile may be
                # behind a partition, without them, and would take our segments once it is back, though our
                # topology does not name it (seed 4884: a member cut off alone in allow_read_writes took writes,
                # merged, was cut off again before its push arrived, and left with the only copy).
                self._vanished_owners |= old_view - set(members) - {self.address}
        self._vanished_owners -= set(members)
        for gone in sorted(old_view - set(members)):
            self._repair_after(gone)
        # Transactions learn of the view before a topology the planner makes from it is installed below: the
        # originator re-routes what the departed members had not answered to that topology.
        self._tx_on_view(now, merge or bool(old_view - set(members)))
        if merge and t is not None and self.store is not None:
            # Also from a degraded topology: it still writes the segments whose owners are all with us (seed
            # 614: a member cut off alone took a write for such a segment, never pushed it, and lost it).
            self._merge_from = t.topology_id
        if merge and t is not None:
            self._merge_hold = t.topology_id
            self._merge_others = set(members) - old_view
        elif self._merge_hold is not None:
            self._merge_others &= set(members)  # those gone are no longer awaited in the merged topology
        alive = set(self.view)
        if self.view[0] == self.address:
            if self.planner is None or merge or old_coord != self.address:
                mode = self.config.mode
                self.planner = RebalancePlanner(
                    self.view,
                    num_segments=self.topology.num_segments if self.topology else self.config.num_segments,
                    num_owners=self.topology.current.num_owners if self.topology else self.config.num_owners,
                    mode=mode,
                    recovery_timeout=self.config.recovery_timeout,
                    now=now,
                    may_start_grid=not self._joined_others,
                    initial_size=self.config.initial_cluster_size,
                    merge=merge,
                )
            else:
                self._planner_out(self.planner.on_view(self.view, now))
            early = {m: st for m, st in self._early_statuses.items() if m in alive}
            self._early_statuses.clear()
            self._statuses_in.update(early)
        else:
            self.planner = None
            self._joined_others = True
            # Statuses kept for when we become coordinator belong to an older view now: their senders send
            # new ones to whoever the coordinator of their next view is.
            self._early_statuses.clear()
        # Operations whose target left wait for the topology that replaces it.
        for op in list(self._ops.values()):
            if op.not_before is None and op.target is not None and op.target not in alive:
                op.not_before = (op.topology_id + 1, 0.0)
                self._try_send(op)  # at once if a newer topology is here already
        for key in [k for k in self._out_xfers if k[0] not in alive]:
            del self._out_xfers[key]
        lost = False
        for xid in [x for x, xf in self._in_xfers.items() if xf.source not in alive]:
            del self._in_xfers[xid]
            lost = True
        if lost:
            self._plan_fetches()
        self._send_status()
        self._flush()

    def on_messages(self, batch: Iterable[tuple[Address, bytes]], now: float) -> None:
        """Payloads delivered by the group, as (sender, payload) pairs; bad payloads are dropped and counted."""
        self._now = now
        defer = self.defer_transfer
        deferred = self._deferred
        for src, payload in batch:
            try:
                msgs = decode_payload(payload, self.limits)
            except WireError as exc:
                self.metrics["grid.bad_payloads"] += 1
                log.warning("%s: dropped a grid payload from %s: %s", self.address, src, exc)
                continue
            for msg in msgs:
                kind = type(msg)
                if defer and kind not in _OPERATION_KINDS and (deferred or kind is XferData or kind is XferAck):
                    deferred.append((src, msg))
                else:
                    self._handle(src, msg)
        self._flush()

    def _run_deferred(self, max_chunks: int) -> None:
        """Handle held-back messages in arrival order until ``max_chunks`` transfer chunks were applied or
        produced (see ``defer_transfer``)."""
        deferred = self._deferred
        done = 0
        while deferred and done < max_chunks:
            src, msg = deferred.popleft()
            self._handle(src, msg)
            if type(msg) is XferData or type(msg) is XferAck:
                done += 1

    def _drain_deferred(self) -> None:
        """Handle every held-back message now (a view change must come after what arrived before it)."""
        while self._deferred:
            src, msg = self._deferred.popleft()
            self._handle(src, msg)

    def tick(self, now: float) -> None:
        """Time passed: resend or fail operations, expire held requests, advance the planner's recovery."""
        self._now = now
        if self._deferred:
            self._run_deferred(DEFERRED_CHUNKS_PER_STEP)
        elif self._pumps:
            dest, xid = self._pumps.popleft()
            stream = self._out_xfers.get((dest, xid))
            if stream is not None:
                self._pump(dest, xid, stream)
        if self.planner is not None:
            self._planner_out(self.planner.on_tick(now))
        while self._queued and self._queued[0][0] <= now:
            _, _, src, msg = self._queued.popleft()
            self._reject_held(src, msg)
        ops = self._ops
        cutoffs = self._cutoffs
        while cutoffs and cutoffs[0][0] <= now:
            _, first, last = heapq.heappop(cutoffs)
            for op_id in range(first, last + 1):
                op = ops.get(op_id)
                if op is not None:
                    self._expire(op)
        due: set[int] = set()
        for op in ops.values():  # start order, which is deadline order (see next_deadline)
            if op.deadline > now:
                break
            due.add(op.op_id)
        timers = self._op_timers
        while timers and timers[0][0] <= now:
            run = heapq.heappop(timers)
            if run is self._timer_run:
                self._timer_run = None
            due.update(range(run[2], run[3] + 1))
        for op_id in sorted(due):  # start order, as a sweep over every operation would go
            op = ops.get(op_id)
            if op is None:
                continue
            if now >= op.deadline:
                self._finish(op, False, error=f"timed out after {op.attempt} attempts")
            elif op.not_before is None and now >= op.resend_at:
                self.metrics["grid.op_resends"] += 1
                self._send_op(op)
            elif op.not_before is not None:
                self._try_send(op)
        if self._refetch_at is not None and now >= self._refetch_at:
            self._refetch_at = None
            self._plan_fetches()
        while self._acks_due and self._acks_due[0][0] <= now:
            _, src, xid = self._acks_due.popleft()
            xf = self._in_xfers.get(xid)
            if xf is not None and xf.source == src:  # not cancelled meanwhile
                self._emit(src, XferAck(xid))
        expiry = self._tombstone_expiry()
        if expiry is not None and now >= expiry:
            assert self.store is not None
            self.metrics["grid.tombstones_expired"] += self.store.expire_tombstones(now, self.config.tombstone_grace)
        if self.store is not None and self.store._expiring:
            self._remove_expired()
        self._tx_tick(now)
        self._flush()

    def next_deadline(self) -> float | None:
        """When :meth:`tick` must be called next (None: nothing is timed)."""
        times = [t for t in (self.planner.next_deadline() if self.planner else None, self._refetch_at) if t is not None]
        if self._queued:
            times.append(self._queued[0][0])
        expiry = self._tombstone_expiry()
        if expiry is not None:
            times.append(expiry)
        if self._acks_due:
            times.append(self._acks_due[0][0])
        if self._deferred or self._pumps:
            times.append(self._now)  # held-back transfer work: the next chunk in a step of its own
        if self.store is not None and self.store._garbage:
            times.append(self._collect_at)  # dropped segments still to free: the next slice (see _flush)
        tx_next = self._tx_next_deadline()
        if tx_next is not None:
            times.append(tx_next)
        if self._cutoffs:
            times.append(self._cutoffs[0][0])
        if self.store is not None and self.store._expiring:
            times.append(self.store._expiring[0][0] - self.wall_offset)  # the next entry to expire (Unix time)
        ops = self._ops
        if ops:
            # Deadlines are start time + op_timeout and operations stay in start order, so the first is the
            # earliest: no scan over thousands of operations in flight on every step.
            times.append(next(iter(ops.values())).deadline)
        timers = self._op_timers
        while timers:
            run = timers[0]
            at, op_id, last = run[0], run[2], run[3]
            while op_id <= last:
                op = ops.get(op_id)
                if op is not None and at == (op.resend_at if op.not_before is None else op.not_before[1]):
                    break
                op_id += 1  # finished, or its timer was set again (a newer entry exists)
            if op_id <= last:
                run[2] = op_id  # the ones before it need no timer any more (not a heap key: seq orders)
                times.append(at)
                break
            heapq.heappop(timers)
            if run is self._timer_run:
                self._timer_run = None
        return min(times) if times else None

    def _tombstone_expiry(self) -> float | None:
        """When the oldest tombstone may go, or None while none may (see docs/grid.md, tombstones).

        Tombstones stop a deleted key from coming back when an older value arrives: by state transfer during a
        rebalance, or pushed by another partition after a merge. So none goes while a rebalance or a merge
        runs, or while our topology is degraded (a partition may still have older values to push when it
        merges back); otherwise a tombstone goes ``tombstone_grace`` after this member stored it.
        """
        grace = self.config.tombstone_grace
        t = self.topology
        if grace <= 0 or self.store is None or t is None:
            return None
        oldest = self.store.oldest_tombstone()
        # ``merging`` scans the pending writes: asked last, and only when a tombstone waits.
        if oldest is None or t.phase != Phase.NO_REBALANCE or t.availability != Availability.AVAILABLE:
            return None
        return None if self.merging else oldest + grace

    # -- client operations ----------------------------------------------------------------------------------
    # Each takes the client's ``deadline`` (node time; None: none), after which the operation sends no attempt
    # and ends as timed out (see docs/grid.md, "Client deadlines"). The grid's own ``op_timeout`` still applies.
    def get(self, key: bytes, now: float, deadline: float | None = None) -> int:
        return self._start_op(GET, key, None, now, deadline)

    def put(self, key: bytes, value: bytes, now: float, deadline: float | None = None, expires: float = 0.0) -> int:
        """``expires``: when the entry expires, as a Unix time (0.0: never); see docs/grid.md, "Expiry"."""
        if type(value) is not bytes:
            raise TypeError(f"value: expected bytes, got {type(value).__name__}")
        if len(value) > self.limits.max_value_bytes:
            raise ValueError(f"value: {len(value)} bytes exceed the limit of {self.limits.max_value_bytes}")
        _check_expires(expires, "expires")
        return self._start_op(PUT, key, value, now, deadline, expires)

    def delete(self, key: bytes, now: float, deadline: float | None = None) -> int:
        return self._start_op(DELETE, key, None, now, deadline)

    def start_batch(
        self,
        ops: Sequence[tuple[int, bytes, bytes | None]],
        now: float,
        deadline: float | None = None,
        expiries: Sequence[float] | None = None,
    ) -> list[int]:
        """Start ``(kind, key, value)`` operations in one step; their op ids, in order.

        Like :meth:`get`/:meth:`put`/:meth:`delete` one after the other, except that the step ends (and
        payloads are encoded) once, after the last: the commands for one owner leave as one
        :class:`~.messages.CommandBatch`. Every operation is checked before any starts. ``deadline`` applies
        to every operation of the batch; ``expiries`` (None: none) gives each PUT's expiry as a Unix time (0.0:
        never), one per operation."""
        lim = self.limits
        if expiries is not None:
            if len(expiries) != len(ops):
                raise ValueError(f"expiries: {len(expiries)} for {len(ops)} operations")
            for i, e in enumerate(expiries):
                _check_expires(e, f"expiries[{i}]")
                if e and ops[i][0] != PUT:
                    raise ValueError(f"expiries[{i}]: only a PUT expires")
        for i, (kind, key, value) in enumerate(ops):
            if type(key) is not bytes:
                raise TypeError(f"ops[{i}].key: expected bytes, got {type(key).__name__}")
            if len(key) > lim.max_key_bytes:
                raise ValueError(f"ops[{i}].key: {len(key)} bytes exceed the limit of {lim.max_key_bytes}")
            if kind == PUT:
                if type(value) is not bytes:
                    raise TypeError(f"ops[{i}].value: expected bytes, got {type(value).__name__}")
                if len(value) > lim.max_value_bytes:
                    raise ValueError(f"ops[{i}].value: {len(value)} bytes exceed the limit of {lim.max_value_bytes}")
            elif kind not in (GET, DELETE):
                raise ValueError(f"ops[{i}]: unknown operation kind {kind!r}")
        self._now = now
        op_deadline = now + self.config.op_timeout
        ids = []
        start = self._next_op
        self._next_op += len(ops)
        t = self.topology
        nseg = t.num_segments if t is not None else 0
        segs = segments_of([o[1] for o in ops], nseg) if nseg else [0] * len(ops)
        cutoff = self._arm_cutoff(deadline, start, start + len(ops) - 1, now) if ops else _NO_CUTOFF
        exps: Sequence[float] = expiries if expiries is not None else [0.0] * len(ops)
        for op_id, (kind, key, value), seg, expires in zip(
            range(start, start + len(ops)), ops, segs, exps, strict=True
        ):
            op = _Op(op_id, kind, key, value if kind == PUT else None, op_deadline)
            op.seg, op.nseg = seg, nseg
            op.cutoff = cutoff
            op.expires = expires
            self._ops[op_id] = op
            if cutoff <= now:
                self._expire(op)
            else:
                self._try_send(op)
            ids.append(op_id)
        self._flush()
        return ids

    def leave(self, now: float) -> None:
        """Ask to leave: the coordinator moves our segments away; :attr:`ready_to_leave` turns True after."""
        self._now = now
        if not self.leaving:
            self.leaving = True
            self._send_status()
            self._check_ready()
        self._flush()

    def set_capacity(self, capacity: float, now: float) -> None:
        """Change this member's capacity while it runs: the coordinator rebalances so it owns its new share of the
        segments (none at 0: its segments move to the others and it stays in the group; docs/grid.md,
        "Capacity"). Raises ValueError for a capacity outside [0, 1000000]."""
        if type(capacity) not in (int, float) or not 0 <= capacity <= MAX_CAPACITY:
            raise ValueError(f"capacity: expected a number from 0 to {MAX_CAPACITY:.0f}, got {capacity!r}")
        self._now = now
        if float(capacity) != self.config.capacity:
            self.config = dataclasses.replace(self.config, capacity=float(capacity))
            self.metrics["grid.capacity_changes"] += 1
            self._send_status()
        self._flush()

    def force_available(self, now: float) -> bool:
        """Operator's override on the coordinator: accept what the missing owners took with them and leave
        degraded mode with the members present. Returns False on a member that is not the coordinator."""
        self._now = now
        if self.planner is None:
            return False
        self._planner_out(self.planner.force_available())
        self._flush()
        return True

    # -- outputs --------------------------------------------------------------------------------------------
    def reads_locally(self, key: bytes) -> bool:
        """Whether a GET of ``key`` issued here now is answered from this member's own copy (no hop)."""
        t = self.topology
        if t is None:
            return False
        return bool(self._routes(t).i_read[segment_of(key, t.num_segments)])

    def owner_routes(self) -> tuple[list[tuple[Address, ...]], list[tuple[Address, ...]]] | None:
        """Per segment of the installed topology, its read owners (preferred first) and write owners (primary
        first); computed once per topology and shared with the node's own routing (None: no topology)."""
        t = self.topology
        if t is None:
            return None
        r = self._routes(t)
        return r.read, r.write

    def take_outbox(self) -> list[Outgoing]:
        out, self._outbox = self._outbox, []
        return out

    def take_results(self) -> list[OpResult]:
        out, self._results = self._results, []
        return out

    @property
    def merging(self) -> bool:
        """True from a merge view (while our topology was available) until every entry we pushed to the
        merged group's owners is acknowledged (see :meth:`_push_entries`)."""
        return self._merge_from is not None or any(pw.merge for pw in self._writes.values())

    @property
    def pending_ops(self) -> int:
        return len(self._ops)

    @property
    def transfer_pending(self) -> bool:
        """True while this member still has segments to receive (``/readyz`` is not ready then)."""
        t = self.topology
        if t is None or t.phase != Phase.READ_OLD_WRITE_ALL:
            return False
        return not self._to_fetch(t) <= self._fetched

    def status(self) -> dict[str, Any]:
        """A JSON-able summary for ``/v1/status``."""
        t = self.topology
        out: dict[str, Any] = {
            "address": str(self.address),
            "view": [str(m) for m in self.view],
            "coordinator": str(self.view[0]) if self.view else None,
            "leaving": self.leaving,
            "ready_to_leave": self.ready_to_leave,
            "capacity": self.config.capacity,
            "topology": t.summary() if t else None,
            "store": None
            if self.store is None
            else {**self.store.describe(), "max_entries": self.config.max_entries, "max_bytes": self.config.max_bytes},
        }
        if t is not None:
            out["segments_primary"] = len(t.current.segments_primary(self.address))
            out["segments_owned"] = len(t.current.segments_owned(self.address))
            need = self._to_fetch(t) if t.phase == Phase.READ_OLD_WRITE_ALL else frozenset()
            out["rebalance"] = {"segments_to_fetch": len(need), "segments_fetched": len(need & self._fetched)}
        return out

    # ==== dispatch =========================================================================================
    def _handle(self, src: Address, msg: GridMessage) -> None:
        kind = type(msg)
        if kind is BackupBatch:
            self._on_backup_batch(src, msg)  # type: ignore[arg-type]
        elif kind is BackupAckBatch:
            self._on_backup_ack_batch(src, msg)  # type: ignore[arg-type]
        elif kind is CommandBatch:
            self._on_command_batch(src, msg)  # type: ignore[arg-type]
        elif kind is ResponseBatch:
            self._on_response_batch(msg)  # type: ignore[arg-type]
        elif kind is Command:
            self._on_command(src, msg)  # type: ignore[arg-type]
        elif kind is Response:
            self._on_response(msg)  # type: ignore[arg-type]
        elif kind is Backup:
            self._on_backup(src, msg)  # type: ignore[arg-type]
        elif kind is BackupAck:
            self._on_backup_ack(src, msg)  # type: ignore[arg-type]
        elif kind is XferData:
            self._on_xfer_data(src, msg)  # type: ignore[arg-type]
        elif kind is XferAck:
            self._on_xfer_ack(src, msg)  # type: ignore[arg-type]
        elif kind is Fetch:
            self._on_fetch(src, msg)  # type: ignore[arg-type]
        elif kind is Topology:
            if self.view and src == self.view[0]:
                self._install(msg.topology)  # type: ignore[union-attr]
            else:
                self.metrics["grid.topology_not_from_coordinator"] += 1
        elif kind is Confirm:
            if self.planner is not None:
                self._planner_out(self.planner.on_confirm(src, msg.topology_id))  # type: ignore[union-attr]
                self._check_ready()
        elif kind is Status:
            if self.planner is not None and src in self.view:
                self._statuses_in[src] = msg.status  # type: ignore[union-attr]
            else:
                # From a member our view does not hold yet, or from one whose view already makes us the
                # coordinator while ours does not (seed 460: dropping it left that member out of every
                # topology): kept for the view that makes us coordinator.
                self._early_statuses[src] = msg.status  # type: ignore[union-attr]
        elif kind is XferCancel:
            self._out_xfers.pop((src, msg.xfer_id), None)  # type: ignore[union-attr]
        elif kind is XferFail:
            self._on_xfer_fail(src, msg)  # type: ignore[arg-type]
        elif kind in _TX_KINDS:
            self._on_tx(src, msg)  # type: ignore[arg-type]

    def _emit(self, dest: Address | None, msg: GridMessage) -> None:
        if dest == self.address:
            self._loop.append((dest, msg))
        else:
            self._out.setdefault(dest, []).append(msg)

    # Operations, answers, backups and acknowledgements join the batch message of their kind when it is the
    # last one queued for the destination (messages.py, "batches of operations"): the order of messages to a
    # destination stays what single messages would have had, with one message per run instead of one each.
    def _tail(self, dest: Address | None) -> Any:
        lst = self._out.get(dest)  # first: a dict lookup of the same object compares no fields
        if lst:
            return lst[-1]
        if dest == self.address:
            loop = self._loop
            return loop[-1][1] if loop else None
        return None

    def _emit_cmd(
        self,
        dest: Address | None,
        op_id: int,
        attempt: int,
        tid: int,
        kind: int,
        key: bytes,
        value: bytes | None,
        deadline: float,
        expires: float = 0.0,
    ) -> None:
        b = self._tail(dest)
        size = len(key) + (len(value) if value is not None else 0)
        if type(b) is not CommandBatch or b.topology_id != tid or len(b.keys) >= BATCH_MAX_ENTRIES or b.full(size):
            b = CommandBatch(tid)
            self._emit(dest, b)
        b.add(op_id, attempt, kind, key, value, deadline, expires)

    def _emit_backup(
        self, dest: Address, wid: int, tid: int, version: int, key: bytes, value: bytes | None, expires: float = 0.0
    ) -> None:
        b = self._tail(dest)
        size = len(key) + (len(value) if value is not None else 0)
        if type(b) is not BackupBatch or b.topology_id != tid or len(b.keys) >= BATCH_MAX_ENTRIES or b.full(size):
            b = BackupBatch(tid)
            self._emit(dest, b)
        b.add(wid, version, key, value, expires)

    def _emit_ack(self, dest: Address, wid: int, code: int, tid: int) -> None:
        b = self._tail(dest)
        if type(b) is not BackupAckBatch or len(b.codes) >= BATCH_MAX_ENTRIES:
            b = BackupAckBatch()
            self._emit(dest, b)
        b.add(wid, code, tid)

    def _flush(self) -> None:
        """Run loopback messages and planner inputs to quiescence, then encode one payload per destination."""
        while self._loop or self._statuses_in:
            while self._loop:
                src, msg = self._loop.popleft()
                self._handle(src, msg)
            if self._statuses_in and self.planner is not None:
                st, self._statuses_in = self._statuses_in, {}
                self._planner_out(self.planner.on_statuses(st, self._now))
            elif self.planner is None:
                self._statuses_in.clear()
        self._check_ready()
        written = self._written
        if written is not None and written[0]:
            self._event(EVENT_WRITTEN, -1, *written)
            self._written = ([], [], [])
        if self.store is not None and self.store._garbage and self._now >= self._collect_at:
            self.store.collect(FREE_PER_STEP)
            self._collect_at = self._now + FREE_INTERVAL
        for dest, msgs in self._out.items():
            start, size = 0, 0
            for i, m in enumerate(msgs):
                size += _approx_size(m)
                if size >= MAX_PAYLOAD_SPLIT or i - start >= self.limits.max_messages - 1:
                    self._outbox.append(Outgoing(dest, encode_payload(msgs[start : i + 1])))
                    start, size = i + 1, 0
            if start < len(msgs):
                self._outbox.append(Outgoing(dest, encode_payload(msgs[start:])))
        self._out.clear()

    def _planner_out(self, outputs: list[tuple[Address | None, CacheTopology]]) -> None:
        for dest, topo in outputs:
            if dest is None:
                self._out.setdefault(None, []).append(Topology(topo))
                self._install(topo)
            elif dest == self.address:
                self._install(topo)
            else:
                self._emit(dest, Topology(topo))

    def _send_status(self) -> None:
        if not self.view:
            return
        lost = tuple(sorted(self._vanished_owners)[:MAX_LOST])
        status = MemberStatus(self.config.capacity, self.leaving, self.topology, self._topology_floor, lost)
        self._emit(self.view[0], Status(status))

    # ==== topology =========================================================================================
    def _install(self, t: CacheTopology) -> None:
        old = self.topology
        if old is not None and t.topology_id <= old.topology_id:
            if t.topology_id < old.topology_id:
                self.metrics["grid.stale_topology"] += 1
            return
        self.topology = t
        self.metrics["grid.topologies_installed"] += 1
        merged_topology = self._merged_topology(t)
        if merged_topology:
            self._merge_hold = None  # the merged group's topology: commands are served again (held ones below)
        me = self.address
        if self.store is None or self.store.num_segments != t.num_segments:
            self.store = SegmentStore(t.num_segments)
        store = self.store
        merged: list[tuple[int, bytes, int, bytes | None]] = []
        merged_expiries: dict[tuple[int, bytes], float] | None = None
        if self._merge_from is not None and merged_topology:
            # The first topology of the merged group: take our entries (tombstones too) before any drop.
            merged = [(s, k, ver, val) for s, data in sorted(store.segments.items()) for k, (ver, val) in data.items()]
            if any(data.exp for data in store.segments.values()):
                # Their expiries too, now: the segments we do not keep are dropped below, before the push, and a
                # re-stamp below gives the entries new versions (expiries are recorded per version).
                merged_expiries = {
                    (s, k): e for s, k, ver, val in merged if val is not None and (e := store.expiry_of(s, k, ver))
                }
            if t.restamp > self._merge_from:
                # The merged group joins grids that never met (topology.py, restamp): our versions and the
                # other grid's count topologies from 1 each, so they say nothing about which write came last.
                # Every member of either grid pushes its entries re-stamped under the one topology id
                # ``restamp``, above both grids' and below the merged group's, keeping each sequence: the
                # write's time. So the later write of a key wins everywhere, and any write of the merged
                # group beats them all.
                high = t.restamp << SEQ_BITS
                merged = [(s, k, high | version_seq(ver), val) for s, k, ver, val in merged]
                self.metrics["grid.merge_entries_restamped"] += len(merged)
            self._merge_from = None
        # Tombstones stay: a member that was cut off (or a partition that wrote on its own) pushes its entries
        # after a merge, and an older value must not bring a deleted key back (see docs/grid.md, merge).
        store.keep_tombstones = True
        keep = t.segments_to_keep(me)
        dropped_segments: list[int] = []
        emptied: list[int] = []  # segments whose copy was dropped or emptied here
        dropping = t.availability == Availability.AVAILABLE and self._merge_from is None
        if t.phase in (Phase.NO_REBALANCE, Phase.READ_OLD_WRITE_ALL) and dropping:
            # Old copies go only once no topology in use can still read them (see docs/grid.md). Never on a
            # degraded topology: it is provisional (owners are missing, a partition may have cut us off),
            # and the merged group may adopt another partition's topology that names us an owner of what we
            # would drop here; seed 15 lost acknowledged writes that way. Dropping waits for availability.
            # Nor while our merge push waits for the merged group's topology: a topology of our old group
            # that arrives after the merge view must not take entries the push still has to carry (seed 19).
            departed = EVENT_DEPARTED in self._event_kinds
            for s in store.held_segments() - keep:
                if departed:
                    data = store.segments[s]
                    if data:
                        # Snapshot the columns before the store lets go of the entries (they may be freed a
                        # slice per step from here on).
                        self._event(EVENT_DEPARTED, s, list(data.ver), list(data.ver.values()), list(data.val.values()))
                self.metrics["grid.entries_dropped"] += store.remove_segment(s)
                dropped_segments.append(s)
                emptied.append(s)
        if t.phase == Phase.READ_OLD_WRITE_ALL:
            if t.rebalance_id != self._xfer_rebalance:
                self._cancel_in_xfers()
                self._xfer_rebalance = t.rebalance_id
                self._fetch_started = set()
                self._fetched = set()
                self._fetch_tries.clear()
            for s in self._to_fetch(t) - self._fetch_started:
                # A new owner's old copy may be stale (it missed writes while not an owner): start empty.
                store.clear_segment(s)
                self._fetch_started.add(s)
                emptied.append(s)
            # Streams from sources that are no longer current owners of their segments restart elsewhere.
            for xid, xf in list(self._in_xfers.items()):
                if xf.source not in t.members or any(xf.source not in t.current.owners_of(s) for s in xf.remaining):
                    if xf.source in self.view:
                        self._emit(xf.source, XferCancel(xid))
                    del self._in_xfers[xid]
        else:
            self._cancel_in_xfers()
            if t.phase == Phase.NO_REBALANCE:
                self._out_xfers.clear()
        for s in keep:
            store.add_segment(s)
        if emptied:
            # Committed transactions' writes there went with the copy: a repeated commit applies them again (a
            # transfer into the emptied copy may come from an owner the commit has not reached yet).
            self.tx.forget_applied(emptied)
        if dropping and not self.tx.locks.empty():
            # Locks go with ownership, whatever the phase and whether the copy is dropped yet: a member that is no
            # write owner of a segment gets no commit carrying the versions of its keys, so a committed
            # transaction's lock still waiting for one there would be held for good (a lock promoted in a
            # partition of our own, then a merged topology that continued the other side's rebalance without us).
            gone = sorted(self.tx.locks.segments() - keep - set(dropped_segments))
            dropped_segments += gone
        self._tx_install(old, t, dropped_segments)
        # Writes we applied under another topology: push them to this topology's write owners, unless the write
        # went to all of them already (then its round goes on, for them only: see _kept_owners).
        recent = self._recent_routes
        if t.availability == Availability.AVAILABLE and not merged_topology:
            recent[t.topology_id] = self._routes(t)
            while len(recent) > _RECENT_TOPOLOGIES:
                del recent[min(recent)]
        else:
            recent.clear()
        for wid, pw in list(self._writes.items()):
            if pw.topology_id != t.topology_id:
                owners = self._kept_owners(pw.topology_id, t, segment_of(pw.key, t.num_segments))
                if owners is None:
                    self._redrive(wid, pw)
                    continue
                self.metrics["grid.writes_kept_across_topologies"] += 1
                pw.awaiting.intersection_update(owners)  # an owner that left the segment is not waited for
                if not pw.awaiting:
                    self._write_done(wid, pw)
        if merged:
            self._push_entries(merged, merge=True, expiries=merged_expiries if merged_expiries is not None else {})
        if old is None and (self._restored is not None or self._topology_floor):
            self._settle_restored(t)
        # Requests held for this topology (or an older one) can be answered now.
        if self._queued:
            held, self._queued = self._queued, deque()
            for item in held:
                if item[1] <= t.topology_id:
                    self._handle(item[2], item[3])
                else:
                    self._queued.append(item)
        if t.phase == Phase.READ_OLD_WRITE_ALL:
            self._plan_fetches()
        self._maybe_confirm()
        for op in list(self._ops.values()):
            if op.not_before is not None:
                self._try_send(op)
            elif op.target not in t.members:
                # Its target is gone: nobody will answer. Attempts to live owners under an older topology get
                # a RETRY from them (or an answer, if the owner had not moved on either).
                self._send_op(op)
        self._check_ready()

    def _settle_restored(self, t: CacheTopology) -> None:
        """Our first topology: merge what the persistent store brought back, or discard it (see :meth:`restore`)."""
        entries, self._restored = self._restored or [], None
        expiries, self._restored_expiries = self._restored_expiries, {}
        store = self.store
        assert store is not None
        if self.address in owner_set(t.current) and t.phase == Phase.NO_REBALANCE:
            self.restore_outcome = "merged"
            # The persistent copy restarts from what this member holds from now on: kept entries come back to
            # it through their owners' writes (ours included). The old rows are set aside, not deleted, until
            # every push is acknowledged: a member killed during the push brings them back at its next start.
            store.stash_backing()
            n = t.num_segments
            first = self._next_write
            # A key may come twice (the rows a killed restore had set aside, and the new ones): push the one the
            # stores would keep (the rule of SegmentStore.write), so the expiry by key is that version's.
            newest: dict[bytes, TransferEntry] = {}
            for e in entries:
                old = newest.get(e[0])
                if old is None or old[1] < e[1] or (old[1] == e[1] and tie_wins(e[2], old[2])):
                    newest[e[0]] = e
            self._push_entries(
                [(segment_of(k, n), k, v, val) for k, v, val in newest.values()],
                merge=False,
                expiries={(segment_of(k, n), k): expiries[k, v] for k, v, _ in newest.values() if (k, v) in expiries},
            )
            self._restore_wids = {w for w in range(first, self._next_write) if w in self._writes}
            if not self._restore_wids:
                store.drop_stash()
            self.metrics["grid.restored_entries_pushed"] += len(entries)
        else:
            # Joined a running grid: nothing of the old file may linger (it may be stale).
            store.reset_backing()
            self.restore_outcome = "discarded"
            self.metrics["grid.restored_entries_discarded"] += len(entries)
        # A warning when there was something, so it shows at the default log level: an operator should know a
        # store was emptied or merged.
        log.log(
            logging.WARNING if entries else logging.INFO,
            "%s: persistent store %s: %d entries (%s)",
            self.address,
            self.restore_outcome,
            len(entries),
            "formed a new grid with the other members: pushed to their owners, newest version wins"
            if self.restore_outcome == "merged"
            else "joined a running grid: the store is cleared, its entries may be stale",
        )

    def _restore_done(self, wid: int) -> None:
        wids = self._restore_wids
        wids.discard(wid)
        if not wids and self.store is not None:
            self.store.drop_stash()  # every restored entry is with its owners now

    def _repair_after(self, gone: Address) -> None:
        """``gone`` left our view: finish the writes it may have left half replicated.

        The member that stamps a write applies it, then sends it to the other write owners and stays
        responsible until all of them have it (:meth:`_redrive`). If it dies in between, some copies have the
        write and some do not, and nobody finishes it: the owners would serve different values for good
        (simulation seeds 24 and 581: a primary died; 716: a former primary re-driving a write died). So
        every member that applied writes from ``gone`` recently (within ``op_timeout`` of the last one)
        re-drives its entries of those segments from the lowest such version up to the write owners, each at
        its own version, as a write of its own; every store keeps the newest version, so the copies agree.
        """
        recs = self._stamped_by.pop(gone, None)
        if not recs or self.store is None or self.topology is None:
            return
        store, horizon = self.store, self._now - self.config.op_timeout
        entries: list[tuple[int, bytes, int, bytes | None]] = []
        for seg, (floor, last) in sorted(recs.items()):
            if last < horizon or not store.has_segment(seg):
                continue
            entries.extend((seg, k, ver, val) for k, (ver, val) in store.segments[seg].items() if ver >= floor)
        if entries:
            self._push_entries(entries, merge=False)
            self.metrics["grid.repair_entries_pushed"] += len(entries)

    def _merged_topology(self, t: CacheTopology) -> bool:
        """Whether ``t`` (newer than ours) is the merged group's first topology after a merge view."""
        if self._merge_hold is None and self._merge_from is None:
            return False
        hold = max(x for x in (self._merge_hold, self._merge_from) if x is not None)
        others = self._merge_others
        return t.topology_id > hold and self.address in t.members and (not others or not others.isdisjoint(t.members))

    def _maybe_confirm(self) -> None:
        t = self.topology
        if t is None or self._confirmed_id == t.topology_id or not self.view:
            return
        if t.phase == Phase.READ_OLD_WRITE_ALL and not self._to_fetch(t) <= self._fetched:
            return
        self._confirmed_id = t.topology_id
        self._emit(self.view[0], Confirm(t.topology_id))

    def _check_ready(self) -> None:
        if not self.leaving or self.ready_to_leave or self._ops or self.txc.pending():
            return  # a graceful leave also drains this member's own client operations and transactions
        t = self.topology
        if t is None:
            self.ready_to_leave = True  # never held data
            return
        if self._no_taker(t):
            # Nobody could take our segments (we are alone, or every other member owns nothing by its
            # capacity): waiting would only run into the leave timeout, and the data goes either way.
            # Writes still being replicated to members that are gone or own nothing cannot finish either.
            if not any(pw.op_id != 0 for pw in self._writes.values()):
                self.metrics["grid.left_without_taker"] += 1
                self.ready_to_leave = True
            return
        if self._writes:
            return
        if (
            t.phase == Phase.NO_REBALANCE
            and t.availability == Availability.AVAILABLE
            and self.address not in owner_set(t.current)
        ):
            # A leaving coordinator also waits until everyone installed that topology: were it to leave
            # first, a broadcast still in flight would arrive from a non-coordinator and be ignored, and its
            # successor would recover from an older topology that still names it as an owner.
            if self.planner is not None and not self.planner.all_installed():
                return
            self.ready_to_leave = True

    def _no_taker(self, t: CacheTopology) -> bool:
        """Whether no other member could take our segments: we are alone in our view, or every other member
        of it owns nothing by its capacity (0: a client-only member).

        Only a member the CH lists with capacity 0 is known to own nothing (the planner lists every such cache
        member: RebalancePlanner._with_clients). Any other member of our view could take our segments, listed or
        not: one the CH does not list may have joined after the CH was built (the topology that ends a
        rebalance carries the CH planned at its start: seed 2801), and a member that is leaving takes segments
        again once every member with capacity is leaving, ourselves included (RebalancePlanner._owner_candidates),
        which a CH built before the coordinator knew of our leave cannot show (seed 3413). Both seeds left with
        the only copy on such a CH, a step before the coordinator's next topology handed the segments on.
        Capacities never change after a join, so this answer cannot go stale the way leave flags do.

        Only on an available, balanced topology: a degraded one may mean we are just cut off from the others,
        who would take our segments once the partition heals, so we wait for that (or the leave timeout).
        """
        if t.phase != Phase.NO_REBALANCE or t.availability != Availability.AVAILABLE:
            return False
        if self._vanished_owners:
            return False  # owners we lost without a handoff may be behind a partition: wait for them
        if any(m not in self.view for m in t.lost):
            # So may the owners our grid lost before we took its data over: no owner of our own topology vanished,
            # but what we hold may be the only copy of what our side acknowledged while cut off from them.
            return False
        others = [m for m in self.view if m != self.address]
        if any(m not in t.members for m in others):
            return False  # a member the topology does not know yet (joining): its capacity is unknown
        caps = dict(zip(t.current.members, t.current.capacities, strict=True))
        return all(caps.get(m, -1.0) == 0 for m in others)

    def _to_fetch(self, t: CacheTopology) -> frozenset[int]:
        """Our segments to pull in ``t`` (asked after every transfer chunk: cached per topology)."""
        cached = self._to_fetch_cache
        if cached is None or cached[0] is not t:
            cached = self._to_fetch_cache = (t, t.segments_to_fetch(self.address))
        return cached[1]

    def _routes(self, t: CacheTopology) -> _Routes:
        r = self._routes_cache
        if r is None or r.topology is not t:
            r = self._routes_cache = _Routes(t, self.address)
        return r

    def _kept_owners(self, tid: int, t: CacheTopology, seg: int) -> tuple[Address, ...] | None:
        """``t``'s write owners of ``seg`` if a write sent under our earlier topology ``tid`` reached all of
        them: ``t`` has the same primary and no owner that ``tid`` lacked, and no view change came between.
        None otherwise.

        Then the topology change says nothing new about that write: a backup still an owner under ``t``
        applies a Backup of ``tid`` and acknowledges it as of ``tid``, and the primary keeps waiting for that
        round (for ``t``'s owners only) instead of re-driving it. No new owner appeared, nor an owner that starts
        fetching the segment, so no state-transfer snapshot can miss the write. The phase changes that end a
        rebalance keep the write owners (read old, read all, read new: write all in each) or drop the old ones
        (the balanced topology), and each re-drove every write in flight: a second round trip behind members
        busy installing the next topology, the slowest writes of a rebalance. A topology that adds an
        owner (a joiner's first), makes an owner fetch the segment, or changes the primary re-drives as before;
        so does a write whose topology we did not install since the last view change."""
        old = self._recent_routes.get(tid)
        if old is None:
            return None
        before, now = old.write[seg], self._routes(t).write[seg]
        if not now or not before or now[0] != before[0]:
            return None
        if _fetching(t, seg) - (_fetching(old.topology, seg) if old.topology.rebalance_id == t.rebalance_id else set()):
            # An owner that fetches ``seg`` under ``t`` but did not under ``tid`` clears its copy when it installs
            # the topology that makes it fetch, which may be after it acknowledged our write (an owner under
            # ``tid``, dropped in between, owner again), and its snapshot source may not have the write yet: that
            # acknowledgement says nothing, so the write is re-driven to ``t``'s owners.
            return None
        if now == before or set(now) <= set(before):
            return now
        return None

    def _write_done(self, wid: int, pw: _PendingWrite) -> None:
        """Every write owner has write ``wid``: forget it and answer its originator."""
        del self._writes[wid]
        if self._restore_wids:
            self._restore_done(wid)
        self._respond(pw.origin, pw.op_id, pw.attempt, OK, pw.topology_id)

    # ==== operations (originator side) =====================================================================
    def _start_op(
        self, kind: int, key: bytes, value: bytes | None, now: float, cutoff: float | None, expires: float = 0.0
    ) -> int:
        if type(key) is not bytes:
            raise TypeError(f"key: expected bytes, got {type(key).__name__}")
        if len(key) > self.limits.max_key_bytes:
            raise ValueError(f"key: {len(key)} bytes exceed the limit of {self.limits.max_key_bytes}")
        self._now = now
        op_id = self._next_op
        self._next_op += 1
        op = _Op(op_id, kind, key, value, now + self.config.op_timeout)
        op.cutoff = self._arm_cutoff(cutoff, op_id, op_id, now)
        op.expires = expires
        self._ops[op_id] = op
        if op.cutoff <= now:
            self._expire(op)
        else:
            self._try_send(op)
        self._flush()
        return op_id

    def _arm_cutoff(self, deadline: float | None, first: int, last: int, now: float) -> float:
        """The cutoff of operations ``first``..``last`` for a client ``deadline`` (None: none, inf), with a timer
        entry for it unless it has passed already (the caller then expires them at once)."""
        if deadline is None:
            return _NO_CUTOFF
        if deadline > now:
            heapq.heappush(self._cutoffs, (deadline, first, last))
        return deadline

    def _expire(self, op: _Op) -> None:
        """End an operation whose client deadline passed: the client has given up on it and may be retrying
        elsewhere, so no further attempt may land after that retry."""
        self.metrics["grid.ops_deadline_expired"] += 1
        suffix = f" after {op.attempt} attempts" if op.attempt else " before any attempt was sent"
        self._finish(op, False, error=_CUTOFF_ERROR + suffix)

    def _try_send(self, op: _Op) -> None:
        t = self.topology
        nb = op.not_before
        if nb is None or t is None or t.topology_id < nb[0] or self._now < nb[1]:
            return
        self._send_op(op)

    def _send_op(self, op: _Op) -> None:
        if self._now >= op.cutoff:
            self._expire(op)
            return
        t = self.topology
        if t is None:
            op.not_before = (1, 0.0)
            return
        if op.nseg != t.num_segments:
            op.seg = segment_of(op.key, t.num_segments)
            op.nseg = t.num_segments
        seg = op.seg
        r = self._routes(t)
        if op.kind == GET:
            if not r.can_read[seg]:
                self._finish(op, False, error=f"segment {seg} is unavailable for reads ({t.mode.value})")
                return
            target = self.address if r.i_read[seg] else r.read[seg][0]
        else:
            if not r.can_write[seg]:
                self._finish(op, False, error=f"segment {seg} is unavailable for writes ({t.mode.value})")
                return
            w = r.write[seg]
            target = w[0] if w else None  # type: ignore[assignment]
        op.attempt += 1
        op.target = target
        op.topology_id = t.topology_id
        op.not_before = None
        at = op.resend_at = self._now + self.config.attempt_timeout
        run = self._timer_run
        op_id = op.op_id
        if run is not None and run[0] == at and run[3] == op_id - 1:
            run[3] = op_id
        else:
            self._timer_run = self._push_timer(at, op_id)
        # The owner gets the deadline as a Unix time (its own clock differs from ours); 0.0: none.
        cutoff = op.cutoff
        wall = cutoff + self.wall_offset if cutoff != _NO_CUTOFF else 0.0
        self._emit_cmd(target, op.op_id, op.attempt, t.topology_id, op.kind, op.key, op.value, wall, op.expires)

    def _push_timer(self, at: float, op_id: int) -> list[Any]:
        """A timer run of operation ``op_id`` alone at ``at`` (see ``_op_timers``)."""
        self._timer_seq += 1
        run = [at, self._timer_seq, op_id, op_id]
        heapq.heappush(self._op_timers, run)
        return run

    def _on_response_batch(self, b: ResponseBatch) -> None:
        response = self._response
        errors = b.errors
        for i, (op_id, attempt, code, tid, value, version) in enumerate(
            zip(b.op_ids, b.attempts, b.codes, b.topology_ids, b.values, b.versions, strict=True)
        ):
            response(op_id, attempt, code, tid, value, errors.get(i, "") if errors else "", version)

    def _on_response(self, rsp: Response) -> None:
        self._response(rsp.op_id, rsp.attempt, rsp.code, rsp.topology_id, rsp.value, rsp.error, rsp.version)

    def _response(
        self, op_id: int, attempt: int, code: int, tid: int, value: bytes | None, error: str, version: int = 0
    ) -> None:
        op = self._ops.get(op_id)
        if op is None or attempt != op.attempt or op.not_before is not None:
            return  # an answer to an earlier attempt (or a duplicate)
        if code == OK:
            self._finish(op, True, value=value, version=version)
        elif code == NOT_FOUND:
            self._finish(op, True)
        elif code == ERROR:
            self._finish(op, False, error=error)
        else:
            self.metrics["grid.retries"] += 1
            mine = self.topology.topology_id if self.topology else 0
            if tid > mine:
                op.not_before = (tid, 0.0)
            elif op.topology_id < mine:
                op.not_before = (0, 0.0)  # we have moved on already: retry at once
            else:
                op.not_before = (0, self._now + self.config.retry_backoff)
                self._push_timer(op.not_before[1], op.op_id)
            self._try_send(op)

    def _finish(self, op: _Op, ok: bool, *, value: bytes | None = None, error: str = "", version: int = 0) -> None:
        self._ops.pop(op.op_id, None)
        reason = ""
        if not ok:
            self.metrics["grid.ops_failed"] += 1
            if error.startswith(REASON_LOCKED):
                reason = REASON_LOCKED
            elif error.startswith(REASON_FULL):
                reason = REASON_FULL
            elif "unavailable" in error:
                reason = REASON_UNAVAILABLE
            elif error.startswith("timed out"):
                reason = REASON_TIMEOUT
            else:
                reason = REASON_ERROR
        self._results.append(OpResult(op.op_id, op.kind, op.key, ok, value, error, op.attempt, version, reason))

    # ==== operations (owner side) ==========================================================================
    def _hold(self, topology_id: int, src: Address, msg: GridMessage) -> None:
        if len(self._queued) >= self.config.max_queued:
            _, _, osrc, omsg = self._queued.popleft()
            self._reject_held(osrc, omsg)
        self._queued.append((self._now + self.config.attempt_timeout, topology_id, src, msg))

    def _reject_held(self, src: Address, msg: GridMessage) -> None:
        mine = self.topology.topology_id if self.topology else 0
        if type(msg) is Command:
            self._respond(src, msg.op_id, msg.attempt, RETRY, mine)
        elif type(msg) is Backup:
            self._emit_ack(src, msg.write_id, RETRY, mine)
        elif type(msg) is Fetch:
            self._emit(src, XferFail(msg.xfer_id, msg.segments))

    def _respond(
        self,
        dest: Address,
        op_id: int,
        attempt: int,
        code: int,
        tid: int,
        value: bytes | None = None,
        error: str = "",
        *,
        version: int = 0,
    ) -> None:
        if op_id == 0:
            return  # a pushed entry (:meth:`_push_entries`): no client waits for it
        b = self._tail(dest)
        size = (len(value) if value is not None else 0) + len(error)
        if type(b) is not ResponseBatch or len(b.values) >= BATCH_MAX_ENTRIES or b.full(size):
            b = ResponseBatch()
            self._emit(dest, b)
        b.add(op_id, attempt, code, tid, value, error, version)

    def _on_command_batch(self, src: Address, b: CommandBatch) -> None:
        tid = b.topology_id
        command = self._command
        t = self.topology
        if t is None:
            segs: Iterable[int] = [-1] * len(b)
        elif src == self.address:
            # Our own operations (the originator is their primary, as clients route writes): each one's
            # segment was computed when it started, so the keys are not hashed a second time here.
            nseg = t.num_segments
            ops = self._ops
            segs = [
                op.seg if (op := ops.get(i)) is not None and op.nseg == nseg and op.key is k else segment_of(k, nseg)
                for i, k in zip(b.op_ids, b.keys, strict=True)
            ]
        else:
            segs = segments_of(b.keys, t.num_segments)  # one call for the batch
        for op_id, attempt, kind, key, value, seg, deadline, expires in zip(
            b.op_ids, b.attempts, b.kinds, b.keys, b.values, segs, b.deadlines, b.expiries, strict=True
        ):
            command(src, op_id, attempt, tid, kind, key, value, seg, deadline, expires)

    def _on_command(self, src: Address, cmd: Command) -> None:
        self._command(
            src, cmd.op_id, cmd.attempt, cmd.topology_id, cmd.kind, cmd.key, cmd.value, -1, cmd.deadline, cmd.expires
        )

    def _command(
        self,
        src: Address,
        op_id: int,
        attempt: int,
        tid: int,
        kind: int,
        key: bytes,
        value: bytes | None,
        seg: int = -1,  # segment_of(key) when the caller knows it (a batch computes them in one call)
        deadline: float = 0.0,  # the client's, as a Unix time (0.0: none)
        expires: float = 0.0,  # a PUT's expiry, as a Unix time (0.0: none)
    ) -> None:
        t = self.topology
        if t is None or tid > t.topology_id:
            self._hold(tid, src, Command(op_id, attempt, tid, kind, key, value, deadline, expires))
            return
        if tid < t.topology_id:
            self._respond(src, op_id, attempt, RETRY, t.topology_id)
            return
        if seg < 0:
            seg = segment_of(key, t.num_segments)
        store = self.store
        assert store is not None
        if self._merge_hold is not None:
            # A merge view came and the merged group's first topology has not: ours may be the topology of a
            # partition whose data the merged group does not continue. A read from it would miss what the
            # other side acknowledged long ago (seeds 20, 70), and a write stamped with its version could lose
            # the merge to an older value of the other side (seed 607). Hold both until that topology comes.
            self.metrics["grid.ops_held_merging"] += 1
            self._hold(t.topology_id + 1, src, Command(op_id, attempt, tid, kind, key, value, deadline, expires))
            return
        r = self._routes(t)
        if kind == GET:
            if not r.can_read[seg]:
                self._respond(src, op_id, attempt, ERROR, tid, error=f"segment {seg} unavailable")
            elif not r.i_read[seg]:
                self._respond(src, op_id, attempt, RETRY, tid)
            else:
                data = store.segments.get(seg)  # the two dicts directly: this is every read's path
                val = data.val.get(key) if data is not None else None
                if val is None:
                    self._respond(src, op_id, attempt, NOT_FOUND, tid)
                else:
                    self._respond(src, op_id, attempt, OK, tid, val, version=data.ver[key])  # type: ignore[union-attr]
            return
        if not r.can_write[seg]:
            self._respond(src, op_id, attempt, ERROR, tid, error=f"segment {seg} unavailable")
            return
        if not r.primary[seg]:
            self._respond(src, op_id, attempt, RETRY, tid)
            return
        locks = self.tx.locks
        if self._tx_locked and locks.is_held(key):
            # A transaction holds the key (prepared, or locked pessimistically): a plain write now could slip
            # under it, so it fails at once rather than queue behind a lock that may be in doubt for long.
            self.metrics["grid.writes_refused_locked"] += 1
            holders = ", ".join(str(x) for x in locks.holder_list(key)[:3])
            error = f"{REASON_LOCKED}: key is held by transaction {holders}"
            self._respond(src, op_id, attempt, ERROR, tid, error=error)
            return
        if self._tx_blocked and seg in self._tx_blocked:
            # New primary, the old one's lock information not here yet: which keys are locked is unknown. The
            # wait is short (one message), so the originator retries after its backoff, as for any RETRY.
            self._respond(src, op_id, attempt, RETRY, tid)
            return
        if deadline and self._now + self.wall_offset >= deadline:
            # Its client has given up and may have written the key again through another member since: applying
            # this now could put the older value over that one (docs/grid.md, "Client deadlines").
            self.metrics["grid.writes_refused_deadline"] += 1
            self._respond(src, op_id, attempt, ERROR, tid, error=_PRIMARY_CUTOFF_ERROR)
            return
        if kind == PUT and (self.config.max_entries or self.config.max_bytes) and self._full(seg, key, value):
            self.metrics["grid.writes_refused_full"] += 1
            # A first attempt refused wrote nothing; an earlier attempt, unanswered, may have been applied (by a
            # primary before a topology change) and still be replicated.
            written = "nothing was written" if attempt == 1 else "this attempt wrote nothing (an earlier may have)"
            error = self._full_error(f"{written} (delete keys, add members or raise the bound)")
            self._respond(src, op_id, attempt, ERROR, tid, error=error)
            return
        owners = r.write[seg]
        if kind != PUT:
            value = None
            expires = 0.0
        self._stamp_write(seg, key, value, expires, tid, owners[1:], src, op_id, attempt)
        if len(owners) == 1:
            self._respond(src, op_id, attempt, OK, tid)

    def _full(self, seg: int, key: bytes, value: bytes | None) -> bool:
        """Whether a PUT of ``key`` would take this member past a bound: ``max_entries`` if it adds a key,
        ``max_bytes`` if it grows the live bytes (a key held already may be overwritten by a value no larger)."""
        data = self.store.segments.get(seg)  # type: ignore[union-attr]
        held = None if data is None else data.val.get(key)
        size = len(value or b"")
        grow = len(key) + size if held is None else size - len(held)
        return not self._fits(int(held is None), grow)

    def _fits(self, adds: int, grow: int) -> bool:
        """:meth:`_take_room`, asked only when a bound could refuse: what neither adds a key under max_entries
        nor grows the bytes under max_bytes fits without a count (the count of a step starts at its first PUT
        that could be refused, as before max_bytes existed)."""
        cfg = self.config
        if not (adds and cfg.max_entries) and not (grow > 0 and cfg.max_bytes):
            return True
        return self._take_room(adds, grow)

    def _take_room(self, adds: int, grow: int) -> bool:
        """Count ``adds`` new keys and ``grow`` bytes against ``max_entries`` and ``max_bytes`` if they fit (True),
        else change nothing (False). The store is counted once per step, then what the step's PUTs add is counted
        on, so a batch cannot overshoot a bound."""
        cfg = self.config
        if self._entries_at != self._now:
            store = self.store
            assert store is not None
            self._entries, self._bytes, self._entries_at = len(store), store.nbytes, self._now
        if cfg.max_entries and adds and self._entries + adds > cfg.max_entries:
            self._full_bound = "max_entries"
            return False
        if cfg.max_bytes and grow > 0 and self._bytes + grow > cfg.max_bytes:
            self._full_bound = "max_bytes"
            return False
        self._entries += adds
        self._bytes += grow
        return True

    def _full_error(self, tail: str) -> str:
        if self._full_bound == "max_bytes":
            held, bound = f"{self._bytes} bytes of keys and values", f"its max_bytes is {self.config.max_bytes}"
        else:
            held, bound = f"{self._entries} entries", f"its max_entries is {self.config.max_entries}"
        return f"{REASON_FULL}: member {self.address} holds {held}, {bound}; {tail}"

    def _stamp_write(
        self,
        seg: int,
        key: bytes,
        value: bytes | None,
        expires: float,
        tid: int,
        backups: Sequence[Address],
        origin: Address,
        op_id: int,
        attempt: int,
    ) -> None:
        """As the segment's primary under topology ``tid``: stamp a write with the segment's next version, apply
        it, and send it to the ``backups`` as a pending write answered to ``origin`` once all acknowledge
        (``op_id`` 0: nobody waits). A client's PUT or DELETE, and the removal of an expired entry."""
        store = self.store
        assert store is not None
        data = store.segments.get(seg)
        seq = self._seq[seg] = next_seq(
            self._seq.get(seg, 0), self._now + self.wall_offset, data.ver.get(key) if data is not None else None
        )
        version = (tid << SEQ_BITS) | seq
        if store.write(seg, key, version, value, now=self._now):
            if expires:
                store.set_expiry(seg, key, version, expires)
            if self._written is not None:
                self._note_written(key, version, value)
        if not backups:
            return
        wid = self._next_write
        self._next_write += 1
        self._writes[wid] = _PendingWrite(
            origin, op_id, attempt, tid, set(backups), key, version, value, expires=expires
        )
        for b in backups:
            self._emit_backup(b, wid, tid, version, key, value, expires)

    def _remove_expired(self) -> None:
        """Remove the entries whose expiry has passed, for the segments we are the primary of: each as a delete
        stamped now, which reaches the other write owners as any write does (backups, re-driven across
        topologies), so the copies, the change feed and transactions all see one ordinary delete. An entry whose
        primary is another member is looked at again after ``EXPIRY_RECHECK`` (its primary removes it; if that
        member dies first, we may be the new primary by then); so is one we cannot delete now (a transaction
        holds the key, the segment cannot be written, a merge is pending)."""
        store = self.store
        assert store is not None
        wall = self._now + self.wall_offset
        if store._expiring[0][0] > wall:
            return
        due = store.due_expiries(wall, EXPIRE_PER_STEP)
        t = self.topology
        r = self._routes(t) if t is not None else None
        locks = self.tx.locks
        for seg, key, version in due:
            if (
                r is None
                or t is None
                or not r.primary[seg]
                or not r.can_write[seg]
                or self._merge_hold is not None
                or (self._tx_locked and locks.is_held(key))
                or (self._tx_blocked and seg in self._tx_blocked)
            ):
                store.recheck_expiry(wall + EXPIRY_RECHECK, seg, key, version)
                continue
            self._stamp_write(seg, key, None, 0.0, t.topology_id, r.write[seg][1:], self.address, 0, 0)
            self.metrics["grid.entries_expired"] += 1

    def _redrive(self, wid: int, pw: _PendingWrite) -> None:
        """Finish a write we applied whose replication a topology change interrupted.

        Answering RETRY instead would leave our copy diverged from the others for good if the originator
        died before retrying. So the stamping member stays responsible: it sends the *same* version to the
        write owners of the topology now installed, and answers the originator once all of them have it.
        Stores keep the newest version, so this never overwrites a later write; and a write owner of the
        current topology includes any new owner still fetching, so no snapshot can miss it.
        """
        t = self.topology
        assert t is not None and self.store is not None
        seg = segment_of(pw.key, t.num_segments)
        r = self._routes(t)
        if not r.can_write[seg]:
            # This (degraded) topology cannot write the segment. The client, if one waits, hears the error
            # now; the write itself stays, to be re-driven by the next topology that can write the segment:
            # we applied it already (and maybe some backups did), so dropping it would leave the copies
            # differing for good once the grid is available again (seed 24). Merge pushes wait the same way.
            if pw.op_id != 0:
                self._respond(pw.origin, pw.op_id, pw.attempt, ERROR, t.topology_id, error=f"segment {seg} unavailable")
                pw.op_id = 0
                self.metrics["grid.writes_kept_degraded"] += 1
            pw.topology_id = t.topology_id
            pw.awaiting = set()
            return
        owners = r.write[seg]
        applied = self.address in owners and self.store.write(seg, pw.key, pw.version, pw.value, now=self._now)
        if applied and pw.expires:
            self.store.set_expiry(seg, pw.key, pw.version, pw.expires)
        if applied and self._written is not None:
            self._note_written(pw.key, pw.version, pw.value)
        pw.topology_id = t.topology_id
        pw.awaiting = {m for m in owners if m != self.address}
        self.metrics["grid.writes_redriven"] += 1
        if not pw.awaiting:
            self._write_done(wid, pw)
            return
        for b in sorted(pw.awaiting):  # sorted: address hashes (so set order) differ between processes
            self._emit_backup(b, wid, t.topology_id, pw.version, pw.key, pw.value, pw.expires)

    def _push_entries(
        self,
        entries: list[tuple[int, bytes, int, bytes | None]],
        *,
        merge: bool,
        expiries: Mapping[tuple[int, bytes], float] | None = None,
    ) -> None:
        """Send our entries to the keys' write owners now: after a merge view (``merge``, the merge policy: every
        entry we held goes), or to finish the writes of a member that vanished (:meth:`_repair_after`).

        Each travels as a write of its own version (a :class:`_PendingWrite` with no client waiting), so it
        survives topology changes like any write, and every store keeps the newest version: the partition
        whose write is newest wins, a tie of different values (two partitions that stamped the same version)
        goes to the greater value, a deletion counting as smallest (:meth:`SegmentStore.write`).
        """
        t = self.topology
        store = self.store
        assert t is not None and store is not None
        for s, key, version, value in entries:
            wid = self._next_write
            self._next_write += 1
            # Each entry keeps its expiry (``expiries``: taken by segment and key before the entries were re-stamped
            # or their segments dropped; else read from the store now).
            if value is None:
                expires = 0.0
            elif expiries is not None:
                expires = expiries.get((s, key), 0.0)
            else:
                expires = store.expiry_of(s, key, version)
            pw = _PendingWrite(self.address, 0, 0, 0, set(), key, version, value, merge=merge, expires=expires)
            self._writes[wid] = pw
            self._redrive(wid, pw)
        if merge:
            self.metrics["grid.merge_entries_pushed"] += len(entries)

    def _on_backup_batch(self, src: Address, b: BackupBatch) -> None:
        tid = b.topology_id
        t = self.topology
        if t is None or tid != t.topology_id:
            for one in b.backups():  # held or refused one by one, as single backups are
                self._on_backup(src, one)
            return
        # The common case, under our own topology: the checks of _on_backup, per entry, in one loop.
        write = self.store.write  # type: ignore[union-attr]
        ack = self._emit_ack
        mine = self._routes(t).i_write
        now = self._now
        written = self._written
        lows: dict[int, int] = {}
        segs = segments_of(b.keys, t.num_segments)
        for wid, version, key, value, seg in zip(b.write_ids, b.versions, b.keys, b.values, segs, strict=True):
            if not mine[seg]:
                ack(src, wid, RETRY, tid)
            else:
                if write(seg, key, version, value, now=now) and written is not None:
                    written[0].append(key)
                    written[1].append(version)
                    written[2].append(value)
                ack(src, wid, OK, tid)
                low = lows.get(seg)
                if low is None or version < low:
                    lows[seg] = version
        if any(b.expiries):
            # Some entries expire: recorded after the loop (the common batch has no expiry to look at), for the
            # entries whose version is the key's now (applied here, or already held).
            set_expiry = self.store.set_expiry  # type: ignore[union-attr]
            for version, key, seg, expires in zip(b.versions, b.keys, segs, b.expiries, strict=True):
                if expires and mine[seg]:
                    set_expiry(seg, key, version, expires)
        if lows:
            self._note_stamped(src, lows)

    def _on_backup(self, src: Address, b: Backup) -> None:
        t = self.topology
        if t is None or b.topology_id > t.topology_id:
            self._hold(b.topology_id, src, b)
            return
        seg = segment_of(b.key, t.num_segments)
        if not self._routes(t).i_write[seg] or (
            b.topology_id < t.topology_id and self._kept_owners(b.topology_id, t, seg) is None
        ):
            self._emit_ack(src, b.write_id, RETRY, t.topology_id)
            return
        applied = self.store.write(seg, b.key, b.version, b.value, now=self._now)  # type: ignore[union-attr]
        if applied and b.expires:
            self.store.set_expiry(seg, b.key, b.version, b.expires)  # type: ignore[union-attr]
        if applied and self._written is not None:
            self._note_written(b.key, b.version, b.value)
        # Named as the Backup's own round: the primary matches it to the round it waits for.
        self._emit_ack(src, b.write_id, OK, b.topology_id)
        if b.topology_id < t.topology_id:
            self.metrics["grid.backups_kept_across_topologies"] += 1
        self._note_stamped(src, {seg: b.version})

    def _note_stamped(self, src: Address, lows: dict[int, int]) -> None:
        """``src`` made us apply writes of these segments, the lowest version of each given (see _repair_after)."""
        recs = self._stamped_by.setdefault(src, {})
        now, window = self._now, self.config.op_timeout
        for seg, low in lows.items():
            rec = recs.get(seg)
            if rec is None or now - rec[1] > window:
                recs[seg] = [low, now]
            else:
                rec[0] = min(rec[0], low)
                rec[1] = now

    def _on_backup_ack_batch(self, src: Address, b: BackupAckBatch) -> None:
        ack = self._backup_ack
        for wid, code, tid in zip(b.write_ids, b.codes, b.topology_ids, strict=True):
            ack(src, wid, code, tid)

    def _on_backup_ack(self, src: Address, ack: BackupAck) -> None:
        self._backup_ack(src, ack.write_id, ack.code, ack.topology_id)

    def _backup_ack(self, src: Address, wid: int, code: int, tid: int) -> None:
        pw = self._writes.get(wid)
        if pw is None:
            return
        if code == OK:
            # A backup acknowledges as of the Backup's own topology, so the id names the round it answers.
            if tid == pw.topology_id:
                pw.awaiting.discard(src)
                if not pw.awaiting:
                    self._write_done(wid, pw)
            return
        if src not in pw.awaiting:
            return  # it has this round already, or is no longer an owner (see _kept_owners): nothing to redo
        if tid > pw.topology_id:
            # The backup moved on: re-send under its topology once we have it (at once if we do).
            pw.topology_id = 0
            if self.topology is not None and self.topology.topology_id >= tid:
                self._redrive(wid, pw)
        elif tid < pw.topology_id and src in pw.awaiting:
            # It held our Backup too long waiting for this round's topology: offer it again.
            self._emit_backup(src, wid, pw.topology_id, pw.version, pw.key, pw.value, pw.expires)

    # ==== transactions =====================================================================================
    # The client's calls (docs/grid-transactions.md, "Using transactions"); results come out of take_results.
    def tx_begin(self, now: float, mode: str | None = None) -> TxId:
        """Start a transaction on this member (its originator); ``mode`` "optimistic", "pessimistic" or None
        (``GridConfig.tx_locking``)."""
        if mode is not None and mode not in ("optimistic", "pessimistic"):
            raise ValueError(f"mode: {mode!r} is not 'optimistic' or 'pessimistic'")
        self._now = now
        return self.txc.begin(now, mode)

    def tx_lock(self, tx: TxId, keys: Sequence[bytes], now: float) -> int:
        """Pessimistic: lock ``keys`` on their primaries. The result is ok once all are locked; ok False (with a
        reason) means the transaction was rolled back."""
        ks = list(keys)
        for i, key in enumerate(ks):
            self._check_key(key, f"keys[{i}]")
        c_state = self.txc.state_of(tx)
        if c_state is None and tx not in self._tx_done:
            raise ValueError(f"transaction {tx}: unknown on this member")
        self._now = now
        op_id = self._new_op_id()
        if c_state != CoordState.ACTIVE:
            self._tx_result(op_id, TX_LOCK_OP, tx, False, self._tx_done_reason(tx), "the transaction is not running")
            self._flush()
            return op_id
        out = self.txc.lock(tx, ks, now)  # ValueError for an optimistic transaction, before anything is recorded
        self._tx_lock_ops[tx] = op_id
        unavailable = self._tx_unavailable(ks)
        if unavailable:
            out += self.txc.rollback(tx, now)
            self._tx_reason_override[tx] = (REASON_UNAVAILABLE, unavailable)
        self._tx_out(out)
        self._flush()
        return op_id

    def tx_commit(self, tx: TxId, writes: Mapping[bytes, bytes | None], reads: Mapping[bytes, int], now: float) -> int:
        """Two-phase commit of ``writes`` (key -> value, None deletes), validating ``reads`` (key -> version
        read, 0 absent) on the primaries. The result is ok only once every owner acknowledged the commit."""
        if not isinstance(writes, Mapping) or not isinstance(reads, Mapping):
            raise TypeError("writes and reads: expected mappings of key -> value and key -> version")
        lim = self.limits
        for key, value in writes.items():
            self._check_key(key, "writes key")
            if value is not None:
                if type(value) is not bytes:
                    raise TypeError(f"writes[{key!r}]: expected bytes or None, got {type(value).__name__}")
                if len(value) > lim.max_value_bytes:
                    raise ValueError(f"writes[{key!r}]: {len(value)} bytes exceed the limit of {lim.max_value_bytes}")
        for key, version in reads.items():
            self._check_key(key, "reads key")
            if type(version) is not int or version < 0:
                raise ValueError(f"reads[{key!r}]: expected a version (an integer >= 0), got {version!r}")
        c_state = self.txc.state_of(tx)
        if c_state is None and tx not in self._tx_done:
            raise ValueError(f"transaction {tx}: unknown on this member")
        if c_state in (CoordState.PREPARING, CoordState.WAITING, CoordState.COMMITTING):
            raise ValueError(f"transaction {tx} is already being committed")
        if tx in self._tx_lock_ops:
            raise ValueError(f"transaction {tx} still waits for a lock request")
        self._now = now
        op_id = self._new_op_id()
        if c_state != CoordState.ACTIVE:
            self._tx_result(op_id, TX_COMMIT_OP, tx, False, self._tx_done_reason(tx), "the transaction was rolled back")
            self._flush()
            return op_id
        self._tx_end_ops[tx] = (op_id, TX_COMMIT_OP)
        unavailable = self._tx_unavailable(list(writes) + list(reads))
        if unavailable:
            self._tx_reason_override[tx] = (REASON_UNAVAILABLE, unavailable)
            out = self.txc.rollback(tx, now)
        else:
            out = self.txc.commit(tx, writes, now, reads)
        self._tx_out(out)
        self._flush()
        return op_id

    def tx_rollback(self, tx: TxId, now: float) -> int:
        """Roll ``tx`` back; the result is ok once it is rolled back (at once: presumed abort)."""
        c_state = self.txc.state_of(tx)
        if c_state is None and tx not in self._tx_done:
            raise ValueError(f"transaction {tx}: unknown on this member")
        self._now = now
        op_id = self._new_op_id()
        if c_state is None or c_state in (CoordState.ROLLING_BACK, CoordState.COMMITTING):
            committed = c_state == CoordState.COMMITTING or self._tx_done.get(tx, (False, ""))[0]
            why = "the transaction is committed" if committed else ""
            self._tx_result(op_id, TX_ROLLBACK_OP, tx, not committed, "committed" if committed else "", why)
            self._flush()
            return op_id
        self._tx_end_ops.setdefault(tx, (op_id, TX_ROLLBACK_OP))
        if self._tx_end_ops[tx][0] != op_id:
            # A commit is in flight (preparing): the rollback decides it; both calls hear the outcome.
            self._tx_extra_rollbacks[tx] = op_id
        self._tx_out(self.txc.rollback(tx, now))
        self._flush()
        return op_id

    def tx_in_doubt(self) -> list[InDoubt]:
        """This member's in-doubt transactions: prepared here, their originator gone; they keep their locks."""
        return self.tx.in_doubt()

    def tx_report(self, tx: TxId) -> TxReport:
        """What this member knows of ``tx`` (state, attempt, writes, versions): a resolver collects these from
        every member and decides with :func:`~.tx.termination_decision`."""
        return self.tx.report(tx)

    def tx_resolve(self, tx: TxId, commit: bool, now: float, versions: Mapping[bytes, int] | None = None) -> bool:
        """Resolve an in-doubt transaction here; False when ``tx`` is not in doubt on this member.

        Every member that lists ``tx`` in :meth:`tx_in_doubt` must be resolved the same way (decide with
        :func:`~.tx.termination_decision` over every member's :meth:`tx_report`). A commit needs a version for
        each written key this member holds: the ones stamped here, those in ``versions`` (from the other
        members' reports), and, for keys this member is the write primary of, fresh ones stamped now (the
        stamping primary is gone); any other missing one is a ValueError. The decision also goes, as a
        self-contained message, to the current write owners of the keys: owners that got the keys by state
        transfer after the prepare never saw it, and must apply (or release) it too."""
        if not any(d.tx == tx for d in self.tx.in_doubt()):
            return False
        self._now = now
        rep = self.tx.report(tx)
        vs = dict(rep.versions)
        vs.update(versions or {})
        t = self.topology
        keys = sorted({k for k, _ in rep.writes} | set(self.tx.locks.held_by(tx)) | set(self.tx.locks.backup_locks(tx)))
        not_held: list[bytes] = []
        if commit:
            missing = [k for k, _ in rep.writes if k not in vs]
            if missing and t is not None:
                r = self._routes(t)
                for k in missing:
                    if r.primary[segment_of(k, t.num_segments)]:
                        vs[k] = self._tx_stamp(k)
            # A written key whose segment we hold no more is not written here: its owners have it, and its
            # version may have left with the members that knew it (the originator's decision reached us only
            # after we were in doubt, and was ignored then, while the key moved on by state transfer).
            store = self.store
            n = t.num_segments if t is not None else 0
            not_held = [
                k for k, _ in rep.writes if k not in vs and (store is None or not store.has_segment(segment_of(k, n)))
            ]
            still = sorted(k for k, _ in rep.writes if k not in vs and k not in not_held)
            if still:
                raise ValueError(
                    f"transaction {tx}: no version for written keys {still!r}: resolve on their write primary "
                    "first, or pass the versions other members report"
                )
        out = self.tx.resolve(tx, commit, now, vs if commit else None, not_held=not_held)
        out += self.txc.resolved_here(tx, commit, now)
        if t is not None:
            r = self._routes(t)
            per_dest: dict[Address, list[VersionedWrite]] = {}
            dests: set[Address] = set()
            writes = dict(rep.writes)
            for k in keys:
                for owner in r.write[segment_of(k, t.num_segments)]:
                    if owner == self.address:
                        continue
                    dests.add(owner)
                    if commit and k in writes and k in vs:
                        per_dest.setdefault(owner, []).append((k, vs[k], writes[k]))
            for dest in sorted(dests):
                if commit:
                    msg: Any = TxCommit(tx, rep.attempt, t.topology_id, tuple(sorted(per_dest.get(dest, ()))), True)
                else:
                    msg = TxRollback(tx, rep.attempt, t.topology_id, True)
                out.append(TxSend(dest, msg))
        self.metrics["grid.tx_resolved_commit" if commit else "grid.tx_resolved_rollback"] += 1
        self._tx_out(out)
        self._tx_gauge()
        self._flush()
        return True

    def tx_resolve_all(self, tx: TxId, commit: bool | None, now: float) -> int:
        """Resolve in-doubt ``tx`` on every member, from this one: ask every member of the view for its report
        (TX_REPORT_REQ), then decide, with ``commit`` (True/False: an operator's decision) or, when None, by the
        grid's own rule (:func:`~.tx.resolution`), and send the decision like the automatic resolver does.

        The result (``take_results``) has kind TX_RESOLVE_OP; ok with value ``b"commit"`` or ``b"rollback"``,
        else a reason: ``not_in_doubt`` (no member has it in doubt), ``undecided`` (``commit`` None and the rule
        cannot tell; the error says why), ``timeout`` (a member did not answer within ``op_timeout``),
        ``unavailable`` (the view changed meanwhile, or a merge is in progress: ask again)."""
        self._now = now
        op_id = self._new_op_id()
        if not self.view:
            self._tx_query_done(op_id, tx, False, REASON_UNAVAILABLE, "not in a group yet")
            return op_id
        self._tx_query_seq += 1
        rid = _QUERY_IDS + self._tx_query_seq
        self._tx_queries[rid] = [op_id, tx, commit, set(self.view), {}, now + self.config.op_timeout]
        msg = TxReportRequest(rid, (tx,), tuple(self.view))
        for m in self.view:
            self._emit(m, msg)
        self._flush()
        return op_id

    def tx_prepared_count(self) -> int:
        """Transactions prepared on this member as a participant (voted YES, no decision yet)."""
        return sum(1 for t in self.tx.active() if self.tx.state_of(t) == TxState.PREPARED)

    @property
    def tx_pending(self) -> int:
        """Transactions this member originated that are not finished."""
        return len(self.txc.pending())

    # -- helpers of the calls
    def _check_key(self, key: object, what: str) -> None:
        if type(key) is not bytes:
            raise TypeError(f"{what}: expected bytes, got {type(key).__name__}")
        if len(key) > self.limits.max_key_bytes:
            raise ValueError(f"{what}: {len(key)} bytes exceed the limit of {self.limits.max_key_bytes}")

    def _new_op_id(self) -> int:
        op_id = self._next_op
        self._next_op += 1
        return op_id

    def _tx_unavailable(self, keys: Iterable[bytes]) -> str:
        """Why a transaction over ``keys`` cannot run now ("" when it can): no topology, or a segment this
        topology cannot write (degraded) or with no live owner."""
        t = self.topology
        if t is None:
            return "no topology installed yet"
        r = self._routes(t)
        for k in keys:
            seg = segment_of(k, t.num_segments)
            if not r.can_write[seg] or not r.write[seg]:
                return f"segment {seg} is unavailable for writes ({t.mode.value})"
        return ""

    def _tx_done_reason(self, tx: TxId) -> str:
        done = self._tx_done.get(tx)
        return done[1] if done is not None and done[1] else REASON_ROLLED_BACK

    def _tx_result(self, op_id: int, kind: int, tx: TxId, ok: bool, reason: str, error: str = "") -> None:
        self._results.append(OpResult(op_id, kind, b"", ok, None, error, 1, 0, "" if ok else reason, tx))

    # -- the core's callbacks
    def _tx_segment(self, key: bytes) -> int:
        t = self.topology
        return segment_of(key, t.num_segments if t is not None else self.config.num_segments)

    def _tx_version(self, key: bytes) -> int:
        """The version a read of ``key`` here returns (0: absent or deleted), which a transaction validates."""
        if self.store is None:
            return 0
        entry = self.store.get(self._tx_segment(key), key)
        return 0 if entry is None or entry[1] is None else entry[0]

    def _tx_room(self, puts: list[tuple[bytes, bytes]]) -> str:
        """Why a transaction's ``puts`` (key, value; we are the keys' primary) do not fit under max_entries or
        max_bytes ("": they do): counted as :meth:`_full` counts plain PUTs."""
        store = self.store
        assert store is not None
        adds = grow = 0
        for k, v in puts:
            held = store.value(self._tx_segment(k), k)
            adds += held is None
            grow += len(k) + len(v) if held is None else len(v) - len(held)
        if self._fits(adds, grow):
            return ""
        self.metrics["grid.tx_refused_full"] += 1
        what = f"{adds} keys" if self._full_bound == "max_entries" else f"{grow} bytes"
        return self._full_error(f"the transaction would add {what}")

    def _tx_stamp(self, key: bytes) -> int:
        # The sequence plain writes use: one primary orders a key's versions, whichever kind of write.
        t = self.topology
        seg = self._tx_segment(key)
        entry = self.store.get(seg, key) if self.store is not None else None
        held = entry[0] if entry is not None else None
        seq = self._seq[seg] = next_seq(self._seq.get(seg, 0), self._now + self.wall_offset, held)
        return make_version(t.topology_id if t is not None else 0, seq)

    def _tx_apply(self, tx: TxId, writes: tuple[VersionedWrite, ...]) -> None:
        store = self.store
        if store is None:
            return
        now = self._now
        lows: dict[int, int] = {}
        for key, version, value in writes:
            seg = self._tx_segment(key)
            if store.has_segment(seg):
                if store.write(seg, key, version, value, now=now) and self._written is not None:
                    self._note_written(key, version, value)
                low = lows.get(seg)
                if low is None or version < low:
                    lows[seg] = version
        self.metrics["grid.tx_writes_applied"] += len(writes)
        if lows and tx.origin != self.address:
            # The originator drives the commit to every owner and stays responsible until all acknowledged; if
            # it dies in between, an owner that joined by state transfer (its copy taken before the commit came
            # here) may never get it. So the commit counts as a write ``tx.origin`` made us apply: when it
            # leaves the view, _repair_after re-drives these segments' recent entries to the write owners
            # (random search seed 9745: a committed write missing on k4's new owner for good).
            self._note_stamped(tx.origin, lows)

    def _tx_route(self, keys: Sequence[bytes]) -> tuple[int, Mapping[bytes, Sequence[Address]]]:
        """The originator's routing: the write owners of each key's segment, write primary first. A segment
        without a live write owner routes to its current owners (they do not answer, so the transaction times
        out rather than committing somewhere that does not own the key)."""
        t = self.topology
        if t is None:
            return 0, {k: (self.address,) for k in keys}
        r = self._routes(t)
        n = t.num_segments
        out: dict[bytes, Sequence[Address]] = {}
        for k in keys:
            seg = segment_of(k, n)
            out[k] = r.write[seg] or t.current.owners_of(seg)
        return t.topology_id, out

    # -- inputs
    def _on_tx(self, src: Address, msg: Any) -> None:
        now = self._now
        kind = type(msg)
        if kind is TxVote or kind is TxAck:
            self._tx_out(self.txc.on_message(src, msg, now))
            return
        if kind is TxInfoAck:
            self._tx_pushes.pop((src, msg.topology_id, msg.segments), None)
            return
        if kind is TxLockInfo:
            self._on_lock_info(src, msg)
            return
        if kind is TxReportRequest:
            self._tx_on_report_request(src, msg)
            return
        if kind is TxReportAnswer:
            if msg.request_id > _QUERY_IDS:
                self._tx_on_query_answer(src, msg)
            else:
                self._tx_resolver_out(self.txr.on_answer(src, msg, now))
            return
        t = self.topology
        if kind is TxPrepare or kind is TxLock:
            if t is not None and self._merge_hold is not None and msg.topology_id >= t.topology_id:
                # As for commands: our topology may be the other partition's until the merged one arrives.
                self._hold(t.topology_id + 1, src, msg)
                return
            if t is not None and msg.topology_id == t.topology_id:
                keys = msg.keys if kind is TxLock else tuple(msg.lock_keys) + tuple(k for k, _ in msg.writes)
                r = self._routes(t)
                for k in keys:
                    seg = segment_of(k, t.num_segments)
                    if not r.can_write[seg]:
                        request = msg.request if kind is TxLock else 0
                        reason = f"segment {seg} unavailable"
                        self._emit(src, TxVote(msg.tx, msg.attempt, request, NO, t.topology_id, (), reason))
                        return
            out = self.tx.on_message(src, msg, now)
            if self.tx.locks.waiting(msg.tx):
                self.metrics["grid.tx_lock_waits"] += 1
            self._tx_out(out)
            return
        self._tx_out(self.tx.on_message(src, msg, now))
        if kind is TxCommit and (msg.resolved or src != msg.tx.origin):
            self._tx_stamp_orphans()  # a resolver's commit may leave a write waiting for its version here

    def _on_lock_info(self, src: Address, info: TxLockInfo) -> None:
        t = self.topology
        if t is None or info.topology_id > t.topology_id:
            # Pushed under a topology we have not installed: imported once we have it (and know which of its
            # segments we wait for); acknowledged then, so the pusher re-sends it if we never get there.
            if len(self._tx_info_held) < self.config.max_queued:
                self._tx_info_held.append((src, info))
            return
        key = (src, info.topology_id, info.segments)
        self._emit(src, TxInfoAck(info.topology_id, info.segments))
        if key in self._tx_info_seen:
            return  # a re-send: importing twice could lock for transactions long finished
        self._tx_info_seen[key] = None
        while len(self._tx_info_seen) > _TX_DONE_KEPT:
            self._tx_info_seen.popitem(last=False)
        for seg in info.segments:
            self._tx_awaiting.pop(seg, None)
        self.metrics["grid.tx_lock_info_in"] += 1
        self._tx_out(self.tx.on_message(src, info, self._now))
        for r in info.records:
            if r.tx.origin == self.address and self.txc.state_of(r.tx) is None:
                # Our own commit, completed: no commit of ours brings a version any more (TxTable.settle_own).
                self._tx_out(self.tx.settle_own(r.tx, self._now))
        self._tx_stamp_orphans()
        self._tx_gauge()

    def _tx_install(self, old: CacheTopology | None, t: CacheTopology, dropped: list[int]) -> None:
        """The transaction side of installing ``t`` (after ``old``): where the write primary of a segment
        changed, the new primary blocks it (and promotes its backup locks) until the old primary's lock
        information arrives, and the old primary pushes it; then the core answers waits of older topologies,
        runs what it held for ``t``, drops the locks of segments gone, and the originator re-routes."""
        now = self._now
        me = self.address
        alive = set(self.view)
        block: list[int] = []
        promote: list[int] = []
        push: dict[Address, list[int]] = {}
        if old is not None and old.num_segments == t.num_segments:
            ro, rn = self._routes(old), self._routes(t)
            for s in range(t.num_segments):
                wo, wn = ro.write[s], rn.write[s]
                op = wo[0] if wo else None
                np = wn[0] if wn else None
                if op == np:
                    continue
                if np == me:
                    promote.append(s)
                    if op is not None and op != me and op in alive:
                        block.append(s)
                        self._tx_awaiting[s] = (op, now)
                elif op == me and np is not None:
                    push.setdefault(np, []).append(s)
        out: list[TxOutput] = []
        if block:
            self.tx.block_segments(block)
        if promote:
            self.tx.promote(promote)
        out += self.tx.on_topology(t.topology_id, now)
        for dest, segs in sorted(push.items()):
            self.metrics["grid.tx_lock_info_pushed"] += 1
            out += self.tx.push_lock_info(segs, dest)
        if dropped:
            out += self.tx.drop_segments(dropped, now)
        self._tx_out(out)
        self._tx_out(self.txc.on_topology(now))
        if self._tx_info_held:
            held, self._tx_info_held = self._tx_info_held, []
            for src, info in held:
                self._on_lock_info(src, info)
        self._tx_stamp_orphans()

    def _tx_on_view(self, now: float, removed: bool) -> None:
        members = self.view
        alive = set(members)
        self._tx_out(self.tx.on_view(members, now))
        self._tx_out(self.txc.on_view(members, now))
        self._tx_resolver_out(self.txr.on_view(members, now, removed=removed))
        for rid, q in list(self._tx_queries.items()):
            if q[3] - alive:  # a member it waits for left: its answer never comes
                del self._tx_queries[rid]
                self._tx_query_done(q[0], q[1], False, REASON_UNAVAILABLE, "the view changed meanwhile: ask again")
        for key in [k for k in self._tx_pushes if k[0] not in alive]:
            del self._tx_pushes[key]  # the new primary is gone; its successor promotes its own records
        self._tx_info_held = [(s, i) for s, i in self._tx_info_held if s in alive]
        gone = sorted(s for s, (pusher, _) in self._tx_awaiting.items() if pusher not in alive)
        if gone:
            self._tx_unblock(gone, "grid.tx_lock_info_pusher_gone")
        self._tx_gauge()

    def _tx_unblock(self, segments: list[int], metric: str) -> None:
        """Stop waiting for lock information of ``segments`` (its pusher is gone: the backup locks promoted at
        install are what is known). An empty import unblocks them and passes on what we have."""
        for s in segments:
            self._tx_awaiting.pop(s, None)
        self.metrics[metric] += len(segments)
        t = self.topology
        tid = t.topology_id if t is not None else 0
        self._tx_out(self.tx.import_lock_info(TxLockInfo(tid, tuple(segments), ()), self._now))
        self._tx_stamp_orphans()

    def _tx_tick(self, now: float) -> None:
        out = self.tx.tick(now)
        out += self.txc.tick(now)
        self._tx_out(out)
        self._tx_resolver_out(self.txr.tick(now))
        for rid, q in list(self._tx_queries.items()):
            if q[5] <= now:
                del self._tx_queries[rid]
                missing = ", ".join(sorted(str(m) for m in q[3]))
                self._tx_query_done(q[0], q[1], False, REASON_TIMEOUT, f"no report from {missing} in time")
        interval = self.config.attempt_timeout
        for key, entry in self._tx_pushes.items():
            if entry[1] <= now:
                entry[1] = now + interval
                self.metrics["grid.tx_lock_info_resent"] += 1
                self._emit(key[0], entry[0])
        # Last resort: a segment blocked for a whole transaction timeout with its pusher alive never got the
        # information (members that skipped a topology can disagree on who the previous primary was). Locks
        # there wait no longer; counted, as it means lock information may have been lost.
        limit = self.config.tx_timeout
        # The same expression as _tx_next_deadline's: ``now - since >= limit`` can be false at that very
        # deadline (floating point), and the driver then steps at it for ever (grid-tx simulation seed 814).
        stale = sorted(s for s, (_, since) in self._tx_awaiting.items() if since + limit <= now)
        if stale:
            self._tx_unblock(stale, "grid.tx_lock_info_given_up")

    def _tx_next_deadline(self) -> float | None:
        times = [
            x for x in (self.tx.next_deadline(), self.txc.next_deadline(), self.txr.next_deadline()) if x is not None
        ]
        if self._tx_pushes:
            times.append(min(e[1] for e in self._tx_pushes.values()))
        if self._tx_awaiting:
            times.append(min(since for _, since in self._tx_awaiting.values()) + self.config.tx_timeout)
        if self._tx_queries:
            times.append(min(q[5] for q in self._tx_queries.values()))
        return min(times) if times else None

    # -- outputs of the core
    def _tx_out(self, outputs: Iterable[TxOutput]) -> None:
        for o in outputs:
            kind = type(o)
            if kind is TxSend:
                msg = o.message  # type: ignore[union-attr]
                if type(msg) is TxCommit and self.config.tx_test_hold_commit and msg.tx.origin == self.address:  # type: ignore[union-attr]
                    continue  # fault injection (GridConfig.tx_test_hold_commit)
                if type(msg) is TxLockInfo and o.dest != self.address:  # type: ignore[union-attr]
                    key = (o.dest, msg.topology_id, msg.segments)  # type: ignore[union-attr]
                    self._tx_pushes[key] = [msg, self._now + self.config.attempt_timeout]  # type: ignore[list-item]
                self._emit(o.dest, msg)  # type: ignore[union-attr]
            elif kind is TxOutcome:
                self._tx_outcome(o)  # type: ignore[arg-type]
            elif kind is TxLocked:
                op_id = self._tx_lock_ops.pop(o.tx, None)  # type: ignore[union-attr]
                if op_id is not None:
                    reason = "" if o.ok else _tx_reason(o.reason)  # type: ignore[union-attr]
                    self._tx_result(op_id, TX_LOCK_OP, o.tx, o.ok, reason, o.reason)  # type: ignore[union-attr]

    def _tx_outcome(self, o: TxOutcome) -> None:
        # ok False from tx_commit means: not committed, and never will be (a rollback is only ever decided
        # before a commit, and a commit is reported only once every owner acknowledged it). A commit that a
        # participant answered with ROLLED_BACK (resolved the other way while this originator was cut off) is
        # ok with reason "mixed": committed here and on the others, not there.
        committed = o.committed
        override = self._tx_reason_override.pop(o.tx, None)
        if committed:
            reason, error = (REASON_MIXED, o.reason) if o.mixed else ("", "")
            self.metrics["grid.tx_commits"] += 1
            if o.mixed:
                self.metrics["grid.tx_mixed"] += 1
        else:
            reason = override[0] if override else _tx_reason(o.reason)
            error = override[1] if override else o.reason
            self.metrics["grid.tx_rollbacks"] += 1
            self.metrics[f"grid.tx_rollbacks.{reason}"] += 1
        self._tx_done[o.tx] = (committed, reason)
        while len(self._tx_done) > _TX_DONE_KEPT:
            self._tx_done.popitem(last=False)
        lock_op = self._tx_lock_ops.pop(o.tx, None)
        if lock_op is not None:
            self._tx_result(lock_op, TX_LOCK_OP, o.tx, False, reason or REASON_ROLLED_BACK, error)
        end = self._tx_end_ops.pop(o.tx, None)
        extra = self._tx_extra_rollbacks.pop(o.tx, None)
        for op_id, kind in ([end] if end else []) + ([(extra, TX_ROLLBACK_OP)] if extra else []):
            if kind == TX_COMMIT_OP:
                self._results.append(OpResult(op_id, kind, b"", committed, None, error, o.attempts, 0, reason, o.tx))
            else:  # a rollback asked for: done unless it committed after all
                ok = not o.committed
                self._tx_result(op_id, kind, o.tx, ok, "" if ok else "committed", "" if ok else "committed")

    def _tx_gauge(self) -> None:
        self.metrics["grid.tx_in_doubt"] = len(self.tx.in_doubt())

    # -- automatic resolution of in-doubt transactions (TxResolver on the view coordinator)
    def _tx_on_report_request(self, src: Address, req: TxReportRequest) -> None:
        """Answer the coordinator's report request: the reports of the transactions it names and of every one
        in doubt here. Writes waiting for a version this member can stamp now are stamped first, so the
        report carries the version (seed 19's gap)."""
        self._tx_stamp_orphans()
        ids = set(req.txs).union(self.tx.unresolved(req.members))
        self._emit(src, TxReportAnswer(req.request_id, tuple(self._tx_report_info(tx) for tx in sorted(ids))))

    def _tx_report_info(self, tx: TxId) -> TxReportInfo:
        """This member's report of ``tx`` for a resolver; on its originator, what the originator decided."""
        rep = self.tx.report(tx)
        if tx.origin != self.address:
            return report_info(rep)
        decided = self.txc.decided(tx)
        if decided is not None:  # COMMITTING: the commit's writes and versions; ROLLING_BACK: rolled back
            return report_info(decided if decided.state == TxState.COMMITTED or rep.state != TxState.COMMITTED else rep)
        if self.txc.state_of(tx) is not None:
            return report_info(rep, deciding=True)
        done = self._tx_done.get(tx)
        if done is not None and rep.state != TxState.COMMITTED:
            state = TxState.COMMITTED if done[0] else TxState.ROLLED_BACK
            return report_info(TxReport(tx, state, rep.attempt, rep.writes, rep.versions, False, rep.views))
        return report_info(rep)

    def _tx_on_query_answer(self, src: Address, answer: TxReportAnswer) -> None:
        q = self._tx_queries.get(answer.request_id)
        if q is None or src not in q[3]:
            return
        op_id, tx, commit, waiting, reports, _ = q
        waiting.discard(src)
        for r in answer.reports:
            if r.tx == tx:
                reports[src] = r
        if waiting:
            return
        del self._tx_queries[answer.request_id]
        present = set(self.view)
        if not any(r.in_doubt or (r.state == TxState.PREPARED and tx.origin not in present) for r in reports.values()):
            self._tx_query_done(op_id, tx, False, "not_in_doubt", f"transaction {tx} is in doubt on no member")
            return
        verdict = resolution(tx, reports, self.view) if commit is None else commit
        if isinstance(verdict, str):
            self._tx_query_done(op_id, tx, False, "undecided", f"transaction {tx} stays in doubt: {verdict}")
            return
        if self._merge_hold is not None or self.topology is None:
            self._tx_query_done(op_id, tx, False, REASON_UNAVAILABLE, "a merge is in progress: ask again")
            return
        self._tx_send_decision(decision(tx, verdict, reports))
        self._results.append(
            OpResult(op_id, TX_RESOLVE_OP, b"", True, b"commit" if verdict else b"rollback", "", 1, 0, "", tx)
        )

    def _tx_query_done(self, op_id: int, tx: TxId, ok: bool, reason: str, error: str) -> None:
        self._results.append(OpResult(op_id, TX_RESOLVE_OP, b"", ok, None, error, 1, 0, reason, tx))

    def _tx_resolver_out(self, outputs: Iterable[ResolverOutput]) -> None:
        for o in outputs:
            if type(o) is TxSend:
                self._emit(o.dest, o.message)  # type: ignore[union-attr]
            else:
                self._tx_send_decision(o)  # type: ignore[arg-type]

    def _tx_send_decision(self, d: TxDecided) -> None:
        """Send the resolver's decision, self-contained, to the write owners of its keys (current and pending:
        owners that get them by state transfer never saw the prepare) and to every member that reported it
        unfinished. Not during a merge hold (our topology may be the other side's): the next round decides
        again."""
        t = self.topology
        if t is None or self._merge_hold is not None:
            return
        r = self._routes(t)
        n = t.num_segments
        writes = dict(d.writes)
        versions = dict(d.versions)
        dests: set[Address] = set(d.members)
        per_dest: dict[Address, list[VersionedWrite]] = {}
        for k in sorted(writes):
            for owner in r.write[segment_of(k, n)]:
                dests.add(owner)
                if d.commit and k in versions:
                    per_dest.setdefault(owner, []).append((k, versions[k], writes[k]))
        for dest in sorted(dests):
            if d.commit:
                msg: Any = TxCommit(d.tx, d.attempt, t.topology_id, tuple(per_dest.get(dest, ())), True)
            else:
                msg = TxRollback(d.tx, d.attempt, t.topology_id, True)
            self._emit(dest, msg)
        self._tx_out(self.txc.resolved_here(d.tx, d.commit, self._now))
        self.metrics["grid.tx_auto_resolved_commit" if d.commit else "grid.tx_auto_resolved_rollback"] += 1
        log.info("%s: resolved in-doubt transaction %s: %s", self.address, d.tx, "commit" if d.commit else "rollback")

    def _tx_stamp_orphans(self) -> None:
        """Committed here with a write still waiting for a version only the dead originator knew: as the key's
        current write primary, stamp one, apply it, and send it to the other write owners (TxTable.stamp_committed)."""
        t = self.topology
        if t is None or not self.tx.locks._held:
            return
        r = self._routes(t)
        n = t.num_segments

        def is_primary(key: bytes) -> bool:
            seg = segment_of(key, n)
            return r.primary[seg] and r.can_write[seg]

        out, stamped = self.tx.stamp_committed(is_primary, self._now)
        self._tx_out(out)
        for tx, attempt, writes in stamped:
            per_dest: dict[Address, list[VersionedWrite]] = {}
            for w in writes:
                for owner in r.write[segment_of(w[0], n)]:
                    if owner != self.address:
                        per_dest.setdefault(owner, []).append(w)
            for dest, ws in sorted(per_dest.items()):
                self._emit(dest, TxCommit(tx, attempt, t.topology_id, tuple(ws), True))
            self.metrics["grid.tx_versions_stamped_late"] += len(writes)

    def tx_undecided(self) -> dict[TxId, str]:
        """On the view coordinator: the in-doubt transactions its last resolution round could not decide, and
        why (an operator decides those: ``groupcluster tx resolve``)."""
        return dict(self.txr.undecided)

    # ==== state transfer ===================================================================================
    def _cancel_in_xfers(self) -> None:
        for xid, xf in self._in_xfers.items():
            if xf.source in self.view:
                self._emit(xf.source, XferCancel(xid))
        self._in_xfers.clear()

    def _plan_fetches(self) -> None:
        """Request every segment still missing from a live current owner, one stream per source."""
        t = self.topology
        if t is None or t.phase != Phase.READ_OLD_WRITE_ALL:
            return
        need = self._to_fetch(t) - self._fetched
        for xf in self._in_xfers.values():
            need -= xf.remaining
        alive = set(self.view) & set(t.members)
        by_source: dict[Address, list[int]] = {}
        # Segments each source already streams to us: a segment goes to the least loaded of its owners. Always
        # asking the primary left one old member streaming 45% of a joiner's segments and another 15%, so
        # the last ~100 ms of a 1M-entry rebalance ran one stream alone (issue 4).
        load: Counter[Address] = Counter()
        for xf in self._in_xfers.values():
            load[xf.source] += len(xf.remaining)
        for s in sorted(need):
            sources = [m for m in t.current.owners_of(s) if m in alive and m != self.address]
            if not sources:
                # Nobody holds it any more (more owners failed than the data survives): start empty.
                self.metrics["grid.segments_unrecoverable"] += 1
                self._fetched.add(s)
                continue
            # A retry (the source failed the segment) asks the next owner in turn, as before; a first try the
            # least loaded owner, ties to the first listed (deterministic, so simulation seeds replay).
            k = self._fetch_tries[s] % len(sources)
            turn = sources[k:] + sources[:k]
            src = min(turn, key=lambda m: load[m]) if not self._fetch_tries[s] else turn[0]
            load[src] += 1
            by_source.setdefault(src, []).append(s)
        for src, segs in by_source.items():
            xid = self._next_xfer
            self._next_xfer += 1
            self._in_xfers[xid] = _InXfer(src, segs)
            self._emit(src, Fetch(xid, t.topology_id, t.rebalance_id, tuple(segs)))
        self._maybe_confirm()

    def _on_fetch(self, src: Address, f: Fetch) -> None:
        t = self.topology
        if t is None or f.topology_id > t.topology_id:
            # A source serves only once it writes to the new owners too, so nothing written after its
            # snapshot can miss them.
            self._hold(f.topology_id, src, f)
            return
        store = self.store
        assert store is not None
        mine = t.current.segments_owned(self.address)
        bad = tuple(s for s in f.segments if s not in mine or not store.has_segment(s) or s >= t.num_segments)
        if bad:
            self._emit(src, XferFail(f.xfer_id, bad))
        good = [s for s in f.segments if s not in bad]
        if not good:
            return
        cfg = self.config
        stream = _OutXfer(_batches(store, f.xfer_id, good, cfg.transfer_batch_entries, cfg.transfer_batch_bytes))
        self._out_xfers[(src, f.xfer_id)] = stream
        self._pump(src, f.xfer_id, stream)

    def _pump(self, dest: Address, xid: int, stream: _OutXfer) -> None:
        """Send the stream's next chunks while its window has room. With ``defer_transfer``, one chunk per step:
        if the window has room for more, the stream waits in ``_pumps`` for the next step (a FETCH used to
        produce the whole first window in one step, 1.5-2 ms of a source's loop with 256 KiB chunks)."""
        limit = 1 if self.defer_transfer else self.config.transfer_window
        sent = 0
        while stream.unacked < self.config.transfer_window:
            if sent == limit:
                self._pumps.append((dest, xid))
                return
            sent += 1
            batch = next(stream.batches, None)
            if batch is None:
                self._out_xfers.pop((dest, xid), None)
                return
            stream.unacked += 1
            self.metrics["grid.xfer_entries_out"] += len(batch.entries)
            # In order with everything else to ``dest``: a chunk must not be overtaken by, say, a topology
            # that makes the receiver an owner of what the chunk completes (seed 39 lost a write that way).
            self._emit(dest, batch)
            if batch.last:
                self._out_xfers.pop((dest, xid), None)
                return

    def _on_xfer_ack(self, src: Address, ack: XferAck) -> None:
        stream = self._out_xfers.get((src, ack.xfer_id))
        if stream is not None:
            stream.unacked -= 1
            self._pump(src, ack.xfer_id, stream)

    def _on_xfer_data(self, src: Address, d: XferData) -> None:
        xf = self._in_xfers.get(d.xfer_id)
        if xf is None or xf.source != src:
            return  # a stream we cancelled
        store = self.store
        assert store is not None
        chunk = d.entries
        if d.segment in xf.remaining and len(chunk):
            applied = store.apply_chunk(d.segment, chunk.keys, chunk.versions, chunk.values, now=self._now)
            if chunk.expiries is not None:
                store.set_expiries(d.segment, chunk.keys, chunk.versions, chunk.expiries)
            self.metrics["grid.xfer_entries_in"] += len(chunk)
            self.metrics["grid.xfer_entries_applied"] += applied
            self.metrics["grid.xfer_bytes_in"] += chunk.nbytes
            if EVENT_ARRIVED in self._event_kinds:
                # Every entry received, applied or not (a newer local write wins): duplicates are allowed.
                self._event(EVENT_ARRIVED, d.segment, chunk.keys, chunk.versions, chunk.values)
        for s in d.done:
            if s in xf.remaining:
                xf.remaining.discard(s)
                self._fetched.add(s)
        if d.last or not xf.remaining:
            self._in_xfers.pop(d.xfer_id, None)
            if xf.remaining:  # the source ended early: fetch the rest again
                self._plan_fetches()
        else:
            self._ack(src, d)
        self._maybe_confirm()

    def _ack(self, src: Address, d: XferData) -> None:
        """Acknowledge a chunk, which lets its source send the next one: at once, or with ``transfer_rate`` once
        the chunks acknowledged so far are within the rate (each is counted at its packed size)."""
        rate = self.config.transfer_rate
        if not rate:
            self._emit(src, XferAck(d.xfer_id))
            return
        now = self._now
        due = max(now, self._ack_at)
        self._ack_at = due + (len(d.entries.blob) + XFER_OVERHEAD) / rate
        if due > now or self._acks_due:
            self._acks_due.append((due, src, d.xfer_id))
        else:
            self._emit(src, XferAck(d.xfer_id))

    def _on_xfer_fail(self, src: Address, f: XferFail) -> None:
        xf = self._in_xfers.get(f.xfer_id)
        if xf is None or xf.source != src:
            return
        for s in f.segments:
            if s in xf.remaining:
                xf.remaining.discard(s)
                self._fetch_tries[s] += 1
        if not xf.remaining:
            self._in_xfers.pop(f.xfer_id, None)
        self.metrics["grid.xfer_failed"] += len(f.segments)
        # Try another owner after a short pause (the source may just not have caught up with us).
        self._refetch_at = self._now + self.config.retry_backoff


def _tx_reason(text: str) -> str:
    """The stable reason for the core's rollback explanation (its texts are for people)."""
    if "changed since it was read" in text or text.startswith("conflict:"):
        return REASON_CONFLICT
    if text.startswith(f"{REASON_FULL}:"):
        return REASON_FULL
    if "lock timeout" in text:
        return REASON_LOCK_TIMEOUT
    if "timed out" in text:
        return REASON_TIMEOUT
    if "unavailable" in text:
        return REASON_UNAVAILABLE
    return REASON_ROLLED_BACK


def _batches(
    store: SegmentStore, xid: int, segments: list[int], max_entries: int, max_bytes: int
) -> Iterator[XferData]:
    """The stream of one FETCH: chunks per segment, each segment's last chunk marking it done."""
    n = len(segments)
    for i, s in enumerate(segments):
        it = store.segment_chunks(s, max_entries, max_bytes)
        prev: Columns | None = next(it, None)
        while prev is not None:
            nxt = next(it, None)
            if nxt is None:
                break
            yield XferData(xid, s, EntryChunk(*prev, store.expiries_of(s, prev[0], prev[1])), (), False)
            prev = nxt
        keys, versions, values = prev or ([], [], [])
        chunk = EntryChunk(keys, versions, values, store.expiries_of(s, keys, versions))
        yield XferData(xid, s, chunk, (s,), i == n - 1)


def _approx_size(msg: GridMessage) -> int:
    kind = type(msg)
    if kind is BackupBatch or kind is CommandBatch or kind is ResponseBatch or kind is BackupAckBatch:
        return msg.nbytes + 24 * len(msg) + 32  # type: ignore[union-attr,arg-type]
    if kind is XferData:
        return len(msg.entries.blob) + 32  # type: ignore[union-attr]  # packed once, reused by the encoder
    if kind is Command or kind is Backup:
        return len(msg.key) + (len(msg.value) if msg.value else 0) + 48  # type: ignore[union-attr]
    if kind is Response:
        return (len(msg.value) if msg.value else 0) + 48  # type: ignore[union-attr]
    if kind is Topology or kind is Status:
        return 8192
    if kind in _TX_KINDS:
        return _tx_approx_size(msg)  # type: ignore[arg-type]
    return 32
