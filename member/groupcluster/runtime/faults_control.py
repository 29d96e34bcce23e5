"""Fault injection steered at run time through a small JSON file (``groupcluster member --faults-control PATH``).

The member polls ``PATH`` about every 0.2 s. Whenever the file changes (its modification time, size or inode:
replacing it with ``os.replace`` is the safe way to write it) its content is parsed and handed to the stack's
``faults`` layer as one :class:`~groupcluster.protocols.faults.SetFaults` event. The content is a JSON object
with any of the keys of that event; a key left out (or ``null``) leaves its setting unchanged::

    {"partitions": [{"start": "0s", "end": "60s",
                     "groups": [["127.0.0.1:7801"], ["127.0.0.1:7802", "127.0.0.1:7803"]]}]}
    {"partitions": []}                               # heal every partition
    {"drop_rate": 0.05, "delay": "20ms", "shuffle": true}

Partition windows count from the moment the member applies the file. Every member lists the same groups,
so both sides drop each other's frames (frames from another group are dropped on arrival, unicasts to it
before they leave); the other members see a member that went silent, and it sees them go silent.

A file that is not valid (not JSON, not an object, an unknown key, a bad rate, duration or endpoint) is logged
with the reason and ignored: a control file never takes a member down. A missing file applies nothing, and
deleting the file does not undo what was applied (write ``{"partitions": []}`` to heal). ``groupcluster
chaos`` cuts members off this way (:mod:`groupcluster.tools.chaos`).

:func:`with_faults_layer` puts a ``faults`` layer directly above the transport of a stack that has none (a
``faults`` layer with nothing configured passes batches through at the cost of one attribute test).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..core.errors import ConfigError
from ..core.units import parse_duration
from ..protocols.faults import SetFaults, parse_partitions

log = logging.getLogger("groupcluster.runtime.faults_control")

CONTROL_KEYS = tuple(f.name for f in dataclasses.fields(SetFaults))
POLL_INTERVAL = 0.2
# A control file is a few hundred bytes; anything far larger is a mistake (or not a control file at all).
MAX_CONTROL_BYTES = 1024 * 1024


def parse_control(text: str, where: str = "faults control") -> SetFaults:
    """The :class:`SetFaults` event a control file's ``text`` asks for; a :class:`ConfigError` naming the bad
    part otherwise (e.g. ``faults control m1.json.partitions[0].groups[1][0]: 'x' is not host:port``)."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{where}: not JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})") from None
    if not isinstance(doc, dict):
        raise ConfigError(
            f"{where}: expected a JSON object with any of the keys {', '.join(CONTROL_KEYS)}; "
            f"got {type(doc).__name__} {_short(doc)}"
        )
    unknown = sorted(k for k in doc if k not in CONTROL_KEYS)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)}; allowed keys: {', '.join(CONTROL_KEYS)}")
    fields: dict[str, Any] = {}
    for key in ("drop_rate", "duplicate_rate"):
        value = doc.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 <= value <= 1.0:
            raise ConfigError(f"{where}.{key}: {_short(value)} is not a probability between 0 and 1")
        fields[key] = float(value)
    for key in ("delay", "delay_jitter"):
        if doc.get(key) is not None:
            fields[key] = parse_duration(doc[key], where=f"{where}.{key}")
    if doc.get("shuffle") is not None:
        if not isinstance(doc["shuffle"], bool):
            raise ConfigError(f"{where}.shuffle: expected true or false, got {_short(doc['shuffle'])}")
        fields["shuffle"] = doc["shuffle"]
    if doc.get("partitions") is not None:
        # Parsed here, not in the layer: every endpoint is checked before anything is applied.
        fields["partitions"] = parse_partitions(doc["partitions"], f"{where}.partitions")
    return SetFaults(**fields)


