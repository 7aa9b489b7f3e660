"""``raysaga launch`` and the views of a launched run, as a review found them (stop 46).

- A launched run whose Ray job failed before its driver started stayed ``pending`` with nothing
  saying so, and ``status --watch`` waited forever: the launch now appends an event ``launched``
  (the job's id and address), ``status`` (text and ``--json``) names the job and what to do, and
  ``status --watch`` stops with exit 1 once the job has ended; a run not launched is never given
  up on (``launch_marks.watch_stop``).
- Ctrl-C between recording the run and submitting its job left a run nobody had the id of: the
  id and how to start it are said.
- ``status --watch`` piped printed an unchanging run's view every interval (its age changes).
- A module the workflow imports that a ``.gitignore`` ignores is left out of the job by Ray:
  a warning names it and ``RAY_RUNTIME_ENV_IGNORE_GITIGNORE=1``.
- ``launch proj/flows.py:wf`` was refused as "module 'proj' is not importable here".

The Ray Job API is ``tests.support.fake_jobs.FakeJobs`` (the edge: what the tests are about is
what raysaga records and shows of its answers); the store is a real SQLite file.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import sys
import textwrap
import threading
import time
import types
from pathlib import Path
from typing import Any

import pytest

from raysaga.errors import UserError
from raysaga.orchestrator import cli_status, cli_watch, launch_marks
from raysaga.orchestrator import launch as lx
from raysaga.orchestrator.loader import load_workflow
from raysaga.orchestrator.runner import create_run
from raysaga.state import RunStatus, RunSummary, SqlStore
from tests.support.cli import invoke
from tests.support.fake_jobs import FakeJobInfo, FakeJobs, project_cluster

MODULE = "launch_review_stop46_flow"
FLOW = textwrap.dedent('''
    from raysaga import Workflow

    wf = Workflow("launch_review_stop46")

    @wf.step()
    def only() -> int:
        return 1
''')
ADDRESS = "http://127.0.0.1:8265"


def _the_run(url: str) -> RunSummary:
    """The store's one run (a launch recorded it)."""
    store = SqlStore(url)
    try:
        [run] = store.list_runs()
    finally:
        store.close()
    return run


@pytest.fixture
def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeJobs:
    return project_cluster(tmp_path, monkeypatch, MODULE, FLOW)


def _launch(db: str, *extra: str) -> str:
    code, out, err = invoke("launch", f"{MODULE}:wf", "--address", ADDRESS, "--db", db, *extra)
    assert code == 0, err
    return out.strip()


def _bounded_sleep(monkeypatch: pytest.MonkeyPatch, then: Any = None, after: int = 40) -> list[float]:
    """``cli_watch``'s redraw pause, counted: ``then()`` runs at the ``after``-th (a watch that
    never stops fails the test instead of hanging it). Its clock is the real one."""
    calls: list[float] = []

    def sleep(seconds: float) -> None:
        calls.append(seconds)
        if len(calls) == after:
            if then is None:
                raise AssertionError(f"the watch went on for {after} redraws")
            then()

    clock = types.SimpleNamespace(sleep=sleep, time=time.time, monotonic=time.monotonic)
    monkeypatch.setattr(cli_watch, "time", clock)
    return calls


def test_a_launched_run_no_driver_started_says_which_job_and_what_to_do(cluster: FakeJobs, sqlite_url: str) -> None:
    run_id = _launch(sqlite_url)
    sid = lx.submission_id(run_id)
    store = SqlStore(sqlite_url)
    try:
        launched = [e for e in store.events(run_id) if e.kind == "launched"]
        assert [e.data["job"] for e in launched] == [sid]
        assert launched[0].data["address"] == ADDRESS
        assert store.get_run(run_id).status == RunStatus.PENDING
    finally:
        store.close()
    code, out, err = invoke("status", run_id, "--db", sqlite_url)
    assert code == 0, err
    line = next(t for t in out.splitlines() if t.startswith("launch: "))
    assert f"launched as Ray job {sid} at " in line and "no driver has started it" in line
    assert f"`ray job logs {sid} --address {ADDRESS}`" in line
    assert f"`raysaga launch {MODULE}:wf --address {ADDRESS} --run-id {run_id}`" in line
    code, out, err = invoke("status", run_id, "--db", sqlite_url, "--json")
    assert code == 0, err
    doc = json.loads(out)["launch"]
    assert doc["job"] == sid and doc["address"] == ADDRESS and doc["not_started"] == line.removeprefix("launch: ")
    # launched again while its job is live: no second job, no second note
    assert _launch(sqlite_url, "--run-id", run_id) == run_id
    assert cluster.submitted == [sid]
    store = SqlStore(sqlite_url)
    try:
        assert len([e for e in store.events(run_id) if e.kind == "launched"]) == 1
    finally:
        store.close()


