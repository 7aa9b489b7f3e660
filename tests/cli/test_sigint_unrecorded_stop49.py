"""Ctrl-C while ``raysaga run`` starts Ray, before its run is recorded, says so.

``runner.run`` records a new run only once its executor is up (an unreachable cluster leaves no
``pending`` run behind); Ray's start takes seconds on a loaded machine. A Ctrl-C then printed
"interrupted: `raysaga resume X` continues it", and ``raysaga resume X`` answered "no run with id
'X'". Now: "interrupted before run X was recorded: nothing ran; run the command again" (exit 130),
and running the command again runs it.

``tests.support.stop49_flows`` (``STOP49_BLOCK_RAY``): the executor's start joins the session's Ray,
then writes a file and blocks, so the test's SIGINT lands before the run is recorded, with no sleep.
The last test shuts a local Ray down as ``abandon_ray`` does after that Ctrl-C, in a process of its own.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from raysaga.errors import RunNotFoundError
from raysaga.state import RunStatus, open_store
from tests.support import REPO
from tests.support.child_signals import sigint_default
from tests.support.crash_driver import wait_until
from tests.support.processes import pids_mentioning


def _run(db: str, ray_address: str) -> list[str]:
    return [sys.executable, "-m", "raysaga", "run", "tests.support.stop49_flows:slow_start", "--run-id", "unrec-49",
            "--db", db, "--address", ray_address, "--quiet", "--input", json.dumps({})]


def test_a_ctrl_c_before_the_run_is_recorded_says_nothing_ran(tmp_path: Path, ray_address: str) -> None:
    db = f"sqlite:///{tmp_path / 'u.db'}"
    ready = tmp_path / "ray-started"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(_run(db, ray_address), cwd=REPO, env={**env, "STOP49_BLOCK_RAY": str(ready)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=sigint_default)
    try:
        wait_until(lambda: ready.exists() or proc.poll() is not None, timeout=300, what="Ray's start to be under way")
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, (out, err)
    assert err.strip() == "interrupted before run unrec-49 was recorded: nothing ran; run the command again", err
    assert "resume" not in err
    store = open_store(db)
    try:
        with pytest.raises(RunNotFoundError):
            store.get_run("unrec-49")
    finally:
        store.close()
    again = subprocess.run(_run(db, ray_address), cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr
    store = open_store(db)
    try:
        assert store.get_run("unrec-49").status == RunStatus.COMPLETED
    finally:
        store.close()


def test_abandon_ray_ends_the_local_ray_a_process_started_at_once(tmp_path: Path) -> None:
    """Ray's exit hook shut it down gracefully (a second per process after SIGTERM, another after
    SIGKILL, one after another); ``abandon_ray`` kills them at once, after leaving the cluster, and
    the process exits cleanly (killed before it left, the exit waited 15 s for the dead GCS, or
    crashed)."""
    code = textwrap.dedent('''
        import json, logging, os
        import ray
        from raysaga.orchestrator.unrecorded import abandon_ray
        ray.init(num_cpus=1, include_dashboard=False, logging_level=logging.ERROR, log_to_driver=False)
        node = ray._private.worker._global_node
        pids = [info.process.pid for infos in node.all_processes.values() for info in infos]
        abandon_ray()
        def alive(pid):
            try:
                with open(f"/proc/{pid}/status") as f:
                    return "\\nState:\\tZ" not in f.read()
            except OSError:
                return False
        print(json.dumps({"pids": len(pids), "alive": [p for p in pids if alive(p)],
                          "up": ray.is_initialized()}))
    ''')
    ray_tmp = tempfile.mkdtemp(prefix="rs49-", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    try:
        done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env={**env, "RAY_TMPDIR": ray_tmp},
                              capture_output=True, text=True, timeout=300)
    finally:  # what Ray leaves behind whatever the shutdown (a runtime env agent, reparented to 1)
        for pid in pids_mentioning(ray_tmp, open_files=True):
            os.kill(pid, signal.SIGKILL)
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert done.returncode == 0, done.stdout + done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["pids"] >= 2 and out["alive"] == [] and out["up"] is False, out
