"""An invalidation-mode cache member as a sans-IO state machine (Infinispan's INVALIDATION_SYNC).

Every member holds only its own copies; nothing is ever copied from one member to another, so there is no
consistent hash, no topology and no state transfer. A write stores the value here and multicasts an
*invalidation* of the key; every other member drops its copy and acknowledges. The write completes when
every member of the view it was made in acknowledged (or left the view). A read is answered from the local
copy alone: absent when this member holds none. The cache is meant to sit in front of a shared store (a
near cache): the application reads its store on a miss and puts what it read here.

Guarantees (docs/grid.md, "Named caches and modes"):

* once ``put``/``delete`` of a key completed on member A, no other member of that view answers a value of
  the key from a write that had completed before A's began (their copies were dropped before they
  acknowledged: such a write's version is below A's, since A's clock had passed it);
* concurrent writes of one key on several members leave at most one copy, the newest by (Lamport clock,
  writer address): every member keeps a copy only if no invalidation it received is newer, so the writers
  of older versions drop theirs;
* a member whose clock is behind (it joined after the writes it has not heard of) cannot lose a write to an
  older copy: a member that keeps its copy because it looks newer says so in its acknowledgement, with its
  clock, and the writer, if it still holds what it wrote, stamps it again above that clock and sends the
  invalidation to that member again before the write completes;
* a merge view drops every copy here: invalidations sent in the other partition never arrived.

It does *not* promise that a value is anywhere at all (any member may hold nothing), nor that members
agree on absent keys; a member that joins starts empty.

Wire (after the runtime's cache prefix): msgpack ``[1, msg_id, keys, versions]`` (INVALIDATE: multicast, or
unicast for a resend or a new stamp) and ``[2, msg_id, clock, kept]`` (ACK, unicast back: the acknowledging
member's clock and the indexes of the keys whose newer copy it kept). Everything decoded is checked; a bad
payload is dropped and counted, never raised.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack

from ..core.address import Address
from ..core.config import param, parse_params
from ..core.errors import ConfigError, WireError
from .columns import BATCH_MAX_ENTRIES
from .messages import DELETE, GET, PUT
from .node import OpResult, Outgoing
from .payload import DEFAULT_LIMITS, GridLimits

INVALIDATE, ACK = 1, 2
_MAX_INT = (1 << 63) - 1


@dataclass(frozen=True)
class InvalidationConfig:
    """Parameters of an invalidation cache (``--cache NAME:mode=invalidation,KEY=VALUE``)."""

    max_entries: int = param(1_000_000, "int", doc="copies kept here; the oldest written are dropped first", minimum=1)
    attempt_timeout: float = param("3s", "duration", doc="resend an unacknowledged invalidation after this")
    op_timeout: float = param("30s", "duration", doc="fail a write whose invalidation is not acknowledged by then")

    def __post_init__(self) -> None:
        if self.attempt_timeout <= 0 or self.op_timeout <= 0:
            raise ConfigError("invalidation: attempt_timeout and op_timeout must be positive")

    @classmethod
    def from_dict(cls, params: dict[str, Any], where: str = "invalidation") -> InvalidationConfig:
        return parse_params(cls, params, where)


class _Write:
    """A write of this member waiting for the other members' acknowledgements."""

    __slots__ = ("deadline", "key", "kind", "msg_ids", "op_id", "version", "waiting")

    def __init__(self, op_id: int, kind: int, key: bytes, version: int, waiting: set[Address], deadline: float) -> None:
        self.op_id = op_id
        self.kind = kind
        self.key = key
        self.version = version
        self.waiting = waiting
        self.deadline = deadline
        self.msg_ids: list[int] = []  # the messages that carried it (their bookkeeping ends with the write)


@dataclass(frozen=True, slots=True)
class InvMessage:
    """A decoded payload: INVALIDATE (``keys``, ``versions``) or ACK (``clock``, ``kept`` indexes)."""

    kind: int
    msg_id: int
    keys: tuple[bytes, ...] = ()
    versions: tuple[int, ...] = ()
    clock: int = 0
    kept: tuple[int, ...] = ()


def encode_invalidate(msg_id: int, keys: Sequence[bytes], versions: Sequence[int]) -> bytes:
    return msgpack.packb([INVALIDATE, msg_id, list(keys), list(versions)], use_bin_type=True)


def encode_ack(msg_id: int, clock: int, kept: Sequence[int] = ()) -> bytes:
    return msgpack.packb([ACK, msg_id, clock, list(kept)], use_bin_type=True)


