"""A crash loop under a fleet of ``raysaga worker`` processes, on SQLite and PostgreSQL.

Two workers (inline executor, one run at a time each, a short lease) share one store; whenever
one dies the test starts another, as a supervisor (systemd, Kubernetes) would. A run whose step
kills its process, or whose drivers are killed before its first commit, is parked after
``max_driver_deaths`` (3) deaths in a row, naming the step, and the fleet goes on: a healthy run
submitted beside it completes.

The gap shown here (``test_drivers_killed_before_the_first_commit_are_counted``): a driver
SIGKILLed between its claim and the run's first commit left the run ``pending``. A claim of a
pending run never said ``abandoned_by`` and the crash-loop check skipped pending runs, so the
fleet claimed it, lost a worker and claimed it again for ever (before the fix the test fails at
the 4th hold). A step that kills its process inline was already counted: the driver commits
``pending → running`` before it runs the first step (the first test shows it, with the fleet).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from raysaga import Client, RunOptions
from raysaga.state import EventRecord, NodeStatus, RunRecord, RunStatus, SqlStore
from tests.support import REPO
from tests.support import poison_fleet_stop29 as flows
from tests.support.crash_driver import wait_until

DEATHS = RunOptions().max_driver_deaths
MODULE = "tests.support.poison_fleet_stop29"



class Fleet:
    """``size`` worker processes kept alive: a dead one is replaced (its output kept in a file)."""

    def __init__(self, db: str, folder: Path, *names: str, env: dict[str, str] | None = None, size: int = 2) -> None:
        self.db, self.folder, self.names, self.size = db, folder, names, size
        self.env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
        self.procs: list[subprocess.Popen[bytes]] = []
        self.files: list[IO[bytes]] = []
        self.deaths: list[int] = []  # return codes of the workers that died
        for _ in range(size):
            self._start()

    def _start(self) -> None:
        args = [sys.executable, "-m", "raysaga", "worker", "--db", self.db, "--executor", "inline",
                "--lease-ttl", "2", "--poll", "0.05", "--concurrency", "1"]
        for name in self.names:
            args += ["--workflow", f"{MODULE}:{name}"]
        log = (self.folder / f"worker-{len(self.files)}.log").open("wb")
        self.files.append(log)
        self.procs.append(subprocess.Popen(args, cwd=REPO, env=self.env, stdout=log, stderr=subprocess.STDOUT))

    def replace_dead(self) -> None:
        for proc in [p for p in self.procs if p.poll() is not None]:
            self.procs.remove(proc)
            self.deaths.append(proc.returncode)
            self._start()

    def pids(self) -> set[int]:
        return {p.pid for p in self.procs if p.poll() is None}

    def logs(self) -> str:
        return "\n".join(f.name + ":\n" + Path(f.name).read_text(errors="replace")[-3000:] for f in self.files)

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            else:  # died since the last look: a worker may take its run over and end the wait first
                self.deaths.append(proc.returncode)
        for proc in self.procs:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for log in self.files:
            log.close()


def supervise(fleet: Fleet, until: Callable[[], bool], what: str, *, each: Callable[[], None] | None = None,
              timeout: float = 120.0) -> None:
    """Keep the fleet at its size (and call ``each``) until ``until()``; fail naming ``what``."""
    def check() -> bool:
        if each is not None:
            each()
        fleet.replace_dead()
        return until()

    try:
        wait_until(check, timeout=timeout, what=what, interval=0.05)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{fleet.logs()}") from None


def calls(folder: Path) -> list[str]:
    path = folder / "calls"
    return [line.split()[0] for line in path.read_text().splitlines()] if path.exists() else []


def run_of(db: str, run_id: str) -> tuple[RunRecord, list[EventRecord]]:
    store = SqlStore(db)
    try:
        return store.get_run(run_id), store.events(run_id)
    finally:
        store.close()


def status(db: str, run_id: str) -> RunStatus:
    return run_of(db, run_id)[0].status


def claims(events: list[EventRecord]) -> list[dict[str, Any]]:
    return [e.data for e in events if e.kind == "lease_claimed" and isinstance(e.data, dict)]


def assert_parked(run: RunRecord, events: list[EventRecord], step: str) -> None:
    assert run.status == RunStatus.FAILED, (run.status, run.status_reason)
    assert run.error is not None and run.error["type"] == "CrashLoop" and run.error["deaths"] == DEATHS
    assert run.error["suspects"] == [step]
    assert run.status_reason is not None and "crash loop" in run.status_reason and step in run.status_reason
    assert run.status_reason.endswith(f"`raysaga retry {run.run_id}`")
    assert [e.data for e in events if e.kind == "crash_loop"] == [{"deaths": DEATHS, "suspects": [step]}]
    assert run.lease_owner is None  # released: no worker is stuck on it


def submit(db: str, folder: Path, *flows_: Any) -> list[str]:
    tag = uuid.uuid4().hex[:6]
    with Client(db) as client:
        return [client.submit(wf, {"log_dir": str(folder)}, run_id=f"{wf.name}-{tag}").run_id for wf in flows_]


def test_a_first_step_that_kills_its_worker_is_parked_and_the_fleet_goes_on(fleet_url: str, tmp_path: Path) -> None:
    pill, healthy = submit(fleet_url, tmp_path, flows.pill, flows.healthy)
    fleet = Fleet(fleet_url, tmp_path, "pill", "healthy")
    try:
        supervise(fleet, lambda: status(fleet_url, pill) == RunStatus.FAILED
                  and status(fleet_url, healthy) == RunStatus.COMPLETED, "the pill parked, the healthy run done")
    finally:
        fleet.close()
    run, events = run_of(fleet_url, pill)
    assert_parked(run, events, "swallow")
    assert fleet.deaths == [-signal.SIGKILL] * DEATHS  # one worker per attempt, no more
    assert calls(tmp_path).count("swallow") == DEATHS
    assert [bool(c.get("abandoned_by")) for c in claims(events)] == [False] + [True] * DEATHS
    assert sorted(c for c in calls(tmp_path) if c != "swallow") == ["one", "two"]


def test_drivers_killed_before_the_first_commit_are_counted(fleet_url: str, tmp_path: Path) -> None:
    """An external killer SIGKILLs each worker that holds the run between its claim and the run's
    first commit, 3 times: the 4th claim parks the run (still ``pending`` until then) instead of
    starting it, and the step never ran."""
    holds = tmp_path / "holds"
    holds.mkdir()
    held, healthy = submit(fleet_url, tmp_path, flows.held, flows.healthy)
    killed: list[str] = []

    def killer() -> None:
        for marker in sorted(holds.glob("held-*")):
            if marker.name in killed:
                continue
            assert len(killed) < DEATHS, f"held a {len(killed) + 1}th time: the crash loop was not counted"
            killed.append(marker.name)
            os.kill(int(marker.name.split("-")[1]), signal.SIGKILL)

    fleet = Fleet(fleet_url, tmp_path, "held", "healthy", env={flows.HOLD_DIR: str(holds)})
    try:
        supervise(fleet, lambda: status(fleet_url, held) == RunStatus.FAILED
                  and status(fleet_url, healthy) == RunStatus.COMPLETED, "the held run parked, the healthy run done",
                  each=killer)
    finally:
        fleet.close()
    run, events = run_of(fleet_url, held)
    assert_parked(run, events, "only")
    assert len(killed) == DEATHS and fleet.deaths.count(-signal.SIGKILL) == DEATHS
    assert {(holds / name).read_text() for name in killed} == {"pending"}  # each died before the first commit
    assert "run_running" not in [e.kind for e in events]  # parked straight from pending
    assert [bool(c.get("abandoned_by")) for c in claims(events)] == [False] + [True] * DEATHS
    assert "only" not in calls(tmp_path)
    assert sorted(calls(tmp_path)) == ["one", "two"]


def test_a_driver_killed_once_before_the_first_commit_is_resumed(fleet_url: str, tmp_path: Path) -> None:
    holds = tmp_path / "holds"
    holds.mkdir()
    [held] = submit(fleet_url, tmp_path, flows.held)
    killed: list[str] = []

    def killer() -> None:
        for marker in holds.glob("held-*"):
            if marker.name not in killed:
                killed.append(marker.name)
                os.kill(int(marker.name.split("-")[1]), signal.SIGKILL)

    fleet = Fleet(fleet_url, tmp_path, "held", env={flows.HOLD_DIR: str(holds), flows.HOLD_TIMES: "1"})
    try:
        supervise(fleet, lambda: status(fleet_url, held) == RunStatus.COMPLETED, "the held run to complete",
                  each=killer)
    finally:
        fleet.close()
    run, events = run_of(fleet_url, held)
    assert len(killed) == 1 and calls(tmp_path) == ["only"]
    assert [bool(c.get("abandoned_by")) for c in claims(events)] == [False, True]
    assert "crash_loop" not in [e.kind for e in events] and run.error is None


def test_deaths_after_committed_steps_are_counted_from_the_progress(fleet_url: str, tmp_path: Path) -> None:
    """``a`` and ``b`` complete, then ``c`` kills its worker every time. The first death follows
    progress, so it is not counted: ``c`` runs ``DEATHS + 1`` times before the run is parked, and
    ``a`` and ``b`` are neither run again nor lost."""
    [late] = submit(fleet_url, tmp_path, flows.late_pill)
    fleet = Fleet(fleet_url, tmp_path, "late_pill")
    try:
        supervise(fleet, lambda: status(fleet_url, late) == RunStatus.FAILED, "the late pill to be parked")
    finally:
        fleet.close()
    run, events = run_of(fleet_url, late)
    assert_parked(run, events, "c")
    assert calls(tmp_path) == ["a", "b"] + ["c"] * (DEATHS + 1)
    assert fleet.deaths == [-signal.SIGKILL] * (DEATHS + 1)
    store = SqlStore(fleet_url)
    try:
        done = {n.node_id: n.output for n in store.nodes(late) if n.status == NodeStatus.COMPLETED}
        assert done == {"a": 1, "b": 2}
    finally:
        store.close()
