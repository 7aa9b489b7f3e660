"""PostgreSQL crashes and comes back under a working fleet: nothing lost, nothing done twice, no run
stuck, no worker dead.

A PostgreSQL server of the test's own (``tests.support.private_postgres``: the session's server is
shared by every test) is stopped with ``-m immediate`` (a crash, to its clients) and started again
over and over while 3 ``raysaga worker`` processes drive runs submitted as the chaos goes on. Every
run must end with its golden output, every effect take effect once at the deduping provider, no
ledger row stay ``pending``, no lease stay held, no run be parked as a crash loop, every run be at
rest within 60 s of the last restart, and every worker still be alive and stop clean (exit 0) on
SIGTERM, with no unexpected error in its log.

CI: 36 runs, a crash every 1-3 s, down 0.2-1 s. ``RAYSAGA_FULL_SWEEP=1``: the acceptance's 1,000
runs, a crash every 5-40 s, down up to 2 s.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import raysaga
from raysaga import Client
from raysaga.state import EffectStatus, RunStatus, SqlStore
from tests.support import REPO, private_postgres
from tests.support import fleet_flows as flows
from tests.support.crash_driver import wait_until
from tests.support.private_postgres import retrying, submit_once
from tests.support.services import FakeServices, get_log
from tests.support.worker_procs import fleet_input, start_worker

FULL = os.environ.get("RAYSAGA_FULL_SWEEP") == "1"
RUNS = 1000 if FULL else 36
WORKERS = 3
EVERY = (5.0, 40.0) if FULL else (1.0, 3.0)  # seconds between crashes
DOWN = (0.5, 2.0) if FULL else (0.2, 1.0)  # seconds the server stays down
MIN_CRASHES = 3 if FULL else 4
LEASE_TTL = 3.0
SETTLED_WITHIN = 60.0  # the acceptance: no run stuck 60 s after the end of the chaos

pytestmark = pytest.mark.skipif(private_postgres.available() is not None,
                                reason=f"no private PostgreSQL server here: {private_postgres.available()}")


@pytest.fixture
def services() -> Iterator[FakeServices]:
    with FakeServices() as svc:
        yield svc



class Drained:
    """Reads a worker's stderr as it comes, so its log can never fill the pipe and block it."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self.lines: list[str] = []
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line)


def test_a_fleet_rides_out_postgres_crashes(tmp_path: Path, services: FakeServices) -> None:
    pg = private_postgres.PrivatePostgres()
    pg.start()
    crashes: list[float] = []
    stop_chaos = threading.Event()
    rng = random.Random(int(os.environ.get("RAYSAGA_CHAOS_SEED", "11")))

    def chaos() -> None:
        while not stop_chaos.wait(rng.uniform(*EVERY)):  # the chaos schedule, not a synchronisation
            pg.crash()
            crashes.append(time.time())
            time.sleep(rng.uniform(*DOWN))  # how long the server stays down
            pg.start()

    raysaga.open_store(pg.url).close()  # migrated before the chaos starts
    client = Client(pg.url)
    reader = SqlStore(pg.url)
    workers = [Drained(start_worker(pg.url, "short", lease_ttl=LEASE_TTL)) for _ in range(WORKERS)]
    trace = tmp_path / "trace.log"
    submitted: list[tuple[str, int]] = []
    crasher = threading.Thread(target=chaos, daemon=True)
    try:
        crasher.start()
        for n in range(RUNS):  # runs arrive while the server crashes
            submitted.append((submit_once(client, flows.short, fleet_input(n, services, trace), f"dbr-{n}"), n))
            if n % 3 == 2:
                time.sleep(0.1)  # pacing the arrivals over the chaos (not a synchronisation)
        wait_until(lambda: len(crashes) >= MIN_CRASHES, timeout=120, what=f"{MIN_CRASHES} crashes of the server")
        stop_chaos.set()
        crasher.join(timeout=60)
        assert not crasher.is_alive()
        ended = time.time()

        def all_at_rest() -> bool:
            return all(reader.get_run(run_id).status in (RunStatus.COMPLETED, RunStatus.FAILED)
                       for run_id, _ in submitted)

        wait_until(lambda: retrying(all_at_rest), timeout=SETTLED_WITHIN, what="every run at rest", interval=0.2)
        settled = time.time() - ended
        for worker in workers:
            assert worker.proc.poll() is None, f"a worker died:\n{''.join(worker.lines[-40:])}"
            worker.proc.send_signal(signal.SIGTERM)
        for worker in workers:
            worker.proc.wait(timeout=60)
            worker.thread.join(timeout=10)
            log = "".join(worker.lines)
            assert worker.proc.returncode == 0, log[-4000:]
            assert "unexpected error" not in log and "Traceback" not in log, log[-4000:]

        for run_id, n in submitted:
            run = reader.get_run(run_id)
            assert (run.status, run.output) == (RunStatus.COMPLETED, flows.golden(n)), (run_id, run.status_reason)
            assert run.lease_owner is None, f"{run_id} still leased by {run.lease_owner}"
            assert [e.idempotency_key for e in reader.effects(run_id) if e.status != EffectStatus.COMMITTED] == []
            assert not [e for e in reader.events(run_id) if e.kind == "crash_loop"]
        provider = get_log(services.url)
        assert len(provider["by_subject"]) == 2 * RUNS and set(provider["by_subject"].values()) == {1}
        assert set(provider["effective"].values()) == {1}
        print(f"postgres crashed {len(crashes)} times under {WORKERS} workers and {RUNS} runs: all completed "
              f"{settled:.1f} s after the last crash, {len(provider['calls'])} provider calls for {2 * RUNS} "
              "effects, 0 duplicates")
    finally:
        stop_chaos.set()
        for worker in workers:
            if worker.proc.poll() is None:
                worker.proc.kill()
        reader.close()
        client.close()
        pg.close()


