"""Consistent hash: stable key hashing, balance within ±1 of the fair share, minimal movement, strict wire."""

from __future__ import annotations

import math
import os

import msgpack
import pytest
from groupcluster.core.address import Address
from groupcluster.core.errors import WireError
from groupcluster.grid.consistent_hash import ConsistentHash, balanced, quotas, segment_of, segments_of
from hypothesis import example, given, settings
from hypothesis import strategies as st

# Derandomized and without the example database, so CI runs the same examples every time; GRID_HYPOTHESIS_SCALE=20
# multiplies the examples for a local search for new failures.
EXAMPLES_SCALE = int(os.environ.get("GRID_HYPOTHESIS_SCALE", "1"))


def m(i: int) -> Address:
    return Address("10.0.0.1", 7000 + i, i + 1)


def moved(a: ConsistentHash, b: ConsistentHash) -> int:
    """Owner slots that are new in ``b`` (data that must travel)."""
    return sum(len(set(nb) - set(na)) for na, nb in zip(a.owner_map(), b.owner_map(), strict=True))


def assert_balanced(ch: ConsistentHash, members: list[Address], caps: dict[Address, float]) -> None:
    prim_q, owner_q, k = quotas(members, caps, ch.num_segments, ch.num_owners)
    counts = ch.owned_counts()
    total_w = sum(caps.get(x, 1.0) for x in members)
    for x in members:
        p, o = counts.get(x, (0, 0))
        assert p == prim_q[x] and o == owner_q[x]
        fair_p = ch.num_segments * caps.get(x, 1.0) / total_w
        assert abs(p - fair_p) < 1 + 1e-9, (x, p, fair_p)
    for own in ch.owners:
        assert len(own) == k and len(set(own)) == k


def test_segment_of_is_stable_and_spreads() -> None:
    # Fixed values: a change here re-routes every key of every existing grid (and every client).
    assert segment_of(b"", 256) == segment_of(b"", 256)
    assert [segment_of(k, 256) for k in (b"a", b"key1", b"\x00\xff")] == segments_of([b"a", b"key1", b"\x00\xff"], 256)
    counts = [0] * 256
    for i in range(25600):
        counts[segment_of(f"key{i}".encode(), 256)] += 1
    assert min(counts) > 50 and max(counts) < 160


def test_segment_of_known_values() -> None:
    import hashlib

    for key in (b"x", b"hello", bytes(range(40))):
        expect = int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") % 256
        assert segment_of(key, 256) == expect


@pytest.mark.parametrize("n", [1, 2, 3, 5, 7, 16])
def test_fresh_ch_is_balanced(n: int) -> None:
    members = [m(i) for i in range(n)]
    ch = balanced(None, members, {})
    assert ch.num_segments == 256 and ch.num_owners == 2
    assert_balanced(ch, members, {})


def test_capacity_factors_weight_ownership() -> None:
    members = [m(0), m(1), m(2)]
    caps = {m(0): 1.0, m(1): 2.0, m(2): 1.0}
    ch = balanced(None, members, caps)
    assert_balanced(ch, members, caps)
    counts = ch.owned_counts()
    assert counts[m(1)][0] == 128 and counts[m(0)][0] == 64
    # Half of all 512 copies would be m(1)'s share: exactly one copy of every segment (the cap).
    assert counts[m(1)][1] == 256 and counts[m(0)][1] == counts[m(2)][1] == 128
    heavy = balanced(None, members, {m(0): 1.0, m(1): 5.0, m(2): 1.0})
    # Capped at 256 copies; the excess spreads over the others (who then own 128 each).
    assert heavy.owned_counts()[m(1)][1] == 256 and heavy.owned_counts()[m(0)][1] == 128


def test_zero_capacity_member_owns_nothing() -> None:
    members = [m(0), m(1), m(2)]
    caps = {m(2): 0.0}
    ch = balanced(None, members, caps)
    assert m(2) not in ch.owned_counts() or ch.owned_counts()[m(2)] == (0, 0)
    with pytest.raises(ValueError, match="capacity above 0"):
        balanced(None, [m(0)], {m(0): 0.0})


def test_join_moves_about_the_joiners_share() -> None:
    members = [m(i) for i in range(4)]
    ch = balanced(None, members, {})
    ch2 = balanced(ch.owner_map(), [*members, m(4)], {})
    assert_balanced(ch2, [*members, m(4)], {})
    joiner_share = ch2.owned_counts()[m(4)][1]
    assert moved(ch, ch2) <= joiner_share + 5
    # No primary moves between old members without need: most old primaries stay.
    same_primary = sum(1 for s in range(256) if ch.primary_of(s) == ch2.primary_of(s))
    assert same_primary >= 256 - ch2.owned_counts()[m(4)][0] - 5


