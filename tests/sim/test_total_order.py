"""Total order (SEQUENCER): the checkers on crafted histories, 300 simulated seeds of the total-order stack with
every fault kind, and targeted runs where the coordinator (the sequencer) crashes while members forward."""

from __future__ import annotations

import random

import pytest
from groupcluster.sim.checkers import check_all
from groupcluster.sim.faults import FAULT_KINDS
from groupcluster.sim.history import History
from groupcluster.sim.loop import EventLoop
from groupcluster.sim.network import LinkConfig, Network
from groupcluster.sim.runner import default_jobs, run_many
from groupcluster.sim.scenario import Scenario, SeedResult, build_spec, run_seed
from groupcluster.sim.stack_checkers import check_crashed_prefix, check_total_order
from groupcluster.sim.world import World, slot_endpoint

A, B, C, S = "a:1#1", "b:1#2", "c:1#3", "s:1#4"

# ---- the checkers on crafted histories ---------------------------------------------------------------------


def history(*events: tuple) -> History:  # type: ignore[type-arg]
    h = History()
    for t, (member, kind, data) in enumerate(events):
        h.add(float(t), member, kind, **data)
    return h


def view(member: str, seq: int, members: list[str]) -> tuple:  # type: ignore[type-arg]
    return (member, "view", {"view_id": [seq, members[0]], "members": members, "merge": False})


def send(member: str, msg: str, seq: int = 1, creator: str = A) -> tuple:  # type: ignore[type-arg]
    return (member, "send", {"msg": msg, "dest": None, "view": [seq, creator]})


def deliver(member: str, sender: str, msg: str) -> tuple:  # type: ignore[type-arg]
    return (member, "deliver", {"sender": sender, "msg": msg, "dest": None})


def test_total_order_catches_two_members_disagreeing_and_accepts_agreement() -> None:
    base = [view(A, 1, [A, B]), view(B, 1, [A, B]), send(A, "1"), send(B, "2")]
    bad = history(*base, deliver(A, A, "1"), deliver(A, B, "2"), deliver(B, B, "2"), deliver(B, A, "1"))
    [v] = check_total_order(bad)
    assert v.property == "total-order" and "'1' from a:1#1 before '2' from b:1#2" in v.detail
    good = history(*base, deliver(A, B, "2"), deliver(A, A, "1"), deliver(B, B, "2"), deliver(B, A, "1"))
    assert check_total_order(good) == []


def test_total_order_only_compares_deliveries_made_while_together() -> None:
    # B, alone in its own view (a partition), orders 2 before 1; A, without B, the other way round.
    h = history(
        view(A, 1, [A]),
        view(B, 1, [B]),
        send(A, "1", creator=A),
        send(B, "2", creator=B),
        deliver(A, A, "1"),
        deliver(A, B, "2"),
        deliver(B, B, "2"),
        deliver(B, A, "1"),
    )
    assert check_total_order(h) == []


def test_crashed_prefix_catches_a_crashed_member_ordered_differently_from_the_survivors() -> None:
    h = history(
        view(C, 1, [C, S]),
        view(S, 1, [C, S]),
        send(C, "1", creator=C),
        send(S, "2", creator=C),
        deliver(C, C, "1"),
        deliver(C, S, "2"),
        (C, "crash", {}),
        view(S, 2, [S]),
        deliver(S, S, "2"),
        deliver(S, C, "1"),
    )
    assert check_total_order(h) == []  # S delivered both without C: total-order alone does not see it
    [v] = check_crashed_prefix(h)
    assert v.property == "crashed-prefix" and "then crashed" in v.detail


def test_crashed_prefix_catches_a_message_the_crashed_member_delivered_and_a_survivor_lost() -> None:
    events = [view(C, 1, [C, S]), view(S, 1, [C, S]), send(S, "1", creator=C), deliver(C, S, "1"), (C, "crash", {})]
    [v] = check_crashed_prefix(history(*events))
    assert "never delivered" in v.detail
    assert check_crashed_prefix(history(*events, view(S, 2, [S]), deliver(S, S, "1"))) == []
    # Had S already lost sight of the sender when C delivered it, nothing is owed to S.
    apart = [view(C, 1, [C, S, A]), view(S, 1, [C, S, A]), send(A, "1", creator=C), view(S, 2, [C, S])]
    assert check_crashed_prefix(history(*apart, deliver(C, A, "1"), (C, "crash", {}))) == []


