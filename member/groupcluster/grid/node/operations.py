"""Client operations on their originator: routing, attempts, resends, client deadlines, answers."""

from __future__ import annotations

from ...core.address import Address

_NO_CUTOFF = float("inf")
_CUTOFF_ERROR = "timed out: the request's deadline passed"
_PRIMARY_CUTOFF_ERROR = _CUTOFF_ERROR + " before the key's primary owner could apply it"


class _Op:
    __slots__ = (
        "attempt",
        "cutoff",
        "deadline",
        "expires",
        "key",
        "kind",
        "not_before",
        "nseg",
        "op_id",
        "resend_at",
        "seg",
        "target",
        "topology_id",
        "value",
    )

    def __init__(self, op_id: int, kind: int, key: bytes, value: bytes | None, deadline: float) -> None:
        self.op_id = op_id
        self.kind = kind
        self.key = key
        self.deadline = deadline
        self.attempt = 0
        self.target: Address | None = None
        self.topology_id = 0  # the topology of the attempt in flight; 0 while waiting
        self.resend_at = 0.0
        # Waiting to be (re)sent: until our topology id reaches ``not_before[0]`` and time ``not_before[1]``.
        self.not_before: tuple[int, float] | None = (0, 0.0)
        self.value = value
        self.seg = 0  # segment_of(key, nseg), computed for the first topology that routes the operation
        self.nseg = 0
        # The client's deadline (node time; inf: none): no attempt is sent at or after it (see _send_op).
        self.cutoff = _NO_CUTOFF
        self.expires = 0.0  # a PUT's expiry as a Unix time (0.0: none), stamped by its originator
