"""The grid's messages: one frozen dataclass per kind, the type code each kind carries on the wire, and the
codes their fields hold (operation kinds, response codes).

These are what a grid node emits and handles. Their column forms (the batches of operations and the packed
chunk of transferred entries) are in :mod:`.columns`; the payload that carries them, its format version,
limits, encoder and validating decoder, in :mod:`.payload`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .topology import CacheTopology, MemberStatus

if TYPE_CHECKING:
    from .columns import EntryChunk

STATUS, TOPOLOGY, CONFIRM, CMD, RSP, BACKUP, BACKUP_ACK = 1, 2, 3, 4, 5, 6, 7
FETCH, XFER_DATA, XFER_ACK, XFER_CANCEL, XFER_FAIL = 8, 9, 10, 11, 12
CMD_BATCH, RSP_BATCH, BACKUP_BATCH, BACKUP_ACK_BATCH = 13, 14, 15, 16

GET, PUT, DELETE = 0, 1, 2
OP_NAMES = {GET: "GET", PUT: "PUT", DELETE: "DELETE"}

# Response codes: OK (value for GET, None otherwise), NOT_FOUND (GET of an absent key), RETRY (stale or
# future topology: the originator retries on the owners of a topology at least as new as the one given),
# ERROR (the message says why; e.g. the segment is unavailable in degraded mode).
OK, NOT_FOUND, RETRY, ERROR = 0, 1, 2, 3
MAX_ERROR_LEN = 512


@dataclass(frozen=True, slots=True)
class Status:
    status: MemberStatus


@dataclass(frozen=True, slots=True)
class Topology:
    topology: CacheTopology


@dataclass(frozen=True, slots=True)
class Confirm:
    topology_id: int


@dataclass(frozen=True, slots=True)
class Command:
    op_id: int
    attempt: int
    topology_id: int
    kind: int
    key: bytes
    value: bytes | None
    # The client's deadline as a Unix time, 0.0 for none: a write owner does not apply the command after it.
    deadline: float = 0.0
    # A PUT's expiry as a Unix time, 0.0 for none: the key's primary removes the entry once it has passed.
    expires: float = 0.0


@dataclass(frozen=True, slots=True)
class Response:
    op_id: int
    attempt: int
    code: int
    topology_id: int
    value: bytes | None = None
    error: str = ""
    version: int = 0  # a GET's entry version (0: absent); optimistic transactions validate it


@dataclass(frozen=True, slots=True)
class Backup:
    write_id: int
    topology_id: int
    version: int
    key: bytes
    value: bytes | None  # None: a delete
    expires: float = 0.0  # the entry's expiry as a Unix time (0.0: none)


@dataclass(frozen=True, slots=True)
class BackupAck:
    write_id: int
    code: int
    topology_id: int


@dataclass(frozen=True, slots=True)
class Fetch:
    xfer_id: int
    topology_id: int
    rebalance_id: int
    segments: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class XferData:
    xfer_id: int
    segment: int
    # An EntryChunk; a list of (key, version, value) is accepted too and packed when encoded.
    entries: EntryChunk
    done: tuple[int, ...]  # segments complete with this batch
    last: bool


@dataclass(frozen=True, slots=True)
class XferAck:
    xfer_id: int


@dataclass(frozen=True, slots=True)
class XferCancel:
    xfer_id: int


@dataclass(frozen=True, slots=True)
class XferFail:
    xfer_id: int
    segments: tuple[int, ...]
