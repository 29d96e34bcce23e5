"""The simulator's plumbing with a toy stack: members, crashes, restarts, pauses, leaves, stack failures."""

from __future__ import annotations

import random

import pytest
from groupcluster.core.errors import ConfigError
from groupcluster.sim.faults import FAULT_KINDS, draw_plan, draw_startup
from groupcluster.sim.history import History
from groupcluster.sim.loop import EventLoop
from groupcluster.sim.network import LinkConfig, Network
from groupcluster.sim.scenario import Scenario, build_spec, run_seed
from groupcluster.sim.world import GONE, World, slot_endpoint

from .simtoy import TOY_STACK


def make_world(n: int = 3, stack: list | None = None) -> World:  # type: ignore[type-arg]
    loop = EventLoop()
    net = Network(loop, random.Random(1), LinkConfig(delay=0.001))
    spec = build_spec(stack or TOY_STACK, [slot_endpoint(i) for i in range(n)])
    return World(loop, net, History(), lambda addr, eps: spec, slots=n, rng=random.Random(2))


def kinds(world: World, member: str) -> list[str]:
    return [e.kind for e in world.history if e.member == member]


def test_members_start_and_see_each_other() -> None:
    world = make_world(3)
    for slot in range(3):
        world.start(slot)
    world.loop.run_until(1.0)
    views = [n.view for n in world.live_nodes()]
    assert all(v is not None and len(v.members) == 3 for v in views)
    assert len({v.view_id for v in views if v}) == 1
    assert [n.address.incarnation for n in world.live_nodes()] == [1, 2, 3]
    assert all(n.address.endpoint == slot_endpoint(n.slot) for n in world.live_nodes())


def test_multicast_and_unicast_are_recorded_and_delivered() -> None:
    world = make_world(3)
    for slot in range(3):
        world.start(slot)
    world.loop.run_until(1.0)
    ids = world.send(0, None, count=3, size=50)
    b = world.node(1)
    assert b is not None
    [uid] = world.send(2, b.address)
    world.loop.run_until(1.5)
    delivered = [(e.member, e.data["msg"]) for e in world.history if e.kind == "deliver"]
    for node in world.live_nodes():
        assert [m for who, m in delivered if who == node.name][:3] == ids
    assert (b.name, uid) in delivered
    sends = [e for e in world.history if e.kind == "send"]
    assert sends[0].data["view"] == [world.node(0).view.view_id.seq, str(world.node(0).view.view_id.creator)]  # type: ignore[union-attr]


def test_crash_silences_a_member_and_restart_is_a_new_incarnation() -> None:
    world = make_world(3)
    for slot in range(3):
        world.start(slot)
    world.loop.run_until(1.0)
    old = world.node(2)
    assert old is not None
    world.crash(2)
    assert world.node(2) is None and old.state == GONE
    world.send(0, None)
    world.loop.run_until(1.5)
    assert world.network.stats["vanished"] > 0
    assert kinds(world, old.name)[-1] == "crash"
    new = world.start(2)
    assert new.address.endpoint == old.address.endpoint and new.address.incarnation > old.address.incarnation
    restart = [e for e in world.history if e.kind == "restart"]
    assert restart and restart[0].member == new.name and restart[0].data["previous"] == old.name
    world.loop.run_until(2.5)
    assert new.view is not None and new.address in new.view.members


def test_pause_defers_input_and_timers_until_resume() -> None:
    world = make_world(2)
    a, b = world.start(0), world.start(1)
    world.loop.run_until(1.0)
    world.pause(1)
    frames_before = world.network.stats["sent"]
    world.send(0, None, count=2)
    world.loop.run_until(3.0)
    # While paused: nothing delivered at B and B's hello timer did not send anything.
    assert not [e for e in world.history if e.member == b.name and e.kind == "deliver"]
    hellos_from_a = 10  # A greets B every 200 ms for two seconds, B never answers
    assert world.network.stats["sent"] - frames_before <= hellos_from_a + 2
    assert len(b.inbox) > 0
    world.resume(1)
    got = [e for e in world.history if e.member == b.name and e.kind == "deliver"]
    assert len(got) == 2 and all(e.t == 3.0 for e in got)
    assert kinds(world, b.name)[-3:] == ["resume", "deliver", "deliver"]
    assert a.state == "running"


