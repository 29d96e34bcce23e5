"""``groupcluster chaos``: a one-minute run of real members under SIGKILL, SIGSTOP, leave and network-cut faults
is clean, a cut really isolated its member, and the checking side really catches a lost write or diverged
replicas in that run's own history. A 1.5-minute run with ``--capacity-changes`` adds capacity changes to
those faults and is clean too.

The run is driven through the command line as a user would; its history is kept (``--dir``) so the second
half can doctor it and show that the same checks then fail.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from groupcluster.sim.history import History, HistoryEvent
from groupcluster.tools.chaos.faults import CAPACITY, CAPACITY_VALUES, CUT_LENGTH, KINDS, FaultSchedule
from groupcluster.tools.chaos.judgement import check_history
from groupcluster.tools.chaos.runner import HISTORY_FILE
from groupcluster.tools.chaos.workload import ATTEMPT_TIMEOUT, OP_TIMEOUT, REQUEST_TIMEOUT
from groupcluster.tools.local_cluster import pid_alive

SUMMARY = re.compile(r"^chaos: (\d+) ops, (\d+) violations, (\d+) lost$")
# The one-minute run's seed: its first fault is a cut long enough (9.9 s) to get the member excluded, and the
# first four faults (every kind) fit in the minute.
SEED = 11
# A cut at least this long is past the failure detector's timeout (4 s) + verify (1 s) + a heartbeat interval
# and the view change: the member is excluded (and comes back through a merge).
EXCLUDING_CUT = 8.0


def chaos(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "groupcluster.cli", "chaos", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


@dataclass
class Run:
    proc: subprocess.CompletedProcess[str]
    report: dict[str, Any]
    summary: str
    directory: Path


def run_chaos(d: Path, *args: str) -> Iterator[Run]:
    """A chaos run with ``args`` keeping its state in ``d``, yielded with its JSON report and summary line."""
    try:
        proc = chaos(*args, "--json", "--dir", str(d))
        lines = proc.stdout.strip().splitlines()
        assert len(lines) >= 2, f"no report (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
        yield Run(proc, json.loads(lines[-2]), lines[-1], d)
    finally:
        # A run that timed out leaves members (in their own sessions) behind: kill ours, never a reused pid.
        with contextlib.suppress(OSError, ValueError, KeyError):
            for m in json.loads((d / "cluster.json").read_text())["members"]:
                if pid_alive(m["pid"], m["bind"]):
                    os.kill(m["pid"], signal.SIGKILL)


@pytest.fixture(scope="module")
def one_minute(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    yield from run_chaos(tmp_path_factory.mktemp("chaos") / "run", "--minutes", "1", "--seed", str(SEED))


def test_one_minute_run_is_clean_and_has_every_fault_kind(one_minute: Run) -> None:
    run = one_minute
    detail = f"{run.proc.stdout[-3000:]}\n{run.proc.stderr[-3000:]}"
    m = SUMMARY.match(run.summary)
    assert m, f"last line is not the summary: {run.summary!r}\n{detail}"
    ops, violations, lost = (int(g) for g in m.groups())
    assert (violations, lost) == (0, 0), detail
    assert run.proc.returncode == 0, detail
    assert ops == run.report["ops"] and ops > 500, run.report
    kinds = run.report["fault_kinds"]
    assert {k: kinds.get(k, 0) > 0 for k in KINDS} == dict.fromkeys(("kill", "pause", "leave", "cut"), True)
    assert all(f["recovered_after"] is not None for f in run.report["faults"]), run.report["faults"]
    assert run.report["keys_checked"] > 0
    assert run.report["violations"] == {
        "grid-fresh-reads": 0,
        "grid-lost-write": 0,
        "grid-replicas-equal": 0,
        "grid-expired": 0,  # (the chaos writer gives no lifespans: this checker has nothing to judge here)
        "grid-liveness": 0,  # (chaos histories record no grid_whole/grid_heal: it makes no claim on them)
    }
    # The same seed draws the same schedule: the first four faults are the four kinds in a seeded order.
    assert len({f["kind"] for f in run.report["faults"][:4]}) == 4


def replay_schedule(
    seed: int, members: int, faults: int, *, capacity_changes: bool = False
) -> list[tuple[str, str, str | None]]:
    """The (kind, victim, replacement) a seed draws for a run's first ``faults`` faults, without a cluster."""
    schedule = FaultSchedule(seed, capacity_changes=capacity_changes)
    names = [f"m{i}" for i in range(1, members + 1)]
    nxt = members + 1
    out: list[tuple[str, str, str | None]] = []
    for number in range(1, faults + 1):
        schedule.gap()
        kind, victim, _ = schedule.draw(number, names)
        replacement = None
        if kind not in ("pause", "cut", CAPACITY):
            replacement = f"m{nxt}"
            nxt += 1
            names = [n for n in names if n != victim] + [replacement]
        out.append((kind, victim, replacement))
    return out


