"""Grid transactions under simulation (``groupcluster sim --stack grid-tx``): the ``grid`` simulation plus
clients that run multi-key transactions, and an operator that resolves in-doubt transactions.

Everything of :mod:`groupcluster.sim.grid.run` holds (members, faults with the rule "at most ``num_owners - 1``
members lost before rebalancing completes", plain GET/PUT/DELETE clients on keys ``k0..k23`` judged by the grid
checkers). On top, each member's client starts transactions (2 to 5 keys, optimistic or pessimistic):

* **transfers** between counters ``c0..c7``: read the counters (pessimistic: after locking them), move random
  amounts from one to the others, commit with the versions read. Every transfer conserves the total (0), so
  the sum of the final values is 0 under any interleaving of atomic, isolated transactions;
* **unique writes** of keys ``u0..u15``: every written value names its transaction (``<id>:<key>``), so the
  final value of a key says which transaction wrote it last.

Transaction keys are not touched by plain operations (the grid checkers judge those on their own keys).

**In-doubt transactions.** A transaction prepared on a member whose originator left that member's view (crash,
or a partition) is *in doubt*, keeping its locks, until it is resolved (docs/grid-transactions.md). With
``tx_auto_resolve`` (three seeds in four: ``seed % 4 != 0``) the grid's view coordinator resolves it by itself;
what it cannot decide (a member of the transaction's prepare-time view left for good: it may have committed)
stays in doubt for an operator. Once the group has converged and settled (the liveness phase), the simulator
does what an operator does: for each transaction some live member lists in doubt, it collects every live
member's ``tx_report``, decides with :func:`~groupcluster.grid.tx.termination_decision` (commit iff some member
committed it), merges the reported versions, and resolves it on every member listing it (those that need a
version first stamped by the current primary are resolved after it). It repeats while in-doubt transactions
appear. With automatic resolution on, a transaction the grid's own rule could decide and that is still in doubt
then is recorded (``tx_auto_left``) and fails the ``tx-auto-resolved`` checker; the seeds with it off keep
exercising the manual procedure alone.

History events (besides the grid's):

===============  =========================================================================================
kind             fields
===============  =========================================================================================
tx_start         ``id``, ``mode``, ``tx_kind`` transfer/unique, ``keys``, ``tx``
tx_reads         ``id``, ``values`` {key: value or null}  (what a transfer read, before committing)
tx_commit        ``id``, ``writes`` {key: value}  (the commit was asked with these writes)
tx_end           ``id``, ``ok``, ``reason`` (``ok`` True: committed, every owner acknowledged)
tx_resolve       ``tx``, ``commit``, ``members``, ``why`` (the operator resolved an in-doubt transaction;
                 ``why``: why the grid left it, with automatic resolution on)
tx_auto_left     ``tx``, ``decision`` (automatic resolution on: still in doubt after convergence, though the
                 grid's rule decides it)
tx_final         ``key``, ``value`` (final read of a transaction key after the grid converged, by the member)
tx_locks         ``locked``, ``active``, ``in_doubt``, ``blocked`` (a member's lock table at the end)
===============  =========================================================================================
"""

from __future__ import annotations

import dataclasses
import random
from collections import Counter
from typing import Any

from ...grid.messages import GET
from ...grid.node import GridConfig, OpResult
from ...grid.tx.coordinator import CoordState
from ...grid.tx.messages import TxId
from ...grid.tx.reasons import REASON_MIXED
from ...grid.tx.resolution import resolution, termination_decision
from ..history_index import Violation
from ..scenario import Scenario
from ..world import PAUSED, RUNNING, AppFactory, Node
from .run import GridApp, GridRun, GridSetup, grid_scenario

GRID_TX_STACK = "grid-tx"
COUNTERS = 8
UNIQUE_KEYS = 16
GRID_TX_DEFAULT_OPS = 3.0  # client actions (plain operations and transactions) per member per virtual second
GRID_TX_DEFAULT_SAFETY = 8.0
TX_SHARE = 0.5  # of the client actions, transactions
_COMMITTING = (CoordState.PREPARING, CoordState.WAITING, CoordState.COMMITTING)


def grid_tx_scenario(**changes: Any) -> Scenario:
    """The grid-tx scenario's defaults: the grid's, with 8 virtual seconds of faults."""
    base: dict[str, Any] = {
        "stack": GRID_TX_STACK,
        "safety_time": GRID_TX_DEFAULT_SAFETY,
        "send_rate": GRID_TX_DEFAULT_OPS,
    }
    return grid_scenario(**{**base, **changes})


