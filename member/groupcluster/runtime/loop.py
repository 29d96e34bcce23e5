"""The event loop of members, drivers and clients: uvloop (libuv) on Linux when it is installed, else asyncio's.

``GROUPCLUSTER_LOOP`` chooses: unset (or ``auto``) takes uvloop where it is importable on Linux and the standard
loop elsewhere; ``asyncio`` forces the standard loop (to measure the difference, or to rule uvloop out);
``uvloop`` demands uvloop and fails with :class:`LoopError` when it is missing rather than quietly running slower.
The standard library's loop stays the fallback because uvloop is an optional extra (``groupcluster[fast]``).
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any, TypeVar

LOOP_ENV = "GROUPCLUSTER_LOOP"
CHOICES = ("auto", "uvloop", "asyncio")
INSTALL_HINT = "pip install 'groupcluster[fast]' (or pip install uvloop)"

T = TypeVar("T")


class LoopError(RuntimeError):
    """``GROUPCLUSTER_LOOP`` asks for a loop this process cannot have."""


@dataclass(frozen=True)
class Choice:
    """Which loop a process runs, and why."""

    name: str  # "uvloop" or "asyncio"
    reason: str
    version: str = ""  # uvloop's, when it is the choice

    def describe(self) -> str:
        if self.name == "uvloop":
            return f"event loop: uvloop {self.version} ({self.reason})"
        return f"event loop: asyncio ({self.reason})"


def _import_uvloop() -> ModuleType | None:
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop


def choose(environ: Mapping[str, str] | None = None, platform: str | None = None) -> Choice:
    """The loop a process with environment ``environ`` on ``platform`` (default: this process's) runs."""
    env = os.environ if environ is None else environ
    plat = sys.platform if platform is None else platform
    wanted = env.get(LOOP_ENV, "").strip().lower() or "auto"
    if wanted not in CHOICES:
        raise LoopError(f"{LOOP_ENV}={env.get(LOOP_ENV)!r}: expected one of {', '.join(CHOICES)}")
    if wanted == "asyncio":
        return Choice("asyncio", f"{LOOP_ENV}=asyncio")
    uvloop = _import_uvloop()
    if wanted == "uvloop":
        if uvloop is None:
            raise LoopError(f"{LOOP_ENV}=uvloop but uvloop is not installed: {INSTALL_HINT}, or unset {LOOP_ENV}")
        return Choice("uvloop", f"{LOOP_ENV}=uvloop", uvloop.__version__)
    if not plat.startswith("linux"):
        # uvloop is what members run on Linux (containers, CI); elsewhere the standard loop is the tested one.
        return Choice("asyncio", f"not Linux ({plat})")
    if uvloop is None:
        return Choice("asyncio", f"uvloop not installed; {INSTALL_HINT}")
    return Choice("uvloop", "default on Linux", uvloop.__version__)


def loop_factory(choice: Choice | None = None) -> Callable[[], asyncio.AbstractEventLoop]:
    """A function that makes a new loop of the chosen kind (for ``asyncio.Runner(loop_factory=...)``)."""
    choice = choose() if choice is None else choice
    if choice.name == "uvloop":
        uvloop = _import_uvloop()
        if uvloop is None:
            raise LoopError(f"uvloop was chosen but cannot be imported: {INSTALL_HINT}")
        factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
        return factory
    return asyncio.new_event_loop


def new_loop() -> asyncio.AbstractEventLoop:
    """A new event loop of the chosen kind, not set as the current one."""
    return loop_factory()()


def run(main: Coroutine[Any, Any, T], *, debug: bool | None = None) -> T:
    """Run ``main`` to completion on a new loop of the chosen kind, as ``asyncio.run`` does on the standard one."""
    try:
        factory = loop_factory()
    except LoopError:
        main.close()  # never started: closing it spares a "coroutine was never awaited" warning
        raise
    with asyncio.Runner(debug=debug, loop_factory=factory) as runner:
        return runner.run(main)
