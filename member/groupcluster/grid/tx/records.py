"""What a participant knows of a transaction: its state (:class:`TxState`), its record on one member
(:class:`TxRecord`, kept by :class:`~.participant.TxTable`) and what others read of it (:class:`TxReport`,
:class:`InDoubt`)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

from ...core.address import Address
from .messages import TxId, Write

# A version of 0 in a transaction's reads means "the key was absent": real versions start at 1 << 40
# (store.make_version with a topology id of at least 1).
ABSENT = 0


class TxState(IntEnum):
    ACTIVE = 0  # known here, locks (being) taken, no YES vote for a prepare given
    PREPARED = 1  # voted YES: only a decision (commit or rollback) ends it
    COMMITTED = 2
    ROLLED_BACK = 3


TERMINAL = (TxState.COMMITTED, TxState.ROLLED_BACK)


@dataclass(frozen=True, slots=True)
class InDoubt:
    """A prepared transaction whose originator left the view: it keeps its locks until resolved."""

    tx: TxId
    attempt: int
    keys: tuple[bytes, ...]
    writes: tuple[Write, ...]
    versions: tuple[tuple[bytes, int], ...]  # stamped here (as primary); a resolver collects them


@dataclass(frozen=True, slots=True)
class TxReport:
    """One member's knowledge of a transaction (:meth:`TxTable.report`)."""

    tx: TxId
    state: TxState | None
    attempt: int
    writes: tuple[Write, ...]
    versions: tuple[tuple[bytes, int], ...]
    in_doubt: bool = False
    # The members of the view at its prepare here (or at the import of its lock information), sorted.
    views: tuple[Address, ...] = ()


class TxRecord:
    __slots__ = (
        "attempt",
        "backup_keys",
        "decided",
        "expires",
        "floors",
        "imported",
        "in_doubt",
        "lock_keys",
        "lost",
        "pending",
        "prepared_attempt",
        "reads",
        "reason",
        "reply_to",
        "stamp_keys",
        "state",
        "topology_id",
        "tx",
        "versions",
        "views",
        "writes",
    )

    def __init__(self, tx: TxId, attempt: int, reply_to: Address) -> None:
        self.tx = tx
        self.attempt = attempt
        self.reply_to = reply_to
        self.state = TxState.ACTIVE
        self.lock_keys: tuple[bytes, ...] = ()
        self.backup_keys: tuple[bytes, ...] = ()
        # The keys the prepare asked this member to stamp (it is their primary in the prepare's topology).
        # Not lock_keys: those may include keys inherited by an import, whose primary is another member now.
        self.stamp_keys: frozenset[bytes] = frozenset()
        self.writes: dict[bytes, bytes | None] = {}
        self.reads: dict[bytes, int] = {}
        # Backed-up keys -> the version the transaction read there (TxPrepare.floors): where the late stamp of
        # a committed write goes when its stamping primary died with the version.
        self.floors: dict[bytes, int] = {}
        self.versions: dict[bytes, int] = {}
        self.in_doubt = False
        self.reason = ""
        self.topology_id = 0
        self.prepared_attempt = 0  # the attempt this member voted YES to a prepare of (0: none)
        self.expires = 0.0  # finished: forgotten at this time
        self.decided = False  # finished by a decision (commit, rollback message, resolve), not on local grounds
        self.imported = False  # known here only through pushed lock information
        # Committed keys whose applied write this member's copy lost since (the segment was dropped or emptied
        # for a fresh transfer): ``versions`` still names them, but a repeated commit must apply them again.
        self.lost: set[bytes] = set()
        # The request a lock wait will answer: 0 the prepare, n the lock request n, None nothing waits.
        self.pending: int | None = None
        # The members of the view when it prepared here (or its lock information came): a resolver rolls an
        # in-doubt transaction back only when all of them but the originator are still members.
        self.views: frozenset[Address] = frozenset()
