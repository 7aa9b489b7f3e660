"""Review of stop 31's ``gc_pacing`` (the young threshold put back by a gc callback at the first
collection after the last driver of the process ends): real drivers in threads of one process,
a run that raises out of its driver, and what is left behind afterwards (thresholds, the
callback, the module's counters).
"""

from __future__ import annotations

import gc
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

import raysaga
from raysaga import RunStatus, Workflow
from raysaga.orchestrator import gc_pacing
from raysaga.orchestrator.driver import Driver
from raysaga.orchestrator.executor_base import InlineExecutor
from raysaga.orchestrator.faults import FaultInjected, Faults
from raysaga.orchestrator.gc_pacing import YOUNG, paced_gc
from raysaga.state import SqlStore

DEFAULT = (700, 10, 10)

wf = Workflow("review_stop32_gc")


@wf.step
def plan(input: int) -> list[int]:
    return list(range(input))


@wf.map("plan")
def work(plan: int) -> dict[str, int]:
    return {"n": plan}


@wf.step
def total(work: list[dict[str, int]]) -> int:
    return len(work)


@pytest.fixture(autouse=True)
def _default_thresholds() -> Iterator[None]:
    before, enabled = gc.get_threshold(), gc.isenabled()
    gc.collect()
    gc.set_threshold(*DEFAULT)
    gc.enable()
    yield
    gc.collect()
    gc.set_threshold(*before)
    (gc.enable if enabled else gc.disable)()


def _left_behind() -> tuple[tuple[int, int, int], int, int, object]:
    gc.collect(0)
    return gc.get_threshold(), gc.callbacks.count(gc_pacing._put_back), gc_pacing._drivers, gc_pacing._saved


def test_real_drivers_in_threads_put_the_threshold_back_after_the_last(tmp_path: Path) -> None:
    """Two runs driven at once in two threads of one process, one of them ending in an error
    raised out of its driver: the threshold stays raised while either drives, and is back after."""
    seen: list[tuple[int, int, int]] = []
    errors: list[BaseException] = []
    inside = threading.Barrier(2, timeout=60)

    class Meeting(Faults):
        """Both drivers meet once mid-run (at a commit), so they overlap; one then fails."""

        def __init__(self, fail: bool) -> None:
            super().__init__("")
            self.active, self.fail, self.met = True, fail, False

        def hit(self, point: str, labels: object) -> None:
            if point == "after_commit" and not self.met:
                self.met = True
                seen.append(gc.get_threshold())
                inside.wait()
                gc.collect(0)  # a collection while both drive: nothing is put back
                seen.append(gc.get_threshold())
                inside.wait()
                if self.fail:
                    raise FaultInjected(point, "*")

    def drive(name: str, fail: bool) -> None:
        store = SqlStore(f"sqlite:///{tmp_path / name}.db")
        try:
            record = raysaga.create_run(wf, 50, store=store)
            Driver(wf, store, InlineExecutor(), record.run_id, faults=Meeting(fail)).drive()
        except BaseException as exc:  # (the thread's error, for the test to look at)
            errors.append(exc)
        finally:
            store.close()

    threads = [threading.Thread(target=drive, args=(f"t{i}", i == 1)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert [type(e) for e in errors] == [FaultInjected]
    assert seen and all(threshold[0] == YOUNG for threshold in seen)
    assert _left_behind() == (DEFAULT, 1, 0, None)


def test_many_runs_leave_one_callback_and_the_thresholds_as_they_were(tmp_path: Path) -> None:
    store = SqlStore(f"sqlite:///{tmp_path / 'r.db'}")
    try:
        for _ in range(5):
            assert raysaga.run(wf, 20, store=store, executor="inline").status == RunStatus.COMPLETED
            assert _left_behind() == (DEFAULT, 1, 0, None)
    finally:
        store.close()


def test_an_exception_inside_the_block_still_counts_the_driver_out() -> None:
    with pytest.raises(RuntimeError), paced_gc():
        assert gc.get_threshold()[0] == YOUNG
        raise RuntimeError("the run's error")
    assert _left_behind() == (DEFAULT, 1, 0, None)


def test_a_thread_starting_while_another_collects_is_not_left_unpaced() -> None:
    """A driver starting in one thread while the last one ended in another and no collection has
    run yet: the threshold it runs with is the raised one (kept, not put back under it)."""
    started, release = threading.Event(), threading.Event()
    during: list[tuple[int, int, int]] = []

    def second() -> None:
        with paced_gc():
            started.set()
            release.wait(timeout=60)
            gc.collect(0)
            during.append(gc.get_threshold())

    with paced_gc():
        pass
    t = threading.Thread(target=second)
    t.start()
    started.wait(timeout=60)
    gc.collect(0)  # a collection in this thread while the other drives
    during.append(gc.get_threshold())
    release.set()
    t.join(timeout=60)
    assert [d[0] for d in during] == [YOUNG, YOUNG]
    assert _left_behind() == (DEFAULT, 1, 0, None)


def test_a_process_forked_during_a_run_is_not_left_raised_for_good() -> None:
    """A child forked while a driver runs (multiprocessing's default start on Linux, from an inline
    step) has no driver of its own, and none will ever end in it: it inherits the count of the
    parent's drivers (one) and the raised threshold, which its collections can then never put back."""
    read, write = os.pipe()
    with paced_gc():
        pid = os.fork()
        if pid == 0:  # the child: report, and leave at once (no pytest, no finalizers)
            os.write(write, f"{gc_pacing._drivers} {gc.get_threshold()[0]}".encode())
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        drivers, threshold = map(int, f.read().split())
    os.waitpid(pid, 0)
    assert _left_behind() == (DEFAULT, 1, 0, None)  # the parent is fine
    assert drivers == 0, f"the child counts {drivers} driver(s) running and keeps the threshold at {threshold}"
