"""Span attributes: OpenTelemetry's GenAI semantic conventions for model turns and tool calls.

Message content is left out unless ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true``
(the conventions' own switch): a trace backend is rarely where prompts and answers should go.
Content that is captured is scrubbed of secrets like everything raysaga writes, then cut to
``CONTENT_LIMIT`` characters (``OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT`` when set): a tool's 3 MB result
made one attribute past what an OTLP collector takes in a request (4 MiB), and the whole batch of
spans around it was refused. A cut value ends with ``CUT_MARK`` and says how long it was.
"""

from __future__ import annotations

import json
import os
from typing import Any

from raysaga.state.redact import scrub

__all__ = ["CAPTURE_ENV", "CONTENT_LIMIT", "CUT_MARK", "LIMIT_ENV", "SPAN_LIMIT_ENV", "content", "error_type",
           "model_turn", "tool_call", "tool_uses"]

CAPTURE_ENV = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
LIMIT_ENV = "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT"
SPAN_LIMIT_ENV = "OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT"
#: Characters of captured content kept in one attribute (16 KiB) unless ``LIMIT_ENV`` says otherwise.
CONTENT_LIMIT = 16 * 1024
CUT_MARK = "...[cut by raysaga: {size} characters in all]"
PROVIDER = "anthropic"


def capture_content() -> bool:
    return os.environ.get(CAPTURE_ENV, "").strip().lower() in ("1", "true", "yes")


def content_limit() -> int:
    """Characters one captured attribute keeps: the SDK's own limit when the environment sets one
    (``OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT``, else ``OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT``, in the
    SDK's order: its cut would take our mark off), else ``CONTENT_LIMIT``."""
    for name in (SPAN_LIMIT_ENV, LIMIT_ENV):
        try:
            limit = int(os.environ.get(name, "").strip())
        except ValueError:
            continue
        if limit > 0:
            return limit
    return CONTENT_LIMIT


def content(value: Any) -> str:
    """Captured content as one attribute: scrubbed (keys too: a tool call's ``{KEY: "primary"}``),
    as JSON, cut to ``content_limit()`` characters (ending with ``CUT_MARK``) when longer."""
    text = json.dumps(scrub(value), default=str)
    limit = content_limit()
    if len(text) <= limit:
        return text
    mark = CUT_MARK.format(size=len(text))
    return text[:max(0, limit - len(mark))] + mark[:limit]


def error_type(error: Any) -> str | None:
    """The failure's type from a stored error (an ``ErrorRecord`` or a dict), if any."""
    if error is None:
        return None
    kind = error.get("type") if hasattr(error, "get") else None
    return str(kind) if kind else "error"


def model_turn(response: Any, request_model: str | None, cost: float | None, *,
               replayed: bool = False) -> dict[str, Any]:
    """Attributes of one model turn from its stored response (``ModelResponse`` as JSON).

    A replayed turn (its answer read back from the store by a resume, not asked again) carries no
    ``gen_ai.usage.*``: those tokens were paid for, and counted, when the turn was first answered.
    """
    attrs: dict[str, Any] = {"gen_ai.operation.name": "chat", "gen_ai.provider.name": PROVIDER,
                             "gen_ai.system": PROVIDER, "raysaga.turn.replayed": replayed}
    if request_model:
        attrs["gen_ai.request.model"] = request_model
    if not isinstance(response, dict):
        return attrs
    if response.get("model"):
        attrs["gen_ai.response.model"] = str(response["model"])
    if response.get("stop_reason"):
        attrs["gen_ai.response.finish_reasons"] = [str(response["stop_reason"])]
    if replayed:
        return attrs
    usage = response.get("usage") or {}
    for key, name in (("input_tokens", "gen_ai.usage.input_tokens"), ("output_tokens", "gen_ai.usage.output_tokens"),
                      ("cache_read_input_tokens", "gen_ai.usage.cache_read.input_tokens"),
                      ("cache_creation_input_tokens", "gen_ai.usage.cache_creation.input_tokens")):
        if isinstance(usage.get(key), int):
            attrs[name] = usage[key]
    if cost is not None:
        attrs["raysaga.cost_usd"] = cost
    if capture_content():
        attrs["gen_ai.output.messages"] = content([{"role": "assistant", "parts": response.get("content") or []}])
    return attrs


def tool_uses(response: Any) -> list[tuple[str, str]]:
    """The (name, id) of each tool call a stored model response asks for, in order."""
    if not isinstance(response, dict):
        return []
    return [(str(b.get("name", "")), str(b.get("id", ""))) for b in response.get("content") or []
            if isinstance(b, dict) and b.get("type") == "tool_use"]


def tool_call(name: str | None, call_id: str | None, result: Any) -> dict[str, Any]:
    attrs: dict[str, Any] = {"gen_ai.operation.name": "execute_tool"}
    if name:
        attrs["gen_ai.tool.name"] = name
    if call_id:
        attrs["gen_ai.tool.call.id"] = call_id
    if isinstance(result, dict) and result.get("is_error"):
        attrs["error.type"] = "tool_error"
    if capture_content() and isinstance(result, dict):
        attrs["gen_ai.tool.call.result"] = content(result.get("content"))
    return attrs
