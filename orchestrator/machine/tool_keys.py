"""An agent's effect tool call and its idempotency key: the key, what the ledger already says of
it, and a call whose key another call of its turn went with first.

The turn rules answer a call whose key, from the model's arguments, is that of an earlier call of
its turn (``agents.turns``: one effect per key and turn, the first counts). A human approving a
call may edit its arguments after that check, onto another call's key: the call then went out as
a second effect under one key, its commit overwrote the first call's ledger row, and a rollback
undid it (with its arguments) and never the first. So an approved call is checked again, with the
arguments it would run with, against the calls of its turn that went (admitted, sent, or answered
having run): the first to go counts, whichever the model asked for first.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from raysaga.agents.agent import Agent
from raysaga.agents.tools import Tool, ToolError
from raysaga.agents.turns import Conversation, RunTool, ran_unstored, tool_of
from raysaga.node_key import NodeKey
from raysaga.orchestrator.keys import effect_key
from raysaga.orchestrator.machine.agent_limits import RAN_KEY
from raysaga.orchestrator.machine.calls import Calls
from raysaga.state import jsoncodec

__all__ = ["ran_before", "tool_key", "twin_answer", "twin_of"]


def tool_key(run_id: str, sub: NodeKey, tool: Tool, args: dict[str, Any]) -> str | None:
    """The idempotency key of call ``sub`` of ``tool`` (None: it is no effect)."""
    if not tool.effect:
        return None
    return effect_key(run_id, sub.step, sub.fan_index, f"tool:{tool.name}", tool.key_args(args))


def ran_before(calls: Calls, run_id: str, sub: NodeKey, tool: Tool, args: dict[str, Any]) -> dict[str, Any] | None:
    """``turns.ran_unstored`` of the call's key in the ledger: issued, such a call went out
    ``reconciling`` and, with nothing to reconcile it, the function ran a second time."""
    ekey = tool_key(run_id, sub, tool, args)
    if ekey is None:
        return None
    ekey = calls.in_doubt.key_for(sub.node_id, sub.fan_index, f"tool:{tool.name}", ekey, calls.ledger)
    return ran_unstored(tool, *calls.ledger.get(ekey, (None, None)))


def twin_of(agent: Agent, conv: Conversation, calls: Calls, run_id: str, sub: NodeKey, tool: Tool,
            args: dict[str, Any], admitted: Mapping[NodeKey, RunTool],
            sent: Mapping[NodeKey, tuple[Any, dict[str, Any], Any]]) -> int | None:
    """The call of ``sub``'s turn that went first with the key ``args`` give call ``sub`` (None:
    there is none, or ``tool`` is no effect). ``admitted``: calls waiting on their breaker;
    ``sent``: calls issued (their kwargs hold ``args``)."""
    mine = tool_key(run_id, sub, tool, args)
    if mine is None:
        return None
    for other, went in _went(agent, conv, sub, tool, admitted, sent):
        if tool_key(run_id, other, tool, went) == mine:
            return other.call
    assert sub.turn is not None
    response = conv.turns[sub.turn].response
    for k in range(len(response.tool_uses()) if response is not None else 0):
        other = sub.owner.with_turn(sub.turn, k)  # after a crash: a call the ledger says took effect, or
        if k != sub.call and calls.in_doubt.took.get((other.node_id, other.fan_index)) == mine:  # may have
            return k
    return None


def _went(agent: Agent, conv: Conversation, sub: NodeKey, tool: Tool, admitted: Mapping[NodeKey, RunTool],
          sent: Mapping[NodeKey, tuple[Any, dict[str, Any], Any]]) -> Iterator[tuple[NodeKey, dict[str, Any]]]:
    """The other calls of ``tool`` in ``sub``'s turn that went, each with the arguments it went with."""
    assert sub.turn is not None
    t = sub.turn

    def sibling(other: NodeKey) -> bool:
        if other.turn != t or other.call is None or other.call == sub.call:
            return False
        named = tool_of(agent, conv, t, other.call)
        return named is not None and named.name == tool.name

    for other, action in admitted.items():
        if sibling(other):
            yield other, action.args
    for other, (_, kwargs, _) in sent.items():
        if sibling(other) and isinstance(kwargs.get("args"), dict):
            yield other, kwargs["args"]
    response = conv.turns[t].response if t < len(conv.turns) else None
    uses = response.tool_uses() if response is not None else []
    for k, result in conv.turns[t].results.items() if t < len(conv.turns) else ():
        other = sub.with_turn(t, k)
        if not sibling(other) or not isinstance(result, dict) or result.get("is_error"):
            continue  # (an error answer ran nothing; one that took effect unstored: ``ran_before``)
        ran = result.get(RAN_KEY)  # a call a human edited ran with these
        if isinstance(ran, dict) and isinstance(ran.get("args"), dict):
            yield other, ran["args"]
            continue
        try:
            yield other, tool.validate(uses[k].get("input"))
        except ToolError:
            continue


def twin_answer(tool: Tool, other: int, args: dict[str, Any], asked: dict[str, Any]) -> dict[str, Any]:
    """What the model is told of a call not run for ``twin_of`` (``args``: those it was approved
    with; ``asked``: the model's), like a twin the turn rules answer: an error, the first counts."""
    what = "/".join(tool.key) if tool.key else "arguments"
    edited = "" if args == asked else \
        f" (a human approved it with its arguments edited to {jsoncodec.dumps(args, 'arguments')})"
    return {"content": f"not run: this {tool.name} call{edited} has the same {what} as {tool.name} call {other} of "
                       "this turn, which went first and is the one that counts", "is_error": True}
