"""The originator's coordinator (grid/tx/coordinator.py): commit after every ack, rollback on NO and
timeouts, retries on a newer topology, pessimistic lock requests, mixed outcomes."""

from __future__ import annotations

import pytest
from groupcluster.grid.store import make_version
from groupcluster.grid.tx.config import TxConfig
from groupcluster.grid.tx.coordinator import CoordState, TxCoordinator
from groupcluster.grid.tx.messages import (
    ACK_OK,
    ACK_RETRY,
    ACK_ROLLED_BACK,
    NO,
    VOTE_RETRY,
    YES,
    TxAck,
    TxCommit,
    TxId,
    TxLock,
    TxPrepare,
    TxRollback,
    TxVote,
)
from groupcluster.grid.tx.outputs import TxLocked, TxOutcome, TxOutput, TxSend

from .grid_tx_support import O1, A, B, C, D, StaticRouter, sends


def committing_k0(router: StaticRouter) -> tuple[TxCoordinator, TxId]:
    """A coordinator whose transaction wrote k0 and got YES from A (stamping a version) and B: committing."""
    co = TxCoordinator(O1, router)
    tx = co.begin(0.0)
    co.commit(tx, {b"k0": b"x"}, 0.0)
    co.on_message(A, TxVote(tx, 1, 0, YES, 1, ((b"k0", make_version(1, 1)),)), 1.0)
    co.on_message(B, TxVote(tx, 1, 0, YES, 1), 1.0)
    return co, tx


