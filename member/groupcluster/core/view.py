"""Views: the agreed membership of the group at one moment, named by a view id.

A view id is (sequence number, creator). Two views with the same id always have the same members in the
same order, because a creator never reuses a sequence number (a restarted member is a new address).
The coordinator is the first member.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .address import Address
from .validate import as_address, as_address_list, as_int, as_list


@dataclass(frozen=True, order=True, slots=True)
class ViewId:
    seq: int
    creator: Address

    def to_wire(self) -> list[Any]:
        return [self.seq, self.creator.to_wire()]

    @classmethod
    def from_wire(cls, data: Any, field_name: str = "view_id") -> ViewId:
        items = as_list(data, field_name, 2, exact=2)
        return cls(as_int(items[0], f"{field_name}.seq"), as_address(items[1], f"{field_name}.creator"))

    def __str__(self) -> str:
        return f"{self.creator}|{self.seq}"


@dataclass(frozen=True, slots=True)
class View:
    view_id: ViewId
    members: tuple[Address, ...]
    # For a merge view: the member lists of the subgroups that merged (empty otherwise).
    subgroups: tuple[tuple[Address, ...], ...] = field(default=())

    @property
    def coordinator(self) -> Address:
        return self.members[0]

    @property
    def is_merge(self) -> bool:
        return bool(self.subgroups)

    def __contains__(self, addr: object) -> bool:
        return addr in self.members

    def __len__(self) -> int:
        return len(self.members)

    def to_wire(self) -> list[Any]:
        return [
            self.view_id.to_wire(),
            [m.to_wire() for m in self.members],
            [[m.to_wire() for m in sub] for sub in self.subgroups],
        ]

    @classmethod
    def from_wire(cls, data: Any, field_name: str = "view") -> View:
        items = as_list(data, field_name, 3, exact=3)
        members = as_address_list(items[1], f"{field_name}.members")
        if not members:
            from .errors import WireError

            raise WireError(f"{field_name}.members: a view cannot be empty")
        subs = as_list(items[2], f"{field_name}.subgroups", 4096)
        return cls(
            ViewId.from_wire(items[0], f"{field_name}.view_id"),
            members,
            tuple(as_address_list(s, f"{field_name}.subgroups[{i}]") for i, s in enumerate(subs)),
        )

    def __str__(self) -> str:
        kind = "MergeView" if self.subgroups else "View"
        return f"{kind}[{self.view_id}] ({len(self.members)}) [{', '.join(map(str, self.members))}]"
