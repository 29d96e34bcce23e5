"""Messages and per-layer headers.

A message carries a payload, a destination (``None`` for a multicast to the group), the sender (set by the
transport) and one header per protocol id. Header classes register their protocol id at import, so two
layers claiming the same id fail loudly before anything runs.
"""

from __future__ import annotations

from types import FunctionType
from typing import Any, ClassVar, Final, TypeVar

from .address import Address
from .errors import WireError
from .native import mypyc_attr

# Flags: bits a layer reads to decide whether a message is its business.
NO_RELIABILITY: Final = 1  # bypass NAKACK/UNICAST (heartbeats, discovery, retransmission traffic)
NO_FLOW_CONTROL: Final = 2  # bypass credit-based flow control (control traffic)
OOB: Final = 4  # deliver without waiting for FIFO order (control messages that must not queue)
NO_FRAG: Final = 8  # never fragment
ALL_FLAGS: Final = NO_RELIABILITY | NO_FLOW_CONTROL | OOB | NO_FRAG


# Compiled, the headers of the interpreted layers (GMS, SEQUENCER, ...) still subclass it as Python classes.
@mypyc_attr(allow_interpreted_subclasses=True)
class Header:
    """Base of every protocol header: a small immutable value with a compact wire form."""

    PROTO_ID: ClassVar[int]
    __slots__ = ()

    def to_wire(self) -> list[Any]:
        raise NotImplementedError

    @classmethod
    def from_wire(cls, data: Any) -> Header:
        raise NotImplementedError

    @classmethod
    def from_wire_many(cls, wires: list[Any]) -> list[Header]:
        """The headers of a run of messages, from their wire forms: what :meth:`from_wire` makes of each. A class
        whose headers come in long runs (STATE's DATA, one per multicast of the total-order stack) overrides it
        with one tight loop for the whole run instead of a call per message."""
        return [cls.from_wire(data) for data in wires]

    def run_seqno(self) -> int:
        """The seqno this header stands for in a run of the wire format, or 0: not part of runs (the default)."""
        return 0


HEADER_TYPES: dict[int, type[Header]] = {}
H = TypeVar("H", bound=type[Header])


def register_header(cls: H) -> H:
    """Bind a header class to its protocol id, refusing collisions.

    Called after the class (``register_header(Cls)``) rather than as a decorator where the module is compiled
    with mypyc: a decorated class would be compiled as a plain Python class, not a native one."""
    pid = cls.PROTO_ID
    existing = HEADER_TYPES.get(pid)
    if existing is not None and existing is not cls:
        raise RuntimeError(
            f"protocol id {pid} is claimed by both {_qualified_name(existing)} and {_qualified_name(cls)}"
        )
    HEADER_TYPES[pid] = cls
    return cls


def _qualified_name(cls: type) -> str:
    # Typed as a plain ``type``: mypyc reads ``__module__`` of a ``type[Header]`` as a Header instance attribute.
    return f"{cls.__module__}.{cls.__qualname__}"


def decode_header(pid: int, data: Any) -> Header:
    cls = HEADER_TYPES.get(pid)
    if cls is None:
        raise WireError(f"header: unknown protocol id {pid}")
    return cls.from_wire(data)


class Message:
    """One message. Layers add headers on the way down and read them on the way up."""

    __slots__ = ("dest", "flags", "headers", "payload", "src")

    def __init__(
        self,
        dest: Address | None = None,
        payload: bytes = b"",
        *,
        src: Address | None = None,
        flags: int = 0,
        headers: dict[int, Header] | None = None,
    ) -> None:
        self.dest = dest
        self.src = src
        self.payload = payload
        self.flags = flags
        # Each layer reads its own header class under its protocol id, a pairing the type system cannot
        # express for one dict: values are typed Any, and a layer annotates the header it reads
        # (``hdr: NakackHeader | None = msg.headers.get(pid)``), which costs nothing at run time.
        self.headers: dict[int, Any] = headers if headers is not None else {}

    def sender(self) -> Address:
        """``src`` of a message on its way up: the transport sets it on every message it decodes or loops back, so
        a message without one was passed up by a layer that never set it (a bug, reported here by name)."""
        src = self.src
        if src is None:
            raise ValueError("a message on its way up has no src: the transport sets it on every received message")
        return src

    @property
    def is_multicast(self) -> bool:
        return self.dest is None

    def put_header(self, header: Header) -> Message:
        self.headers[header.PROTO_ID] = header
        return self

    def get_header(self, pid: int) -> Header | None:
        return self.headers.get(pid)

    def copy(self) -> Message:
        """A shallow copy with its own header dict (headers themselves are immutable)."""
        return Message(self.dest, self.payload, src=self.src, flags=self.flags, headers=dict(self.headers))

    def size(self) -> int:
        """Payload size in bytes, the unit of flow control and fragmentation."""
        return len(self.payload)

    def __repr__(self) -> str:
        hdrs = ", ".join(f"{type(h).__name__}" for h in self.headers.values())
        dest = "all" if self.dest is None else str(self.dest)
        return f"Message({self.src}->{dest}, {len(self.payload)}B, flags={self.flags}, [{hdrs}])"


# Whether Message is the native class of the mypyc build (its __init__ is then a slot of the C type, not a Python
# function). Compiled, a direct ``Message(...)`` call is a C call that fills the slots once; interpreted, that
# call binds keywords and costs more than ``Message.__new__`` plus setting the fields, which decoders use instead.
# (Compiled, ``__new__`` runs ``__init__`` with its defaults first: an empty header dict built and dropped.)
NATIVE: Final = not isinstance(vars(Message)["__init__"], FunctionType)
