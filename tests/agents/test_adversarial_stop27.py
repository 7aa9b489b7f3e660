"""Second adversarial round, agents: final answers the loop took wrongly, or could not take.

- A final answer whose JSON holds ``NaN``/``Infinity`` (models do write them) or is nested deeper
  than the JSON parser recurses raised ``NotJSONableError`` / ``RecursionError`` out of the
  driver (``final_answer_problem`` caught only ``ValueError`` and ``ValidationError``): the run
  stayed ``running``, and every resume read the same persisted answer and crashed again. Now it
  is fed back to the model like any answer that does not fit the output type.
- ``stop_reason: "refusal"`` (the model declined) was taken as the final answer: the node
  completed with the refusal's text as its output (or, with an output type, with whatever JSON
  the text held). Now the node fails, ``ModelRefused``, quoting it.
- ``stop_reason: "pause_turn"`` (the API paused a long turn for the caller to continue) and
  ``"model_context_window_exceeded"`` (cut off) were taken as final answers too: the node
  completed with half an answer. Now the model is asked to go on, as after ``max_tokens``.
- A model call's ``Usage`` took any int: a count beyond 64 bits crashed the driver's commit, a
  negative one lowered the run's spend (budgets never stopped it). Now ``0 <= n <= 2**40`` per
  field, else the call fails (``ModelCallFailed``) like any answer raysaga cannot use.
- A model's own ``cost()`` that raised or returned None crashed the driver; NaN, inf or a
  negative amount made ``cost_used`` nonsense. Now the agent node fails, ``ModelCostFailed``.
- A shared-memory key is the model's text: on PostgreSQL one longer than its column (200) or with
  NUL crashed the driver. Now the model is answered that the key is not valid.
"""

from __future__ import annotations

import math
import re
from typing import Any

import pytest
from pydantic import BaseModel

import raysaga
from raysaga import RunOptions, RunStatus, Workflow
from raysaga.agents import Agent, ModelResponse, ScriptedModel, Usage, text_reply
from raysaga.orchestrator import Driver, InlineExecutor
from raysaga.state import RunRecord, SqlStore


class Total(BaseModel):
    total: int


def _reply(text: str, stop: str) -> ModelResponse:
    return ModelResponse(content=[{"type": "text", "text": text}], stop_reason=stop,
                         usage=Usage(input_tokens=5, output_tokens=5), model="scripted")


def _drive(store_url: str, script: list[ModelResponse], output_type: type[BaseModel] | None) -> tuple[RunRecord, Any]:
    """One run of an agent answering with ``script``; the run as ``drive`` left it, and the agent's row."""
    agent = Agent(name="adder", model=ScriptedModel(default=tuple(script)), tools=(), max_turns=4,
                  output_type=output_type)
    wf = Workflow("stop27_answers")

    @wf.agent(agent)
    def solve(input: str) -> str:
        return input

    store = SqlStore(store_url)
    try:
        run_id = raysaga.create_run(wf, "add 1 and 2", store=store).run_id
        final = Driver(wf, store, InlineExecutor(), run_id).drive()  # must return, whatever the model said
        (node,) = [n for n in store.nodes(run_id) if n.node_id == "solve"]
        return final, node
    finally:
        store.close()


UNREADABLE = {
    "nan": '{"total": NaN}',
    "infinity": '{"total": -Infinity}',
    "too-deep": "[" * 100_000 + "]" * 100_000,
    "too-deep-field": '{"total": ' + "[" * 100_000 + "]" * 100_000 + "}",
}


@pytest.mark.parametrize("answer", UNREADABLE.values(), ids=list(UNREADABLE))
def test_an_answer_json_cannot_hold_is_fed_back_not_raised(store_url: str, answer: str) -> None:
    final, _ = _drive(store_url, [text_reply(answer), text_reply('{"total": 3}')], Total)
    assert final.status == RunStatus.COMPLETED
    assert final.output == {"solve": {"total": 3}}


def test_an_answer_json_cannot_hold_fails_the_node_after_the_retries(store_url: str) -> None:
    final, node = _drive(store_url, [text_reply('{"total": NaN}')], Total)
    assert final.status == RunStatus.FAILED
    assert node.error["type"] == "InvalidOutput"
    assert "NaN" in node.error["message"] or "nan" in node.error["message"]


@pytest.mark.parametrize("output_type", [None, Total], ids=["text", "typed"])
def test_a_refusal_fails_the_node_instead_of_being_its_answer(store_url: str,
                                                             output_type: type[BaseModel] | None) -> None:
    final, node = _drive(store_url, [_reply('I cannot help with that. {"total": 0}', "refusal")], output_type)
    assert final.status == RunStatus.FAILED
    assert final.output is None
    assert node.error["type"] == "ModelRefused"
    assert "declined to answer" in node.error["message"] and "I cannot help with that" in node.error["message"]


@pytest.mark.parametrize("stop", ["pause_turn", "model_context_window_exceeded"])
def test_a_paused_or_cut_off_reply_is_continued_not_taken_as_the_answer(store_url: str, stop: str) -> None:
    final, _ = _drive(store_url, [_reply("Let me look that", stop), text_reply("The total is 3.")], None)
    assert final.status == RunStatus.COMPLETED
    assert final.output == {"solve": "The total is 3."}


def test_pauses_are_not_counted_as_bad_answers(store_url: str) -> None:
    """A long server-tool turn may pause more often than ``max_output_retries`` (2) allows bad answers."""
    pauses = [_reply(f"step {i}", "pause_turn") for i in range(3)]
    agent_turns = [*pauses, text_reply("done")]
    final, _ = _drive(store_url, agent_turns, None)
    assert final.status == RunStatus.COMPLETED
    assert final.output == {"solve": "done"}


