"""The sweep ledger's simulated-code digest: it covers every module a simulation runs, it is the same computed
from a commit and from its checkout, and totals count exactly the rows on one code version."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from groupcluster.compiled import PURE_ENV
from groupcluster.sim import ledger
from groupcluster.sim import sweep as sweep_cli

_LOADED = """
import json, sys
from groupcluster.sim.sweep import DEFAULT_PROFILES, parse_profile, _run
for p in DEFAULT_PROFILES:
    _run((3, parse_profile(p).scenario))
print(json.dumps(sorted(m for m in sys.modules if m == "groupcluster" or m.startswith("groupcluster."))))
"""


def test_every_module_a_seed_of_each_default_profile_loads_is_in_the_digest() -> None:
    # A fresh interpreter, so only what the seeds import is loaded.
    out = subprocess.run([sys.executable, "-c", _LOADED], capture_output=True, text=True, check=True, timeout=600)
    modules = json.loads(out.stdout.strip().splitlines()[-1])
    assert "groupcluster.grid.node.facade" in modules and "groupcluster.protocols.flush" in modules
    outside = []
    for name in modules:
        if name.endswith("__mypyc"):
            continue  # mypyc's shared runtime of the compiled modules, built from the sources checked here
        if name == "groupcluster.sim.ledger":
            continue  # imported by the sweep, but no seed calls it (the tracing test below checks it)
        parts = name.split(".")[1:]
        package = ledger.PACKAGE.joinpath(*parts)
        rel = ((package / "__init__.py") if package.is_dir() else package.with_suffix(".py")).relative_to(
            ledger.PACKAGE
        )
        if not ledger.in_sim_code(rel.as_posix()):
            outside.append(name)
    assert not outside, f"modules the simulation runs that the digest leaves out: {outside}"


_CALLED = """
import json, sys
from groupcluster.sim.sweep import DEFAULT_PROFILES, parse_profile, _run
files = {}

for p in DEFAULT_PROFILES:
    seen = files.setdefault(p.split("+", 1)[0], set())

    def on_call(frame, event, arg, seen=seen):
        if event == "call":
            seen.add(frame.f_code.co_filename)

    sys.setprofile(on_call)
    _run((3, parse_profile(p).scenario))
    sys.setprofile(None)
