"""The data source through Spark (local[2]) against real grid members: three, a fourth joining, one leaving.

The tests share one grid and run in file order (the last ones change its membership):

* a DataFrame written with ``format("groupcluster")`` is read back complete, each key once, with the segment
  the members compute and a version stamped by the grid; the members serve the same values to the client;
* ``key = x`` / ``key IN (...)`` are pushed down and answered by key lookups (the members count batch
  requests and no segment scans meanwhile), with the versions a scan shows; other filters still apply;
* bad options and schemas fail before anything is read or written, with the option named;
* a segment scan sent to a member that does not own the segment follows it to an owner, cursor and all;
* a streaming query restarted from its checkpoint delivers each change once, none skipped, in segment order,
  deletions and every overwrite between triggers included;
* a read while a fourth member joins (the grid rebalances under it) returns every row exactly once;
* a Spark write while a member leaves loses nothing;
* a write the grid refuses (a degraded partition) fails the job with the grid's reason.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

import pytest
from groupcluster.grid.client import GridClient
from groupcluster.grid.consistent_hash import segment_of

from .gridprocs import SparkGrid, http

N = 3000


def reader(spark: Any, grid: SparkGrid, **opts: str) -> Any:
    r = spark.read.format("groupcluster").option("members", grid.endpoints(["m0", "m1"]))
    for k, v in opts.items():
        r = r.option(k, v)
    return r.load()


@pytest.fixture(scope="module")
def written(spark: Any, grid3: SparkGrid) -> dict[str, str]:
    """N rows written through Spark: key ``row:i`` -> value ``v-i-<i*i>``."""
    from pyspark.sql import functions as F

    df = spark.range(N).select(
        F.format_string("row:%d", "id").alias("key"),
        F.format_string("v-%d-%d", "id", F.col("id") * F.col("id")).alias("value"),
    )
    df.write.format("groupcluster").option("members", grid3.endpoints(["m0"])).option("batchSize", "500").mode(
        "append"
    ).save()
    return {f"row:{i}": f"v-{i}-{i * i}" for i in range(N)}


def test_write_then_read_back_every_row_once(spark: Any, grid3: SparkGrid, written: dict[str, str]) -> None:
    rows = reader(spark, grid3, valueType="string").collect()
    ours = [r for r in rows if r.key.startswith("row:")]
    counts = Counter(r.key for r in ours)
    assert len(ours) == N, f"{len(ours)} rows for {N} keys"
    assert all(c == 1 for c in counts.values()), [k for k, c in counts.items() if c > 1][:5]
    for r in ours:
        assert r.value == written[r.key]
        assert r.segment == segment_of(r.key.encode(), 256)
        assert r.version is not None and r.version > 0
    # The members agree with what Spark read.
    with GridClient([grid3.urls["m2"]]) as c:
        sample = [f"row:{i}".encode() for i in range(0, N, 97)]
        got = c.get_many(sample)
    assert {k.decode(): v.decode() for k, v in got.items()} == {k.decode(): written[k.decode()] for k in sample}


def test_binary_columns_and_spark_transform(spark: Any, grid3: SparkGrid, written: dict[str, str]) -> None:
    df = reader(spark, grid3, keyType="binary")
    assert [f.dataType.simpleString() for f in df.schema.fields] == ["binary", "binary", "int", "bigint"]
    from pyspark.sql import functions as F

    per_segment = (
        df.where(F.col("key").startswith(F.lit(b"row:")))
        .groupBy("segment")
        .count()
        .agg(F.sum("count").alias("rows"), F.count("segment").alias("segments"))
        .collect()[0]
    )
    assert per_segment.rows == N
    assert per_segment.segments == len({segment_of(k.encode(), 256) for k in written})


def _requests(grid: SparkGrid, kind: str) -> int:
    """How many HTTP requests of ``kind`` (``batch``, ``segment``, ...) the members have served."""
    total = 0
    for url in grid.urls.values():
        try:
            _, body = http("GET", url + "/metrics")
        except OSError:
            continue  # a member that left
        for line in body.decode().splitlines():
            if line.startswith(f'groupcluster_http_requests_total{{kind="{kind}"}}'):
                total += int(float(line.split()[-1]))
    return total


def test_key_filters_are_pushed_down_as_lookups(spark: Any, grid3: SparkGrid, written: dict[str, str]) -> None:
    from pyspark.sql import functions as F

    df = reader(spark, grid3, valueType="string")
    scans, batches = _requests(grid3, "segment"), _requests(grid3, "batch")
    one = df.where(F.col("key") == "row:42").collect()
    assert [(r.key, r.value) for r in one] == [("row:42", written["row:42"])]
    assert _requests(grid3, "segment") == scans, "a pushed-down key filter scanned segments"
    assert _requests(grid3, "batch") > batches
    assert one[0].segment == segment_of(b"row:42", 256)
    with GridClient([grid3.urls["m0"]]) as c:
        scanned = {k: ver for k, _, ver in c.scan_segment_versions(one[0].segment)}
    assert one[0].version == scanned[b"row:42"], "a key lookup carries the version of its value"

    keys = ["row:1", "row:2", "row:2999", "absent:7"]
    some = df.where(F.col("key").isin(keys)).collect()
    assert sorted((r.key, r.value) for r in some) == sorted((k, written[k]) for k in keys if k in written)

    # Conjunction of two pushed filters, plus a filter Spark keeps for itself.
    both = df.where(F.col("key").isin(["row:5", "row:6"]) & (F.col("key") == "row:6") & F.col("value").endswith("36"))
    assert [r.key for r in both.collect()] == ["row:6"]
    assert df.where((F.col("key") == "row:5") & (F.col("key") == "row:6")).count() == 0


def test_bad_options_fail_with_the_option_named(spark: Any, grid3: SparkGrid) -> None:
    """Through Spark, the messages reach the user (the full set of option errors: test_spark_plan.py)."""
    one = spark.range(1)
    with pytest.raises(Exception, match="option members is required"):
        spark.read.format("groupcluster").load().collect()
    with pytest.raises(Exception, match=r"supports mode\('append'\) only"):
        one.selectExpr("'k' as key", "'v' as value").write.format("groupcluster").option(
            "members", grid3.endpoints()
        ).mode("overwrite").save()
    with pytest.raises(Exception, match="column 'value' is int"):
        one.selectExpr("'k' as key", "1 as value").write.format("groupcluster").option(
            "members", grid3.endpoints()
        ).mode("append").save()


def test_null_values_fail_or_delete(spark: Any, grid3: SparkGrid) -> None:
    df = spark.createDataFrame([("nv:1", "a"), ("nv:2", None)], "key string, value string")
    ep = grid3.endpoints()
    with pytest.raises(Exception, match="key 'nv:2' has a null value"):
        df.write.format("groupcluster").option("members", ep).mode("append").save()
    spark.createDataFrame([("nv:2", "b")], "key string, value string").write.format("groupcluster").option(
        "members", ep
    ).mode("append").save()
    df.write.format("groupcluster").option("members", ep).option("nullValue", "delete").mode("append").save()
    with GridClient([grid3.urls["m1"]]) as c:
        assert c.get_many([b"nv:1", b"nv:2"]) == {b"nv:1": b"a", b"nv:2": None}


def test_rows_written_with_a_lifespan_expire(spark: Any, grid3: SparkGrid) -> None:
    """``lifespan`` (docs/spark.md): every entry of the write expires that long after it was written."""
    df = spark.createDataFrame([(f"ls:{i}", f"v{i}") for i in range(50)], "key string, value string")
    before = time.time()  # the members count each lifespan from when they take the write: after this
    df.write.format("groupcluster").option("members", grid3.endpoints()).option("lifespan", "6s").mode("append").save()
    keys = [f"ls:{i}".encode() for i in range(50)]
    with GridClient([grid3.urls["m1"]]) as c:
        present = c.get_many(keys)
        if time.time() - before < 5.5:  # the write took less than its lifespan (as it does, by far)
            assert all(v is not None for v in present.values())
        deadline = time.monotonic() + 30
        while any(v is not None for v in c.get_many(keys).values()):
            assert time.monotonic() < deadline, "entries written with a 6 s lifespan still there after 30 s"
            time.sleep(0.1)
    assert time.time() - before >= 6.0  # none removed before its lifespan ended (one clock on this machine)


def test_write_the_grid_refuses_fails_the_job(spark: Any, grid3: SparkGrid) -> None:
    """A value over the grid's 4 MiB limit: the job fails naming the key and the limit; nothing is swallowed."""
    big = "x" * (4 * 1024 * 1024 + 1)
    df = spark.createDataFrame([("big:1", big)], "key string, value string")
    with pytest.raises(Exception, match=r"groupcluster write failed in Spark partition \d+.*exceed the limit"):
        df.write.format("groupcluster").option("members", grid3.endpoints()).mode("append").save()


