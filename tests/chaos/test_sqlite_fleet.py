"""SQLite under a fleet: 4 ``raysaga worker`` processes drive N runs on one SQLite file while
clients submit and read; no caller ever sees "database is locked".

Three submitter threads (each with its own ``Client``) submit the ``short`` fleet flow
(``prepare → charge → email → finish``, two effects at the deduping provider) while 4 worker
processes (concurrency 2 each: 8 drivers writing the one file) drive them, and a reader thread
lists runs and reads them back the whole time. Checks: every submit and every read succeeded
(no exception, so no ``database is locked``); every run completed with its golden output, its
lease released, nothing left pending in the ledger; every effect took effect once; the workers
exited cleanly on SIGTERM and no worker's log mentions a locked database or a traceback.
CI: N=40; ``RAYSAGA_FULL_SWEEP=1``: N=1,000 (``RAYSAGA_CHAOS_FLEET_RUNS``).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from raysaga import Client
from raysaga.state import EffectStatus, RunStatus, SqlStore
from tests.support import fleet_flows as flows
from tests.support.crash_driver import wait_until
from tests.support.kill_sweep import FULL_SWEEP
from tests.support.services import FakeServices, get_log
from tests.support.worker_procs import fleet_input, start_worker

LONG = 4 * 3600  # seconds: a full sweep's own time limit
RUNS = int(os.environ.get("RAYSAGA_CHAOS_FLEET_RUNS", "1000" if FULL_SWEEP else "40"))
WORKERS, SUBMITTERS = 4, 3


@pytest.fixture
def services() -> Iterator[FakeServices]:
    with FakeServices() as svc:
        yield svc


@pytest.mark.timeout(LONG if FULL_SWEEP else 300)  # the suite-wide 300 s stops a full sweep
def test_four_workers_on_one_sqlite_file(tmp_path: Path, services: FakeServices) -> None:
    db = f"sqlite:///{tmp_path / 'fleet.db'}"
    trace = tmp_path / "trace.log"
    Client(db).close()  # the schema exists before anyone races to make it
    workers = [start_worker(db, "short", lease_ttl=2.0, concurrency=2) for _ in range(WORKERS)]
    errors: list[str] = []
    runs: dict[str, int] = {}
    lock = threading.Lock()
    submitting = threading.Event()
    submitting.set()
    started = time.monotonic()

    def submitter(offset: int) -> None:
        with Client(db) as client:
            for n in range(offset, RUNS, SUBMITTERS):
                try:
                    run_id = client.submit(flows.short, fleet_input(n, services, trace)).run_id
                except Exception as exc:
                    with lock:
                        errors.append(f"submit {n}: {type(exc).__name__}: {exc}")
                    continue
                with lock:
                    runs[run_id] = n

    reads = 0

    def reader() -> None:
        """What a dashboard or ``raysaga list``/``status`` does meanwhile: list, read, count."""
        nonlocal reads
        reading = SqlStore(db)
        try:
            with Client(db) as client:
                while submitting.is_set():
                    try:
                        for summary in reading.list_runs(limit=20):
                            client.get_run(summary.run_id)
                        client.stats()
                        reads += 1
                    except Exception as exc:
                        with lock:
                            errors.append(f"read: {type(exc).__name__}: {exc}")
        finally:
            reading.close()

    threads = [threading.Thread(target=submitter, args=(i,)) for i in range(SUBMITTERS)]
    threads.append(threading.Thread(target=reader))
    store = SqlStore(db)
    try:
        for thread in threads:
            thread.start()
        for thread in threads[:SUBMITTERS]:
            thread.join()
        submitting.clear()
        threads[-1].join()
        assert errors == [], errors[:10]
        assert len(runs) == RUNS

        def all_done() -> bool:
            return all(store.get_run(run_id).status in (RunStatus.COMPLETED, RunStatus.FAILED) for run_id in runs)

        wait_until(all_done, timeout=1800 if FULL_SWEEP else 300, what=f"{RUNS} runs to complete", interval=0.25)
        elapsed = time.monotonic() - started
        for worker in workers:  # all at once: each finishes its in-flight runs and exits
            worker.send_signal(signal.SIGTERM)
        outs = []
        for worker in workers:
            out, err = worker.communicate(timeout=120)
            outs.append((worker.returncode, out, err))
        for code, _, err in outs:
            assert code == 0, err[-3000:]
            assert "database is locked" not in err and "Traceback" not in err, err[-3000:]
        for run_id, n in runs.items():
            run = store.get_run(run_id)
            assert (run.status, run.output, run.lease_owner) == (RunStatus.COMPLETED, flows.golden(n), None), run
            assert {e.status for e in store.effects(run_id)} == {EffectStatus.COMMITTED}
        log = get_log(services.url)
        assert len(log["by_subject"]) == 2 * RUNS and set(log["by_subject"].values()) == {1}
        assert set(log["effective"].values()) == {1}
        claimed = sum(int(out.split("claimed ")[1].split(",")[0]) for _, out, _ in outs if "claimed " in out)
        print(f"sqlite fleet: {RUNS} runs, {WORKERS} workers, {elapsed:.1f}s ({RUNS / elapsed:.1f} runs/s), "
              f"{claimed} claims, {reads} reader passes, 0 caller errors")
    finally:
        submitting.clear()
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.communicate()
        store.close()
