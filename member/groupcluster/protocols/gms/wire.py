"""GMS's wire form: the message kinds and :class:`GmsHeader` with its codec."""

from __future__ import annotations

from typing import Any

from ...core import protocol_ids
from ...core.address import Address
from ...core.digest import Digest
from ...core.errors import WireError
from ...core.message import Header, register_header
from ...core.validate import as_address, as_int, as_list, as_str
from ...core.view import View, ViewId

JOIN_REQ, JOIN_RSP, VIEW, VIEW_ACK, LEAVE_REQ, SUSPECT = 0, 1, 2, 3, 4, 5
MERGE_REQ, MERGE_RSP, INSTALL_MERGE_VIEW, CANCEL_MERGE = 6, 7, 8, 9
FLUSH_REQ = 10  # a member asks the coordinator for a group flush (FlushGroup)
KIND_NAMES = (
    "JOIN_REQ",
    "JOIN_RSP",
    "VIEW",
    "VIEW_ACK",
    "LEAVE_REQ",
    "SUSPECT",
    "MERGE_REQ",
    "MERGE_RSP",
    "INSTALL_MERGE_VIEW",
    "CANCEL_MERGE",
    "FLUSH_REQ",
)

MergeId = tuple[Address, int]


@register_header
class GmsHeader(Header):
    """All GMS messages: a kind and the fields that kind uses (unused fields travel as nil)."""

    PROTO_ID = protocol_ids.GMS
    __slots__ = ("digest", "kind", "member", "merge_id", "reason", "seqno", "view", "view_id")

    def __init__(
        self,
        kind: int,
        *,
        view: View | None = None,
        digest: Digest | None = None,
        view_id: ViewId | None = None,
        member: Address | None = None,
        merge_id: MergeId | None = None,
        reason: str | None = None,
        seqno: int = 0,
    ) -> None:
        self.kind = kind
        self.view = view
        self.digest = digest
        self.view_id = view_id
        self.member = member
        self.merge_id = merge_id
        self.reason = reason
        self.seqno = seqno

    def to_wire(self) -> list[Any]:
        return [
            self.kind,
            None if self.view is None else self.view.to_wire(),
            None if self.digest is None else self.digest.to_wire(),
            None if self.view_id is None else self.view_id.to_wire(),
            None if self.member is None else self.member.to_wire(),
            None if self.merge_id is None else [self.merge_id[0].to_wire(), self.merge_id[1]],
            self.reason,
            self.seqno,
        ]

    @classmethod
    def from_wire(cls, data: Any) -> GmsHeader:
        items = as_list(data, "gms", 8, exact=8)
        kind = as_int(items[0], "gms.kind", 0, len(KIND_NAMES) - 1)
        merge_id = None
        if items[5] is not None:
            mid = as_list(items[5], "gms.merge_id", 2, exact=2)
            merge_id = (as_address(mid[0], "gms.merge_id.leader"), as_int(mid[1], "gms.merge_id.counter"))
        hdr = cls(
            kind,
            view=None if items[1] is None else View.from_wire(items[1], "gms.view"),
            digest=None if items[2] is None else Digest.from_wire(items[2], "gms.digest"),
            view_id=None if items[3] is None else ViewId.from_wire(items[3], "gms.view_id"),
            member=None if items[4] is None else as_address(items[4], "gms.member"),
            merge_id=merge_id,
            reason=None if items[6] is None else as_str(items[6], "gms.reason", 512),
            seqno=as_int(items[7], "gms.seqno"),
        )
        needs_view = (VIEW, INSTALL_MERGE_VIEW)
        if kind in needs_view and hdr.view is None:
            raise WireError(f"gms: {KIND_NAMES[kind]} without a view")
        if kind in (MERGE_REQ, MERGE_RSP, INSTALL_MERGE_VIEW, CANCEL_MERGE) and merge_id is None:
            raise WireError(f"gms: {KIND_NAMES[kind]} without a merge id")
        return hdr

    def __repr__(self) -> str:
        return f"GmsHeader({KIND_NAMES[self.kind]}, view={self.view}, reason={self.reason})"
