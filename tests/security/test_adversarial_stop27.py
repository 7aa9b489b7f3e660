"""Second adversarial round, secrets: an API key a model or a tool *says* reached the store.

Errors, events and reasons were scrubbed, but an agent's turns and tool results are outputs,
stored as they came: a model that echoed the process's ``ANTHROPIC_API_KEY`` into a tool's
arguments or its final answer (it read it in a tool result, say a config file a tool returned),
or a tool whose result held it, put the key in ``raysaga_nodes`` (the turn's response, the tool
call's result) and in the run's output (DESIGN invariant 7: API keys never reach the store).

Now the known secret *values* (secret-named environment variables', registered ones) are
replaced by the marker in a model's response and in a tool's result inside their task, before
the driver persists them: the tool is called with what is stored, so a resume sees the same turn.
Words that merely look like a token are left alone in a conversation (no pattern is applied).
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from sqlalchemy import select

import raysaga
from raysaga import RunStatus, Workflow
from raysaga.agents import Agent, ModelResponse, ScriptedModel, Usage, text_reply, tool
from raysaga.orchestrator import Driver, InlineExecutor
from raysaga.state import SqlStore
from raysaga.state.redact import MARKER
from raysaga.state.schema import metadata

received_queries: list[str] = []


@tool
def lookup(query: str) -> str:
    """Look a customer up."""
    received_queries.append(query)
    return f"customer for {query}"


@tool
def read_config(name: str) -> dict[str, str]:
    """Read a configuration file (it holds the key: the model now knows it)."""
    import os

    return {"file": name, "anthropic_key_line": f"key {os.environ['ANTHROPIC_API_KEY']} (prod)"}


def _turn(*blocks: dict[str, Any], stop: str = "tool_use") -> ModelResponse:
    return ModelResponse(content=list(blocks), stop_reason=stop, usage=Usage(input_tokens=5, output_tokens=5),
                         model="scripted")


def _use(name: str, args: dict[str, Any], k: int) -> dict[str, Any]:
    return {"type": "tool_use", "id": f"toolu_{k}", "name": name, "input": args}


def _rows_holding(url: str, text: str) -> list[str]:
    """Every row of every raysaga table, as text, that holds ``text``."""
    store = SqlStore(url)
    try:
        found = []
        with store.engine.connect() as conn:
            for table in metadata.sorted_tables:
                for row in conn.execute(select(table)).all():
                    shown = " ".join(c.decode("utf-8", "replace") if isinstance(c, bytes) else str(c) for c in row)
                    if text in shown:
                        found.append(f"{table.name}: {shown[:200]}")
        return found
    finally:
        store.close()


@pytest.fixture
def api_key(monkeypatch: pytest.MonkeyPatch) -> str:
    key = f"sk-ant-api03-{uuid.uuid4().hex}{uuid.uuid4().hex}"
    monkeypatch.setenv("ANTHROPIC_API_KEY", key)
    received_queries.clear()
    return key


def _drive(store_url: str, script: list[ModelResponse]) -> Any:
    agent = Agent(name="support", model=ScriptedModel(default=tuple(script)), tools=(lookup, read_config), max_turns=6)
    wf = Workflow("stop27_keys")

    @wf.agent(agent)
    def answer(input: str) -> str:
        return input

    store = SqlStore(store_url)
    try:
        run_id = raysaga.create_run(wf, "who is the customer?", store=store).run_id
        return Driver(wf, store, InlineExecutor(), run_id).drive()
    finally:
        store.close()


def test_a_key_a_model_echoes_into_tool_arguments_and_its_answer_is_never_stored(store_url: str,
                                                                                api_key: str) -> None:
    script = [_turn(_use("read_config", {"name": "prod.env"}, 0)),
              _turn(_use("lookup", {"query": f"account with key {api_key}"}, 1)),
              text_reply(f"Done. By the way the key is {api_key}.")]
    final = _drive(store_url, script)
    assert final.status == RunStatus.COMPLETED
    assert _rows_holding(store_url, api_key) == []
    # stop 41: a tool never runs with arguments the scrub rewrote ("account with key [redacted]"):
    # the call is stored with its input replaced and answered as not run (resumed: the same)
    assert received_queries == [], "the tool is not called with arguments a scrub changed"
    assert final.output == {"answer": f"Done. By the way the key is {MARKER}."}


def test_words_that_only_look_like_a_token_are_left_in_the_conversation(store_url: str, api_key: str) -> None:
    lookalike = "sk-ant-" + "x" * 30  # not this process's key: the model's words stay as they are
    final = _drive(store_url, [_turn(_use("lookup", {"query": lookalike}, 0)), text_reply(f"found {lookalike}")])
    assert final.status == RunStatus.COMPLETED
    assert received_queries == [lookalike]
    assert final.output == {"answer": f"found {lookalike}"}
