"""The originator's side of two-phase commit: :class:`TxCoordinator` sends a transaction's prepares to the
owners of its keys, gathers the votes, decides (commit only on a YES from every participant of one attempt;
presumed abort otherwise), retries on a newer topology and reports a :class:`~.outputs.TxOutcome` once the
decision is complete."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import IntEnum

from ...core.address import Address
from .config import LockingMode, TxConfig
from .messages import (
    ACK_COMMITTED,
    ACK_OK,
    ACK_RETRY,
    ACK_ROLLED_BACK,
    NO,
    VOTE_RETRY,
    TxAck,
    TxCommit,
    TxId,
    TxLock,
    TxMessage,
    TxPrepare,
    TxRollback,
    TxVote,
    VersionedWrite,
    Write,
)
from .outputs import TxLocked, TxOutcome, TxOutput, TxSend
from .records import ABSENT, TxReport, TxState

# (keys) -> (topology id, key -> owners, primary first): the originator's current routing.
Router = Callable[[Sequence[bytes]], tuple[int, Mapping[bytes, Sequence[Address]]]]
# What the originator sends and waits for an answer to (kept per member until it comes, resent meanwhile).
Sent = TxLock | TxPrepare | TxCommit | TxRollback


class CoordState(IntEnum):
    ACTIVE = 0  # the client works (pessimistic lock requests may run)
    PREPARING = 1  # prepares of the current attempt sent, votes being gathered
    WAITING = 2  # a participant answered RETRY: waiting for a newer topology to prepare again
    COMMITTING = 3  # decided commit: waiting for every owner's ack
    ROLLING_BACK = 4  # decided rollback (outcome reported): releasing locks everywhere
    DONE = 5


@dataclass(slots=True)
class _CTx:
    tx: TxId
    mode: LockingMode
    state: CoordState = CoordState.ACTIVE
    attempt: int = 1
    writes: dict[bytes, bytes | None] = field(default_factory=dict)
    reads: dict[bytes, int] = field(default_factory=dict)
    locked: set[bytes] = field(default_factory=set)  # pessimistic locks granted
    # every key ever asked of a participant: the decision goes to all their owners (a lock request that
    # failed as a whole may still hold some of its keys somewhere, or their lock information moved)
    touched: set[bytes] = field(default_factory=set)
    deadline: float = 0.0
    resend_at: float = 0.0
    need_topology: int = 0
    contacted: set[Address] = field(default_factory=set)
    # the messages of the current phase not answered yet, by destination (resent on resend_at)
    unanswered: dict[Address, Sent] = field(default_factory=dict)
    votes: dict[Address, TxVote] = field(default_factory=dict)
    primary_of: dict[bytes, Address] = field(default_factory=dict)
    versions: dict[bytes, int] = field(default_factory=dict)
    # lock requests: how many were made, the one in progress (0: none) and its keys
    requests: int = 0
    request: int = 0
    request_keys: tuple[bytes, ...] = ()
    # the lock request's primaries not asked yet, in the global order (see _send_locks)
    lock_plan: list[tuple[Address, TxLock]] = field(default_factory=list)
    acked: dict[Address, int] = field(default_factory=dict)  # completion acks: member -> topology id
    reason: str = ""
    mixed: bool = False
    # The committed attempt's voters per written key: the owners its prepare went to (each voted YES). A
    # member that voted on none of the keys but owns some now is ``held`` back until a voter of each of its
    # keys answered the commit: applied (the key is ``confirmed``, its write goes) or rolled back (``refused``,
    # its write never goes); see _send_completion.
    voters_of: dict[bytes, tuple[Address, ...]] = field(default_factory=dict)
    confirmed: set[bytes] = field(default_factory=set)
    refused: set[bytes] = field(default_factory=set)
    held: set[Address] = field(default_factory=set)
    # The originator's own member, a voter, gets the commit only once another member applied it (``released``;
    # see _own_held). ``carried``: members that voted on none of the keys and were sent writes anyway.
    released: bool = False
    carried: set[Address] = field(default_factory=set)


class TxCoordinator:
    """The originator's side: one instance per member, any number of transactions.

    ``router(keys)`` returns the originator's current topology id and the owners of each key (primary
    first); call :meth:`on_topology` whenever it changes. The outcome of a transaction is one
    :class:`TxOutcome`: committed only after every owner acknowledged the commit; rolled back on any NO, a
    timeout before the decision, or :meth:`rollback`.
    """

    def __init__(self, address: Address, router: Router, config: TxConfig | None = None) -> None:
        self.address = address
        self.config = config or TxConfig()
        self._router = router
        self._seq = 0
        self._txs: dict[TxId, _CTx] = {}
        self._members: frozenset[Address] | None = None

    # -- queries

    def state_of(self, tx: TxId) -> CoordState | None:
        c = self._txs.get(tx)
        return None if c is None else c.state

    def pending(self) -> list[TxId]:
        return sorted(self._txs)

    def decided(self, tx: TxId) -> TxReport | None:
        """The decision taken and still being completed, as a report: COMMITTED (with the commit's writes and
        versions) or ROLLED_BACK; None before a decision or once done."""
        c = self._txs.get(tx)
        if c is None or c.state not in (CoordState.COMMITTING, CoordState.ROLLING_BACK):
            return None
        if c.state == CoordState.ROLLING_BACK:
            return TxReport(tx, TxState.ROLLED_BACK, c.attempt, (), ())
        return TxReport(
            tx, TxState.COMMITTED, c.attempt, tuple(sorted(c.writes.items())), tuple(sorted(c.versions.items()))
        )

    def next_deadline(self) -> float | None:
        out: list[float] = []
        for c in self._txs.values():
            if self._timed(c):
                out.append(c.deadline)
            if c.unanswered:
                out.append(c.resend_at)
        return min(out, default=None)

    @staticmethod
    def _timed(c: _CTx) -> bool:
        """Before the decision, while something is asked of the participants, the transaction has a deadline."""
        return c.state in (CoordState.PREPARING, CoordState.WAITING) or (c.state == CoordState.ACTIVE and c.request > 0)

    # -- the client's calls

    def begin(self, now: float, mode: LockingMode | str | None = None) -> TxId:
        self._seq += 1
        tx = TxId(self.address, self._seq)
        m = self.config.mode if mode is None else LockingMode(mode)
        self._txs[tx] = _CTx(tx, m, deadline=now + self.config.tx_timeout)
        return tx

    def lock(self, tx: TxId, keys: Iterable[bytes], now: float) -> list[TxOutput]:
        """Pessimistic mode: lock ``keys`` on their primaries now; a :class:`TxLocked` answers."""
        c = self._get(tx, CoordState.ACTIVE)
        if c.mode != LockingMode.PESSIMISTIC:
            raise ValueError(f"transaction {tx} is optimistic: keys are locked at prepare")
        if c.request:
            raise ValueError(f"transaction {tx} already waits for a lock request")
        c.request_keys = tuple(sorted(set(keys) - c.locked))
        c.requests += 1
        out: list[TxOutput] = []
        if not c.request_keys:
            out.append(TxLocked(tx, c.requests, True))
            return out
        c.request = c.requests
        c.deadline = now + self.config.tx_timeout
        self._send_locks(c, now, out)
        return out

    def commit(
        self,
        tx: TxId,
        writes: Mapping[bytes, bytes | None],
        now: float,
        reads: Mapping[bytes, int] | None = None,
    ) -> list[TxOutput]:
        """Start two-phase commit: ``writes`` (key -> value, None deletes) and the versions the transaction
        read (key -> version, 0 absent; validated on the primaries)."""
        c = self._get(tx, CoordState.ACTIVE)
        if c.request:
            raise ValueError(f"transaction {tx} still waits for a lock request")
        c.writes = dict(writes)
        c.reads = dict(reads or {})
        c.deadline = now + self.config.tx_timeout
        out: list[TxOutput] = []
        if not c.writes and not c.reads and not c.locked:
            self._done(c, True, out)  # nothing to do anywhere
            return out
        self._send_prepares(c, now, out)
        return out

    def rollback(self, tx: TxId, now: float) -> list[TxOutput]:
        c = self._txs.get(tx)
        if c is None or c.state >= CoordState.COMMITTING:
            raise ValueError(f"transaction {tx} is not running (state {None if c is None else c.state.name})")
        out: list[TxOutput] = []
        self._decide(c, False, now, out, "rolled back by the client")
        return out

    # -- inputs

    def on_message(self, src: Address, msg: TxMessage, now: float) -> list[TxOutput]:
        out: list[TxOutput] = []
        if isinstance(msg, TxVote):
            c = self._txs.get(msg.tx)
            if c is not None and msg.attempt == c.attempt:
                if msg.request == 0 and c.state == CoordState.PREPARING:
                    self._on_prepare_vote(c, src, msg, now, out)
                elif msg.request and msg.request == c.request and c.state == CoordState.ACTIVE:
                    self._on_lock_vote(c, src, msg, now, out)
        elif isinstance(msg, TxAck):
            c = self._txs.get(msg.tx)
            if c is not None and c.state in (CoordState.COMMITTING, CoordState.ROLLING_BACK):
                self._on_ack(c, src, msg, now, out)
        return out

    def resolved_here(self, tx: TxId, commit: bool, now: float) -> list[TxOutput]:
        """This member sent a resolution of ``tx`` (an operator's, or the automatic resolver's) while this
        originator still completes its own decision. The same decision: nothing changes. The other one
        overrules ours and we stop sending it: an overruled commit is reported rolled back (mixed when a voter
        had applied it); an overruled rollback was reported when it was decided, so nothing more is. The
        answers to the resolution come back here and cannot be told from answers to our decision, so going on
        would take them for acknowledgements of it (simulation seed 912: an operator rolled back, on every
        member, a commit the participants in doubt had ignored; the originator took their acks of the rollback
        for applied commits and sent the commit on to a new owner)."""
        c = self._txs.get(tx)
        if c is None or c.state not in (CoordState.COMMITTING, CoordState.ROLLING_BACK):
            return []
        if commit == (c.state == CoordState.COMMITTING):
            return []
        out: list[TxOutput] = []
        if c.state == CoordState.COMMITTING:
            # Reported as rolled back: no client was told it committed (that waits for every ack).
            reason = "rolled back by a resolution while committing"
            out.append(TxOutcome(c.tx, False, reason, c.attempt, bool(c.confirmed)))
        self._done(c, None, out)
        return out

    def on_topology(self, now: float) -> list[TxOutput]:
        """The router's topology changed: retry what waited for it; send decisions to the new owners."""
        out: list[TxOutput] = []
        tid, _ = self._router(())
        for tx in sorted(self._txs):
            c = self._txs[tx]
            # Owners of any topology seen during the transaction may hold its lock information (pushed to a
            # primary of that topology, possibly arriving late): the decision goes to all of them.
            _, owners = self._router(sorted(c.touched))
            c.contacted.update(o for route in owners.values() for o in route)
            if c.state == CoordState.WAITING and tid >= c.need_topology:
                c.attempt += 1
                self._send_prepares(c, now, out)
            elif c.state == CoordState.ACTIVE and c.request and c.need_topology and tid >= c.need_topology:
                c.need_topology = 0
                self._send_locks(c, now, out)
            elif c.state in (CoordState.COMMITTING, CoordState.ROLLING_BACK):
                self._send_completion(c, now, out)
        return out

    def on_view(self, members: Iterable[Address], now: float) -> list[TxOutput]:
        """Members that left answer nothing more: a missing vote from one means a new attempt once the
        topology without it arrives; a missing ack means the new owners get the decision then."""
        self._members = frozenset(members)
        out: list[TxOutput] = []
        tid, _ = self._router(())
        for tx in sorted(self._txs):
            c = self._txs[tx]
            gone = {d for d in c.unanswered if d not in self._members}
            # a primary of the lock request not asked yet counts too: it would never answer
            planned_gone = {d for d, _ in c.lock_plan if d not in self._members}
            if not gone and not planned_gone:
                continue
            for d in gone:
                del c.unanswered[d]
            gone |= planned_gone
            # The topology without them is the next one, unless the router has it already (a driver can install
            # it before the view: waiting for one more would wait for good, simulation seed 1250).
            _, owners = self._router(sorted(c.touched))
            owner_gone = any(o in gone for route in owners.values() for o in route)
            need = tid + 1 if owner_gone else tid
            if c.state == CoordState.PREPARING:
                self._abandon(c, need, now, out)
            elif c.state == CoordState.ACTIVE and c.request:
                c.need_topology = need  # resend the lock request to the new primaries
                c.unanswered.clear()
                c.lock_plan = []
                if need <= tid:
                    c.need_topology = 0
                    self._send_locks(c, now, out)
            elif c.state in (CoordState.COMMITTING, CoordState.ROLLING_BACK):
                if owner_gone:
                    # An owner left without acknowledging the decision: the owners of the topology that
                    # replaces it must have it before a commit is reported (they take its keys over). Completing
                    # now reported a commit nobody had applied when every owner was cut off from the originator
                    # (simulation seed 1171: the participants, in doubt, were then rolled back).
                    c.need_topology = max(c.need_topology, tid + 1)
                if c.held:
                    # voters that left may release members held back for them
                    self._send_completion(c, now, out, only=c.held)
                else:
                    self._maybe_complete(c, out)
        return out

    def tick(self, now: float) -> list[TxOutput]:
        out: list[TxOutput] = []
        for tx in sorted(self._txs):
            c = self._txs[tx]
            timed = c.state in (CoordState.PREPARING, CoordState.WAITING) or (
                c.state == CoordState.ACTIVE and c.request
            )
            if timed and now >= c.deadline:
                if c.state == CoordState.ACTIVE:
                    out.append(TxLocked(tx, c.request, False, "lock request timed out"))
                self._decide(c, False, now, out, "timed out before every participant voted")
                continue
            if c.unanswered and now >= c.resend_at:
                if c.state in (CoordState.COMMITTING, CoordState.ROLLING_BACK):
                    self._send_completion(c, now, out)  # routed anew: the owners may have changed
                    continue
                for dest, msg in sorted(c.unanswered.items()):
                    out.append(TxSend(dest, msg))
                c.resend_at = now + self.config.resend_interval
        return out

    # -- internals

    def _get(self, tx: TxId, state: CoordState) -> _CTx:
        c = self._txs.get(tx)
        if c is None or c.state != state:
            got = "unknown" if c is None else c.state.name
            raise ValueError(f"transaction {tx} is {got}, expected {state.name}")
        return c

    def _send(self, c: _CTx, dest: Address, msg: Sent, now: float, out: list[TxOutput]) -> None:
        c.contacted.add(dest)
        c.unanswered[dest] = msg
        c.resend_at = now + self.config.resend_interval
        out.append(TxSend(dest, msg))

    def _send_locks(self, c: _CTx, now: float, out: list[TxOutput]) -> None:
        """Send a pessimistic lock request to its primaries **one at a time, in address order** (the next
        only once the previous granted its keys; each primary takes its keys in key order). Every waiting
        request then holds only locks below, in the global (primary, key) order, the one it waits for, so
        lock requests cannot wait for each other in a cycle across members; asking every primary at once
        let two transactions each hold a key on one member and wait on the other until the lock timeout.
        The price is one round trip per primary. Lock requests made one after another by the same
        transaction (keys locked as the client touches them) are outside this order: the lock timeout
        still breaks such cycles."""
        c.touched.update(c.request_keys)
        tid, owners = self._router(c.request_keys)
        by_primary: dict[Address, list[bytes]] = {}
        for key in c.request_keys:
            by_primary.setdefault(owners[key][0], []).append(key)
        c.unanswered.clear()
        c.votes.clear()
        c.lock_plan = [
            (dest, TxLock(c.tx, c.attempt, c.request, tid, tuple(by_primary[dest]))) for dest in sorted(by_primary)
        ]
        self._send_next_lock(c, now, out)

    def _send_next_lock(self, c: _CTx, now: float, out: list[TxOutput]) -> None:
        dest, msg = c.lock_plan.pop(0)
        self._send(c, dest, msg, now, out)

    def _on_lock_vote(self, c: _CTx, src: Address, vote: TxVote, now: float, out: list[TxOutput]) -> None:
        if src not in c.unanswered:
            return
        del c.unanswered[src]
        if vote.code == NO:
            out.append(TxLocked(c.tx, c.request, False, vote.reason))
            self._decide(c, False, now, out, vote.reason or "lock refused")
        elif vote.code == VOTE_RETRY:
            c.unanswered.clear()
            c.lock_plan = []
            c.need_topology = vote.topology_id
            tid, _ = self._router(())
            if tid >= c.need_topology:
                c.need_topology = 0
                self._send_locks(c, now, out)
        elif not c.unanswered and not c.need_topology and c.lock_plan:
            self._send_next_lock(c, now, out)  # the next primary in the order
        elif not c.unanswered and not c.need_topology:
            c.locked.update(c.request_keys)
            out.append(TxLocked(c.tx, c.request, True))
            c.request_keys = ()
            c.request = 0

    def _send_prepares(self, c: _CTx, now: float, out: list[TxOutput]) -> None:
        keys = sorted(set(c.writes) | set(c.reads) | c.locked)
        c.touched.update(keys)
        tid, owners = self._router(keys)
        lock_keys: dict[Address, list[bytes]] = {}
        writes: dict[Address, list[Write]] = {}
        c.primary_of = {}
        c.voters_of = {}
        for key in keys:
            route = owners[key]
            primary = route[0]
            c.primary_of[key] = primary
            lock_keys.setdefault(primary, []).append(key)
            if key in c.writes:
                c.voters_of[key] = tuple(route)
                for dest in route:
                    writes.setdefault(dest, []).append((key, c.writes[key]))
        c.state = CoordState.PREPARING
        c.unanswered.clear()
        c.votes.clear()
        c.versions = {}
        # Optimistic prepares never queue behind another transaction (a held key is a conflict: NO at once),
        # so they cannot deadlock; pessimistic ones wait (their keys are normally held already).
        wait = c.mode == LockingMode.PESSIMISTIC
        for dest in sorted(set(lock_keys) | set(writes)):
            lk = tuple(lock_keys.get(dest, ()))
            reads = tuple((k, c.reads[k]) for k in lk if k in c.reads)
            ws = tuple(writes.get(dest, ()))
            # A read of an absent key (0) separates nothing: the primary may have purged a tombstone the backup
            # still holds, so a write stamped above 0 could lose to it. Those keys keep the fresh late stamp.
            floors = tuple((k, c.reads[k]) for k, _ in ws if k not in lk and c.reads.get(k, ABSENT) != ABSENT)
            msg = TxPrepare(c.tx, c.attempt, tid, lk, ws, reads, wait, floors)
            self._send(c, dest, msg, now, out)

    def _on_prepare_vote(self, c: _CTx, src: Address, vote: TxVote, now: float, out: list[TxOutput]) -> None:
        if src not in c.unanswered:
            return
        del c.unanswered[src]
        if vote.code == NO:
            self._decide(c, False, now, out, vote.reason or "a participant voted no")
            return
        if vote.code == VOTE_RETRY:
            self._abandon(c, vote.topology_id, now, out)
            return
        c.votes[src] = vote
        # Only a key's primary (in this attempt's routing) stamps its version; anything else is ignored, so
        # a participant can never make two transactions commit one key with one version.
        c.versions.update((k, v) for k, v in vote.versions if c.primary_of.get(k) == src)
        if c.unanswered:
            return
        # Every participant of this attempt voted YES: the decision is commit, final from here on.
        missing = sorted(k for k in c.writes if k not in c.versions)
        if missing:
            self._decide(c, False, now, out, f"no version stamped for {missing!r}")
            return
        self._decide(c, True, now, out)

    def _abandon(self, c: _CTx, need_topology: int, now: float, out: list[TxOutput]) -> None:
        """Give the current attempt up (a participant is on a newer topology, or gone) and prepare again,
        as a new attempt, once the router has that topology. Participants of the old attempt release their
        locks on the rollback (best effort: the next attempt's prepare and the final decision also do)."""
        tid, _ = self._router(())
        for dest in sorted(c.contacted):
            if self._members is None or dest in self._members:
                out.append(TxSend(dest, TxRollback(c.tx, c.attempt, tid)))
        c.unanswered.clear()
        c.votes.clear()
        c.need_topology = need_topology
        c.state = CoordState.WAITING
        if tid >= need_topology:
            c.attempt += 1
            self._send_prepares(c, now, out)

    def _decide(self, c: _CTx, commit: bool, now: float, out: list[TxOutput], reason: str = "") -> None:
        c.state = CoordState.COMMITTING if commit else CoordState.ROLLING_BACK
        c.reason = reason
        c.unanswered.clear()
        c.acked.clear()
        c.request = 0
        c.lock_plan = []
        if not commit:
            # Presumed abort: a rollback can be reported at once; the messages below only free locks.
            out.append(TxOutcome(c.tx, False, reason, c.attempt))
        self._send_completion(c, now, out)

    def _send_completion(self, c: _CTx, now: float, out: list[TxOutput], only: Iterable[Address] | None = None) -> None:
        """Send the decision to every member contacted and every current owner of the keys that has not
        acknowledged it under the current topology (a commit carries each owner's writes); ``only``: just to
        these (members held back before).

        A member that voted on none of the keys (it got its keys by state transfer since the prepare) gets
        the commit only once their voters answered. Between the prepare and this commit an automatic resolver
        may have rolled the transaction back (the originator was cut off by a partition, not gone), and such a
        new owner's copy of a key came from a rolled-back owner: applying the late commit there alone left the
        key's replicas unequal (simulation seed 1461). So it is held back until a voter of each of its keys
        answers: applied, and the write goes; rolled back, and it never goes. A key whose voters all left is
        sent as before: nobody is left to ask. A member that voted on some keys gets all of its keys at once,
        as before (holding part of its writes back let it release the other keys' locks early, and holding
        it whole could hold every member back), except a key whose voters rolled it back: that write goes to
        no member that did not vote on it (the originator's member, a voter of another key, got such a write
        as a new owner after a merge and kept it alone: simulation seed 338600243)."""
        keys = sorted(c.touched)
        tid, owners = self._router(keys)
        targets = {d for d in c.contacted if self._members is None or d in self._members}
        per_dest: dict[Address, list[VersionedWrite]] = {}
        held: set[Address] = set()
        voters = {v for vs in c.voters_of.values() for v in vs}
        if self._own_held(c, voters, owners):
            held.add(self.address)
        for key in keys:
            for dest in owners[key]:
                targets.add(dest)
                if c.state == CoordState.COMMITTING and key in c.writes:
                    if c.voters_of and dest not in c.voters_of.get(key, ()):
                        applied = self._applied_by_voter(c, key)
                        if applied is False:
                            # Rolled back where it was voted: the key stays as they have it, also on a member
                            # that voted on other keys of the commit.
                            continue
                        if applied is None and dest not in voters:
                            held.add(dest)
                            continue
                    per_dest.setdefault(dest, []).append((key, c.versions[key], c.writes[key]))
        chosen = None if only is None else set(only)
        if chosen is None:
            c.unanswered.clear()
        c.held = held
        for dest in sorted(targets):
            if c.acked.get(dest, -1) >= tid or dest in held or (chosen is not None and dest not in chosen):
                continue
            if c.state == CoordState.COMMITTING:
                if per_dest.get(dest) and dest not in voters:
                    c.carried.add(dest)
                msg: Sent = TxCommit(c.tx, c.attempt, tid, tuple(per_dest.get(dest, ())))
            else:
                msg = TxRollback(c.tx, c.attempt, tid)
            self._send(c, dest, msg, now, out)
        self._maybe_complete(c, out)

    def _own_held(self, c: _CTx, voters: set[Address], owners: Mapping[bytes, Sequence[Address]]) -> bool:
        """Whether the originator's own member, a voter, still waits for its commit: until another member applied
        it. An automatic resolver rolls a transaction in doubt back when every member of its prepare-time view
        but the originator is present and none committed it; it cannot ask a member it does not see, the
        originator's, so that member must not be the only one to have applied the commit. Applied at once, it
        kept the writes it owned while the resolver on the other side of a partition rolled the rest back, and
        the merge brought them back: half a transaction visible. Once a member
        reachable by a resolver applied it, that member reports it committed and any resolver commits too.
        Released at once where no other member owns or voted on any of the keys (nobody else could apply it)."""
        me = self.address
        if c.state != CoordState.COMMITTING or c.released or me not in voters:
            return False
        others = (voters - {me}) | {o for k in c.writes if k in owners for o in owners[k] if o != me}
        if not others:
            c.released = True
        return not c.released

    def _applied_by_voter(self, c: _CTx, key: bytes) -> bool | None:
        """Whether a voter of ``key`` applied the commit (True), was rolled back instead (False), or has not
        answered yet (None). True as well when every voter but the originator's own member (held back until
        another member applied it, see _own_held) left: nobody is left to ask."""
        if key in c.refused:
            return False
        if key in c.confirmed:
            return True
        voters = c.voters_of.get(key, ())
        if self._members is not None and not any(v in self._members for v in voters if v != self.address):
            return True
        return None

    def _on_ack(self, c: _CTx, src: Address, ack: TxAck, now: float, out: list[TxOutput]) -> None:
        if ack.attempt == c.attempt and c.state == CoordState.COMMITTING:
            # What a voter did with the commit is final whatever topology its answer names (the answers to
            # a late commit name the participant's newer topology and are otherwise not counted): it decides
            # whether the owners that did not vote get the keys it voted on (see _send_completion).
            voted = {k for k, voters in c.voters_of.items() if src in voters}
            release = False
            if ack.code == ACK_ROLLED_BACK:
                news = voted - c.refused
                c.refused |= voted
                if news and self._overruled(c, src, now, out):
                    return
                if news:
                    c.mixed = True
                    c.reason = c.reason or f"{src} had rolled it back, not committed"
            elif ack.code in (ACK_OK, ACK_RETRY):
                news = voted - c.confirmed
                c.confirmed |= voted
                if src != self.address and (voted or src in c.carried) and not c.released:
                    # Applied by a member a resolver can ask: the originator's own member may apply it too.
                    c.released = release = True
            else:
                news = set()
            if (news or release) and c.held:
                self._send_completion(c, now, out, only=c.held)
        sent = c.unanswered.get(src)
        if ack.attempt != c.attempt or sent is None:
            return
        if ack.code == ACK_RETRY:
            # Applied there, but the keys may have new owners: send the decision to them (and again to this
            # member, with the writes it owns then) once we route by that topology; until then this
            # transaction is not complete. Not counted as an ack: it answered a message whose writes were
            # computed for an older topology (the property test found a new owner never sent its writes
            # because such an answer counted for the newer topology).
            del c.unanswered[src]
            c.need_topology = max(c.need_topology, ack.topology_id)
            tid, _ = self._router(())
            if tid >= c.need_topology:
                self._send_completion(c, now, out)
            return
        if ack.topology_id != sent.topology_id:
            return  # the answer to an earlier message to it, for another topology: wait for this one's
        if ack.code in (ACK_ROLLED_BACK, ACK_COMMITTED):
            want = "committed" if c.state == CoordState.COMMITTING else "rolled back"
            got = "rolled back" if ack.code == ACK_ROLLED_BACK else "committed"
            c.mixed = True
            c.reason = c.reason or f"{src} had {got} it, not {want}"
        del c.unanswered[src]
        c.acked[src] = ack.topology_id
        self._maybe_complete(c, out)

    def _overruled(self, c: _CTx, src: Address, now: float, out: list[TxOutput]) -> bool:
        """A voter answered our commit ROLLED_BACK (a resolver rolled the transaction back while we were cut off)
        and no member can have applied the commit: no voter acknowledged it, none that did not vote was sent a
        write, and the originator's own member is still held back (_own_held). The resolver's rule rolled it
        back everywhere it could ask, so rolling back our own member too leaves the transaction atomic: it is
        reported rolled back (it was never reported committed) and the rollback goes to every member."""
        if c.released or c.confirmed or c.carried or self.address not in c.held:
            return False
        reason = f"rolled back by a resolution while committing ({src} had rolled it back)"
        c.state = CoordState.ROLLING_BACK
        c.reason = reason
        c.unanswered.clear()
        c.acked.clear()
        c.held = set()
        out.append(TxOutcome(c.tx, False, reason, c.attempt))
        self._send_completion(c, now, out)
        return True

    def _maybe_complete(self, c: _CTx, out: list[TxOutput]) -> None:
        if c.unanswered or c.held:
            return
        tid, _ = self._router(())
        if c.need_topology > tid:
            return  # the owners of a newer topology still need the decision
        if c.state == CoordState.COMMITTING:
            out.append(TxOutcome(c.tx, True, c.reason, c.attempt, c.mixed))
        self._done(c, None, out)

    def _done(self, c: _CTx, committed: bool | None, out: list[TxOutput]) -> None:
        if committed is not None:
            out.append(TxOutcome(c.tx, committed, "", c.attempt))
        c.state = CoordState.DONE
        del self._txs[c.tx]
