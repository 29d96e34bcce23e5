"""Deciding in-doubt transactions (grid/tx/resolution.py): the automatic rule on hand-made reports, the
view coordinator's resolver rounds, and the termination decision."""

from __future__ import annotations

from groupcluster.core.address import Address
from groupcluster.grid.store import make_version
from groupcluster.grid.tx.config import TxConfig
from groupcluster.grid.tx.messages import (
    ACK_OK,
    TxAck,
    TxCommit,
    TxId,
    TxPrepare,
    TxReportAnswer,
    TxReportInfo,
    TxReportRequest,
)
from groupcluster.grid.tx.outputs import TxSend
from groupcluster.grid.tx.records import TxState
from groupcluster.grid.tx.resolution import TxDecided, TxResolver, report_info, resolution, termination_decision

from .grid_tx_support import O1, O2, O3, RESOLVER, A, B, C, D, prepare, seg, sends, table, tid


class TestAutomaticResolution:
    """The view coordinator's resolver (TxResolver) and the decision rule (resolution)."""

    T = TxId(O1, 3)

    @staticmethod
    def rep(
        state: int, in_doubt: bool = False, views: tuple[Address, ...] = (A, B, C, O1), **kw: object
    ) -> TxReportInfo:
        tx = kw.get("tx", TestAutomaticResolution.T)
        if state == -1:
            return TxReportInfo(tx, -1, 0, False, bool(kw.get("deciding")), (), (), ())  # type: ignore[arg-type]
        writes = kw.get("writes", ((b"k1", b"v1"),))
        versions = kw.get("versions", ())
        return TxReportInfo(tx, state, 1, in_doubt, bool(kw.get("deciding")), writes, versions, views)  # type: ignore[arg-type]

    def test_the_rule(self) -> None:
        P, CM, RB, UNK = int(TxState.PREPARED), int(TxState.COMMITTED), int(TxState.ROLLED_BACK), -1
        members = (A, B, C)
        r = self.rep
        # some member committed it: commit, whoever else left
        assert resolution(self.T, {A: r(P, True, (A, B, C, D, O1)), B: r(CM)}, members) is True
        # nobody committed and every member of the prepare-time view but the originator answered: roll back
        assert resolution(self.T, {A: r(P, True), B: r(RB), C: r(UNK)}, members) is False
        # a member of the prepare-time view left: it may have committed; stays in doubt, saying why
        why = resolution(self.T, {A: r(P, True, (A, B, C, D, O1)), B: r(P, True), C: r(UNK)}, members)
        assert isinstance(why, str) and "prepare-time view left" in why and str(D) in why
        # a member that has not seen the originator leave would still take its late commit: wait
        why = resolution(self.T, {A: r(P, True), B: r(P, False), C: r(UNK)}, members)
        assert isinstance(why, str) and str(B) in why and "not seen its originator leave" in why
        # the originator is back (a merge) and still deciding: wait for it
        why = resolution(self.T, {A: r(P, True), O1: r(UNK, deciding=True)}, (A, O1))
        assert isinstance(why, str) and "has not decided" in why
        why = resolution(self.T, {A: r(P, True), O1: r(P, deciding=True)}, (A, O1))
        assert isinstance(why, str)
        # the originator is back and decided rollback: roll back, even with a prepare-time member gone
        assert resolution(self.T, {A: r(P, True, (A, B, C, D, O1)), O1: r(RB)}, (A, O1)) is False
        # ... but not on a report in its name from a member that is not it
        why = resolution(self.T, {A: r(P, True, (A, D, O1)), B: r(RB)}, (A, B))
        assert isinstance(why, str)

    def answer(self, request: int, *reports: TxReportInfo) -> TxReportAnswer:
        return TxReportAnswer(request, tuple(reports))

    def test_only_the_view_coordinator_asks(self) -> None:
        res = TxResolver(A, TxConfig())
        assert res.on_view([B, A, C], 0.0, removed=True) == []
        assert res.next_deadline() is None
        res.enabled = False
        assert res.on_view([A, B], 0.0, removed=True) == [] and res.next_deadline() is None

    def test_request_answers_decide_and_rounds_repeat_while_in_doubt(self) -> None:
        res = TxResolver(A, TxConfig(resend_interval=3.0))
        out = res.on_view([A, B, C], 10.0, removed=True)
        assert out == [TxSend(m, TxReportRequest(1, (), (A, B, C))) for m in (A, B, C)]
        assert res.next_deadline() == 13.0
        P, CM = int(TxState.PREPARED), int(TxState.COMMITTED)
        # Round 1: B lists it in doubt. A round that did not name it asks every member about it at once.
        assert res.on_answer(A, self.answer(1), 10.1) == []
        assert res.on_answer(B, self.answer(1, self.rep(P, True)), 10.1) == []
        assert res.on_answer(B, self.answer(1), 10.1) == []  # a duplicate: ignored
        out = res.on_answer(C, self.answer(1), 10.1)
        assert out == [TxSend(m, TxReportRequest(2, (self.T,), (A, B, C))) for m in (A, B, C)]
        # Round 2: C committed it (with a version), B holds it in doubt with another key's version.
        assert res.on_answer(C, self.answer(1, self.rep(CM)), 10.2) == []  # an older round's answer: ignored
        res.on_answer(A, self.answer(2, self.rep(-1)), 10.2)
        v1, v2 = make_version(2, 1), make_version(2, 2)
        b_rep = self.rep(P, True, writes=((b"k2", b"v2"),), versions=((b"k2", v2),))
        res.on_answer(B, self.answer(2, b_rep), 10.2)
        (decided,) = res.on_answer(C, self.answer(2, self.rep(CM, versions=((b"k1", v1),))), 10.2)
        assert decided == TxDecided(self.T, True, 1, ((b"k1", b"v1"), (b"k2", b"v2")), ((b"k1", v1), (b"k2", v2)), (B,))
        assert res.undecided == {}
        # It was in doubt in this round: another follows after resend_interval, and says nothing is left.
        assert res.tick(12.0) == []
        out = res.tick(13.2)
        assert out == [TxSend(m, TxReportRequest(3, (self.T,), (A, B, C))) for m in (A, B, C)]
        for m in (A, B, C):
            res.on_answer(m, self.answer(3, self.rep(CM if m != A else -1)), 13.3)
        assert res.next_deadline() is None and res.rounds == 3 and res.decided == 1

    def test_undecided_stays_listed_and_is_asked_again_then_rolled_back_once_answerable(self) -> None:
        res = TxResolver(A, TxConfig(resend_interval=3.0))
        res.on_view([A, B], 0.0, removed=True)
        P = int(TxState.PREPARED)
        res.on_answer(A, self.answer(1, self.rep(P, True, (A, B, C, O1))), 0.1)
        res.on_answer(B, self.answer(1), 0.1)  # round 2 at once: it names the transaction
        res.on_answer(A, self.answer(2, self.rep(P, True, (A, B, C, O1))), 0.2)
        assert res.on_answer(B, self.answer(2, self.rep(-1)), 0.2) == []
        assert str(C) in res.undecided[self.T] and res.next_deadline() == 3.1  # round 2 began at 0.1
        # C is back (a merge), answers, and knows nothing of it: every member but the originator answered.
        out = res.on_view([A, B, C], 1.0, removed=True)
        assert out == [TxSend(m, TxReportRequest(3, (self.T,), (A, B, C))) for m in (A, B, C)]
        res.on_answer(A, self.answer(3, self.rep(P, True, (A, B, C, O1))), 1.1)
        res.on_answer(B, self.answer(3, self.rep(-1)), 1.1)
        (decided,) = res.on_answer(C, self.answer(3, self.rep(-1)), 1.1)
        assert isinstance(decided, TxDecided) and decided.commit is False and decided.members == (A,)
        assert res.undecided == {}

    def test_a_member_whose_view_is_behind_is_asked_again(self) -> None:
        # Simulation seed 446: in the round of the view change, a member that had not installed the view yet
        # had the transaction prepared, not in doubt; it reported nothing and no round followed. Now a request
        # carries the coordinator's view, and a prepared record of an originator outside it is reported.
        t, _ = table(B)
        t.on_view([A, B, O1], 0.0)  # the view at the prepare
        tx = tid(1)
        t.on_message(O1, prepare(tx, [b"k1"]), 0.0)
        assert t.unresolved() == [] and t.unresolved([A, B, O1]) == [] and t.unresolved([A, B]) == [tx]
        res = TxResolver(A, TxConfig(resend_interval=3.0))
        res.on_view([A, B], 0.0, removed=True)
        res.on_answer(A, self.answer(1), 0.1)
        out = res.on_answer(B, self.answer(1, report_info(t.report(tx))), 0.1)
        assert out == [TxSend(m, TxReportRequest(2, (tx,), (A, B))) for m in (A, B)]
        res.on_answer(A, self.answer(2, self.rep(-1, tx=tx)), 0.2)
        assert res.on_answer(B, self.answer(2, report_info(t.report(tx))), 0.2) == []
        assert "not seen its originator leave" in res.undecided[tx] and res.next_deadline() == 3.1
        t.on_view([A, B], 1.0)  # B installs the view: in doubt now; the next round decides
        res.tick(3.1)
        res.on_answer(A, self.answer(3, self.rep(-1, tx=tx)), 3.2)
        (decided,) = res.on_answer(B, self.answer(3, report_info(t.report(tx))), 3.2)
        assert isinstance(decided, TxDecided) and decided.tx == tx and decided.commit is False

    def test_a_member_that_never_answers_makes_the_round_repeat(self) -> None:
        res = TxResolver(A, TxConfig(resend_interval=3.0))
        res.on_view([A, B], 0.0, removed=True)
        res.on_answer(A, self.answer(1), 0.1)
        assert res.tick(3.0) == [TxSend(m, TxReportRequest(2, (), (A, B))) for m in (A, B)]

    def test_reports_carry_the_prepare_time_view(self) -> None:
        t, _ = table(B)
        tx = tid(1)
        t.on_message(O1, prepare(tx, [b"k1"]), 0.0)
        info = report_info(t.report(tx))
        assert info.state == TxState.PREPARED and not info.in_doubt and set(info.views) == {A, B, C, D, O1, O2, O3}
        t.on_view([A, B], 1.0)
        info = report_info(t.report(tx))
        assert info.in_doubt and set(info.views) == {A, B, C, D, O1, O2, O3}  # the view at the prepare, not now
        assert report_info(t.report(tid(2))) == TxReportInfo(tid(2), -1, 0, False, False, (), (), ())

    def test_the_current_primary_stamps_a_committed_write_whose_version_died_with_the_originator(self) -> None:
        # Seed 19's state: committed here (a resolver's commit without k1's version), k1's write from the prepare
        # (as a backup), now its primary; the originator, which stamped k1, is gone.
        t, store = table(B)
        tx = tid(1)
        t.on_message(O1, prepare(tx, [b"k1"], lock=()), 0.0)
        t.promote([seg(b"k1")])
        assert t.stamp_committed(lambda k: True, 0.5) == ([], [])  # not committed yet
        t.on_view([A, B], 1.0)
        t.on_message(RESOLVER, TxCommit(tx, 1, 1, ()), 2.0)
        assert t.state_of(tx) == TxState.COMMITTED and t.locks.held_by(tx) == {b"k1"}  # waits for a version
        assert t.stamp_committed(lambda k: False, 2.5) == ([], [])  # not its primary: nothing
        _, stamped = t.stamp_committed(lambda k: True, 3.0)
        (v,) = [v for k, v, _ in stamped[0][2]]
        assert stamped == [(tx, 1, ((b"k1", v, b"vk1"),))] and store.data[b"k1"] == (v, b"vk1")
        assert t.locks.empty() and t.report(tx).versions == ((b"k1", v),)
        assert t.stamp_committed(lambda k: True, 4.0) == ([], [])  # once

    def test_a_late_stamp_lands_just_above_the_floor_under_a_later_transactions_write(self) -> None:
        # Seed 760155000251's state: the originator, k1's primary, applied tx (read k1 at version F, so stamped
        # above it), released k1, and a later tx2 that read tx's value committed k1 at V2 on this backup too; the
        # originator died before this backup got tx's commit. Stamped afresh (topology 2 > V2's 1), tx's write
        # overwrote tx2's: the counter went back. Stamped at F + 1 it stays under V2, and tx2's write stands.
        t, store = table(B, topology_id=2)
        tx, tx2 = tid(1), tid(2, O2)
        floor, v2 = make_version(1, 100), make_version(1, 200)
        t.on_message(O1, TxPrepare(tx, 1, 2, (), ((b"k1", b"tx"),), (), True, ((b"k1", floor),)), 0.0)
        t.on_message(O2, TxPrepare(tx2, 1, 2, (), ((b"k1", b"tx2"),)), 0.1)
        t.on_message(O2, TxCommit(tx2, 1, 2, ((b"k1", v2, b"tx2"),)), 0.2)
        t.promote([seg(b"k1")])
        t.on_view([A, B, O2], 1.0)
        t.on_message(RESOLVER, TxCommit(tx, 1, 2, (), True), 2.0)
        _, stamped = t.stamp_committed(lambda k: True, 3.0)
        assert stamped == [(tx, 1, ((b"k1", floor + 1, b"tx"),))]  # the owners it goes to store the same
        assert store.data[b"k1"] == (v2, b"tx2") and t.locks.empty()

    def test_a_late_stamp_without_a_floor_is_a_fresh_one(self) -> None:
        t, store = table(B, topology_id=2)
        tx = tid(1)
        t.on_message(O1, TxPrepare(tx, 1, 2, (), ((b"k1", b"tx"),), (), True), 0.0)
        t.promote([seg(b"k1")])
        t.on_view([A, B], 1.0)
        t.on_message(RESOLVER, TxCommit(tx, 1, 2, (), True), 2.0)
        _, stamped = t.stamp_committed(lambda k: True, 3.0)
        assert stamped == [(tx, 1, ((b"k1", make_version(2, 1), b"tx"),))] and store.data[b"k1"][1] == b"tx"

    def test_an_in_doubt_participant_takes_a_resolvers_decision_even_from_the_originators_address(self) -> None:
        t, store = table()
        tx = tid(1)
        t.on_message(O1, prepare(tx, [b"k1"]), 0.0)
        t.on_view([A, B], 1.0)
        (doubt,) = t.in_doubt()
        v = doubt.versions[0][1]
        assert sends(t.on_message(O1, TxCommit(tx, 1, 1, ((b"k1", v, b"vk1"),)), 2.0)) == []  # its late commit: no
        assert t.in_doubt() != []
        # Back after a partition and view coordinator, it resolves: that counts.
        out = t.on_message(O1, TxCommit(tx, 1, 1, ((b"k1", v, b"vk1"),), True), 3.0)
        assert sends(out) == [TxAck(tx, 1, ACK_OK, 1)] and store.data[b"k1"] == (v, b"vk1") and t.locks.empty()

    def test_no_stamp_while_the_originator_lives(self) -> None:
        t, _ = table(B)
        tx = tid(1)
        t.on_message(O1, prepare(tx, [b"k1"], lock=()), 0.0)
        t.promote([seg(b"k1")])
        t.on_message(RESOLVER, TxCommit(tx, 1, 1, ()), 2.0)
        assert t.locks.held_by(tx) == {b"k1"}
        assert t.stamp_committed(lambda k: True, 3.0) == ([], [])  # its commit will carry the version


def test_termination_decision() -> None:
    P, Cm, R, A_ = TxState.PREPARED, TxState.COMMITTED, TxState.ROLLED_BACK, TxState.ACTIVE
    assert termination_decision([]) is None
    assert termination_decision([P, P]) is False
    assert termination_decision([P, Cm]) is True
    assert termination_decision([P, R]) is False
    assert termination_decision([P, None]) is False
    assert termination_decision([A_, P]) is False
