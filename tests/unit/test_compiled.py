"""groupcluster.compiled: when the mypyc-compiled modules run, and the finder that runs their sources instead."""

from __future__ import annotations

import hashlib
import json
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

import pytest
from groupcluster import compiled

SUFFIX = EXTENSION_SUFFIXES[0]
MODULES = ["groupcluster.core.wire", "groupcluster.protocols.nakack"]


@pytest.fixture
def package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A package directory with two built modules (sources, stand-in extensions, manifest)."""
    pkg = tmp_path / "groupcluster"
    digests = {}
    for module in MODULES:
        src = pkg.joinpath(*module.split(".")[1:]).with_suffix(".py")
        src.parent.mkdir(parents=True, exist_ok=True)
        src.write_text(f"NAME = {module!r}\n")
        src.with_suffix(SUFFIX).write_bytes(b"")
        digests[module] = hashlib.sha256(src.read_bytes()).hexdigest()
    (pkg / f"_native__mypyc{SUFFIX}").write_bytes(b"")
    (pkg / "_compiled.json").write_text(json.dumps({"modules": digests, "suffix": SUFFIX}))
    monkeypatch.setattr(compiled, "PACKAGE_DIR", pkg)
    monkeypatch.setattr(compiled, "MANIFEST", pkg / "_compiled.json")
    return pkg


def test_a_current_build_runs_compiled(package: Path) -> None:
    status = compiled.decide({})
    assert status == compiled.Status(tuple(MODULES), True, "compiled")
    assert status.describe().startswith("compiled with mypyc: 2 modules (groupcluster.core.wire, ")
    assert compiled.decide({compiled.PURE_ENV: "0"}).compiled


def test_groupcluster_pure_runs_the_sources(package: Path) -> None:
    status = compiled.decide({compiled.PURE_ENV: "1"})
    assert not status.compiled and status.built == tuple(MODULES)
    assert status.describe() == "pure Python (GROUPCLUSTER_PURE is set; 2 modules built)"


def test_a_source_edited_since_the_build_runs_every_source(package: Path) -> None:
    (package / "protocols" / "nakack.py").write_text("NAME = 'edited'\n")
    status = compiled.decide({})
    assert not status.compiled
    assert status.reason == "groupcluster.protocols.nakack changed since the build; run scripts/build-compiled"


def test_a_missing_extension_or_another_interpreter_runs_the_sources(package: Path) -> None:
    (package / "core" / "wire.py").with_suffix(SUFFIX).unlink()
    assert "the extension of groupcluster.core.wire is missing" in compiled.decide({}).reason
    manifest = json.loads((package / "_compiled.json").read_text())
    (package / "_compiled.json").write_text(json.dumps({**manifest, "suffix": ".other.so"}))
    assert compiled.decide({}).reason == "built for another interpreter (.other.so)"


def test_no_build_or_an_interrupted_one(package: Path) -> None:
    (package / "_compiled.json").unlink()
    assert compiled.decide({}) == compiled.Status(
        (), False, "extension modules without a manifest; run scripts/build-compiled"
    )
    (package / f"_native__mypyc{SUFFIX}").unlink()
    assert compiled.decide({}) == compiled.Status((), False, "not built; scripts/build-compiled builds it")
    (package / "_compiled.json").write_text("{not json")
    assert compiled.decide({}).reason.startswith("unreadable _compiled.json")


def test_the_finder_loads_sources_ahead_of_extensions(package: Path) -> None:
    named = compiled._SourceFinder(MODULES)
    spec = named.find_spec("groupcluster.core.wire", None)
    assert spec is not None and spec.origin == str(package / "core" / "wire.py")
    assert named.find_spec("groupcluster.core.view", None) is None  # not built: the import system finds it
    every = compiled._SourceFinder(None)  # which ones were built is unknown: every module that has a source
    spec = every.find_spec("groupcluster.protocols.nakack", None)
    assert spec is not None and spec.origin == str(package / "protocols" / "nakack.py")
    assert every.find_spec("groupcluster.protocols", None) is None  # a package: left to the import system
    assert every.find_spec("msgpack", None) is None
