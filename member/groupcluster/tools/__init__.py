"""Tools for people at a terminal, built on the runtime: ``local`` (a local cluster of grid members: start,
scale, inspect, stop), ``demo`` and ``group_demo`` (``groupcluster demo``), ``chaos`` (kill, pause and cut
off real members under load and check the history)."""