@dataclasses.dataclass(frozen=True)
class GridTxSetup(GridSetup):
    """The grid's draw plus short transaction timeouts (faults last seconds here, not minutes), and whether the
    grid resolves in-doubt transactions itself (``tx_auto_resolve``)."""

    auto_resolve: bool = True

    def config(self) -> GridConfig:
        base = super().config()
        return dataclasses.replace(base, tx_lock_timeout=2.0, tx_timeout=6.0, tx_auto_resolve=self.auto_resolve)

    def to_json(self) -> dict[str, Any]:
        return {**super().to_json(), "tx_auto_resolve": self.auto_resolve}


class _Client:
    """One transaction a simulated client runs: lock (pessimistic), read (transfers), commit."""

    __slots__ = ("hid", "keys", "kind", "mode", "pending", "read_values", "tx", "versions")

    def __init__(self, hid: str, kind: str, mode: str, keys: list[bytes], tx: TxId) -> None:
        self.hid = hid
        self.kind = kind
        self.mode = mode
        self.keys = keys
        self.tx = tx
        self.pending: set[int] = set()
        self.read_values: dict[bytes, bytes | None] = {}
        self.versions: dict[bytes, int] = {}


class GridTxApp(GridApp):
    """A grid member whose client also runs transactions."""

    def __init__(self, node: Node, run: GridTxRun) -> None:
        super().__init__(node, run)
        self.txrun = run  # ``run`` as what it is, for the transaction statistics and streams
        self.clients: dict[int, _Client] = {}  # node op id -> the transaction client waiting for it

    def start_tx(self, hid: str, kind: str, mode: str, keys: list[bytes], now: float) -> None:
        grid = self.grid
        tx = grid.tx_begin(now, mode)
        names = [k.decode() for k in keys]
        self.run.history.add(now, self.node.name, "tx_start", id=hid, mode=mode, tx_kind=kind, keys=names, tx=str(tx))
        c = _Client(hid, kind, mode, keys, tx)
        if mode == "pessimistic":
            self._wait(c, grid.tx_lock(tx, keys, now))
        elif kind == "transfer":
            self._read(c, now)
        else:
            self._commit(c, now)

    def _wait(self, c: _Client, op_id: int) -> None:
        c.pending.add(op_id)
        self.clients[op_id] = c

    def _read(self, c: _Client, now: float) -> None:
        for key in c.keys:
            self._wait(c, self.grid.get(key, now))

    def _commit(self, c: _Client, now: float) -> None:
        if c.kind == "transfer":
            rng = self.txrun.tx_rng
            values = {k: int(v.decode()) if v is not None else 0 for k, v in c.read_values.items()}
            src, *dsts = c.keys
            moved = 0
            for d in dsts:
                amount = rng.randint(1, 9)
                values[d] += amount
                moved += amount
            values[src] -= moved
            writes: dict[bytes, bytes | None] = {k: str(v).encode() for k, v in values.items()}
            reads = dict(c.versions)
        else:
            writes = {k: f"{c.hid}:{k.decode()}".encode() for k in c.keys}
            reads = {}
        self.run.history.add(
            now,
            self.node.name,
            "tx_commit",
            id=c.hid,
            writes={k.decode(): v.decode() for k, v in writes.items() if v is not None},
        )
        self._wait(c, self.grid.tx_commit(c.tx, writes, reads, now))

    def _end(self, c: _Client, ok: bool, reason: str, now: float) -> None:
        self.run.history.add(now, self.node.name, "tx_end", id=c.hid, ok=ok, reason=reason)
        self.txrun.tx_stats["tx_ok" if ok else "tx_failed"] += 1
        if reason:
            self.txrun.tx_stats[f"tx_reason_{reason}"] += 1

    def on_result(self, res: OpResult, now: float) -> bool:
        """A result for a transaction client (True), or not ours (False)."""
        c = self.clients.pop(res.op_id, None)
        if c is None:
            return False
        c.pending.discard(res.op_id)
        if res.tx is not None:  # lock or commit
            if res.kind == GET:
                return True
            if c.pending:
                return True
            if not res.ok:
                self._end(c, False, res.reason, now)
            elif res.kind == 17:  # TX_COMMIT_OP
                self._end(c, True, res.reason, now)
            elif c.kind == "transfer":
                self._read(c, now)
            else:
                self._commit(c, now)
            return True
        # A read of a transfer.
        if not res.ok:
            c.versions.clear()
            if not c.pending:
                self.grid.tx_rollback(c.tx, now)  # its result is not waited for: the transaction failed
                self._end(c, False, "read_failed", now)
            else:
                c.kind = "failed"
            return True
        if c.kind == "failed":
            if not c.pending:
                self.grid.tx_rollback(c.tx, now)
                self._end(c, False, "read_failed", now)
            return True
        c.read_values[res.key] = res.value
        c.versions[res.key] = res.version
        if not c.pending:
            self.run.history.add(
                now,
                self.node.name,
                "tx_reads",
                id=c.hid,
                values={k.decode(): (v.decode() if v is not None else None) for k, v in c.read_values.items()},
            )
            self._commit(c, now)
        return True

    def after_step(self, now: float) -> None:
        plain: list[OpResult] = []
        while True:  # a result can start the client's next call, whose result may come at once
            results = self.grid.take_results()
            if not results:
                break
            plain += [r for r in results if not self.on_result(r, now)]
        self.grid._results = plain  # the base class reports the plain operations' results
        super().after_step(now)

    def committing(self) -> bool:
        """Whether a transaction this member originated is between its prepare and its outcome."""
        txc = self.grid.txc
        return any(txc.state_of(t) in _COMMITTING for t in txc.pending())

    @property
    def tx_waiting(self) -> int:
        return len({id(c) for c in self.clients.values()})


