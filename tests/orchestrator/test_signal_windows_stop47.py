"""Stop 47: operator signals that fell between a driver's last look and what it did next.

- A cancel sent after the driver's last look for signals and before its commit that lets the run
  rest was never carried out: the rest was made due at once only for a newer *decision*, so the
  run rested ``waiting_human``, not due, its cancel unread, until someone decided the approval (and
  then it was cancelled, the decision lost) or for ever.
- A cancel (or pause) that arrived as the run ended (the driver never reached its next boundary)
  stayed unconsumed: ``raysaga retry`` reopened the run and its driver obeyed the stale cancel at
  once, cancelling the retry the operator had just asked for.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import raysaga
from raysaga import Approval, Client, RunRecord, RunStatus, Workflow
from raysaga.state import SqlStore
from raysaga.state.models import Batch, Lease

OPTIONS = raysaga.RunOptions(lease_ttl=5.0)


def _approval_flow(name: str, calls: list[str]) -> Workflow:
    wf = Workflow(name, version="1")

    @wf.step()
    def a(input: dict[str, Any]) -> int:
        calls.append("a")
        return 1

    @wf.approval(after=["a"])
    def review(a: int) -> str:
        return "go on?"

    @wf.step(after=["review"])
    def after(review: Approval) -> str:
        calls.append("after")
        return "done"

    return wf


class CancelsBeforeRest(SqlStore):
    """A driver's store: right before the commit that lets the run rest (after the driver's last
    look for signals), an operator cancels the run through another connection."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.cancelled: RunRecord | None = None

    def commit(self, lease: Lease, batch: Batch) -> RunRecord | None:
        run = batch.run
        if self.cancelled is None and run is not None and run.status == RunStatus.WAITING_HUMAN:
            operator = SqlStore(self.url)
            try:
                self.cancelled = Client(operator).cancel(lease.run_id, reason="no longer wanted")
            finally:
                operator.close()
        return super().commit(lease, batch)


def test_a_cancel_sent_as_the_driver_lets_the_run_rest_is_carried_out(store_url: str) -> None:
    calls: list[str] = []
    flow = _approval_flow("cancel_before_rest", calls)
    driver_store = CancelsBeforeRest(store_url)
    try:
        first = raysaga.run(flow, {}, store=driver_store, run_id="r1", executor="inline", options=OPTIONS)
    finally:
        driver_store.close()
    assert driver_store.cancelled is not None, "the cancel was not sent before the rest"
    assert driver_store.cancelled.status == RunStatus.RUNNING, driver_store.cancelled  # a live driver: queued
    assert first.status == RunStatus.WAITING_HUMAN, first
    store = SqlStore(store_url)
    try:
        # the rest is due at once: a worker takes the run up and obeys the cancel
        assert store.get_run("r1").wake_at is not None
        claim = store.claim_next("a-worker", 5.0, {flow.name: flow.definition_hash})
        assert claim is not None, (f"the run rests {store.get_run('r1').status_reason!r}, its cancel "
                                   f"unread ({store.pending_signals('r1')}), and no worker will take it up")
        store.release(claim.lease)
        final = raysaga.resume(flow, "r1", store=store, executor="inline", options=OPTIONS)
        assert final.status == RunStatus.CANCELLED, final
        assert calls == ["a"], calls
    finally:
        store.close()


def test_a_retry_is_not_cancelled_by_a_cancel_that_came_as_the_run_ended(tmp_path: Path) -> None:
    calls: list[str] = []
    flow = Workflow("stale_cancel", version="1")
    failing = {"on": True}

    @flow.step()
    def a(input: dict[str, Any]) -> int:
        calls.append("a")
        if failing["on"]:
            raise ValueError("not yet")
        return 1

    @flow.step(after=["a"])
    def b(a: int) -> int:
        calls.append("b")
        return a + 1

    store = SqlStore(f"sqlite:///{tmp_path / 'run.db'}")
    try:
        failed = raysaga.run(flow, {}, store=store, run_id="r1", executor="inline", options=OPTIONS)
        assert failed.status == RunStatus.FAILED, failed
        # the operator's cancel reached the store as the driver ended the run: never read by a driver
        store.send_signal("r1", "cancel", payload={"reason": "stop it", "by": "ops"})
        store.send_signal("r1", "pause", payload={"reason": "hold on", "by": "ops"})
        failing["on"] = False
        final = raysaga.retry(flow, "r1", store=store, executor="inline", options=OPTIONS)
        assert final.status == RunStatus.COMPLETED, final
        assert calls == ["a", "a", "b"], calls
        assert store.pending_signals("r1") == [], store.pending_signals("r1")
    finally:
        store.close()


def test_an_unpause_of_an_ended_run_does_not_promise_a_pause(tmp_path: Path) -> None:
    """A pause beside a cancel that won stayed queued; ``unpause`` of the cancelled run said "its
    pause is still on its way to the driver: unpause once it is paused", which never comes."""
    from raysaga.errors import UserError

    calls: list[str] = []
    flow = _approval_flow("unpause_ended", calls)
    store = SqlStore(f"sqlite:///{tmp_path / 'run.db'}")
    try:
        assert raysaga.run(flow, {}, store=store, run_id="r1", executor="inline",
                           options=OPTIONS).status == RunStatus.WAITING_HUMAN
        client = Client(store)
        client.cancel("r1", reason="done with it")
        store.send_signal("r1", "pause", payload={"reason": "late", "by": "ops"})  # came as it ended
        try:
            client.unpause("r1")
        except UserError as exc:
            assert "cancelled, not paused" in str(exc) and "on its way" not in str(exc), str(exc)
        else:
            raise AssertionError("an unpause of a cancelled run was taken")
    finally:
        store.close()