def _short(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def partition_document(groups: Sequence[Sequence[str]], seconds: float) -> dict[str, Any]:
    """The control-file content of one partition between ``groups`` (``host:port`` lists) from now on, for at
    most ``seconds`` (the members heal on their own after that even if nobody writes the heal)."""
    return {"partitions": [{"start": 0, "end": round(seconds, 3), "groups": [list(g) for g in groups]}]}


HEAL_DOCUMENT: dict[str, Any] = {"partitions": []}


def write_control(path: str | Path, doc: dict[str, Any]) -> None:
    """Replace the control file at ``path`` atomically (a poller never reads half a file)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps(doc) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def with_faults_layer(spec: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``spec`` with a ``faults`` layer directly above the transport, unless it already has one."""
    if any(entry.get("layer") == "faults" for entry in spec):
        return spec
    at = next((i + 1 for i, entry in enumerate(spec) if entry.get("layer") == "transport"), None)
    if at is None:
        raise ConfigError("--faults-control: the stack has no transport layer to put a faults layer above")
    return [*spec[:at], {"layer": "faults"}, *spec[at:]]


class FaultsControl:
    """Polls a control file and passes every new valid content to ``control`` (normally ``Driver.control``)."""

    def __init__(
        self, path: str | Path, control: Callable[[SetFaults], object], *, interval: float = POLL_INTERVAL
    ) -> None:
        self.path = Path(path)
        self.control = control
        self.interval = interval
        self.applied = 0  # contents handed to the faults layer
        self.rejected = 0  # contents that were not valid (logged, ignored)
        self.last_error: str | None = None
        self._seen: tuple[int, int, int] | None = None
        self._task: asyncio.Task[None] | None = None

    def status(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "applied": self.applied,
            "rejected": self.rejected,
            "last_error": self.last_error,
        }

    def start(self) -> None:
        """Apply the file as it is now, then poll it from now on."""
        self.poll()
        self._task = asyncio.get_running_loop().create_task(self._run())

    def poll(self) -> bool:
        """Look at the file once; True if a new content was applied."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return False
        except OSError as exc:
            self._reject(f"cannot read it: {exc.strerror or exc}", None)
            return False
        key = (st.st_mtime_ns, st.st_size, st.st_ino)
        if key == self._seen:
            return False
        where = f"faults control {self.path}"
        try:
            if st.st_size > MAX_CONTROL_BYTES:
                raise ConfigError(
                    f"{where}: {st.st_size} bytes, more than a control file may hold ({MAX_CONTROL_BYTES})"
                )
            with open(self.path, "rb") as fh:
                text = fh.read(MAX_CONTROL_BYTES + 1).decode("utf-8")
            event = parse_control(text, where)
        except FileNotFoundError:
            return False  # replaced between stat and open: the next poll sees the new file
        except (ConfigError, OSError, UnicodeDecodeError) as exc:
            self._reject(str(exc), key)
            return False
        self._seen = key
        try:
            self.control(event)
        except ConfigError as exc:  # the layer's own checks (parse_control should have caught it)
            self._reject(str(exc), key)
            return False
        self.applied += 1
        self.last_error = None
        log.warning("faults control %s applied: %s", self.path, _describe(event))
        return True

    def _reject(self, why: str, key: tuple[int, int, int] | None) -> None:
        # Remember the rejected version, so one bad file is logged once rather than five times a second.
        if key is not None:
            self._seen = key
        elif why == self.last_error:
            return  # the same unreadable file again: logged already
        self.rejected += 1
        self.last_error = why
        log.warning("%s (ignored; the faults stay as they were)", why)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                self.poll()
            except Exception:  # a bug of ours must not end the polling (nor the member) silently
                log.exception("faults control %s: polling failed", self.path)

    def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()

    async def aclose(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


def _describe(event: SetFaults) -> str:
    parts = []
    for f in dataclasses.fields(event):
        value = getattr(event, f.name)
        if value is None:
            continue
        if f.name == "partitions":
            value = (
                "healed"
                if not value
                else "; ".join(
                    " | ".join(",".join(f"{h}:{p}" for h, p in sorted(g)) for g in w.groups)
                    + f" from {w.start:g}s to {w.end:g}s"
                    for w in value
                )
            )
        parts.append(f"{f.name}={value}")
    return ", ".join(parts) or "nothing"
