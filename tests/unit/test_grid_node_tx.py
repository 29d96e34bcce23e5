"""Transactions through GridNode (docs/grid-transactions.md): several in-memory nodes over the fake network of
gridnet.py (TxNet), every message encoded and decoded.

What is checked: commit and rollback end to end (values on every owner, one version per key), optimistic
conflicts, pessimistic locks and the waits behind them, plain writes refused on a held key, a transaction across
a rebalance (the lock information reaches the new primary, which stays blocked until it does, even when the
first push is lost), an originator that crashes before prepare (rolled back everywhere) or after it (in doubt on
every owner, its keys unusable, then resolved), GET versions, and the calls' input checks.
"""

from __future__ import annotations

import dataclasses
import re

import pytest
from groupcluster.core.address import Address
from groupcluster.grid.columns import EntryChunk
from groupcluster.grid.consistent_hash import ConsistentHash, segment_of
from groupcluster.grid.messages import GET, PUT, Fetch, Topology, XferData
from groupcluster.grid.node import (
    REASON_CONFLICT,
    REASON_LOCKED,
    REASON_ROLLED_BACK,
    TX_COMMIT_OP,
    TX_LOCK_OP,
    GridConfig,
    GridNode,
    OpResult,
)
from groupcluster.grid.payload import decode_payload, encode_payload
from groupcluster.grid.topology import Availability, CacheTopology, PartitionHandling, Phase
from groupcluster.grid.tx.messages import TxCommit, TxId, TxLockInfo, TxPrepare, TxReportAnswer, TxReportRequest
from groupcluster.grid.tx.records import TxState
from groupcluster.grid.tx.resolution import termination_decision

from .gridnet import TxNet


def resolve_everywhere(net: TxNet, tx: TxId, commit: bool) -> int:
    """Play the operator: resolve ``tx`` on every member that holds it in doubt, the same way. A commit needs
    every written key's version: merged from the members' reports; a key whose stamping primary is gone gets
    one from its current primary, which is therefore resolved first (then its report has it)."""
    pending = [m for m in net.view if any(x.tx == tx for x in net.nodes[m].tx_in_doubt())]
    resolved = 0
    while pending:
        versions: dict[bytes, int] = {}
        for m in net.view:
            versions.update(net.nodes[m].tx_report(tx).versions)
        progress = False
        for m in list(pending):
            try:
                if net.nodes[m].tx_resolve(tx, commit, net.now, versions):
                    resolved += 1
            except ValueError:
                continue  # needs a version its primary has not stamped yet: after that one
            pending.remove(m)
            net.collect(m)
            progress = True
            break
        assert progress, f"no member could resolve {tx}: {pending}"
    return resolved


def cluster(n: int, seed: int = 1) -> tuple[TxNet, list[Address]]:
    net = TxNet(seed)
    members = net.add(n)
    net.run_until(3.0)
    assert net.stable()
    return net, members


def no_locks_left(net: TxNet) -> None:
    for a in net.view:
        node = net.nodes[a]
        assert node.tx.locks.empty(), f"{a} still holds locks: {node.tx.locks.locked_keys()}"
        assert node.tx.active() == [], f"{a} has unfinished transactions {node.tx.active()}"


def test_commit_applies_every_write_on_every_owner_with_one_version() -> None:
    net, (_a, b, c) = cluster(3)
    writes = {f"k{i}".encode(): f"v{i}".encode() for i in range(6)}
    tx = net.call(b, "tx_begin")
    assert isinstance(tx, TxId) and TxId.parse(str(tx)) == tx
    res = net.wait(b, net.call(b, "tx_commit", tx, writes, {}))
    assert res.ok and res.kind == TX_COMMIT_OP and res.tx == tx, res
    for key, value in writes.items():
        copies = net.stored(key)
        assert len(copies) == 2 and {c for c in copies.values()} == {copies[net.primary(key)]}, copies
        assert copies[net.primary(key)][1] == value  # type: ignore[index]
        got = net.get(c, key)
        assert got.ok and got.value == value and got.version == copies[net.primary(key)][0]  # type: ignore[index]
    assert net.nodes[b].metrics["grid.tx_commits"] == 1
    net.run_until(net.now + 2)
    no_locks_left(net)


def test_rollback_applies_nothing_and_a_later_commit_fails() -> None:
    net, (a, b, _c) = cluster(3)
    tx = net.call(a, "tx_begin")
    rb = net.wait(a, net.call(a, "tx_rollback", tx))
    assert rb.ok
    late = net.wait(a, net.call(a, "tx_commit", tx, {b"k": b"v"}, {}))
    assert not late.ok and late.reason == REASON_ROLLED_BACK
    assert net.get(b, b"k").value is None
    assert net.nodes[a].metrics["grid.tx_rollbacks"] == 1
    with pytest.raises(ValueError, match="unknown"):
        net.call(a, "tx_commit", TxId(a, 999), {}, {})


def test_get_answers_carry_the_entry_version() -> None:
    net, (a, b, _c) = cluster(3)
    assert net.get(a, b"absent").version == 0
    assert net.put(a, b"k", b"1").ok
    v1 = net.get(b, b"k").version
    assert net.put(b, b"k", b"2").ok
    v2 = net.get(a, b"k").version
    assert 0 < v1 < v2


