"""Spark tests: one local[2] SparkSession per test session, grids of real member processes on loopback.

PySpark and pyarrow are installed into the running interpreter when missing (pinned versions, from PyPI), so
these tests never skip; Spark needs Java 17+ (a missing ``java`` fails with a message saying so). Python
workers run this interpreter (``PYSPARK_PYTHON``), so they import the same ``groupcluster``.
"""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

PYSPARK_PIN = "pyspark==4.3.0"
PYARROW_PIN = "pyarrow==26.0.1"


def _ensure_installed() -> None:
    missing = []
    for module, pin in (("pyspark", PYSPARK_PIN), ("pyarrow", PYARROW_PIN)):
        try:
            importlib.import_module(module)
        except ImportError:
            missing.append(pin)
    if missing:
        # Install into this interpreter: the Spark tests must run, not skip, on a fresh machine.
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", *missing], check=True)
        importlib.invalidate_caches()
    import pyspark

    if not pyspark.__version__.startswith("4."):
        raise RuntimeError(
            f"the Spark tests need pyspark 4 ({PYSPARK_PIN}); this interpreter has {pyspark.__version__}"
        )


_ensure_installed()
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
