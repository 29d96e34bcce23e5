"""Client operations on their originator: routing a GET/PUT/DELETE to an owner, attempts, resends and
retries across topologies, client deadlines, answers.

It holds the operations in flight (in start order), their resend and retry timers (as runs: a batch is one
heap entry) and the client deadlines armed."""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ...core.address import Address
from ..columns import ResponseBatch
from ..consistent_hash import segment_of, segments_of
from ..messages import DELETE, ERROR, GET, NOT_FOUND, OK, PUT, Response
from ..tx.reasons import REASON_ERROR, REASON_FULL, REASON_LOCKED, REASON_TIMEOUT, REASON_UNAVAILABLE
from .expiry import _check_expires
from .results import OpResult

if TYPE_CHECKING:
    from .facade import GridNode


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


class Operations:
    """The client operations this member originated, until they finish."""

    def __init__(self, node: GridNode) -> None:
        self.node = node
        self._next_op = 1
        self.ops: dict[int, _Op] = {}
        # Resend and retry-backoff times of operations, as set (stale entries are skipped): runs
        # ``[time, seq, first op id, last op id]`` of operations sharing one time. The operations of a batch
        # are sent in one step with consecutive ids, so a batch is one heap entry, not one per operation (a
        # push and a pop per operation were ~4% of a member's CPU under batch writes). ``seq`` orders runs
        # of one time; ``first`` moves up as the run's front operations finish (see next_deadline).
        self.op_timers: list[list[Any]] = []
        self._timer_seq = 0
        self._timer_run: list[Any] | None = None  # the run last pushed by _send_op, which the next may extend
        # Client deadlines of operations started with one, as ``(deadline, first op id, last op id)``: a batch
        # shares one entry. Entries of operations that finished earlier are skipped when due.
        self._cutoffs: list[tuple[float, int, int]] = []

    def ops_tick(self, now: float) -> None:
        """Resend, retry or fail the operations whose timers or deadlines are due."""
        ops = self.ops
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
        timers = self.op_timers
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
                self.node.metrics["grid.op_resends"] += 1
                self.send_op(op)
            elif op.not_before is not None:
                self.try_send(op)

    def ops_deadlines(self) -> list[float]:
        """When operations need a step: the first client deadline, operation deadline and resend time."""
        times: list[float] = []
        if self._cutoffs:
            times.append(self._cutoffs[0][0])
        ops = self.ops
        if ops:
            # Deadlines are start time + op_timeout and operations stay in start order, so the first is the
            # earliest: no scan over thousands of operations in flight on every step.
            times.append(next(iter(ops.values())).deadline)
        timers = self.op_timers
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
        return times

    def start_batch(
        self,
        ops: Sequence[tuple[int, bytes, bytes | None]],
        now: float,
        deadline: float | None = None,
        expiries: Sequence[float] | None = None,
    ) -> list[int]:
        """:meth:`GridNode.start_batch`."""
        lim = self.node.limits
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
        self.node._now = now
        op_deadline = now + self.node.config.op_timeout
        ids = []
        start = self._next_op
        self._next_op += len(ops)
        t = self.node.topology
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
            self.ops[op_id] = op
            if cutoff <= now:
                self._expire(op)
            else:
                self.try_send(op)
            ids.append(op_id)
        self.node._flush()
        return ids

    # ==== operations (originator side) =====================================================================
    def start_op(
        self, kind: int, key: bytes, value: bytes | None, now: float, cutoff: float | None, expires: float = 0.0
    ) -> int:
        if type(key) is not bytes:
            raise TypeError(f"key: expected bytes, got {type(key).__name__}")
        if len(key) > self.node.limits.max_key_bytes:
            raise ValueError(f"key: {len(key)} bytes exceed the limit of {self.node.limits.max_key_bytes}")
        self.node._now = now
        op_id = self._next_op
        self._next_op += 1
        op = _Op(op_id, kind, key, value, now + self.node.config.op_timeout)
        op.cutoff = self._arm_cutoff(cutoff, op_id, op_id, now)
        op.expires = expires
        self.ops[op_id] = op
        if op.cutoff <= now:
            self._expire(op)
        else:
            self.try_send(op)
        self.node._flush()
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
        self.node.metrics["grid.ops_deadline_expired"] += 1
        suffix = f" after {op.attempt} attempts" if op.attempt else " before any attempt was sent"
        self._finish(op, False, error=_CUTOFF_ERROR + suffix)

    def try_send(self, op: _Op) -> None:
        t = self.node.topology
        nb = op.not_before
        if nb is None or t is None or t.topology_id < nb[0] or self.node._now < nb[1]:
            return
        self.send_op(op)

    def send_op(self, op: _Op) -> None:
        if self.node._now >= op.cutoff:
            self._expire(op)
            return
        t = self.node.topology
        if t is None:
            op.not_before = (1, 0.0)
            return
        if op.nseg != t.num_segments:
            op.seg = segment_of(op.key, t.num_segments)
            op.nseg = t.num_segments
        seg = op.seg
        r = self.node._routes(t)
        if op.kind == GET:
            if not r.can_read[seg]:
                self._finish(op, False, error=f"segment {seg} is unavailable for reads ({t.mode.value})")
                return
            target = self.node.address if r.i_read[seg] else r.read[seg][0]
        else:
            w = r.write[seg]
            if not r.can_write[seg] or not w:  # a writable segment has a write owner: both say the same
                self._finish(op, False, error=f"segment {seg} is unavailable for writes ({t.mode.value})")
                return
            target = w[0]
        op.attempt += 1
        op.target = target
        op.topology_id = t.topology_id
        op.not_before = None
        at = op.resend_at = self.node._now + self.node.config.attempt_timeout
        run = self._timer_run
        op_id = op.op_id
        if run is not None and run[0] == at and run[3] == op_id - 1:
            run[3] = op_id
        else:
            self._timer_run = self._push_timer(at, op_id)
        # The owner gets the deadline as a Unix time (its own clock differs from ours); 0.0: none.
        cutoff = op.cutoff
        wall = cutoff + self.node.wall_offset if cutoff != _NO_CUTOFF else 0.0
        self.node._emit_cmd(target, op.op_id, op.attempt, t.topology_id, op.kind, op.key, op.value, wall, op.expires)

    def _push_timer(self, at: float, op_id: int) -> list[Any]:
        """A timer run of operation ``op_id`` alone at ``at`` (see ``_op_timers``)."""
        self._timer_seq += 1
        run = [at, self._timer_seq, op_id, op_id]
        heapq.heappush(self.op_timers, run)
        return run

    def on_response_batch(self, src: Address, b: ResponseBatch) -> None:
        response = self._response
        errors = b.errors
        for i, (op_id, attempt, code, tid, value, version) in enumerate(
            zip(b.op_ids, b.attempts, b.codes, b.topology_ids, b.values, b.versions, strict=True)
        ):
            response(op_id, attempt, code, tid, value, errors.get(i, "") if errors else "", version)

    def on_response(self, src: Address, rsp: Response) -> None:
        self._response(rsp.op_id, rsp.attempt, rsp.code, rsp.topology_id, rsp.value, rsp.error, rsp.version)

    def _response(
        self, op_id: int, attempt: int, code: int, tid: int, value: bytes | None, error: str, version: int = 0
    ) -> None:
        op = self.ops.get(op_id)
        if op is None or attempt != op.attempt or op.not_before is not None:
            return  # an answer to an earlier attempt (or a duplicate)
        if code == OK:
            self._finish(op, True, value=value, version=version)
        elif code == NOT_FOUND:
            self._finish(op, True)
        elif code == ERROR:
            self._finish(op, False, error=error)
        else:
            self.node.metrics["grid.retries"] += 1
            mine = self.node.topology.topology_id if self.node.topology else 0
            if tid > mine:
                op.not_before = (tid, 0.0)
            elif op.topology_id < mine:
                op.not_before = (0, 0.0)  # we have moved on already: retry at once
            else:
                op.not_before = (0, self.node._now + self.node.config.retry_backoff)
                self._push_timer(op.not_before[1], op.op_id)
            self.try_send(op)

    def _finish(self, op: _Op, ok: bool, *, value: bytes | None = None, error: str = "", version: int = 0) -> None:
        self.ops.pop(op.op_id, None)
        reason = ""
        if not ok:
            self.node.metrics["grid.ops_failed"] += 1
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
        self.node._results.append(OpResult(op.op_id, op.kind, op.key, ok, value, error, op.attempt, version, reason))

    def new_op_id(self) -> int:
        op_id = self._next_op
        self._next_op += 1
        return op_id
