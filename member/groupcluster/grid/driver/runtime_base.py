"""RuntimeBase: the state of a :class:`~.grid_runtime.GridRuntime` and the plumbing of every step.

After each input the runtime *pumps* the node: persists what the step wrote, sends its payloads (tagged, see
:data:`TAG_GRID`), dispatches entry events to listeners, completes the futures of finished operations and
re-arms the node's timer. **Member info**: after every view change each member multicasts ``{"http": url,
"clock": t, "low": id}``: the endpoints for routing, how far its clock is ahead of ours, and for the change
feed the oldest topology whose writes it may still re-drive."""

from __future__ import annotations

import asyncio
import logging
import math
import os
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgpack

from ...core.address import Address
from ...core.message import Message
from ..errors import GridLeaving, GridUnavailable
from ..feed import ChangeFeed
from ..node import EVENT_KINDS, EntryEvents, GridConfig, GridNode, OpResult, Outgoing
from ..topology import CacheTopology
from ..tx.messages import TxId
from .gc_tuning import tune_gc
from .outcomes import BatchWait
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


@dataclass(slots=True)
class Interactive:
    """An interactive transaction begun over HTTP: rolled back if no request touches it for ``tx_timeout``."""

    tx: TxId
    mode: str
    deadline: float
    busy: bool = False
    handle: asyncio.TimerHandle | None = None


class RuntimeBase(NodeTimer[GridNode]):
    """The runtime's state and its step: the parts (operations, transactions, segments) build on it."""

    def __init__(
        self,
        config: GridConfig | None = None,
        *,
        http_url: str | None = None,
        other: Callable[[list[Message]], Any] | None = None,
        name: str = "default",
        wire_prefix: bytes = _GRID_PREFIX,
        parent: RuntimeBase | None = None,
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
        self._in_batch: dict[int, BatchWait] = {}  # op id -> its batch
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
        self.interactive: dict[TxId, Interactive] = {}
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

    # ==== shared by the parts ================================================================================
    def _require_node(self) -> GridNode:
        if self._closed:
            raise GridLeaving("this member has left the grid; use another member")
        if self.node is None or self.node.topology is None:
            raise GridUnavailable("this member has not installed a grid topology yet")
        return self.node

    async def _await_op(self, op: int) -> OpResult:
        fut: asyncio.Future[OpResult] = self._loop.create_future()
        self._waiting[op] = fut
        self._pump()
        return await fut

    # ==== member info ========================================================================================
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

    # ==== the step ===========================================================================================
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
