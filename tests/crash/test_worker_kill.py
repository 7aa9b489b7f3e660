"""Invariant 2 when a Ray worker dies mid-effect: the retry carries the same idempotency key.

The ``workerkill`` flow's effect calls the fake provider (the charge takes effect), then, on
its first attempt only, writes its worker's pid and hangs. The test SIGKILLs that worker: the
driver must see the task fail, classify the crash transient, retry the node under the same
key, and finish with exactly one effective charge (the provider saw the key twice).
"""

from __future__ import annotations

import os
import signal
import uuid
from pathlib import Path

import pytest

from raysaga.state import EffectStatus, NodeStatus, SqlStore
from tests.support import crash_driver as harness
from tests.support.services import FakeServices, response_id

pytestmark = pytest.mark.ray

flows = harness.load_flows()


def test_killed_worker_is_retried_with_the_same_key(ray_address: str, sqlite_url: str, tmp_path: Path) -> None:
    control = tmp_path / "control"
    control.mkdir()
    run_id = f"wk-{uuid.uuid4().hex[:8]}"
    pid_file = control / "worker.pid"
    with FakeServices() as services:
        proc = harness.spawn("workerkill", sqlite_url, run_id, executor="ray", lease_ttl=5.0,
                             run_input=flows.sample_input("workerkill", services.url, str(control)))
        try:
            harness.wait_until(lambda: pid_file.exists() or proc.poll() is not None, timeout=180,
                               what="the effect's Ray worker to report its pid")
            assert proc.poll() is None, harness.finish(proc).describe()
            pid_text, key = pid_file.read_text().split()
            worker_pid = int(pid_text)
            assert worker_pid != proc.pid, "the step should run in a Ray worker, not in the driver"
            assert services.log()["raw"] == {key: 1}, "the charge should have taken effect before the kill"

            os.kill(worker_pid, signal.SIGKILL)
            done = harness.finish(proc, timeout=180)
        finally:
            (control / "release").touch()  # never leave a worker hanging, whatever happened
            harness.stop(proc)
        log = services.log()

    assert done.returncode == 0, done.describe()
    assert done.result is not None and done.result["status"] == "completed"
    charge_id = response_id("charge", key)
    assert done.result["output"] == {"wk_finish": f"done:{charge_id}"}
    # the provider: the same key twice (attempt 1 died after its call; attempt 2 re-issued it),
    # one effective charge, and no other key
    assert log["raw"] == {key: 2}
    assert log["effective"] == {key: 1}
    assert log["by_subject"] == {"charge:wk-1": 1}

    store = SqlStore(sqlite_url)
    try:
        retries = [e for e in store.events(run_id) if e.kind == "retry_scheduled"]
        nodes = {n.label: n for n in store.nodes(run_id)}
        effects = store.effects(run_id)
    finally:
        store.close()
    # the driver saw the worker's death, as a transient failure of attempt 1
    assert [(e.node_id, e.data["attempt"]) for e in retries] == [("wk_charge", 1)]
    error = retries[0].data["error"]
    assert error["transient"] is True and error["type"] in ("WorkerCrashedError", "NodeDiedError"), error
    assert nodes["wk_charge"].status == NodeStatus.COMPLETED and nodes["wk_charge"].attempt == 2
    assert [(e.idempotency_key, e.status) for e in effects] == [(key, EffectStatus.COMMITTED)]
