"""The property checkers on crafted histories: each catches its violation and accepts a correct history."""

from __future__ import annotations

import pytest
from groupcluster.sim.checkers import (
    check_all,
    check_fifo,
    check_liveness_delivery,
    check_merge_convergence,
    check_no_creation,
    check_no_duplicates,
    check_reliable_delivery,
    check_safety,
    check_view_agreement,
)
from groupcluster.sim.history import History, HistoryEvent
from groupcluster.sim.history_index import HistoryFormatError, HistoryIndex
from groupcluster.sim.stack_checkers import check_virtual_synchrony

A, B, C = "10.0.0.1:7800#1", "10.0.0.2:7800#2", "10.0.0.3:7800#3"


class H:
    """A small builder: events get increasing times in the order written."""

    def __init__(self) -> None:
        self.history = History()
        self.t = 0.0

    def _add(self, member: str, kind: str, **data: object) -> H:
        self.t += 0.01
        self.history.add(self.t, member, kind, **data)
        return self

    def start(self, *members: str) -> H:
        for m in members:
            self._add(m, "start")
        return self

    def view(self, seq: int, members: list[str], at: list[str] | None = None, creator: str | None = None) -> H:
        for m in at or members:
            self._add(m, "view", view_id=[seq, creator or members[0]], members=members, merge=False)
        return self

    def send(self, member: str, msg: str, dest: str | None = None, view: int | None = 1, creator: str = A) -> H:
        return self._add(member, "send", msg=msg, dest=dest, view=None if view is None else [view, creator])

    def deliver(self, member: str, sender: str, msg: str, dest: str | None = None) -> H:
        return self._add(member, "deliver", sender=sender, msg=msg, dest=dest)

    def mcast_all(self, sender: str, msg: str, members: list[str], view: int = 1) -> H:
        self.send(sender, msg, view=view)
        for m in members:
            self.deliver(m, sender, msg)
        return self


def correct_history() -> History:
    """Three members, multicasts and unicasts, a crash and a new view: everything as it should be."""
    h = H().start(A, B, C).view(1, [A, B, C])
    h.mcast_all(A, "a1", [A, B, C]).mcast_all(B, "b1", [A, B, C]).mcast_all(A, "a2", [A, B, C])
    h.send(A, "u1", dest=B).deliver(B, A, "u1", dest=B)
    h.send(A, "u2", dest=B).deliver(B, A, "u2", dest=B)
    h.send(C, "c1")  # C crashes before anyone gets it: nobody has to deliver it
    h._add(C, "crash")
    h.view(2, [A, B])
    h.mcast_all(B, "b2", [A, B], view=2)
    return h.history


def test_correct_history_passes_every_checker() -> None:
    h = correct_history()
    assert check_safety(h) == []
    assert check_all(h, converged_at=0.0) == []


# ---- view agreement -----------------------------------------------------------------------------------------


def test_view_agreement_catches_same_id_different_members() -> None:
    h = H().start(A, B, C).view(1, [A, B], at=[A]).view(1, [A, B, C], at=[C], creator=A)
    vs = check_view_agreement(h.history)
    assert [v.property for v in vs] == ["view-agreement"]
    assert "has members" in vs[0].detail and vs[0].member == C


def test_view_agreement_catches_same_members_different_order() -> None:
    h = H().view(1, [A, B], at=[A]).view(1, [B, A], at=[B], creator=A)
    assert len(check_view_agreement(h.history)) == 1


def test_view_agreement_catches_decreasing_seq() -> None:
    h = H().view(3, [A, B], at=[A]).view(2, [A, B], at=[A])
    vs = check_view_agreement(h.history)
    assert len(vs) == 1 and "went down" in vs[0].detail


def test_view_agreement_catches_view_without_self() -> None:
    h = H().view(1, [A, B], at=[C])
    vs = check_view_agreement(h.history)
    assert len(vs) == 1 and "without itself" in vs[0].detail


def test_view_agreement_accepts_equal_seqs_from_different_creators() -> None:
    # Two partitions' coordinators may both create seq 2; ids differ by creator.
    h = H().view(2, [A], at=[A]).view(2, [B], at=[B]).view(3, [A, B], at=[A, B])
    assert check_view_agreement(h.history) == []


# ---- fifo -------------------------------------------------------------------------------------------------------


def test_fifo_catches_multicast_out_of_order() -> None:
    h = H().view(1, [A, B]).send(A, "1").send(A, "2").deliver(B, A, "2").deliver(B, A, "1")
    vs = check_fifo(h.history)
    assert len(vs) == 1 and vs[0].member == B and "'1'" in vs[0].detail


def test_fifo_catches_unicast_out_of_order() -> None:
    h = H().send(A, "1", dest=B).send(A, "2", dest=B).deliver(B, A, "2", dest=B).deliver(B, A, "1", dest=B)
    assert len(check_fifo(h.history)) == 1


def test_fifo_judges_multicast_and_unicast_streams_separately() -> None:
    # A unicast overtaking a multicast is fine: they are separate streams.
    h = H().send(A, "m", dest=None).send(A, "u", dest=B).deliver(B, A, "u", dest=B).deliver(B, A, "m")
    assert check_fifo(h.history) == []


