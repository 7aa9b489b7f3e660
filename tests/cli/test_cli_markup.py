"""User data is never read as rich markup: hostile run ids, error messages and workflow versions
print verbatim from every command, on each store (SQLite file, PostgreSQL)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from raysaga.orchestrator.cli import app
from raysaga.state import SqlStore

HOSTILE_IDS = ["bad[/]", "[bold]x[/bold]", "[red]", "a]b[/c", ":smile:[/]", "x\\[/]"]
MESSAGE = "cannot open [/data/in.csv] [bold]boom[/] :warning:"

FLOW = textwrap.dedent(f'''
    from raysaga import Permanent, Workflow

    wf = Workflow("hostile", version="[/]v1[bold]")

    @wf.step()
    def first() -> int:
        return 1

    @wf.step()
    def second(first: int) -> int:
        raise Permanent({MESSAGE!r})
''')


@pytest.fixture
def flow(tmp_path: Path) -> str:
    path = tmp_path / "hostile_flow.py"
    path.write_text(FLOW)
    return f"{path}:wf"


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.stdout, result.stderr


@pytest.mark.parametrize("run_id", HOSTILE_IDS)
def test_every_command_prints_hostile_ids_and_messages_verbatim(flow: str, store_url: str, run_id: str) -> None:
    run_id = f"{run_id}-{abs(hash(store_url)) % 10_000}"
    code, out, err = invoke("run", flow, "--db", store_url, "--executor", "inline", "--run-id", run_id)
    assert code == 1, (out, err)
    assert run_id in out and MESSAGE in out and "[/]v1[bold]" in out

    code, out, err = invoke("status", run_id, "--db", store_url)
    assert code == 0, err
    assert f"run {run_id} (hostile v[/]v1[bold]): failed" in out
    assert MESSAGE in out

    code, out, err = invoke("status", run_id, "--db", store_url, "--errors")
    assert code == 0, err
    assert MESSAGE in out and "Permanent" in out

    code, out, _ = invoke("status", run_id, "--db", store_url, "--json")
    assert code == 0
    data = json.loads(out)
    assert data["run_id"] == run_id and data["error"]["message"] == MESSAGE

    code, out, err = invoke("list", "--db", store_url, "--limit", "1000")
    assert code == 0, err
    assert any(line.startswith(run_id + " ") for line in out.splitlines()), out
    assert MESSAGE in out

    code, out, _ = invoke("list", "--db", store_url, "--json", "--limit", "1000")
    assert run_id in [r["run_id"] for r in json.loads(out)]

    code, out, err = invoke("events", run_id, "--db", store_url)
    assert code == 0, err
    assert all(json.loads(line)["run_id"] == run_id for line in out.splitlines())

    code, out, err = invoke("cancel", run_id, "--db", store_url)
    assert code == 1, err
    assert f"run {run_id} is already failed: nothing to cancel" in out

    code, out, err = invoke("resume", run_id, "--db", store_url, "--executor", "inline", "--workflow", flow)
    assert code == 1, err
    assert run_id in out


@pytest.mark.parametrize("run_id", HOSTILE_IDS)
def test_errors_naming_a_hostile_id_are_verbatim(store: SqlStore, store_url: str, run_id: str) -> None:
    # ``store`` opens (so migrates) the store first: the session's PostgreSQL database is shared and
    # migrated by whichever test opens it first, and "no run with id" needs raysaga tables; on an
    # empty database the CLI rightly says "no raysaga store" (a pytest-xdist worker may run these first)
    for command in ("status", "events", "resume", "cancel", "retry"):
        code, out, err = invoke(command, run_id, "--db", store_url)
        assert code == 2, (command, out, err)
        assert f"no run with id {run_id!r}" in err, (command, err)
        assert len(err.strip().splitlines()) == 1, err