def _positive(value: object, field: str) -> int:
    if type(value) is not int or not 0 < value <= _MAX_INT:
        raise WireError(f"{field}: {value!r} is not a positive integer")
    return value


def decode(payload: bytes, limits: GridLimits = DEFAULT_LIMITS) -> InvMessage:
    """The message in a payload; :class:`WireError` naming the bad field otherwise."""
    try:
        doc = msgpack.unpackb(payload, raw=False, max_bin_len=limits.max_key_bytes, max_array_len=BATCH_MAX_ENTRIES)
    except Exception as exc:  # msgpack raises assorted errors on hostile bytes
        raise WireError(f"invalidation: not msgpack ({type(exc).__name__})") from None
    if type(doc) is not list or not doc or type(doc[0]) is not int:
        raise WireError("invalidation: expected [kind, ...]")
    kind = doc[0]
    if kind == ACK:
        if len(doc) != 4:
            raise WireError("invalidation.ack: expected [2, msg_id, clock, kept]")
        msg_id = _positive(doc[1], "invalidation.ack.msg_id")
        clock = doc[2]
        if type(clock) is not int or not 0 <= clock <= _MAX_INT:
            raise WireError(f"invalidation.ack.clock: {clock!r} is not a clock value")
        kept = doc[3]
        if type(kept) is not list or not all(type(i) is int and 0 <= i < BATCH_MAX_ENTRIES for i in kept):
            raise WireError("invalidation.ack.kept: expected a list of key indexes")
        return InvMessage(ACK, msg_id, clock=clock, kept=tuple(kept))
    if kind != INVALIDATE or len(doc) != 4:
        raise WireError(f"invalidation: unknown kind {kind!r} or wrong length {len(doc)}")
    msg_id = _positive(doc[1], "invalidation.msg_id")
    keys, versions = doc[2], doc[3]
    if type(keys) is not list or type(versions) is not list or len(keys) != len(versions) or not keys:
        raise WireError("invalidation: keys and versions must be non-empty lists of one length")
    for i, (k, v) in enumerate(zip(keys, versions, strict=True)):
        if type(k) is not bytes or not k:
            raise WireError(f"invalidation.keys[{i}]: expected non-empty bytes")
        _positive(v, f"invalidation.versions[{i}]")
    return InvMessage(INVALIDATE, msg_id, tuple(keys), tuple(versions))


