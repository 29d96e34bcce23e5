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
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from .history import History, HistoryEvent

# A view id as a hashable value: (seq, creator address string).
VidKey = tuple[int, str]

# Kinds that end a member (an address is one incarnation; a restart is a new address).
_ENDING_KINDS = frozenset({"crash", "leave", "left"})


class HistoryFormatError(ValueError):
    """A history event lacks a field a checker needs, or the field has the wrong type."""


@dataclass(frozen=True, slots=True)
class Violation:
    """One broken property: which, seen at which member, and what exactly."""

    property: str
    member: str
    detail: str

    def __str__(self) -> str:
        return f"{self.property}: {self.member}: {self.detail}"

    def to_json(self) -> dict[str, str]:
        return {"property": self.property, "member": self.member, "detail": self.detail}


def _field(ev: HistoryEvent, pos: int, name: str) -> Any:
    try:
        return ev.data[name]
    except KeyError:
        raise HistoryFormatError(f"history event #{pos} ({ev.kind} by {ev.member}): missing field {name!r}") from None


def _vid(ev: HistoryEvent, pos: int, name: str) -> VidKey | None:
    raw = _field(ev, pos, name)
    if raw is None:
        return None
    if (
        not isinstance(raw, list | tuple)
        or len(raw) != 2
        or not isinstance(raw[0], int)
        or isinstance(raw[0], bool)
        or not isinstance(raw[1], str)
    ):
        raise HistoryFormatError(
            f"history event #{pos} ({ev.kind} by {ev.member}): {name} must be [seq, creator], got {raw!r}"
        )
    return (raw[0], raw[1])


def _opt_str(ev: HistoryEvent, pos: int, name: str) -> str | None:
    raw = _field(ev, pos, name)
    if raw is not None and not isinstance(raw, str):
        raise HistoryFormatError(f"history event #{pos} ({ev.kind} by {ev.member}): {name} must be a string or null")
    return raw


def _str(ev: HistoryEvent, pos: int, name: str) -> str:
    raw = _field(ev, pos, name)
    if not isinstance(raw, str):
        raise HistoryFormatError(f"history event #{pos} ({ev.kind} by {ev.member}): {name} must be a string")
    return raw


def _fmt_vid(vid: VidKey | None) -> str:
    return "none" if vid is None else f"{vid[1]}|{vid[0]}"


@dataclass(slots=True)
class _Send:
    pos: int
    t: float
    sender: str
    msg: str
    dest: str | None
    view: VidKey | None
    ordinal: int  # position among this sender's sends


@dataclass(slots=True)
class _Deliver:
    pos: int
    t: float
    receiver: str
    sender: str
    msg: str
    dest: str | None


class HistoryIndex:
    """One pass over a history, shared by the checkers: sends, deliveries, views and ends by member."""

    def __init__(self, history: History | Iterable[HistoryEvent]) -> None:
        self.events: list[HistoryEvent] = list(history.events if isinstance(history, History) else history)
        self.sends: dict[tuple[str, str], _Send] = {}
        self.duplicate_sends: list[_Send] = []
        self.deliveries: list[_Deliver] = []
        # member -> [(pos, view id, members)] in the order installed
        self.views: dict[str, list[tuple[int, VidKey, tuple[str, ...]]]] = {}
        self.view_positions: dict[str, list[int]] = {}
        self.members: dict[str, int] = {}  # every member that recorded something -> first position
        self.ended: dict[str, int] = {}  # member -> position of its first crash/leave/left
        self.last_t = 0.0
        ordinals: dict[str, int] = {}
        for pos, ev in enumerate(self.events):
            member = ev.member
            if member not in self.members:
                self.members[member] = pos
            if ev.t > self.last_t:
                self.last_t = ev.t
            kind = ev.kind
            if kind == "deliver":
                self.deliveries.append(
                    _Deliver(
                        pos,
                        ev.t,
                        member,
                        _str(ev, pos, "sender"),
                        _str(ev, pos, "msg"),
                        _opt_str(ev, pos, "dest"),
                    )
                )
            elif kind == "send":
                n = ordinals.get(member, 0)
                ordinals[member] = n + 1
                send = _Send(
                    pos, ev.t, member, _str(ev, pos, "msg"), _opt_str(ev, pos, "dest"), _vid(ev, pos, "view"), n
                )
                key = (member, send.msg)
                if key in self.sends:
                    self.duplicate_sends.append(send)
                else:
                    self.sends[key] = send
            elif kind == "view":
                vid = _vid(ev, pos, "view_id")
                members = _field(ev, pos, "members")
                if vid is None or not isinstance(members, list) or not all(isinstance(m, str) for m in members):
                    raise HistoryFormatError(
                        f"history event #{pos} (view by {member}): needs view_id [seq, creator] and members [str]"
                    )
                self.views.setdefault(member, []).append((pos, vid, tuple(members)))
                self.view_positions.setdefault(member, []).append(pos)
            elif kind in _ENDING_KINDS and member not in self.ended:
                self.ended[member] = pos
        self._suffix: dict[str, list[frozenset[str]]] = {}

    def live_members(self) -> set[str]:
        """Members that recorded something and never crashed, left or asked to leave."""
        return {m for m in self.members if m not in self.ended}

    def suffix_common(self, member: str) -> list[frozenset[str]]:
        """For each of ``member``'s views k: the members present in every view it installed from k on."""
        cached = self._suffix.get(member)
        if cached is None:
            views = self.views.get(member, [])
            cached = [frozenset()] * len(views)
            acc: frozenset[str] | None = None
            for k in range(len(views) - 1, -1, -1):
                members = frozenset(views[k][2])
                acc = members if acc is None else acc & members
                cached[k] = acc
            self._suffix[member] = cached
        return cached


