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

The group's own state transfer is not used: the grid rebalances by itself (docs/grid.md).
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable
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
        self.node = GridNode(ch.address, self.config)
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
        for fut in self._waiting.values():
            if not fut.done():
                fut.set_exception(GridUnavailable("this member left the grid before the operation completed"))
        self._waiting.clear()

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
        hold indexes into that list, ``-1`` where no live owner exists (any member forwards).
        """
        node = self.node
        t = node.topology if node is not None else None
        if t is None:
            return None
        members = list(t.members)
        index = {m: i for i, m in enumerate(members)}
        read, write = [], []
        for s in range(t.num_segments):
            r = t.read_owners(s)
            w = t.write_primary(s)
            read.append(index.get(r[0], -1) if r else -1)
            write.append(index.get(w, -1) if w is not None else -1)
        return {
            "topology_id": t.topology_id,
            "num_segments": t.num_segments,
            "members": [self.endpoints.get(m) for m in members],
            "addresses": [str(m) for m in members],
            "read": read,
            "write": write,
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
            if fut is not None and not fut.done():
                fut.set_result(res)
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
