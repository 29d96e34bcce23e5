"""The thin adapter that runs a sans-IO :class:`~.node.GridNode` on a live group channel.

It moves views, delivered batches and time into the node and the node's payloads out to the group; it turns
client operations into awaitables completed by the node's results::

    grid = GridRuntime(GridConfig(), http_url="http://127.0.0.1:8080")
    ch = await Channel.connect(..., on_view=grid.on_view, on_messages=grid.on_messages)
    grid.bind(ch)
    await grid.put(b"k", b"v"); value = await grid.get(b"k")
    grid.leave(); await grid.wait_ready_to_leave(); await ch.leave()

**Multiplexing.** The grid shares the channel with whatever else the member sends (the test workload of
``groupcluster member``), so every payload it sends starts with a one-byte tag: :data:`TAG_GRID` for node
payloads, :data:`TAG_INFO` for the member-info announcements below. Payloads with another first byte go to
the ``other`` callback unchanged. A tag byte instead of a protocol header keeps the channel API (and the
protocol layers another engineer owns) untouched; both tags are outside printable ASCII, so they do not clash
with the text ids the test workload puts first.

**Member info.** Clients route a key to its owner's HTTP endpoint, so members must know each other's
endpoints. After every view change each member multicasts a small msgpack map ``{"http": url}``; the map of
group address to URL is pruned to the view and published in :meth:`GridRuntime.routing`.

**Binding late.** The callbacks must be registered with ``Channel.connect`` to see the first view, but the
node needs our address, which exists only once ``connect`` runs. Events that arrive before :meth:`bind` are
buffered in order and replayed into the node when it is created.

**Batches.** :meth:`GridRuntime.run_batch` starts many operations in one step of the node, so the node's
per-destination grouping puts the commands for one owner into one payload (a flush per operation would send
one payload each). :meth:`GridRuntime.scan_segment` pages through a segment this member can read, for bulk
readers that split the key space by segment (the Spark data source).

The group's own state transfer is not used: the grid rebalances by itself (docs/grid.md).
"""

from __future__ import annotations

import asyncio
import heapq
import logging
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgpack

from ..core.address import Address
from ..core.message import Message
from ..core.view import View
from .consistent_hash import segment_of
from .messages import DELETE, GET, PUT
from .node import GridConfig, GridNode, OpResult
from .topology import Availability, Phase

if TYPE_CHECKING:
    from ..runtime.channel import Channel

log = logging.getLogger("groupcluster.grid.runtime")

TAG_GRID = 0xF7
TAG_INFO = 0xF8
_GRID_PREFIX = bytes([TAG_GRID])
_INFO_PREFIX = bytes([TAG_INFO])
MAX_INFO_BYTES = 1024  # a member-info payload is a URL or two; anything bigger is a bad peer


class GridError(Exception):
    """A grid operation failed; the message says why."""


class GridUnavailable(GridError):
    """The grid refuses the operation for now (degraded partition, not joined yet, leaving)."""


class GridTimeout(GridError):
    """The operation did not complete within the node's ``op_timeout``."""


class GridNotOwner(GridError):
    """This member cannot serve the segment (it holds no complete copy); ``owners`` lists the ones that do."""

    def __init__(self, message: str, owners: list[str | None]) -> None:
        super().__init__(message)
        self.owners = owners


@dataclass(frozen=True, slots=True)
class SegmentPage:
    """One page of a segment scan: entries ``(key, value, version)`` in key order, after the cursor given."""

    segment: int
    topology_id: int
    entries: list[tuple[bytes, bytes, int]]
    more: bool  # True: entries after the last one exist; ask again with ``after`` = the last key


KIND_NAMES = {GET: "get", PUT: "put", DELETE: "delete"}


