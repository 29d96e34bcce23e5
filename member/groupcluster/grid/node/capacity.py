"""A member's capacity bounds: max_entries and max_bytes, checked by a key's primary before a PUT or a transaction adds
or grows entries.

It holds the live entries and bytes counted once per step plus what the step's PUTs added, and which bound the
last refusal met. (The capacity factor, a member's share of the segments, is ``GridConfig.capacity``, changed
by :meth:`GridNode.set_capacity`.)"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..tx.reasons import REASON_FULL

if TYPE_CHECKING:
    from .facade import GridNode


class EntryBounds:
    """The max_entries and max_bytes bounds of one member, counted per step."""

    def __init__(self, node: GridNode) -> None:
        self.node = node
        # max_entries and max_bytes: the live entries and their key and value bytes counted at ``_entries_at`` (a
        # step's time), plus what PUTs added since; ``_full_bound`` names the bound the last refusal met.
        self._entries = 0
        self._bytes = 0
        self._entries_at = -1.0
        self.full_bound = "max_entries"

    def full(self, seg: int, key: bytes, value: bytes | None) -> bool:
        """Whether a PUT of ``key`` would take this member past a bound: ``max_entries`` if it adds a key,
        ``max_bytes`` if it grows the live bytes (a key held already may be overwritten by a value no larger)."""
        data = self.node.installed_store().segments.get(seg)
        held = None if data is None else data.val.get(key)
        size = len(value or b"")
        grow = len(key) + size if held is None else size - len(held)
        return not self.fits(int(held is None), grow)

    def fits(self, adds: int, grow: int) -> bool:
        """:meth:`_take_room`, asked only when a bound could refuse: what neither adds a key under max_entries
        nor grows the bytes under max_bytes fits without a count (the count of a step starts at its first PUT
        that could be refused, as before max_bytes existed)."""
        cfg = self.node.config
        if not (adds and cfg.max_entries) and not (grow > 0 and cfg.max_bytes):
            return True
        return self._take_room(adds, grow)

    def _take_room(self, adds: int, grow: int) -> bool:
        """Count ``adds`` new keys and ``grow`` bytes against ``max_entries`` and ``max_bytes`` if they fit (True),
        else change nothing (False). The store is counted once per step, then what the step's PUTs add is counted
        on, so a batch cannot overshoot a bound."""
        cfg = self.node.config
        if self._entries_at != self.node._now:
            store = self.node.store
            assert store is not None
            self._entries, self._bytes, self._entries_at = len(store), store.nbytes, self.node._now
        if cfg.max_entries and adds and self._entries + adds > cfg.max_entries:
            self.full_bound = "max_entries"
            return False
        if cfg.max_bytes and grow > 0 and self._bytes + grow > cfg.max_bytes:
            self.full_bound = "max_bytes"
            return False
        self._entries += adds
        self._bytes += grow
        return True

    def full_error(self, tail: str) -> str:
        if self.full_bound == "max_bytes":
            held, bound = f"{self._bytes} bytes of keys and values", f"its max_bytes is {self.node.config.max_bytes}"
        else:
            held, bound = f"{self._entries} entries", f"its max_entries is {self.node.config.max_entries}"
        return f"{REASON_FULL}: member {self.node.address} holds {held}, {bound}; {tail}"