def test_leave_promotes_backups_and_moves_only_the_lost_copies() -> None:
    members = [m(i) for i in range(5)]
    ch = balanced(None, members, {})
    lost_slots = ch.owned_counts()[m(2)][1]
    rest = [x for x in members if x != m(2)]
    ch2 = balanced(ch.owner_map(), rest, {})
    assert_balanced(ch2, rest, {})
    assert moved(ch, ch2) <= lost_slots + len(rest)
    # Where the leaver was primary, a surviving backup is promoted (no data has to move for reads).
    for s in range(256):
        if ch.primary_of(s) == m(2):
            assert ch2.primary_of(s) in ch.owners_of(s) or ch2.primary_of(s) not in ch.owners_of(s)
    promoted = sum(1 for s in range(256) if ch.primary_of(s) == m(2) and ch2.primary_of(s) in ch.owners_of(s))
    assert promoted >= ch.owned_counts()[m(2)][0] * 0.8


def test_unchanged_membership_changes_nothing() -> None:
    members = [m(i) for i in range(3)]
    ch = balanced(None, members, {})
    assert balanced(ch.owner_map(), members, {}).owner_map() == ch.owner_map()


def test_deterministic_for_same_input() -> None:
    members = [m(i) for i in range(6)]
    assert balanced(None, members, {}).owners == balanced(None, members, {}).owners


def test_fewer_members_than_owners() -> None:
    ch = balanced(None, [m(0)], {}, num_segments=16, num_owners=3)
    assert all(len(o) == 1 for o in ch.owners)
    ch2 = balanced(ch.owner_map(), [m(0), m(1)], {}, num_segments=16, num_owners=3)
    assert all(len(o) == 2 for o in ch2.owners)


@settings(max_examples=300 * EXAMPLES_SCALE, deadline=None, derandomize=True, database=None)
@given(
    n=st.integers(1, 9),
    segments=st.sampled_from([1, 7, 16, 64, 256]),
    owners=st.integers(1, 4),
    caps=st.lists(st.sampled_from([0.5, 1.0, 1.0, 2.0, 3.0]), min_size=9, max_size=9),
    changes=st.lists(st.tuples(st.booleans(), st.integers(0, 50)), max_size=6),
)
# Regression (found by hypothesis): a member leaves and three members must own every segment (capacity cap);
# the only segments lacking one of them were still short, so the old swap found no backup to move.
@example(n=6, segments=256, owners=4, caps=[1.0, 2.0, 3.0, 3.0, 3.0, 0.5, 0.5, 0.5, 0.5], changes=[(False, 0)])
# Regression (found by hypothesis with 20x examples): a joiner with capacity 2 took primaries where the small
# member was backup; greedy removals left the small member's excess nowhere to go but segments that had already
# changed, and 25 slots moved between old members (252 moved against a minimum of 227).
@example(n=3, segments=256, owners=2, caps=[0.5, 1.0, 1.0, 2.0, 0.5, 0.5, 0.5, 0.5, 0.5], changes=[(True, 0)])
def test_property_balanced_after_any_sequence_of_joins_and_leaves(
    n: int, segments: int, owners: int, caps: list[float], changes: list[tuple[bool, int]]
) -> None:
    next_id = n
    members = [m(i) for i in range(n)]
    capmap = {m(i): caps[i % 9] for i in range(100)}
    ch = balanced(None, members, capmap, segments, owners)
    assert_balanced(ch, members, capmap)
    for join, pick in changes:
        if join or len(members) == 1:
            new_members = [*members, m(next_id)]
            next_id += 1
        else:
            new_members = [x for x in members if x != members[pick % len(members)]]
        ch2 = balanced(ch.owner_map(), new_members, capmap, segments, owners)
        assert_balanced(ch2, new_members, capmap)
        # Near-minimal movement: new owner slots are what the change forces plus a few per member (rounding
        # of quotas, primaries handed to backups, co-owned segments of a departing member).
        _, old_q, _ = quotas(members, capmap, segments, owners)
        _, new_q, _ = quotas(new_members, capmap, segments, owners)
        forced = sum(max(0, new_q.get(x, 0) - old_q.get(x, 0)) for x in new_members)
        assert moved(ch, ch2) <= forced + 4 * len(new_members) + _swap_slack(ch, new_members)
        assert ConsistentHash.from_wire(ch2.to_wire()) == ch2
        members, ch = new_members, ch2


