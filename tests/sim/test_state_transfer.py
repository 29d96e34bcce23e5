"""State transfer in the simulator: the ``state-transfer`` checker on crafted histories (it must catch a lost
or repeated message at the cut, a corrupted state and a delivery before the state), and simulated seeds of
both stacks that carry the ``state`` layer, where every member that starts fetches the group's state while
faults run (the 300-seed sweeps of ``test_vsync.py`` and ``test_total_order.py`` run the same checker too)."""

from __future__ import annotations

import pytest
from groupcluster.sim.history import History
from groupcluster.sim.runner import default_jobs, run_many
from groupcluster.sim.scenario import Scenario, SeedResult, run_seed
from groupcluster.sim.stack_checkers import STACK_CHECKERS, check_state_transfer

D, J, S = "d:1#1", "j:1#2", "s:1#3"


def history(*events: tuple) -> History:  # type: ignore[type-arg]
    h = History()
    for t, (member, kind, data) in enumerate(events):
        h.add(float(t), member, kind, **data)
    return h


def view(member: str, seq: int, members: list[str]) -> tuple:  # type: ignore[type-arg]
    return (member, "view", {"view_id": [seq, members[0]], "members": members, "merge": False})


def deliver(member: str, sender: str, msg: str, via: str | None = None) -> tuple:  # type: ignore[type-arg]
    data = {"sender": sender, "msg": msg, "dest": None}
    if via:
        data["via"] = via
    return (member, "deliver", data)


def state(member: str, op: str, **data: object) -> tuple:  # type: ignore[type-arg]
    return (member, "state", {"op": op, **data})


def transfer(size: int, digest: str = "x") -> list[tuple]:  # type: ignore[type-arg]
    return [
        state(D, "get", transfer=[J, 1], size=size, digest=digest),
        state(J, "set", donor=D, transfer=[J, 1], size=size, digest=digest),
    ]


def send(msg: str, seq: int) -> tuple:  # type: ignore[type-arg]
    return (S, "send", {"msg": msg, "dest": None, "view": [seq, D]})


BASE = [
    send("1", 1),
    send("2", 1),
    send("3", 2),
    send("4", 2),
    view(D, 1, [D, S]),
    state(J, "request"),
    deliver(D, S, "1"),
    deliver(D, S, "2"),
    view(D, 2, [D, S, J]),
    view(J, 2, [D, S, J]),
]


def test_a_consistent_cut_passes() -> None:
    h = history(
        *BASE,
        *transfer(2),
        deliver(D, S, "3"),
        deliver(J, S, "2", via="state"),  # held, and already in the state
        deliver(J, S, "3"),
        deliver(D, S, "4"),
        deliver(J, S, "4"),
    )
    assert check_state_transfer(h) == []


def test_a_message_lost_at_the_cut_is_caught() -> None:
    # The donor's state ends at 2; the joiner goes on from 4: 3 is in neither.
    h = history(*BASE, *transfer(2), deliver(D, S, "3"), deliver(D, S, "4"), deliver(J, S, "4"))
    [v] = check_state_transfer(h)
    assert v.property == "state-transfer" and v.member == J and "'4'" in v.detail and "'3'" in v.detail


def test_a_message_applied_twice_is_caught() -> None:
    h = history(*BASE, *transfer(2), deliver(J, S, "2"), deliver(D, S, "3"), deliver(J, S, "3"))
    problems = [v.detail for v in check_state_transfer(h)]
    assert any("twice" in p for p in problems)


def test_a_state_that_changed_on_the_way_or_never_left_the_donor_is_caught() -> None:
    bad = [
        state(D, "get", transfer=[J, 1], size=2, digest="aaa"),
        state(J, "set", donor=D, transfer=[J, 1], size=2, digest="bbb"),
    ]
    [v] = check_state_transfer(history(*BASE, *bad))
    assert "digest" in v.detail
    [v] = check_state_transfer(history(*BASE, state(J, "set", donor=D, transfer=[J, 9], size=0, digest="x")))
    assert "never took" in v.detail


def test_a_delivery_before_the_state_and_a_false_covered_claim_are_caught() -> None:
    early = history(*BASE, deliver(J, S, "2"), *transfer(2))
    assert any("before its state was set" in v.detail for v in check_state_transfer(early))
    short = [view(D, 1, [D, S]), state(J, "request"), deliver(D, S, "1"), view(D, 2, [D, S, J]), view(J, 2, [D, S, J])]
    false_claim = history(*short, *transfer(1), deliver(D, S, "2"), deliver(J, S, "2", via="state"))
    assert any("lacks it" in v.detail for v in check_state_transfer(false_claim))


def test_a_donor_whose_recorded_size_disagrees_with_its_deliveries_is_caught() -> None:
    [v] = check_state_transfer(history(*BASE, *transfer(5)))
    assert "5 entries" in v.detail


