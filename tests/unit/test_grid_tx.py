"""Grid transactions as a whole (grid/tx/): property tests of many transactions over an in-memory network with
random delivery order, loss, duplication, originator crashes and rebalances that move lock information
(atomicity, no lost update, replicas equal, no lock left), replays of the runs that found bugs
(docs/grid-transactions.md, "Tests"), and the configuration. The parts have their own files: test_grid_tx_locks.py,
_participant.py, _resolution.py, _coordinator.py, _messages.py."""

from __future__ import annotations

import os
import random
from collections.abc import Sequence

import pytest
from groupcluster.core.address import Address
from groupcluster.core.errors import ConfigError
from groupcluster.grid.tx.config import LockingMode, TxConfig
from groupcluster.grid.tx.coordinator import TxCoordinator
from groupcluster.grid.tx.messages import (
    TxCommit,
    TxId,
    TxLockInfo,
    TxMessage,
    TxRollback,
    decode_tx_payload,
    encode_tx_payload,
)
from groupcluster.grid.tx.outputs import TxLocked, TxOutcome, TxOutput, TxSend
from groupcluster.grid.tx.participant import TxTable
from groupcluster.grid.tx.resolution import termination_decision
from hypothesis import given, settings
from hypothesis import strategies as st

from .grid_tx_support import EXAMPLES_SCALE, O1, O2, O3, RESOLVER, A, B, C, D, StaticRouter, Store, seg


def test_config_validation() -> None:
    assert TxConfig.from_dict({"locking": "pessimistic"}).mode == LockingMode.PESSIMISTIC
    with pytest.raises(ConfigError, match=r"tx\.locking"):
        TxConfig.from_dict({"locking": "eager"})
    with pytest.raises(ConfigError, match="unknown key"):
        TxConfig.from_dict({"lock_timeuot": "1s"})
    with pytest.raises(ConfigError, match="positive"):
        TxConfig.from_dict({"lock_timeout": "0s"})


# -- many transactions over an in-memory network --------------------------------------------------------------------

OWNERS = [A, B, C, D]
ORIGINATORS = [O1, O2, O3]
KEYS = [b"k%d" % i for i in range(6)]


