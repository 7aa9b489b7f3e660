"""``raysaga status`` for people: every node in the order it ran, human times, the driver and the
store, each failed attempt with its error line and the latest traceback, and, with --workflow,
the steps that never started."""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from raysaga.orchestrator.cli import app

FLOW = textwrap.dedent('''
    from pathlib import Path
    from raysaga import Permanent, RetryPolicy, Transient, Workflow

    wf = Workflow("flaky", version="1")
    COUNTER = Path({counter!r})

    @wf.step()
    def fetch() -> list[int]:
        return [1, 2, 3]

    @wf.map("fetch")
    def score(fetch: int) -> int:
        return fetch * 10

    @wf.step(retry=RetryPolicy(max_attempts=4, base=0.001, cap=0.002))
    def upload(score: list[int]) -> int:
        tries = int(COUNTER.read_text()) + 1 if COUNTER.exists() else 1
        COUNTER.write_text(str(tries))
        if tries < 3:
            raise Transient(f"upload timed out (try {{tries}})")
        raise Permanent("bucket [prod] refused: quota")

    @wf.step()
    def notify(upload: int) -> str:
        return "sent"
''')


@pytest.fixture
def flow(tmp_path: Path) -> str:
    path = tmp_path / "flaky_flow.py"
    path.write_text(FLOW.format(counter=str(tmp_path / "tries.txt")))
    return f"{path}:wf"


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exc_info
    return result.exit_code, result.stdout, result.stderr


def test_status_lists_nodes_in_order_with_readable_errors(flow: str, store_url: str) -> None:
    run_id = f"flaky-{abs(hash(store_url)) % 100_000}"
    code, out, err = invoke("run", flow, "--db", store_url, "--executor", "inline", "--run-id", run_id)
    assert code == 1, (out, err)
    code, out, err = invoke("status", run_id, "--db", store_url)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == f"run {run_id} (flaky v1): failed — critical step 'upload' failed: bucket [prod] refused: quota"
    assert re.fullmatch(r"created \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC, updated .* UTC \(.* in all\)", lines[1])
    assert lines[2].startswith("driver: no live driver since ")
    assert lines[3].startswith("store: ")
    table = [line.split()[0] for line in lines[5:] if line and not line.startswith(("fan-out", "error", "1 failed"))]
    assert table[:3] == ["fetch", "score", "upload"]  # the order the run went, parents before children
    upload = next(line for line in lines if line.startswith("upload "))
    assert "Permanent: bucket [prod] refused: quota" in upload and "{" not in upload  # a line, not a dict
    assert upload.split()[2] == "3"  # attempts
    assert "fan-out score: 3 items — 3 completed" in out
    assert "error: Permanent: bucket [prod] refused: quota" in out

    code, out, err = invoke("status", run_id, "--db", store_url, "--node", "upload")
    assert code == 0, err
    attempts = [line.strip() for line in out.splitlines() if line.strip().startswith("attempt ")]
    assert len(attempts) == 3, out
    assert "Transient: upload timed out (try 1) — retried after" in attempts[0]
    assert "Transient: upload timed out (try 2) — retried after" in attempts[1]
    assert "Permanent: bucket [prod] refused: quota — failed for good" in attempts[2]
    assert "latest traceback:" in out and "Traceback (most recent call last)" in out
    assert 'raise Permanent("bucket [prod] refused: quota")' in out
    # every failed attempt keeps its own traceback, not only the latest one
    assert out.count("Traceback (most recent call last)") == 3, out  # attempts 1 and 2, and the latest (3)
    assert out.count('raise Transient(f"upload timed out (try {tries})")') == 2, out

    code, out, _ = invoke("status", run_id, "--db", store_url, "--errors")
    assert code == 0 and "upload: failed" in out and "attempt 3" in out

    code, _, err = invoke("status", run_id, "--db", store_url, "--node", "nope[2]")
    assert code == 2 and "has no node 'nope[2]'" in err