class GarbageUsageModel:
    """A backend (or a proxy in front of one) reporting token counts no real call has."""

    name = "garbage-usage"

    def __init__(self, tokens: int) -> None:
        self.tokens = tokens

    def complete(self, request: Any) -> ModelResponse:
        return ModelResponse.model_validate({
            "content": [{"type": "text", "text": "done"}], "stop_reason": "end_turn", "model": self.name,
            "usage": {"input_tokens": self.tokens, "output_tokens": 1}})

    def cost(self, usage: Usage) -> float:
        return 0.0


@pytest.mark.parametrize("tokens", [2**63, 2**70, -1_000_000], ids=["2**63", "2**70", "negative"])
def test_a_token_count_no_real_call_reports_fails_the_call_not_the_driver(store_url: str, tokens: int) -> None:
    """Added up into the run's 64-bit ``tokens_used``, a huge count raised ``OverflowError`` /
    ``DataError`` out of the driver's commit (the run stayed ``running``), and a negative one lowered
    the run's spend below what it paid, so a ``token_budget`` never stopped it."""
    agent = Agent(name="counter", model=GarbageUsageModel(tokens), tools=(), max_turns=2)
    wf = Workflow("stop27_usage")

    @wf.agent(agent)
    def solve(input: str) -> str:
        return input

    store = SqlStore(store_url)
    try:
        run_id = raysaga.create_run(wf, "count", store=store).run_id
        final = Driver(wf, store, InlineExecutor(), run_id).drive()
        assert final.status == RunStatus.FAILED
        assert final.tokens_used == 0
        (node,) = [n for n in store.nodes(run_id) if n.node_id == "solve"]
        assert node.error is not None and node.error["type"] == "ModelCallFailed"
        assert "input_tokens" in node.error["message"]
    finally:
        store.close()


class BadCostModel:
    """A model of one's own whose ``cost()`` is broken."""

    name = "bad-cost"

    def __init__(self, cost: Any) -> None:
        self.price = cost

    def complete(self, request: Any) -> ModelResponse:
        return text_reply("done")

    def cost(self, usage: Usage) -> Any:
        if isinstance(self.price, Exception):
            raise self.price
        return self.price


BAD_COSTS = {"raises": RuntimeError("no price for this model"), "none": None, "str": "0.01",
             "nan": math.nan, "inf": math.inf, "negative": -5.0}


@pytest.mark.parametrize("cost", BAD_COSTS.values(), ids=list(BAD_COSTS))
def test_a_broken_cost_fails_the_agent_node_not_the_driver(store_url: str, cost: Any) -> None:
    """``cost()`` raising or returning None crashed the driver (``TypeError``, the run left
    ``running``, every resume the same); NaN, inf or a negative amount made ``cost_used`` nonsense,
    so a ``cost_budget`` could never stop the run."""
    agent = Agent(name="spender", model=BadCostModel(cost), tools=(), max_turns=2)
    wf = Workflow("stop27_cost")

    @wf.agent(agent)
    def solve(input: str) -> str:
        return input

    store = SqlStore(store_url)
    try:
        run_id = raysaga.create_run(wf, "spend", store=store, options=RunOptions(cost_budget=1.0)).run_id
        final = Driver(wf, store, InlineExecutor(), run_id).drive()
        assert final.status == RunStatus.FAILED
        assert final.cost_used == 0.0 and final.tokens_used == 20  # the answer's tokens are counted
        (node,) = [n for n in store.nodes(run_id) if n.node_id == "solve"]
        assert node.error is not None and node.error["type"] == "ModelCostFailed"
        assert "its model's cost()" in node.error["message"]
    finally:
        store.close()


def _use(name: str, args: dict[str, Any]) -> ModelResponse:
    return ModelResponse(content=[{"type": "tool_use", "id": "toolu_0", "name": name, "input": args}],
                         stop_reason="tool_use", usage=Usage(input_tokens=5, output_tokens=5), model="scripted")


BAD_KEYS = {"long-write": ("memory_write", "k" * 201), "nul-write": ("memory_write", "k\x00ey"),
            "long-read": ("memory_read", "k" * 201), "nul-read": ("memory_read", "\x00"),
            "empty-read": ("memory_read", "")}


@pytest.mark.parametrize(("tool_name", "key"), BAD_KEYS.values(), ids=list(BAD_KEYS))
def test_a_memory_key_no_row_can_hold_is_answered_to_the_model(store_url: str, tool_name: str, key: str) -> None:
    """The key is the model's text and a row's 200-character key: on PostgreSQL a longer one, or
    one with NUL, raised ``DataError`` out of the driver (the run left ``running``, every resume the
    same); on SQLite it was stored. Now the model is told, like any malformed call."""
    args: dict[str, Any] = {"key": key}
    if tool_name == "memory_write":
        args.update(value=1, expected_version=0)
    agent = Agent(name="noter", model=ScriptedModel(default=(_use(tool_name, args), text_reply("done"))),
                  tools=(), max_turns=3, shared_memory=True)
    wf = Workflow("stop27_memory")

    @wf.agent(agent)
    def solve(input: str) -> str:
        return input

    store = SqlStore(store_url)
    try:
        run_id = raysaga.create_run(wf, "note it", store=store).run_id
        final = Driver(wf, store, InlineExecutor(), run_id).drive()
        assert final.status == RunStatus.COMPLETED
        (answer,) = [n.output for n in store.nodes(run_id) if n.node_id == "solve@0.0"]
        assert answer is not None and answer["is_error"] is True
        rule = f"{tool_name}: the 'key' must be 1 to 200 printable characters"
        assert re.fullmatch(re.escape(rule) + r"(, got \d+: .*|: .* holds .*)", answer["content"])
    finally:
        store.close()
