"""The grid checkers on hand-written histories: each property both holds and breaks."""

from __future__ import annotations

from typing import Any

import pytest
from groupcluster.sim.grid.checkers import (
    LIVENESS_BOUND,
    check_grid_expired,
    check_grid_fresh_reads,
    check_grid_liveness,
    check_grid_lost_writes,
    check_grid_replicas,
    parse,
)
from groupcluster.sim.history import History, HistoryEvent
from groupcluster.sim.history_index import HistoryFormatError


def ev(t: float, member: str, kind: str, **data: Any) -> HistoryEvent:
    return HistoryEvent(t, member, kind, data)


def op(
    t0: float,
    t1: float | None,
    i: str,
    kind: str,
    key: str,
    value: str | None,
    *,
    ok: bool = True,
    read: str | None = None,
    member: str = "a",
    deadline: float | None = None,
    expires: float | None = None,
    error: str = "timed out",
) -> list[HistoryEvent]:
    extra = {} if deadline is None else {"deadline": deadline}
    if expires is not None:
        extra["expires"] = expires
    out = [ev(t0, member, "grid_start", id=i, op=kind, key=key, value=value if kind == "put" else None, **extra)]
    if t1 is not None:
        out.append(ev(t1, member, "grid_end", id=i, ok=ok, value=read, error=None if ok else error))
    return out


def hist(*parts: list[HistoryEvent], mode: str = "deny_read_writes") -> History:
    events = [ev(0.0, "-", "grid_config", mode=mode, num_owners=2, num_segments=8)]
    for p in parts:
        events.extend(p)
    events.sort(key=lambda e: e.t)
    return History(events)


def test_latest_acknowledged_or_concurrent_value_is_fresh() -> None:
    h = hist(
        op(1.0, 2.0, "1", "put", "k", "v1"),
        op(3.0, 5.0, "2", "put", "k", "v2"),  # concurrent with the read below
        op(4.0, 4.5, "3", "get", "k", None, read="v1"),
        op(4.0, 4.6, "4", "get", "k", None, read="v2"),
        op(0.1, 0.2, "5", "get", "k", None, read=None),  # nothing acknowledged yet
    )
    assert check_grid_fresh_reads(h) == []


def test_stale_read_is_caught() -> None:
    h = hist(
        op(1.0, 2.0, "1", "put", "k", "v1"),
        op(3.0, 4.0, "2", "put", "k", "v2"),
        op(5.0, 5.1, "3", "get", "k", None, read="v1"),
    )
    out = check_grid_fresh_reads(h)
    assert len(out) == 1 and "read #3" in out[0].detail and "'v1'" in out[0].detail


def test_unacknowledged_write_may_or_may_not_show() -> None:
    h = hist(
        op(1.0, 2.0, "1", "put", "k", "v1"),
        op(3.0, None, "2", "put", "k", "v2"),  # its member crashed: no end
        op(4.0, 8.0, "3", "put", "k", "v3", ok=False),
        op(9.0, 9.1, "4", "get", "k", None, read="v2"),
        op(9.2, 9.3, "5", "get", "k", None, read="v1"),
        op(9.4, 9.5, "6", "get", "k", None, read="v3"),
    )
    assert check_grid_fresh_reads(h) == []


def test_a_failed_write_with_a_deadline_took_effect_before_it_or_never() -> None:
    def reads_after(deadline: float | None, read: str) -> History:
        return hist(
            op(1.0, 2.0, "1", "put", "k", "v1"),
            op(3.0, 8.0, "2", "put", "k", "late", ok=False, deadline=deadline),
            op(5.0, 5.5, "3", "put", "k", "v3"),  # acknowledged, started after the deadline 4.0
            op(9.0, 9.1, "4", "get", "k", None, read=read),
        )

    # Without a deadline the failed write may land any time, even after v3: reading it is allowed.
    assert check_grid_fresh_reads(reads_after(None, "late")) == []
    # With one (4.0) it happened before 4.0 or never, and v3 followed it: reading it now is a late landing.
    out = check_grid_fresh_reads(reads_after(4.0, "late"))
    assert len(out) == 1 and "read #4" in out[0].detail and "'late'" in out[0].detail
    assert check_grid_fresh_reads(reads_after(4.0, "v3")) == []
    # A read that overlaps the deadline window may still see it (it may have happened).
    h = hist(
        op(3.0, 8.0, "2", "put", "k", "late", ok=False, deadline=4.0),
        op(3.5, 3.6, "3", "get", "k", None, read="late"),
    )
    assert check_grid_fresh_reads(h) == []


