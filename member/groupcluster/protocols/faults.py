"""Fault injection for real-network tests (JGroups DISCARD, DELAY, DUPL, SHUFFLE, and scheduled partitions).

Placed directly above the transport. On the way up it drops messages (``drop_rate``), duplicates them
(``duplicate_rate``), shuffles the order within a batch (``shuffle``) and holds batches back for ``delay`` plus
up to ``delay_jitter`` (so batches can overtake each other). ``partitions`` is a schedule of time windows,
counted from the moment the layer started::

    partitions:
      - {start: 5s, end: 20s, groups: [["127.0.0.1:7800", "127.0.0.1:7801"], ["127.0.0.1:7802"]]}

While a window is active, frames from a member of another group are dropped on the way up and unicasts to
one are dropped on the way down; endpoints listed in no group are not affected. Every member runs the same
configuration, so real processes partition deterministically and heal when the window ends.
``SetFaults`` (a down event) changes any of this at run time; its windows count from when it is applied.
All randomness comes from the layer's seeded RNG.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..core import protocol_ids
from ..core.config import param
from ..core.errors import ConfigError
from ..core.events import Event
from ..core.layer import Layer, register_layer
from ..core.message import Message
from ..core.units import parse_duration

Endpoint = tuple[str, int]


@dataclass(frozen=True, slots=True)
class PartitionWindow:
    """From ``start`` to ``end`` (seconds after the schedule's origin) members only hear their own group."""

    start: float
    end: float
    groups: tuple[frozenset[Endpoint], ...]

    def group_of(self, endpoint: Endpoint) -> int:
        """Index of the group ``endpoint`` belongs to, or -1 if it is in none."""
        for i, group in enumerate(self.groups):
            if endpoint in group:
                return i
        return -1


_WINDOW_KEYS = ("start", "end", "groups")


def _parse_endpoint(value: Any, where: str) -> Endpoint:
    if isinstance(value, list | tuple) and len(value) == 2:
        host, port = value
    elif isinstance(value, str):
        host, sep, port_text = value.strip().rpartition(":")
        if not sep or not host or not port_text.isdigit():
            raise ConfigError(f"{where}: {value!r} is not host:port")
        port = int(port_text)
    else:
        raise ConfigError(f"{where}: {value!r} is not host:port")
    if not isinstance(host, str) or not host:
        raise ConfigError(f"{where}: {value!r} has no host")
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise ConfigError(f"{where}: port {port!r} is out of range 1-65535")
    return (host, port)


def parse_partitions(value: Any, where: str) -> tuple[PartitionWindow, ...]:
    """Validate a partition schedule; errors name the bad key, e.g. ``...partitions[0].groups[1][0]``."""
    if value is None:
        return ()
    if isinstance(value, str | bytes | Mapping) or not isinstance(value, list | tuple):
        raise ConfigError(f"{where}: expected a list of windows {{start, end, groups}}, got {value!r}")
    windows: list[PartitionWindow] = []
    for i, raw in enumerate(value):
        w = f"{where}[{i}]"
        if isinstance(raw, PartitionWindow):
            windows.append(raw)
            continue
        if not isinstance(raw, Mapping):
            raise ConfigError(f"{w}: expected a mapping with keys start, end, groups; got {raw!r}")
        unknown = sorted(str(k) for k in raw if k not in _WINDOW_KEYS)
        if unknown:
            raise ConfigError(f"{w}: unknown key(s) {', '.join(unknown)}; allowed keys: end, groups, start")
        for key in _WINDOW_KEYS:
            if key not in raw:
                raise ConfigError(f"{w}.{key}: missing (a window needs start, end and groups)")
        start = parse_duration(raw["start"], where=f"{w}.start")
        end = parse_duration(raw["end"], where=f"{w}.end")
        if end <= start:
            raise ConfigError(f"{w}.end: {raw['end']!r} must be later than start {raw['start']!r}")
        groups = _parse_groups(raw["groups"], f"{w}.groups")
        windows.append(PartitionWindow(start, end, tuple(groups)))
    return tuple(windows)


def _parse_groups(raw_groups: Any, where: str) -> list[frozenset[Endpoint]]:
    """A window's groups: at least two disjoint, non-empty lists of host:port (or comma-separated strings)."""
    if isinstance(raw_groups, str | bytes | Mapping) or not isinstance(raw_groups, list | tuple):
        raise ConfigError(f"{where}: expected a list of groups (lists of host:port), got {raw_groups!r}")
    if len(raw_groups) < 2:
        raise ConfigError(f"{where}: a partition needs at least 2 groups, got {len(raw_groups)}")
    groups: list[frozenset[Endpoint]] = []
    seen: dict[Endpoint, int] = {}
    for g, raw_group in enumerate(raw_groups):
        gw = f"{where}[{g}]"
        if isinstance(raw_group, str):
            raw_group = [v for v in raw_group.split(",") if v.strip()]
        if not isinstance(raw_group, list | tuple) or not raw_group:
            raise ConfigError(f"{gw}: expected a non-empty list of host:port, got {raw_group!r}")
        members: set[Endpoint] = set()
        for j, item in enumerate(raw_group):
            ep = _parse_endpoint(item, f"{gw}[{j}]")
            if ep in seen and seen[ep] != g:
                raise ConfigError(f"{gw}[{j}]: {ep[0]}:{ep[1]} is also in groups[{seen[ep]}]")
            seen[ep] = g
            members.add(ep)
        groups.append(frozenset(members))
    return groups


def _check_rate(value: float, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 <= value <= 1.0:
        raise ConfigError(f"{where}: {value!r} is not a probability between 0 and 1")
    return float(value)


@dataclass(frozen=True)
class FaultsConfig:
    drop_rate: float = param(0.0, "float", doc="probability that a message is dropped on the way up (0..1)")
    duplicate_rate: float = param(0.0, "float", doc="probability that a message is delivered twice (0..1)")
    delay: float = param(0.0, "duration", doc="how long batches are held on the way up")
    delay_jitter: float = param(0.0, "duration", doc="extra random delay up to this much (lets batches reorder)")
    shuffle: bool = param(False, "bool", doc="deliver the messages of a batch in random order")
    partitions: tuple[Any, ...] = param(
        (),
        "custom",
        parser=lambda value, where: parse_partitions(value, where),
        doc="time windows {start, end, groups: [[host:port, ...], ...]} during which groups are cut off",
    )


@dataclass(frozen=True, slots=True)
class SetFaults(Event):
    """Change fault injection at run time; ``None`` leaves a setting unchanged.

    ``partitions`` takes the same windows as the configuration (mappings or :class:`PartitionWindow`), with
    times counted from when the event is applied; ``()`` heals every partition.
    """

    drop_rate: float | None = None
    duplicate_rate: float | None = None
    delay: float | str | None = None
    delay_jitter: float | str | None = None
    shuffle: bool | None = None
    partitions: Any = None


@register_layer
class Faults(Layer):
    NAME = "faults"
    PROTO_ID = protocol_ids.FAULTS
    Config = FaultsConfig

    def __init__(self, config: FaultsConfig, ctx: Any) -> None:
        super().__init__(config, ctx)
        where = f"stack[{ctx.index}] (faults)"
        self.drop_rate = _check_rate(config.drop_rate, f"{where}.drop_rate")
        self.duplicate_rate = _check_rate(config.duplicate_rate, f"{where}.duplicate_rate")
        self.delay = config.delay
        self.delay_jitter = config.delay_jitter
        self.shuffle = config.shuffle
        self.windows = parse_partitions(config.partitions, f"{where}.partitions")
        self.origin = 0.0  # when the partition schedule's clock started
        self._delay_seq = 0
        self._held: dict[int, list[Message]] = {}
        self._active: PartitionWindow | None = None
        self._update_fast_path()

    def _update_fast_path(self) -> None:
        self._noop = not (
            self.drop_rate or self.duplicate_rate or self.delay or self.delay_jitter or self.shuffle or self.windows
        )

    def start(self) -> None:
        self.origin = self.now
        self._schedule_windows()

    def _schedule_windows(self) -> None:
        for i, w in enumerate(self.windows):
            t = self.origin + w.start - self.now
            if self.origin + w.end > self.now:
                self.set_timer(("window", i), max(0.0, t))
        self._refresh_window()

    # -- partitions ------------------------------------------------------------------------------------
    def _window_now(self) -> PartitionWindow | None:
        elapsed = self.now - self.origin
        for w in self.windows:
            if w.start <= elapsed < w.end:
                return w
        return None

    def _refresh_window(self) -> None:
        w = self._window_now()
        if w is not self._active:
            if w is None:
                self.ctx.log.warning("faults: partition healed")
                self.count("partitions_healed")
            else:
                me = self.local_address.endpoint
                self.ctx.log.warning("faults: partition active, this member in group %d", w.group_of(me))
                self.count("partitions_started")
            self._active = w

    def _cut_off(self, endpoint: Endpoint) -> bool:
        """True if ``endpoint`` is in another group than us under the window active now."""
        w = self._window_now()
        if w is None:
            return False
        mine = w.group_of(self.local_address.endpoint)
        other = w.group_of(endpoint)
        return mine >= 0 and other >= 0 and mine != other

    # -- traffic -------------------------------------------------------------------------------------
    def down(self, msg: Message) -> None:
        if self.windows and msg.dest is not None and self._cut_off(msg.dest.endpoint):
            self.count("partition_dropped_down")
            return
        self.below.down(msg)

    def up(self, batch: list[Message]) -> None:
        if self._noop:
            self.above.up(batch)
            return
        src = batch[0].src
        if self.windows and src is not None and self._cut_off(src.endpoint):
            self.count("partition_dropped", len(batch))
            return
        rng = self.ctx.rng
        if self.drop_rate or self.duplicate_rate:
            out: list[Message] = []
            drop, dup = self.drop_rate, self.duplicate_rate
            for msg in batch:
                if drop and rng.random() < drop:
                    self.count("dropped")
                    continue
                out.append(msg)
                if dup and rng.random() < dup:
                    self.count("duplicated")
                    out.append(msg.copy())
            batch = out
            if not batch:
                return
        if self.shuffle and len(batch) > 1:
            batch = list(batch)
            rng.shuffle(batch)
            self.count("shuffled")
        if self.delay or self.delay_jitter:
            delay = self.delay + (rng.uniform(0.0, self.delay_jitter) if self.delay_jitter else 0.0)
            self._delay_seq += 1
            self._held[self._delay_seq] = batch
            self.set_timer(("delay", self._delay_seq), delay)
            self.count("delayed", len(batch))
            return
        self.above.up(batch)

    def on_timer(self, key: Any) -> None:
        if type(key) is not tuple:
            return
        if key[0] == "delay":
            batch = self._held.pop(key[1], None)
            if batch:
                self.above.up(batch)
        elif key[0] == "window":
            self._refresh_window()
            w = self.windows[key[1]] if key[1] < len(self.windows) else None
            if w is not None and self.now < self.origin + w.end:
                # Wake again when this window ends, to log the heal.
                self.set_timer(key, self.origin + w.end - self.now)

    # -- control ----------------------------------------------------------------------------------------
    def down_event(self, event: Event) -> Any:
        if isinstance(event, SetFaults):
            self._apply(event)
            return None
        return self.below.down_event(event)

    def _apply(self, ev: SetFaults) -> None:
        where = "SetFaults"
        if ev.drop_rate is not None:
            self.drop_rate = _check_rate(ev.drop_rate, f"{where}.drop_rate")
        if ev.duplicate_rate is not None:
            self.duplicate_rate = _check_rate(ev.duplicate_rate, f"{where}.duplicate_rate")
        if ev.delay is not None:
            self.delay = parse_duration(ev.delay, where=f"{where}.delay")
        if ev.delay_jitter is not None:
            self.delay_jitter = parse_duration(ev.delay_jitter, where=f"{where}.delay_jitter")
        if ev.shuffle is not None:
            if not isinstance(ev.shuffle, bool):
                raise ConfigError(f"{where}.shuffle: expected true or false, got {ev.shuffle!r}")
            self.shuffle = ev.shuffle
        if ev.partitions is not None:
            windows = parse_partitions(ev.partitions, f"{where}.partitions")
            for i in range(len(self.windows)):
                self.cancel_timer(("window", i))
            self.windows = windows
            self.origin = self.now
            self._schedule_windows()
        self.count("settings_changed")
        self._update_fast_path()

    def stop(self) -> None:
        self._held.clear()

    def describe_state(self) -> dict[str, Any]:
        return {
            "drop_rate": self.drop_rate,
            "duplicate_rate": self.duplicate_rate,
            "delay": self.delay,
            "delay_jitter": self.delay_jitter,
            "shuffle": self.shuffle,
            "partition_active": self._window_now() is not None,
            "held_batches": len(self._held),
        }
