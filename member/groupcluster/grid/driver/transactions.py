"""RuntimeTransactions: a grid runtime's transactions, begun on this member (their originator), and the
interactive ones driven over HTTP, rolled back when no request touches them for ``tx_timeout``."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence

from ..errors import (
    GridLeaving,
    GridTxBusy,
    GridTxConflict,
    GridTxError,
    GridTxNotFound,
    GridTxUnknown,
    GridUnavailable,
)
from ..node import OpResult
from ..tx.messages import TxId
from ..tx.records import InDoubt, TxReport
from .outcomes import tx_error_for
from .runtime_base import Interactive, RuntimeBase

MAX_ENDED = 10_000  # ended transactions remembered, so a late request gets a precise answer
MAX_INTERACTIVE = 10_000  # interactive transactions open at once on one member


class RuntimeTransactions(RuntimeBase):
    """Transactions as awaitables, in-doubt resolution, and the interactive transactions' expiry."""

    @property
    def tx_timeout(self) -> float:
        """How long an interactive transaction may go without a request before it is rolled back (the grid's
        ``tx_timeout``)."""
        return float(self.config.tx_timeout)

    async def tx_begin(self, mode: str | None = None, *, interactive: bool = False) -> TxId:
        """Start a transaction on this member (its originator). ``mode``: ``"optimistic"``, ``"pessimistic"``
        or None (the grid's default); a bad mode raises ValueError. ``interactive``: it is driven by later
        requests (HTTP), so it is rolled back after :attr:`tx_timeout` without one."""
        node = self._require_node()
        if node.leaving:
            raise GridLeaving("this member is leaving the grid; use another member")
        if interactive and len(self.interactive) >= MAX_INTERACTIVE:
            # Each holds state (and maybe locks) until its tx_timeout: a bound keeps a flood of begins harmless.
            raise GridUnavailable(
                f"{len(self.interactive)} interactive transactions are open on this member (the limit); "
                "finish some, or try again later"
            )
        tx = node.tx_begin(self._loop.time(), mode)
        self.counters["tx_begun"] += 1
        if interactive:
            entry = Interactive(tx, mode or self.config.tx_locking, 0.0)
            self.interactive[tx] = entry
            self._touch(entry)
        self._pump()
        return tx

    async def tx_lock(self, tx: TxId, keys: Sequence[bytes]) -> None:
        """Pessimistic mode: lock ``keys`` on their primaries. On failure the transaction is rolled back and a
        :class:`GridTxError` subclass says why (e.g. ``lock_timeout``)."""
        node = self._require_node()
        entry = self._claim(tx)
        try:
            op = node.tx_lock(tx, list(keys), self._loop.time())
            res = await self._await_op(op)
        finally:
            self._release(entry)
        self.counters["tx_lock_requests"] += 1
        if not res.ok:
            self._ended_as(tx, f"rolled back: {res.error or res.reason}")
            self.counters["tx_aborted"] += 1
            raise tx_error_for(res, tx)

    async def tx_commit(
        self, tx: TxId, writes: Mapping[bytes, bytes | None], reads: Mapping[bytes, int] | None = None
    ) -> OpResult:
        """Commit ``writes`` (key -> value, None deletes) after validating ``reads`` (key -> version read,
        0 = absent). Returns once every owner applied it; raises a :class:`GridTxError` subclass otherwise
        (:class:`GridTxConflict` when a read changed). Bad keys or values raise ValueError/TypeError before
        anything starts, and the transaction stays open."""
        node = self._require_node()
        entry = self._claim(tx)
        try:
            op = node.tx_commit(tx, writes, reads or {}, self._loop.time())
        except BaseException:
            self._release(entry)
            raise
        # From here on the commit's own deadlines run in the node; no other request may touch it.
        self._ended_as(tx, "committing")
        try:
            res = await self._await_op(op)
        except GridUnavailable as exc:
            # This member left (or is closing) before the outcome came: the commit may have been decided.
            self._ended_as(tx, "outcome unknown (this member left during the commit)")
            raise GridTxUnknown(f"transaction {tx}: {exc}; it may or may not have committed", "unknown", tx) from None
        if res.ok:
            self._ended_as(tx, "committed")
            self.counters["tx_committed"] += 1
            return res
        self._ended_as(tx, f"rolled back: {res.error or res.reason}")
        self.counters["tx_aborted"] += 1
        err = tx_error_for(res, tx)
        if isinstance(err, GridTxConflict):
            self.counters["tx_conflicts"] += 1
        raise err

    async def tx_rollback(self, tx: TxId) -> None:
        """Roll the transaction back (a no-op for one the node no longer knows: it already ended)."""
        node = self._require_node()
        # Also while a lock request of it waits: the rollback ends the wait (that request fails).
        self._ended_as(tx, "rolled back by the client")
        try:
            op = node.tx_rollback(tx, self._loop.time())
        except ValueError:
            return  # unknown to the node: it ended already (rolled back)
        await self._await_op(op)
        self.counters["tx_rolled_back"] += 1

    async def transact(
        self,
        writes: Mapping[bytes, bytes | None],
        reads: Mapping[bytes, int] | None = None,
        *,
        mode: str | None = None,
        lock: Sequence[bytes] = (),
    ) -> tuple[TxId, OpResult]:
        """A one-shot transaction: begin, lock ``lock`` (pessimistic), commit. Raises as :meth:`tx_commit`; a
        bad request (ValueError/TypeError) rolls the transaction back before raising."""
        tx = await self.tx_begin(mode)
        try:
            if lock:
                await self.tx_lock(tx, lock)
        except GridTxError:
            raise  # the node rolled it back
        except BaseException:
            # A bad key, or the HTTP client went away while the locks were taken: do not leave it open.
            self._rollback_now(tx)
            raise
        try:
            return tx, await self.tx_commit(tx, writes, reads)
        except (ValueError, TypeError):
            self._rollback_now(tx)  # refused before anything started
            raise

    def tx_in_doubt(self) -> list[InDoubt]:
        """This member's in-doubt transactions (prepared, originator gone): see :meth:`tx_resolve`."""
        return list(self._require_node().tx_in_doubt())

    def tx_report(self, tx: TxId) -> TxReport:
        """What this member knows of ``tx`` (state, attempt, writes, versions stamped here): a resolver reads
        every member's and decides with :func:`~.tx.termination_decision`."""
        return self._require_node().tx_report(tx)

    def tx_resolve(self, tx: TxId, commit: bool, versions: Mapping[bytes, int] | None = None) -> bool:
        """An operator's decision for a transaction in doubt here; False when it is not in doubt here. A commit
        needs each written key's version: stamped here, given in ``versions`` (from other members' reports),
        or stamped now for keys this member is the write primary of; otherwise ValueError."""
        node = self._require_node()
        done = bool(node.tx_resolve(tx, commit, self._loop.time(), versions))
        if done:
            self.counters["tx_resolved_commit" if commit else "tx_resolved_rollback"] += 1
        self._pump()
        return done

    async def tx_resolve_all(self, tx: TxId, commit: bool | None) -> OpResult:
        """Resolve in-doubt ``tx`` on every member from this one (:meth:`GridNode.tx_resolve_all`): ``commit``
        True/False forces the decision, None lets the grid's rule decide. The result says what happened (ok:
        ``value`` b"commit" or b"rollback"; else ``reason`` not_in_doubt, undecided, timeout, unavailable)."""
        node = self._require_node()
        res = await self._await_op(node.tx_resolve_all(tx, commit, self._loop.time()))
        if res.ok:
            self.counters[f"tx_resolved_all_{res.value.decode() if res.value else ''}"] += 1
        return res

    def tx_ended(self, tx: TxId) -> str | None:
        """How a recently ended transaction of this member ended (None: not known to have ended)."""
        return self._ended.get(tx)

    def check_interactive(self, tx: TxId) -> None:
        """Raise :class:`GridTxNotFound` unless ``tx`` is an open interactive transaction of this member."""
        if tx not in self.interactive:
            ended = self._ended.get(tx)
            if ended is not None:
                raise GridTxNotFound(f"transaction {tx} has ended ({ended})", "not_found", tx)
            raise GridTxNotFound(
                f"no open transaction {tx} on this member (a transaction lives on the member that began it; "
                f"it is rolled back after {self.tx_timeout:g} s without a request, or when its member restarts)",
                "not_found",
                tx,
            )

    def _claim(self, tx: TxId) -> Interactive | None:
        entry = self.interactive.get(tx)
        if entry is not None:
            if entry.busy:
                raise GridTxBusy(f"transaction {tx}: another request of it is still running", "busy", tx)
            entry.busy = True
        return entry

    def _release(self, entry: Interactive | None) -> None:
        if entry is not None and self.interactive.get(entry.tx) is entry:
            entry.busy = False
            self._touch(entry)

    def _touch(self, entry: Interactive) -> None:
        entry.deadline = self._loop.time() + self.tx_timeout
        if entry.handle is None:
            entry.handle = self._loop.call_at(entry.deadline, self._expire, entry.tx)

    def _expire(self, tx: TxId) -> None:
        entry = self.interactive.get(tx)
        if entry is None:
            return
        entry.handle = None
        now = self._loop.time()
        if entry.busy:
            return  # _release re-arms it
        if now < entry.deadline:
            entry.handle = self._loop.call_at(entry.deadline, self._expire, tx)
            return
        self._ended_as(tx, f"rolled back after {self.tx_timeout:g} s without a request")
        self.counters["tx_expired"] += 1
        node = self.node
        if node is not None and not self._closed:
            with contextlib.suppress(ValueError):  # the node ended it already
                node.tx_rollback(tx, now)
            self._pump()

    def _ended_as(self, tx: TxId, what: str) -> None:
        entry = self.interactive.pop(tx, None)
        if entry is not None and entry.handle is not None:
            entry.handle.cancel()
            entry.handle = None
        self._ended[tx] = what
        self._ended.move_to_end(tx)
        while len(self._ended) > MAX_ENDED:
            self._ended.popitem(last=False)

    def _rollback_now(self, tx: TxId) -> None:
        """Roll back without waiting for the answer (cleanup paths)."""
        self._ended_as(tx, "rolled back")
        node = self.node
        if node is None or self._closed:
            return
        try:
            node.tx_rollback(tx, self._loop.time())
        except ValueError:
            return
        self._pump()
