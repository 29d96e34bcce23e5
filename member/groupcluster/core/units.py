"""Readable units for configuration values: durations ("250ms", "3s", "1m") and sizes ("64KiB", "1MB")."""

from __future__ import annotations

import re

from .errors import ConfigError

_DURATION_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
}
_NUMBER_UNIT = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_duration(value: object, *, where: str = "value") -> float:
    """Return seconds for ``value``: a number (seconds) or a string such as ``"250ms"`` or ``"3s"``."""
    if isinstance(value, bool):
        raise ConfigError(f"{where}: expected a duration such as '3s' or '250ms', got {value!r}")
    if isinstance(value, int | float):
        if value < 0:
            raise ConfigError(f"{where}: a duration cannot be negative, got {value!r}")
        return float(value)
    if isinstance(value, str):
        match = _NUMBER_UNIT.match(value)
        if match:
            number, unit = match.groups()
            factor = _DURATION_UNITS.get(unit.lower() if unit else "s")
            if factor is not None:
                return float(number) * factor
    raise ConfigError(
        f"{where}: expected a duration such as '3s' or '250ms' (units: {', '.join(_DURATION_UNITS)}), got {value!r}"
    )


def parse_size(value: object, *, where: str = "value") -> int:
    """Return bytes for ``value``: an integer or a string such as ``"64KiB"`` or ``"1MB"``."""
    if isinstance(value, bool):
        raise ConfigError(f"{where}: expected a size such as '64KiB', got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ConfigError(f"{where}: a size cannot be negative, got {value!r}")
        return value
    if isinstance(value, str):
        match = _NUMBER_UNIT.match(value)
        if match:
            number, unit = match.groups()
            factor = _SIZE_UNITS.get(unit.lower())
            if factor is not None:
                return int(float(number) * factor)
    raise ConfigError(
        f"{where}: expected a size such as '64KiB' or '1MB' (units: B, KB, MB, GB, KiB, MiB, GiB), got {value!r}"
    )
