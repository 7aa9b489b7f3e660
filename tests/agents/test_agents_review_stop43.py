"""Stop 43's agent review: approvals, rollbacks and an agent node's own options.

Driven for real (inline executor, SQLite and PostgreSQL where the store matters), with scripted
models (a conversation without a script fails for good):

- a tool call still waiting for a human took no effect: a rollback (a failure, an operator's
  cancel with compensation) never undoes it, nor one held at a rate gate and never sent;
- after "approve with edits", a rollback undoes the call that ran: the edited arguments, under
  the key the effect ran under, with the tool's own output (across a crash too);
- a non-critical fan-out failed while agent items wait for a human: the run never ends with an
  item 'running' and its call 'waiting';
- a loop pause in a fan-out names the item;
- ``@wf.agent(timeout=, retry=)`` are obeyed.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

import raysaga
from raysaga import Client, RateLimit, RetryPolicy, RunStatus, StepContext, Transient, Workflow
from raysaga.agents import Agent, LoopPolicy, ModelRequest, ModelResponse, ScriptedModel, text_reply, tool, tool_reply
from raysaga.agents.models import first_user_text
from raysaga.sagas import ALL, quorum
from raysaga.state import NodeStatus, SqlStore
from raysaga.testing import CrashAt, SimulatedCrash, drive_inline
from tests.support.store_rows import nodes_of

PAID: list[dict[str, Any]] = []
UNDONE: list[dict[str, Any]] = []


@pytest.fixture(autouse=True)
def _fresh() -> None:
    PAID.clear()
    UNDONE.clear()


def _refund(ctx: StepContext, who: str, amount: int, output: Any = None) -> None:
    UNDONE.append({"who": who, "amount": amount, "key": ctx.idempotency_key, "output": output})


@tool(effect=True, requires_approval=True, approvers=["alice"], compensate=_refund)
def pay(who: str, amount: int, idempotency_key: str) -> str:
    """Pay someone (a human approves it first)."""
    PAID.append({"who": who, "amount": amount, "key": idempotency_key})
    return f"paid {amount} to {who}"


class Flaky(ScriptedModel):
    """A ``ScriptedModel`` whose conversations naming ``broken`` fail with a provider's 500: after
    its retries (a short backoff: the other items ask for their tools first), for good."""

    def complete(self, request: ModelRequest) -> ModelResponse:
        if "broken" in first_user_text(request.messages):
            raise Transient("HTTP 500 internal server error")
        return super().complete(request)


RETRY_FAST = RetryPolicy(max_attempts=2, base=0.01, cap=0.02)


def _research(subjects: list[str], *, policy: Any = ALL, critical: bool = True,
              writer_fails: bool = False) -> Workflow:
    """plan -> research (an agent per subject: pay, then answer) -> write (an agent). A subject
    named ``broken``: its model fails for good (``Flaky``)."""
    script = {f"RESEARCH {s}": [tool_reply(("pay", {"who": s, "amount": 5})), text_reply(f"done {s}")]
              for s in subjects}
    researcher = Agent(name="researcher", model=Flaky(script=script), tools=(pay,), transport_retry=RETRY_FAST)
    writer = Agent(name="writer", model=ScriptedModel(default=() if writer_fails else (text_reply("written"),)))
    wf = Workflow(f"review43_{len(subjects)}_{critical}_{writer_fails}")

    @wf.step()
    def plan(input: Any) -> list[str]:
        return subjects

    @wf.agent(researcher, map_over="plan", policy=policy, critical=critical)
    def research(plan: str) -> str:
        return f"RESEARCH {plan}"

    @wf.agent(writer)
    def write(research: Any) -> str:
        return "WRITE " + json.dumps(research, default=repr)

    return wf


def drive(url: str, wf: Workflow, run_id: str, faults: CrashAt | None = None) -> raysaga.RunRecord:
    return drive_inline(wf, run_id, store=url, crash_at=faults)


rows = nodes_of  # a run's node rows by label


# ---------------------------------------------------------------------- bug 1: never-run calls


def test_a_call_waiting_for_approval_is_not_undone_when_the_run_fails(store_url: str) -> None:
    wf = _research(["alpha", "broken", "gamma"])
    run_id = raysaga.create_run(wf, None, store=store_url).run_id
    done = drive(store_url, wf, run_id)
    assert done.status == RunStatus.FAILED, done.status_reason  # nothing took effect: nothing to undo
    assert PAID == [] and UNDONE == []
    found = rows(store_url, run_id)
    for label in ("research@0.0[0]", "research@0.0[2]"):
        error = found[label].error
        assert found[label].status == NodeStatus.CANCELLED and error is not None and error.took_effect is False


def test_a_cancel_with_compensation_does_not_undo_a_call_waiting_for_approval(sqlite_url: str) -> None:
    wf = _research(["alpha"])
    run_id = raysaga.create_run(wf, None, store=sqlite_url).run_id
    assert drive(sqlite_url, wf, run_id).status == RunStatus.WAITING_HUMAN
    store = SqlStore(sqlite_url)
    try:
        Client(store).cancel(run_id, compensate=True, by="ops")
    finally:
        store.close()
    done = drive(sqlite_url, wf, run_id)
    assert done.status == RunStatus.COMPENSATED, done.status_reason  # (nothing to undo)
    assert PAID == [] and UNDONE == []


def test_a_call_held_at_a_rate_gate_and_never_sent_is_not_undone(sqlite_url: str) -> None:
    """gamma's call waits at the gate (one call a minute: alpha's took it) when an item's model fails
    for good: it never left the driver, so nothing undoes it; alpha's, which ran, is undone."""
    undone: list[str] = []

    def unpay(who: str) -> None:
        undone.append(who)

    @tool(effect=True, compensate=unpay, rate_limit=RateLimit(name="review43-pay", requests=1, per=60.0))
    def charge(who: str) -> str:
        """Charge someone."""
        PAID.append({"who": who})
        return f"charged {who}"

    script = {f"R {s}": [tool_reply(("charge", {"who": s})), text_reply("done")] for s in ("alpha", "gamma")}
    agent = Agent(name="r", model=Flaky(script=script), tools=(charge,), transport_retry=RETRY_FAST)
    wf = Workflow("review43_gate")

    @wf.step()
    def plan(input: Any) -> list[str]:
        return ["alpha", "broken", "gamma"]

    @wf.agent(agent, map_over="plan", policy=ALL)
    def research(plan: str) -> str:
        return f"R {plan}"

    run_id = raysaga.create_run(wf, None, store=sqlite_url).run_id
    done = drive(sqlite_url, wf, run_id)
    assert done.status == RunStatus.COMPENSATED, done.status_reason
    assert PAID == [{"who": "alpha"}] and undone == ["alpha"]
    held = rows(sqlite_url, run_id)["research@0.0[2]"]
    assert held.status == NodeStatus.CANCELLED and held.error is not None and held.error.took_effect is False


