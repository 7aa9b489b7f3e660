"""``bench/suite.py --quick`` runs end to end and prints every table (figures are not checked).

It starts its own local Ray (``num_cpus=2``) in a subprocess, neither needing nor disturbing
the session's cluster, and skips a peer (LangGraph, DBOS) that is not installed: CI installs
the ``dev`` extra only. About 45 s on the 2-core VM, most of it Ray starting and subprocesses:
a benchmark, so it runs with ``RAYSAGA_FULL_SWEEP=1`` (CI runs the shorter ``bench.py --quick``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support import REPO
from tests.support.sweep import full_sweep_only

SUITE = REPO / "bench" / "suite.py"

HEADINGS = (
    "== Chain: 20 no-op steps, durable on SQLite",
    "== Fan-out: plan -> N no-op items -> join",
    "== Fan-out: 8 items x 10 ms of CPU each",
    "== Storage: database bytes after one run of each scenario",
    "== Storage: raysaga bytes per node as the fan-out grows",
    "== Driver peak RSS",
    "== Resume: SIGKILL",
    "== Reading:",
    "== Targets (ratios from this run) ==",
)


@full_sweep_only("CI runs bench/bench.py --quick (test_bench_smoke) and bench/io_fanout.py --quick")
def test_suite_quick_runs_and_prints_every_table(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAYSAGA_BENCH_PG_URL")}
    out = tmp_path / "tables.txt"
    proc = subprocess.run([sys.executable, str(SUITE), "--quick", "--out", str(out)],
                          capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-4000:]}"
    for heading in HEADINGS:
        assert heading in proc.stdout, f"missing {heading!r} in:\n{proc.stdout}"
    for row in ("raysaga inline", "raysaga on Ray", "floor: Ray round trip", "raw Ray batched",
                "status --json", "list (newest 50)", "dashboard GET /api/runs/RUN"):
        assert row in proc.stdout, f"missing row {row!r}"
    assert "PASS" in proc.stdout or "MISS" in proc.stdout
    assert out.read_text() != ""
