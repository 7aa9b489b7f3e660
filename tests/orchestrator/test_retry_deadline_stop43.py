"""A run's deadline and the operator's retry and decisions (review, stop 43).

A retry keeps the run's deadline: a ``failed`` run past it was retried anyway, failed ``deadline``
again at once, and its sleep was left ``pending`` with 0 attempts, the earlier record (cancelled
by the deadline, 1 attempt) lost. It is refused now before anything is written, naming the
deadline and ``raysaga fork``. A rollback is not forward work: a ``compensation_failed`` run past
its deadline is still retried with ``--compensations`` and ends ``compensated``. A decision on an
approval of a run past its deadline was accepted ("a worker takes the run up now") though the run
could only fail ``deadline``; it is refused as a decision after the approval's own timeout is.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from sqlalchemy import update

import raysaga
from raysaga import Ask, Client, Permanent, RunOptions, StepContext, Workflow
from raysaga.errors import UserError
from raysaga.state import NodeStatus, RunStatus, SqlStore
from raysaga.state.decisions import decide
from raysaga.state.schema import runs
from tests.support.cli import invoke

#: What the refund of ``_saga`` does: refused while ``"down"`` (a permanent failure), else logged.
REFUNDS: dict[str, Any] = {}


def _sleeper() -> Workflow:
    wf = Workflow("stop43_deadline_sleep")

    @wf.step()
    def first() -> int:
        return 1

    wf.sleep("nap", seconds=3600, after=["first"])

    @wf.step(after=["nap"])
    def last() -> int:
        return 2

    return wf


def _saga() -> Workflow:
    wf = Workflow("stop43_deadline_saga")

    def refund(ctx: StepContext, output: int) -> None:
        if REFUNDS.get("down"):
            raise Permanent("refunds are down")
        REFUNDS.setdefault("done", []).append(output)

    @wf.step(compensate=refund)
    def charge() -> int:
        return 40

    wf.sleep("nap", seconds=3600, after=["charge"])

    @wf.step(after=["nap"])
    def ship() -> int:
        return 2

    return wf


def _failed_on_its_deadline(wf: Workflow, url: str, run_id: str) -> raysaga.RunRecord:
    """The run driven until its deadline (0.3 s) stops it: its sleep of an hour is cut short."""
    record = raysaga.run(wf, store=url, run_id=run_id, executor="inline", options=RunOptions(deadline=0.3))
    assert record.deadline_at is not None and time.time() >= record.deadline_at
    return record


def _rows(store: SqlStore, run_id: str) -> list[tuple[str, str, int]]:
    return sorted((n.node_id, n.status.value, n.attempt) for n in store.nodes(run_id))


def test_a_retry_past_the_deadline_is_refused_before_anything_is_written(sqlite_url: str) -> None:
    wf = _sleeper()
    failed = _failed_on_its_deadline(wf, sqlite_url, "late-1")
    assert (failed.status, failed.status_reason) == (RunStatus.FAILED, "deadline")
    store = SqlStore(sqlite_url)
    try:
        before = (_rows(store, "late-1"), len(store.events("late-1")), store.get_run("late-1").version)
        assert ("nap", "cancelled", 1) in before[0]
        with pytest.raises(UserError, match=r"passed its deadline at .* UTC .*ago.*raysaga fork late-1 --from NODE"):
            raysaga.retry(wf, "late-1", store=store, executor="inline")
        with pytest.raises(UserError, match="passed its deadline"):  # the fleet's retry: the same check
            Client(store).retry("late-1", by="op")
        code, _, err = invoke("retry", "late-1", "--db", sqlite_url, "--executor", "inline")
        assert code == 2 and "passed its deadline" in err and "raysaga fork" in err, err
        assert "raysaga cancel late-1 --compensate" in err, err  # the way to undo it, not only to go on
        after = store.get_run("late-1")
        assert (after.status, after.status_reason) == (RunStatus.FAILED, "deadline")
        assert (_rows(store, "late-1"), len(store.events("late-1")), after.version) == before
    finally:
        store.close()


def test_a_rollback_past_the_deadline_is_still_retried_to_its_end(store_url: str) -> None:
    """The deadline stops forward work only (the driver checks it in the forward phase): the run's
    charge is refunded by the retry of its compensations, though the deadline passed long ago."""
    REFUNDS.clear()
    REFUNDS["down"] = True
    wf = _saga()
    parked = _failed_on_its_deadline(wf, store_url, "late-saga")
    assert parked.status == RunStatus.COMPENSATION_FAILED, parked.status_reason
    with pytest.raises(UserError, match="compensation_failed"):  # a forward retry is the wrong verb anyway
        raysaga.retry(wf, "late-saga", store=store_url, executor="inline")
    REFUNDS["down"] = False  # the refund service is back
    done = raysaga.retry(wf, "late-saga", store=store_url, executor="inline", compensations=True)
    assert done.status == RunStatus.COMPENSATED, done.status_reason
    assert REFUNDS["done"] == [40]


def _approval() -> Workflow:
    wf = Workflow("stop43_deadline_approval")

    @wf.step()
    def first() -> int:
        return 1

    @wf.approval()
    def ok(first: int) -> Ask:
        return Ask(prompt="ship it?", payload={"first": first})

    return wf


def test_a_decision_past_the_run_deadline_is_refused_naming_it(store_url: str) -> None:
    wf = _approval()
    rested = raysaga.run(wf, store=store_url, run_id="late-ask", executor="inline",
                         options=RunOptions(deadline=3600, release_after=0))
    assert rested.status == RunStatus.WAITING_HUMAN and rested.deadline_at is not None
    store = SqlStore(store_url)
    try:
        events = len(store.events("late-ask"))
        with pytest.raises(UserError, match=r"run 'late-ask' passed its deadline at .* UTC: a decision on 'ok' "
                                            r"is refused"):
            decide(store.engine, "late-ask", "ok", "approve", by="alice", now=rested.deadline_at + 1)
        assert len(store.events("late-ask")) == events and store.pending_signals("late-ask") == []
        # the deadline passes (moved into the past, as the clock would move it): the CLI refuses too
        with store.engine.begin() as conn:
            conn.execute(update(runs).where(runs.c.run_id == "late-ask").values(deadline_at=time.time() - 5))
        code, out, err = invoke("approve", "late-ask", "ok", "--by", "alice", "--db", store_url)
        assert code == 2 and "passed its deadline" in err and out == "", (out, err)
        assert store.pending_signals("late-ask") == []
        assert store.get_run("late-ask").wake_at != pytest.approx(time.time(), abs=60)  # not woken by it
        resumed = raysaga.resume(wf, "late-ask", store=store, executor="inline")
        assert (resumed.status, resumed.status_reason) == (RunStatus.FAILED, "deadline")
        assert {n.node_id: n.status for n in store.nodes("late-ask")}["ok"] == NodeStatus.CANCELLED
    finally:
        store.close()


def test_the_inbox_leaves_out_an_approval_whose_run_passed_its_deadline(own_store_url: str) -> None:
    """A decision on it is refused, so neither ``inbox`` nor the dashboard offers it (it was listed
    as "times out in 0s" beside approvals an approver could still decide)."""
    wf = _approval()
    for run_id in ("late-inbox", "open-inbox"):
        rested = raysaga.run(wf, store=own_store_url, run_id=run_id, executor="inline",
                             options=RunOptions(deadline=3600, release_after=0))
        assert rested.status == RunStatus.WAITING_HUMAN
    store = SqlStore(own_store_url)
    try:
        assert sorted(w.run_id for w in store.waiting_approvals()) == ["late-inbox", "open-inbox"]
        with store.engine.begin() as conn:
            conn.execute(update(runs).where(runs.c.run_id == "late-inbox").values(deadline_at=time.time() - 5))
        assert [w.run_id for w in store.waiting_approvals()] == ["open-inbox"]
        code, out, err = invoke("inbox", "--db", own_store_url)
        assert code == 0 and "open-inbox ok" in out and "late-inbox" not in out, (out, err)
    finally:
        store.close()


def test_a_decision_before_the_run_deadline_is_taken(store_url: str) -> None:
    wf = _approval()
    rested = raysaga.run(wf, store=store_url, run_id="early-ask", executor="inline",
                         options=RunOptions(deadline=3600, release_after=0))
    assert rested.deadline_at is not None
    store = SqlStore(store_url)
    try:
        decision = decide(store.engine, "early-ask", "ok", "approve", by="alice", now=rested.deadline_at - 1)
        assert decision.verdict == "approve"
    finally:
        store.close()