def test_the_properties_have_teeth_on_the_fifo_stack() -> None:
    """Without a sequencer, members do disagree on the order (the checker is not vacuous)."""
    violated = 0
    for seed in range(3):
        result = run_seed(seed, Scenario(stack="fifo", faults=False, safety_time=5.0), keep_history=True)
        assert result.history is not None
        violated += bool(check_total_order(result.history))
    assert violated == 3


# ---- seeds -------------------------------------------------------------------------------------------------------


def run_total_order(seeds: range) -> list[SeedResult]:
    results = list(run_many(seeds, Scenario(stack="total-order"), jobs=default_jobs()))
    failed = [r for r in results if r.violations]
    lines = []
    for r in failed[:20]:
        lines.append(f"seed {r.seed} (faults: {', '.join(r.kinds)}):")
        lines.extend(f"    {v}" for v in r.violations[:5])
        lines.append(f"    replay: groupcluster sim --seeds 1 --start {r.seed} --stack total-order")
    assert not failed, f"{len(failed)} of {len(results)} seeds failed:\n" + "\n".join(lines)
    return results


def test_300_total_order_seeds_with_every_fault_kind() -> None:
    results = run_total_order(range(300))
    assert {k for r in results for k in r.kinds} == set(FAULT_KINDS)
    assert all(r.converged_at is not None for r in results)
    assert sum(r.stats["delivered"] for r in results) > 300 * 1000
    assert sum(r.stats["crashes"] for r in results) > 50


@pytest.mark.slow
def test_1500_more_total_order_seeds() -> None:
    run_total_order(range(300, 1800))


# ---- the coordinator crashes while members forward ------------------------------------------------------------


def coordinator_crash_run(seed: int, crash_after: float, loss: float) -> History:
    """Five members; everyone multicasts a burst of 4 every 5 ms for 1 s. ``crash_after`` seconds after the
    coordinator first delivered something while newer multicasts were on their way to it, it crashes: others
    are forwarding to it, it has sequenced and delivered some, others hold batches they have not delivered
    yet. The run goes on until the survivors are one group again."""
    n = 5
    loop = EventLoop()
    net = Network(loop, random.Random(seed), LinkConfig(delay=0.0005, jitter=0.0005, loss=loss))
    spec = build_spec(
        "total-order",
        [slot_endpoint(i) for i in range(n)],
        {"fd": {"interval": "200ms", "timeout": "600ms", "verify_timeout": "200ms"}},
    )
    world = World(loop, net, History(), lambda addr, eps: spec, slots=n, rng=random.Random(seed + 1))
    for slot in range(n):
        world.start(slot)

    def formed(size: int) -> bool:
        """One view of ``size`` members, and its sequencer done with the sync (the epoch is open)."""
        live = world.live_nodes()
        views = {(node.view.view_id, len(node.view.members)) if node.view else None for node in live}
        if len(views) != 1 or next(iter(views)) is None or next(iter(views))[1] != size:  # type: ignore[index]
            return False
        seqs = [node.stack.layer("sequencer") for node in live]
        return any(q.is_coord and q.open for q in seqs)  # type: ignore[union-attr]

    def run_until_formed(size: int, limit: float) -> None:
        deadline = loop.now + limit
        while loop.now < deadline and not formed(size):
            loop.run_until(loop.now + 0.25)
        assert formed(size), f"no view of {size} members: {[str(node.view) for node in world.live_nodes()]}"

    run_until_formed(n, 60.0)
    coordinator = world.live_nodes()[0].view.coordinator  # type: ignore[union-attr]
    coord = next(node for node in world.live_nodes() if node.address == coordinator)

    def burst(round_no: int) -> None:
        for node in world.live_nodes():
            world.send(node.slot, None, count=4, size=64)
        if round_no < 200:
            loop.after(0.005, burst, round_no + 1)

    def watch() -> None:
        # Crash once the coordinator delivered something and multicasts it has not delivered are on the way.
        if loop.now > bursts_end:
            return
        events = world.history.events
        delivered = {e.data["msg"] for e in events if e.kind == "deliver" and e.member == coord.name}
        sent = {e.data["msg"] for e in events if e.kind == "send"}
        if delivered and sent - delivered:
            loop.after(crash_after, world.crash, coord.slot)
        else:
            loop.after(0.0002, watch)

    bursts_end = loop.now + 1.0
    loop.at(loop.now, burst, 0)
    loop.at(loop.now, watch)
    loop.run_until(bursts_end + 0.1)
    run_until_formed(n - 1, 60.0)
    loop.run_until(loop.now + 3.0)
    return world.history


