"""Persistence of grid entries (docs/grid.md, "Persistence"): the SQLite copy of a member's store, and what a
node does with entries it brings back from it.

The SQLite part runs on real files (tmp_path). The node part runs in-memory nodes on test_grid_node's fake
network: members that form a new grid together merge their stored entries (newest version wins, tombstones
count) and number their topologies above every stored one, so a new write beats any stored value; a member
that joins a running grid discards its stored entries, so a key deleted meanwhile does not come back.
"""

from __future__ import annotations

import dataclasses
import random
import sqlite3
from pathlib import Path

import pytest
from groupcluster.core.errors import ConfigError
from groupcluster.grid.node import GridConfig, GridNode
from groupcluster.grid.persist import PersistentStore, SqliteBacking
from groupcluster.grid.store import make_version, version_topology

from .test_grid_node import CONFIG, FakeNet, member


def _rows(path: Path) -> dict[bytes, tuple[int, int, bytes | None]]:
    with sqlite3.connect(path) as db:
        return {bytes(k): (s, v, None if x is None else bytes(x)) for k, s, v, x in db.execute("SELECT * FROM entries")}


def test_store_record_reaches_sqlite_newest_version_winning(tmp_path: Path) -> None:
    path = tmp_path / "m.sqlite"
    backing = SqliteBacking(str(path))
    store = PersistentStore(8, 100, 1 << 20)
    store.keep_tombstones = True
    v1, v2, v3 = make_version(3, 1), make_version(3, 2), make_version(4, 1)
    store.write(1, b"a", v2, b"new")
    store.write(1, b"a", v1, b"old")  # older: not applied, not recorded
    store.write(2, b"b", v1, b"x")
    store.write(2, b"b", v3, None)  # a delete: a tombstone in the file
    keys = [b"c%d" % i for i in range(40)]
    store.apply_chunk(3, keys, [v1] * 40, [b"y"] * 40)
    backing.apply(store.take_ops(), 4)
    rows = _rows(path)
    assert rows[b"a"] == (1, v2, b"new") and rows[b"b"] == (2, v3, None)
    assert all(rows[k] == (3, v1, b"y") for k in keys)
    # A chunk re-sent with older versions changes nothing in SQL either; a drop deletes the segment's rows.
    store.apply_chunk(1, [b"a", *keys[:20]], [v1] * 21, [b"stale"] * 21)
    store.remove_segment(3)
    store.write(3, b"c0", v3, b"after-drop")  # recorded after the drop: it stays
    backing.apply(store.take_ops(), 4)
    rows = _rows(path)
    assert rows[b"a"] == (1, v2, b"new")
    assert {k for k in rows if k.startswith(b"c")} == {b"c0"} and rows[b"c0"][2] == b"after-drop"
    assert backing.topology_id == 4
    backing.close()
    # Reopened: the entries and the highest topology id come back.
    again = SqliteBacking(str(path))
    assert again.topology_id == 4
    assert sorted(again.load()) == sorted([(b"a", v2, b"new"), (b"b", v3, None), (b"c0", v3, b"after-drop")])
    # A restore sets the rows aside until its pushes are acknowledged: a restart meanwhile loads them again.
    kept = sorted(again.load())
    store.stash_backing()
    store.write(5, b"z", v3, b"new-grid")
    again.apply(store.take_ops(), 4)
    assert again.count() == 1 and sorted(again.load()) == sorted([*kept, (b"z", v3, b"new-grid")])
    store.drop_stash()
    again.apply(store.take_ops(), 4)
    assert again.load() == [(b"z", v3, b"new-grid")]
    store.stash_backing()
    store.reset_backing()  # joined a running grid: both tables go
    again.apply(store.take_ops(), 4)
    assert again.load() == []
    again.close()


def test_bad_paths_and_config_get_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="does not exist"):
        SqliteBacking(str(tmp_path / "no-such-dir" / "m.sqlite"))
    junk = tmp_path / "junk"
    junk.write_bytes(b"not a database at all" * 100)
    with pytest.raises(ValueError, match="not a usable SQLite file"):
        SqliteBacking(str(junk))
    with pytest.raises(ConfigError, match="persistence_path"):
        GridConfig.from_dict({"persistence": "write_through"})


