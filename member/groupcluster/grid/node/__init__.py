"""One grid member as a sans-IO state machine (:class:`GridNode`), split by what each part owns.

Where a rule lives:

* ``facade.py``: :class:`GridNode`, the driver's calls, the dispatch table (message type -> handler), the
  outbox;
* ``config.py``: :class:`GridConfig`; ``results.py``: what the driver collects; ``events.py``: entry events;
* ``routes.py``: per-topology routing answers;
* ``operations.py``: client operations on their originator; ``replication.py``: primary/backup writes.
"""

from ..tx import (
    REASON_CONFLICT,
    REASON_ERROR,
    REASON_FULL,
    REASON_LOCK_TIMEOUT,
    REASON_LOCKED,
    REASON_MIXED,
    REASON_ROLLED_BACK,
    REASON_TIMEOUT,
    REASON_UNAVAILABLE,
)
from .config import MAX_CAPACITY, GridConfig
from .events import EVENT_ARRIVED, EVENT_DEPARTED, EVENT_KINDS, EVENT_WRITTEN, EntryEvents
from .expiry import EXPIRE_PER_STEP, EXPIRY_RECHECK
from .facade import DEFERRED_CHUNKS_PER_STEP, FREE_INTERVAL, FREE_PER_STEP, MAX_PAYLOAD_SPLIT, GridNode
from .replication import _PendingWrite
from .results import TX_COMMIT_OP, TX_LOCK_OP, TX_RESOLVE_OP, TX_ROLLBACK_OP, OpResult, Outgoing
from .transfer_in import XFER_OVERHEAD

__all__ = [
    "DEFERRED_CHUNKS_PER_STEP",
    "EVENT_ARRIVED",
    "EVENT_DEPARTED",
    "EVENT_KINDS",
    "EVENT_WRITTEN",
    "EXPIRE_PER_STEP",
    "EXPIRY_RECHECK",
    "FREE_INTERVAL",
    "FREE_PER_STEP",
    "MAX_CAPACITY",
    "MAX_PAYLOAD_SPLIT",
    "REASON_CONFLICT",
    "REASON_ERROR",
    "REASON_FULL",
    "REASON_LOCKED",
    "REASON_LOCK_TIMEOUT",
    "REASON_MIXED",
    "REASON_ROLLED_BACK",
    "REASON_TIMEOUT",
    "REASON_UNAVAILABLE",
    "TX_COMMIT_OP",
    "TX_LOCK_OP",
    "TX_RESOLVE_OP",
    "TX_ROLLBACK_OP",
    "XFER_OVERHEAD",
    "EntryEvents",
    "GridConfig",
    "GridNode",
    "OpResult",
    "Outgoing",
    "_PendingWrite",
]
