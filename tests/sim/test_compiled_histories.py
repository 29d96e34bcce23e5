"""The mypyc-compiled modules (scripts/build-compiled) behave exactly as their sources: the simulator records
byte-identical histories for the same seeds of every stack, compiled and with ``GROUPCLUSTER_PURE=1``.

Without a build there is nothing to compare: the tests say so as skipped, with the reason, and fail instead
when ``GROUPCLUSTER_REQUIRE_COMPILED=1`` (a run that means to test the compiled modules must not pass without
them).
"""

from __future__ import annotations

import filecmp
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from groupcluster import compiled

STACKS = ["fifo", "vsync", "total-order", "grid", "grid-tx"]
START = 7000
SEEDS = 20

# Runs the simulator in the child, then reports which groupcluster modules that same process ran compiled.
_RUN_SIM = """
import json, sys
from groupcluster import cli, compiled
code = cli.main(sys.argv[1:])
print("RUNNING-COMPILED " + json.dumps(compiled.running_compiled()), file=sys.stderr)
sys.exit(code)
"""


def _environ(pure: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != compiled.PURE_ENV}
    if pure:
        env[compiled.PURE_ENV] = "1"
    return env


@pytest.fixture(scope="module")
def built() -> tuple[str, ...]:
    status = compiled.decide(_environ(pure=False))
    if not status.compiled:
        reason = f"no compiled modules to compare with their sources: {status.describe()}"
        if os.environ.get("GROUPCLUSTER_REQUIRE_COMPILED", "") not in ("", "0"):
            pytest.fail(f"GROUPCLUSTER_REQUIRE_COMPILED is set but there are {reason}")
        pytest.skip(reason)
    return status.built


def _record(stack: str, out: Path, *, pure: bool) -> tuple[int, list[str], str]:
    argv = ["sim", "--stack", stack, "--seeds", str(SEEDS), "--start", str(START), "--jobs", "1"]
    proc = subprocess.run(
        [sys.executable, "-c", _RUN_SIM, *argv, "--record", str(out)],
        env=_environ(pure),
        capture_output=True,
        text=True,
        timeout=900,
    )
    marker = [line for line in proc.stderr.splitlines() if line.startswith("RUNNING-COMPILED ")]
    assert marker, f"the simulator did not finish ({proc.returncode}):\n{proc.stderr[-3000:]}"
    summary = [line for line in proc.stdout.splitlines() if line.startswith(f"sim: {SEEDS} seeds,")]
    return proc.returncode, json.loads(marker[-1].split(" ", 1)[1]), "\n".join(summary)


@pytest.mark.parametrize("stack", STACKS)
def test_compiled_and_pure_histories_are_identical(stack: str, built: tuple[str, ...], tmp_path: Path) -> None:
    compiled_dir, pure_dir = tmp_path / "compiled", tmp_path / "pure"
    code_c, running_c, summary_c = _record(stack, compiled_dir, pure=False)
    code_p, running_p, summary_p = _record(stack, pure_dir, pure=True)
    # Each run really was what it claims: every built module ran compiled in the first, none in the second.
    assert sorted(running_c) == sorted(built)
    assert running_p == []
    names = sorted(p.name for p in compiled_dir.iterdir())
    assert names == [f"seed-{seed}.jsonl" for seed in range(START, START + SEEDS)]
    assert sorted(p.name for p in pure_dir.iterdir()) == names
    _match, mismatch, errors = filecmp.cmpfiles(compiled_dir, pure_dir, names, shallow=False)
    assert (mismatch, errors) == ([], []), f"{stack}: histories differ between compiled and pure: {mismatch}"
    assert (code_c, summary_c) == (code_p, summary_p)
    assert summary_c, "the simulator printed no summary line"