def test_optimistic_read_changed_before_commit_is_a_conflict() -> None:
    net, (a, b, c) = cluster(3)
    assert net.put(a, b"x", b"10").ok
    read = net.get(b, b"x")
    tx = net.call(b, "tx_begin", "optimistic")
    assert net.put(c, b"x", b"11").ok  # another client writes the key after the transaction read it
    res = net.wait(b, net.call(b, "tx_commit", tx, {b"x": b"9", b"y": b"1"}, {b"x": read.version}))
    assert not res.ok and res.reason == REASON_CONFLICT, res
    assert net.get(a, b"x").value == b"11" and net.get(a, b"y").value is None
    assert net.nodes[b].metrics[f"grid.tx_rollbacks.{REASON_CONFLICT}"] == 1
    # Unchanged reads validate: the same transfer with fresh versions commits.
    read = net.get(b, b"x")
    tx = net.call(b, "tx_begin")
    res = net.wait(b, net.call(b, "tx_commit", tx, {b"x": b"9", b"y": b"1"}, {b"x": read.version, b"y": 0}))
    assert res.ok, res
    net.run_until(net.now + 1)
    no_locks_left(net)


def test_pessimistic_lock_blocks_plain_writes_and_other_lockers_until_commit() -> None:
    net, (a, b, c) = cluster(3)
    t1 = net.call(a, "tx_begin", "pessimistic")
    locked = net.wait(a, net.call(a, "tx_lock", t1, [b"p", b"q"]))
    assert locked.ok and locked.kind == TX_LOCK_OP
    refused = net.put(c, b"p", b"plain")
    assert not refused.ok and refused.reason == REASON_LOCKED, refused
    primary = net.primary(b"p")
    assert net.nodes[primary].metrics["grid.writes_refused_locked"] == 1
    t2 = net.call(b, "tx_begin", "pessimistic")
    second = net.call(b, "tx_lock", t2, [b"p"])
    net.run_until(net.now + 1.0)
    assert all(r.op_id != second for r in net.results.get(b, []))  # waits behind t1
    assert net.nodes[primary].metrics["grid.tx_lock_waits"] >= 1
    assert net.wait(a, net.call(a, "tx_commit", t1, {b"p": b"1", b"q": b"2"}, {})).ok
    assert net.wait(b, second).ok  # granted once t1 committed
    assert net.wait(b, net.call(b, "tx_commit", t2, {b"p": b"3"}, {})).ok
    assert net.get(c, b"p").value == b"3" and net.get(c, b"q").value == b"2"
    assert net.put(c, b"p", b"plain").ok  # free again
    net.run_until(net.now + 1)
    no_locks_left(net)
    with pytest.raises(ValueError, match="optimistic"):
        net.call(a, "tx_lock", net.call(a, "tx_begin", "optimistic"), [b"p"])


def test_optimistic_commit_on_a_locked_key_fails_at_once_as_a_conflict() -> None:
    net, (a, b, c) = cluster(3)
    t1 = net.call(a, "tx_begin", "pessimistic")
    assert net.wait(a, net.call(a, "tx_lock", t1, [b"p", b"q"])).ok
    t0 = net.now
    t2 = net.call(b, "tx_begin", "optimistic")
    res = net.wait(b, net.call(b, "tx_commit", t2, {b"p": b"9", b"z": b"1"}, {b"p": 0}))
    # refused without waiting for the lock (tx_lock_timeout is 10 s), as a conflict naming the holder
    assert not res.ok and res.reason == REASON_CONFLICT and str(t1) in (res.error or ""), res
    assert net.now - t0 < 1.0
    assert net.get(c, b"z").value is None  # nothing of it applied
    assert net.wait(a, net.call(a, "tx_commit", t1, {b"p": b"1"}, {})).ok
    net.run_until(net.now + 1)
    no_locks_left(net)


def test_ordered_pessimistic_lock_requests_do_not_deadlock_across_members() -> None:
    net, (a, b, c) = cluster(3)
    # two keys with different primaries, locked by two transactions in opposite orders at the same moment:
    # with both primaries asked at once each could get one key and wait for the other until the lock timeout
    keys = [bytes([97 + i]) for i in range(26)]
    k1 = keys[0]
    k2 = next(k for k in keys if net.primary(k) != net.primary(k1))
    t1 = net.call(a, "tx_begin", "pessimistic")
    t2 = net.call(b, "tx_begin", "pessimistic")
    l1 = net.call(a, "tx_lock", t1, [k1, k2])
    l2 = net.call(b, "tx_lock", t2, [k2, k1])
    t0 = net.now
    assert net.wait(a, l1).ok
    assert net.wait(a, net.call(a, "tx_commit", t1, {k1: b"1", k2: b"1"}, {})).ok
    assert net.wait(b, l2).ok
    assert net.wait(b, net.call(b, "tx_commit", t2, {k1: b"2", k2: b"2"}, {})).ok
    assert net.now - t0 < 5.0  # no lock timeout on the way
    assert net.get(c, k1).value == b"2" and net.get(c, k2).value == b"2"
    net.run_until(net.now + 1)
    no_locks_left(net)


def test_input_checks_name_what_is_wrong() -> None:
    net, (a, _b, _c) = cluster(3)
    with pytest.raises(ValueError, match="mode"):
        net.nodes[a].tx_begin(net.now, "eager")
    tx = net.call(a, "tx_begin")
    with pytest.raises(TypeError, match=r"writes\[b'k'\]"):
        net.nodes[a].tx_commit(tx, {b"k": "text"}, {}, net.now)  # type: ignore[dict-item]
    with pytest.raises(ValueError, match=r"reads\[b'k'\]"):
        net.nodes[a].tx_commit(tx, {}, {b"k": -1}, net.now)
    with pytest.raises(ValueError, match="exceed"):
        net.nodes[a].tx_commit(tx, {b"k" * 70000: b"v"}, {}, net.now)
    for bad in ("", "10.0.0.1:7800#1", "10.0.0.1:7800#1/x", "nohost/3"):
        with pytest.raises(ValueError, match="transaction id"):
            TxId.parse(bad)
    assert net.nodes[a].tx_resolve(TxId(a, 77), True, net.now) is False


