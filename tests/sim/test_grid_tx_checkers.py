"""The grid transaction checkers on hand-written histories: each property both holds and breaks."""

from __future__ import annotations

from typing import Any

from groupcluster.sim.grid.tx_checkers import (
    check_tx_atomicity_and_lost_writes,
    check_tx_auto_resolved,
    check_tx_conserved_total,
    check_tx_locks_released,
)
from groupcluster.sim.history import History, HistoryEvent


def ev(t: float, member: str, kind: str, **data: Any) -> HistoryEvent:
    return HistoryEvent(t, member, kind, data)


def tx(i: str, t0: float, t1: float | None, writes: dict[str, str], *, ok: bool = True, kind: str = "unique",
       reason: str = "") -> list[HistoryEvent]:  # fmt: skip
    out = [
        ev(t0, "a", "tx_start", id=i, mode="optimistic", tx_kind=kind, keys=sorted(writes)),
        ev(t0, "a", "tx_commit", id=i, writes=writes),
    ]
    if t1 is not None:
        out.append(ev(t1, "a", "tx_end", id=i, ok=ok, reason=reason))
    return out


def final(t: float, **values: str | None) -> list[HistoryEvent]:
    return [ev(t, "-", "tx_final", key=k, value=v, ok=True) for k, v in values.items()]


def hist(*parts: list[HistoryEvent]) -> History:
    events = [ev(0.0, "-", "grid_config", mode="deny_read_writes", num_owners=2, num_segments=8)]
    for p in parts:
        events.extend(p)
    events.sort(key=lambda e: e.t)
    return History(events)


def test_a_committed_transaction_later_overwritten_is_fine() -> None:
    h = hist(
        tx("t1", 1.0, 2.0, {"u1": "t1:u1", "u2": "t1:u2"}),
        tx("t2", 3.0, 4.0, {"u2": "t2:u2"}),
        tx("t3", 3.5, None, {"u3": "t3:u3"}),  # unknown outcome, not visible: may have rolled back
        tx("t4", 3.5, 3.6, {"u4": "t4:u4"}, ok=False, reason="conflict"),
        final(9.0, u1="t1:u1", u2="t2:u2", u3=None, u4=None),
    )
    assert check_tx_atomicity_and_lost_writes(h) == []


def test_a_rolled_back_transaction_must_not_be_visible() -> None:
    h = hist(tx("t1", 1.0, 2.0, {"u1": "t1:u1"}, ok=False, reason="lock_timeout"), final(9.0, u1="t1:u1"))
    (v,) = check_tx_atomicity_and_lost_writes(h)
    assert v.property == "tx-atomicity" and "rolled back" in v.detail


def test_a_committed_write_lost_or_beaten_by_an_earlier_transaction_is_reported() -> None:
    h = hist(
        tx("t1", 1.0, 2.0, {"u1": "t1:u1"}),
        tx("t2", 3.0, 4.0, {"u1": "t2:u1", "u2": "t2:u2"}),
        final(9.0, u1="t1:u1", u2=None),
    )
    props = sorted((v.property, v.detail) for v in check_tx_atomicity_and_lost_writes(h))
    assert [p for p, _ in props] == ["tx-lost-write", "tx-lost-write"]
    assert any("absent" in d for _, d in props) and any("before t2 started" in d for _, d in props)


def test_a_partly_visible_transaction_of_unknown_outcome_breaks_atomicity() -> None:
    h = hist(tx("t1", 1.0, None, {"u1": "t1:u1", "u2": "t1:u2"}), final(9.0, u1="t1:u1", u2=None))
    (v,) = check_tx_atomicity_and_lost_writes(h)
    assert v.property == "tx-atomicity"


