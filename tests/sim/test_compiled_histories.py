"""The mypyc-compiled modules (scripts/build-compiled) behave exactly as their sources: the simulator records
byte-identical histories for the same seeds of every stack, compiled and with ``GROUPCLUSTER_PURE=1``.

The comparison never depends on someone having built the modules: without a build in the source tree the
fixture builds them in a copy of the package (scripts/build_compiled.py, about a minute) and runs that copy. Only
without a C compiler is there nothing to compare: the tests then say so as skipped, with the reason, and fail
instead when ``GROUPCLUSTER_REQUIRE_COMPILED=1``.
"""

from __future__ import annotations

import filecmp
import json
import os
import shutil
import subprocess
import sys
import sysconfig
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


REPO = Path(__file__).resolve().parents[2]


def _environ(pure: bool, member: Path | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != compiled.PURE_ENV}
    if pure:
        env[compiled.PURE_ENV] = "1"
    if member is not None:  # the copy's package, ahead of the editable install's
        env["PYTHONPATH"] = os.pathsep.join([str(member), *filter(None, [env.get("PYTHONPATH")])])
    return env


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[tuple[str, ...], Path | None]:
    """The compiled modules and the ``member`` directory that holds them (None: this checkout's own build)."""
    status = compiled.decide(_environ(pure=False, member=None))
    if status.compiled:
        return status.built, None
    compiler = sysconfig.get_config_var("CC") or "cc"
    if shutil.which(compiler.split()[0]) is None:
        reason = f"no C compiler ({compiler}) to build the compiled modules with: {status.describe()}"
        if os.environ.get("GROUPCLUSTER_REQUIRE_COMPILED", "") not in ("", "0"):
            pytest.fail(f"GROUPCLUSTER_REQUIRE_COMPILED is set but there is {reason}")
        pytest.skip(reason)
    root = tmp_path_factory.mktemp("compiled")
    shutil.copytree(REPO / "member", root / "member", ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    shutil.copytree(REPO / "operator", root / "operator", ignore=shutil.ignore_patterns("__pycache__"))
    (root / "scripts").mkdir()
    shutil.copy2(REPO / "scripts" / "build_compiled.py", root / "scripts")
    shutil.copy2(REPO / "pyproject.toml", root)
    (root / "member" / "groupcluster" / "_compiled.json").unlink(missing_ok=True)
    proc = subprocess.run(
        [sys.executable, str(root / "scripts" / "build_compiled.py")],
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert proc.returncode == 0, (
        f"the build of the compiled modules failed:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}"
    )
    manifest = json.loads((root / "member" / "groupcluster" / "_compiled.json").read_text())
    return tuple(manifest["modules"]), root / "member"


def _record(stack: str, out: Path, member: Path | None, *, pure: bool) -> tuple[int, list[str], str]:
    argv = ["sim", "--stack", stack, "--seeds", str(SEEDS), "--start", str(START), "--jobs", "1"]
    proc = subprocess.run(
        [sys.executable, "-c", _RUN_SIM, *argv, "--record", str(out)],
        env=_environ(pure, member),
        capture_output=True,
        text=True,
        timeout=900,
    )
    marker = [line for line in proc.stderr.splitlines() if line.startswith("RUNNING-COMPILED ")]
    assert marker, f"the simulator did not finish ({proc.returncode}):\n{proc.stderr[-3000:]}"
    summary = [line for line in proc.stdout.splitlines() if line.startswith(f"sim: {SEEDS} seeds,")]
    return proc.returncode, json.loads(marker[-1].split(" ", 1)[1]), "\n".join(summary)


@pytest.mark.parametrize("stack", STACKS)
def test_compiled_and_pure_histories_are_identical(
    stack: str, built: tuple[tuple[str, ...], Path | None], tmp_path: Path
) -> None:
    modules, member = built
    compiled_dir, pure_dir = tmp_path / "compiled", tmp_path / "pure"
    code_c, running_c, summary_c = _record(stack, compiled_dir, member, pure=False)
    code_p, running_p, summary_p = _record(stack, pure_dir, member, pure=True)
    # Each run really was what it claims: every built module ran compiled in the first, none in the second.
    assert sorted(running_c) == sorted(modules)
    assert running_p == []
    names = sorted(p.name for p in compiled_dir.iterdir())
    assert names == [f"seed-{seed}.jsonl" for seed in range(START, START + SEEDS)]
    assert sorted(p.name for p in pure_dir.iterdir()) == names
    _match, mismatch, errors = filecmp.cmpfiles(compiled_dir, pure_dir, names, shallow=False)
    assert (mismatch, errors) == ([], []), f"{stack}: histories differ between compiled and pure: {mismatch}"
    assert (code_c, summary_c) == (code_p, summary_p)
    assert summary_c, "the simulator printed no summary line"
