"""Approval nodes end to end on a real store (SQLite and PostgreSQL), driven inline.

A run that reaches an approval with nothing else to do rests ``waiting_human`` and its driver
returns with the lease released; a decision from any process (the store's ``decide``) is checked
against the request the node stored; a resume completes the node with the decision as its
output, or rolls the saga back on a rejection. Timeouts follow the declared outcome.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from pydantic import BaseModel

import raysaga
from raysaga import Approval, Ask, RunOptions, StepContext, Workflow
from raysaga.errors import UserError, WorkflowDefinitionError
from raysaga.orchestrator.driver import Driver
from raysaga.orchestrator.executor import make_executor
from raysaga.state import NodeStatus, RunStatus, SqlStore
from raysaga.state.decisions import decide

LOG: list[str] = []


class Refund(BaseModel):
    amount: int


class Edit(BaseModel):
    amount: int


def refund_flow(**approval: Any) -> Workflow:
    wf = Workflow(f"refund_{abs(hash(tuple(sorted(map(str, approval.items()))))) % 10**8}")

    def undo_reserve(ctx: StepContext, output: dict[str, Any]) -> None:
        LOG.append(f"undo reserve {output['amount']}")

    @wf.step(compensate=undo_reserve)
    def reserve(input: Refund) -> dict[str, Any]:
        LOG.append(f"reserve {input.amount}")
        return {"amount": input.amount}

    @wf.approval(**approval)
    def review(reserve: dict[str, Any]) -> Ask:
        return Ask(prompt=f"Refund {reserve['amount']}?", payload=reserve)

    @wf.step()
    def pay(reserve: dict[str, Any], review: Approval) -> dict[str, Any]:
        amount = review.answer["amount"] if review.answer else reserve["amount"]
        LOG.append(f"pay {amount} by {','.join(review.by)}")
        return {"paid": amount, "by": review.by}

    return wf


@pytest.fixture(autouse=True)
def _clear_log() -> None:
    LOG.clear()


def _run(wf: Workflow, url: str, **options: Any) -> raysaga.RunRecord:
    return raysaga.run(wf, {"amount": 40}, store=url, executor="inline", options=RunOptions(**options))


def _resume(wf: Workflow, url: str, run_id: str, **options: Any) -> raysaga.RunRecord:
    return raysaga.resume(wf, run_id, store=url, executor="inline", options=RunOptions(**options))


def test_waiting_run_holds_no_lease_and_a_decision_completes_it(store_url: str) -> None:
    wf = refund_flow(approvers=["alice", "bob"], answer=Edit)
    rested = _run(wf, store_url)
    assert rested.status == RunStatus.WAITING_HUMAN
    assert "review" in (rested.status_reason or "")
    store = SqlStore(store_url)
    try:
        assert store.get_run(rested.run_id).lease_owner is None  # released: nothing holds the run
        [waiting] = store.waiting_approvals("alice")
        assert (waiting.run_id, waiting.node, waiting.request.prompt) == (rested.run_id, "review", "Refund 40?")
        assert waiting.request.payload == {"amount": 40}
        assert store.waiting_approvals("mallory") == []
        with pytest.raises(UserError, match="mallory may not decide 'review': its approvers are alice, bob"):
            store.decide(rested.run_id, "review", "approve", by="mallory")
        with pytest.raises(UserError, match="does not fit its schema"):
            store.decide(rested.run_id, "review", "approve", by="alice", answer={"amount": "lots"})
        first = store.decide(rested.run_id, "review", "approve", by="alice", answer={"amount": 30},
                             comment="partial", decision_id="click-1")
        again = store.decide(rested.run_id, "review", "approve", by="alice", answer={"amount": 30},
                             decision_id="click-1")  # a double click: the same decision
        assert again == first
        with pytest.raises(UserError, match="already decided: approved by alice"):
            store.decide(rested.run_id, "review", "reject", by="bob")
        assert store.get_run(rested.run_id).wake_at is not None  # a worker would take it up now
        done = _resume(wf, store_url, rested.run_id)
        assert done.status == RunStatus.COMPLETED, done.status_reason
        assert done.output == {"pay": {"paid": 30, "by": ["alice"]}}
        review = next(n for n in store.nodes(rested.run_id) if n.node_id == "review")
        assert review.status == NodeStatus.COMPLETED
        assert review.output["by"] == ["alice"] and review.output["comment"] == "partial"
        assert store.pending_signals(rested.run_id) == []  # the decision was consumed with the node
        kinds = [e.kind for e in store.events(rested.run_id)]
        assert "approval_requested" in kinds and "decision" in kinds and kinds[-1] == "run_completed"
        decision = next(e for e in store.events(rested.run_id) if e.kind == "decision")
        assert decision.data["by"] == "alice" and decision.data["verdict"] == "approve"
        with pytest.raises(UserError, match="already decided"):
            store.decide(rested.run_id, "review", "approve", by="bob")
    finally:
        store.close()
    assert LOG == ["reserve 40", "pay 30 by alice"]  # reserve ran once: the resume did not repeat it


def test_rejection_of_a_critical_approval_rolls_back(store_url: str) -> None:
    wf = refund_flow()
    rested = _run(wf, store_url)
    store = SqlStore(store_url)
    try:
        store.decide(rested.run_id, "review", "reject", by="carol", comment="not this quarter")
        ended = _resume(wf, store_url, rested.run_id)
        assert ended.status == RunStatus.COMPENSATED
        assert "rejected by carol: not this quarter" in (ended.status_reason or "")
    finally:
        store.close()
    assert LOG == ["reserve 40", "undo reserve 40"]


def test_quorum_needs_distinct_approvers(store_url: str) -> None:
    wf = refund_flow(approvers=["a", "b", "c"], quorum=2)
    rested = _run(wf, store_url)
    store = SqlStore(store_url)
    try:
        store.decide(rested.run_id, "review", "approve", by="a")
        with pytest.raises(UserError, match="a already approved"):
            store.decide(rested.run_id, "review", "approve", by="a")
        assert store.get_run(rested.run_id).wake_at is None  # not settled: nothing to wake for
        again = _resume(wf, store_url, rested.run_id)  # one approval of two: it waits again
        assert again.status == RunStatus.WAITING_HUMAN
        [waiting] = store.waiting_approvals()
        assert waiting.approvals == ["a"]
        store.decide(rested.run_id, "review", "approve", by="c")
        done = _resume(wf, store_url, rested.run_id)
        assert done.status == RunStatus.COMPLETED and done.output["pay"]["by"] == ["a", "c"]
    finally:
        store.close()


def test_timeout_rejects_while_a_driver_waits(sqlite_url: str) -> None:
    wf = refund_flow(timeout=0.3)
    ended = _run(wf, sqlite_url)  # the timeout is near: the driver waits for it itself
    assert ended.status == RunStatus.COMPENSATED
    assert "before its timeout" in (ended.status_reason or "")
    assert LOG == ["reserve 40", "undo reserve 40"]


def test_timeout_default_approves_with_the_default(sqlite_url: str) -> None:
    wf = refund_flow(timeout=0.3, on_timeout="default", default={"amount": 5}, answer=Edit)
    ended = _run(wf, sqlite_url)
    assert ended.status == RunStatus.COMPLETED
    assert ended.output == {"pay": {"paid": 5, "by": ["timeout"]}}


def test_late_decision_is_refused_and_the_outcome_applies(sqlite_url: str) -> None:
    wf = refund_flow(timeout=0.5)
    rested = _run(wf, sqlite_url, release_after=0)  # rest at once, timeout pending
    assert rested.status == RunStatus.WAITING_HUMAN and rested.wake_at is not None
    store = SqlStore(sqlite_url)
    try:
        with pytest.raises(UserError, match="timed out"):
            decide(store.engine, rested.run_id, "review", "approve", by="x", now=rested.wake_at + 0.01)
    finally:
        store.close()
    ended = _resume(wf, sqlite_url, rested.run_id)  # waits out the timeout, then rejects
    assert ended.status == RunStatus.COMPENSATED


def test_escalation_moves_the_decision_to_others(sqlite_url: str) -> None:
    wf = refund_flow(approvers=["alice"], timeout=0.3, on_timeout="escalate", escalate_to=["boss"])
    rested = _run(wf, sqlite_url, release_after=0.1)  # alice does not answer in time: escalated
    store = SqlStore(sqlite_url)
    try:
        assert rested.status == RunStatus.WAITING_HUMAN
        # a driver whose clock is past the first timeout (a worker woken by wake_at): it escalates
        # (a new timeout from its now) and rests again
        later = Driver(wf, store, make_executor("inline"), rested.run_id, options=RunOptions(release_after=0),
                       clock=lambda: time.time() + 1.0)
        escalated = later.drive()
        assert escalated.status == RunStatus.WAITING_HUMAN
        [waiting] = store.waiting_approvals("boss")
        assert waiting.request.escalated and waiting.request.deciders() == ["alice", "boss"]
        store.decide(rested.run_id, "review", "approve", by="boss")
        done = _resume(wf, sqlite_url, rested.run_id)
        assert done.status == RunStatus.COMPLETED and done.output["pay"]["by"] == ["boss"]
        assert any(e.kind == "approval_escalated" for e in store.events(rested.run_id))
    finally:
        store.close()


def test_decisions_refused_for_nodes_not_waiting(sqlite_url: str) -> None:
    wf = refund_flow()
    rested = _run(wf, sqlite_url)
    store = SqlStore(sqlite_url)
    try:
        with pytest.raises(UserError, match=r"'pay' of run .* is not waiting for a decision"):
            store.decide(rested.run_id, "pay", "approve", by="x")
        with pytest.raises(UserError, match="names who made it"):
            store.decide(rested.run_id, "review", "approve", by=" ")
        with pytest.raises(raysaga.RunNotFoundError):
            store.decide("nope", "review", "approve", by="x")
        with pytest.raises(UserError, match="takes no answer"):
            store.decide(rested.run_id, "review", "approve", by="x", answer={"amount": 1})
    finally:
        store.close()


def test_definition_errors_name_the_fix() -> None:
    wf = Workflow("bad_approvals")

    @wf.step()
    def a() -> int:
        return 1

    def ask(a: int) -> str:
        return "ok?"

    with pytest.raises(WorkflowDefinitionError, match="approvers= is empty"):
        wf.approval(approvers=[])(ask)
    with pytest.raises(WorkflowDefinitionError, match="quorum=3 needs more approvers"):
        wf.approval(approvers=["x", "y"], quorum=3)(ask)
    with pytest.raises(WorkflowDefinitionError, match="escalate_to="):
        wf.approval(timeout=5, on_timeout="escalate")(ask)
    with pytest.raises(WorkflowDefinitionError, match="needs default="):
        wf.approval(timeout=5, on_timeout="default")(ask)
    with pytest.raises(WorkflowDefinitionError, match="not one str"):
        wf.approval(approvers="alice")(ask)  # a str is an Iterable[str] to a type checker: refused at run time
    with pytest.raises(WorkflowDefinitionError, match="on_timeout='later' is not one of"):
        wf.approval(timeout=5, on_timeout="later")(ask)  # type: ignore[arg-type]


def test_durable_sleep_rests_and_wakes_on_time(store_url: str) -> None:
    wf = Workflow("sleepy")

    @wf.step()
    def first() -> int:
        LOG.append("first")
        return 1

    wf.sleep("cool_off", seconds=0.4, after=["first"])

    @wf.step(after=["cool_off"])
    def second(first: int) -> int:
        LOG.append("second")
        return first + 1

    rested = raysaga.run(wf, None, store=store_url, executor="inline", options=RunOptions(release_after=0))
    assert rested.status == RunStatus.WAITING_TIMER
    assert rested.wake_at is not None and "cool_off" in (rested.status_reason or "")
    store = SqlStore(store_url)
    try:
        row = next(n for n in store.nodes(rested.run_id) if n.node_id == "cool_off")
        assert row.status == NodeStatus.WAITING and row.not_before == rested.wake_at
    finally:
        store.close()
    done = raysaga.resume(wf, rested.run_id, store=store_url, executor="inline")  # sleeps out the rest
    assert done.status == RunStatus.COMPLETED and done.output == {"second": 2}
    assert done.updated_at >= rested.wake_at  # it woke no earlier than the time its row said
    assert LOG == ["first", "second"]


def test_a_decided_approval_leaves_no_timer_behind(sqlite_url: str) -> None:
    """An approval with a day-long timeout, approved: the run completes at once instead of resting
    on the timeout that no longer applies."""
    wf = refund_flow(timeout=86_400.0)
    rested = _run(wf, sqlite_url)
    assert rested.status == RunStatus.WAITING_HUMAN and rested.wake_at is not None
    store = SqlStore(sqlite_url)
    try:
        store.decide(rested.run_id, "review", "approve", by="dana")
    finally:
        store.close()
    done = _resume(wf, sqlite_url, rested.run_id)
    assert done.status == RunStatus.COMPLETED, done.status_reason


def test_concurrent_decisions_record_one(store_url: str) -> None:
    """Eight approvers click at once: one decision is recorded, the others are told it is decided."""
    wf = refund_flow()
    rested = _run(wf, store_url)
    stores = [SqlStore(store_url) for _ in range(8)]
    results: list[str] = []
    barrier = threading.Barrier(len(stores))

    def click(i: int) -> None:
        barrier.wait()
        try:
            stores[i].decide(rested.run_id, "review", "approve" if i % 2 else "reject", by=f"p{i}")
            results.append("recorded")
        except UserError as exc:
            results.append("refused" if "already decided" in str(exc) else str(exc))

    threads = [threading.Thread(target=click, args=(i,)) for i in range(len(stores))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    try:
        assert sorted(results) == ["recorded"] + ["refused"] * 7
        assert len([s for s in stores[0].pending_signals(rested.run_id) if s.kind in ("approve", "reject")]) == 1
        assert len([e for e in stores[0].events(rested.run_id) if e.kind == "decision"]) == 1
    finally:
        for s in stores:
            s.close()


def test_a_secret_in_a_decision_never_reaches_the_store(sqlite_url: str) -> None:
    """An approver pastes an API key into the comment: the signal, the event, the node's output and
    the decision returned all hold it redacted."""
    key = "sk-ant-api03-" + "Q" * 40
    wf = refund_flow()
    rested = _run(wf, sqlite_url)
    store = SqlStore(sqlite_url)
    try:
        decision = store.decide(rested.run_id, "review", "approve", by="erin", comment=f"paid with {key}")
        assert key not in str(decision) and "[redacted]" in (decision.comment or "")
        done = _resume(wf, sqlite_url, rested.run_id)
        assert done.status == RunStatus.COMPLETED
        stored = [str(e.data) for e in store.events(rested.run_id)]
        stored += [str(n.output) for n in store.nodes(rested.run_id)]
        assert not [s for s in stored if key in s]
        assert any("[redacted]" in s for s in stored)
    finally:
        store.close()
