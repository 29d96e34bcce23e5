"""Discovery through a shared hosts file: members on one machine (or a shared volume) find each other.

Each member appends its ``host:port`` to the file under an exclusive ``fcntl.flock`` (so concurrent starts
never interleave half lines), then re-reads the file every ``interval`` seconds and hands the endpoints to
the stack as :class:`~groupcluster.core.events.UpdateHosts` whenever the set changes. Lines that are blank,
start with ``#`` or are not ``host:port`` are ignored (a bad line is logged once).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
from collections.abc import Callable
from pathlib import Path

from ..core.events import UpdateHosts
from .driver import parse_endpoint

log = logging.getLogger("groupcluster.runtime.file_discovery")

Endpoint = tuple[str, int]


def read_hosts(path: str | Path, warned: set[str] | None = None) -> tuple[Endpoint, ...]:
    """The endpoints listed in ``path`` in file order without duplicates; a missing file lists none."""
    try:
        with open(path, encoding="utf-8") as fh:
            fcntl.flock(fh.fileno(), fcntl.LOCK_SH)
            try:
                text = fh.read()
            finally:
                fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
    except FileNotFoundError:
        return ()
    seen: dict[Endpoint, None] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        try:
            seen[parse_endpoint(line, f"hosts file {path}")] = None
        except ValueError as exc:
            if warned is None or line not in warned:
                log.warning("%s (line ignored)", exc)
                if warned is not None:
                    warned.add(line)
    return tuple(seen)


def add_host(path: str | Path, endpoint: Endpoint) -> None:
    """Append ``endpoint`` to the hosts file unless it is already listed (atomic with respect to other members)."""
    line = f"{endpoint[0]}:{endpoint[1]}"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
    with os.fdopen(fd, "r+", encoding="utf-8") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            fh.seek(0)
            text = fh.read()
            if line in (raw.strip() for raw in text.splitlines()):
                return
            prefix = "" if not text or text.endswith("\n") else "\n"
            fh.write(f"{prefix}{line}\n")
            fh.flush()
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


class FileDiscovery:
    """Polls a hosts file and feeds changes to ``control`` (normally ``Driver.control``)."""

    def __init__(
        self,
        path: str | Path,
        endpoint: Endpoint,
        control: Callable[[UpdateHosts], object],
        *,
        interval: float = 1.0,
        extra_hosts: tuple[Endpoint, ...] = (),
    ) -> None:
        self.path = Path(path)
        self.endpoint = endpoint
        self.control = control
        self.interval = interval
        self.extra_hosts = extra_hosts
        self.hosts: tuple[Endpoint, ...] = ()
        self._warned: set[str] = set()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Register our endpoint, feed the current list, and poll from now on."""
        add_host(self.path, self.endpoint)
        self.poll()
        self._task = asyncio.get_running_loop().create_task(self._run())

    def poll(self) -> bool:
        """Re-read the file; returns True if the hosts changed (and were passed to the stack)."""
        try:
            listed = read_hosts(self.path, self._warned)
        except OSError as exc:
            log.warning("cannot read hosts file %s: %s", self.path, exc)
            return False
        hosts = tuple(dict.fromkeys((*self.extra_hosts, *listed)))
        if hosts == self.hosts:
            return False
        self.hosts = hosts
        self.control(UpdateHosts(hosts))
        return True

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            self.poll()

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def aclose(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
