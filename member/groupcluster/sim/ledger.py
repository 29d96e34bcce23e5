"""The sweep ledger: which seed ranges ran on which simulated code, and how many seeds one code version passed.

A ledger row names the commit it ran on, but most commits leave the simulated code alone (docs, the operator,
benchmarks). The **simulated-code digest** hashes exactly the sources a simulation can import (the package's
``core``, ``protocols``, ``sim``, the grid without its client, driver and HTTP parts, and the few top-level
modules they use), so sweeps on different commits count together when they judged the same code, and a
correctness claim ("N fresh seeds, 0 failing, on this code") can be checked from the ledger alone.
``tests/sim/test_ledger.py`` runs a seed of every default profile and checks that every module it loaded is
inside the digest, so the digest cannot silently miss code the seeds ran.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import subprocess
from collections.abc import Iterable, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

PACKAGE = Path(__file__).resolve().parents[1]
# Relative to the package: what a simulation imports (checked by the test named above).
SIM_CODE_DIRS = ("core", "protocols", "sim", "grid")
SIM_CODE_EXCLUDED = ("grid/client", "grid/driver", "grid/http")
SIM_CODE_FILES = ("__init__.py", "compiled.py", "stacks.py")


def in_sim_code(rel: str) -> bool:
    """Whether the package file ``rel`` (posix, relative to the package) is part of the simulated code."""
    if not rel.endswith(".py"):
        return False
    if rel in SIM_CODE_FILES:
        return True
    top = rel.split("/", 1)[0]
    return top in SIM_CODE_DIRS and not any(rel == ex or rel.startswith(ex + "/") for ex in SIM_CODE_EXCLUDED)


def digest(files: Iterable[tuple[str, bytes]]) -> str:
    """A short hex digest of ``(relative path, content)`` pairs, independent of their order."""
    h = hashlib.sha256()
    for rel, data in sorted(files):
        h.update(rel.encode() + b"\0" + hashlib.sha256(data).digest())
    return h.hexdigest()[:16]


def sim_code_digest(package: Path = PACKAGE) -> str:
    """The digest of the simulated code as it is on disk (uncommitted changes included)."""
    files = []
    for path in package.rglob("*.py"):
        rel = path.relative_to(package).as_posix()
        if in_sim_code(rel):
            files.append((rel, path.read_bytes()))
    return digest(files)


def sim_code_digest_at(repo: Path, commit: str, package: str = "member/groupcluster") -> str | None:
    """The digest of the simulated code at ``commit`` of the git repository ``repo``; None when git cannot
    tell (no such commit, no git)."""
    try:
        listing = subprocess.run(
            ["git", "-C", str(repo), "ls-tree", "-r", "-z", commit, "--", package],
            capture_output=True,
            check=True,
            timeout=30,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    wanted: list[tuple[str, str]] = []
    for entry in listing.split(b"\0"):
        if not entry:
            continue
        meta, _, path = entry.partition(b"\t")
        rel = PurePosixPath(path.decode()).relative_to(package).as_posix()
        kind, obj = meta.split()[1:3]
        if kind == b"blob" and in_sim_code(rel):
            wanted.append((rel, obj.decode()))
    if not wanted:
        return None
    batch = "".join(obj + "\n" for _, obj in wanted).encode()
    try:
        out = subprocess.run(
            ["git", "-C", str(repo), "cat-file", "--batch"], input=batch, capture_output=True, check=True, timeout=60
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    files = []
    pos = 0
    for rel, _ in wanted:
        header_end = out.index(b"\n", pos)
        size = int(out[pos:header_end].split()[2])
        files.append((rel, out[header_end + 1 : header_end + 1 + size]))
        pos = header_end + 1 + size + 1
    return digest(files)


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The ledger's rows, in order."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def read_ranges(path: Path) -> list[tuple[int, int]]:
    """The seed ranges ``(first, end)`` a ledger records (any profile): a new start avoids all of them."""
    return [(int(r["start"]), int(r["start"]) + int(r["seeds"])) for r in read_rows(path)]


@dataclasses.dataclass
class Total:
    """Seeds one stack (or profile) ran on one code version, and the ones that failed."""

    seeds: int = 0
    failed: list[int] = dataclasses.field(default_factory=list)
    ranges: list[str] = dataclasses.field(default_factory=list)


def row_digest(row: dict[str, Any], repo: Path, cache: dict[str, str | None]) -> str | None:
    """A row's simulated-code digest: recorded, or computed from its clean commit (rows written before the
    digest was recorded); None when the row ran on uncommitted changes or names no commit."""
    recorded = row.get("sim_code")
    if recorded:
        return str(recorded)
    code = row.get("code")
    if not code or "+" in str(code):
        return None
    if code not in cache:
        cache[code] = sim_code_digest_at(repo, str(code))
    return cache[code]


def totals(rows: Sequence[dict[str, Any]], current: str, repo: Path) -> tuple[dict[str, Total], dict[str, Total]]:
    """Per stack and per profile, the seeds the ledger's rows ran on the simulated code ``current``."""
    cache: dict[str, str | None] = {}
    by_stack: dict[str, Total] = {}
    by_profile: dict[str, Total] = {}
    for row in rows:
        if row_digest(row, repo, cache) != current:
            continue
        # Rows written by hand for sweeps run with `groupcluster sim` carry the options profiles cannot name.
        profile = str(row["profile"]) + (f" {row['options']}" if row.get("options") else "")
        start, seeds = int(row["start"]), int(row["seeds"])
        stack = str(row["profile"]).split("+", 1)[0]
        for key, table in ((stack, by_stack), (profile, by_profile)):
            t = table.setdefault(key, Total())
            t.seeds += seeds
            t.failed += [int(s) for s in row.get("failed") or ()]
            t.ranges.append(f"{start}..{start + seeds - 1}")
    return by_stack, by_profile


def format_totals(current: str, by_stack: dict[str, Total], by_profile: dict[str, Total]) -> str:
    """The ``groupcluster sweep --totals`` report."""
    lines = [f"simulated code {current}: seeds the ledger records on exactly this code"]
    if not by_stack:
        lines.append("  none yet")
        return "\n".join(lines) + "\n"
    lines.append(f"  {'stack':<31} {'seeds':>7} {'failing':>8}")
    for name, t in sorted(by_stack.items()):
        lines.append(f"  {name:<31} {t.seeds:>7} {len(t.failed):>8}")
    lines.append(f"  {'profile':<31} {'seeds':>7} {'failing':>8}  ranges")
    for name, t in sorted(by_profile.items()):
        shown = ", ".join(t.ranges[:3]) + (f", ... ({len(t.ranges)} ranges)" if len(t.ranges) > 3 else "")
        lines.append(f"  {name:<31} {t.seeds:>7} {len(t.failed):>8}  {shown}")
    return "\n".join(lines) + "\n"
