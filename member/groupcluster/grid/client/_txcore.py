"""A client transaction's bookkeeping, shared by the blocking and the asyncio transactions (no I/O here)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgpack

from ..errors import GridError
from ._routing import _Router
from ._wire import TX_MODES, VALUE_LIMIT, _check_key


class _TxCore:
    """A client-side transaction's bookkeeping, shared by the blocking and asyncio forms (no I/O here).

    ``reads``: key -> version first read (0: absent), checked by the primary at commit; ``values``: what was
    read (read again in the transaction, a key gives the same answer); ``writes``: key -> value (None
    deletes), buffered until the commit; ``locked``: keys a pessimistic transaction holds on their primaries;
    ``tx``/``member``: the id and the member (originator) of a pessimistic transaction once begun there.
    """

    def __init__(self, mode: str) -> None:
        if mode not in TX_MODES:
            raise ValueError(f"mode: expected 'optimistic' or 'pessimistic', got {mode!r}")
        self.mode = mode
        self.reads: dict[bytes, int] = {}
        self.values: dict[bytes, bytes | None] = {}
        self.writes: dict[bytes, bytes | None] = {}
        self.locked: set[bytes] = set()
        self.tx: str | None = None
        self.member: str | None = None
        self.state = "active"  # active | committed | rolled_back | failed
        self.commit_sent = False

    def begun(self) -> tuple[str, str]:
        """``(tx, member)`` of a transaction begun on its member (which happens with its first lock)."""
        if self.tx is None or self.member is None:
            raise GridError("the transaction has not begun on a member yet")
        return self.tx, self.member

    def needs_rollback(self) -> bool:
        """A rollback is due unless the transaction finished, or a commit was sent (whose outcome stands): a
        failed lock request may leave the transaction open on its member, holding the locks it got."""
        return self.state in ("active", "failed") and not self.commit_sent

    @property
    def pessimistic(self) -> bool:
        return self.mode == "pessimistic"

    def check_active(self) -> None:
        if self.state != "active":
            raise GridError(f"the transaction is {self.state.replace('_', ' ')}: start a new one")

    def lookup(self, key: bytes) -> tuple[bool, bytes | None]:
        if key in self.writes:
            return True, self.writes[key]
        if key in self.values:
            return True, self.values[key]
        return False, None

    def read(self, key: bytes, value: bytes | None, version: int) -> None:
        self.values[key] = value
        self.reads[key] = version

    def write(self, key: bytes, value: bytes | None) -> None:
        _check_key(key)
        if value is not None:
            if type(value) is not bytes:
                raise TypeError(f"value of {key!r}: expected bytes, got {type(value).__name__}")
            if len(value) > VALUE_LIMIT:
                raise ValueError(f"value of {key!r}: {len(value)} bytes exceed the limit of {VALUE_LIMIT}")
        self.writes[key] = value

    def to_lock(self, keys: Iterable[bytes]) -> list[bytes]:
        if not self.pessimistic:
            raise ValueError("lock: an optimistic transaction locks nothing ahead (use mode='pessimistic')")
        return [_check_key(k) for k in dict.fromkeys(keys) if k not in self.locked]

    def empty(self) -> bool:
        return not self.reads and not self.writes and not self.locked

    def body(self, oneshot: bool) -> bytes:
        doc: dict[str, Any] = {"reads": self.reads, "writes": self.writes}
        if oneshot:
            doc["mode"] = self.mode
        return msgpack.packb(doc, use_bin_type=True)

    def commit_target(self, router: _Router) -> str:
        """Where a one-shot commit goes: the write primary of a written key (it coordinates from there, one
        hop less), else of a read key."""
        key = next(iter(self.writes), None) or next(iter(self.reads))
        return router.target(key, write=True)


class _TxHandle:
    """What the blocking and the asyncio transaction share: their state, kept in a :class:`_TxCore`."""

    def __init__(self, mode: str) -> None:
        self._t = _TxCore(mode)

    @property
    def mode(self) -> str:
        return self._t.mode

    @property
    def id(self) -> str | None:
        """The member's transaction id (pessimistic: once begun; optimistic: after the commit)."""
        return self._t.tx

    @property
    def state(self) -> str:
        return self._t.state
