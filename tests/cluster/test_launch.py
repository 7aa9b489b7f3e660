"""``raysaga launch`` on a real Ray cluster with token authentication, and PostgreSQL.

The cluster is this module's own, never the session's: a head (``ray start --head`` on free
ports, one CPU, a dashboard serving the Job API) and a second node joined with ``ray start
--address`` offering ``{"special": 1}``, both started with ``RAY_AUTH_MODE=token`` and a token
file of their own (``RAY_AUTH_TOKEN_PATH``; nothing is written to ``~/.ray``, which other
clusters on the machine read). The launching shell has that token file but no
``RAY_AUTH_MODE``: raysaga must find that the cluster wants it. Every process of a node mentions
its temp dir; they are all killed at the end, pass or fail (never ``ray stop``, which would stop
every cluster of the machine).

- launch returns in seconds, its process exits, the run completes on the cluster (the pinned
  step on the second node, the ``--env`` variable seen there), ``raysaga status`` from another
  process shows it; a second launch of the run starts no second job;
- a run whose job died is taken over by launching it again (job ``raysaga-RUN-2``), which
  ``--wait`` follows to the end; a launch of a completed run starts nothing;
- the job's driver SIGKILLed mid-run (an effect committed, the pinned step in flight): once its
  lease expires a ``raysaga worker`` takes the run over and completes it with no effect twice;
- a missing or wrong token is one line naming the fix, and no run is recorded.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from raysaga import RunStatus
from raysaga.state import NodeStatus, SqlStore
from tests.support.crash_driver import process_gone, wait_until
from tests.support.processes import pids_mentioning
from tests.support.services import FakeServices, get_log

pytestmark = pytest.mark.cluster

FLOW = Path(__file__).with_name("launch_flow.py")
BIN = Path(sys.executable).parent
RAY = shutil.which("ray", path=str(BIN)) or shutil.which("ray") or "ray"
RAYSAGA = shutil.which("raysaga", path=str(BIN)) or shutil.which("raysaga") or "raysaga"
#: Variables of this test process that would point a subprocess at the session's cluster or mode.
_SCRUBBED = ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAYSAGA_DB",
             "RAY_API_SERVER_ADDRESS")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    assert port != 6379  # Redis's; never ours
    return port


def _base_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _SCRUBBED}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"  # the job's `python` is this venv's
    env.update(extra)
    return env


@dataclass(frozen=True)
class Cluster:
    gcs: str  # HOST:PORT, for `raysaga run --address` and `resume --address`
    dashboard: str  # http://HOST:PORT, for `raysaga launch --address`
    token_file: Path
    temp_dir: Path

    def client_env(self, **extra: str) -> dict[str, str]:
        """A shell on the 'laptop': the cluster's token in a file, RAY_AUTH_MODE unset."""
        return _base_env(RAY_AUTH_TOKEN_PATH=str(self.token_file), **extra)