def test_graceful_leave_records_leave_and_left() -> None:
    world = make_world(2)
    world.start(0)
    b = world.start(1)
    world.loop.run_until(1.0)
    world.leave(1)
    assert kinds(world, b.name)[-2:] == ["leave", "left"]
    assert b.state == GONE and world.node(1) is None


def test_a_stack_exception_becomes_a_violation_and_a_crash() -> None:
    stack = [*TOY_STACK, {"layer": "toy_crasher", "after": 2}]
    world = make_world(2, stack)
    a = world.start(0)
    world.start(1)
    world.loop.run_until(1.0)
    world.send(0, None)
    world.send(0, None)  # the crasher raises here
    assert [v.property for v in world.errors] == ["exception"]
    assert "toy crasher fired" in world.errors[0].detail
    assert kinds(world, a.name)[-1] == "crash" and world.node(0) is None
    world.loop.run_until(2.0)  # the rest of the world runs on


def test_toy_group_passes_every_check_without_faults() -> None:
    sc = Scenario(members=4, stack=TOY_STACK, faults=False, safety_time=3.0)
    result = run_seed(3, sc)
    assert result.violations == []
    assert result.converged_at is not None and result.stats["delivered"] > 100
    assert result.events > 100


def test_a_broken_layer_is_caught_and_replays_identically() -> None:
    sc = Scenario(members=3, stack=[*TOY_STACK, {"layer": "toy_duplicator"}], faults=False, safety_time=2.0)
    first = run_seed(11, sc, digest=True)
    # Every batch delivered twice: duplicates, and the second copies also break per-sender order.
    assert first.violations and {v.property for v in first.violations} == {"no-duplicates", "fifo"}
    again = run_seed(11, sc, digest=True)
    assert again.violations == first.violations and again.digest == first.digest


def test_faults_break_the_toy_stack_which_has_no_reliability() -> None:
    # With loss on, a stack without retransmission must be caught by reliable-delivery.
    sc = Scenario(members=4, stack=TOY_STACK, safety_time=4.0)
    bad = []
    for seed in range(40):
        r = run_seed(seed, sc)
        if "loss" in r.kinds and "crash" not in r.kinds:
            bad.append({v.property for v in r.violations})
    assert bad and any("reliable-delivery" in props for props in bad)


def test_fault_plans_cover_every_kind_and_vary() -> None:
    plans = [draw_startup(random.Random(f"startup-{s}"), draw_plan(random.Random(s), 5), 5, 25.0) for s in range(500)]
    seen = {k for p in plans for k in p.kinds()}
    assert seen == set(FAULT_KINDS)
    assert sum(1 for p in plans if len(p.kinds()) >= 9) > 0
    assert max(p.loss for p in plans) > 0.25 and min(p.loss for p in plans) == 0.0


def test_build_spec_gives_discovery_every_endpoint() -> None:
    eps = [slot_endpoint(i) for i in range(3)]
    spec = build_spec("fifo", eps, {"fd": {}})
    disc = next(e for e in spec if e["layer"] == "discovery")
    assert disc["initial_hosts"] == ["10.0.0.1:7800", "10.0.0.2:7800", "10.0.0.3:7800"]
    toy = next(e for e in build_spec(TOY_STACK, eps) if e["layer"] == "toy_members")
    assert toy["initial_hosts"] == disc["initial_hosts"]


def test_build_spec_rejects_unknown_stacks_and_layers() -> None:
    with pytest.raises(ConfigError, match="neither a preset nor a YAML file"):
        build_spec("nope", [slot_endpoint(0)])
    with pytest.raises(ConfigError, match="'nolayer' is not in"):
        build_spec(TOY_STACK, [slot_endpoint(0)], {"nolayer": {"x": 1}})


def test_scenario_rejects_bad_values() -> None:
    with pytest.raises(ValueError, match="members"):
        Scenario(members=0)
    with pytest.raises(ValueError, match="safety_time"):
        Scenario(safety_time=-1)
