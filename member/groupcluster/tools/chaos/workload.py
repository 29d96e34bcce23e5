"""The client side of a chaos run: the history its operations are recorded in (:class:`HistoryLog`,
:func:`timed_op`) and the writer and reader threads that make them (:class:`Workload`)."""

from __future__ import annotations

import functools
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .errors import ChaosError

# A client request gives up after REQUEST_TIMEOUT; a member's operation ends within OP_TIMEOUT + ATTEMPT_TIMEOUT
# (see Chaos.grid_params), which must stay below it.
REQUEST_TIMEOUT = 5.0
OP_TIMEOUT = 3.0
ATTEMPT_TIMEOUT = 1.0
KEY_POOL = 64  # few keys: reads and writes of one key overlap often, which is what the checkers judge
DELETE_SHARE = 0.1
OP_PAUSE = 0.01  # between a thread's operations: the members share a small machine with the workload


class HistoryLog:
    """The client side of the history: thread-safe, in wall-clock seconds like the members' recorders."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.events: list[dict[str, Any]] = []
        self.counter = 0

    def add(self, member: str, kind: str, **data: Any) -> None:
        with self.lock:
            self.events.append({"t": time.time(), "member": member, "kind": kind, **data})

    def next_id(self, who: str) -> str:
        with self.lock:
            self.counter += 1
            return f"{who}-{self.counter}"


def as_text(b: bytes | None) -> str | None:
    return None if b is None else b.decode("utf-8", errors="backslashreplace")


def timed_op(log: HistoryLog, who: str, op: str, key: bytes, value: bytes | None, call: Callable[[], Any]) -> bool:
    """Run one grid operation between a ``grid_start`` and a ``grid_end`` event; True if acknowledged."""
    from ...grid.client import GridClientError

    op_id = log.next_id(who)
    log.add(who, "grid_start", id=op_id, op=op, key=as_text(key), value=as_text(value) if op == "put" else None)
    try:
        result = call()
    except (GridClientError, OSError, ValueError) as exc:
        log.add(who, "grid_end", id=op_id, ok=False, error=str(exc)[:300])
        return False
    log.add(who, "grid_end", id=op_id, ok=True, value=as_text(result) if op == "get" else None)
    return True


@dataclass
class Workload:
    """A writer and a reader thread over :data:`KEY_POOL` keys, recording every operation."""

    endpoints: Callable[[], list[str]]
    log: HistoryLog
    seed: int
    stop: threading.Event = field(default_factory=threading.Event)
    written: set[bytes] = field(default_factory=set)
    counts: Counter[str] = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)
    threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> None:
        for role in ("writer", "reader"):
            t = threading.Thread(target=self._run, args=(role,), name=f"chaos-{role}", daemon=True)
            t.start()
            self.threads.append(t)

    def finish(self, timeout: float = 120.0) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout)
            if t.is_alive():
                raise ChaosError(f"{t.name} did not finish its last operation within {timeout:g}s")

    def _client(self) -> Any:
        from ...grid.client import GridClient

        # Short request timeouts: a paused member must not hold an operation for the default 35 s; the
        # client then retries on another member within ``timeout``.
        return GridClient(
            self.endpoints(), request_timeout=REQUEST_TIMEOUT, timeout=30.0, retries=30, avoid_seconds=3.0
        )

    def _run(self, role: str) -> None:
        rng = random.Random(f"{self.seed}:{role}")
        seq = 0
        client = self._client()
        try:
            while not self.stop.is_set():
                key = f"k{rng.randrange(KEY_POOL):03d}".encode()
                if role == "reader":
                    op, ok = "get", timed_op(self.log, role, "get", key, None, functools.partial(client.get, key))
                elif rng.random() < DELETE_SHARE:
                    op, ok = (
                        "delete",
                        timed_op(self.log, role, "delete", key, None, functools.partial(client.delete, key)),
                    )
                else:
                    seq += 1
                    value = f"v{seq}".encode()
                    with self.log.lock:
                        self.written.add(key)  # before the request: an unacknowledged put may have landed
                    op, ok = (
                        "put",
                        timed_op(self.log, role, "put", key, value, functools.partial(client.put, key, value)),
                    )
                with self.log.lock:
                    self.counts[f"{op} {'ok' if ok else 'failed'}"] += 1
                if not ok:
                    # A fresh client learns the replacements' endpoints (a client only knows the endpoints
                    # it was given and those in the routing tables it read).
                    client.close()
                    client = self._client()
                time.sleep(OP_PAUSE)
        except Exception as exc:  # a bug of ours: report it instead of dying silently in a thread
            self.errors.append(f"{role}: {type(exc).__name__}: {exc}")
        finally:
            client.close()