class Cluster:
    """Owners with a TxTable each, originators with a TxCoordinator each, and a network that delivers in a
    random order, may lose and duplicate messages (resends make up for losses), encodes every message."""

    def __init__(self, rng: random.Random, *, loss: float = 0.0, dup: float = 0.0, owners: int = 2) -> None:
        self.rng = rng
        self.loss = loss
        self.dup = dup
        self.now = 0.0
        self.router = StaticRouter(OWNERS, owners)
        cfg = TxConfig.from_dict({"lock_timeout": "4s", "tx_timeout": "20s", "resend_interval": "1s"})
        self.stores = {a: Store() for a in OWNERS}
        self.tables = {
            a: TxTable(a, cfg, segment_of=seg, version_of=s.version_of, stamp=s.stamp, apply=s.apply, topology_id=1)
            for a, s in self.stores.items()
        }
        self.coords = {o: TxCoordinator(o, self.router, cfg) for o in ORIGINATORS}
        self.view = OWNERS + ORIGINATORS
        for t in self.tables.values():
            t.on_view(self.view, 0.0)
        for co in self.coords.values():
            co.on_view(self.view, 0.0)
        self.flight: list[tuple[Address, Address, bytes]] = []
        self.outcomes: dict[TxId, TxOutcome] = {}
        self.plans: dict[TxId, tuple[bytes, ...]] = {}  # the keys each transaction increments
        self.crashed: set[Address] = set()
        self.rebalances = 0

    def applied_on(self, tx: TxId) -> set[Address]:
        return {a for a, s in self.stores.items() if any(t == tx for t, _ in s.applied)}

    # -- clients: each transaction increments its keys by one

    def start(self, origin: Address, keys: Sequence[bytes], mode: LockingMode) -> None:
        co = self.coords[origin]
        tx = co.begin(self.now, mode)
        self.plans[tx] = tuple(keys)
        if mode == LockingMode.PESSIMISTIC:
            self.process(origin, co.lock(tx, keys, self.now))
        else:
            self.finish_client(origin, tx)

    def finish_client(self, origin: Address, tx: TxId) -> None:
        """Read each key from its primary and write it plus one, with the versions read."""
        writes: dict[bytes, bytes | None] = {}
        reads: dict[bytes, int] = {}
        for key in self.plans[tx]:
            version, value = self.stores[self.router.owners_of(key)[0]].data.get(key, (0, b"0"))
            reads[key] = version
            writes[key] = b"%d" % (int(value or b"0") + 1)
        self.process(origin, self.coords[origin].commit(tx, writes, self.now, reads))

    # -- the network

    def process(self, src: Address, outputs: list[TxOutput]) -> None:
        for o in outputs:
            if isinstance(o, TxSend):
                if self.rng.random() < self.loss and not isinstance(o.message, TxLockInfo):
                    continue
                blob = encode_tx_payload([o.message])
                self.flight.append((src, o.dest, blob))
                if self.rng.random() < self.dup:
                    self.flight.append((src, o.dest, blob))
            elif isinstance(o, TxOutcome):
                assert o.tx not in self.outcomes, f"two outcomes for {o.tx}"
                assert not o.mixed, o
                self.outcomes[o.tx] = o
            elif isinstance(o, TxLocked) and o.ok:
                self.finish_client(src, o.tx)

    def deliver(self, i: int) -> None:
        src, dest, blob = self.flight.pop(i)
        if dest in self.crashed or dest == RESOLVER:
            return
        (msg,) = decode_tx_payload(blob)
        if dest in self.tables:
            self.process(dest, self.tables[dest].on_message(src, msg, self.now))
        else:
            self.process(dest, self.coords[dest].on_message(src, msg, self.now))

    def advance(self, dt: float) -> None:
        self.now += dt
        for a, t in self.tables.items():
            d = t.next_deadline()
            if d is not None and d <= self.now:
                self.process(a, t.tick(self.now))
        for o, co in self.coords.items():
            d = co.next_deadline()
            if o not in self.crashed and d is not None and d <= self.now:
                self.process(o, co.tick(self.now))

    def next_deadline(self) -> float | None:
        ds = [t.next_deadline() for t in self.tables.values()]
        ds += [co.next_deadline() for o, co in self.coords.items() if o not in self.crashed]
        return min((d for d in ds if d is not None), default=None)

    def crash(self, origin: Address) -> None:
        """The originator dies: each of its messages in flight arrives or not, then everyone sees the view."""
        self.crashed.add(origin)
        self.flight = [f for f in self.flight if f[0] != origin or self.rng.random() < 0.5]
        self.view = [m for m in self.view if m != origin]
        for a, t in self.tables.items():
            self.process(a, t.on_view(self.view, self.now))
        for o, co in self.coords.items():
            if o not in self.crashed:
                self.process(o, co.on_view(self.view, self.now))

    def rebalance(self) -> None:
        """A new topology with the owners shuffled, installed everywhere at once (the skew between members'
        installs and the grid's phases are for the grid-tx simulation). As GridNode will do it: each member
        installs it (old-topology waits answer RETRY), new owners copy the data of their new keys, each new
        primary blocks its new segments until the old primary's lock information arrives (a message, in
        flight like any other, never lost: the real transfer is reliable), a promoted backup promotes, and
        members that no longer own a segment drop its locks."""
        old = {k: self.router.owners_of(k) for k in KEYS}
        self.router.members = self.rng.sample(OWNERS, len(OWNERS))
        self.router.topology_id += 1
        t = self.router.topology_id
        for a, tab in self.tables.items():
            self.stores[a].topology_id = t
            self.process(a, tab.on_topology(t, self.now))
        for key in KEYS:
            new = self.router.owners_of(key)
            source = self.stores[old[key][0]]
            entry = source.data.get(key)
            for o in new:
                if o not in old[key] and entry is not None:
                    self.stores[o].data[key] = max(self.stores[o].data.get(key, (0, None)), entry)
        moved: dict[tuple[Address, Address], set[int]] = {}
        for key in KEYS:
            old_p, new_p = old[key][0], self.router.owners_of(key)[0]
            if old_p != new_p:
                moved.setdefault((old_p, new_p), set()).add(seg(key))
        for (old_p, new_p), segs in sorted(moved.items()):
            self.tables[new_p].block_segments(segs)
            if new_p in {o for k in KEYS if seg(k) in segs for o in old[k]}:
                self.tables[new_p].promote(segs)
            self.process(old_p, self.tables[old_p].push_lock_info(segs, new_p))
        # Then members drop the locks of segments they own no more (their information was just pushed).
        for a, tab in self.tables.items():
            lost = {seg(k) for k in KEYS if a in old[k] and a not in self.router.owners_of(k)}
            self.process(a, tab.drop_segments(lost, self.now))
        for o, co in self.coords.items():
            if o not in self.crashed:
                self.process(o, co.on_topology(self.now))
        self.rebalances += 1

    def settle(self) -> None:
        """Heal the network and run until nothing is in flight and no coordinator has work left."""
        self.loss = self.dup = 0.0
        for _ in range(100_000):
            if self.flight:
                self.deliver(self.rng.randrange(len(self.flight)))
                continue
            if any(co.pending() for o, co in self.coords.items() if o not in self.crashed):
                d = self.next_deadline()
                assert d is not None, "a coordinator has work but no deadline"
                self.advance(max(d - self.now, 0.0))
                continue
            return
        raise AssertionError("the cluster did not settle")

    def resolve_in_doubt(self) -> None:
        """Play the resolver: decide each in-doubt transaction from every member's report, then send one
        self-contained decision to every current owner of its keys and every member that knows it. (Only
        resolving the prepared records misses owners that got the keys by a rebalance after the prepare:
        the property test found such a replica without the committed write.)"""
        doubtful = sorted({d.tx for t in self.tables.values() for d in t.in_doubt()})
        for tx in doubtful:
            reports = [t.report(tx) for t in self.tables.values()]
            # Every member's report, not only the current owners': after a rebalance the participants of the
            # prepare may have moved on (a member that never knew it reports None, which changes nothing).
            decision = termination_decision([r.state for r in reports])
            assert decision is not None
            writes: dict[bytes, bytes | None] = {}
            versions: dict[bytes, int] = {}
            for r in reports:
                writes.update(r.writes)
                versions.update(r.versions)
            attempt = max(r.attempt for r in reports)
            knows = {a for a, t in self.tables.items() if t.state_of(tx) is not None}
            for dest in sorted(knows | {o for k in writes for o in self.router.owners_of(k)}):
                if decision:
                    mine = tuple(
                        (k, versions[k], v) for k, v in sorted(writes.items()) if dest in self.router.owners_of(k)
                    )
                    msg: TxMessage = TxCommit(tx, attempt, self.router.topology_id, mine)
                else:
                    msg = TxRollback(tx, attempt, self.router.topology_id)
                self.process(dest, self.tables[dest].on_message(RESOLVER, msg, self.now))
        self.settle()

    # -- the checks

    def check(self) -> None:
        for tx, keys in self.plans.items():
            owners = {o for k in keys for o in self.router.owners_of(k)}
            applied_on = self.applied_on(tx)
            outcome = self.outcomes.get(tx)
            if tx.origin not in self.crashed:
                assert outcome is not None, f"{tx}: no outcome"
            # Atomicity: on every owner of its keys or on none (with rebalances, owners that got the keys later
            # have the writes by copy, and the values below tell).
            if not self.rebalances:
                assert applied_on in (set(), owners), f"{tx}: applied on {applied_on} of {owners}"
            if outcome is not None:
                assert bool(applied_on) == outcome.committed, f"{tx}: outcome {outcome}, applied on {applied_on}"
            # Each write applied at most once per member.
            for s in self.stores.values():
                keys_applied = [k for t, ws in s.applied if t == tx for k, _, _ in ws]
                assert len(keys_applied) == len(set(keys_applied)), f"{tx}: applied twice: {keys_applied}"
        # Isolation (no lost update): each key's value counts the committed transactions that incremented it,
        # and every owner holds the same version and value.
        for key in KEYS:
            committed = sum(1 for tx, keys in self.plans.items() if key in keys and self.applied_on(tx))
            if not committed:
                continue
            entries = {self.stores[o].data.get(key, (0, b"0")) for o in self.router.owners_of(key)}
            assert len(entries) == 1, f"{key!r}: owners differ: {entries}"
            ((_, value),) = entries
            assert int(value or b"0") == committed, f"{key!r}: {value!r} after {committed} committed increments"
        # No lock left, nothing unfinished.
        for a, t in self.tables.items():
            assert t.locks.empty(), f"{a}: locks left"
            assert t.active() == [], f"{a}: unfinished {t.active()}"
            assert t.in_doubt() == []


