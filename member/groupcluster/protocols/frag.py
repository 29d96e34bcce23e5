"""FRAG: split large messages into fragments on the way down, reassemble them on the way up (FRAG2).

A message whose payload exceeds ``frag_size`` (and that lacks NO_FRAG) leaves as ``count`` fragments with the
same destination and flags and a header (frag_id, index, count); frag ids increase per sender. A receiver
reassembles per (sender, frag_id) and passes the whole message up in the position of its last fragment, so
batch order is kept. Memory is bounded: when more than ``max_pending`` bytes are waiting for missing
fragments, the oldest partial message is dropped (and counted); fragments of a finished or dropped id are
ignored, and state of senders that left the view is dropped. ``max_pending`` counts each incomplete message's
slots (a fragment may announce 65536 pieces) besides its payload, and at most :data:`MAX_SENDERS` senders are
tracked.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from ..core import protocol_ids
from ..core.address import Address
from ..core.config import param
from ..core.events import Event, ViewChange
from ..core.layer import Layer, register_layer
from ..core.message import NO_FRAG, Header, Message, register_header
from ..core.validate import MAX_INT, as_int, as_list

_PID: Final = protocol_ids.FRAG
# Most fragments one message may claim: bounds the slot list a peer can make us allocate.
MAX_FRAGMENTS: Final = 1 << 16
# Finished ids remembered per sender beyond the contiguous floor (gaps come from unicasts to others).
_MAX_DONE: Final = 1024
# What an incomplete message costs besides its payload: one list slot per announced fragment, plus the
# objects. Counted in ``max_pending``, so fragments announcing 65536 pieces cannot allocate without bound.
_SLOT_BYTES: Final = 8
_PARTIAL_BYTES: Final = 200
# Senders whose reassembly bookkeeping is kept; anyone can send us a fragment, so this is bounded too.
MAX_SENDERS: Final = 4096


class FragHeader(Header):
    """Fragment ``index`` of ``count`` of the sender's message ``frag_id``."""

    PROTO_ID = protocol_ids.FRAG
    __slots__ = ("count", "frag_id", "index")

    def __init__(self, frag_id: int, index: int, count: int) -> None:
        self.frag_id = frag_id
        self.index = index
        self.count = count

    def to_wire(self) -> list[Any]:
        return [self.frag_id, self.index, self.count]

    @classmethod
    def from_wire(cls, data: Any) -> FragHeader:
        items = as_list(data, "frag", 3, exact=3)
        frag_id = as_int(items[0], "frag.frag_id", 0, MAX_INT)
        count = as_int(items[2], "frag.count", 1, MAX_FRAGMENTS)
        index = as_int(items[1], "frag.index", 0, count - 1)
        return cls(frag_id, index, count)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FragHeader) and other.to_wire() == self.to_wire()

    def __hash__(self) -> int:
        return hash((self.frag_id, self.index, self.count))

    def __repr__(self) -> str:
        return f"FragHeader({self.frag_id}, {self.index}/{self.count})"


register_header(FragHeader)


@dataclass(frozen=True)
class FragConfig:
    frag_size: int = param(
        "56KiB", "size", doc="largest payload sent in one piece; larger ones are fragmented", minimum=64
    )
    max_pending: int = param(
        "64MiB",
        "size",
        doc="bytes held for incomplete messages; beyond it the oldest is dropped",
        minimum=1,
    )


class _Partial:
    __slots__ = ("chunks", "missing", "overhead", "size")

    def __init__(self, count: int) -> None:
        self.chunks: list[bytes | None] = [None] * count
        self.missing = count
        self.size = 0  # payload bytes held
        self.overhead = _PARTIAL_BYTES + _SLOT_BYTES * count

    def joined(self) -> bytes:
        """The whole payload, once no chunk is missing."""
        parts: list[bytes] = []
        for chunk in self.chunks:
            if chunk is None:
                raise RuntimeError("frag: joining a message that still misses a fragment")
            parts.append(chunk)
        return b"".join(parts)


