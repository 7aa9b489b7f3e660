"""The CLI as a shell user meets it: one-line errors, documented exit codes, JSON status."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from raysaga.orchestrator.cli import app
from raysaga.state import open_store
from raysaga.state.schema import SCHEMA_VERSION

FLOW = textwrap.dedent('''
    from pydantic import BaseModel
    from raysaga import Permanent, Workflow

    wf = Workflow("cli_demo", version="2")

    class In(BaseModel):
        n: int
        fail: bool = False

    @wf.step()
    def plan(input: In) -> list[int]:
        return list(range(input.n))

    @wf.map("plan")
    def square(plan: int) -> int:
        return plan * plan

    @wf.step()
    def total(input: In, square: list[int]) -> int:
        if input.fail:
            raise Permanent("refused by the test")
        return sum(square)

    not_a_workflow = 42
''')


@pytest.fixture
def flow(tmp_path: Path) -> str:
    path = tmp_path / "cli_flow.py"
    path.write_text(FLOW)
    return f"{path}:wf"


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_run_completes_and_status_json_lists_every_node(flow: str, sqlite_url: str) -> None:
    code, out, _ = invoke("run", flow, "--input", '{"n": 4}', "--db", sqlite_url, "--executor", "inline",
                          "--run-id", "r1", "--json")
    assert code == 0, out
    data = json.loads(out)
    assert data["status"] == "completed"
    assert data["output"] == {"total": 0 + 1 + 4 + 9}
    code, out, _ = invoke("status", "r1", "--db", sqlite_url, "--json")
    assert code == 0
    data = json.loads(out)
    labels = {n["node"]: n for n in data["nodes"]}
    assert set(labels) == {"plan", "square", "square[0]", "square[1]", "square[2]", "square[3]", "total"}
    assert labels["total"]["attempts"] == 1
    assert labels["total"]["duration"] is not None and labels["total"]["started_at"] is not None


def test_failed_run_exits_1_and_status_shows_reason(flow: str, sqlite_url: str) -> None:
    code, out, _ = invoke("run", flow, "--input", '{"n": 2, "fail": true}', "--db", sqlite_url,
                          "--executor", "inline", "--run-id", "bad")
    assert code == 1
    assert "failed" in out and "refused by the test" in out
    code, out, _ = invoke("list", "--status", "failed", "--db", sqlite_url, "--json")
    assert [r["run_id"] for r in json.loads(out)] == ["bad"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["run", "{flow}", "--input", '{"n": 4'], "--input is not valid JSON"),
        (["run", "{flow}", "--input", '{"n": NaN}'], "--input is not valid JSON"),
        (["run", "{flow}", "--input", "@/nonexistent.json"], "does not exist"),
        (["run", "{flow}", "--input", '{"n": "many"}'], "input does not match In"),
        (["run", "no_such_module_xyz:wf"], "cannot import 'no_such_module_xyz'"),
        (["run", "{path}:nope"], "has no attribute 'nope'; workflows there: wf"),
        (["run", "{path}:not_a_workflow"], "is a int, not a raysaga Workflow"),
        (["run", "justamodule"], "is not MODULE:WORKFLOW"),
        (["status", "no-such-run"], "no run with id 'no-such-run'"),
        (["resume", "no-such-run"], "no run with id 'no-such-run'"),
        (["list", "--status", "sleeping"], "is not a run state"),
        (["graph", "{flow}", "--format", "png"], "--format 'png' is not known"),
    ],
)
def test_usage_errors_exit_2_with_one_line(args: list[str], message: str, flow: str, sqlite_url: str) -> None:
    path = flow.rpartition(":")[0]
    argv = [a.replace("{flow}", flow).replace("{path}", path) for a in args]
    if args[0] != "graph":
        argv += ["--db", sqlite_url]
    code, out, err = invoke(*argv)
    assert code == 2, (out, err)
    assert message in err
    assert len(err.strip().splitlines()) == 1, err
    assert open_store(sqlite_url).list_runs() == []  # a rejected command leaves nothing behind


def test_graph_mermaid_and_dot(flow: str) -> None:
    code, out, _ = invoke("graph", flow)
    assert code == 0
    assert out.startswith("flowchart TD")
    assert "plan --> square" in out and "square --> total" in out
    code, out, _ = invoke("graph", flow, "--format", "dot")
    assert code == 0
    assert '"plan" -> "square";' in out and out.rstrip().endswith("}")


def test_resume_of_completed_run_is_a_no_op(flow: str, sqlite_url: str) -> None:
    assert invoke("run", flow, "-i", '{"n": 1}', "--db", sqlite_url, "--executor", "inline", "--run-id", "x")[0] == 0
    events_before = len(open_store(sqlite_url).events("x"))
    before = open_store(sqlite_url).get_run("x")
    # the flow was started from a file path, which is never recorded as the run's workflow_ref
    # (a path read from the store is never imported): the operator names the workflow again
    code, out, _ = invoke("resume", "x", "--db", sqlite_url, "--executor", "inline", "--workflow", flow)
    assert code == 0 and "completed" in out
    # A run at rest is returned as it stands: no lease is claimed (this used to append one
    # `lease_claimed` event and bump the fence and updated_at, moving the run's prune cutoff).
    store = open_store(sqlite_url)
    assert [e.kind for e in store.events("x", after_seq=events_before)] == []
    after = store.get_run("x")
    assert (after.fence, after.updated_at, after.version) == (before.fence, before.updated_at, before.version)


def test_events_are_json_lines_in_order(flow: str, sqlite_url: str) -> None:
    invoke("run", flow, "-i", '{"n": 2}', "--db", sqlite_url, "--executor", "inline", "--run-id", "ev")
    code, out, _ = invoke("events", "ev", "--db", sqlite_url)
    assert code == 0
    seqs = [json.loads(line)["seq"] for line in out.splitlines()]
    assert seqs == list(range(1, len(seqs) + 1))


def test_db_upgrade_and_console_script(sqlite_url: str, tmp_path: Path) -> None:
    code, out, _ = invoke("db", "upgrade", "--db", sqlite_url)
    assert code == 0 and f"schema version {SCHEMA_VERSION}" in out
    exe = Path(sys.executable).with_name("raysaga")
    proc = subprocess.run([str(exe), "status", "nothing-here", "--db", sqlite_url], capture_output=True, text=True,
                          env={**os.environ, "COLUMNS": "60"}, timeout=60, cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("error: no run with id 'nothing-here'")
    assert len(proc.stderr.strip().splitlines()) == 1
