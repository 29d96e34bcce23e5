"""How the node's results reach the callers waiting for them: the exception for a failed result, and the
wait of a batch that completes with its last result."""

from __future__ import annotations

import asyncio

from ..errors import TX_ERRORS as _TX_ERRORS
from ..errors import GridError, GridFull, GridLocked, GridTimeout, GridTxAborted, GridTxError, GridUnavailable
from ..node import OpResult
from ..tx.messages import TxId


def error_for(result: OpResult) -> GridError:
    """The exception for a failed :class:`OpResult` (``reason`` set by the node, the text says more)."""
    if result.reason == "locked":
        return GridLocked(result.error)
    if result.reason == "full":
        return GridFull(result.error)
    if "unavailable" in result.error:
        return GridUnavailable(result.error)
    if "timed out" in result.error:
        return GridTimeout(result.error)
    return GridError(result.error or "operation failed")


def tx_error_for(result: OpResult, tx: TxId | None) -> GridTxError:
    """The exception for a failed transaction :class:`OpResult` (``reason`` set by the node; older text-only
    results are classified by their text as :func:`error_for` does)."""
    reason = getattr(result, "reason", "") or ""
    if not reason:
        text = result.error
        reason = "unavailable" if "unavailable" in text else "timeout" if "timed out" in text else "rolled_back"
    cls = _TX_ERRORS.get(reason, GridTxAborted)
    where = f"transaction {tx}" if tx is not None else "transaction"
    return cls(f"{where}: {result.error or reason}", reason, tx)


class BatchWait:
    """The results of one batch, filled in as the node reports them; ``done`` resolves with the last one.

    The node numbers a batch's operations consecutively, so an operation's place in the batch is its id
    less the first one (``index`` maps them only if they ever were not)."""

    __slots__ = ("done", "first", "index", "remaining", "results")

    def __init__(self, ids: list[int], fut: asyncio.Future[list[OpResult]]) -> None:
        self.results: list[OpResult | None] = [None] * len(ids)
        self.remaining = len(ids)
        self.done = fut
        self.first = ids[0]
        self.index = None if ids[-1] - ids[0] == len(ids) - 1 else {op: i for i, op in enumerate(ids)}

    def complete(self) -> list[OpResult]:
        """The results, once every operation reported one (``remaining`` is 0)."""
        out = [r for r in self.results if r is not None]
        if len(out) != len(self.results):
            raise RuntimeError(f"batch: {len(self.results) - len(out)} results missing at completion")
        return out
