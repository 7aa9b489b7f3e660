"""The operations verbs of the CLI, in-process on a real SQLite store: inbox, approve and reject
(their refusals are one line, exit 2), pause, unpause, submit, stats (text, JSON, Prometheus)."""

from __future__ import annotations

import json
from pathlib import Path

import raysaga
from raysaga.state import RunStatus, SqlStore
from tests.support import fleet_flows as flows
from tests.support.cli import invoke, one_line_error


def _waiting(db: str, tmp_path: Path, n: int) -> str:
    value = {"n": n, "services": "http://127.0.0.1:9", "trace": str(tmp_path / "t")}
    rested = raysaga.run(flows.approval, value, store=db, executor="inline")
    assert rested.status == RunStatus.WAITING_HUMAN
    return rested.run_id


def test_inbox_decisions_and_their_refusals(sqlite_url: str, tmp_path: Path) -> None:
    run_id = _waiting(sqlite_url, tmp_path, 1)
    code, out, _ = invoke("inbox", "--for", "alice", "--db", sqlite_url)
    assert code == 0 and run_id in out and "charge 1?" in out
    code, out, _ = invoke("inbox", "--for", "bob", "--db", sqlite_url)
    assert code == 0 and "nothing waits for a decision by bob" in out
    code, out, _ = invoke("inbox", "--json", "--db", sqlite_url)
    assert json.loads(out.splitlines()[0])["request"]["approvers"] == ["alice"]
    code, _, err = invoke("approve", run_id, "review", "--by", "bob", "--db", sqlite_url)
    one_line_error(code, err, "bob may not decide 'review': its approvers are alice")
    code, _, err = invoke("approve", run_id, "nope", "--by", "alice", "--db", sqlite_url)
    one_line_error(code, err, "is not waiting for a decision")
    code, _, err = invoke("approve", run_id, "review", "--by", "alice", "--answer", "{bad", "--db", sqlite_url)
    assert code == 2 and "JSON" in err
    code, out, _ = invoke("reject", run_id, "review", "--by", "alice", "--comment", "no", "--decision-id", "d1",
                          "--db", sqlite_url)
    assert code == 0 and "rejected by alice (decision d1)" in out
    code, out, _ = invoke("reject", run_id, "review", "--by", "alice", "--decision-id", "d1", "--db", sqlite_url)
    assert code == 0  # the same decision again: one decision
    code, _, err = invoke("approve", run_id, "review", "--by", "alice", "--db", sqlite_url)
    one_line_error(code, err, "already decided: rejected by alice")


def test_pause_unpause_submit_and_stats(sqlite_url: str, tmp_path: Path) -> None:
    run_id = _waiting(sqlite_url, tmp_path, 2)
    code, out, _ = invoke("pause", run_id, "--by", "ops", "--db", sqlite_url)
    assert code == 0 and f"run {run_id}: paused" in out
    code, out, _ = invoke("unpause", run_id, "--db", sqlite_url)
    assert code == 0 and "unpaused" in out  # paused until a worker takes it up: unpausing again is harmless
    code, out, _ = invoke("submit", "tests.support.fleet_flows:short", "--input",
                          json.dumps({"n": 3, "services": "http://127.0.0.1:9", "trace": str(tmp_path / "t")}),
                          "--db", sqlite_url)
    submitted = out.strip()
    assert code == 0 and submitted.startswith("fleet_short-")
    store = SqlStore(sqlite_url)
    try:
        assert store.get_run(submitted).queue == "default" and store.get_run(submitted).status == RunStatus.PENDING
    finally:
        store.close()
    code, _, err = invoke("unpause", submitted, "--db", sqlite_url)
    one_line_error(code, err, "is pending, not paused")
    code, out, _ = invoke("stats", "--json", "--db", sqlite_url)
    figures = json.loads(out)
    assert code == 0 and figures["runs_by_state"] == {"paused": 1, "pending": 1}
    assert figures["waiting_human_seconds"]["count"] == 1  # the wait ended when it was paused
    code, out, _ = invoke("stats", "--prometheus", "--db", sqlite_url)
    assert 'raysaga_runs{status="paused"} 1' in out.splitlines()
    code, out, _ = invoke("stats", "--db", sqlite_url)
    assert "runs: paused 1, pending 1" in out
