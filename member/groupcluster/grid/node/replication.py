"""Primary/backup replication: writes stamped by a primary, backups, re-drives across topologies."""

from __future__ import annotations

from ...core.address import Address


class _PendingWrite:
    """A write this member stamped and applied, not yet on every write owner (see :meth:`GridNode._redrive`)."""

    __slots__ = (
        "attempt",
        "awaiting",
        "expires",
        "key",
        "merge",
        "op_id",
        "origin",
        "topology_id",
        "value",
        "version",
    )

    def __init__(
        self,
        origin: Address,
        op_id: int,
        attempt: int,
        topology_id: int,
        awaiting: set[Address],
        key: bytes,
        version: int,
        value: bytes | None,
        *,
        merge: bool = False,
        expires: float = 0.0,
    ) -> None:
        self.origin = origin
        self.op_id = op_id
        self.attempt = attempt
        self.topology_id = topology_id  # 0: re-send under the next topology installed
        self.awaiting = awaiting
        self.key = key
        self.version = version
        self.value = value
        # A merge push (:meth:`GridNode._push_entries`). Like a write whose client was already answered (op_id
        # 0), nobody waits for it; unlike that one, it keeps ``GridNode.merging`` True until it is done.
        self.merge = merge
        self.expires = expires  # the entry's expiry as a Unix time (0.0: none), sent with every copy
