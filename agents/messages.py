"""What crosses between the driver and a model call: JSON-only request and response records."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

#: The most tokens one model call may report, per field (~10^12: no real call is near it). The run
#: adds them up in 64-bit columns: unbounded, a backend's (or a proxy's) garbage count crashed the
#: driver's commit (OverflowError, DataError: the run stayed running), and a negative one lowered the
#: run's spend, so a token or cost budget never stopped it.
MAX_CALL_TOKENS = 2**40


class Usage(BaseModel):
    input_tokens: int = Field(default=0, ge=0, le=MAX_CALL_TOKENS)
    output_tokens: int = Field(default=0, ge=0, le=MAX_CALL_TOKENS)
    cache_read_input_tokens: int = Field(default=0, ge=0, le=MAX_CALL_TOKENS)
    """Prompt tokens served from the provider's cache (reported, e.g. in traces; not in ``total``)."""
    cache_creation_input_tokens: int = Field(default=0, ge=0, le=MAX_CALL_TOKENS)

    @property
    def total(self) -> int:
        return self.input_tokens + self.output_tokens


class ModelRequest(BaseModel):
    """One Messages API call, as JSON (no client, no key)."""

    model: str
    system: str = ""
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] = Field(default_factory=list)
    max_tokens: int = 1024
    metadata: dict[str, Any] = Field(default_factory=dict)


class ModelResponse(BaseModel):
    """A model's answer as persisted (before any tool it asks for runs)."""

    content: list[dict[str, Any]] = Field(default_factory=list)
    stop_reason: str | None = None
    usage: Usage = Field(default_factory=Usage)
    model: str = ""

    def tool_uses(self) -> list[dict[str, Any]]:
        return [b for b in self.content if b.get("type") == "tool_use"]

    def text(self) -> str:
        return "".join(str(b.get("text", "")) for b in self.content if b.get("type") == "text")