def test_watch_stops_once_the_launched_job_ended_before_a_driver_started(cluster: FakeJobs, sqlite_url: str,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    run_id = _launch(sqlite_url)
    sid = lx.submission_id(run_id)
    cluster.jobs[sid].status = "FAILED"  # e.g. `--python` not found on the cluster
    _bounded_sleep(monkeypatch)
    code, out, err = invoke("status", run_id, "--db", sqlite_url, "--watch", "--interval", "0.05")
    assert code == 1, (out, err)
    assert f"stopped watching: Ray job {sid} ended (FAILED) before any driver started run {run_id}" in err
    assert f"--run-id {run_id}" in err
    assert out.count("launch: launched as Ray job") == 1


def test_watch_goes_on_while_the_launched_job_is_live(cluster: FakeJobs, sqlite_url: str,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    run_id = _launch(sqlite_url)
    store = SqlStore(sqlite_url)

    def cancel() -> None:
        run = store.get_run(run_id)
        store.transition(run_id, run.version, RunStatus.CANCELLED, reason="ended by the test")

    try:
        calls = _bounded_sleep(monkeypatch, then=cancel, after=5)
        code, out, err = invoke("status", run_id, "--db", sqlite_url, "--watch", "--interval", "0.05")
    finally:
        store.close()
    assert code == 0, (out, err)
    assert len(calls) == 5 and "cancelled" in out  # watched until the run rested, the job PENDING meanwhile


def test_the_watch_gives_up_only_on_a_launched_run(sqlite_url: str, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    project_cluster(tmp_path, monkeypatch, MODULE, FLOW)
    wf = load_workflow(f"{MODULE}:wf")
    store = SqlStore(sqlite_url)
    try:
        plain = create_run(wf, None, store=store, run_id="plain-one")  # no launch: a `raysaga run`'s
        queued = create_run(wf, None, store=store, run_id="queued-one", queue="default")  # a worker's to take
        assert launch_marks.record(store, queued.run_id, "raysaga-queued-one", ADDRESS)  # ... and launched too
        queued = store.get_run(queued.run_id)
        queued_launch = launch_marks.latest(store, queued)
        launched = create_run(wf, None, store=store, run_id="launched-one")
        assert launch_marks.record(store, launched.run_id, "raysaga-launched-one", ADDRESS)
        launched = store.get_run(launched.run_id)
        launch = launch_marks.latest(store, launched)
        assert launch is not None and queued_launch is not None and launch_marks.latest(store, plain) is None
        later = launch.at + launch_marks.NO_DRIVER_GRACE
        assert launch_marks.not_started(queued, queued_launch, later) is None
        for ended in (True, None, False):
            assert launch_marks.watch_stop(plain, None, ended, later + 1e6) is None
            assert launch_marks.watch_stop(queued, queued_launch, ended, later + 1e6) is None
        assert launch_marks.watch_stop(launched, launch, False, later + 1e6) is None  # its job is live
        assert launch_marks.watch_stop(launched, launch, None, later - 1) is None  # within the grace
        unknown = launch_marks.watch_stop(launched, launch, None, later)
        assert unknown is not None and "out of reach" in unknown
        ended_now = launch_marks.watch_stop(launched, launch, True, launch.at)
        assert ended_now is not None and "ended before any driver started" in ended_now
        # a driver holding a live lease: nothing to say
        held = launched.model_copy(update={"lease_owner": "someone", "lease_expires_at": later + 10})
        assert launch_marks.not_started(held, launch, later) is None
    finally:
        store.close()


def test_ctrl_c_before_the_job_is_submitted_names_the_recorded_run(cluster: FakeJobs, sqlite_url: str,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupted(*args: Any, **kwargs: Any) -> Any:  # Ctrl-C as the job is being submitted
        raise KeyboardInterrupt

    monkeypatch.setattr(lx, "submit", interrupted)
    code, out, err = invoke("launch", f"{MODULE}:wf", "--address", ADDRESS, "--db", sqlite_url)
    assert code == 130 and out == "", err
    run = _the_run(sqlite_url)
    assert f"run {run.run_id} is recorded, not started: launch again with --run-id {run.run_id}" in err
    assert cluster.submitted == []


def test_a_refused_submit_says_recorded_not_started_once(cluster: FakeJobs, sqlite_url: str,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    def refused(client: Any, run_id: str, *args: Any, **kwargs: Any) -> Any:
        raise UserError(f"the Ray cluster refused job x for run {run_id!r} (no): the run is recorded, not "
                        f"started; fix that and launch again with --run-id {run_id}")

    monkeypatch.setattr(lx, "submit", refused)
    code, _, err = invoke("launch", f"{MODULE}:wf", "--address", ADDRESS, "--db", sqlite_url)
    assert code == 2 and err.count("recorded, not started") == 1, err


def test_a_piped_watch_prints_an_unchanging_run_once(sqlite_url: str, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    project_cluster(tmp_path, monkeypatch, MODULE, FLOW)
    store = SqlStore(sqlite_url)
    run = create_run(load_workflow(f"{MODULE}:wf"), None, store=store, run_id="still-one")
    # the views' clock moves a second per view: the run's age ("(3.0s so far)") differs in each
    ticks = itertools.count(time.time())
    real = cli_status.print_status

    def ticking(console: Any, store_: SqlStore, record: Any, **kwargs: Any) -> None:
        real(console, store_, record, now=lambda: float(next(ticks)), **kwargs)

    monkeypatch.setattr(cli_status, "print_status", ticking)

    def cancel() -> None:
        store.transition(run.run_id, store.get_run(run.run_id).version, RunStatus.CANCELLED, reason="done")

    try:
        _bounded_sleep(monkeypatch, then=cancel, after=6)
        code, out, err = invoke("status", run.run_id, "--db", sqlite_url, "--watch", "--interval", "0.05")
    finally:
        store.close()
    assert code == 0, err
    views = [line for line in out.splitlines() if line.startswith(f"run {run.run_id} ")]
    assert [v.split(": ")[1].split(" ")[0] for v in views] == ["pending", "cancelled"], out
    assert "launch:" not in out  # not launched: nothing said of a job


def test_a_gitignored_module_the_workflow_imports_is_warned_of(tmp_path: Path, sqlite_url: str,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    flow = "from stop46_local_settings import LEVEL\n" + FLOW.replace("launch_review_stop46", "stop46_gitignored")
    folder_cluster = project_cluster(tmp_path, monkeypatch, "stop46_ignoring_flow", flow)
    project = Path.cwd()
    (project / "stop46_local_settings.py").write_text("LEVEL = 1\n")
    (project / ".gitignore").write_text("*.db\nstop46_local_settings.py\n")
    code, _, err = invoke("launch", "stop46_ignoring_flow:wf", "--address", ADDRESS, "--db", sqlite_url)
    assert code == 0, err
    assert ("warning: stop46_local_settings.py is imported by the workflow but .gitignore ignores it" in err
            and "RAY_RUNTIME_ENV_IGNORE_GITIGNORE=1" in err)
    monkeypatch.setenv("RAY_RUNTIME_ENV_IGNORE_GITIGNORE", "1")  # Ray then ships it: nothing to warn of
    code, _, err = invoke("launch", "stop46_ignoring_flow:wf", "--address", ADDRESS, "--db", sqlite_url)
    assert code == 0 and "warning" not in err, err
    assert len(folder_cluster.submitted) == 2


def test_a_file_path_in_a_subfolder_is_refused_naming_the_launch_that_works(
        tmp_path: Path, sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "path", list(sys.path))  # loading a file adds its folder
    project_cluster(tmp_path, monkeypatch, "stop46_unused", "")
    sub = Path.cwd() / "stop46proj"  # a folder without __init__.py: a namespace package from here
    sub.mkdir()
    (sub / "stop46_helper.py").write_text("def shout(x: str) -> str:\n    return x.upper()\n")
    (sub / "stop46_flows.py").write_text("from stop46_helper import shout\n" + FLOW)
    code, out, err = invoke("launch", "stop46proj/stop46_flows.py:wf", "--address", ADDRESS, "--db", sqlite_url)
    assert code == 2 and out == "", err
    assert "is not importable here" not in err
    assert "launch takes MODULE:WORKFLOW from the folder that holds the module" in err
    assert "cd stop46proj && raysaga launch stop46_flows:wf" in err
    assert not Path(sqlite_url.removeprefix("sqlite:///")).exists()  # refused before the store was opened
    # named as a module of a namespace package, the folder shipped is the one it is imported from
    assert lx.source_root("stop46proj.stop46_flows:wf") == Path.cwd().resolve()


# --- the diff review of the event ``launched`` (fix_launch2) ---------------------------------------


class _Clock:
    """``cli_watch``'s clock: real time shifted by ``offset``, moved on ``step`` seconds per redraw
    pause; ``then()`` runs at the ``after``-th pause (a watch that never stops fails instead)."""

    def __init__(self, offset: float = 0.0, step: float = 0.0, then: Any = None, after: int = 40) -> None:
        self.offset, self.step, self.then, self.after, self.pauses = offset, step, then, after, 0

    def time(self) -> float:
        return time.time() + self.offset

    def monotonic(self) -> float:
        return time.monotonic() + self.offset

    def sleep(self, seconds: float) -> None:
        self.pauses += 1
        self.offset += self.step
        if self.pauses == self.after:
            if self.then is None:
                raise AssertionError(f"the watch went on for {self.after} redraws")
            self.then()


def _canceller(db: str, run_id: str) -> Any:
    def cancel() -> None:
        store = SqlStore(db)
        try:
            store.transition(run_id, store.get_run(run_id).version, RunStatus.CANCELLED, reason="ended by the test")
        finally:
            store.close()

    return cancel


def _job_api(monkeypatch: pytest.MonkeyPatch, fake: Any) -> None:
    monkeypatch.setattr(lx, "connect", lambda address: fake)


class _HangingJobs(FakeJobs):
    """A fake Job API whose answers hang, as Ray's SDK (no timeout) can on a head that stopped
    answering; ``release`` ends them (``wait``'s bound only keeps a broken watch from hanging the suite)."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()
        self.returned = 0

    def get_job_info(self, sid: str) -> FakeJobInfo:
        self.release.wait(timeout=5)
        self.returned += 1
        raise RuntimeError("Request failed: connection reset by peer")


def test_the_watch_never_blocks_on_a_job_api_that_hangs(cluster: FakeJobs, sqlite_url: str,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    run_id = _launch(sqlite_url)
    hanging = _HangingJobs()
    _job_api(monkeypatch, hanging)
    clock = _Clock(step=60.0)
    monkeypatch.setattr(cli_watch, "time", clock)
    try:
        code, out, err = invoke("status", run_id, "--db", sqlite_url, "--watch", "--interval", "0.05")
        assert hanging.returned == 0  # every question still hung while the watch redrew and ended
        questions = [t for t in threading.enumerate() if t.name == "raysaga-watch-job"]
        assert len(questions) <= cli_watch.HUNG_KEPT  # a question a hang: they never pile up
    finally:
        hanging.release.set()
    assert code == 1, (out, err)
    assert "the Ray Job API was out of reach to check its job" in err
    assert clock.pauses * clock.step >= launch_marks.NO_DRIVER_GRACE


class _BlinkingJobs(FakeJobs):
    """A fake Job API that fails its first ``fails`` requests (a proxy's 503), then answers."""

    def __init__(self, jobs: dict[str, FakeJobInfo], fails: int = 1) -> None:
        super().__init__(jobs)
        self.fails = fails

    def get_job_info(self, sid: str) -> FakeJobInfo:
        if self.fails > 0:
            self.fails -= 1
            raise RuntimeError("Request failed with status code 503: Service Unavailable")
        return super().get_job_info(sid)


def test_one_failed_job_api_request_long_after_the_launch_does_not_stop_the_watch(
        cluster: FakeJobs, sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    run_id = _launch(sqlite_url)
    sid = lx.submission_id(run_id)
    cluster.jobs[sid].status = "RUNNING"
    _job_api(monkeypatch, _BlinkingJobs(cluster.jobs))
    # watched 700 s after the launch (past the grace): one unanswered request is no verdict
    clock = _Clock(offset=launch_marks.NO_DRIVER_GRACE + 100, then=_canceller(sqlite_url, run_id), after=5)
    monkeypatch.setattr(cli_watch, "time", clock)
    code, out, err = invoke("status", run_id, "--db", sqlite_url, "--watch", "--interval", "0.05")
    assert code == 0 and "cancelled" in out, (out, err)
    assert clock.pauses == 5


def test_the_grace_counts_from_the_last_answer_of_the_job_api(sqlite_url: str, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    project_cluster(tmp_path, monkeypatch, MODULE, FLOW)
    store = SqlStore(sqlite_url)
    try:
        run = create_run(load_workflow(f"{MODULE}:wf"), None, store=store, run_id="answered-one")
        assert launch_marks.record(store, run.run_id, "raysaga-answered-one", ADDRESS)
        run = store.get_run(run.run_id)
        launch = launch_marks.latest(store, run)
        assert launch is not None
        answered = launch.at + 5 * launch_marks.NO_DRIVER_GRACE  # the API last answered (live) then
        now = answered + launch_marks.NO_DRIVER_GRACE - 1
        assert launch_marks.watch_stop(run, launch, None, now, unknown_since=answered) is None
        stop = launch_marks.watch_stop(run, launch, None, now + 1, unknown_since=answered)
        assert stop is not None and "out of reach" in stop
    finally:
        store.close()


def test_the_watch_asks_about_all_the_runs_jobs(cluster: FakeJobs, sqlite_url: str,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    run_id = _launch(sqlite_url)
    cluster.jobs[lx.submission_id(run_id)].status = "FAILED"
    # launched again: its second job runs, its note not written (yet, or the record failed)
    second = lx.submission_id(run_id, 2)
    cluster.jobs[second] = FakeJobInfo("RUNNING", run_id)
    clock = _Clock(then=_canceller(sqlite_url, run_id), after=4)
    monkeypatch.setattr(cli_watch, "time", clock)
    code, out, err = invoke("status", run_id, "--db", sqlite_url, "--watch", "--interval", "0.05")
    assert code == 0 and "cancelled" in out and clock.pauses == 4, (out, err)
    # none live: the watch stops
    relaunched = _launch(sqlite_url)
    cluster.jobs[lx.submission_id(relaunched)].status = "FAILED"
    cluster.jobs[lx.submission_id(relaunched, 2)] = FakeJobInfo("STOPPED", relaunched)
    monkeypatch.setattr(cli_watch, "time", _Clock())
    code, out, err = invoke("status", relaunched, "--db", sqlite_url, "--watch", "--interval", "0.05")
    assert code == 1 and "stopped watching: Ray job" in err, (out, err)


def test_a_queued_and_launched_run_is_a_workers_to_take(sqlite_url: str, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    project_cluster(tmp_path, monkeypatch, MODULE, FLOW)
    store = SqlStore(sqlite_url)
    try:
        run = create_run(load_workflow(f"{MODULE}:wf"), None, store=store, run_id="both-one", queue="default")
        assert launch_marks.record(store, run.run_id, "raysaga-both-one", ADDRESS)
        run = store.get_run(run.run_id)
        launch = launch_marks.latest(store, run)
        assert launch is not None
        assert launch_marks.not_started(run, launch, launch.at + 1e6) is None
        assert launch_marks.watch_stop(run, launch, True, launch.at + 1e6) is None
    finally:
        store.close()


def test_a_driver_that_claimed_the_run_and_stopped_is_named(sqlite_url: str, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    project_cluster(tmp_path, monkeypatch, MODULE, FLOW)
    store = SqlStore(sqlite_url)
    try:
        run = create_run(load_workflow(f"{MODULE}:wf"), None, store=store, run_id="died-one")
        assert launch_marks.record(store, run.run_id, "raysaga-died-one", ADDRESS, token=True)
        run = store.get_run(run.run_id)
        launch = launch_marks.latest(store, run)
        assert launch is not None and launch.token
        died = run.model_copy(update={"lease_owner": "driver-7", "lease_expires_at": launch.at + 1})
        note = launch_marks.not_started(died, launch, launch.at + 100)
        assert note is not None and "its driver driver-7 stopped" in note and "no driver has started" not in note
        # the cluster asks for a token: the commands say so
        assert f"`RAY_AUTH_MODE=token ray job status raysaga-died-one --address {ADDRESS}`" in note
        fresh = launch_marks.not_started(run, launch, launch.at + 100)
        assert fresh is not None and "no driver has started it" in fresh
    finally:
        store.close()


def test_a_token_launch_is_noted_for_the_ray_commands(cluster: FakeJobs, sqlite_url: str,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    run_id = _launch(sqlite_url)
    code, out, err = invoke("status", run_id, "--db", sqlite_url)
    assert code == 0, err
    assert f"`RAY_AUTH_MODE=token ray job logs {lx.submission_id(run_id)} --address {ADDRESS}`" in out


class _UnreadableAfterSubmit(FakeJobs):
    """A fake Job API that takes a job, then fails to report it (a dropped connection, a 503)."""

    def get_job_info(self, sid: str) -> FakeJobInfo:
        if sid in self.jobs:
            raise RuntimeError("Request failed with status code 503: Service Unavailable")
        return super().get_job_info(sid)


def test_a_failed_read_after_the_submit_does_not_say_not_started(cluster: FakeJobs, sqlite_url: str,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _UnreadableAfterSubmit()
    _job_api(monkeypatch, fake)
    code, out, err = invoke("launch", f"{MODULE}:wf", "--address", ADDRESS, "--db", sqlite_url)
    assert code == 0, err
    run_id = out.strip()
    assert fake.submitted == [lx.submission_id(run_id)]
    assert "not started" not in err and f"launched as Ray job {lx.submission_id(run_id)} (PENDING)" in err


def test_a_closed_terminal_before_the_submit_names_the_recorded_run(cluster: FakeJobs, sqlite_url: str,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    def unhandled(signum: int, frame: object) -> None:  # (the default would end the test process)
        raise RuntimeError("SIGHUP was not handled by the launch")

    previous = signal.signal(signal.SIGHUP, unhandled)

    def hung_up(*args: Any, **kwargs: Any) -> Any:  # the terminal closes as the job is being submitted
        os.kill(os.getpid(), signal.SIGHUP)
        raise AssertionError("SIGHUP did not interrupt the launch")

    monkeypatch.setattr(lx, "submit", hung_up)
    try:
        code, out, err = invoke("launch", f"{MODULE}:wf", "--address", ADDRESS, "--db", sqlite_url)
        assert signal.getsignal(signal.SIGHUP) is unhandled  # the launch put the handler back
    finally:
        signal.signal(signal.SIGHUP, previous)
    assert code == 128 + signal.SIGHUP and out == "", err
    run = _the_run(sqlite_url)
    assert f"run {run.run_id} is recorded, not started: launch again with --run-id {run.run_id}" in err


def test_a_module_of_a_regular_package_launches_by_its_file(tmp_path: Path, sqlite_url: str,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "path", list(sys.path))
    fake = project_cluster(tmp_path, monkeypatch, "stop46_unused_pkg", "")
    pkg = Path.cwd() / "stop46pkg"  # a regular package: its modules import each other by dotted names
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "stop46_helper.py").write_text("def shout(x: str) -> str:\n    return x.upper()\n")
    (pkg / "stop46_flows.py").write_text("from stop46pkg.stop46_helper import shout\n"
                                         + FLOW.replace("launch_review_stop46", "stop46_pkgflow"))
    code, out, err = invoke("launch", "stop46pkg/stop46_flows.py:wf", "--address", ADDRESS, "--db", sqlite_url)
    assert code == 0, err
    store = SqlStore(sqlite_url)
    try:
        assert store.get_run(out.strip()).workflow_ref == "stop46pkg.stop46_flows:wf"
    finally:
        store.close()
    assert fake.submitted == [lx.submission_id(out.strip())]
    assert lx.source_root("stop46pkg.stop46_flows:wf") == Path.cwd().resolve()


def test_a_virtualenv_inside_the_project_is_not_warned_of(tmp_path: Path, sqlite_url: str,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    flow = "import stop46_venv_dep\nimport stop46_env_dep\n" + FLOW.replace("launch_review_stop46", "stop46_venvflow")
    project_cluster(tmp_path, monkeypatch, "stop46_venv_flow", flow)
    project = Path.cwd()
    for venv, module in ((".venv", "stop46_venv_dep"), ("env", "stop46_env_dep")):  # ignored by .gitignore
        site = project / venv / "lib" / "python3" / "site-packages"
        site.mkdir(parents=True)
        (project / venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
        (site / f"{module}.py").write_text("VALUE = 1\n")
        monkeypatch.syspath_prepend(str(site))
    (project / ".gitignore").write_text(".venv/\nenv/\n*.db\n")
    code, _, err = invoke("launch", "stop46_venv_flow:wf", "--address", ADDRESS, "--db", sqlite_url)
    assert code == 0, err
    assert "warning" not in err, err


def test_a_folder_ignored_with_a_file_let_back_in_is_matched_as_ray_does(tmp_path: Path) -> None:
    from raysaga.orchestrator.launch_ignored import ignored_modules

    root = tmp_path.resolve()
    (root / "sub").mkdir()
    kept, left = root / "sub" / "keep.py", root / "sub" / "other.py"
    for file in (kept, left):
        file.write_text("X = 1\n")
    (root / ".gitignore").write_text("sub/\n!sub/keep.py\n")
    assert ignored_modules(root, [kept, left], {}) == [(left, root / ".gitignore")]


def test_a_hangup_ignored_by_nohup_stays_ignored_while_the_launch_records_and_submits() -> None:
    """``nohup raysaga launch ...``: the terminal closing must not cut the launch off."""
    import signal

    from raysaga.orchestrator import cli_launch

    before = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        restore = cli_launch._signals_raise()
        try:
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
            assert signal.getsignal(signal.SIGTERM) is not signal.SIG_IGN  # (SIGTERM: raises, as designed)
        finally:
            restore()
    finally:
        signal.signal(signal.SIGHUP, before)


def test_a_package_module_importing_a_sibling_by_its_bare_name_in_a_step_is_refused(
        tmp_path: Path, sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A second diff review: a sibling imported inside a step's body is imported only when the step
    runs, on the cluster, where it is not found; loading the file here imports nothing bare."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    project_cluster(tmp_path, monkeypatch, "stop46_unused_lazy", "")
    pkg = Path.cwd() / "stop46lazy"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "stop46_lazy_helper.py").write_text("def shout(x: str) -> str:\n    return x.upper()\n")
    flow = FLOW.replace("launch_review_stop46", "stop46_lazyflow")
    (pkg / "stop46_lazy_flows.py").write_text(flow + "\n\ndef later() -> str:\n"
                                              "    from stop46_lazy_helper import shout\n    return shout('x')\n")
    code, out, err = invoke("launch", "stop46lazy/stop46_lazy_flows.py:wf", "--address", ADDRESS, "--db", sqlite_url)
    assert code == 2 and out == "", err
    assert "launch takes MODULE:WORKFLOW from the folder that holds the module" in err
