"""Entry lifespans (docs/grid.md, "Expiry"): the bounds and the parsing shared by the member's HTTP API, the
clients and the Spark data source's ``lifespan`` option (pure; no I/O)."""

from __future__ import annotations

import math

from ..core.errors import ConfigError
from ..core.units import parse_duration

# The longest lifespan a PUT may give, in seconds (10 years of 365 days).
MAX_LIFESPAN_SECONDS = 315_360_000
LIFESPAN_PARAM = "lifespan"


def check_lifespan(seconds: float, where: str = LIFESPAN_PARAM, raw: str | None = None) -> float:
    """``seconds`` as a float if it is a usable lifespan (finite, above 0, at most :data:`MAX_LIFESPAN_SECONDS`);
    ValueError naming ``where`` otherwise (showing ``raw``, the text as given, when there is one)."""
    text = repr(seconds) if raw is None else repr(raw)
    shown = text if len(text) <= 40 else text[:40] + "..."
    # An int from a JSON body may be far beyond a float's range: compare it as an int, never convert it first.
    if isinstance(seconds, float) and not math.isfinite(seconds):
        raise ValueError(f"{where}: expected a finite number of seconds, got {shown}")
    if seconds <= 0:
        raise ValueError(f"{where}: expected seconds above 0, got {shown}")
    if seconds > MAX_LIFESPAN_SECONDS:
        raise ValueError(f"{where}: {shown} seconds exceed the limit of {MAX_LIFESPAN_SECONDS} (10 years)")
    return float(seconds)


def parse_lifespan(raw: str) -> float:
    """A lifespan given as text, in seconds: a decimal number (``30``, ``0.5``, ``1e3``) or a duration with a
    unit (``250ms``, ``30s``, ``5m``, ``2h``); ValueError says what is wrong with it."""
    try:
        seconds = float(raw)
    except ValueError:
        try:
            seconds = parse_duration(raw, where=LIFESPAN_PARAM)
        except ConfigError:
            shown = raw if len(raw) <= 40 else raw[:40] + "..."
            raise ValueError(
                f"{LIFESPAN_PARAM}: expected seconds (e.g. 30, 0.5, 1e3) or a duration (e.g. 30s, 5m, 2h; units: "
                f"us, ms, s, m, h), got {shown!r}"
            ) from None
    return check_lifespan(seconds, raw=raw)
