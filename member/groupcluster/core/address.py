"""Member addresses.

An address is the member's physical endpoint (host, port) plus an incarnation number chosen at start, so a
member restarted on the same endpoint is a different member. Incarnation 0 is reserved for "whoever listens
at this endpoint" and is used only by discovery before the real address is known.
"""

from __future__ import annotations

from dataclasses import dataclass, field

ANY_INCARNATION = 0


@dataclass(frozen=True, slots=True)
class Address:
    """A member: host, port and incarnation. Ordering is total and deterministic (used for merge leaders).

    Addresses are dictionary keys on every message's path (a receive window per sender, credits per member),
    so the hash is computed once, and equality tries identity first (the wire decoder hands out one object per
    sender) before comparing fields; the generated versions build a tuple on every call. The ordering is written
    out too (the ``order=True`` one, field by field): mypyc, compiling the class, refuses the generated one.
    """

    host: str
    port: int
    incarnation: int = ANY_INCARNATION
    _hash: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_hash", hash((self.host, self.port, self.incarnation)))

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self) -> tuple[type[Address], tuple[str, int, int]]:
        # String hashes differ between processes: a pickled address computes its hash again where it lands.
        return (Address, (self.host, self.port, self.incarnation))

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if type(other) is not Address:
            return NotImplemented
        return (
            self._hash == other._hash
            and self.incarnation == other.incarnation
            and self.port == other.port
            and self.host == other.host
        )

    def _key(self) -> tuple[str, int, int]:
        return (self.host, self.port, self.incarnation)

    def __lt__(self, other: object) -> bool:
        if type(other) is not Address:
            return NotImplemented
        return self._key() < other._key()

    def __le__(self, other: object) -> bool:
        if type(other) is not Address:
            return NotImplemented
        return self._key() <= other._key()

    def __gt__(self, other: object) -> bool:
        if type(other) is not Address:
            return NotImplemented
        return self._key() > other._key()

    def __ge__(self, other: object) -> bool:
        if type(other) is not Address:
            return NotImplemented
        return self._key() >= other._key()

    @property
    def endpoint(self) -> tuple[str, int]:
        """The physical (host, port) the transport sends to."""
        return (self.host, self.port)

    def is_placeholder(self) -> bool:
        """True for an endpoint-only address used by discovery (incarnation 0)."""
        return self.incarnation == ANY_INCARNATION

    def to_wire(self) -> list[object]:
        return [self.host, self.port, self.incarnation]

    def __str__(self) -> str:
        return f"{self.host}:{self.port}#{self.incarnation}"

    @classmethod
    def parse(cls, text: str) -> Address:
        """Parse ``host:port`` or ``host:port#incarnation``."""
        host_port, _, inc = text.partition("#")
        host, sep, port = host_port.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"not an address (expected host:port or host:port#incarnation): {text!r}")
        return cls(host, int(port), int(inc) if inc else ANY_INCARNATION)
