"""A worker takes over at once a run whose driver died on its host: the dead driver's lease (here
600 s) does not hold the run up. Runs of live drivers and of other definitions are left alone.

Real processes: a ``raysaga run`` driver SIGKILLed mid-step, a ``raysaga worker`` process; real
SQLite; effects go to the deduping fake provider (the oracle: every effect once).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from raysaga import Workflow
from raysaga.orchestrator.ownership import new_owner
from raysaga.orchestrator.runner import create_run
from raysaga.orchestrator.worker import Worker
from raysaga.state import RunStatus, SqlStore
from tests.support import REPO
from tests.support import fleet_flows as flows
from tests.support.crash_driver import process_gone, wait_until
from tests.support.services import FakeServices
from tests.support.worker_procs import assert_effects_once, dead_owner, fleet_input, start_worker, stop

LONG_LEASE = 600.0  # far beyond the test's time limits: only a take-over frees the run in time


@pytest.fixture
def services() -> Iterator[FakeServices]:
    with FakeServices() as svc:
        yield svc


def test_a_worker_takes_over_a_sigkilled_drivers_run_without_waiting_for_its_lease(
        sqlite_url: str, services: FakeServices, tmp_path: Path) -> None:
    trace = tmp_path / "trace.log"
    value = json.dumps(fleet_input(5, services, trace))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    driver = subprocess.Popen([sys.executable, "-m", "raysaga", "run", "tests.support.fleet_flows:slow", "--db",
                               sqlite_url, "--input", value, "--run-id", "take-1", "--executor", "inline",
                               "--lease-ttl", str(LONG_LEASE), "--quiet"], cwd=REPO, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    store = SqlStore(sqlite_url)
    worker = None
    try:
        wait_until(lambda: (trace.exists() and "start" in trace.read_text()) or driver.poll() is not None,
                   timeout=60, what="the driver to start the blocking step")
        assert driver.poll() is None, driver.stderr.read() if driver.stderr else ""
        driver.send_signal(signal.SIGKILL)
        driver.wait(30)
        assert process_gone(driver.pid)
        held = store.get_run("take-1")
        assert held.status == RunStatus.RUNNING and held.lease_owner is not None
        assert (held.lease_expires_at or 0.0) > time.time() + LONG_LEASE / 2  # claim_next alone would wait
        dead = held.lease_owner
        (tmp_path / "release").write_text("go")  # the step, run again by the worker, ends at once
        worker = start_worker(sqlite_url, "slow", lease_ttl=LONG_LEASE)
        wait_until(lambda: store.get_run("take-1").status == RunStatus.COMPLETED, timeout=60,
                   what="the worker to take the dead driver's run over and complete it")
        code, out, err = stop(worker)
        assert code == 0, err
        assert "claimed 1, completed 1" in out
        claims = [e.data for e in store.events("take-1") if e.kind == "lease_claimed"]
        assert claims[-1]["taken_from"] == dead and claims[-1]["abandoned_by"] == dead  # a death, counted
        starts = [line.split()[2] for line in trace.read_text().splitlines() if line.startswith("start")]
        assert starts == ["wait", "wait", "after"]  # the step in flight at the kill runs again; nothing else
        assert_effects_once(services, ["charge:slow-5"])
    finally:
        if driver.poll() is None:
            driver.kill()
        if worker is not None and worker.poll() is None:
            worker.kill()
        store.close()


def test_only_runs_of_gone_drivers_and_registered_definitions_are_taken(sqlite_url: str, tmp_path: Path) -> None:
    store = SqlStore(sqlite_url)
    try:
        other = Workflow(flows.slow.name)  # the same name, another definition

        @other.step()
        def only(x: int = 0) -> int:
            return x

        value = {"n": 1, "services": "http://127.0.0.1:9", "trace": str(tmp_path / "t")}  # nothing runs
        live = create_run(flows.slow, value, store=store, run_id="live")
        changed = create_run(other, None, store=store, run_id="changed")
        orphan = create_run(flows.slow, value, store=store, run_id="orphan")
        dead = dead_owner()
        store.claim(live.run_id, new_owner(), LONG_LEASE)  # this process: alive
        store.claim(changed.run_id, dead, LONG_LEASE)
        worker = Worker([flows.slow], store, executor="inline", poll=60.0)
        assert worker.claim_orphan() is None  # nothing running yet: pending runs are claim_next's
        store.claim(orphan.run_id, dead, LONG_LEASE)
        for run_id in ("live", "changed", "orphan"):
            store.transition(run_id, store.get_run(run_id).version, RunStatus.RUNNING)
        worker._next_scan = 0.0  # the test looks again at once instead of after a poll
        taken = worker.claim_orphan()
        assert taken is not None and taken.lease.run_id == "orphan" and taken.reason == "takeover"
        assert store.get_run("orphan").lease_owner == taken.lease.owner
        assert store.get_run("live").lease_owner != taken.lease.owner
        assert store.get_run("changed").lease_owner == dead
        worker._next_scan = 0.0
        assert worker.claim_orphan() is None  # the one orphan is taken; the rest are not ours to take
    finally:
        store.close()

