"""PySpark data source for the grid: format ``groupcluster`` (batch read, batch write, stream read).

Needs ``pyspark`` 4 and ``pyarrow`` (``pip install 'groupcluster[spark]'``); importing this package without
them fails with a message saying so. Usage and guarantees: docs/spark.md.

::

    from groupcluster.spark import register
    register(spark)
    spark.read.format("groupcluster").option("members", "127.0.0.11:8080").load().show()
"""

from __future__ import annotations

from typing import Any

try:
    from .source import GroupClusterDataSource
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        f"groupcluster.spark needs pyspark 4 and pyarrow ({exc}); install them with pip install 'groupcluster[spark]'"
    ) from exc

PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"


def register(spark: Any) -> None:
    """Register format ``groupcluster`` with a SparkSession and enable Python filter pushdown.

    Spark refuses to run a Python data source that implements ``pushFilters`` while that configuration is
    off, so registering turns it on for the session (it affects Python data sources only).
    """
    spark.conf.set(PUSHDOWN_CONF, "true")
    spark.dataSource.register(GroupClusterDataSource)


__all__ = ["PUSHDOWN_CONF", "GroupClusterDataSource", "register"]