def test_a_put_refused_at_the_bound_on_its_first_attempt_never_took_effect() -> None:
    full = "full: member a holds 10 entries, its max_entries is 10; nothing was written (delete keys, ...)"
    later = "full: member a holds 10 entries, its max_entries is 10; this attempt wrote nothing (an earlier may have)"

    def read_after(error: str, read: str | None) -> History:
        return hist(
            op(1.0, 2.0, "1", "put", "k", "v1"),
            op(3.0, 3.5, "2", "put", "k", "refused", ok=False, error=error),
            op(4.0, 4.1, "3", "get", "k", None, read=read),
        )

    assert check_grid_fresh_reads(read_after(full, "v1")) == []
    out = check_grid_fresh_reads(read_after(full, "refused"))
    assert len(out) == 1 and "read #3" in out[0].detail and "'refused'" in out[0].detail
    # A later attempt refused: an earlier one may have been applied, so its value may show.
    assert check_grid_fresh_reads(read_after(later, "refused")) == []


def test_a_deadline_before_the_start_is_a_bad_history() -> None:
    with pytest.raises(HistoryFormatError, match="deadline must be a time at or after the start"):
        parse(hist(op(3.0, 4.0, "1", "put", "k", "v", deadline=2.0)))


def test_lost_write_after_convergence_and_acknowledged_delete() -> None:
    h = hist(
        op(1.0, 2.0, "1", "put", "k", "v1"),
        op(1.0, 2.0, "2", "put", "j", "w1"),
        op(3.0, 4.0, "3", "delete", "j", None),
        [ev(10.0, "-", "grid_converged")],
        op(11.0, 11.1, "4", "get", "k", None, read=None),
        op(11.0, 11.1, "5", "get", "j", None, read="w1"),
    )
    out = check_grid_lost_writes(h)
    assert {v.detail.split(" of ")[1].split(" ")[0] for v in out} == {"'k'", "'j'"}
    assert check_grid_fresh_reads(h) == []  # final reads are judged by grid-lost-write only


def test_partition_windows_per_mode() -> None:
    # Two groups on available topologies that do not contain each other: their writes are concurrent.
    split = [
        ev(0.5, "a", "view", view_id=[1, "a"], members=["a"], merge=False),
        ev(0.5, "a", "grid_topology", topology_id=1, phase="NO_REBALANCE", availability="AVAILABLE"),
        ev(0.5, "b", "view", view_id=[1, "b"], members=["b"], merge=False),
        ev(0.5, "b", "grid_topology", topology_id=1, phase="NO_REBALANCE", availability="AVAILABLE"),
        ev(3.0, "a", "view", view_id=[2, "a"], members=["a", "b"], merge=True),
        ev(3.0, "b", "view", view_id=[2, "a"], members=["a", "b"], merge=True),
        ev(3.1, "a", "grid_topology", topology_id=5, phase="NO_REBALANCE", availability="AVAILABLE"),
        ev(3.1, "b", "grid_topology", topology_id=5, phase="NO_REBALANCE", availability="AVAILABLE"),
    ]
    writes = [*op(1.0, 1.1, "1", "put", "k", "va", member="a"), *op(2.0, 2.1, "2", "put", "k", "vb", member="b")]
    final = [ev(10.0, "-", "grid_converged"), *op(11.0, 11.1, "3", "get", "k", None, read="va")]
    assert check_grid_lost_writes(hist(split, writes, final)) == []
    # Without the split, "va" was followed by the acknowledged "vb": losing it is a violation.
    assert len(check_grid_lost_writes(hist(writes, final))) == 1
    gh = parse(hist(split, writes, final, mode="allow_read_writes"))
    assert gh.mode == "allow_read_writes" and gh.write_windows and gh.write_windows[0][0] == 0.5


