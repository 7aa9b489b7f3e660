"""Review stop 43 (cluster and launch): a request whose only node left, launch checks, messages.

A long-lived driver (a worker, a launched job) kept "feasible" for a resource request for the
process's life: once the only node offering it left, new attempts and the retry of one that ran
there waited in Ray's queue for ever, the run ``running`` with nothing to show.
"""

from __future__ import annotations

import http.server
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import raysaga
from raysaga import RetryPolicy, RunOptions, RunStatus, Workflow
from raysaga.errors import UserError
from raysaga.orchestrator.launch import connect, env_vars
from raysaga.orchestrator.ray_address import host_port, speaks_http, unreachable
from raysaga.orchestrator.resources import Feasibility, resource_request
from raysaga.state import NodeStatus, SqlStore

BIN = Path(sys.executable).parent
RAYSAGA = shutil.which("raysaga", path=str(BIN)) or shutil.which("raysaga") or "raysaga"
FLOW = Path(__file__).with_name("launch_flow.py")


@pytest.fixture(scope="module", autouse=True)
def _pickle_this_module_by_value() -> None:
    cloudpickle = pytest.importorskip("ray.cloudpickle")
    cloudpickle.register_pickle_by_value(sys.modules[__name__])


class _Nodes:
    """``ray.nodes()`` of a cluster whose nodes the test changes."""

    def __init__(self, nodes: list[dict[str, Any]]) -> None:
        self.listed = nodes
        self.reads = 0

    def nodes(self) -> list[dict[str, Any]]:
        self.reads += 1
        return [dict(n) for n in self.listed]


def test_a_long_lived_feasibility_sees_the_only_node_offering_a_resource_leave(
        monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]
    monkeypatch.setattr("raysaga.orchestrator.resources.time.monotonic", lambda: now[0])
    special = {"Alive": True, "Resources": {"CPU": 1.0, "special": 1.0}}
    ray = _Nodes([{"Alive": True, "Resources": {"CPU": 2.0}}, special])
    feasible = Feasibility(ray)
    request = resource_request("uses_special", resources={"special": 1})
    assert request is not None
    assert feasible.problem("uses_special", request) is None
    for _ in range(1000):  # a wide fan-out's submits within REFRESH_S: one read of the nodes
        assert feasible.problem("uses_special", request) is None
    assert ray.reads == 1
    special["Alive"] = False  # the node left
    now[0] += Feasibility.REFRESH_S + 0.1
    # a restart under its supervisor (the docs' advice) brings it back: its runs wait for a while
    assert feasible.problem("uses_special", request) is None
    now[0] += Feasibility.LEFT_GRACE_S + 0.1
    problem = feasible.problem("uses_special", request)
    assert problem is not None and "step 'uses_special' asks for" in problem and "special=1" in problem
    assert "left the cluster and did not come back" in problem
    special["Alive"] = True  # it came back
    now[0] += Feasibility.REFRESH_S + 0.1
    assert feasible.problem("uses_special", request) is None
    special["Alive"] = False  # it left again: a fresh grace, not the one spent before
    now[0] += Feasibility.REFRESH_S + 0.1
    assert feasible.problem("uses_special", request) is None
    special["Alive"] = True  # back, and up longer than a grace with nobody asking about it
    now[0] += Feasibility.REFRESH_S + 0.1
    other = resource_request("other", num_cpus=1)
    assert other is not None
    feasible.problem("other", other)  # (some other step's ask reads the nodes)
    now[0] += Feasibility.LEFT_GRACE_S + 1
    special["Alive"] = False  # its next departure: a grace of its own (it was refused at once, "did not come back")
    now[0] += Feasibility.REFRESH_S + 0.1
    assert feasible.problem("uses_special", request) is None


def test_a_request_no_node_ever_offered_is_refused_at_once() -> None:
    """The grace is for a node that left: a GPU on a cluster that never had one is refused at once."""
    ray = _Nodes([{"Alive": True, "Resources": {"CPU": 2.0}}, {"Alive": False, "Resources": {"CPU": 1.0}}])
    request = resource_request("trains", num_gpus=1)
    assert request is not None
    problem = Feasibility(ray).problem("trains", request)
    assert problem is not None and "num_gpus=1" in problem and "did not come back" not in problem


def test_an_infeasible_memory_request_is_shown_in_gib_not_bytes() -> None:
    ray = _Nodes([{"Alive": True, "Resources": {"CPU": 2.0, "memory": 8.0 * 1024**3}}])
    request = resource_request("big", memory=10 * 1024**4)
    assert request is not None
    problem = Feasibility(ray).problem("big", request)
    assert problem is not None
    assert "memory=10 TiB" in problem and "memory: 8 GiB" in problem and "e+" not in problem


