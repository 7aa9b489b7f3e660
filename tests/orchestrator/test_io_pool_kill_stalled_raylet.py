"""A timed-out I/O call's actor process is gone when ``raysaga.run`` returns, even while the raylet
that would relay Ray's kill is not running.

``ray.kill`` returns once the GCS has marked the actor dead, and the driver hears of the death at
once (its stream fails, its cancellation settles), but the process is killed by its raylet, when
the raylet next runs. On a loaded 2-core host a nice'd raylet could be starved for longer than the
30 s ``test_io_bound.py`` waits, so the run returned with the stuck thread still running (that
test's flake). Here the raylet is stopped (SIGSTOP: a starved raylet, made deterministic) while the
second attempt runs: before the fix the run returned FAILED with that attempt's process alive, and
it exited only once the raylet was resumed; now the pool also SIGKILLs a killed actor's process
itself when it runs on the driver's host (``io_pool._kill_local``).

The raylet is stopped for a few seconds at most (the GCS declares a node dead after ~15 s of missed
health checks): every wait is on a condition, bounded well below that.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from functools import partial
from pathlib import Path

import pytest

import raysaga
from raysaga import RunStatus
from tests.support import crash_driver as harness
from tests.support.stuck_io import stuck_io_workflow

pytestmark = pytest.mark.ray

#: Seconds the raylet may stay stopped (well below the GCS's ~15 s to declare its node dead).
STALL_LIMIT = 8.0


@pytest.fixture(scope="module", autouse=True)
def _pickle_this_module_by_value() -> None:
    cloudpickle = pytest.importorskip("ray.cloudpickle")
    cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _exit_or_resume(pid: int, staller: threading.Thread) -> str | None:
    """'exited' once ``pid`` has; else 'resumed' once the raylet runs again (the staller ended)."""
    if harness.process_gone(pid):
        return "exited"
    return None if staller.is_alive() else "resumed"


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def test_a_timed_out_calls_process_is_gone_at_the_runs_end_while_its_raylet_is_stalled(
        ray_session: str, sqlite_url: str, tmp_path: Path) -> None:
    if not Path("/proc/self/stat").exists():
        pytest.skip("reads processes from /proc (Linux)")
    pids = tmp_path / "pids"
    wf = stuck_io_workflow("io-slow-stalled")

    stalled: dict[str, int] = {}
    run_over = threading.Event()

    def stall_the_raylet() -> None:
        """Once the second attempt runs, stop the raylet that hosts it until the run is over."""
        harness.wait_until(lambda: run_over.is_set() or (pids.exists() and len(pids.read_text().split()) == 2),
                           timeout=120, what="the second attempt to start")
        if run_over.is_set():
            return
        raylet = _parent(int(pids.read_text().split()[1]))
        if b"raylet" not in Path(f"/proc/{raylet}/cmdline").read_bytes():
            return  # not how Ray starts workers any more: the assertion below says so
        os.kill(raylet, signal.SIGSTOP)
        stalled["raylet"] = raylet
        run_over.wait(STALL_LIMIT)
        os.kill(raylet, signal.SIGCONT)

    staller = threading.Thread(target=stall_the_raylet, daemon=True)
    staller.start()
    try:
        record = raysaga.run(wf, str(pids), store=sqlite_url, executor="ray", address=ray_session)
        assert record.status == RunStatus.FAILED
        assert "raylet" in stalled, "the pool actor's parent is not the raylet"
        ran = [int(p) for p in pids.read_text().split()]
        assert len(ran) == 2 and os.getpid() not in ran
        # the raylet is still stopped: only the driver's own kill can have ended these processes
        for pid in ran:  # (a killed process is a zombie until the stopped raylet reaps it: gone)
            seen = harness.wait_until(partial(_exit_or_resume, pid, staller), timeout=STALL_LIMIT + 5,
                                      what=f"process {pid} to exit")
            assert seen == "exited", f"process {pid} outlived the run while its raylet was stopped"
    finally:
        run_over.set()
        staller.join(STALL_LIMIT + 5)
        if "raylet" in stalled:
            os.kill(stalled["raylet"], signal.SIGCONT)
