"""Discovery through a shared hosts file, and the hosts-file helpers.

Three members know nothing but a shared file: each appends its endpoint and polls the file, so they find
each other and form one view. ``--run-for`` then ends each with a graceful leave (exit status 0).
"""

from __future__ import annotations

import threading
from pathlib import Path

from groupcluster.runtime.file_discovery import add_host, read_hosts

from .procs import Members, free_port, loopback_hosts, view_of, wait_until


def test_add_host_is_idempotent_and_read_hosts_skips_bad_lines(tmp_path: Path) -> None:
    path = tmp_path / "hosts"
    assert read_hosts(path) == ()
    path.write_text("# members\n127.0.0.1:7800\nnot-an-endpoint\n\n127.0.0.1:99999\n127.0.0.1:7800\n10.0.0.1:7801")
    add_host(path, ("127.0.0.1", 7800))  # already listed
    add_host(path, ("127.0.0.2", 7802))  # appended on a line of its own even though the file lacks a final newline
    assert read_hosts(path) == (("127.0.0.1", 7800), ("10.0.0.1", 7801), ("127.0.0.2", 7802))
    assert path.read_text().endswith("10.0.0.1:7801\n127.0.0.2:7802\n")


def test_concurrent_appends_do_not_interleave(tmp_path: Path) -> None:
    path = tmp_path / "hosts"

    def add(i: int) -> None:
        for j in range(50):
            add_host(path, (f"127.0.{i}.{j}", 7000 + j))

    threads = [threading.Thread(target=add, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(read_hosts(path)) == 400
    assert len(path.read_text().splitlines()) == 400


def test_members_find_each_other_through_a_hosts_file(members: Members, tmp_path: Path) -> None:
    hosts = loopback_hosts(3)
    port = free_port(hosts)
    hosts_file = tmp_path / "cluster.hosts"
    procs = [
        members.start(f"m{i + 1}", f"{h}:{port}", "--hosts-file", str(hosts_file), "--run-for", "8")
        for i, h in enumerate(hosts)
    ]
    wait_until("one view of 3", lambda: all(len(view_of(p) or ()) == 3 for p in procs), 7, members, procs)
    assert {tuple(view_of(p) or ()) for p in procs} == {tuple(view_of(procs[0]) or ())}
    assert set(read_hosts(hosts_file)) == {(h, port) for h in hosts}
    for p in procs:
        assert p.wait(20) == 0, p.log_text()
        assert (p.status() or {}).get("left") is True, p.log_text()
