"""``bench/io_fanout.py --quick`` runs end to end and prints its table (figures are not checked).

It starts its own local Ray (``num_cpus=2``) in a subprocess, like ``test_bench_smoke``; the
peers (LangGraph, DBOS) are left out so it needs no optional package.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support import REPO

BENCH = REPO / "bench" / "io_fanout.py"


def test_io_fanout_bench_quick_runs_and_prints_its_table(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAYSAGA_IO_CONCURRENCY")}
    proc = subprocess.run([sys.executable, str(BENCH), "--quick", "--no-peers", "--items", "40", "--wait", "0.01",
                           "--concurrency", "8"], capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-4000:]}"
    for row in ("I/O fan-out: 40 items x 10 ms wait", "I/O concurrency 8", "ideal: ceil(N / concurrency) x wait",
                "raysaga io_bound", "of which the items", "raw Ray: one task per item", "== Targets =="):
        assert row in proc.stdout, f"missing {row!r} in:\n{proc.stdout}"
    assert "PASS" in proc.stdout or "MISS" in proc.stdout
