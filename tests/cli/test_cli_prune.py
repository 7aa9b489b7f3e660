"""``raysaga prune``: durations, counts, a dry run that deletes nothing, and refusals."""

from __future__ import annotations

import textwrap
import time
from pathlib import Path

import pytest
from sqlalchemy import update
from typer.testing import CliRunner

from raysaga.orchestrator.cli import app
from raysaga.state import RunStatus, open_store
from raysaga.state.schema import runs

FLOW = textwrap.dedent('''
    from raysaga import Permanent, Workflow

    wf = Workflow("keep", version="1")

    @wf.step()
    def one(input: int) -> int:
        if input < 0:
            raise Permanent("negative")
        return input
''')


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exc_info
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture
def aged(tmp_path: Path, sqlite_url: str) -> str:
    """Three completed and one failed run, 40 days old; one completed run from now."""
    path = tmp_path / "keep_flow.py"
    path.write_text(FLOW)
    for run_id, value in (("old-1", "1"), ("old-2", "2"), ("old-3", "3"), ("old-bad", "-1"), ("new-1", "4")):
        invoke("run", f"{path}:wf", "--input", value, "--db", sqlite_url, "--executor", "inline", "--run-id", run_id)
    store = open_store(sqlite_url)
    try:
        with store.engine.begin() as conn:
            conn.execute(update(runs).where(runs.c.run_id.like("old-%"))
                         .values(updated_at=time.time() - 40 * 86400, created_at=time.time() - 40 * 86400))
    finally:
        store.close()
    return sqlite_url


def _ids(url: str) -> list[str]:
    store = open_store(url)
    try:
        return sorted(r.run_id for r in store.list_runs(limit=100))
    finally:
        store.close()


def test_prune_dry_run_then_by_status_then_all(aged: str) -> None:
    code, out, err = invoke("prune", "--older-than", "30d", "--dry-run", "--db", aged)
    assert code == 0, err
    assert out.startswith("would delete 4 run(s) in ")
    assert _ids(aged) == ["new-1", "old-1", "old-2", "old-3", "old-bad"]
    code, out, err = invoke("prune", "--older-than", "720h", "--status", "completed", "--db", aged)
    assert code == 0, err
    assert out.startswith("deleted 3 run(s) in completed not updated since ")
    assert _ids(aged) == ["new-1", "old-bad"]
    code, out, _ = invoke("prune", "--older-than", "43200m", "--db", aged)
    assert out.startswith("deleted 1 run(s)")
    assert _ids(aged) == ["new-1"]
    store = open_store(aged)
    try:
        assert store.get_run("new-1").status == RunStatus.COMPLETED
    finally:
        store.close()


@pytest.mark.parametrize(("args", "message"), [
    (["--older-than", "-3d"], "--older-than '-3d' is not a duration"),
    (["--older-than", "0s"], "--older-than '0s' must be a positive duration"),
    (["--older-than", "soon"], "is not a duration: use e.g. 30d, 12h, 90m or 3600s"),
    (["--older-than", "nan"], "is not a duration"),
    # a bare number meant seconds: every finished run older than 30 s went
    (["--older-than", "30"], "--older-than '30' has no unit: write 30d (days), 30h (hours)"),
    (["--older-than", "30d", "--status", "sleeping"], "--status 'sleeping' is not a run state"),
    (["--older-than", "30d", "--status", "running"], "--status 'running' is not a state at rest"),
    (["--older-than", "30d", "--status", "completed,waiting_human"], "'waiting_human' is not a state at rest"),
    (["--older-than", "30d", "--status", ","], "--status names no state"),
    (["--older-than", "30d", "--batch-size", "0"], "--batch-size must be from 1 to 10000"),
])
def test_prune_refuses_nonsense(aged: str, args: list[str], message: str) -> None:
    code, _, err = invoke("prune", *args, "--db", aged)
    assert code == 2 and message in err, err
    assert len(err.strip().splitlines()) == 1
    assert len(_ids(aged)) == 5


def test_prune_of_a_missing_store_creates_nothing(tmp_path: Path) -> None:
    code, _, err = invoke("prune", "--older-than", "30d", "--db", f"sqlite:///{tmp_path / 'typo' / 'x.db'}")
    assert code == 2 and "no raysaga store" in err
    assert list(tmp_path.iterdir()) == []