def test_fifo_accepts_gaps() -> None:
    # A late joiner starts in the middle of a stream: order matters, not completeness.
    h = H().send(A, "1").send(A, "2").send(A, "3").deliver(B, A, "1").deliver(B, A, "3")
    assert check_fifo(h.history) == []


# ---- duplicates and creation -------------------------------------------------------------------------------------


def test_no_duplicates_catches_a_second_delivery() -> None:
    h = H().send(A, "1").deliver(B, A, "1").deliver(B, A, "1")
    vs = check_no_duplicates(h.history)
    assert len(vs) == 1 and vs[0].property == "no-duplicates" and vs[0].member == B


def test_no_duplicates_is_per_receiver_incarnation() -> None:
    b2 = "10.0.0.2:7800#9"
    h = H().send(A, "1").deliver(B, A, "1")._add(B, "crash").deliver(b2, A, "1")
    assert check_no_duplicates(h.history) == []


def test_no_creation_catches_a_message_never_sent() -> None:
    h = H().send(A, "1").deliver(B, A, "2")
    vs = check_no_creation(h.history)
    assert len(vs) == 1 and "never sent" in vs[0].detail


def test_no_creation_catches_a_message_from_the_wrong_sender() -> None:
    h = H().send(A, "1").deliver(B, C, "1")
    assert len(check_no_creation(h.history)) == 1


def test_no_creation_catches_a_unicast_delivered_to_someone_else() -> None:
    h = H().send(A, "1", dest=B).deliver(C, A, "1", dest=C)
    vs = check_no_creation(h.history)
    assert len(vs) == 1 and "unicast to" in vs[0].detail


def test_no_creation_catches_unicast_delivered_as_multicast_and_back() -> None:
    h = H().send(A, "1", dest=B).deliver(B, A, "1").send(A, "2").deliver(B, A, "2", dest=B)
    assert len(check_no_creation(h.history)) == 2


# ---- reliable delivery -----------------------------------------------------------------------------------------


def test_reliable_delivery_catches_a_lost_multicast() -> None:
    h = H().start(A, B, C).view(1, [A, B, C]).send(A, "1").deliver(A, A, "1").deliver(B, A, "1")
    vs = check_reliable_delivery(h.history)
    assert len(vs) == 1 and vs[0].member == C and "'1'" in vs[0].detail


def test_reliable_delivery_includes_self_delivery() -> None:
    h = H().start(A, B).view(1, [A, B]).send(A, "1").deliver(B, A, "1")
    vs = check_reliable_delivery(h.history)
    assert [v.member for v in vs] == [A]


def test_reliable_delivery_catches_a_lost_unicast() -> None:
    h = H().start(A, B).view(1, [A, B]).send(A, "1", dest=B)
    vs = check_reliable_delivery(h.history)
    assert len(vs) == 1 and "unicast" in vs[0].detail


def test_reliable_delivery_excuses_crashed_and_leaving_members() -> None:
    h = H().start(A, B, C).view(1, [A, B, C]).send(A, "1").deliver(A, A, "1")
    h._add(B, "crash")._add(C, "leave")._add(C, "left")
    assert check_reliable_delivery(h.history) == []


def test_reliable_delivery_excuses_a_receiver_that_dropped_the_sender() -> None:
    # C installed a view without A (a partition): it owes nothing of what A sent in view 1.
    h = H().start(A, B, C).view(1, [A, B, C]).send(A, "1").deliver(A, A, "1").deliver(B, A, "1")
    h.view(2, [C], at=[C], creator=C).view(3, [A, B, C], creator=A)
    assert check_reliable_delivery(h.history) == []


def test_reliable_delivery_excuses_when_the_sender_dropped_the_receiver() -> None:
    h = H().start(A, B, C).view(1, [A, B, C]).send(A, "1").deliver(A, A, "1").deliver(B, A, "1")
    h.view(2, [A, B], at=[A, B])
    assert check_reliable_delivery(h.history) == []


def test_reliable_delivery_still_requires_delivery_when_views_kept_both() -> None:
    # A later view that still holds both does not excuse anything.
    h = H().start(A, B, C).view(1, [A, B, C]).send(A, "1").deliver(A, A, "1").deliver(B, A, "1")
    h.view(2, [A, B, C])
    assert [v.member for v in check_reliable_delivery(h.history)] == [C]


def test_reliable_delivery_excuses_a_receiver_that_never_installed_the_view() -> None:
    h = H().start(A, B, C).view(1, [A, B, C], at=[A, B]).send(A, "1").deliver(A, A, "1").deliver(B, A, "1")
    assert check_reliable_delivery(h.history) == []


def test_reliable_delivery_ignores_sends_before_joining() -> None:
    h = H().start(A, B).send(A, "1", view=None).view(1, [A, B])
    assert check_reliable_delivery(h.history) == []


# ---- liveness -----------------------------------------------------------------------------------------------------


