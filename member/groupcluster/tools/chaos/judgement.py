"""The checkers' verdict on a chaos history: violations per grid checker, samples, and the keys lost."""

from __future__ import annotations

from typing import Any


def check_history(history: Any) -> tuple[dict[str, int], list[str], set[str]]:
    """Run the grid checkers over a chaos history: violations per checker, a few samples, the keys lost.

    A key is lost when its read-back after convergence returned a value no write allows
    (``grid-lost-write``) or failed: a key that cannot be read back cannot be shown to hold its value.
    """
    from ...sim.grid.checkers import GRID_CHECKERS

    violations: dict[str, int] = {}
    samples: list[str] = []
    lost_keys: set[str] = set()
    for name, check in GRID_CHECKERS.items():
        found = check(history)
        violations[name] = len(found)
        samples += [f"{v.property} {v.member}: {v.detail}" for v in found[:3]]
        if name == "grid-lost-write":
            lost_keys |= {_key_of(v.detail) for v in found}
    finals = {e.data["id"]: e for e in history.events if e.kind == "grid_start" and e.member == "final"}
    for e in history.events:
        if e.kind == "grid_end" and e.data.get("id") in finals and not e.data.get("ok"):
            lost_keys.add(str(finals[e.data["id"]].data.get("key")))
    return violations, samples, lost_keys


def _key_of(detail: str) -> str:
    """The key named in a read violation's text (``... of 'k012' at ...``)."""
    _, _, rest = detail.partition(" of ")
    return rest.split(" at t=", 1)[0].strip("'\"") if rest else detail
