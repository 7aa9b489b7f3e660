"""The agent's turn rules on their own (``raysaga.agents.turns``): no driver, store, Ray or model.

Each test builds a conversation by hand and checks what the rules decide next.
"""

from __future__ import annotations

from typing import Any

from raysaga.agents.agent import Agent, LoopPolicy, Turn
from raysaga.agents.models import ScriptedModel, text_reply, tool_reply
from raysaga.agents.tools import tool
from raysaga.agents.turns import (
    Answer,
    CallModel,
    Conversation,
    Fail,
    Feedback,
    Finish,
    Pause,
    RunTool,
    UseMemory,
    next_actions,
    record_tool_failure,
)


@tool
def search(query: str) -> str:
    """Search."""
    return query


@tool(effect=True, key=["order"])
def pay(order: str, amount: int) -> str:
    """Pay an order."""
    return order


def agent(**kw: Any) -> Agent:
    return Agent(name="helper", model=ScriptedModel({}), tools=(search, pay), **kw)


def conv(*responses: Any, results: dict[int, dict[int, Any]] | None = None) -> Conversation:
    c = Conversation("do it")
    for t, response in enumerate(responses):
        c.turns.append(Turn(response=response, results=dict((results or {}).get(t, {}))))
    return c


def test_an_empty_conversation_asks_the_model_for_turn_0() -> None:
    actions = next_actions(agent(), Conversation("do it"), waiting=set(), budget_stop=None)
    assert len(actions) == 1 and isinstance(actions[0], CallModel) and actions[0].turn == 0
    assert actions[0].request["messages"] == [{"role": "user", "content": "do it"}]


def test_tool_uses_become_calls_and_a_final_answer_finishes() -> None:
    c = conv(tool_reply(("search", {"query": "x"}), ("search", {"query": "y"})))
    actions = next_actions(agent(), c, waiting=set(), budget_stop=None)
    assert [(type(a), a.call) for a in actions if isinstance(a, RunTool)] == [(RunTool, 0), (RunTool, 1)]
    c.put(0, 0, {"content": "x!", "is_error": False})
    c.put(0, 1, {"content": "y!", "is_error": False})
    nxt = next_actions(agent(), c, waiting=set(), budget_stop=None)
    assert isinstance(nxt[0], CallModel) and nxt[0].turn == 1
    c.put(1, None, text_reply("done").model_dump(mode="json"))
    assert next_actions(agent(), c, waiting=set(), budget_stop=None) == [Finish("done")]


def test_unknown_tool_and_invalid_arguments_are_answered_without_a_call() -> None:
    c = conv(tool_reply(("nope", {}), ("search", {"query": []})))
    actions = next_actions(agent(), c, waiting=set(), budget_stop=None)
    answers = [a for a in actions if isinstance(a, Answer)]
    assert [a.call for a in answers] == [0, 1]
    assert "no tool named 'nope'" in answers[0].result["content"]
    assert answers[1].result["is_error"] is True
    assert isinstance(actions[-1], CallModel) and actions[-1].turn == 1  # both answered: next turn


def test_two_effect_calls_with_one_key_in_a_turn_run_once() -> None:
    c = conv(tool_reply(("pay", {"order": "o1", "amount": 5}), ("pay", {"order": "o1", "amount": 7})))
    actions = next_actions(agent(), c, waiting=set(), budget_stop=None)
    assert isinstance(actions[0], RunTool) and actions[0].call == 0
    assert isinstance(actions[1], Answer) and "not run" in actions[1].result["content"]


def test_a_spent_budget_pauses_or_fails_as_the_agent_says() -> None:
    assert next_actions(agent(), Conversation("x"), waiting=set(), budget_stop="budget: 9 of 5") == [
        Pause("budget: 9 of 5")]
    failed = next_actions(agent(on_budget="fail"), Conversation("x"), waiting=set(), budget_stop="b")
    assert failed == [Fail("BudgetExceeded", "b")]


def test_max_turns_fails_the_node() -> None:
    c = conv(tool_reply(("search", {"query": "x"})), results={0: {0: {"content": "r", "is_error": False}}})
    actions = next_actions(agent(max_turns=1), c, waiting=set(), budget_stop=None)
    assert len(actions) == 1 and isinstance(actions[0], Fail) and actions[0].kind == "MaxTurns"


def test_a_loop_is_warned_once_then_ends_the_node() -> None:
    same = ("search", {"query": "x"})
    policy = LoopPolicy(window=6, repeats=2, then="fail")
    c = conv(tool_reply(same), results={0: {0: {"content": "r", "is_error": False}}})
    c.turns.append(Turn(response=tool_reply(same)))
    warned = next_actions(agent(loop=policy), c, waiting=set(), budget_stop=None)
    assert isinstance(warned[0], Answer) and warned[0].result.get("loop") is True
    assert isinstance(warned[1], CallModel) and warned[1].turn == 2
    c.put(2, None, tool_reply(same).model_dump(mode="json"))
    ended = next_actions(agent(loop=policy), c, waiting=set(), budget_stop=None)
    assert isinstance(ended[-1], Fail) and ended[-1].kind == "LoopDetected"
    paused = conv(*[t.response for t in c.turns], results={0: c.turns[0].results, 1: c.turns[1].results})
    actions = next_actions(agent(loop=LoopPolicy(window=6, repeats=2, then="pause")), paused, waiting=set(),
                           budget_stop=None)
    assert isinstance(actions[-2], Answer) and isinstance(actions[-1], Pause)
    assert paused.turns[2].results[0]["loop"] is True  # answered, so a resume does not pause again at once


def test_an_invalid_final_answer_is_fed_back_then_fails() -> None:
    c = conv(text_reply(""))
    actions = next_actions(agent(max_output_retries=1), c, waiting=set(), budget_stop=None)
    assert isinstance(actions[0], Feedback) and isinstance(actions[1], CallModel) and actions[1].turn == 1
    c.put(1, None, text_reply("").model_dump(mode="json"))
    ended = next_actions(agent(max_output_retries=1), c, waiting=set(), budget_stop=None)
    assert isinstance(ended[-1], Fail) and ended[-1].kind == "InvalidOutput"


def test_shared_memory_calls_are_handed_to_the_engine() -> None:
    c = conv(tool_reply(("memory_write", {"key": "k", "value": [1], "expected_version": 0}),
                        ("memory_read", {"key": 5})))
    actions = next_actions(agent(shared_memory=True), c, waiting=set(), budget_stop=None)
    assert isinstance(actions[0], UseMemory) and actions[0].name == "memory_write"
    assert isinstance(actions[1], Answer) and "needs a string 'key'" in actions[1].result["content"]


def test_a_failed_tool_call_is_told_to_the_model() -> None:
    c = conv(tool_reply(("search", {"query": "x"})))
    result = record_tool_failure(agent(), c, 0, 0, {"type": "Timeout", "message": "slow", "reason": "3 attempts"})
    assert result["is_error"] and "search failed (3 attempts): Timeout: slow" in result["content"]
    assert c.turns[0].results[0] == result
