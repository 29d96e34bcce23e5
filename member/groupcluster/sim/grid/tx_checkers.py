"""Grid transaction checkers: judge the transaction events of a history (:mod:`groupcluster.sim.grid.tx_run`), never
the code. The plain grid checkers (:mod:`groupcluster.sim.grid.checkers`) judge the plain operations of the same
runs (their keys are apart).

A transaction's *outcome* as its client saw it: **committed** (``tx_end`` ok, reason not "mixed"), **rolled back**
(``tx_end`` not ok: the node reports that only when no commit was or will be decided), or **unknown** (its
originator crashed or left before the end, or a mixed outcome). Unique writes name their transaction
(``<id>:<key>``), so the final value of a key names the transaction that wrote it last.

* ``tx-atomicity`` — no value of a rolled-back transaction is visible after convergence; and a transaction
  with one value visible (so it committed, whatever its client heard) has every other write visible too,
  unless a transaction that may have committed after it overwrote that key.
* ``tx-lost-write`` — a committed transaction's write is still visible after convergence, or overwritten by a
  transaction that may have come after it: not one that finished before it started to commit, and the key is
  not absent (no transaction deletes these keys).
* ``tx-conserved-total`` — the isolation check: transfers between counters conserve their total (0), so the
  final counters sum to 0 (not judged in a run where a transfer committed while two groups took writes
  apart). A lost update (two transfers validated against the same read, or a lock that did not hold across a
  rebalance) or a partly applied transfer breaks it. The documented isolation is serializability of committed
  transactions over the keys they read and wrote (docs/grid-transactions.md).

**Separate grids**: as in the grid checkers, a transaction committed through a member whose grid the final
reader's grid never met (no view linked them before the read) binds that read only as a write that may have
happened.

**Two groups that took writes apart** (the grid checkers' write windows: members that formed grids apart, or
a side that did not yet notice it was cut off) merge by "newest version wins" per key, so writes in such a
window are concurrent for ``tx-lost-write``, and the conserved total is not judged when a transfer committed
in such a window.

* ``tx-locks-released`` — after convergence and the operator's resolutions, no member holds a lock, waits for
  one, keeps a transaction active or in doubt, blocks a segment for lock information, or still runs one as an
  originator; and every resolution the operator tried succeeded.
* ``tx-auto-resolved`` — with automatic resolution on (``tx_auto_resolve``), no transaction is still in doubt after
  convergence that the grid's own rule decides (``tx_auto_left``): the operator is needed only for those whose
  prepare-time view lost a member for good.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from ..history import History, HistoryEvent
from ..history_index import HistoryIndex, Violation
from ..stack_checkers import STACK_CHECKERS
from .checkers import GRID_CHECKERS, _widen
from .checkers import parse as parse_grid

INF = float("inf")


@dataclass(slots=True)
class TxRecord:
    id: str
    member: str
    kind: str = ""
    start: float = 0.0
    commit_at: float | None = None  # when the commit was asked
    writes: dict[str, str] = field(default_factory=dict)
    end: float = INF
    ok: bool | None = None
    reason: str = ""

    @property
    def outcome(self) -> str:
        if self.ok is None or self.reason == "mixed":
            return "unknown"
        return "committed" if self.ok else "rolled back"


@dataclass(slots=True)
class TxHistory:
    txs: dict[str, TxRecord]
    finals: dict[str, str | None]  # key -> final value (read after convergence)
    readers: dict[str, tuple[str, float]]  # key -> (member that read it, when)
    locks: list[HistoryEvent]
    resolve_failures: list[HistoryEvent]
    auto_left: list[HistoryEvent] = field(default_factory=list)


def parse(history: History | HistoryIndex | Iterable[HistoryEvent]) -> TxHistory:
    events = history.events if isinstance(history, HistoryIndex | History) else list(history)
    txs: dict[str, TxRecord] = {}
    finals: dict[str, str | None] = {}
    readers: dict[str, tuple[str, float]] = {}
    locks: list[HistoryEvent] = []
    failures: list[HistoryEvent] = []
    auto_left: list[HistoryEvent] = []
    for ev in events:
        k = ev.kind
        d = ev.data
        if k == "tx_start":
            txs[d["id"]] = TxRecord(d["id"], ev.member, d.get("tx_kind", ""), ev.t)
        elif k == "tx_commit" and d["id"] in txs:
            rec = txs[d["id"]]
            rec.commit_at = ev.t
            rec.writes = dict(d.get("writes") or {})
        elif k == "tx_end" and d["id"] in txs:
            rec = txs[d["id"]]
            rec.end = ev.t
            rec.ok = bool(d["ok"])
            rec.reason = d.get("reason") or ""
        elif k == "tx_final" and d.get("ok", True):
            finals[d["key"]] = d.get("value")
            readers[d["key"]] = (ev.member, ev.t)
        elif k == "tx_locks":
            locks.append(ev)
        elif k == "tx_resolve_failed":
            failures.append(ev)
        elif k == "tx_auto_left":
            auto_left.append(ev)
    return TxHistory(txs, finals, readers, locks, failures, auto_left)


def _writer(value: str | None) -> str | None:
    if value is None or ":" not in value:
        return None
    return value.partition(":")[0]


def check_tx_atomicity_and_lost_writes(history: History | HistoryIndex | Iterable[HistoryEvent]) -> list[Violation]:
    h = parse(history)
    # Two groups that both took writes (members that formed grids apart, a side that did not notice it was cut
    # off): the merge keeps the newest version of each key, so writes in such a window are concurrent
    # (the grid checkers' rule; checkers.parse finds the windows).
    grid = parse_grid(history)
    windows = grid.write_windows
    out: list[Violation] = []
    final_writer = {k: _writer(v) for k, v in h.finals.items() if k.startswith("u")}
    for rec in sorted(h.txs.values(), key=lambda r: r.start):
        if rec.kind != "unique" or rec.commit_at is None:
            continue
        keys = [k for k in rec.writes if k in final_writer]
        visible = [k for k in keys if final_writer[k] == rec.id]
        if rec.outcome == "rolled back":
            if visible:
                out.append(
                    Violation(
                        "tx-atomicity",
                        rec.member,
                        f"transaction {rec.id} was reported rolled back ({rec.reason}) but its writes of "
                        f"{visible} are visible after convergence",
                    )
                )
            continue
        if rec.outcome == "unknown" and not visible:
            continue  # it may have rolled back: nothing to demand
        prop = "tx-lost-write" if rec.outcome == "committed" else "tx-atomicity"
        for k in keys:
            w = final_writer[k]
            if w == rec.id:
                continue
            reader, read_at = h.readers.get(k, ("-", INF))
            if reader in grid.known and grid.known[reader].get(rec.member, INF) > read_at:
                # Committed through a grid the reader's never met (the grid checkers' "separate grids"): the
                # reader's grid need not hold it (e.g. every member of that grid left, the last with the data).
                continue
            if w is None:
                out.append(
                    Violation(
                        prop,
                        rec.member,
                        f"transaction {rec.id} ({rec.outcome}, {len(visible)} of its {len(keys)} writes visible) "
                        f"wrote {k}, which is absent after convergence",
                    )
                )
                continue
            other = h.txs.get(w)
            if other is None or other.commit_at is None:
                out.append(Violation(prop, rec.member, f"{k} holds {h.finals[k]!r}, written by no known commit"))
                continue
            assert rec.commit_at is not None and other.commit_at is not None
            _, other_end = _widen(other.commit_at, other.end, windows, both=True)
            rec_start, _ = _widen(rec.commit_at, rec.end, windows, both=True)
            if other_end < rec_start:
                out.append(
                    Violation(
                        prop,
                        rec.member,
                        f"transaction {rec.id} ({rec.outcome}) wrote {k} at t={rec.commit_at:.3f}, but the key holds "
                        f"the value of {other.id}, which ended at t={other.end:.3f}, before {rec.id} started to commit",
                    )
                )
    return out


def check_tx_conserved_total(history: History | HistoryIndex | Iterable[HistoryEvent]) -> list[Violation]:
    h = parse(history)
    windows = parse_grid(history).write_windows
    for rec in h.txs.values():
        start = rec.commit_at
        if rec.kind == "transfer" and start is not None and any(ws <= rec.end and we >= start for ws, we in windows):
            # A transfer committed while two groups took writes apart: the merge keeps each key's newest version,
            # which no multi-key invariant survives (as for any data; docs/grid.md, merges). Isolation is
            # promised within one group; the total is judged only when no transfer overlaps such a window.
            return []
    counters = {k: v for k, v in h.finals.items() if k.startswith("c")}
    if not counters:
        return []
    total = 0
    for k, v in sorted(counters.items()):
        try:
            total += int(v) if v is not None else 0
        except ValueError:
            return [Violation("tx-conserved-total", "-", f"counter {k} holds {v!r}, not an integer")]
    if total != 0:
        shown = ", ".join(f"{k}={v}" for k, v in sorted(counters.items()))
        committed = sum(1 for r in h.txs.values() if r.kind == "transfer" and r.outcome == "committed")
        return [
            Violation(
                "tx-conserved-total",
                "-",
                f"the counters sum to {total}, not 0, after convergence ({shown}; {committed} transfers committed)",
            )
        ]
    return []


def check_tx_locks_released(history: History | HistoryIndex | Iterable[HistoryEvent]) -> list[Violation]:
    h = parse(history)
    out: list[Violation] = []
    for ev in h.locks:
        d = ev.data
        left = {name: d.get(name) for name in ("locked", "active", "in_doubt", "blocked", "pending") if d.get(name)}
        if left or d.get("empty") is False:
            out.append(
                Violation(
                    "tx-locks-released", ev.member, f"after convergence and resolution the member still has {left}"
                )
            )
    for ev in h.resolve_failures:
        out.append(
            Violation("tx-locks-released", ev.member, f"the operator could not resolve {ev.data.get('tx')}: {ev.data}")
        )
    return out


def check_tx_auto_resolved(history: History | HistoryIndex | Iterable[HistoryEvent]) -> list[Violation]:
    h = parse(history)
    return [
        Violation(
            "tx-auto-resolved",
            ev.member,
            f"{ev.data.get('tx')} was still in doubt after convergence though the grid's rule decides it "
            f"({ev.data.get('decision')}): automatic resolution did not run or did not reach every member",
        )
        for ev in h.auto_left
    ]


TX_CHECKERS = {
    "tx-atomicity": check_tx_atomicity_and_lost_writes,
    "tx-conserved-total": check_tx_conserved_total,
    "tx-locks-released": check_tx_locks_released,
    "tx-auto-resolved": check_tx_auto_resolved,
}

STACK_CHECKERS["grid-tx"] = {**GRID_CHECKERS, **TX_CHECKERS}
