"""STATE's wire forms: the header (DATA on every application multicast, REQ, CHUNK, ACK, REFUSE), its bounds,
the codecs of its vectors and cuts, and what a cut covers."""

from __future__ import annotations

from typing import Any, Final

from ...core import protocol_ids
from ...core.address import Address
from ...core.errors import WireError
from ...core.message import NATIVE, Header, register_header
from ...core.validate import MAX_INT, as_address, as_int, as_list, as_str

_PID: Final = protocol_ids.STATE
DATA: Final = 0
REQ: Final = 1
CHUNK: Final = 2
ACK: Final = 3
REFUSE: Final = 4
KIND_NAMES = ("DATA", "REQ", "CHUNK", "ACK", "REFUSE")
# Most chunks one transfer may announce, and most entries in a cut vector or a floor list.
MAX_CHUNKS: Final = 1 << 24
MAX_VECTOR: Final = 4096
MAX_REASON: Final = 256

Vector = dict[Address, int]
# A cut: per sender, the highest number applied and the ranges below it that were never applied (a sender's
# multicasts made while it was apart from us: per-sender streams have holes across partitions and merges).
Gaps = tuple[tuple[int, int], ...]
Cut = dict[Address, tuple[int, Gaps]]
MAX_GAPS: Final = 64  # holes remembered per sender; older ones are forgotten (counted as applied)
TransferId = tuple[Address, int]  # (joiner, joiner's request counter)
# A refusal's reason that tells the joiner the donor waits for a state itself.
NO_STATE_YET = "I have no state yet"


def _vector_to_wire(vec: Vector) -> list[Any]:
    return [[a.to_wire(), s] for a, s in vec.items()]


def _vector_from_wire(data: Any, field: str) -> Vector:
    out: Vector = {}
    for i, item in enumerate(as_list(data, field, MAX_VECTOR)):
        pair = as_list(item, f"{field}[{i}]", 2, exact=2)
        addr = as_address(pair[0], f"{field}[{i}].member")
        if addr in out:
            raise WireError(f"{field}[{i}]: member {addr} appears twice")
        out[addr] = as_int(pair[1], f"{field}[{i}].seq")
    return out


def _cut_to_wire(cut: Cut) -> list[Any]:
    return [[a.to_wire(), top, [list(g) for g in gaps]] for a, (top, gaps) in cut.items()]


def _cut_from_wire(data: Any, field: str) -> Cut:
    out: Cut = {}
    for i, item in enumerate(as_list(data, field, MAX_VECTOR)):
        parts = as_list(item, f"{field}[{i}]", 3, exact=3)
        addr = as_address(parts[0], f"{field}[{i}].member")
        if addr in out:
            raise WireError(f"{field}[{i}]: member {addr} appears twice")
        top = as_int(parts[1], f"{field}[{i}].seq")
        gaps: list[tuple[int, int]] = []
        prev = 0
        for k, g in enumerate(as_list(parts[2], f"{field}[{i}].gaps", MAX_GAPS)):
            lo, hi = as_list(g, f"{field}[{i}].gaps[{k}]", 2, exact=2)
            # Sorted, disjoint, below the highest seq (which was applied): anything else is malformed.
            lo = as_int(lo, f"{field}[{i}].gaps[{k}].lo", prev + 1, top - 1)
            hi = as_int(hi, f"{field}[{i}].gaps[{k}].hi", lo, top - 1)
            gaps.append((lo, hi))
            prev = hi + 1
        out[addr] = (top, tuple(gaps))
    return out


def covers(cut: Cut, src: Address, seq: int) -> bool:
    """Whether the state with cut ``cut`` contains multicast ``seq`` of ``src``."""
    entry = cut.get(src)
    if entry is None or seq > entry[0]:
        return False
    return not any(lo <= seq <= hi for lo, hi in entry[1])


