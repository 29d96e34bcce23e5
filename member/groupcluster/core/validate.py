"""Strict validators for decoded wire values: each names the field that is wrong and why."""

from __future__ import annotations

from typing import Any, Final

from .address import Address
from .errors import WireError

MAX_HOST_LEN: Final = 255
MAX_INT: Final = 2**63 - 1


def as_int(value: Any, field: str, lo: int = 0, hi: int = MAX_INT) -> int:
    if type(value) is not int:
        raise WireError(f"{field}: expected an integer, got {type(value).__name__}")
    if not lo <= value <= hi:
        raise WireError(f"{field}: {value} is outside [{lo}, {hi}]")
    return value


def as_bool(value: Any, field: str) -> bool:
    if type(value) is not bool:
        raise WireError(f"{field}: expected a boolean, got {type(value).__name__}")
    return value


def as_str(value: Any, field: str, max_len: int = 1024) -> str:
    if type(value) is not str:
        raise WireError(f"{field}: expected a string, got {type(value).__name__}")
    if len(value) > max_len:
        raise WireError(f"{field}: string of {len(value)} characters exceeds the limit of {max_len}")
    return value


def as_bytes(value: Any, field: str, max_len: int) -> bytes:
    if type(value) is not bytes:
        raise WireError(f"{field}: expected bytes, got {type(value).__name__}")
    if len(value) > max_len:
        raise WireError(f"{field}: {len(value)} bytes exceed the limit of {max_len}")
    return value


def as_list(value: Any, field: str, max_len: int, exact: int | None = None) -> list[Any]:
    if type(value) is not list:
        raise WireError(f"{field}: expected a list, got {type(value).__name__}")
    if exact is not None and len(value) != exact:
        raise WireError(f"{field}: expected {exact} items, got {len(value)}")
    if len(value) > max_len:
        raise WireError(f"{field}: {len(value)} items exceed the limit of {max_len}")
    return value


# Decoded addresses by wire form. Frames name their sender, unicasts their destination, views and digests
# their members: handing out one object per member lets the dictionaries keyed by address on every message's
# path (receive windows, connections, credits) match on identity, without comparing fields.
_ADDRESSES: dict[tuple[str, int, int], Address] = {}
_MAX_ADDRESSES: Final = 4096


def known_address(value: Any) -> Address | None:
    """The address decoded before from the same wire form, or None (then use :func:`as_address`)."""
    if type(value) is list and len(value) == 3:
        host, port, incarnation = value
        # Exact types before the lookup: True == 1 and hashes alike, and must still be rejected.
        if type(host) is str and type(port) is int and type(incarnation) is int:
            return _ADDRESSES.get((host, port, incarnation))
    return None


def as_address(value: Any, field: str) -> Address:
    addr = known_address(value)
    if addr is not None:
        return addr
    items = as_list(value, field, 3, exact=3)
    addr = Address(
        as_str(items[0], f"{field}.host", MAX_HOST_LEN),
        as_int(items[1], f"{field}.port", 0, 65535),
        as_int(items[2], f"{field}.incarnation"),
    )
    if len(_ADDRESSES) >= _MAX_ADDRESSES:
        _ADDRESSES.clear()
    _ADDRESSES[(addr.host, addr.port, addr.incarnation)] = addr
    return addr


def as_optional_address(value: Any, field: str) -> Address | None:
    return None if value is None else as_address(value, field)


def as_address_list(value: Any, field: str, max_len: int = 4096) -> tuple[Address, ...]:
    return tuple(as_address(v, f"{field}[{i}]") for i, v in enumerate(as_list(value, field, max_len)))
