"""Named stack configurations (bottom first), and loading a stack configuration from YAML.

``fifo`` is reliable FIFO multicast and unicast with membership, merge, fragmentation and flow control;
``vsync`` adds FLUSH before every view change (virtual synchrony); ``total-order`` is ``vsync`` plus SEQUENCER.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from .core.errors import ConfigError
from .protocols import state_transfer as _state_transfer  # noqa: F401  # registers "state" (the presets use it)

FIFO: list[dict[str, Any]] = [
    {"layer": "transport"},
    {"layer": "discovery"},
    {"layer": "merge"},
    {"layer": "fd"},
    {"layer": "nakack"},
    {"layer": "unicast"},
    {"layer": "stable"},
    {"layer": "gms"},
    {"layer": "flow"},
    {"layer": "frag"},
]

# Virtual synchrony: every view change is preceded by a flush, so survivors deliver the same messages in the
# old view; NAKACK keeps delivered messages so any member can retransmit for one that crashed.
VSYNC: list[dict[str, Any]] = [
    {"layer": "transport"},
    {"layer": "discovery"},
    {"layer": "merge"},
    {"layer": "fd"},
    {"layer": "nakack", "retain_delivered": True},
    {"layer": "unicast"},
    {"layer": "stable"},
    {"layer": "gms", "use_flush": True},
    {"layer": "flow"},
    {"layer": "frag"},
    {"layer": "flush"},
    {"layer": "state"},
]

# Total order is virtual synchrony plus a sequencer: SEQUENCER above GMS (the coordinator numbers every
# multicast), FLUSH near the top so that it latches whole application messages and its round sees the
# sequencer's traffic below it drained. Unlike JGroups' sequencer.xml, FRAG sits below SEQUENCER: the
# sequencer then numbers whole messages, so a flush that ends an epoch cannot split one message's fragments
# between two epochs (a member merged in from the other side would receive only the second part).
TOTAL_ORDER: list[dict[str, Any]] = [
    *[dict(e) for e in VSYNC if e["layer"] not in ("flow", "frag", "flush", "state")],
    {"layer": "frag"},
    {"layer": "sequencer"},
    {"layer": "flow"},
    {"layer": "flush"},
    {"layer": "state"},
]

PRESETS: dict[str, list[dict[str, Any]]] = {"fifo": FIFO, "vsync": VSYNC, "total-order": TOTAL_ORDER}


def preset(name: str, overrides: dict[str, dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """A copy of preset ``name`` with per-layer parameter overrides ``{layer: {key: value}}``."""
    if name not in PRESETS:
        raise ConfigError(f"stack: unknown preset {name!r}; allowed values: {', '.join(sorted(PRESETS))}")
    spec = copy.deepcopy(PRESETS[name])
    for layer_name, params in (overrides or {}).items():
        entry = next((e for e in spec if e["layer"] == layer_name), None)
        if entry is None:
            raise ConfigError(
                f"stack overrides: layer {layer_name!r} is not in preset {name!r}; "
                f"allowed values: {', '.join(e['layer'] for e in spec)}"
            )
        entry.update(params)
    return spec


def load_stack_file(path: str | Path) -> list[dict[str, Any]]:
    """Read a YAML stack file: either a list of layers or ``{preset: NAME, overrides: {...}}``."""
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"stack file {path}: {exc}") from None
    if isinstance(data, dict) and "preset" in data:
        extra = set(data) - {"preset", "overrides"}
        if extra:
            raise ConfigError(f"stack file {path}: unknown key(s) {sorted(extra)}; allowed keys: overrides, preset")
        return preset(data["preset"], data.get("overrides"))
    if not isinstance(data, list):
        raise ConfigError(f"stack file {path}: expected a list of layers or a mapping with 'preset'")
    return data