class _Sender:
    """Reassembly bookkeeping of one sender: ids below ``floor`` and ids in ``done`` are finished."""

    __slots__ = ("done", "floor")

    def __init__(self) -> None:
        self.floor = 0
        self.done: set[int] = set()

    def finish(self, frag_id: int) -> None:
        done = self.done
        done.add(frag_id)
        floor = self.floor
        while floor in done:
            done.discard(floor)
            floor += 1
        self.floor = floor
        if len(done) > _MAX_DONE:
            # Ids that never reach us (fragments of unicasts to others) leave gaps: treat old gaps as finished.
            keep = sorted(done)[-_MAX_DONE // 2 :]
            self.floor = keep[0]
            self.done = set(keep)
            self.finish(keep[0])


class Frag(Layer):
    NAME = "frag"
    PROTO_ID = protocol_ids.FRAG
    Config = FragConfig

    def __init__(self, config: FragConfig, ctx: Any) -> None:
        super().__init__(config, ctx)
        self._frag_size = config.frag_size
        self._next_id = 0
        self._senders: dict[Address, _Sender] = {}
        # (sender, frag_id) -> partial; insertion order is age, for dropping the oldest.
        self._pending: dict[tuple[Address, int], _Partial] = {}
        self.pending_bytes = 0  # payload bytes held for incomplete messages
        self.overhead_bytes = 0  # their bookkeeping (slots); both count against max_pending
        self.dropped = 0

    # -- down ----------------------------------------------------------------------------------------
    def down(self, msg: Message) -> None:
        if len(msg.payload) <= self._frag_size or msg.flags & NO_FRAG:
            self.below.down(msg)
            return
        payload = msg.payload
        size = self._frag_size
        count = -(-len(payload) // size)
        if count > MAX_FRAGMENTS:
            raise ValueError(
                f"message of {len(payload)} bytes needs {count} fragments of {size} bytes; the limit is "
                f"{MAX_FRAGMENTS} (raise frag_size or send less)"
            )
        frag_id = self._next_id
        self._next_id += 1
        self.count("fragmented")
        self.count("fragments_sent", count)
        below = self.below
        for index in range(count):
            headers = dict(msg.headers)
            headers[_PID] = FragHeader(frag_id, index, count)
            below.down(Message(msg.dest, payload[index * size : (index + 1) * size], flags=msg.flags, headers=headers))

    # -- up ------------------------------------------------------------------------------------------
    def up(self, batch: list[Message]) -> None:
        for msg in batch:
            if _PID in msg.headers:
                break
        else:
            self.above.up(batch)
            return
        out: list[Message] = []
        for msg in batch:
            hdr: FragHeader | None = msg.headers.get(_PID)
            if hdr is None:
                out.append(msg)
            else:
                whole = self._add(msg, hdr)
                if whole is not None:
                    out.append(whole)
        if out:
            self.above.up(out)

    def _add(self, msg: Message, hdr: FragHeader) -> Message | None:
        src = msg.sender()
        key = (src, hdr.frag_id)
        partial = self._pending.get(key)
        if partial is None:
            sender = self._senders.get(src)
            if sender is None:
                if len(self._senders) >= MAX_SENDERS:
                    self._forget_a_sender()
                sender = self._senders[src] = _Sender()
            elif hdr.frag_id < sender.floor or hdr.frag_id in sender.done:
                self.count("stale_fragments")
                return None
            partial = self._pending[key] = _Partial(hdr.count)
            self.overhead_bytes += partial.overhead
        elif len(partial.chunks) != hdr.count:
            self.count("inconsistent_fragments")
            return None
        if partial.chunks[hdr.index] is not None:
            self.count("duplicate_fragments")
            return None
        partial.chunks[hdr.index] = msg.payload
        partial.missing -= 1
        n = len(msg.payload)
        partial.size += n
        self.pending_bytes += n
        if partial.missing == 0:
            del self._pending[key]
            self.pending_bytes -= partial.size
            self.overhead_bytes -= partial.overhead
            sender = self._senders.get(src)
            if sender is not None:
                sender.finish(hdr.frag_id)
            self.count("reassembled")
            headers = dict(msg.headers)
            del headers[_PID]
            return Message(msg.dest, partial.joined(), src=src, flags=msg.flags, headers=headers)
        if self.pending_bytes + self.overhead_bytes > self.config.max_pending:
            self._drop_oldest()
        return None

    def _forget_a_sender(self) -> None:
        # The oldest sender with nothing waiting; its late fragments start a partial that max_pending bounds.
        busy = {src for src, _ in self._pending}
        victim = next((s for s in self._senders if s not in busy), None)
        if victim is None:
            victim = next(iter(self._senders))
        del self._senders[victim]
        self.count("forgot_sender")

    def _drop_oldest(self) -> None:
        pending = self._pending
        while self.pending_bytes + self.overhead_bytes > self.config.max_pending and pending:
            (src, frag_id), partial = next(iter(pending.items()))
            del pending[(src, frag_id)]
            self.pending_bytes -= partial.size
            self.overhead_bytes -= partial.overhead
            sender = self._senders.get(src)
            if sender is not None:
                sender.finish(frag_id)
            self.count("dropped_partial")
            self.dropped += 1
            # The first few are logged, then every 1000th: a flood of bogus fragments must not flood the log.
            if self.dropped <= 10 or self.dropped % 1000 == 0:
                self.ctx.log.warning(
                    "dropped incomplete message %d from %s (%d bytes; %d dropped so far): more than %d bytes "
                    "awaiting fragments",
                    frag_id,
                    src,
                    partial.size,
                    self.dropped,
                    self.config.max_pending,
                )

    # -- events ----------------------------------------------------------------------------------------
    def up_event(self, event: Event) -> None:
        if isinstance(event, ViewChange):
            members = set(event.view.members)
            gone = [s for s in self._senders if s not in members]
            for s in gone:
                del self._senders[s]
            if gone:
                gone_set = set(gone)
                for key in [k for k in self._pending if k[0] in gone_set]:
                    partial = self._pending.pop(key)
                    self.pending_bytes -= partial.size
                    self.overhead_bytes -= partial.overhead
                    self.count("dropped_partial_left")
        self.above.up_event(event)

    def describe_state(self) -> dict[str, Any]:
        return {"next_id": self._next_id, "pending": len(self._pending), "pending_bytes": self.pending_bytes}


register_layer(Frag)