@settings(max_examples=300 * EXAMPLES_SCALE, deadline=None, derandomize=True, database=None)
@given(
    n=st.integers(1, 7),
    segments=st.sampled_from([1, 7, 16, 64, 256]),
    owners=st.integers(1, 3),
    caps=st.lists(st.sampled_from([0.0, 0.5, 1.0, 1.0, 2.0]), min_size=9, max_size=9),
    swaps=st.lists(st.tuples(st.integers(0, 255), st.integers(0, 8)), max_size=3),
    asked=st.sampled_from(["same", "join", "leave", "caps"]),
)
def test_property_is_balanced_means_balanced_keeps_it(
    n: int, segments: int, owners: int, caps: list[float], swaps: list[tuple[int, int]], asked: str
) -> None:
    """The planner skips balanced() where ``is_balanced`` holds: it must hold exactly where balanced() would
    keep the owners, for balanced CHs (then it must hold) and perturbed ones, asked about the same members,
    a joiner, one member fewer, or other capacities."""
    members = [m(i) for i in range(n)]
    capmap = {m(i): caps[i % 9] for i in range(100)}
    if not any(capmap[x] > 0 for x in members):
        capmap[members[0]] = 1.0
    ch = balanced(None, members, capmap, segments, owners)
    assert ch.is_balanced(members, capmap)
    owner_map = [list(own) for own in ch.owner_map()]
    for seg, who in swaps:  # move an owner slot to another member, or a primary behind its backup
        own = owner_map[seg % segments]
        x = m(who % (n + 1))
        if x in own:
            own.reverse()
        else:
            own[-1] = x
    asked_members, asked_caps = members, capmap
    if asked == "join":
        asked_members = [*members, m(n)]
    elif asked == "leave" and n > 1:
        asked_members = members[1:]
    elif asked == "caps":
        asked_caps = {**capmap, members[-1]: 3.0}
    if not any(asked_caps.get(x, 1.0) > 0 for x in asked_members):
        return
    try:
        perturbed = ConsistentHash.from_owner_map(segments, owners, owner_map, capmap)
    except ValueError:
        return  # a member twice in one segment: not a CH
    kept = balanced(perturbed.owner_map(), asked_members, asked_caps, segments, owners).owner_map()
    assert perturbed.is_balanced(asked_members, asked_caps) == (kept == perturbed.owner_map())


def _swap_slack(ch: ConsistentHash, members: list[Address]) -> int:
    # A member that must gain segments cannot take one it already co-owns; the swap that fixes this moves one
    # more slot per co-owned segment of a departing member (bounded by its ownership).
    gone = [x for x in ch.members if x not in members]
    return sum(ch.owned_counts().get(x, (0, 0))[1] for x in gone)


# ---- wire -------------------------------------------------------------------------------------------------


def test_wire_round_trip_through_msgpack() -> None:
    ch = balanced(None, [m(0), m(1), m(2)], {m(1): 2.0})
    data = msgpack.unpackb(msgpack.packb(ch.to_wire()), raw=False)
    assert ConsistentHash.from_wire(data) == ch


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda w: w.__setitem__(0, 0), "num_segments"),
        (lambda w: w.__setitem__(1, 99), "num_owners"),
        (lambda w: w.__setitem__(2, []), "members"),
        (lambda w: w.__setitem__(3, [1.0]), "capacities"),
        (lambda w: w[3].__setitem__(0, -1.0), r"capacities\[0\]"),
        (lambda w: w[3].__setitem__(0, "x"), r"capacities\[0\]"),
        (lambda w: w[4].pop(), "owners"),
        (lambda w: w[4].__setitem__(3, [0, 0]), r"owners\[3\]"),
        (lambda w: w[4].__setitem__(5, [7]), r"owners\[5\]"),
        (lambda w: w[4].__setitem__(5, []), r"owners\[5\]"),
        (lambda w: w[4].__setitem__(5, [0, 1, 2]), r"owners\[5\]"),
        (lambda w: w[2].__setitem__(1, w[2][0]), "listed twice"),
        # Owner lists equal to valid ones but not of ints (True == 1, 1.0 == 1), and the first bad segment named
        # when several are (owner lists are checked once per distinct list).
        (lambda w: w[4].__setitem__(6, [True, 0] if w[4][6] == [1, 0] else [1.0, 0]), r"owners\[6\].*index"),
        (lambda w: w[4].__setitem__(9, "x"), r"owners\[9\]"),
        (lambda w: w[4].__setitem__(9, [[0]]), r"owners\[9\]"),
        (lambda w: (w[4].__setitem__(8, [9]), w[4].__setitem__(4, [9])), r"owners\[4\]: member index 9"),
    ],
)
def test_wire_rejects_bad_fields(mutate, message: str) -> None:  # type: ignore[no-untyped-def]
    ch = balanced(None, [m(0), m(1), m(2)], {}, num_segments=16)
    w = msgpack.unpackb(msgpack.packb(ch.to_wire()), raw=False)
    mutate(w)
    with pytest.raises(WireError, match=message):
        ConsistentHash.from_wire(w)


def test_local_construction_is_checked_too() -> None:
    with pytest.raises(ValueError, match="owners"):
        ConsistentHash(4, 2, (m(0),), (1.0,), ((0,), (0,), (0,)))
    with pytest.raises(ValueError, match="capacities"):
        ConsistentHash(1, 2, (m(0),), (math.inf,), ((0,),))


def test_joiner_with_larger_capacity_moves_only_its_own_share() -> None:
    # The case above, exactly: only the joiner gains slots, and exactly its quota.
    caps = {m(0): 0.5, m(1): 1.0, m(2): 1.0, m(3): 2.0}
    ch = balanced(None, [m(0), m(1), m(2)], caps)
    ch2 = balanced(ch.owner_map(), [m(0), m(1), m(2), m(3)], caps)
    _, new_q, _ = quotas([m(0), m(1), m(2), m(3)], caps, 256, 2)
    gained = {x: 0 for x in ch2.members}
    for old, new in zip(ch.owner_map(), ch2.owner_map(), strict=True):
        for x in set(new) - set(old):
            gained[x] += 1
    assert gained == {m(0): 0, m(1): 0, m(2): 0, m(3): new_q[m(3)]}
