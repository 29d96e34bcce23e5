"""Example pipeline: CSV -> Spark transform -> the grid -> change stream -> aggregates (docs/spark.md).

::

    python examples/spark_pipeline.py                          # starts its own 3-member local grid
    groupcluster local start --members 3 && groupcluster local status
    python examples/spark_pipeline.py --members 127.0.0.1:PORT  # or use a running grid

Steps:

1. write a CSV of orders (``order_id, customer, country, quantity, unit_price``), seeded so runs repeat;
2. Spark reads the CSV, computes each order's total and stores it in the grid: key ``order:<id>``, value a
   JSON document (``format("groupcluster")``, batched puts routed to the owners);
3. a streaming query follows the grid's changes and keeps revenue per country (memory sink);
4. a second CSV batch of orders is written; the stream picks up just those changes;
5. a batch read of the grid aggregates the same figures again, and both are checked against Spark's own
   aggregate of the CSV files: the last line says whether everything matched.

Needs ``pip install 'groupcluster[spark]'`` (pyspark 4, pyarrow) and Java 17.
"""

from __future__ import annotations

import argparse
import csv
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

COUNTRIES = ["DE", "FR", "NL", "PL", "SE", "IT"]


def write_orders(path: Path, first_id: int, count: int, seed: int) -> None:
    rng = random.Random(seed)
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["order_id", "customer", "country", "quantity", "unit_price"])
        for i in range(first_id, first_id + count):
            w.writerow(
                [i, f"c{rng.randrange(500)}", rng.choice(COUNTRIES), rng.randint(1, 9), rng.randint(100, 9999) / 100]
            )


def start_local_grid(workdir: Path) -> tuple[Any, str]:
    from groupcluster.tools.local_cluster import LocalCluster

    cluster = LocalCluster(workdir / "grid")
    print("starting a local grid of 3 members ...", flush=True)
    cluster.start(3, timeout=180)
    endpoints = ",".join(m.http for m in cluster.live())
    return cluster, endpoints


def run(members: str, workdir: Path, orders: int) -> bool:
    from groupcluster.spark import register
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # read when the JVM starts
    spark = (
        SparkSession.builder.master("local[2]")
        # Loopback only: Spark would otherwise bind to the host's interface address.
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .appName("groupcluster-pipeline")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    grid = {"members": members}
    schema = "order_id long, customer string, country string, quantity int, unit_price double"
    value_schema = "customer string, country string, cents long"

    def load_csv(path: Path) -> Any:
        return spark.read.option("header", True).schema(schema).csv(str(path))

    def to_grid(df: Any) -> Any:
        # Transform: the order's total, and the row shaped as the grid's key/value pair.
        return df.select(
            F.concat(F.lit("order:"), F.col("order_id").cast("string")).alias("key"),
            F.to_json(
                F.struct(
                    "customer",
                    "country",
                    # Whole cents: sums are exact whatever order Spark adds them in.
                    F.round(F.col("quantity") * F.col("unit_price") * 100).cast("long").alias("cents"),
                )
            ).alias("value"),
        )

    csv1, csv2 = workdir / "orders-1.csv", workdir / "orders-2.csv"
    write_orders(csv1, 1, orders, seed=1)
    write_orders(csv2, orders + 1, orders // 2, seed=2)

    t0 = time.monotonic()
    to_grid(load_csv(csv1)).write.format("groupcluster").options(**grid).mode("append").save()
    print(f"1. wrote {orders} orders into the grid in {time.monotonic() - t0:.1f}s", flush=True)

    # The change stream: every order written from now on (and those already there: startingOffsets=earliest).
    changes = spark.readStream.format("groupcluster").options(**grid).option("valueType", "string").load()
    revenue = (
        changes.where(F.col("key").startswith("order:"))
        .select(F.from_json("value", value_schema).alias("o"))
        .groupBy("o.country")
        .agg((F.sum("o.cents") / 100).alias("revenue"), F.count("*").alias("orders"))
    )
    # Each trigger reads every segment's change feed from where the last one stopped (docs/spark.md); a
    # trigger every few seconds keeps the members' request load low.
    query = (
        revenue.writeStream.outputMode("complete")
        .format("memory")
        .queryName("revenue_by_country")
        .trigger(processingTime="2 seconds")
        .start()
    )
    query.processAllAvailable()
    first = spark.table("revenue_by_country").orderBy("country").collect()
    print("2. streamed revenue per country after the first batch:", flush=True)
    for r in first:
        print(f"   {r.country}  {r.orders:6d} orders  {r.revenue:12.2f}")

    t0 = time.monotonic()
    to_grid(load_csv(csv2)).write.format("groupcluster").options(**grid).mode("append").save()
    query.processAllAvailable()
    print(f"3. wrote {orders // 2} more orders; the stream caught up in {time.monotonic() - t0:.1f}s", flush=True)
    streamed = {r.country: (r.orders, r.revenue) for r in spark.table("revenue_by_country").collect()}
    query.stop()

    stored = (
        spark.read.format("groupcluster")
        .options(**grid)
        .option("valueType", "string")
        .load()
        .where(F.col("key").startswith("order:"))
        .select(F.from_json("value", value_schema).alias("o"))
        .groupBy("o.country")
        .agg((F.sum("o.cents") / 100).alias("revenue"), F.count("*").alias("orders"))
    )
    read_back = {r.country: (r.orders, r.revenue) for r in stored.collect()}
    both = load_csv(csv1).unionByName(load_csv(csv2))
    truth = {
        r.country: (r.orders, r.revenue)
        for r in to_grid(both)
        .select(F.from_json("value", value_schema).alias("o"))
        .groupBy("o.country")
        .agg((F.sum("o.cents") / 100).alias("revenue"), F.count("*").alias("orders"))
        .collect()
    }
    print("4. revenue per country: stream | batch read of the grid | the CSV files", flush=True)
    for c in sorted(truth):
        print(f"   {c}  {streamed.get(c)}  {read_back.get(c)}  {truth[c]}")
    ok = streamed == truth and read_back == truth
    total = sum(n for n, _ in truth.values())
    print(f"pipeline: {total} orders, stream and batch read match the CSV: {'yes' if ok else 'NO'}")
    spark.stop()
    return ok


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--members", help="HTTP endpoints of a running grid (default: start a local grid of 3)")
    ap.add_argument("--orders", type=int, default=2000, help="orders in the first CSV (default 2000)")
    args = ap.parse_args(argv)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    with tempfile.TemporaryDirectory(prefix="gc-pipeline-") as tmp:
        workdir = Path(tmp)
        cluster = None
        members = args.members
        try:
            if members is None:
                cluster, members = start_local_grid(workdir)
            return 0 if run(members, workdir, args.orders) else 1
        finally:
            if cluster is not None:
                cluster.stop()


if __name__ == "__main__":
    sys.exit(main())
