"""Fault injection: drop, duplicate, shuffle, delay, scheduled partitions, SetFaults, configuration errors."""

from __future__ import annotations

import pytest
from groupcluster.core import protocol_ids
from groupcluster.core.address import Address
from groupcluster.core.errors import ConfigError
from groupcluster.core.message import HEADER_TYPES, Message
from groupcluster.protocols.faults import PartitionWindow, SetFaults, parse_partitions

from .harness import ME, PEERS, LayerHarness

P1, P2, P3 = PEERS[:3]


def ep(a: Address) -> str:
    return f"{a.host}:{a.port}"


def make(seed: int = 0, **params) -> LayerHarness:
    h = LayerHarness([{"layer": "faults", **params}, {"layer": "probe"}], seed=seed)
    h.install_view([ME, P1, P2, P3])
    h.take_events()
    return h


def batch(n: int, tag: str = "m") -> list[Message]:
    return [Message(None, f"{tag}{i}".encode()) for i in range(n)]


def payloads(msgs: list[Message]) -> list[bytes]:
    return [m.payload for m in msgs]


def test_without_faults_batches_pass_untouched():
    h = make()
    b = [Message(None, b"a", src=P1), Message(None, b"b", src=P1)]
    h.layer("faults").up(b)
    assert h.probe().log.up[-1] is b
    assert payloads(h.collect().take_delivered()) == [b"a", b"b"]
    h.receive(P1, batch(3))
    assert payloads(h.take_delivered()) == [b"m0", b"m1", b"m2"]


def test_drop_rate_one_drops_everything_and_counts():
    h = make(drop_rate=1.0)
    h.receive(P1, batch(10))
    assert h.take_delivered() == []
    assert h.metric("faults.dropped") == 10


def test_drop_rate_drops_about_that_share_deterministically():
    def run(seed: int) -> list[bytes]:
        h = make(seed=seed, drop_rate=0.3)
        for i in range(100):
            h.receive(P1, batch(10, tag=f"b{i}-"))
        return payloads(h.take_delivered())

    got = run(7)
    assert 600 <= len(got) <= 800
    assert run(7) == got
    assert run(8) != got


def test_duplicate_rate_one_delivers_everything_twice():
    h = make(duplicate_rate=1.0)
    h.receive(P1, batch(3))
    assert payloads(h.take_delivered()) == [b"m0", b"m0", b"m1", b"m1", b"m2", b"m2"]
    assert h.metric("faults.duplicated") == 3


def test_shuffle_reorders_within_a_batch():
    h = make(shuffle=True)
    h.receive(P1, batch(20))
    got = payloads(h.take_delivered())
    assert sorted(got) == sorted(payloads(batch(20)))
    assert got != payloads(batch(20))


def test_delay_holds_batches_back():
    h = make(delay="100ms")
    h.receive(P1, batch(2))
    assert h.take_delivered() == []
    h.advance(0.099)
    assert h.take_delivered() == []
    h.advance(0.002)
    assert payloads(h.take_delivered()) == [b"m0", b"m1"]
    assert h.metric("faults.delayed") == 2


def test_jitter_lets_batches_overtake_each_other():
    h = make(delay="10ms", delay_jitter="200ms")
    for i in range(30):
        h.receive(P1, [Message(None, f"b{i}".encode())])
    h.advance(0.009)
    assert h.take_delivered() == []
    h.advance(0.202)
    got = payloads(h.take_delivered())
    assert sorted(got) == sorted(f"b{i}".encode() for i in range(30))
    assert got != [f"b{i}".encode() for i in range(30)]


def partition_spec(start="1s", end="3s", groups=None):
    return [{"start": start, "end": end, "groups": groups or [[ep(ME), ep(P1)], [ep(P2)]]}]


