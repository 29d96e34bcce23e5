"""Digests: per member, the highest sequence number delivered and the highest received (NAKACK state).

A digest is what a joiner needs to know where each member's stream starts, what STABLE gossips to find
messages everyone has delivered, and what a merge combines.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from .address import Address
from .errors import WireError
from .validate import as_address, as_int, as_list


class Digest(Mapping[Address, tuple[int, int]]):
    """Immutable mapping member -> (highest_delivered, highest_received)."""

    __slots__ = ("_entries",)

    def __init__(self, entries: Mapping[Address, tuple[int, int]] | Iterable[tuple[Address, tuple[int, int]]]):
        self._entries: dict[Address, tuple[int, int]] = dict(entries)

    def __getitem__(self, key: Address) -> tuple[int, int]:
        return self._entries[key]

    def __iter__(self) -> Iterator[Address]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def delivered(self, member: Address) -> int:
        return self._entries[member][0]

    def received(self, member: Address) -> int:
        return self._entries[member][1]

    def same_members(self, other: Digest) -> bool:
        return self._entries.keys() == other._entries.keys()

    def merge_min_delivered_max_received(self, other: Digest) -> Digest:
        """Combine two digests over the same members: what both delivered, what either received."""
        out = {}
        for m, (d, r) in self._entries.items():
            od, orr = other._entries.get(m, (d, r))
            out[m] = (min(d, od), max(r, orr))
        return Digest(out)

    def union(self, other: Digest) -> Digest:
        """Entries of both; for a member in both, the larger values (used when merging subgroups)."""
        out = dict(self._entries)
        for m, (d, r) in other._entries.items():
            if m in out:
                od, orr = out[m]
                out[m] = (max(d, od), max(r, orr))
            else:
                out[m] = (d, r)
        return Digest(out)

    def to_wire(self) -> list[Any]:
        return [[m.to_wire(), d, r] for m, (d, r) in self._entries.items()]

    @classmethod
    def from_wire(cls, data: Any, field_name: str = "digest") -> Digest:
        entries: dict[Address, tuple[int, int]] = {}
        for i, item in enumerate(as_list(data, field_name, 4096)):
            parts = as_list(item, f"{field_name}[{i}]", 3, exact=3)
            addr = as_address(parts[0], f"{field_name}[{i}].member")
            delivered = as_int(parts[1], f"{field_name}[{i}].delivered")
            received = as_int(parts[2], f"{field_name}[{i}].received")
            if delivered > received:
                raise WireError(f"{field_name}[{i}]: delivered {delivered} > received {received}")
            entries[addr] = (delivered, received)
        return cls(entries)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Digest) and self._entries == other._entries

    def __hash__(self) -> int:
        return hash(frozenset(self._entries.items()))

    def __repr__(self) -> str:
        inner = ", ".join(f"{m}: {d}/{r}" for m, (d, r) in self._entries.items())
        return f"Digest({inner})"
