"""The young-generation threshold a driver raises (``gc_pacing``) goes back at the first collection
after the last driver of the process ends, not at once: at once, the next allocation collected
the run's last young objects while they were still alive."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from raysaga.orchestrator import gc_pacing
from raysaga.orchestrator.gc_pacing import YOUNG, paced_gc


@pytest.fixture(autouse=True)
def _default_thresholds() -> Iterator[None]:
    before, enabled = gc.get_threshold(), gc.isenabled()
    gc.collect()  # anything a test before left pending is put back first
    gc.set_threshold(700, 10, 10)
    gc.enable()
    yield
    gc.collect()
    gc.set_threshold(*before)
    (gc.enable if enabled else gc.disable)()


def test_raised_while_driving_and_put_back_at_the_next_collection() -> None:
    with paced_gc():
        assert gc.get_threshold() == (YOUNG, 10, 10)
    assert gc.get_threshold() == (YOUNG, 10, 10)  # no collection yet: still raised
    gc.collect(0)
    assert gc.get_threshold() == (700, 10, 10)


def test_put_back_only_after_the_last_of_concurrent_drivers() -> None:
    with paced_gc():
        with paced_gc():
            pass
        gc.collect(0)
        assert gc.get_threshold()[0] == YOUNG  # one driver still runs
    gc.collect(0)
    assert gc.get_threshold()[0] == 700


def test_a_driver_that_starts_before_the_put_back_keeps_it_raised() -> None:
    with paced_gc():
        pass
    with paced_gc():
        gc.collect(0)
        assert gc.get_threshold()[0] == YOUNG
    gc.collect(0)
    assert gc.get_threshold()[0] == 700
    assert gc_pacing._saved is None


def test_a_process_s_own_setting_is_left_alone() -> None:
    gc.set_threshold(100_000, 10, 10)
    with paced_gc():
        assert gc.get_threshold()[0] == 100_000
    gc.collect(0)
    assert gc.get_threshold()[0] == 100_000
    gc.set_threshold(700, 10, 10)
    gc.disable()
    with paced_gc():
        assert gc.get_threshold()[0] == 700
    gc.collect(0)
    assert gc.get_threshold()[0] == 700


def test_a_threshold_changed_meanwhile_is_not_overwritten() -> None:
    with paced_gc():
        pass
    gc.set_threshold(5_000, 10, 10)  # the application's own, after the driver ended
    gc.collect(0)
    assert gc.get_threshold()[0] == 5_000