def test_partition_window_cuts_off_the_other_group_and_heals():
    h = make(partitions=partition_spec())
    h.receive(P2, batch(1, "before"))
    assert payloads(h.take_delivered()) == [b"before0"]
    h.advance(1.0)
    h.receive(P2, batch(2, "during"))
    h.receive(P1, batch(1, "same-group"))
    h.receive(P3, batch(1, "unlisted"))
    assert payloads(h.take_delivered()) == [b"same-group0", b"unlisted0"]
    assert h.metric("faults.partition_dropped") == 2
    assert h.metric("faults.partitions_started") == 1
    h.advance(2.0)
    h.receive(P2, batch(1, "after"))
    assert payloads(h.take_delivered()) == [b"after0"]
    assert h.metric("faults.partitions_healed") == 1


def test_partition_drops_unicasts_to_the_other_group_on_the_way_down():
    h = make(partitions=partition_spec(start="0s"))
    h.send(b"to-p2", dest=P2)
    h.send(b"to-p1", dest=P1)
    sent = h.take_sent()
    assert [(e, m.payload) for e, m in sent] == [(P1.endpoint, b"to-p1")]
    assert h.metric("faults.partition_dropped_down") == 1
    h.advance(3.0)
    h.send(b"to-p2", dest=P2)
    assert [m.payload for _, m in h.take_sent()] == [b"to-p2"]


def test_partition_on_the_other_side_is_symmetric():
    # P2 runs the same schedule: it drops what comes from us.
    h = LayerHarness([{"layer": "faults", "partitions": partition_spec(start="0s")}], me=P2)
    h.receive(ME, batch(1))
    h.receive(P3, batch(1, "x"))
    assert payloads(h.take_delivered()) == [b"x0"]


def test_set_faults_changes_rates_at_run_time():
    h = make()
    h.control(SetFaults(drop_rate=1.0))
    h.receive(P1, batch(5))
    assert h.take_delivered() == []
    h.control(SetFaults(drop_rate=0.0, duplicate_rate=1.0))
    h.receive(P1, batch(1))
    assert payloads(h.take_delivered()) == [b"m0", b"m0"]
    h.control(SetFaults(duplicate_rate=0.0, delay="50ms"))
    h.receive(P1, batch(1))
    assert h.take_delivered() == []
    h.advance(0.05)
    assert payloads(h.take_delivered()) == [b"m0"]


def test_set_faults_partitions_count_from_now_and_empty_heals():
    h = make()
    h.advance(100.0)
    h.control(SetFaults(partitions=partition_spec(start="0s", end="1h")))
    h.receive(P2, batch(1))
    assert h.take_delivered() == []
    h.control(SetFaults(partitions=()))
    h.receive(P2, batch(1))
    assert len(h.take_delivered()) == 1


def test_set_faults_is_not_passed_below():
    h = LayerHarness([{"layer": "probe"}, {"layer": "faults"}])
    h.control(SetFaults(shuffle=True))
    assert [e for e in h.probe().log.down_events if isinstance(e, SetFaults)] == []


@pytest.mark.parametrize(
    ("event", "key"),
    [
        (SetFaults(drop_rate=2.0), "SetFaults.drop_rate"),
        (SetFaults(duplicate_rate=-0.1), "SetFaults.duplicate_rate"),
        (SetFaults(delay="soon"), "SetFaults.delay"),
        (SetFaults(shuffle="yes"), "SetFaults.shuffle"),  # type: ignore[arg-type]
        (SetFaults(partitions=[{"start": "0s", "end": "1s", "groups": [["a:1"]]}]), "SetFaults.partitions[0].groups"),
    ],
)
def test_set_faults_rejects_bad_values(event, key):
    h = make()
    with pytest.raises(ConfigError) as err:
        h.control(event)
    assert key in str(err.value)


