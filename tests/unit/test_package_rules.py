"""The import rules of docs/architecture.md's map, checked on the source (no import is executed).

The sans-IO parts (the group's core and protocol layers, the stacks, the grid node, the transaction core and
the grid's top-level core modules) must never reach for sockets, threads, an event loop, the clock or a
driver: the simulator replays them, and a seed replays only if they see nothing but their inputs. A client
never imports a member, and the operator takes only three small pieces of the member package.
"""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "member" / "groupcluster"
OPERATOR = Path(__file__).resolve().parents[2] / "operator" / "groupcluster_operator"

# Standard library and third-party modules a sans-IO module may not import.
IO_MODULES = {"asyncio", "socket", "threading", "selectors", "subprocess", "time", "aiohttp", "sqlite3", "urllib"}
IO_MODULES |= {"http", "concurrent", "multiprocessing", "signal", "os", "pathlib", "shutil", "tempfile"}
# Parts of groupcluster a sans-IO module may not import: the drivers, the tools and the clients.
DRIVER_PACKAGES = ("runtime", "tools", "sim", "bench", "spark", "grid.http", "grid.client", "grid.driver")
GRID_CORE = ("consistent_hash", "topology", "messages", "columns", "payload", "store", "lifespan", "invalidation")
GRID_CORE += ("errors", "feed", "rebalance")
# Files read when a stack is built, never while it runs: auth's secret files, the stack files of stacks.py.
CONFIG_TIME_IO = {PKG / "protocols" / "auth.py": {"os", "pathlib"}, PKG / "stacks.py": {"pathlib"}}


def sans_io_modules() -> list[Path]:
    files = [*(PKG / "core").glob("*.py"), *(PKG / "protocols").rglob("*.py"), PKG / "stacks.py"]
    files += [*(PKG / "grid" / "node").glob("*.py")]
    files += [p for p in (PKG / "grid" / "tx").glob("*.py") if p.name != "cli.py"]  # cli is a command
    files += [PKG / "grid" / f"{name}.py" for name in GRID_CORE]
    return sorted(files)


def imported(path: Path, source: str | None = None) -> set[str]:
    """Absolute dotted names of everything ``path`` (or ``source`` as if it were ``path``) imports, relative
    imports resolved, imports inside functions included."""
    root = PKG.parent if path.is_relative_to(PKG.parent) else OPERATOR.parent
    package = list(path.relative_to(root).with_suffix("").parts[:-1])
    names: set[str] = set()
    text = path.read_text() if source is None else source
    for node in ast.walk(ast.parse(text, filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - (node.level - 1)] if node.level else []
            target = ".".join([*base, *(node.module.split(".") if node.module else [])])
            names.add(target)
            # ``from . import x`` / ``from .grid import checkers``: the names may be modules themselves.
            names.update(f"{target}.{alias.name}" for alias in node.names)
    return names


def _within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def violations_of_sans_io(path: Path, source: str | None = None) -> list[str]:
    allowed_io = CONFIG_TIME_IO.get(path, set())
    bad = []
    for name in sorted(imported(path, source)):
        top = name.split(".")[0]
        io = top in IO_MODULES and top not in allowed_io
        if io or any(_within(name, f"groupcluster.{p}") for p in DRIVER_PACKAGES):
            bad.append(name)
    return bad


def test_the_sans_io_parts_import_no_io_and_no_driver() -> None:
    checked = sans_io_modules()
    assert len(checked) > 50 and all(p.is_file() for p in checked)
    found = {str(p.relative_to(PKG)): bad for p in checked if (bad := violations_of_sans_io(p))}
    assert found == {}


def test_the_rule_catches_a_layer_that_reaches_for_the_clock_or_a_driver() -> None:
    # Judged as if it were a protocol layer, so its relative imports resolve as a layer's would.
    probe = PKG / "protocols" / "probe.py"
    source = "import time\nfrom ..runtime.channel import Channel\nfrom ..core.view import View\n"
    found = violations_of_sans_io(probe, source)
    assert found == ["groupcluster.runtime.channel", "groupcluster.runtime.channel.Channel", "time"]
    assert violations_of_sans_io(probe, "from ..core.view import View\nimport heapq\n") == []


def test_core_imports_nothing_else_of_groupcluster() -> None:
    for path in (PKG / "core").glob("*.py"):
        others = [n for n in imported(path) if _within(n, "groupcluster") and not _within(n, "groupcluster.core")]
        assert others == [], path.name


def test_the_clients_import_no_member_code() -> None:
    allowed = ("groupcluster.grid.client", "groupcluster.grid.errors", "groupcluster.grid.consistent_hash")
    allowed += ("groupcluster.grid.lifespan",)
    for path in (PKG / "grid" / "client").rglob("*.py"):
        member = [n for n in imported(path) if _within(n, "groupcluster") and not any(_within(n, a) for a in allowed)]
        assert member == [], path.relative_to(PKG)


def test_the_operator_takes_only_three_pieces_of_the_member_package() -> None:
    allowed = ("groupcluster.core.errors", "groupcluster.protocols.auth", "groupcluster.runtime.kube_client")
    for path in OPERATOR.glob("*.py"):
        names = {n for n in imported(path) if _within(n, "groupcluster")}
        assert all(any(_within(n, a) for a in allowed) for n in names), (path.name, names)


# A module past this many lines holds more than one responsibility, unless its docstring says why it must not be
# split (a sentence starting "Longer than 800 lines:").
MAX_MODULE_LINES = 800


def oversized_modules(roots: list[Path]) -> list[str]:
    """The modules under ``roots`` longer than MAX_MODULE_LINES whose docstring gives no reason."""
    found = []
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            source = path.read_text()
            lines = source.count("\n") + 1
            if lines <= MAX_MODULE_LINES:
                continue
            doc = ast.get_docstring(ast.parse(source, filename=str(path))) or ""
            if "Longer than 800 lines:" not in doc:
                found.append(f"{path.relative_to(root.parent)}: {lines} lines")
    return found


def test_no_module_outgrows_one_responsibility() -> None:
    long = oversized_modules([PKG, OPERATOR])
    assert not long, "split these along their responsibilities (docs/architecture.md), or say why not:\n" + "\n".join(
        long
    )


def test_the_size_rule_sees_a_long_module_and_accepts_a_stated_reason(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "short.py").write_text('"""Short."""\nA = 1\n')
    (pkg / "long.py").write_text('"""Long."""\n' + "A = 1\n" * MAX_MODULE_LINES)
    (pkg / "reasoned.py").write_text(
        '"""Reasoned.\n\nLonger than 800 lines: one table.\n"""\n' + "A = 1\n" * MAX_MODULE_LINES
    )
    assert oversized_modules([pkg]) == [f"pkg/long.py: {MAX_MODULE_LINES + 2} lines"]