def together(hist: History, members: set[str]) -> bool:
    """Every view these members installed held all of them."""
    return all(members <= set(e.data["members"]) for e in hist if e.kind == "view" and e.member in members)


@pytest.mark.parametrize("crash_after", [0.0, 0.0004, 0.0008, 0.0015, 0.003])
@pytest.mark.parametrize("loss", [0.0, 0.05])
def test_coordinator_crash_while_members_forward(crash_after: float, loss: float) -> None:
    hist = coordinator_crash_run(7, crash_after, loss)
    violations = check_all(hist, stack="total-order")
    assert violations == [], "\n".join(map(str, violations[:10]))
    crashed = {e.member for e in hist if e.kind == "crash"}
    assert len(crashed) == 1
    survivors = {e.member for e in hist} - crashed
    orders = {
        m: [(e.data["sender"], e.data["msg"]) for e in hist if e.kind == "deliver" and e.member == m] for m in survivors
    }
    if together(hist, survivors):
        # Nothing a survivor multicast is lost, though the sequencer crashed with some of it forwarded, and
        # every survivor delivered the very same sequence.
        sent = {(e.member, e.data["msg"]) for e in hist if e.kind == "send" and e.member in survivors}
        assert all(sent <= set(order) for order in orders.values())
        assert len({tuple(order) for order in orders.values()}) == 1
    # The crashed coordinator delivered messages, and each survivor's sequence starts with them.
    mine = [(e.data["sender"], e.data["msg"]) for e in hist if e.kind == "deliver" and e.member in crashed]
    assert mine
    for order in orders.values():
        assert order[: len(mine)] == mine


def test_the_crash_left_work_for_the_new_coordinator() -> None:
    """Not vacuous: at the crash, survivors held batches not delivered yet and forwards not sequenced yet."""
    hist = coordinator_crash_run(3, 0.0, 0.0)
    crash_t = next(e.t for e in hist if e.kind == "crash")
    crashed = next(e.member for e in hist if e.kind == "crash")
    before = {(e.member, e.data["msg"]) for e in hist if e.kind == "deliver" and e.t <= crash_t}
    mine = {m for who, m in before if who == crashed}
    survivors = {e.member for e in hist} - {crashed}
    behind = [s for s in survivors if not mine <= {m for who, m in before if who == s}]
    assert behind, "every survivor had delivered what the coordinator had: the crash tested nothing"
    unsequenced = [
        e
        for e in hist
        if e.kind == "send" and e.t <= crash_t and e.member in survivors and (crashed, e.data["msg"]) not in before
    ]
    assert unsequenced


def test_members_joining_one_by_one_sync_without_being_asked_twice() -> None:
    """A joiner's SYNC goes out with its first view (GMS drops what is sent down while it still installs that
    view, so it must leave at the end of the step): no new coordinator has to ask for it again."""
    n = 5
    loop = EventLoop()
    net = Network(loop, random.Random(5), LinkConfig(delay=0.0005, jitter=0.0005))
    spec = build_spec("total-order", [slot_endpoint(i) for i in range(n)])
    world = World(loop, net, History(), lambda addr, eps: spec, slots=n, rng=random.Random(6))
    for slot in range(n):
        loop.at(slot * 0.7, world.start, slot)
    loop.run_until(8.0)
    live = world.live_nodes()
    assert len(live) == n and len({node.view.view_id for node in live if node.view}) == 1
    metrics = [node.stack.metrics for node in live]
    assert sum(m["sequencer.syncs_completed"] for m in metrics) >= n  # a sync per view, at least
    assert sum(m["sequencer.sync_requests"] for m in metrics) == 0