print(json.dumps({k: sorted(v) for k, v in files.items()}))
"""


def test_a_seed_of_each_group_stack_calls_only_the_group_code_and_none_calls_the_ledger() -> None:
    # Interpreted modules, so that every function the seeds call is seen by the profiler hook.
    env = {**os.environ, PURE_ENV: "1"}
    out = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", _CALLED],
        capture_output=True,
        text=True,
        check=True,
        timeout=900,
        env=env,
    )
    called = json.loads(out.stdout.strip().splitlines()[-1])
    package = ledger.PACKAGE.resolve()

    def rels(stack: str) -> set[str]:
        paths = (Path(f).resolve() for f in called[stack])
        return {p.relative_to(package).as_posix() for p in paths if p.is_relative_to(package)}

    assert set(ledger.GROUP_STACKS) < set(called) and "grid-tx" in called
    group = set().union(*(rels(s) for s in ledger.GROUP_STACKS))
    assert {"protocols/flush.py", "protocols/sequencer/layer.py", "sim/scenario.py"} <= group
    outside = sorted(r for r in group if not ledger.in_group_code(r))
    assert not outside, f"code a group stack's seed calls that the group-code digest leaves out: {outside}"
    everything = set().union(*(rels(s) for s in called))
    assert "grid/tx/locks.py" in everything
    outside = sorted(r for r in everything if not ledger.in_sim_code(r))
    assert not outside, f"code a seed calls that the digest leaves out: {outside}"


def test_the_group_code_is_the_simulated_code_without_the_grid() -> None:
    assert ledger.in_group_code("protocols/flush.py")
    assert ledger.in_group_code("sim/scenario.py")
    assert ledger.in_group_code("stacks.py")
    assert not ledger.in_group_code("grid/node/facade.py")
    assert not ledger.in_group_code("grid/tx/locks.py")
    assert not ledger.in_group_code("sim/grid/tx_checkers.py")
    assert not ledger.in_group_code("grid/http/app.py")


def test_the_parts_a_simulation_never_imports_are_left_out() -> None:
    assert ledger.in_sim_code("protocols/flush.py")
    assert ledger.in_sim_code("grid/node/facade.py")
    assert ledger.in_sim_code("stacks.py")
    assert not ledger.in_sim_code("sim/ledger.py")
    assert not ledger.in_sim_code("grid/http/app.py")
    assert not ledger.in_sim_code("grid/client/_routing.py")
    assert not ledger.in_sim_code("tools/chaos.py")
    assert not ledger.in_sim_code("bench/peers.py")
    assert not ledger.in_sim_code("grid/node/facade.cpython-311-x86_64-linux-gnu.so")


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout


def _repo(tmp_path: Path) -> tuple[Path, Path]:
    repo = tmp_path / "repo"
    pkg = repo / "member" / "groupcluster"
    for rel, text in {
        "__init__.py": "",
        "core/wire.py": "A = 1\n",
        "protocols/flush.py": "B = 2\n",
        "grid/tx/locks.py": "E = 5\n",
        "grid/http/app.py": "C = 3\n",
        "tools/chaos.py": "D = 4\n",
    }.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(text)
    _git(repo.parent, "init", "-q", str(repo))
    _git(repo, "-c", "user.email=t@t", "-c", "user.name=t", "add", ".")
    _git(repo, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "one")
    return repo, pkg


def test_the_digest_of_a_commit_equals_that_of_its_checkout_and_ignores_code_the_sim_does_not_run(
    tmp_path: Path,
) -> None:
    repo, pkg = _repo(tmp_path)
    first = ledger.sim_code_digest(pkg)
    assert ledger.sim_code_digest_at(repo, "HEAD") == first
    (pkg / "grid/http/app.py").write_text("C = 30\n")
    (pkg / "tools/chaos.py").write_text("D = 40\n")
    assert ledger.sim_code_digest(pkg) == first
    (pkg / "protocols/flush.py").write_text("B = 20\n")
    changed = ledger.sim_code_digest(pkg)
    assert changed != first
    _git(repo, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qam", "two")
    assert ledger.sim_code_digest_at(repo, "HEAD") == changed
    assert ledger.sim_code_digest_at(repo, "HEAD~1") == first
    assert ledger.sim_code_digest_at(repo, "no-such-commit") is None


def test_totals_count_only_the_rows_on_the_current_code(tmp_path: Path) -> None:
    repo, pkg = _repo(tmp_path)
    old = _git(repo, "rev-parse", "HEAD").strip()
    (pkg / "protocols/flush.py").write_text("B = 20\n")
    _git(repo, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qam", "two")
    new = _git(repo, "rev-parse", "HEAD").strip()
    current = ledger.sim_code_digest(pkg)
    rows = [
        {"profile": "vsync", "start": 100, "seeds": 50, "failed": [120], "code": old},
        {"profile": "vsync", "start": 200, "seeds": 40, "failed": [], "code": new},
        {"profile": "grid+deadlines=0.5", "start": 300, "seeds": 30, "failed": [], "sim_code": current},
        {"profile": "grid", "options": "--members 3", "start": 400, "seeds": 20, "failed": [], "code": new},
        {"profile": "grid", "start": 500, "seeds": 10, "failed": [], "code": new + "+dirty"},
        {"profile": "fifo", "start": 600, "seeds": 5, "failed": [], "code": None},
    ]
    by_stack, by_profile = ledger.totals(rows, current, repo)
    assert {k: (t.seeds, t.failed) for k, t in by_stack.items()} == {"vsync": (40, []), "grid": (50, [])}
    assert by_profile["grid+deadlines=0.5"].ranges == ["300..329"]
    assert by_profile["grid --members 3"].seeds == 20
    text = ledger.format_totals(current, by_stack, by_profile)
    assert "vsync" in text and "fifo" not in text


def test_a_change_to_the_grid_alone_keeps_the_group_stacks_totals(tmp_path: Path) -> None:
    repo, pkg = _repo(tmp_path)
    old = _git(repo, "rev-parse", "HEAD").strip()
    (pkg / "grid/tx/locks.py").write_text("E = 50\n")
    _git(repo, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qam", "grid")
    grid_changed = _git(repo, "rev-parse", "HEAD").strip()
    (pkg / "protocols/flush.py").write_text("B = 20\n")
    current = ledger.sim_code_digest(pkg)
    group = ledger.sim_code_digest(pkg, part=ledger.in_group_code)
    rows = [
        {"profile": "vsync", "start": 100, "seeds": 50, "failed": [], "code": old},
        {"profile": "grid-tx", "start": 100, "seeds": 50, "failed": [], "code": old},
    ]
    # Before the protocol change: the grid's change keeps vsync's rows, not grid-tx's.
    at_grid = ledger.sim_code_digest_at(repo, "HEAD")
    at_grid_group = ledger.sim_code_digest_at(repo, "HEAD", part=ledger.in_group_code)
    assert at_grid is not None and at_grid_group is not None
    by_stack, _ = ledger.totals(rows, at_grid, repo, at_grid_group)
    assert {k: t.seeds for k, t in by_stack.items()} == {"vsync": 50}
    rows.append({"profile": "grid-tx", "start": 200, "seeds": 7, "failed": [], "code": grid_changed})
    by_stack, _ = ledger.totals(rows, at_grid, repo, at_grid_group)
    assert {k: t.seeds for k, t in by_stack.items()} == {"vsync": 50, "grid-tx": 7}
    # A protocol change counts for every stack: none of those rows ran it.
    by_stack, _ = ledger.totals(rows, current, repo, group)
    assert by_stack == {}
    rows.append({"profile": "fifo", "start": 300, "seeds": 3, "failed": [], "sim_code": "x", "group_code": group})
    by_stack, by_profile = ledger.totals(rows, current, repo, group)
    assert {k: t.seeds for k, t in by_stack.items()} == {"fifo": 3}
    assert f"the group code {group}" in ledger.format_totals(current, by_stack, by_profile)


def test_a_sweep_records_the_digest_and_totals_read_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "ledger.jsonl"
    parser = argparse.ArgumentParser()
    sweep_cli.add_arguments(parser)
    assert (
        sweep_cli.run(
            parser.parse_args(
                ["--seeds", "2", "--start", "7", "--profile", "fifo", "--jobs", "1", "--ledger", str(path)]
            )
        )
        == 0
    )
    (row,) = ledger.read_rows(path)
    assert row["sim_code"] == ledger.sim_code_digest()
    capsys.readouterr()
    assert sweep_cli.run(parser.parse_args(["--totals", "--ledger", str(path)])) == 0
    out = capsys.readouterr().out
    assert f"simulated code {row['sim_code']}" in out
    assert "fifo" in out and "7..8" in out
