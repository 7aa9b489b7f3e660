"""An agent's turn rules, pure: given its conversation so far, what happens next.

The conversation (``Conversation``: the prompt and the durable turns) is rebuilt from the store
on every resume, so these rules see exactly what the crashed driver saw and decide the same.
They never call anything: the engine (``raysaga.orchestrator.machine``) turns the actions into
model calls, tool calls, writes and a node outcome.

    model turn t unanswered   → CallModel(t)       (or Fail: max turns; or BudgetStop)
    t answered with tool uses → per unanswered use: RunTool, UseMemory, or Answer (a refusal
                                the engine records itself: unknown tool, invalid input, a loop,
                                a reply cut off by max_tokens: none of its calls runs)
    every use answered        → turn t+1
    t answered without tools  → Finish(output), or feedback and turn t+1, or Fail (no valid answer)
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from raysaga.agents.agent import (
    MEMORY_TOOLS,
    REFUSAL,
    Agent,
    Turn,
    final_answer_problem,
    final_output,
    fingerprint,
    messages_for,
)
from raysaga.agents.memory_calls import SHOWN_CAP, memory_problem, memory_result, too_big_to_read
from raysaga.agents.messages import ModelRequest, ModelResponse
from raysaga.agents.runtime import INVALID_INPUT
from raysaga.agents.tools import Tool, ToolError
from raysaga.state import EffectStatus, jsoncodec
from raysaga.state.redact import scrub_text

__all__ = [
    "Action", "Answer", "CallModel", "Conversation", "Fail", "Feedback", "Finish", "Pause", "RunTool",
    "UseMemory", "memory_result", "model_failure", "next_actions", "ran_unstored", "record_tool_failure", "tool_of",
]


@dataclass
class Conversation:
    """An agent node's durable state: its prompt and turns (model responses, tool results)."""

    prompt: str
    turns: list[Turn] = field(default_factory=list)

    def request(self, agent: Agent, t: int) -> dict[str, Any]:
        """The Messages API request of turn ``t`` (JSON, as the model call's input)."""
        return ModelRequest(model=agent.model.name, system=agent.system, tools=agent.tool_definitions(),
                            messages=messages_for(self.prompt, self.turns[:t], agent.output_type,
                                                  agent.max_tool_result_chars),
                            max_tokens=agent.request_max_tokens()).model_dump(mode="json")

    def put(self, turn: int, call: int | None, value: Any) -> None:
        """A durable answer: the model's response (``call`` None) or a tool call's result."""
        while len(self.turns) <= turn:
            self.turns.append(Turn())
        if call is None:
            self.turns[turn].response = ModelResponse.model_validate(value)
        else:
            self.turns[turn].results[call] = value


@dataclass(frozen=True)
class CallModel:
    turn: int
    request: dict[str, Any]


@dataclass(frozen=True)
class RunTool:
    """Call ``tool`` with validated ``args`` (the engine checks its circuit breaker first)."""

    turn: int
    call: int
    tool: Tool
    args: dict[str, Any]


@dataclass(frozen=True)
class UseMemory:
    """A shared-memory read or compare-and-set write: the engine asks the store, then ``memory_result``."""

    turn: int
    call: int
    name: str
    args: dict[str, Any]


@dataclass(frozen=True)
class Answer:
    """A tool call answered without a call (already in the conversation): record it as completed."""

    turn: int
    call: int
    result: dict[str, Any]


@dataclass(frozen=True)
class Feedback:
    """The final answer of ``turn`` was refused; the model is told why in the next turn."""

    turn: int
    problem: str


@dataclass(frozen=True)
class Finish:
    output: Any


@dataclass(frozen=True)
class Fail:
    kind: str
    message: str

    def error(self) -> dict[str, Any]:
        return {"type": self.kind, "message": self.message, "transient": False}


@dataclass(frozen=True)
class Pause:
    """Pause the whole run for a human (budget spent, or a loop with ``then="pause"``)."""

    reason: str


Action = CallModel | RunTool | UseMemory | Answer | Feedback | Finish | Fail | Pause


