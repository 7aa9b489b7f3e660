"""What a failed fan-out's end does to its other items, and a deadline-bound wait that must not
spin (found by the stop-41 review of that change): an agent item goes on with its own retries, an
approval item stops waiting, and the driver sleeps until a deadline nearer than ``release_after``."""

from __future__ import annotations

import time
from pathlib import Path

import raysaga
from raysaga import RetryPolicy, RunOptions, Workflow
from raysaga.agents import Agent, ScriptedModel, tool
from raysaga.state import EffectStatus, NodeStatus, RunStatus, open_store
from raysaga.testing import text_reply, tool_reply

CHARGES: list[int] = []


def charge(amount: int) -> dict[str, int]:
    CHARGES.append(amount)
    if len(CHARGES) == 1:
        raise ConnectionError("the provider dropped the connection")
    return {"charged": amount}


def test_an_agent_item_of_a_failed_fan_out_still_retries_its_own_calls(tmp_path: Path) -> None:
    """Item 0's agent fails for good (no script: its model call fails), failing the non-critical
    step; item 1's agent goes on to its end, and its tool call's transient failure is retried (its
    timer was dropped with the step's: the agent waited on that call for ever, its row 'running')."""
    CHARGES.clear()
    pay = tool(charge, name="charge", effect=True, retry=RetryPolicy(max_attempts=3, base=0.05, cap=0.05))
    model = ScriptedModel({"item 1": [tool_reply(("charge", {"amount": 5})), text_reply("done")]})
    wf = Workflow("stop41_agent_items")

    @wf.step()
    def plan(input: int) -> list[int]:
        return [0, 1]

    @wf.agent(Agent(name="payer", model=model, tools=(pay,)), map_over="plan", critical=False)
    def ask(plan: int) -> str:
        return f"item {plan}"

    store = open_store(f"sqlite:///{tmp_path / 'runs.db'}")
    record = raysaga.run(wf, 1, store=store, executor="inline")
    rows = {(n.node_id, n.fan_index): n for n in store.nodes(record.run_id)}
    assert record.status == RunStatus.COMPLETED
    assert rows[("ask", -1)].status == NodeStatus.FAILED
    assert rows[("ask", 1)].status == NodeStatus.COMPLETED  # not 'running' for ever
    assert CHARGES == [5, 5]
    assert [e.status for e in store.effects(record.run_id)] == [EffectStatus.COMMITTED]


def test_an_approval_item_of_a_failed_fan_out_stops_waiting(tmp_path: Path) -> None:
    """Item 0 rejected fails the (non-critical) step: item 1's approval is moot. It is closed with
    its step (its row 'cancelled', no longer in the inbox) and the run goes on, here to its end.
    (It stayed asked: the driver, the run otherwise done, held it until the item's timeout, an
    hour; and with the first fix its row said 'cancelled' while the run still waited on it.)"""
    wf = Workflow("stop41_approval_items")

    @wf.step()
    def plan(input: int) -> list[int]:
        return [0, 1]

    @wf.approval(approvers=["boss"], map_over="plan", critical=False, timeout=3600)
    def sign(plan: int) -> str:
        return f"ok {plan}?"

    @wf.approval(approvers=["boss"])
    def other(input: int) -> str:
        return "and this?"

    store = open_store(f"sqlite:///{tmp_path / 'runs.db'}")
    options = RunOptions(release_after=0)
    record = raysaga.run(wf, 1, store=store, executor="inline", options=options)
    assert record.status == RunStatus.WAITING_HUMAN
    store.decide(record.run_id, "sign", "reject", by="boss", fan_index=0)  # fails the (non-critical) step
    record = raysaga.run(wf, run_id=record.run_id, store=store, executor="inline", options=options)
    rows = {(n.node_id, n.fan_index): n for n in store.nodes(record.run_id)}
    assert rows[("sign", 1)].status == NodeStatus.CANCELLED
    assert record.status == RunStatus.WAITING_HUMAN and record.status_reason == "waiting for a decision on other"
    assert [(w.node, w.fan_index) for w in store.waiting_approvals()] == [("other", -1)]
    store.decide(record.run_id, "other", "approve", by="boss")
    record = raysaga.run(wf, run_id=record.run_id, store=store, executor="inline", options=options)
    assert record.status == RunStatus.COMPLETED


def test_a_human_awaited_with_a_deadline_nearer_than_release_after_is_waited_for_asleep(tmp_path: Path) -> None:
    """The run cannot rest (its deadline is within ``release_after``) and nothing else waits on time:
    the driver looped without sleeping, a core busy until the deadline."""
    wf = Workflow("stop41_near_deadline")

    @wf.approval(approvers=["boss"])
    def sign() -> str:
        return "go?"

    store = open_store(f"sqlite:///{tmp_path / 'runs.db'}")
    wall, cpu = time.monotonic(), time.process_time()
    record = raysaga.run(wf, store=store, executor="inline", options=RunOptions(deadline=2))
    wall, cpu = time.monotonic() - wall, time.process_time() - cpu
    assert record.status == RunStatus.FAILED and "deadline" in str(record.error)
    assert wall >= 1.5 and cpu < wall / 2, (wall, cpu)  # slept until the deadline, not spun
