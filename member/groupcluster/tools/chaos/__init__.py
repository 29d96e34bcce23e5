"""``groupcluster chaos``: real member processes under seeded faults, judged by the simulator's grid checkers.

::

    groupcluster chaos --minutes 5 --seed 7            # 4 members, faults every few seconds for 5 minutes
    groupcluster chaos --minutes 1 --seed 1 --json     # the report as one JSON line before the last line
    groupcluster chaos --minutes 5 --seed 7 --capacity-changes   # capacity changes are faults too

1. Starts a local cluster (:class:`~groupcluster.tools.local_cluster.LocalCluster`) of ``--members`` grid members
   on loopback; each records its history (``--record``), so its views reach the checkers.
2. Runs a writer and a reader, each a thread with its own :class:`~groupcluster.grid.client.GridClient`,
   over a small pool of keys (puts of unique values, some deletes; gets). Every operation is recorded as a
   ``grid_start`` event before the request and a ``grid_end`` event after the answer: the events of the
   simulator's grid histories (:mod:`groupcluster.sim.grid.checkers`), so one code judges both.
3. Every few seconds it injects a fault drawn from a :class:`random.Random` seeded with ``--seed``:

   * ``kill``: SIGKILL a member and start a replacement;
   * ``pause``: SIGSTOP a member for 1 to 10 seconds, then SIGCONT it (a long pause gets it excluded; it comes
     back through a merge);
   * ``leave``: ask a member to leave gracefully (``POST /v1/leave``) and start a replacement;
   * ``cut``: cut a member off the network for 2 to 12 seconds, then heal. Every member runs with
     ``--faults-control`` (a ``faults`` layer above its transport, steered by its file ``mN.faults.json``,
     :mod:`groupcluster.runtime.faults_control`); the run writes the partition {victim} | {everybody else}
     into every live member's file, waits until each reports it applied it, and after the cut writes the
     heal the same way. Both sides drop the other side's frames, so the victim keeps running and answering
     its clients on its own: before anyone notices it serves what its side can (a read of its own copy, a
     write that then waits for the other owner), once excluded it is a one-member group whose degraded
     topology refuses what it cannot serve safely (503 in the default ``deny_read_writes`` mode). A long cut
     (past the failure detector's 4 s + 1 s) gets it excluded, and after the heal it comes back through a
     merge; a short one is ridden out. The report gives, per cut, the frames each side's faults layer
     dropped: that the cut really cut.
   * ``capacity`` (only with ``--capacity-changes``): set a member's capacity to 0, 0.5, 1 or 2 through
     ``POST /v1/capacity`` (the value from a random stream of its own, seeded by the seed). The coordinator
     rebalances to it: at 0 the member hands every segment to the others and stays a member. A 0 that would
     leave fewer than ``num_owners`` members with capacity is made 1, so every segment keeps ``num_owners``
     copies. Replacements start at capacity 1.

   The kind, the victim (by name: ``m1``, ``m2``, ...; replacements take the next number) and the delays come
   from the seed alone, so a seed replays its fault schedule (the timing of the operations around it is the
   machine's). The first four faults are the four kinds in a seeded order (five with ``--capacity-changes``),
   so every run of that many faults or more has each kind; without the option a seed draws what it drew
   before the option existed. At most ``num_owners - 1`` members are faulted at a time (down, paused, or cut off):
   a fault counts until the grid is balanced again after it, and before a fault that would exceed the
   limit the run waits until it is (every member ready on one topology, no rebalance running). Operations
   are only acknowledged when the member answered OK, whatever side of a cut it was on: the checkers judge
   them all, with no allowance for the cut beyond what the members' own views show (the ``cut`` events in
   the history are for readers; no checker reads them).
4. At the end: faults stop, the grid converges, the workload stops, every key ever written is read back
   (``grid_converged`` then final reads), every owner's copy of every segment is scanned (``grid_store``),
   and the checkers run: ``grid-fresh-reads``, ``grid-lost-write`` and ``grid-replicas-equal``.

The output is a table of the faults and the figures, ending in exactly ``chaos: <ops> ops, <V> violations,
<L> lost``: ``ops`` operations of the workload and the read-back, ``V`` checker violations of every kind
(lost writes included), ``L`` keys lost (a final read-back that did not return an allowed value, or that
failed). The exit status is 0 only if V and L are 0. The merged history is kept as ``chaos-history.jsonl``
in ``--dir`` (a temporary directory is removed after a clean run, kept after a failing one), so
``groupcluster check --stack grid FILE`` judges it again.

The package follows those steps: :mod:`.faults` (the kinds and the seeded schedule), :mod:`.workload` (the
history of the clients' operations and the writer and reader threads), :mod:`.runner` (one run: cluster,
faults, read-back, stores), :mod:`.judgement` (the checkers over the history), :mod:`.report` (the result and
its table) and :mod:`.command` (the command line). The processes themselves are
:mod:`groupcluster.tools.local_cluster`.
"""
