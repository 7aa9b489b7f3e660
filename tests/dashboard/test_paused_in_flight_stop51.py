"""A paused run's calls in flight, as every view shows them (stop 51, a review).

A token budget spent mid fan-out pauses the run: the pause cancels the calls in flight, whose
rows stay ``running`` in the store until the run goes on and runs them again (on purpose: an
effect's running row is what says it may have happened). ``raysaga status`` said "5 running",
``--json`` ``node_counts`` and ``--summary`` ``running: 5``, ``--dag`` and the dashboard's DAG
and Gantt ``running`` (its bars growing with the clock) while nothing ran them. They now show
``interrupted``, as in a run no driver drives; the stored rows are left as they are.

A real inline run with a scripted model (the edge this is not about) on a real SQLite file; the
CLI through typer's runner; the dashboard in Debian's chromium.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

import raysaga
from raysaga.state import NodeStatus, RunStatus, SqlStore
from tests.support.browser import require_chromium
from tests.support.cli import invoke
from tests.support.dashboard_serving import serving

if TYPE_CHECKING:
    from playwright.sync_api import Page

RUN = "paused51"
FLOW = '''
from raysaga import Workflow
from raysaga.agents import Agent, tool
from raysaga.agents.models import ScriptedModel, text_reply, tool_reply


@tool
def lookup(q: str) -> str:
    """Look up."""
    return "found " + q


model = ScriptedModel(default=(
    tool_reply(("lookup", {"q": "a"}), input_tokens=1000, output_tokens=500),
    tool_reply(("lookup", {"q": "b"}), input_tokens=1000, output_tokens=500),
    text_reply("done", input_tokens=1000, output_tokens=500),
))
wf = Workflow("paused51")


@wf.step()
def plan(input: int) -> list[str]:
    return [f"q{i}" for i in range(input)]


@wf.agent(Agent("res", model, tools=(lookup,)), map_over="plan")
def research(plan: str) -> str:
    return f"question {plan}"
'''


@pytest.fixture(scope="module")
def paused(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SqlStore, str]]:
    """(the store, its URL) of a run paused by its token budget with 5 agent items recorded running."""
    folder = tmp_path_factory.mktemp("paused51")
    (folder / "paused51_flow.py").write_text(FLOW)
    sys.path.insert(0, str(folder))
    try:
        from paused51_flow import wf  # type: ignore[import-not-found]

        url = f"sqlite:///{folder / 'raysaga.db'}"
        run = raysaga.run(wf, 5, store=url, run_id=RUN, executor="inline",
                          options=raysaga.RunOptions(token_budget=5000, retry_budget=0))
        assert run.status == RunStatus.PAUSED, run.status_reason
        store = SqlStore(url)
        stored = [n.status for n in store.nodes(RUN) if n.node_id == "research" and n.fan_index >= 0]
        assert stored == [NodeStatus.RUNNING] * 5  # as the driver left them: what the views must not say
        yield store, url
        store.close()
    finally:
        sys.path.remove(str(folder))


def test_status_text_json_summary_and_dag_say_interrupted(paused: tuple[SqlStore, str]) -> None:
    _, url = paused
    code, out, err = invoke("status", RUN, "--workflow", "paused51_flow:wf", "--db", url)
    assert code == 0, err
    assert "research[0]  interrupted" in out and "fan-out research: 5 items — 5 interrupted" in out, out
    assert "it runs again when the run goes on" in out, out
    assert not re.search(r"^\S+ +running ", out, re.M) and "running" not in out.split("fan-out research")[1], out
    code, out, err = invoke("status", RUN, "--json", "--db", url)
    doc = json.loads(out)
    assert "running" not in doc["node_counts"] and doc["node_counts"]["interrupted"] == 5, doc["node_counts"]
    assert {n["status"] for n in doc["nodes"] if n["node"].startswith("research[")} == {"interrupted"}
    code, out, err = invoke("status", RUN, "--json", "--summary", "--db", url)
    steps = {s["step"]: s for s in json.loads(out)["steps"]}
    assert steps["research"]["counts"] == {"interrupted": 5}, steps
    code, out, err = invoke("status", RUN, "--dag", "--workflow", "paused51_flow:wf", "--db", url)
    assert code == 0 and "research  interrupted, 5 items" in out, out


def test_the_dashboard_draws_them_interrupted_not_growing(paused: tuple[SqlStore, str], page: Page) -> None:
    require_chromium()
    from playwright.sync_api import expect

    store, _ = paused
    with serving(store) as base:
        page.goto(f"{base}/#/runs/{RUN}")
        expect(page.locator('svg.dag [data-node="research"]')).to_have_attribute("data-state", "interrupted")
        expect(page.locator('svg.gantt [data-node="research[0]"]')).to_have_attribute("data-state", "interrupted")
        expect(page.locator('svg.dag [data-node="plan"]')).to_have_attribute("data-state", "completed")
        expect(page.locator('dt:text-is("retries") + dd')).to_have_text("0 of 0")  # (a budget of 0 was hidden)
        expect(page.locator('dt:text-is("tokens") + dd')).to_have_text("7500 of 5000")
        page.goto(f"{base}/#/")
        expect(page.locator("#runs")).to_be_visible()
        # the filter's times are read as UTC, as the pages show every time: the fields say so
        expect(page.get_by_label("since (UTC)")).to_have_attribute("type", "datetime-local")


def test_an_agent_rows_note_counts_its_calls_as_shown() -> None:
    """The note of an agent step's own row (``3 turns, 2 tool calls (1 running)``) said running too."""
    from raysaga.orchestrator import undriven
    from raysaga.orchestrator.status_agents import AgentCalls

    calls = AgentCalls(turns=3, tool_calls=2, unfinished={"running": 1, "failed": 1})
    assert calls.note() == "3 turns, 2 tool calls (1 failed, 1 running)"
    at_rest = calls.note(lambda s: undriven.shown_state(s, None, "paused"))
    assert at_rest == "3 turns, 2 tool calls (1 failed, 1 interrupted)"
    assert calls.note(lambda s: undriven.shown_state(s, None, "running")) == calls.note()
