"""Real member processes on loopback: one view, reliable FIFO multicast, crash removal, over UDP and TCP.

Four ``groupcluster member`` processes on 127.0.0.11-14 form one view; each multicasts its test messages;
every member must deliver every message from every sender in the order sent (checked directly from the
``--record`` files and by the property checkers). Then one member is killed with SIGKILL and the others
must install a view without it within the configured failure-detection time plus a margin.
"""

from __future__ import annotations

import socket
import time

from groupcluster.sim import checkers
from groupcluster.sim.history import History, HistoryEvent

from .procs import (
    FD_FLAGS,
    FD_INTERVAL,
    FD_TIMEOUT,
    FD_VERIFY,
    MemberProcess,
    Members,
    before,
    check_fifo_complete,
    free_port,
    loopback_hosts,
    view_of,
    wait_until,
)

# Scheduling slack on a loaded 2-core machine, on top of heartbeat interval + timeout + verification.
DETECTION_MARGIN = 2.5


def _run_cluster(members: Members, transport: str, count: int, kill_coordinator: bool) -> None:
    hosts = loopback_hosts(4)
    port = free_port(hosts, transport)
    everyone = ",".join(f"{h}:{port}" for h in hosts)
    procs = [
        members.start(
            f"m{i + 1}",
            f"{host}:{port}",
            "--hosts",
            everyone,
            "--transport",
            transport,
            "--send-count",
            str(count),
            "--payload-size",
            "100",
            "--start-when-members",
            "4",
            *FD_FLAGS,
        )
        for i, host in enumerate(hosts)
    ]
    total = 4 * count

    def all_delivered() -> bool:
        sts = [p.status() for p in procs]
        return all(st is not None and st["delivered_total"] >= total for st in sts)

    wait_until(f"every member to deliver {total} messages", all_delivered, 120, members, procs)
    statuses = [p.status() for p in procs]
    assert all(st["delivered_total"] == total for st in statuses), members.describe()  # type: ignore[index]
    views = {tuple(st["view"]["members"]) for st in statuses}  # type: ignore[index]
    assert len(views) == 1 and len(next(iter(views))) == 4, views
    time.sleep(0.6)  # let the records flush

    coordinator = statuses[0]["view"]["coordinator"]  # type: ignore[index]
    victim = next(p for p in procs if (p.address() == coordinator) == kill_coordinator)
    survivors = [p for p in procs if p is not victim]
    victim_addr = victim.address()
    killed_at = time.time()
    victim.kill()

    def removed() -> bool:
        return all((v := view_of(p)) is not None and victim_addr not in v for p in survivors)

    wait_until(f"survivors to remove {victim.name}", removed, 30, members, survivors)
    time.sleep(0.6)
    bound = FD_INTERVAL + FD_TIMEOUT + FD_VERIFY + DETECTION_MARGIN
    for p in survivors:
        first_without = next(
            ev.t
            for ev in p.history()
            if ev.kind == "view" and ev.t >= killed_at and victim_addr not in ev.data["members"]
        )
        took = first_without - killed_at
        assert took <= bound, f"{p.name} removed the killed member after {took:.2f}s (bound {bound:.1f}s)"
    final_views = {tuple(view_of(p) or ()) for p in survivors}
    assert len(final_views) == 1 and len(next(iter(final_views))) == 3, final_views

    stopping_at = time.time()
    for p in survivors:
        p.terminate()
    for p in survivors:
        assert p.wait(15) == 0, p.log_text()

    senders = [p.address() for p in procs]
    for p in procs:
        check_fifo_complete(p.history(), senders, count)
    _check_histories(procs, victim, killed_at, stopping_at)


def _check_histories(procs: list[MemberProcess], victim: MemberProcess, killed_at: float, stopping_at: float) -> None:
    events: list[HistoryEvent] = []
    for p in procs:
        events.extend(before(p.history(), stopping_at))
    events.append(HistoryEvent(killed_at, victim.address(), "crash"))
    events.sort(key=lambda e: e.t)
    history = History(events)
    violations = checkers.check_safety(history) + checkers.check_merge_convergence(history)
    assert not violations, "\n".join(map(str, violations[:20]))


def test_four_members_udp_fifo_multicast_then_a_crash(members: Members) -> None:
    _run_cluster(members, "udp", 10_000, kill_coordinator=False)


def test_four_members_tcp_fifo_multicast_then_the_coordinator_crashes(members: Members) -> None:
    _run_cluster(members, "tcp", 5_000, kill_coordinator=True)


def test_tcp_member_survives_a_bad_length_prefix(members: Members) -> None:
    hosts = loopback_hosts(2)
    port = free_port(hosts, "tcp")
    everyone = ",".join(f"{h}:{port}" for h in hosts)
    procs = [
        members.start(f"m{i + 1}", f"{h}:{port}", "--hosts", everyone, "--transport", "tcp")
        for i, h in enumerate(hosts)
    ]
    wait_until("one view of 2", lambda: all(len(view_of(p) or ()) == 2 for p in procs), 30, members, procs)
    with socket.create_connection((hosts[0], port), timeout=5) as s:
        s.sendall(b"\x7f\xff\xff\xff" + b"x" * 100)
        s.settimeout(5)
        assert s.recv(10) == b""  # closed by the member
    wait_until(
        "the bad prefix to be counted",
        lambda: (procs[0].status() or {}).get("metrics", {}).get("runtime.tcp_bad_length") == 1,
        5,
        members,
        procs,
    )
    assert all(p.alive() for p in procs)
    assert len(view_of(procs[0]) or ()) == 2
