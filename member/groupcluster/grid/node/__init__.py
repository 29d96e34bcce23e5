"""One grid member as a sans-IO state machine: routing, replication, state transfer, rebalancing, leaving.

The node never touches sockets, threads, real time or the global random: the driver hands it views
(:meth:`GridNode.on_view`), delivered payloads (:meth:`GridNode.on_messages`), the time (``now`` on every
call, :meth:`GridNode.tick` at :meth:`GridNode.next_deadline`) and client operations
(:meth:`GridNode.get`/``put``/``delete``); it answers with payloads to send (:meth:`GridNode.take_outbox`:
``dest`` None is a multicast to the view) and finished operations (:meth:`GridNode.take_results`).

What happens on the wire (see docs/grid.md for the full picture):

* after every view change each member sends its STATUS (capacity, leave request, last topology) to the
  coordinator; the coordinator's :class:`~..rebalance.RebalancePlanner` turns statuses, views and
  confirmations into topologies it multicasts;
* a client operation becomes a CMD tagged with the originator's topology id, sent to the write primary
  (PUT/DELETE) or a read owner (GET). An owner whose topology is newer answers RETRY and the originator tries
  again on the owners of the newer topology; an owner whose topology is older holds the command until it
  catches up. The primary stamps a version, applies, sends BACKUP to every other write owner and answers
  only when all acknowledged, so an acknowledged write is on every owner. Operations started in one step
  (:meth:`GridNode.start_batch`) travel as one CMD_BATCH per owner, and their backups, acknowledgements and
  answers as one batch message per destination too, each entry handled as its single message would be;
* a new owner pulls each segment from a current owner (FETCH, then XFER_DATA batches with a window of
  acknowledgements), applies batches "newest version wins", and confirms to the coordinator once it holds
  all its new segments; old owners drop segments only once a topology without them is installed.

Transactions (docs/grid-transactions.md): the node owns one participant table (:class:`~..tx.TxTable`, on
its store) and one originator (:class:`~..tx.TxCoordinator`, routed by the write owners of its topology); the
seven two-phase-commit messages and TX_INFO_ACK share the grid payload. Where the write primary of a segment
changes between two topologies the new primary blocks lock acquisition there (and promotes its backup locks)
until the old primary's lock information arrives, which the old primary re-sends until it is acknowledged. A
plain PUT/DELETE on a key a transaction holds fails at once (reason ``locked``).

Where a rule lives (one part per file, each holding its own state):

* ``facade.py``: :class:`GridNode`: the driver's calls, the dispatch table, the outbox, held requests;
* ``membership.py``: views, installing topologies (segments dropped, cleared, kept), merges, statuses and
  confirmations for the coordinator's planner, when a leaving member may go;
* ``operations.py``: client operations on their originator: routing, attempts, resends, client deadlines;
* ``replication.py``: a key's owners: commands served, writes stamped by the primary, backups, re-drives
  across topologies, merge and repair pushes;
* ``transfer_in.py``: inbound state transfer (the state consumer): fetches, chunks applied, pacing;
* ``transfer_out.py``: outbound state transfer (the state provider): windowed streams of chunks;
* ``transactions.py``: the transaction calls and the glue to the state machines of ``grid/tx/``;
* ``capacity.py``: the max_entries and max_bytes bounds; ``expiry.py``: expired entries and tombstones;
* ``restore.py``: what a persistent store brought back; ``events.py``: entry events; ``hooks.py``: where an
  extension (the change feed) takes part in a step;
* ``config.py``: :class:`GridConfig`; ``results.py``: what the driver collects; ``routes.py``: per-topology
  routing answers.
"""

from ..tx.reasons import (
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
from .hooks import NodeHooks
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
    "NodeHooks",
    "OpResult",
    "Outgoing",
    "_PendingWrite",
]
