"""Per-step resource requests on the session's Ray cluster.

- a request no node can ever hold (``num_gpus=1`` on a cluster without GPUs) fails its node
  permanently with ``InfeasibleResourcesError`` naming the step, the request and the nodes,
  instead of waiting in Ray's queue forever;
- ``resources={"special": 1}`` runs the step on the node that offers it: a second node, started
  here with ``ray start --address ... --resources '{"special": 1, ...}'`` and zero CPUs (so nothing
  else lands on it), then killed by its process group.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import pytest

import raysaga
from raysaga import RetryPolicy, RunStatus, Workflow
from raysaga.state import NodeStatus, SqlStore
from tests.support import crash_driver as harness
from tests.support.processes import first_pid_mentioning, ray_nodes

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module", autouse=True)
def _pickle_this_module_by_value() -> None:
    cloudpickle = pytest.importorskip("ray.cloudpickle")
    cloudpickle.register_pickle_by_value(sys.modules[__name__])


def test_a_request_no_node_can_hold_fails_the_step_clearly(ray_session: str, sqlite_url: str) -> None:
    import ray

    resources = cast(dict[str, float], ray.cluster_resources())  # type: ignore[no-untyped-call]
    assert not resources.get("GPU")  # the session's cluster has no GPU
    wf = Workflow("needs-gpu")

    @wf.step()
    def prepare() -> int:
        return 1

    @wf.step(num_gpus=1, retry=RetryPolicy(max_attempts=3))
    def train(prepare: int) -> int:
        return prepare

    record = raysaga.run(wf, None, store=sqlite_url, executor="ray", address=ray_session)
    assert record.status == RunStatus.FAILED
    store = SqlStore(sqlite_url)
    try:
        node = {n.label: n for n in store.nodes(record.run_id)}["train"]
    finally:
        store.close()
    assert (node.status, node.attempt) == (NodeStatus.FAILED, 1)  # permanent: not retried
    assert node.error is not None
    assert node.error["type"] == "InfeasibleResourcesError" and node.error["transient"] is False
    message = node.error["message"]
    assert "step 'train' asks for num_gpus=1" in message and "no node of the Ray cluster can ever hold" in message
    assert "{CPU: 2, GPU: 0}" in message  # what the cluster has
    assert "'train'" in (record.status_reason or "")


@pytest.fixture
def special_node(ray_address: str, tmp_path: Path) -> Iterator[str]:
    """A second Ray node offering ``special: 1`` (and a marker resource naming it), zero CPUs."""
    ray_bin = shutil.which("ray", path=str(Path(sys.executable).parent)) or shutil.which("ray")
    assert ray_bin
    marker = f"raysaga_test_{uuid.uuid4().hex[:10]}"
    proc = subprocess.run(
        [ray_bin, "start", f"--address={ray_address}", "--num-cpus=0", "--node-ip-address=127.0.0.1",
         f"--resources={json.dumps({'special': 1, marker: 1})}", "--disable-usage-stats"],
        capture_output=True, text=True, timeout=120, start_new_session=True)
    pgid = None
    try:
        assert proc.returncode == 0, proc.stderr[-2000:]
        raylet = harness.wait_until(lambda: first_pid_mentioning(marker), timeout=30, what="the second node's raylet")
        pgid = os.getpgid(raylet)
        node_id: str = harness.wait_until(
            lambda: next((n["NodeID"] for n in ray_nodes() if n["Alive"] and marker in n["Resources"]), None),
            timeout=60, what="the second node to join the cluster")
        yield node_id
    finally:
        if pgid is not None and pgid != os.getpgid(0):
            # SIGTERM: the raylet leaves the cluster cleanly (the GCS marks the node dead at once, so
            # no later task is sent to it); then whatever `ray start` started for it is killed
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGTERM)
            harness.wait_until(lambda: not any(n["Alive"] and marker in n["Resources"] for n in ray_nodes()),
                               timeout=60, what="the second node to leave the cluster")
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)




def test_a_custom_resource_runs_the_step_on_the_node_offering_it(
        ray_session: str, special_node: str, sqlite_url: str) -> None:
    wf = Workflow("special")

    @wf.step()
    def anywhere() -> str:
        import ray

        return str(ray.get_runtime_context().get_node_id())

    @wf.step(num_cpus=0, resources={"special": 1})
    def there(anywhere: str) -> str:
        import ray

        return str(ray.get_runtime_context().get_node_id())

    record = raysaga.run(wf, None, store=sqlite_url, executor="ray", address=ray_session)
    assert record.status == RunStatus.COMPLETED, record.status_reason
    store = SqlStore(sqlite_url)
    try:
        outputs = {n.label: n.output for n in store.nodes(record.run_id)}
    finally:
        store.close()
    assert outputs["there"] == special_node
    assert outputs["anywhere"] != special_node  # a plain step needs a CPU: the special node has none

    # without num_cpus=0 the step also asks for Ray's default of one CPU, which that node lacks
    wf2 = Workflow("special-cpu")

    @wf2.step(resources={"special": 1})
    def there_too() -> str:
        return "never"

    record = raysaga.run(wf2, None, store=sqlite_url, executor="ray", address=ray_session)
    assert record.status == RunStatus.FAILED
    assert "asks for CPU=1 (Ray's default: set num_cpus=0 to ask for none), special=1" in (record.status_reason or "")
