"""``machine.undo_targets.call_undo``: which agent tool call owes an undo, the one rule the
rollback and the fork refusal both follow (tests/orchestrator/test_undo_targets_stop49.py runs
them). Each case from a call row as the store keeps it."""

from __future__ import annotations

import math
from typing import Any, NoReturn

import pytest

from raysaga.agents import Agent, ScriptedModel, tool
from raysaga.orchestrator.machine.undo_targets import ToolLost, ToolUndo, call_undo, can_owe, turn_uses
from raysaga.state import NodeRecord, NodeStatus
from raysaga.state.error_record import ErrorRecord


def _undo(output: Any, item: str) -> None:
    return None


@tool(effect=True, compensate=_undo)
def pay(item: str) -> str:
    """Pay for an item."""
    return f"paid {item}"


@tool()
def look(item: str) -> str:
    """Read only."""
    return item


AGENT = Agent("buyer", ScriptedModel({}), tools=(look, pay), shared_memory=True)
PAY = {"type": "tool_use", "id": "t0", "name": "pay", "input": {"item": "book"}}


def _row(status: NodeStatus = NodeStatus.COMPLETED, error: dict[str, Any] | None = None) -> NodeRecord:
    return NodeRecord(run_id="r", node_id="buyer@0.0", status=status, finished_at=12.5,
                      error=ErrorRecord(**error) if error is not None else None)


def _result(value: Any) -> Any:
    return lambda: value


def _unread() -> NoReturn:
    raise AssertionError("the call's result was read though the answer did not need it")


def test_a_call_that_took_effect_owes_the_undo_of_its_tool() -> None:
    undo = call_undo(AGENT, PAY, _row(), _result({"content": '{"id": "p1"}', "is_error": False}), took=True)
    assert undo == ToolUndo(pay, {"item": "book"}, {"id": "p1"}, 12.5)


@pytest.mark.parametrize("result", [{"content": "sold out", "is_error": True},
                                    {"content": "not run: ...", "is_error": True, "loop": True}, "not a dict"])
def test_a_call_answered_with_an_error_owes_nothing(result: Any) -> None:
    assert call_undo(AGENT, PAY, _row(), _result(result), took=False) is None


def test_a_call_whose_arguments_fail_the_tools_schema_owes_nothing() -> None:
    bad = {**PAY, "input": {"colour": "red"}}
    # answered by the engine (an error result), or no ledger row says it ran: never a call that ran
    assert call_undo(AGENT, bad, _row(), _result({"content": "missing item", "is_error": True}), took=False) is None
    assert call_undo(AGENT, bad, _row(NodeStatus.RUNNING), _unread, took=False) is None


@pytest.mark.parametrize("status", [NodeStatus.COMPLETED, NodeStatus.RUNNING])
def test_a_call_that_took_effect_with_arguments_the_schema_no_longer_takes_is_owed_and_lost(
        status: NodeStatus) -> None:
    """The ledger says it ran: the schema took its arguments then, a deploy changed it since. It
    is owed, and its undo cannot be called with them (the rollback stops on it, a fork is refused)."""
    bad = {**PAY, "input": {"colour": "red"}}
    undo = call_undo(AGENT, bad, _row(status), _result({"content": "p1", "is_error": False}), took=True)
    assert isinstance(undo, ToolLost) and (undo.name, undo.finished_at) == \
        ("pay", 12.5 if status == NodeStatus.COMPLETED else math.inf), undo
    assert "no longer fit the tool's schema" in undo.why and "invalid arguments for pay" in undo.why, undo.why


def test_a_call_whose_outcome_is_unknown_is_undone_as_the_latest() -> None:
    undo = call_undo(AGENT, PAY, _row(NodeStatus.CANCELLED), _unread, took=True)
    assert undo == ToolUndo(pay, {"item": "book"}, None, math.inf)
    edited = call_undo(AGENT, PAY, _row(NodeStatus.RUNNING), _unread, took=True, approved={"item": "pen"})
    assert isinstance(edited, ToolUndo) and edited.args == {"item": "pen"}


def test_a_call_a_human_edited_is_undone_as_it_ran() -> None:
    result = {"content": "shown to the model", "is_error": False, "ran": {"args": {"item": "pen"}, "content": "p2"}}
    assert call_undo(AGENT, PAY, _row(), _result(result), took=True) == ToolUndo(pay, {"item": "pen"}, "p2", 12.5)


