"""The options of the ``groupcluster`` Spark data source, parsed and checked in one place (pure, no Spark).

Spark hands a data source its options as strings in a case-insensitive map. :func:`parse_options` turns them
into a frozen :class:`GridOptions`; a bad or unknown option raises :class:`OptionError` naming the option, the
value and what is allowed, so a typo (``batchsize=1k``, ``membres=...``) fails the job before it reads or
writes anything instead of being ignored.

========================  ===========  ==========================================================================
option                    default      meaning
========================  ===========  ==========================================================================
``members``               (required)   comma-separated HTTP endpoints of grid members (``host:port`` or URL)
``keyType``               ``string``   read: ``string`` (UTF-8) or ``binary`` for the ``key`` column
``valueType``             ``binary``   read: ``binary`` or ``string`` (UTF-8) for the ``value`` column
``numPartitions``         0 (auto)     read: Spark partitions, each a group of segments (auto: 2 per member)
``pageSize``              5000         read: entries per segment-scan request (1..10000)
``batchSize``             1000         write: rows per batch request (1..10000)
``parallel``              4            write: batch requests in flight per Spark task
``keyColumn``             ``key``      write: the column holding the key (string or binary)
``valueColumn``           ``value``    write: the column holding the value (string or binary)
``nullValue``             ``error``    write: a null value fails the job (``error``) or deletes the key (``delete``)
``lifespan``              (none)       write: every entry written expires that long after its write (seconds or
                                       a duration: ``30``, ``30s``, ``5m``, ``2h``; docs/grid.md, "Expiry")
``timeout``               60           seconds a single grid operation may take, retries included
``retries``               10           retries on topology changes, 503/504 and broken connections
``startingOffsets``       ``earliest`` stream: ``earliest`` (every entry present, then changes) or ``latest``
========================  ===========  ==========================================================================

Names are matched ignoring case and underscores (``batch_size`` = ``batchSize``), as Spark users write both.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..grid.client import normalize_endpoint
from ..grid.lifespan import parse_lifespan


class OptionError(ValueError):
    """A ``groupcluster`` data source option is missing, unknown or has a bad value."""


@dataclass(frozen=True)
class GridOptions:
    """The checked options of one read, write or stream."""

    members: tuple[str, ...]
    key_type: str = "string"
    value_type: str = "binary"
    num_partitions: int = 0
    page_size: int = 5000
    batch_size: int = 1000
    parallel: int = 4
    key_column: str = "key"
    value_column: str = "value"
    null_value: str = "error"
    lifespan: float | None = None
    timeout: float = 60.0
    retries: int = 10
    starting_offsets: str = "earliest"


# canonical option name -> GridOptions field; lookups use the name folded by _fold.
_FIELDS = {
    "members": "members",
    "keyType": "key_type",
    "valueType": "value_type",
    "numPartitions": "num_partitions",
    "pageSize": "page_size",
    "batchSize": "batch_size",
    "parallel": "parallel",
    "keyColumn": "key_column",
    "valueColumn": "value_column",
    "nullValue": "null_value",
    "lifespan": "lifespan",
    "timeout": "timeout",
    "retries": "retries",
    "startingOffsets": "starting_offsets",
}
_CHOICES = {
    "key_type": ("string", "binary"),
    "value_type": ("binary", "string"),
    "null_value": ("error", "delete"),
    "starting_offsets": ("earliest", "latest"),
}
# (minimum, maximum) of the integer options; the server takes at most 10,000 operations or entries at once.
_INT_RANGES = {
    "num_partitions": (0, 65536),
    "page_size": (1, 10_000),
    "batch_size": (1, 10_000),
    "parallel": (1, 64),
    "retries": (0, 1000),
}
# Options Spark itself may put into a source's map; they mean nothing to us and are not typos.
_SPARK_OWN = frozenset({"path", "paths"})


def _fold(name: str) -> str:
    return name.replace("_", "").replace("-", "").lower()


_BY_FOLDED = {_fold(name): name for name in _FIELDS}


def parse_members(text: str) -> tuple[str, ...]:
    """``"h1:8080, http://h2:8080"`` -> normalized URLs; OptionError naming the bad endpoint."""
    out: list[str] = []
    for part in text.split(","):
        if not part.strip():
            continue
        try:
            out.append(normalize_endpoint(part))
        except ValueError as exc:
            raise OptionError(f"option members: bad endpoint {part.strip()!r} ({exc})") from None
    if not out:
        raise OptionError("option members: give at least one member endpoint, e.g. members=127.0.0.11:8080")
    return tuple(dict.fromkeys(out))


def parse_options(options: Mapping[str, str]) -> GridOptions:
    """Check every option Spark passed; unknown names and bad values raise :class:`OptionError`."""
    values: dict[str, object] = {}
    for raw_name, raw_value in options.items():
        name = _BY_FOLDED.get(_fold(raw_name))
        if name is None:
            if raw_name.lower() in _SPARK_OWN:
                continue
            allowed = ", ".join(sorted(_FIELDS))
            raise OptionError(f"unknown option {raw_name!r} for format groupcluster (options: {allowed})")
        field = _FIELDS[name]
        text = str(raw_value).strip()
        values[field] = _option_value(name, field, text, raw_value)
    if "members" not in values:
        raise OptionError(
            "option members is required: the HTTP endpoints of grid members, e.g. "
            ".option('members', '127.0.0.11:8080,127.0.0.12:8080')"
        )
    # Each value has its field's type (the branch of _option_value for that field makes it), which a dict with
    # one value type cannot say per key.
    return GridOptions(**values)  # type: ignore[arg-type]


def _option_value(name: str, field: str, text: str, raw_value: object) -> object:
    """The checked value of option ``name`` (for ``field``), given as ``text``."""
    if field == "members":
        return parse_members(text)
    elif field in _CHOICES:
        choice = text.lower()
        if choice not in _CHOICES[field]:
            raise OptionError(f"option {name}: {raw_value!r} is not one of {', '.join(_CHOICES[field])}")
        return choice
    elif field in _INT_RANGES:
        lo, hi = _INT_RANGES[field]
        try:
            number = int(text)
        except ValueError:
            raise OptionError(f"option {name}: expected an integer, got {raw_value!r}") from None
        if not lo <= number <= hi:
            raise OptionError(f"option {name}: {number} is outside [{lo}, {hi}]")
        return number
    elif field == "timeout":
        try:
            seconds = float(text.removesuffix("s"))
        except ValueError:
            raise OptionError(f"option timeout: expected seconds, e.g. 30 or 30s, got {raw_value!r}") from None
        if not 0 < seconds <= 3600:
            raise OptionError(f"option timeout: {seconds} is outside (0, 3600] seconds")
        return seconds
    elif field == "lifespan":
        try:
            return parse_lifespan(text)
        except ValueError as exc:
            raise OptionError(f"option {exc}") from None
    else:  # key_column, value_column
        if not text:
            raise OptionError(f"option {name}: empty column name")
        return text