def run_random(
    rng: random.Random,
    *,
    txs: int,
    loss: float,
    dup: float,
    crash: bool,
    pessimistic: float,
    jumps: Sequence[float] = (0.01, 0.3, 1.0, 5.0),
    rebalances: int = 0,
) -> Cluster:
    """Start ``txs`` transactions at random steps from random originators, deliver in random order, jump
    time (lock and transaction timeouts fire when a jump beats the deliveries), maybe crash an originator;
    then heal, settle, resolve what is in doubt, and check."""
    cl = Cluster(rng, loss=loss, dup=dup)
    todo = txs
    crash_at = rng.randrange(txs * 6 + 1) if crash else -1
    rebalance_at = {rng.randrange(txs * 20 + 1) for _ in range(rebalances)}
    for step in range(txs * 40):
        if step == crash_at:
            cl.crash(rng.choice(ORIGINATORS))
        if step in rebalance_at:
            cl.rebalance()
        r = rng.random()
        alive = [o for o in ORIGINATORS if o not in cl.crashed]
        if todo and r < 0.15 and alive:
            todo -= 1
            keys = rng.sample(KEYS, rng.randint(1, 3))
            mode = LockingMode.PESSIMISTIC if rng.random() < pessimistic else LockingMode.OPTIMISTIC
            cl.start(rng.choice(alive), keys, mode)
        elif cl.flight and r < 0.9:
            cl.deliver(rng.randrange(len(cl.flight)))
        else:
            cl.advance(rng.choice(jumps))
    cl.settle()
    cl.resolve_in_doubt()
    cl.check()
    return cl


