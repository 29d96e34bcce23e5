"""Whether the hot modules run compiled with mypyc (``scripts/build-compiled``) or interpreted.

The build leaves an extension module next to each compiled ``.py`` file, and Python's import system prefers an
extension to the source in the same directory. This module, run first by ``groupcluster/__init__.py``, decides
once per process, from the build's manifest ``_compiled.json``:

- compiled, when every compiled module's source still has the SHA-256 recorded at build time and
  ``GROUPCLUSTER_PURE`` is unset (or ``0``): the import system is left alone;
- interpreted otherwise (no build, ``GROUPCLUSTER_PURE=1``, a source edited since the build, a build for another
  interpreter): a finder placed first on ``sys.meta_path`` loads those modules from their ``.py`` files.

It is all or nothing: the compiled modules call each other's native code directly, so one of them interpreted
next to compiled ones would still run the others' compiled (possibly stale) code and meet two versions of
their classes.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

PURE_ENV = "GROUPCLUSTER_PURE"
PACKAGE_DIR = Path(__file__).resolve().parent
MANIFEST = PACKAGE_DIR / "_compiled.json"


@dataclass(frozen=True)
class Status:
    """What was built and what this process runs."""

    built: tuple[str, ...]  # the modules the last build compiled (empty without a build)
    compiled: bool  # whether they run compiled in this process
    reason: str  # why, in a few words

    def describe(self) -> str:
        if self.compiled:
            return f"compiled with mypyc: {len(self.built)} modules ({', '.join(self.built)})"
        built = f"; {len(self.built)} modules built" if self.built else ""
        return f"pure Python ({self.reason}{built})"


def source_path(module: str) -> Path:
    """The ``.py`` file of a module of this package."""
    return PACKAGE_DIR.joinpath(*module.split(".")[1:]).with_suffix(".py")


def decide(environ: Mapping[str, str]) -> Status:
    """What a process with environment ``environ`` would run (:func:`install` decides with ``os.environ``)."""
    try:
        manifest = json.loads(MANIFEST.read_text())
        digests: dict[str, str] = dict(manifest["modules"])
        suffix = str(manifest["suffix"])
    except FileNotFoundError:
        if any(PACKAGE_DIR.glob("_native__mypyc*")):
            # The build writes the manifest last: extension modules without one are an interrupted build.
            return Status((), False, "extension modules without a manifest; run scripts/build-compiled")
        return Status((), False, "not built; scripts/build-compiled builds it")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return Status((), False, f"unreadable {MANIFEST.name}: {exc!r}")
    built = tuple(digests)
    if environ.get(PURE_ENV, "") not in ("", "0"):
        return Status(built, False, f"{PURE_ENV} is set")
    if suffix != importlib.machinery.EXTENSION_SUFFIXES[0]:
        return Status(built, False, f"built for another interpreter ({suffix})")
    for module, digest in digests.items():
        src = source_path(module)
        if not src.with_suffix(suffix).exists():
            return Status(built, False, f"the extension of {module} is missing; run scripts/build-compiled")
        try:
            current = hashlib.sha256(src.read_bytes()).hexdigest()
        except OSError as exc:
            return Status(built, False, f"cannot read {src.name}: {exc}")
        if current != digest:
            return Status(built, False, f"{module} changed since the build; run scripts/build-compiled")
    return Status(built, True, "compiled")


class _SourceFinder(importlib.abc.MetaPathFinder):
    """Loads modules of this package from their ``.py`` files, ahead of the extension modules beside them: the
    named ones, or (``modules`` None, when which ones were compiled is unknown) every one that has a ``.py``."""

    def __init__(self, modules: Sequence[str] | None) -> None:
        self.modules = None if modules is None else frozenset(modules)

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if self.modules is None:
            if not fullname.startswith("groupcluster.") or not source_path(fullname).is_file():
                return None
        elif fullname not in self.modules:
            return None
        return importlib.util.spec_from_file_location(fullname, source_path(fullname))


_status: Status | None = None


def install() -> Status:
    """Decide (once per process) and, when the compiled modules are not to run, load their sources instead."""
    global _status
    if _status is None:
        _status = decide(os.environ)
        stray = "without a manifest" in _status.reason
        if (_status.built or stray) and not _status.compiled:
            sys.meta_path.insert(0, _SourceFinder(None if stray else _status.built))
        if stray or "changed since the build" in _status.reason or "missing" in _status.reason:
            # Someone built them and now does not get them: worth a word, unlike GROUPCLUSTER_PURE or no build.
            warnings.warn(f"groupcluster: running interpreted: {_status.reason}", RuntimeWarning, stacklevel=2)
    return _status


def status() -> Status:
    """What was built and whether this process runs it (see the module docstring)."""
    return install()


def running_compiled() -> list[str]:
    """The modules imported so far that run as compiled extension modules."""
    suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    return sorted(
        name
        for name, module in list(sys.modules.items())
        if name.startswith("groupcluster.")
        and "__mypyc" not in name  # the shared library holding the code of all of them
        and str(getattr(module, "__file__", None) or "").endswith(suffixes)
    )
