"""Persistence in real member processes (docs/grid.md, "Persistence"): ``--grid-set persistence=write_through``
with one SQLite file per member.

* A full-cluster restart recovers: three members write, all are SIGKILLed, three start again on the same files
  and form a new grid; every acknowledged key reads back, and a new write wins over the stored value (its
  topology id is above every stored one).
* A named cache (``--cache NAME:...,persistence=write_through``) keeps a file of its own beside the default
  cache's in a shared directory, and a full restart brings both back.
* A member restarted into the running grid never resurrects stale data: a key deleted while it was down stays
  deleted, and the member says in its log that it cleared its store.
* Lifespans survive a full restart: an entry whose lifespan ended while the members were down is removed once
  they are back, one whose lifespan runs on is read back and removed when it ends.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

from groupcluster.grid.client import GridClient

from .grids import Grid
from .procs import Members, wait_until

N_KEYS = 3000


def _start(grid: Grid, i: int, tmp: Path, *extra: str) -> None:
    grid.start(
        i,
        "--grid-set",
        "persistence=write_through",
        "--grid-set",
        f"persistence_path={tmp / f'm{i}.sqlite'}",
        "--grid-set",
        "num_owners=2",
        *extra,
    )


def _settled(grid: Grid, members: Members) -> None:
    names = [f"m{i}" for i in range(3)]
    wait_until("three members settled", lambda: grid.settled(names), 90, members)


def test_full_restart_recovers_every_acknowledged_key_and_new_writes_win(members: Members, tmp_path: Path) -> None:
    grid = Grid(members, 3)
    for i in range(3):
        _start(grid, i, tmp_path, "--grid-set", "initial_cluster_size=3")
    _settled(grid, members)
    data = {f"p-{i}".encode(): f"v{i}".encode() for i in range(N_KEYS)}
    with GridClient(list(grid.urls.values()), timeout=30.0, retries=20) as client:
        client.put_many(data)  # acknowledged: on both owners' SQLite files
        client.put(b"p-1", b"overwritten")
        client.delete(b"p-2")
        first_topology = client.status()["grid"]["topology_id"]
    data[b"p-1"] = b"overwritten"
    del data[b"p-2"]
    for proc in list(grid.procs.values()):
        proc.kill()
    for i in range(3):
        _start(grid, i, tmp_path, "--grid-set", "initial_cluster_size=3")
    _settled(grid, members)
    with GridClient(list(grid.urls.values()), timeout=30.0, retries=20) as client:
        got = client.get_many([*data, b"p-2"])
        assert got[b"p-2"] is None
        missing = [k for k, v in data.items() if got[k] != v]
        assert not missing, f"{len(missing)} keys lost or wrong, e.g. {missing[:5]}"
        st = client.status()
        assert st["grid"]["topology_id"] > first_topology
        client.put(b"p-3", b"new")
        assert client.get(b"p-3") == b"new"
    for name in grid.procs:
        g = grid.status(name)
        assert g is not None and g["grid"]["persistence"]["restore"] == "merged", g

    def stash_dropped() -> bool:
        # The old rows each member set aside go once all its pushes are acknowledged; the files hold the
        # entries of the members' own segments again.
        counts = []
        for i in range(3):
            with sqlite3.connect(tmp_path / f"m{i}.sqlite") as db:
                counts.append(db.execute("SELECT (SELECT count(*) FROM restored), count(*) FROM entries").fetchone())
        return all(r == 0 and e > 0 for r, e in counts)

    wait_until("the restored rows dropped", stash_dropped, 30, members)


def test_member_restarted_into_the_running_grid_does_not_bring_back_a_deleted_key(
    members: Members, tmp_path: Path
) -> None:
    grid = Grid(members, 3)
    # Tombstones go at once: were the restarted member's stale entries merged, nothing would stop them.
    quick = ("--grid-set", "initial_cluster_size=2", "--grid-set", "tombstone_grace=10ms")
    for i in range(3):
        _start(grid, i, tmp_path, *quick)
    _settled(grid, members)
    keys = [f"d-{i}".encode() for i in range(300)]
    with GridClient([grid.urls["m0"], grid.urls["m1"]], timeout=30.0, retries=20) as client:
        client.put_many({k: b"before" for k in keys})
        grid.procs["m2"].kill()  # its SQLite file keeps every key it owned
        wait_until("two members settled", lambda: grid.settled(["m0", "m1"]), 90, members)
        client.delete_many(keys)
        time.sleep(0.5)  # past the grace: the deletions' tombstones are gone
        _start(grid, 2, tmp_path, *quick)
        _settled(grid, members)
        got = client.get_many(keys)
        assert all(v is None for v in got.values()), [k for k, v in got.items() if v is not None][:5]
    st = grid.status("m2")
    assert st is not None and st["grid"]["persistence"]["restore"] == "discarded", st
    assert "joined a running grid: the store is cleared" in grid.procs["m2"].log_text()
    # Read from the restarted member itself too (it now owns part of the keys).
    with GridClient([grid.urls["m2"]], timeout=30.0, retries=20, route=False) as direct:
        assert all(direct.get(k) is None for k in keys[:50])


def test_a_named_cache_keeps_its_own_file_and_comes_back_after_a_full_restart(members: Members, tmp_path: Path) -> None:
    grid = Grid(members, 3)
    store = tmp_path / "stores"
    store.mkdir()
    options = (
        "--grid-set",
        "persistence=write_through",
        "--grid-set",
        f"persistence_path={store}",
        "--grid-set",
        "initial_cluster_size=3",
        "--cache",
        f"orders:mode=replicated,num_segments=16,persistence=write_through,persistence_path={store}",
    )
    for i in range(3):
        grid.start(i, *options)
    _settled(grid, members)
    with GridClient(list(grid.urls.values()), timeout=30.0, retries=20) as client:
        orders = client.cache("orders")
        for i in range(200):
            orders.put(f"o-{i}".encode(), f"order {i}".encode())
        orders.delete(b"o-7")
        client.put(b"d-1", b"default's")
        client.put(b"o-1", b"not an order")  # the same key in the default cache is another entry
    files = sorted(p.name for p in store.glob("*.sqlite"))
    assert len(files) == 6 and sum(f.endswith("-orders.sqlite") for f in files) == 3, files
    for proc in list(grid.procs.values()):
        proc.kill()
    for i in range(3):
        grid.start(i, *options)
    _settled(grid, members)

    def orders_ready() -> bool:
        # The named cache settles on its own schedule: /readyz waits for every cache.
        return all(grid.ready(f"m{i}") for i in range(3))

    wait_until("every cache ready", orders_ready, 60, members)
    with GridClient(list(grid.urls.values()), timeout=30.0, retries=20) as client:
        orders = client.cache("orders")
        got = {i: orders.get(f"o-{i}".encode()) for i in range(200)}
        wrong = [i for i, v in got.items() if v != (None if i == 7 else f"order {i}".encode())]
        assert not wrong, f"{len(wrong)} orders lost or wrong, e.g. {wrong[:5]}"
        assert client.get(b"d-1") == b"default's"
        assert client.get(b"o-1") == b"not an order"


def test_lifespans_survive_a_full_restart_and_entries_expire_on_time(members: Members, tmp_path: Path) -> None:
    """Entries written with a lifespan keep their expiry in the SQLite files: after all three members are
    SIGKILLed and start again, an entry whose lifespan ended meanwhile is gone, one whose lifespan is still
    running reads back and goes when it ends, and entries without one (or rewritten without one) stay."""
    grid = Grid(members, 3)
    for i in range(3):
        _start(grid, i, tmp_path, "--grid-set", "initial_cluster_size=3")
    _settled(grid, members)
    gone = {f"gone-{i}".encode(): b"g" for i in range(100)}
    later = {f"later-{i}".encode(): b"l" for i in range(100)}
    kept = {f"kept-{i}".encode(): b"k" for i in range(100)}
    with GridClient(list(grid.urls.values()), timeout=30.0, retries=20) as client:
        client.put_many(gone, lifespan=4)
        client.put_many(later, lifespan=40)
        client.put_many(kept)
        client.put(b"gone-0", b"rewritten")  # no lifespan now: it stays
        written = time.time()
    with sqlite3.connect(tmp_path / "m0.sqlite") as db:
        (with_expiry,) = db.execute("SELECT count(*) FROM entries WHERE expires IS NOT NULL").fetchone()
    assert with_expiry > 0, "no expiry in m0's file"
    for proc in list(grid.procs.values()):
        proc.kill()
    time.sleep(max(0.0, written + 5 - time.time()))  # the 4 s lifespans end while every member is down
    for i in range(3):
        _start(grid, i, tmp_path, "--grid-set", "initial_cluster_size=3")
    _settled(grid, members)
    with GridClient(list(grid.urls.values()), timeout=30.0, retries=20) as client:

        def expired() -> bool:
            got = client.get_many(list(gone))
            return got[b"gone-0"] == b"rewritten" and all(v is None for k, v in got.items() if k != b"gone-0")

        wait_until("the entries whose lifespan ended during the restart removed", expired, 30, members)
        assert time.time() < written + 40, "the restart took longer than the long lifespan; nothing left to test"
        got = client.get_many([*later, *kept])
        assert all(got[k] == b"l" for k in later), "an entry whose lifespan runs on was lost in the restart"
        assert all(got[k] == b"k" for k in kept)
        wait_until("the 40 s lifespans ended", lambda: time.time() > written + 40, 60, members)
        wait_until(
            "the entries with a 40 s lifespan removed",
            lambda: all(v is None for v in client.get_many(list(later)).values()),
            30,
            members,
        )
        got = client.get_many(list(kept))
        assert all(v == b"k" for v in got.values())
