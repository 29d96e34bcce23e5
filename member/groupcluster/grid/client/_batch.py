"""Batch planning of ``put_many``/``get_many``/``delete_many``: the operations checked, grouped by owner, cut
into requests, and the per-key outcome of each round of requests (no I/O here)."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from itertools import repeat
from operator import itemgetter
from typing import Any

import msgpack

from ..errors import GridBatchError, GridError, GridRequestError
from ._routing import _Router
from ._wire import BATCH_BYTES, BATCH_KEY_LIMIT, RETRYABLE_STATUS, VALUE_LIMIT, _check_key, _Reply

# One operation of a batch: ("get" | "put" | "delete", key, value or None).
_Op = tuple[str, bytes, bytes | None]


_BYTES = {bytes}


_OK_RESULT = {"status": 200}  # a batch's answer for a write that was done


def _put_ops(items: Mapping[bytes, bytes] | Iterable[tuple[bytes, bytes]]) -> list[_Op]:
    # A dict keeps the last value of a repeated key: requests run concurrently, so two writes of one key in
    # one call would otherwise land in no defined order.
    pairs = dict(items.items() if isinstance(items, Mapping) else items)
    keys, values = list(pairs), list(pairs.values())
    # The checks below in bulk (C-level map/min/max; the Spark writer sends millions of rows through here);
    # anything off takes the loop, which names the first bad entry.
    if (
        keys
        and set(map(type, keys)) == _BYTES
        and set(map(type, values)) == _BYTES
        and min(map(len, keys)) >= 1
        and max(map(len, keys)) <= BATCH_KEY_LIMIT
        and max(map(len, values)) <= VALUE_LIMIT
    ):
        return list(zip(repeat("put"), keys, values))
    ops: list[_Op] = []
    for k, v in pairs.items():
        _check_key(k)
        if type(v) is not bytes:
            raise TypeError(f"value of {k!r}: expected bytes, got {type(v).__name__}")
        if len(v) > VALUE_LIMIT:
            raise ValueError(f"value of {k!r}: {len(v)} bytes exceed the limit of {VALUE_LIMIT}")
        ops.append(("put", k, v))
    return ops


def _key_ops(kind: str, keys: Iterable[bytes]) -> list[_Op]:
    return [(kind, _check_key(k), None) for k in dict.fromkeys(keys)]


class _BatchRun:
    """The state of one ``*_many`` call: results so far, keys still to do, keys failed for good (no I/O)."""

    def __init__(self, ops: list[_Op], timeout: float, lifespan: float | None = None) -> None:
        self.ops = ops
        # Sent with every put of the run, retries included: {"lifespan": seconds} as the op's fourth element.
        self.options = None if lifespan is None else {"lifespan": lifespan}
        self.results: list[bytes | None] = [None] * len(ops)
        self.versions: list[int | None] = [None] * len(ops)
        self.pending: list[int] = list(range(len(ops)))
        self.failed: dict[int, str] = {}
        self.retry: list[int] = []
        self.last_status: int | None = None
        self.last_error = ""
        self.deadline = time.monotonic() + timeout
        self.no_gets = all(op[0] != "get" for op in ops)

    def plan(self, router: _Router, batch_size: int, route: bool) -> list[tuple[str, list[int]]]:
        """The pending operations grouped by target member (one member for all without ``route``), cut into
        requests of ``batch_size`` operations / ~4 MiB."""
        groups: dict[str, list[int]] = {}
        ops = self.ops
        if route:
            targets = router.targets([ops[i][1] for i in self.pending], [ops[i][0] != "get" for i in self.pending])
        else:
            targets = [router.any_endpoint()] * len(self.pending)
        for i, ep in zip(self.pending, targets, strict=True):
            groups.setdefault(ep, []).append(i)
        plan: list[tuple[str, list[int]]] = []
        for ep, idxs in groups.items():
            parts = [idxs[j : j + batch_size] for j in range(0, len(idxs), batch_size)]
            if all(self._nbytes(part) <= BATCH_BYTES for part in parts):
                plan.extend((ep, part) for part in parts)  # the usual case: small entries, cut by count alone
                continue
            chunk: list[int] = []
            size = 0
            for i in idxs:
                _, key, value = self.ops[i]
                n = len(key) + (len(value) if value else 0) + 16
                if chunk and (len(chunk) >= batch_size or size + n > BATCH_BYTES):
                    plan.append((ep, chunk))
                    chunk, size = [], 0
                chunk.append(i)
                size += n
            if chunk:
                plan.append((ep, chunk))
        return plan

    def _nbytes(self, idxs: list[int]) -> int:
        """The bytes :meth:`plan` counts for these operations (key, value and 16 each)."""
        part = list(map(self.ops.__getitem__, idxs))
        keys = sum(map(len, map(itemgetter(1), part)))
        return keys + sum(map(len, filter(None, map(itemgetter(2), part)))) + 16 * len(part)

    def body(self, idxs: list[int]) -> bytes:
        ops = self.ops
        # An operation is its (kind, key, value) tuple as it is (msgpack packs a tuple as an array) for a put;
        # gets and deletes leave the value out.
        body: list[tuple[Any, ...]]
        if self.options is None:
            body = [op if op[0] == "put" else op[:2] for op in map(ops.__getitem__, idxs)]
        else:
            opts = self.options
            body = [(*op, opts) if op[0] == "put" else op[:2] for op in map(ops.__getitem__, idxs)]
        return msgpack.packb({"ops": body}, use_bin_type=True)

    def absorb(self, router: _Router, ep: str, idxs: list[int], reply: _Reply | None, error: str = "") -> None:
        """Take one request's outcome: results in, retryable keys to ``retry``; raises for a refused request."""
        if reply is None:
            router.failed(ep)
            self.retry.extend(idxs)
            self.last_error, self.last_status = f"{ep}: {error}", None
            return
        if reply.status in RETRYABLE_STATUS:
            if reply.status == 503:
                router.avoid[ep] = time.monotonic() + router.avoid_seconds
            self.retry.extend(idxs)
            self.last_error = f"{ep}: HTTP {reply.status}: {router.error_message(reply)}"
            self.last_status = reply.status
            return
        if reply.status != 200:
            raise GridRequestError(reply.status, router.error_message(reply))
        try:
            doc = msgpack.unpackb(reply.body, raw=False)
            results = doc["results"]
            if len(results) != len(idxs):
                raise ValueError(f"{len(results)} results for {len(idxs)} operations")
        except Exception as exc:
            raise GridError(f"{ep}: malformed batch answer: {exc}") from None
        if self.no_gets and type(results) is list and results.count(_OK_RESULT) == len(results):
            return  # every write done (the usual answer): nothing to record, results and versions stay None
        for i, res in zip(idxs, results, strict=True):
            status = res.get("status")
            if status == 200:
                self.results[i] = res.get("value")
                version = res.get("version")
                self.versions[i] = version if type(version) is int else None
            elif status == 404 and self.ops[i][0] == "get":
                self.results[i] = None
            elif status in RETRYABLE_STATUS or (status == 409 and res.get("reason") == "locked"):
                self.retry.append(i)
                self.last_error = f"{ep}: {status}: {res.get('error', '')}"
                self.last_status = status
            else:
                self.failed[i] = f"HTTP {status}: {res.get('error', '')}"

    def next_round(self) -> bool:
        """Move the keys to retry into ``pending``; False when nothing is left to do."""
        self.pending, self.retry = self.retry, []
        return bool(self.pending)

    def finish(self) -> list[bytes | None]:
        if self.pending:
            for i in self.pending:
                self.failed[i] = f"not done after the retries; last: {self.last_error}"
        if self.failed:
            failed = {self.ops[i][1]: msg for i, msg in sorted(self.failed.items())}
            raise GridBatchError(failed, len(self.ops) - len(failed), self.last_status)
        return self.results