def test_segment_scan_follows_the_segment_to_an_owner(grid3: SparkGrid, written: dict[str, str]) -> None:
    """Asked of a member that does not read the segment (409 with the owners), the scan moves to an owner and
    carries its cursor on: small pages, every key of the segment once."""
    from groupcluster.spark.gridio import GridIO
    from groupcluster.spark.options import parse_options

    io = GridIO(parse_options({"members": grid3.endpoints(["m0"]), "pageSize": "3"}))
    try:
        seg = segment_of(b"row:7", io.refresh().num_segments)
        # Three members, two owners per segment: exactly one member does not hold it.
        stranger = next(u for u in (grid3.urls[n] for n in ("m0", "m1", "m2")) if _owns_nothing_of(u, seg))
        entries = io.read_segment(seg, prefer=stranger)
    finally:
        io.close()
    keys = [k for k, _, _ in entries]
    assert io.stats["moved"] >= 1, io.stats
    assert keys == sorted(set(keys)), "keys twice or out of order"
    expected = sorted(k.encode() for k in written if segment_of(k.encode(), 256) == seg)
    assert [k for k in keys if k.startswith(b"row:")] == expected
    assert io.stats["pages"] > 1


def _owns_nothing_of(url: str, seg: int) -> bool:
    """True if the member at ``url`` does not read ``seg`` (it answers 409 for a scan of it)."""
    from .gridprocs import http

    return http("GET", f"{url}/v1/segments/{seg}?limit=1")[0] == 409


