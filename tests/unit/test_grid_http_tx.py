"""The transaction request bodies of the member HTTP API (``POST /v1/tx`` and the interactive endpoints):
every malformed body is refused with a message naming the field, in both body formats (msgpack: bytes keys;
JSON: base64 strings), and well-formed ones parse to what the grid node takes."""

from __future__ import annotations

import base64
import json
from typing import Any

import msgpack
import pytest
from groupcluster.grid.http.parsers import (
    MAX_TX_KEYS,
    MAX_VALUE_BYTES,
    BadBatch,
    no_duplicates,
    parse_tx,
    parse_tx_begin,
    parse_tx_lock,
    parse_tx_resolve,
    unpack_body,
)


def b64(b: bytes) -> str:
    return base64.b64encode(b).decode()


def test_a_msgpack_transaction_parses_to_reads_writes_and_mode() -> None:
    doc = {"mode": "optimistic", "reads": {b"a": 5, b"b": 0}, "writes": {b"a": b"1", b"c": None}}
    req = parse_tx(doc, binary=True)
    assert req.mode == "optimistic"
    assert req.reads == {b"a": 5, b"b": 0}
    assert req.writes == {b"a": b"1", b"c": None}
    assert req.lock == ()


def test_a_json_transaction_takes_base64_keys_and_values() -> None:
    doc = json.loads(json.dumps({"reads": {b64(b"k1"): 7}, "writes": {b64(b"k2"): b64(b"v"), b64(b"k3"): None}}))
    req = parse_tx(doc, binary=False)
    assert req.mode is None and req.reads == {b"k1": 7} and req.writes == {b"k2": b"v", b"k3": None}


def test_lock_implies_pessimistic_and_is_refused_for_optimistic() -> None:
    req = parse_tx({"lock": [b"a", b"b"], "writes": {b"a": b"x"}}, binary=True)
    assert req.mode == "pessimistic" and req.lock == (b"a", b"b")
    with pytest.raises(BadBatch, match=r"^lock: an optimistic transaction"):
        parse_tx({"mode": "optimistic", "lock": [b"a"], "writes": {b"a": b"x"}}, binary=True)


