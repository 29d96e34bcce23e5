"""The ``max_bytes`` bound of a grid member (docs/grid.md, "A bound on entries"): as a key's primary, a member
refuses a PUT that would grow its live key and value bytes past the bound, with reason ``full`` and nothing
written anywhere; deletes and overwrites that do not grow go on. In-memory nodes on the fake network
of gridnet.py."""

from __future__ import annotations

import dataclasses
import random

import pytest
from groupcluster.core.errors import ConfigError
from groupcluster.grid.node import GridConfig

from .gridnet import CONFIG, FakeNet, TxNet, do_op, held


def _grid(max_bytes: int, members: int = 1, max_entries: int = 0) -> FakeNet:
    config = dataclasses.replace(CONFIG, max_bytes=max_bytes, max_entries=max_entries, num_owners=min(2, members))
    net = FakeNet(random.Random(5), config)
    net.add(members)
    net.run_until(3.0)
    assert net.stable()
    return net


def test_a_member_refuses_what_would_grow_it_past_max_bytes() -> None:
    net = _grid(100)
    node = net.nodes[net.view[0]]
    assert do_op(net, "put", b"k1", b"x" * 40).ok  # 42 bytes
    assert do_op(net, "put", b"k2", b"x" * 40).ok  # 84
    refused = do_op(net, "put", b"k3", b"x" * 20)  # would be 106
    assert not refused.ok and refused.reason == "full", refused
    assert "holds 84 bytes of keys and values, its max_bytes is 100; nothing was written" in refused.error
    assert held(net, b"k3") == [None]
    assert do_op(net, "put", b"k3", b"x" * 14).ok  # exactly 100
    assert node.store.nbytes == 100  # type: ignore[union-attr]
    grown = do_op(net, "put", b"k1", b"x" * 41)  # an overwrite that grows by one byte
    assert not grown.ok and grown.reason == "full" and held(net, b"k1") == [b"x" * 40]
    assert do_op(net, "put", b"k1", b"y" * 40).ok  # same size: goes through
    assert do_op(net, "put", b"k1", b"y" * 10).ok  # shrinks: goes through, and makes room
    assert do_op(net, "put", b"k4", b"z" * 28).ok  # the 30 bytes freed
    assert do_op(net, "delete", b"k2").ok  # deletes always go through
    assert node.store.nbytes == node.store.count_bytes() == 58  # type: ignore[union-attr]
    assert node.metrics["grid.writes_refused_full"] == 2
    st = node.status()["store"]
    assert st["max_bytes"] == 100 and st["bytes"] == 58


def test_both_bounds_and_the_error_names_the_one_met() -> None:
    net = _grid(1000, max_entries=2)
    assert do_op(net, "put", b"a", b"1").ok and do_op(net, "put", b"b", b"2").ok
    refused = do_op(net, "put", b"c", b"3")
    assert not refused.ok and "holds 2 entries, its max_entries is 2" in refused.error
    refused = do_op(net, "put", b"a", b"x" * 2000)
    assert not refused.ok and "its max_bytes is 1000" in refused.error


def test_puts_of_one_step_count_their_bytes_together() -> None:
    """Ten PUTs of 10 bytes each started in one step, room for 35 bytes: three are written."""
    net = _grid(35)
    a = net.view[0]
    node = net.nodes[a]
    ids = [node.put(b"b%d" % i, b"v" * 8, net.now) for i in range(10)]
    net.collect(a)
    net.run_until(net.now + 1.0)
    results = {r.op_id: r for r in net.results[a] if r.op_id in ids}
    assert sorted(r.ok for r in results.values()) == [False] * 7 + [True] * 3
    assert node.store.nbytes == 30  # type: ignore[union-attr]


def test_backups_follow_their_primary_and_copies_stay_equal() -> None:
    net = _grid(300, members=2)
    written = [k for k in (b"key%02d" % i for i in range(40)) if do_op(net, "put", k, b"v" * 20).ok]
    assert 0 < len(written) < 40
    for i in range(40):
        copies = held(net, b"key%02d" % i)
        assert copies[0] == copies[1]
    for a in net.view:
        store = net.nodes[a].store
        assert store is not None and store.nbytes == store.count_bytes() <= 300


def test_no_bound_by_default_sizes_parse_and_a_negative_one_is_refused() -> None:
    assert GridConfig.from_dict({}).max_bytes == 0
    assert GridConfig.from_dict({"max_bytes": "64MiB"}).max_bytes == 64 * 1024 * 1024
    with pytest.raises(ConfigError, match="max_bytes"):
        GridConfig.from_dict({"max_bytes": -1})


def test_a_transaction_that_would_grow_a_primary_past_max_bytes_rolls_back() -> None:
    net = TxNet(7)
    net.config = dataclasses.replace(net.config, max_bytes=50, num_owners=1)
    (a,) = net.add(1)
    net.run_until(3.0)
    assert net.stable()
    assert net.put(a, b"k0", b"v" * 38).ok  # 40 bytes
    tx = net.call(a, "tx_begin")
    res = net.wait(a, net.call(a, "tx_commit", tx, {b"k0": b"w" * 38, b"k1": b"v" * 10}, {}))
    assert not res.ok and res.reason == "full", res
    assert "holds 40 bytes of keys and values, its max_bytes is 50; the transaction would add 12 bytes" in res.error
    assert net.get(a, b"k0").value == b"v" * 38 and net.get(a, b"k1").value is None
    tx = net.call(a, "tx_begin")
    assert net.wait(a, net.call(a, "tx_commit", tx, {b"k0": b"w" * 30, b"k1": b"v" * 6}, {})).ok  # 40 -> 40