def test_stream_restarted_from_its_checkpoint(spark: Any, grid3: SparkGrid, tmp_path: Any) -> None:
    """Runs of one streaming query (trigger availableNow) with writes, overwrites and deletes before each: every
    change arrives once (each overwrite, each deletion as a null value), the next run starts where the
    checkpoint says, and per segment the versions only grow."""
    checkpoint = str(tmp_path / "checkpoint")
    seen: list[tuple[int, str, str | None, int, int]] = []  # batch id, key, value, segment, version

    def collect(batch: Any, batch_id: int) -> None:
        for r in batch.collect():
            seen.append((batch_id, r.key, r.value, r.segment, r.version))

    def run() -> list[tuple[int, str, str | None, int, int]]:
        before = len(seen)
        stream = (
            spark.readStream.format("groupcluster")
            .option("members", grid3.endpoints(["m1", "m2"]))
            .option("valueType", "string")
            .load()
            .where("key like 'st:%'")
        )
        q = stream.writeStream.foreachBatch(collect).option("checkpointLocation", checkpoint)
        query = q.trigger(availableNow=True).start()
        assert query.awaitTermination(180), "the availableNow run did not finish"
        assert query.exception() is None, query.exception()
        return seen[before:]

    def changes(run_rows: list[tuple[int, str, str | None, int, int]]) -> list[tuple[str, str | None]]:
        # Per key in version order: the changes of one key share its segment, whose order is by version.
        return [(k, v) for _, k, v, _, _ in sorted(run_rows, key=lambda r: (r[1], r[4]))]

    with GridClient([grid3.urls["m0"]]) as c:
        c.put_many({f"st:a{i}".encode(): b"1" for i in range(200)})
    first = run()
    with GridClient([grid3.urls["m0"]]) as c:
        c.put_many({f"st:b{i}".encode(): b"2" for i in range(200)})
        c.put_many({f"st:a{i}".encode(): b"3" for i in range(50)})
        for i in range(5):  # two overwrites of one key between triggers: both arrive, in order
            c.put(f"st:a{100 + i}".encode(), b"4")
            c.put(f"st:a{100 + i}".encode(), b"5")
        c.delete_many([f"st:a{i}".encode() for i in range(150, 160)])
        c.put(b"st:c", b"6")
        c.delete(b"st:c")  # written and deleted between triggers: both arrive
    second = run()
    third = run()  # nothing new: a run from the checkpoint delivers nothing
    with GridClient([grid3.urls["m0"]]) as c:
        c.delete_many([f"st:b{i}".encode() for i in range(10)])
    fourth = run()

    # The first run starts from the earliest offsets: the grid's present state (which a segment's history
    # before its log's floor is reduced to), then nothing else of "st:".
    assert sorted(changes(first)) == sorted((f"st:a{i}", "1") for i in range(200))
    expected = (
        [(f"st:b{i}", "2") for i in range(200)]
        + [(f"st:a{i}", "3") for i in range(50)]
        + [(f"st:a{100 + i}", v) for i in range(5) for v in ("4", "5")]
        + [(f"st:a{i}", None) for i in range(150, 160)]
        + [("st:c", "6"), ("st:c", None)]
    )
    assert sorted(changes(second), key=repr) == sorted(expected, key=repr)
    assert [(k, v) for k, v in changes(second) if k in ("st:a100", "st:c")] == [
        ("st:a100", "4"),
        ("st:a100", "5"),
        ("st:c", "6"),
        ("st:c", None),
    ]
    assert third == []
    assert sorted(changes(fourth)) == sorted((f"st:b{i}", None) for i in range(10))

    pairs = Counter((k, ver) for _, k, _, _, ver in seen)
    assert all(c == 1 for c in pairs.values()), "a change was delivered twice"
    batches = [{b for b, *_ in r} for r in (first, second, fourth)]
    assert all(a.isdisjoint(b) for i, a in enumerate(batches) for b in batches[i + 1 :]), "a batch ran twice"
    top: dict[int, int] = {}
    for rows in (first, second, fourth):
        run_top = dict(top)
        for _, key, _, seg, ver in rows:
            assert ver > top.get(seg, 0), f"{key}: version {ver} not after segment {seg}'s offset"
            run_top[seg] = max(run_top.get(seg, 0), ver)
        top = run_top