def test_a_foreground_run_whose_store_drops_says_how_to_go_on(tmp_path: Path) -> None:
    """``raysaga run`` in a terminal: the store crashes under the driver. It stops as after a crash,
    says so in one line with the command that continues (exit 2, no traceback), and that command
    finishes the run once the server is back."""
    pg = private_postgres.PrivatePostgres()
    pg.start()
    try:
        cmd = [sys.executable, "-m", "raysaga", "run", "tests.support.slow_flow:wf", "--db", pg.url,
               "--run-id", "slow-1", "--executor", "inline", "--quiet", "--input", json.dumps({"dir": str(tmp_path)})]
        proc = subprocess.Popen(cmd, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        wait_until((tmp_path / "started").exists, timeout=120, what="the step to start")
        pg.crash()
        (tmp_path / "go").touch()  # the step returns; its driver meets a store that is gone
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 2, (out, err)
        assert err.startswith("store unreachable:") and "`raysaga resume slow-1` continues the run" in err, err
        assert "Traceback" not in err
        pg.start()
        resumed = subprocess.run([sys.executable, "-m", "raysaga", "resume", "slow-1", "--db", pg.url, "--quiet",
                                  "--executor", "inline"], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                                 capture_output=True, text=True, timeout=120)
        assert resumed.returncode == 0, resumed.stderr
        store = SqlStore(pg.url)
        try:
            assert store.get_run("slow-1").output == {"after": "held then after"}
        finally:
            store.close()
    finally:
        pg.close()


def test_the_python_api_says_the_store_dropped_and_names_the_run(tmp_path: Path) -> None:
    """``raysaga.run`` from Python: the store crashes under the driver. The call raises
    ``StoreOutageError`` (a ``StoreUnavailableError``) naming the run and how to continue, not
    SQLAlchemy's raw ``OperationalError``; ``raysaga.resume`` then finishes the run."""
    from tests.support import slow_flow

    pg = private_postgres.PrivatePostgres()
    pg.start()
    try:
        outcome: dict[str, BaseException] = {}

        def drive() -> None:
            try:
                raysaga.run(slow_flow.wf, {"dir": str(tmp_path)}, store=pg.url, run_id="slow-py", executor="inline")
            except BaseException as exc:  # handed to the test thread
                outcome["error"] = exc

        thread = threading.Thread(target=drive)
        thread.start()
        wait_until((tmp_path / "started").exists, timeout=120, what="the step to start")
        pg.crash()
        (tmp_path / "go").touch()
        thread.join(timeout=120)
        assert not thread.is_alive()
        error = outcome.get("error")
        assert isinstance(error, raysaga.StoreOutageError), repr(error)
        assert isinstance(error, raysaga.StoreUnavailableError)
        assert error.run_id == "slow-py"
        assert "`raysaga resume slow-py`" in str(error) and error.cause in str(error)
        pg.start()
        done = raysaga.resume(slow_flow.wf, "slow-py", store=pg.url, executor="inline")
        assert done.status == RunStatus.COMPLETED and done.output == {"after": "held then after"}
    finally:
        pg.close()