def test_parse_partitions_accepts_the_documented_forms():
    windows = parse_partitions(
        [
            {"start": "5s", "end": "20s", "groups": [["10.0.0.1:7800", "10.0.0.2:7800"], ["10.0.0.3:7800"]]},
            {"start": 30, "end": 31.5, "groups": ["a:1,b:2", [["c", 3]]]},
        ],
        "x",
    )
    assert windows[0] == PartitionWindow(
        5.0, 20.0, (frozenset({("10.0.0.1", 7800), ("10.0.0.2", 7800)}), frozenset({("10.0.0.3", 7800)}))
    )
    assert windows[1].groups == (frozenset({("a", 1), ("b", 2)}), frozenset({("c", 3)}))
    assert windows[1].group_of(("c", 3)) == 1 and windows[1].group_of(("z", 9)) == -1


GOOD_GROUPS = [["a:1"], ["b:2"]]


@pytest.mark.parametrize(
    ("partitions", "key"),
    [
        ("0s-1s", "stack[1] (faults).partitions: expected a list"),
        ({"start": "0s"}, "stack[1] (faults).partitions: expected a list"),
        (["w"], "stack[1] (faults).partitions[0]: expected a mapping"),
        ([{"start": "0s", "end": "1s"}], "stack[1] (faults).partitions[0].groups: missing"),
        ([{"end": "1s", "groups": GOOD_GROUPS}], "stack[1] (faults).partitions[0].start: missing"),
        ([{"start": "0s", "end": "1s", "groups": GOOD_GROUPS, "who": 1}], "stack[1] (faults).partitions[0]: unknown"),
        ([{"start": "later", "end": "1s", "groups": GOOD_GROUPS}], "stack[1] (faults).partitions[0].start"),
        ([{"start": "2s", "end": "1s", "groups": GOOD_GROUPS}], "stack[1] (faults).partitions[0].end"),
        ([{"start": "0s", "end": "1s", "groups": "a:1"}], "stack[1] (faults).partitions[0].groups"),
        ([{"start": "0s", "end": "1s", "groups": [["a:1"]]}], "stack[1] (faults).partitions[0].groups: a partition"),
        ([{"start": "0s", "end": "1s", "groups": [["a:1"], []]}], "stack[1] (faults).partitions[0].groups[1]"),
        ([{"start": "0s", "end": "1s", "groups": [["a:1"], ["b"]]}], "stack[1] (faults).partitions[0].groups[1][0]"),
        ([{"start": "0s", "end": "1s", "groups": [["a:1"], ["b:0"]]}], "stack[1] (faults).partitions[0].groups[1][0]"),
        ([{"start": "0s", "end": "1s", "groups": [["a:1"], [5]]}], "stack[1] (faults).partitions[0].groups[1][0]"),
        (
            [
                {"start": "0s", "end": "1s", "groups": GOOD_GROUPS},
                {"start": "0s", "end": "1s", "groups": [["a:1"], ["a:1"]]},
            ],
            "stack[1] (faults).partitions[1].groups[1][0]: a:1 is also in groups[0]",
        ),
    ],
)
def test_bad_partitions_name_the_key(partitions, key):
    with pytest.raises(ConfigError) as err:
        LayerHarness([{"layer": "faults", "partitions": partitions}])
    assert key in str(err.value)


@pytest.mark.parametrize(
    ("params", "key"),
    [
        ({"drop_rate": 1.5}, "stack[1] (faults).drop_rate"),
        ({"drop_rate": "often"}, "stack[1] (faults).drop_rate"),
        ({"duplicate_rate": -0.5}, "stack[1] (faults).duplicate_rate"),
        ({"delay": "1 fortnight"}, "stack[1] (faults).delay"),
        ({"delay_jitter": -1}, "stack[1] (faults).delay_jitter"),
        ({"shuffle": "yes"}, "stack[1] (faults).shuffle"),
        ({"loss": 0.1}, "unknown key 'loss'"),
    ],
)
def test_bad_configuration_names_the_key(params, key):
    with pytest.raises(ConfigError) as err:
        LayerHarness([{"layer": "faults", **params}])
    assert key in str(err.value)


def test_faults_has_no_header():
    assert protocol_ids.FAULTS not in HEADER_TYPES
