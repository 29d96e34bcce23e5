"""Pure parts of the Spark data source: options, segment groups, stream offsets, schema checks (no JVM)."""

from __future__ import annotations

from typing import Any

import pytest
from groupcluster.spark.options import GridOptions, OptionError, parse_options
from groupcluster.spark.plan import Offset, Routing, RoutingError, SegmentGroup, in_range, plan_groups, plan_ranges
from groupcluster.spark.source import GroupClusterDataSource, GroupClusterWriter, read_schema
from pyspark.sql.types import BinaryType, IntegerType, StringType, StructField, StructType

EP = "127.0.0.11:8080"


def test_options_defaults_aliases_and_endpoints() -> None:
    o = parse_options({"members": " 127.0.0.11:8080, http://127.0.0.12:8080/ ,127.0.0.11:8080"})
    assert o.members == ("http://127.0.0.11:8080", "http://127.0.0.12:8080")
    assert (o.key_type, o.value_type, o.batch_size, o.null_value) == ("string", "binary", 1000, "error")
    o = parse_options({"MEMBERS": EP, "batch_size": "250", "valuetype": "STRING", "timeout": "5s", "path": "x"})
    assert (o.batch_size, o.value_type, o.timeout) == (250, "string", 5.0)
    assert o.lifespan is None
    assert parse_options({"members": EP, "lifespan": "2m"}).lifespan == 120.0
    assert parse_options({"members": EP, "life_span": "0.5"}).lifespan == 0.5


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, "option members is required"),
        ({"members": " , "}, "give at least one member endpoint"),
        ({"members": "nohost"}, "option members: bad endpoint 'nohost'"),
        ({"members": "ftp://h:1"}, "bad endpoint 'ftp://h:1'"),
        ({"members": EP, "membres": EP}, "unknown option 'membres'"),
        ({"members": EP, "batchSize": "1k"}, "option batchSize: expected an integer, got '1k'"),
        ({"members": EP, "batchSize": "0"}, r"option batchSize: 0 is outside \[1, 10000\]"),
        ({"members": EP, "pageSize": "20000"}, r"option pageSize: 20000 is outside \[1, 10000\]"),
        ({"members": EP, "keyType": "int"}, "option keyType: 'int' is not one of string, binary"),
        ({"members": EP, "nullValue": "skip"}, "option nullValue: 'skip' is not one of error, delete"),
        ({"members": EP, "startingOffsets": "now"}, "is not one of earliest, latest"),
        ({"members": EP, "timeout": "soon"}, "option timeout: expected seconds"),
        ({"members": EP, "timeout": "0"}, r"option timeout: 0.0 is outside \(0, 3600\]"),
        ({"members": EP, "keyColumn": " "}, "option keyColumn: empty column name"),
        ({"members": EP, "lifespan": "0"}, "option lifespan: expected seconds above 0, got '0'"),
        ({"members": EP, "lifespan": "soon"}, r"option lifespan: expected seconds \(e.g. 30"),
        ({"members": EP, "lifespan": "4e8"}, "option lifespan: '4e8' seconds exceed the limit"),
    ],
)
def test_bad_options_are_named(options: dict[str, str], message: str) -> None:
    with pytest.raises(OptionError, match=message):
        parse_options(options)


def _routing(owners: list[int], members: int = 3, tid: int = 7) -> Routing:
    return Routing.from_status(
        {
            "routing": {
                "topology_id": tid,
                "num_segments": len(owners),
                "members": [f"http://127.0.0.{11 + i}:8080" for i in range(members)],
                "read": owners,
                "write": owners,
            }
        }
    )