def test_replicas_equal_and_non_owners_hold_nothing() -> None:
    owners = [["a", "b"], ["b", "c"]]
    good = hist(
        [
            ev(20.0, "a", "grid_store", topology_id=9, owners=owners, data={"0": {"k": "v"}}),
            ev(20.0, "b", "grid_store", topology_id=9, owners=owners, data={"0": {"k": "v"}, "1": {}}),
            ev(20.0, "c", "grid_store", topology_id=9, owners=owners, data={"1": {}}),
        ]
    )
    assert check_grid_replicas(good) == []
    bad = hist(
        [
            ev(20.0, "a", "grid_store", topology_id=9, owners=owners, data={"0": {"k": "v"}, "1": {"x": "y"}}),
            ev(20.0, "b", "grid_store", topology_id=9, owners=owners, data={"0": {"k": "w"}, "1": {}}),
            ev(20.0, "c", "grid_store", topology_id=9, owners=owners, data={"1": {}}),
        ]
    )
    out = check_grid_replicas(bad)
    assert any("segment 0" in v.detail and "k: 'v' vs 'w'" in v.detail for v in out)
    assert any(v.member == "a" and "segment 1, not an owner" in v.detail for v in out)


def test_read_through_a_grid_that_never_met_the_writers_grid() -> None:
    # Seeds 68 and 126: b formed a grid of its own and read absent a key a's grid had acknowledged. Until b's
    # grid meets a's (a view with both), a's writes are ones that may have happened for b's reads.
    views = [
        ev(0.5, "a", "view", view_id=[1, "a"], members=["a"], merge=False),
        ev(2.5, "b", "view", view_id=[1, "b"], members=["b"], merge=False),
        ev(6.0, "a", "view", view_id=[2, "a"], members=["a", "b"], merge=True),
        ev(6.0, "b", "view", view_id=[2, "a"], members=["a", "b"], merge=True),
        ev(6.5, "-", "grid_converged"),
    ]
    write = op(1.0, 1.1, "1", "put", "k", "va", member="a")
    apart = op(3.0, 3.1, "2", "get", "k", None, read=None, member="b")
    assert check_grid_fresh_reads(hist(views[:4], write, apart)) == []
    # Once b's view contains a, a read through b that misses "va" is stale again.
    after = op(7.0, 7.1, "3", "get", "k", None, read=None, member="b")
    out = check_grid_fresh_reads(hist(views[:4], write, after))
    assert len(out) == 1 and "read #3" in out[0].detail
    # The same read through a member of a's own grid was never excused.
    same = op(3.0, 3.1, "4", "get", "k", None, read=None, member="a")
    assert len(check_grid_fresh_reads(hist(views[:4], write, same))) == 1


def test_allow_read_writes_read_overlapping_a_split_may_be_absent() -> None:
    # Seeds 50 and 81: in allow_read_writes a side without any owner of a segment starts it empty.
    views = [
        ev(0.5, "a", "view", view_id=[1, "a"], members=["a", "b"], merge=False),
        ev(0.5, "b", "view", view_id=[1, "a"], members=["a", "b"], merge=False),
        ev(4.0, "b", "view", view_id=[2, "b"], members=["b"], merge=False),
        ev(4.1, "a", "view", view_id=[2, "a"], members=["a"], merge=False),
    ]
    write = op(1.0, 1.1, "1", "put", "k", "va", member="a")
    read = op(4.5, 4.6, "2", "get", "k", None, read=None, member="b")
    assert check_grid_fresh_reads(hist(views, write, read, mode="allow_read_writes")) == []
    assert len(check_grid_fresh_reads(hist(views, write, read, mode="deny_read_writes"))) == 1
    # Outside a split the rule does not apply.
    early = op(2.0, 2.1, "3", "get", "k", None, read=None, member="b")
    assert len(check_grid_fresh_reads(hist(views, write, early, mode="allow_read_writes"))) == 1


def test_an_entry_may_read_absent_from_its_expiry_until_a_later_write_replaces_it() -> None:
    h = hist(
        op(1.0, 2.0, "1", "put", "k", "v1", expires=5.0),
        op(3.0, 3.1, "2", "get", "k", None, read="v1"),
        op(5.5, 5.6, "3", "get", "k", None, read=None),  # removed at its expiry
        op(5.7, 5.8, "4", "get", "k", None, read="v1"),  # or not yet: the removal is never acknowledged
        op(6.0, 7.0, "5", "put", "k", "v2"),  # started after the PUT ended: a newer version, not removed
        op(8.0, 8.1, "6", "get", "k", None, read="v2"),
    )
    assert check_grid_fresh_reads(h) == []
    early = hist(op(1.0, 2.0, "1", "put", "k", "v1", expires=5.0), op(3.0, 3.1, "2", "get", "k", None, read=None))
    assert [v.property for v in check_grid_fresh_reads(early)] == ["grid-fresh-reads"]
    replaced = hist(
        op(1.0, 2.0, "1", "put", "k", "v1", expires=5.0),
        op(3.0, 4.0, "2", "put", "k", "v2"),
        op(6.0, 6.1, "3", "get", "k", None, read=None),
    )
    assert [v.property for v in check_grid_fresh_reads(replaced)] == ["grid-fresh-reads"]
    # A PUT never acknowledged may land after the later write: its removal stays possible.
    unacked = hist(
        op(1.0, None, "1", "put", "k", "v1", expires=5.0),
        op(3.0, 4.0, "2", "put", "k", "v2"),
        op(6.0, 6.1, "3", "get", "k", None, read=None),
    )
    assert check_grid_fresh_reads(unacked) == []


