"""Deciding in-doubt transactions: :func:`termination_decision` (the one answer every participant can be
resolved with), :func:`resolution` (the automatic rule, from every member's report) and :class:`TxResolver`, the
view coordinator's rounds of reports that apply it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from ...core.address import Address
from .config import TxConfig
from .messages import REPORT_UNKNOWN, TxId, TxReportAnswer, TxReportInfo, TxReportRequest, Write
from .outputs import TxSend
from .records import TxReport, TxState


def termination_decision(states: Iterable[TxState | None]) -> bool | None:
    """The one decision for an in-doubt transaction, from what each participant reports (None: unknown
    there). True: commit everywhere; False: roll back everywhere; None: nothing reported.

    * a participant COMMITTED → commit: the originator decided commit (only it or a resolver sends commits);
    * otherwise any participant ROLLED_BACK, ACTIVE or not knowing it → roll back: it never voted YES, so no
      commit was decided (presumed abort). "Unknown" relies on ``completed_retention`` being longer than
      the time to resolve: a participant must not have forgotten a commit;
    * all PREPARED → roll back: nobody applied the commit and the originator reports a commit to its client
      only after every owner acknowledged it, so no client was told the transaction committed.

    Every participant must be resolved with the answer computed from *all* their reports, after all of them
    installed a view without the originator (from then on they ignore its late commits).
    """
    seen = list(states)
    if not seen:
        return None
    return TxState.COMMITTED in seen


@dataclass(frozen=True, slots=True)
class TxDecided:
    """The resolver's decision for an in-doubt transaction. The driver sends it, self-contained (a TX_COMMIT
    with each owner's writes and the versions known, or a TX_ROLLBACK), to the current write owners of the keys
    and to ``members`` (those that reported it unfinished). A written key with no version anywhere (its
    stamping primary is gone) is committed by its current primary, which stamps one
    (:meth:`~.participant.TxTable.stamp_committed`)."""

    tx: TxId
    commit: bool
    attempt: int
    writes: tuple[Write, ...]
    versions: tuple[tuple[bytes, int], ...]
    members: tuple[Address, ...]


ResolverOutput = TxSend | TxDecided


def resolution(tx: TxId, reports: Mapping[Address, TxReportInfo], members: Iterable[Address]) -> bool | str:
    """The automatic decision for in-doubt ``tx`` from the reports of *every* member of the current view
    (``members``): True commit, False roll back, or a text saying why it stays in doubt.

    * some member COMMITTED it → commit (only the originator after a unanimous YES, or a resolver, commits);
    * its originator is a member and still deciding → wait for it;
    * its originator is a member and reports it ROLLED_BACK → roll back (it decided so, and only it decides a
      commit; the node reports what its originator side decided. Simulation seed 19 had one: an originator back
      after a partition had rolled the transaction back, and a participant that left kept it in doubt);
    * a member has it PREPARED without knowing it in doubt while the originator is gone (it has not installed
      the view without the originator yet, and would still take the originator's late commit) → wait;
    * a member of a view at its prepare, other than the originator, is no longer a member → stay in doubt: it
      may have committed the transaction and its data may have moved by state transfer, so no member left
      can tell a rollback is safe (an operator decides: ``groupcluster tx resolve``);
    * otherwise roll back (:func:`termination_decision`: nobody committed it, so no client was told it did).
    """
    present = set(members)
    states = [r.state for r in reports.values()]
    if int(TxState.COMMITTED) in states:
        return True
    deciding = sorted(str(m) for m, r in reports.items() if r.deciding)
    if deciding:
        return f"its originator {deciding[0]} has not decided yet"
    origin = reports.get(tx.origin) if tx.origin in present else None
    if origin is not None and origin.state == int(TxState.ROLLED_BACK):
        return False
    if tx.origin not in present:
        unaware = sorted(str(m) for m, r in reports.items() if r.state == int(TxState.PREPARED) and not r.in_doubt)
        if unaware:
            return f"{', '.join(unaware)} prepared it and has not seen its originator leave yet"
    views: set[Address] = set()
    for r in reports.values():
        views.update(r.views)
    left = sorted(str(m) for m in views - present - {tx.origin})
    if left:
        return f"members of its prepare-time view left ({', '.join(left)}): one may have committed it"
    return False


class TxResolver:
    """The view coordinator's automatic resolution of in-doubt transactions (docs/grid-transactions.md,
    "Resolving in-doubt transactions"), one per member, active on the view coordinator only.

    After a view change that removed a member (or made this member coordinator), and then every
    ``resend_interval`` while any member reports a transaction in doubt or a round went unanswered, it sends
    every member a TX_REPORT_REQ (the transactions it knows in doubt; each member adds those in doubt on it).
    Once every member of the view answered a round, each transaction in doubt that the round asked about is
    decided by :func:`resolution` (one in doubt that the round did not name yet is asked about in a new round,
    at once). Decisions come out as :class:`TxDecided`; those it cannot take are listed in :attr:`undecided`.
    A round's decisions are taken from fresh reports each time, so a lost decision message is decided (the
    same way) again in the next round."""

    def __init__(self, address: Address, config: TxConfig | None = None) -> None:
        self.address = address
        self.config = config or TxConfig()
        self.enabled = True
        self._members: tuple[Address, ...] = ()
        self._request = 0
        self._asked: frozenset[TxId] = frozenset()
        self._waiting: set[Address] = set()
        self._answers: dict[Address, TxReportAnswer] = {}
        self._next_round: float | None = None
        self._known: frozenset[TxId] = frozenset()
        self.undecided: dict[TxId, str] = {}  # in doubt and not decidable by the last round: why
        self.rounds = 0
        self.decided = 0

    @property
    def active(self) -> bool:
        return self.enabled and bool(self._members) and self._members[0] == self.address

    def next_deadline(self) -> float | None:
        return self._next_round if self.active else None

    def on_view(self, members: Sequence[Address], now: float, *, removed: bool) -> list[ResolverOutput]:
        """A new view; ``removed``: a member of the previous view is not in it (a merge view counts too)."""
        was = self.active
        self._members = tuple(members)
        if not self.active:
            self._next_round = None
            self._waiting.clear()
            self._answers.clear()
            self.undecided.clear()
            return []
        if removed or not was or self._next_round is not None:
            return self._start(now)
        return []

    def tick(self, now: float) -> list[ResolverOutput]:
        if self.active and self._next_round is not None and now >= self._next_round:
            return self._start(now)
        return []

    def on_answer(self, src: Address, answer: TxReportAnswer, now: float) -> list[ResolverOutput]:
        if not self.active or answer.request_id != self._request or src not in self._waiting:
            return []  # an answer to an older round, or a duplicate
        self._waiting.discard(src)
        self._answers[src] = answer
        if self._waiting:
            return []
        return self._complete(now)

    def _start(self, now: float) -> list[ResolverOutput]:
        self._request += 1
        self.rounds += 1
        self._asked = self._known
        self._waiting = set(self._members)
        self._answers = {}
        # Unless every answer comes and nothing is in doubt, another round follows.
        self._next_round = now + self.config.resend_interval
        msg = TxReportRequest(self._request, tuple(sorted(self._asked)), self._members)
        return [TxSend(m, msg) for m in self._members]

    def _complete(self, now: float) -> list[ResolverOutput]:
        by_tx: dict[TxId, dict[Address, TxReportInfo]] = {}
        in_doubt: set[TxId] = set()
        present = set(self._members)
        for member, answer in self._answers.items():
            for r in answer.reports:
                by_tx.setdefault(r.tx, {})[member] = r
                # Prepared with its originator gone from our view counts too: the member's view may be behind
                # (simulation seed 446: it reported nothing in the round of the view change, in doubt later).
                if r.in_doubt or (r.state == int(TxState.PREPARED) and r.tx.origin not in present):
                    in_doubt.add(r.tx)
        out: list[ResolverOutput] = []
        new = in_doubt - self._asked
        self.undecided = {}
        for tx in sorted(in_doubt & self._asked):
            reports = by_tx[tx]
            verdict = resolution(tx, reports, self._members)
            if isinstance(verdict, str):
                self.undecided[tx] = verdict
                continue
            self.decided += 1
            out.append(decision(tx, verdict, reports))
        self._known = frozenset(in_doubt)
        if new:
            out += self._start(now)  # ask every member about them now
        elif not in_doubt:
            self._next_round = None
        return out


def decision(tx: TxId, commit: bool, reports: Mapping[Address, TxReportInfo]) -> TxDecided:
    """The decision for ``tx`` with what the members reported: the writes and versions merged (a committed
    report's versions win: they are what every owner must store), and the members that have it unfinished."""
    writes: dict[bytes, bytes | None] = {}
    versions: dict[bytes, int] = {}
    attempt = 0
    # Committed reports last: the versions a commit carried are the ones every owner must store.
    for member in sorted(reports, key=lambda m: (reports[m].state == int(TxState.COMMITTED), m)):
        r = reports[member]
        writes.update(r.writes)
        versions.update(r.versions)
        if r.in_doubt or r.state == int(TxState.COMMITTED):
            attempt = max(attempt, r.attempt)
    unfinished = tuple(sorted(m for m, r in reports.items() if r.state in (int(TxState.ACTIVE), int(TxState.PREPARED))))
    return TxDecided(
        tx,
        commit,
        attempt,
        tuple(sorted(writes.items())),
        tuple(sorted((k, v) for k, v in versions.items() if k in writes)),
        unfinished,
    )


def report_info(report: TxReport, deciding: bool = False) -> TxReportInfo:
    """A :class:`TxReport` as a TX_REPORT carries it."""
    state = REPORT_UNKNOWN if report.state is None else int(report.state)
    if report.state is None:
        return TxReportInfo(report.tx, state, 0, False, deciding, (), (), ())
    return TxReportInfo(
        report.tx, state, report.attempt, report.in_doubt, deciding, report.writes, report.versions, report.views
    )