def _restored_net(seed: int, stores: list[list[tuple[bytes, int, bytes | None]]], floor: int) -> FakeNet:
    net = FakeNet(random.Random(seed), dataclasses.replace(CONFIG, initial_cluster_size=len(stores)))
    for entries in stores:
        a = member(net.next_id)
        net.next_id += 1
        node = net.nodes[a] = GridNode(a, net.config)
        node.restore(entries, floor)
    net.install_view(list(net.nodes))
    return net


def _read(net: FakeNet, key: bytes) -> tuple[int, bytes | None] | None:
    """The entry every owner of ``key`` holds (they must agree)."""
    t = net.coordinator.topology
    assert t is not None
    seg = t.segment_of(key)
    seen = {net.nodes[m].store.get(seg, key) for m in t.current.owners_of(seg)}  # type: ignore[union-attr]
    assert len(seen) == 1, (key, seen)
    return seen.pop()


def test_members_forming_a_new_grid_merge_their_stores_and_number_topologies_above_them() -> None:
    old, mid, new = make_version(5, 1), make_version(6, 9), make_version(7, 3)
    stores = [
        [(b"k1", old, b"a-old"), (b"k2", new, b"a-new"), (b"gone", old, b"alive-once")],
        [(b"k1", mid, b"b-mid"), (b"k2", old, b"b-old"), (b"gone", mid, None)],  # a tombstone counts
        [(b"k3", old, b"c-only")],
    ]
    net = _restored_net(21, stores, 7)
    net.run_until(4.0)
    assert net.stable()
    t = net.coordinator.topology
    assert t is not None and t.topology_id > 7
    assert all(n.restore_outcome == "merged" for n in net.nodes.values())
    assert not any(n._restore_wids for n in net.nodes.values())  # every push acknowledged: the stash goes
    assert _read(net, b"k1") == (mid, b"b-mid")
    assert _read(net, b"k2") == (new, b"a-new")
    assert _read(net, b"k3") == (old, b"c-only")
    assert _read(net, b"gone") in (None, (mid, None))  # a tombstone or nothing: never the old value
    # A write in the new grid wins over every stored version.
    a = net.view[0]
    net.nodes[a].put(b"k2", b"fresh", net.now)
    net.collect(a)
    net.run_until(5.0)
    assert net.results[a][-1].ok
    ver, val = _read(net, b"k2")  # type: ignore[misc]
    assert val == b"fresh" and version_topology(ver) > 7


def test_member_joining_a_running_grid_discards_its_store() -> None:
    net = FakeNet(random.Random(22), dataclasses.replace(CONFIG, initial_cluster_size=2))
    a, b = net.add(2)
    net.run_until(2.0)
    net.nodes[a].put(b"key", b"v1", net.now)
    net.collect(a)
    net.run_until(3.0)
    net.nodes[a].delete(b"key", net.now)  # deleted while the third member was down
    net.collect(a)
    net.run_until(4.0)
    assert all(r.ok for r in net.results[a])
    c = member(net.next_id)
    net.next_id += 1
    node = net.nodes[c] = GridNode(c, net.config)
    node.restore([(b"key", make_version(1, 1), b"stale"), (b"other", make_version(1, 2), b"stale too")], 1)
    net.install_view([a, b, c])
    net.run_until(8.0)
    assert net.stable() and node.restore_outcome == "discarded"
    assert node.metrics["grid.restored_entries_discarded"] == 2
    for m in (a, b, c):  # no live copy of either key anywhere (items() lists live entries only)
        assert not [k for _, k, _, _ in net.nodes[m].store.items() if k in (b"key", b"other")]  # type: ignore[union-attr]
    got = _read(net, b"key")
    assert got is None or got[1] is None
    assert _read(net, b"other") is None


def test_status_carries_the_store_floor_only_when_set() -> None:
    from groupcluster.core.errors import WireError
    from groupcluster.grid.topology import MemberStatus

    plain = MemberStatus(1.0, False, None)
    assert len(plain.to_wire()) == 3 and MemberStatus.from_wire(plain.to_wire()) == plain
    floored = MemberStatus(1.0, False, None, 9)
    assert MemberStatus.from_wire(floored.to_wire()) == floored
    with pytest.raises(WireError, match=r"status\.floor"):
        MemberStatus.from_wire([1.0, False, None, -1])
    with pytest.raises(WireError, match="status"):
        MemberStatus.from_wire([1.0, False, None, 9, 9])
