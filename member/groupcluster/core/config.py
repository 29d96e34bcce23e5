"""Layer parameters: typed dataclasses whose fields say their unit, parsed with errors that name the key.

A layer declares ``Config`` as a dataclass built with :func:`param`; :func:`parse_params` turns a dict
(from YAML or code) into it, rejecting unknown keys and bad values with the allowed values in the message.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from .errors import ConfigError
from .units import parse_duration, parse_size

KINDS = ("duration", "size", "int", "float", "bool", "str", "choice", "hosts", "strs", "custom")


def param(
    default: Any,
    kind: str,
    *,
    doc: str = "",
    choices: tuple[str, ...] = (),
    minimum: float = 0,
    parser: Callable[[Any, str], Any] | None = None,
) -> Any:
    """Declare one layer parameter. ``kind`` is one of :data:`KINDS`; "custom" needs ``parser(value, where)``."""
    assert kind in KINDS, kind
    assert (kind == "custom") == (parser is not None), "a 'custom' parameter needs a parser, and only it"
    meta = {"kind": kind, "doc": doc, "choices": choices, "minimum": minimum, "parser": parser}
    # Defaults are written in readable units too ("3s"); store them converted, as parsed values are.
    converted = _convert(default, meta, "default")
    return dataclasses.field(default=converted, metadata=meta)


def _convert(value: Any, meta: Mapping[str, Any], where: str) -> Any:  # noqa: C901  one case per parameter kind
    kind = meta["kind"]
    minimum = meta.get("minimum", 0)
    if kind == "duration":
        out: Any = parse_duration(value, where=where)
    elif kind == "size":
        out = parse_size(value, where=where)
    elif kind == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        out = value
    elif kind == "float":
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        out = float(value)
    elif kind == "bool":
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true or false, got {value!r}")
        return value
    elif kind == "str":
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, got {value!r}")
        return value
    elif kind == "choice":
        if value not in meta["choices"]:
            raise ConfigError(f"{where}: {value!r} is not allowed; allowed values: {', '.join(meta['choices'])}")
        return value
    elif kind == "strs":
        if isinstance(value, str):
            value = [v for v in value.split(",") if v.strip()]
        if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{where}: expected a list of strings, got {value!r}")
        return tuple(v.strip() for v in value)
    elif kind == "hosts":
        return parse_hosts(value, where)
    elif kind == "custom":
        return meta["parser"](value, where)
    else:  # pragma: no cover - guarded by param()
        raise AssertionError(kind)
    if out < minimum:
        raise ConfigError(f"{where}: {value!r} is below the minimum {minimum}")
    return out


def parse_hosts(value: Any, where: str) -> tuple[tuple[str, int], ...]:
    """Parse endpoints given as ``"h1:7800,h2:7800"`` or a list of ``"host:port"`` strings."""
    if isinstance(value, str):
        value = [v for v in value.split(",") if v.strip()]
    if not isinstance(value, list | tuple):
        raise ConfigError(f"{where}: expected host:port entries, got {value!r}")
    hosts: list[tuple[str, int]] = []
    for item in value:
        if isinstance(item, list | tuple) and len(item) == 2:
            host, port = item
        elif isinstance(item, str):
            host, _, port_text = item.strip().rpartition(":")
            if not host or not port_text.isdigit():
                raise ConfigError(f"{where}: {item!r} is not host:port")
            port = int(port_text)
        else:
            raise ConfigError(f"{where}: {item!r} is not host:port")
        if not isinstance(port, int) or not 0 < port < 65536:
            raise ConfigError(f"{where}: port {port!r} is out of range 1-65535")
        hosts.append((str(host), port))
    return tuple(hosts)


def parse_params(config_cls: type, params: Mapping[str, Any], where: str) -> Any:
    """Build ``config_cls`` from ``params``; unknown keys and bad values raise :class:`ConfigError`."""
    fields = {f.name: f for f in dataclasses.fields(config_cls)}
    kwargs: dict[str, Any] = {}
    for key, value in params.items():
        fld = fields.get(key)
        if fld is None:
            allowed = ", ".join(sorted(fields)) or "(none)"
            raise ConfigError(f"{where}: unknown key {key!r}; allowed keys: {allowed}")
        kwargs[key] = _convert(value, fld.metadata, f"{where}.{key}")
    return config_cls(**kwargs)


def describe(config_cls: type) -> list[tuple[str, str, Any, str]]:
    """(name, kind, default, doc) for every parameter, for documentation and ``--help`` output."""
    rows = []
    for f in dataclasses.fields(config_cls):
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            raise TypeError(f"{config_cls.__name__}.{f.name}: a configuration parameter needs a default")
        rows.append((f.name, f.metadata.get("kind", "?"), default, f.metadata.get("doc", "")))
    return rows
