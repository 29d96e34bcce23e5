"""Real member processes on the total-order stack (SEQUENCER): four members multicast while the coordinator,
which is the sequencer, is killed. From their ``--record`` histories: the total order and crashed-prefix
checkers and every safety checker hold, the three survivors delivered the very same sequence, nothing a
survivor sent was lost, and the killed sequencer's deliveries are a prefix of it."""

from __future__ import annotations

import time
from pathlib import Path

from groupcluster.sim import checkers, stack_checkers
from groupcluster.sim.history import History, HistoryEvent

from .procs import FD_FLAGS, Members, before, free_port, loopback_hosts, view_of, wait_until

COUNT = 4000


def multicasts(events: list[HistoryEvent], member: str) -> list[tuple[str, str]]:
    return [(e.data["sender"], e.data["msg"]) for e in events if e.kind == "deliver" and e.member == member]


def test_members_agree_on_one_order_when_the_sequencer_is_killed(members: Members, tmp_path: Path) -> None:
    stack = tmp_path / "total-order.yaml"
    stack.write_text("preset: total-order\n")
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
            str(stack),
            "--send-count",
            str(COUNT),
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
    coordinator = (view_of(procs[0]) or [""])[0]
    victim = next(p for p in procs if p.address() == coordinator)
    survivors = [p for p in procs if p is not victim]
    killed_at = time.time()
    victim.kill()

    def removed() -> bool:
        return all((v := view_of(p)) is not None and coordinator not in v for p in survivors)

    wait_until("survivors to install a view without the sequencer", removed, 30, members, survivors)
    total = len(survivors) * COUNT

    def delivered_all() -> bool:
        return all(
            sum(n for sender, n in ((p.status() or {}).get("delivered") or {}).items() if sender != coordinator)
            >= total
            for p in survivors
        )

    wait_until("survivors to deliver each other's messages", delivered_all, 90, members, survivors)
    time.sleep(1.0)  # records flush
    stopping_at = time.time()
    for p in survivors:
        p.terminate()
    for p in survivors:
        assert p.wait(15) == 0, p.log_text()

    events: list[HistoryEvent] = []
    for p in procs:
        events.extend(before(p.history(), stopping_at))
    events.append(HistoryEvent(killed_at, coordinator, "crash"))
    events.sort(key=lambda e: e.t)
    history = History(events)
    violations = (
        checkers.check_safety(history)
        + stack_checkers.check_total_order(history)
        + stack_checkers.check_crashed_prefix(history)
    )
    assert not violations, "\n".join(map(str, violations[:20]))

    names = [p.address() for p in survivors]
    orders = {name: multicasts(events, name) for name in names}
    # The survivors stayed together: they delivered the very same sequence, with all they multicast in it.
    assert len({tuple(o) for o in orders.values()}) == 1
    order = orders[names[0]]
    for name in names:
        assert [m for s, m in order if s == name] == [str(i) for i in range(COUNT)]
    # The killed sequencer had delivered messages; they open the survivors' sequence in the same order.
    mine = multicasts(events, coordinator)
    assert len(mine) > 1000
    assert order[: len(mine)] == mine
