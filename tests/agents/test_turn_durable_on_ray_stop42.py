"""Invariant 3 on Ray with a plain (non-effect) tool: a model response is durable before any tool
it asks for runs.

On Ray the driver may send the next calls while the batch of the last round is still being
committed (``RunMachine.may_overlap``); an agent's tool call must never be among them, or a
crash in that window re-asks the model after its tool already ran. The agent kill sweeps did not
reach this: inline there is no overlap, and their Ray case uses an effect tool, whose ``pending``
ledger row makes the driver commit first anyway (``driver_io.commits_first``). Found by a
mutation review (stop 42): dropping the agent-call clause of ``may_overlap`` passed every test.

The model turn's commit is stalled with the driver's own fault hook (``RAYSAGA_FAULTS``), and the
tool the turn asked for reads the store: it must find the turn's row completed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import raysaga
from raysaga import Workflow
from raysaga.agents import Agent, ScriptedModel, text_reply, tool, tool_reply
from raysaga.state import RunStatus, SqlStore

PROMPT = "probe the store"


@tool
def probe(url: str, run_id: str) -> list[list[Any]]:
    """The run's node rows (node id, index, status) as this tool call sees them in the store."""
    store = SqlStore(url)
    try:
        return [[n.node_id, n.fan_index, str(n.status)] for n in store.nodes(run_id)]
    finally:
        store.close()


def _workflow(url: str, run_id: str) -> Workflow:
    model = ScriptedModel({PROMPT: [tool_reply(("probe", {"url": url, "run_id": run_id})), text_reply("done")]})
    wf = Workflow("turn_durable42", version="1")

    @wf.agent(Agent("researcher", model, system="probe", tools=(probe,), max_turns=3), name="research")
    def research() -> str:
        return PROMPT

    return wf


def test_a_plain_tool_runs_only_after_the_turn_that_asked_for_it_is_durable(
        ray_session: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAYSAGA_FAULTS", "before_commit:research@0=stall:2")  # read by the driver, here
    url, run_id = f"sqlite:///{tmp_path / 'turn.db'}", "turn42"
    record = raysaga.run(_workflow(url, run_id), None, store=url, run_id=run_id, executor="ray")
    assert record.status == RunStatus.COMPLETED, (record.status, record.status_reason, record.error)
    store = SqlStore(url)
    try:
        tool_rows = [n for n in store.nodes(run_id) if n.node_id.startswith("research@0.")]
    finally:
        store.close()
    assert len(tool_rows) == 1, tool_rows
    seen = json.loads(tool_rows[0].output["content"])  # the tool's result, as the model got it
    turn = [row for row in seen if row[0] == "research@0"]
    assert turn and turn[0][2].lower().endswith("completed"), (
        f"the tool ran while the model turn that asked for it was not durable: it saw {seen}")
