"""Named caches: several caches per member process over the one group channel, each with its own mode.

``groupcluster member --grid --cache NAME:mode=replicated,num_segments=64`` (repeatable) declares a cache
next to the grid's own, which stays the cache named ``default`` (its wire tag, URLs and clients unchanged).
Modes (docs/grid.md, "Named caches and modes"):

* ``distributed``: a :class:`~.node.GridNode` of its own (segments, owners, topology, state transfer);
* ``replicated``: the same node with every member owning every segment (``num_owners`` is
  :data:`~.consistent_hash.MAX_OWNERS`, and the balancing function caps owners at the members present), so
  reads are local on every member that holds its copy and a joiner fetches its segments from all members;
* ``invalidation``: an :class:`~.invalidation.InvalidationNode` (local copies, writes invalidate the
  others, no state transfer).

**Wire.** A named cache's payload starts with :data:`TAG_CACHE`, then one byte for its mode, one byte for
the length of its name, the name (ASCII), then the node's payload. Carrying the name (at most 48 bytes)
costs a few bytes per message and needs no id agreement between members; carrying the mode lets a member
tell that a peer declared the same name with another mode. Such payloads are dropped (never mixed into a
node of the other mode), counted and logged once per peer, and ``/v1/caches`` shows the mismatch. A payload
for a name this member does not declare is dropped, counted and logged once per name. Where members agree
on the mode but not on ``num_segments``/``num_owners``, the coordinator's win, as for the default cache.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import yaml

from ..core.address import Address
from ..core.errors import ConfigError
from ..core.message import Message
from ..core.view import View
from .consistent_hash import MAX_OWNERS
from .driver.grid_runtime import GridRuntime
from .driver.outcomes import error_for
from .driver.runtime_base import TAG_GRID, TAG_INFO
from .driver.timer import NodeTimer
from .errors import GridTimeout, GridUnavailable
from .invalidation import InvalidationConfig, InvalidationNode
from .messages import DELETE, GET, PUT
from .node import GridConfig, OpResult

if TYPE_CHECKING:
    from ..runtime.channel import Channel

log = logging.getLogger("groupcluster.grid.caches")

TAG_CACHE = 0xF9
DEFAULT_CACHE = "default"
DISTRIBUTED, REPLICATED, INVALIDATION = "distributed", "replicated", "invalidation"
MODES = (DISTRIBUTED, REPLICATED, INVALIDATION)
MODE_CODES = {DISTRIBUTED: 1, REPLICATED: 2, INVALIDATION: 3}
MODE_NAMES = {v: k for k, v in MODE_CODES.items()}
NAME_RE = re.compile(r"[a-z0-9][a-z0-9_-]{0,47}")
# An invalidation cache keeps local copies only (no state transfer, no merge), so a persistent copy of them
# would bring back entries other members invalidated meanwhile: persistence is for the other modes.
_INVALIDATION_FORBIDDEN = {"persistence", "persistence_path"}
assert TAG_CACHE not in (TAG_GRID, TAG_INFO)


@dataclass(frozen=True)
class CacheSpec:
    """A named cache as declared on the command line: its name, mode and the node's configuration."""

    name: str
    mode: str
    grid: GridConfig | None = None  # distributed and replicated
    invalidation: InvalidationConfig | None = None  # invalidation
    explicit: frozenset[str] = frozenset()  # the keys the declaration set (the rest are defaults)

    @property
    def prefix(self) -> bytes:
        return wire_prefix(self.name, self.mode)

    def describe(self) -> dict[str, Any]:
        g = self.grid
        return {
            "name": self.name,
            "mode": self.mode,
            "num_segments": g.num_segments if g is not None else None,
            "num_owners": (None if self.mode == REPLICATED else g.num_owners) if g is not None else None,
        }


def wire_prefix(name: str, mode: str) -> bytes:
    raw = name.encode("ascii")
    return bytes([TAG_CACHE, MODE_CODES[mode], len(raw)]) + raw


def _value(text: str) -> Any:
    try:
        return yaml.safe_load(text) if text else ""
    except yaml.YAMLError:
        return text


