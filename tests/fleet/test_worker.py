"""``raysaga worker`` processes drive submitted runs; a SIGTERM hands runs back; an approval waits
with nothing alive and a worker completes the run after a decision from another process.

Workers are real ``python -m raysaga worker`` processes on a real store; effects go to the
deduping fake provider over HTTP (the oracle: every effect once).
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

from raysaga import Client
from raysaga.state import RunStatus, SqlStore
from tests.support import REPO
from tests.support import fleet_flows as flows
from tests.support.crash_driver import process_gone, wait_until
from tests.support.processes import pids_mentioning
from tests.support.services import FakeServices
from tests.support.worker_procs import assert_effects_once, fleet_input, start_worker, stop


@pytest.fixture
def services() -> Iterator[FakeServices]:
    with FakeServices() as svc:
        yield svc


def test_worker_drives_submitted_runs_and_stops_clean(fleet_url: str, services: FakeServices,
                                                      tmp_path: Path) -> None:
    """On a store of its own (``fleet_url``): its figures are the whole store's, and runs an earlier
    test left in the session's shared PostgreSQL database counted there (37 of them under xdist)."""
    store_url = fleet_url
    trace = tmp_path / "trace.log"
    client = Client(store_url)
    worker = start_worker(store_url, "short")
    started = time.time()
    try:
        runs = [client.submit(flows.short, fleet_input(n, services, trace)).run_id for n in range(12)]
        assert {client.get_run(r).status for r in runs} <= {RunStatus.PENDING, RunStatus.RUNNING,
                                                             RunStatus.COMPLETED}
        wait_until(lambda: all(client.get_run(r).status == RunStatus.COMPLETED for r in runs), timeout=90,
                   what="the worker to complete 12 submitted runs")
        code, out, err = stop(worker)
        assert code == 0, err
        assert "claimed 12, completed 12" in out
        for n, run_id in enumerate(runs):
            run = client.get_run(run_id)
            assert run.output == flows.golden(n) and run.lease_owner is None
        assert_effects_once(services, [f"charge:charge-{n}" for n in range(12)]
                            + [f"email:email-{n}" for n in range(12)])
        figures = client.stats(since=started)
        assert figures.runs_by_state == {"completed": 12} and figures.claim_latency_seconds.count == 12
    finally:
        if worker.poll() is None:
            worker.kill()
        client.close()


def test_a_worker_drives_only_what_it_registered(sqlite_url: str, services: FakeServices, tmp_path: Path) -> None:
    client = Client(sqlite_url)
    try:
        other = client.submit(flows.approval, fleet_input(1, services, tmp_path / "t"))
        mine = client.submit(flows.short, fleet_input(2, services, tmp_path / "t"))
        worker = start_worker(sqlite_url, "short")
        wait_until(lambda: client.get_run(mine.run_id).status == RunStatus.COMPLETED, timeout=60,
                   what="the registered workflow's run to complete")
        code, _, err = stop(worker)
        assert code == 0, err
        assert client.get_run(other.run_id).status == RunStatus.PENDING  # not its workflow: left alone
    finally:
        client.close()


