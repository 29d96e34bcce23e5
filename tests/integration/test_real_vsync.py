"""Real member processes on the vsync stack: a member is killed while everyone multicasts; the survivors
flush before the view without it, so they delivered the same messages in the old view (virtual synchrony),
checked from their ``--record`` histories."""

from __future__ import annotations

import time

import pytest
from groupcluster.sim import checkers, stack_checkers
from groupcluster.sim.history import History, HistoryEvent

from .procs import FD_FLAGS, FD_TIMEOUT, MemberProcess, Members, before, free_port, loopback_hosts, view_of, wait_until


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
    violations = checkers.check_safety(history) + stack_checkers.check_virtual_synchrony(history)
    assert not violations, "\n".join(map(str, violations[:20]))
    # The survivors did move from a view with the victim to one without it (the property was exercised).
    moved = [
        p
        for p in survivors
        if any(ev.kind == "view" and ev.t >= killed_at and victim_addr not in ev.data["members"] for ev in p.history())
    ]
    assert len(moved) == 3


def test_channel_flush_blocks_everyone_and_ends_in_a_new_view_of_the_same_members() -> None:
    """The explicit flush API: any member asks; all three see Block, deliver the same multicasts of the old
    view, and are unblocked by a new view with the same members. The fifo stack refuses it clearly."""
    import asyncio

    from groupcluster.core.events import Block, Unblock
    from groupcluster.runtime.channel import Channel, ChannelError

    hosts = loopback_hosts(3)
    port = free_port(hosts, "udp")
    everyone = [f"{h}:{port}" for h in hosts]

    async def main() -> None:
        chans: list[Channel] = []
        got: dict[int, list[bytes]] = {}
        events: dict[int, list[str]] = {}
        for i, host in enumerate(hosts):
            got[i], events[i] = [], []
            chans.append(
                await Channel.connect(
                    f"flush-{port}",
                    bind=(host, port),
                    initial_hosts=everyone,
                    stack="vsync",
                    on_message=lambda m, i=i: got[i].append(m.payload),
                    on_event=lambda e, i=i: events[i].append(type(e).__name__),
                )
            )
        try:
            await chans[0].wait_for_view(lambda v: len(v.members) == 3, 30)
            old = chans[0].view
            for n in range(50):
                chans[2].send(f"m{n}".encode())
            new = await chans[2].flush(timeout=20)
            assert new.members == old.members and new.view_id != old.view_id
            for ch in chans:
                await ch.wait_for_view(lambda v: v.view_id == new.view_id, 20)
            # What was multicast before the flush reached everyone before the new view.
            assert all(got[i] == [f"m{n}".encode() for n in range(50)] for i in got), got
            assert all(Block.__name__ in events[i] and Unblock.__name__ in events[i] for i in events), events
        finally:
            for ch in chans:
                await ch.leave()
        fifo = await Channel.connect(f"fifo-{port}", bind=(hosts[0], port), initial_hosts=everyone[:1], stack="fifo")
        try:
            with pytest.raises(ChannelError, match="does not flush"):
                await fifo.flush()
        finally:
            await fifo.leave()

    asyncio.run(main())


def _counters(proc: MemberProcess) -> dict[str, int]:
    st = proc.status()
    assert st is not None, f"{proc.name} has no status"
    return dict(st["metrics"])


def test_the_successor_takes_over_by_one_flush_before_the_other_survivor_suspects_the_coordinator(
    members: Members,
) -> None:
    """SIGKILL the coordinator of three: the next member suspects it first and flushes the other survivor,
    whose own failure detector would take seconds longer (its timeout is 3 s longer, so the START_FLUSH
    always comes first). The survivor must not refuse the successor and be excluded (each survivor in a
    view of one until a merge): it verifies the coordinator at once and both install one 2-member view."""
    hosts = loopback_hosts(3)
    port = free_port(hosts, "udp")
    everyone = ",".join(f"{h}:{port}" for h in hosts)
    slow_fd = ("--set", f"fd.timeout={FD_TIMEOUT + 3.0}")
    procs: list[MemberProcess] = []
    for i, host in enumerate(hosts):
        # One at a time, so the view is [m1, m2, m3]: m1 coordinates, m2 succeeds it, m3 detects slowly.
        extra = slow_fd if i == 2 else ()
        procs.append(
            members.start(f"m{i + 1}", f"{host}:{port}", "--hosts", everyone, "--stack", "vsync", *FD_FLAGS, *extra)
        )
        wait_until(f"a view of {i + 1}", lambda n=i + 1: all(len(view_of(p) or ()) == n for p in procs), 60, members)
    coordinator, successor, slow = procs
    addrs = [p.address() for p in procs]
    assert view_of(successor) == addrs, "members joined in start order"
    before_kill = {p.name: _counters(p) for p in (successor, slow)}
    coordinator.kill()

    wait_until(
        "both survivors in one view without the coordinator",
        lambda: all(view_of(p) == addrs[1:] for p in (successor, slow)),
        30,
        members,
        [successor, slow],
    )
    time.sleep(1.5)  # a refused flush would show within start_flush_timeout; a later view would show too

    def delta(proc: MemberProcess, name: str) -> int:
        return _counters(proc).get(name, 0) - before_kill[proc.name].get(name, 0)

    for p in (successor, slow):
        assert view_of(p) == addrs[1:], members.describe()
        for bad in ("flush.flushes_refused", "gms.excluded", "gms.orphaned", "flush.flushes_failed"):
            assert delta(p, bad) == 0, f"{p.name}: {bad}\n{members.describe()}"
    assert delta(successor, "flush.flushes_started") == 1 and delta(successor, "flush.flushes_completed") == 1
    # The race did happen: the slow survivor got the START_FLUSH before it suspected the coordinator.
    assert delta(slow, "flush.successor_starts_verified") == 1 and delta(slow, "fd.verify_requested") == 1
    # Neither survivor passed through another view on the way (a view of one, then a merge).
    for p in (successor, slow):
        views = [ev.data["members"] for ev in p.history() if ev.kind == "view"]
        assert views[-1] == addrs[1:] and views[-2] == addrs, f"{p.name} views: {views}"
