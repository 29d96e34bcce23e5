"""The one error a chaos run reports to its user instead of a traceback."""

from __future__ import annotations


class ChaosError(Exception):
    """A clear, user-facing failure of ``groupcluster chaos`` (bad argument, cluster that never settles)."""
