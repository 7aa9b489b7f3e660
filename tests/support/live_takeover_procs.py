"""Real processes for ``tests/crash/test_live_takeover_bound.py``: lease owners that stay alive,
and inline workers whose steps hold the GIL past their lease. Not a test module."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.support import REPO

FLOWS = "tests.support.live_takeover_flows"
#: The workers' lease: shorter than any ``hold`` the tests give, so a held GIL outlasts it.
LEASE_TTL = 1.0


@contextmanager
def live_owners(n: int) -> Iterator[list[str]]:
    """The lease owner strings of ``n`` processes that stay alive (each prints its own, then waits on
    stdin): a claim taking a lease from one finds it provably alive on this host."""
    code = "from raysaga.orchestrator.ownership import new_owner; print(new_owner(), flush=True); input()"
    procs = [subprocess.Popen([sys.executable, "-c", code], text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
             for _ in range(n)]
    try:
        owners = []
        for proc in procs:
            assert proc.stdout is not None
            owners.append(proc.stdout.readline().strip())
        assert all(owners), owners
        yield owners
    finally:
        for proc in procs:
            proc.kill()
            proc.communicate()


def start_worker(db: str, log_dir: Path, n: int, flow: str) -> subprocess.Popen[str]:
    """An inline worker (one run at a time) serving ``flow`` of ``FLOWS``, its stderr in
    ``log_dir/worker<n>.err``; returned once its banner says it polls."""
    args = [sys.executable, "-m", "raysaga", "worker", "--db", db, "--executor", "inline", "--lease-ttl",
            str(LEASE_TTL), "--poll", "0.05", "--concurrency", "1", "--workflow", f"{FLOWS}:{flow}"]
    err_path = log_dir / f"worker{n}.err"
    with err_path.open("w") as err:
        proc = subprocess.Popen(args, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, text=True,
                                stdout=subprocess.PIPE, stderr=err)
    assert proc.stdout is not None
    banner = proc.stdout.readline()  # printed once its signal handlers are in place ('' if it died)
    assert banner.startswith("worker "), (banner, err_path.read_text())
    return proc


def stop_all(procs: list[subprocess.Popen[str]]) -> None:
    for proc in procs:
        proc.kill()
        proc.communicate()