def test_the_run_followed_its_seeds_schedule(one_minute: Run) -> None:
    faults = one_minute.report["faults"]
    ran = [(f["kind"], f["member"], f["replacement"]) for f in faults]
    assert ran == replay_schedule(SEED, one_minute.report["members"], len(faults))


def test_same_seed_same_schedule_other_seed_another() -> None:
    a, b = replay_schedule(7, 4, 12), replay_schedule(7, 4, 12)
    assert a == b
    assert a != replay_schedule(8, 4, 12)
    assert sorted(k for k, _, _ in a[:4]) == sorted(KINDS)
    lengths = [FaultSchedule(seed).draw(1, ["m1", "m2", "m3", "m4"]) for seed in range(40)]
    cuts = [d.hold for d in lengths if d.kind == "cut"]
    assert cuts and all(CUT_LENGTH[0] <= h <= CUT_LENGTH[1] for h in cuts)


def _events(run: Run) -> list[HistoryEvent]:
    return History.read(run.directory / HISTORY_FILE).events


def test_a_cut_really_cut_its_member_off(one_minute: Run) -> None:
    """Both sides' faults layers dropped the other side's frames; a long cut got the member out of the others'
    views (or them out of its view) while it lasted, and the group merged back after the heal."""
    cuts = [f for f in one_minute.report["faults"] if f["kind"] == "cut"]
    assert cuts, one_minute.report["faults"]
    for f in cuts:
        by_victim, by_others = f["dropped"]
        assert by_victim > 0 and by_others > 0, f
    events = _events(one_minute)
    marks = [e for e in events if e.kind == "cut"]
    assert [e.data["phase"] for e in marks] == ["start", "end"] * len(cuts)
    views = [e for e in events if e.kind == "view"]
    checked = 0
    for f, start, end in zip(cuts, marks[::2], marks[1::2], strict=True):
        victim = start.member
        if f["length"] < EXCLUDING_CUT:
            continue
        checked += 1
        before = next(e for e in reversed(views) if e.member == victim and e.t < start.t)
        during = [e for e in views if start.t <= e.t <= end.t]
        shrank = [e for e in during if e.member == victim and len(e.data["members"]) < len(before.data["members"])]
        excluded = [e for e in during if e.member != victim and victim not in e.data["members"]]
        assert shrank or excluded, f"no view without {victim} during the cut {f}:\n{during}"
        # After the heal the victim and the others are in one view again (through MERGE).
        merged = [e for e in views if e.t > start.t and e.member == victim and e.data.get("merge")]
        assert any(len(e.data["members"]) == len(before.data["members"]) for e in merged), merged[:3]
    assert checked, f"no cut of {EXCLUDING_CUT:g}s or more in {cuts}"


def test_checks_catch_a_lost_write_in_the_real_history(one_minute: Run) -> None:
    events = _events(one_minute)
    assert check_history(History(events))[0]["grid-lost-write"] == 0
    # The last acknowledged put of each key; doctor the read-back of one whose value should still be there.
    starts = {e.data["id"]: e for e in events if e.kind == "grid_start"}
    last_put: dict[str, str] = {}
    for e in events:
        if e.kind == "grid_end" and e.data["ok"] and starts[e.data["id"]].member == "writer":
            s = starts[e.data["id"]]
            last_put[s.data["key"]] = s.data["op"]
    final = next(
        e
        for e in events
        if e.kind == "grid_end" and starts[e.data["id"]].member == "final" and e.data["ok"] and e.data["value"]
    )
    key = starts[final.data["id"]].data["key"]
    doctored = [HistoryEvent(e.t, e.member, e.kind, {**e.data, "value": None}) if e is final else e for e in events]
    violations, samples, lost = check_history(History(doctored))
    assert violations["grid-lost-write"] == 1, samples
    assert lost == {key}


def test_checks_catch_diverged_replicas_in_the_real_history(one_minute: Run) -> None:
    events = _events(one_minute)
    stores = [e for e in events if e.kind == "grid_store"]
    assert len(stores) == one_minute.report["members"]
    # Change one entry in one owner's copy of a segment that holds data.
    victim = next(e for e in stores if any(e.data["data"].values()))
    seg, entries = next((s, d) for s, d in victim.data["data"].items() if d)
    k = sorted(entries)[0]
    data = {**victim.data["data"], seg: {**entries, k: entries[k] + "-diverged"}}
    doctored = [HistoryEvent(e.t, e.member, e.kind, {**e.data, "data": data}) if e is victim else e for e in events]
    violations, samples, _ = check_history(History(doctored))
    assert violations["grid-replicas-equal"] >= 1, samples


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--minutes", "0", "--seed", "1"], "--minutes: expected minutes between 0 and 1440"),
        (["--minutes", "x", "--seed", "1"], "--minutes: expected minutes between 0 and 1440"),
        (["--minutes", "1", "--seed", "-3"], "--seed: expected a seed"),
        (["--minutes", "1", "--seed", "1", "--members", "2"], "--members: expected 3 to 16 members"),
        (["--minutes", "1"], "the following arguments are required: --seed"),
    ],
)
def test_bad_arguments_are_named(args: list[str], message: str) -> None:
    proc = chaos(*args, timeout=60)
    assert proc.returncode == 2
    assert message in proc.stderr, proc.stderr


