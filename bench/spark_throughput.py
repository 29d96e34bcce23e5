"""Spark data source throughput: write and full scan of N rows through format ``groupcluster``, beside Parquet.

::

    python bench/spark_throughput.py                    # 1,000,000 rows, 3 members, local[2]
    python bench/spark_throughput.py --rows 200000 --json

One run, same machine, same DataFrame (``key`` = ``k%09d``, ``value`` = ``--value-bytes`` bytes):

* **grid write**: ``df.write.format("groupcluster")`` into a fresh local grid of ``--members`` members
  (``groupcluster local``, 2 owners): batched puts routed to the write primaries;
* **grid scan**: ``spark.read.format("groupcluster").load()`` written to Spark's ``noop`` sink, so every row
  is read and materialized, nothing else;
* **parquet write / scan**: the same DataFrame to Parquet on local disk and back through ``noop``.

Rows/s is rows divided by the wall-clock seconds of the Spark job. The issue's targets: at least 100k
rows/s written and 200k rows/s read. Spark and the members share the machine's cores, so the figures
include the members' own CPU: compare the two sinks within one run.

Beside the wall clock, each grid job reports the CPU it cost, which other work on the machine moves much less:
``members_cpu_us_per_row`` (user + system time of the member processes) and ``spark_cpu_us_per_row`` (this
process's other descendants: the JVM and its Python workers), both per row, read from ``/proc`` before and
after the job (Linux only; absent elsewhere).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def _proc_table() -> dict[int, tuple[int, float]]:
    """pid -> (parent pid, user + system CPU seconds) of every process, from ``/proc`` ({} without it)."""
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    out: dict[int, tuple[int, float]] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return out
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue  # exited meanwhile
        # The command name (field 2) may hold spaces and parentheses: the fields after it start at the last ")".
        fields = stat[stat.rindex(b")") + 2 :].split()
        out[int(name)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / tick)
    return out


def cpu_split(member_pids: set[int]) -> tuple[float, float]:
    """CPU seconds used so far by the member processes, and by this process's other descendants (Spark)."""
    table = _proc_table()
    me = os.getpid()
    members = spark = 0.0
    for pid, (_, cpu) in table.items():
        if pid in member_pids:
            members += cpu
            continue
        p, hops = table[pid][0], 0
        while p > 1 and p != me and p in table and hops < 64:
            p, hops = table[p][0], hops + 1
        if p == me:
            spark += cpu
    return members, spark


def timed(
    label: str, fn: Any, rows: int, results: dict[str, Any], quiet: bool, member_pids: set[int] | None = None
) -> None:
    cpu0 = cpu_split(member_pids) if member_pids is not None else None
    t0 = time.perf_counter()
    fn()
    secs = time.perf_counter() - t0
    results[label] = {"seconds": round(secs, 2), "rows_per_s": round(rows / secs)}
    line = f"  {label:<14} {secs:8.1f} s  {rows / secs:12,.0f} rows/s"
    if cpu0 is not None and member_pids is not None:
        cpu1 = cpu_split(member_pids)
        if cpu1[0] > 0:
            m_us, s_us = ((b - a) / rows * 1e6 for a, b in zip(cpu0, cpu1, strict=True))
            results[label]["members_cpu_us_per_row"] = round(m_us, 2)
            results[label]["spark_cpu_us_per_row"] = round(s_us, 2)
            line += f"   CPU per row: members {m_us:5.1f} us, Spark {s_us:5.1f} us"
    if not quiet:
        print(line, flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--members", type=int, default=3)
    ap.add_argument("--value-bytes", type=int, default=100)
    ap.add_argument("--batch-size", type=int, default=2000, help="rows per batch request (option batchSize)")
    ap.add_argument("--parallel", type=int, default=4, help="batch requests in flight per task (option parallel)")
    ap.add_argument("--json", action="store_true", help="print the results as JSON only")
    args = ap.parse_args(argv)
    if args.rows < 1 or args.members < 1 or args.value_bytes < 1:
        ap.error("--rows, --members and --value-bytes must be at least 1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

    from groupcluster.spark import register
    from groupcluster.tools.local_cluster import LocalCluster
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    quiet = args.json
    tmp = Path(tempfile.mkdtemp(prefix="gc-spark-bench-"))
    cluster = LocalCluster(tmp / "grid")
    results: dict[str, Any] = {"rows": args.rows, "members": args.members, "value_bytes": args.value_bytes}
    try:
        if not quiet:
            print(f"starting {args.members} grid members ...", flush=True)
        cluster.start(args.members, timeout=300)
        members = ",".join(m.http for m in cluster.live())
        member_pids = {m.pid for m in cluster.live()}
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # read when the JVM starts
        spark = (
            SparkSession.builder.master("local[2]")
            # Loopback only: Spark would otherwise bind to the host's interface address.
            .config("spark.driver.host", "127.0.0.1")
            .config("spark.driver.bindAddress", "127.0.0.1")
            .appName("groupcluster-bench")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.driver.memory", "2g")
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
        register(spark)
        pad = "x" * max(0, args.value_bytes - 9)
        df = spark.range(args.rows, numPartitions=2).select(
            F.format_string("k%09d", "id").alias("key"),
            F.concat(F.format_string("%09d", "id"), F.lit(pad)).alias("value"),
        )
        grid = {
            "members": members,
            "batchSize": str(args.batch_size),
            "parallel": str(args.parallel),
        }
        parquet = str(tmp / "rows.parquet")
        if not quiet:
            print(f"{args.rows:,} rows of {args.value_bytes} bytes, Spark local[2]:", flush=True)
        # Warm-up: starts the Python workers (writer, read planner, reader), so no measured job pays for it.
        spark.range(10).select(F.col("id").cast("string").alias("key"), F.lit("w").alias("value")).write.format(
            "groupcluster"
        ).options(**grid).mode("append").save()
        spark.read.format("groupcluster").options(**grid).load().write.format("noop").mode("overwrite").save()
        timed("parquet write", lambda: df.write.mode("overwrite").parquet(parquet), args.rows, results, quiet)
        timed(
            "parquet scan",
            lambda: spark.read.parquet(parquet).write.format("noop").mode("overwrite").save(),
            args.rows,
            results,
            quiet,
        )
        timed(
            "grid write",
            lambda: df.write.format("groupcluster").options(**grid).mode("append").save(),
            args.rows,
            results,
            quiet,
            member_pids,
        )
        total = args.rows + 10
        timed(
            "grid scan",
            lambda: (
                spark.read.format("groupcluster").options(**grid).load().write.format("noop").mode("overwrite").save()
            ),
            total,
            results,
            quiet,
            member_pids,
        )
        counted = spark.read.format("groupcluster").options(**grid).load().count()
        results["grid_rows_read"] = counted
        if counted != total:
            print(f"error: the grid scan returned {counted} rows, expected {total}", file=sys.stderr)
            return 1
        spark.stop()
    finally:
        cluster.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    if quiet:
        print(json.dumps(results))
    else:
        print(
            f"targets: write >= 100,000 rows/s (measured {results['grid write']['rows_per_s']:,}), "
            f"scan >= 200,000 rows/s (measured {results['grid scan']['rows_per_s']:,})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