def test_transaction_across_a_rebalance_moves_its_locks_to_the_new_primaries() -> None:
    net, (a, _b, _c) = cluster(3, seed=4)
    keys = [f"r{i}".encode() for i in range(40)]
    before = {k: net.primary(k) for k in keys}
    tx = net.call(a, "tx_begin", "pessimistic")
    assert net.wait(a, net.call(a, "tx_lock", tx, keys)).ok
    (d,) = net.add(1)
    net.run_until(net.now + 6.0)
    assert net.stable()
    moved = [k for k in keys if net.primary(k) != before[k]]
    assert moved, "the join moved no primary: pick other keys"
    for k in moved:
        new = net.nodes[net.primary(k)]
        assert tx in new.tx.locks.holders(k), f"{k!r}: the new primary {new.address} did not get the lock"
    assert sum(net.nodes[m].metrics["grid.tx_lock_info_in"] for m in net.view) >= 1
    refused = net.put(d, moved[0], b"plain")
    assert not refused.ok and refused.reason == REASON_LOCKED
    writes = {k: b"t" for k in keys}
    assert net.wait(a, net.call(a, "tx_commit", tx, writes, {})).ok
    for k in keys:
        assert {e[1] if e else None for e in net.stored(k).values()} == {b"t"}, k
    net.run_until(net.now + 1)
    no_locks_left(net)


def test_a_lost_lock_information_push_is_sent_again_and_the_new_primary_waits_for_it() -> None:
    net, (a, b, c) = cluster(3, seed=4)
    keys = [f"r{i}".encode() for i in range(40)]
    tx = net.call(a, "tx_begin", "pessimistic")
    assert net.wait(a, net.call(a, "tx_lock", tx, keys)).ok
    budget = [1]

    def drop_first_info(src: Address, msg: object) -> bool:
        if type(msg) is TxLockInfo and msg.records and budget[0]:  # type: ignore[attr-defined]
            budget[0] -= 1
            return True
        return False

    net.drop = drop_first_info
    net.add(1)
    for _ in range(200):
        net.run_until(net.now + 0.05)
        if net.lost:
            break
    assert net.lost, "no lock information was pushed"
    src, info = net.lost[0]
    assert isinstance(info, TxLockInfo)
    dest = next(m for m in net.view if m != src and net.nodes[m].tx.locks.blocked_segments & set(info.segments))
    blocked = net.nodes[dest].tx.locks.blocked_segments & set(info.segments)
    assert blocked  # the new primary waits for the lost information
    key = next(k for k in keys if segment_of(k, 32) in blocked)
    # A plain write there is neither applied nor refused while blocked: it is retried until the push arrives.
    writer = c if c != dest else b
    op = net.call(writer, "put", key, b"plain")
    net.run_until(net.now + 0.5)
    assert net.nodes[dest].tx.locks.blocked_segments & blocked  # still waiting (re-sent after attempt_timeout)
    assert all(r.op_id != op for r in net.results.get(writer, []))
    net.run_until(net.now + 3.0)  # attempt_timeout: the pusher sends it again
    assert net.nodes[src].metrics["grid.tx_lock_info_resent"] >= 1
    assert not net.nodes[dest].tx.locks.blocked_segments
    assert tx in net.nodes[dest].tx.locks.holders(key)
    res = net.wait(writer, op)
    assert not res.ok and res.reason == REASON_LOCKED
    assert net.wait(a, net.call(a, "tx_commit", tx, {k: b"t" for k in keys}, {})).ok
    net.run_until(net.now + 3)
    assert not net.nodes[src].transactions.tx_pushes  # acknowledged, no more re-sends
    no_locks_left(net)


def test_originator_crash_before_prepare_rolls_back_everywhere() -> None:
    net, (a, _b, _c, d) = cluster(4)
    tx = net.call(d, "tx_begin", "pessimistic")
    assert net.wait(d, net.call(d, "tx_lock", tx, [b"u", b"w"])).ok
    assert not net.put(a, b"u", b"x").ok
    net.crash(d)
    net.run_until(net.now + 5.0)
    assert net.stable()
    assert net.put(a, b"u", b"x").ok  # the lock went with the originator
    for m in net.view:
        assert net.nodes[m].tx_in_doubt() == []
    no_locks_left(net)


def _prepared_then_crash(net: TxNet, origin: Address, writes: dict[bytes, bytes]) -> TxId:
    """Start a commit on ``origin`` whose TX_COMMIT never leaves it, wait for every vote, crash it."""
    net.drop = lambda src, msg: src == origin and type(msg) is TxCommit
    tx = net.call(origin, "tx_begin")
    net.call(origin, "tx_commit", tx, writes, {})
    net.run_until(net.now + 1.0)
    assert not any(r.tx == tx for r in net.results.get(origin, []))  # not committed: commits were lost
    net.crash(origin)
    net.drop = lambda src, msg: False
    net.run_until(net.now + 5.0)
    assert net.stable()
    return tx  # type: ignore[return-value]


