"""The sweep ledger: which seed ranges ran on which simulated code, and how many seeds one code version passed.

A ledger row names the commit it ran on, but most commits leave the simulated code alone (docs, the operator,
benchmarks). The **simulated-code digest** hashes exactly the sources a simulation can import (the package's
``core``, ``protocols``, ``sim``, the grid without its client, driver and HTTP parts, and the few top-level
modules they use), so sweeps on different commits count together when they judged the same code, and a
correctness claim ("N fresh seeds, 0 failing, on this code") can be checked from the ledger alone.
``tests/sim/test_ledger.py`` runs a seed of every default profile and checks that every module it loaded is
inside the digest, so the digest cannot silently miss code the seeds ran.

The group stacks (fifo, vsync, total-order) import the grid with the simulator but never run it, so their rows
count on the **group-code digest**, the same sources without the grid's: a change to the grid alone keeps their
totals. The same test traces every function a seed of each group stack calls and checks none is the grid's. This
module is bookkeeping, not simulated code: no seed calls it (traced too), so changing it keeps every total.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import subprocess
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

PACKAGE = Path(__file__).resolve().parents[1]
# Relative to the package: what a simulation imports (checked by the test named above).
SIM_CODE_DIRS = ("core", "protocols", "sim", "grid")
SIM_CODE_EXCLUDED = ("grid/client", "grid/driver", "grid/http", "sim/ledger.py")
SIM_CODE_FILES = ("__init__.py", "compiled.py", "stacks.py")
# The stacks whose seeds never call the grid (checked by tracing in the test named above), and the grid's parts.
GROUP_STACKS = ("fifo", "vsync", "total-order")
GRID_CODE_DIRS = ("grid", "sim/grid")


def in_sim_code(rel: str) -> bool:
    """Whether the package file ``rel`` (posix, relative to the package) is part of the simulated code."""
    if not rel.endswith(".py"):
        return False
    if rel in SIM_CODE_FILES:
        return True
    top = rel.split("/", 1)[0]
    return top in SIM_CODE_DIRS and not any(rel == ex or rel.startswith(ex + "/") for ex in SIM_CODE_EXCLUDED)


def in_group_code(rel: str) -> bool:
    """Whether ``rel`` is part of the code a group stack's simulation runs: the simulated code without the grid."""
    return in_sim_code(rel) and not any(rel.startswith(d + "/") for d in GRID_CODE_DIRS)


def digest(files: Iterable[tuple[str, bytes]]) -> str:
    """A short hex digest of ``(relative path, content)`` pairs, independent of their order."""
    h = hashlib.sha256()
    for rel, data in sorted(files):
        h.update(rel.encode() + b"\0" + hashlib.sha256(data).digest())
    return h.hexdigest()[:16]


def sim_code_digest(package: Path = PACKAGE, part: Callable[[str], bool] = in_sim_code) -> str:
    """The digest of the simulated code (or of ``part`` of it, e.g. :func:`in_group_code`) as it is on disk
    (uncommitted changes included)."""
    files = []
    for path in package.rglob("*.py"):
        rel = path.relative_to(package).as_posix()
        if part(rel):
            files.append((rel, path.read_bytes()))
    return digest(files)


def sim_code_digest_at(
    repo: Path, commit: str, package: str = "member/groupcluster", part: Callable[[str], bool] = in_sim_code
) -> str | None:
    """The digest of the simulated code (or of ``part`` of it) at ``commit`` of the git repository ``repo``; None
    when git cannot tell (no such commit, no git)."""
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
        if kind == b"blob" and part(rel):
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
    code: str = ""  # the digest the seeds count on: the simulated code, or the group code of a group stack


def row_digest(
    row: dict[str, Any], repo: Path, cache: dict[tuple[str, bool], str | None], *, group: bool = False
) -> str | None:
    """A row's simulated-code digest (its group-code digest with ``group``), computed from the clean commit it
    names, so rows count by today's rule of what is simulated code; the digest the row recorded when it names
    no clean commit or git cannot tell; None when neither."""
    code = row.get("code")
    if code and "+" not in str(code):
        key = (str(code), group)
        if key not in cache:
            cache[key] = sim_code_digest_at(repo, str(code), part=in_group_code if group else in_sim_code)
        if cache[key] is not None:
            return cache[key]
    recorded = row.get("group_code" if group else "sim_code")
    return str(recorded) if recorded else None


def totals(
    rows: Sequence[dict[str, Any]], current: str, repo: Path, current_group: str | None = None
) -> tuple[dict[str, Total], dict[str, Total]]:
    """Per stack and per profile, the seeds the ledger's rows ran on the simulated code ``current``; the group
    stacks' rows count when they ran on the group code ``current_group`` (by default the checkout's, when
    ``current`` is the checkout's digest)."""
    if current_group is None and current == sim_code_digest():
        current_group = sim_code_digest(part=in_group_code)
    cache: dict[tuple[str, bool], str | None] = {}
    by_stack: dict[str, Total] = {}
    by_profile: dict[str, Total] = {}
    for row in rows:
        stack = str(row["profile"]).split("+", 1)[0]
        on_current = row_digest(row, repo, cache) == current
        if current_group is not None and stack in GROUP_STACKS:
            # The same simulated code holds the same group code: the check for rows that name no clean commit.
            code = current_group
            if not on_current and row_digest(row, repo, cache, group=True) != current_group:
                continue
        elif not on_current:
            continue
        else:
            code = current
        # Rows written by hand for sweeps run with `groupcluster sim` carry the options profiles cannot name.
        profile = str(row["profile"]) + (f" {row['options']}" if row.get("options") else "")
        start, seeds = int(row["start"]), int(row["seeds"])
        for key, table in ((stack, by_stack), (profile, by_profile)):
            t = table.setdefault(key, Total(code=code))
            t.seeds += seeds
            t.failed += [int(s) for s in row.get("failed") or ()]
            t.ranges.append(f"{start}..{start + seeds - 1}")
    return by_stack, by_profile


def format_totals(current: str, by_stack: dict[str, Total], by_profile: dict[str, Total]) -> str:
    """The ``groupcluster sweep --totals`` report."""
    lines = [f"simulated code {current}: seeds the ledger records on exactly this code"]
    group = {t.code for name, t in by_stack.items() if name in GROUP_STACKS and t.code != current}
    if group:
        lines.append(f"  ({', '.join(GROUP_STACKS)}: on exactly their part of it, the group code {min(group)})")
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