def next_actions(agent: Agent, conv: Conversation, *, waiting: set[int], budget_stop: str | None) -> list[Action]:
    """What the conversation calls for now. ``waiting``: tool calls of the last turn already
    under way. Answers decided here are put into ``conv`` at once (later calls of the turn see
    them: a loop warning counts); a node-ending action (Finish, Fail, Pause) comes last."""
    actions: list[Action] = []
    while True:
        if not conv.turns:
            conv.turns.append(Turn())
        t = len(conv.turns) - 1
        turn = conv.turns[t]
        if turn.response is None:
            if t >= agent.max_turns:
                return [*actions, Fail("MaxTurns", f"agent {agent.name!r} did not finish within {t} turns")]
            if budget_stop is not None:
                end: Action = Pause(budget_stop) if agent.on_budget == "pause" else Fail("BudgetExceeded", budget_stop)
                return [*actions, end]
            return [*actions, CallModel(t, conv.request(agent, t))]
        uses = turn.response.tool_uses()
        if not uses:
            final = _final(agent, conv, t)
            actions.append(final)
            if not isinstance(final, Feedback):
                return actions
            conv.turns.append(Turn())
            continue
        if turn.response.stop_reason == REFUSAL:  # no answer, its calls included: none of them runs
            return [*actions, _refused(agent, turn.response)]
        issued = False
        cut = turn.response.stop_reason in CUT_OFF
        for k, use in enumerate(uses):
            if k in turn.results or k in waiting:
                continue
            decided = _cut_off(agent, t, k, use, turn.response.stop_reason) if cut \
                else _tool_use(agent, conv, t, k, use, waiting, actions)
            if isinstance(decided, Fail | Pause):
                return [*actions, decided]
            actions.append(decided)
            if isinstance(decided, Answer):
                turn.results[k] = decided.result
            else:
                issued = True
        if issued or waiting:
            return actions
        conv.turns.append(Turn())  # every tool answered: the next turn


#: Stop reasons of a reply none of whose calls is run. One cut off before its end: a ``tool_use``
#: block in it may hold a truncated input (the Messages API sends what was written so far); each
#: call is answered (``_cut_off``). A refusal: no answer, its calls included; the node fails
#: (``ModelRefused``). Speculation reads it too: no call of such a reply runs in its model call.
CUT_OFF = frozenset({"max_tokens", "model_context_window_exceeded", REFUSAL})


def _cut_off(agent: Agent, t: int, k: int, use: dict[str, Any], stop_reason: str | None) -> Answer:
    """A call of a reply that was cut off: answered, never run (an effect tool sent the half-written
    email), with what is wrong with its input if anything. The answer is the call's result,
    durable like any, so a resume decides the same."""
    name = str(use.get("name", "")) or "the tool"
    text = (f"not run: your reply was cut off (stop_reason {stop_reason!r}) before this {name} call was complete, "
            "so its input may be truncated. Ask again with a shorter call (less text before it, smaller arguments).")
    problem = _input_problem(agent, name, use.get("input"))
    return Answer(t, k, {"content": text if problem is None else f"{text} Its input: {problem}", "is_error": True})


def _input_problem(agent: Agent, name: str, args: Any) -> str | None:
    """What is wrong with a call's input (not JSON, an unknown tool, failing the tool's schema), or None."""
    if isinstance(args, dict) and INVALID_INPUT in args:
        return _not_json(name, args)
    if agent.shared_memory and name in MEMORY_TOOLS:
        return memory_problem(name, args)
    tool = agent.tool(name)
    if tool is None:
        return _unknown_tool(agent, name)
    try:
        tool.validate(args)
    except ToolError as exc:
        return exc.message
    return None


def _not_json(name: str, args: dict[str, Any]) -> str:
    return f"your input for {name} was not valid JSON: {args[INVALID_INPUT]}"


def _unknown_tool(agent: Agent, name: str) -> str:
    return f"there is no tool named {name!r}; the tools are {[d['name'] for d in agent.tool_definitions()]}"