@pytest.mark.ray
def test_an_attempt_waiting_for_a_node_that_left_fails_clearly_instead_of_for_ever(
        ray_session: str, sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The executor read the nodes while one offering ``special`` was up (simulated: the first
    read lists it), so the attempt went to Ray; the node is gone, so Ray queues it for ever. The
    watch reads the nodes again, cancels it (transient: it might have started there), and the
    retry is refused at submit, permanently, naming the step."""
    monkeypatch.setattr(Feasibility, "REFRESH_S", 0.3)
    real_read = Feasibility._read
    reads = [0]

    def read_with_a_node_that_left(self: Feasibility) -> None:
        real_read(self)
        reads[0] += 1
        if reads[0] == 1:  # what the executor saw before the node left
            assert self._nodes is not None
            self._nodes.append({"CPU": 1.0, "special": 1.0})

    monkeypatch.setattr(Feasibility, "_read", read_with_a_node_that_left)
    wf = Workflow("node-left")

    @wf.step(resources={"special": 1}, retry=RetryPolicy(max_attempts=3, base=0.01))
    def uses_special() -> int:
        return 1

    started = time.monotonic()
    # a deadline, so the code before the fix (queued for ever) fails here instead of hanging
    record = raysaga.run(wf, None, store=sqlite_url, executor="ray", address=ray_session,
                         options=RunOptions(deadline=60))
    assert record.status == RunStatus.FAILED, (record.status, record.status_reason)
    assert time.monotonic() - started < 60
    store = SqlStore(sqlite_url)
    try:
        node = {n.label: n for n in store.nodes(record.run_id)}["uses_special"]
    finally:
        store.close()
    assert node.status == NodeStatus.FAILED and node.attempt == 2  # the cancelled one, then the refused retry
    assert node.error is not None and node.error["type"] == "InfeasibleResourcesError"
    assert node.error["transient"] is False
    assert "step 'uses_special' asks for" in node.error["message"]


def test_a_url_given_as_a_cluster_address_says_to_drop_the_scheme() -> None:
    with pytest.raises(UserError) as caught:
        host_port("http://127.0.0.1:6379")
    message = str(caught.value)
    assert "without http://" in message and "127.0.0.1:6379" in message and "raysaga launch" in message


@pytest.fixture
def http_server() -> Iterator[tuple[str, int]]:
    """A local HTTP server standing in for a Ray dashboard."""
    server = http.server.HTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield "127.0.0.1", server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def test_a_dashboard_port_given_as_the_cluster_address_is_named_as_one(http_server: tuple[str, int]) -> None:
    host, port = http_server
    assert speaks_http(host, port) is True
    message = str(unreachable(f"{host}:{port}", "timed out"))
    assert "answers HTTP" in message and "Ray dashboard" in message and "ray start --head --port" in message
    assert "cannot reach" not in message


@pytest.mark.ray
def test_the_cluster_port_given_to_launch_is_named_as_the_gcs(ray_address: str) -> None:
    host, port = ray_address.rsplit(":", 1)
    assert speaks_http(host, int(port)) is False  # a GCS takes the connection, answers no HTTP/1
    with pytest.raises(UserError) as caught:
        connect(f"http://{ray_address}")
    message = str(caught.value)
    assert "does not answer HTTP" in message and "GCS port" in message and "http://HEAD:8265" in message
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    free = closed.getsockname()[1]
    closed.close()
    assert speaks_http("127.0.0.1", free) is None  # nothing listens: "cannot reach" stays
    assert "cannot reach" in str(unreachable(f"127.0.0.1:{free}", "refused"))


def test_launch_checks_raysaga_variables_passed_with_env_before_submitting(tmp_path: Path) -> None:
    """RAYSAGA_IO_CONCURRENCY=0 sent with --env failed the job before it drove the run, after
    `launch` had said "launched" (the run then sat `pending`): refused here, nothing recorded."""
    project = tmp_path / "project"
    project.mkdir()
    shutil.copy(FLOW, project / "launch_flow.py")
    store_url = f"sqlite:///{tmp_path / 'store.db'}"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])  # nobody listens: the check must come before the cluster
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "RAYSAGA_"))}
    env.update(PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}", RAYSAGA_IO_CONCURRENCY="0")
    bad = subprocess.run([RAYSAGA, "launch", "launch_flow:hello", "--address", f"http://127.0.0.1:{port}",
                          "--db", store_url, "--env", "RAYSAGA_IO_CONCURRENCY"],
                         cwd=project, env=env, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2, bad.stderr
    assert "--env RAYSAGA_IO_CONCURRENCY" in bad.stderr and "got 0" in bad.stderr
    assert "cannot reach" not in bad.stderr
    assert not (tmp_path / "store.db").exists() or not _runs(store_url)
    assert env_vars(["RAYSAGA_IO_CONCURRENCY"], {"RAYSAGA_IO_CONCURRENCY": "8"}) == {"RAYSAGA_IO_CONCURRENCY": "8"}


def _runs(url: str) -> int:
    store = SqlStore(url)
    try:
        return len(store.list_runs(limit=1000))
    finally:
        store.close()


def test_a_connect_that_times_out_is_not_taken_for_a_port_that_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    """The second review: a host dropping packets (no answer to the connect) was named "the
    cluster's GCS port" by launch: only a port that took the connection and then kept silent is."""
    from raysaga.orchestrator import ray_address

    def no_answer(*args: Any, **kwargs: Any) -> Any:
        raise TimeoutError("timed out")

    monkeypatch.setattr("raysaga.orchestrator.ray_address.socket.create_connection", no_answer)
    assert ray_address.speaks_http("192.0.2.123", 8265) is None