def parse_cache_spec(text: str) -> CacheSpec:
    """``NAME:mode=replicated,num_segments=64,...`` (``NAME`` alone: a distributed cache with the defaults).

    Keys other than ``mode`` are the mode's node parameters (:class:`~.node.GridConfig` for distributed and
    replicated, :class:`~.invalidation.InvalidationConfig` for invalidation). Errors say what and where:
    ``--cache sessions: mode 'replicatd' is not one of distributed, replicated, invalidation``.
    """
    name, _, rest = text.partition(":")
    name = name.strip()
    if not NAME_RE.fullmatch(name):
        raise ConfigError(
            f"--cache {text!r}: the name {name!r} must be 1 to 48 characters of a-z, 0-9, '_' and '-', "
            "starting with a letter or digit"
        )
    if name == DEFAULT_CACHE:
        raise ConfigError(f"--cache {name}: 'default' is the grid's own cache (configure it with --grid-set)")
    where = f"--cache {name}"
    params: dict[str, Any] = {}
    items = [p for p in rest.split(",") if p.strip()]
    for i, item in enumerate(items):
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"{where}: item {i + 1} {item!r}: expected KEY=VALUE")
        if key in params:
            raise ConfigError(f"{where}: {key} is given twice")
        params[key] = _value(value.strip())
    mode = params.pop("mode", DISTRIBUTED)
    if mode not in MODES:
        raise ConfigError(f"{where}: mode {mode!r} is not one of {', '.join(MODES)}")
    bad = _INVALIDATION_FORBIDDEN & params.keys() if mode == INVALIDATION else set()
    if bad:
        raise ConfigError(
            f"{where}: {', '.join(sorted(bad))}: an invalidation cache keeps no persistent copy (its local copies "
            "are not kept in step by state transfer; put the shared store behind it instead)"
        )
    explicit = frozenset(params)
    if mode == INVALIDATION:
        return CacheSpec(name, mode, invalidation=InvalidationConfig.from_dict(params, where), explicit=explicit)
    if mode == REPLICATED:
        if "num_owners" in params:
            raise ConfigError(f"{where}: num_owners: a replicated cache has every member as owner; leave it out")
        params["num_owners"] = MAX_OWNERS
    return CacheSpec(name, mode, grid=_grid_config(params, where), explicit=explicit)


def _grid_config(params: dict[str, Any], where: str) -> GridConfig:
    from ..core.config import parse_params

    try:
        return parse_params(GridConfig, params, where)
    except ConfigError as exc:
        text = str(exc)
        # GridConfig's own range checks name "grid.KEY"; say which cache.
        raise ConfigError(text if text.startswith(where) else f"{where}: {text}") from None


def parse_cache_specs(texts: Iterable[str]) -> list[CacheSpec]:
    specs: list[CacheSpec] = []
    seen: set[str] = set()
    for t in texts:
        spec = parse_cache_spec(t)
        if spec.name in seen:
            raise ConfigError(f"--cache {spec.name}: declared twice")
        seen.add(spec.name)
        specs.append(spec)
    return specs


_EXPIRED = "timed out: the request's deadline passed before the operation started"


def _expired(deadline: float | None) -> bool:
    return deadline is not None and time.time() >= deadline


