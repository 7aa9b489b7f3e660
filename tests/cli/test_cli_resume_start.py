"""``raysaga resume`` joins Ray in a thread while it loads the run's workflow: what the operator
sees is unchanged. A cluster that cannot be reached is the usual one-line error and the run is
left as it was; a workflow that cannot be loaded is reported as such even when Ray fails too; a
run on the session's cluster completes. Fresh processes (this one may be connected to Ray)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from raysaga import Workflow
from raysaga.errors import UserError
from raysaga.orchestrator.executor import Executor
from raysaga.orchestrator.runner import create_run, executor_started
from raysaga.state import RunStatus, SqlStore
from tests.support import REPO
from tests.support.cli import one_line_error
from tests.support.ports import refused_port
from tests.support.processes import pids_mentioning

FLOW = """
from raysaga import Workflow

wf = Workflow("resume_start")

@wf.step()
def first() -> int:
    return 1

@wf.step()
def second(first: int) -> int:
    return first + 1
"""


def _pending_run(tmp_path: Path) -> tuple[str, SqlStore]:
    """A run recorded (pending) with a workflow ref the CLI can import, and its store."""
    (tmp_path / "resume_start_flow.py").write_text(FLOW)
    sys.path.insert(0, str(tmp_path))
    try:
        from resume_start_flow import wf  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(tmp_path))
    assert isinstance(wf, Workflow)
    url = f"sqlite:///{tmp_path / 'raysaga.db'}"
    store = SqlStore(url)
    create_run(wf, None, store=store, run_id="rs-1", workflow_ref="resume_start_flow:wf")
    sys.modules.pop("resume_start_flow", None)
    return url, store


def _resume(url: str, cwd: Path, *extra: str,
            ray_env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(cwd), str(REPO)])}
    env.pop("RAY_ADDRESS", None)
    env.update(ray_env or {})
    return subprocess.run([sys.executable, "-m", "raysaga", "resume", "rs-1", "--db", url, "--quiet", *extra],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=180)


def test_an_unreachable_cluster_is_one_line_and_leaves_the_run_as_it_was(tmp_path: Path) -> None:
    url, store = _pending_run(tmp_path)
    try:
        port = refused_port()
        done = _resume(url, tmp_path, "--address", f"127.0.0.1:{port}")
        one_line_error(done.returncode, done.stderr, f"cannot reach the Ray cluster at 127.0.0.1:{port}")
        run = store.get_run("rs-1")
        assert run.status == RunStatus.PENDING and run.lease_owner is None
        assert [e.kind for e in store.events("rs-1")] == ["run_created"]  # never claimed
    finally:
        store.close()


def test_a_workflow_that_cannot_load_is_reported_even_when_ray_fails_too(tmp_path: Path) -> None:
    url, store = _pending_run(tmp_path)
    try:
        done = _resume(url, tmp_path, "--address", f"127.0.0.1:{refused_port()}",
                       "--workflow", "no_such_module_here:wf")
        assert done.returncode == 2, done.stderr
        assert "no_such_module_here" in done.stderr and "Ray cluster" not in done.stderr, done.stderr
        assert store.get_run("rs-1").status == RunStatus.PENDING
    finally:
        store.close()


@pytest.mark.ray
def test_a_resume_on_the_cluster_completes(tmp_path: Path, ray_address: str) -> None:
    url, store = _pending_run(tmp_path)
    try:
        done = _resume(url, tmp_path, "--address", ray_address)
        assert done.returncode == 0, done.stderr
        run = store.get_run("rs-1")
        assert run.status == RunStatus.COMPLETED and run.output == {"second": 2} and run.lease_owner is None
    finally:
        store.close()


def test_a_resume_that_starts_a_local_ray_completes(tmp_path: Path) -> None:
    """No cluster to join: Ray is started in the command's own thread (the processes Ray starts
    die with the thread that started them: from a helper thread they were gone before the first
    step, and the resume hung for a minute, then failed)."""
    url, store = _pending_run(tmp_path)
    ray_tmp = Path(tempfile.mkdtemp(prefix="rs-", dir="/tmp"))  # short: Ray's socket paths must fit 107 bytes
    try:
        done = _resume(url, tmp_path, ray_env={"RAY_ADDRESS": "local", "RAY_TMPDIR": str(ray_tmp)})
        assert done.returncode == 0, done.stderr
        assert store.get_run("rs-1").status == RunStatus.COMPLETED
    finally:
        store.close()
        for pid in pids_mentioning(str(ray_tmp), open_files=True):  # the local Ray it started, if any outlived it
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(ray_tmp, ignore_errors=True)


def test_executor_started_raises_the_start_error_where_it_is_asked_for() -> None:
    with pytest.raises(UserError, match="unknown executor"), executor_started("nope", None) as started:
        started()
    with pytest.raises(ValueError, match="the caller's own"), executor_started("nope", None):
        raise ValueError("the caller's own")  # a start failure nobody asked for does not hide it
    with executor_started("inline", None) as started:
        assert isinstance(started(), Executor) and started() is started()
