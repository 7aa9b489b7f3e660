"""A run that is over shows nothing as under way: no node row says 'running' once it ended.

An agent's own row is written 'running' when it starts; its calls are what is in flight. A
critical failure elsewhere cancels those calls (their rows say 'cancelled'), but the agent's
row said 'running' for ever on a failed run: ``raysaga status`` and the dashboard showed the
agent still at work. The same for a cancel. (The hypothesis model test checks the same rule
after every schedule and crash: ``tests/orchestrator/machine/test_machine_model.py``.)
"""

from __future__ import annotations

import pytest

import raysaga
from raysaga import Permanent, RunStatus, Workflow
from raysaga.agents import Agent, ScriptedModel, text_reply, tool, tool_reply
from raysaga.state import NodeStatus, SqlStore


@tool
def lookup(q: str) -> str:
    """Look a word up."""
    return f"{q}: found"


def _flow(fail: bool) -> Workflow:
    wf = Workflow("agent-beside-a-check")
    model = ScriptedModel(default=(tool_reply(("lookup", {"q": "a"})), tool_reply(("lookup", {"q": "b"})),
                                   text_reply("done")))

    @wf.step()
    def start() -> str:
        return "go"

    @wf.agent(Agent("researcher", model, tools=(lookup,)))
    def research(start: str) -> str:
        return f"research {start}"

    @wf.step()
    def check(start: str) -> str:
        if fail:
            raise Permanent("the check refused the order")
        return "ok"

    return wf


def _rows(url: str, run_id: str) -> dict[str, NodeStatus]:
    store = SqlStore(url)
    try:
        return {n.label: n.status for n in store.nodes(run_id)}
    finally:
        store.close()


@pytest.mark.parametrize("fail", [True, False])
def test_an_agent_under_way_when_the_run_fails_ends_cancelled_not_running(sqlite_url: str, fail: bool) -> None:
    record = raysaga.run(_flow(fail), None, store=sqlite_url, executor="inline")
    rows = _rows(sqlite_url, record.run_id)
    if not fail:  # the same flow, nothing failing: the agent finishes (the test's control)
        assert record.status == RunStatus.COMPLETED
        assert rows["research"] == NodeStatus.COMPLETED
        return
    assert record.status == RunStatus.FAILED, record.status_reason
    assert rows["check"] == NodeStatus.FAILED
    running = sorted(label for label, status in rows.items() if status == NodeStatus.RUNNING)
    assert running == [], f"a failed run still shows {running} under way: {rows}"
    assert rows["research"] == NodeStatus.CANCELLED
