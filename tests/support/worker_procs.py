"""Worker processes for the fleet tests: start one, stop one, and the checks they share."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from raysaga.orchestrator.ownership import owner_is_gone
from tests.support import REPO
from tests.support.services import FakeServices, get_log


def start_worker(db: str, *flow_names: str, executor: str = "inline", lease_ttl: float = 2.0,
                 concurrency: int = 2, extra: list[str] | None = None) -> subprocess.Popen[str]:
    args = [sys.executable, "-m", "raysaga", "worker", "--db", db, "--executor", executor,
            "--lease-ttl", str(lease_ttl), "--poll", "0.05", "--concurrency", str(concurrency), *(extra or [])]
    for name in flow_names:
        args += ["--workflow", f"tests.support.fleet_flows:{name}"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(args, cwd=REPO, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None
    banner = proc.stdout.readline()  # printed once its signal handlers are in place (or '' if it died)
    assert banner.startswith("worker "), f"the worker did not start: {banner!r} {proc.stderr and proc.stderr.read()}"
    return proc


def dead_owner() -> str:
    """The lease owner string of a process that has exited (provably gone from this host)."""
    code = "from raysaga.orchestrator.ownership import new_owner; print(new_owner())"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    owner = done.stdout.strip()
    assert owner_is_gone(owner), owner
    return owner


def stop(proc: subprocess.Popen[str], sig: int = signal.SIGTERM, timeout: float = 60.0) -> tuple[int, str, str]:
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def fleet_input(n: int, services: FakeServices, trace: Path) -> dict[str, Any]:
    return {"n": n, "services": services.url, "trace": str(trace)}


def assert_effects_once(services: FakeServices, subjects: list[str]) -> None:
    log = get_log(services.url)
    assert {k: v for k, v in log["effective"].items() if v != 1} == {}
    assert sorted(log["by_subject"]) == sorted(subjects)
    assert set(log["by_subject"].values()) == {1}
