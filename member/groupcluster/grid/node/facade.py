"""GridNode, the facade: the driver's calls, the dispatch table (message type -> handler), the outbox and
requests held for a topology not installed yet. It holds what every part reads (address, config, view,
topology, store, planner, metrics, the time of the step) and builds the parts, each of which holds its own
state and reaches the others through the node (see the package docstring for the map)."""

from __future__ import annotations

import dataclasses
import logging
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from ...core.address import Address
from ...core.errors import WireError
from ..columns import BATCH_MAX_ENTRIES, BackupAckBatch, BackupBatch, CommandBatch, ResponseBatch
from ..consistent_hash import segment_of
from ..messages import (
    DELETE,
    GET,
    PUT,
    RETRY,
    Backup,
    BackupAck,
    Command,
    Confirm,
    Fetch,
    Response,
    Status,
    Topology,
    XferAck,
    XferCancel,
    XferData,
    XferFail,
)
from ..payload import DEFAULT_LIMITS, GridLimits, GridMessage, decode_payload, encode_payload
from ..rebalance import RebalancePlanner
from ..store import (
    SegmentStore,
    TransferEntry,
)
from ..topology import (
    CacheTopology,
    Phase,
)
from ..tx.coordinator import TxCoordinator
from ..tx.messages import (
    TxAck,
    TxCommit,
    TxId,
    TxInfoAck,
    TxLock,
    TxLockInfo,
    TxPrepare,
    TxReportAnswer,
    TxReportRequest,
    TxRollback,
    TxVote,
)
from ..tx.messages import approx_size as _tx_approx_size
from ..tx.participant import TxTable
from ..tx.records import InDoubt, TxReport
from ..tx.resolution import TxResolver
from .capacity import EntryBounds
from .config import MAX_CAPACITY, GridConfig
from .events import EVENT_WRITTEN, EntryEventLog, EntryEvents
from .expiry import Expiry, _check_expires
from .hooks import NO_HOOKS, NodeHooks
from .membership import Membership
from .operations import Operations
from .replication import Replication
from .restore import Restore
from .results import OpResult, Outgoing
from .routes import _Routes
from .transactions import Transactions
from .transfer_in import StateConsumer
from .transfer_out import StateProvider

log = logging.getLogger("groupcluster.grid")

MAX_PAYLOAD_SPLIT = 1024 * 1024  # a payload is cut near this size (the transport fragments beyond its MTU)
# Entries of dropped segments freed per slice (SegmentStore.collect), at most one slice per FREE_INTERVAL.
# A slice of 2,048 cost ~1 ms of CPU; freed on every step, back to back, the three old owners of a 1M-entry
# rebalance each spent ~80 ms of CPU in a row after the last topology, on a 2-core machine with the joiner
# and the writer, and single writes there took 10-25 ms. Paced, freeing takes ~10% of a core
# (~1.2 s for a member's ~250,000 entries and feed-log entries) and operations find the CPUs free.
FREE_PER_STEP = 1024
FREE_INTERVAL = 0.005
# Transfer chunks applied or produced per step while operations may be waiting (see GridNode.defer_transfer).
DEFERRED_CHUNKS_PER_STEP = 1