_Observation = tuple[float, float, str, int, str]  # (asked, answered, member, topology id, phase)


def _overlaps(read: tuple[float, float], seen: list[_Observation]) -> bool:
    """Whether the read surely ran while the grid rebalanced: a status call made and answered wholly during the
    read saw a member in a phase other than NO_REBALANCE, or the calls made during it saw more than one topology."""
    t0, t1 = read
    during = [(tid, phase) for asked, answered, _, tid, phase in seen if t0 <= asked and answered <= t1]
    return any(phase != "NO_REBALANCE" for _, phase in during) or len({tid for tid, _ in during}) > 1


def _timeline(reads: list[tuple[float, float]], seen: list[_Observation], origin: float) -> str:
    """Reads and topology changes in time order, for a failure message: when each member's (topology, phase)
    changed, and the reads around the changes."""
    events: list[tuple[float, str]] = []
    last: dict[str, tuple[int, str]] = {}
    for asked, answered, name, tid, phase in seen:
        if last.get(name) != (tid, phase):
            last[name] = (tid, phase)
            events.append((asked, f"{name} topology {tid} {phase} (call {asked - origin:.3f}-{answered - origin:.3f})"))
    changes = [t for t, _ in events]
    near = [r for r in reads if any(r[0] - 5 <= t <= r[1] + 5 for t in changes)]
    events += [(t0, f"read {t0 - origin:.3f}-{t1 - origin:.3f}") for t0, t1 in near]
    return "\n".join(f"  {t - origin:8.3f} {what}" for t, what in sorted(events))