class StateHeader(Header):
    """DATA(seq) on every application multicast; REQ (a multicast marker naming the donor) and CHUNK / ACK /
    REFUSE (reliable unicasts) for a transfer.

    Wire forms: DATA ``[0, seq]``; REQ ``[1, tid, donor, floors]``; CHUNK ``[2, tid, index, count, total, cut|nil]``
    (the chunk's bytes are the payload; the cut only on chunk 0); ACK ``[3, tid, next_index]``;
    REFUSE ``[4, tid, reason]``.
    """

    PROTO_ID = protocol_ids.STATE
    # Every application multicast carries a DATA header, so DATA is made cheap: only ``kind`` and ``seq`` are
    # slots; the fields of the rare transfer headers live in the instance dict, their defaults on the class.
    # (Compiled with mypyc, every field is a slot of the native class and the defaults are set per instance.)
    __slots__ = ("__dict__", "kind", "seq")
    count = 0
    cut: Cut | None = None
    donor: Address | None = None
    index = 0
    reason = ""
    tid = 0
    total = 0
    vector: Vector | None = None

    # ``kind`` has a default only for from_wire's ``_new_header(cls)``: compiled with mypyc, a class's __new__
    # runs its __init__ too (with no arguments); interpreted, it does not.
    def __init__(
        self,
        kind: int = DATA,
        seq: int = 0,
        *,
        tid: int = 0,
        index: int = 0,
        count: int = 0,
        total: int = 0,
        vector: Vector | None = None,
        reason: str = "",
        donor: Address | None = None,
        cut: Cut | None = None,
    ) -> None:
        self.kind = kind
        self.seq = seq
        if kind != DATA or tid or index or count or total or vector is not None or reason or donor is not None:
            self.donor = donor
            self.tid = tid
            self.index = index
            self.count = count
            self.total = total
            self.vector = vector
            self.reason = reason
        if cut is not None:
            self.cut = cut

    def to_wire(self) -> list[Any]:
        kind = self.kind
        if kind == DATA:
            return [DATA, self.seq]
        if kind == REQ:
            assert self.donor is not None
            return [REQ, self.tid, self.donor.to_wire(), _vector_to_wire(self.vector or {})]
        if kind == CHUNK:
            cut = None if self.cut is None else _cut_to_wire(self.cut)
            return [CHUNK, self.tid, self.index, self.count, self.total, cut]
        if kind == ACK:
            return [ACK, self.tid, self.index]
        return [REFUSE, self.tid, self.reason]

    @classmethod
    def from_wire(cls, data: Any) -> StateHeader:
        if type(data) is list and len(data) == 2:
            kind, seq = data
            if type(kind) is int and kind == DATA and type(seq) is int and 1 <= seq <= MAX_INT:
                # DATA, on every multicast: checked and built without the general path's calls.
                hdr = _new_header(cls)
                hdr.kind = DATA
                hdr.seq = seq
                return hdr
        items = as_list(data, "state", 6)
        kind = as_int(items[0] if items else None, "state.kind", 0, len(KIND_NAMES) - 1)
        want = (2, 4, 6, 3, 3)[kind]
        if len(items) != want:
            raise WireError(f"state: {KIND_NAMES[kind]} needs {want} fields, got {len(items)}")
        if kind == DATA:
            return cls(DATA, as_int(items[1], "state.seq", 1, MAX_INT))
        tid = as_int(items[1], "state.tid", 0, MAX_INT)
        if kind == REQ:
            donor = as_address(items[2], "state.donor")
            return cls(REQ, tid=tid, donor=donor, vector=_vector_from_wire(items[3], "state.floors"))
        if kind == CHUNK:
            count = as_int(items[3], "state.count", 1, MAX_CHUNKS)
            index = as_int(items[2], "state.index", 0, count - 1)
            total = as_int(items[4], "state.total", 0, MAX_INT)
            if items[5] is None:
                if index == 0:
                    raise WireError("state: CHUNK 0 without the cut")
                cut = None
            else:
                if index != 0:
                    raise WireError(f"state: CHUNK {index} carries a cut (only chunk 0 does)")
                cut = _cut_from_wire(items[5], "state.cut")
            return cls(CHUNK, tid=tid, index=index, count=count, total=total, cut=cut)
        if kind == ACK:
            return cls(ACK, tid=tid, index=as_int(items[2], "state.next_index", 0, MAX_CHUNKS))
        return cls(REFUSE, tid=tid, reason=as_str(items[2], "state.reason", MAX_REASON))

    @classmethod
    def from_wire_many(cls, wires: list[Any]) -> list[Header]:
        """:meth:`from_wire` of each, the DATA headers of the run checked and built in one loop."""
        out: list[Header] = []
        native = NATIVE and cls is StateHeader
        for data in wires:
            if type(data) is list and len(data) == 2:
                kind = data[0]
                seq = data[1]
                if type(kind) is int and kind == DATA and type(seq) is int and 1 <= seq <= MAX_INT:
                    if native:
                        out.append(StateHeader(DATA, seq))
                        continue
                    hdr = _new_header(cls)
                    hdr.kind = DATA
                    hdr.seq = seq
                    out.append(hdr)
                    continue
            out.append(cls.from_wire(data))
        return out

    def __eq__(self, other: object) -> bool:
        return isinstance(other, StateHeader) and other.to_wire() == self.to_wire()

    def __hash__(self) -> int:
        return hash((self.kind, self.seq, self.tid, self.index))

    def __repr__(self) -> str:
        if self.kind == DATA:
            return f"StateHeader(DATA {self.seq})"
        return f"StateHeader({KIND_NAMES[self.kind]} tid={self.tid} index={self.index}/{self.count})"


register_header(StateHeader)
# mypyc cannot compile ``cls.__new__(cls)`` inside the class; a Header compiled with it refuses object.__new__.
_new_header: Final = StateHeader.__new__