def test_status_with_the_workflow_lists_steps_that_never_started(flow: str, sqlite_url: str) -> None:
    code, _, _ = invoke("run", flow, "--db", sqlite_url, "--executor", "inline", "--run-id", "p1")
    assert code == 1
    code, out, _ = invoke("status", "p1", "--db", sqlite_url)
    assert "notify" not in out  # the recorded code is never imported: unknown without --workflow
    code, out, err = invoke("status", "p1", "--db", sqlite_url, "--workflow", flow)
    assert code == 0, err
    notify = next(line for line in out.splitlines() if line.startswith("notify"))
    assert notify.split()[1:] == ["pending", "0", "not", "started"]
    code, out, _ = invoke("status", "p1", "--db", sqlite_url, "--workflow", flow, "--json")
    nodes = json.loads(out)["nodes"]
    assert [n["node"] for n in nodes] == ["fetch", "score", "score[0]", "score[1]", "score[2]", "upload", "notify"]
    assert nodes[-1]["status"] == "pending"


def test_status_json_keeps_its_keys_and_adds_schema_version(flow: str, sqlite_url: str) -> None:
    invoke("run", flow, "--db", sqlite_url, "--executor", "inline", "--run-id", "k1")
    code, out, _ = invoke("status", "k1", "--db", sqlite_url, "--json")
    assert code == 0
    data = json.loads(out)
    assert data["schema_version"] == 1
    assert {"run_id", "workflow", "version", "status", "reason", "trace_id", "created_at", "updated_at",
            "lease_owner", "lease_expires_at", "retries_used", "retry_budget", "tokens_used", "cost_used", "input",
            "output", "error", "node_counts", "nodes", "effects"} <= set(data)
    assert set(data["nodes"][0]) == {"node", "step", "index", "status", "attempts", "started_at", "finished_at",
                                     "duration", "not_before", "error", "output_digest", "inherited_from"}
    assert data["node_counts"] == {"completed": 5, "failed": 1}


def test_status_names_the_effects_whose_outcome_is_unknown(sqlite_url: str) -> None:
    """A charge in flight when its run stopped may or may not have happened: its ledger row says
    ``abandoned``, and the human view says so, with the key to look the call up by. (The ledger
    state is written as a driver that stopped writes it; how a run gets there is the crash and
    saga tests'.)"""
    import raysaga
    from raysaga import Workflow
    from raysaga.state import Batch, EffectStatus, EffectWrite, RunStatus, RunUpdate, SqlStore

    wf = Workflow("shop")

    @wf.step(effect=True)
    def charge() -> str:
        return "ch_1"

    raysaga.create_run(wf, store=sqlite_url, run_id="shop-1")
    store = SqlStore(sqlite_url)
    try:
        lease = store.claim("shop-1", "test-driver", 30.0)
        keys = [f"rs-{i:040x}" for i in range(12)]
        pending = [EffectWrite(idempotency_key=k, node_id="charge", fan_index=-1, effect_name="charge",
                               args_digest="", status=EffectStatus.PENDING) for k in keys]
        store.commit(lease, Batch(effects=pending))
        store.commit(lease, Batch(
            effects=[EffectWrite(idempotency_key=keys[0], node_id="charge", fan_index=-1, effect_name="charge",
                                 args_digest="", status=EffectStatus.COMMITTED, result="ch_1")],
            run=RunUpdate(status=RunStatus.CANCELLED, status_reason="operator says stop")))
        ledger = {e.idempotency_key: e.status for e in store.effects("shop-1")}
    finally:
        store.close()
    assert ledger[keys[0]] == EffectStatus.COMMITTED
    assert {ledger[k] for k in keys[1:]} == {EffectStatus.ABANDONED}  # the transition abandoned the rest
    code, out, err = invoke("status", "shop-1", "--db", sqlite_url)
    assert code == 0, err
    assert "11 effect(s) with an unknown outcome" in out, out
    listed = [line.split()[-1] for line in out.splitlines() if line.startswith("  charge: effect charge, key ")]
    assert len(listed) == 10 and set(listed) <= set(keys[1:]), out  # the first ten, each with its key
    assert keys[0] not in out  # committed: its outcome is known
    assert "... and 1 more: `raysaga status shop-1 --json`" in out
