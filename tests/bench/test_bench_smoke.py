"""``bench/bench.py --quick`` runs end to end and prints its tables (figures are not checked).

It starts its own local Ray (``num_cpus=2``) in a subprocess, so it neither needs nor
disturbs the session's Ray cluster; most of its ~15-30 s is ``ray.init``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support import REPO

BENCH = REPO / "bench" / "bench.py"

HEADINGS = ("== Chain: 50 dependent no-op nodes ==", "== Fan-out:", "== DB size:", "== Targets ==")


def test_bench_quick_runs_and_prints_every_table(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAYSAGA_BENCH_PG_URL")}
    proc = subprocess.run([sys.executable, str(BENCH), "--quick", "--json", str(tmp_path / "bench.json")],
                          capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-4000:]}"
    for heading in HEADINGS:
        assert heading in proc.stdout, f"missing {heading!r} in:\n{proc.stdout}"
    for row in ("raysaga executor=ray", "raysaga executor=inline", "floor: raw Ray round trip"):
        assert row in proc.stdout
    assert "PASS" in proc.stdout or "MISS" in proc.stdout
    assert (tmp_path / "bench.json").stat().st_size > 0
