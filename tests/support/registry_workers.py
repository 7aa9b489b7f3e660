"""Worker processes for the fleet-registry tests: started with a short beat, so a test waits for
the registry to say what it should (``wait_until``) in well under a second instead of minutes."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.support import REPO

#: The beat interval the tests' workers use (``RAYSAGA_WORKER_BEAT``): live means a beat within 3.
BEAT = 0.2
FLOWS = "tests.support.fleet_view_flows"


def start_registered(db: str, *names: str, concurrency: int = 1, beat: float = BEAT) -> subprocess.Popen[str]:
    """A ``raysaga worker`` (inline executor) of ``fleet_view_flows``' ``names``, its signal handlers in place."""
    args = [sys.executable, "-m", "raysaga", "worker", "--db", db, "--executor", "inline", "--lease-ttl", "5",
            "--poll", "0.05", "--concurrency", str(concurrency)]
    for name in names:
        args += ["--workflow", f"{FLOWS}:{name}"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAYSAGA_WORKER_BEAT": str(beat)}
    proc = subprocess.Popen(args, cwd=REPO, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None
    banner = proc.stdout.readline()  # printed once its signal handlers are in place (or '' if it died)
    assert banner.startswith("worker "), f"the worker did not start: {banner!r} {proc.stderr and proc.stderr.read()}"
    return proc
