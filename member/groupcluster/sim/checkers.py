"""Property checkers: judge a :class:`~groupcluster.sim.history.History`, never the protocol code.

Each checker reads only history events (see :mod:`groupcluster.sim.history`), so the same code judges a
simulated run and JSON lines recorded by real member processes. A checker returns a list of
:class:`Violation`; an empty list means the property held.

Safety properties (hold at every moment, faults or not):

* ``view-agreement`` — two views with the same id have the same members in the same order; a member's
  successive view sequence numbers never decrease; a member's views contain itself.
* ``fifo`` — per receiver and sender, multicasts (and unicasts to that receiver) are delivered in the order
  the sender sent them.
* ``no-duplicates`` — a receiver delivers a message at most once.
* ``no-creation`` — every delivered message was sent by its sender (a unicast, to that receiver).
* ``reliable-delivery`` — if S sent m in view V, R is in V and installed V, every view R installed from then
  on contains S, every view S installed after sending contains R, and neither crashed nor left, then R
  delivered m (R may be S).

Liveness properties (judged at the end of a run whose faults healed):

* ``merge-convergence`` — the live members' last views are one view containing exactly the live members.
* ``liveness-delivery`` — what live members sent after the group converged reached every live member.

The properties only some stacks promise (virtual synchrony, total order, state transfer) are in
:mod:`groupcluster.sim.stack_checkers`; the index every checker reads is
:mod:`groupcluster.sim.history_index`.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable

from .history import History
from .history_index import Checker, HistoryIndex, VidKey, Violation, fmt_vid, index_of
from .stack_checkers import STACK_CHECKERS

# ---- safety -------------------------------------------------------------------------------------------------


def check_view_agreement(history: History | HistoryIndex) -> list[Violation]:
    idx = index_of(history)
    out: list[Violation] = []
    first: dict[VidKey, tuple[tuple[str, ...], str]] = {}
    for member, views in idx.views.items():
        prev: VidKey | None = None
        for _pos, vid, members in views:
            seen = first.get(vid)
            if seen is None:
                first[vid] = (members, member)
            elif seen[0] != members:
                out.append(
                    Violation(
                        "view-agreement",
                        member,
                        f"view {fmt_vid(vid)} has members [{', '.join(members)}] here but "
                        f"[{', '.join(seen[0])}] at {seen[1]}",
                    )
                )
            if prev is not None and vid[0] < prev[0]:
                out.append(
                    Violation(
                        "view-agreement",
                        member,
                        f"view seq went down: installed {fmt_vid(vid)} after {fmt_vid(prev)}",
                    )
                )
            if member not in members:
                out.append(Violation("view-agreement", member, f"installed view {fmt_vid(vid)} without itself"))
            prev = vid
    return out


def check_fifo(history: History | HistoryIndex) -> list[Violation]:
    idx = index_of(history)
    out: list[Violation] = []
    # (receiver, sender, multicast?) -> (ordinal, msg) of the last delivery
    last: dict[tuple[str, str, bool], tuple[int, str]] = {}
    sends = idx.sends
    for d in idx.deliveries:
        send = sends.get((d.sender, d.msg))
        if send is None:
            continue  # judged by no-creation
        key = (d.receiver, d.sender, d.dest is None)
        prev = last.get(key)
        if prev is not None and send.ordinal < prev[0]:
            what = "multicast" if d.dest is None else "unicast"
            out.append(
                Violation(
                    "fifo",
                    d.receiver,
                    f"{what} {d.msg!r} from {d.sender} delivered after {prev[1]!r}, which the sender sent later",
                )
            )
        if prev is None or send.ordinal > prev[0]:
            last[key] = (send.ordinal, d.msg)
    return out


def check_no_duplicates(history: History | HistoryIndex) -> list[Violation]:
    idx = index_of(history)
    out: list[Violation] = []
    seen: set[tuple[str, str, str]] = set()
    for d in idx.deliveries:
        key = (d.receiver, d.sender, d.msg)
        if key in seen:
            out.append(Violation("no-duplicates", d.receiver, f"delivered {d.msg!r} from {d.sender} again"))
        else:
            seen.add(key)
    for s in idx.duplicate_sends:
        # Not a protocol fault, but it makes the other checks ambiguous: say so.
        out.append(Violation("no-duplicates", s.sender, f"the history has two sends of message id {s.msg!r}"))
    return out


def check_no_creation(history: History | HistoryIndex) -> list[Violation]:
    idx = index_of(history)
    out: list[Violation] = []
    sends = idx.sends
    for d in idx.deliveries:
        send = sends.get((d.sender, d.msg))
        if send is None:
            out.append(Violation("no-creation", d.receiver, f"delivered {d.msg!r} from {d.sender}, who never sent it"))
        elif send.dest is None and d.dest is not None:
            out.append(
                Violation("no-creation", d.receiver, f"{d.msg!r} from {d.sender} was a multicast, delivered as unicast")
            )
        elif send.dest is not None and (d.dest is None or send.dest != d.receiver):
            out.append(
                Violation(
                    "no-creation",
                    d.receiver,
                    f"{d.msg!r} from {d.sender} was a unicast to {send.dest}, delivered here "
                    f"as {'a multicast' if d.dest is None else 'a unicast to ' + d.dest}",
                )
            )
    return out


def check_reliable_delivery(history: History | HistoryIndex) -> list[Violation]:
    idx = index_of(history)
    out: list[Violation] = []
    delivered = {(d.receiver, d.sender, d.msg) for d in idx.deliveries}
    view_members: dict[VidKey, tuple[str, ...]] = {}
    installed_at: dict[str, dict[VidKey, int]] = {}  # member -> view id -> index of first install
    for member, views in idx.views.items():
        firsts: dict[VidKey, int] = {}
        for k, (_pos, vid, vmembers) in enumerate(views):
            view_members.setdefault(vid, vmembers)
            firsts.setdefault(vid, k)
        installed_at[member] = firsts
    ended = idx.ended
    for send in idx.sends.values():
        sender = send.sender
        if send.view is None or sender in ended:
            continue
        members = view_members.get(send.view)
        if members is None:
            continue
        # Members in every view the sender installed after sending (None: it installed none, no constraint).
        s_positions = idx.view_positions.get(sender, [])
        k_s = bisect.bisect_right(s_positions, send.pos)
        s_common: frozenset[str] | None = idx.suffix_common(sender)[k_s] if k_s < len(s_positions) else None
        targets = members if send.dest is None else ((send.dest,) if send.dest in members else ())
        for receiver in targets:
            if receiver in ended:
                continue
            k_r = installed_at.get(receiver, {}).get(send.view)
            if k_r is None or sender not in idx.suffix_common(receiver)[k_r]:
                continue
            if s_common is not None and receiver not in s_common:
                continue
            if (receiver, sender, send.msg) not in delivered:
                what = "multicast" if send.dest is None else "unicast"
                out.append(
                    Violation(
                        "reliable-delivery",
                        receiver,
                        f"never delivered {what} {send.msg!r} that {sender} sent in view {fmt_vid(send.view)} "
                        f"(at t={send.t:.6f}), though both stayed in each other's views",
                    )
                )
    return out


# ---- liveness -----------------------------------------------------------------------------------------------


def check_merge_convergence(history: History | HistoryIndex, live: Iterable[str] | None = None) -> list[Violation]:
    """The live members' last views are one view with exactly the live members (``live`` defaults to
    every member that recorded something and neither crashed nor left)."""
    idx = index_of(history)
    live_set = set(idx.live_members() if live is None else live)
    if not live_set:
        return [Violation("merge-convergence", "-", "no live member at the end")]
    out: list[Violation] = []
    last: dict[str, tuple[VidKey, tuple[str, ...]]] = {}
    for member in sorted(live_set):
        views = idx.views.get(member)
        if not views:
            out.append(Violation("merge-convergence", member, "live at the end but never installed a view"))
            continue
        _pos, vid, members = views[-1]
        last[member] = (vid, members)
    groups: dict[tuple[VidKey, tuple[str, ...]], list[str]] = {}
    for member, view in last.items():
        groups.setdefault(view, []).append(member)
    if len(groups) > 1:
        summary = "; ".join(
            f"{', '.join(ms)} in {fmt_vid(v[0])} [{', '.join(v[1])}]"
            for v, ms in sorted(groups.items(), key=lambda kv: kv[1])
        )
        out.append(Violation("merge-convergence", "-", f"live members ended in {len(groups)} views: {summary}"))
    for (vid, members), ms in groups.items():
        missing = sorted(live_set - set(members))
        extra = sorted(set(members) - live_set)
        if missing or extra:
            parts = []
            if missing:
                parts.append(f"lacks live {', '.join(missing)}")
            if extra:
                parts.append(f"has non-live {', '.join(extra)}")
            out.append(Violation("merge-convergence", ms[0], f"last view {fmt_vid(vid)} {' and '.join(parts)}"))
    return out


def check_liveness_delivery(
    history: History | HistoryIndex, since: float, live: Iterable[str] | None = None
) -> list[Violation]:
    """Every message a live member sent at or after ``since`` reached every live member (its target)."""
    idx = index_of(history)
    live_set = set(idx.live_members() if live is None else live)
    delivered = {(d.receiver, d.sender, d.msg) for d in idx.deliveries}
    out: list[Violation] = []
    for send in idx.sends.values():
        if send.t < since or send.sender not in live_set:
            continue
        targets = sorted(live_set) if send.dest is None else ([send.dest] if send.dest in live_set else [])
        missing = [r for r in targets if (r, send.sender, send.msg) not in delivered]
        if missing:
            out.append(
                Violation(
                    "liveness-delivery",
                    send.sender,
                    f"{'multicast' if send.dest is None else 'unicast'} {send.msg!r} sent at t={send.t:.6f} "
                    f"after convergence never reached {', '.join(missing)}",
                )
            )
    return out


SAFETY_CHECKERS: dict[str, Checker] = {
    "view-agreement": check_view_agreement,
    "fifo": check_fifo,
    "no-duplicates": check_no_duplicates,
    "no-creation": check_no_creation,
    "reliable-delivery": check_reliable_delivery,
}

LIVENESS_PROPERTIES = ("merge-convergence", "liveness-delivery")


def check_safety(history: History | HistoryIndex, skip: Iterable[str] = ()) -> list[Violation]:
    """Run every safety checker (except those named in ``skip``) over one index of ``history``."""
    skipped = set(skip)
    unknown = skipped - set(SAFETY_CHECKERS)
    if unknown:
        raise ValueError(
            f"unknown checker(s) {', '.join(sorted(unknown))}; allowed values: {', '.join(SAFETY_CHECKERS)}"
        )
    idx = index_of(history)
    out: list[Violation] = []
    for name, checker in SAFETY_CHECKERS.items():
        if name not in skipped:
            out.extend(checker(idx))
    return out


def check_all(
    history: History | HistoryIndex,
    *,
    live: Iterable[str] | None = None,
    converged_at: float | None = None,
    stack: str | None = None,
) -> list[Violation]:
    """Safety checkers (plus those of ``stack``), merge convergence, and liveness delivery after ``converged_at``."""
    idx = index_of(history)
    live_list = list(idx.live_members() if live is None else live)
    out = check_safety(idx)
    for checker in STACK_CHECKERS.get(stack or "", {}).values():
        out.extend(checker(idx))
    out.extend(check_merge_convergence(idx, live_list))
    if converged_at is not None:
        out.extend(check_liveness_delivery(idx, converged_at, live_list))
    return out
