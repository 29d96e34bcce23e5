"""The data grid in the simulator: ``run`` puts a grid node on every simulated member and drives client
operations through the fault schedule, ``tx_run`` adds transactions; ``checkers`` and ``tx_checkers`` judge
the grid events of a history. The group-communication simulation they build on is the rest of
:mod:`groupcluster.sim`."""
