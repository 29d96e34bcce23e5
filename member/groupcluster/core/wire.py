"""The one wire format: a msgpack frame carrying a batch of messages from one sender.

    frame   = [version, cluster, sender, [item, ...]]
    item    = message | run                  (a run only in a RUNS_VERSION frame)
    message = [dest or nil, flags, [proto_id, header, proto_id, header, ...], payload]
    run     = [first_seqno, flags, [payload, ...]]

A run stands for consecutive multicasts whose only header is a NAKACK ``MSG`` with seqnos ``first_seqno``,
``first_seqno + 1``, ...: one item instead of a message list and a header list per message. Frames without runs
keep ``FORMAT_VERSION``; a member of the previous version rejects a ``RUNS_VERSION`` frame as an unsupported
version, so senders use runs only towards members that said they decode them (docs/decisions/004-wire-runs.md).

Every decoded field is validated and every size a peer controls is bounded. Decoding raises
:class:`WireError` naming the field; callers drop the frame and count it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

import msgpack

from . import protocol_ids
from .address import Address
from .errors import WireError
from .message import ALL_FLAGS, HEADER_TYPES, NATIVE, Message
from .validate import MAX_INT, as_address, as_bytes, as_int, as_list, as_str, known_address

FORMAT_VERSION: Final = 1
# Frames that may hold runs; also sent empty, as the "I decode runs" hello (see the Transport).
RUNS_VERSION: Final = 2
# The protocol whose header a run stands for: NAKACK's MSG (its header class implements Header.run_seqno).
RUN_PROTO_ID: Final = protocol_ids.NAKACK
MAX_CLUSTER_NAME: Final = 128
# Builds a run's messages (sender, first seqno, flags, payloads, into): registered by the protocol whose header a
# run stands for when it is imported (set_run_builder), so that core imports no protocol. One call per run; the
# builder makes each message with its own module's (compiled: native) constructors.
RunBuilder = Callable[[Address, int, int, list[bytes], list[Message]], None]
_RUN_BUILDER: list[RunBuilder] = []
# ``Message.__new__``, not ``object.__new__``: the same function interpreted, and the one a compiled Message accepts.
_new_message: Final = Message.__new__


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


def run_seqno(msg: Message) -> int:
    """The seqno under which ``msg`` can travel in a run, or 0 if it must travel as a message of its own."""
    if msg.dest is not None:
        return 0
    headers = msg.headers
    if len(headers) != 1:
        return 0
    hdr = headers.get(RUN_PROTO_ID)
    if hdr is None:
        return 0
    seqno: int = hdr.run_seqno()
    return seqno


def encode_frame(
    cluster: str, sender: Address, encoded_messages: list[list[Any]], version: int = FORMAT_VERSION
) -> bytes:
    """Encode already-encoded items (see :func:`encode_message`, :func:`encode_items`) into one frame;
    ``version`` must be RUNS_VERSION if any of them is a run."""
    return msgpack.packb([version, cluster, sender.to_wire(), encoded_messages], use_bin_type=True)


def encode_items(messages: list[Message], runs: bool) -> tuple[list[list[Any]], bool]:
    """``messages`` as frame items, consecutive run-able multicasts folded into runs if ``runs``; and whether any
    run was made (the frame must then be RUNS_VERSION)."""
    items: list[list[Any]] = []
    any_run = False
    payloads: list[bytes] | None = None
    flags = -1
    nxt = 0
    for msg in messages:
        seqno = run_seqno(msg) if runs else 0
        if seqno:
            if payloads is not None and seqno == nxt and msg.flags == flags:
                payloads.append(msg.payload)
            else:
                payloads = [msg.payload]
                flags = msg.flags
                items.append([seqno, flags, payloads])
                any_run = True
            nxt = seqno + 1
        else:
            payloads = None
            items.append(encode_message(msg))
    return items, any_run


def encode_messages(cluster: str, sender: Address, messages: list[Message], runs: bool = False) -> bytes:
    items, any_run = encode_items(messages, runs)
    return encode_frame(cluster, sender, items, RUNS_VERSION if any_run else FORMAT_VERSION)


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
    sender, out, _ = decode_frame_version(data, expected_cluster, limits)
    return sender, out


def decode_frame_version(  # noqa: C901  the per-message hot path, kept in one function
    data: bytes | memoryview, expected_cluster: str, limits: WireLimits = DEFAULT_LIMITS
) -> tuple[Address, list[Message], int]:
    """:func:`decode_frame`, and the frame's format version (RUNS_VERSION: the sender decodes runs)."""
    if len(data) > limits.max_frame_bytes:
        raise WireError(f"frame: {len(data)} bytes exceed the limit of {limits.max_frame_bytes}")
    frame = unpack_bounded(data, "frame", limits.max_frame_bytes, max(limits.max_messages, 4096) * 4)
    parts = as_list(frame, "frame", 4, exact=4)
    version = as_int(parts[0], "frame.version")
    if version != FORMAT_VERSION and version != RUNS_VERSION:
        raise WireError(
            f"frame.version: unsupported format version {version} (this member speaks {FORMAT_VERSION} and "
            f"{RUNS_VERSION})"
        )
    cluster = as_str(parts[1], "frame.cluster", MAX_CLUSTER_NAME)
    if cluster != expected_cluster:
        raise WireError(f"frame.cluster: frame belongs to cluster {cluster!r}, not {expected_cluster!r}")
    sender = _address(parts[2], "frame.sender")
    raw_messages = as_list(parts[3], "frame.messages", limits.max_messages)
    out: list[Message] = []
    max_payload = limits.max_frame_bytes
    max_headers2 = limits.max_headers * 2
    header_types = HEADER_TYPES
    runs = version == RUNS_VERSION
    max_messages = limits.max_messages
    for i, raw in enumerate(raw_messages):
        if runs and type(raw) is list and len(raw) == 3:
            _decode_run(raw, i, sender, out, max_messages)
            continue
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
        if NATIVE:
            out.append(Message(dest, payload, src=sender, flags=flags, headers=headers))
            continue
        # Built field by field: interpreted, a keyword call of Message() costs more than the rest of this loop body.
        msg = _new_message(Message)
        msg.dest = dest
        msg.src = sender
        msg.payload = payload
        msg.flags = flags
        msg.headers = headers
        out.append(msg)
    if len(out) > max_messages:
        raise WireError(f"frame.messages: {len(out)} messages exceed the limit of {max_messages}")
    return sender, out, version