@pytest.mark.parametrize("decide_commit", [False, True])
def test_originator_crash_after_prepare_leaves_it_in_doubt_until_resolved(decide_commit: bool) -> None:
    # tx_auto_resolve off: today's manual procedure (the operator's).
    net = TxNet(3, auto_resolve=False)
    net.add(4)
    net.run_until(3.0)
    a, _b, _c, d = net.view
    writes = {b"m1": b"x1", b"m2": b"x2", b"m3": b"x3"}
    tx = _prepared_then_crash(net, d, writes)
    doubtful = [m for m in net.view if any(x.tx == tx for x in net.nodes[m].tx_in_doubt())]
    assert doubtful and all(net.nodes[m].metrics["grid.tx_in_doubt"] >= 1 for m in doubtful)
    # Its keys stay locked: neither plain writes nor other transactions get them meanwhile.
    assert net.put(a, b"m1", b"plain").reason == REASON_LOCKED
    reports = [net.nodes[m].tx_report(tx) for m in net.view]
    assert termination_decision(r.state for r in reports) is False  # all prepared: nobody committed
    versions: dict[bytes, int] = {}
    for r in reports:
        versions.update(r.versions)
    assert set(versions) <= set(writes)  # stamped by the primaries (those still alive)
    assert resolve_everywhere(net, tx, decide_commit) == len(doubtful)
    net.run_until(net.now + 2.0)
    for m in net.view:
        assert net.nodes[m].tx_in_doubt() == []
    for key, value in writes.items():
        stored = {e[1] if e else None for e in net.stored(key).values()}
        assert stored == ({value} if decide_commit else {None}), (key, stored)
    assert net.put(a, b"m1", b"plain").ok
    no_locks_left(net)


def test_resolution_reaches_an_owner_that_never_saw_the_prepare() -> None:
    # The keys get a new owner (a join) while the transaction is in doubt: its commit must reach it too.
    net = TxNet(5, auto_resolve=False)
    net.add(3)
    net.run_until(3.0)
    _a, _b, c = net.view
    writes = {f"n{i}".encode(): b"z" for i in range(12)}
    tx = _prepared_then_crash(net, c, writes)
    net.add(2)
    net.run_until(net.now + 8.0)
    assert net.stable()
    assert TxState.PREPARED in [net.nodes[m].tx_report(tx).state for m in net.view]
    assert resolve_everywhere(net, tx, True) >= 1
    net.run_until(net.now + 2.0)
    for key in writes:
        assert {e[1] if e else None for e in net.stored(key).values()} == {b"z"}, key
    no_locks_left(net)


def test_plain_grid_results_carry_no_reason_on_success() -> None:
    net, (a, _b, _c) = cluster(3)
    res = net.put(a, b"k", b"v")
    assert res.ok and res.reason == "" and res.kind == PUT
    got = net.get(a, b"k")
    assert got.kind == GET and got.ok


def test_a_plain_write_cannot_slip_under_a_prepared_transaction() -> None:
    # tx_test_hold_commit (fault injection): the originator sends no commit, so its participants stay prepared.
    net = TxNet(6)
    held = dataclasses.replace(net.config, tx_test_hold_commit=True)
    net.config = held
    a, b, c = net.add(3)
    net.run_until(3.0)
    tx = net.call(a, "tx_begin")
    op = net.call(a, "tx_commit", tx, {b"h1": b"t", b"h2": b"t"}, {})
    net.run_until(net.now + 2.0)
    assert all(r.op_id != op for r in net.results.get(a, []))  # no outcome: the commit never left
    prepared = {m: net.nodes[m].tx_prepared_count() for m in net.view}
    assert sum(prepared.values()) >= 2, prepared  # the primaries and backups of both keys voted YES
    for writer in (b, c):
        res = net.put(writer, b"h1", b"plain")
        assert not res.ok and res.reason == REASON_LOCKED and "held by transaction" in res.error
    assert net.get(b, b"h1").value is None  # nothing slipped in
    assert net.nodes[net.primary(b"h1")].metrics["grid.writes_refused_locked"] >= 2


def test_a_commit_whose_originator_vanished_is_finished_by_the_owners_that_applied_it() -> None:
    # The core's random search seed 9745: the originator died with its commit in flight after a rebalance gave
    # a key a new owner whose copy was taken before the commit reached the old primary; the other owners
    # committed, nobody was in doubt, and the new owner lacked the committed write for good. In the node a
    # commit applied from an originator counts as a write it made us apply, so its departure re-drives it.
    net, (a, _b, _c, d) = cluster(4)
    key = next(k for k in (f"r{i}".encode() for i in range(100)) if d not in net.owners(k))
    tx = net.call(d, "tx_begin")
    assert net.wait(d, net.call(d, "tx_commit", tx, {key: b"committed"}, {})).ok
    owners = net.owners(key)
    keeper, lagging = owners[0], owners[1]
    # The lagging owner lost the write (as a copy taken before the commit would lack it).
    store = net.nodes[lagging].store
    assert store is not None
    seg = store.segments[segment_of(key, store.num_segments)]
    del seg.ver[key], seg.val[key]
    assert net.stored(key)[lagging] is None
    net.crash(d)
    net.run_until(net.now + 5.0)
    assert net.stable()
    assert net.nodes[keeper].metrics["grid.repair_entries_pushed"] >= 1
    copies = net.stored(key)
    assert {v for v in copies.values()} == {copies[keeper]} and copies[keeper][1] == b"committed", copies  # type: ignore[index]
    assert net.get(a, key).value == b"committed"


# -- automatic resolution of in-doubt transactions (GridConfig.tx_auto_resolve, on by default) -----------------


def _in_doubt_on(net: TxNet, tx: TxId) -> list[Address]:
    return [m for m in net.view if any(x.tx == tx for x in net.nodes[m].tx_in_doubt())]


