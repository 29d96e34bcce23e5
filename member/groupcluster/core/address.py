"""Member addresses.

An address is the member's physical endpoint (host, port) plus an incarnation number chosen at start, so a
member restarted on the same endpoint is a different member. Incarnation 0 is reserved for "whoever listens
at this endpoint" and is used only by discovery before the real address is known.
"""

from __future__ import annotations

from dataclasses import dataclass

ANY_INCARNATION = 0


@dataclass(frozen=True, order=True, slots=True)
class Address:
    """A member: host, port and incarnation. Ordering is total and deterministic (used for merge leaders)."""

    host: str
    port: int
    incarnation: int = ANY_INCARNATION

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
