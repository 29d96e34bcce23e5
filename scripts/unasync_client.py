"""Generate the blocking grid client from its asyncio source with unasync (PyPI ``unasync``, in the test extra).

    .venv/bin/python scripts/unasync_client.py          write member/groupcluster/grid/client/_sync/ from _async/
    .venv/bin/python scripts/unasync_client.py --check  fail, showing the difference, if the committed ones are stale

``async``/``await`` are dropped and the asyncio names replaced by the blocking ones (:data:`REPLACEMENTS`, on
top of unasync's own: ``__aenter__``, ``AsyncIterator``, ... and any ``AsyncX`` class to ``SyncX``); the
transport, the one part that differs beyond that, is hand-written twice (``_io_async.py``, ``_io_sync.py``).
The output is then import-sorted and formatted with ruff, so it passes the project's checks as committed.
scripts/test runs ``--check``.
"""

from __future__ import annotations

import argparse
import difflib
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import unasync

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "member" / "groupcluster" / "grid" / "client"
REPLACEMENTS = {
    "AsyncGridClient": "GridClient",
    "AsyncCacheClient": "CacheClient",
    "AsyncTransaction": "Transaction",
    "_io_async": "_io_sync",  # AsyncTransport -> SyncTransport by unasync's own rule
}
HEADER = (
    "# Generated from ../_async/{name} by scripts/unasync_client.py: do not edit. Change the asyncio source, then run\n"
    "# .venv/bin/python scripts/unasync_client.py (scripts/test checks that this file is current).\n"
)


def _ruff(args: list[str], name: str, text: str) -> str:
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff") or "ruff"
    stdin_name = str(PACKAGE / "_sync" / name)
    done = subprocess.run(
        [ruff, *args, "--stdin-filename", stdin_name, "-"], input=text, capture_output=True, text=True, cwd=ROOT
    )
    if done.returncode != 0:
        raise SystemExit(f"unasync: ruff {args[0]} failed on {name}:\n{done.stderr}")
    return done.stdout


def generate() -> dict[str, str]:
    """The generated files: name -> text."""
    out: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "_async"
        shutil.copytree(PACKAGE / "_async", src, ignore=shutil.ignore_patterns("__pycache__"))
        rule = unasync.Rule(fromdir="/_async/", todir="/_sync/", additional_replacements=REPLACEMENTS)
        unasync.unasync_files([str(p) for p in sorted(src.glob("*.py"))], [rule])
        for path in sorted((Path(tmp) / "_sync").glob("*.py")):
            text = HEADER.format(name=path.name) + path.read_text()
            text = _ruff(["check", "--fix-only", "--quiet"], path.name, text)
            out[path.name] = _ruff(["format", "--quiet"], path.name, text)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="only check that the committed files are current")
    args = parser.parse_args()
    target = PACKAGE / "_sync"
    wanted = generate()
    present = {p.name for p in target.glob("*.py")} if target.is_dir() else set()
    if args.check:
        stale = []
        for name in sorted(present | set(wanted)):
            have = (target / name).read_text() if name in present else ""
            want = wanted.get(name, "")
            if have != want:
                stale.append(name)
                sys.stdout.writelines(
                    difflib.unified_diff(
                        have.splitlines(True), want.splitlines(True), f"committed/{name}", f"generated/{name}"
                    )
                )
        if stale:
            print(
                f"unasync: {', '.join(stale)} in {target.relative_to(ROOT)} out of date: run scripts/unasync_client.py"
            )
            return 1
        return 0
    target.mkdir(exist_ok=True)
    for name in present - set(wanted):
        (target / name).unlink()
    for name, text in wanted.items():
        (target / name).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
