"""``raysaga launch``'s "follow it" line names the driver's log as the cluster's auth mode needs it
(review, stop 49), on real Ray heads of this module's own.

A shell with ``RAY_AUTH_MODE=token`` launching on a cluster without token authentication was told
``(the driver's log: RAY_AUTH_MODE=token ray job logs ...)``, and ``status`` of the pending run
the same: the prefix followed this shell's variable, not the cluster. It now follows what the
cluster's dashboard says of itself (``/api/authentication_mode``): no prefix for a cluster without
token auth, whatever the shell has; the prefix for one that requires it, found by a shell with no
``RAY_AUTH_MODE`` (raysaga turned token mode on for itself: the shell that follows has none).

Each head is started with its own temp dir and token file (nothing written to ``~/.ray``, which
other clusters of the machine read); every process mentioning that dir is killed at the end.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from raysaga.orchestrator.ray_auth import cluster_uses_token
from raysaga.state import SqlStore
from tests.support.processes import pids_mentioning

pytestmark = pytest.mark.cluster

BIN = Path(sys.executable).parent
RAY = shutil.which("ray", path=str(BIN)) or shutil.which("ray") or "ray"
RAYSAGA = shutil.which("raysaga", path=str(BIN)) or shutil.which("raysaga") or "raysaga"
_SCRUBBED = ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAYSAGA_DB",
             "RAY_API_SERVER_ADDRESS")
FLOW = textwrap.dedent('''
    from raysaga import Workflow

    wf = Workflow("launch_auth_stop49")

    @wf.step()
    def only() -> int:
        return 1
''')


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class Head:
    mode: str  # "disabled" or "token"
    dashboard: str
    token_file: Path


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _SCRUBBED}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env.update(extra)
    return env


@pytest.fixture(scope="module", params=["disabled", "token"])
def head(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Head]:
    mode = str(request.param)
    token_file = tmp_path_factory.mktemp("auth-stop49") / "auth_token"
    token_file.write_text(uuid.uuid4().hex + uuid.uuid4().hex)
    temp_dir = Path(tempfile.mkdtemp(prefix="rs49-", dir="/tmp"))  # short: Ray's socket paths fit 107 bytes
    dashboard_port = free_port()
    try:
        started = subprocess.run(
            [RAY, "start", "--head", f"--port={free_port()}", f"--dashboard-port={dashboard_port}",
             "--dashboard-host=127.0.0.1", "--include-dashboard=true", f"--ray-client-server-port={free_port()}",
             f"--dashboard-agent-listen-port={free_port()}", "--num-cpus=1", "--node-ip-address=127.0.0.1",
             f"--temp-dir={temp_dir}", "--disable-usage-stats"],
            env=_env(RAY_AUTH_MODE=mode, RAY_AUTH_TOKEN_PATH=str(token_file)), capture_output=True, text=True,
            timeout=120, start_new_session=True)
        assert started.returncode == 0, started.stderr[-3000:]
        yield Head(mode, f"http://127.0.0.1:{dashboard_port}", token_file)
    finally:
        for pid in pids_mentioning(str(temp_dir), open_files=True):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(temp_dir, ignore_errors=True)


def test_the_follow_line_names_the_token_only_for_a_cluster_that_requires_it(head: Head, tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "launch_auth_stop49_flow.py").write_text(FLOW)
    db = tmp_path / "s.db"
    # the token shell of the review (RAY_AUTH_MODE=token) on either cluster, and a shell that leaves
    # the mode to raysaga (the cluster's token in a file) on the cluster that requires it
    shells = [{"RAY_AUTH_MODE": "token"}] + ([{}] if head.mode == "token" else [])
    for shell in shells:
        launched = subprocess.run(
            [RAYSAGA, "launch", "launch_auth_stop49_flow:wf", "--address", head.dashboard, "--db", str(db)],
            cwd=project, env=_env(RAY_AUTH_TOKEN_PATH=str(head.token_file), **shell), capture_output=True,
            text=True, timeout=120)
        assert launched.returncode == 0, launched.stderr
        run_id = launched.stdout.strip()
        [follow] = [line for line in launched.stderr.splitlines() if line.startswith("follow it: ")]
        log = f"ray job logs raysaga-{run_id} --address {head.dashboard})"
        if head.mode == "token":
            assert f"(the driver's log: RAY_AUTH_MODE=token {log}" in follow, follow
        else:
            assert f"(the driver's log: {log}" in follow, follow  # this shell's RAY_AUTH_MODE=token: not needed
        store = SqlStore(f"sqlite:///{db}")
        try:  # the note `status` shows of a pending launched run says the same (if the job's driver let it be written)
            marks = [e.data for e in store.events(run_id) if e.kind == "launched"]
        finally:
            store.close()
        assert all(isinstance(m, dict) and m.get("token", False) is (head.mode == "token") for m in marks), marks
    assert cluster_uses_token(head.dashboard) is (head.mode == "token")
