"""``raysaga launch --wait`` against a Ray Job API that hangs or fails a request (stop 47).

``--wait`` asked the Job API on its own thread with no timeout (Ray's SDK sets none): a head
that stopped answering hung the command for ever, the run completed (here: ended) in the store
meanwhile; and one failed request (a dashboard restarting, a proxy's 503) ended ``--wait`` with an
error while the run went on. It now asks as ``status --watch`` does (``cli_watch.JobLook``, on a
daemon thread) and follows the run in the store while the API is out of reach.

The Ray Job API is ``tests.support.fake_jobs.FakeJobs`` (the edge: what is tested is how the
command follows its answers); the store is a real SQLite file.
"""

from __future__ import annotations

import textwrap
import threading
from pathlib import Path

import pytest

from raysaga.orchestrator import cli_launch, cli_watch
from raysaga.state import RunStatus, SqlStore
from tests.support.cli import invoke
from tests.support.fake_jobs import FakeJobInfo, FakeJobs, project_cluster

MODULE = "launch_wait_stop47_flow"
FLOW = textwrap.dedent('''
    from raysaga import Workflow

    wf = Workflow("launch_wait_stop47")

    @wf.step()
    def only() -> int:
        return 1
''')
ADDRESS = "http://127.0.0.1:8265"


def _end_the_run(db: str) -> None:
    """The run comes to rest in the store (as its driver on the cluster would make it)."""
    store = SqlStore(db)
    try:
        [run] = store.list_runs()
        store.transition(run.run_id, store.get_run(run.run_id).version, RunStatus.CANCELLED,
                         reason="ended by the test")
    finally:
        store.close()


class _AfterSubmit(FakeJobs):
    """A Job API whose answers after the submission's own follow-up read misbehave (``misbehave``),
    the run ending in the store at the ``end_at``-th of them."""

    def __init__(self, db: str, end_at: int) -> None:
        super().__init__()
        self.db, self.end_at = db, end_at
        self.after = 0
        self.release = threading.Event()
        self.returned = 0

    def get_job_info(self, sid: str) -> FakeJobInfo:
        if not self.submitted or sid not in self.jobs or self.after < 0:
            return super().get_job_info(sid)
        if self.after == 0:  # the submission's own read
            self.after = 1
            return super().get_job_info(sid)
        self.after += 1
        if self.after - 1 == self.end_at:
            _end_the_run(self.db)
        try:
            return self.misbehave(sid)
        finally:
            self.returned += 1

    def misbehave(self, sid: str) -> FakeJobInfo:
        raise NotImplementedError


class _Hanging(_AfterSubmit):
    def misbehave(self, sid: str) -> FakeJobInfo:
        self.release.wait(timeout=10)  # (the bound only keeps a broken command from hanging the suite)
        raise RuntimeError("Request failed: connection reset by peer")


class _Blinking(_AfterSubmit):
    """Its first question after the submission fails (a 503), then it answers: the job runs."""

    def misbehave(self, sid: str) -> FakeJobInfo:
        if self.after == 2:
            raise RuntimeError("Request failed with status code 503: Service Unavailable")
        self.jobs[sid].status = "RUNNING"
        return self.jobs[sid]


def _cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake: FakeJobs) -> None:
    project_cluster(tmp_path, monkeypatch, MODULE, FLOW)
    from raysaga.orchestrator import launch as lx

    monkeypatch.setattr(lx, "connect", lambda address: fake)
    monkeypatch.setattr(cli_launch, "FOLLOW_EVERY", 0.05)
    monkeypatch.setattr(cli_watch, "JOB_EVERY", 0.05)  # (asked again soon after a failure: 0.3 s)


def test_launch_wait_follows_the_run_while_the_job_api_hangs(sqlite_url: str, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    hanging = _Hanging(sqlite_url, end_at=1)
    _cluster(tmp_path, monkeypatch, hanging)
    try:
        code, out, err = invoke("launch", f"{MODULE}:wf", "--address", ADDRESS, "--db", sqlite_url, "--wait")
        still_hung = hanging.returned == 0
    finally:
        hanging.release.set()
    assert still_hung, "the command waited for the Job API's hung answer"
    assert code == 1 and "cancelled" in out, (out, err)  # the run's end, from the store
    assert "not a Ray Job API" not in err and "Error" not in err, err
    assert "not known (the Job API does not answer)" in err, err


def test_one_failed_job_api_request_does_not_end_launch_wait(sqlite_url: str, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    blinking = _Blinking(sqlite_url, end_at=3)
    _cluster(tmp_path, monkeypatch, blinking)
    code, out, err = invoke("launch", f"{MODULE}:wf", "--address", ADDRESS, "--db", sqlite_url, "--wait")
    assert code == 1 and "cancelled" in out, (out, err)  # followed to the run's end, not stopped at the 503
    assert "failed a request" not in err, err
    assert blinking.returned >= 3, blinking.returned