class _BatchingNode(GridNode):
    """A :class:`GridNode` whose end-of-step flush can be held back while a batch of operations starts.

    ``GridNode.put``/``get``/``delete`` each end their step with a flush that encodes one payload per
    destination, so N operations started one by one leave as N payloads. Holding the flush until the last one
    has started lets the node group the N commands by owner, as it does for everything else in one step.
    (A ``GridNode`` method to start many operations would make this subclass unnecessary.)
    """

    _hold_flush = False

    def _flush(self) -> None:
        if not self._hold_flush:
            super()._flush()

    def start_batch(self, ops: Sequence[tuple[int, bytes, bytes | None]], now: float) -> list[int]:
        self._hold_flush = True
        try:
            ids = [
                self.get(key, now)
                if kind == GET
                else self.put(key, value, now)
                if kind == PUT
                else self.delete(key, now)  # type: ignore[arg-type]
                for kind, key, value in ops
            ]
        finally:
            self._hold_flush = False
            self._flush()
        return ids


class _BatchWait:
    """The results of one batch, filled in as the node reports them; ``done`` resolves with the last one."""

    __slots__ = ("done", "remaining", "results")

    def __init__(self, n: int, fut: asyncio.Future[list[OpResult]]) -> None:
        self.results: list[OpResult | None] = [None] * n
        self.remaining = n
        self.done = fut


def error_for(result: OpResult) -> GridError:
    """The exception for a failed :class:`OpResult` (the node reports the reason as text)."""
    if "unavailable" in result.error:
        return GridUnavailable(result.error)
    if "timed out" in result.error:
        return GridTimeout(result.error)
    return GridError(result.error or "operation failed")


