"""An agent's tool with ``requires_approval=True``: the call waits for a human before it runs.

Driven for real (inline executor, SQLite and PostgreSQL) with a ``RecordingModel``: the run rests
``waiting_human`` once the model asked for the tool; the model is never asked that turn again
(its answer was committed before the tool was held); an approval with edited arguments runs the
tool with them and the model is told; a rejection's reason is shown to the model; a crash right
after the decision keeps it.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest

import raysaga
from raysaga import RunStatus, Workflow
from raysaga.agents import Agent, text_reply, tool, tool_reply
from raysaga.errors import UserError, WorkflowDefinitionError
from raysaga.orchestrator import Driver, InlineExecutor
from raysaga.state import NodeStatus, SqlStore
from raysaga.testing import CrashAt, RecordingModel, SimulatedCrash
from tests.support.models import Recorded

JOURNAL = "test_tool_approval"
SEEN = Recorded(JOURNAL, lambda r: r.messages)
recording = functools.partial(RecordingModel, journal=JOURNAL)
REFUNDS: list[dict[str, Any]] = []


@pytest.fixture(autouse=True)
def _fresh() -> None:
    SEEN.clear()
    REFUNDS.clear()
    LOOKUPS.clear()


@tool(effect=True, requires_approval=True, approvers=["alice"])
def refund(order: str, amount: int) -> str:
    """Refund an order."""
    REFUNDS.append({"order": order, "amount": amount})
    return f"refunded {amount} on {order}"


LOOKUPS: list[str] = []


@tool(requires_approval=True)
def lookup(order: str) -> str:
    """Look an order up."""
    LOOKUPS.append(order)
    return f"{order}: in transit"


def flow() -> tuple[Workflow, RecordingModel]:
    model = recording(default=(tool_reply(("refund", {"order": "o-1", "amount": 90})), text_reply("all done")))
    agent = Agent(name="support", model=model, tools=(refund,))
    wf = Workflow("tool_approval")

    @wf.agent(agent)
    def helpdesk(input: str) -> str:
        return f"customer says: {input}"

    return wf, model


def drive(url: str, wf: Workflow, run_id: str, faults: CrashAt | None = None) -> raysaga.RunRecord:
    store = SqlStore(url)
    try:
        return Driver(wf, store, InlineExecutor(), run_id, faults=faults).drive()
    finally:
        store.close()


def test_approved_with_edits_runs_the_edited_call_and_tells_the_model(store_url: str) -> None:
    wf, _ = flow()
    run_id = raysaga.create_run(wf, "my parcel never came", store=store_url).run_id
    rested = drive(store_url, wf, run_id)
    assert rested.status == RunStatus.WAITING_HUMAN
    assert REFUNDS == [] and len(SEEN) == 1  # nothing ran; the model was asked once
    store = SqlStore(store_url)
    try:
        [waiting] = store.waiting_approvals("alice")
        assert waiting.node == "helpdesk@0.0" and waiting.request.tool == "refund"
        assert waiting.request.payload == {"tool": "refund", "args": {"order": "o-1", "amount": 90}}
        with pytest.raises(UserError, match="may not decide"):
            store.decide(run_id, "helpdesk@0.0", "approve", by="bob")
        with pytest.raises(UserError, match="does not fit its schema"):
            store.decide(run_id, "helpdesk@0.0", "approve", by="alice", answer={"order": "o-1", "amount": "x"})
        store.decide(run_id, "helpdesk@0.0", "approve", by="alice", answer={"order": "o-1", "amount": 60},
                     comment="partial refund")
        done = drive(store_url, wf, run_id)
        assert done.status == RunStatus.COMPLETED, done.status_reason
        assert REFUNDS == [{"order": "o-1", "amount": 60}]
        assert len(SEEN) == 2  # turn 0 was not asked again: only the turn after the tool
        result = SEEN[1][-1]["content"][0]
        assert result["content"].startswith('(a human edited this call\'s arguments to {"amount":60,"order":"o-1"})')
        assert result["content"].endswith("refunded 60 on o-1") and result["is_error"] is False
        [effect] = store.effects(run_id)
        assert effect.status.value == "committed"
    finally:
        store.close()


def test_rejection_reason_is_shown_to_the_model(sqlite_url: str) -> None:
    wf, _ = flow()
    run_id = raysaga.create_run(wf, "refund me twice", store=sqlite_url).run_id
    drive(sqlite_url, wf, run_id)
    store = SqlStore(sqlite_url)
    try:
        store.decide(run_id, "helpdesk@0.0", "reject", by="alice", comment="already refunded")
        done = drive(sqlite_url, wf, run_id)
        assert done.status == RunStatus.COMPLETED
        assert REFUNDS == []
        result = SEEN[1][-1]["content"][0]
        assert result["is_error"] is True and "rejected by alice: already refunded" in result["content"]
        row = next(n for n in store.nodes(run_id) if n.node_id == "helpdesk@0.0")
        assert row.status == NodeStatus.COMPLETED
    finally:
        store.close()


def test_a_crash_after_the_decision_keeps_it(sqlite_url: str) -> None:
    wf, _ = flow()
    run_id = raysaga.create_run(wf, "x", store=sqlite_url).run_id
    drive(sqlite_url, wf, run_id)
    store = SqlStore(sqlite_url)
    try:
        store.decide(run_id, "helpdesk@0.0", "approve", by="alice")
        with pytest.raises(SimulatedCrash):  # the effect's ledger row is durable, the tool not yet run
            drive(sqlite_url, wf, run_id, faults=CrashAt("after_pending", "*"))
        assert REFUNDS == [] and [s.kind for s in store.pending_signals(run_id)] == ["approve"]
        row = next(n for n in store.nodes(run_id) if n.node_id == "helpdesk@0.0")
        assert row.status == NodeStatus.RUNNING  # issued: nobody can decide it again
        with pytest.raises(UserError, match="not waiting for a decision"):
            store.decide(run_id, "helpdesk@0.0", "reject", by="alice")
        done = drive(sqlite_url, wf, run_id)  # the recorded decision is found again: no second one is asked
        assert done.status == RunStatus.COMPLETED
        assert REFUNDS == [{"order": "o-1", "amount": 90}] and len(SEEN) == 2
        assert store.pending_signals(run_id) == []  # consumed with the call's outcome
    finally:
        store.close()


def test_a_crash_between_the_decision_and_a_plain_tool_call_keeps_it(sqlite_url: str) -> None:
    """A tool that is not an effect writes no row before its call: a crash before the commit of its
    outcome leaves the row waiting and the decision unconsumed; the resume applies the same
    decision again (nobody is asked twice) and consumes it with the call's outcome. The call itself
    is at least once, like any plain step."""
    model = recording(default=(tool_reply(("lookup", {"order": "o-9"})), text_reply("found")))
    agent = Agent(name="reader", model=model, tools=(lookup,))
    wf = Workflow("tool_approval_plain")

    @wf.agent(agent)
    def ask(input: str) -> str:
        return input

    run_id = raysaga.create_run(wf, "where is o-9", store=sqlite_url).run_id
    drive(sqlite_url, wf, run_id)
    store = SqlStore(sqlite_url)
    try:
        store.decide(run_id, "ask@0.0", "approve", by="alice")
        with pytest.raises(SimulatedCrash):
            drive(sqlite_url, wf, run_id, faults=CrashAt("before_commit", "ask@0.0"))
        row = next(n for n in store.nodes(run_id) if n.node_id == "ask@0.0")
        assert row.status == NodeStatus.WAITING and [s.kind for s in store.pending_signals(run_id)] == ["approve"]
        done = drive(sqlite_url, wf, run_id)
        assert done.status == RunStatus.COMPLETED and LOOKUPS == ["o-9", "o-9"]
        assert store.pending_signals(run_id) == []  # the decision consumed with the call's outcome
    finally:
        store.close()


def test_tool_options_are_checked() -> None:
    def f(x: int) -> int:
        return x

    with pytest.raises(WorkflowDefinitionError, match="approvers= goes with requires_approval=True"):
        tool(f, approvers=["a"])
    with pytest.raises(WorkflowDefinitionError, match="non-empty list of names"):
        tool(f, requires_approval=True, approvers=[])
