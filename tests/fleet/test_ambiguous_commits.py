"""Ambiguous commits: the database commits a driver's write, then the connection is lost before the
driver hears so. The worker drives the run again from what is durable, under its lease, and the
write is found, not made twice.

``RAYSAGA_FAULTS="after_commit:*=drop:0.5,after_pending:*=drop:0.5"`` (``orchestrator/faults.py``)
raises a ``ConnectionDropped`` right after a durable write of a step's outcome or of an effect's
``pending`` row, with an even chance, at most once per driver: about every other write is
answered by a lost connection, and each run needs several drivers. Checked on SQLite and PostgreSQL: every run
ends with its golden output, every effect takes effect once at the deduping provider (no effect
was called again for a ``pending`` row the driver did not know was durable), no ledger row is left
``pending``, and there is no false conflict: no driver lost its lease, no run failed, the worker
counted no failure. CI: 24 runs; ``RAYSAGA_FULL_SWEEP=1``: 400 runs (about 1,000 injections a
store).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from raysaga import Client, RunOptions, Worker
from raysaga.state import EffectStatus, RunStatus, SqlStore
from tests.support import fleet_flows as flows
from tests.support.crash_driver import wait_until
from tests.support.services import FakeServices, get_log
from tests.support.worker_procs import fleet_input

RUNS = 400 if os.environ.get("RAYSAGA_FULL_SWEEP") == "1" else 24
DROPS = "after_commit:*=drop:0.5,after_pending:*=drop:0.5"


@pytest.fixture
def services() -> Iterator[FakeServices]:
    with FakeServices() as svc:
        yield svc


def test_a_lost_answer_to_a_commit_is_found_not_redone(store_url: str, tmp_path: Path, services: FakeServices,
                                                       monkeypatch: pytest.MonkeyPatch,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    trace = tmp_path / "trace.log"
    client = Client(store_url)
    store = SqlStore(store_url)
    worker: Worker | None = None
    try:
        runs = [(client.submit(flows.short, fleet_input(n, services, trace)).run_id, n) for n in range(RUNS)]
        monkeypatch.setenv("RAYSAGA_FAULTS", DROPS)  # read by each driver the worker starts
        caplog.set_level(logging.WARNING, logger="raysaga.worker")
        worker = Worker([flows.short], store, concurrency=2, executor="inline", poll=0.02,
                        options=RunOptions(lease_ttl=5.0))
        thread = threading.Thread(target=worker.run, daemon=True)
        thread.start()
        wait_until(lambda: all(store.get_run(r).status in (RunStatus.COMPLETED, RunStatus.FAILED) for r, _ in runs),
                   timeout=240, what="every run at rest", interval=0.1)
        worker.stop()
        thread.join(timeout=60)
        assert not thread.is_alive()

        dropped = [r for r in caplog.records if "the store is unreachable" in r.getMessage()]
        assert len(dropped) >= 2 * RUNS, f"only {len(dropped)} injected drops for {RUNS} runs"
        assert worker.counts.failed == 0 and not [r for r in caplog.records if "lease" in r.getMessage()]
        for run_id, n in runs:
            run = store.get_run(run_id)
            assert (run.status, run.output) == (RunStatus.COMPLETED, flows.golden(n)), (run_id, run.status_reason)
            assert [e.idempotency_key for e in store.effects(run_id) if e.status != EffectStatus.COMMITTED] == []
            assert run.lease_owner is None
        provider = get_log(services.url)
        assert len(provider["by_subject"]) == 2 * RUNS and set(provider["by_subject"].values()) == {1}
        assert set(provider["effective"].values()) == {1}
        print(f"{len(dropped)} commits answered by a dropped connection over {RUNS} runs: "
              f"0 duplicate effects, 0 lost leases, 0 failed runs")
    finally:
        if worker is not None:
            worker.stop()
        store.close()
        client.close()
