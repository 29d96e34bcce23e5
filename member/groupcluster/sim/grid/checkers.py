"""Grid property checkers: judge the grid events of a history (see :mod:`groupcluster.sim.grid.run`), never the code.

Operations are intervals: a ``grid_start`` and, unless its member crashed first, a ``grid_end`` (``ok``
True: acknowledged). A write is a PUT (its value) or a DELETE (value absent). Two operations are
*concurrent* when their intervals overlap; a write that never ended (or failed) may or may not have taken
effect, at any time after it started, unless its client gave it a deadline (``deadline`` on ``grid_start``,
docs/grid.md "Client deadlines"): then it may have taken effect only before that deadline, so an acknowledged
write that started after the deadline and ended before a read began hides it from that read.

* ``grid-fresh-reads`` — a GET returns the value of a write that could have taken effect before the GET
  ended and that no acknowledged write *followed* before the GET began (followed: started after it ended);
  or absent, if no acknowledged write of the key ended before the GET began. In other words: the latest
  value acknowledged before the read started, or a concurrent one, or one that may have happened.
* ``grid-lost-write`` — the same rule for the GETs after ``grid_converged`` (every written key is read back
  once the healed grid converged): an acknowledged PUT's key reads back its value or a later/concurrent
  write's; an acknowledged DELETE stays deleted unless rewritten.
* ``grid-replicas-equal`` — after convergence (``grid_store`` events) every member is on one topology, every
  owner of a segment holds the same entries, and no member holds a segment it does not own.
* ``grid-expired`` — a PUT may give its entry a lifespan (``expires`` on ``grid_start``, docs/grid.md
  "Expiry"): its key's primary removes the entry at that time, so a read may find the key absent from then on,
  unless an acknowledged write that started after the PUT ended has replaced the entry (a newer version,
  which the removal leaves alone) while one group took writes (in a write window, the removal on one side is
  concurrent with the other side's writes, and the merge keeps the later). And once the grid converged, no
  store holds an entry whose lifespan ended more than ``EXPIRY_GRACE`` before (the removal's recheck interval,
  plus slack).

* ``grid-liveness`` — availability comes back by itself when nothing forbids it (docs/guarantees.md). The
  simulator records ``grid_whole`` (the grid was whole, with ``owners`` owning its segments) and ``grid_heal``
  (the faults stop). The members *lost for good* are the owners of the last ``grid_whole`` before the heal that
  crashed or left the group after it: an address never comes back (a restart is a new member, with an empty
  store), and the history does not tell a leave that handed its data off from one that took it along, so every
  leave counts (which only ever asks less of the grid). With ``k = min(num_owners, owners)`` copies of every
  segment at that moment, when fewer than ``k`` and fewer than half of the owners were lost for good, no segment
  lost every copy and the members left are a majority of that topology: no other side can be available. Then
  nobody may force the grid available (no ``grid_force_available``), and from at most ``LIVENESS_BOUND``
  virtual seconds after the group last converged (every live member in one view of exactly the live members,
  after the heal, to the end of the history) to the end, every live member that holds a topology holds an
  available one.
  Histories without ``grid_whole`` and ``grid_heal`` events (hand-written ones, real-process chaos runs) make
  no claim here.

**Partitions** (``grid_split`` windows recorded by the simulator, and any time the live members' views
differ): a member that was cut off may serve a read before it notices, in every mode, so a GET overlapping
such a window counts as started when the window opened. In ``allow_read_writes`` mode both sides also take
writes and the merge policy (docs/grid.md: newest version wins) keeps one of them, so a write overlapping a
window counts as lasting the whole window: writes in one window are concurrent with each other. In
``deny_read_writes`` and ``allow_reads`` writes get no such leeway: a side that may have lost owners refuses
them, so every acknowledged write must survive. In ``allow_read_writes`` a read overlapping a window may also
return absent: a side left without any owner of a segment starts it empty (the mode's trade-off).

**Separate grids** (members that started apart, or a restarted member that formed a group of its own): a
member's grid holds nothing of a grid it has never been in one view with. So a write acknowledged through a
member the reader had not yet been in one view with (directly, or through members that were) when the read
started binds that read only as a write that *may* have happened: it neither hides older values nor rules out
absent. After the merge view the merged group's data includes it (the merge push), and reads must see it.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..history import History, HistoryEvent
from ..history_index import HistoryFormatError, HistoryIndex, Violation, event_field, event_str
from ..stack_checkers import STACK_CHECKERS

INF = math.inf
# How long after its expiry an entry may still be held once the grid is whole: a member that was not the key's
# primary when it expired looks again after EXPIRY_RECHECK (grid/node/expiry.py), plus slack for the removal to reach
# every copy.
EXPIRY_GRACE = 1.5
# How long after the group converged the grid may still be degraded when it should not be: a merge view's
# coordinator waits for every member's status (recovery_timeout, 1 s in the simulation) and then broadcasts;
# the simulated operator steps in only after settle_time (6 s), so a grid it had to rescue misses this.
LIVENESS_BOUND = 5.0
ALLOW_READ_WRITES = "allow_read_writes"
MODES = ("deny_read_writes", "allow_reads", "allow_read_writes")


@dataclass(slots=True)
class GridOp:
    id: str
    member: str
    op: str  # get, put, delete
    key: str
    value: str | None  # put: the value written; get: the value read (once ended)
    start: float
    end: float = INF  # INF: never ended (its member crashed)
    ok: bool | None = None  # None: never ended
    error: str | None = None
    final: bool = False  # a read-back after the grid converged
    deadline: float = INF  # the client's deadline (INF: none)
    expires: float = INF  # a PUT's expiry (INF: never)

    @property
    def is_write(self) -> bool:
        return self.op != "get"

    @property
    def written(self) -> str | None:
        """The value this write leaves (None: the key absent)."""
        return self.value if self.op == "put" else None


@dataclass(slots=True)
class GridHistory:
    mode: str
    ops: list[GridOp]
    windows: list[tuple[float, float]]  # reads overlapping one may be stale
    write_windows: list[tuple[float, float]]  # two disjoint groups served writes: writes in one are concurrent
    stores: list[HistoryEvent]
    # member -> {member -> when it first installed a view linking its grid to that member's grid}
    known: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)
    converged_at: float | None = None


def _opt(ev: HistoryEvent, pos: int, name: str) -> str | None:
    raw = ev.data.get(name)
    if raw is not None and not isinstance(raw, str):
        raise HistoryFormatError(f"history event #{pos} ({ev.kind} by {ev.member}): {name} must be a string or null")
    return raw


def _deadline(ev: HistoryEvent, pos: int, name: str = "deadline") -> float:
    raw = ev.data.get(name)
    if raw is None:
        return INF
    if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not raw >= ev.t:
        raise HistoryFormatError(
            f"history event #{pos} ({ev.kind} by {ev.member}): {name} must be a time at or after the start"
        )
    return float(raw)


def parse(history: History | HistoryIndex | Iterable[HistoryEvent]) -> GridHistory:  # noqa: C901, PLR0912, PLR0915  one pass over the history: each event kind moves the shared window state
    """Collect the grid operations, the split windows and the store snapshots of a history."""
    events = history.events if isinstance(history, HistoryIndex | History) else list(history)
    mode = "deny_read_writes"
    ops: dict[str, GridOp] = {}
    order: list[GridOp] = []
    windows: list[tuple[float, float]] = []
    split_start: float | None = None
    converged_at: float | None = None
    stores: list[HistoryEvent] = []
    # View divergence: the live members' current views differ (a split, or a view change in progress).
    current: dict[str, tuple[int, str]] = {}
    diverged_since: float | None = None
    # Two available groups: members with disjoint views, each on a topology that is available.
    view_members: dict[str, frozenset[str]] = {}
    available: dict[str, bool] = {}
    grid_group: dict[str, frozenset[str]] = {}
    merge_start: dict[str, float] = {}
    write_windows: list[tuple[float, float]] = []
    two_since: float | None = None
    last_t = 0.0
    # Grid lineages: the members whose writes a member's grid may hold (see "Separate grids" above), and who
    # installed each view so far (two members' grids meet when both installed one view).
    installed: dict[tuple[int, str], list[str]] = {}
    known: dict[str, dict[str, float]] = {}
    for pos, ev in enumerate(events):
        kind = ev.kind
        last_t = max(last_t, ev.t)
        if kind == "grid_start":
            g = _started_op(ev, pos, final=converged_at is not None)
            if g.id in ops:
                raise HistoryFormatError(f"history event #{pos}: grid operation id {g.id!r} started twice")
            ops[g.id] = g
            order.append(g)
        elif kind == "grid_end":
            _end_op(ops, ev, pos)
        elif kind == "grid_config":
            m = ev.data.get("mode", mode)
            if m not in MODES:
                raise HistoryFormatError(f"history event #{pos} (grid_config): mode {m!r} is not one of {MODES}")
            mode = m
        elif kind == "grid_split":
            if ev.data.get("phase") == "start":
                split_start = ev.t if split_start is None else split_start
            elif split_start is not None:
                windows.append((split_start, ev.t))
                split_start = None
        elif kind == "grid_merge":
            if ev.data.get("phase") == "start":
                merge_start.setdefault(ev.member, ev.t)
            elif ev.member in merge_start:
                write_windows.append((merge_start.pop(ev.member), ev.t))
        elif kind == "grid_converged":
            converged_at = ev.t
        elif kind == "grid_store":
            stores.append(ev)
        elif kind == "view" or kind in ("crash", "leave", "left") or kind == "grid_topology":
            if kind == "view":
                raw = ev.data.get("view_id")
                members = ev.data.get("members")
                if isinstance(raw, list) and len(raw) == 2:
                    current[ev.member] = (int(raw[0]), str(raw[1]))
                if isinstance(members, list):
                    view_members[ev.member] = frozenset(str(m) for m in members)
                    if isinstance(raw, list) and len(raw) == 2:
                        _link(ev.member, current[ev.member], ev.t, installed, known)
            elif kind == "grid_topology":
                # A member serves from the group it had when it installed its topology, until the next one
                # (after a merge view, until the merged group's first topology reaches it).
                available[ev.member] = ev.data.get("availability") == "AVAILABLE"
                grid_group[ev.member] = view_members.get(ev.member, frozenset({ev.member}))
            else:
                current.pop(ev.member, None)
                view_members.pop(ev.member, None)
                available.pop(ev.member, None)
                grid_group.pop(ev.member, None)
            diverged = len(set(current.values())) > 1
            if diverged and diverged_since is None:
                diverged_since = ev.t
            elif not diverged and diverged_since is not None:
                windows.append((diverged_since, ev.t))
                diverged_since = None
            two = _two_available_groups(grid_group, available)
            if two and two_since is None:
                two_since = ev.t
            elif not two and two_since is not None:
                write_windows.append((two_since, ev.t))
                two_since = None
    if split_start is not None:
        windows.append((split_start, INF))
    if diverged_since is not None:
        windows.append((diverged_since, INF))
    if two_since is not None:
        write_windows.append((two_since, INF))
    write_windows.extend((t, INF) for t in merge_start.values())
    if mode == ALLOW_READ_WRITES:
        # Both sides of any split take writes in this mode (the grid is never degraded).
        write_windows.extend(windows)
    return GridHistory(
        mode, order, _merge_windows(windows + write_windows), _merge_windows(write_windows), stores, known, converged_at
    )


def _started_op(ev: HistoryEvent, pos: int, *, final: bool) -> GridOp:
    """The operation a ``grid_start`` event begins (``final``: the grid had converged; only a get is final)."""
    op = event_str(ev, pos, "op")
    if op not in ("get", "put", "delete"):
        raise HistoryFormatError(f"history event #{pos} (grid_start by {ev.member}): op {op!r} unknown")
    g = GridOp(
        event_str(ev, pos, "id"),
        ev.member,
        op,
        event_str(ev, pos, "key"),
        _opt(ev, pos, "value"),
        ev.t,
        final=final and op == "get",
        deadline=_deadline(ev, pos),
        expires=_deadline(ev, pos, "expires"),
    )
    if g.expires != INF and op != "put":
        raise HistoryFormatError(f"history event #{pos} (grid_start by {ev.member}): only a put expires")
    return g


def _end_op(ops: dict[str, GridOp], ev: HistoryEvent, pos: int) -> None:
    """Record a ``grid_end`` event's outcome on the operation it ends."""
    g = ops.get(event_str(ev, pos, "id"))
    if g is None:
        raise HistoryFormatError(f"history event #{pos}: grid_end of an operation that never started")
    ok = event_field(ev, pos, "ok")
    if not isinstance(ok, bool):
        raise HistoryFormatError(f"history event #{pos} (grid_end by {ev.member}): ok must be true or false")
    g.end, g.ok, g.error = ev.t, ok, _opt(ev, pos, "error")
    if g.op == "get":
        g.value = _opt(ev, pos, "value") if ok else None


