"""``list`` and ``status --json`` stay bounded on big stores: summaries only, nodes streamed.

The tests build smaller stores than the acceptance figures; the figures come from the same
builders at full size (see docs/cli.md, "Scale"):

    python tests/cli/test_cli_scale.py runs /tmp/runs.db 100000      # + 5 runs with ~20 MB inputs
    /usr/bin/time -v raysaga list --db sqlite:////tmp/runs.db
    python tests/cli/test_cli_scale.py wide /tmp/wide.db 50000
    /usr/bin/time -v raysaga status wide --json --db sqlite:////tmp/wide.db > /dev/null
"""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

from sqlalchemy import insert, select

from raysaga.state import NewRun, SqlStore, open_store
from raysaga.state.schema import nodes, runs

BIG_INPUT_BYTES = 20 * 1024 * 1024


def _run_row(run_id: str, at: float, status: str = "completed") -> dict[str, object]:
    return {"run_id": run_id, "workflow_name": "bulk", "workflow_version": "1", "definition_hash": "0" * 64,
            "workflow_ref": None, "status": status, "status_reason": None, "version": 3, "fence": 1,
            "event_seq": 1, "input": {"n": 1}, "retries_used": 0, "tokens_used": 0, "cost_used": 0.0,
            "trace_id": uuid.uuid4().hex, "created_at": at, "updated_at": at + 1.0}


def build_runs(url: str, count: int, big: int = 5, big_bytes: int = BIG_INPUT_BYTES) -> None:
    """``count`` small runs inserted in bulk, plus ``big`` runs with an input of ``big_bytes``
    created through the store (so their inputs are blobs, as in real use)."""
    store = SqlStore(url, max_input_bytes=big_bytes * 2) if "max_input_bytes" in _open_params() else SqlStore(url)
    try:
        base = 1_700_000_000.0
        with store.engine.begin() as conn:
            for start in range(0, count, 10_000):
                conn.execute(insert(runs), [_run_row(f"bulk-{i:07d}", base + i)
                                            for i in range(start, min(count, start + 10_000))])
        for i in range(big):
            store.create_run(NewRun(run_id=f"big-{i}", workflow_name="bulk", workflow_version="1",
                                    definition_hash="0" * 64, input={"i": i, "blob": "x" * big_bytes},
                                    trace_id=uuid.uuid4().hex))
    finally:
        store.close()


def _open_params() -> set[str]:
    return set(inspect.signature(SqlStore.__init__).parameters)


def build_wide_run(url: str, run_id: str, width: int) -> None:
    """One completed run of a fan-out ``width`` wide, its node rows written in bulk."""
    store = open_store(url)
    try:
        at = time.time()
        with store.engine.begin() as conn:
            conn.execute(insert(runs), [_run_row(run_id, at)])
            # node rows carry the run's integer key (schema 8), given when its row was inserted
            key = conn.execute(select(runs.c.run_key).where(runs.c.run_id == run_id)).scalar_one()
            rows = [{"run_key": key, "node_id": "plan", "fan_index": -1, "status": "completed", "attempt": 1,
                     "error": None, "output": None, "started_at": at, "finished_at": at + 0.1, "duration": 0.1},
                    {"run_key": key, "node_id": "square", "fan_index": -1, "status": "completed", "attempt": 1,
                     "error": None, "output": None, "started_at": at + 0.2, "finished_at": at + 9, "duration": 8.8},
                    {"run_key": key, "node_id": "total", "fan_index": -1, "status": "completed", "attempt": 1,
                     "error": None, "output": None, "started_at": at + 10, "finished_at": at + 10.1, "duration": 0.1}]
            rows += [{"run_key": key, "node_id": "square", "fan_index": i,
                      "status": "failed" if i % 1000 == 7 else "completed", "attempt": 1,
                      "error": {"type": "ValueError", "message": f"item {i}"} if i % 1000 == 7 else None,
                      "output": {"value": i * i}, "started_at": at + 0.2 + i * 1e-5,
                      "finished_at": at + 0.3 + i * 1e-5, "duration": 0.1} for i in range(width)]
            # (executemany takes its columns from the first row: every row names them all)
            for start in range(0, len(rows), 10_000):
                conn.execute(insert(nodes), rows[start:start + 10_000])
    finally:
        store.close()


