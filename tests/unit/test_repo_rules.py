"""Rules of the repository's layout that no linter checks: no module imports a test module.

A test module (``test_*.py``) holds tests; what several of them share (fakes, fixtures' helpers, generators)
lives in a harness module beside them (tests/unit/harness.py, gridnet.py, fuzzwire.py,
tests/integration/procs.py, tests/e2e/groupclusters.py, ...). A test module imported from elsewhere ties every
importer to the test's own imports and module-level set-up, and a test function imported by name is collected
twice.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# Every Python file that could import a test module: the tests themselves and the scripts and benchmarks.
SCANNED = ("tests", "scripts", "bench", "member", "operator")


def _module_parts(path: Path) -> list[str]:
    """``tests/unit/test_x.py`` -> ["tests", "unit", "test_x"] (relative to the repository)."""
    return list(path.relative_to(REPO).with_suffix("").parts)


def imports_of_test_modules(path: Path, source: str) -> list[str]:
    """The imports in ``source`` (the text of ``path``) that name a test module of this repository."""
    found: list[str] = []
    package = _module_parts(path)[:-1]
    for node in ast.walk(ast.parse(source, filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "tests" and any(p.startswith("test_") for p in parts):
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
            if any(p.startswith("test_") for p in target):
                found.append(f"{path.relative_to(REPO)}:{node.lineno}: from {'.' * node.level}{node.module or ''}")
            for name in names:
                if name.startswith("test_") and REPO.joinpath(*target, f"{name}.py").is_file():
                    found.append(f"{path.relative_to(REPO)}:{node.lineno}: imports test module {name}")
    return found


def _python_files() -> list[Path]:
    files: list[Path] = []
    for top in SCANNED:
        files.extend(p for p in (REPO / top).rglob("*.py") if ".venv" not in p.parts)
    return sorted(files)


def test_no_module_imports_a_test_module() -> None:
    offenders = [hit for path in _python_files() for hit in imports_of_test_modules(path, path.read_text())]
    assert not offenders, "move what they share into a harness module (not test_*.py):\n" + "\n".join(offenders)


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
    ]
    for source in bad:
        assert imports_of_test_modules(here, source), source
    good = [
        "from .gridnet import FakeNet",
        "from .harness import LayerHarness",
        "from tests.integration.procs import Members",
        "from . import seedruns",
        "from groupcluster.grid.node import GridNode",
        "import pytest",
    ]
    for source in good:
        assert not imports_of_test_modules(here, source), source
