"""Data path review (stop 42), agents: a pydantic alias (a camelCase API's fields) broke two paths.

* A tool whose parameter is a model with an alias showed the model the schema by alias, the model
  sent exactly that, and the arguments were stored by field name (``model_dump(mode="json")``)
  then re-validated by alias for the call: "invalid arguments for lookup: order.orderId: Field
  required", though the model had done what it was asked.
* An agent's ``output_type`` with an alias: the node completed, its answer stored by field name,
  and the next step, reading the type by alias, failed.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

import raysaga
from raysaga import RunStatus, Workflow
from raysaga.agents import Agent, tool
from raysaga.testing import ScriptedModel, text_reply, tool_reply


class Order(BaseModel):
    order_id: str = Field(alias="orderId")


class Plan(BaseModel):
    sub_questions: list[str] = Field(alias="subQuestions")


def test_a_tool_taking_an_aliased_model_is_called_with_what_the_model_sent(sqlite_url: str) -> None:
    called: list[str] = []

    @tool
    def lookup(order: Order) -> dict[str, str]:
        """Look up an order."""
        called.append(order.order_id)
        return {"found": order.order_id}

    assert "orderId" in lookup.definition()["input_schema"]["$defs"]["Order"]["properties"]
    model = ScriptedModel({"go": [tool_reply(("lookup", {"order": {"orderId": "o-1"}})), text_reply("done")]})
    wf = Workflow("stop42_tool_alias")

    @wf.agent(Agent("a", model, tools=(lookup,)))
    def ask(input: Any) -> str:
        return "go"

    record = raysaga.run(wf, {}, store=sqlite_url, executor="inline")
    assert record.status == RunStatus.COMPLETED, record.status_reason
    assert called == ["o-1"]
    store = raysaga.open_store(sqlite_url)
    try:
        results = [n.output for n in store.nodes(record.run_id) if n.node_id == "ask@0.0"]
    finally:
        store.close()
    assert results == [{"content": '{"found":"o-1"}', "is_error": False}]


def test_an_agent_output_type_with_an_alias_reaches_the_next_step(sqlite_url: str) -> None:
    model = ScriptedModel({"plan it": [text_reply('{"subQuestions": ["a", "b"]}')]})
    wf = Workflow("stop42_agent_output_alias")

    @wf.agent(Agent("planner", model, output_type=Plan))
    def plan_it(input: Any) -> str:
        return "plan it"

    @wf.step()
    def plan(plan_it: Plan) -> list[str]:
        return plan_it.sub_questions

    record = raysaga.run(wf, {}, store=sqlite_url, executor="inline")
    assert record.status == RunStatus.COMPLETED, record.status_reason
    assert record.output == {"plan": ["a", "b"]}
