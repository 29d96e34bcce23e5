"""``groupcluster sim`` and ``groupcluster check`` on toy stacks (in-process, so the toy layers are registered)."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from groupcluster.sim import check_cli
from groupcluster.sim import cli as sim_cli

from .simtoy import TOY_STACK

SUMMARY = re.compile(r"^sim: (\d+) seeds, (\d+) events, (\d+) violations$")


def sim(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[str]]:
    parser = argparse.ArgumentParser()
    sim_cli.add_arguments(parser)
    code = sim_cli.run(parser.parse_args(list(argv)))
    out = capsys.readouterr().out
    return code, out.splitlines()


def check(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[str], str]:
    parser = argparse.ArgumentParser()
    check_cli.add_arguments(parser)
    code = check_cli.run(parser.parse_args(list(argv)))
    captured = capsys.readouterr()
    return code, captured.out.splitlines(), captured.err


@pytest.fixture
def toy_file(tmp_path: Path) -> str:
    path = tmp_path / "toy.yaml"
    path.write_text(yaml.safe_dump(TOY_STACK))
    return str(path)


@pytest.fixture
def broken_file(tmp_path: Path) -> str:
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump([*TOY_STACK, {"layer": "toy_duplicator"}]))
    return str(path)


def test_clean_seeds_exit_zero_with_the_summary_last(capsys: pytest.CaptureFixture[str], toy_file: str) -> None:
    code, lines = sim(capsys, "--seeds", "3", "--stack", toy_file, "--no-faults", "--jobs", "1", "--safety-time", "2")
    assert code == 0
    m = SUMMARY.match(lines[-1])
    assert m and m.group(1) == "3" and int(m.group(2)) > 100 and m.group(3) == "0"
    assert len(lines) == 1  # nothing else without --verbose


def test_violations_print_seed_property_and_replay(capsys: pytest.CaptureFixture[str], broken_file: str) -> None:
    args = ("--seeds", "2", "--start", "5", "--stack", broken_file, "--no-faults", "--safety-time", "2")
    code, lines = sim(capsys, *args, "--jobs", "1")
    assert code == 1
    m = SUMMARY.match(lines[-1])
    assert m and m.group(1) == "2" and int(m.group(3)) > 0
    assert any(line.startswith("seed 5: ") for line in lines)
    assert any("seed 6: no-duplicates:" in line for line in lines)
    replay = [line.split("replay: ", 1)[1] for line in lines if "replay: " in line]
    assert replay[0] == (f"groupcluster sim --seeds 1 --start 5 --stack {broken_file} --safety-time 2 --no-faults")


def test_results_do_not_depend_on_jobs(capsys: pytest.CaptureFixture[str], broken_file: str) -> None:
    args = ("--seeds", "4", "--stack", broken_file, "--safety-time", "2", "--members", "3")
    _, one = sim(capsys, *args, "--jobs", "1")
    _, two = sim(capsys, *args, "--jobs", "2")
    assert one == two and SUMMARY.match(one[-1])


def test_json_lines_per_seed(capsys: pytest.CaptureFixture[str], toy_file: str) -> None:
    code, lines = sim(capsys, "--seeds", "2", "--stack", toy_file, "--no-faults", "--json", "--jobs", "1")
    assert code == 0 and SUMMARY.match(lines[-1])
    docs = [json.loads(line) for line in lines[:-1]]
    assert [d["seed"] for d in docs] == [0, 1] and all(d["ok"] and d["violations"] == [] for d in docs)


def test_verbose_prints_every_seed(capsys: pytest.CaptureFixture[str], toy_file: str) -> None:
    _, lines = sim(capsys, "--seeds", "2", "--stack", toy_file, "--no-faults", "--verbose", "--jobs", "1")
    assert [line.split(":")[0] for line in lines[:-1]] == ["seed 0", "seed 1"]


def test_check_determinism_option(capsys: pytest.CaptureFixture[str], toy_file: str, tmp_path: Path) -> None:
    code, lines = sim(capsys, "--seeds", "2", "--stack", toy_file, "--no-faults", "--check-determinism", "--jobs", "1")
    assert code == 0 and SUMMARY.match(lines[-1])
    # A layer that draws from the global random generator makes two runs of a seed differ: caught.
    unseeded = tmp_path / "unseeded.yaml"
    unseeded.write_text(yaml.safe_dump([*TOY_STACK, {"layer": "toy_unseeded"}]))
    args = ("--seeds", "1", "--stack", str(unseeded), "--no-faults", "--check-determinism", "--jobs", "1")
    code, lines = sim(capsys, *args)
    assert code == 1 and any("seed 0: determinism: -: two runs of the seed differ" in line for line in lines)


def test_recorded_histories_are_judged_by_check(
    capsys: pytest.CaptureFixture[str], broken_file: str, toy_file: str, tmp_path: Path
) -> None:
    bad_dir, good_dir = tmp_path / "bad", tmp_path / "good"
    sim(capsys, "--seeds", "1", "--stack", broken_file, "--no-faults", "--record", str(bad_dir), "--jobs", "1")
    sim(capsys, "--seeds", "1", "--stack", toy_file, "--no-faults", "--record", str(good_dir), "--jobs", "1")
    code, lines, _ = check(capsys, str(bad_dir / "seed-0.jsonl"))
    assert code == 1
    m = re.match(r"^check: (\d+) events, (\d+) violations$", lines[-1])
    assert m and int(m.group(1)) > 0 and int(m.group(2)) == len(lines) - 1
    assert any(line.startswith("no-duplicates: ") for line in lines)
    # The same history split into one file per member, as real processes write it, gives the same verdict.
    events = (bad_dir / "seed-0.jsonl").read_text().splitlines()
    per_member: dict[str, list[str]] = {}
    for line in events:
        per_member.setdefault(json.loads(line)["member"], []).append(line)
    files = []
    for i, member_lines in enumerate(per_member.values()):
        f = tmp_path / f"member-{i}.jsonl"
        f.write_text("\n".join(member_lines) + "\n")
        files.append(str(f))
    code2, lines2, _ = check(capsys, *files)
    assert code2 == 1 and lines2[-1] == lines[-1]
    code3, lines3, _ = check(capsys, str(good_dir / "seed-0.jsonl"), "--converged")
    assert code3 == 0 and lines3[-1].endswith(" 0 violations")


def test_check_skip_leaves_out_a_checker(capsys: pytest.CaptureFixture[str], broken_file: str, tmp_path: Path) -> None:
    sim(capsys, "--seeds", "1", "--stack", broken_file, "--no-faults", "--record", str(tmp_path), "--jobs", "1")
    code, lines, _ = check(capsys, str(tmp_path / "seed-0.jsonl"), "--skip", "no-duplicates", "--skip", "fifo")
    assert code == 0 and lines[-1].endswith(" 0 violations")


def test_check_reports_a_bad_file_clearly(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"t": 0, "member": "a", "kind": "start"}\nnot json\n')
    code, _, err = check(capsys, str(bad))
    assert code == 2 and f"{bad}:2: not a history event" in err
    code, _, err = check(capsys, str(tmp_path / "missing.jsonl"))
    assert code == 2 and "missing.jsonl" in err


def test_bad_arguments_fail_with_a_clear_message(capsys: pytest.CaptureFixture[str], toy_file: str) -> None:
    parser = argparse.ArgumentParser()
    sim_cli.add_arguments(parser)
    assert sim_cli.run(parser.parse_args(["--stack", "nope", "--seeds", "1"])) == 2
    assert "neither a preset nor a YAML file" in capsys.readouterr().err
    assert sim_cli.run(parser.parse_args(["--stack", toy_file, "--set", "toy_members.hello_interval"])) == 2
    assert "LAYER.KEY=VALUE" in capsys.readouterr().err
    assert sim_cli.run(parser.parse_args(["--stack", toy_file, "--set", "toy_members.bogus=1"])) == 2
    assert "unknown key 'bogus'" in capsys.readouterr().err
    assert sim_cli.run(parser.parse_args(["--seeds", "0"])) == 2


def test_set_overrides_reach_the_layers(capsys: pytest.CaptureFixture[str], toy_file: str) -> None:
    # A hello interval longer than the run means members never see each other: convergence fails.
    code, lines = sim(
        capsys, "--seeds", "1", "--stack", toy_file, "--no-faults", "--set", "toy_members.hello_interval=10m"
    )
    assert code == 1 and any("merge-convergence" in line for line in lines)
    assert sim_cli.parse_overrides(["fd.timeout=2s", "fd.max_tries=3"]) == {"fd": {"timeout": "2s", "max_tries": 3}}


def test_the_groupcluster_sim_command_on_the_fifo_stack() -> None:
    # The real entry point, in its own process, on the real stack.
    proc = subprocess.run(
        [sys.executable, "-m", "groupcluster.cli", "sim", "--seeds", "3", "--jobs", "2", "--verbose"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = proc.stdout.splitlines()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    m = SUMMARY.match(lines[-1])
    assert m and m.group(1) == "3" and int(m.group(2)) > 1000 and m.group(3) == "0"
    assert [line.split(":")[0] for line in lines[:-1]] == ["seed 0", "seed 1", "seed 2"]
    assert "sim: 3/3 seeds" in proc.stderr


def test_check_stack_adds_the_properties_of_that_stack(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """``--stack vsync`` judges virtual synchrony: here b moved to view 2 with a without a's message."""
    v1, v2 = [1, "10.0.0.1:7800#1"], [2, "10.0.0.1:7800#1"]
    a, b = "10.0.0.1:7800#1", "10.0.0.2:7800#2"
    events = [
        {"t": 1.0, "member": a, "kind": "view", "view_id": v1, "members": [a, b], "merge": False},
        {"t": 1.0, "member": b, "kind": "view", "view_id": v1, "members": [a, b], "merge": False},
        {"t": 2.0, "member": a, "kind": "send", "msg": "m1", "dest": None, "view": v1},
        {"t": 2.0, "member": a, "kind": "deliver", "sender": a, "msg": "m1", "dest": None},
        {"t": 3.0, "member": a, "kind": "view", "view_id": v2, "members": [a, b], "merge": False},
        {"t": 3.0, "member": b, "kind": "view", "view_id": v2, "members": [a, b], "merge": False},
        {"t": 3.5, "member": b, "kind": "deliver", "sender": a, "msg": "m1", "dest": None},
    ]
    path = tmp_path / "h.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    code, lines, _ = check(capsys, str(path))
    assert code == 0 and lines[-1].endswith(" 0 violations")
    code, lines, _ = check(capsys, str(path), "--stack", "vsync")
    assert code == 1 and lines[-1].endswith(" 1 violations")
    assert lines[0].startswith("virtual-synchrony")
