"""Fixtures for real-process tests on loopback."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from .procs import Members


@pytest.fixture
def members(tmp_path: Path) -> Iterator[Members]:
    """Starts member processes for a test and kills every one of them at the end, pass or fail."""
    group = Members(tmp_path)
    try:
        yield group
    finally:
        group.kill_all()
