"""Persistence of grid entries (docs/grid.md, "Persistence"): the SQLite copy of a member's store, and what a
node does with entries it brings back from it.

The SQLite part runs on real files (tmp_path). The node part runs in-memory nodes on gridnet.py's fake
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

from .gridnet import CONFIG, FakeNet, member


def _rows(path: Path) -> dict[bytes, tuple[int, int, bytes | None]]:
    with sqlite3.connect(path) as db:
        rows = db.execute("SELECT key, seg, version, value FROM entries")
        return {bytes(k): (s, v, None if x is None else bytes(x)) for k, s, v, x in rows}


def _expiries(path: Path) -> dict[bytes, float | None]:
    with sqlite3.connect(path) as db:
        return {bytes(k): e for k, e in db.execute("SELECT key, expires FROM entries")}


def _fresh(tmp_path: Path) -> tuple[Path, SqliteBacking, PersistentStore]:
    """A new SQLite file and a store that keeps tombstones, as a grid node's does."""
    path = tmp_path / "m.sqlite"
    store = PersistentStore(8, 100, 1 << 20)
    store.keep_tombstones = True
    return path, SqliteBacking(str(path)), store


def test_store_record_reaches_sqlite_newest_version_winning(tmp_path: Path) -> None:
    path, backing, store = _fresh(tmp_path)
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
    assert sorted(again.load()[0]) == sorted([(b"a", v2, b"new"), (b"b", v3, None), (b"c0", v3, b"after-drop")])
    # A restore sets the rows aside until its pushes are acknowledged: a restart meanwhile loads them again.
    kept = sorted(again.load()[0])
    store.stash_backing()
    store.write(5, b"z", v3, b"new-grid")
    again.apply(store.take_ops(), 4)
    assert again.count() == 1 and sorted(again.load()[0]) == sorted([*kept, (b"z", v3, b"new-grid")])
    store.drop_stash()
    again.apply(store.take_ops(), 4)
    assert again.load() == ([(b"z", v3, b"new-grid")], {})
    store.stash_backing()
    store.reset_backing()  # joined a running grid: both tables go
    again.apply(store.take_ops(), 4)
    assert again.load() == ([], {})
    again.close()


def test_expiries_reach_sqlite_for_the_version_each_row_holds(tmp_path: Path) -> None:
    path, backing, store = _fresh(tmp_path)
    v1, v2, v3 = make_version(3, 1), make_version(3, 2), make_version(4, 1)
    store.write(1, b"a", v1, b"x")
    store.set_expiry(1, b"a", v1, 100.0)
    store.write(1, b"b", v1, b"x")
    store.set_expiry(1, b"b", v1, 100.0)
    store.write(1, b"b", v2, b"again")  # rewritten in the same step without a lifespan: never expires
    store.write(1, b"c", v1, b"x")
    store.set_expiry(1, b"c", v1, 100.0)
    store.write(1, b"c", v2, None)  # deleted: a tombstone keeps no expiry
    store.write(1, b"d", v1, b"x")
    store.set_expiry(1, b"d", v1, 300.0)
    store.set_expiry(1, b"d", v1, 300.0)  # recorded twice (a backup bringing what we hold): one row
    keys = [b"e%d" % i for i in range(10)]
    store.apply_chunk(2, keys, [v1] * 10, [b"y"] * 10)
    store.set_expiries(2, keys, [v1] * 10, [200.0 + i if i % 2 else 0.0 for i in range(10)])
    backing.apply(store.take_ops(), 4)
    assert _expiries(path) == {
        b"a": 100.0,
        b"b": None,
        b"c": None,
        b"d": 300.0,
        **{k: 200.0 + i if i % 2 else None for i, k in enumerate(keys)},
    }
    # A later step: an expiry for a version the row no longer holds changes nothing; a new version clears it.
    store.set_expiry(1, b"b", v1, 999.0)
    store.write(1, b"d", v3, b"newer")
    backing.apply(store.take_ops(), 4)
    exp = _expiries(path)
    assert exp[b"b"] is None and exp[b"d"] is None and exp[b"a"] == 100.0
    # Reopened: the expiries come back with the entries, by (key, version), and a stash keeps them.
    backing.close()
    again = SqliteBacking(str(path))
    entries, expiries = again.load()
    assert expiries == {(b"a", v1): 100.0, **{(k, v1): 200.0 + i for i, k in enumerate(keys) if i % 2}}
    store.stash_backing()
    store.write(1, b"a", v3, b"new-grid")
    again.apply(store.take_ops(), 4)
    entries2, expiries2 = again.load()
    assert sorted(entries2) == sorted([*entries, (b"a", v3, b"new-grid")]) and expiries2 == expiries
    again.close()