def _prepare_with_commits_lost(
    net: TxNet, origin: Address, writes: dict[bytes, bytes], keep_to: Address | None = None
) -> TxId:
    """Commit on ``origin`` and lose its TX_COMMITs (all, or all but the one to ``keep_to``) after every vote."""
    net.drop_to = lambda src, dest, msg: src == origin and type(msg) is TxCommit and dest != keep_to
    tx = net.call(origin, "tx_begin")
    net.call(origin, "tx_commit", tx, writes, {})
    net.run_until(net.now + 1.0)
    assert not any(r.tx == tx for r in net.results.get(origin, []))  # no outcome: not every owner acknowledged
    return tx  # type: ignore[return-value]


def _key_where(net: TxNet, pred: object, prefix: str = "q") -> bytes:
    return next(k for k in (f"{prefix}{i}".encode() for i in range(1000)) if pred(net.owners(k)))  # type: ignore[operator]


def test_report_request_and_answer_name_every_in_doubt_transaction_and_the_prepare_time_view() -> None:
    net, (a, b, c, d) = cluster(4)
    writes = {b"m1": b"x1", b"m2": b"x2", b"m3": b"x3"}
    tx = _prepare_with_commits_lost(net, d, writes)
    # A member answers a request with every transaction in doubt on it (none yet: the originator lives) and
    # those named; the prepare-time view of a prepared one is the four members.
    owner = net.owners(b"m1")[0]
    node = net.nodes[owner]
    node.on_messages([(a, encode_payload([TxReportRequest(7, (tx,))]))], net.now)
    answers = [
        m for o in node.take_outbox() if o.dest == a for m in decode_payload(o.payload) if type(m) is TxReportAnswer
    ]
    assert len(answers) == 1 and answers[0].request_id == 7
    (rep,) = answers[0].reports
    assert rep.tx == tx and rep.state == TxState.PREPARED and not rep.in_doubt and set(rep.views) == {a, b, c, d}
    assert b"m1" in dict(rep.writes)
    # The originator says it is still deciding (its commits are lost, so it waits for the acknowledgements).
    net.nodes[d].on_messages([(a, encode_payload([TxReportRequest(8, (tx,))]))], net.now)
    (ans,) = [
        m
        for o in net.nodes[d].take_outbox()
        if o.dest == a
        for m in decode_payload(o.payload)
        if type(m) is TxReportAnswer
    ]
    assert ans.reports[0].state == TxState.COMMITTED  # it decided commit: a resolver must commit it too


def test_the_grid_rolls_back_an_in_doubt_transaction_nobody_committed() -> None:
    net, (a, _b, _c, d) = cluster(4)
    writes = {b"m1": b"x1", b"m2": b"x2", b"m3": b"x3"}
    tx = _prepare_with_commits_lost(net, d, writes)
    net.crash(d)
    net.drop_to = lambda src, dest, msg: False
    net.run_until(net.now + 0.5)  # one round of the coordinator, right after the view change
    assert _in_doubt_on(net, tx) == []
    coordinator = net.nodes[net.view[0]]
    assert coordinator.metrics["grid.tx_auto_resolved_rollback"] == 1
    assert coordinator.metrics["grid.tx_auto_resolved_commit"] == 0
    for key in writes:
        assert {e[1] if e else None for e in net.stored(key).values()} == {None}, key
    assert net.put(a, b"m1", b"plain").ok  # the keys are usable again
    no_locks_left(net)


def test_the_grid_commits_an_in_doubt_transaction_a_member_committed() -> None:
    net, (_a, _b, _c, d) = cluster(4)
    writes = {_key_where(net, lambda o: d not in o, "p"): b"v1", _key_where(net, lambda o: d in o, "r"): b"v2"}
    first = sorted(writes)[0]
    keeper = net.owners(first)[1]  # the one owner the originator's commit reaches
    tx = _prepare_with_commits_lost(net, d, writes, keep_to=keeper)
    assert net.nodes[keeper].tx_report(tx).state == TxState.COMMITTED
    net.crash(d)
    net.drop_to = lambda src, dest, msg: False
    net.run_until(net.now + 3.0)
    assert net.stable()
    assert all(net.nodes[m].tx_in_doubt() == [] for m in net.view)
    assert net.nodes[net.view[0]].metrics["grid.tx_auto_resolved_commit"] >= 1
    for key, value in writes.items():
        copies = net.stored(key)
        assert {e[1] if e else None for e in copies.values()} == {value}, (key, copies)
        assert len({e[0] for e in copies.values() if e}) == 1, copies  # one version on every owner
    no_locks_left(net)


def _undecidable(net: TxNet, members: list[Address], writes: dict[bytes, bytes]) -> tuple[TxId, Address]:
    """A transaction in doubt whose prepare-time view lost another member for good: (tx, that member)."""
    d = members[-1]
    tx = _prepare_with_commits_lost(net, d, writes)
    # Another member of the view at the prepare leaves for good (it may have committed it, and its data moved).
    gone = next(m for m in members[1:-1] if m not in set(net.owners(b"m1")) | set(net.owners(b"m2")))
    net.crash(gone)
    net.run_until(net.now + 5.0)
    net.crash(d)
    net.drop_to = lambda src, dest, msg: False
    net.run_until(net.now + 5.0)
    assert net.stable()
    return tx, gone


def test_an_in_doubt_transaction_stays_listed_when_a_member_of_its_prepare_time_view_left() -> None:
    net, members = cluster(5)
    tx, gone = _undecidable(net, members, {b"m1": b"x1", b"m2": b"x2"})
    doubtful = _in_doubt_on(net, tx)
    assert doubtful, "nobody can tell a rollback is safe: it stays in doubt"
    why = net.nodes[net.view[0]].tx_undecided()
    assert tx in why and str(gone) in why[tx] and "prepare-time view" in why[tx], why
    assert net.put(net.view[0], b"m1", b"plain").reason == REASON_LOCKED  # still locked
    # The operator's procedure still resolves it.
    assert resolve_everywhere(net, tx, False) == len(doubtful)
    net.run_until(net.now + 3.0)
    assert net.put(net.view[0], b"m1", b"plain").ok
    assert net.nodes[net.view[0]].tx_undecided() == {}
    no_locks_left(net)


