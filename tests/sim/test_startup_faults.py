"""The startup faults of the fault plan: partial host lists, staggered starts, shuffled endpoints; drawn apart from
every other draw of a seed, and switched off by ``Scenario(startup_faults=False)``."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from groupcluster.sim.faults import STARTUP_KINDS
from groupcluster.sim.history import History
from groupcluster.sim.scenario import Scenario, SeedResult, run_seed
from groupcluster.sim.world import slot_endpoint

SMALL = Scenario(members=4, safety_time=3.0, send_rate=2.0, converge_deadline=40.0)
SEEDS = range(40)


@pytest.fixture(scope="module")
def runs() -> list[SeedResult]:
    return [run_seed(s, SMALL, keep_history=True) for s in SEEDS]


def starts(history: History | None) -> list[dict[str, Any]]:
    """The first start of each slot: slot, member, endpoint, time, hosts (None: the full list)."""
    assert history is not None
    out: dict[int, dict[str, Any]] = {}
    for ev in history.events:
        if ev.kind == "start":
            host_port = ev.member.split("#")[0]
            out.setdefault(
                ev.data["slot"], {"member": ev.member, "endpoint": host_port, "t": ev.t, "hosts": ev.data.get("hosts")}
            )
    return [out[slot] for slot in sorted(out)]


def with_kind(runs: list[SeedResult], kind: str) -> list[SeedResult]:
    found = [r for r in runs if kind in r.kinds]
    assert found, f"no seed of {list(SEEDS)} drew {kind}"
    return found


def test_the_seeds_draw_every_startup_kind_and_converge(runs: list[SeedResult]) -> None:
    assert {k for r in runs for k in r.kinds} >= set(STARTUP_KINDS)
    assert [r.seed for r in runs if r.violations] == []


def test_partial_host_lists_name_one_side_of_every_pair_at_least(runs: list[SeedResult]) -> None:
    prefix_seen = False
    for r in with_kind(runs, "partial-hosts"):
        first = starts(r.history)
        hosts = [set(s["hosts"]) for s in first]
        endpoints = [s["endpoint"] for s in first]
        for i, ep in enumerate(endpoints):
            assert ep in hosts[i]
            for j in range(i):
                assert endpoints[j] in hosts[i]  # a later slot lists every earlier one
        if "partial_hosts=1 " in r.plan + " ":
            prefix_seen = True
            assert [len(h) for h in hosts] == [1, 2, 3, 4]  # slot i lists exactly slots 0..i
    assert prefix_seen
    # Without the kind every member lists every endpoint (no per-slot list is recorded).
    assert all(s["hosts"] is None for r in runs if "partial-hosts" not in r.kinds for s in starts(r.history))


def test_shuffled_endpoints_hand_the_slots_other_addresses(runs: list[SeedResult]) -> None:
    identity = [f"{h}:{p}" for h, p in (slot_endpoint(i) for i in range(SMALL.members))]
    shuffled = with_kind(runs, "endpoint-order")
    assert any([s["endpoint"] for s in starts(r.history)] != identity for r in shuffled)
    for r in runs:
        eps = [s["endpoint"] for s in starts(r.history)]
        assert sorted(eps) == identity
        if "endpoint-order" not in r.kinds:
            assert eps == identity


def test_staggered_starts_spread_the_first_members_over_seconds(runs: list[SeedResult]) -> None:
    spreads = []
    for r in with_kind(runs, "staggered-start"):
        if "late-join" not in r.kinds:
            times = [s["t"] for s in starts(r.history)]
            spreads.append(max(times) - min(times))
    assert max(spreads) > 1.0
    for r in runs:
        if "staggered-start" not in r.kinds and "late-join" not in r.kinds:
            assert max(s["t"] for s in starts(r.history)) <= 0.3


def test_without_startup_kinds_drawn_a_seed_runs_as_with_the_switch_off(runs: list[SeedResult]) -> None:
    # The startup faults draw from a generator of their own: a seed that drew none of them replays exactly the run
    # it has with the switch off (so pinned seeds found before they existed keep their runs).
    plain = [r for r in runs if not set(r.kinds) & set(STARTUP_KINDS)]
    assert plain
    off = dataclasses.replace(SMALL, startup_faults=False)
    for r in plain[:2]:
        assert run_seed(r.seed, SMALL, digest=True).digest == run_seed(r.seed, off, digest=True).digest


def test_the_switch_leaves_the_other_faults_of_a_seed_as_they_were(runs: list[SeedResult]) -> None:
    off = dataclasses.replace(SMALL, startup_faults=False)
    for r in with_kind(runs, "partial-hosts")[:3]:
        without = run_seed(r.seed, off)
        assert without.kinds == [k for k in r.kinds if k not in STARTUP_KINDS]
        assert not set(without.kinds) & set(STARTUP_KINDS)
        assert all(part in r.plan.split() for part in without.plan.split())