def test_a_file_from_before_expiries_gets_their_column(tmp_path: Path) -> None:
    """A file written by a member of an earlier release (no ``expires`` column) opens, loads its entries as never
    expiring, and records expiries from then on."""
    path = tmp_path / "old.sqlite"
    v1 = make_version(2, 1)
    with sqlite3.connect(path) as db:
        db.executescript(
            "CREATE TABLE entries (key BLOB PRIMARY KEY, seg INTEGER NOT NULL, version INTEGER NOT NULL, value BLOB)"
            " WITHOUT ROWID;"
            "CREATE TABLE meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL);"
            "CREATE TABLE restored (key BLOB NOT NULL, version INTEGER NOT NULL, value BLOB);"
        )
        db.execute("INSERT INTO entries VALUES (?, 1, ?, ?)", (b"old", v1, b"kept"))
        db.execute("INSERT INTO restored VALUES (?, ?, ?)", (b"set-aside", v1, b"too"))
        db.execute("INSERT INTO meta VALUES ('topology_id', 2)")
    backing = SqliteBacking(str(path))
    assert backing.topology_id == 2
    assert backing.load() == ([(b"old", v1, b"kept"), (b"set-aside", v1, b"too")], {})
    store = PersistentStore(8, 100, 1 << 20)
    store.write(1, b"new", v1, b"x")
    store.set_expiry(1, b"new", v1, 50.0)
    backing.apply(store.take_ops(), 2)
    assert backing.load()[1] == {(b"new", v1): 50.0}
    backing.close()


def test_bad_paths_and_config_get_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="does not exist"):
        SqliteBacking(str(tmp_path / "no-such-dir" / "m.sqlite"))
    junk = tmp_path / "junk"
    junk.write_bytes(b"not a database at all" * 100)
    with pytest.raises(ValueError, match="not a usable SQLite file"):
        SqliteBacking(str(junk))
    with pytest.raises(ConfigError, match="persistence_path"):
        GridConfig.from_dict({"persistence": "write_through"})


def _restored_net(
    seed: int,
    stores: list[list[tuple[bytes, int, bytes | None]]],
    floor: int,
    expiries: list[dict[tuple[bytes, int], float]] | None = None,
) -> FakeNet:
    net = FakeNet(random.Random(seed), dataclasses.replace(CONFIG, initial_cluster_size=len(stores)))
    for i, entries in enumerate(stores):
        a = member(net.next_id)
        net.next_id += 1
        node = net.nodes[a] = GridNode(a, net.config)
        node.restore(entries, floor, expiries[i] if expiries else None)
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
    assert not any(n.persistence.restore_wids for n in net.nodes.values())  # every push acknowledged: the stash goes
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


def test_restored_entries_keep_their_expiries_and_expire_on_time() -> None:
    """Two members form a new grid from their files (FakeNet's wall clock is its virtual time, from 0): an entry
    whose expiry passed while the grid was down goes at once, one whose expiry is still ahead keeps it on every
    owner and goes then, and a key stored twice keeps the expiry of the version that wins."""
    old, new = make_version(5, 1), make_version(6, 1)
    stores = [
        [(b"past", old, b"x"), (b"soon", old, b"x"), (b"plain", old, b"x"), (b"twice", old, b"old")],
        [(b"later", old, b"x"), (b"twice", new, b"new"), (b"twice2", old, b"old"), (b"twice2", new, b"new")],
    ]
    expiries = [
        {(b"past", old): 1.0, (b"soon", old): 8.0, (b"twice", old): 6.0},
        {(b"later", old): 1000.0, (b"twice2", new): 6.0},
    ]
    net = _restored_net(23, stores, 6, expiries)
    net.run_until(4.0)
    assert net.stable() and all(n.restore_outcome == "merged" for n in net.nodes.values())
    got = _read(net, b"past")
    assert got is None or got[1] is None
    t = net.coordinator.topology
    assert t is not None
    for key, expires in ((b"soon", 8.0), (b"later", 1000.0), (b"twice2", 6.0), (b"twice", 0.0), (b"plain", 0.0)):
        seg = t.segment_of(key)
        entry = _read(net, key)
        assert entry is not None and entry[1] is not None, key
        for m in t.current.owners_of(seg):
            assert net.nodes[m].store.expiry_of(seg, key, entry[0]) == expires, key  # type: ignore[union-attr]
    net.run_until(9.5)
    assert (_read(net, b"soon") or (0, None))[1] is None
    assert (_read(net, b"twice2") or (0, None))[1] is None
    assert _read(net, b"twice") == (new, b"new") and _read(net, b"plain") == (old, b"x")
    assert _read(net, b"later") == (old, b"x")


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