# ---------------------------------------------------------------------- bug 2: approve with edits


def _approve_all(url: str, run_id: str, edits: dict[int, dict[str, Any]]) -> None:
    store = SqlStore(url)
    try:
        for index in range(3):
            store.decide(run_id, "research@0.0", "approve", by="alice", fan_index=index, answer=edits.get(index))
    finally:
        store.close()


def test_the_undo_of_an_edited_call_is_of_the_call_that_ran(store_url: str) -> None:
    wf = _research(["alpha", "beta", "gamma"], writer_fails=True)
    run_id = raysaga.create_run(wf, None, store=store_url).run_id
    assert drive(store_url, wf, run_id).status == RunStatus.WAITING_HUMAN
    _approve_all(store_url, run_id, {1: {"who": "zeta", "amount": 500}})
    done = drive(store_url, wf, run_id)
    assert done.status == RunStatus.COMPENSATED, done.status_reason
    keys = {p["who"]: p["key"] for p in PAID}
    assert sorted(keys) == ["alpha", "gamma", "zeta"]
    assert sorted((u["who"], u["amount"], u["key"], u["output"]) for u in UNDONE) == [
        ("alpha", 5, keys["alpha"] + ":compensate", "paid 5 to alpha"),
        ("gamma", 5, keys["gamma"] + ":compensate", "paid 5 to gamma"),
        ("zeta", 500, keys["zeta"] + ":compensate", "paid 500 to zeta")]


def test_the_undo_of_an_edited_call_in_doubt_after_a_crash_is_of_the_call_that_ran(sqlite_url: str) -> None:
    """The driver dies once the edited call's ledger row is durable, before the call: its outcome
    is unknown, its row no longer holds the approved arguments; the operator cancels with
    compensation. The undo is of the edited call, under its key (the tool never returned: no output)."""
    wf = _research(["beta"])
    run_id = raysaga.create_run(wf, None, store=sqlite_url).run_id
    assert drive(sqlite_url, wf, run_id).status == RunStatus.WAITING_HUMAN
    store = SqlStore(sqlite_url)
    try:
        store.decide(run_id, "research@0.0", "approve", by="alice", fan_index=0, answer={"who": "zeta", "amount": 500})
        with pytest.raises(SimulatedCrash):
            drive(sqlite_url, wf, run_id, faults=CrashAt("after_pending", "research@0.0[0]"))
        [pending] = store.effects(run_id)
        assert PAID == [] and rows(sqlite_url, run_id)["research@0.0[0]"].status == NodeStatus.RUNNING
        Client(store).cancel(run_id, compensate=True, by="ops")
    finally:
        store.close()
    done = drive(sqlite_url, wf, run_id)
    assert done.status == RunStatus.COMPENSATED, done.status_reason
    assert [(u["who"], u["amount"], u["key"], u["output"]) for u in UNDONE] == [
        ("zeta", 500, pending.idempotency_key + ":compensate", None)]