def test_read_while_a_member_joins_returns_every_row_once(spark: Any, grid3: SparkGrid) -> None:
    """A fourth member joins and segments move to it while reads run.

    Deterministic part: a scan of every segment is stopped after its first page, the member joins and the
    grid settles, then the scans go on from their cursors. Segments whose old owner dropped them must be
    followed to their new owner (409 -> owners), and every key must still come exactly once. End-to-end
    part: Spark reads run in a loop during the rebalance; each must return every row exactly once.
    """
    from groupcluster.spark.gridio import GridIO
    from groupcluster.spark.options import parse_options

    keys = {f"join:{i}".encode(): f"j{i}".encode() for i in range(20_000)}
    with GridClient([grid3.urls["m0"]]) as c:
        c.put_many(keys)
    names = ["m0", "m1", "m2"]
    io = GridIO(parse_options({"members": grid3.endpoints(names), "pageSize": "40"}))
    n = io.refresh().num_segments
    scans = {seg: io.scan_segment(seg) for seg in range(n)}
    scanned: list[bytes] = []
    for gen in scans.values():
        scanned += [k for k, _, _ in next(gen, [])]

    # A poller asks every member for its topology while the reads run back to back, so no status calls sit
    # between two reads: a rebalance (a few hundred ms for these keys) once fell wholly into such a gap. Each
    # call is timed on its own: a read counts as overlapping the rebalance only by calls made wholly within it,
    # and timing the four calls of a round as one (as this test once did) let a round that straddled two reads
    # hide the whole rebalance when the loaded members answered slowly.
    everyone = [*names, "m3"]
    seen: list[_Observation] = []
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set():
            for name in everyone:
                if name not in grid3.urls:
                    continue
                asked = time.monotonic()
                g = (grid3.status(name) or {}).get("grid")
                # A joiner has no topology until the coordinator sends it one: nothing to judge by.
                if g and g["topology_id"] is not None:
                    seen.append((asked, time.monotonic(), name, g["topology_id"], g["phase"]))
            stop.wait(0.02)

    reads: list[tuple[float, float]] = []
    problems: list[str] = []
    poller = threading.Thread(target=poll, daemon=True)
    origin = time.monotonic()
    poller.start()
    # The joiner takes its ~0.2 MB at 100 KiB/s, so the rebalance lasts a second or two: unpaced it can be over
    # in 70 ms and fall wholly into the gap between two Spark jobs on a loaded machine.
    grid3.start(3, "--grid-set", "transfer_rate=100KiB")
    deadline = time.monotonic() + 120
    overlapped = False
    try:
        while time.monotonic() < deadline:
            t0 = time.monotonic()
            # Small pages: more requests per segment, so more of them straddle a topology change.
            rows = reader(spark, grid3, pageSize="200").where("key like 'join:%'").select("key", "value").collect()
            reads.append((t0, time.monotonic()))
            counts = Counter(r.key for r in rows)
            dups = sum(c - 1 for c in counts.values())
            wrong = [r.key for r in rows if keys.get(r.key.encode()) != r.value]
            missing = len(keys) - len(counts)
            if dups or wrong or missing:
                problems.append(f"{len(rows)} rows: {dups} duplicates, {missing} missing, {len(wrong)} wrong values")
            assert grid3.procs["m3"].alive(), f"the joiner exited\n{grid3.members.describe()}"
            # The poller may answer a call made during the last read only after it ended: look at the read before.
            overlapped = overlapped or any(_overlaps(r, list(seen)) for r in reads[-2:])
            if overlapped and grid3.settled(everyone):
                break
    finally:
        stop.set()
        poller.join(timeout=10)
    assert not problems, problems
    overlapped = overlapped or any(_overlaps(r, seen) for r in reads)
    assert overlapped, (
        f"no Spark read overlapped the rebalance ({len(reads)} reads)\n{_timeline(reads, seen, origin)}\n"
        f"{grid3.members.describe()}"
    )
    grid3.wait_settled(everyone, timeout=60)

    for gen in scans.values():
        for page in gen:
            scanned += [k for k, _, _ in page]
    io.close()
    assert io.stats["moved"] > 0, f"no scan had to follow its segment: {io.stats}"
    ours = Counter(k for k in scanned if k.startswith(b"join:"))
    assert set(ours) == set(keys), f"{len(set(keys) - set(ours))} keys missing"
    assert max(ours.values()) == 1, "a key came twice"
    # The settled grid of four still reads complete.
    assert reader(spark, grid3).where("key like 'join:%'").count() == len(keys)