def test_partition_messages_of_a_merged_joiner_are_not_counted_as_divergence() -> None:
    # The joiner applies, after the state, a message from its partition the donor never had: divergence by
    # merge, not a broken cut (the donor's own stream after the cut still matches).
    h = history(*BASE, *transfer(2), deliver(J, S, "p"), deliver(D, S, "3"), deliver(J, S, "3"))
    assert check_state_transfer(h) == []


def test_a_tail_the_joiner_missed_before_a_split_is_not_counted_as_lost_at_the_cut() -> None:
    # Vsync: after a good cut the joiner misses the donor's last multicast of the shared view (a one-way cut),
    # moves alone into a view of its own applying nothing there, and merges back. Members moving to different
    # next views may deliver different sets: the comparison ends at the joiner's view without the donor.
    h = history(
        *BASE,
        *transfer(2),
        deliver(D, S, "3"),
        deliver(J, S, "3"),
        deliver(D, S, "4"),
        view(D, 3, [D, S]),
        view(J, 3, [J]),
        view(D, 4, [D, S, J]),
        view(J, 4, [D, S, J]),
        deliver(D, S, "5"),
        deliver(J, S, "5"),
    )
    assert check_state_transfer(h) == []


def test_a_message_the_joiner_applied_while_apart_is_not_counted_as_lost_at_the_cut() -> None:
    # Total order: after a good cut the joiner is excluded and, alone, applies the donor's multicast of their
    # shared view; the donor, still counting the joiner in, applies it too. The joiner's stretch together with
    # the donor starts after the merge, so that message is compared on neither side.
    h = history(
        *BASE,
        *transfer(2),
        view(J, 3, [J]),
        deliver(J, D, "d1"),
        deliver(D, D, "d1"),
        view(D, 4, [D, S, J]),
        view(J, 4, [D, S, J]),
        deliver(D, D, "d2"),
        deliver(J, D, "d2"),
        deliver(D, S, "3"),
        deliver(J, S, "3"),
    )
    assert check_state_transfer(h) == []


def test_a_message_lost_at_the_cut_is_caught_when_the_joiner_parts_from_the_donor_later() -> None:
    h = history(
        *BASE,
        *transfer(2),
        deliver(D, S, "3"),
        deliver(D, S, "4"),
        deliver(J, S, "4"),
        view(J, 3, [J]),
        view(J, 4, [D, S, J]),
        deliver(J, S, "5"),
        deliver(D, S, "5"),
    )
    [v] = check_state_transfer(h)
    assert v.member == J and "applied '4'" in v.detail and "applied '3'" in v.detail


def test_the_checker_runs_for_the_stacks_with_the_state_layer() -> None:
    assert STACK_CHECKERS["vsync"]["state-transfer"] is check_state_transfer
    assert STACK_CHECKERS["total-order"]["state-transfer"] is check_state_transfer


# ---- seeds -------------------------------------------------------------------------------------------------------


def state_events(stack: str, seeds: range) -> dict[str, int]:
    """How often states moved in these seeds (read from their histories)."""
    counts = {"get": 0, "set": 0, "covered": 0}
    for seed in seeds:
        result = run_seed(seed, Scenario(stack=stack), keep_history=True)
        assert result.history is not None
        for ev in result.history:
            if ev.kind == "state" and ev.data["op"] in ("get", "set") and ev.data.get("donor", "") is not None:
                counts[ev.data["op"]] += 1
            elif ev.kind == "deliver" and ev.data.get("via") == "state":
                counts["covered"] += 1
    return counts


def run(stack: str, seeds: range) -> list[SeedResult]:
    results = list(run_many(seeds, Scenario(stack=stack), jobs=default_jobs()))
    failed = [r for r in results if r.violations]
    lines = []
    for r in failed[:20]:
        lines.append(f"seed {r.seed} (faults: {', '.join(r.kinds)}):")
        lines.extend(f"    {v}" for v in r.violations[:5])
        lines.append(f"    replay: groupcluster sim --seeds 1 --start {r.seed} --stack {stack}")
    assert not failed, f"{len(failed)} of {len(results)} seeds failed:\n" + "\n".join(lines)
    return results


@pytest.mark.parametrize("stack", ["vsync", "total-order"])
def test_joiners_get_consistent_states_under_faults(stack: str) -> None:
    run(stack, range(2000, 2020))
    # The property was exercised: states moved, and joiners received multicasts their state already held.
    counts = state_events(stack, range(2000, 2004))
    assert counts["set"] >= 8 and counts["get"] >= counts["set"] and counts["covered"] > 0, counts


@pytest.mark.slow
@pytest.mark.parametrize("stack", ["vsync", "total-order"])
def test_400_more_seeds(stack: str) -> None:
    run(stack, range(2020, 2420))