# ---------------------------------------------------------------------- bug 3: a failed fan-out's asks


def test_a_non_critical_fan_out_failed_while_its_agent_items_wait_for_a_human(store_url: str) -> None:
    """quorum(3) is out of reach once one item fails: the step fails, the run goes on. The agent
    items asking a human run to their end, their calls answered as not run (nobody can decide them
    any more): no row is left 'running' or 'waiting' on the ended run, and nothing was paid."""
    wf = _research(["alpha", "broken", "gamma"], policy=quorum(3), critical=False)
    run_id = raysaga.create_run(wf, None, store=store_url).run_id
    done = drive(store_url, wf, run_id)
    assert done.status == RunStatus.COMPLETED, done.status_reason
    found = rows(store_url, run_id)
    assert {label: n.status for label, n in found.items()
            if n.status in (NodeStatus.RUNNING, NodeStatus.WAITING)} == {}
    assert PAID == [] and UNDONE == []
    for label in ("research@0.0[0]", "research@0.0[2]"):
        assert found[label].status == NodeStatus.COMPLETED
        assert found[label].output["is_error"] is True and "its step failed" in found[label].output["content"]
    store = SqlStore(store_url)
    try:
        assert store.waiting_approvals("alice", run_id=run_id) == []
        decided = [e.data for e in store.events(run_id) if e.kind == "fanout_decision"]
    finally:
        store.close()
    # what the decision says of the unsettled items is true: agent items are not cut short
    assert len(decided) == 1 and "the 2 unsettled run to their end" in decided[0]["reason"], decided


# ---------------------------------------------------------------------- bug 4: a loop pause's item


def test_a_loop_pause_in_a_fan_out_names_the_item(sqlite_url: str) -> None:
    @tool
    def search(q: str) -> str:
        """Search."""
        return f"result for {q}"

    script = {"R loops": [tool_reply(("search", {"q": "same"}))]}
    script["R fine"] = [text_reply("fine")]
    agent = Agent(name="researcher", model=ScriptedModel(script=script), tools=(search,),
                  loop=LoopPolicy(window=6, repeats=3, then="pause"), max_turns=12)
    wf = Workflow("review43_loop")

    @wf.step()
    def plan(input: Any) -> list[str]:
        return ["fine", "loops"]

    @wf.agent(agent, map_over="plan")
    def research(plan: str) -> str:
        return f"R {plan}"

    run_id = raysaga.create_run(wf, None, store=sqlite_url).run_id
    done = drive(sqlite_url, wf, run_id)
    assert done.status == RunStatus.PAUSED
    assert done.status_reason is not None and done.status_reason.startswith(
        "loop: agent 'researcher' (research[1]) keeps calling search"), done.status_reason


# ---------------------------------------------------------------------- bug 5: timeout=, retry=


def test_an_agent_nodes_timeout_fails_it_while_it_waits_for_a_human(sqlite_url: str) -> None:
    """The node's whole wall time, from its first turn: still asking a human at its deadline, it
    fails (nobody is asked any more, the call never ran), and the run with it."""
    model = ScriptedModel(default=(tool_reply(("pay", {"who": "alpha", "amount": 5})), text_reply("done")))
    wf = Workflow("review43_timeout")

    @wf.agent(Agent(name="a", model=model, tools=(pay,)), timeout=0.2)
    def ask(input: Any) -> str:
        return "pay alpha"

    run_id = raysaga.create_run(wf, None, store=sqlite_url).run_id
    done = drive(sqlite_url, wf, run_id)
    assert done.status == RunStatus.FAILED, done.status_reason
    assert done.error is not None and done.error.get("type") == "AgentTimeout", done.error
    found = rows(sqlite_url, run_id)
    assert found["ask"].status == NodeStatus.FAILED
    call = found["ask@0.0"]
    assert call.status == NodeStatus.CANCELLED and call.error is not None and call.error.took_effect is False
    assert PAID == [] and UNDONE == []


def test_an_agent_nodes_retry_is_its_model_calls_attempts(sqlite_url: str) -> None:
    calls: list[int] = []

    class Down(ScriptedModel):
        def complete(self, request: Any) -> Any:
            calls.append(1)
            raise ConnectionError("model endpoint down")

    wf = Workflow("review43_retry")

    @wf.agent(Agent(name="down", model=Down(), transport_retry=RetryPolicy(max_attempts=1)),
              retry=RetryPolicy(max_attempts=3, base=0.01, cap=0.02))
    def ask(input: Any) -> str:
        return "hi"

    run_id = raysaga.create_run(wf, None, store=sqlite_url).run_id
    done = drive(sqlite_url, wf, run_id)
    assert done.status == RunStatus.FAILED and len(calls) == 3, (done.status_reason, calls)


