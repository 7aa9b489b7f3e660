"""Cancel (from another process, while a driver is live) and run deadlines stop runs cleanly."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import raysaga
from raysaga.state import NodeStatus, RunStatus, open_store

FLOW = textwrap.dedent('''
    import os, time
    from pathlib import Path
    from raysaga import Workflow

    wf = Workflow("blocking")

    @wf.step()
    def first(input: dict) -> str:
        return "ok"

    @wf.step()
    def wait_for_file(input: dict, first: str) -> str:
        pid_file = Path(input["started"])  # written whole, then renamed: a reader never sees it empty
        pid_file.with_name(f".{pid_file.name}").write_text(str(os.getpid()))
        os.replace(pid_file.with_name(f".{pid_file.name}"), pid_file)
        gate = Path(input["gate"])
        while not gate.exists():        # the workload: blocks until the test opens the gate
            time.sleep(0.02)
        return "opened"

    @wf.step()
    def after(wait_for_file: str) -> str:
        return "after"
''')


def _wait_for(predicate, what: str, timeout: float = 60.0):  # type: ignore[no-untyped-def]
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)  # polling a condition in another process, with a deadline
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def flow_file(tmp_path: Path) -> Path:
    path = tmp_path / "blocking_flow.py"
    path.write_text(FLOW)
    return path


def _start_driver(flow_file: Path, db: str, run_id: str, inp: dict[str, str], *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "raysaga", "run", f"{flow_file}:wf", "--db", db, "--run-id", run_id,
         "--input", json.dumps(inp), "--quiet", *extra],
        cwd=flow_file.parent, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ),
    )


@pytest.mark.ray
def test_cancel_reaches_a_live_driver_and_cancels_the_inflight_task(
        flow_file: Path, sqlite_url: str, tmp_path: Path, ray_address: str) -> None:
    inp = {"started": str(tmp_path / "started"), "gate": str(tmp_path / "gate-never-opens")}
    proc = _start_driver(flow_file, sqlite_url, "c1", inp, "--executor", "ray")
    try:
        _wait_for(lambda: Path(inp["started"]).exists(), "the blocking step to start")
        result = raysaga.cancel("c1", store=sqlite_url, reason="operator says stop")
        assert result.status == RunStatus.CANCELLED
        assert result.status_reason == "operator says stop"
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 1, err
    store = open_store(sqlite_url)
    nodes = {n.label: n.status for n in store.nodes("c1")}
    assert nodes["first"] == NodeStatus.COMPLETED
    assert nodes["wait_for_file"] == NodeStatus.CANCELLED
    assert "after" not in nodes
    kinds = [e.kind for e in store.events("c1")]
    assert kinds[-1] == "run_cancelled"
    assert store.pending_signals("c1") == []  # the signal was consumed in the same commit


def test_cancel_without_a_live_driver_is_immediate(sqlite_url: str) -> None:
    wf = raysaga.Workflow("idle")

    @wf.step()
    def only() -> int:
        return 1

    record = raysaga.create_run(wf, store=sqlite_url, run_id="idle-1")
    assert record.status == RunStatus.PENDING
    assert raysaga.cancel("idle-1", store=sqlite_url).status == RunStatus.CANCELLED
    # terminal: a resume does nothing, a second cancel is a no-op
    assert raysaga.resume(wf, "idle-1", store=sqlite_url, executor="inline").status == RunStatus.CANCELLED
    assert raysaga.cancel("idle-1", store=sqlite_url).status == RunStatus.CANCELLED
    assert open_store(sqlite_url).nodes("idle-1") == []


@pytest.mark.ray
def test_deadline_stops_the_run_cleanly(flow_file: Path, sqlite_url: str, tmp_path: Path,
                                        ray_address: str) -> None:
    inp = {"started": str(tmp_path / "started"), "gate": str(tmp_path / "gate-never-opens")}
    proc = _start_driver(flow_file, sqlite_url, "d1", inp, "--executor", "ray", "--deadline", "8")
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err
    run = open_store(sqlite_url).get_run("d1")
    assert run.status == RunStatus.FAILED
    assert run.status_reason == "deadline"
    assert run.error == {"type": "DeadlineExceeded", "message": "the run passed its deadline"}
    nodes = {n.label: n for n in open_store(sqlite_url).nodes("d1")}
    assert nodes["first"].status == NodeStatus.COMPLETED
    assert nodes["wait_for_file"].status == NodeStatus.CANCELLED
    assert "after" not in nodes
    assert run.deadline_at is not None and run.updated_at >= run.deadline_at