@pytest.mark.parametrize("auto", [True, False])
def test_a_version_only_the_dead_originator_knew_is_stamped_by_the_current_primary(auto: bool) -> None:
    # Simulation seed 19's old schedule: the originator was the primary that stamped k1's version and died with
    # it; a member holds the transaction committed with k1's write waiting for that version, another holds it in
    # doubt. Nobody alive knows the version, so k1's current primary must stamp one (before: k1 stayed locked, the
    # in-doubt member could not be resolved).
    net = TxNet(11, auto_resolve=auto)
    net.add(4)
    net.run_until(3.0)
    a, _b, _c, d = net.view
    k1 = _key_where(net, lambda o: o[0] == d, "s")  # stamped by the originator
    p1 = net.owners(k1)[1]  # its backup: the primary once the originator is gone
    k3 = _key_where(net, lambda o: d not in o and p1 not in o, "t")
    writes = {k1: b"one", k3: b"three"}
    tx = _prepare_with_commits_lost(net, d, writes)
    net.crash(d)
    net.drop_to = lambda src, dest, msg: False
    if auto:
        # The committed member: a commit without k1's version (as one computed for a topology in which it did
        # not own k1) reaches the new primary of k1 from another member before any resolution.
        net.drop = lambda src, msg: type(msg) is TxReportRequest  # hold the resolver back meanwhile
    pushed = TxCommit(tx, 1, net.coordinator.topology.topology_id, ())  # type: ignore[union-attr]
    node = net.nodes[p1]
    node.on_messages([(a, encode_payload([pushed]))], net.now)
    net.collect(p1)
    net.drop = lambda src, msg: False
    net.run_until(net.now + 4.0)
    if not auto:
        resolve_everywhere(net, tx, True)  # the operator: commit (a member committed it)
        net.run_until(net.now + 2.0)
    assert node.metrics["grid.tx_versions_stamped_late"] == 1
    assert all(net.nodes[m].tx_in_doubt() == [] for m in net.view)
    for key, value in writes.items():
        copies = net.stored(key)
        assert {e[1] if e else None for e in copies.values()} == {value}, (key, copies)
        assert len({e[0] for e in copies.values() if e}) == 1, copies
    assert net.put(a, k1, b"plain").ok
    no_locks_left(net)


def test_a_segment_waiting_for_lock_information_is_given_up_at_its_very_deadline() -> None:
    # Grid-tx simulation seed 814: the last-resort unblock compared ``now - since >= tx_timeout`` while the next
    # deadline was ``since + tx_timeout``; at since = 5.87407714840255 the subtraction gives 5.999999999999999,
    # so at the deadline nothing was due and the simulator stepped the member at that instant for ever.
    net, (a, _b, _c) = cluster(3)
    node = net.nodes[a]
    node.config = dataclasses.replace(node.config, tx_timeout=6.0)  # the simulation's
    since = 5.87407714840255
    deadline = since + node.config.tx_timeout
    assert deadline - since < node.config.tx_timeout  # the rounding that made it happen
    node.transactions.tx_awaiting[0] = (net.view[1], since)
    node.tx.block_segments([0])
    assert node.next_deadline() is not None and node.next_deadline() <= deadline  # type: ignore[operator]
    node.tick(deadline)
    assert node.transactions.tx_awaiting == {} and not node.tx.locks.is_blocked(0)
    assert node.metrics["grid.tx_lock_info_given_up"] == 1


def test_tx_resolve_all_resolves_on_every_member_from_one() -> None:
    # Next 2: one call on any member collects every member's report (the resolver's messages) and decides.
    net, members = cluster(5)
    writes = {b"m1": b"x1", b"m2": b"x2"}
    tx, _gone = _undecidable(net, members, writes)
    asker = net.view[-1]

    def resolve_all(commit: bool | None) -> OpResult:
        return net.wait(asker, net.call(asker, "tx_resolve_all", tx, commit))

    res = resolve_all(None)  # the grid's rule: cannot tell
    assert not res.ok and res.reason == "undecided" and "prepare-time view" in res.error, res
    res = resolve_all(True)  # the operator's decision
    assert res.ok and res.value == b"commit" and res.tx == tx, res
    net.run_until(net.now + 2.0)
    assert _in_doubt_on(net, tx) == []
    for key, value in writes.items():
        copies = net.stored(key)
        assert {e[1] if e else None for e in copies.values()} == {value}, (key, copies)
        assert len({e[0] for e in copies.values() if e}) == 1, copies
    no_locks_left(net)
    res = resolve_all(False)
    assert not res.ok and res.reason == "not_in_doubt", res


