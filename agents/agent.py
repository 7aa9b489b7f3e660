"""An LLM sub-agent: a model, a system prompt, tools, and the rules of its loop.

The loop itself lives in the store, not here: ``Transcript`` rebuilds the conversation from
persisted turns, and ``next_step`` says what the persisted state calls for next. Both are
pure, so a resumed driver reaches exactly the decision the crashed one would have.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from raysaga.agents.messages import ModelResponse
from raysaga.agents.models import Model
from raysaga.agents.tools import Tool, empty_error
from raysaga.errors import InvalidOptionError, WorkflowDefinitionError
from raysaga.state import jsoncodec
from raysaga.state.json_form import model_json, read_back_problem
from raysaga.types import RateLimit, RetryPolicy, check_name, check_number, checked_fields

MEMORY_TOOLS = ("memory_read", "memory_write")
#: ``max_tokens`` of a model call when neither the agent nor its model sets one.
DEFAULT_MAX_TOKENS = 1024
#: What an assistant turn without any non-blank text or other block is sent as: the Messages API
#: refuses an empty content list and an empty or whitespace-only text block (400).
EMPTY_REPLY = "(no reply)"


@checked_fields
@dataclass(frozen=True)
class LoopPolicy:
    """Break a loop: the same tool call (same tool, same arguments) getting the same result
    again and again. A call is a repeat when ``repeats - 1`` earlier calls with its tool and
    arguments lie within the last ``window`` calls and the latest of them (its ``repeats - 1``
    latest runs) all got one result; a call whose result changes (a poll, a read of shared
    memory another agent writes) is no loop. The first time the agent is told; a repeat after
    that warning (one about this very call, within the window) applies ``then``: ``"fail"`` the
    node or ``"pause"`` the run for a human."""

    window: int = 6
    """How many of the latest tool calls are compared (at least ``repeats - 1``)."""
    repeats: int = 3
    """Identical calls with one result within the window that count as a loop (at least 2)."""
    then: str = "fail"
    """``"fail"`` the node, or ``"pause"`` the run for a human, when the loop goes on after the warning."""

    def __post_init__(self) -> None:
        check_number("LoopPolicy", "window", self.window, minimum=1, integer=True, allowed="a whole number >= 1")
        # 1 made every first call a "repeat" of itself: no tool could ever run
        check_number("LoopPolicy", "repeats", self.repeats, minimum=2, integer=True,
                     allowed="a whole number >= 2 (the number of identical calls that make a loop)")
        if self.window < self.repeats - 1:  # the earlier repeats could never fit: it never fired
            raise InvalidOptionError(f"LoopPolicy.window must be at least repeats - 1 = {self.repeats - 1} (the "
                                     f"earlier calls a repeat is compared with), got window={self.window}")
        if self.then not in ("pause", "fail"):
            raise InvalidOptionError(f"LoopPolicy.then must be 'pause' or 'fail', got {self.then!r}")


@checked_fields
@dataclass(frozen=True)
class Agent:
    """An LLM sub-agent: ``Agent("researcher", AnthropicModel("claude-sonnet-4-5"), system=..., tools=(search,))``.

    Put it in a workflow with ``@wf.agent(agent)``. Every field but ``name`` and ``model`` has a
    default; a field of the wrong type or out of range is refused here (``InvalidOptionError``,
    or ``WorkflowDefinitionError`` for the tools), not when the run reaches the node.
    """

    name: str
    model: Model
    system: str = ""
    tools: tuple[Tool, ...] = ()
    max_turns: int = 10
    output_type: type[BaseModel] | None = None
    """The final answer must be JSON for this model; a mismatch is fed back, at most
    ``max_output_retries`` times, then the node fails."""
    max_output_retries: int = 2
    on_budget: str = "pause"
    """When the run's token/cost budget is spent: ``"pause"`` the run or ``"fail"`` the node."""
    loop: LoopPolicy = field(default_factory=LoopPolicy)
    transport_retry: RetryPolicy = field(default_factory=lambda: RetryPolicy(max_attempts=6, base=0.5, cap=20.0))
    """Retries of model calls on 429/529/5xx/timeouts/dropped connections (never shown to the model)."""
    model_timeout: float | None = None
    """Seconds before a model call is abandoned and counted a transient failure."""
    breaker_threshold: int = 5
    """Consecutive failures of a tool's dependency that open its circuit breaker."""
    breaker_cooldown: float = 30.0
    """Seconds an open breaker waits before it lets one probe call through."""
    shared_memory: bool = False
    """Give the agent ``memory_read``/``memory_write`` on the run's blackboard (compare-and-set)."""
    max_tokens: int | None = None
    """The ``max_tokens`` of each model call. None (the default): the model's own
    (``AnthropicModel(max_tokens=...)``), else 1024. Set here, it wins over the model's."""
    rate_limit: RateLimit | None = None
    """The provider's limit its model calls go through, shared by every driver on the store
    (``RateLimit(name="anthropic", requests=50, tokens=40_000)``)."""
    max_tool_result_chars: int | None = 100_000
    """The longest tool result the model is shown, in characters (~25,000 tokens): a longer one
    (a web page, a file) is cut there, with a note telling the model so and how long it was; the
    whole result stays in the store. ``None``: results go to the model whole (one that overflows
    the model's context fails its next call with "prompt is too long"). Shared memory is never cut:
    a ``memory_write`` whose read would be longer is refused, a longer value read is an error."""
    speculative_tools: bool = False
    """Run the tools a model response asks for that change nothing (not ``effect=True``, no
    approval, no rate limit) in the model call's own task, right after the response, and use
    their results if the engine then decides those very calls (docs/agents.md): one round trip
    through the I/O pool per turn instead of two. Such a tool may then run before the response
    is durable, and once more than the agent uses it (after a crash, or a result the engine
    does not take). Off (the default): each tool call is sent once the response is durable."""

    def __post_init__(self) -> None:
        check_name("agent", self.name)
        self._check_options()
        names = [t.name for t in self.tools]
        if len(names) != len(set(names)):
            raise WorkflowDefinitionError(f"agent {self.name!r} has two tools with one name: {names}")
        if self.shared_memory and set(names) & set(MEMORY_TOOLS):
            raise WorkflowDefinitionError(f"agent {self.name!r}: {MEMORY_TOOLS} are reserved for shared memory")
        if self.on_budget not in ("pause", "fail") or self.loop.then not in ("pause", "fail"):
            raise WorkflowDefinitionError(f"agent {self.name!r}: on_budget and loop.then take 'pause' or 'fail'")
        for t in self.tools:  # a Tool made by hand, not by @tool: its schema is checked here, not at the first call
            try:
                t.definition()
            except Exception as exc:  # pydantic's schema errors are of several kinds
                raise WorkflowDefinitionError(f"agent {self.name!r}: tool {t.name!r} cannot be described to a "
                                              f"model as JSON schema: {type(exc).__name__}: {exc}"[:800]) from None

    def request_max_tokens(self) -> int:
        """The ``max_tokens`` of its model calls: its own, else its model's, else 1024 (so a request
        where neither is set is what it always was: a resumed run asks the same)."""
        if self.max_tokens is not None:
            return self.max_tokens
        own = getattr(self.model, "max_tokens", None)
        if isinstance(own, int) and not isinstance(own, bool) and own >= 1:
            return own
        return DEFAULT_MAX_TOKENS

    def _check_options(self) -> None:
        """Refuse a field of the wrong type or range; a list of tools becomes a tuple (kept hashable)."""
        owner = f"Agent({self.name!r})"
        if not isinstance(self.model, Model):
            raise InvalidOptionError(f"{owner}.model must be a model backend (AnthropicModel(...), ScriptedModel(...) "
                                     f"or your own raysaga.agents.Model), got {self.model!r}")
        if not isinstance(self.system, str):
            raise InvalidOptionError(f"{owner}.system must be a str, got {self.system!r}")
        try:  # sent with every model call: refused there, the run failed at its first one
            self.system.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise InvalidOptionError(f"{owner}.system holds a lone surrogate at index {exc.start}: it is not valid "
                                     "UTF-8 text, and no model call could carry it") from None
        given: Any = (self.tools,) if isinstance(self.tools, Tool) else self.tools
        try:
            tools = tuple(given)
        except TypeError:  # one bare function, say
            tools = (given,)
        for item in tools:
            if not isinstance(item, Tool):
                raise WorkflowDefinitionError(
                    f"agent {self.name!r}: tools= takes tools made with @raysaga.agents.tool, got {item!r}"
                    + (": decorate it with @tool" if callable(item) else ""))
        object.__setattr__(self, "tools", tools)
        if self.output_type is not None and not (isinstance(self.output_type, type)
                                                 and issubclass(self.output_type, BaseModel)):
            raise InvalidOptionError(f"{owner}.output_type must be a pydantic model class or None, "
                                     f"got {self.output_type!r}")
        check_number(owner, "max_turns", self.max_turns, minimum=1, integer=True, allowed="a whole number >= 1")
        check_number(owner, "max_output_retries", self.max_output_retries, minimum=0, integer=True,
                     allowed="a whole number >= 0")
        check_number(owner, "max_tokens", self.max_tokens, minimum=1, integer=True, optional=True,
                     allowed="None or a whole number >= 1")
        check_number(owner, "max_tool_result_chars", self.max_tool_result_chars, minimum=1, integer=True,
                     optional=True, allowed="None or a whole number of characters >= 1")
        check_number(owner, "model_timeout", self.model_timeout, minimum=0, strict=True, optional=True,
                     allowed="None or a finite number of seconds > 0")
        check_number(owner, "breaker_threshold", self.breaker_threshold, minimum=1, integer=True,
                     allowed="a whole number >= 1")
        check_number(owner, "breaker_cooldown", self.breaker_cooldown, minimum=0,
                     allowed="a finite number of seconds >= 0")
        if not isinstance(self.loop, LoopPolicy):
            raise InvalidOptionError(f"{owner}.loop must be a LoopPolicy, got {self.loop!r}")
        if not isinstance(self.transport_retry, RetryPolicy):
            raise InvalidOptionError(f"{owner}.transport_retry must be a RetryPolicy, got {self.transport_retry!r}")
        if self.rate_limit is not None and not isinstance(self.rate_limit, RateLimit):
            raise InvalidOptionError(f"{owner}.rate_limit must be a RateLimit, got {self.rate_limit!r}")
        if not isinstance(self.speculative_tools, bool):
            raise InvalidOptionError(f"{owner}.speculative_tools must be True or False, got {self.speculative_tools!r}")
        if not isinstance(self.shared_memory, bool):
            raise InvalidOptionError(f"{owner}.shared_memory must be True or False, got {self.shared_memory!r}")

    def tool(self, name: str) -> Tool | None:
        return next((t for t in self.tools if t.name == name), None)

    def tool_definitions(self) -> list[dict[str, Any]]:
        """The tools as the Messages API takes them (built once: a JSON schema per tool per model
        call cost the driver half a millisecond each)."""
        return list(self._definitions)

    @functools.cached_property
    def _definitions(self) -> tuple[dict[str, Any], ...]:
        defs = [t.definition() for t in self.tools]
        if self.shared_memory:
            defs += MEMORY_DEFINITIONS
        return tuple(defs)