def _decode_run(raw: list[Any], i: int, sender: Address, out: list[Message], max_messages: int) -> None:
    """Validate the run ``raw`` (item ``i`` of its frame) as a whole and append its messages to ``out``."""
    first, flags, payloads = raw
    if type(first) is not int or first < 1:
        as_int(first, f"frame.messages[{i}].first_seqno", 1)
    if type(flags) is not int or flags & ~ALL_FLAGS or flags < 0:
        raise WireError(f"frame.messages[{i}].flags: invalid flags {flags!r}")
    if type(payloads) is not list or not payloads:
        raise WireError(f"frame.messages[{i}].payloads: expected a non-empty list of payloads")
    n = len(payloads)
    if len(out) + n > max_messages:
        raise WireError(f"frame.messages[{i}]: a run of {n} messages exceeds the limit of {max_messages} per frame")
    if first > MAX_INT - n + 1:
        raise WireError(f"frame.messages[{i}]: a run of {n} from seqno {first} overflows the seqno range")
    for j, payload in enumerate(payloads):
        if type(payload) is not bytes:
            as_bytes(payload, f"frame.messages[{i}].payloads[{j}]", 0)
    builders = _RUN_BUILDER
    if not builders:
        raise WireError(f"frame.messages[{i}]: a run, but no protocol that decodes runs is loaded")
    builders[0](sender, first, flags, payloads, out)


def set_run_builder(builder: RunBuilder) -> None:
    """Make ``builder`` the one that turns a decoded run into messages (see ``RunBuilder``)."""
    _RUN_BUILDER[:] = [builder]
