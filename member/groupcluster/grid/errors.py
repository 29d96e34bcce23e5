"""The grid's exceptions: one hierarchy for the in-process runtime (:mod:`.driver.grid_runtime`) and the HTTP clients
(:mod:`.client`), so an error means the same class wherever it is raised (a conflict is a
:class:`GridTxConflict` in a member and in a client)::

    GridError (alias GridClientError)
    ├── GridRequestError          a member refused the request (HTTP 4xx); clients only
    ├── GridUnavailable (alias GridUnavailableError)
    │   ├── GridLeaving
    │   └── GridBatchError        clients only: some keys of a batch failed
    ├── GridTimeout
    ├── GridLocked
    ├── GridFull
    ├── GridNotOwner
    └── GridTxError
        ├── GridTxAborted         rolled back: safe to run again
        │   ├── GridTxConflict
        │   ├── GridTxUnavailable (also a GridUnavailable)
        │   └── GridTxTimeout     (also a GridTimeout)
        ├── GridTxUnknownOutcome (alias GridTxUnknown)
        ├── GridTxNotFound
        └── GridTxBusy

Where two names were kept for one meaning, the first is canonical and the other an alias of the same class:
:class:`GridError` (``GridClientError``, the clients' name), :class:`GridUnavailable` (``GridUnavailableError``,
the clients' name), :class:`GridTxUnknownOutcome` (``GridTxUnknown``, the runtime's name). Every name is
importable from here and from :mod:`.client`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .tx.messages import TxId


class GridError(Exception):
    """A grid operation failed; the message says why. The base of every grid error, in a member or a client."""


GridClientError = GridError  # alias: the clients' name of the base class


class GridRequestError(GridError):
    """A member refused the request (4xx): bad key, missing body, value too large, ... Never retried."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.message = message


class GridUnavailable(GridError):
    """The grid cannot serve the operation for now (degraded partition, not joined yet, leaving); from a
    client: every retry failed (members unreachable, or they kept refusing with 503/504). ``last_status`` is
    the client's last HTTP status (None: no answer, or raised in a member)."""

    def __init__(self, message: str, last_status: int | None = None) -> None:
        super().__init__(message)
        self.last_status = last_status


GridUnavailableError = GridUnavailable  # alias: the clients' name


class GridLeaving(GridUnavailable):
    """This member is leaving the grid (or has left): it starts no new operation; send it to another member."""

    reason = "leaving"


class GridBatchError(GridUnavailable):
    """Some operations of a client's batch failed after every retry; the rest completed.

    ``failed`` maps each failed key to the last reason; ``completed`` counts the operations that succeeded.
    """

    def __init__(self, failed: dict[bytes, str], completed: int, last_status: int | None = None) -> None:
        sample = "; ".join(f"{k!r}: {v}" for k, v in list(failed.items())[:3])
        super().__init__(f"{len(failed)} of {len(failed) + completed} operations failed, e.g. {sample}", last_status)
        self.failed = failed
        self.completed = completed


class GridTimeout(GridError):
    """The operation did not complete within the node's ``op_timeout``."""


class GridLocked(GridError):
    """A plain write on a key a transaction holds locked: nothing was written; try again shortly."""


class GridFull(GridError):
    """A PUT that would add a key to its primary, which holds its ``max_entries`` bound: nothing was written."""


class GridNotOwner(GridError):
    """This member cannot serve the segment (it holds no complete copy); ``owners`` lists the ones that do."""

    def __init__(self, message: str, owners: list[str | None]) -> None:
        super().__init__(message)
        self.owners = owners


class GridTxError(GridError):
    """A transaction did not commit. ``reason`` is the machine-readable cause (``"conflict"``,
    ``"lock_timeout"``, ``"timeout"``, ``"unavailable"``, ``"rolled_back"``, ``"not_found"``, ``"connection"``,
    ...), ``tx`` the transaction id when one was assigned (a :class:`~.tx.messages.TxId` in a member, its text
    in a client), ``status`` the HTTP status a client got (None: no answer, or raised in a member)."""

    def __init__(self, message: str, reason: str, tx: TxId | str | None = None, status: int | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.tx = tx
        self.status = status


class GridTxAborted(GridTxError):
    """The transaction was rolled back: none of its writes took effect, so running it again is safe."""


class GridTxConflict(GridTxAborted):
    """Rolled back because a key it read changed before the commit (optimistic validation failed)."""


class GridTxUnavailable(GridTxAborted, GridUnavailable):
    """Rolled back because the grid could not serve it (owners missing, degraded partition, member leaving)."""


class GridTxTimeout(GridTxAborted, GridTimeout):
    """Rolled back because it was not decided within the transaction timeout."""


class GridTxUnknownOutcome(GridTxError):
    """Nobody can say whether the transaction committed (it may have): the originator lost track of it, or a
    client sent the commit and got no answer. Never re-run on its own; read the keys to find out."""


GridTxUnknown = GridTxUnknownOutcome  # alias: the runtime's name


class GridTxNotFound(GridTxError):
    """No interactive transaction with that id lives on this member (never begun here, or already ended)."""


class GridTxBusy(GridTxError):
    """Another request of the same interactive transaction is still running on this member."""


# reason -> exception class; reasons not listed abort with GridTxAborted
TX_ERRORS: dict[str, type[GridTxError]] = {
    "conflict": GridTxConflict,
    "unavailable": GridTxUnavailable,
    "timeout": GridTxTimeout,
    "unknown": GridTxUnknownOutcome,
}

__all__ = [
    "TX_ERRORS",
    "GridBatchError",
    "GridClientError",
    "GridError",
    "GridFull",
    "GridLeaving",
    "GridLocked",
    "GridNotOwner",
    "GridRequestError",
    "GridTimeout",
    "GridTxAborted",
    "GridTxBusy",
    "GridTxConflict",
    "GridTxError",
    "GridTxNotFound",
    "GridTxTimeout",
    "GridTxUnavailable",
    "GridTxUnknown",
    "GridTxUnknownOutcome",
    "GridUnavailable",
    "GridUnavailableError",
]
