"""An ``on_progress=`` callback that raises does not derail the run it displays: its exception is
logged once at WARNING with its traceback, it is not called again for this run, and the run goes
on to the same end as without it. Before, the exception propagated out of ``run()`` mid-run (the
lease released; only a ``resume`` finished the run). ``KeyboardInterrupt`` still stops the driver."""

from __future__ import annotations

import logging
import uuid
from typing import Any

import pytest

import raysaga
from raysaga import Workflow
from raysaga.orchestrator.progress import Progress
from raysaga.state import RunStatus, SqlStore


def _chain() -> Workflow:
    wf = Workflow(f"progress_stop28_{uuid.uuid4().hex[:8]}")

    @wf.step()
    def one() -> int:
        return 1

    @wf.step()
    def two(one: int) -> int:
        return one + 1

    @wf.step()
    def three(two: int) -> int:
        return two + 1

    return wf


def test_a_raising_callback_is_logged_once_dropped_and_the_run_goes_on(
        store_url: str, caplog: pytest.LogCaptureFixture) -> None:
    calls: list[int] = []

    def broken_display(p: Progress) -> None:
        calls.append(p.done)
        raise RuntimeError("the terminal went away")

    wf = _chain()
    with caplog.at_level(logging.WARNING, logger="raysaga.driver"):
        result = raysaga.run(wf, store=store_url, executor="inline", on_progress=broken_display)
    assert result.status == RunStatus.COMPLETED, result.error
    assert result.output == {"three": 3}
    assert len(calls) == 1  # not called again for this run
    [record] = [r for r in caplog.records if "progress callback" in r.getMessage()]
    assert record.levelno == logging.WARNING
    assert "broken_display" in record.getMessage() and "not called again" in record.getMessage()
    assert record.exc_info is not None and "the terminal went away" in str(record.exc_info[1])
    store = SqlStore(store_url)
    try:
        assert store.get_run(result.run_id).lease_owner is None
    finally:
        store.close()


def test_a_good_callback_is_called_at_every_step_and_a_bad_one_only_loses_itself() -> None:
    seen: list[int] = []

    def divide(p: Progress) -> None:
        seen.append(p.done // 0)

    progress = Progress(total=3)
    progress.listeners += [lambda p: seen.append(p.done), divide, lambda p: seen.append(-p.done)]
    for done in (1, 2, 3):
        progress.report(type("Counts", (), {"done": done, "failed": 0})())
    assert seen == [1, -1, 2, -2, 3, -3]
    assert len(progress.listeners) == 2


def test_keyboard_interrupt_in_a_callback_still_stops_the_driver(store_url: str) -> None:
    def interrupt(p: Any) -> None:
        raise KeyboardInterrupt

    wf = _chain()
    with pytest.raises(KeyboardInterrupt):
        raysaga.run(wf, store=store_url, run_id=f"kbd-{uuid.uuid4().hex[:8]}", executor="inline",
                    on_progress=interrupt)
