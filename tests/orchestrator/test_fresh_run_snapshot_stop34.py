"""A run ``raysaga.run`` creates is driven from the record ``create_claimed`` wrote, without reading
it back (``Driver(created=...)``): that record must be the one a read would give, a resume still
reads the store, and a signal sent between the creation and the driver's start is not lost (the
heartbeat's poll brings it).
"""

from __future__ import annotations

import sys
import time
from typing import Any

import pytest

import raysaga
from raysaga import RunOptions, RunStatus, Workflow
from raysaga.orchestrator.runner import new_run
from raysaga.state import SignalKind, SqlStore

cloudpickle = pytest.importorskip("ray.cloudpickle")

wf = Workflow("fresh_snapshot_stop34")


@wf.step
def double(input: dict[str, Any]) -> int:
    return 2 * len(input)


blocking = Workflow("fresh_snapshot_blocking_stop34")


@blocking.step
def hold(input: str) -> str:
    """Runs until the run is cancelled (its Ray task is cancelled), or 60 s: the workload."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        time.sleep(0.05)
    return "never cancelled"


@pytest.fixture(autouse=True)
def _by_value() -> None:
    cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.mark.parametrize("value", [{"x": 1}, {"big": "y" * 2_000_000}, {"odd": "é\u2028\U0001f600"}],
                         ids=["small", "parked-as-blob", "unicode"])
def test_the_created_record_is_what_a_read_gives(sqlite_url: str, value: dict[str, Any]) -> None:
    store = SqlStore(sqlite_url)
    try:
        options = RunOptions(labels={"team": "a"}, token_budget=10, max_driver_deaths=4)
        record, lease = store.create_claimed(new_run(wf, value, run_id="r1", options=options, workflow_ref=None),
                                             "me", 30.0)
        snap = store.snapshot("r1")
        assert record == snap.run
        assert (snap.nodes, snap.effects, snap.signals) == ([], [], [])
        assert lease.fence == record.fence
    finally:
        store.close()


def test_a_fresh_run_is_not_read_back_and_a_resume_is(sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    reads: list[str] = []
    real = SqlStore.snapshot

    def counted(self: SqlStore, run_id: str) -> Any:
        reads.append(run_id)
        return real(self, run_id)

    monkeypatch.setattr(SqlStore, "snapshot", counted)
    record = raysaga.run(wf, {"a": 1, "b": 2}, store=sqlite_url, executor="inline")
    assert (record.status, record.output) == (RunStatus.COMPLETED, {"double": 4})
    assert reads == []
    again = raysaga.resume(wf, record.run_id, store=sqlite_url, executor="inline")
    assert again.status == RunStatus.COMPLETED  # at rest: returned as it stands
    store = SqlStore(sqlite_url)
    try:  # a pending run (created, never driven) is read by the driver that resumes it
        pending = store.create_run(new_run(wf, {"c": 3}, run_id="later", options=None, workflow_ref=None))
    finally:
        store.close()
    done = raysaga.resume(wf, pending.run_id, store=sqlite_url, executor="inline")
    assert (done.status, done.output) == (RunStatus.COMPLETED, {"double": 2})
    assert reads == ["later"]


def test_a_cancel_sent_before_the_driver_starts_reaches_it(sqlite_url: str, ray_session: str,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The cancel is queued right after the run's row is written, before its driver starts: had
    the driver relied on a read of signals at its start, the run would complete after 60 s."""
    real = SqlStore.create_claimed

    def then_cancel(self: SqlStore, *args: Any, **kwargs: Any) -> Any:
        record, lease = real(self, *args, **kwargs)
        self.send_signal(record.run_id, SignalKind.CANCEL, payload={"reason": "sent before the driver started"})
        return record, lease

    monkeypatch.setattr(SqlStore, "create_claimed", then_cancel)
    record = raysaga.run(blocking, "x", store=sqlite_url, executor="ray", address=ray_session)
    assert record.status == RunStatus.CANCELLED, (record.status, record.status_reason)
