"""What the transaction state machines hand their driver: :class:`TxSend` (a message to send),
:class:`TxOutcome` (a finished transaction on its originator) and :class:`TxLocked` (the answer to a pessimistic
lock request)."""

from __future__ import annotations

from dataclasses import dataclass

from ...core.address import Address
from .messages import TxId, TxMessage


@dataclass(frozen=True, slots=True)
class TxSend:
    """Send ``message`` to ``dest``."""

    dest: Address
    message: TxMessage


@dataclass(frozen=True, slots=True)
class TxOutcome:
    """A finished transaction on its originator. ``committed`` True only once every owner acknowledged the
    commit (so a participant in doubt never holds a transaction a client was told is committed without
    another participant having committed it: see :func:`~.resolution.termination_decision`)."""

    tx: TxId
    committed: bool
    reason: str = ""
    attempts: int = 1
    # A participant answered with the other outcome (it was resolved the other way while this originator
    # was cut off): the transaction is not atomic. XA calls this a heuristic mixed outcome.
    mixed: bool = False


@dataclass(frozen=True, slots=True)
class TxLocked:
    """The answer to :meth:`~.coordinator.TxCoordinator.lock` (pessimistic mode). On ``ok`` False the
    transaction is rolled back (a :class:`TxOutcome` follows)."""

    tx: TxId
    request: int
    ok: bool
    reason: str = ""


TxOutput = TxSend | TxOutcome | TxLocked
