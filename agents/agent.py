"""An LLM sub-agent: a model, a system prompt, tools, and the rules of its loop.

The loop itself lives in the store, not here: ``Transcript`` rebuilds the conversation from
persisted turns, and ``next_step`` says what the persisted state calls for next. Both are
pure, so a resumed driver reaches exactly the decision the crashed one would have.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ValidationError

from raysaga.agents.messages import ModelResponse
from raysaga.agents.models import Model
from raysaga.agents.tools import Tool
from raysaga.errors import WorkflowDefinitionError
from raysaga.state import jsoncodec
from raysaga.types import RetryPolicy, check_name

MEMORY_TOOLS = ("memory_read", "memory_write")


@dataclass(frozen=True)
class LoopPolicy:
    """Break a loop of identical tool calls: the same (tool, args) ``repeats`` times within the
    last ``window`` calls. The first time the agent is told; the next time ``then`` applies:
    ``"fail"`` the node or ``"pause"`` the run for a human."""

    window: int = 6
    repeats: int = 3
    then: str = "fail"


@dataclass(frozen=True)
class Agent:
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
    breaker_threshold: int = 5
    breaker_cooldown: float = 30.0
    shared_memory: bool = False
    """Give the agent ``memory_read``/``memory_write`` on the run's blackboard (compare-and-set)."""
    max_tokens: int = 1024

    def __post_init__(self) -> None:
        check_name("agent", self.name)
        names = [t.name for t in self.tools]
        if len(names) != len(set(names)):
            raise WorkflowDefinitionError(f"agent {self.name!r} has two tools with one name: {names}")
        if self.shared_memory and set(names) & set(MEMORY_TOOLS):
            raise WorkflowDefinitionError(f"agent {self.name!r}: {MEMORY_TOOLS} are reserved for shared memory")
        if self.on_budget not in ("pause", "fail") or self.loop.then not in ("pause", "fail"):
            raise WorkflowDefinitionError(f"agent {self.name!r}: on_budget and loop.then take 'pause' or 'fail'")
        if self.max_turns < 1:
            raise WorkflowDefinitionError(f"agent {self.name!r}: max_turns must be >= 1")

    def tool(self, name: str) -> Tool | None:
        return next((t for t in self.tools if t.name == name), None)

    def tool_definitions(self) -> list[dict[str, Any]]:
        defs = [t.definition() for t in self.tools]
        if self.shared_memory:
            defs += MEMORY_DEFINITIONS
        return defs


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
                 ) -> list[dict[str, Any]]:
    """The Messages API conversation implied by the persisted turns (the last one unanswered)."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": prompt}]
    for turn in turns:
        if turn.response is None:
            break
        messages.append({"role": "assistant", "content": turn.response.content or [{"type": "text", "text": ""}]})
        uses = turn.response.tool_uses()
        if uses:
            blocks: list[dict[str, Any]] = []
            for k, use in enumerate(uses):
                result = turn.results.get(k)
                if result is None:
                    break
                blocks.append({"type": "tool_result", "tool_use_id": use.get("id", f"toolu_{k}"),
                               "content": result.get("content", ""), "is_error": bool(result.get("is_error"))})
            messages.append({"role": "user", "content": blocks})
        else:
            # the agent's output_type, not None: with None an answer failing validation was fed
            # back as "Continue.", so the model never learned what was wrong with it
            feedback = final_answer_problem(turn.response, output_type)
            messages.append({"role": "user", "content": feedback or "Continue."})
    return messages


def final_answer_problem(response: ModelResponse, output_type: type[BaseModel] | None) -> str | None:
    """Why a final (tool-less) response is not an acceptable answer, or None if it is."""
    if response.stop_reason == "max_tokens":
        return "Your reply was cut off (max_tokens). Give a shorter, complete answer."
    text = response.text().strip()
    if not text:
        return "Your reply was empty. Answer the task."
    if output_type is None:
        return None
    try:
        output_type.model_validate(extract_json(text))
    except (ValueError, ValidationError) as exc:
        schema = json.dumps(output_type.model_json_schema())[:1500]
        return f"Your final answer must be only JSON matching this schema: {schema}. Problem: {str(exc)[:800]}"
    return None


def final_output(response: ModelResponse, output_type: type[BaseModel] | None) -> Any:
    text = response.text().strip()
    if output_type is None:
        return text
    return output_type.model_validate(extract_json(text)).model_dump(mode="json")


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
