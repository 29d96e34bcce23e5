"""``groupcluster sweep``: profiles, fresh starts outside the ledger, contiguous ranges, replay commands that
reproduce a failure (on toy stacks, in-process, so the toy layers are registered)."""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml
from groupcluster.sim import cli as sim_cli
from groupcluster.sim import ledger as sim_ledger
from groupcluster.sim import sweep as sweep_cli
from groupcluster.sim.grid.run import GRID_DEFAULT_SAFETY

from .simtoy import TOY_STACK


def test_profiles_set_scenario_fields_and_replay_with_the_same_options() -> None:
    p = sweep_cli.parse_profile("grid+lifespans=0.3+max-entries=10")
    assert p.scenario.stack == "grid" and p.scenario.safety_time == GRID_DEFAULT_SAFETY
    assert p.scenario.lifespans == 0.3 and p.scenario.max_entries == 10
    assert p.replay(7) == "groupcluster sim --seeds 1 --start 7 --stack grid --lifespans 0.3 --max-entries 10"
    assert sweep_cli.parse_profile("vsync").replay(3) == "groupcluster sim --seeds 1 --start 3 --stack vsync"
    for bad in ("", "grid+nosuch=1", "grid+lifespans", "grid+lifespans=lots"):
        with pytest.raises(ValueError, match="profile"):
            sweep_cli.parse_profile(bad)
    for name in sweep_cli.DEFAULT_PROFILES:
        sweep_cli.parse_profile(name)


def test_a_fresh_start_misses_every_range_of_the_ledger(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.jsonl"
    rows = [{"profile": "fifo", "start": sweep_cli.START_LOW + 2_000_000, "seeds": 1_500_000, "failed": []}]
    ledger.write_text("".join(json.dumps(r) + "\n" for r in rows))
    used = sim_ledger.read_ranges(ledger)
    assert used == [(sweep_cli.START_LOW + 2_000_000, sweep_cli.START_LOW + 3_500_000)]
    # The draw offers the used slots first (2 and 3 overlap the range, 1 would run into it), then slot 4.
    offers = iter([2, 3, 1, 4])
    start = sweep_cli.fresh_start(used, 1_500_000, lambda _n: next(offers))
    assert start == sweep_cli.START_LOW + 4_000_000


def _toy_profile(tmp_path: Path, extra: list[dict[str, str]]) -> str:
    path = tmp_path / "toy.yaml"
    path.write_text(yaml.safe_dump([*TOY_STACK, *extra]))
    return f"{path}+safety_time=2"


def test_a_time_bound_stops_every_profile_after_a_contiguous_range(tmp_path: Path) -> None:
    profiles = [
        sweep_cli.parse_profile(_toy_profile(tmp_path, [])),
        sweep_cli.parse_profile(_toy_profile(tmp_path, [])),
    ]
    ticks = iter(range(100))
    runs = sweep_cli.sweep(profiles, 50, jobs=1, seeds=None, deadline=5, clock=lambda: next(ticks))
    # Five tasks were started before the clock reached the deadline: round-robin, three and two.
    assert [(r.start, r.seeds) for r in runs] == [(50, 3), (50, 2)]


def test_failures_print_a_replay_that_reproduces_them_and_land_in_the_ledger(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = _toy_profile(tmp_path, [{"layer": "toy_duplicator"}])
    ledger = tmp_path / "ledger.jsonl"
    parser = argparse.ArgumentParser()
    sweep_cli.add_arguments(parser)
    args = ["--seeds", "2", "--profile", broken, "--jobs", "1", "--ledger", str(ledger)]
    code = sweep_cli.run(parser.parse_args(args))
    out = capsys.readouterr().out.splitlines()
    assert code == 1
    start = int(out[0].split()[3])
    assert sweep_cli.START_LOW <= start < sweep_cli.START_HIGH and out[-1].endswith("2 failing")
    replays = [line.split("replay: ", 1)[1] for line in out if "replay: " in line]
    assert len(replays) == 2
    row = json.loads(ledger.read_text())
    assert row["start"] == start and row["seeds"] == 2 and row["failed"] == [start, start + 1]
    # The row names the code the seeds judged: this checkout's commit (``+dirty`` with uncommitted changes).
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    assert row["code"] is not None and row["code"].removesuffix("+dirty") == head
    # The printed command replays the failure through `groupcluster sim`.
    sim_parser = argparse.ArgumentParser()
    sim_cli.add_arguments(sim_parser)
    argv = shlex.split(replays[1])[2:]
    assert sim_cli.run(sim_parser.parse_args([*argv, "--jobs", "1"])) == 1
    assert "no-duplicates" in capsys.readouterr().out


def test_bad_options_are_refused_with_a_clear_message(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    sweep_cli.add_arguments(parser)
    assert sweep_cli.run(parser.parse_args(["--profile", "grid+colour=1", "--seeds", "1", "--ledger", "-"])) == 2
    assert "colour" in capsys.readouterr().err
    assert sweep_cli.run(parser.parse_args(["--seeds", "1", "--minutes", "1", "--ledger", "-"])) == 2
    assert "not both" in capsys.readouterr().err