def _index(history: History | HistoryIndex | Iterable[HistoryEvent]) -> HistoryIndex:
    return history if isinstance(history, HistoryIndex) else HistoryIndex(history)


# ---- safety -------------------------------------------------------------------------------------------------


def check_view_agreement(history: History | HistoryIndex) -> list[Violation]:
    idx = _index(history)
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
                        f"view {_fmt_vid(vid)} has members [{', '.join(members)}] here but "
                        f"[{', '.join(seen[0])}] at {seen[1]}",
                    )
                )
            if prev is not None and vid[0] < prev[0]:
                out.append(
                    Violation(
                        "view-agreement",
                        member,
                        f"view seq went down: installed {_fmt_vid(vid)} after {_fmt_vid(prev)}",
                    )
                )
            if member not in members:
                out.append(Violation("view-agreement", member, f"installed view {_fmt_vid(vid)} without itself"))
            prev = vid
    return out


def check_fifo(history: History | HistoryIndex) -> list[Violation]:
    idx = _index(history)
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
    idx = _index(history)
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
    idx = _index(history)
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
    idx = _index(history)
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
                        f"never delivered {what} {send.msg!r} that {sender} sent in view {_fmt_vid(send.view)} "
                        f"(at t={send.t:.6f}), though both stayed in each other's views",
                    )
                )
    return out


# ---- liveness -----------------------------------------------------------------------------------------------


def check_merge_convergence(history: History | HistoryIndex, live: Iterable[str] | None = None) -> list[Violation]:
    """The live members' last views are one view with exactly the live members (``live`` defaults to
    every member that recorded something and neither crashed nor left)."""
    idx = _index(history)
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
            f"{', '.join(ms)} in {_fmt_vid(v[0])} [{', '.join(v[1])}]"
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
            out.append(Violation("merge-convergence", ms[0], f"last view {_fmt_vid(vid)} {' and '.join(parts)}"))
    return out


def check_liveness_delivery(
    history: History | HistoryIndex, since: float, live: Iterable[str] | None = None
) -> list[Violation]:
    """Every message a live member sent at or after ``since`` reached every live member (its target)."""
    idx = _index(history)
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


Checker = Callable[[HistoryIndex], list[Violation]]


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
    idx = _index(history)
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
                        f"moved from view {_fmt_vid(v1)} to {_fmt_vid(v2)} like {first_member} but delivered other "
                        f"messages in {_fmt_vid(v1)}: {len(only_first_set)} only at {first_member} (e.g. "
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


# Properties that only some stacks promise, by stack preset name.
STACK_CHECKERS: dict[str, dict[str, Checker]] = {
    "vsync": {"virtual-synchrony": check_virtual_synchrony},
}

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
    idx = _index(history)
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
    idx = _index(history)
    live_list = list(idx.live_members() if live is None else live)
    out = check_safety(idx)
    for checker in STACK_CHECKERS.get(stack or "", {}).values():
        out.extend(checker(idx))
    out.extend(check_merge_convergence(idx, live_list))
    if converged_at is not None:
        out.extend(check_liveness_delivery(idx, converged_at, live_list))
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
    idx = _index(history)
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
    idx = _index(history)
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


# total-order is vsync plus a sequencer: it promises virtual synchrony too.
STACK_CHECKERS["total-order"] = {
    "virtual-synchrony": lambda idx: check_virtual_synchrony(idx, merged_earlier=True),
    "total-order": check_total_order,
    "crashed-prefix": check_crashed_prefix,
}


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


def check_state_transfer(history: History | HistoryIndex) -> list[Violation]:
    idx = _index(history)
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
            key = (_str(ev, pos, "sender"), _str(ev, pos, "msg"))
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
            op = _field(ev, pos, "op")
            if op == "request":
                requested.add(m)
            elif op == "get":
                transfer = _field(ev, pos, "transfer")
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
                transfer = _field(ev, pos, "transfer")
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


STACK_CHECKERS["vsync"]["state-transfer"] = check_state_transfer
STACK_CHECKERS["total-order"]["state-transfer"] = check_state_transfer