def test_no_store_holds_an_entry_long_expired_once_converged() -> None:
    owners = [["a", "b"]]

    def stores(data: dict[str, str]) -> list[HistoryEvent]:
        return [
            ev(20.0, "-", "grid_converged"),
            *(ev(20.5, m, "grid_store", topology_id=9, owners=owners, data={"0": dict(data)}) for m in "ab"),
        ]

    puts = [op(1.0, 2.0, "1", "put", "k", "v1", expires=10.0), op(1.0, 2.0, "2", "put", "j", "w", expires=19.0)]
    # j expired less than EXPIRY_GRACE before convergence: it may still be there.
    assert check_grid_expired(hist(*puts, stores({"j": "w"}))) == []
    out = check_grid_expired(hist(*puts, stores({"k": "v1", "j": "w"})))
    assert [v.member for v in out] == ["a", "b"] and "put #1 that expired at t=10.000000" in out[0].detail
    # The same key written again without a lifespan is fine.
    again = op(11.0, 12.0, "3", "put", "k", "v3")
    assert check_grid_expired(hist(*puts, again, stores({"k": "v3"}))) == []


def test_only_a_put_expires_and_not_before_it_starts() -> None:
    with pytest.raises(HistoryFormatError, match="only a put expires"):
        parse(hist(op(1.0, 2.0, "1", "delete", "k", None, expires=5.0)))
    with pytest.raises(HistoryFormatError, match="expires must be a time at or after the start"):
        parse(hist(op(3.0, 4.0, "1", "put", "k", "v", expires=2.0)))


def test_a_removal_while_two_groups_take_writes_is_concurrent_with_their_writes() -> None:
    """allow_read_writes: during a split each side has a primary; one side may remove the expired entry after the
    other side wrote the key, and the removal (stamped when it runs) can win the merge (seed 503)."""
    parts = (
        op(1.0, 2.0, "1", "put", "k", "v1", expires=3.0),
        [ev(4.0, "-", "grid_split", phase="start"), ev(8.0, "-", "grid_split", phase="end")],
        op(5.0, 5.5, "2", "put", "k", "v2", member="b"),
        op(9.0, 9.1, "3", "get", "k", None, read=None),
    )
    assert check_grid_fresh_reads(hist(*parts, mode="allow_read_writes")) == []
    # Without a window after the expiry one primary holds every acknowledged write: v2 replaced the entry.
    calm = (parts[0], op(5.0, 5.5, "2", "put", "k", "v2", member="b"), parts[3])
    assert [v.property for v in check_grid_fresh_reads(hist(*calm, mode="allow_read_writes"))] == ["grid-fresh-reads"]


def view(t: float, members: str, seq: int, *, creator: str | None = None) -> list[HistoryEvent]:
    """Every member of ``members`` installs the view ``seq`` of exactly them."""
    vid = [seq, creator or members[0]]
    return [ev(t, m, "view", view_id=vid, members=list(members), merge=False) for m in members]


def topo(t: float, members: str, tid: int, availability: str) -> list[HistoryEvent]:
    return [
        ev(t, m, "grid_topology", topology_id=tid, phase="NO_REBALANCE", availability=availability) for m in members
    ]


