"""The properties only some stacks promise, by stack preset (:data:`STACK_CHECKERS`, which ``check_all``
runs for its ``stack``): virtual synchrony (``vsync``, ``total-order``), the sequencer's total order and
crashed members' prefix (``total-order``), and state transfer (the stacks with the ``state`` layer).

Like the checkers every stack promises (:mod:`groupcluster.sim.checkers`), each reads only an indexed
history (:class:`~groupcluster.sim.history_index.HistoryIndex`). The grid stacks add theirs to the same
table (:mod:`groupcluster.sim.grid.checkers`, :mod:`groupcluster.sim.grid.tx_checkers`).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from typing import Any

from .history import History
from .history_index import (
    Checker,
    HistoryFormatError,
    HistoryIndex,
    VidKey,
    Violation,
    event_field,
    event_str,
    fmt_vid,
    index_of,
)

# ---- virtual synchrony (stacks vsync and total-order) -----------------------------------------------------


def check_virtual_synchrony(history: History | HistoryIndex, *, merged_earlier: bool = False) -> list[Violation]:
    """Members that install the same view V2 right after the same view V1 delivered the same multicasts in V1.

    A member's deliveries between installing V1 and installing its next view count as delivered in V1. Only
    members that moved on to the same next view are compared (a member that crashed in V1 has no next view).
    ``merged_earlier`` (the ``total-order`` stack): a multicast one member delivered in V1 that the other had
    already applied before V1, by delivering it or in a state it took (the donor's deliveries up to the cut,
    ``state`` events ``get`` and ``set``), is no difference: both have it when they leave V1, which is what the
    property protects. The sequencer replays earlier epochs in a new view: after a partition, each side's to
    the merged view (extended virtual synchrony), and a replay a joiner never receives is in its state.
    """
    idx = index_of(history)
    views_at: dict[str, list[tuple[int, VidKey]]] = {
        m: [(pos, vid) for pos, vid, _ in vs] for m, vs in idx.views.items()
    }
    # (member, index of its view) -> the multicasts it delivered while in that view
    delivered: dict[tuple[str, int], set[tuple[str, str]]] = {}
    positions = {m: [pos for pos, _ in vs] for m, vs in views_at.items()}
    for d in idx.deliveries:
        if d.dest is not None:
            continue
        k = bisect.bisect_right(positions.get(d.receiver, []), d.pos) - 1
        if k >= 0:
            delivered.setdefault((d.receiver, k), set()).add((d.sender, d.msg))
    # (V1, V2) -> [(member, its deliveries in V1)]
    groups: dict[tuple[VidKey, VidKey], list[tuple[str, set[tuple[str, str]], int]]] = {}
    for member, vs in views_at.items():
        for k in range(len(vs) - 1):
            groups.setdefault((vs[k][1], vs[k + 1][1]), []).append((member, delivered.get((member, k), set()), k))
    earlier: dict[tuple[str, int], set[tuple[str, str]]] = {}
    if merged_earlier:
        # (member, index of its view) -> every multicast it applied before installing that view
        from_state: dict[str, set[tuple[str, str]]] = {}
        for joiner, donor, get_pos, _ in _state_transfers(idx):
            from_state.setdefault(joiner, set()).update(
                (d.sender, d.msg) for d in idx.deliveries if d.receiver == donor and d.dest is None and d.pos < get_pos
            )
        for member, vs in views_at.items():
            acc: set[tuple[str, str]] = set(from_state.get(member, ()))
            for k in range(len(vs)):
                earlier[(member, k)] = set(acc)
                acc |= delivered.get((member, k), set())
    out: list[Violation] = []
    for (v1, v2), members in groups.items():
        first_member, first, first_k = members[0]
        for member, got, k in members[1:]:
            if got != first:
                only_first_set = first - got - earlier.get((member, k), set())
                only_other_set = got - first - earlier.get((first_member, first_k), set())
                if not only_first_set and not only_other_set:
                    continue
                only_first = sorted(only_first_set)[:3]
                only_other = sorted(only_other_set)[:3]
                out.append(
                    Violation(
                        "virtual-synchrony",
                        member,
                        f"moved from view {fmt_vid(v1)} to {fmt_vid(v2)} like {first_member} but delivered other "
                        f"messages in {fmt_vid(v1)}: {len(only_first_set)} only at {first_member} (e.g. "
                        f"{only_first}), {len(only_other_set)} only here (e.g. {only_other})",
                    )
                )
    return out


def _state_transfers(idx: HistoryIndex) -> list[tuple[str, str, int, int]]:
    """(joiner, donor, position of the donor's ``get``, of the joiner's ``set``) for every state a joiner set
    from a donor."""
    gets: dict[tuple[str, str, Any], int] = {}
    out: list[tuple[str, str, int, int]] = []
    for pos, ev in enumerate(idx.events):
        if ev.kind != "state":
            continue
        op = ev.data.get("op")
        transfer = ev.data.get("transfer")
        if not isinstance(transfer, list) or len(transfer) != 2:
            continue
        if op == "get":
            gets[(ev.member, str(transfer[0]), transfer[1])] = pos
        elif op == "set" and ev.data.get("donor") is not None:
            get_pos = gets.get((str(ev.data["donor"]), ev.member, transfer[1]))
            if get_pos is not None:
                out.append((ev.member, str(ev.data["donor"]), get_pos, pos))
    return out


# ---- total order (stack "total-order") ----------------------------------------------------------------------
#
# * ``total-order`` — two members deliver the multicasts they both delivered in the same relative order,
#   counting the deliveries each made while the other was in its view (extended virtual synchrony's agreed
#   order: members in different partitions order independently, and the merged group cannot undo that).
# * ``crashed-prefix`` — a crashed member's deliveries, made while a survivor S was in its view, are a prefix
#   of S's order: those S delivered too (while the crashed member was in S's view, or after the crash) come in
#   the same order, and S also delivered each one whose sender S had in every view from the send until the
#   crashed member delivered it (uniform agreement: what a member delivered before crashing is not lost or
#   reordered for the others, even when the sender crashed as well).


def _multicasts_by_view(idx: HistoryIndex) -> dict[str, list[tuple[tuple[str, str], int, int]]]:
    """Per receiver: its multicast deliveries as ((sender, msg), index of its view then or -1, position)."""
    out: dict[str, list[tuple[tuple[str, str], int, int]]] = {}
    for d in idx.deliveries:
        if d.dest is not None:
            continue
        k = bisect.bisect_right(idx.view_positions.get(d.receiver, []), d.pos) - 1
        out.setdefault(d.receiver, []).append(((d.sender, d.msg), k, d.pos))
    return out


def _with_peer(
    idx: HistoryIndex, member: str, seq: list[tuple[tuple[str, str], int, int]], peer: str
) -> list[tuple[tuple[str, str], int, int]]:
    """The deliveries of ``member`` made while ``peer`` was in its view."""
    views = idx.views.get(member, [])
    present = [peer in members for _pos, _vid, members in views]
    return [e for e in seq if e[1] >= 0 and present[e[1]]]


def _first_inversion(
    ours: list[tuple[str, str]], theirs: dict[tuple[str, str], int]
) -> tuple[tuple[str, str], tuple[str, str]] | None:
    """In ``ours`` (an order), the first pair (a, b) that ``theirs`` (positions) orders b before a."""
    best: tuple[int, tuple[str, str]] | None = None
    for key in ours:
        p = theirs.get(key)
        if p is None:
            continue
        if best is not None and p < best[0]:
            return best[1], key
        if best is None or p > best[0]:
            best = (p, key)
    return None


def _fmt_msg(key: tuple[str, str]) -> str:
    return f"{key[1]!r} from {key[0]}"


def check_total_order(history: History | HistoryIndex) -> list[Violation]:
    idx = index_of(history)
    per = _multicasts_by_view(idx)
    members = sorted(per)
    out: list[Violation] = []
    for i, x in enumerate(members):
        for y in members[i + 1 :]:
            xs = [e[0] for e in _with_peer(idx, x, per[x], y)]
            if not xs:
                continue
            ys = [e[0] for e in _with_peer(idx, y, per[y], x)]
            pos_y = {key: n for n, key in enumerate(ys)}
            inv = _first_inversion(xs, pos_y)
            if inv is not None:
                a, b = inv
                out.append(
                    Violation(
                        "total-order",
                        x,
                        f"delivered {_fmt_msg(a)} before {_fmt_msg(b)}, but {y} delivered them the other way round "
                        f"(each while the other was in its view)",
                    )
                )
    return out


def check_crashed_prefix(history: History | HistoryIndex) -> list[Violation]:
    idx = index_of(history)
    crashed = sorted({ev.member for ev in idx.events if ev.kind == "crash"})
    if not crashed:
        return []
    survivors = sorted(idx.live_members())
    per = _multicasts_by_view(idx)
    out: list[Violation] = []
    for c in crashed:
        seq = per.get(c, [])
        if not seq:
            continue
        for s in survivors:
            if s == c:
                continue
            mine = _with_peer(idx, c, seq, s)
            if not mine:
                continue
            # The survivor's deliveries while the crashed member was in its view or after the crash (before,
            # while apart, the survivor ordered on its own: see total-order).
            together = _with_peer(idx, s, per.get(s, []), c)
            crash_pos = idx.ended.get(c, -1)
            theirs_seq = [e for e in per.get(s, []) if e[2] > crash_pos] if crash_pos >= 0 else []
            theirs = {e[0]: e[2] for e in sorted({*together, *theirs_seq}, key=lambda e: e[2])}
            inv = _first_inversion([e[0] for e in mine], theirs)
            if inv is not None:
                a, b = inv
                out.append(
                    Violation(
                        "crashed-prefix",
                        c,
                        f"delivered {_fmt_msg(a)} before {_fmt_msg(b)} (then crashed); survivor {s} delivered them "
                        f"the other way round",
                    )
                )
                continue
            delivered = {e[0] for e in per.get(s, [])}
            for key, _k, pos in mine:
                if key not in delivered and _owed(idx, key, s, pos):
                    out.append(
                        Violation(
                            "crashed-prefix",
                            c,
                            f"delivered {_fmt_msg(key)} while {s} was in its view (then crashed); {s} never "
                            f"delivered it, though it had the sender in every view from the send on",
                        )
                    )
                    break
    return out


def _owed(idx: HistoryIndex, key: tuple[str, str], s: str, until: int) -> bool:
    """Whether ``s`` should deliver multicast ``key`` that another member delivered at position ``until``:
    it was sent in a view ``s`` installed, and every view ``s`` installed from then up to ``until`` held the
    sender."""
    send = idx.sends.get(key)
    if send is None or send.view is None or send.dest is not None:
        return False
    views = idx.views.get(s, [])
    start = next((k for k, (_pos, vid, _m) in enumerate(views) if vid == send.view), None)
    if start is None:
        return False
    for pos, _vid, members in views[start:]:
        if pos > until:
            break
        if send.sender not in members:
            return False
    return True


# ---- state transfer (stacks with the "state" layer: vsync, total-order) ------------------------------------
#
# * ``state-transfer`` — a member's application state is the ordered list of multicasts it applied: those it
#   delivered, preceded, for a member that received a state, by the donor's list at the donor's cut. A donor
#   records a ``state`` event ``op: get`` (transfer, ``size`` = length of its list, ``digest`` of the bytes) at
#   the cut; the joiner records ``op: set`` (donor, transfer, size, digest) when it takes the state, and
#   ``deliver`` events with ``via: "state"`` for multicasts it received that the state already held. Then:
#
#   1. every ``set`` matches the donor's ``get`` for that transfer, with the same digest and size (the bytes
#      arrived intact), and a donor's recorded size equals the length of its list as the history shows it;
#   2. a member that asked for state (``op: request``) delivers no multicast before its ``set`` (it holds them),
#      and a ``via: state`` delivery names a multicast that is in its state;
#   3. the cut is consistent — what the joiner applies after its ``set`` continues exactly where the donor's
#      state ended: for every sender, the joiner's list and the donor's list (each counted only while the
#      other is in its views, and after the cut) agree, one being a prefix of the other. A message lost at the
#      cut (the donor's state too old), or applied twice (in the state and delivered again), breaks it.


def check_state_transfer(history: History | HistoryIndex) -> list[Violation]:  # noqa: C901  one pass over the history: deliveries and state events share the per-member logs
    idx = index_of(history)
    out: list[Violation] = []
    Entry = tuple[str, str]  # (sender, msg)
    logs: dict[str, list[Entry]] = {}
    positions: dict[str, list[int]] = {}
    contents: dict[str, set[Entry]] = {}
    gets: dict[tuple[str, str, int], tuple[int, Any, Any, int]] = {}  # (donor, joiner, tid) -> (len, digest, size, pos)
    requested: set[str] = set()
    state_set: set[str] = set()
    early: set[str] = set()
    # (joiner, donor, cut length, set position, get position)
    transfers: list[tuple[str, str, int, int, int]] = []
    for pos, ev in enumerate(idx.events):
        kind = ev.kind
        m = ev.member
        if kind == "deliver":
            if ev.data.get("dest") is not None:
                continue
            key = (event_str(ev, pos, "sender"), event_str(ev, pos, "msg"))
            if ev.data.get("via") == "state":
                if m not in state_set:
                    out.append(Violation("state-transfer", m, f"{_fmt_msg(key)} counted as in a state it never set"))
                elif key not in contents.get(m, ()):
                    out.append(
                        Violation("state-transfer", m, f"{_fmt_msg(key)} counted as in the state, which lacks it")
                    )
                continue
            if m in requested and m not in state_set and m not in early:
                early.add(m)
                out.append(Violation("state-transfer", m, f"delivered {_fmt_msg(key)} before its state was set"))
            if m in state_set and key in contents.get(m, ()):
                out.append(Violation("state-transfer", m, f"applied {_fmt_msg(key)} twice (its state had it)"))
            logs.setdefault(m, []).append(key)
            positions.setdefault(m, []).append(pos)
            contents.setdefault(m, set()).add(key)
        elif kind == "state":
            op = event_field(ev, pos, "op")
            if op == "request":
                requested.add(m)
            elif op == "get":
                transfer = event_field(ev, pos, "transfer")
                if not isinstance(transfer, list) or len(transfer) != 2:
                    raise HistoryFormatError(f"history event #{pos} (state get by {m}): transfer must be [joiner, id]")
                n = len(logs.get(m, ()))
                size = ev.data.get("size")
                if size != n:
                    out.append(
                        Violation(
                            "state-transfer",
                            m,
                            f"state for {transfer[0]} has {size} entries, but the history shows {n} multicasts applied",
                        )
                    )
                gets[(m, str(transfer[0]), int(transfer[1]))] = (n, ev.data.get("digest"), size, pos)
            elif op == "set":
                donor = ev.data.get("donor")
                state_set.add(m)
                if donor is None:
                    continue  # founded the group: starts empty
                transfer = event_field(ev, pos, "transfer")
                got = gets.get((str(donor), m, int(transfer[1]))) if isinstance(transfer, list) else None
                if got is None:
                    out.append(Violation("state-transfer", m, f"set a state {donor} never took for it ({transfer})"))
                    continue
                n, digest, size, get_pos = got
                if digest != ev.data.get("digest") or size != ev.data.get("size"):
                    out.append(
                        Violation(
                            "state-transfer",
                            m,
                            f"set state {transfer} from {donor} with digest {ev.data.get('digest')} and size "
                            f"{ev.data.get('size')}; the donor took digest {digest} and size {size}",
                        )
                    )
                    continue
                logs[m] = list(logs.get(str(donor), [])[:n])
                positions[m] = [pos] * n
                contents[m] = set(logs[m])
                transfers.append((m, str(donor), n, pos, get_pos))
    for joiner, donor, n, _set_pos, _get_pos in transfers:
        out += _check_cut(idx, joiner, donor, n, logs, positions, contents)
    return out


def _check_cut(
    idx: HistoryIndex,
    joiner: str,
    donor: str,
    n: int,
    logs: dict[str, list[tuple[str, str]]],
    positions: dict[str, list[int]],
    contents: dict[str, set[tuple[str, str]]],
) -> list[Violation]:
    """Whether ``joiner`` and ``donor`` applied the same messages per sender after the state's cut at ``n``."""
    out: list[Violation] = []
    j_log, d_log = logs.get(joiner, []), logs.get(donor, [])
    # Each side's stretch together with the other after the cut (see _together), before any filtering.
    j_run = _together(idx, joiner, donor, j_log, positions.get(joiner, []), n)
    d_run = _together(idx, donor, joiner, d_log, positions.get(donor, []), n)
    j_kept, d_kept = set(j_run), set(d_run)
    # A message one side applied after the cut, but outside its stretch together, says nothing about the
    # cut: the joiner applied it while apart from the donor (a sequencer delivers a view's leftovers in the
    # joiner's view of its own; the donor applies the same message while still counting the joiner in),
    # or the donor applied it after the two parted. It is left out on both sides.
    j_apart = set(j_log[n:]) - j_kept
    d_apart = set(d_log[n:]) - d_kept
    d_all = contents.get(donor, set())
    j_all = contents.get(joiner, set())
    # The joiner's side counts only messages the donor applied too: after a merge, a joiner that was apart
    # from the donor finishes its partition's messages, which the donor never sees (no loss: divergence).
    ours = _per_sender(key for key in j_run if key in d_all and key not in d_apart)
    # The donor's side counts only messages the joiner could have had: sent in a view the joiner installed
    # (or applied by it). A sequencer replays an epoch the joiner was never in to the donor after a merge.
    joiner_views = {vid for _pos, vid, _m in idx.views.get(joiner, [])}
    theirs = _per_sender(
        key
        for key in d_run
        if (key in j_all and key not in j_apart)
        or (key not in j_all and idx.sends.get(key) and idx.sends[key].view in joiner_views)
    )
    for sender in sorted(set(ours) & set(theirs)):
        a, b = ours[sender], theirs[sender]
        k = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
        if k is not None:
            out.append(
                Violation(
                    "state-transfer",
                    joiner,
                    f"after the state from {donor} (cut at {n} multicasts), applied {a[k]!r} from {sender} "
                    f"where the donor applied {b[k]!r} (entry {k} after the cut; the cut lost or repeated one)",
                )
            )
            break
    return out


