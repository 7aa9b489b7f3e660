"""What runs inside the Ray tasks of an agent: one model call, or one tool call.

Both return JSON only. A model response whose tool input is not storable JSON (too deep,
NaN...) is kept, with that input replaced by a marker, so the agent can be told its call was
malformed instead of the whole node dying. Elsewhere in a response (its text, a block's fields)
a lone surrogate, which no UTF-8 text and so no store can hold, is replaced with U+FFFD: the
model's answer is not the user's fault, and it must not fail the node for good.

A tool is never called with arguments a scrub changed: a call whose input holds a known secret
value is kept with that input replaced by the same marker (stored and replayed so), and the model
told the call was not run (``scrubbed_response``).
"""

from __future__ import annotations

import re
from typing import Any

from raysaga.agents.messages import ModelRequest
from raysaga.agents.models import Model
from raysaga.agents.tools import Tool, run_compensation, run_tool
from raysaga.errors import NotJSONableError, Permanent
from raysaga.state import jsoncodec
from raysaga.state.redact import scrub_secret_values
from raysaga.types import StepContext

INVALID_INPUT = "$raysaga_invalid_input"


def model_turn(model: Model, request: dict[str, Any]) -> dict[str, Any]:
    try:
        response = model.complete(ModelRequest.model_validate(request))
    except RecursionError:
        raise Permanent("the model's response is nested too deeply to parse") from None
    content = []
    for block in response.content:
        if block.get("type") == "tool_use":
            try:
                jsoncodec.to_jsonable(block.get("input"), "tool input")
            except (NotJSONableError, RecursionError) as exc:
                # keep the end: the message is "<path> is <problem>", and for a deeply nested
                # input the path alone is longer than the cut, which left the model no reason
                reason = str(exc)
                if len(reason) > 300:
                    reason = "..." + reason[-297:]
                block = {**block, "input": {INVALID_INPUT: reason}}
        content.append(block)
    data = response.model_copy(update={"content": content}).model_dump(mode="json")
    try:
        jsoncodec.to_jsonable(data, "model response")
    except NotJSONableError:
        data = mended(data)  # a lone surrogate in its text: the one thing in it JSON cannot carry
        jsoncodec.to_jsonable(data, "model response")
    return scrubbed_response(data)


#: Why a call whose input held a secret value was not run (the model reads it after "your input
#: for NAME was not valid JSON: ").
SECRET_INPUT = ("it held the value of a secret (an API key or a password), which is never stored nor passed "
                "to a tool through a model: the call was not run; call it without the secret")


def scrubbed_response(data: dict[str, Any]) -> dict[str, Any]:
    """A model's response as it is stored and acted on, with no known secret value in it (DESIGN
    invariant 7): in its text, replaced by the marker; in a tool call's input (a string or a key:
    ``{"values": {KEY: "primary"}}``), the whole input replaced by ``INVALID_INPUT`` (the call is
    answered, never run). So every reader (the store,
    the tools, the next request, a resume replaying the row) sees the same response, and no tool
    runs with arguments the scrub rewrote (``database="[redacted]_analytics"``)."""
    clean: dict[str, Any] = scrub_secret_values(data)
    if clean is data or clean == data:
        return data
    content = [
        {**new, "input": {INVALID_INPUT: SECRET_INPUT}}
        if isinstance(new, dict) and new.get("type") == "tool_use" and new.get("input") != old.get("input") else new
        for old, new in zip(data.get("content") or [], clean.get("content") or [], strict=True)]
    return {**clean, "content": content}


#: Half of a UTF-16 surrogate pair, alone: ``json.loads`` makes one of ``"\\ud800"``; UTF-8 has none.
_SURROGATE = re.compile("[\ud800-\udfff]")


def mended(value: Any) -> Any:
    """``value`` with every lone surrogate in its strings (keys too) replaced with U+FFFD, the
    replacement character a UTF-8 decoder shows for bytes it cannot read: the text stays readable,
    its length unchanged, and what was lost is visible."""
    if isinstance(value, str):
        return _SURROGATE.sub("\ufffd", value)
    if isinstance(value, dict):
        return {mended(k): mended(v) for k, v in value.items()}
    if isinstance(value, list):
        return [mended(v) for v in value]
    return value


def tool_call(tool: Tool, args: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
    return run_tool(tool, args, ctx.idempotency_key)


def tool_undo(tool: Tool, args: dict[str, Any], output: Any, ctx: StepContext) -> Any:
    """The compensation of one call of an effect tool (the rollback's Ray task)."""
    return run_compensation(tool, args, output, ctx)
