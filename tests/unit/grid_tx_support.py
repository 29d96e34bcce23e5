"""Shared by the grid transaction unit tests (test_grid_tx*.py): member addresses, the segment function, a
participant's store and table, and a static router for coordinators."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from groupcluster.core.address import Address
from groupcluster.grid.store import make_version
from groupcluster.grid.tx.config import TxConfig
from groupcluster.grid.tx.messages import TxId, TxMessage, TxPrepare
from groupcluster.grid.tx.outputs import TxOutput, TxSend
from groupcluster.grid.tx.participant import TxTable

# Derandomized and without the example database, so CI runs the same examples every time; GRID_HYPOTHESIS_SCALE=20
# multiplies the examples for a local search.
EXAMPLES_SCALE = int(os.environ.get("GRID_HYPOTHESIS_SCALE", "1"))

A = Address("10.0.0.1", 7800, 1)
B = Address("10.0.0.2", 7800, 1)
C = Address("10.0.0.3", 7800, 1)
D = Address("10.0.0.4", 7800, 1)
O1 = Address("10.0.1.1", 7800, 1)
O2 = Address("10.0.1.2", 7800, 1)
O3 = Address("10.0.1.3", 7800, 1)
RESOLVER = Address("10.0.2.1", 7800, 1)  # plays the operator's resolution tool
SEGMENTS = 8


def seg(key: bytes) -> int:
    return key[-1] % SEGMENTS


def tid(n: int, origin: Address = O1) -> TxId:
    return TxId(origin, n)


class Store:
    """A member's data as the participant sees it: versions for validation, a stamp counter."""

    def __init__(self, topology_id: int = 1) -> None:
        self.data: dict[bytes, tuple[int, bytes | None]] = {}
        self.topology_id = topology_id
        self.seq = 0
        self.applied: list[tuple[TxId, tuple[tuple[bytes, int, bytes | None], ...]]] = []

    def version_of(self, key: bytes) -> int:
        return self.data.get(key, (0, None))[0]

    def stamp(self, key: bytes) -> int:
        self.seq += 1
        return make_version(self.topology_id, self.seq)

    def apply(self, tx: TxId, writes: tuple[tuple[bytes, int, bytes | None], ...]) -> None:
        self.applied.append((tx, writes))
        for key, version, value in writes:
            if version > self.version_of(key):
                self.data[key] = (version, value)


def table(addr: Address = A, topology_id: int = 1, **cfg: str) -> tuple[TxTable, Store]:
    store = Store(topology_id)
    t = TxTable(
        addr,
        TxConfig.from_dict(dict(cfg)),
        segment_of=seg,
        version_of=store.version_of,
        stamp=store.stamp,
        apply=store.apply,
        topology_id=topology_id,
    )
    t.on_view([A, B, C, D, O1, O2, O3], 0.0)
    return t, store


def sends(out: list[TxOutput]) -> list[TxMessage]:
    return [o.message for o in out if isinstance(o, TxSend)]


def prepare(tx: TxId, keys: Sequence[bytes], attempt: int = 1, topology_id: int = 1, **kw: object) -> TxPrepare:
    writes = tuple((k, b"v" + k) for k in keys)
    return TxPrepare(tx, attempt, topology_id, tuple(kw.get("lock", keys)), writes, tuple(kw.get("reads", ())))  # type: ignore[arg-type]


class StaticRouter:
    """Owners per key from a fixed list of members: primary ``members[h]``, backup the next one."""

    def __init__(self, members: Sequence[Address], owners: int = 2, topology_id: int = 1) -> None:
        self.members = list(members)
        self.owners = owners
        self.topology_id = topology_id

    def owners_of(self, key: bytes) -> tuple[Address, ...]:
        h = seg(key) % len(self.members)
        n = min(self.owners, len(self.members))
        return tuple(self.members[(h + i) % len(self.members)] for i in range(n))

    def __call__(self, keys: Sequence[bytes]) -> tuple[int, Mapping[bytes, Sequence[Address]]]:
        return self.topology_id, {k: self.owners_of(k) for k in keys}