# ---------------------------------------------------------------------- the review of these fixes


CHARGES: list[str] = []


@tool(effect=True, retry=RetryPolicy(max_attempts=5, base=4.0, cap=4.0))
def slow_charge(who: str, idempotency_key: str) -> str:
    """Charge (the gateway times out: a backoff of 4 s between attempts)."""
    CHARGES.append(idempotency_key)
    raise Transient("gateway timeout")


def test_a_non_critical_agent_timed_out_in_a_tool_backoff_leaves_no_row_retrying(
        sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its tool call waiting out a backoff stayed 'retrying' (next try pending) on a completed run:
    the node's calls in flight or in a backoff now stop with it, and their rows say so. The backoff
    is its ceiling (4 s), not full jitter's draw from 0 to 4 s: a draw under the node's 0.5 s made
    the retry before the timeout, rightly, and the test saw 3 charges (a CI rehearsal, stop 45)."""
    from raysaga.orchestrator.machine import calls

    monkeypatch.setattr(calls, "backoff_delay", lambda attempt, policy, rng: policy.cap)
    CHARGES.clear()
    model = ScriptedModel(default=(tool_reply(("slow_charge", {"who": "alpha"})), text_reply("done")))
    wf = Workflow("review43_timeout_backoff")

    @wf.agent(Agent(name="a", model=model, tools=(slow_charge,)), timeout=0.5, critical=False)
    def ask(input: Any) -> str:
        return "charge alpha"

    run_id = raysaga.create_run(wf, None, store=sqlite_url).run_id
    done = drive(sqlite_url, wf, run_id)
    assert done.status == RunStatus.COMPLETED, done.status_reason
    found = rows(sqlite_url, run_id)
    assert found["ask"].status == NodeStatus.FAILED
    assert {label: n.status for label, n in found.items()
            if n.status in (NodeStatus.RUNNING, NodeStatus.RETRYING, NodeStatus.WAITING)} == {}
    assert len(CHARGES) == 1  # the backoff's retry was not made after the node ended


def test_an_agent_item_waiting_for_a_human_ends_when_its_step_fails(sqlite_url: str) -> None:
    """Told "not run" when its step failed, the item asked its model again, was told again, and a
    loop policy paused the run (an operator unpaused a run whose step had failed): it ends there."""
    turns: list[str] = []

    class Counting(Flaky):
        def complete(self, request: ModelRequest) -> ModelResponse:
            turns.append(first_user_text(request.messages))
            return super().complete(request)

    script = {"RESEARCH alpha": [tool_reply(("pay", {"who": "alpha", "amount": 5}))] * 6}
    agent = Agent(name="r", model=Counting(script=script), tools=(pay,), transport_retry=RETRY_FAST,
                  loop=LoopPolicy(window=4, repeats=2, then="pause"), max_turns=8)
    wf = Workflow("review43_not_asked_loop")

    @wf.step()
    def plan(input: Any) -> list[str]:
        return ["alpha", "broken"]

    @wf.agent(agent, map_over="plan", policy=quorum(2), critical=False)
    def research(plan: str) -> str:
        return f"RESEARCH {plan}"

    run_id = raysaga.create_run(wf, None, store=sqlite_url).run_id
    done = drive(sqlite_url, wf, run_id)
    assert done.status == RunStatus.COMPLETED, done.status_reason
    assert turns.count("RESEARCH alpha") == 1, turns  # no turn after "not run"
    found = rows(sqlite_url, run_id)
    assert found["research[0]"].status == NodeStatus.FAILED
    assert PAID == [] and UNDONE == []


def test_timers_dropped_in_a_batch_keep_one_scheduled_after_its_drop() -> None:
    """Dropping a key's timers was a scan and a re-heap each (quadratic over a fan-out of agent
    items with a timeout=); now batched, and a key scheduled again after its drop keeps its timer."""
    from raysaga.node_key import NodeKey
    from raysaga.orchestrator.machine.timers import Timers

    timers = Timers()
    keys = [NodeKey("s", i) for i in range(5)]
    for i, key in enumerate(keys):
        timers.push(10.0 + i, key)
    for key in keys[:3]:
        timers.drop(key)
    timers.push(1.0, keys[0])  # scheduled again after its drop: kept
    assert timers.next() == 1.0 and len(timers) == 3
    assert timers.due(12.0) == [keys[0]]
    assert timers.due(100.0) == [keys[3], keys[4]]