def _ray_start(args: list[str], env: dict[str, str]) -> None:
    proc = subprocess.run([RAY, "start", *args, "--disable-usage-stats"], env=env, capture_output=True, text=True,
                          timeout=120, start_new_session=True)
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    base = tmp_path_factory.mktemp("launch-cluster")
    token_file = base / "auth_token"
    token_file.write_text(uuid.uuid4().hex + uuid.uuid4().hex)
    # short paths: Ray's socket paths must fit 107 bytes. The second node has a folder of its own: two
    # nodes sharing one would unpack each job's code into one place, each replacing the other's copy
    temp_dir = Path(tempfile.mkdtemp(prefix="rsl-", dir="/tmp"))
    node_dir = Path(tempfile.mkdtemp(prefix="rsl2-", dir="/tmp"))
    gcs_port, dashboard_port = _free_port(), _free_port()
    common = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token_file)}
    try:
        _ray_start(["--head", f"--port={gcs_port}", f"--dashboard-port={dashboard_port}", "--dashboard-host=127.0.0.1",
                    "--include-dashboard=true", f"--ray-client-server-port={_free_port()}",
                    f"--dashboard-agent-listen-port={_free_port()}", "--num-cpus=1", "--node-ip-address=127.0.0.1",
                    f"--temp-dir={temp_dir}"], _base_env(**common, RAYSAGA_TEST_NODE="head"))
        _ray_start([f"--address=127.0.0.1:{gcs_port}", "--num-cpus=1", '--resources={"special": 1}',
                    f"--dashboard-agent-listen-port={_free_port()}", "--node-ip-address=127.0.0.1",
                    f"--temp-dir={node_dir}"],
                   _base_env(**common, RAYSAGA_TEST_NODE="special"))
        yield Cluster(f"127.0.0.1:{gcs_port}", f"http://127.0.0.1:{dashboard_port}", token_file, temp_dir)
    finally:
        for folder in (temp_dir, node_dir):  # every process of a node names its folder
            for pid in pids_mentioning(str(folder), open_files=True):
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            shutil.rmtree(folder, ignore_errors=True)


def _project(tmp_path: Path) -> Path:
    """A user's project folder holding their workflow module, as launch ships it."""
    project = tmp_path / "project"
    project.mkdir()
    shutil.copy(FLOW, project / "launch_flow.py")
    return project


def _driver_pids(run_id: str) -> list[int]:
    """The job's entrypoint: ``python -m raysaga resume --quiet --lease-ttl S -- RUN`` and the
    shell Ray runs it in (only a Ray Job runs that here; a command line ends in a NUL, read as a space)."""
    return [pid for pid in pids_mentioning(f" -- {run_id} ") if "-m raysaga resume " in _cmdline(pid)]


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _node(store: SqlStore, run_id: str, name: str) -> NodeStatus | None:
    return next((n.status for n in store.nodes(run_id) if n.node_id == name), None)


def _output(command: list[str], env: dict[str, str]) -> str:
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    return done.stdout + done.stderr


def _kill_the_driver_mid_run(store: SqlStore, run_id: str) -> None:
    """Once the charge committed and the pinned step is in flight on the second node, SIGKILL the
    job's driver (the gate file is still closed: the pinned step cannot have finished)."""
    wait_until(lambda: _node(store, run_id, "charge") == NodeStatus.COMPLETED
               and _node(store, run_id, "pinned") == NodeStatus.RUNNING, timeout=90,
               what="the charge to commit and the pinned step to start on the cluster")
    drivers = wait_until(lambda: _driver_pids(run_id), timeout=10, what="the job's driver process")
    for pid in drivers:
        os.kill(pid, signal.SIGKILL)
    wait_until(lambda: all(process_gone(pid) for pid in drivers), timeout=10, what="the killed driver to go")
    assert store.get_run(run_id).status == RunStatus.RUNNING


