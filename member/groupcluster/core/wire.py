"""The one wire format: a msgpack frame carrying a batch of messages from one sender.

    frame   = [FORMAT_VERSION, cluster, sender, [message, ...]]
    message = [dest or nil, flags, [proto_id, header, proto_id, header, ...], payload]

Every decoded field is validated and every size a peer controls is bounded. Decoding raises
:class:`WireError` naming the field; callers drop the frame and count it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgpack

from .address import Address
from .errors import WireError
from .message import ALL_FLAGS, HEADER_TYPES, Message
from .validate import as_address, as_bytes, as_int, as_list, as_str, known_address

FORMAT_VERSION = 1
MAX_CLUSTER_NAME = 128
# ``Message.__new__``, not ``object.__new__``: the same function interpreted, and the one a compiled Message accepts.
_new_message = Message.__new__


@dataclass(frozen=True, slots=True)
class WireLimits:
    """Bounds on what a peer can make us allocate."""

    max_frame_bytes: int = 4 * 1024 * 1024
    max_messages: int = 65536
    max_headers: int = 16


DEFAULT_LIMITS = WireLimits()


def encode_message(msg: Message) -> list[Any]:
    headers: list[Any] = []
    for pid, hdr in msg.headers.items():
        headers.append(pid)
        headers.append(hdr.to_wire())
    return [None if msg.dest is None else msg.dest.to_wire(), msg.flags, headers, msg.payload]


def encode_frame(cluster: str, sender: Address, encoded_messages: list[list[Any]]) -> bytes:
    """Encode already-encoded messages (see :func:`encode_message`) into one frame."""
    return msgpack.packb([FORMAT_VERSION, cluster, sender.to_wire(), encoded_messages], use_bin_type=True)


def encode_messages(cluster: str, sender: Address, messages: list[Message]) -> bytes:
    return encode_frame(cluster, sender, [encode_message(m) for m in messages])


def _address(wire: Any, field: str, index: int = 0) -> Address:
    """``wire`` as an Address, validated; ``field`` (formatted with ``index``) names it in an error, and is
    formatted only on the first sight of an address (the common case is a known one)."""
    addr = known_address(wire)
    return addr if addr is not None else as_address(wire, field.format(index))


def unpack_bounded(data: bytes | memoryview, what: str, max_bytes: int, max_array_len: int) -> Any:
    """msgpack ``data`` decoded with every size bounded and no maps or extensions; a WireError naming ``what``
    if it is not valid msgpack within those bounds (shared by every decoder of peer input)."""
    try:
        return msgpack.unpackb(
            data,
            raw=False,
            use_list=True,
            strict_map_key=True,
            max_bin_len=max_bytes,
            max_str_len=max_bytes,
            max_array_len=max_array_len,
            max_map_len=0,
            max_ext_len=0,
        )
    except Exception as exc:  # msgpack raises several types for malformed input
        raise WireError(f"{what}: not valid msgpack ({type(exc).__name__}: {exc})") from None


def decode_frame(
    data: bytes | memoryview, expected_cluster: str, limits: WireLimits = DEFAULT_LIMITS
) -> tuple[Address, list[Message]]:
    """Decode and validate a frame; return (sender, messages with ``src`` set to the sender)."""
    if len(data) > limits.max_frame_bytes:
        raise WireError(f"frame: {len(data)} bytes exceed the limit of {limits.max_frame_bytes}")
    frame = unpack_bounded(data, "frame", limits.max_frame_bytes, max(limits.max_messages, 4096) * 4)
    parts = as_list(frame, "frame", 4, exact=4)
    version = as_int(parts[0], "frame.version")
    if version != FORMAT_VERSION:
        raise WireError(f"frame.version: unsupported format version {version} (this member speaks {FORMAT_VERSION})")
    cluster = as_str(parts[1], "frame.cluster", MAX_CLUSTER_NAME)
    if cluster != expected_cluster:
        raise WireError(f"frame.cluster: frame belongs to cluster {cluster!r}, not {expected_cluster!r}")
    sender = _address(parts[2], "frame.sender")
    raw_messages = as_list(parts[3], "frame.messages", limits.max_messages)
    out: list[Message] = []
    max_payload = limits.max_frame_bytes
    max_headers2 = limits.max_headers * 2
    header_types = HEADER_TYPES
    for i, raw in enumerate(raw_messages):
        if type(raw) is not list or len(raw) != 4:
            as_list(raw, f"frame.messages[{i}]", 4, exact=4)
        raw_dest, flags, raw_headers, payload = raw
        dest = None if raw_dest is None else _address(raw_dest, "frame.messages[{}].dest", i)
        if type(flags) is not int or flags & ~ALL_FLAGS or flags < 0:
            raise WireError(f"frame.messages[{i}].flags: invalid flags {flags!r}")
        if type(payload) is not bytes:
            as_bytes(payload, f"frame.messages[{i}].payload", max_payload)
        if type(raw_headers) is not list or len(raw_headers) > max_headers2 or len(raw_headers) % 2:
            raise WireError(f"frame.messages[{i}].headers: expected a flat list of (id, header) pairs")
        headers = {}
        for j in range(0, len(raw_headers), 2):
            pid = raw_headers[j]
            cls = header_types.get(pid) if type(pid) is int else None
            if cls is None:
                raise WireError(f"frame.messages[{i}].headers: unknown protocol id {pid!r}")
            if pid in headers:
                raise WireError(f"frame.messages[{i}].headers: protocol id {pid} appears twice")
            try:
                headers[pid] = cls.from_wire(raw_headers[j + 1])
            except WireError as exc:
                raise WireError(f"frame.messages[{i}].headers[{cls.__name__}]: {exc}") from None
            except Exception as exc:  # a header class must never turn bad input into a crash
                raise WireError(f"frame.messages[{i}].headers[{cls.__name__}]: {type(exc).__name__}: {exc}") from None
        # Built field by field: a keyword call of Message() costs more than the rest of this loop body.
        msg = _new_message(Message)
        msg.dest = dest
        msg.src = sender
        msg.payload = payload
        msg.flags = flags
        msg.headers = headers
        out.append(msg)
    return sender, out