def _link(
    member: str,
    view_id: tuple[int, str],
    t: float,
    installed: dict[tuple[int, str], list[str]],
    known: dict[str, dict[str, float]],
) -> None:
    """``member`` installed view ``view_id`` at ``t``: its grid meets the grids of the members that installed
    the same view before it. (Being listed in someone's view is not enough: a member that never installs that
    view, e.g. one whose join failed and that formed a group of its own, keeps a grid of its own.)"""
    mine = known.setdefault(member, {member: -INF})
    peers = installed.setdefault(view_id, [])
    for other in peers:
        theirs = known.setdefault(other, {other: -INF})
        for m in list(theirs):
            mine.setdefault(m, t)
        for m in list(mine):
            theirs.setdefault(m, t)
    peers.append(member)


def _two_available_groups(views: dict[str, frozenset[str]], available: dict[str, bool]) -> bool:
    """Whether two members on available topologies are not both in the group each installed its topology in
    (two groups that may both take writes: members that started apart, a partition in ``allow_read_writes``,
    or a member that has not noticed it was cut off)."""
    members = sorted(m for m, ok in available.items() if ok and m in views)
    return any(b not in views[a] or a not in views[b] for i, a in enumerate(members) for b in members[i + 1 :])


def _merge_windows(windows: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for s, e in sorted(windows):
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


def _widen(start: float, end: float, windows: list[tuple[float, float]], both: bool) -> tuple[float, float]:
    """The interval stretched over every window it overlaps (``both``: also its end)."""
    for ws, we in windows:
        if ws > end:
            break
        if we >= start:
            start = min(start, ws)
            if both:
                end = max(end, we)
    return start, end


def _overlaps(start: float, end: float, windows: list[tuple[float, float]]) -> bool:
    return any(ws <= end and we >= start for ws, we in windows)


@dataclass(slots=True)
class _Write:
    op: GridOp
    start: float
    end: float  # INF unless acknowledged


class _KeyWrites:
    """The writes of one key, with what a read needs: which writes an acknowledged one followed."""

    def __init__(self, writes: list[_Write]) -> None:
        self.writes = sorted(writes, key=lambda w: w.start)
        acked = sorted((w for w in writes if w.op.ok), key=lambda w: w.start)
        self.acked_starts = [w.start for w in acked]
        # suffix minimum of the end times of acknowledged writes, by start
        self.suffix_min_end = [INF] * (len(acked) + 1)
        for i in range(len(acked) - 1, -1, -1):
            self.suffix_min_end[i] = min(acked[i].end, self.suffix_min_end[i + 1])
        self.acked = acked
        self.min_acked_end = self.suffix_min_end[0]

    def followed_before(self, w: _Write, t: float) -> bool:
        """Whether an acknowledged write started after ``w`` ended and ended before ``t``."""
        if w.end == INF:
            # Never acknowledged: it may take effect at any time, so nothing reliably follows it.
            return False
        i = bisect.bisect_right(self.acked_starts, w.end)
        return self.suffix_min_end[i] < t

    def allowed(self, start: float, end: float) -> set[str | None]:
        vals: set[str | None] = set()
        for w in self.writes:
            if w.start > end:
                break
            if not self.followed_before(w, start):
                vals.add(w.op.written)
        if self.min_acked_end >= start:
            vals.add(None)  # nothing acknowledged yet: still absent
        return vals

    def latest_before(self, t: float) -> _Write | None:
        best = None
        for w in self.acked:
            if w.end < t and (best is None or w.end > best.end):
                best = w
        return best


def _foreign(read: GridOp, writes: Iterable[_Write], known: dict[str, dict[str, float]]) -> set[int]:
    """The acknowledged writes (by id) made through a member whose grid the reader's had not met when the read
    started. Histories without views (hand-written ones) have no lineages: nothing is foreign there."""
    mine = known.get(read.member)
    if mine is None:
        return set()
    return {id(w) for w in writes if w.end != INF and w.op.member in known and mine.get(w.op.member, INF) > read.start}


def _refused_unwritten(g: GridOp) -> bool:
    """A PUT its primary refused at the max_entries bound on its first attempt (docs/grid.md, "A bound on
    entries"): nothing of it was written, so it is no candidate for any read."""
    error = g.error or ""
    return error.startswith("full:") and "nothing was written" in error


def _check_reads(gh: GridHistory) -> list[Violation]:
    windows = gh.windows
    by_key: dict[str, list[_Write]] = {}
    for g in gh.ops:
        if not g.is_write or (g.ok is False and _refused_unwritten(g)):
            continue
        # A failed write may still have been applied somewhere (a timeout, a member that left): it stays a
        # candidate, but it was not acknowledged, so it never hides an older value. With a client deadline it
        # took effect before the deadline or never: an acknowledged write after it can hide it.
        end = g.end if g.ok else g.deadline
        start, end = _widen(g.start, end, gh.write_windows, both=True)
        by_key.setdefault(g.key, []).append(_Write(g, start, end))
        if g.expires != INF:
            # Its removal at expiry: a delete that may take effect from then on, never acknowledged, and hidden
            # (like a write followed) by an acknowledged write that started after the PUT ended: the key's
            # primary holds that one by then, with a newer version, which the removal leaves alone. Not so for
            # an unacknowledged PUT, nor when two groups may take writes at or after the expiry (a write window):
            # a primary on one side may remove the entry while the other side writes the key, and the removal,
            # stamped when it runs, can win the merge (seed 503 in allow_read_writes: last writer wins).
            hidden_after = g.end if g.ok and not _overlaps(g.expires, INF, gh.write_windows) else INF
            removal = GridOp(f"{g.id}:expiry", g.member, "delete", g.key, None, g.expires)
            by_key[g.key].append(_Write(removal, g.expires, hidden_after))
    keys = {k: _KeyWrites(ws) for k, ws in by_key.items()}
    empty = _KeyWrites([])
    out: list[Violation] = []
    for g in gh.ops:
        if g.is_write or not g.ok:
            continue
        start, end = _widen(g.start, g.end, windows, both=False) if not g.final else (g.start, g.end)
        kw = keys.get(g.key, empty)
        foreign = _foreign(g, by_key.get(g.key, ()), gh.known)
        if foreign:
            # Writes acknowledged through a grid the reader's grid had not met yet: they may have happened.
            kw = _KeyWrites([_Write(w.op, w.start, INF) if id(w) in foreign else w for w in by_key[g.key]])
        allowed = kw.allowed(start, end)
        if gh.mode == ALLOW_READ_WRITES and not g.final and _overlaps(g.start, g.end, windows):
            allowed.add(None)  # a side without any owner of the segment started it empty
        if g.value in allowed:
            continue
        latest = kw.latest_before(start)
        what = (
            "nothing acknowledged before it"
            if latest is None
            else f"the latest acknowledged write before it was {latest.op.op} #{latest.op.id} "
            f"({latest.op.written!r}, acknowledged at t={latest.op.end:.6f} via {latest.op.member})"
        )
        prop = "grid-lost-write" if g.final else "grid-fresh-reads"
        label = "final read" if g.final else "read"
        out.append(
            Violation(
                prop,
                g.member,
                f"{label} #{g.id} of {g.key!r} at t={g.start:.6f}..{g.end:.6f} returned {g.value!r}; {what}; "
                f"allowed: {sorted(allowed, key=lambda v: (v is not None, v or ''))}",
            )
        )
    return out


def check_grid_fresh_reads(history: History | HistoryIndex) -> list[Violation]:
    return [v for v in _check_reads(parse(history)) if v.property == "grid-fresh-reads"]


def check_grid_lost_writes(history: History | HistoryIndex) -> list[Violation]:
    return [v for v in _check_reads(parse(history)) if v.property == "grid-lost-write"]


def check_grid_replicas(history: History | HistoryIndex) -> list[Violation]:
    gh = parse(history)
    if not gh.stores:
        return []
    out: list[Violation] = []
    tids = {ev.data.get("topology_id") for ev in gh.stores}
    if len(tids) > 1:
        out.append(
            Violation(
                "grid-replicas-equal",
                "-",
                "members ended on different topologies: "
                + ", ".join(f"{ev.member}: {ev.data.get('topology_id')}" for ev in gh.stores),
            )
        )
        return out
    held: dict[str, dict[str, dict[str, str]]] = {}
    owners: list[list[str]] | None = None
    for pos, ev in enumerate(gh.stores):
        data = event_field(ev, pos, "data")
        own = event_field(ev, pos, "owners")
        if not isinstance(data, dict) or not isinstance(own, list):
            raise HistoryFormatError(f"grid_store by {ev.member}: data must be an object and owners a list")
        held[ev.member] = data
        owners = own if owners is None else owners
    assert owners is not None
    for s, seg_owners in enumerate(owners):
        copies = [(m, held[m].get(str(s), {})) for m in seg_owners if m in held]
        for m, c in copies[1:]:
            if c != copies[0][1]:
                a, b = copies[0][1], c
                diff = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
                sample = ", ".join(f"{k}: {a.get(k)!r} vs {b.get(k)!r}" for k in diff[:3])
                out.append(
                    Violation(
                        "grid-replicas-equal",
                        m,
                        f"segment {s}: holds other entries than owner {copies[0][0]} "
                        f"({len(diff)} keys differ: {sample})",
                    )
                )
        for m, data in held.items():
            if m not in seg_owners and data.get(str(s)):
                out.append(
                    Violation(
                        "grid-replicas-equal", m, f"holds {len(data[str(s)])} entries of segment {s}, not an owner"
                    )
                )
    return out


def check_grid_expired(history: History | HistoryIndex) -> list[Violation]:
    """No store holds, once the grid converged, an entry whose lifespan ended ``EXPIRY_GRACE`` before that."""
    gh = parse(history)
    if not gh.stores or gh.converged_at is None:
        return []
    cutoff = gh.converged_at - EXPIRY_GRACE
    expired = {(g.key, g.value): g for g in gh.ops if g.expires <= cutoff}
    if not expired:
        return []
    out: list[Violation] = []
    for pos, ev in enumerate(gh.stores):
        data = event_field(ev, pos, "data")
        if not isinstance(data, dict):
            raise HistoryFormatError(f"grid_store by {ev.member}: data must be an object")
        for seg, entries in sorted(data.items()):
            for key, value in sorted(entries.items()):
                g = expired.get((key, value))
                if g is not None:
                    out.append(
                        Violation(
                            "grid-expired",
                            ev.member,
                            f"segment {seg}: holds {key!r} = {value!r} at t={ev.t:.6f}, written by put #{g.id} "
                            f"that expired at t={g.expires:.6f} (the grid converged at t={gh.converged_at:.6f})",
                        )
                    )
    return out


def check_grid_liveness(history: History | HistoryIndex | Iterable[HistoryEvent]) -> list[Violation]:
    """A grid that lost fewer than num_owners members for good, and fewer than half of its owners, is available
    again by itself within ``LIVENESS_BOUND`` of the group converging after the heal (see the module docstring)."""
    events = history.events if isinstance(history, HistoryIndex | History) else list(history)
    num_owners, heal, whole = _heal_and_whole(events)
    if heal is None or whole is None:
        return []
    owners = set(whole.data["owners"])
    lost = sorted(
        {ev.member for ev in events if ev.kind in ("crash", "left") and ev.t >= whole.t and ev.member in owners}
    )
    k = min(num_owners, len(owners))
    if len(lost) >= k or 2 * len(lost) >= len(owners):
        return []
    premise = (
        f"{len(lost)} of the {len(owners)} owners of the grid whole at t={whole.t:.3f} "
        f"(topology {whole.data.get('topology_id')}) lost for good ({', '.join(lost) or 'none'}), "
        f"{num_owners} owners per segment"
    )
    out = [
        Violation(
            "grid-liveness",
            ev.member,
            f"forced available at t={ev.t:.3f} (topology {ev.data.get('topology_id')}), though {premise}: "
            "the grid should have become available by itself",
        )
        for ev in events
        if ev.kind == "grid_force_available" and ev.t >= whole.t
    ]
    live, avail, converged, since = _convergence(events, heal)
    if converged is None:
        return out  # the group did not end converged: the convergence checks report that
    deadline = converged + LIVENESS_BOUND
    if since is None:
        degraded = sorted(m for m in live if not avail.get(m, True))
        out.append(
            Violation(
                "grid-liveness",
                "-",
                f"still degraded at the end of the history ({', '.join(degraded)}), though {premise}; "
                f"the group converged at t={converged:.3f}",
            )
        )
    elif since > deadline:
        out.append(
            Violation(
                "grid-liveness",
                "-",
                f"available again only at t={since:.3f}, more than {LIVENESS_BOUND:g}s after the group "
                f"converged at t={converged:.3f}, though {premise}",
            )
        )
    return out


def _heal_and_whole(events: list[HistoryEvent]) -> tuple[int, float | None, HistoryEvent | None]:
    """The liveness premise's inputs: owners per segment, the first heal, and the last ``grid_whole`` before it."""
    num_owners = 2
    heal: float | None = None
    whole: HistoryEvent | None = None
    for pos, ev in enumerate(events):
        if ev.kind == "grid_config":
            raw = ev.data.get("num_owners", num_owners)
            if isinstance(raw, bool) or not isinstance(raw, int) or raw < 1:
                raise HistoryFormatError(f"history event #{pos} (grid_config): num_owners must be a positive integer")
            num_owners = raw
        elif ev.kind == "grid_heal" and heal is None:
            heal = ev.t
        elif ev.kind == "grid_whole" and heal is None:
            owners = ev.data.get("owners")
            if not isinstance(owners, list) or not all(isinstance(o, str) for o in owners):
                raise HistoryFormatError(f"history event #{pos} (grid_whole): owners must be a list of members")
            whole = ev
    return num_owners, heal, whole


def _convergence(
    events: list[HistoryEvent], heal: float
) -> tuple[set[str], dict[str, bool], float | None, float | None]:
    """The live members and their topologies' availability at the end, when the group last converged after
    ``heal``, and since when every live member holding a topology holds an available one."""
    live: set[str] = set()
    views: dict[str, tuple[Any, frozenset[str]]] = {}
    avail: dict[str, bool] = {}
    converged: float | None = None
    since: float | None = None  # every live member holding a topology holds an available one, from then on
    for ev in events:
        kind, member = ev.kind, ev.member
        if kind in ("start", "restart"):
            live.add(member)
        elif kind in ("crash", "left"):
            live.discard(member)
            views.pop(member, None)
            avail.pop(member, None)
        elif kind == "view":
            members = ev.data.get("members")
            if isinstance(members, list):
                views[member] = (repr(ev.data.get("view_id")), frozenset(str(m) for m in members))
        elif kind == "grid_topology":
            avail[member] = ev.data.get("availability") == "AVAILABLE"
        else:
            continue
        # The group converges (again: it may still split after the heal, e.g. a member its failure detector
        # suspected wrongly, and a side of one rightly degrades until it merges back).
        together = ev.t >= heal and bool(live) and all(m in views for m in live)
        if together:
            ids = {views[m] for m in live}
            together = len(ids) == 1 and next(iter(ids))[1] == frozenset(live)
        if not together:
            converged = None
        elif converged is None:
            converged = ev.t
        ok = all(avail.get(m, True) for m in live)
        if not ok:
            since = None
        elif since is None:
            since = ev.t
    return live, avail, converged, since


GRID_CHECKERS = {
    "grid-fresh-reads": check_grid_fresh_reads,
    "grid-lost-write": check_grid_lost_writes,
    "grid-replicas-equal": check_grid_replicas,
    "grid-expired": check_grid_expired,
    "grid-liveness": check_grid_liveness,
}

STACK_CHECKERS["grid"] = dict(GRID_CHECKERS)