def coordinator_killed(*tail: list[HistoryEvent], lost: str = "c", owners: str = "abc") -> History:
    """Three members (2 owners) whole on topology 3; ``lost`` crash; the survivors each form a view of one and
    degrade; the faults stop at t=12 and the survivors merge at t=13 into a view of them both, still degraded."""
    survivors = "".join(m for m in "abc" if m not in lost)
    parts: list[list[HistoryEvent]] = [
        [ev(0.0, m, "start", slot=i) for i, m in enumerate("abc")],
        view(0.5, "abc", 1),
        topo(1.0, "abc", 3, "AVAILABLE"),
        [ev(2.0, "-", "grid_whole", topology_id=3, owners=list(owners))],
        [ev(3.0, m, "crash") for m in lost],
        *(view(4.0, m, 2 + i) for i, m in enumerate(survivors)),
        topo(4.5, survivors, 4, "DEGRADED"),
        [ev(12.0, "-", "grid_heal")],
        view(13.0, survivors, 9),
        topo(13.5, survivors, 10, "DEGRADED"),
        *tail,
    ]
    return hist(*parts)


def test_liveness_catches_a_grid_that_needed_forcing_though_it_lost_one_member_of_three() -> None:
    # The real-process report: the coordinator of three (2 owners) SIGKILLed, the survivors degraded alone,
    # merged, and stayed degraded until the operator forced them available.
    h = coordinator_killed(
        [ev(20.0, "a", "grid_force_available", topology_id=10)],
        topo(20.5, "ab", 11, "AVAILABLE"),
    )
    out = check_grid_liveness(h)
    assert [v.property for v in out] == ["grid-liveness", "grid-liveness"]
    assert "forced available at t=20.000" in out[0].detail and "1 of the 3 owners" in out[0].detail
    assert "(c)" in out[0].detail
    assert f"more than {LIVENESS_BOUND:g}s after the group converged at t=13.000" in out[1].detail
    # Never forced, never available: degraded to the end.
    out = check_grid_liveness(coordinator_killed())
    assert len(out) == 1 and "still degraded at the end of the history (a, b)" in out[0].detail


def test_liveness_accepts_a_grid_available_by_itself_after_the_merge() -> None:
    assert check_grid_liveness(coordinator_killed(topo(14.5, "ab", 11, "AVAILABLE"))) == []
    # Just within the bound after the group converged.
    assert check_grid_liveness(coordinator_killed(topo(13.0 + LIVENESS_BOUND, "ab", 11, "AVAILABLE"))) == []
    late = coordinator_killed(topo(13.1 + LIVENESS_BOUND, "ab", 11, "AVAILABLE"))
    assert [v.property for v in check_grid_liveness(late)] == ["grid-liveness"]
    # The group splits once more after the heal (a wrong suspicion): the side of one rightly degrades until it
    # merges back, and the bound counts from the group's last convergence.
    again = (view(20.0, "a", 20), topo(20.1, "a", 12, "DEGRADED"), view(30.0, "ab", 21))
    ok = coordinator_killed(topo(14.5, "ab", 11, "AVAILABLE"), *again, topo(31.0, "ab", 13, "AVAILABLE"))
    assert check_grid_liveness(ok) == []
    stuck = coordinator_killed(topo(14.5, "ab", 11, "AVAILABLE"), *again, topo(31.0, "b", 13, "DEGRADED"))
    assert [v.detail[:35] for v in check_grid_liveness(stuck)] == ["still degraded at the end of the hi"]


def test_liveness_asks_nothing_when_data_or_the_majority_may_be_gone() -> None:
    def forced(survivors: str) -> tuple[list[HistoryEvent], ...]:
        return [ev(20.0, survivors[0], "grid_force_available", topology_id=10)], topo(20.5, survivors, 11, "AVAILABLE")

    # Two of three lost with 2 owners: a segment may have lost both copies; forcing is the operator's call.
    assert check_grid_liveness(coordinator_killed(*forced("a"), lost="bc")) == []
    # One of two owners lost: half of the stable topology, which may be going on without us.
    assert check_grid_liveness(coordinator_killed(*forced("ac"), lost="b", owners="ab")) == []
    # A member that joined after the grid was last whole is not counted against it: still one of three lost,
    # so the forced call and the late availability are violations.
    extra = [ev(5.0, "d", "start", slot=3), ev(6.0, "d", "crash")]
    assert len(check_grid_liveness(coordinator_killed(extra, *forced("ab")))) == 2


def test_liveness_needs_the_simulators_events() -> None:
    # Hand-written or real-process histories without grid_whole / grid_heal make no claim.
    h = coordinator_killed()
    bare = History([e for e in h.events if e.kind not in ("grid_whole", "grid_heal")])
    assert check_grid_liveness(bare) == []
    with pytest.raises(HistoryFormatError, match="owners must be a list"):
        check_grid_liveness(hist([ev(1.0, "-", "grid_whole", topology_id=3, owners="abc")]))
