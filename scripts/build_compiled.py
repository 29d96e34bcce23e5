"""Compile the hot, typed modules of the group stack with mypyc (it ships with mypy, in the test extra).

    .venv/bin/python scripts/build_compiled.py           build (scripts/build-compiled wraps this)
    .venv/bin/python scripts/build_compiled.py --clean   remove every compiled output

mypyc writes one extension module next to each ``.py`` file plus one shared library holding the code of all of
them (``member/groupcluster/_native__mypyc*.so``); the ``.py`` files stay the source and the fallback. The build
ends by writing ``member/groupcluster/_compiled.json``, the list of compiled modules with the SHA-256 of the source
each was built from: :mod:`groupcluster._compiled` reads it at import and runs the compiled modules only while
every source still matches and ``GROUPCLUSTER_PURE`` is not set (CONTRIBUTING.md, "Compiled modules").
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import sys
import time
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "member"
PACKAGE = SRC / "groupcluster"
MANIFEST = PACKAGE / "_compiled.json"
# The shared library is named after this group: inside the package, so the editable install's finder (which maps
# only the package) finds it; a top-level ``<hash>__mypyc`` module would not be importable.
GROUP = "groupcluster._native"
BUILD_DIR = ROOT / "build" / "mypyc"

# The multicast and total-order hot path: the wire codec and what it decodes into, the stack's dispatch, the
# layers every application message crosses (DISCOVERY, MERGE, FD and STABLE too: each scans every message
# going up for its header), and the total-order stack's SEQUENCER and STATE (their packages but STATE's events,
# dataclasses of the interpreted Event). GMS, FLUSH and the drivers stay interpreted; they subclass and call these
# as before.
MODULES = [
    "groupcluster.core.address",
    "groupcluster.core.validate",
    "groupcluster.core.message",
    "groupcluster.core.wire",
    "groupcluster.core.layer",
    "groupcluster.core.stack",
    "groupcluster.protocols.transport",
    "groupcluster.protocols.discovery",
    "groupcluster.protocols.merge",
    "groupcluster.protocols.fd",
    "groupcluster.protocols.nakack",
    "groupcluster.protocols.unicast",
    "groupcluster.protocols.stable",
    "groupcluster.protocols.frag",
    "groupcluster.protocols.flow",
    "groupcluster.protocols.sequencer.wire",
    "groupcluster.protocols.sequencer.state",
    "groupcluster.protocols.sequencer.forwarding",
    "groupcluster.protocols.sequencer.member",
    "groupcluster.protocols.sequencer.coordinator",
    "groupcluster.protocols.sequencer.view_sync",
    "groupcluster.protocols.sequencer.layer",
    "groupcluster.protocols.state_transfer.wire",
    "groupcluster.protocols.state_transfer.state",
    "groupcluster.protocols.state_transfer.donor",
    "groupcluster.protocols.state_transfer.joiner",
    "groupcluster.protocols.state_transfer.layer",
]


def source_path(module: str) -> Path:
    return SRC.joinpath(*module.split(".")).with_suffix(".py")


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def compiled_outputs() -> list[Path]:
    """Every file a build leaves in the source tree (for any interpreter's extension suffix)."""
    found = [*PACKAGE.glob("_native__mypyc*"), MANIFEST]
    for module in MODULES:
        src = source_path(module)
        found += [p for p in src.parent.glob(src.stem + ".*") if p.suffix in (".so", ".pyd") and p.name != src.name]
    return [p for p in found if p.exists()]


def clean() -> None:
    for path in compiled_outputs():
        path.unlink()
    shutil.rmtree(BUILD_DIR, ignore_errors=True)
    with contextlib.suppress(OSError):
        BUILD_DIR.parent.rmdir()  # build/, if nothing else is in it


def build() -> int:
    from mypyc.build import mypycify
    from setuptools import Distribution

    # The old outputs go first: a module dropped from MODULES must not keep running from a stale extension, and
    # without a manifest a failed build leaves the package pure rather than half compiled.
    clean()
    started = time.monotonic()
    os.chdir(ROOT)  # mypy reads its configuration from pyproject.toml here
    paths = [str(source_path(m).relative_to(ROOT)) for m in MODULES]
    extensions = mypycify(paths, group_name=GROUP, target_dir=str(BUILD_DIR / "c"), opt_level="3")
    # A bare Distribution, not setup(): that would read pyproject.toml's [project] table, which is the package's
    # metadata and not this build's business.
    dist = Distribution({"name": "groupcluster-compiled", "package_dir": {"": "member"}, "ext_modules": extensions})
    dist.verbose = False
    build_ext = dist.get_command_obj("build_ext")
    build_ext.inplace = True
    build_ext.build_temp = str(BUILD_DIR / "temp")
    build_ext.build_lib = str(BUILD_DIR / "lib")
    dist.run_command("build_ext")
    suffix = EXTENSION_SUFFIXES[0]
    missing = [m for m in MODULES if not source_path(m).with_suffix(suffix).exists()]
    if missing:
        print(f"build-compiled: no extension module for {', '.join(missing)}", file=sys.stderr)
        return 1
    import mypy.version

    manifest = {
        "mypy": mypy.version.__version__,
        "python": sys.version.split()[0],
        "suffix": suffix,
        "modules": {m: sha256(source_path(m)) for m in MODULES},
    }
    MANIFEST.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    print(f"build-compiled: {len(MODULES)} modules compiled in {time.monotonic() - started:.0f} s")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clean", action="store_true", help="remove the compiled modules and the build directory")
    args = parser.parse_args(argv)
    if args.clean:
        clean()
        return 0
    return build()


if __name__ == "__main__":
    sys.exit(main())