class InvalidationRuntime(NodeTimer[InvalidationNode]):
    """Drives one :class:`~.invalidation.InvalidationNode` from the channel and the event loop (the same
    operations as :class:`~.driver.grid_runtime.GridRuntime` that the HTTP API uses)."""

    def __init__(self, spec: CacheSpec, wire: bytes) -> None:
        assert spec.invalidation is not None
        self.name = spec.name
        self.config = spec.invalidation
        self._prefix = wire
        self.node: InvalidationNode | None = None
        self.ch: Channel | None = None
        self.counters: Counter[str] = Counter()
        self._loop = asyncio.get_running_loop()
        self._early: list[tuple[str, Any]] = []
        self._waiting: dict[int, asyncio.Future[OpResult]] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self._closed = False

    # -- channel side --------------------------------------------------------------------------------------
    def bind(self, ch: Channel) -> None:
        self.ch = ch
        self.node = InvalidationNode(ch.address, self.config)
        early, self._early = self._early, []
        for kind, item in early:
            if kind == "view":
                self.on_view(item)
            else:
                self.deliver([(src, p) for src, p in item if src != ch.address])
        if ch.view is not None and self.node.view != ch.view.members:
            self.on_view(ch.view)

    def on_view(self, view: View) -> None:
        if self.node is None:
            self._early.append(("view", view))
            return
        self.node.on_view(view.members, self._loop.time(), merge=view.is_merge)
        self._pump()

    def deliver(self, batch: list[tuple[Address, bytes]]) -> None:
        if self.node is None:
            self._early.append(("msgs", batch))
            return
        if batch:
            self.node.on_messages(batch, self._loop.time())
            self._pump()

    # -- operations ----------------------------------------------------------------------------------------
    def _require_node(self) -> InvalidationNode:
        if self._closed:
            raise GridUnavailable("this member has left the group")
        if self.node is None or not self.node.view:
            raise GridUnavailable("this member has not joined the group yet")
        return self.node

    async def get_versioned(self, key: bytes, deadline: float | None = None) -> tuple[bytes | None, int]:
        node = self._require_node()
        if _expired(deadline):
            raise GridTimeout(_EXPIRED)
        value = node.get(key)
        self.counters["ops_get"] += 1
        return value, node.version_of(key)

    async def get(self, key: bytes, deadline: float | None = None) -> bytes | None:
        return (await self.get_versioned(key, deadline))[0]

    async def put(self, key: bytes, value: bytes, deadline: float | None = None) -> OpResult:
        return (await self._write([(PUT, key, value)], deadline))[0]

    async def delete(self, key: bytes, deadline: float | None = None) -> OpResult:
        return (await self._write([(DELETE, key, None)], deadline))[0]

    async def _write(self, ops: Sequence[tuple[int, bytes, bytes | None]], deadline: float | None) -> list[OpResult]:
        results = await self.run_batch(ops, deadline)
        for res in results:
            if not res.ok:
                raise error_for(res)
        return results

    async def run_batch(
        self, ops: Sequence[tuple[int, bytes, bytes | None]], deadline: float | None = None
    ) -> list[OpResult]:
        """``deadline`` (Unix time) is checked once, before anything starts: a write here is applied to the local
        copy in the step that starts it, so one that started in time cannot land later."""
        node = self._require_node()
        if _expired(deadline):
            return [OpResult(-1, k, key, False, error=_EXPIRED, attempts=0, reason="timeout") for k, key, _ in ops]
        ids = node.start_batch(ops, self._loop.time())
        futs = []
        for op in ids:
            fut: asyncio.Future[OpResult] = self._loop.create_future()
            self._waiting[op] = fut
            futs.append(fut)
        self._pump()
        results = list(await asyncio.gather(*futs))
        kinds = Counter(r.kind for r in results)
        for kind, n in kinds.items():
            self.counters[f"ops_{'get' if kind == GET else 'put' if kind == PUT else 'delete'}"] += n
        self.counters["ops_failed"] += sum(1 for r in results if not r.ok)
        return results

    def versions_of(
        self, ops: Sequence[tuple[int, bytes, bytes | None]], results: Sequence[OpResult]
    ) -> list[int | None]:
        return [r.version or None for r in results]

    # -- lifecycle and status ------------------------------------------------------------------------------
    def leave(self) -> None:
        """Nothing to hand off: an invalidation cache holds only local copies."""

    @property
    def ready_to_leave(self) -> bool:
        return True

    @property
    def ready(self) -> bool:
        return not self.not_ready_reasons()

    def not_ready_reasons(self) -> list[str]:
        return [] if self.node is not None and self.node.view else ["not joined to the group yet"]

    def status(self) -> dict[str, Any]:
        return self.node.status() if self.node is not None else {"joined": False}

    def routing(self) -> None:
        return None  # every member answers from its own copies: talk to one member

    def close(self) -> None:
        self._stop(GridUnavailable("this member left the group before the operation completed"))

    def _pump(self) -> None:
        node = self.node
        if node is None:
            return
        ch = self.ch
        out = node.take_outbox()
        if out and ch is not None and not ch.closed:
            for o in out:
                try:
                    ch.send(self._prefix + o.payload, dest=o.dest)
                except Exception as exc:  # leaving/closed: the node fails the write at op_timeout
                    self.counters["send_dropped"] += 1
                    log.debug("cache %s: payload not sent: %s", self.name, exc)
        for res in node.take_results():
            fut = self._waiting.pop(res.op_id, None)
            if fut is not None and not fut.done():
                fut.set_result(res)
        self._arm()


CacheRuntime = GridRuntime | InvalidationRuntime


