"""groupcluster.runtime.loop: which event loop members and clients run (uvloop, or asyncio's as the fallback)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import types
import warnings

import pytest
from groupcluster.runtime import loop


@pytest.fixture
def no_uvloop(monkeypatch: pytest.MonkeyPatch) -> None:
    """uvloop not installed: ``import uvloop`` raises ImportError, as it does without the ``fast`` extra."""
    monkeypatch.setitem(sys.modules, "uvloop", None)


@pytest.fixture
def fake_uvloop(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """An importable uvloop whatever is installed, so the choice itself is what is tested."""
    module = types.ModuleType("uvloop")
    module.__version__ = "9.9.9"  # type: ignore[attr-defined]
    module.new_event_loop = asyncio.new_event_loop  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "uvloop", module)
    return module


def test_uvloop_is_the_default_on_linux(fake_uvloop: types.ModuleType) -> None:
    for value in ("", "auto", " UVLOOP "):
        choice = loop.choose({loop.LOOP_ENV: value} if value else {}, "linux")
        assert choice.name == "uvloop" and choice.version == "9.9.9"
    assert loop.choose({}, "linux").describe() == "event loop: uvloop 9.9.9 (default on Linux)"
    assert loop.loop_factory(loop.choose({}, "linux")) is fake_uvloop.new_event_loop


def test_the_environment_variable_forces_asyncio(fake_uvloop: types.ModuleType) -> None:
    choice = loop.choose({loop.LOOP_ENV: "asyncio"}, "linux")
    assert choice == loop.Choice("asyncio", "GROUPCLUSTER_LOOP=asyncio")
    assert choice.describe() == "event loop: asyncio (GROUPCLUSTER_LOOP=asyncio)"
    assert loop.loop_factory(choice) is asyncio.new_event_loop


def test_other_platforms_default_to_asyncio(fake_uvloop: types.ModuleType) -> None:
    for platform in ("darwin", "win32", "freebsd14"):
        choice = loop.choose({}, platform)
        assert choice.name == "asyncio" and platform in choice.reason
    # Asked for by name, uvloop runs wherever it imports.
    assert loop.choose({loop.LOOP_ENV: "uvloop"}, "darwin").name == "uvloop"


def test_missing_uvloop_falls_back_unless_demanded(no_uvloop: None) -> None:
    choice = loop.choose({}, "linux")
    assert (
        choice.name == "asyncio" and "uvloop not installed" in choice.reason and "groupcluster[fast]" in choice.reason
    )
    with pytest.raises(loop.LoopError, match=r"GROUPCLUSTER_LOOP=uvloop but uvloop is not installed: pip install"):
        loop.choose({loop.LOOP_ENV: "uvloop"}, "linux")


def test_an_unknown_value_is_an_error_naming_the_choices() -> None:
    with pytest.raises(loop.LoopError, match=r"GROUPCLUSTER_LOOP='tokio': expected one of auto, uvloop, asyncio"):
        loop.choose({loop.LOOP_ENV: "tokio"}, "linux")


async def _loop_type() -> type:
    return type(asyncio.get_running_loop())


def test_run_uses_the_chosen_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    # The real uvloop: scripts/bootstrap installs it (the fast extra), so the suite runs on what members run.
    import uvloop

    monkeypatch.delenv(loop.LOOP_ENV, raising=False)
    monkeypatch.setattr(sys, "platform", "linux")
    assert loop.run(_loop_type()) is uvloop.Loop
    monkeypatch.setenv(loop.LOOP_ENV, "asyncio")
    ran = loop.run(_loop_type())
    assert not issubclass(ran, uvloop.Loop) and issubclass(ran, asyncio.BaseEventLoop)
    new = loop.new_loop()
    try:
        assert not isinstance(new, uvloop.Loop)
    finally:
        new.close()


def test_run_refuses_a_missing_uvloop_without_leaving_the_coroutine_unawaited(
    no_uvloop: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(loop.LOOP_ENV, "uvloop")
    coro = _loop_type()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "coroutine ... was never awaited" would be a RuntimeWarning
        with pytest.raises(loop.LoopError, match="pip install"):
            loop.run(coro)
    assert coro.cr_frame is None  # closed


def test_a_member_demanding_a_missing_uvloop_exits_with_the_fix() -> None:
    code = (
        "import sys; sys.modules['uvloop'] = None\n"
        "from groupcluster.cli import main\n"
        "sys.exit(main(['member', '--cluster', 'c', '--bind', '127.0.0.1:0']))\n"
    )
    env = {"GROUPCLUSTER_LOOP": "uvloop", "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == (
        "groupcluster member: error: GROUPCLUSTER_LOOP=uvloop but uvloop is not installed: "
        "pip install 'groupcluster[fast]' (or pip install uvloop), or unset GROUPCLUSTER_LOOP"
    )


def test_version_says_which_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "groupcluster.cli", "--version"],
        env={"GROUPCLUSTER_LOOP": "asyncio", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    assert out.splitlines()[-1] == "event loop: asyncio (GROUPCLUSTER_LOOP=asyncio)"