def _tool_use(agent: Agent, conv: Conversation, t: int, k: int, use: dict[str, Any], waiting: set[int],
              decided: list[Action]) -> Action:
    name = str(use.get("name", ""))
    args = use.get("input")
    loop = _loop_check(agent, conv, t, k, name, args)
    if isinstance(loop, Fail):
        return loop
    if isinstance(loop, Pause):
        # The call is answered (durable with the pause) with the warning: unanswered, a resume
        # replayed to the same decision and paused again at once, so an operator had no way on.
        # Resumed, the model sees the warning; one more repeat pauses the run again.
        conv.turns[t].results[k] = _loop_answer(agent, name)
        decided.append(Answer(t, k, conv.turns[t].results[k]))
        return loop
    if loop is not None:
        return Answer(t, k, {"content": loop, "is_error": True, "loop": True})
    if isinstance(args, dict) and INVALID_INPUT in args:
        return Answer(t, k, {"content": _not_json(name, args), "is_error": True})
    if agent.shared_memory and name in MEMORY_TOOLS:
        problem = memory_problem(name, args)
        if problem is not None:
            return Answer(t, k, {"content": problem, "is_error": True})
        assert isinstance(args, dict)
        if name == "memory_write":
            try:
                args = {**args, "value": jsoncodec.to_jsonable(args["value"], "value")}
            except Exception as exc:
                return Answer(t, k, {"content": f"memory_write: {exc}", "is_error": True})
            too_big = too_big_to_read(agent, args)
            if too_big is not None:
                return Answer(t, k, {"content": too_big, "is_error": True})
        else:  # the reader's own cap: a value it could not be shown whole is refused, never cut
            args = {**args, SHOWN_CAP: agent.max_tool_result_chars}
        return UseMemory(t, k, name, args)
    tool = agent.tool(name)
    if tool is None:
        return Answer(t, k, {"content": _unknown_tool(agent, name), "is_error": True})
    try:
        valid = tool.validate(args)
    except ToolError as exc:
        return Answer(t, k, {"content": exc.message, "is_error": True})
    if tool.effect and _has_twin(agent, conv, t, k, tool, valid, waiting, decided):
        # One call per key at a time. Two calls of one turn with the same key both went out (the
        # second as a "reconcile" of the first's pending row); the second, a replay or a refusal
        # at the provider, then overwrote the first's committed ledger row: a refusal left the
        # ledger saying "failed" for an effect that took place. The twin is answered here.
        return Answer(t, k, {"content": f"not run: an earlier {tool.name} call of this turn has the same "
                                        f"{'/'.join(tool.key) if tool.key else 'arguments'} and is the one that counts",
                             "is_error": True})
    return RunTool(t, k, tool, valid)


def _has_twin(agent: Agent, conv: Conversation, t: int, k: int, tool: Tool, valid: dict[str, Any],
              waiting: set[int], decided: list[Action]) -> bool:
    """Whether a call of this turn under way (or issued in this round) has the same idempotency key."""
    mine = fingerprint(tool.name, tool.key_args(valid))
    for action in decided:
        if isinstance(action, RunTool) and action.turn == t and action.tool.name == tool.name \
                and fingerprint(tool.name, tool.key_args(action.args)) == mine:
            return True
    response = conv.turns[t].response
    assert response is not None
    uses = response.tool_uses()
    for other in waiting:
        if other == k or other >= len(uses) or str(uses[other].get("name", "")) != tool.name:
            continue
        try:
            if fingerprint(tool.name, tool.key_args(tool.validate(uses[other].get("input")))) == mine:
                return True
        except ToolError:
            continue
    return False


def _loop_answer(agent: Agent, name: str) -> dict[str, Any]:
    return {"content": _loop_message(agent, name), "is_error": True, "loop": True}


def _loop_message(agent: Agent, name: str) -> str:
    policy = agent.loop
    return (f"You are repeating {name} with the same arguments and getting the same result ({policy.repeats} "
            f"times within your last {policy.window} calls); it will not give a different result. Try something "
            "else.")


#: What stands for the result of a call of the turn being decided: its results come in while the
#: turn's calls are decided (or, after a crash, before), so they are not read; it matches any result.
_UNREAD = ""


