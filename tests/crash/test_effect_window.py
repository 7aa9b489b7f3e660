"""An effect fan-out on Ray is issued a window at a time (``machine.effect_window``): an item's
pending ledger row is written when it is issued, so a driver SIGKILLed mid-fan-out leaves at most
the window's items in doubt, not all of them (40 pending rows: a rollback would have refunded 40
charges of which 8 were made, a resume re-sent 40 calls). The resume completes the run with every
charge effective exactly once at the provider."""

from __future__ import annotations

import os
import signal
import uuid
from pathlib import Path

import pytest

from raysaga.orchestrator.executor import RayExecutor
from raysaga.state import EffectStatus, SqlStore
from tests.support import crash_driver as harness
from tests.support import effect_window_flows as flows
from tests.support.services import FakeServices

pytestmark = pytest.mark.ray

COUNT = 40
FLOWS = "tests.support.effect_window_flows"


def test_a_killed_driver_leaves_only_the_window_in_doubt(ray_session: str, sqlite_url: str, tmp_path: Path) -> None:
    import ray

    cpus = int(ray.cluster_resources()["CPU"])  # type: ignore[no-untyped-call]
    window = RayExecutor.LANE_TASKS_PER_CPU * cpus  # (each item holds a CPU: ``cpus`` of them run at once)
    assert window < COUNT
    control = tmp_path / "control"
    control.mkdir()
    run_id = f"ew-{uuid.uuid4().hex[:8]}"
    with FakeServices() as services:
        run_input = flows.sample(services.url, str(control), COUNT)
        proc = harness.spawn("wide", sqlite_url, run_id, executor="ray", flows=FLOWS, run_input=run_input)
        try:
            harness.wait_until(lambda: len(list(control.glob("ran-*"))) >= cpus or proc.poll() is not None,
                               timeout=180, what=f"{cpus} items to run")
            assert proc.poll() is None, harness.finish(proc).describe()
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=60)
        finally:
            harness.stop(proc)
        store = SqlStore(sqlite_url)
        try:
            rows = store.effects(run_id)
        finally:
            store.close()
        assert rows and all(e.status == EffectStatus.PENDING for e in rows)
        assert len(rows) <= window, f"{len(rows)} pending ledger rows for a window of {window}"
        charged = set(services.log()["raw"])
        assert charged <= {e.idempotency_key for e in rows}  # every call made had its row first

        (control / "release").touch()
        resumed = harness.run_driver("wide", sqlite_url, run_id, executor="ray", flows=FLOWS, resume=True,
                                     timeout=180)
        log = services.log()

    assert resumed.returncode == 0, resumed.describe()
    assert resumed.result is not None and resumed.result["output"] == {"total": COUNT}
    assert len(log["effective"]) == COUNT and set(log["effective"].values()) == {1}
    assert set(log["by_subject"].values()) == {1} and len(log["by_subject"]) == COUNT
    store = SqlStore(sqlite_url)
    try:
        assert sorted(e.status.value for e in store.effects(run_id)) == ["committed"] * COUNT
    finally:
        store.close()


def test_items_waiting_out_a_backoff_keep_their_place(ray_session: str, sqlite_url: str, tmp_path: Path) -> None:
    import ray

    import raysaga

    window = RayExecutor.LANE_TASKS_PER_CPU * int(ray.cluster_resources()["CPU"])  # type: ignore[no-untyped-call]
    control = tmp_path / "control"
    control.mkdir()
    db_file = sqlite_url.removeprefix("sqlite:///")
    with FakeServices() as services:
        record = raysaga.run(flows.flaky, {"services_url": services.url, "control_dir": str(control),
                                           "db_file": db_file, "count": COUNT}, store=sqlite_url, executor="ray")
        log = services.log()
    assert record.status.value == "completed", record.error
    assert record.output == {"flaky_total": COUNT}
    seen = [name.split("-")[1:] for name in os.listdir(control) if name.startswith("seen-")]
    assert len(seen) == 2 * COUNT  # every item: a failed first attempt, then its retry
    most = max(int(pending) for _, _, pending in seen)
    # at each start, the pending rows were the window's at most (every item's row before it)
    assert most <= window, f"{most} pending ledger rows when an item started, for a window of {window}"
    assert len(log["effective"]) == COUNT and set(log["effective"].values()) == {1}
