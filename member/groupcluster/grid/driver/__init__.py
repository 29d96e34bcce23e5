"""The asyncio driver of a grid node, as ``groupcluster.runtime.driver`` drives the group stack.

* ``grid_runtime.py``: :class:`GridRuntime`, which runs a sans-IO :class:`~..node.GridNode` on a live group
  channel (views, payloads, time in; payloads, results out): the channel callbacks, binding, leaving, status;
* ``runtime_base.py``: its state, the member info it multicasts and the step that pumps the node; its parts
  ``operations.py`` (key operations and batches), ``transactions.py``, ``segments.py`` (segment scans, the
  change feed of ``grid/feed.py``, the routing table); ``outcomes.py``: failed results as exceptions;
* ``timer.py``: :class:`NodeTimer`, the node's one loop timer; ``gc_tuning.py``: :func:`tune_gc`.
"""