def test_spark_write_during_a_join_loses_nothing(spark: Any, grid3: SparkGrid) -> None:
    """Writes retried on topology changes: a Spark write while a member leaves and the grid rebalances."""
    from pyspark.sql import functions as F

    names = [n for n in ("m0", "m1", "m2", "m3") if n in grid3.procs and grid3.procs[n].alive()]
    assert len(names) == 4, "runs after the join test"
    leaver = grid3.urls["m3"]
    done = threading.Event()

    def leave_soon() -> None:
        time.sleep(1.0)
        from .gridprocs import http

        http("POST", leaver + "/v1/leave")
        done.set()

    t = threading.Thread(target=leave_soon)
    t.start()
    df = spark.range(30_000).select(
        F.format_string("w:%d", "id").alias("key"), F.col("id").cast("string").alias("value")
    )
    df.write.format("groupcluster").option("members", grid3.endpoints(["m0", "m1"])).mode("append").save()
    t.join()
    grid3.procs["m3"].wait(timeout=120)
    grid3.wait_settled(["m0", "m1", "m2"], timeout=60)
    with GridClient([grid3.urls["m0"]]) as c:
        got = c.get_many([f"w:{i}".encode() for i in range(30_000)])
    missing = [k for k, v in got.items() if v is None]
    assert not missing, f"{len(missing)} rows missing, e.g. {missing[:5]}"
    assert all(v == k[2:] for k, v in got.items())


def test_write_the_degraded_grid_refuses_fails_the_job(spark: Any, grid3: SparkGrid) -> None:
    """Two of three members killed: the survivor is a degraded partition that refuses writes (503, segment
    unavailable). The Spark job must fail with that reason after its bounded retries, not report success."""
    grid3.procs["m1"].kill()
    grid3.procs["m2"].kill()
    deadline = time.monotonic() + 60
    while True:
        st = grid3.status("m0")
        if st and st["grid"] and st["grid"]["availability"] != "AVAILABLE":
            break
        assert time.monotonic() < deadline, f"m0 never became degraded: {st and st['grid']}"
        time.sleep(0.2)
    df = spark.createDataFrame([(f"deg:{i}", "v") for i in range(50)], "key string, value string")
    with pytest.raises(Exception, match=r"groupcluster write failed in Spark partition \d+.*unavailable for writes"):
        df.write.format("groupcluster").option("members", grid3.endpoints(["m0"])).option("retries", "2").option(
            "timeout", "10"
        ).mode("append").save()
