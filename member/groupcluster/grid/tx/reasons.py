"""The stable failure reasons a member reports for a transaction or a plain operation (``OpResult.reason``,
grid/node/results.py; docs/grid-transactions.md, "Using transactions"). The state machines' own texts
(``TxOutcome.reason``) are for people."""

from __future__ import annotations

REASON_CONFLICT = "conflict"  # optimistic validation: a key read changed before the commit
REASON_LOCK_TIMEOUT = "lock_timeout"  # a lock was not granted within lock_timeout
REASON_TIMEOUT = "timeout"  # no answer in time (operation or transaction timeout)
REASON_ROLLED_BACK = "rolled_back"  # rolled back (by the client, the originator lost a participant, ...)
REASON_UNAVAILABLE = "unavailable"  # a segment cannot be written (degraded) or has no owner
REASON_LOCKED = "locked"  # a plain write on a key a transaction holds
REASON_FULL = "full"  # a PUT past its primary's max_entries or max_bytes bound
REASON_MIXED = "mixed"  # committed, but a participant had been resolved to roll back (ok True)
REASON_ERROR = "error"  # any other failure of a plain operation