class InvalidationNode:
    """One member of an invalidation cache. Feed it views, payloads, time and operations; collect payloads and
    results, as with :class:`~.node.GridNode` (same :class:`~.node.Outgoing` and :class:`~.node.OpResult`)."""

    def __init__(
        self, address: Address, config: InvalidationConfig | None = None, *, limits: GridLimits = DEFAULT_LIMITS
    ) -> None:
        self.address = address
        self.config = config or InvalidationConfig()
        self.limits = limits
        self.view: tuple[Address, ...] = ()
        # key -> (version, writer as text, value). Insertion order is write order, which max_entries evicts by.
        self.entries: dict[bytes, tuple[int, str, bytes]] = {}
        # A Lamport clock: above every version written here or seen in an invalidation or acknowledgement, so a
        # write here is newer than everything this member has heard of.
        self.clock = 0
        self.metrics: Counter[str] = Counter()
        self.last_error = ""
        self._me = str(address)
        self._next_op = 1
        self._next_msg = 1
        self._writes: dict[int, _Write] = {}
        self._msgs: dict[int, list[int]] = {}  # message id -> the op ids of its keys, in order
        self._msg_open: Counter[int] = Counter()  # message id -> its writes not finished yet
        self._timers: list[tuple[float, int]] = []  # (resend or fail time, op id)
        self._outbox: list[Outgoing] = []
        self._results: list[OpResult] = []

    # ==== inputs ========================================================================================
    def on_view(self, members: Sequence[Address], now: float, *, merge: bool = False) -> None:
        """A new group view (``merge`` True for a merge view)."""
        if not members:
            raise ValueError("on_view: a view has at least one member")
        self.view = tuple(members)
        alive = set(members)
        if merge and self.entries:
            # Writes of the other partition were never invalidated here: every copy may be stale.
            self.metrics["inv.dropped_on_merge"] += len(self.entries)
            self.entries.clear()
        for w in list(self._writes.values()):
            w.waiting &= alive  # a member that left holds nothing of this cache any more
            if not w.waiting:
                self._complete(w, True)

    def on_messages(self, batch: Iterable[tuple[Address, bytes]], now: float) -> None:
        """Payloads for this cache, as (sender, payload); bad ones are dropped and counted."""
        for src, payload in batch:
            try:
                m = decode(payload, self.limits)
            except WireError as exc:
                self.metrics["inv.bad_payloads"] += 1
                self.last_error = f"from {src}: {exc}"
                continue
            if m.kind == ACK:
                self._on_ack(src, m)
            else:
                kept = self._invalidate(src, m.keys, m.versions)
                self._outbox.append(Outgoing(src, encode_ack(m.msg_id, self.clock, kept)))

    def tick(self, now: float) -> None:
        timers = self._timers
        due: dict[Address, list[_Write]] = {}
        while timers and timers[0][0] <= now:
            _, op_id = heapq.heappop(timers)
            w = self._writes.get(op_id)
            if w is None:
                continue
            if now >= w.deadline:
                missing = ", ".join(sorted(str(m) for m in w.waiting))
                self._complete(
                    w,
                    False,
                    f"invalidation timed out: not acknowledged by {missing} within {self.config.op_timeout:g}s "
                    "(the value is stored on this member; other copies may remain)",
                )
                continue
            # The channel is reliable, so this only matters when a member stalls: ask the missing ones again.
            for m in w.waiting:
                due.setdefault(m, []).append(w)
            heapq.heappush(timers, (min(now + self.config.attempt_timeout, w.deadline), op_id))
        for dest in sorted(due):
            self._send(dest, due[dest])
            self.metrics["inv.resent"] += 1

    def next_deadline(self) -> float | None:
        return self._timers[0][0] if self._timers else None

    # ==== operations ====================================================================================
    def get(self, key: bytes) -> bytes | None:
        """The local copy (None: not held here). Reads never leave this member."""
        self._check_key(key)
        e = self.entries.get(key)
        self.metrics["inv.hits" if e is not None else "inv.misses"] += 1
        return e[2] if e is not None else None

    def version_of(self, key: bytes) -> int:
        e = self.entries.get(key)
        return e[0] if e is not None else 0

    def put(self, key: bytes, value: bytes, now: float) -> int:
        return self.start_batch([(PUT, key, value)], now)[0]

    def delete(self, key: bytes, now: float) -> int:
        return self.start_batch([(DELETE, key, None)], now)[0]

    def start_batch(self, ops: Sequence[tuple[int, bytes, bytes | None]], now: float) -> list[int]:
        """Run ``(kind, key, value)`` operations in one step: gets answer at once from the local copy, and the
        invalidations of all writes leave as one multicast (per :data:`BATCH_MAX_ENTRIES` keys). Bad operations
        raise ValueError before anything runs."""
        for i, (kind, key, value) in enumerate(ops):
            self._check_key(key, f"ops[{i}].key")
            if kind == PUT:
                if type(value) is not bytes or not value or len(value) > self.limits.max_value_bytes:
                    raise ValueError(f"ops[{i}].value: expected 1 to {self.limits.max_value_bytes} bytes")
            elif kind not in (GET, DELETE):
                raise ValueError(f"ops[{i}]: unknown operation kind {kind!r}")
        ids: list[int] = []
        writes: list[_Write] = []
        others = {m for m in self.view if m != self.address}
        deadline = now + self.config.op_timeout
        for kind, key, value in ops:
            op_id = self._next_op
            self._next_op += 1
            ids.append(op_id)
            if kind == GET:
                found = self.get(key)
                self._results.append(OpResult(op_id, GET, key, True, found, version=self.version_of(key)))
                continue
            self.clock += 1
            self.entries.pop(key, None)  # re-inserted last: insertion order stays write order
            if kind == PUT:
                assert value is not None
                self.entries[key] = (self.clock, self._me, value)
            self.metrics["inv.puts" if kind == PUT else "inv.deletes"] += 1
            writes.append(_Write(op_id, kind, key, self.clock, set(others), deadline))
        self._evict()
        if not others:
            for w in writes:
                self._complete(w, True)  # alone in the view: nobody else holds a copy
            return ids
        resend_at = min(now + self.config.attempt_timeout, deadline)
        for w in writes:
            self._writes[w.op_id] = w
            heapq.heappush(self._timers, (resend_at, w.op_id))
        self._send(None, writes)
        return ids

    # ==== outputs =======================================================================================
    def take_outbox(self) -> list[Outgoing]:
        out, self._outbox = self._outbox, []
        return out

    def take_results(self) -> list[OpResult]:
        res, self._results = self._results, []
        return res

    @property
    def pending_ops(self) -> int:
        return len(self._writes)

    def status(self) -> dict[str, Any]:
        return {
            "entries": len(self.entries),
            "pending_writes": len(self._writes),
            "clock": self.clock,
            "view_size": len(self.view),
        }

    # ==== internals =====================================================================================
    def _check_key(self, key: object, what: str = "key") -> None:
        if type(key) is not bytes or not key or len(key) > self.limits.max_key_bytes:
            raise ValueError(f"{what}: expected 1 to {self.limits.max_key_bytes} bytes")

    def _send(self, dest: Address | None, writes: list[_Write]) -> None:
        """Invalidations of ``writes`` to ``dest`` (None: every member), one message per batch of keys."""
        for i in range(0, len(writes), BATCH_MAX_ENTRIES):
            part = writes[i : i + BATCH_MAX_ENTRIES]
            msg_id = self._next_msg
            self._next_msg += 1
            self._msgs[msg_id] = [w.op_id for w in part]
            self._msg_open[msg_id] = len(part)
            for w in part:
                w.msg_ids.append(msg_id)
            payload = encode_invalidate(msg_id, [w.key for w in part], [w.version for w in part])
            self._outbox.append(Outgoing(dest, payload))
            self.metrics["inv.sent"] += 1

    def _on_ack(self, src: Address, m: InvMessage) -> None:
        if m.clock > self.clock:
            self.clock = m.clock
        op_ids = self._msgs.get(m.msg_id)
        if op_ids is None:
            return  # every write of that message is finished (a late or repeated acknowledgement)
        kept = set(m.kept)
        again: list[_Write] = []
        for i, op_id in enumerate(op_ids):
            w = self._writes.get(op_id)
            if w is None or src not in w.waiting:
                continue
            if i in kept and self._still_ours(w):
                # src kept a copy that looks newer: our clock was behind (e.g. we joined after it was written).
                # Ours is the later write, so it is stamped again above src's clock and sent to src again.
                self.clock += 1
                w.version = self.clock
                if w.kind == PUT:
                    e = self.entries[w.key]
                    self.entries[w.key] = (w.version, self._me, e[2])
                again.append(w)
                self.metrics["inv.restamped"] += 1
                continue
            w.waiting.discard(src)
            if not w.waiting:
                self._complete(w, True)
        if again:
            self._send(src, again)

    def _still_ours(self, w: _Write) -> bool:
        """Whether this member still holds what ``w`` wrote (else a newer write replaced it: nothing to defend)."""
        e = self.entries.get(w.key)
        if w.kind == PUT:
            return e is not None and e[0] == w.version and e[1] == self._me
        return e is None

    def _complete(self, w: _Write, ok: bool, error: str = "") -> None:
        self._writes.pop(w.op_id, None)
        for mid in w.msg_ids:
            self._msg_open[mid] -= 1
            if self._msg_open[mid] <= 0:
                del self._msg_open[mid]
                self._msgs.pop(mid, None)
        self._results.append(OpResult(w.op_id, w.kind, w.key, ok, None, error, 1, w.version))
        if not ok:
            self.metrics["inv.failed"] += 1

    def _invalidate(self, src: Address, keys: Sequence[bytes], versions: Sequence[int]) -> list[int]:
        """Drop the copies older than the writer's; the indexes of the keys whose newer copy was kept."""
        writer = str(src)
        entries = self.entries
        dropped = 0
        kept: list[int] = []
        for i, (key, version) in enumerate(zip(keys, versions, strict=True)):
            if version > self.clock:
                self.clock = version
            e = entries.get(key)
            if e is None:
                continue
            # Of concurrent writes the newest by (clock, writer) keeps its copy; every older copy is dropped.
            if (e[0], e[1]) < (version, writer):
                del entries[key]
                dropped += 1
            else:
                kept.append(i)
        self.metrics["inv.received"] += len(keys)
        self.metrics["inv.dropped"] += dropped
        self.metrics["inv.kept_newer"] += len(kept)
        return kept

    def _evict(self) -> None:
        extra = len(self.entries) - self.config.max_entries
        if extra <= 0:
            return
        for key in list(self.entries)[:extra]:
            del self.entries[key]
        self.metrics["inv.evicted"] += extra
