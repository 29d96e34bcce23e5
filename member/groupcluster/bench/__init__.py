"""Benchmarks of groupcluster against its peers (``groupcluster bench``).

:mod:`.model` holds the pure parts (workloads, aggregation, JSON, table), :mod:`.workers` and
:mod:`.pysyncobj_worker` the member processes in Python, :mod:`.jgroups` the JGroups harness builds,
:mod:`.runner` the orchestration, :mod:`.lifecycle` the join, state-transfer and grid workloads (the
``bench/`` scripts and the JGroups Lifecycle harness) with :mod:`.figures` reading their output,
:mod:`.plots` the PNG figures and :mod:`.cli` the command.
"""