def _check_persistence_files(default: GridConfig, specs: Sequence[CacheSpec]) -> None:
    """Two caches must not write one SQLite file: a directory gets a file per cache (the cache's name in the
    file name), but a file path names one file, which only one cache may use."""
    owners: dict[str, str] = {}
    configs = [(DEFAULT_CACHE, default)] + [(s.name, s.grid) for s in specs if s.grid is not None]
    for name, cfg in configs:
        if cfg.persistence != "write_through" or os.path.isdir(cfg.persistence_path):
            continue
        path = os.path.abspath(cfg.persistence_path)
        if path in owners:
            raise ConfigError(
                f"--cache {name}: persistence_path {cfg.persistence_path!r} is the file of cache {owners[path]!r} "
                "too; give each cache its own file, or a directory (one file per cache and member in it)"
            )
        owners[path] = name


class CacheSet:
    """The default cache and the named ones of a member: demultiplexes the channel, lists the caches.

    Register :meth:`on_view` and :meth:`on_messages` with ``Channel.connect`` and call :meth:`bind` once
    connected; messages that are neither a named cache's nor the default grid's go to the default runtime's
    ``other`` callback, as without named caches.
    """

    def __init__(self, default: GridRuntime, specs: Sequence[CacheSpec]) -> None:
        _check_persistence_files(default.config, specs)
        self.default = default
        self.specs = {s.name: s for s in specs}
        self.named: dict[str, CacheRuntime] = {}
        self.counters: Counter[str] = Counter()
        # name -> {peer address: the mode it declared}, for the caches where a peer's mode differs from ours.
        self.mismatches: dict[str, dict[str, str]] = {}
        self._logged: set[tuple[str, str]] = set()
        self._unknown: Counter[str] = Counter()
        self._me: Address | None = None
        for spec in specs:
            if spec.mode == INVALIDATION:
                self.named[spec.name] = InvalidationRuntime(spec, spec.prefix)
            else:
                assert spec.grid is not None
                cfg = spec.grid
                if "initial_cluster_size" not in spec.explicit:
                    # The member's guard against starting a second, empty grid when its join failed (the
                    # operator sets it per pod with --grid-set) protects every cache of the member alike.
                    cfg = replace(cfg, initial_cluster_size=default.config.initial_cluster_size)
                self.named[spec.name] = GridRuntime(
                    cfg, http_url=default.http_url, name=spec.name, wire_prefix=spec.prefix, parent=default
                )

    def get(self, name: str) -> CacheRuntime | None:
        """The runtime of a cache by name (``default`` included); None if this member has no such cache."""
        if name == DEFAULT_CACHE:
            return self.default
        return self.named.get(name)

    def mode_of(self, name: str) -> str | None:
        if name == DEFAULT_CACHE:
            return DISTRIBUTED
        spec = self.specs.get(name)
        return spec.mode if spec is not None else None

    def names(self) -> list[str]:
        return [DEFAULT_CACHE, *self.named]

    # -- channel callbacks ---------------------------------------------------------------------------------
    def on_view(self, view: View) -> None:
        self.default.on_view(view)  # first: it prunes the endpoints map the named caches share
        for rt in self.named.values():
            rt.on_view(view)

    def on_messages(self, msgs: list[Message]) -> None:
        rest: list[Message] = []
        per: dict[str, list[tuple[Address, bytes]]] = {}
        me = self._me
        for m in msgs:
            p = m.payload
            if not p or p[0] != TAG_CACHE:
                rest.append(m)
                continue
            if m.dest is None and m.src == me:
                continue  # our own copy of a multicast: the node handled what it sent itself
            src = m.sender()
            routed = self._route(src, p)
            if routed is not None:
                per.setdefault(routed[0], []).append((src, routed[1]))
        if rest:
            self.default.on_messages(rest)
        for name, batch in per.items():
            self.named[name].deliver(batch)  # before bind the runtime buffers, and drops our copies at bind

    def _route(self, src: Address, p: bytes) -> tuple[str, bytes] | None:
        if len(p) < 3 or len(p) < 3 + p[2]:
            self.counters["cache_bad_payloads"] += 1
            return None
        mode_code, n = p[1], p[2]
        try:
            name = p[3 : 3 + n].decode("ascii")
        except UnicodeDecodeError:
            self.counters["cache_bad_payloads"] += 1
            return None
        spec = self.specs.get(name)
        if spec is None:
            self.counters["cache_unknown"] += 1
            # Names come from peers: a bounded table (a hostile or broken peer cannot grow it without end).
            self._unknown[name if name in self._unknown or len(self._unknown) < 100 else "(others)"] += 1
            if ("?", name) not in self._logged and len(self._logged) < 1000:
                self._logged.add(("?", name))
                log.error(
                    "cache %r: %s sends payloads for a cache this member does not declare (start every member with "
                    "the same --cache options); dropped and counted (cache_unknown)",
                    name,
                    src,
                )
            return None
        if MODE_CODES[spec.mode] != mode_code:
            theirs = MODE_NAMES.get(mode_code, f"unknown mode {mode_code}")
            self.counters["cache_mode_mismatch"] += 1
            self.mismatches.setdefault(name, {})[str(src)] = theirs
            if (name, str(src)) not in self._logged and len(self._logged) < 1000:
                self._logged.add((name, str(src)))
                log.error(
                    "cache %r: %s declares it %s, this member %s; its payloads are dropped, not mixed "
                    "(declare the cache with one mode on every member)",
                    name,
                    src,
                    theirs,
                    spec.mode,
                )
            return None
        return name, p[3 + n :]

    def bind(self, ch: Channel) -> None:
        self._me = ch.address
        self.default.bind(ch)
        for rt in self.named.values():
            rt.bind(ch)

    def close(self) -> None:
        for rt in self.named.values():
            rt.close()
        self.default.close()

    # -- leaving -------------------------------------------------------------------------------------------
    def leave(self) -> None:
        for rt in self.all():
            rt.leave()

    async def wait_ready_to_leave(self) -> None:
        await self.default.wait_ready_to_leave()
        for rt in self.named.values():
            if isinstance(rt, GridRuntime):
                await rt.wait_ready_to_leave()

    @property
    def ready_to_leave(self) -> bool:
        """Every distributed and replicated cache handed its segments off (an invalidation cache has none)."""
        return all(rt.node is None or rt.node.ready_to_leave for rt in self.all() if isinstance(rt, GridRuntime))

    def all(self) -> list[CacheRuntime]:
        return [self.default, *self.named.values()]

    # -- status --------------------------------------------------------------------------------------------
    def not_ready_reasons(self) -> list[str]:
        """The default cache's reasons as they are, then each named cache's, prefixed with its name."""
        out = list(self.default.not_ready_reasons())
        for name, rt in self.named.items():
            out += [f"cache {name}: {r}" for r in rt.not_ready_reasons()]
            if name in self.mismatches:
                out.append(f"cache {name}: members declare it with different modes (see /v1/caches)")
        return out

    def describe(self, name: str) -> dict[str, Any] | None:
        """What ``/v1/caches`` lists for one cache: name, mode, segments, owners, status."""
        rt = self.get(name)
        if rt is None:
            return None
        mode = self.mode_of(name)
        doc: dict[str, Any] = {"name": name, "mode": mode, "ready": rt.ready, "not_ready": rt.not_ready_reasons()}
        if isinstance(rt, GridRuntime):
            node = rt.node
            t = node.topology if node is not None else None
            owners = t.current.num_owners if t is not None else rt.config.num_owners
            doc.update(
                num_segments=t.num_segments if t is not None else rt.config.num_segments,
                # Replicated: every member present owns every segment (the CH caps owners at the members).
                num_owners=None if mode == REPLICATED else owners,
                topology_id=t.topology_id if t is not None else None,
                phase=t.phase.name if t is not None else None,
                availability=t.availability.name if t is not None else None,
                members=len(t.members) if t is not None else 0,
                segments_owned=len(t.current.segments_owned(node.address)) if t is not None and node else 0,
                entries=len(node.store) if node is not None and node.store is not None else 0,
                transfer_pending=bool(node is not None and node.transfer_pending),
            )
        else:
            st = rt.status()
            doc.update(num_segments=None, num_owners=None, entries=st.get("entries", 0))
        doc["mode_mismatch"] = dict(self.mismatches.get(name, {}))
        return doc

    def listing(self) -> dict[str, Any]:
        caches: list[dict[str, Any]] = []
        for n in self.names():
            d = self.describe(n)
            if d is not None:
                caches.append(d)
        return {"caches": caches, "unknown_payloads": dict(self._unknown)}


def runtime_for(caches: CacheSet | None, default: GridRuntime | None, name: str) -> CacheRuntime | None:
    """The runtime serving cache ``name`` on a member (the default grid alone when no named caches exist)."""
    if caches is not None:
        return caches.get(name)
    return default if name == DEFAULT_CACHE else None