class TestManyTransactions:
    # A seed for the run's own generator: hypothesis' randoms() draws every call from its data, which is
    # slow at this length; the seed still shrinks the transaction count and the fault switch.
    @given(st.integers(0, 2**32 - 1), st.integers(1, 12), st.booleans())
    @settings(max_examples=100 * EXAMPLES_SCALE, deadline=None, derandomize=True, database=None)
    def test_property_atomic_isolated_no_lock_left(self, seed: int, txs: int, faulty: bool) -> None:
        run_random(
            random.Random(seed),
            txs=txs,
            loss=0.1 if faulty else 0.0,
            dup=0.1 if faulty else 0.0,
            crash=False,
            pessimistic=0.5,
        )

    @given(st.integers(0, 2**32 - 1), st.integers(1, 10))
    @settings(max_examples=100 * EXAMPLES_SCALE, deadline=None, derandomize=True, database=None)
    def test_property_originator_crash_resolves_consistently(self, seed: int, txs: int) -> None:
        run_random(random.Random(seed), txs=txs, loss=0.05, dup=0.05, crash=True, pessimistic=0.3)

    @given(st.integers(0, 2**32 - 1), st.integers(1, 10), st.integers(1, 3), st.booleans())
    @settings(max_examples=100 * EXAMPLES_SCALE, deadline=None, derandomize=True, database=None)
    def test_property_rebalancing_keeps_locks_and_writes(self, seed: int, txs: int, moves: int, crash: bool) -> None:
        run_random(random.Random(seed), txs=txs, loss=0.05, dup=0.05, crash=crash, pessimistic=0.4, rebalances=moves)

    # Runs of the rebalancing property test that found bugs (docs/grid-transactions.md, "Tests"), replayed:
    # (seed, transactions, rebalances, originator crash).
    @pytest.mark.parametrize(
        ("seed", "txs", "moves", "crash"),
        [
            (0, 1, 1, False),  # a repeated commit did not apply the keys a new topology gave the member
            (3, 4, 1, True),  # the decision skipped the new primary holding a failed lock request's keys
            (780, 2, 3, False),  # late lock information at a member that was no longer primary
            (26667210, 5, 1, False),  # a new attempt reused an inherited, shared lock: lost update
            (20674, 4, 2, False),  # a prepare arriving after its attempt's rollback re-opened it
            (196436, 3, 2, True),  # resolution skipped an owner gained by a rebalance
            (809379, 3, 3, True),  # versions stamped for inherited keys: two commits, one version
            (23325, 3, 3, False),  # a new owner refused a commit after an earlier failed lock request
            (10425805, 9, 3, True),  # a crashed originator's late request re-opened a rolled-back record
            (433541, 7, 3, True),  # a RETRY answer counted as an ack under the newer topology
            (140990, 2, 1, True),  # an old-topology commit released an imported lock without its write
            (159, 4, 3, True),  # a forwarded push of backup locks let four requests of one attempt share a key
            (4611027, 3, 3, False),  # a key locked here once, dropped with its segment, not held when pushed back
        ],
    )
    def test_regressions(self, seed: int, txs: int, moves: int, crash: bool) -> None:
        run_random(random.Random(seed), txs=txs, loss=0.05, dup=0.05, crash=crash, pessimistic=0.4, rebalances=moves)

    # Found by a longer random search (seeds with their own fault mix), replayed the same way:
    # (seed, transactions, rebalances, crash, loss and duplication, share of pessimistic transactions).
    @pytest.mark.parametrize(
        ("seed", "txs", "moves", "crash", "loss", "pessimistic"),
        [
            # found by the scale-100 search; fixed by the import and forwarding rules below
            pytest.param(896, 2, 3, True, 0.05, 0.4, id="896"),
            # a committed record released an imported lock without its write
            pytest.param(561, 8, 3, True, 0.15, 0.6422206272677251, id="561"),
            # import skipped for a record committed as a backup of other keys
            pytest.param(2301, 10, 2, True, 0.15, 0.041283574420537206, id="2301"),
            # an old primary pushed a segment it still waited for
            pytest.param(4824, 11, 2, True, 0.05, 0.9353853682494977, id="4824"),
            # locks dropped before they were passed on
            pytest.param(12500, 4, 3, True, 0.05, 0.86856516486987, id="12500"),
            # a lock held for a write without version, kept after a later push brought the version
            pytest.param(6375, 11, 3, False, 0.05, 0.18389413160029788, id="6375"),
            # a record known only from a forwarded push, of a later topology, left prepared for good
            pytest.param(8957, 12, 3, False, 0.0, 0.6849043544634881, id="8957"),
            # a too broad fix of 159 (ignore every pushed record of an attempt the importer takes part in)
            pytest.param(42, 5, 3, False, 0.15, 0.3967153333030232, id="42"),
            pytest.param(648, 8, 3, False, 0.0, 0.6122396215812252, id="648"),
            # a promoted backup lock (a commit not arrived yet) shared with an imported pessimistic lock: the
            # prepare counted the shared key as held and validated against the old value (lost update)
            pytest.param(641, 2, 2, True, 0.15, 0.951683155335479, id="641"),
        ],
    )
    def test_search_regressions(
        self, seed: int, txs: int, moves: int, crash: bool, loss: float, pessimistic: float
    ) -> None:
        run_random(
            random.Random(seed), txs=txs, loss=loss, dup=loss, crash=crash, pessimistic=pessimistic, rebalances=moves
        )

    def test_search_seed_9745(self) -> None:
        """Was known open: the originator crashed while its commit was in flight, after a rebalance gave k4 a
        new owner whose copy was taken before the old primary applied the commit; the other owners committed,
        nobody was in doubt, and the new owner lacked the committed write for good. Since new owners that
        voted on none of a commit's keys get it only once a voter answered (TxCoordinator._send_completion,
        simulation seed 1461) the run takes another path and the owners agree. The gap it showed (resolution
        after an originator's departure does not cover committed transactions, docs/grid-transactions.md,
        "Next") is not closed by that in general; this seed stays as a replay."""
        run_random(
            random.Random(9745), txs=7, loss=0.0, dup=0.0, crash=True, pessimistic=0.3676201226539725, rebalances=3
        )

    @pytest.mark.slow
    def test_search(self) -> None:
        """The longer random search (scripts/test --slow): each seed draws its own mix of transactions,
        rebalances, crash, loss and duplication. GRID_TX_SEARCH=N sets how many seeds (default 3000)."""
        failures = []
        for seed in range(int(os.environ.get("GRID_TX_SEARCH", "3000"))):
            r = random.Random(seed * 7919)
            txs, moves, crash = r.randint(1, 12), r.randint(0, 3), r.random() < 0.5
            loss, pessimistic = r.choice([0, 0.05, 0.15]), r.random()
            try:
                run_random(
                    random.Random(seed),
                    txs=txs,
                    loss=loss,
                    dup=loss,
                    crash=crash,
                    pessimistic=pessimistic,
                    rebalances=moves,
                )
            except AssertionError as exc:
                failures.append(f"seed {seed} ({txs}, {moves}, {crash}, {loss}, {pessimistic}): {exc}")
        assert not failures, "\n".join(failures[:10])

    def test_fixed_seeds_commit_most_transactions(self) -> None:
        # Not only rollbacks: with deliveries faster than the timeouts, most transactions commit although they
        # contend for 6 keys (the losers are validation failures and cross-member lock cycles broken by timeouts).
        committed = total = 0
        for seed in range(20):
            cl = run_random(
                random.Random(seed), txs=8, loss=0.0, dup=0.0, crash=False, pessimistic=0.5, jumps=(0.01, 0.1)
            )
            committed += sum(o.committed for o in cl.outcomes.values())
            total += len(cl.outcomes)
        assert total == 160
        assert committed * 5 >= total * 2, f"{committed} of {total} committed"

    def test_crash_between_prepare_and_commit_leaves_in_doubt_until_resolved(self) -> None:
        cl = Cluster(random.Random(1))
        cl.start(O1, [b"k0", b"k1"], LockingMode.OPTIMISTIC)
        # deliver the prepares and the votes, but not the commits
        while cl.flight:
            _, _, blob = cl.flight[0]
            if isinstance(decode_tx_payload(blob)[0], TxCommit):
                break
            cl.deliver(0)
        assert cl.flight and all(isinstance(decode_tx_payload(b)[0], TxCommit) for _, _, b in cl.flight)
        cl.flight.clear()  # O1 dies before any commit leaves
        cl.crash(O1)
        doubt = {a: [d.tx for d in t.in_doubt()] for a, t in cl.tables.items()}
        (tx,) = cl.plans
        participants = {o for k in cl.plans[tx] for o in cl.router.owners_of(k)}
        assert {a for a, txs in doubt.items() if txs == [tx]} == participants
        # another transaction on k0 cannot get the lock meanwhile: the in-doubt one holds it
        cl.start(O2, [b"k0"], LockingMode.OPTIMISTIC)
        cl.settle()
        (other,) = [t for t in cl.plans if t != tx]
        assert cl.outcomes[other].committed is False and cl.outcomes[other].reason.startswith("conflict:")
        cl.resolve_in_doubt()  # all prepared, none committed: rolled back everywhere
        assert cl.applied_on(tx) == set()
        cl.check()