def test_merge_convergence_catches_two_final_views() -> None:
    h = H().start(A, B).view(1, [A], at=[A]).view(1, [B], at=[B], creator=B)
    vs = check_merge_convergence(h.history)
    assert any("2 views" in v.detail for v in vs)


def test_merge_convergence_catches_a_view_with_a_dead_member() -> None:
    h = H().start(A, B, C).view(1, [A, B, C])._add(C, "crash")
    vs = check_merge_convergence(h.history)
    assert len(vs) == 1 and "non-live" in vs[0].detail and C in vs[0].detail


def test_merge_convergence_catches_a_live_member_left_out() -> None:
    h = H().start(A, B, C).view(1, [A, B], at=[A, B]).view(1, [C], at=[C], creator=C)
    vs = check_merge_convergence(h.history, live=[A, B])
    assert vs == []
    vs = check_merge_convergence(h.history)
    assert vs and any("lacks live" in v.detail for v in vs)


def test_merge_convergence_catches_a_member_without_a_view() -> None:
    h = H().start(A, B).view(1, [A], at=[A])
    vs = check_merge_convergence(h.history)
    assert any(v.member == B and "never installed" in v.detail for v in vs)


def test_liveness_delivery_catches_a_late_message_not_delivered() -> None:
    h = H().start(A, B).view(1, [A, B])
    since = h.t + 0.001
    h.send(A, "late").deliver(A, A, "late")
    vs = check_liveness_delivery(h.history, since)
    assert len(vs) == 1 and B in vs[0].detail
    # A message before convergence is not the liveness checker's business.
    assert check_liveness_delivery(h.history, h.t + 1) == []


# ---- format errors -------------------------------------------------------------------------------------------------


def test_a_malformed_event_is_a_clear_error() -> None:
    h = History([HistoryEvent(0.0, A, "deliver", {"sender": B})])
    with pytest.raises(HistoryFormatError, match="missing field 'msg'"):
        HistoryIndex(h)
    h = History([HistoryEvent(0.0, A, "view", {"view_id": [1], "members": [A]})])
    with pytest.raises(HistoryFormatError, match=r"\[seq, creator\]"):
        HistoryIndex(h)


def test_checkers_read_json_lines_round_trip(tmp_path) -> None:  # type: ignore[no-untyped-def]
    h = H().start(A, B).view(1, [A, B]).send(A, "1").deliver(B, A, "1").deliver(B, A, "1")
    path = tmp_path / "h.jsonl"
    path.write_text("\n".join(h.history.to_lines()) + "\n")
    again = History.read(path)
    assert [v.property for v in check_safety(again)] == ["no-duplicates", "reliable-delivery"]


def test_check_safety_rejects_unknown_skip() -> None:
    with pytest.raises(ValueError, match="allowed values"):
        check_safety(History(), skip=["nope"])


# ---- virtual synchrony and state transfer -------------------------------------------------------------------


def _joiner_history(*, state_after_delivery: bool) -> History:
    """B joins A's view 2 by a state from A; A delivers a1 (sent in view 1, a sequencer's replay) in view 2,
    before or after taking B's state. Then both move on to view 3 together."""
    h = H().start(A, B).view(1, [A]).send(A, "a1", view=1)
    h._add(B, "state", op="request")
    h.view(2, [A, B])
    if state_after_delivery:
        h.deliver(A, A, "a1")
    h._add(A, "state", op="get", transfer=[B, 1], size=1 if state_after_delivery else 0, digest="d")
    h._add(B, "state", op="set", donor=A, transfer=[B, 1], size=1 if state_after_delivery else 0, digest="d")
    if not state_after_delivery:
        h.deliver(A, A, "a1")
    h.view(3, [A, B])
    return h.history


def test_total_orders_virtual_synchrony_counts_what_a_member_applied_before_the_view() -> None:
    # a1 is in B's state (A delivered it before the cut): both have it when they leave view 2.
    assert check_virtual_synchrony(_joiner_history(state_after_delivery=True), merged_earlier=True) == []
    # Strictly (vsync), B did not deliver it in view 2.
    assert [v.member for v in check_virtual_synchrony(_joiner_history(state_after_delivery=True))] == [B]
    # A delivered a1 after the cut: B has it neither from the state nor delivered, and moved on with A.
    violations = check_virtual_synchrony(_joiner_history(state_after_delivery=False), merged_earlier=True)
    assert [(v.property, v.member) for v in violations] == [("virtual-synchrony", B)]


def test_after_a_merge_a_message_the_other_side_delivered_earlier_is_no_difference() -> None:
    h = H().start(A, B).view(1, [A, B]).send(A, "a1", view=1).deliver(B, A, "a1")
    h.view(2, [A], at=[A]).view(2, [B], at=[B], creator=B)
    h.view(3, [A, B]).deliver(A, A, "a1")  # A gets its own message by the merged view's replay
    h.view(4, [A, B])
    assert check_virtual_synchrony(h.history, merged_earlier=True) == []
    assert [v.member for v in check_virtual_synchrony(h.history)] == [B]