class TestCoordinator:
    def test_all_yes_commits_after_every_ack(self) -> None:
        router = StaticRouter([A, B])
        co = TxCoordinator(O1, router)
        tx = co.begin(0.0)
        out = co.commit(tx, {b"k0": b"x", b"k1": None}, 0.0)
        preps = {o.dest: o.message for o in out if isinstance(o, TxSend)}
        assert set(preps) == {A, B}
        pa, pb = preps[A], preps[B]
        assert isinstance(pa, TxPrepare) and isinstance(pb, TxPrepare)
        assert pa.lock_keys == (b"k0",) and pb.lock_keys == (b"k1",)  # each the primary of one key
        assert {k for k, _ in pa.writes} == {b"k0", b"k1"}  # and the backup of the other
        va, vb = make_version(1, 1), make_version(1, 2)
        assert co.on_message(A, TxVote(tx, 1, 0, YES, 1, ((b"k0", va),)), 1.0) == []
        out = co.on_message(B, TxVote(tx, 1, 0, YES, 1, ((b"k1", vb),)), 1.0)
        commits = {o.dest: o.message for o in out if isinstance(o, TxSend)}
        assert all(isinstance(m, TxCommit) for m in commits.values())
        assert set(commits[A].writes) == {(b"k0", va, b"x"), (b"k1", vb, None)}  # type: ignore[union-attr]
        assert co.on_message(A, TxAck(tx, 1, ACK_OK, 1), 2.0) == []  # not reported before every ack
        out = co.on_message(B, TxAck(tx, 1, ACK_OK, 1), 2.0)
        assert out == [TxOutcome(tx, True, "", 1)]
        assert co.pending() == []

    def test_a_backup_is_told_the_version_read_of_each_key_it_backs_up(self) -> None:
        # The floor of a late stamp (TxTable.late_version): the read version of the backed-up keys, not of the
        # keys the recipient locks (it validates those), and none for a key read absent.
        co = TxCoordinator(O1, StaticRouter([A, B]))
        tx = co.begin(0.0)
        v0, v2 = make_version(1, 7), make_version(1, 9)
        out = co.commit(tx, {b"k0": b"x", b"k1": b"y", b"k2": b"z"}, 0.0, reads={b"k0": v0, b"k1": 0, b"k2": v2})
        preps = {o.dest: o.message for o in out if isinstance(o, TxSend)}
        pa, pb = preps[A], preps[B]
        assert isinstance(pa, TxPrepare) and isinstance(pb, TxPrepare)
        assert pa.lock_keys == (b"k0", b"k2") and pa.floors == ()  # A is the primary of k0 and k2
        assert pb.lock_keys == (b"k1",) and pb.floors == ((b"k0", v0), (b"k2", v2))

    def test_a_commit_whose_owners_all_left_is_reported_only_once_new_owners_have_it(self) -> None:
        # Simulation seed 1171: the originator was cut off from both owners after their YES; completing on the
        # view change reported a commit nobody had applied, and the owners, in doubt, were later rolled back.
        router = StaticRouter([A, B])
        co, tx = committing_k0(router)
        assert co.state_of(tx) == CoordState.COMMITTING
        out = co.on_view([O1], 2.0)
        assert not [o for o in out if isinstance(o, TxOutcome)]  # no answer from any owner: not committed yet
        router.members, router.topology_id = [O1], 2  # the topology of the originator's side: it owns k0 now
        out = co.on_topology(3.0)
        commits = [o for o in out if isinstance(o, TxSend) and isinstance(o.message, TxCommit)]
        assert [o.dest for o in commits] == [O1]
        out = co.on_message(O1, TxAck(tx, 1, ACK_OK, 2), 3.5)
        assert out == [TxOutcome(tx, True, "", 1)]

    @staticmethod
    def _committing_then_new_owner(voter_answer: int) -> tuple[TxCoordinator, TxId, list[TxOutput], list[TxOutput]]:
        """k0 prepared and voted on by A and B; the routing then makes C an owner (by state transfer: it never
        saw the prepare), and A answers the commit with ``voter_answer``. Returns the coordinator, the
        transaction, what the new topology produced and what A's answer produced."""
        router = StaticRouter([A, B])
        co, tx = committing_k0(router)
        assert co.state_of(tx) == CoordState.COMMITTING
        router.members, router.topology_id = [A, C], 2
        on_topology = co.on_topology(2.0)
        # A's answer names its newer topology (it answers a commit routed by topology 1)
        code_topology = 2 if voter_answer != ACK_OK else 1
        answered = co.on_message(A, TxAck(tx, 1, voter_answer, code_topology), 2.5)
        return co, tx, on_topology, answered

    def test_a_new_owner_gets_a_commit_only_once_a_voter_applied_it(self) -> None:
        co, tx, on_topology, answered = self._committing_then_new_owner(ACK_OK)
        assert C not in {o.dest for o in on_topology if isinstance(o, TxSend)}  # held back: no voter answered
        to_c = [o.message for o in answered if isinstance(o, TxSend) and o.dest == C]
        assert len(to_c) == 1 and isinstance(to_c[0], TxCommit)
        assert [w[0] for w in to_c[0].writes] == [b"k0"]
        co.on_message(C, TxAck(tx, 1, ACK_OK, 2), 3.0)
        co.on_message(B, TxAck(tx, 1, ACK_OK, 2), 3.0)  # the answers to the commits routed by topology 2
        out = co.on_message(A, TxAck(tx, 1, ACK_OK, 2), 3.0)
        assert out == [TxOutcome(tx, True, "", 1)]

    def test_a_new_owner_never_gets_a_write_its_voters_rolled_back(self) -> None:
        # Simulation seed 1461: a resolver rolled the transaction back while the originator was cut off; a new
        # owner copied the key from a rolled-back owner. Sending it the late commit made the replicas differ.
        co, tx, _, answered = self._committing_then_new_owner(ACK_ROLLED_BACK)
        to_c = [o.message for o in answered if isinstance(o, TxSend) and o.dest == C]
        assert len(to_c) == 1 and isinstance(to_c[0], TxCommit) and to_c[0].writes == ()
        assert co.state_of(tx) == CoordState.COMMITTING  # A's answer counted; B and C have not answered
        out = co.on_message(C, TxAck(tx, 1, ACK_OK, 2), 3.0) + co.on_message(B, TxAck(tx, 1, ACK_ROLLED_BACK, 2), 3.0)
        (outcome,) = [o for o in out if isinstance(o, TxOutcome)]
        assert outcome.committed and outcome.mixed

    def test_a_voter_of_other_keys_never_gets_a_write_its_voters_rolled_back(self) -> None:
        # Simulation seed 338600243 (deadlines): the originator, cut off after the votes, was itself a voter of
        # another key; a resolver rolled the transaction back on the other side, and at the merge the originator's
        # member became an owner of u2. As a voter of the commit it got u2's write, which u2's voters had rolled
        # back: the replicas differed for good.
        router = StaticRouter([A, B, C])  # k0: A, B; k1: B, C
        co = TxCoordinator(O1, router)
        tx = co.begin(0.0)
        co.commit(tx, {b"k0": b"x", b"k1": b"y"}, 0.0)
        co.on_message(A, TxVote(tx, 1, 0, YES, 1, ((b"k0", make_version(1, 1)),)), 1.0)
        co.on_message(B, TxVote(tx, 1, 0, YES, 1, ((b"k1", make_version(1, 2)),)), 1.0)
        co.on_message(C, TxVote(tx, 1, 0, YES, 1), 1.0)
        assert co.state_of(tx) == CoordState.COMMITTING
        co.on_message(A, TxAck(tx, 1, ACK_ROLLED_BACK, 1), 2.0)  # k0 rolled back where it was voted
        router.members, router.topology_id = [C, B, A], 2  # k0: C, B; k1: B, A
        out = co.on_topology(3.0)
        to_c = [o.message for o in out if isinstance(o, TxSend) and o.dest == C]
        assert len(to_c) == 1 and isinstance(to_c[0], TxCommit) and to_c[0].writes == ()

    @staticmethod
    def _committing_own_backup() -> tuple[TxCoordinator, TxId, StaticRouter, list[TxOutput]]:
        """k0 owned by A (primary) and the originator's own member O1 (backup); both voted YES: committing."""
        router = StaticRouter([A, O1])  # k0: A, O1
        co = TxCoordinator(O1, router)
        co.on_view([A, O1], 0.0)
        tx = co.begin(0.0)
        preps = co.commit(tx, {b"k0": b"x"}, 0.0)
        assert {o.dest for o in preps if isinstance(o, TxSend)} == {A, O1}
        co.on_message(O1, TxVote(tx, 1, 0, YES, 1), 1.0)
        out = co.on_message(A, TxVote(tx, 1, 0, YES, 1, ((b"k0", make_version(1, 1)),)), 1.0)
        assert co.state_of(tx) == CoordState.COMMITTING
        return co, tx, router, out

    def test_the_originators_own_member_applies_a_commit_only_after_another_member_did(self) -> None:
        # Simulation seed 681165000353 (deadlines): the originator's member applied its own commit of u10 at
        # once; a partition then cut the originator off, the resolver on the other side (every prepare-time
        # member but the originator present, none committed) rolled the transaction back, and the merge brought
        # the originator's u10 back beside the rolled-back u12: half a transaction visible.
        co, tx, _, out = self._committing_own_backup()
        assert [o.dest for o in out if isinstance(o, TxSend) and isinstance(o.message, TxCommit)] == [A]
        out = co.on_message(A, TxAck(tx, 1, ACK_OK, 1), 2.0)  # A applied it: a resolver asking A commits
        to_me = [o.message for o in out if isinstance(o, TxSend) and o.dest == O1]
        assert len(to_me) == 1 and isinstance(to_me[0], TxCommit) and to_me[0].writes[0][0] == b"k0"
        assert co.on_message(O1, TxAck(tx, 1, ACK_OK, 1), 2.1) == [TxOutcome(tx, True, "", 1)]

    def test_a_commit_the_resolver_rolled_back_while_the_originator_was_cut_off_rolls_back_its_member(self) -> None:
        co, tx, router, _ = self._committing_own_backup()
        out = co.on_view([O1], 2.0)  # cut off before A answered: A's side resolves it without us
        router.topology_id = 2  # our side's topology still names A (degraded): nobody applies it here
        out += co.on_topology(2.5) + co.tick(5.0)
        assert not [o for o in out if isinstance(o, TxSend) and o.dest == O1]
        assert not [o for o in out if isinstance(o, TxOutcome)]
        co.on_view([A, O1], 6.0)  # merged: A was rolled back by the resolver
        out = co.tick(9.0)
        assert {o.dest for o in out if isinstance(o, TxSend) and isinstance(o.message, TxCommit)} == {A}
        out = co.on_message(A, TxAck(tx, 1, ACK_ROLLED_BACK, 2), 9.5)
        (outcome,) = [o for o in out if isinstance(o, TxOutcome)]
        assert not outcome.committed and not outcome.mixed
        rollbacks = {o.dest for o in out if isinstance(o, TxSend) and isinstance(o.message, TxRollback)}
        assert rollbacks == {A, O1}  # our own member never applied it: it rolls back like the others
        co.on_message(A, TxAck(tx, 1, ACK_OK, 2), 10.0)
        assert co.on_message(O1, TxAck(tx, 1, ACK_OK, 2), 10.0) == [] and co.pending() == []

    def test_the_originators_own_member_is_released_by_a_new_owner_when_its_co_voter_crashed(self) -> None:
        co, tx, router, _ = self._committing_own_backup()
        co.on_view([O1, C], 2.0)  # A crashed before answering
        router.members, router.topology_id = [C, O1], 2  # k0: C (a new owner by state transfer), O1
        out = co.on_topology(2.5)
        to_c = [o.message for o in out if isinstance(o, TxSend) and o.dest == C]
        assert len(to_c) == 1 and isinstance(to_c[0], TxCommit) and to_c[0].writes[0][0] == b"k0"
        assert not [o for o in out if isinstance(o, TxSend) and o.dest == O1]
        out = co.on_message(C, TxAck(tx, 1, ACK_OK, 2), 3.0)
        assert [o.dest for o in out if isinstance(o, TxSend) and isinstance(o.message, TxCommit)] == [O1]
        assert co.on_message(O1, TxAck(tx, 1, ACK_OK, 2), 3.1) == [TxOutcome(tx, True, "", 1)]

    def test_an_originator_owning_every_key_alone_commits_at_once(self) -> None:
        router = StaticRouter([O1], owners=1)
        co = TxCoordinator(O1, router)
        tx = co.begin(0.0)
        co.commit(tx, {b"k0": b"x"}, 0.0)
        out = co.on_message(O1, TxVote(tx, 1, 0, YES, 1, ((b"k0", make_version(1, 1)),)), 1.0)
        assert [o.dest for o in out if isinstance(o, TxSend) and isinstance(o.message, TxCommit)] == [O1]
        assert co.on_message(O1, TxAck(tx, 1, ACK_OK, 1), 1.1) == [TxOutcome(tx, True, "", 1)]

    def test_a_new_owner_held_back_is_released_when_every_voter_left(self) -> None:
        router = StaticRouter([A, B])
        co, _ = committing_k0(router)
        router.members, router.topology_id = [C, D], 2
        out = co.on_topology(2.0)
        assert not {o.dest for o in out if isinstance(o, TxSend)} & {C, D}
        out = co.on_view([O1, C, D], 2.5)  # nobody left to ask: the owners get the write
        to_new = {o.dest: o.message for o in out if isinstance(o, TxSend)}
        assert set(to_new) == {C, D} and all(m.writes and m.writes[0][0] == b"k0" for m in to_new.values())  # type: ignore[union-attr]

    def test_a_resolution_sent_from_the_originators_member_overrules_its_decision(self) -> None:
        # Simulation seed 912: an operator rolled back, from every member, a commit its participants (in doubt)
        # had ignored. The answers to those rollbacks reached the originator's coordinator, which took them for
        # acknowledgements of its commit and sent the commit on to a new owner.
        router = StaticRouter([A, B])
        co, tx = committing_k0(router)
        assert co.resolved_here(tx, True, 2.0) == [] and co.state_of(tx) == CoordState.COMMITTING  # the same
        out = co.resolved_here(tx, False, 2.0)
        assert out == [TxOutcome(tx, False, "rolled back by a resolution while committing", 1, False)]
        assert co.state_of(tx) is None and co.pending() == []
        assert co.on_message(A, TxAck(tx, 1, ACK_OK, 1), 2.5) == []  # the rollback's answer: nothing to count

    def test_a_participant_gone_with_its_topology_already_routed_retries_at_once(self) -> None:
        # Simulation seed 1250: the driver installed the topology without the departed member before the
        # view; waiting for one topology more waited for good (the transaction stayed pending).
        router = StaticRouter([A, B])
        co = TxCoordinator(O1, router)
        tx = co.begin(0.0)
        co.commit(tx, {b"k0": b"x", b"k1": b"y"}, 0.0)
        router.members, router.topology_id = [A], 2
        co.on_topology(1.0)  # nothing to do while preparing
        out = co.on_view([O1, A], 1.0)
        preps = [o for o in out if isinstance(o, TxSend) and isinstance(o.message, TxPrepare)]
        assert preps and all(o.dest == A and o.message.attempt == 2 for o in preps)  # type: ignore[union-attr]
        assert co.state_of(tx) == CoordState.PREPARING

    def test_versions_only_from_the_keys_primary(self) -> None:
        co = TxCoordinator(O1, StaticRouter([A, B]))
        tx = co.begin(0.0)
        co.commit(tx, {b"k0": b"x"}, 0.0)  # primary A, backup B
        va = make_version(1, 5)
        co.on_message(A, TxVote(tx, 1, 0, YES, 1, ((b"k0", va),)), 1.0)
        out = co.on_message(B, TxVote(tx, 1, 0, YES, 1, ((b"k0", make_version(1, 9)),)), 1.0)  # not B's to stamp
        commits = [m for m in sends(out) if isinstance(m, TxCommit)]
        assert commits and all(m.writes == ((b"k0", va, b"x"),) for m in commits)

    def test_a_no_vote_rolls_back_at_once(self) -> None:
        co = TxCoordinator(O1, StaticRouter([A, B]))
        tx = co.begin(0.0)
        co.commit(tx, {b"k0": b"x"}, 0.0)
        out = co.on_message(A, TxVote(tx, 1, 0, NO, 1, (), "lock timeout"), 1.0)
        assert TxOutcome(tx, False, "lock timeout", 1) in out
        rollbacks = {o.dest for o in out if isinstance(o, TxSend) and isinstance(o.message, TxRollback)}
        assert rollbacks == {A, B}
        # a YES arriving afterwards changes nothing
        assert co.on_message(B, TxVote(tx, 1, 0, YES, 1), 1.5) == []
        co.on_message(A, TxAck(tx, 1, ACK_OK, 1), 2.0)
        co.on_message(B, TxAck(tx, 1, ACK_OK, 1), 2.0)
        assert co.pending() == []

    def test_timeout_rolls_back_and_resends_until_acked(self) -> None:
        co = TxCoordinator(O1, StaticRouter([A]), TxConfig.from_dict({"tx_timeout": "5s", "resend_interval": "1s"}))
        tx = co.begin(0.0)
        co.commit(tx, {b"k0": b"x"}, 0.0)
        assert co.next_deadline() == 1.0
        assert [type(m) for m in sends(co.tick(1.0))] == [TxPrepare]  # resent
        out = co.tick(5.0)
        assert TxOutcome(tx, False, "timed out before every participant voted", 1) in out
        assert [type(m) for m in sends(out)] == [TxRollback]
        assert [type(m) for m in sends(co.tick(6.0))] == [TxRollback]
        co.on_message(A, TxAck(tx, 1, ACK_OK, 1), 6.5)
        assert co.pending() == [] and co.next_deadline() is None

    def test_retry_vote_prepares_again_on_the_new_topology(self) -> None:
        router = StaticRouter([A, B], owners=1)
        co = TxCoordinator(O1, router)
        tx = co.begin(0.0)
        co.commit(tx, {b"k0": b"x"}, 0.0)
        out = co.on_message(A, TxVote(tx, 1, 0, VOTE_RETRY, 2), 1.0)
        assert [type(m) for m in sends(out)] == [TxRollback]  # attempt 1 given up; waits for topology 2
        router.topology_id, router.members = 2, [C, D]
        out = co.on_topology(1.5)
        (prep,) = sends(out)
        assert isinstance(prep, TxPrepare) and prep.attempt == 2 and prep.topology_id == 2
        assert [o.dest for o in out if isinstance(o, TxSend)] == [C]
        out = co.on_message(C, TxVote(tx, 2, 0, YES, 2, ((b"k0", make_version(2, 1)),)), 2.0)
        dests = sorted(o.dest for o in out if isinstance(o, TxSend))
        assert dests == [A, C]  # the commit also releases what attempt 1 may still hold on A
        co.on_message(A, TxAck(tx, 2, ACK_OK, 2), 3.0)
        assert co.on_message(C, TxAck(tx, 2, ACK_OK, 2), 3.0) == [TxOutcome(tx, True, "", 2)]

    def test_commit_ack_retry_sends_the_decision_to_the_new_owners(self) -> None:
        router = StaticRouter([A], owners=1)
        co = TxCoordinator(O1, router)
        tx = co.begin(0.0)
        co.commit(tx, {b"k0": b"x"}, 0.0)
        co.on_message(A, TxVote(tx, 1, 0, YES, 1, ((b"k0", make_version(1, 1)),)), 1.0)
        assert co.on_message(A, TxAck(tx, 1, ACK_RETRY, 2), 2.0) == []  # not done: k0 may have moved
        router.topology_id, router.members = 2, [D]
        out = co.on_topology(2.5)
        commits = {o.dest: o.message for o in out if isinstance(o, TxSend)}
        assert set(commits) == {A, D}  # D owns k0 now; A is asked again under topology 2 (it owns nothing)
        assert commits[D] == TxCommit(tx, 1, 2, ((b"k0", make_version(1, 1), b"x"),))
        assert commits[A] == TxCommit(tx, 1, 2, ())
        # an answer to the topology-1 message does not count for the topology-2 one
        assert co.on_message(A, TxAck(tx, 1, ACK_OK, 1), 2.7) == []
        assert co.on_message(A, TxAck(tx, 1, ACK_OK, 2), 2.8) == []
        assert co.on_message(D, TxAck(tx, 1, ACK_OK, 2), 3.0) == [TxOutcome(tx, True, "", 1)]

    def test_participant_leaving_before_its_vote_means_a_new_attempt(self) -> None:
        router = StaticRouter([A, B], owners=1)
        co = TxCoordinator(O1, router)
        co.on_view([A, B, O1], 0.0)
        tx = co.begin(0.0)
        co.commit(tx, {b"k0": b"x", b"k1": b"y"}, 0.0)
        co.on_view([A, O1], 1.0)  # B crashed
        router.topology_id, router.members = 2, [A]
        (p1,) = [m for m in sends(co.on_topology(1.5)) if isinstance(m, TxPrepare)]
        assert p1.attempt == 2 and p1.lock_keys == (b"k0", b"k1")

    def test_pessimistic_lock(self) -> None:
        co = TxCoordinator(O1, StaticRouter([A, B], owners=2), TxConfig.from_dict({"locking": "pessimistic"}))
        tx = co.begin(0.0)
        out = co.lock(tx, [b"k0", b"k1"], 0.0)
        # primaries one at a time, in address order: B only once A granted its keys
        assert [(o.dest, o.message) for o in out if isinstance(o, TxSend)] == [(A, TxLock(tx, 1, 1, 1, (b"k0",)))]
        with pytest.raises(ValueError, match="still waits"):
            co.commit(tx, {}, 0.0)
        out = co.on_message(A, TxVote(tx, 1, 1, YES, 1), 0.5)
        assert [(o.dest, o.message) for o in out if isinstance(o, TxSend)] == [(B, TxLock(tx, 1, 1, 1, (b"k1",)))]
        assert co.on_message(B, TxVote(tx, 1, 1, YES, 1), 0.5) == [TxLocked(tx, 1, True)]
        assert co.lock(tx, [b"k0"], 0.6) == [TxLocked(tx, 2, True)]  # held already
        out = co.commit(tx, {b"k0": b"x"}, 1.0)
        preps = {o.dest: o.message for o in out if isinstance(o, TxSend)}
        assert preps[B].lock_keys == (b"k1",)  # type: ignore[union-attr]  # read-locked keys stay locked
        # a refused lock request rolls back
        tx2 = co.begin(2.0)
        co.lock(tx2, [b"k0"], 2.0)
        out = co.on_message(A, TxVote(tx2, 1, 1, NO, 1, (), "lock timeout on key b'k0'"), 3.0)
        assert out[0] == TxLocked(tx2, 1, False, "lock timeout on key b'k0'")
        assert isinstance(out[1], TxOutcome) and not out[1].committed
        with pytest.raises(ValueError, match="optimistic"):
            co.lock(co.begin(4.0, "optimistic"), [b"k0"], 4.0)

    def test_mixed_outcome_is_reported(self) -> None:
        co = TxCoordinator(O1, StaticRouter([A], owners=1))
        tx = co.begin(0.0)
        co.commit(tx, {b"k0": b"x"}, 0.0)
        co.on_message(A, TxVote(tx, 1, 0, YES, 1, ((b"k0", make_version(1, 1)),)), 1.0)
        (outcome,) = co.on_message(A, TxAck(tx, 1, ACK_ROLLED_BACK, 1), 2.0)
        assert isinstance(outcome, TxOutcome) and outcome.committed and outcome.mixed

    def test_empty_transaction_commits_locally(self) -> None:
        co = TxCoordinator(O1, StaticRouter([A]))
        tx = co.begin(0.0)
        assert co.commit(tx, {}, 0.0) == [TxOutcome(tx, True, "", 1)]
        tx = co.begin(0.0)
        assert co.rollback(tx, 0.0) == [TxOutcome(tx, False, "rolled back by the client", 1)]
        assert co.pending() == []
