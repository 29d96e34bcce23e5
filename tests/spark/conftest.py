"""Spark tests: one local[2] SparkSession per test session, grids of real member processes on loopback.

PySpark and pyarrow come with the package's ``spark`` extra, which scripts/bootstrap installs; without them
collection fails with a message saying so (these tests never skip). Spark needs Java 17+ (a missing ``java``
fails with a message saying so too). Python
workers run this interpreter (``PYSPARK_PYTHON``), so they import the same ``groupcluster``.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


def _require_spark() -> None:
    try:
        import pyarrow  # noqa: F401
        import pyspark
    except ImportError as exc:
        raise RuntimeError(
            f"the Spark tests need the 'spark' extra ({exc.name} is missing): run scripts/bootstrap, or "
            "pip install -e '.[test,spark]'"
        ) from exc
    if not pyspark.__version__.startswith("4."):
        raise RuntimeError(f"the Spark tests need pyspark 4; this interpreter has {pyspark.__version__}")


_require_spark()
os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
# Loopback only: the members listen on 127.0.0.x and Spark need not pick a public interface.
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

from tests.integration.procs import Members  # noqa: E402

from .gridprocs import SparkGrid  # noqa: E402


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One local[2] SparkSession for every Spark test (starting the JVM costs ~15 s on 2 cores)."""
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.fail("Spark needs Java 17 or newer: install a JDK (apt-get install openjdk-17-jre-headless)")
    from groupcluster.spark import register
    from pyspark.sql import SparkSession

    warehouse = tmp_path_factory.mktemp("spark-warehouse")
    session = (
        SparkSession.builder.master("local[2]")
        .appName("groupcluster-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.sql.warehouse.dir", str(warehouse))
        .config("spark.sql.streaming.stopTimeout", "30s")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture(scope="module")
def grid3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkGrid]:
    """Three grid members (room for a fourth to join) shared by the tests of one module."""
    workdir: Path = tmp_path_factory.mktemp("grid")
    members = Members(workdir)
    g = SparkGrid(members, n_hosts=4)
    try:
        for i in range(3):
            g.start(i)
        g.wait_settled(["m0", "m1", "m2"], timeout=60)
        yield g
    finally:
        members.kill_all()
