"""What a node hands its driver: payloads to send (Outgoing) and finished operations (OpResult)."""

from __future__ import annotations

from dataclasses import dataclass

from ...core.address import Address
from ..tx.messages import TxId

# OpResult.kind of the transaction calls (never on the wire: operations on the wire are GET, PUT, DELETE).
TX_LOCK_OP, TX_COMMIT_OP, TX_ROLLBACK_OP = 16, 17, 18
TX_RESOLVE_OP = 19  # tx_resolve_all: value b"commit" or b"rollback" when ok


@dataclass(frozen=True, slots=True)
class Outgoing:
    """A payload for the group: ``dest`` None is a multicast to the view (the sender may ignore its copy)."""

    dest: Address | None
    payload: bytes


# Not frozen, to be treated as read-only: one is made per operation, and a frozen dataclass's __init__ cost
# ~1.1 us against ~0.2 us (its field assignments go through object.__setattr__), ~6% of a member's CPU in
# Spark batch writes.
@dataclass(slots=True)
class OpResult:
    """A finished client operation. ``ok`` False carries ``error``; a GET of an absent key is ok, value None."""

    op_id: int
    kind: int
    key: bytes
    ok: bool
    value: bytes | None = None
    error: str = ""
    attempts: int = 1
    # GET: the version of the entry read (0 when absent); a transaction's read version for optimistic checks.
    version: int = 0
    # ok False: a stable machine-readable reason (the REASON_* strings above).
    reason: str = ""
    tx: TxId | None = None  # the transaction of a TX_*_OP result
