"""Operators' signals through ``raysaga.Client``, on runs with and without a live driver.

- A run waiting for a human (no driver) is paused at once; a decision while it is paused is
  recorded but wakes nothing; unpause lets a worker take it up and complete it.
- A live driver (a worker driving a slow step) obeys a pause at its next step boundary: the run
  rests ``paused`` with no lease; unpause hands it to the worker again.
- Cancel with compensation of a waiting run (no driver): a worker rolls it back.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from raysaga import Client, RunOptions, RunRecord
from raysaga.errors import UserError
from raysaga.state import NodeStatus, RunStatus
from tests.support import fleet_flows as flows
from tests.support.crash_driver import wait_until
from tests.support.services import FakeServices, get_log
from tests.support.worker_procs import fleet_input, start_worker, stop


@pytest.fixture
def services() -> Iterator[FakeServices]:
    with FakeServices() as svc:
        yield svc


def test_pause_and_unpause_a_waiting_run(sqlite_url: str, services: FakeServices, tmp_path: Path) -> None:
    with Client(sqlite_url) as client:
        import raysaga

        rested = raysaga.run(flows.approval, fleet_input(1, services, tmp_path / "t"), store=sqlite_url,
                             executor="inline")
        assert rested.status == RunStatus.WAITING_HUMAN
        paused = client.pause(rested.run_id, by="ops")
        assert paused.status == RunStatus.PAUSED  # no driver: at once
        assert client.pause(rested.run_id).status == RunStatus.PAUSED  # again: nothing changes
        client.approve(rested.run_id, "review", by="alice")
        assert client.get_run(rested.run_id).wake_at is None  # paused: the decision wakes nothing
        worker = start_worker(sqlite_url, "approval")
        try:
            client.unpause(rested.run_id, by="ops")
            wait_until(lambda: client.get_run(rested.run_id).status == RunStatus.COMPLETED, timeout=60,
                       what="the worker to complete the unpaused run")
        finally:
            code, _, err = stop(worker)
        assert code == 0, err
        with pytest.raises(UserError, match="is completed, not paused"):
            client.unpause(rested.run_id)
        kinds = [e.kind for e in client.store.events(rested.run_id)]
        assert "run_paused" in kinds and "unpause_requested" in kinds
    assert get_log(services.url)["by_subject"] == {"charge:pay-1": 1}


@pytest.mark.ray
def test_a_live_driver_obeys_pause(sqlite_url: str, services: FakeServices, tmp_path: Path,
                                   ray_address: str) -> None:
    """On Ray the driver's loop keeps turning while a step runs: it sees the pause within a
    heartbeat, cancels the step in flight (releasing its CPU) and rests paused with no lease."""
    trace = tmp_path / "trace.log"
    with Client(sqlite_url) as client:
        run = client.submit(flows.slow, fleet_input(2, services, trace))
        worker = start_worker(sqlite_url, "slow", executor="ray", lease_ttl=60.0)
        try:
            wait_until(lambda: trace.exists() and "start" in trace.read_text(), timeout=90,
                       what="the slow step to start")
            client.pause(run.run_id, by="ops")  # a live driver: a signal
            def paused_and_free() -> RunRecord | None:
                r = client.get_run(run.run_id)
                return r if r.status == RunStatus.PAUSED and r.lease_owner is None else None

            paused = wait_until(paused_and_free, timeout=60, what="the driver to pause the run and release it")
            assert "paused by ops" in (paused.status_reason or "")
            (tmp_path / "release").write_text("go")
            client.unpause(run.run_id)
            wait_until(lambda: client.get_run(run.run_id).status == RunStatus.COMPLETED, timeout=90,
                       what="the worker to finish the unpaused run")
        finally:
            code, _, err = stop(worker)
        assert code == 0, err
        starts = [line.split()[2] for line in trace.read_text().splitlines() if line.startswith("start")]
        assert starts == ["wait", "wait", "after"]  # the cancelled attempt ran again; nothing after it twice
    assert get_log(services.url)["by_subject"] == {"charge:slow-2": 1}


def test_cancel_with_compensation_of_a_waiting_run(sqlite_url: str, services: FakeServices, tmp_path: Path) -> None:
    import raysaga

    with Client(sqlite_url) as client:
        rested = raysaga.run(flows.approval, fleet_input(3, services, tmp_path / "t"), store=sqlite_url,
                             executor="inline", options=RunOptions())
        assert rested.status == RunStatus.WAITING_HUMAN
        client.cancel(rested.run_id, compensate=True, by="ops")
        assert client.get_run(rested.run_id).wake_at is not None  # a worker takes it up now
        worker = start_worker(sqlite_url, "approval")
        try:
            def ended_run() -> RunRecord | None:
                r = client.get_run(rested.run_id)
                return r if r.status in (RunStatus.COMPENSATED, RunStatus.CANCELLED, RunStatus.FAILED) else None

            ended = wait_until(ended_run, timeout=60, what="the worker to roll the cancelled run back")
        finally:
            code, _, err = stop(worker)
        assert code == 0, err
        assert ended.status in (RunStatus.COMPENSATED, RunStatus.CANCELLED)
        assert "cancelled by ops" in (ended.status_reason or "")
        assert client.inbox() == []
        review = next(n for n in client.store.nodes(rested.run_id) if n.node_id == "review")
        assert review.status == NodeStatus.CANCELLED  # the wait is closed with the run


def test_retry_of_a_failed_run_through_a_worker(sqlite_url: str, services: FakeServices, tmp_path: Path) -> None:
    """An operator fixes what failed and retries from any process (the dashboard's button): the run
    is runnable again with the same keys and a worker drives it; what completed is not re-run."""
    import raysaga

    (tmp_path / "broken").write_text("yes")
    with Client(sqlite_url) as client:
        failed = raysaga.run(flows.fragile, fleet_input(4, services, tmp_path / "t"), store=sqlite_url,
                             executor="inline")
        assert failed.status == RunStatus.FAILED
        (tmp_path / "broken").unlink()
        retried = client.retry(failed.run_id, by="ops")
        assert retried.status == RunStatus.RUNNING and retried.lease_owner is None
        with pytest.raises(UserError, match="only a failed run can be retried"):
            client.retry(failed.run_id)
        worker = start_worker(sqlite_url, "fragile")
        try:
            wait_until(lambda: client.get_run(failed.run_id).status == RunStatus.COMPLETED, timeout=60,
                       what="the worker to complete the retried run")
        finally:
            code, _, err = stop(worker)
        assert code == 0, err
        assert any(e.kind == "retry_requested" and e.data["by"] == "ops" for e in client.store.events(failed.run_id))
    assert get_log(services.url)["by_subject"] == {"charge:fragile-4": 1}
