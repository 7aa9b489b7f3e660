"""A blob that is missing or does not match its digest parks the run; the data is never used.

A run writes a large (> 64 KiB, so blob-stored) output from ``big`` and is SIGKILLed while its
dependent is running. The blob row is then altered (or deleted) with plain SQL, behind
raysaga's back. ``raysaga resume`` must not hand the dependent the altered data: the run ends
``failed`` with a reason naming the node and the digest, an event records it, the lease is
released, there is no traceback, and the dependent never runs again.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from sqlalchemy import text

from raysaga.state import NodeStatus, RunStatus, SqlStore
from tests.support import crash_driver as harness

FLOW = textwrap.dedent('''
    import time
    from pathlib import Path
    from raysaga import Workflow

    wf = Workflow("runtime_blob")

    @wf.step()
    def big(input: dict) -> list:
        return ["x" * 1000 for _ in range(100)]       # ~100 KB of JSON: kept as a blob

    @wf.step()
    def count(big: list) -> int:                       # committing its dispatch makes big durable
        return len(big)

    @wf.step()
    def dependent(input: dict, big: list, count: int) -> int:
        Path(input["started"]).write_text("started")
        while not Path(input["gate"]).exists():        # the workload: waits for the test
            time.sleep(0.02)
        Path(input["ran"]).write_text(json.dumps(big[:1]))
        return len(big)

    import json
''')


def cli(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "raysaga", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120, env={k: v for k, v in os.environ.items() if k != "RAYSAGA_FAULTS"})


@pytest.mark.parametrize("damage", ["altered", "missing"])
def test_damaged_blob_parks_the_run_and_is_never_used(store_url: str, tmp_path: Path, damage: str) -> None:
    flow = tmp_path / "blob_flow.py"
    flow.write_text(FLOW)
    inp = {"started": str(tmp_path / "started"), "gate": str(tmp_path / "gate"), "ran": str(tmp_path / "ran")}
    run_id = f"blob-{damage}"
    store = SqlStore(store_url)
    proc = subprocess.Popen(
        [sys.executable, "-m", "raysaga", "run", f"{flow}:wf", "--db", store_url, "--run-id", run_id,
         "--input", json.dumps(inp), "--executor", "inline", "--quiet", "--lease-ttl", "1"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        def big_durable_and_dependent_started() -> bool:
            if proc.poll() is not None:
                return True
            rows = {n.label: n.status for n in store.nodes(run_id)} if Path(inp["started"]).exists() else {}
            return rows.get("big") == NodeStatus.COMPLETED

        harness.wait_until(big_durable_and_dependent_started, timeout=120,
                           what="big's output to be durable and the dependent step to start")
        assert proc.poll() is None, harness.finish(proc).describe()
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)
    finally:
        harness.stop(proc)
    try:
        rows = {n.label: n for n in store.nodes(run_id)}
        assert rows["big"].status == NodeStatus.COMPLETED
        digest = rows["big"].output_digest
        assert digest is not None, "big's output must be blob-stored for this test"
        with store.engine.begin() as conn:  # behind raysaga's back
            if damage == "altered":
                conn.execute(text("UPDATE raysaga_blobs SET data = :d WHERE digest = :g"),
                             {"d": b'["tampered"]', "g": digest})
            else:
                conn.execute(text("DELETE FROM raysaga_blobs WHERE digest = :g"), {"g": digest})
        harness.wait_lease_expired(store, run_id)
        Path(inp["started"]).unlink()
        Path(inp["gate"]).touch()

        done = cli(tmp_path, "resume", run_id, "--db", store_url, "--executor", "inline", "--quiet")
        assert done.returncode == 1, done.stdout + done.stderr  # the run ended failed (parked)
        assert "Traceback" not in done.stdout + done.stderr

        run = store.get_run(run_id)
        assert run.status == RunStatus.FAILED
        reason = run.status_reason or ""
        assert "node big" in reason and digest in reason, reason
        assert ("is missing" if damage == "missing" else "does not match") in reason, reason
        assert "raysaga retry" in reason
        assert run.error is not None
        assert run.error["type"] == "BlobIntegrityError" and run.error["digest"] == digest
        assert run.lease_owner is None
        events = [e for e in store.events(run_id) if e.kind == "blob_integrity_error"]
        assert len(events) == 1 and events[0].data["digest"] == digest and events[0].data["node"] == "node big"
        # the dependent never ran on the damaged data (not even started again), nor did count
        assert not Path(inp["started"]).exists() and not Path(inp["ran"]).exists()
        assert "dependent" not in {n.label for n in store.nodes(run_id) if n.status == NodeStatus.COMPLETED}
        assert store.get_run(run_id).status == RunStatus.FAILED
    finally:
        store.close()
