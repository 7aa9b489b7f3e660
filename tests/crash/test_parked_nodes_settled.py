"""A parked run (a crash loop, a damaged blob, drives that keep failing) shows no node ``running``
or ``retrying``: the parking batch settles them ``cancelled`` with why, as a run's end does, and
its ``pending`` ledger rows are ``abandoned`` (docs/guarantees.md: a run that completed, failed,
was cancelled or rolled back shows no node running).

The parking updated the run row alone: a step that killed its inline driver stayed ``running``,
attempt 3, on a run ``failed — crash loop``. Real driver processes (SIGKILLed by their step), a
real SQLite file; the store-level parkings also on PostgreSQL.
"""

from __future__ import annotations

import signal
import uuid
from pathlib import Path

import pytest

import raysaga
from raysaga.errors import BlobIntegrityError
from raysaga.orchestrator import blob_parking, crash_loop, runner
from raysaga.state import Batch, EffectStatus, EffectWrite, Lease, NodeStatus, NodeWrite, RunStatus, RunUpdate, SqlStore
from raysaga.types import COMPENSATE_SUFFIX
from tests.support import crash_driver as harness
from tests.support import silent_flows

FLOWS = "tests.support.silent_flows"
DEATHS = raysaga.RunOptions().max_driver_deaths
UNSETTLED = (NodeStatus.RUNNING, NodeStatus.RETRYING)


def _drive(db: str, run_id: str, log_dir: Path, *, resume: bool) -> harness.Finished:
    return harness.run_driver("silent_killer", db, run_id, flows=FLOWS, run_input={"log_dir": str(log_dir)},
                              resume=resume, any_state_ok=True)


def test_a_crash_loop_parks_its_step_cancelled_and_its_effect_abandoned(tmp_path: Path) -> None:
    db, run_id = f"sqlite:///{tmp_path / 'k.db'}", "killer-1"
    for i in range(DEATHS):
        died = _drive(db, run_id, tmp_path, resume=i > 0)
        assert died.returncode == -signal.SIGKILL, died.describe()
    parked = _drive(db, run_id, tmp_path, resume=True)
    assert parked.result is not None and parked.result["status"] == "failed", parked.describe()
    assert parked.result["error"]["type"] == "CrashLoop"
    assert len(silent_flows.starts(tmp_path)) == DEATHS  # the parking driver ran nothing
    store = SqlStore(db)
    try:
        [row] = store.nodes(run_id)
        assert (row.node_id, row.status, row.attempt) == ("kill_me", NodeStatus.CANCELLED, DEATHS)
        assert row.error is not None and row.error.as_dict()["reason"] == (
            "in flight when the run was parked for a crash loop: its outcome is unknown")
        assert row.finished_at is not None and row.started_at is not None
        [effect] = store.effects(run_id)
        assert effect.status == EffectStatus.ABANDONED
        # ``raysaga retry`` runs the settled step again, under the same key
        runner.reopen(store, run_id)
        assert store.nodes(run_id)[0].status == NodeStatus.PENDING
    finally:
        store.close()
    again = _drive(db, run_id, tmp_path, resume=True)
    assert again.returncode == -signal.SIGKILL, again.describe()
    assert len(silent_flows.starts(tmp_path)) == DEATHS + 1


def _rows(status: RunStatus, store: SqlStore, tmp_path: Path) -> tuple[str, Lease]:
    """A run in ``status`` with a step completed, an effect in flight (its ledger row ``pending``), a
    step waiting out a retry backoff and, mid-rollback, a compensation in flight."""
    run = raysaga.create_run(silent_flows.make_gated(f"park_{uuid.uuid4().hex[:8]}"), {"log_dir": str(tmp_path)},
                             store=store, run_id=f"park-{uuid.uuid4().hex[:8]}")
    lease = store.claim(run.run_id, "d1", 15)
    store.commit(lease, Batch(run=RunUpdate(status=RunStatus.RUNNING), nodes=[
        NodeWrite(node_id="done", status=NodeStatus.COMPLETED, attempt=1, output=1, started_at=1.0, finished_at=2.0),
        NodeWrite(node_id="hold", status=NodeStatus.RUNNING, attempt=2, started_at=3.0),
        NodeWrite(node_id="later", status=NodeStatus.RETRYING, attempt=1, not_before=9e9, started_at=4.0),
    ], effects=[EffectWrite(idempotency_key=f"{run.run_id}-k", node_id="hold", effect_name="hold", args_digest="a",
                            status=EffectStatus.PENDING)]))
    if status == RunStatus.COMPENSATING:
        store.commit(lease, Batch(run=RunUpdate(status=status), nodes=[
            NodeWrite(node_id="done" + COMPENSATE_SUFFIX, status=NodeStatus.RUNNING, attempt=1, started_at=5.0)]))
    return run.run_id, lease


def _check_settled(store: SqlStore, run_id: str, why: str) -> None:
    rows = {n.node_id: n for n in store.nodes(run_id)}
    assert not [n.label for n in rows.values() if n.status in UNSETTLED]
    assert rows["done"].status == NodeStatus.COMPLETED and rows["done"].output == 1
    hold, later = rows["hold"], rows["later"]
    assert (hold.status, hold.attempt, hold.started_at) == (NodeStatus.CANCELLED, 2, 3.0)
    assert hold.error is not None and hold.error.as_dict()["reason"] == (
        f"in flight when the run was parked for {why}: its outcome is unknown")
    assert (later.status, later.attempt) == (NodeStatus.CANCELLED, 1)
    assert later.error is not None and later.error.as_dict()["reason"] == f"not retried: the run was parked for {why}"
    assert [e.status for e in store.effects(run_id)] == [EffectStatus.ABANDONED]


@pytest.mark.parametrize("status", [RunStatus.RUNNING, RunStatus.COMPENSATING])
def test_a_blob_parking_settles_what_was_in_flight(store_url: str, tmp_path: Path, status: RunStatus) -> None:
    store = SqlStore(store_url)
    try:
        run_id, lease = _rows(status, store, tmp_path)
        record = blob_parking.park_on_blob(store, run_id, BlobIntegrityError("sha256:00", "is missing"), "done",
                                           lambda batch: store.commit(lease, batch))
        assert record.status == (RunStatus.COMPENSATION_FAILED if status == RunStatus.COMPENSATING
                                 else RunStatus.FAILED)
        _check_settled(store, run_id, "a missing or altered blob")
        if status == RunStatus.COMPENSATING:
            undo = next(n for n in store.nodes(run_id) if n.node_id == "done" + COMPENSATE_SUFFIX)
            assert undo.status == NodeStatus.CANCELLED
    finally:
        store.close()


def test_a_worker_parking_a_failing_run_settles_what_was_in_flight(store_url: str, tmp_path: Path) -> None:
    """``crash_loop.failing_parking`` (a worker's, for drives that keep failing) takes the rows too."""
    store = SqlStore(store_url)
    try:
        run_id, lease = _rows(RunStatus.RUNNING, store, tmp_path)
        resume_first, batch = crash_loop.failing_parking(RunStatus.RUNNING, 3, "ValueError: bad row", run_id,
                                                         nodes=store.nodes(run_id))
        assert not resume_first
        store.commit(lease, batch)
        assert store.get_run(run_id).status == RunStatus.FAILED
        _check_settled(store, run_id, "drives that kept failing")
    finally:
        store.close()