def _per_sender(keys: Iterable[tuple[str, str]]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for sender, msg in keys:
        out.setdefault(sender, []).append(msg)
    return out


def _together(
    idx: HistoryIndex,
    member: str,
    other: str,
    log: list[tuple[str, str]],
    positions: list[int],
    start: int,
) -> list[tuple[str, str]]:
    """The messages of ``log[start:]`` that ``member`` applied while ``other`` was in its view: from the first
    such one up to the first view without ``other`` installed after it (a joiner that was apart from the donor
    before the merge that brought them together applies its partition's messages first; across a partition
    the two states diverge by nature, so neither part is compared — nor what follows a later merge, even if
    ``member`` applied nothing while apart: it may have missed the tail of the view before the split, which
    the other applied, and virtual synchrony asks for the same messages only of members that move to the same
    next view)."""
    view_pos = idx.view_positions.get(member, [])
    views = idx.views.get(member, [])
    end = idx.ended.get(member, len(idx.events))
    out: list[tuple[str, str]] = []
    checked = -1  # once started: the last view index known to hold ``other`` since the first compared message
    for k in range(start, len(log)):
        pos = positions[k]
        if pos >= end:
            break
        v = bisect.bisect_right(view_pos, pos) - 1
        if checked < 0:
            if v < 0 or other not in views[v][2]:
                continue
        elif any(other not in views[i][2] for i in range(checked + 1, v + 1)):
            break
        checked = v
        out.append(log[k])
    return out


# Properties that only some stacks promise, by stack preset name.
STACK_CHECKERS: dict[str, dict[str, Checker]] = {
    "vsync": {"virtual-synchrony": check_virtual_synchrony, "state-transfer": check_state_transfer},
    # total-order is vsync plus a sequencer: it promises virtual synchrony too.
    "total-order": {
        "virtual-synchrony": lambda idx: check_virtual_synchrony(idx, merged_earlier=True),
        "total-order": check_total_order,
        "crashed-prefix": check_crashed_prefix,
        "state-transfer": check_state_transfer,
    },
}