#: Runs the CLI and, at exit, writes the process's peak RSS (VmHWM: reset at exec, unlike
#: ru_maxrss, which keeps the forked pytest parent's size) to the file named by argv[1].
_MEASURED_CLI = """
import atexit, sys
from pathlib import Path

REPORT = sys.argv[1]

def _peak() -> None:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            Path(REPORT).write_text(line.split()[1])

atexit.register(_peak)
sys.argv = ["raysaga", *sys.argv[2:]]  # what the CLI sees: the command and its options
from raysaga.orchestrator.cli import main
main()
"""


def _raysaga(*args: str, cwd: Path) -> tuple[subprocess.CompletedProcess[str], float, int]:
    """Run the CLI in a fresh interpreter; (process, wall seconds, peak RSS of that process in MiB)."""
    report = cwd / f"peak-{uuid.uuid4().hex}"
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", _MEASURED_CLI, str(report), *args], capture_output=True,
                          text=True, timeout=300, cwd=cwd, env={**os.environ, "COLUMNS": "80"})
    wall = time.monotonic() - started
    return proc, wall, int(report.read_text()) // 1024


def test_list_reads_summaries_only(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    build_runs(url, 20_000, big=3, big_bytes=8 * 1024 * 1024)
    proc, _, peak = _raysaga("list", "--db", url, "--limit", "1000", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)
    assert [r["run_id"] for r in rows[:3]] == ["big-2", "big-1", "big-0"]
    assert len(rows) == 1000
    # the three 8 MiB inputs are never read: far below what reading them (and their JSON) costs
    assert peak < 250, f"peak RSS {peak} MiB"


def test_status_json_streams_a_wide_run_in_order(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'wide.db'}"
    build_wide_run(url, "wide", 5_000)
    proc, _, _ = _raysaga("status", "wide", "--json", "--db", url, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["schema_version"] == 1
    labels = [n["node"] for n in data["nodes"]]
    assert labels[:3] == ["plan", "square", "square[0]"] and labels[-1] == "total"
    assert labels[2:-1] == [f"square[{i}]" for i in range(5_000)]
    assert data["node_counts"] == {"completed": 5_003 - 5, "failed": 5}
    # paging: three pages of 2,001 cover everything once, in the same order
    seen: list[str] = []
    after: str | None = None
    while True:
        extra = ["--nodes-after", after] if after else []
        proc, _, _ = _raysaga("status", "wide", "--json", "--db", url, "--nodes-limit", "2001", *extra, cwd=tmp_path)
        page = json.loads(proc.stdout)
        seen += [n["node"] for n in page["nodes"]]
        after = page["next_nodes_after"]
        if after is None:
            break
    assert seen == labels
    proc, _, _ = _raysaga("status", "wide", "--json", "--summary", "--db", url, cwd=tmp_path)
    summary = json.loads(proc.stdout)
    assert "nodes" not in summary
    square = next(s for s in summary["steps"] if s["step"] == "square")
    assert square["counts"] == {"completed": 4_996, "failed": 5} and square["nodes"] == 5_001
    assert [f["node"] for f in summary["failures"]] == [f"square[{i}]" for i in (7, 1007, 2007, 3007, 4007)]
    assert summary["failures"][0]["error"] == "ValueError: item 7"
    proc, _, _ = _raysaga("status", "wide", "--db", url, cwd=tmp_path)
    assert "fan-out square: 5000 items — 4995 completed, 5 failed" in proc.stdout, proc.stdout
    assert "square[7]" in proc.stdout and "ValueError: item 7" in proc.stdout


if __name__ == "__main__":
    kind, path, size = sys.argv[1], sys.argv[2], int(sys.argv[3])
    target = f"sqlite:///{Path(path).resolve()}"
    if kind == "runs":
        build_runs(target, size)
    else:
        build_wide_run(target, "wide", size)
    print(f"built {kind} x {size} in {target}")
