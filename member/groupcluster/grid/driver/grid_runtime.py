"""GridRuntime: the thin adapter that runs a sans-IO :class:`~..node.GridNode` on a live group channel.

It moves views, delivered batches and time into the node and the node's payloads out to the group; it turns
client operations into awaitables completed by the node's results::

    grid = GridRuntime(GridConfig(), http_url="http://127.0.0.1:8080")
    ch = await Channel.connect(..., on_view=grid.on_view, on_messages=grid.on_messages)
    grid.bind(ch)
    await grid.put(b"k", b"v"); value = await grid.get(b"k")
    grid.leave(); await grid.wait_ready_to_leave(); await ch.leave()

**Multiplexing.** Every payload it sends starts with a one-byte tag (:data:`TAG_GRID` for node payloads,
:data:`TAG_INFO` for member info); payloads with another first byte go to the ``other`` callback unchanged
(the channel is shared with the member's test workload). Named caches (:mod:`..caches`) run one more
:class:`GridRuntime` each, with their own ``wire_prefix`` and the default runtime as ``parent``.

**Member info.** After every view change each member multicasts ``{"http": url, "clock": t, "low": id}``:
the endpoints for :meth:`GridRuntime.routing`, how far its clock is ahead of ours, and for the change feed
the oldest topology whose writes it may still re-drive.

**Binding late.** The node needs our address, which exists only once ``Channel.connect`` runs: events that
arrive before :meth:`GridRuntime.bind` are buffered in order and replayed into the node.

**Change feed.** The node runs with :class:`~..feed.ChangeFeed` as its hooks, so its store logs every write
it applies; :meth:`GridRuntime.changes` pages it up to :meth:`GridRuntime.stable_version` (docs/spark.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import math
import os
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import TYPE_CHECKING, Any

import msgpack

from ...core.address import Address
from ...core.message import Message
from ...core.view import View
from ..consistent_hash import segment_of
from ..errors import TX_ERRORS as _TX_ERRORS
from ..errors import (
    GridError,
    GridFull,
    GridLeaving,
    GridLocked,
    GridNotOwner,
    GridTimeout,
    GridTxAborted,
    GridTxBusy,
    GridTxConflict,
    GridTxError,
    GridTxNotFound,
    GridTxUnknown,
    GridUnavailable,
)
from ..feed import ChangeFeed, ChangePage, FeedStore, stable_bound
from ..messages import DELETE, GET, PUT
from ..node import EVENT_KINDS, EntryEvents, GridConfig, GridNode, OpResult, Outgoing
from ..store import Segment
from ..topology import Availability, CacheTopology, Phase
from ..tx.messages import TxId
from ..tx.participant import InDoubt, TxReport
from .gc_tuning import tune_gc
from .timer import NodeTimer

if TYPE_CHECKING:
    from ...runtime.channel import Channel

log = logging.getLogger("groupcluster.grid.runtime")

TAG_GRID = 0xF7
TAG_INFO = 0xF8
_GRID_PREFIX = bytes([TAG_GRID])
_INFO_PREFIX = bytes([TAG_INFO])
MAX_INFO_BYTES = 1024  # a member-info payload is a URL or two; anything bigger is a bad peer
# A peer whose clock is ahead of ours by more than this is logged (client deadlines allow 1 s by default).
CLOCK_AHEAD_WARNING = 1.0


def tx_error_for(result: OpResult, tx: TxId | None) -> GridTxError:
    """The exception for a failed transaction :class:`OpResult` (``reason`` set by the node; older text-only
    results are classified by their text as :func:`error_for` does)."""
    reason = getattr(result, "reason", "") or ""
    if not reason:
        text = result.error
        reason = "unavailable" if "unavailable" in text else "timeout" if "timed out" in text else "rolled_back"
    cls = _TX_ERRORS.get(reason, GridTxAborted)
    where = f"transaction {tx}" if tx is not None else "transaction"
    return cls(f"{where}: {result.error or reason}", reason, tx)


@dataclass(slots=True)
class _Interactive:
    """An interactive transaction begun over HTTP: rolled back if no request touches it for ``tx_timeout``."""

    tx: TxId
    mode: str
    deadline: float
    busy: bool = False
    handle: asyncio.TimerHandle | None = None


MAX_ENDED = 10_000  # ended transactions remembered, so a late request gets a precise answer
MAX_INTERACTIVE = 10_000  # interactive transactions open at once on one member


@dataclass(frozen=True, slots=True)
class SegmentPage:
    """One page of a segment scan: entries ``(key, value, version)`` in key order, after the cursor given."""

    segment: int
    topology_id: int
    entries: list[tuple[bytes, bytes, int]]
    more: bool  # True: entries after the last one exist; ask again with ``after`` = the last key


KIND_NAMES = {GET: "get", PUT: "put", DELETE: "delete"}

_KIND_OF = attrgetter("kind")
_OK_OF = attrgetter("ok")
_ATTEMPTS_OF = attrgetter("attempts")


class _BatchWait:
    """The results of one batch, filled in as the node reports them; ``done`` resolves with the last one.

    The node numbers a batch's operations consecutively, so an operation's place in the batch is its id
    less the first one (``index`` maps them only if they ever were not)."""

    __slots__ = ("done", "first", "index", "remaining", "results")

    def __init__(self, ids: list[int], fut: asyncio.Future[list[OpResult]]) -> None:
        self.results: list[OpResult | None] = [None] * len(ids)
        self.remaining = len(ids)
        self.done = fut
        self.first = ids[0]
        self.index = None if ids[-1] - ids[0] == len(ids) - 1 else {op: i for i, op in enumerate(ids)}

    def complete(self) -> list[OpResult]:
        """The results, once every operation reported one (``remaining`` is 0)."""
        out = [r for r in self.results if r is not None]
        if len(out) != len(self.results):
            raise RuntimeError(f"batch: {len(self.results) - len(out)} results missing at completion")
        return out


def error_for(result: OpResult) -> GridError:
    """The exception for a failed :class:`OpResult` (``reason`` set by the node, the text says more)."""
    if result.reason == "locked":
        return GridLocked(result.error)
    if result.reason == "full":
        return GridFull(result.error)
    if "unavailable" in result.error:
        return GridUnavailable(result.error)
    if "timed out" in result.error:
        return GridTimeout(result.error)
    return GridError(result.error or "operation failed")


class GridRuntime(NodeTimer[GridNode]):
    """Drives one :class:`GridNode` from a channel's callbacks and the event loop's clock."""

    def __init__(
        self,
        config: GridConfig | None = None,
        *,
        http_url: str | None = None,
        other: Callable[[list[Message]], Any] | None = None,
        name: str = "default",
        wire_prefix: bytes = _GRID_PREFIX,
        parent: GridRuntime | None = None,
    ) -> None:
        self.config = config or GridConfig()
        # A named cache (grid/caches.py) runs its own node behind its own wire prefix and shares the default
        # cache's member info: the endpoints map is the parent's object (pruned in place), and it announces none.
        self.name = name
        self._prefix = wire_prefix
        self._parent = parent
        tune_gc()
        self.http_url = http_url
        self.other = other
        self.ch: Channel | None = None
        self.node: GridNode | None = None
        # The change feed's hooks in the node (created at bind): the node's store logs every write it applies.
        self.feed = ChangeFeed(persistent=self.config.persistence == "write_through")
        self.endpoints: dict[Address, str] = parent.endpoints if parent is not None else {}
        self.counters: Counter[str] = Counter()
        self._loop = asyncio.get_running_loop()
        self._early: list[tuple[str, Any]] = []
        self._waiting: dict[int, asyncio.Future[OpResult]] = {}
        self._in_batch: dict[int, _BatchWait] = {}  # op id -> its batch
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self._ready_to_leave = asyncio.Event()
        self._closed = False
        # The change feed's stability: per member, the lowest topology id whose versions may still arrive
        # from it (announced with the member info); ours is computed, what we announced last is remembered.
        self.unfinished: dict[Address, int] = {}
        # Per member, how far its clock was ahead of ours when its last member info arrived (at least: the
        # delivery delay only makes it look less ahead). Client deadlines and the merge of grids that never met
        # assume the members' clocks agree; this makes a member that is off visible (docs/grid.md).
        self.peer_clock_ahead: dict[Address, float] = {}
        self._clock_warned: set[Address] = set()
        self._announced_low: int | None = None
        self._low_topology = -1
        self._routing_cache: tuple[CacheTopology, list[str | None], dict[str, Any]] | None = None
        self._seen_topology: CacheTopology | None = None
        self.topology_installed_at: float | None = None
        # Interactive transactions begun here (HTTP), and how recently ended ones ended (for clear answers).
        self.interactive: dict[TxId, _Interactive] = {}
        self._ended: OrderedDict[TxId, str] = OrderedDict()
        # Entry-event listeners: handle -> (callable, kinds it wants). See add_listener.
        self._listeners: dict[int, tuple[Callable[[list[EntryEvents]], Any], frozenset[str]]] = {}
        self._next_listener = 1
        # The SQLite copy with persistence=write_through (grid/persist.py): a file path is opened now, so a bad
        # path fails the member's start with a clear error; a directory gets one file per bind address, opened
        # at bind (the address exists only then). Loaded into the node at bind.
        self._backing: Any = None
        if self.config.persistence == "write_through" and not os.path.isdir(self.config.persistence_path):
            from ..persist import SqliteBacking

            self._backing = SqliteBacking(self.config.persistence_path)

    # ==== entry events =======================================================================================
    def add_listener(self, fn: Callable[[list[EntryEvents]], Any], kinds: Iterable[str] | None = None) -> int:
        """Call ``fn(batches)`` after every step of the node that produced entry events of ``kinds`` (default:
        all of ``arrived``, ``departed``, ``written``), with the list of :class:`~.node.EntryEvents` of those
        kinds, in order. Called on the event loop: keep it short (hand heavy work to a task or a queue). An
        exception is logged and counted (``listener_errors``), never passed on. Returns a handle for
        :meth:`remove_listener`. With no listener the node produces no events at all."""
        wanted = EVENT_KINDS if kinds is None else frozenset(kinds)
        bad = wanted - EVENT_KINDS
        if not wanted or bad:
            raise ValueError(f"add_listener: kinds {sorted(bad) or '(none)'} not among {sorted(EVENT_KINDS)}")
        if not callable(fn):
            raise TypeError(f"add_listener: {fn!r} is not callable")
        handle = self._next_listener
        self._next_listener += 1
        self._listeners[handle] = (fn, wanted)
        self._sync_event_kinds()
        return handle

    def remove_listener(self, handle: int) -> bool:
        """Stop calling a listener; False if the handle is not registered."""
        if self._listeners.pop(handle, None) is None:
            return False
        self._sync_event_kinds()
        return True

    def _sync_event_kinds(self) -> None:
        if self.node is None:
            return  # bind() sets them
        kinds: set[str] = set(EVENT_KINDS) if self.config.count_events else set()
        for _, wanted in self._listeners.values():
            kinds |= wanted
        self.node.set_event_kinds(kinds)

    def _dispatch_events(self, events: list[EntryEvents]) -> None:
        for fn, wanted in list(self._listeners.values()):
            mine = events if len(wanted) == len(EVENT_KINDS) else [e for e in events if e.kind in wanted]
            if not mine:
                continue
            try:
                fn(mine)
            except Exception:
                # A listener is user code: its failure must not stop the member (nor the other listeners).
                self.counters["listener_errors"] += 1
                if self.counters["listener_errors"] <= 10 or self.counters["listener_errors"] % 1000 == 0:
                    log.exception("entry listener %r failed (%d failures so far)", fn, self.counters["listener_errors"])

    # ==== channel callbacks (register them with Channel.connect) ============================================
    def on_view(self, view: View) -> None:
        if self.node is None:
            self._early.append(("view", view))
            return
        self.node.on_view(view.members, self._loop.time(), merge=view.is_merge)
        members = set(view.members)
        for gone in [a for a in self.endpoints if a not in members]:
            del self.endpoints[gone]  # in place: named caches share this map
        self.unfinished = {a: v for a, v in self.unfinished.items() if a in view.members}
        self.peer_clock_ahead = {a: v for a, v in self.peer_clock_ahead.items() if a in members}
        self._announced_low = None  # new members need to hear it
        self._announce()
        self._pump()

    def on_messages(self, msgs: list[Message]) -> None:
        grid: list[tuple[Address, bytes]] = []
        others: list[Message] = []
        me = self.ch.address if self.ch is not None else None
        for m in msgs:
            p = m.payload
            tag = p[0] if p else -1
            if tag == TAG_GRID:
                # Our own copy of a multicast: the node already handled what it sent to itself.
                if m.dest is None and m.src == me:
                    continue
                grid.append((m.sender(), p[1:]))
            elif tag == TAG_INFO:
                self._on_info(m.sender(), p)
            else:
                others.append(m)
        if others and self.other is not None:
            self.other(others)
        if grid:
            self.deliver(grid)

    def deliver(self, grid: list[tuple[Address, bytes]]) -> None:
        """Payloads for our node, tag already stripped and our own multicast copies already left out."""
        if self.node is None:
            # Before bind we cannot tell our own multicast copies apart; bind() filters them.
            self._early.append(("msgs", grid))
            return
        self.node.on_messages(grid, self._loop.time())
        self._pump()

    def bind(self, ch: Channel) -> None:
        """Create the node now that the channel (and so our address) exists, and replay what came before."""
        self.ch = ch
        self.node = GridNode(ch.address, self.config, hooks=self.feed)
        # The node is given the loop's (monotonic) time; versions carry wall-clock time (store.next_seq).
        self.node.wall_offset = time.time() - self._loop.time()
        self._sync_event_kinds()
        if self.config.persistence == "write_through" and self._backing is None:
            from ..persist import SqliteBacking

            a = ch.address
            # Named caches (grid/caches.py) keep a file of their own beside the default cache's.
            suffix = "" if self._parent is None else f"-{self.name}"
            name = f"grid-{a.host}-{a.port}{suffix}.sqlite"
            self._backing = SqliteBacking(os.path.join(self.config.persistence_path, name))
        if self._backing is not None:
            entries, expiries = self._backing.load()
            self.node.restore(entries, self._backing.topology_id, expiries)
            log.info(
                "persistent store %s: %d entries, topology id up to %d (merged if this member forms a new grid with "
                "the others, cleared if it joins a running grid)",
                self._backing.path,
                len(entries),
                self._backing.topology_id,
            )
        early, self._early = self._early, []
        for kind, item in early:
            if kind == "view":
                self.on_view(item)
            else:
                batch = [(src, p) for src, p in item if src != ch.address]
                if batch:
                    self.node.on_messages(batch, self._loop.time())
                    self._pump()
        if ch.view is not None and (self.node.view != ch.view.members):
            self.on_view(ch.view)
        self._announce()
        self._pump()

    # ==== client operations ==================================================================================
    # ``deadline``: the client's deadline as a Unix time (the X-Grid-Deadline header), or None. After it the
    # operation sends no further attempt and fails with GridTimeout (docs/grid.md, "Client deadlines").
    async def get(self, key: bytes, deadline: float | None = None) -> bytes | None:
        """The value of ``key`` (None: absent). Raises :class:`GridError` subclasses."""
        res = await self._run(GET, key, None, deadline)
        return res.value

    async def put(
        self, key: bytes, value: bytes, deadline: float | None = None, lifespan: float | None = None
    ) -> OpResult:
        """Write ``key``; with a ``lifespan`` (seconds) the entry expires that long after now, this member's
        clock (docs/grid.md, "Expiry"). Raises ValueError for a lifespan this member cannot take."""
        return await self._run(PUT, key, value, deadline, self._expires(lifespan))

    def _expires(self, lifespan: float | None) -> float:
        """The expiry (a Unix time; 0.0: never) of an entry written now with ``lifespan`` seconds."""
        if lifespan is None:
            return 0.0
        if type(lifespan) not in (int, float) or not 0 < lifespan < math.inf:
            raise ValueError(f"lifespan: expected a positive, finite number of seconds, got {lifespan!r}")
        return time.time() + float(lifespan)

    async def delete(self, key: bytes, deadline: float | None = None) -> OpResult:
        return await self._run(DELETE, key, None, deadline)

    def _node_time(self, now: float, deadline: float | None) -> float | None:
        """A Unix-time deadline on the node's clock (the event loop's), read against the wall clock now (not a
        stored offset: the wall clock may have been stepped since)."""
        return None if deadline is None else now + (deadline - time.time())

    async def _run(
        self, kind: int, key: bytes, value: bytes | None, deadline: float | None = None, expires: float = 0.0
    ) -> OpResult:
        node = self._require_node()
        if node.leaving:
            raise GridLeaving("this member is leaving the grid; use another member")
        now = self._loop.time()
        cutoff = self._node_time(now, deadline)
        if kind == GET:
            if self._parent is not None and node.reads_locally(key):
                # Named caches count reads answered from our own copy (no hop: what replicated mode is for); the
                # default cache skips the extra key hash on its hot path.
                self.counters["ops_get_local"] += 1
            op = node.get(key, now, cutoff)
        elif kind == PUT:
            if value is None:
                raise TypeError("put: value must be bytes, got None")
            op = node.put(key, value, now, cutoff, expires)
        else:
            op = node.delete(key, now, cutoff)
        fut: asyncio.Future[OpResult] = self._loop.create_future()
        self._waiting[op] = fut
        self._pump()
        res = await fut
        self.counters[f"ops_{'get' if kind == GET else 'put' if kind == PUT else 'delete'}"] += 1
        if not res.ok:
            self.counters["ops_failed"] += 1
            raise error_for(res)
        if res.attempts > 1:
            self.counters["ops_retried"] += 1
        return res

    async def run_batch(
        self,
        ops: Sequence[tuple[int, bytes, bytes | None]],
        deadline: float | None = None,
        lifespans: Sequence[float | None] | None = None,
    ) -> list[OpResult]:
        """Run ``(kind, key, value)`` operations together; one :class:`OpResult` each, in order, failures included.

        All start in one step of the node. The whole batch is refused (:class:`GridUnavailable`) only when
        this member cannot take operations at all (not joined, leaving); a segment that is unavailable or an
        operation that times out fails that operation alone. Bad kinds, keys or values raise ValueError or
        TypeError before anything starts (:meth:`GridNode.start_batch` checks every operation first).
        ``lifespans`` (None: none) gives each PUT's lifespan in seconds (None: never expires), one per operation.
        """
        node = self._require_node()
        if node.leaving:
            raise GridLeaving("this member is leaving the grid; use another member")
        expiries = None
        if lifespans is not None:
            if len(lifespans) != len(ops):
                raise ValueError(f"lifespans: {len(lifespans)} for {len(ops)} operations")
            expiries = [self._expires(x) for x in lifespans]
        now = self._loop.time()
        ids = node.start_batch(ops, now, self._node_time(now, deadline), expiries)
        if not ids:
            return []
        fut: asyncio.Future[list[OpResult]] = self._loop.create_future()
        wait = _BatchWait(ids, fut)
        self._in_batch.update(dict.fromkeys(ids, wait))
        self._pump()
        results: list[OpResult] = await fut
        # Counted per kind in one pass (a counter update per operation showed in profiles of batch writes),
        # with C-level passes over the columns where they say the same.
        kinds = Counter(map(_KIND_OF, results))
        counters = self.counters
        for kind, n in kinds.items():
            counters[f"ops_{KIND_NAMES[kind]}"] += n
        failed = list(map(_OK_OF, results)).count(False)
        if failed:
            counters["ops_failed"] += failed
            retried = sum(1 for res in results if res.ok and res.attempts > 1)
        else:
            retried = len(results) - list(map(_ATTEMPTS_OF, results)).count(1)
        if retried:
            counters["ops_retried"] += retried
        counters["batches"] += 1
        return results

    def versions_of(
        self, ops: Sequence[tuple[int, bytes, bytes | None]], results: Sequence[OpResult]
    ) -> list[int | None]:
        """For each successful get of ``ops`` that found a value, its version when this member holds the key's
        segment and still has that value (a client routes gets to a read owner, so it usually does); None
        otherwise. The node's answers carry values only, so the version comes from the local copy."""
        node = self.node
        store = node.store if node is not None else None
        t = node.topology if node is not None else None
        out: list[int | None] = []
        for (kind, key, _), res in zip(ops, results, strict=True):
            version = None
            if kind == GET and res.ok and res.value is not None and store is not None and t is not None:
                entry = store.get(segment_of(key, t.num_segments), key)
                if entry is not None and entry[1] == res.value:
                    version = entry[0]
            out.append(version)
        return out

    # ==== transactions ========================================================================================
    async def get_versioned(self, key: bytes, deadline: float | None = None) -> tuple[bytes | None, int]:
        """``(value, version)`` of ``key``: value None and version 0 when absent. The version is what an
        optimistic transaction passes as its read of the key."""
        res = await self._run(GET, key, None, deadline)
        return res.value, res.version

    @property
    def tx_timeout(self) -> float:
        """How long an interactive transaction may go without a request before it is rolled back (the grid's
        ``tx_timeout``)."""
        return float(self.config.tx_timeout)

    async def tx_begin(self, mode: str | None = None, *, interactive: bool = False) -> TxId:
        """Start a transaction on this member (its originator). ``mode``: ``"optimistic"``, ``"pessimistic"``
        or None (the grid's default); a bad mode raises ValueError. ``interactive``: it is driven by later
        requests (HTTP), so it is rolled back after :attr:`tx_timeout` without one."""
        node = self._require_node()
        if node.leaving:
            raise GridLeaving("this member is leaving the grid; use another member")
        if interactive and len(self.interactive) >= MAX_INTERACTIVE:
            # Each holds state (and maybe locks) until its tx_timeout: a bound keeps a flood of begins harmless.
            raise GridUnavailable(
                f"{len(self.interactive)} interactive transactions are open on this member (the limit); "
                "finish some, or try again later"
            )
        tx = node.tx_begin(self._loop.time(), mode)
        self.counters["tx_begun"] += 1
        if interactive:
            entry = _Interactive(tx, mode or self.config.tx_locking, 0.0)
            self.interactive[tx] = entry
            self._touch(entry)
        self._pump()
        return tx

    async def tx_lock(self, tx: TxId, keys: Sequence[bytes]) -> None:
        """Pessimistic mode: lock ``keys`` on their primaries. On failure the transaction is rolled back and a
        :class:`GridTxError` subclass says why (e.g. ``lock_timeout``)."""
        node = self._require_node()
        entry = self._claim(tx)
        try:
            op = node.tx_lock(tx, list(keys), self._loop.time())
            res = await self._await_op(op)
        finally:
            self._release(entry)
        self.counters["tx_lock_requests"] += 1
        if not res.ok:
            self._ended_as(tx, f"rolled back: {res.error or res.reason}")
            self.counters["tx_aborted"] += 1
            raise tx_error_for(res, tx)

    async def tx_commit(
        self, tx: TxId, writes: Mapping[bytes, bytes | None], reads: Mapping[bytes, int] | None = None
    ) -> OpResult:
        """Commit ``writes`` (key -> value, None deletes) after validating ``reads`` (key -> version read,
        0 = absent). Returns once every owner applied it; raises a :class:`GridTxError` subclass otherwise
        (:class:`GridTxConflict` when a read changed). Bad keys or values raise ValueError/TypeError before
        anything starts, and the transaction stays open."""
        node = self._require_node()
        entry = self._claim(tx)
        try:
            op = node.tx_commit(tx, writes, reads or {}, self._loop.time())
        except BaseException:
            self._release(entry)
            raise
        # From here on the commit's own deadlines run in the node; no other request may touch it.
        self._ended_as(tx, "committing")
        try:
            res = await self._await_op(op)
        except GridUnavailable as exc:
            # This member left (or is closing) before the outcome came: the commit may have been decided.
            self._ended_as(tx, "outcome unknown (this member left during the commit)")
            raise GridTxUnknown(f"transaction {tx}: {exc}; it may or may not have committed", "unknown", tx) from None
        if res.ok:
            self._ended_as(tx, "committed")
            self.counters["tx_committed"] += 1
            return res
        self._ended_as(tx, f"rolled back: {res.error or res.reason}")
        self.counters["tx_aborted"] += 1
        err = tx_error_for(res, tx)
        if isinstance(err, GridTxConflict):
            self.counters["tx_conflicts"] += 1
        raise err

    async def tx_rollback(self, tx: TxId) -> None:
        """Roll the transaction back (a no-op for one the node no longer knows: it already ended)."""
        node = self._require_node()
        # Also while a lock request of it waits: the rollback ends the wait (that request fails).
        self._ended_as(tx, "rolled back by the client")
        try:
            op = node.tx_rollback(tx, self._loop.time())
        except ValueError:
            return  # unknown to the node: it ended already (rolled back)
        await self._await_op(op)
        self.counters["tx_rolled_back"] += 1

    async def transact(
        self,
        writes: Mapping[bytes, bytes | None],
        reads: Mapping[bytes, int] | None = None,
        *,
        mode: str | None = None,
        lock: Sequence[bytes] = (),
    ) -> tuple[TxId, OpResult]:
        """A one-shot transaction: begin, lock ``lock`` (pessimistic), commit. Raises as :meth:`tx_commit`; a
        bad request (ValueError/TypeError) rolls the transaction back before raising."""
        tx = await self.tx_begin(mode)
        try:
            if lock:
                await self.tx_lock(tx, lock)
        except GridTxError:
            raise  # the node rolled it back
        except BaseException:
            # A bad key, or the HTTP client went away while the locks were taken: do not leave it open.
            self._rollback_now(tx)
            raise
        try:
            return tx, await self.tx_commit(tx, writes, reads)
        except (ValueError, TypeError):
            self._rollback_now(tx)  # refused before anything started
            raise

    def tx_in_doubt(self) -> list[InDoubt]:
        """This member's in-doubt transactions (prepared, originator gone): see :meth:`tx_resolve`."""
        return list(self._require_node().tx_in_doubt())

    def tx_report(self, tx: TxId) -> TxReport:
        """What this member knows of ``tx`` (state, attempt, writes, versions stamped here): a resolver reads
        every member's and decides with :func:`~.tx.termination_decision`."""
        return self._require_node().tx_report(tx)

    def tx_resolve(self, tx: TxId, commit: bool, versions: Mapping[bytes, int] | None = None) -> bool:
        """An operator's decision for a transaction in doubt here; False when it is not in doubt here. A commit
        needs each written key's version: stamped here, given in ``versions`` (from other members' reports),
        or stamped now for keys this member is the write primary of; otherwise ValueError."""
        node = self._require_node()
        done = bool(node.tx_resolve(tx, commit, self._loop.time(), versions))
        if done:
            self.counters["tx_resolved_commit" if commit else "tx_resolved_rollback"] += 1
        self._pump()
        return done

    async def tx_resolve_all(self, tx: TxId, commit: bool | None) -> OpResult:
        """Resolve in-doubt ``tx`` on every member from this one (:meth:`GridNode.tx_resolve_all`): ``commit``
        True/False forces the decision, None lets the grid's rule decide. The result says what happened (ok:
        ``value`` b"commit" or b"rollback"; else ``reason`` not_in_doubt, undecided, timeout, unavailable)."""
        node = self._require_node()
        res = await self._await_op(node.tx_resolve_all(tx, commit, self._loop.time()))
        if res.ok:
            self.counters[f"tx_resolved_all_{res.value.decode() if res.value else ''}"] += 1
        return res

    def tx_ended(self, tx: TxId) -> str | None:
        """How a recently ended transaction of this member ended (None: not known to have ended)."""
        return self._ended.get(tx)

    def check_interactive(self, tx: TxId) -> None:
        """Raise :class:`GridTxNotFound` unless ``tx`` is an open interactive transaction of this member."""
        if tx not in self.interactive:
            ended = self._ended.get(tx)
            if ended is not None:
                raise GridTxNotFound(f"transaction {tx} has ended ({ended})", "not_found", tx)
            raise GridTxNotFound(
                f"no open transaction {tx} on this member (a transaction lives on the member that began it; "
                f"it is rolled back after {self.tx_timeout:g} s without a request, or when its member restarts)",
                "not_found",
                tx,
            )

    def _claim(self, tx: TxId) -> _Interactive | None:
        entry = self.interactive.get(tx)
        if entry is not None:
            if entry.busy:
                raise GridTxBusy(f"transaction {tx}: another request of it is still running", "busy", tx)
            entry.busy = True
        return entry

    def _release(self, entry: _Interactive | None) -> None:
        if entry is not None and self.interactive.get(entry.tx) is entry:
            entry.busy = False
            self._touch(entry)

    def _touch(self, entry: _Interactive) -> None:
        entry.deadline = self._loop.time() + self.tx_timeout
        if entry.handle is None:
            entry.handle = self._loop.call_at(entry.deadline, self._expire, entry.tx)

    def _expire(self, tx: TxId) -> None:
        entry = self.interactive.get(tx)
        if entry is None:
            return
        entry.handle = None
        now = self._loop.time()
        if entry.busy:
            return  # _release re-arms it
        if now < entry.deadline:
            entry.handle = self._loop.call_at(entry.deadline, self._expire, tx)
            return
        self._ended_as(tx, f"rolled back after {self.tx_timeout:g} s without a request")
        self.counters["tx_expired"] += 1
        node = self.node
        if node is not None and not self._closed:
            with contextlib.suppress(ValueError):  # the node ended it already
                node.tx_rollback(tx, now)
            self._pump()

    def _ended_as(self, tx: TxId, what: str) -> None:
        entry = self.interactive.pop(tx, None)
        if entry is not None and entry.handle is not None:
            entry.handle.cancel()
            entry.handle = None
        self._ended[tx] = what
        self._ended.move_to_end(tx)
        while len(self._ended) > MAX_ENDED:
            self._ended.popitem(last=False)

    def _rollback_now(self, tx: TxId) -> None:
        """Roll back without waiting for the answer (cleanup paths)."""
        self._ended_as(tx, "rolled back")
        node = self.node
        if node is None or self._closed:
            return
        try:
            node.tx_rollback(tx, self._loop.time())
        except ValueError:
            return
        self._pump()

    async def _await_op(self, op: int) -> OpResult:
        fut: asyncio.Future[OpResult] = self._loop.create_future()
        self._waiting[op] = fut
        self._pump()
        return await fut

    def scan_segment(
        self, segment: int, after: bytes | None = None, limit: int = 1000, max_bytes: int = 4 << 20
    ) -> SegmentPage:
        """Up to ``limit`` live entries of ``segment`` with keys above ``after``, in key order (one page).

        Served only by a member that reads the segment in the installed topology (it holds a complete copy);
        others raise :class:`GridNotOwner` naming the members that do. Key order makes the cursor stable
        while writes go on: a key present during the whole scan is returned exactly once.
        """
        node = self._require_node()
        t = node.topology
        assert t is not None and node.store is not None
        if not 0 <= segment < t.num_segments:
            raise ValueError(f"segment: {segment} is outside [0, {t.num_segments - 1}]")
        if limit < 1:
            raise ValueError(f"limit: expected at least 1, got {limit}")
        if node.leaving:
            raise GridLeaving("this member is leaving the grid; read the segment from another owner")
        if not t.can_read(segment):
            raise GridUnavailable(f"segment {segment} is unavailable for reads ({t.mode.value})")
        owners = t.read_owners(segment)
        if node.address not in owners or not node.store.has_segment(segment):
            urls = [self.endpoints.get(m) for m in owners]
            raise GridNotOwner(f"segment {segment} is not readable on this member; read it from its owners", urls)
        data = node.store.segments.get(segment) or Segment()
        # nsmallest keeps the page O(n log limit) without sorting the whole segment for every page.
        keys = heapq.nsmallest(
            limit + 1, (k for k, v in data.val.items() if v is not None and (after is None or k > after))
        )
        entries: list[tuple[bytes, bytes, int]] = []
        size = 0
        more = len(keys) > limit
        for k in keys[:limit]:
            version, value = data[k]
            assert value is not None
            size += len(k) + len(value)
            if entries and size > max_bytes:
                more = True
                break
            entries.append((k, value, version))
        self.counters["segment_pages"] += 1
        return SegmentPage(segment, t.topology_id, entries, more)

    def stable_version(self) -> int:
        """The version at or below which no write can still arrive at this member (:data:`ALL_STABLE`: none).

        A segment's versions under one topology come from its one primary, in order (FIFO channel), so the
        only writes that arrive out of version order are the re-driven ones: stamped under an older topology,
        pushed to the owners of a newer one. Every member announces the lowest topology it may still push
        such writes of (:meth:`ChangeFeed.oldest_unfinished`); once every member of the view announced at least
        our topology, nothing older can come and the whole log is stable. Until then only the versions of
        topologies before the lowest announced one are. A member not heard from yet counts as 0.
        """
        node = self._require_node()
        t = node.topology
        assert t is not None
        others = (self.unfinished.get(m, 0) for m in node.view if m != node.address)
        return stable_bound(t.topology_id, self.feed.oldest_unfinished(node), others)

    def changes(self, segment: int, after: int, limit: int = 1000, max_bytes: int = 4 << 20) -> ChangePage:
        """One page of the change feed of ``segment`` after version ``after`` (see :class:`FeedStore`).

        Served, like a segment scan, only by a member that reads the segment in its installed topology;
        others raise :class:`GridNotOwner` naming the members that do.
        """
        node = self._require_node()
        t = node.topology
        store = node.store
        assert t is not None and store is not None
        if not 0 <= segment < t.num_segments:
            raise ValueError(f"segment: {segment} is outside [0, {t.num_segments - 1}]")
        if node.leaving:
            raise GridLeaving("this member is leaving the grid; read the segment from another owner")
        if not t.can_read(segment):
            raise GridUnavailable(f"segment {segment} is unavailable for reads ({t.mode.value})")
        owners = t.read_owners(segment)
        if node.address not in owners or not store.has_segment(segment) or not isinstance(store, FeedStore):
            urls = [self.endpoints.get(m) for m in owners]
            raise GridNotOwner(f"segment {segment} is not readable on this member; read it from its owners", urls)
        page = store.changes(segment, after, limit, self.stable_version(), max_bytes)
        self.counters["change_pages"] += 1
        if not page.covered:
            self.counters["change_pages_uncovered"] += 1
        return page

    def _require_node(self) -> GridNode:
        if self._closed:
            raise GridLeaving("this member has left the grid; use another member")
        if self.node is None or self.node.topology is None:
            raise GridUnavailable("this member has not installed a grid topology yet")
        return self.node

    # ==== leaving =========================================================================================
    def leave(self) -> None:
        """Ask the coordinator to move our segments away; :meth:`wait_ready_to_leave` returns when done."""
        node = self.node
        if node is None:
            self._ready_to_leave.set()
            return
        node.leave(self._loop.time())
        self._pump()

    def set_capacity(self, capacity: float) -> None:
        """This member's new capacity (GridNode.set_capacity); raises ValueError for a bad value and
        GridUnavailable before the grid started here."""
        node = self.node
        if node is None:
            raise GridUnavailable("no grid node yet (not joined)")
        node.set_capacity(capacity, self._loop.time())
        self._pump()

    def force_available(self) -> bool:
        """Operator's override, on the coordinator only (False elsewhere): leave degraded mode with the members
        present, accepting that segments whose owners are all gone lost their data (see GridNode)."""
        node = self.node
        if node is None:
            return False
        forced = node.force_available(self._loop.time())
        self._pump()
        return forced

    async def wait_ready_to_leave(self) -> None:
        await self._ready_to_leave.wait()

    @property
    def leaving(self) -> bool:
        return self.node is not None and self.node.leaving

    def close(self) -> None:
        """Stop timers and fail the operations still waiting (the member is going away)."""
        gone = GridLeaving(
            "this member left the grid before the operation completed (a write may or may not have been applied)"
        )
        self._stop(gone)
        for wait in self._in_batch.values():
            if not wait.done.done():
                wait.done.set_exception(gone)
        self._in_batch.clear()
        for entry in self.interactive.values():
            if entry.handle is not None:
                entry.handle.cancel()
        self.interactive.clear()
        if self._backing is not None:
            node = self.node
            if node is not None:
                self._persist(node)
            self._backing.close()
            self._backing = None

    # ==== status ============================================================================================
    @property
    def ready(self) -> bool:
        """Joined, holding a topology, not leaving and no segment of ours still being fetched (``/readyz``)."""
        return not self.not_ready_reasons()

    def not_ready_reasons(self) -> list[str]:
        node = self.node
        out = []
        if node is None or self.ch is None or not self.ch.joined:
            return ["not joined to the group yet"]
        t = node.topology
        if t is None:
            out.append("no grid topology installed yet")
        elif t.availability != Availability.AVAILABLE:
            out.append("the grid is degraded (a partition may have lost owners)")
        if node.transfer_pending:
            out.append("segments of this member are still being transferred")
        if node.leaving:
            out.append("leaving the grid")
        return out

    def status(self) -> dict[str, Any]:
        node = self.node
        if node is None:
            return {"joined": False}
        st = node.status()
        t = node.topology
        if t is not None and t.phase == Phase.READ_OLD_WRITE_ALL:
            # Grid-wide progress is the coordinator's; per member, what it still has to fetch.
            st["rebalance"]["in_progress"] = True
        elif "rebalance" in st:
            st["rebalance"]["in_progress"] = t is not None and t.rebalancing
        st["endpoints"] = {str(a): u for a, u in self.endpoints.items()}
        st["topology_installed_at"] = self.topology_installed_at
        if self.config.persistence != "none":
            b = self._backing
            st["persistence"] = {
                "mode": self.config.persistence,
                "path": self.config.persistence_path,
                "restore": node.restore_outcome or "pending",
                "rows_written": b.rows_written if b is not None else None,
                "steps": self.counters["persist_steps"],
                "errors": self.counters["persist_errors"],
            }
        st["transactions"] = {
            "originated_pending": node.tx_pending,  # begun here, not finished
            "interactive": len(self.interactive),  # of those, driven over HTTP (rolled back when abandoned)
            "prepared": node.tx_prepared_count(),  # prepared here as a participant, waiting for the decision
            "in_doubt": len(node.tx_in_doubt()),  # prepared here, originator gone: see GET /v1/tx/in-doubt
            "auto_resolve": node.config.tx_auto_resolve,
            # On the view coordinator: in doubt, and the grid cannot tell the outcome (an operator decides).
            "undecided": {str(t): why for t, why in sorted(node.tx_undecided().items())},
        }
        return st

    def routing(self) -> dict[str, Any] | None:
        """What a client needs to route keys itself: per segment, the member to read from and to write to.

        Members are listed by HTTP URL (``null`` when a member has not announced one yet); ``read``/``write``
        hold indexes into that list, ``-1`` where no live owner exists (any member forwards); ``owners`` lists,
        per segment, every member that can serve reads and segment scans, preferred first.
        """
        node = self.node
        if node is None or node.topology is None:
            return None
        t = node.topology
        members = list(t.members)
        urls = [self.endpoints.get(m) for m in members]
        cached = self._routing_cache
        if cached is not None and cached[0] is t and cached[1] == urls:
            return cached[2]  # clients and progress bars ask often; a topology's table never changes
        index = {m: i for i, m in enumerate(members)}
        read, write, owners = [], [], []
        routes = node.owner_routes()  # the node's, computed once per topology
        if routes is None:
            raise RuntimeError("routing: the node has a topology but no owner routes")
        for r, w in zip(*routes, strict=True):
            read.append(index.get(r[0], -1) if r else -1)
            write.append(index.get(w[0], -1) if w else -1)
            owners.append([index[m] for m in r if m in index])
        table = {
            "topology_id": t.topology_id,
            "num_segments": t.num_segments,
            "members": urls,
            "addresses": [str(m) for m in members],
            "read": read,
            "write": write,
            "owners": owners,
        }
        self._routing_cache = (t, urls, table)
        return table

    def segment_of(self, key: bytes) -> int | None:
        t = self.node.topology if self.node is not None else None
        return None if t is None else segment_of(key, t.num_segments)

    # ==== plumbing ============================================================================================
    def _announce(self) -> None:
        ch = self.ch
        if ch is None or ch.closed or ch.leaving or self._parent is not None:
            return
        info: dict[str, Any] = {}
        if self.http_url is not None:
            self.endpoints[ch.address] = self.http_url
            info["http"] = self.http_url
        node = self.node
        if node is not None and node.topology is not None:
            low = self.feed.oldest_unfinished(node)
            info["low"] = low
            self._announced_low = low
            self._low_topology = node.topology.topology_id
        if info:
            info["clock"] = time.time()
            ch.send(_INFO_PREFIX + msgpack.packb(info))

    def _maybe_announce_low(self) -> None:
        """Announce our :meth:`ChangeFeed.oldest_unfinished` when it changed (cheap when nothing was re-driven)."""
        node = self.node
        if node is None or node.topology is None or self._parent is not None:
            return
        tid = node.topology.topology_id
        if not self.feed.redriven and tid == self._low_topology and self._announced_low == tid:
            return  # nothing old in flight and no re-drive since: the answer is still our topology id
        if self.feed.oldest_unfinished(node) != self._announced_low or tid != self._low_topology:
            self._announce()

    def _on_info(self, src: Address, payload: bytes) -> None:
        if len(payload) > MAX_INFO_BYTES:
            self.counters["bad_info"] += 1
            return
        try:
            info = msgpack.unpackb(payload[1:], raw=False)
            if not isinstance(info, dict):
                raise ValueError("not a map")
            url = info.get("http")
            if url is not None and (not isinstance(url, str) or not url.startswith("http")):
                raise ValueError(f"http: expected a URL, got {url!r}")
            low = info.get("low")
            if low is not None and (type(low) is not int or low < 0):
                raise ValueError(f"low: expected a topology id, got {low!r}")
            clock = info.get("clock")
            if clock is not None and (type(clock) not in (int, float) or not 0 < clock < math.inf):
                raise ValueError(f"clock: expected a Unix time, got {clock!r}")
        except Exception as exc:  # a peer's bad bytes are dropped and counted, never a crash
            self.counters["bad_info"] += 1
            log.warning("dropped a member-info payload from %s: %s", src, exc)
            return
        if url is not None:
            self.endpoints[src] = url
        if low is not None:
            self.unfinished[src] = low
        if clock is not None:
            self._note_peer_clock(src, clock - time.time())

    def _note_peer_clock(self, src: Address, ahead: float) -> None:
        """Record how far ``src``'s clock is ahead of ours (a lower bound); log once when beyond the warning
        level. A member whose clock is behind shows as ahead on that member's side, so each pair is covered."""
        self.peer_clock_ahead[src] = ahead
        if ahead > CLOCK_AHEAD_WARNING:
            self.counters["peer_clock_ahead_warnings"] += 1
            if src not in self._clock_warned:
                self._clock_warned.add(src)
                log.warning(
                    "member %s: its clock is at least %.3f s ahead of ours; client deadlines (X-Grid-Deadline) and "
                    "last-writer-wins merges of grids that never met assume the members' clocks agree",
                    src,
                    ahead,
                )

    def max_peer_clock_ahead(self) -> float:
        """How far the most-ahead member's clock is ahead of ours, at least (0 when none is)."""
        return max(0.0, *self.peer_clock_ahead.values()) if self.peer_clock_ahead else 0.0

    def _pump(self) -> None:
        node = self.node
        if node is None:
            return
        ch = self.ch
        if self._backing is not None:
            self._persist(node)  # before this step's payloads leave: an acknowledgement follows the commit
        out = node.take_outbox()
        if out and ch is not None and not ch.closed:
            self._send_outbox(ch, out)
        if node.topology is not self._seen_topology:
            # Wall-clock time of each install, for /v1/status (when did the last rebalance end, to the step).
            self._seen_topology = node.topology
            self.topology_installed_at = time.time()
        if node.events.events:
            self._dispatch_events(node.take_events())
        self._resolve_results(node.take_results())
        if node.ready_to_leave:
            self._ready_to_leave.set()
        if ch is not None and not ch.closed:
            self._maybe_announce_low()
        self._arm()

    def _send_outbox(self, ch: Channel, out: list[Outgoing]) -> None:
        """Send the node's payloads on the channel (its own loop back inside the node)."""
        for o in out:
            if o.dest == ch.address:
                continue  # the node loops back to itself internally
            try:
                ch.send(self._prefix + o.payload, dest=o.dest)
            except Exception as exc:  # leaving/closed: nothing more goes out; the node copes with loss
                self.counters["send_dropped"] += 1
                log.debug("grid payload not sent: %s", exc)

    def _resolve_results(self, results: list[OpResult]) -> None:
        """Complete the futures waiting for these operations' results: a single operation's, or a batch's once
        its last result is in."""
        for res in results:
            fut = self._waiting.pop(res.op_id, None)
            if fut is not None:
                if not fut.done():
                    fut.set_result(res)
                continue
            wait = self._in_batch.pop(res.op_id, None)
            if wait is not None:
                op_id = res.op_id
                wait.results[op_id - wait.first if wait.index is None else wait.index[op_id]] = res
                wait.remaining -= 1
                if wait.remaining == 0 and not wait.done.done():
                    wait.done.set_result(wait.complete())

    def _persist(self, node: GridNode) -> None:
        store = node.store
        take = getattr(store, "take_ops", None)
        if take is None:
            return
        ops = take()
        tid = node.topology.topology_id if node.topology is not None else 0
        if not ops and tid <= self._backing.topology_id:
            return
        started = time.perf_counter()
        try:
            self._backing.apply(ops, tid)
        except Exception:
            # Disk full, file removed...: the member keeps serving from memory (its copies on other owners
            # stay); the persistent copy is behind from here on. Logged and counted, never silent.
            self.counters["persist_errors"] += 1
            log.exception("persistent store %s: a write failed", self._backing.path)
        self.counters["persist_steps"] += 1
        self.counters["persist_us"] += int((time.perf_counter() - started) * 1e6)

    def _tick(self, node: GridNode, now: float) -> None:
        # Follow the wall clock's adjustments (NTP): refreshed whenever a timer fires.
        node.wall_offset = time.time() - self._loop.time()
        node.tick(now)
