"""Rules of the test layout that no linter checks: no module imports a test module or a conftest.py, and every
test carries the marker of its directory (integration, e2e, spark).

A test module (``test_*.py``) holds tests; what several of them share (fakes, fixtures' helpers, generators)
lives in a harness module beside them (tests/unit/harness.py, gridnet.py, fuzzwire.py,
tests/integration/procs.py, tests/e2e/kubeharness.py, ...). A test module imported from elsewhere ties every
importer to the test's own imports and module-level set-up, and a test function imported by name is collected
twice. A conftest.py is pytest's to load (as a plugin, once per directory): its fixtures reach tests by name.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# Every Python file that could import a test module: the tests themselves and the scripts and benchmarks.
SCANNED = ("tests", "scripts", "bench", "member", "operator")


def _module_parts(path: Path) -> list[str]:
    """``tests/unit/test_x.py`` -> ["tests", "unit", "test_x"] (relative to the repository)."""
    return list(path.relative_to(REPO).with_suffix("").parts)


def _is_test_module(parts: list[str]) -> bool:
    return any(p.startswith("test_") or p == "conftest" for p in parts)


def imports_of_test_modules(path: Path, source: str) -> list[str]:
    """The imports in ``source`` (the text of ``path``) that name a test module or a conftest of this repository."""
    found: list[str] = []
    package = _module_parts(path)[:-1]
    for node in ast.walk(ast.parse(source, filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "tests" and _is_test_module(parts):
                    found.append(f"{path.relative_to(REPO)}:{node.lineno}: import {alias.name}")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)] if node.level > 1 else list(package)
            else:
                base = []
            target = base + (node.module.split(".") if node.module else [])
            if not target or target[0] != "tests":
                continue
            names = [a.name for a in node.names]
            if _is_test_module(target):
                found.append(f"{path.relative_to(REPO)}:{node.lineno}: from {'.' * node.level}{node.module or ''}")
            for name in names:
                if _is_test_module([name]) and REPO.joinpath(*target, f"{name}.py").is_file():
                    found.append(f"{path.relative_to(REPO)}:{node.lineno}: imports test module {name}")
    return found


def _python_files() -> list[Path]:
    files: list[Path] = []
    for top in SCANNED:
        files.extend(p for p in (REPO / top).rglob("*.py") if ".venv" not in p.parts)
    return sorted(files)


def test_no_module_imports_a_test_module() -> None:
    offenders = [hit for path in _python_files() for hit in imports_of_test_modules(path, path.read_text())]
    hint = "move what they share into a harness module (not test_*.py, not conftest.py):\n"
    assert not offenders, hint + "\n".join(offenders)


def test_the_rule_sees_every_way_of_importing_a_test_module() -> None:
    here = REPO / "tests" / "unit" / "test_example.py"
    bad = [
        "from .test_grid_node import FakeNet",
        "from . import test_fuzz_wire",
        "from tests.unit import test_fuzz_wire as fz",
        "from tests.unit.test_grid_node import CONFIG",
        "import tests.unit.test_grid_node",
        "from ..unit.test_grid_node import member",
        "def f():\n    from .test_grid_node_tx import TxNet\n",
        "from .conftest import Kube",
        "from tests.e2e.conftest import wait_for",
    ]
    for source in bad:
        assert imports_of_test_modules(here, source), source
    good = [
        "from .gridnet import FakeNet",
        "from .harness import LayerHarness",
        "from tests.integration.procs import Members",
        "from .kubeharness import Kube, wait_for",
        "from . import seedruns",
        "from groupcluster.grid.node import GridNode",
        "import pytest",
    ]
    for source in good:
        assert not imports_of_test_modules(here, source), source


def _collected(*args: str) -> list[str]:
    res = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode in (0, 5), f"collection failed ({res.returncode}):\n{res.stdout}\n{res.stderr}"
    return [line.split("::")[0] for line in res.stdout.splitlines() if "::" in line]


def test_every_test_carries_the_marker_of_its_directory() -> None:
    """tests/conftest.py marks by directory, so ``-m`` picks a kind of test without the files saying so."""
    files = [
        "tests/unit/test_config.py",
        "tests/sim/test_sim_world.py",
        "tests/integration/test_real_bad_input.py",
        "tests/e2e/test_localkube_rules.py",
        "tests/spark/test_spark_plan.py",
    ]
    for marker in ("integration", "e2e", "spark"):
        got = set(_collected("-m", marker, *files))
        assert got == {f for f in files if f.startswith(f"tests/{marker}/")}, (marker, got)
    pure = set(_collected("-m", "not integration and not e2e and not spark", *files))
    assert pure == {"tests/unit/test_config.py", "tests/sim/test_sim_world.py"}