@pytest.mark.parametrize("commit_first", [True, False], ids=["commit-before-topology", "commit-after-topology"])
def test_a_lock_promoted_in_a_partition_goes_with_the_segment_a_merged_topology_takes_away(commit_first: bool) -> None:
    # Simulation grid-tx seed 4100123: x, backup of a key b, was cut off alone while the transaction was
    # prepared; primary of b's segment in its degraded topology, it held b's lock (a promoted backup lock). The
    # merged group's topology continued the other side's rebalance, without x as an owner of that segment (the
    # phase kept x's copy: no drop). The resolved commit carried only the keys x owned then, so b's lock waited
    # for a version that never comes, for good. Locks now go with ownership at every available topology.
    o, p, x = (Address(f"10.0.0.{i}", 7800, i) for i in (1, 2, 3))
    a = next(f"a{i}".encode() for i in range(100) if segment_of(f"a{i}".encode(), 2) == 1)
    b = next(f"b{i}".encode() for i in range(100) if segment_of(f"b{i}".encode(), 2) == 0)
    caps = {o: 1.0, p: 1.0, x: 1.0}

    def topo(tid: int, owners: list[tuple[Address, ...]], members: tuple[Address, ...], phase: Phase) -> CacheTopology:
        ch = ConsistentHash.from_owner_map(2, 2, owners, caps)
        pending = None if phase == Phase.NO_REBALANCE else ch
        return CacheTopology(
            tid, 1, phase, ch, pending, members, Availability.AVAILABLE, members, PartitionHandling.DENY_READ_WRITES
        )

    node = GridNode(x, GridConfig.from_dict({"num_segments": 2, "num_owners": 2, "recovery_timeout": "1s"}))
    node.on_view((o, p, x), 0.0)
    node.on_messages([(o, encode_payload([Topology(topo(5, [(p, x), (x, p)], (o, p, x), Phase.NO_REBALANCE))]))], 0.1)
    tx = TxId(o, 1)
    prepare = TxPrepare(tx, 1, 5, (a,), ((a, b"1"), (b, b"2")), ())
    node.on_messages([(o, encode_payload([prepare]))], 0.2)
    assert node.tx.state_of(tx) == TxState.PREPARED and node.tx.locks.held_by(tx) == {a}
    version_a = node.tx.report(tx).versions[0][1]
    node.on_view((x,), 1.0)  # cut off alone: in doubt, and its own degraded grid makes it b's primary
    node.tick(2.5)
    assert node.topology is not None and node.topology.availability == Availability.DEGRADED
    assert node.tx.locks.held_by(tx) == {a, b}
    node.on_view((o, p, x), 3.0, merge=True)
    commit = encode_payload([TxCommit(tx, 1, 7, ((a, version_a, b"1"),), resolved=True)])  # x's keys under 7
    merged = encode_payload([Topology(topo(7, [(p, o), (x, p)], (o, p, x), Phase.READ_NEW_WRITE_ALL))])
    for payload in [commit, merged] if commit_first else [merged, commit]:
        node.on_messages([(o, payload)], 3.1)
    assert node.tx.state_of(tx) == TxState.COMMITTED
    assert node.tx.locks.empty(), node.tx.locks.locked_keys()


def test_a_primary_that_stays_a_backup_keeps_no_lock_after_pushing_its_lock_information() -> None:
    # Simulation grid-tx seed 959994000140: as in the test above, x (a backup of b, prepared) was cut off alone
    # and, primary of b's segment in its own degraded grid, held b's lock (a promoted backup lock). The merged
    # topology made p b's primary again but kept x as a backup: x pushed its lock information to p and kept the
    # lock itself. The resolved commit carried only a's write (b's version unknown to the resolver), so x held b
    # for that missing version, for good. The old primary now demotes its locks to backup locks after the push.
    o, p, x = (Address(f"10.0.0.{i}", 7800, i) for i in (1, 2, 3))
    a = next(f"a{i}".encode() for i in range(100) if segment_of(f"a{i}".encode(), 2) == 1)
    b = next(f"b{i}".encode() for i in range(100) if segment_of(f"b{i}".encode(), 2) == 0)
    caps = {o: 1.0, p: 1.0, x: 1.0}

    def topo(tid: int, owners: list[tuple[Address, ...]], members: tuple[Address, ...]) -> Topology:
        ch = ConsistentHash.from_owner_map(2, 2, owners, caps)
        deny = PartitionHandling.DENY_READ_WRITES
        return Topology(
            CacheTopology(tid, 1, Phase.NO_REBALANCE, ch, None, members, Availability.AVAILABLE, members, deny)
        )

    node = GridNode(x, GridConfig.from_dict({"num_segments": 2, "num_owners": 2, "recovery_timeout": "1s"}))
    node.on_view((o, p, x), 0.0)
    node.on_messages([(o, encode_payload([topo(5, [(p, x), (x, p)], (o, p, x))]))], 0.1)
    tx = TxId(o, 1)
    node.on_messages([(o, encode_payload([TxPrepare(tx, 1, 5, (a,), ((a, b"1"), (b, b"2")), ())]))], 0.2)
    assert node.tx.state_of(tx) == TxState.PREPARED and node.tx.locks.backup_locks(tx) == {b}
    version_a = node.tx.report(tx).versions[0][1]
    node.on_view((x,), 1.0)  # cut off alone: in doubt, and its own degraded grid makes it b's primary
    node.tick(2.5)
    assert node.tx.locks.held_by(tx) == {a, b}
    node.on_view((o, p, x), 3.0, merge=True)
    node.take_outbox()
    node.on_messages([(o, encode_payload([topo(7, [(p, x), (x, p)], (o, p, x))]))], 3.1)  # p is b's primary again
    pushed = [m for o in node.take_outbox() if o.dest == p for m in decode_payload(o.payload) if type(m) is TxLockInfo]
    assert [r.lock_keys for info in pushed for r in info.records] == [(b,)]  # p holds b for tx now
    assert node.tx.locks.held_by(tx) == {a} and node.tx.locks.backup_locks(tx) == {b}
    node.on_messages([(o, encode_payload([TxCommit(tx, 1, 7, ((a, version_a, b"1"),), resolved=True)]))], 3.2)
    assert node.tx.state_of(tx) == TxState.COMMITTED
    assert node.tx.locks.empty(), node.tx.locks.locked_keys()