class GridRuntime:
    """Drives one :class:`GridNode` from a channel's callbacks and the event loop's clock."""

    def __init__(
        self,
        config: GridConfig | None = None,
        *,
        http_url: str | None = None,
        other: Callable[[list[Message]], Any] | None = None,
    ) -> None:
        self.config = config or GridConfig()
        self.http_url = http_url
        self.other = other
        self.ch: Channel | None = None
        self.node: GridNode | None = None
        self.endpoints: dict[Address, str] = {}
        self.counters: Counter[str] = Counter()
        self._loop = asyncio.get_running_loop()
        self._early: list[tuple[str, Any]] = []
        self._waiting: dict[int, asyncio.Future[OpResult]] = {}
        self._in_batch: dict[int, tuple[_BatchWait, int]] = {}  # op id -> (its batch, index in the batch)
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self._ready_to_leave = asyncio.Event()
        self._closed = False

    # ==== channel callbacks (register them with Channel.connect) ============================================
    def on_view(self, view: View) -> None:
        if self.node is None:
            self._early.append(("view", view))
            return
        self.node.on_view(view.members, self._loop.time(), merge=view.is_merge)
        self.endpoints = {a: u for a, u in self.endpoints.items() if a in view.members}
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
                grid.append((m.src, p[1:]))  # type: ignore[arg-type]
            elif tag == TAG_INFO:
                self._on_info(m.src, p)  # type: ignore[arg-type]
            else:
                others.append(m)
        if others and self.other is not None:
            self.other(others)
        if not grid:
            return
        if self.node is None:
            # Before bind we cannot tell our own multicast copies apart; bind() filters them.
            self._early.append(("msgs", grid))
            return
        self.node.on_messages(grid, self._loop.time())
        self._pump()

    def bind(self, ch: Channel) -> None:
        """Create the node now that the channel (and so our address) exists, and replay what came before."""
        self.ch = ch
        self.node = _BatchingNode(ch.address, self.config)
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
    async def get(self, key: bytes) -> bytes | None:
        """The value of ``key`` (None: absent). Raises :class:`GridError` subclasses."""
        res = await self._run(GET, key, None)
        return res.value

    async def put(self, key: bytes, value: bytes) -> OpResult:
        return await self._run(PUT, key, value)

    async def delete(self, key: bytes) -> OpResult:
        return await self._run(DELETE, key, None)

    async def _run(self, kind: int, key: bytes, value: bytes | None) -> OpResult:
        node = self._require_node()
        if node.leaving:
            raise GridUnavailable("this member is leaving the grid; use another member")
        now = self._loop.time()
        if kind == GET:
            op = node.get(key, now)
        elif kind == PUT:
            op = node.put(key, value, now)  # type: ignore[arg-type]
        else:
            op = node.delete(key, now)
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

    async def run_batch(self, ops: Sequence[tuple[int, bytes, bytes | None]]) -> list[OpResult]:
        """Run ``(kind, key, value)`` operations together; one :class:`OpResult` each, in order, failures included.

        All start in one step of the node. The whole batch is refused (:class:`GridUnavailable`) only when
        this member cannot take operations at all (not joined, leaving); a segment that is unavailable or an
        operation that times out fails that operation alone. Bad keys or values raise ValueError or TypeError
        before anything starts.
        """
        node = self._require_node()
        if node.leaving:
            raise GridUnavailable("this member is leaving the grid; use another member")
        limits = node.limits
        for i, (kind, key, value) in enumerate(ops):
            if kind not in KIND_NAMES:
                raise ValueError(f"ops[{i}]: unknown operation kind {kind!r}")
            if type(key) is not bytes:
                raise TypeError(f"ops[{i}].key: expected bytes, got {type(key).__name__}")
            if len(key) > limits.max_key_bytes:
                raise ValueError(f"ops[{i}].key: {len(key)} bytes exceed the limit of {limits.max_key_bytes}")
            if kind == PUT:
                if type(value) is not bytes:
                    raise TypeError(f"ops[{i}].value: expected bytes, got {type(value).__name__}")
                if len(value) > limits.max_value_bytes:
                    raise ValueError(f"ops[{i}].value: {len(value)} bytes exceed the limit of {limits.max_value_bytes}")
        if not ops:
            return []
        fut: asyncio.Future[list[OpResult]] = self._loop.create_future()
        wait = _BatchWait(len(ops), fut)
        ids = node.start_batch(ops, self._loop.time())  # type: ignore[attr-defined]
        for i, op in enumerate(ids):
            self._in_batch[op] = (wait, i)
        self._pump()
        results: list[OpResult] = await fut
        counters = self.counters
        for res in results:
            counters[f"ops_{KIND_NAMES[res.kind]}"] += 1
            if not res.ok:
                counters["ops_failed"] += 1
            elif res.attempts > 1:
                counters["ops_retried"] += 1
        counters["batches"] += 1
        return results

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
            raise GridUnavailable("this member is leaving the grid; read the segment from another owner")
        if not t.can_read(segment):
            raise GridUnavailable(f"segment {segment} is unavailable for reads ({t.mode.value})")
        owners = t.read_owners(segment)
        if node.address not in owners or not node.store.has_segment(segment):
            urls = [self.endpoints.get(m) for m in owners]
            raise GridNotOwner(f"segment {segment} is not readable on this member; read it from its owners", urls)
        data = node.store.segments.get(segment) or {}
        # nsmallest keeps the page O(n log limit) without sorting the whole segment for every page.
        keys = heapq.nsmallest(
            limit + 1, (k for k, (_, v) in data.items() if v is not None and (after is None or k > after))
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

    def _require_node(self) -> GridNode:
        if self._closed:
            raise GridUnavailable("this member has left the grid")
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

    async def wait_ready_to_leave(self) -> None:
        await self._ready_to_leave.wait()

    @property
    def leaving(self) -> bool:
        return self.node is not None and self.node.leaving

    def close(self) -> None:
        """Stop timers and fail the operations still waiting (the member is going away)."""
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        gone = GridUnavailable("this member left the grid before the operation completed")
        for fut in self._waiting.values():
            if not fut.done():
                fut.set_exception(gone)
        self._waiting.clear()
        for wait, _ in self._in_batch.values():
            if not wait.done.done():
                wait.done.set_exception(gone)
        self._in_batch.clear()

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
        return st

    def routing(self) -> dict[str, Any] | None:
        """What a client needs to route keys itself: per segment, the member to read from and to write to.

        Members are listed by HTTP URL (``null`` when a member has not announced one yet); ``read``/``write``
        hold indexes into that list, ``-1`` where no live owner exists (any member forwards); ``owners`` lists,
        per segment, every member that can serve reads and segment scans, preferred first.
        """
        node = self.node
        t = node.topology if node is not None else None
        if t is None:
            return None
        members = list(t.members)
        index = {m: i for i, m in enumerate(members)}
        read, write, owners = [], [], []
        for s in range(t.num_segments):
            r = t.read_owners(s)
            w = t.write_primary(s)
            read.append(index.get(r[0], -1) if r else -1)
            write.append(index.get(w, -1) if w is not None else -1)
            owners.append([index[m] for m in r if m in index])
        return {
            "topology_id": t.topology_id,
            "num_segments": t.num_segments,
            "members": [self.endpoints.get(m) for m in members],
            "addresses": [str(m) for m in members],
            "read": read,
            "write": write,
            "owners": owners,
        }

    def segment_of(self, key: bytes) -> int | None:
        t = self.node.topology if self.node is not None else None
        return None if t is None else segment_of(key, t.num_segments)

    # ==== plumbing ============================================================================================
    def _announce(self) -> None:
        ch = self.ch
        if ch is None or self.http_url is None or ch.closed or ch.leaving:
            return
        self.endpoints[ch.address] = self.http_url
        ch.send(_INFO_PREFIX + msgpack.packb({"http": self.http_url}))

    def _on_info(self, src: Address, payload: bytes) -> None:
        if len(payload) > MAX_INFO_BYTES:
            self.counters["bad_info"] += 1
            return
        try:
            info = msgpack.unpackb(payload[1:], raw=False)
            url = info["http"]
            if not isinstance(url, str) or not url.startswith("http"):
                raise ValueError(f"http: expected a URL, got {url!r}")
        except Exception as exc:  # a peer's bad bytes are dropped and counted, never a crash
            self.counters["bad_info"] += 1
            log.warning("dropped a member-info payload from %s: %s", src, exc)
            return
        self.endpoints[src] = url

    def _pump(self) -> None:
        node = self.node
        if node is None:
            return
        ch = self.ch
        out = node.take_outbox()
        if out and ch is not None and not ch.closed:
            for o in out:
                if o.dest == ch.address:
                    continue  # the node loops back to itself internally
                try:
                    ch.send(_GRID_PREFIX + o.payload, dest=o.dest)
                except Exception as exc:  # leaving/closed: nothing more goes out; the node copes with loss
                    self.counters["send_dropped"] += 1
                    log.debug("grid payload not sent: %s", exc)
        for res in node.take_results():
            fut = self._waiting.pop(res.op_id, None)
            if fut is not None:
                if not fut.done():
                    fut.set_result(res)
                continue
            entry = self._in_batch.pop(res.op_id, None)
            if entry is not None:
                wait, i = entry
                wait.results[i] = res
                wait.remaining -= 1
                if wait.remaining == 0 and not wait.done.done():
                    wait.done.set_result(wait.results)  # type: ignore[arg-type]
        if node.ready_to_leave:
            self._ready_to_leave.set()
        self._arm()

    def _arm(self) -> None:
        if self._closed or self.node is None:
            return
        deadline = self.node.next_deadline()
        if deadline == self._timer_at:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_at = deadline
        if deadline is not None:
            self._timer = self._loop.call_at(deadline, self._on_timer)

    def _on_timer(self) -> None:
        # The loop may fire a hair before the deadline (clock resolution); ticking at the deadline itself keeps
        # the node from finding nothing due and the timer from re-arming at once in a loop.
        due = self._timer_at or 0.0
        self._timer = None
        self._timer_at = None
        if self.node is None or self._closed:
            return
        self.node.tick(max(self._loop.time(), due))
        self._pump()
