"""Whether an agent's tool call owes an undo: one answer for the rollback and for ``raysaga fork``.

The rollback (``machine.rollback``) undoes each call that owes one; ``fork_refusals`` refuses a
fork that would inherit (or make again) a call whose undo its lineage still owes. Both ask
``call_undo``, from the same facts, so a fork is refused exactly for the calls a rollback would
undo (or stop on), never for one it would skip:

- a call that never took effect (``sagas.rollback.effect_time``: answered by the engine, never
  sent) owes nothing;
- its tool is the name its turn's recorded model response asked for, looked up in the agent's
  tools now; a shared-memory read or write (a compare-and-set on the blackboard) is never undone;
- a call of a tool without ``compensate=`` owes nothing;
- a completed call whose result is an error (a ``ToolError``, arguments failing the tool's schema,
  an open breaker, a loop stop, a human's rejection) took no effect: nothing to undo;
- a call whose tool cannot be told (its turn cannot be read, asks for fewer calls, or names a tool
  the agent no longer has) owes an undo that cannot run when the ledger says it took effect (or
  may have): the rollback stops on it (``ToolLost``: ``compensation_failed``, naming it) and a fork
  is refused; with no such ledger row, no effect was made from it (an effect tool's call writes
  its row ``pending`` before it is sent) and it owes nothing;
- likewise a call whose arguments (as it ran: a human's edit, if any) fail the tool's schema as the
  code has it now: with no ledger row saying it took effect it was refused before any call (owes
  nothing); with one, the schema changed since (a deploy), the call is owed and its undo cannot be
  called with those arguments (``ToolLost``, saying why), never skipped as if nothing happened.

"Took effect" is read from every ledger row of the call: the run's own and, for a call the run
inherited (a fork's), the row of the run that executed it (``Store.inherited_effects``).

Pure: the caller reads the rows, the turn and the ledger; this only decides.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from raysaga.agents.agent import MEMORY_TOOLS, Agent
from raysaga.agents.messages import ModelResponse
from raysaga.agents.tools import Tool, ToolError, tool_output
from raysaga.orchestrator.machine.agent_limits import RAN_KEY
from raysaga.sagas.rollback import effect_time
from raysaga.state import NodeRecord, NodeStatus

__all__ = ["ToolLost", "ToolUndo", "call_undo", "can_owe", "turn_uses"]


@dataclass(frozen=True)
class ToolUndo:
    """The call owes an undo: ``tool``'s compensation, called with ``args`` (the call's, as it ran)
    and ``output`` (its result as the tool returned it; None when its outcome is unknown)."""

    tool: Tool
    args: dict[str, Any]
    output: Any
    finished_at: float
    """When it took effect, to order the undos (``inf``: its outcome is unknown)."""


@dataclass(frozen=True)
class ToolLost:
    """The call took effect (its ledger says so) but its undo cannot be called: which tool it made
    cannot be found (``name``: what its turn asked for, "" when the turn cannot be read), or, when
    ``why`` says so, its arguments no longer fit that tool's schema."""

    name: str
    finished_at: float
    why: str = ""
    """Empty: the tool is unknown; else why the known tool's undo cannot be called."""


def call_undo(agent: Agent, use: Mapping[str, Any] | None, row: NodeRecord, result: Callable[[], Any], *,
              took: bool, approved: Mapping[str, Any] | None = None) -> ToolUndo | ToolLost | None:
    """What the rollback owes for the agent's tool call ``row`` (None: nothing).

    Args:
        agent: the agent of the call's step, as the code has it now.
        use: the ``tool_use`` block the call's turn asked for (its recorded model response), or
            None when it cannot be read (the turn did not complete, its output is not a model
            response, or it asked for fewer calls).
        row: the call's node row.
        result: the call's recorded result (a completed row's output); called only when needed.
        took: whether a ledger row of this call (the run's own, or the one of the run it was
            inherited from) says it took effect or may have (``machine.doubt.InDoubt.took``).
        approved: the arguments a human approved the call with, when its outcome is unknown.
    """
    finished = effect_time(row)
    if finished is None or not can_owe(agent, took):
        return None  # it took no effect, or nothing it could have called has an undo
    use = use if use is not None else {}  # (unread: no name, so no tool)
    name = str(use.get("name", ""))
    if agent.shared_memory and name in MEMORY_TOOLS:
        return None  # the blackboard's compare-and-set: never undone
    tool = agent.tool(name)
    if tool is None:  # which tool it made is unknown: whether it had an undo is too
        return ToolLost(name, finished) if took else None
    if tool.compensate is None:
        return None
    ran: Any = approved
    output = None
    if row.status == NodeStatus.COMPLETED:
        recorded = result()
        if not isinstance(recorded, dict):  # not a tool result (damaged, or written by another program)
            return ToolLost(name, finished, "its recorded result is not a tool result, so its undo has no "
                                            "output to read") if took else None
        if recorded.get("is_error"):
            return None  # answered without an effect: an error, a refusal, a breaker, a loop stop
        edited = recorded.get(RAN_KEY)  # a call a human edited: the model read another text
        if isinstance(edited, dict):
            ran, recorded = edited.get("args"), {"content": edited.get("content")}
        output = tool_output(recorded)
    try:
        args = tool.validate(use.get("input") if ran is None else ran)
    except ToolError as exc:
        if not took:
            return None  # refused before any call: no ledger row says it ran
        # it ran (the ledger says so) with arguments the schema took then: the schema changed since
        return ToolLost(name, finished, f"the arguments it ran with no longer fit the tool's schema "
                                        f"({str(exc)[:300]})")
    return ToolUndo(tool, args, output, finished)


def can_owe(agent: Agent, took: bool) -> bool:
    """Whether a call of ``agent`` may owe anything (``call_undo`` asks first): one of its tools has
    an undo, or the ledger says the call took effect. False: none does, whatever its turn says, so
    a caller need not read the turn."""
    return took or any(t.compensate is not None for t in agent.tools)


def turn_uses(output: Any) -> list[dict[str, Any]] | None:
    """The ``tool_use`` blocks of a turn's recorded output (its model response), in call order;
    None when it is not a model response (``call_undo`` then reads its calls as unreadable)."""
    try:
        return ModelResponse.model_validate(output).tool_uses()
    except ValidationError:
        return None