def test_an_in_doubt_commit_needs_no_version_for_a_key_whose_segment_the_member_holds_no_more() -> None:
    # Simulation grid-tx seed 203001472: a backup lagging behind held the originator's commit for a topology it
    # had not installed, was cut off (in doubt) before installing it, and so ignored it. The key then moved to
    # other owners, and the primary that had stamped its version left. The operator's tx_resolve asked for that
    # version though the member no longer held the key: the transaction stayed in doubt for good.
    o, p, q, x = (Address(f"10.0.0.{i}", 7800, i) for i in (1, 2, 3, 4))
    kept = next(f"a{i}".encode() for i in range(100) if segment_of(f"a{i}".encode(), 2) == 0)
    moved = next(f"b{i}".encode() for i in range(100) if segment_of(f"b{i}".encode(), 2) == 1)
    caps = {o: 1.0, p: 1.0, q: 1.0, x: 1.0}

    def topo(tid: int, owners: list[tuple[Address, ...]], members: tuple[Address, ...]) -> Topology:
        ch = ConsistentHash.from_owner_map(2, 2, owners, caps)
        return Topology(CacheTopology(tid, 1, Phase.NO_REBALANCE, ch, None, members, Availability.AVAILABLE, members))

    node = GridNode(x, GridConfig.from_dict({"num_segments": 2, "num_owners": 2}))
    node.on_view((o, p, q, x), 0.0)
    node.on_messages([(o, encode_payload([topo(5, [(p, x), (p, x)], (o, p, q, x))]))], 0.1)
    tx = TxId(o, 1)
    node.on_messages([(o, encode_payload([TxPrepare(tx, 1, 5, (), ((kept, b"1"), (moved, b"2")), ())]))], 0.2)
    assert node.tx.state_of(tx) == TxState.PREPARED and node.tx.locks.backup_locks(tx) == {kept, moved}
    node.on_view((p, q, x), 1.0)  # the originator is gone: in doubt
    node.on_messages([(p, encode_payload([topo(6, [(p, x), (p, q)], (p, q, x))]))], 1.1)
    assert node.store is not None and not node.store.has_segment(1)
    assert [d.tx for d in node.tx_in_doubt()] == [tx]
    with pytest.raises(ValueError, match=re.escape(repr([kept]))):
        node.tx_resolve(tx, True, 2.0)  # a key it still holds needs its version
    version = (5 << 40) | 7
    assert node.tx_resolve(tx, True, 2.0, {kept: version})
    assert node.tx.state_of(tx) == TxState.COMMITTED and node.tx_in_doubt() == []
    assert node.tx.locks.empty()
    assert node.store.get(0, kept) == (version, b"1")


def test_a_repeated_commit_is_applied_again_into_a_copy_emptied_for_a_fresh_transfer() -> None:
    # Simulation grid-tx seed 895672000093: x applied a commit of key k, then a topology took k's segment from x
    # and the next one gave it back (a new owner: its copy emptied for a fresh transfer). The transfer came from
    # an owner the commit had not reached yet, with k's older value; the originator's repeated commit, meant for
    # the new owners, was taken as a duplicate (k's version was on record as applied), so x kept the old value
    # while the other owners had the committed one, for good.
    o, p, x = (Address(f"10.0.0.{i}", 7800, i) for i in (1, 2, 3))
    k = next(f"c{i}".encode() for i in range(100) if segment_of(f"c{i}".encode(), 2) == 1)
    caps = {o: 1.0, p: 1.0, x: 1.0}
    members = (o, p, x)

    def topo(tid: int, current: list[tuple[Address, ...]], pending: list[tuple[Address, ...]] | None) -> Topology:
        ch = ConsistentHash.from_owner_map(2, 2, current, caps)
        ph = Phase.NO_REBALANCE if pending is None else Phase.READ_OLD_WRITE_ALL
        new = None if pending is None else ConsistentHash.from_owner_map(2, 2, pending, caps)
        return Topology(CacheTopology(tid, tid, ph, ch, new, members, Availability.AVAILABLE, members))

    node = GridNode(x, GridConfig.from_dict({"num_segments": 2, "num_owners": 2}))
    node.on_view(members, 0.0)
    node.on_messages([(o, encode_payload([topo(5, [(o, p), (p, x)], None)]))], 0.1)
    old, new = (4 << 40) | 1, (5 << 40) | 2
    tx = TxId(o, 1)
    commit = TxCommit(tx, 1, 5, ((k, new, b"new"),))
    node.on_messages([(o, encode_payload([commit]))], 0.2)
    assert node.store is not None and node.store.get(1, k) == (new, b"new")
    node.on_messages([(o, encode_payload([topo(6, [(o, p), (p, o)], None)]))], 0.3)
    assert not node.store.has_segment(1)
    node.on_messages([(o, encode_payload([topo(7, [(o, p), (p, o)], [(o, p), (p, x)])]))], 0.4)
    assert node.store.get(1, k) is None
    ((source, fetch),) = [
        (out.dest, m)
        for out in node.take_outbox()
        for m in decode_payload(out.payload)
        if isinstance(m, Fetch) and 1 in m.segments
    ]
    # The source has not got the commit yet: its copy carries k's older value.
    stale = XferData(fetch.xfer_id, 1, EntryChunk([k], [old], [b"old"]), (1,), True)
    node.on_messages([(source, encode_payload([stale]))], 0.5)
    node.tick(0.5)  # transfer data waits for a step of its own
    assert node.store.get(1, k) == (old, b"old")
    node.on_messages([(o, encode_payload([TxCommit(tx, 1, 7, ((k, new, b"new"),))]))], 0.6)
    assert node.store.get(1, k) == (new, b"new")