_TX_TYPES = (
    TxLock,
    TxPrepare,
    TxVote,
    TxCommit,
    TxRollback,
    TxAck,
    TxLockInfo,
    TxInfoAck,
    TxReportRequest,
    TxReportAnswer,
)
_TX_KINDS: frozenset[type] = frozenset(_TX_TYPES)


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
        hooks: NodeHooks = NO_HOOKS,
    ) -> None:
        self.address = address
        self.config = config or GridConfig()
        self.limits = limits
        # Where an extension takes part in a step (the change feed: its store, installs, re-drives).
        self.hooks = hooks
        self.view: tuple[Address, ...] = ()
        self.topology: CacheTopology | None = None
        self.store: SegmentStore | None = None
        self.planner: RebalancePlanner | None = None
        self.leaving = False
        self.ready_to_leave = False
        self.metrics: Counter[str] = Counter()
        self._now = 0.0
        # Wall-clock seconds minus the ``now`` we are given (the driver's clock may be monotonic): the sequence
        # part of the versions we stamp is at least the wall clock in milliseconds (store.next_seq), so a
        # version dates its write and the merge of two grids that never met keeps the later write (docs/grid.md).
        # 0 (unit tests): sequences count from 1.
        self.wall_offset = 0.0
        self._queued: deque[tuple[float, int, Address, GridMessage]] = deque()
        self._collect_at = 0.0  # when the next slice of dropped segments may be freed (see FREE_INTERVAL)
        self._routes_cache: _Routes | None = None
        self._loop: deque[tuple[Address, GridMessage]] = deque()
        # Transfer work waits behind operations. With ``defer_transfer``, :meth:`on_messages` handles client
        # operations, backups and their answers at once and holds back transfer chunks (XFER_DATA, applied
        # later) and their acknowledgements (XFER_ACK, which produce the next chunk); :meth:`next_deadline`
        # asks for a step at once and each :meth:`tick` handles them in arrival order until one chunk was
        # applied or produced. So a write's backup or answer leaves before the transfer work of its step, and
        # a driver's other inputs (the next delivered batch, HTTP requests) wait behind one chunk, not all
        # chunks of a delivered batch: with 4 members on 2 cores, single writes during a rebalance waited
        # behind 1-2 ms of chunk work per hop. Every other message that arrives while some are held
        # back queues behind them, in order, so a chunk is never overtaken by a topology, a fetch or a cancel
        # (see StateProvider._pump, seed 39); a view change first handles everything held back. Operations may overtake
        # chunks: stores keep the newest version whichever comes first, and an operation sent after a
        # topology carries its id, so it waits for that topology (_hold) as if it had arrived before it.
        self.defer_transfer = True
        self._deferred: deque[tuple[Address, GridMessage]] = deque()
        self._out: dict[Address | None, list[GridMessage]] = {}
        self._outbox: list[Outgoing] = []
        self._results: list[OpResult] = []
        # -- the parts, each with its own state (the package docstring maps them); they reach each other through
        # the node
        self.membership = Membership(self)
        self.operations = Operations(self)
        self.replication = Replication(self)
        self.consumer = StateConsumer(self)
        self.provider = StateProvider(self)
        self.transactions = Transactions(self)
        self.bounds = EntryBounds(self)
        self.expiry = Expiry(self)
        self.events = EntryEventLog(self)
        self.persistence = Restore(self)
        # -- transactions (docs/grid-transactions.md)
        tcfg = self.tx_config = self.config.tx_config()
        self.tx = TxTable(
            address,
            tcfg,
            segment_of=self.transactions.tx_segment,
            version_of=self.transactions.tx_version,
            stamp=self.transactions.tx_stamp,
            apply=self.transactions.tx_apply,
            room=self.transactions.tx_room if self.config.max_entries or self.config.max_bytes else None,
        )
        self.txc = TxCoordinator(address, self.transactions.tx_route, tcfg)
        self.txr = TxResolver(address, tcfg)  # automatic resolution of in-doubt transactions, on the coordinator
        self.txr.enabled = self.config.tx_auto_resolve
        self._handlers = self._dispatch_table()

    # ==== entry events =====================================================================================
    def set_event_kinds(self, kinds: Iterable[str]) -> None:
        """Which entry events to produce (empty: none, the default, at no cost). The driver collects them with
        :meth:`take_events` after every step; each batch is also counted in ``grid.events_<kind>``."""
        self.events.set_event_kinds(kinds)

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
        self.persistence.restore(entries, topology_floor, expiries)

    @property
    def event_kinds(self) -> frozenset[str]:
        return self.events.event_kinds

    def take_events(self) -> list[EntryEvents]:
        """The entry event batches produced since the last call, in the order they happened."""
        return self.events.take_events()

    @property
    def restore_outcome(self) -> str:
        """What became of the restored entries: "" until the first topology, then "merged" (formed a new grid:
        pushed as a merge) or "discarded"."""
        return self.persistence.restore_outcome

    # ==== inputs ===========================================================================================
    def on_view(self, members: Sequence[Address], now: float, *, merge: bool = False) -> None:
        """A new group view (``merge`` True for a merge view)."""
        self.membership.on_view(members, now, merge=merge)

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
        elif self.provider.pumping:
            self.provider.step()
        if self.planner is not None:
            self.membership.planner_out(self.planner.on_tick(now))
        while self._queued and self._queued[0][0] <= now:
            _, _, src, msg = self._queued.popleft()
            self._reject_held(src, msg)
        self.operations.ops_tick(now)
        self.consumer.tick(now)
        self.expiry.tick(now)
        self.transactions.tx_tick(now)
        self._flush()

    def next_deadline(self) -> float | None:
        """When :meth:`tick` must be called next (None: nothing is timed)."""
        times = [
            t
            for t in (self.planner.next_deadline() if self.planner else None, self.consumer.refetch_at)
            if t is not None
        ]
        if self._queued:
            times.append(self._queued[0][0])
        expiry = self.expiry.tombstone_expiry()
        if expiry is not None:
            times.append(expiry)
        if self.consumer.acks_due:
            times.append(self.consumer.acks_due[0][0])
        if self._deferred or self.provider.pumping:
            times.append(self._now)  # held-back transfer work: the next chunk in a step of its own
        if self.store is not None and self.store._garbage:
            times.append(self._collect_at)  # dropped segments still to free: the next slice (see _flush)
        tx_next = self.transactions.tx_next_deadline()
        if tx_next is not None:
            times.append(tx_next)
        if self.store is not None and self.store._expiring:
            times.append(self.store._expiring[0][0] - self.wall_offset)  # the next entry to expire (Unix time)
        times.extend(self.operations.ops_deadlines())
        return min(times) if times else None

    # -- client operations ----------------------------------------------------------------------------------
    # Each takes the client's ``deadline`` (node time; None: none), after which the operation sends no attempt
    # and ends as timed out (see docs/grid.md, "Client deadlines"). The grid's own ``op_timeout`` still applies.
    def get(self, key: bytes, now: float, deadline: float | None = None) -> int:
        return self.operations.start_op(GET, key, None, now, deadline)

    def put(self, key: bytes, value: bytes, now: float, deadline: float | None = None, expires: float = 0.0) -> int:
        """``expires``: when the entry expires, as a Unix time (0.0: never); see docs/grid.md, "Expiry"."""
        if type(value) is not bytes:
            raise TypeError(f"value: expected bytes, got {type(value).__name__}")
        if len(value) > self.limits.max_value_bytes:
            raise ValueError(f"value: {len(value)} bytes exceed the limit of {self.limits.max_value_bytes}")
        _check_expires(expires, "expires")
        return self.operations.start_op(PUT, key, value, now, deadline, expires)

    def delete(self, key: bytes, now: float, deadline: float | None = None) -> int:
        return self.operations.start_op(DELETE, key, None, now, deadline)

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
        return self.operations.start_batch(ops, now, deadline, expiries)

    def leave(self, now: float) -> None:
        """Ask to leave: the coordinator moves our segments away; :attr:`ready_to_leave` turns True after."""
        self._now = now
        if not self.leaving:
            self.leaving = True
            self.membership.send_status()
            self.membership.check_ready()
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
            self.membership.send_status()
        self._flush()

    def force_available(self, now: float) -> bool:
        """Operator's override on the coordinator: accept what the missing owners took with them and leave
        degraded mode with the members present. Returns False on a member that is not the coordinator."""
        self._now = now
        if self.planner is None:
            return False
        self.membership.planner_out(self.planner.force_available())
        self._flush()
        return True

    # -- outputs --------------------------------------------------------------------------------------------
    def reads_locally(self, key: bytes) -> bool:
        """Whether a GET of ``key`` issued here now is answered from this member's own copy (no hop)."""
        t = self.topology
        if t is None:
            return False
        return bool(self._routes(t).i_read[segment_of(key, t.num_segments)])

    def installed_store(self) -> SegmentStore:
        """The store, which exists from the first installed topology on: a RuntimeError before, for a path that
        needs it and was reached without a topology."""
        store = self.store
        if store is None:
            raise RuntimeError("grid node: no store before the first topology is installed")
        return store

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
        return self.membership.merge_from is not None or any(pw.merge for pw in self.replication.writes.values())

    @property
    def pending_ops(self) -> int:
        return len(self.operations.ops)

    @property
    def transfer_pending(self) -> bool:
        """True while this member still has segments to receive (``/readyz`` is not ready then)."""
        t = self.topology
        if t is None or t.phase != Phase.READ_OLD_WRITE_ALL:
            return False
        return not self.consumer.to_fetch(t) <= self.consumer.fetched

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
            need = self.consumer.to_fetch(t) if t.phase == Phase.READ_OLD_WRITE_ALL else frozenset()
            out["rebalance"] = {"segments_to_fetch": len(need), "segments_fetched": len(need & self.consumer.fetched)}
        return out

    # ==== dispatch =========================================================================================
    def _dispatch_table(self) -> dict[type, Callable[[Address, Any], None]]:
        """Message type -> handler: every grid message a member may receive, and the part that handles it."""
        table: dict[type, Callable[[Address, Any], None]] = {
            BackupBatch: self.replication.on_backup_batch,
            BackupAckBatch: self.replication.on_backup_ack_batch,
            CommandBatch: self.replication.on_command_batch,
            ResponseBatch: self.operations.on_response_batch,
            Command: self.replication.on_command,
            Response: self.operations.on_response,
            Backup: self.replication.on_backup,
            BackupAck: self.replication.on_backup_ack,
            XferData: self.consumer.on_xfer_data,
            XferAck: self.provider.on_xfer_ack,
            Fetch: self.provider.on_fetch,
            Topology: self.membership.on_topology,
            Confirm: self.membership.on_confirm,
            Status: self.membership.on_status,
            XferCancel: self.provider.on_xfer_cancel,
            XferFail: self.consumer.on_xfer_fail,
        }
        for kind in _TX_KINDS:
            table[kind] = self.transactions.on_tx
        return table

    def _handle(self, src: Address, msg: GridMessage) -> None:
        handler = self._handlers.get(type(msg))
        if handler is not None:
            handler(src, msg)

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
        while self._loop or self.membership.statuses_in:
            while self._loop:
                src, msg = self._loop.popleft()
                self._handle(src, msg)
            if self.membership.statuses_in and self.planner is not None:
                st, self.membership.statuses_in = self.membership.statuses_in, {}
                self.membership.planner_out(self.planner.on_statuses(st, self._now))
            elif self.planner is None:
                self.membership.statuses_in.clear()
        self.membership.check_ready()
        written = self.events.written
        if written is not None and written[0]:
            self.events.event(EVENT_WRITTEN, -1, *written)
            self.events.written = ([], [], [])
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

    # ==== topology =========================================================================================
    def _routes(self, t: CacheTopology) -> _Routes:
        r = self._routes_cache
        if r is None or r.topology is not t:
            r = self._routes_cache = _Routes(t, self.address)
        return r

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

    # ==== transactions =====================================================================================
    # The client's calls (docs/grid-transactions.md, "Using transactions"); results come out of take_results.
    def tx_begin(self, now: float, mode: str | None = None) -> TxId:
        """Start a transaction on this member (its originator); ``mode`` "optimistic", "pessimistic" or None
        (``GridConfig.tx_locking``)."""
        return self.transactions.tx_begin(now, mode)

    def tx_lock(self, tx: TxId, keys: Sequence[bytes], now: float) -> int:
        """Pessimistic: lock ``keys`` on their primaries. The result is ok once all are locked; ok False (with a
        reason) means the transaction was rolled back."""
        return self.transactions.tx_lock(tx, keys, now)

    def tx_commit(self, tx: TxId, writes: Mapping[bytes, bytes | None], reads: Mapping[bytes, int], now: float) -> int:
        """Two-phase commit of ``writes`` (key -> value, None deletes), validating ``reads`` (key -> version
        read, 0 absent) on the primaries. The result is ok only once every owner acknowledged the commit."""
        return self.transactions.tx_commit(tx, writes, reads, now)

    def tx_rollback(self, tx: TxId, now: float) -> int:
        """Roll ``tx`` back; the result is ok once it is rolled back (at once: presumed abort)."""
        return self.transactions.tx_rollback(tx, now)

    def tx_in_doubt(self) -> list[InDoubt]:
        """This member's in-doubt transactions: prepared here, their originator gone; they keep their locks."""
        return self.transactions.tx_in_doubt()

    def tx_report(self, tx: TxId) -> TxReport:
        """What this member knows of ``tx`` (state, attempt, writes, versions): a resolver collects these from
        every member and decides with :func:`~.tx.termination_decision`."""
        return self.transactions.tx_report(tx)

    def tx_resolve(self, tx: TxId, commit: bool, now: float, versions: Mapping[bytes, int] | None = None) -> bool:
        """Resolve an in-doubt transaction here; False when ``tx`` is not in doubt on this member.

        Every member that lists ``tx`` in :meth:`tx_in_doubt` must be resolved the same way (decide with
        :func:`~.tx.termination_decision` over every member's :meth:`tx_report`). A commit needs a version for
        each written key this member holds: the ones stamped here, those in ``versions`` (from the other
        members' reports), and, for keys this member is the write primary of, fresh ones stamped now (the
        stamping primary is gone); any other missing one is a ValueError. The decision also goes, as a
        self-contained message, to the current write owners of the keys: owners that got the keys by state
        transfer after the prepare never saw it, and must apply (or release) it too."""
        return self.transactions.tx_resolve(tx, commit, now, versions)

    def tx_resolve_all(self, tx: TxId, commit: bool | None, now: float) -> int:
        """Resolve in-doubt ``tx`` on every member, from this one: ask every member of the view for its report
        (TX_REPORT_REQ), then decide, with ``commit`` (True/False: an operator's decision) or, when None, by the
        grid's own rule (:func:`~.tx.resolution`), and send the decision like the automatic resolver does.

        The result (``take_results``) has kind TX_RESOLVE_OP; ok with value ``b"commit"`` or ``b"rollback"``,
        else a reason: ``not_in_doubt`` (no member has it in doubt), ``undecided`` (``commit`` None and the rule
        cannot tell; the error says why), ``timeout`` (a member did not answer within ``op_timeout``),
        ``unavailable`` (the view changed meanwhile, or a merge is in progress: ask again)."""
        return self.transactions.tx_resolve_all(tx, commit, now)

    def tx_prepared_count(self) -> int:
        """Transactions prepared on this member as a participant (voted YES, no decision yet)."""
        return self.transactions.tx_prepared_count()

    @property
    def tx_pending(self) -> int:
        """Transactions this member originated that are not finished."""
        return len(self.txc.pending())

    def tx_undecided(self) -> dict[TxId, str]:
        """On the view coordinator: the in-doubt transactions its last resolution round could not decide, and
        why (an operator decides those: ``groupcluster tx resolve``)."""
        return self.transactions.tx_undecided()


def _approx_size(msg: GridMessage) -> int:
    # isinstance, which the type checker follows: none of these message classes has subclasses.
    if isinstance(msg, (BackupBatch, CommandBatch, ResponseBatch, BackupAckBatch)):
        return msg.nbytes + 24 * len(msg) + 32
    if isinstance(msg, XferData):
        return len(msg.entries.blob) + 32  # packed once, reused by the encoder
    if isinstance(msg, (Command, Backup)):
        return len(msg.key) + (len(msg.value) if msg.value else 0) + 48
    if isinstance(msg, Response):
        return (len(msg.value) if msg.value else 0) + 48
    if isinstance(msg, (Topology, Status)):
        return 8192
    if isinstance(msg, _TX_TYPES):
        return _tx_approx_size(msg)
    return 32