def _loop_check(agent: Agent, conv: Conversation, t: int, k: int, name: str, args: Any) -> str | Fail | Pause | None:
    """A warning for the model, the node's end (Fail or Pause) on a repeat after a warning, or None.

    A loop is the same call getting the same result: the last ``repeats - 1`` runs of this call
    (tool and arguments) within the window got one result. Results of earlier turns are durable
    before this turn's calls are decided; those of this turn are not read (``_UNREAD``), so a
    resumed driver, which may know more of them, decides exactly as the crashed one did. A warning
    counts only if it was about this call and lies within the window."""
    policy = agent.loop
    mine = fingerprint(name, args)
    history: list[tuple[bool, dict[str, Any] | None]] = []  # this call's? and its result (None: unread)
    for i, turn in enumerate(conv.turns[: t + 1]):
        if turn.response is None:
            break
        for j, use in enumerate(turn.response.tool_uses()):
            if (i, j) == (t, k):
                break
            result = turn.results.get(j)
            if (result or {}).get("unavailable") is True:
                continue  # refused (an open circuit breaker): the call did not run, so it repeats nothing
            if i == t and not (result or {}).get("loop"):
                result = None  # a loop warning of this turn is decided by these rules: read
            history.append((fingerprint(str(use.get("name", "")), use.get("input")) == mine, result))
    stands: dict[int, str | None] = {}  # per warning: the result it stands for (None: a false alarm)

    def runs_before(p: int) -> tuple[list[str], bool]:
        """This call's results in the window before ``p`` (a warning's: what it stands for), and
        whether a warning that stands is among them."""
        prints: list[str] = []
        warned = False
        for q in range(max(0, p - policy.window), p):
            mark, result = history[q]
            if not mark:
                continue
            if (result or {}).get("loop"):
                stood = stands[q]
                if stood is None:
                    continue
                prints.append(stood)
                warned = True
            else:
                prints.append(_result_print(result))
        return prints[-(policy.repeats - 1):], warned

    # A call answered with a warning did not run: it stands for the result it was warned about
    # (else, in a window of repeats - 1, the warning pushed a run out and the loop went on after
    # it), read again now: a warning given on calls of its own turn, whose results then turned out
    # to differ, was a false alarm and stands for nothing: neither a repeat nor the warning.
    for p, (mark, result) in enumerate(history):
        if mark and (result or {}).get("loop"):
            stands[p] = _one_result(runs_before(p)[0], policy.repeats)
    recent, warned = runs_before(len(history))
    if _one_result(recent, policy.repeats) is None:
        return None
    if not warned:
        return _loop_message(agent, name)
    reason = f"loop: agent {agent.name!r} keeps calling {name} with the same arguments and getting the same result"
    return Pause(reason) if policy.then == "pause" else Fail("LoopDetected", reason)


def _one_result(recent: list[str], repeats: int) -> str | None:
    """The one result ``recent`` (the latest runs of a call) got (``_UNREAD`` if none is read yet),
    or None: fewer than ``repeats - 1`` runs, or differing results."""
    read = {r for r in recent if r != _UNREAD}
    if len(recent) < repeats - 1 or len(read) > 1:
        return None
    return next(iter(read), _UNREAD)


def _result_print(result: dict[str, Any] | None) -> str:
    if result is None:
        return _UNREAD
    try:
        return "r:" + jsoncodec.fingerprint(result)
    except Exception:  # not JSON: never the same as another
        return f"r:<{id(result)}>"


def _final(agent: Agent, conv: Conversation, t: int) -> Finish | Fail | Feedback:
    response = conv.turns[t].response
    assert response is not None
    problem = final_answer_problem(response, agent.output_type)
    if problem is None:
        return Finish(final_output(response, agent.output_type))
    if response.stop_reason == REFUSAL:  # not an answer to feed back: the node fails, saying so
        return _refused(agent, response)
    rejected = sum(1 for turn in conv.turns if turn.response is not None and not turn.response.tool_uses()
                   and turn.response.stop_reason != "pause_turn"  # a pause is no bad answer: it goes on
                   and final_answer_problem(turn.response, agent.output_type) is not None)
    if rejected > agent.max_output_retries:
        return Fail("InvalidOutput", f"agent {agent.name!r} gave no acceptable answer after {rejected} tries: "
                                     f"{problem[:300]}")
    return Feedback(t, problem[:300])


