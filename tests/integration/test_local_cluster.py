"""``groupcluster local``: start, status, scale up and down with data in the grid, stop; and its clear errors.

Real member processes on 127.0.0.1, driven through the command line as a user would.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from groupcluster.grid.client import GridClient
from groupcluster.tools.local_cluster import pid_alive


def local(directory: Path, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "groupcluster.cli", "local", *args, "--dir", str(directory)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


@pytest.fixture
def cluster_dir(tmp_path: Path) -> Iterator[Path]:
    """The cluster's directory; whatever still runs at the end is killed, pass or fail."""
    d = tmp_path / "cluster"
    try:
        yield d
    finally:
        try:
            members = json.loads((d / "cluster.json").read_text())["members"]
        except (OSError, ValueError, KeyError):
            members = []
        for m in members:
            # Only our member (its bind address on the command line), never a process that reused the pid.
            if pid_alive(m["pid"], m["bind"]):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(m["pid"], signal.SIGKILL)


def endpoints(d: Path) -> list[str]:
    return [m["http"] for m in json.loads((d / "cluster.json").read_text())["members"]]


def test_start_scale_status_stop(cluster_dir: Path) -> None:
    d = cluster_dir
    r = local(d, "status")
    assert r.returncode == 1 and "no cluster in" in r.stderr, r

    r = local(d, "start", "--members", "2")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "2 members formed one grid" in r.stdout
    header = next(ln for ln in r.stdout.splitlines() if ln.startswith("member"))
    for col in ("endpoint", "view", "topology", "phase", "segments", "keys"):
        assert col in header

    r = local(d, "start", "--members", "2")
    assert r.returncode == 1 and "already running" in r.stderr, r

    items = {f"lk{i}".encode(): f"lv{i}".encode() for i in range(3000)}
    with GridClient(endpoints(d)) as c:
        c.put_many(items)

    r = local(d, "scale", "4")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "started m3, m4" in r.stdout
    r = local(d, "status", "--json")
    rows = json.loads(r.stdout)
    assert [row["member"] for row in rows] == ["m1", "m2", "m3", "m4"]
    assert all(row["phase"] == "NO_REBALANCE" and len(row["view"]) == 4 for row in rows), rows
    assert len({row["topology_id"] for row in rows}) == 1
    # Balanced: 256 segments x 2 owners over 4 members, and every key twice.
    assert sorted(row["segments_owned"] for row in rows) == [128] * 4, rows
    assert sum(row["keys"] for row in rows) == 2 * len(items), rows

    # Down to 1: three leaves, one at a time (2 owners), each after handing its segments off; newest first,
    # and the coordinator (whoever formed the group) stays.
    coordinator = next(row["member"] for row in rows if row["coordinator"])
    expected_leavers = [n for n in ("m4", "m3", "m2", "m1") if n != coordinator][:3]
    r = local(d, "scale", "1")
    assert r.returncode == 0, r.stdout + r.stderr
    left = [ln for ln in r.stdout.splitlines() if "handed its segments off and left" in ln]
    assert [ln.split()[0] for ln in left] == expected_leavers, r.stdout
    with GridClient(endpoints(d)) as c:
        got = c.get_many(items)
    assert got == items, f"{sum(got[k] != v for k, v in items.items())} keys lost"
    r = local(d, "status")
    assert r.returncode == 0
    table = r.stdout.splitlines()
    assert table[1].startswith("member") and len(table) == 3, r.stdout
    assert coordinator in table[2] and "3,000" in table[2] and "256 (256 primary)" in table[2], r.stdout

    r = local(d, "stop")
    assert r.returncode == 0 and "stopped 1 members" in r.stdout, r
    r = local(d, "status")
    assert r.returncode == 1 and "no member of the cluster" in r.stderr, r
    r = local(d, "scale", "2")
    assert r.returncode == 1 and "no member of the cluster" in r.stderr, r