MEMORY_DEFINITIONS: list[dict[str, Any]] = [
    {"name": "memory_read", "description": "Read a key of the shared memory; returns its value and version.",
     "input_schema": {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]}},
    {"name": "memory_write",
     "description": "Write a key of the shared memory if it is still at expected_version (0 if new). "
                    "A stale version is refused: read it again and merge.",
     "input_schema": {"type": "object", "properties": {"key": {"type": "string"}, "value": {},
                                                       "expected_version": {"type": "integer"}},
                      "required": ["key", "value", "expected_version"]}},
]


@dataclass
class Turn:
    """One model call and what answered its tool calls (index in the response → result)."""

    response: ModelResponse | None = None
    results: dict[int, dict[str, Any]] = field(default_factory=dict)


def messages_for(prompt: str, turns: list[Turn], output_type: type[BaseModel] | None = None,
                 result_cap: int | None = None) -> list[dict[str, Any]]:
    """The Messages API conversation implied by the persisted turns (the last one unanswered);
    tool results longer than ``result_cap`` characters cut (``shown_result``)."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": prompt}]
    for turn in turns:
        if turn.response is None:
            break
        messages.append({"role": "assistant", "content": sendable(turn.response.content)})
        uses = turn.response.tool_uses()
        if uses:
            blocks: list[dict[str, Any]] = []
            for k, use in enumerate(uses):
                result = turn.results.get(k)
                if result is None:
                    break
                content, is_error = result.get("content", ""), bool(result.get("is_error"))
                if is_error and (content is None or (isinstance(content, str) and not content.strip())):
                    # the API refuses an error with no content (400); a run stored before
                    # ``run_tool`` filled it in has such a result in its turns
                    content = empty_error(str(use.get("name", "")) or "the tool")
                blocks.append({"type": "tool_result", "tool_use_id": use.get("id", f"toolu_{k}"),
                               "content": shown_result(content, result_cap), "is_error": is_error})
            messages.append({"role": "user", "content": blocks})
        else:
            # the agent's output_type, not None: with None an answer failing validation was fed
            # back as "Continue.", so the model never learned what was wrong with it
            feedback = final_answer_problem(turn.response, output_type)
            messages.append({"role": "user", "content": feedback or "Continue."})
    return messages


def shown_result(content: Any, cap: int | None) -> Any:
    """A tool result as the model is shown it: a text longer than ``cap`` characters cut there,
    with a note saying so (a text block of a list of blocks each so). A function of the stored
    result, so a resumed run asks the model exactly what it asked before the crash."""
    if cap is None:
        return content
    if isinstance(content, str):
        if len(content) <= cap:
            return content
        return (f"{content[:cap]}\n[raysaga: this result was cut at {cap:,} of {len(content):,} characters "
                "(Agent.max_tool_result_chars); ask for a smaller part if you need the rest]")
    if isinstance(content, list):
        return [{**b, "text": shown_result(b["text"], cap)}
                if isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str) else b
                for b in content]
    return content


def sendable(content: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """An assistant reply's content as a request may carry it: without its empty or whitespace-only
    text blocks (the API answers 400 "text content blocks must be non-empty"), and a short
    placeholder text when nothing is left. A reply that has none is passed on as it is (the same
    list), so a request built before this rule is built the same."""
    if content and all(b.get("type") != "text" or str(b.get("text", "")).strip() for b in content):
        return content
    kept = [b for b in content if b.get("type") != "text" or str(b.get("text", "")).strip()]
    return kept or [{"type": "text", "text": EMPTY_REPLY}]


#: Stop reasons of a reply that is not a whole answer: the text so far is no output. ``pause_turn``:
#: the API paused a long turn (server tools) for the caller to let it go on; the others cut it off.
UNFINISHED = {
    "pause_turn": "Your turn was paused (pause_turn). Continue it and give your complete answer.",
    "max_tokens": "Your reply was cut off (max_tokens). Give a shorter, complete answer.",
    "model_context_window_exceeded": "Your reply was cut off: the context window is full "
                                     "(model_context_window_exceeded). Give a shorter, complete answer.",
}
#: The model declined to answer: its text is no answer, and asking again the same way will not help.
REFUSAL = "refusal"


def final_answer_problem(response: ModelResponse, output_type: type[BaseModel] | None) -> str | None:
    """Why a final (tool-less) response is not an acceptable answer, or None if it is.

    A paused or cut-off reply and a refusal are never an answer, whatever their text: taken as
    one, the agent's node completed with the half-written text or the refusal as its output."""
    if response.stop_reason in UNFINISHED:
        return UNFINISHED[response.stop_reason]
    if response.stop_reason == REFUSAL:
        return "You declined to answer (refusal)."
    text = response.text().strip()
    if not text:
        return "Your reply was empty. Answer the task."
    if output_type is None:
        return None
    try:
        made = output_type.model_validate(extract_json(text))
        kept = read_back_problem(output_type, made, model_json(made), "answer")
        if kept:  # (the next step reads the stored form: a validator that does not give it back)
            raise ValueError(kept)
    # NaN or nesting deeper than JSON allows in the answer, or a validator raising on it (a TypeError
    # of user code): a model's words, fed back like any bad answer (they raised out of the driver,
    # the run stayed running, and every resume read the same persisted answer again)
    except Exception as exc:
        schema = json.dumps(output_type.model_json_schema())[:1500]
        return f"Your final answer must be only JSON matching this schema: {schema}. Problem: {str(exc)[:800]}"
    return None


def final_output(response: ModelResponse, output_type: type[BaseModel] | None) -> Any:
    text = response.text().strip()
    if output_type is None:
        return text
    # the form the next step reads the output_type from (``json_form.model_json``: keys it reads back)
    return model_json(output_type.model_validate(extract_json(text)))


_FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.S)


def extract_json(text: str) -> Any:
    """The JSON value in a model's answer (bare, or in a ```json fence)."""
    match = _FENCE.search(text)
    candidate = match.group(1) if match else text
    start = min((i for i in (candidate.find("{"), candidate.find("[")) if i >= 0), default=-1)
    if start < 0:
        raise ValueError("no JSON object in the answer")
    value = json.JSONDecoder().raw_decode(candidate[start:])[0]
    return jsoncodec.to_jsonable(value, "answer")


def fingerprint(name: str, args: Any) -> str:
    try:
        return f"{name}:{jsoncodec.fingerprint(args)}"
    except Exception:
        return f"{name}:<unhashable>"