def test_launch_completes_on_the_cluster_and_a_killed_driver_is_taken_over(
        cluster: Cluster, pg_url: str, tmp_path: Path) -> None:
    project = _project(tmp_path)
    gate = tmp_path / "gate"
    run_id = f"launch-{uuid.uuid4().hex[:8]}"
    env = cluster.client_env(RAYSAGA_LAUNCH_MARK="sent-with---env")
    with FakeServices() as services:
        order = json.dumps({"services_url": services.url, "order_id": "o-1", "gate": str(gate)})
        launch = [RAYSAGA, "launch", "launch_flow:wf", "--input", order, "--address", cluster.dashboard,
                  "--db", pg_url, "--env", "RAYSAGA_LAUNCH_MARK", "--run-id", run_id, "--lease-ttl", "3"]
        started = time.monotonic()
        first = subprocess.run(launch, cwd=project, env=env, capture_output=True, text=True, timeout=60)
        took = time.monotonic() - started
        assert first.returncode == 0, first.stderr
        assert first.stdout.strip() == run_id  # the run id alone on stdout; the launching process has exited
        assert f"launched as Ray job raysaga-{run_id}" in first.stderr
        assert took < 30, f"launch took {took:.1f}s"  # ~2 s on an idle machine; CI machines are shared

        # a retried launch finds the job; it starts no second one
        again = subprocess.run(launch, cwd=project, env=env, capture_output=True, text=True, timeout=60)
        assert again.returncode == 0, again.stderr
        assert f"already launched: Ray job raysaga-{run_id}" in again.stderr

        store = SqlStore(pg_url)
        try:
            _kill_the_driver_mid_run(store, run_id)
            gate.touch()

            # the takeover: a worker of the fleet claims the run once the dead driver's lease expires
            log_file = tmp_path / "worker.log"
            with log_file.open("w") as sink:
                worker = subprocess.Popen(
                    [RAYSAGA, "worker", "--workflow", "launch_flow:wf", "--db", pg_url, "--address", cluster.gcs,
                     "--concurrency", "1", "--poll", "0.2"],
                    cwd=project, env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
            try:
                wait_until(lambda: store.get_run(run_id).status == RunStatus.COMPLETED or worker.poll() is not None,
                           timeout=90, what="a worker to take the run over and complete it")
            finally:
                worker.send_signal(signal.SIGTERM)  # hands its runs back and exits
                try:
                    worker.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(worker.pid, signal.SIGKILL)
                    worker.wait()
            assert store.get_run(run_id).status == RunStatus.COMPLETED, log_file.read_text()[-3000:]
            claims = [e for e in store.events(run_id) if e.kind == "lease_claimed"]
            assert len(claims) == 2  # the job's driver, then the worker

            record = store.get_run(run_id)
            assert record.status == RunStatus.COMPLETED, record.status_reason
            assert isinstance(record.output, dict)
            output = record.output["done"]
            assert output["greet"] == {"mark": "sent-with---env", "node": output["greet"]["node"]}
            assert output["pinned_on"] == "special"  # resources={"special": 1}: on the second node
        finally:
            store.close()
        log = get_log(services.url)
        assert dict(log["by_subject"]) == {"charge:o-1": 1, "email:o-1": 1}  # each effect once
        assert all(count == 1 for count in log["effective"].values())

    # `raysaga status` from a third process sees it
    shown = subprocess.run([RAYSAGA, "status", run_id, "--db", pg_url], env=_base_env(), capture_output=True,
                           text=True, timeout=60)
    assert shown.returncode == 0 and "completed" in shown.stdout.splitlines()[0], shown.stdout + shown.stderr


def test_launching_again_takes_over_a_run_whose_job_died(cluster: Cluster, pg_url: str, tmp_path: Path) -> None:
    project = _project(tmp_path)
    gate = tmp_path / "gate"
    run_id = f"relaunch-{uuid.uuid4().hex[:8]}"
    env = cluster.client_env(RAYSAGA_LAUNCH_MARK="x")
    with FakeServices() as services:
        order = json.dumps({"services_url": services.url, "order_id": "o-2", "gate": str(gate)})
        launch = [RAYSAGA, "launch", "launch_flow:wf", "--input", order, "--address", cluster.dashboard,
                  "--db", pg_url, "--env", "RAYSAGA_LAUNCH_MARK", "--run-id", run_id, "--lease-ttl", "3"]
        first = subprocess.run(launch, cwd=project, env=env, capture_output=True, text=True, timeout=60)
        assert first.returncode == 0, first.stderr
        store = SqlStore(pg_url)
        try:
            _kill_the_driver_mid_run(store, run_id)
            gate.touch()
            job_status = [RAY, "job", "status", f"raysaga-{run_id}", "--address", cluster.dashboard]
            token_env = {**env, "RAY_AUTH_MODE": "token"}
            wait_until(lambda: f"Job 'raysaga-{run_id}' failed" in _output(job_status, token_env),
                       timeout=30, interval=0.5, what="Ray to see the job's driver gone")
            # the dead driver ran on this host, so its lease is provably gone: a new launch takes over at
            # once; --wait follows it until the run rests
            second = subprocess.run([*launch, "--wait"], cwd=project, env=env, capture_output=True, text=True,
                                    timeout=120)
            assert second.returncode == 0, second.stderr
            assert f"launched as Ray job raysaga-{run_id}-2" in second.stderr
            lines = second.stdout.splitlines()
            assert lines[0] == run_id and lines[1].startswith(f"run {run_id} (cluster-launch v1): completed")
            assert store.get_run(run_id).status == RunStatus.COMPLETED
        finally:
            store.close()
        log = get_log(services.url)
        assert dict(log["by_subject"]) == {"charge:o-2": 1, "email:o-2": 1}  # each effect once

    at_rest = subprocess.run(launch, cwd=project, env=env, capture_output=True, text=True, timeout=60)
    assert at_rest.returncode == 0 and at_rest.stdout.strip() == run_id
    assert at_rest.stderr.strip() == f"run {run_id} is already completed: nothing to launch"


def test_run_address_finds_the_clusters_token_and_refuses_without_one(cluster: Cluster, tmp_path: Path) -> None:
    project = _project(tmp_path)
    db = f"sqlite:///{tmp_path / 'raysaga.db'}"
    run = [RAYSAGA, "run", "launch_flow:hello", "--address", cluster.gcs, "--db", db, "--json"]
    env = cluster.client_env(RAYSAGA_LAUNCH_MARK="forwarded", RAYSAGA_ENV="RAYSAGA_LAUNCH_MARK")
    done = subprocess.run(run, cwd=project, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["output"] == {"where": "special", "mark": "forwarded"}

    empty_home = tmp_path / "home"  # no ~/.ray/auth_token, no token variables
    empty_home.mkdir()
    fresh = f"sqlite:///{tmp_path / 'fresh.db'}"
    started = time.monotonic()
    refused = subprocess.run([RAYSAGA, "run", "launch_flow:hello", "--address", cluster.gcs, "--db", fresh],
                             cwd=project, env=_base_env(HOME=str(empty_home)), capture_output=True, text=True,
                             timeout=120)
    assert time.monotonic() - started < 30  # no reconnect loop (it took 20 s and more, and printed a line a second)
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines() == [
        f"error: the Ray cluster at {cluster.gcs} requires token authentication and no token was found here: put "
        "the cluster's token in ~/.ray/auth_token, RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH (`ray get-auth-token` on "
        "the head node prints it)"]
    assert not (tmp_path / "fresh.db").exists() or _runs(fresh) == 0


def test_launch_with_a_wrong_token_is_one_line_and_records_nothing(
        cluster: Cluster, pg_url: str, tmp_path: Path) -> None:
    project = _project(tmp_path)
    before = _runs(pg_url)
    wrong = subprocess.run([RAYSAGA, "launch", "launch_flow:hello", "--address", cluster.dashboard, "--db", pg_url],
                           cwd=project, env=_base_env(RAY_AUTH_TOKEN="not-the-token"), capture_output=True, text=True,
                           timeout=60)
    assert wrong.returncode == 2
    assert wrong.stderr.strip().splitlines() == [
        f"error: the Ray cluster at {cluster.dashboard} refused the token from RAY_AUTH_TOKEN: use that cluster's "
        "token (`ray get-auth-token` on the head node prints it) in ~/.ray/auth_token, RAY_AUTH_TOKEN or "
        "RAY_AUTH_TOKEN_PATH"]
    assert _runs(pg_url) == before


def _runs(url: str) -> int:
    store = SqlStore(url)
    try:
        return len(store.list_runs(limit=1000))
    finally:
        store.close()
