"""The asyncio driver raises the garbage collector's thresholds, unless the application chose its own."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator

import pytest
from groupcluster.runtime.driver import GC_THRESHOLDS, Driver, tune_gc
from groupcluster.stacks import preset


@pytest.fixture(autouse=True)
def restore_gc() -> Iterator[None]:
    saved = gc.get_threshold()
    yield
    gc.set_threshold(*saved)


def test_defaults_are_raised_once() -> None:
    gc.set_threshold(700, 10, 10)
    assert tune_gc()
    assert gc.get_threshold() == GC_THRESHOLDS
    assert not tune_gc()  # already done


def test_thresholds_the_application_set_stay() -> None:
    gc.set_threshold(1000, 15, 15)
    assert not tune_gc()
    assert gc.get_threshold() == (1000, 15, 15)


def test_none_leaves_the_collector_alone() -> None:
    gc.set_threshold(700, 10, 10)
    assert not tune_gc(None)
    assert gc.get_threshold() == (700, 10, 10)


@pytest.mark.parametrize(("given", "expected"), [(GC_THRESHOLDS, GC_THRESHOLDS), (None, (700, 10, 10))])
def test_a_driver_tunes_when_it_opens(given: tuple[int, int, int] | None, expected: tuple[int, int, int]) -> None:
    gc.set_threshold(700, 10, 10)

    async def run() -> None:
        driver = Driver(preset("fifo"), cluster="gc", bind=("127.0.0.1", 0), gc_thresholds=given)
        await driver.open()
        try:
            assert gc.get_threshold() == expected
        finally:
            driver.close()

    asyncio.run(run())