def test_groups_cover_every_segment_once_and_follow_owners() -> None:
    owners = [s % 3 for s in range(256)]
    r = _routing(owners)
    for wanted in (0, 1, 5, 6, 50, 256, 1000):
        groups = plan_groups(r, wanted)
        segs = [s for g in groups for s in g.segments]
        assert sorted(segs) == list(range(256)), wanted
        for g in groups:
            assert all(r.read_owner(s) == g.owner for s in g.segments)
        if wanted == 0:
            assert len(groups) == 6  # two per owner
        sizes = [len(g.segments) for g in groups]
        assert max(sizes) - min(sizes) <= max(1, max(sizes) // 2), (wanted, sizes)
    # A segment without a live owner (-1) still gets read (from any member).
    r = _routing([0, -1, 1, -1])
    assert sorted(s for g in plan_groups(r) for s in g.segments) == [0, 1, 2, 3]
    assert any(g.owner is None for g in plan_groups(r))


@pytest.mark.parametrize(
    ("status", "message"),
    [
        ({}, "no grid topology yet"),
        ({"routing": {"num_segments": 2, "members": [], "read": [0], "write": [0, 0], "topology_id": 1}}, "malformed"),
        ({"routing": {"num_segments": 1, "members": ["u"], "read": [3], "write": [0], "topology_id": 1}}, "index 3"),
    ],
)
def test_bad_routing_tables_are_refused(status: dict[str, Any], message: str) -> None:
    with pytest.raises(RoutingError, match=message):
        Routing.from_status(status)


def test_offsets_round_trip_and_ranges_do_not_overlap() -> None:
    zero = Offset.zero(8)
    assert zero.to_json() == {"numSegments": 8, "versions": {}}
    a = zero.advanced({1: 10, 5: 3})
    b = a.advanced({1: 7, 5: 9, 6: 1})  # never backwards: segment 1 stays at 10
    assert Offset.from_json(b.to_json()) == b
    assert b.versions == (0, 10, 0, 0, 0, 9, 1, 0)
    groups = [SegmentGroup((0, 1, 2, 3), "http://a:1"), SegmentGroup((4, 5, 6, 7), "http://b:1")]
    r1 = plan_ranges(groups, zero, a)
    r2 = plan_ranges(groups, a, b)
    assert [(g.segments, g.starts, g.ends) for g in r1] == [((1,), (0,), (10,)), ((5,), (0,), (3,))]
    assert [(g.segments, g.starts, g.ends) for g in r2] == [((5, 6), (3, 0), (9, 1))]
    assert plan_ranges(groups, b, b) == []
    entries = [(b"k", b"v", v) for v in range(12)]
    # Consecutive ranges of one segment partition the versions: each once, none skipped.
    got = in_range(entries, 0, 3) + in_range(entries, 3, 9) + in_range(entries, 9, 11)
    assert [e[2] for e in got] == list(range(1, 12))


@pytest.mark.parametrize(
    "doc",
    [{}, {"numSegments": 4}, {"numSegments": 4, "versions": {"9": 1}}, {"numSegments": 0, "versions": {}}],
)
def test_bad_offsets_are_refused(doc: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="not a groupcluster stream offset"):
        Offset.from_json(doc)


def test_checkpoint_of_another_segment_count_is_refused() -> None:
    with pytest.raises(ValueError, match="cannot resume across a change of num_segments"):
        plan_ranges([], Offset.zero(4), Offset.zero(8))


def test_schema_and_writer_columns_are_checked() -> None:
    ds = GroupClusterDataSource({"members": EP, "valueType": "string"})
    assert ds.schema() == "key string, value string, segment int, version long"
    ds.reader(read_schema(ds.opts))  # our own schema is accepted
    with pytest.raises(OptionError, match="reads the schema 'key string, value string, segment int, version long'"):
        ds.reader(StructType([StructField("key", StringType()), StructField("value", BinaryType())]))
    opts = GridOptions(members=(EP,))
    with pytest.raises(OptionError, match=r"no column 'key' in \(name, value\)"):
        GroupClusterWriter(opts, StructType([StructField("name", StringType()), StructField("value", StringType())]))
    with pytest.raises(OptionError, match="column 'value' is int"):
        GroupClusterWriter(opts, StructType([StructField("key", StringType()), StructField("value", IntegerType())]))
    custom = GridOptions(members=(EP,), key_column="id", value_column="doc")
    GroupClusterWriter(custom, StructType([StructField("id", BinaryType()), StructField("doc", StringType())]))
    with pytest.raises(OptionError, match=r"supports mode\('append'\) only"):
        ds.writer(StructType([StructField("key", StringType()), StructField("value", StringType())]), True)
