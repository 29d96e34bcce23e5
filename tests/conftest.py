"""Markers by directory: every test under tests/integration, tests/e2e and tests/spark carries the marker of
that name (registered in pyproject.toml), so ``-m`` can pick or leave out a kind of test without any test file
saying what it is. ``-m "not slow and not integration and not e2e and not spark"`` runs the pure tests."""

from __future__ import annotations

from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
# Directories whose tests need more than Python: real processes, a control plane, a Spark session.
BY_DIRECTORY = ("integration", "e2e", "spark")


@pytest.hookimpl(tryfirst=True)  # before the -m selection, which runs in the same hook
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        try:
            top = item.path.resolve().relative_to(TESTS).parts[0]
        except ValueError:
            continue
        if top in BY_DIRECTORY:
            item.add_marker(top)
