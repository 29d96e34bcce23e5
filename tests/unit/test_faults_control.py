"""The faults control file (``groupcluster member --faults-control``): parsing, clear errors, polling.

The poller is driven by hand here (``poll()``, no event loop) with a fake ``control`` that records the
events it is given: what matters is which file contents become which ``SetFaults`` events, and that bad
contents are refused with a reason and change nothing. The real member applying a file is in
``tests/integration/test_faults_control.py``; chaos cutting members off with it in ``test_chaos.py``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from groupcluster.core.errors import ConfigError
from groupcluster.protocols.faults import PartitionWindow, SetFaults
from groupcluster.runtime.faults_control import (
    HEAL_DOCUMENT,
    MAX_CONTROL_BYTES,
    FaultsControl,
    parse_control,
    partition_document,
    with_faults_layer,
    write_control,
)
from groupcluster.stacks import FIFO

A, B, C = "127.0.0.1:7801", "127.0.0.1:7802", "127.0.0.1:7803"


def test_a_partition_document_becomes_windows_with_parsed_endpoints() -> None:
    ev = parse_control(json.dumps(partition_document([[A], [B, C]], 12.5)))
    assert ev.partitions == (
        PartitionWindow(
            0.0, 12.5, (frozenset({("127.0.0.1", 7801)}), frozenset({("127.0.0.1", 7802), ("127.0.0.1", 7803)}))
        ),
    )
    # Everything else unchanged: None leaves the layer's setting as it is.
    assert (ev.drop_rate, ev.duplicate_rate, ev.delay, ev.delay_jitter, ev.shuffle) == (None,) * 5


def test_heal_and_other_settings() -> None:
    assert parse_control(json.dumps(HEAL_DOCUMENT)) == SetFaults(partitions=())
    ev = parse_control('{"drop_rate": 0.25, "duplicate_rate": 0, "delay": "20ms", "delay_jitter": 1, "shuffle": true}')
    assert ev == SetFaults(drop_rate=0.25, duplicate_rate=0.0, delay=0.02, delay_jitter=1.0, shuffle=True)
    assert parse_control('{"partitions": null, "shuffle": null}') == SetFaults()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"partitions": [', "m1.json: not JSON: Expecting value (line 1, column 17)"),
        ("", "m1.json: not JSON: Expecting value (line 1, column 1)"),
        ("[1, 2]", "m1.json: expected a JSON object with any of the keys drop_rate, duplicate_rate"),
        ('"cut"', "m1.json: expected a JSON object"),
        ('{"partition": []}', "m1.json: unknown key(s) partition; allowed keys: drop_rate, duplicate_rate, delay"),
        ('{"drop_rate": 2}', "m1.json.drop_rate: 2 is not a probability between 0 and 1"),
        ('{"duplicate_rate": true}', "m1.json.duplicate_rate: true is not a probability"),
        ('{"delay": "soon"}', "m1.json.delay: expected a duration such as '3s'"),
        ('{"shuffle": "yes"}', "m1.json.shuffle: expected true or false, got 'yes'"),
        # Bad endpoints are named by their place in the document.
        (
            json.dumps(partition_document([[A], [B, "127.0.0.1"]], 5)),
            "m1.json.partitions[0].groups[1][1]: '127.0.0.1' is not host:port",
        ),
        (
            json.dumps(partition_document([[A], ["127.0.0.1:99999"]], 5)),
            "m1.json.partitions[0].groups[1][0]: port 99999 is out of range 1-65535",
        ),
        (
            json.dumps(partition_document([[A], [A]], 5)),
            "m1.json.partitions[0].groups[1][0]: 127.0.0.1:7801 is also in groups[0]",
        ),
        (
            json.dumps(partition_document([[A, B]], 5)),
            "m1.json.partitions[0].groups: a partition needs at least 2 groups",
        ),
        ('{"partitions": {"start": 0}}', "m1.json.partitions: expected a list of windows"),
        (
            '{"partitions": [{"start": 5, "end": 1, "groups": [["127.0.0.1:1"], ["127.0.0.1:2"]]}]}',
            "m1.json.partitions[0].end: 1 must be later than start 5",
        ),
    ],
)
def test_bad_content_is_a_clear_error_naming_the_place(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_control(text, "m1.json")
    assert message in str(err.value)


class Recorder:
    def __init__(self) -> None:
        self.events: list[SetFaults] = []

    def __call__(self, event: SetFaults) -> None:
        self.events.append(event)


def test_poller_applies_each_new_content_once_and_ignores_bad_ones(tmp_path: Path) -> None:
    path = tmp_path / "m1.faults.json"
    got = Recorder()
    fc = FaultsControl(path, got)
    assert not fc.poll(), "a missing file applies nothing"
    write_control(path, partition_document([[A], [B]], 30))
    assert fc.poll()
    assert not fc.poll(), "an unchanged file is applied once"
    assert len(got.events) == 1 and got.events[0].partitions
    # A bad content: refused with the reason, nothing applied, logged once (not on every poll).
    path.write_text('{"partitions": [["127.0.0.1:1"]]}')
    assert not fc.poll()
    assert not fc.poll()
    assert fc.rejected == 1 and fc.last_error is not None
    assert f"faults control {path}.partitions[0]: expected a mapping" in fc.last_error
    assert len(got.events) == 1
    # Fixed: applied, and the error is cleared.
    write_control(path, HEAL_DOCUMENT)
    assert fc.poll()
    assert got.events[-1] == SetFaults(partitions=())
    assert fc.status() == {"path": str(path), "applied": 2, "rejected": 1, "last_error": None}
    # Deleting the file undoes nothing.
    os.unlink(path)
    assert not fc.poll()
    assert len(got.events) == 2


def test_poller_refuses_oversized_and_undecodable_files(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    fc = FaultsControl(path, Recorder())
    path.write_bytes(b" " * (MAX_CONTROL_BYTES + 1))
    assert not fc.poll()
    assert fc.last_error is not None and "more than a control file may hold" in fc.last_error
    path.write_bytes(b'{"shuffle": "\xff"}')
    assert not fc.poll()
    assert fc.rejected == 2 and "utf-8" in (fc.last_error or "")


def test_faults_layer_goes_directly_above_the_transport_once() -> None:
    spec = with_faults_layer([dict(e) for e in FIFO])
    assert [e["layer"] for e in spec[:3]] == ["transport", "faults", "discovery"]
    assert with_faults_layer(spec) == spec
    with pytest.raises(ConfigError, match="no transport layer"):
        with_faults_layer([{"layer": "gms"}])