def test_counters_must_sum_to_zero() -> None:
    ok = hist(final(9.0, c0="-5", c1="3", c2="2", c3=None))
    assert check_tx_conserved_total(ok) == []
    bad = hist(tx("t1", 1.0, 2.0, {"c0": "-4", "c1": "4"}, kind="transfer"), final(9.0, c0="-4", c1="8"))
    (v,) = check_tx_conserved_total(bad)
    assert v.property == "tx-conserved-total" and "sum to 4" in v.detail


def test_locks_left_after_convergence_are_reported() -> None:
    clean = dict(locked=[], active=[], in_doubt=[], blocked=[], pending=[], empty=True)
    assert check_tx_locks_released(hist([ev(9.0, "a", "tx_locks", **clean)])) == []
    held = {**clean, "locked": ["u1"], "in_doubt": ["x/1"], "empty": False}
    (v,) = check_tx_locks_released(hist([ev(9.0, "a", "tx_locks", **held)]))
    assert v.property == "tx-locks-released" and "u1" in v.detail
    failed = [ev(9.0, "-", "tx_resolve_failed", tx="x/1", members=["a"])]
    (v,) = check_tx_locks_released(hist(failed))
    assert "could not resolve" in v.detail


def test_an_in_doubt_transaction_the_grid_could_decide_but_left_is_reported() -> None:
    # The operator resolving what the grid cannot decide (a prepare-time member left) is fine ...
    manual = [ev(9.0, "-", "tx_resolve", tx="x/1", commit=False, members=["a"], why="members ... left")]
    assert check_tx_auto_resolved(hist(manual)) == []
    # ... one the grid's own rule decides, still in doubt after convergence, is not.
    left = [ev(9.0, "-", "tx_auto_left", tx="x/2", decision="rollback"), *manual]
    (v,) = check_tx_auto_resolved(hist(left))
    assert v.property == "tx-auto-resolved" and "x/2" in v.detail and "rollback" in v.detail


def test_the_total_is_not_judged_when_a_transfer_overlaps_two_groups_taking_writes() -> None:
    # Members 10.0.0.1 and 10.0.0.2 in views of their own, both on available topologies: two groups.
    split = [
        ev(1.0, "a", "view", view_id=[1, "a"], members=["a"], merge=False),
        ev(1.0, "b", "view", view_id=[1, "b"], members=["b"], merge=False),
        ev(1.1, "a", "grid_topology", topology_id=1, phase="NO_REBALANCE", availability="AVAILABLE"),
        ev(1.1, "b", "grid_topology", topology_id=1, phase="NO_REBALANCE", availability="AVAILABLE"),
    ]
    during = hist(split, tx("t1", 2.0, 2.5, {"c0": "-4", "c1": "4"}, kind="transfer"), final(9.0, c0="-4", c1="8"))
    assert check_tx_conserved_total(during) == []
    before = hist(split, tx("t1", 0.2, 0.5, {"c0": "-4", "c1": "4"}, kind="transfer"), final(9.0, c0="-4", c1="8"))
    assert [v.property for v in check_tx_conserved_total(before)] == ["tx-conserved-total"]


def test_a_commit_through_a_grid_the_reader_never_met_binds_it_only_as_possible() -> None:
    def views(together: bool) -> list[HistoryEvent]:
        if together:
            return [ev(0.5, m, "view", view_id=[1, "a"], members=["a", "b"], merge=False) for m in ("a", "b")]
        return [ev(0.5, m, "view", view_id=[1, m], members=[m], merge=False) for m in ("a", "b")]

    read = [ev(9.0, "b", "tx_final", key="u1", value=None, ok=True)]
    apart = hist(views(False), tx("t1", 1.0, 2.0, {"u1": "t1:u1"}), read)
    assert check_tx_atomicity_and_lost_writes(apart) == []  # b's grid never met a's: a may have taken it along
    met = hist(views(True), tx("t1", 1.0, 2.0, {"u1": "t1:u1"}), read)
    assert [v.property for v in check_tx_atomicity_and_lost_writes(met)] == ["tx-lost-write"]
