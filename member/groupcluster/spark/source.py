"""The ``groupcluster`` data source for Spark 4's Python Data Source API (batch read, batch write, stream read).

::

    from groupcluster.spark import register
    register(spark)                                      # also enables key-filter pushdown
    df = spark.read.format("groupcluster").option("members", "127.0.0.11:8080").load()
    df.write.format("groupcluster").option("members", "127.0.0.11:8080").mode("append").save()
    changes = spark.readStream.format("groupcluster").option("members", "127.0.0.11:8080").load()

**Schema** (read and stream): ``key`` (string, or binary with ``keyType=binary``), ``value`` (binary, or
string with ``valueType=string``), ``segment`` (int: the key's segment) and ``version`` (long: the version
the segment's primary owner stamped on the write, ``(topology_id << 40) | seq``; also for rows fetched by a
pushed-down key lookup). In the stream a deletion is a row whose ``value`` is null.

**Batch read**: one Spark partition per group of segments (:func:`.plan.plan_groups`), each segment scanned
from a member that reads it and followed to its new owner when a rebalance moves it (:mod:`.gridio`): each
key present during the read is returned exactly once. Rows leave the task as Arrow record batches. A filter
``key = x`` or ``key IN (...)`` is pushed down and served by batched key lookups instead of a full scan.

**Batch write** (append only): each task sends its rows in batches of ``batchSize`` to the write primaries
(``POST /v1/batch``), retried per key on topology changes; anything that still fails fails the task with
:class:`.gridio.GridWriteError` and so the job. Writes are idempotent puts, so Spark's task retries are
harmless. *Commit* has nothing to do (each acknowledged batch is durable on every owner). *Abort* cannot undo
the batches already acknowledged: after a failed job the rows of the batches that succeeded are in the grid.

**Stream read**: see :class:`GroupClusterStreamReader`.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, cast

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamReader,
    EqualTo,
    Filter,
    In,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.types import BinaryType, IntegerType, LongType, StringType, StructField, StructType

from ..grid.consistent_hash import segment_of
from .feed import Change, segment_end, segment_range
from .gridio import Entry, GridIO, GridSourceError, GridWriteError
from .options import GridOptions, OptionError, parse_options
from .plan import Offset, RangeGroup, SegmentGroup, plan_groups, plan_ranges

log = logging.getLogger("groupcluster.spark")

ROWS_PER_ARROW_BATCH = 8192
PREFETCH_SEGMENTS = 2  # segments fetched ahead of the one being converted, per task
LOOKUP_CHUNK = 10_000  # keys per lookup partition (the server takes up to 10,000 operations per batch)


def schema_ddl(opts: GridOptions) -> str:
    return f"key {opts.key_type}, value {opts.value_type}, segment int, version long"


def read_schema(opts: GridOptions) -> StructType:
    """The schema as a StructType (built by hand: parsing DDL needs a SparkContext, which workers lack)."""
    kt = StringType() if opts.key_type == "string" else BinaryType()
    vt = StringType() if opts.value_type == "string" else BinaryType()
    return StructType(
        [
            StructField("key", kt),
            StructField("value", vt),
            StructField("segment", IntegerType()),
            StructField("version", LongType()),
        ]
    )


def _arrow_schema(opts: GridOptions) -> pa.Schema:
    kt = pa.string() if opts.key_type == "string" else pa.binary()
    vt = pa.string() if opts.value_type == "string" else pa.binary()
    return pa.schema([("key", kt), ("value", vt), ("segment", pa.int32()), ("version", pa.int64())])


def _record_batch(
    opts: GridOptions,
    keys: list[bytes],
    values: list[bytes | None],
    segments: list[int],
    versions: list[int | None],
) -> pa.RecordBatch:
    """One Arrow batch of rows; bytes go into string columns as they are, after an UTF-8 check by Arrow."""
    schema = _arrow_schema(opts)
    try:
        k = pa.array(keys, type=schema.field("key").type)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        bad = next(x for x in keys if not _is_utf8(x))
        raise GridSourceError(f"key {bad!r} is not UTF-8 text: read with option keyType=binary") from None
    try:
        v = pa.array(values, type=schema.field("value").type)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        i = next(i for i, x in enumerate(values) if not _is_utf8(x))
        raise GridSourceError(
            f"the value of key {keys[i]!r} is not UTF-8 text: read with option valueType=binary (the default)"
        ) from None
    return pa.RecordBatch.from_arrays(
        [k, v, pa.array(segments, type=pa.int32()), pa.array(versions, type=pa.int64())], schema=schema
    )


def _is_utf8(b: bytes | None) -> bool:
    if b is None:
        return True  # a deletion in the stream: a null value
    try:
        b.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def _segment_batches(
    opts: GridOptions, segment: int, entries: Sequence[Entry] | Sequence[Change]
) -> Iterator[pa.RecordBatch]:
    """The entries of one segment as Arrow batches, built column by column (no per-row Python objects)."""
    for i in range(0, len(entries), ROWS_PER_ARROW_BATCH):
        chunk = entries[i : i + ROWS_PER_ARROW_BATCH]
        keys, values, versions = zip(*chunk, strict=True)
        yield _record_batch(opts, list(keys), list(values), [segment] * len(chunk), list(versions))


def _prefetched(io: GridIO, segments: Sequence[int], owner: str | None) -> Iterator[tuple[int, list[Entry]]]:
    """``(segment, entries)`` in order, the next segments fetched on a helper thread meanwhile.

    While this task turns one segment into Arrow batches, the member is already serving the next one, so
    the network wait and the member's work overlap with ours. Only the helper thread uses ``io``.
    """
    with ThreadPoolExecutor(1, thread_name_prefix="groupcluster-scan") as pool:
        ahead: deque[tuple[int, Future[list[Entry]]]] = deque()
        for seg in segments:
            ahead.append((seg, pool.submit(io.read_segment, seg, owner)))
            if len(ahead) > PREFETCH_SEGMENTS:
                seg0, fut = ahead.popleft()
                yield seg0, fut.result()
        while ahead:
            seg0, fut = ahead.popleft()
            yield seg0, fut.result()


def _check_read_schema(opts: GridOptions, schema: StructType) -> None:
    """A user-given schema (``.schema(...)``) must be ours: the columns are fixed by the grid."""
    ours = read_schema(opts)
    if [(f.name, f.dataType) for f in schema.fields] != [(f.name, f.dataType) for f in ours.fields]:
        raise OptionError(
            f"format groupcluster reads the schema '{schema_ddl(opts)}' (keyType/valueType choose string or "
            f"binary); the given schema was '{schema.simpleString()}'"
        )


# ==== the data source ============================================================================================
class GroupClusterDataSource(DataSource):
    """Format ``groupcluster``: the grid's entries as rows (read, stream) and rows as entries (write)."""

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self.opts = parse_options(options)

    @classmethod
    def name(cls) -> str:
        return "groupcluster"

    def schema(self) -> str:
        return schema_ddl(self.opts)

    def reader(self, schema: StructType) -> DataSourceReader:
        _check_read_schema(self.opts, schema)
        return GroupClusterReader(self.opts)

    def writer(self, schema: StructType, overwrite: bool) -> GroupClusterWriter:
        if overwrite:
            raise OptionError(
                "format groupcluster supports mode('append') only: overwrite would have to delete every key the "
                "job does not write, which the grid cannot do atomically"
            )
        return GroupClusterWriter(self.opts, schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        _check_read_schema(self.opts, schema)
        return GroupClusterStreamReader(self.opts)


# ==== batch read =================================================================================================
class ScanPartition(InputPartition):
    """A group of segments to scan, with the read owner they had when the read was planned."""

    def __init__(self, group: SegmentGroup) -> None:
        super().__init__(group.segments)
        self.group = group


class LookupPartition(InputPartition):
    """Keys to look up (a pushed-down key filter)."""

    def __init__(self, keys: tuple[bytes, ...]) -> None:
        super().__init__(len(keys))
        self.keys = keys


class GroupClusterReader(DataSourceReader):
    """Scans the grid by segment groups, or looks keys up when a key filter was pushed down."""

    def __init__(self, opts: GridOptions) -> None:
        self.opts = opts
        self.lookup: set[bytes] | None = None  # None: no key filter pushed, scan everything

    def _key_bytes(self, value: Any) -> bytes | None:
        if isinstance(value, str):
            return value.encode("utf-8")
        if isinstance(value, bytes | bytearray):
            return bytes(value)
        return None

    def pushFilters(self, filters: list[Filter]) -> Iterator[Filter]:
        for f in filters:
            keys: set[bytes] | None = None
            if isinstance(f, EqualTo) and f.attribute == ("key",):
                k = self._key_bytes(f.value)
                keys = {k} if k is not None else None
            elif isinstance(f, In) and f.attribute == ("key",):
                ks = [self._key_bytes(v) for v in f.value]
                keys = None if any(k is None for k in ks) else {k for k in ks if k is not None}
            if keys is None:
                yield f  # Spark evaluates it after the scan
                continue
            # Pushed filters are ANDed: a key must satisfy every one of them.
            self.lookup = keys if self.lookup is None else self.lookup & keys

    def partitions(self) -> Sequence[InputPartition]:
        if self.lookup is not None:
            keys = sorted(self.lookup)
            return [LookupPartition(tuple(keys[i : i + LOOKUP_CHUNK])) for i in range(0, len(keys), LOOKUP_CHUNK)]
        io = GridIO(self.opts)
        try:
            routing = io.refresh()
        finally:
            io.close()
        return [ScanPartition(g) for g in plan_groups(routing, self.opts.num_partitions)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        io = GridIO(self.opts)
        try:
            if isinstance(partition, LookupPartition):
                yield from self._lookup(io, partition.keys)
                return
            assert isinstance(partition, ScanPartition)
            for seg, entries in _prefetched(io, partition.group.segments, partition.group.owner):
                yield from _segment_batches(self.opts, seg, entries)
        finally:
            io.close()

    def _lookup(self, io: GridIO, keys: tuple[bytes, ...]) -> Iterator[pa.RecordBatch]:
        if not keys:
            return
        n = io.current_routing().num_segments
        found = sorted((k, v, ver) for k, (v, ver) in io.get_many_versions(keys).items() if v is not None)
        if found:
            ks = [k for k, _, _ in found]
            # The batch answer carries each value's version (null only if a member off the routing answered).
            yield _record_batch(
                self.opts, ks, [v for _, v, _ in found], [segment_of(k, n) for k in ks], [ver for *_, ver in found]
            )


# ==== batch write ================================================================================================
def _row_entry(
    k: str | bytes | None, v: str | bytes | None, part: int, opts: GridOptions
) -> tuple[bytes, bytes | None]:
    """A row's key and value as bytes (value None: delete the key, where ``nullValue=delete`` allows nulls)."""
    if k is None:
        raise GridWriteError(
            f"groupcluster write failed in Spark partition {part}: a row has a null key "
            f"(column {opts.key_column!r}); filter such rows out first"
        )
    kb = k.encode("utf-8") if isinstance(k, str) else k
    if v is None:
        if opts.null_value != "delete":
            raise GridWriteError(
                f"groupcluster write failed in Spark partition {part}: key {k!r} has a null value; "
                "the grid stores no nulls (filter them out, or set nullValue=delete to delete "
                "such keys)"
            )
        return kb, None
    return kb, v.encode("utf-8") if isinstance(v, str) else v


def _as_bytes(col: pa.Array | pa.ChunkedArray) -> list[bytes]:
    """A string or binary column's values as bytes (UTF-8 for strings), converted by Arrow."""
    t = col.type
    if pa.types.is_string(t):
        col = col.cast(pa.binary())
    elif pa.types.is_large_string(t):
        col = col.cast(pa.large_binary())
    elif pa.types.is_string_view(t):
        col = col.cast(pa.binary_view())
    out: list[Any] = col.to_pylist()
    if out and type(out[0]) is not bytes:  # a column type not listed above: converted row by row
        out = [v.encode("utf-8") if isinstance(v, str) else bytes(v) for v in out]
    return out


@dataclass
class WriteReport(WriterCommitMessage):
    """What one task wrote (the driver logs the totals)."""

    partition: int
    rows: int
    puts: int
    deletes: int


class GroupClusterWriter(DataSourceArrowWriter):
    """Writes each task's rows in batches routed to the write owners; any batch that fails fails the job."""

    def __init__(self, opts: GridOptions, schema: StructType) -> None:
        self.opts = opts
        names = [f.name for f in schema.fields]
        for col in (opts.key_column, opts.value_column):
            if col not in names:
                raise OptionError(
                    f"format groupcluster writes a key and a value column: no column {col!r} in ({', '.join(names)}); "
                    "rename yours or set the options keyColumn/valueColumn"
                )
            dtype = schema[col].dataType
            if not isinstance(dtype, StringType | BinaryType):
                raise OptionError(
                    f"column {col!r} is {dtype.simpleString()}: the grid stores bytes, give a string or binary "
                    f"column (e.g. to_json(struct(...)) or cast({col} as string))"
                )

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriteReport:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        part = ctx.partitionId() if ctx is not None else -1
        opts = self.opts
        io = GridIO(opts)
        chunk: dict[bytes, bytes | None] = {}  # last row per key wins, as it would written one by one
        limit = opts.batch_size * opts.parallel
        stats = {"rows": 0, "puts": 0, "deletes": 0, "flushes": 0}

        def flush() -> None:
            if None in chunk.values():
                puts: dict[bytes, bytes] = {k: v for k, v in chunk.items() if v is not None}
                dels = [k for k, v in chunk.items() if v is None]
            else:  # no deletions (the usual case): the chunk as it is (put_many copies what it keeps)
                puts, dels = cast("dict[bytes, bytes]", chunk), []
            try:
                if puts:
                    io.put_many(puts)
                if dels:
                    io.delete_many(dels)
            except Exception as exc:
                raise GridWriteError(
                    f"groupcluster write failed in Spark partition {part}: {len(chunk)} rows (batch "
                    f"{stats['flushes'] + 1} of this task, after {stats['puts'] + stats['deletes']} rows written "
                    f"and acknowledged) were not all written: {exc}"
                ) from exc
            stats["puts"] += len(puts)
            stats["deletes"] += len(dels)
            stats["flushes"] += 1
            chunk.clear()

        try:
            for batch in iterator:
                ki = batch.schema.get_field_index(opts.key_column)
                vi = batch.schema.get_field_index(opts.value_column)
                kcol, vcol = batch.column(ki), batch.column(vi)
                if kcol.null_count == 0 and vcol.null_count == 0:
                    # No nulls (the usual case): the columns as bytes straight from Arrow (UTF-8 strings are
                    # their bytes already) into the chunk, in slices that end where a flush is due, instead
                    # of a Python step per row.
                    keys = _as_bytes(kcol)
                    values = _as_bytes(vcol)
                    n, i = len(keys), 0
                    while i < n:
                        take = min(n - i, limit - len(chunk))
                        chunk.update(zip(keys[i : i + take], values[i : i + take], strict=True))
                        i += take
                        if len(chunk) >= limit:
                            flush()
                    stats["rows"] += n
                    continue
                keys = kcol.to_pylist()
                values = vcol.to_pylist()
                for k, v in zip(keys, values, strict=True):
                    kb, vb = _row_entry(k, v, part, opts)
                    chunk[kb] = vb
                    if len(chunk) >= limit:
                        flush()
                stats["rows"] += len(keys)
            if chunk:
                flush()
        finally:
            io.close()
        return WriteReport(part, stats["rows"], stats["puts"], stats["deletes"])

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        reports = [m for m in messages if isinstance(m, WriteReport)]
        log.info(
            "groupcluster write committed: %d rows (%d puts, %d deletes) from %d tasks",
            sum(r.rows for r in reports),
            sum(r.puts for r in reports),
            sum(r.deletes for r in reports),
            len(reports),
        )

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        # Puts acknowledged by the grid are durable on every owner; there is nothing to roll back with.
        done = [m for m in messages if isinstance(m, WriteReport)]
        log.error(
            "groupcluster write aborted: %d tasks had finished and their %d rows stay in the grid (writes are "
            "idempotent puts: re-running the job writes the same values again)",
            len(done),
            sum(r.puts + r.deletes for r in done),
        )


# ==== stream read ================================================================================================
class RangePartition(InputPartition):
    """Segments of one micro-batch task with their version ranges."""

    def __init__(self, group: RangeGroup) -> None:
        super().__init__(group.segments)
        self.group = group


class GroupClusterStreamReader(DataSourceStreamReader):
    """The grid's changes as a stream: per segment, every write in version order; the offset is a version per
    segment.

    Each micro-batch delivers, per segment, the writes whose version lies between the last offset and the end
    the driver found when it planned the batch, read from the member-side change feed (:mod:`.feed`): every
    put, every overwrite and every deletion (a row with a null value), once each. A restarted query continues
    from the offsets in its checkpoint: ranges do not overlap and leave no hole, and a range read again gives
    the same writes, so no change is delivered twice and none is skipped. Where a member's log does not reach
    back to the offset (a segment it fetched in a rebalance, or a log truncated because the stream fell far
    behind) the part below the log comes from a scan: the current value of the keys last written in that gap.
    The order is per segment (the order of versions), not one total order (docs/spark.md).
    """

    def __init__(self, opts: GridOptions) -> None:
        self.opts = opts

    def _ends(self, base: Offset | None) -> tuple[int, dict[int, int]]:
        """The number of segments and, per segment, how far the feed lets the stream advance from ``base``."""
        io = GridIO(self.opts)
        try:
            routing = io.refresh()
            start = base if base is not None else Offset.zero(routing.num_segments)
            start.check_compatible(Offset.zero(routing.num_segments))
            ends: dict[int, int] = {}
            for g in plan_groups(routing, self.opts.num_partitions):
                for seg in g.segments:
                    ends[seg] = segment_end(io, seg, start.versions[seg], g.owner)
            return routing.num_segments, ends
        finally:
            io.close()

    def initialOffset(self) -> dict[str, Any]:
        n, ends = self._ends(None) if self.opts.starting_offsets == "latest" else (self._num_segments(), {})
        return Offset.zero(n).advanced(ends).to_json()

    def _num_segments(self) -> int:
        io = GridIO(self.opts)
        try:
            return io.refresh().num_segments
        finally:
            io.close()

    def latestOffset(self, start: dict[str, Any] | None = None, limit: Any = None) -> dict[str, Any]:
        base = Offset.from_json(start) if start else None
        n, ends = self._ends(base)
        return (base or Offset.zero(n)).advanced(ends).to_json()

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        lo, hi = Offset.from_json(start), Offset.from_json(end)
        io = GridIO(self.opts)
        try:
            routing = io.refresh()
        finally:
            io.close()
        lo.check_compatible(Offset.zero(routing.num_segments))
        return [RangePartition(r) for r in plan_ranges(plan_groups(routing, self.opts.num_partitions), lo, hi)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, RangePartition)
        g = partition.group
        io = GridIO(self.opts)
        try:
            for seg, lo, hi in zip(g.segments, g.starts, g.ends, strict=True):
                changes = segment_range(io, seg, lo, hi, g.owner)
                if changes:
                    yield from _segment_batches(self.opts, seg, changes)
        finally:
            io.close()

    def commit(self, end: dict[str, Any]) -> None:
        # The grid keeps no per-reader state: nothing to release once Spark has processed up to ``end``.
        return None
