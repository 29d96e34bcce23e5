"""Real member processes on the vsync stack: a member is killed while everyone multicasts; the survivors
flush before the view without it, so they delivered the same messages in the old view (virtual synchrony),
checked from their ``--record`` histories."""

from __future__ import annotations

import time

from groupcluster.sim import checkers
from groupcluster.sim.history import History, HistoryEvent

from .procs import FD_FLAGS, Members, before, free_port, loopback_hosts, view_of, wait_until


def test_survivors_of_a_crash_agree_on_old_view_deliveries(members: Members) -> None:
    hosts = loopback_hosts(4)
    port = free_port(hosts, "udp")
    everyone = ",".join(f"{h}:{port}" for h in hosts)
    procs = [
        members.start(
            f"m{i + 1}",
            f"{host}:{port}",
            "--hosts",
            everyone,
            "--stack",
            "vsync",
            "--send-count",
            "4000",
            "--send-rate",
            "2000",
            "--payload-size",
            "100",
            "--start-when-members",
            "4",
            *FD_FLAGS,
        )
        for i, host in enumerate(hosts)
    ]
    wait_until("one view of 4", lambda: all(len(view_of(p) or ()) == 4 for p in procs), 60, members, procs)
    wait_until(
        "traffic to flow", lambda: all((p.status() or {}).get("sent", 0) >= 1000 for p in procs), 30, members, procs
    )
    victim = procs[-1]
    survivors = procs[:-1]
    victim_addr = victim.address()
    killed_at = time.time()
    victim.kill()

    def removed() -> bool:
        return all((v := view_of(p)) is not None and victim_addr not in v for p in survivors)

    wait_until("survivors to install a view without the victim", removed, 30, members, survivors)
    wait_until(
        "survivors to finish sending",
        lambda: all((p.status() or {}).get("sent", 0) >= 4000 for p in survivors),
        60,
        members,
        survivors,
    )
    time.sleep(2.0)  # deliveries settle, records flush
    stopping_at = time.time()
    for p in survivors:
        p.terminate()
    for p in survivors:
        assert p.wait(15) == 0, p.log_text()

    events: list[HistoryEvent] = []
    for p in procs:
        events.extend(before(p.history(), stopping_at))
    events.append(HistoryEvent(killed_at, victim_addr, "crash"))
    events.sort(key=lambda e: e.t)
    history = History(events)
    violations = checkers.check_safety(history) + checkers.check_virtual_synchrony(history)
    assert not violations, "\n".join(map(str, violations[:20]))
    # The survivors did move from a view with the victim to one without it (the property was exercised).
    moved = [
        p
        for p in survivors
        if any(ev.kind == "view" and ev.t >= killed_at and victim_addr not in ev.data["members"] for ev in p.history())
    ]
    assert len(moved) == 3
