"""An ``async def`` tool is awaited: its body runs, inline and on Ray, from a running event loop too.

Before, ``@tool`` accepted an ``async def`` and ``run_tool`` took its coroutine for the result:
the body never ran, the coroutine was refused as unstorable, and an effect tool's call was
recorded as having taken effect (its key committed, never run again), the model told so. Now its
coroutine runs to its end in the call's attempt (``raysaga.agents.awaiting``): what it returns
is the call's result, a ``ToolError`` it raises is shown to the model, an effect is committed.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

import pytest

import raysaga
from raysaga import Workflow
from raysaga.agents import Agent, ScriptedModel, Tool, ToolError, text_reply, tool, tool_reply
from raysaga.state import EffectStatus, RunRecord, RunStatus, SqlStore


def _tools(log: Path) -> tuple[Tool, Tool]:
    """An async effect tool that writes what it charged to ``log``, and an async lookup that
    answers a missing query with a ``ToolError`` (closures: pickled by value to Ray)."""

    async def charge(amount: int, idempotency_key: str) -> str:
        """Charge an amount."""
        await asyncio.sleep(0)
        with log.open("a") as f:
            f.write(f"CHARGE {amount} {idempotency_key}\n")
        return f"charged {amount}"

    async def lookup(query: str) -> dict[str, str]:
        """Look something up."""
        await asyncio.sleep(0)
        if query == "missing":
            raise ToolError(f"nothing found for {query!r}")
        return {"query": query, "answer": query.upper()}

    return tool(charge, effect=True), tool(lookup)


def _workflow(log: Path) -> Workflow:
    charge, lookup = _tools(log)
    model = ScriptedModel({"q": [
        tool_reply(("charge", {"amount": 5}), ("lookup", {"query": "x"})),
        tool_reply(("lookup", {"query": "missing"})),
        text_reply("done"),
    ]})
    wf = Workflow(f"async_tools_{uuid.uuid4().hex[:8]}")

    @wf.agent(Agent("a", model, tools=(charge, lookup)))
    def ask(input: str) -> str:
        return input

    return wf


@pytest.mark.parametrize("where", ["inline", "inline in a running loop", pytest.param("ray", marks=pytest.mark.ray)])
def test_an_async_tool_runs_and_its_result_is_the_calls(sqlite_url: str, tmp_path: Path, where: str,
                                                        request: pytest.FixtureRequest) -> None:
    log = tmp_path / "charges.log"
    wf = _workflow(log)
    if where == "ray":
        address = request.getfixturevalue("ray_address")
        record = raysaga.run(wf, "q", store=sqlite_url, executor="ray", address=address)
    else:
        def go() -> RunRecord:
            return raysaga.run(wf, "q", store=sqlite_url, executor="inline")

        async def handler() -> RunRecord:
            return go()

        record = asyncio.run(handler()) if where.endswith("loop") else go()
    assert record.status == RunStatus.COMPLETED, (record.status_reason, record.error)

    store = SqlStore(sqlite_url)
    try:
        calls = {n.node_id: n.output for n in store.nodes(record.run_id) if n.node_id.startswith("ask@")}
        effects = [(e.effect_name, e.status, e.result) for e in store.effects(record.run_id)]
    finally:
        store.close()
    results: dict[str, Any] = {node: out for node, out in calls.items() if isinstance(out, dict) and "is_error" in out}
    assert results["ask@0.0"] == {"content": "charged 5", "is_error": False}
    assert results["ask@0.1"]["is_error"] is False
    assert json.loads(results["ask@0.1"]["content"]) == {"query": "x", "answer": "X"}
    assert results["ask@1.0"] == {"content": "nothing found for 'missing'", "is_error": True}

    charged = log.read_text().splitlines()
    assert len(charged) == 1 and charged[0].startswith("CHARGE 5 "), "the body ran, once"
    assert charged[0].split(" ", 2)[2] != "None", "an effect tool gets its idempotency key"
    assert effects == [("tool:charge", EffectStatus.COMMITTED, results["ask@0.0"])]
