"""The asyncio driver of a grid node, as ``groupcluster.runtime.driver`` drives the group stack.

* ``grid_runtime.py``: :class:`GridRuntime`, which runs a sans-IO :class:`~..node.GridNode` on a live group
  channel (views, payloads, time in; payloads, results out) and serves client operations, transactions,
  segment scans and the change feed (``grid/feed.py``);
* ``timer.py``: :class:`NodeTimer`, the node's one loop timer; ``gc_tuning.py``: :func:`tune_gc`.
"""