def test_worker_refuses_bad_configuration(sqlite_url: str, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    no_flow = subprocess.run([sys.executable, "-m", "raysaga", "worker", "--db", sqlite_url], cwd=REPO, env=env,
                             capture_output=True, text=True, timeout=60)
    assert no_flow.returncode == 2 and "--workflow MODULE:WF" in no_flow.stderr
    bad_limit = subprocess.run([sys.executable, "-m", "raysaga", "worker", "--db", sqlite_url, "-w",
                                "tests.support.fleet_flows:short", "--limit", "nope=3"], cwd=REPO, env=env,
                               capture_output=True, text=True, timeout=60)
    assert bad_limit.returncode == 2 and "--limit names nope" in bad_limit.stderr


def test_sigterm_hands_the_run_back_and_another_worker_finishes_it(sqlite_url: str, services: FakeServices,
                                                                    tmp_path: Path) -> None:
    """A worker SIGTERMed while a run is in flight (on Ray: the step is cancelled) releases the
    lease at once; a second worker takes the run without waiting for any lease to expire."""
    trace = tmp_path / "trace.log"
    client = Client(sqlite_url)
    first = start_worker(sqlite_url, "slow", lease_ttl=60.0)  # a long lease: only a hand-back frees it soon
    try:
        run = client.submit(flows.slow, fleet_input(7, services, trace))
        wait_until(lambda: trace.exists() and "start" in trace.read_text(), timeout=60,
                   what="the slow step to start in the first worker")
        first.send_signal(signal.SIGTERM)
        (tmp_path / "release").write_text("go")  # the inline step finishes; the driver stops at the boundary
        out, err = first.communicate(timeout=60)
        assert first.returncode == 0, err
        assert "handed back 1" in out
        handed = client.get_run(run.run_id)
        assert handed.status == RunStatus.RUNNING and handed.lease_owner is None  # no lease left behind
        second = start_worker(sqlite_url, "slow", lease_ttl=60.0)
        wait_until(lambda: client.get_run(run.run_id).status == RunStatus.COMPLETED, timeout=60,
                   what="the second worker to complete the handed-back run")
        code, _, err = stop(second)
        assert code == 0, err
        starts = [line for line in trace.read_text().splitlines() if line.startswith("start")]
        assert [line.split()[2] for line in starts] == ["wait", "after"]  # nothing ran twice
        assert_effects_once(services, ["charge:slow-7"])
    finally:
        for proc in (first,):
            if proc.poll() is None:
                proc.kill()
        client.close()


@pytest.mark.ray
def test_an_approval_holds_nothing_and_a_worker_completes_it(sqlite_url: str, services: FakeServices,
                                                             tmp_path: Path, ray_address: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_ADDRESS": ray_address}
    value = json.dumps({"n": 3, "services": services.url, "trace": str(tmp_path / "t")})
    driver = subprocess.Popen([sys.executable, "-m", "raysaga", "run", "tests.support.fleet_flows:approval",
                               "--db", sqlite_url, "--input", value, "--run-id", "appr-1", "--quiet"],
                              cwd=REPO, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _, err = driver.communicate(timeout=120)
    assert driver.returncode == 1, err  # not completed: it rests
    assert "raysaga approve" in err and "appr-1" in err
    assert process_gone(driver.pid)
    store = SqlStore(sqlite_url)
    try:
        run = store.get_run("appr-1")
        assert run.status == RunStatus.WAITING_HUMAN and run.lease_owner is None
        # nothing of the run is alive: no process (a Ray worker names itself ray::<task name>, and
        # raysaga names each task after its run) carries the run id
        assert pids_mentioning("appr-1") == []
        refused = subprocess.run([sys.executable, "-m", "raysaga", "approve", "appr-1", "review", "--by", "mallory",
                                  "--db", sqlite_url], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
        assert refused.returncode == 2 and "mallory may not decide" in refused.stderr
        inbox = subprocess.run([sys.executable, "-m", "raysaga", "inbox", "--for", "alice", "--db", sqlite_url],
                               cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
        assert "appr-1" in inbox.stdout and "charge 3?" in inbox.stdout
        worker = start_worker(sqlite_url, "approval", executor="ray")
        try:
            ok = subprocess.run([sys.executable, "-m", "raysaga", "approve", "appr-1", "review", "--by", "alice",
                                 "--comment", "fine", "--db", sqlite_url], cwd=REPO, env=env, capture_output=True,
                                text=True, timeout=60)
            assert ok.returncode == 0, ok.stderr
            wait_until(lambda: store.get_run("appr-1").status == RunStatus.COMPLETED, timeout=90,
                       what="the worker to complete the approved run")
        finally:
            code, _, werr = stop(worker)
        assert code == 0, werr
        assert_effects_once(services, ["charge:pay-3"])
        decision = [e for e in store.events("appr-1") if e.kind == "decision"]
        assert [(e.data["by"], e.data["verdict"]) for e in decision] == [("alice", "approve")]
    finally:
        store.close()
