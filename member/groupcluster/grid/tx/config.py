"""Grid transaction settings: :class:`TxConfig` (the ``tx`` parameters: default locking mode, timeouts,
retention) and :class:`LockingMode`."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

from ...core.config import param, parse_params
from ...core.errors import ConfigError


class LockingMode(Enum):
    """OPTIMISTIC: keys are locked at prepare only and the primary checks that what the transaction read is
    unchanged. PESSIMISTIC: :meth:`~.coordinator.TxCoordinator.lock` locks keys while the transaction runs (read under
    lock, so conflicts are found early); the prepare still validates reads, since a topology change can
    force a retry in which locks are taken again."""

    OPTIMISTIC = "optimistic"
    PESSIMISTIC = "pessimistic"


@dataclass(frozen=True)
class TxConfig:
    locking: str = param(
        "optimistic", "choice", choices=tuple(m.value for m in LockingMode), doc="default locking mode"
    )
    lock_timeout: float = param("10s", "duration", doc="participant: fail a lock not acquired within this")
    tx_timeout: float = param("30s", "duration", doc="originator: roll back a transaction not prepared within this")
    resend_interval: float = param("3s", "duration", doc="originator: resend unanswered transaction messages")
    completed_retention: float = param(
        "10m", "duration", doc="participant: remember a finished transaction this long (late duplicates)"
    )
    max_held: int = param(10_000, "int", doc="participant: messages held for a topology not yet installed", minimum=1)

    def __post_init__(self) -> None:
        if self.lock_timeout <= 0 or self.tx_timeout <= 0 or self.resend_interval <= 0:
            raise ConfigError("tx: lock_timeout, tx_timeout and resend_interval must be positive")

    @classmethod
    def from_dict(cls, params: dict[str, Any]) -> TxConfig:
        """Parse ``{"locking": "pessimistic", "lock_timeout": "5s", ...}``; errors name the bad key."""
        return parse_params(cls, params, "tx")

    @property
    def mode(self) -> LockingMode:
        return LockingMode(self.locking)