def test_a_dir_holding_a_cluster_is_refused(tmp_path: Path) -> None:
    (tmp_path / "cluster.json").write_text("{}")
    proc = chaos("--minutes", "1", "--seed", "1", "--dir", str(tmp_path), timeout=60)
    assert proc.returncode == 2
    assert "already holds a cluster" in proc.stderr


def test_members_finish_an_operation_before_the_client_gives_up_on_them(one_minute: Run) -> None:
    # Found by a CI run of the one-minute chaos: the writer's request to a member that was cut off timed out
    # after 5 s and succeeded on another member; the cut member kept its own operation alive (op_timeout 30 s)
    # and, once the cut healed, wrote the old value over a later acknowledged one. The members now end an
    # operation (last attempt + the owner's hold) before the client's request timeout.
    assert OP_TIMEOUT + ATTEMPT_TIMEOUT < REQUEST_TIMEOUT
    params = json.loads((one_minute.directory / "cluster.json").read_text())["grid_params"]
    assert f"op_timeout={OP_TIMEOUT:g}s" in params and f"attempt_timeout={ATTEMPT_TIMEOUT:g}s" in params


# --capacity-changes: this seed's first faults are a pause, a capacity of 0, a leave, a kill and a cut (all five
# kinds within its 1.5 minutes), and its second capacity fault sets 1.
CAPACITY_SEED = 13


@pytest.fixture(scope="module")
def capacity_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    d = tmp_path_factory.mktemp("chaos-capacity") / "run"
    yield from run_chaos(d, "--minutes", "1.5", "--seed", str(CAPACITY_SEED), "--capacity-changes")


def test_capacity_changes_under_faults_lose_nothing(capacity_run: Run) -> None:
    """Capacity changes are faults among kills, pauses, leaves and cuts on real members: the history is clean,
    and every balanced grid the run waited for had its capacity-0 members owning no segment."""
    run = capacity_run
    detail = f"{run.proc.stdout[-3000:]}\n{run.proc.stderr[-3000:]}"
    assert run.proc.returncode == 0 and run.report["ok"], detail
    assert SUMMARY.match(run.summary) and run.report["total_violations"] == 0 and run.report["lost"] == 0, detail
    kinds = run.report["fault_kinds"]
    assert all(kinds.get(k, 0) > 0 for k in (*KINDS, CAPACITY)), kinds
    capacity_faults = [f for f in run.report["faults"] if f["kind"] == CAPACITY]
    assert any(f["detail"].startswith("POST /v1/capacity 0 ") for f in capacity_faults), capacity_faults
    # The settle after the capacity 0 (and any later one while that member lived) checked it owned nothing.
    assert run.report["capacity_checks"] > 0, run.report
    faults = run.report["faults"]
    ran = [(f["kind"], f["member"], f["replacement"]) for f in faults]
    assert ran == replay_schedule(CAPACITY_SEED, run.report["members"], len(faults), capacity_changes=True)


def test_capacity_changes_add_a_kind_and_leave_other_draws_alone() -> None:
    """Without the option a seed draws what it always drew; with it the first five faults are the five kinds,
    and the capacity values come from their own stream."""
    # What seed 7 drew (kinds and victims from four fixed names) before the option existed.
    before = (
        "pause m1, cut m1, kill m4, leave m1, kill m2, leave m2, kill m1, cut m3, pause m2, cut m3, kill m4, cut m1"
    )
    schedule = FaultSchedule(7)
    drawn = []
    for n in range(1, 13):
        schedule.gap()
        d = schedule.draw(n, ["m1", "m2", "m3", "m4"])
        drawn.append(f"{d.kind} {d.victim}")
    assert ", ".join(drawn) == before
    for seed in range(20):
        first = replay_schedule(seed, 4, 5, capacity_changes=True)
        assert sorted(k for k, _, _ in first) == sorted((*KINDS, CAPACITY)), (seed, first)
    drawn = [FaultSchedule(3, capacity_changes=True) for _ in range(2)]
    values = [[s.capacity() for _ in range(40)] for s in drawn]
    assert values[0] == values[1] and set(values[0]) == set(CAPACITY_VALUES)
