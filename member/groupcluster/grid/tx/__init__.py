"""Grid transactions: two-phase commit over the grid's owners (docs/grid-transactions.md).

Sans-IO and deterministic like the rest of ``grid/``: ``now`` is an argument of every call, timeouts are
deadlines (``next_deadline()``, then ``tick(now)``), and every call returns the outputs it produced for its
driver (``GridNode``, or the unit tests' in-memory network). Import from the module that defines a name:

* ``locks.py`` — :class:`LockTable`, a member's key locks (primary) and backup lock records;
* ``participant.py`` — :class:`TxTable`, a member as participant (ACTIVE → PREPARED → COMMITTED | ROLLED_BACK);
* ``records.py`` — what a participant knows of a transaction (:class:`TxState`, :class:`TxReport`, :class:`InDoubt`);
* ``lock_transfer.py`` — the participant's part in state transfer: lock information of segments that move;
* ``coordinator.py`` — :class:`TxCoordinator`, the originator (prepare, votes, decision, completion);
* ``resolution.py`` — deciding in-doubt transactions (:func:`termination_decision`, :class:`TxResolver`);
* ``outputs.py`` — what the machines return (:class:`TxSend`, :class:`TxOutcome`, :class:`TxLocked`);
* ``config.py`` — :class:`TxConfig`, :class:`LockingMode`; ``reasons.py`` — the stable ``REASON_*`` strings;
* ``messages.py`` — transaction ids, the two-phase-commit messages and their codec;
* ``cli.py`` — ``groupcluster tx``: list and resolve in-doubt transactions on running members.
"""