def test_capacity_empties_a_member_and_fills_it_again(cluster_dir: Path) -> None:
    """``local capacity m2 0``: m2 stays in the view, owns no segment, and every key is still on two members;
    ``capacity m2 1`` gives it its share back. Setting what it has already moves nothing."""
    d = cluster_dir
    r = local(d, "start", "--members", "3")
    assert r.returncode == 0, r.stdout + r.stderr
    items = {f"ck{i}".encode(): f"cv{i}".encode() for i in range(3000)}
    with GridClient(endpoints(d)) as c:
        c.put_many(items)

    def rows() -> dict[str, dict]:
        r = local(d, "status", "--json")
        assert r.returncode == 0, r.stderr
        return {row["member"]: row for row in json.loads(r.stdout)}

    r = local(d, "capacity", "m2", "0")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "m2: capacity 0 (was 1); the grid rebalanced in" in r.stdout, r.stdout
    assert "capacity 0" in next(ln for ln in r.stdout.splitlines() if ln.startswith("m2 ")), r.stdout
    st = rows()
    assert [len(row["view"]) for row in st.values()] == [3, 3, 3], st
    assert st["m2"]["capacity"] == 0 and st["m2"]["segments_owned"] == 0 and st["m2"]["keys"] == 0, st["m2"]
    assert st["m1"]["segments_owned"] == st["m3"]["segments_owned"] == 256, st
    assert st["m1"]["keys"] == st["m3"]["keys"] == len(items), st
    with GridClient(endpoints(d)) as c:  # m2 still answers: it routes to the owners
        assert c.get_many(items) == items

    r = local(d, "capacity", "m2", "0")
    assert r.returncode == 0 and "no segments moved" in r.stdout, r.stdout + r.stderr

    r = local(d, "capacity", "m9", "1")
    assert r.returncode == 1 and "no member 'm9' in the cluster (members: m1, m2, m3)" in r.stderr, r

    r = local(d, "capacity", "m2", "1")
    assert r.returncode == 0 and "m2: capacity 1 (was 0); the grid rebalanced in" in r.stdout, r.stdout + r.stderr
    st = rows()
    owned = sorted(row["segments_owned"] for row in st.values())
    assert sum(owned) == 512 and owned[0] >= 170, st  # 256 segments x 2 owners, even over 3 members
    assert sum(row["keys"] for row in st.values()) == 2 * len(items), st
    with GridClient(endpoints(d)) as c:
        assert c.get_many(items) == items
    assert local(d, "stop").returncode == 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("scale", "0"), "expected 1 to 16 members, got 0"),
        (("scale", "x"), "expected a number of members, got 'x'"),
        (("start", "--members", "17"), "expected 1 to 16 members, got 17"),
        (("start", "--timeout", "-1"), "expected a positive number of seconds"),
        (("capacity", "m1", "-1"), "expected a capacity from 0 to 1000000, got '-1'"),
        (("capacity", "m1", "nan"), "expected a capacity from 0 to 1000000, got 'nan'"),
        (("capacity", "m1", "1e7"), "expected a capacity from 0 to 1000000, got '1e7'"),
        (("capacity", "m1"), "the following arguments are required: C"),
    ],
)
def test_bad_arguments(tmp_path: Path, args: tuple[str, ...], message: str) -> None:
    r = local(tmp_path, *args)
    assert r.returncode == 2 and message in r.stderr, r


def test_a_member_that_exits_before_joining_is_reported_at_once(tmp_path: Path) -> None:
    """``spawn_and_wait_joined`` (the benchmarks' join) stops as soon as the member process is gone, with its
    log, instead of polling its status for the whole timeout (a member that lost its port to another process
    once held the rebalance bench for minutes)."""
    import time

    from groupcluster.tools.local_cluster import LocalCluster, LocalError

    cluster = LocalCluster(tmp_path / "c")
    try:
        cluster.start(1)
        cluster.member_args = ["--set", "nosuchlayer.key=1"]  # the next member refuses this and exits
        started = time.monotonic()
        with pytest.raises(LocalError, match=r"m2 \(.*\) exited before it joined:\n(.|\n)*nosuchlayer"):
            cluster.spawn_and_wait_joined(timeout=120.0)
        assert time.monotonic() - started < 60.0
    finally:
        cluster.kill_all()