def _refused(agent: Agent, response: ModelResponse) -> Fail:
    """The node's end on a refusal: its text quoted, and the calls it asked for, none of which ran."""
    uses = response.tool_uses()
    asked = f" (none of the {len(uses)} tool call(s) it asked for ran)" if uses else ""
    return Fail("ModelRefused", f"agent {agent.name!r}: the model declined to answer (stop_reason "
                                f"'refusal'){asked}: {response.text().strip()[:300]!r}")


def tool_of(agent: Agent, conv: Conversation, t: int, k: int) -> Tool | None:
    """The tool that call ``k`` of turn ``t`` named (None: unknown, or a memory tool)."""
    response = conv.turns[t].response if t < len(conv.turns) else None
    if response is None:
        return None
    uses = response.tool_uses()
    return agent.tool(str(uses[k].get("name", ""))) if k < len(uses) else None


def record_tool_failure(agent: Agent, conv: Conversation, t: int, k: int, error: dict[str, Any]) -> dict[str, Any]:
    """A tool call failed for good: the model is told, as that call's result (and it is kept).

    An effect tool whose function returned a value raysaga could not store (no JSON form, above
    the output cap: ``took_effect`` in its error) did not fail: the model is told it ran, so it
    does not ask for it again as if nothing happened (``ran_unstored`` answers it if it does)."""
    tool = tool_of(agent, conv, t, k)
    name = tool.name if tool is not None else "the tool"
    detail = error.get("reason") or "it failed"
    what = f"{error.get('type')}: {error.get('message', '')}"
    # scrubbed here, in the driver, before it is cut: the worker that ran the tool scrubbed the
    # message of what it knew, not of a value declared secret in the driver (a Secret input's);
    # the model must not be told it, and a resume (which reads the store's scrubbed row) tells the same
    if error.get("took_effect") is True:
        text = scrub_text(f"{name} ran and took effect, but its result could not be stored: do not call it again "
                          f"for the same thing (a call with the same arguments is not run again). Why: {what}")
    else:
        text = scrub_text(f"{name} failed ({detail}): {what}")
    result = {"content": text[:1000], "is_error": True}
    conv.put(t, k, result)
    return result


def ran_unstored(tool: Tool, status: str | None, result: Any) -> dict[str, Any] | None:
    """The answer to a call of effect ``tool`` whose key's ledger row reads ``status``/``result``
    when that key already ran in this agent node and its function returned a value raysaga could
    not store (``took_effect`` in the row's error): it is not run again. None otherwise.
    (``failed``: such a row written before it said ``abandoned``.)"""
    error = result.get("error") if isinstance(result, dict) else None
    if status not in (EffectStatus.ABANDONED, EffectStatus.FAILED) or not isinstance(error, dict) \
            or error.get("took_effect") is not True:
        return None
    what = "/".join(tool.key) if tool.key else "arguments"
    return {"content": f"not run: {tool.name} already ran with the same {what} in this conversation and took "
                       "effect; its result could not be stored. It is not run again.", "is_error": True, "ran": True}


def model_failure(t: int, error: dict[str, Any]) -> Fail:
    """The model call of turn ``t`` failed for good: the node fails.

    Transient: the model could not be reached and the transport retries are spent; permanent:
    the API refused the call (400, 401) or its answer could not be used.
    """
    kind = "ModelUnavailable" if error.get("transient") else "ModelCallFailed"
    said = f"model call for turn {t} failed: {error.get('type')}: {error.get('message', '')}"[:500]
    if not error.get("transient") and TOO_LONG.search(said):  # the conversation overflows the model's context
        said += (" (tool results the model is shown are cut at Agent(max_tool_result_chars=...): lower it, "
                 "or make the tools return less)")
    return Fail(kind, said)


#: How the Messages API (and gateways before it) say a request is over the model's context.
TOO_LONG = re.compile(r"prompt is too long|too many (input )?tokens|context (length|window)", re.IGNORECASE)