@pytest.mark.parametrize("took", [True, False])
def test_a_call_whose_turn_cannot_be_read_is_owed_only_if_the_ledger_says_it_took_effect(took: bool) -> None:
    undo = call_undo(AGENT, None, _row(), _unread, took=took)
    assert undo == (ToolLost("", 12.5) if took else None)


@pytest.mark.parametrize("took", [True, False])
def test_a_call_of_a_tool_the_agent_no_longer_has_likewise(took: bool) -> None:
    gone = {**PAY, "name": "refund_all"}
    assert call_undo(AGENT, gone, _row(), _unread, took=took) == (ToolLost("refund_all", 12.5) if took else None)


def test_read_only_and_memory_calls_owe_nothing() -> None:
    assert call_undo(AGENT, {**PAY, "name": "look"}, _row(), _unread, took=False) is None
    write = {"type": "tool_use", "id": "t1", "name": "memory_write", "input": {"key": "k", "value": 1}}
    assert call_undo(AGENT, write, _row(), _unread, took=True) is None  # the blackboard's compare-and-set


def test_a_call_that_never_took_effect_owes_nothing() -> None:
    never_sent = _row(NodeStatus.FAILED, {"type": "Cancelled", "took_effect": False})
    assert call_undo(AGENT, PAY, never_sent, _unread, took=False) is None
    permanent = _row(NodeStatus.FAILED, {"type": "Permanent", "transient": False})
    assert call_undo(AGENT, PAY, permanent, _unread, took=True) is None


def test_a_turn_output_that_is_not_a_model_response_has_no_readable_calls() -> None:
    assert turn_uses({"content": [PAY, {"type": "text", "text": "hi"}]}) == [PAY]
    assert turn_uses({"content": "not a list"}) is None
    assert turn_uses("text") is None


def test_an_agent_with_no_undoable_tool_owes_only_what_the_ledger_says_took_effect() -> None:
    readers = Agent("reader", ScriptedModel({}), tools=(look,))
    assert not can_owe(readers, False) and can_owe(readers, True) and can_owe(AGENT, False)
    gone = {**PAY, "name": "pay"}  # a tool this agent does not have (any more)
    assert call_undo(readers, gone, _row(), _unread, took=False) is None
    assert call_undo(readers, gone, _row(), _unread, took=True) == ToolLost("pay", 12.5)


@pytest.mark.parametrize("result", [None, "paid", ["paid"]])
def test_a_call_that_took_effect_with_a_result_that_is_no_tool_result_is_owed_and_lost(result: Any) -> None:
    """Stop 50 (a review): a committed call whose stored result is not a tool result (damaged, or
    written by another program) was read as answered without an effect: the fork went on and the
    rollback ended ``compensated`` with the payment standing. The ledger says it ran: owed."""
    undo = call_undo(AGENT, PAY, _row(), _result(result), took=True)
    assert isinstance(undo, ToolLost) and undo.name == "pay", undo
    assert "not a tool result" in undo.why, undo.why
    assert call_undo(AGENT, PAY, _row(), _result(result), took=False) is None  # no ledger row: never sent


def test_the_rollback_says_no_code_can_undo_a_call_whose_result_is_no_tool_result() -> None:
    """The rollback's error for that call advised restoring the tool's schema and retrying, which
    cannot get past it (the fork refusal already said to undo it by hand)."""
    from raysaga.node_key import NodeKey
    from raysaga.orchestrator.machine.rollback import missing_tool

    undo = call_undo(AGENT, PAY, _row(), _result("paid"), took=True)
    assert isinstance(undo, ToolLost)
    error = missing_tool(NodeKey.parse("buyer@0.0", -1), undo.name, "rs-k", "r", undo.why)
    assert "undo it by hand" in error["message"] and "schema" not in error["message"], error
    narrowed = call_undo(AGENT, {**PAY, "input": {"colour": "red"}}, _row(), _result({"content": "p1"}), took=True)
    assert isinstance(narrowed, ToolLost)
    error = missing_tool(NodeKey.parse("buyer@0.0", -1), narrowed.name, "rs-k", "r", narrowed.why)
    assert "restore the schema the call was made under" in error["message"], error