class GridTxRun(GridRun):
    """One seed of the grid-tx scenario (see the module docstring)."""

    def __init__(self, seed: int, scenario: Scenario, logger: Any) -> None:
        super().__init__(seed, scenario, logger)
        s = self.setup
        # Not drawn from a random stream, so the seed's other draws stay what they were.
        self.tx_setup = GridTxSetup(
            s.mode,
            s.num_owners,
            s.num_segments,
            s.initial_cluster_size,
            max_entries=s.max_entries,
            max_bytes=s.max_bytes,
            auto_resolve=seed % 4 != 0,
        )
        self.setup = self.tx_setup
        self.tx_rng = random.Random(self.client_rng.getrandbits(64))
        self.tx_ids = 0
        self.tx_stats: Counter[str] = Counter(
            {"tx": 0, "tx_ok": 0, "tx_failed": 0, "tx_resolved": 0, "tx_auto_commit": 0, "tx_auto_rollback": 0}
        )
        self.tx_final: set[str] = set()
        self.tx_final_start: dict[str, float] = {}
        self.resolved: set[TxId] = set()

    def _app_factory(self) -> AppFactory | None:
        return lambda node: GridTxApp(node, self)

    def _app(self, node: Node) -> GridTxApp:
        app = node.app
        if not isinstance(app, GridTxApp):
            raise TypeError(f"{node.name}: no grid-tx application on this member ({app!r})")
        return app

    def _apps(self, states: tuple[str, ...] = (RUNNING, PAUSED)) -> list[GridTxApp]:
        return [self._app(n) for n in self.world.nodes if n is not None and n.state in states and n.app is not None]

    def extra_stats(self) -> dict[str, int]:
        return {**super().extra_stats(), **{f"grid_{k}": v for k, v in self.tx_stats.items()}}

    def _count_auto(self, app: GridApp) -> None:
        """Add a member's automatic resolutions to the run's stats (members alive at the end: a coordinator that
        crashed took its count along)."""
        m = app.grid.metrics
        self.tx_stats["tx_auto_commit"] += m["grid.tx_auto_resolved_commit"]
        self.tx_stats["tx_auto_rollback"] += m["grid.tx_auto_resolved_rollback"]

    # -- faults ----------------------------------------------------------------------------------------------------
    def _pick(self, states: tuple[str, ...]) -> Node | None:
        """The member a crash or pause hits: half the time one that is in the middle of committing a
        transaction it originated (so the originator dies or vanishes between prepare and decision, or between
        decision and acknowledgements), else any, as in the grid simulation."""
        candidates = [n for n in self.world.nodes if n is not None and n.state in states]
        if not candidates:
            return None
        rng = self.fault_rng
        if rng.random() < 0.5:
            busy = [n for n in candidates if isinstance(n.app, GridTxApp) and n.app.committing()]
            if busy:
                self.tx_stats["faults_on_committing"] += 1
                return rng.choice(busy)
        return rng.choice(candidates)

    # -- clients -------------------------------------------------------------------------------------------------
    def _operate(self, node: Node, rng: random.Random) -> None:
        if rng.random() >= TX_SHARE:
            self._plain(node, rng)
            return
        t = self.tx_rng
        kind = "transfer" if t.random() < 0.6 else "unique"
        mode = "pessimistic" if t.random() < 0.5 else "optimistic"
        n = t.randint(2, 5)
        space = [f"c{i}" for i in range(COUNTERS)] if kind == "transfer" else [f"u{i}" for i in range(UNIQUE_KEYS)]
        keys = [k.encode() for k in t.sample(space, n)]
        self.tx_ids += 1
        self.tx_stats["tx"] += 1
        self.world.app_call(node.slot, self._app(node).start_tx, f"t{self.tx_ids}", kind, mode, keys)

    def _pending_ops(self) -> int:
        return super()._pending_ops() + sum(a.tx_waiting for a in self._apps())

    # -- the operator ----------------------------------------------------------------------------------------------
    def _operator(self) -> None:
        super()._operator()
        if self.group_since is None or self.loop.now - self.group_since < self.sc.settle_time:
            return
        apps = self._apps((RUNNING,))
        doubt = sorted({d.tx for a in apps for d in a.grid.tx_in_doubt()})
        for tx in doubt:
            self._resolve(tx, apps)

    def _resolve(self, tx: TxId, apps: list[GridTxApp]) -> None:
        now = self.loop.now
        reports = [a.grid.tx_report(tx) for a in apps]
        commit = bool(termination_decision(r.state for r in reports))
        why = ""
        if self.tx_setup.auto_resolve:
            # What the grid's coordinator would decide from the same reports: if it decides, the grid should have.
            view = apps[0].grid.view
            infos = {a.grid.address: a.grid.transactions._tx_report_info(tx) for a in apps}
            verdict = resolution(tx, infos, view)
            if isinstance(verdict, str):
                why = verdict
            else:
                self.history.add(now, "-", "tx_auto_left", tx=str(tx), decision="commit" if verdict else "rollback")
                self.tx_stats["tx_auto_left"] += 1
                why = "left by the grid"
        pending = [a for a in apps if any(d.tx == tx for d in a.grid.tx_in_doubt())]
        names = []
        while pending:
            versions: dict[bytes, int] = {}
            for a in apps:
                versions.update(a.grid.tx_report(tx).versions)
            done = None
            for a in pending:
                # "missing": it needs a version its current primary stamps when resolved: after that one
                if self.world.app_call(a.node.slot, _resolve_on, a, tx, commit, versions) != "missing":
                    done = a
                    break
            if done is None:
                self.history.add(now, "-", "tx_resolve_failed", tx=str(tx), members=[a.node.name for a in pending])
                self.tx_stats["tx_resolve_failed"] += 1
                return
            pending.remove(done)
            names.append(done.node.name)
        self.tx_stats["tx_resolved"] += 1
        self.history.add(now, "-", "tx_resolve", tx=str(tx), commit=commit, members=names, why=why)

    # -- the end ---------------------------------------------------------------------------------------------------
    def _final_reads(self) -> None:
        super()._final_reads()
        nodes = [n for n in self.world.live_nodes() if n.app is not None]
        rng = self.client_rng
        keys = [f"c{i}" for i in range(COUNTERS)] + [f"u{i}" for i in range(UNIQUE_KEYS)]
        for key in keys:
            node = rng.choice(nodes)
            self.op_ids += 1
            hid = str(self.op_ids)
            self.final_ops.add(hid)
            self.tx_final.add(hid)
            self.tx_final_start[hid] = self.loop.now
            self.world.app_call(node.slot, _final_read, node.app, key.encode(), hid)

    def op_done(self, app: GridApp, res: OpResult, now: float) -> None:
        hid = app.ops.get(res.op_id)
        if hid is not None and hid in self.tx_final:
            app.ops.pop(res.op_id)
            self.tx_final.discard(hid)
            self.final_ops.discard(hid)
            value = None if res.value is None else res.value.decode(errors="replace")
            self.history.add(now, app.node.name, "tx_final", key=res.key.decode(), value=value, ok=res.ok)
            return
        super().op_done(app, res, now)

    def _record_stores(self) -> None:
        super()._record_stores()
        for app in self._apps():
            self._count_auto(app)
            g = app.grid
            locks = g.tx.locks
            self.history.add(
                self.loop.now,
                app.node.name,
                "tx_locks",
                locked=sorted(k.decode(errors="replace") for k in locks.locked_keys()),
                active=[str(t) for t in g.tx.active()],
                in_doubt=[str(d.tx) for d in g.tx_in_doubt()],
                blocked=sorted(locks.blocked_segments),
                empty=locks.empty(),
                pending=[str(t) for t in g.txc.pending()],
            )

    def judge(self) -> list[Violation]:
        return super().judge()


def _resolve_on(app: GridTxApp, tx: TxId, commit: bool, versions: dict[bytes, int], now: float) -> str:
    try:
        return "resolved" if app.grid.tx_resolve(tx, commit, now, versions) else "not in doubt"
    except ValueError:
        return "missing"


def _final_read(app: GridTxApp, key: bytes, hid: str, now: float) -> None:
    app.ops[app.grid.get(key, now)] = hid


__all__ = ["GRID_TX_STACK", "REASON_MIXED", "GridTxRun", "grid_tx_scenario"]
