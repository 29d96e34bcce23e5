# Generated from ../_async/transaction.py by scripts/unasync_client.py: do not edit. Change the asyncio source, then run
# .venv/bin/python scripts/unasync_client.py (scripts/test checks that this file is current).
"""A client transaction, written once for asyncio (``_async/transaction.py``: ``AsyncTransaction``) and generated
for blocking use (``_sync/transaction.py``: ``Transaction``) by ``scripts/unasync_client.py``; the bookkeeping is
:class:`~.._txcore._TxCore`."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from types import TracebackType
from typing import TYPE_CHECKING

import msgpack

from ...errors import GridTxAborted, GridTxUnknownOutcome
from .._txcore import _TxHandle
from .._wire import _check_key, _check_value, _tx_failure, _tx_path

if TYPE_CHECKING:
    from .client import GridClient


class Transaction(_TxHandle):
    """A transaction of a client (:meth:`~.AsyncGridClient.transaction`): committed on leaving the ``with``
    block (asyncio: ``async with``; every operation is a coroutine), rolled back on an exception. A
    pessimistic transaction locks each key on its primary when it first touches it. Not thread-safe (as the
    blocking client)."""

    def __init__(self, client: GridClient, mode: str = "optimistic") -> None:
        super().__init__(mode)
        self._c = client

    def get(self, key: bytes) -> bytes | None:
        """The value of ``key`` as this transaction sees it (its own writes first); records the version read.
        Pessimistic: locks the key first."""
        t = self._t
        t.check_active()
        _check_key(key)
        hit, value = t.lookup(key)
        if hit:
            return value
        if t.pessimistic:
            self.lock([key])
        value, version = self._c._call("GET", key, None, versioned=True)
        t.read(key, value, version)
        return value

    def get_many(self, keys: Iterable[bytes]) -> dict[bytes, bytes | None]:
        """Several keys in one round of batch requests (pessimistic: one lock request for all first)."""
        t = self._t
        t.check_active()
        keys = [_check_key(k) for k in dict.fromkeys(keys)]
        todo = [k for k in keys if not t.lookup(k)[0]]
        if todo:
            if t.pessimistic:
                self.lock(todo)
            for key, (value, version) in (self._c.get_many_versions(todo)).items():
                if version is None and value is not None:
                    value, version = self._c._call("GET", key, None, versioned=True)
                t.read(key, value, version or 0)
        return {k: t.lookup(k)[1] for k in keys}

    def put(self, key: bytes, value: bytes) -> None:
        self._t.check_active()
        _check_value(value)
        if self._t.pessimistic:
            self.lock([key])
        self._t.write(key, value)

    def delete(self, key: bytes) -> None:
        self._t.check_active()
        if self._t.pessimistic:
            self.lock([key])
        self._t.write(key, None)

    def lock(self, keys: Iterable[bytes]) -> None:
        """Pessimistic mode: lock ``keys`` on their primaries now (they stay locked until the end)."""
        t = self._t
        t.check_active()
        todo = t.to_lock(keys)
        if not todo:
            return
        if t.tx is None:
            t.tx, t.member = self._c._tx_begin(t.mode)
        tx, member = t.begun()
        body = msgpack.packb({"keys": todo}, use_bin_type=True)
        try:
            reply = self._c._tx_post(member, _tx_path(tx, "lock"), body)
        except self._c._io.errors as exc:
            # Nothing was committed; the member rolls the transaction back on its own (timeout, or it died).
            t.state = "failed"
            raise GridTxAborted(f"transaction {t.tx}: lock request failed: {exc}", "connection", t.tx) from None
        if reply.status != 200:
            t.state = "failed"
            raise _tx_failure(reply, t.tx)
        t.locked.update(todo)

    def commit(self) -> None:
        """Commit: raises :class:`~..errors.GridTxConflict` / :class:`~..errors.GridTxAborted` (rolled back,
        safe to run again) or :class:`~..errors.GridTxUnknownOutcome` (no answer to the commit)."""
        t = self._t
        t.check_active()
        if t.empty():
            t.state = "committed"
            return
        t.commit_sent = True
        if t.tx is None:
            t.tx = self._c._tx_oneshot(t)
        else:
            tx, member = t.begun()
            try:
                reply = self._c._tx_post(member, _tx_path(tx, "commit"), t.body(False), commit=True)
            except self._c._io.errors as exc:
                t.state = "failed"
                raise GridTxUnknownOutcome(
                    f"transaction {t.tx}: no answer to the commit ({exc}); it may or may not have committed",
                    "connection",
                    t.tx,
                ) from None
            if reply.status != 200:
                t.state = "failed"
                raise _tx_failure(reply, t.tx)
        t.state = "committed"

    def rollback(self) -> None:
        """Roll back (idempotent). A pessimistic transaction's locks are released on its member now."""
        t = self._t
        if not t.needs_rollback():
            return
        t.state = "rolled_back"
        if t.tx is not None and t.member is not None:
            # Best effort: a member that cannot be told rolls it back by itself after its tx_timeout.
            with contextlib.suppress(*self._c._io.errors):
                self._c._tx_post(t.member, _tx_path(t.tx, "rollback"), None)

    def __enter__(self) -> Transaction:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        if et is not None:
            self.rollback()
        elif self._t.state == "active":
            self.commit()
