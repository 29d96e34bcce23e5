"""The ``max_entries`` bound of a grid member (docs/grid.md, "A bound on entries"): as a key's primary, a member
that holds the bound refuses a PUT that would add a key, with reason ``full`` and nothing written anywhere;
overwrites and deletes go on, and a delete makes room. In-memory nodes on the fake network of gridnet.py."""

from __future__ import annotations

import dataclasses
import random

import pytest
from groupcluster.core.errors import ConfigError
from groupcluster.grid.node import GridConfig

from .gridnet import CONFIG, FakeNet, TxNet, do_op, held


def _grid(max_entries: int, members: int = 1) -> FakeNet:
    config = dataclasses.replace(CONFIG, max_entries=max_entries, num_owners=min(2, members))
    net = FakeNet(random.Random(5), config)
    net.add(members)
    net.run_until(3.0)
    assert net.stable()
    return net


def test_a_full_member_refuses_new_keys_and_keeps_overwrites_and_deletes() -> None:
    net = _grid(5)
    for i in range(5):
        assert do_op(net, "put", b"k%d" % i).ok
    refused = do_op(net, "put", b"new")
    assert not refused.ok and refused.reason == "full"
    assert refused.error.startswith("full: member ") and "holds 5 entries, its max_entries is 5" in refused.error
    assert held(net, b"new") == [None]
    node = net.nodes[net.view[0]]
    assert node.metrics["grid.writes_refused_full"] == 1
    assert node.status()["store"]["max_entries"] == 5
    assert do_op(net, "put", b"k0", b"overwritten").ok  # a key held already may be written again
    assert held(net, b"k0") == [b"overwritten"]
    assert do_op(net, "delete", b"k1").ok  # a delete makes room (its tombstone is not a live entry)
    assert do_op(net, "put", b"new").ok
    assert not do_op(net, "put", b"another").ok


def test_puts_of_one_step_count_against_the_bound_together() -> None:
    """Ten new keys started in one step, room for three: the store is counted once per step, and each key
    added in the step counts on, so exactly three are written."""
    net = _grid(3)
    a = net.view[0]
    node = net.nodes[a]
    ids = [node.put(b"batch%d" % i, b"v", net.now) for i in range(10)]
    net.collect(a)
    net.run_until(net.now + 1.0)
    results = {r.op_id: r for r in net.results[a] if r.op_id in ids}
    assert sorted(r.ok for r in results.values()) == [False] * 7 + [True] * 3
    assert all(r.reason == "full" for r in results.values() if not r.ok)
    assert len(node.store) == 3  # type: ignore[arg-type]


def test_the_bound_is_the_primarys_and_backups_never_refuse() -> None:
    """Two members, two owners: each holds every key. The primary of a key decides; the backup applies what
    its primary accepted, so the copies stay equal and neither member goes above the bound by a client PUT."""
    net = _grid(8, members=2)
    written = [b"key%d" % i for i in range(40) if do_op(net, "put", b"key%d" % i).ok]
    assert len(written) == 8
    for key in (b"key%d" % i for i in range(40)):
        copies = held(net, key)
        assert copies[0] == copies[1], key
    assert all(len(net.nodes[a].store) == 8 for a in net.view)  # type: ignore[arg-type]


def test_no_bound_by_default_and_a_negative_one_is_refused() -> None:
    assert GridConfig.from_dict({}).max_entries == 0
    with pytest.raises(ConfigError, match="max_entries"):
        GridConfig.from_dict({"max_entries": -1})


def test_a_transaction_that_would_add_keys_to_a_full_primary_rolls_back_with_reason_full() -> None:
    """Transactions honour the bound as plain PUTs do: the primary of a key the transaction would add votes no
    at prepare (nothing written anywhere); a transaction that only overwrites keys held commits."""
    net = TxNet(7)
    net.config = dataclasses.replace(net.config, max_entries=4, num_owners=1)
    (a,) = net.add(1)
    net.run_until(3.0)
    assert net.stable()
    for i in range(4):
        assert net.put(a, b"k%d" % i, b"v").ok
    tx = net.call(a, "tx_begin")
    res = net.wait(a, net.call(a, "tx_commit", tx, {b"k0": b"new", b"extra": b"v"}, {}))
    assert not res.ok and res.reason == "full", res
    assert "holds 4 entries, its max_entries is 4; the transaction would add 1" in res.error
    assert net.get(a, b"k0").value == b"v" and net.get(a, b"extra").value is None  # all or nothing
    assert net.nodes[a].metrics["grid.tx_refused_full"] == 1
    tx = net.call(a, "tx_begin")
    assert net.wait(a, net.call(a, "tx_commit", tx, {b"k0": b"new", b"k1": None}, {})).ok  # overwrite, delete
    assert net.get(a, b"k0").value == b"new"