BAD_BODIES: list[tuple[Any, bool, str]] = [
    ([], True, r"^body: expected a map"),
    ({"writes": {b"a": b"1"}, "ops": []}, True, r"^body: unknown field\(s\) ops"),
    ({"mode": "eager", "writes": {b"a": b"1"}}, True, r"^mode: expected 'optimistic' or 'pessimistic', got 'eager'"),
    ({"mode": 1, "writes": {b"a": b"1"}}, True, r"^mode: expected"),
    ({}, True, r"^body: an empty transaction"),
    ({"writes": {}, "reads": {}}, True, r"^body: an empty transaction"),
    ({"writes": [[b"a", b"1"]]}, True, r"^writes: expected a map \{key: value or null\}, got list"),
    ({"reads": [b"a"]}, True, r"^reads: expected a map \{key: version\}, got list"),
    ({"reads": {b"a": "5"}}, True, r"^reads\[b'a'\]: expected a version"),
    ({"reads": {b"a": -1}}, True, r"^reads\[b'a'\]: expected a version"),
    ({"reads": {b"a": 1 << 63}}, True, r"^reads\[b'a'\]: expected a version"),
    ({"reads": {b"a": True}}, True, r"^reads\[b'a'\]: expected a version"),
    ({"reads": {"a": 1}}, True, r"^reads\['a'\] \(key\): expected bytes \(msgpack bin\), got str"),
    ({"reads": {b"": 1}}, True, r"^reads\[b''\] \(key\): 0 bytes is outside"),
    ({"writes": {b"a": "text"}}, True, r"^writes\[b'a'\] \(value\): expected bytes \(msgpack bin\), got str"),
    ({"writes": {b"a": 5}}, True, r"^writes\[b'a'\] \(value\): expected bytes"),
    ({"writes": {b"a": b"x" * (MAX_VALUE_BYTES + 1)}}, True, r"^writes\[b'a'\] \(value\): \d+ bytes exceed the limit"),
    ({"writes": {"!!": b64(b"v")}}, False, r"^writes\['!!'\] \(key\): not valid base64"),
    ({"writes": {b64(b"k"): "%%"}}, False, r"^writes\['aw=='\] \(value\): not valid base64"),
    # Two spellings of one key in base64 (the padding bits differ): one key given twice.
    ({"writes": {"YQ==": None, "YR==": None}}, False, r"^writes\['YR=='\]: the key is given twice"),
    ({"lock": "a", "writes": {b"a": b"1"}}, True, r"^lock: expected a list of keys, got str"),
    ({"lock": [b"a", b"a"]}, True, r"^lock\[1\]: the key is given twice"),
    ({"lock": [5]}, True, r"^lock\[0\]: expected bytes"),
    ({"writes": {bytes([i % 256, i // 256]): None for i in range(MAX_TX_KEYS + 1)}}, True, r"^writes: 4097 keys"),
]


@pytest.mark.parametrize(("doc", "binary", "message"), BAD_BODIES)
def test_malformed_transactions_name_the_field(doc: Any, binary: bool, message: str) -> None:
    with pytest.raises(BadBatch, match=message):
        parse_tx(doc, binary)


def test_too_many_distinct_keys_across_reads_and_writes() -> None:
    reads = {b"r%d" % i: 0 for i in range(MAX_TX_KEYS // 2 + 1)}
    writes = {b"w%d" % i: None for i in range(MAX_TX_KEYS // 2 + 1)}
    with pytest.raises(BadBatch, match=r"^body: the transaction names more than 4096 distinct keys"):
        parse_tx({"reads": reads, "writes": writes}, binary=True)


def test_an_interactive_commit_takes_no_mode_or_lock_and_may_be_empty() -> None:
    assert parse_tx({}, binary=True, interactive=True).writes == {}
    with pytest.raises(BadBatch, match=r"^body: unknown field\(s\) lock, mode"):
        parse_tx({"mode": "pessimistic", "lock": [b"a"]}, binary=True, interactive=True)


def test_begin_lock_and_resolve_bodies() -> None:
    assert parse_tx_begin(None) is None
    assert parse_tx_begin({"mode": "pessimistic"}) == "pessimistic"
    with pytest.raises(BadBatch, match=r"^mode: expected"):
        parse_tx_begin({"mode": "PESSIMISTIC"})
    with pytest.raises(BadBatch, match=r"^body: unknown field\(s\) keys"):
        parse_tx_begin({"keys": []})
    assert parse_tx_lock({"keys": [b"a", b"b"]}, binary=True) == (b"a", b"b")
    assert parse_tx_lock({"keys": [b64(b"a")]}, binary=False) == (b"a",)
    with pytest.raises(BadBatch, match=r"^keys: missing"):
        parse_tx_lock({}, binary=True)
    with pytest.raises(BadBatch, match=r"^keys: empty"):
        parse_tx_lock({"keys": []}, binary=True)
    with pytest.raises(BadBatch, match=r"^body: expected a map \{\"keys\""):
        parse_tx_lock([b"a"], binary=True)
    assert parse_tx_resolve({"commit": True}, True) == (True, {}, False)
    assert parse_tx_resolve({"commit": False}, True) == (False, {}, False)
    assert parse_tx_resolve({"commit": True, "versions": {b"k": 1 << 40}}, True) == (True, {b"k": 1 << 40}, False)
    assert parse_tx_resolve({"commit": True, "versions": {b64(b"k"): 9}}, False) == (True, {b"k": 9}, False)
    # cluster-wide: commit may be null (the grid's rule decides), versions are collected by the member
    assert parse_tx_resolve({"cluster": True, "commit": None}, True) == (None, {}, True)
    assert parse_tx_resolve({"cluster": True}, True) == (None, {}, True)
    assert parse_tx_resolve({"cluster": True, "commit": False}, True) == (False, {}, True)
    with pytest.raises(BadBatch, match=r"^cluster: expected true"):
        parse_tx_resolve({"cluster": 1, "commit": True}, True)
    with pytest.raises(BadBatch, match=r"^versions: not with cluster"):
        parse_tx_resolve({"cluster": True, "commit": True, "versions": {}}, True)
    with pytest.raises(BadBatch, match=r"^commit: expected true \(commit\) or false \(roll back\), or null with"):
        parse_tx_resolve({"cluster": True, "commit": "yes"}, True)
    for bad in ({}, {"commit": 1}, {"commit": "yes"}, {"commit": None}):
        with pytest.raises(BadBatch, match=r"^commit: expected true \(commit\) or false \(roll back\)"):
            parse_tx_resolve(bad, True)
    with pytest.raises(BadBatch, match=r"^versions\[b'k'\]: expected a version \(an integer 1 to"):
        parse_tx_resolve({"commit": True, "versions": {b"k": 0}}, True)
    with pytest.raises(BadBatch, match=r"^body: unknown field\(s\) tx"):
        parse_tx_resolve({"commit": True, "tx": "x"}, True)


def test_a_map_key_given_twice_is_refused_by_both_decoders() -> None:
    # Plain decoders keep the last of two equal map keys; a transaction would silently lose a write.
    raw_json = b'{"writes": {"YQ==": null, "YQ==": "Yg=="}}'
    with pytest.raises(ValueError, match=r"the map key 'YQ==' is given twice"):
        json.loads(raw_json, object_pairs_hook=no_duplicates)
    # msgpack: a map with two equal keys, built by hand (a dict cannot hold it).
    raw = b"\x81\xa6writes\x82\xc4\x01a\xc0\xc4\x01a\xc4\x01b"
    with pytest.raises(ValueError, match=r"the map key b'a' is given twice"):
        unpack_body(raw, no_duplicates)
    assert unpack_body(msgpack.packb({"writes": {b"a": None}}), no_duplicates) == {"writes": {b"a": None}}
