"""Grid transactions: two-phase commit over the grid's owners (docs/grid-transactions.md).

Sans-IO and deterministic like the rest of ``grid/``: ``now`` is an argument of every call, timeouts are
deadlines, and every call returns the outputs it produced for its driver (``GridNode``, or the unit tests'
in-memory network). Import from the module that defines a name:

* ``messages.py`` — transaction ids, the two-phase-commit messages and their codec;
* ``participant.py`` — the participant's transaction table, lock table and resolution (to be split);
* ``cli.py`` — ``groupcluster tx``: list and resolve in-doubt transactions on running members.
"""
