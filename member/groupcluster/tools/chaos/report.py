"""What a chaos run found (:class:`ChaosResult`: its JSON form and summary line) and the report as text."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any

from .faults import CAPACITY, KINDS, FaultRecord


@dataclass
class ChaosResult:
    seed: int
    minutes: float
    members: int
    num_owners: int
    faults: list[FaultRecord]
    ops: int
    op_counts: dict[str, int]
    keys_checked: int
    violations: dict[str, int]
    samples: list[str]
    lost: int
    lost_keys: list[str]
    duration: float
    history: str
    errors: list[str]
    # Settles after which every member at capacity 0 was checked to own no segment (--capacity-changes).
    capacity_checks: int = 0

    @property
    def total_violations(self) -> int:
        return sum(self.violations.values())

    @property
    def ok(self) -> bool:
        return self.total_violations == 0 and self.lost == 0 and not self.errors

    def summary(self) -> str:
        return f"chaos: {self.ops} ops, {self.total_violations} violations, {self.lost} lost"

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self)
        for f in doc["faults"]:
            del f["started"]
        doc["fault_kinds"] = dict(Counter(f.kind for f in self.faults))
        doc["total_violations"] = self.total_violations
        doc["ok"] = self.ok
        return doc


def format_report(r: ChaosResult) -> str:
    lines = [f"faults (seed {r.seed}):"]
    header = ["#", "at", "kind", "member", "how", "replacement", "balanced after"]
    rows = [
        [
            str(f.number),
            f"{f.at:.1f}s",
            f.kind,
            f.member,
            f.detail,
            f.replacement or "-",
            "-" if f.recovered_after is None else f"{f.recovered_after:.1f}s",
        ]
        for f in r.faults
    ]
    widths = [max(len(header[i]), *(len(row[i]) for row in rows)) for i in range(len(header))]
    for row in [header, *rows]:
        lines.append("  " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    kinds = Counter(f.kind for f in r.faults)
    lines.append("")
    lines.append("figures:")
    figures = [
        ("run", f"{r.duration:.0f}s, {r.members} members, num_owners {r.num_owners}"),
        ("faults", ", ".join(f"{kinds.get(k, 0)} {k}" for k in (*KINDS, *(k for k in kinds if k not in KINDS)))),
        ("operations", ", ".join(f"{n} {k}" for k, n in sorted(r.op_counts.items())) or "none"),
        ("keys read back", str(r.keys_checked)),
        *(
            [("capacity checks", f"{r.capacity_checks} balanced grids with every member at capacity 0 owning nothing")]
            if kinds.get(CAPACITY)
            else []
        ),
        *((f"checker {name}", f"{n} violations") for name, n in r.violations.items()),
        ("history", r.history),
    ]
    w = max(len(k) for k, _ in figures)
    lines += [f"  {k.ljust(w)}  {v}" for k, v in figures]
    if r.samples:
        lines.append("")
        lines.append("violations (first of each checker):")
        lines += [f"  {s}" for s in r.samples]
    if r.lost_keys:
        lines.append(f"lost keys: {', '.join(r.lost_keys)}")
    if r.errors:
        lines.append("workload errors:")
        lines += [f"  {e}" for e in r.errors]
    return "\n".join(lines)
