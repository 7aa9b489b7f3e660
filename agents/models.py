"""Model backends behind one small protocol: the real Anthropic SDK, and a scripted one.

A backend object crosses into a Ray task, so it holds configuration only: the Anthropic
client is built on the worker and the API key is read there from the environment. It is
never an attribute, never serialized, never stored.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable
from urllib.parse import urlparse

from raysaga.agents.messages import ModelRequest, ModelResponse, Usage
from raysaga.errors import InvalidOptionError, Permanent, Transient
from raysaga.state.redact import register_secret_env, scrub_text
from raysaga.state.secret_registry import MIN_SECRET_LEN
from raysaga.types import check_number

#: Set by raysaga's own test suite: a model call that would reach the real API fails at once.
FORBID_ENV = "RAYSAGA_FORBID_REAL_API"
REAL_API_HOST = "api.anthropic.com"
#: The Anthropic SDK's variable for another endpoint (a gateway, a local server).
BASE_URL_ENV = "ANTHROPIC_BASE_URL"

#: USD per million tokens (input, output), matched by the longest model-name prefix; override or
#: add a model with ``AnthropicModel(prices=...)``. A model matching no prefix has no price: a run
#: with a ``cost_budget`` then refuses to call it (its spend could not be counted).
DEFAULT_PRICES: dict[str, tuple[float, float]] = {
    "claude-opus-4-6": (5.0, 25.0),
    "claude-opus-4-5": (5.0, 25.0),
    "claude-opus-4": (15.0, 75.0),  # claude-opus-4-0, claude-opus-4-1
    "claude-sonnet-4": (3.0, 15.0),  # claude-sonnet-4-0, 4-5, 4-6
    "claude-haiku-4": (1.0, 5.0),  # claude-haiku-4-5
    "claude-3-7-sonnet": (3.0, 15.0),
    "claude-3-5-sonnet": (3.0, 15.0),
    "claude-3-5-haiku": (0.8, 4.0),
    "claude-3-opus": (15.0, 75.0),
    "claude-3-haiku": (0.25, 1.25),
}


def price_for(model: str, prices: dict[str, tuple[float, float]] | None = None) -> tuple[float, float] | None:
    """USD per million (input, output) tokens of ``model``: the longest prefix of it in ``prices``
    (the user's table wins over the defaults, whatever the lengths: ``{"claude-opus": ...}`` prices
    ``claude-opus-4-5`` although the defaults hold a longer prefix), else in ``DEFAULT_PRICES``;
    None if neither has one."""
    for table in (prices or {}, DEFAULT_PRICES):
        match = max((k for k in table if model.startswith(k)), key=len, default=None)
        if match is not None:
            return table[match]
    return None


def price_of(model: str, usage: Usage, prices: dict[str, tuple[float, float]] | None = None) -> float:
    """Cost in USD of one response, by ``price_for`` (0 if the model has no price)."""
    price = price_for(model, prices)
    if price is None:
        return 0.0
    per_in, per_out = price
    return (usage.input_tokens * per_in + usage.output_tokens * per_out) / 1_000_000


def check_prices(owner: str, prices: Any) -> None:
    """Refuse a price table that is not ``{model-name prefix: (input USD/MTok, output USD/MTok)}``
    with finite numbers >= 0: found here, not after the first paid call."""
    example = '{"claude-sonnet-4-5": (3.0, 15.0)}'
    if not isinstance(prices, dict):
        raise InvalidOptionError(f"{owner}.prices must be a dict like {example}, got {prices!r:.200}")
    for name, pair in prices.items():
        if not isinstance(name, str) or not name:
            raise InvalidOptionError(f"{owner}.prices: a key must be a model name (prefix), got {name!r:.80}")
        ok = isinstance(pair, tuple | list) and len(pair) == 2 and all(
            isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and v >= 0 for v in pair)
        if not ok:
            raise InvalidOptionError(
                f"{owner}.prices[{name!r}] must be (input, output) USD per million tokens, two finite numbers "
                f">= 0 like (3.0, 15.0), got {pair!r:.80}")


def check_base_url(owner: str, base_url: Any) -> None:
    """Refuse a ``base_url`` that is not None or an ``http(s)://host[...]`` URL (a number, a bare
    word, an empty string): found when the model is made, not by every call on the worker."""
    if base_url is None:
        return
    parsed = urlparse(base_url) if isinstance(base_url, str) else None
    try:
        ok = parsed is not None and parsed.scheme in ("http", "https") and bool(parsed.hostname) and parsed.port != 0
    except ValueError:  # a port that is not a number, or out of range
        ok = False
    if not ok:
        raise InvalidOptionError(f"{owner}.base_url must be None (the API's own, or ANTHROPIC_BASE_URL) or an "
                                 f"http(s) URL like 'https://gateway.example.com', got {base_url!r:.200}")


def env_base_url() -> str | None:
    """``ANTHROPIC_BASE_URL`` (unset or empty: None, the real API), checked as ``base_url`` is: a
    value without its scheme (``localhost:9``) failed every call with "Connection error.", naming
    neither the variable nor what was wrong with it."""
    value = os.environ.get(BASE_URL_ENV) or None
    try:
        check_base_url("Model", value)
    except InvalidOptionError:
        raise InvalidOptionError(f"{BASE_URL_ENV} must be an http(s) URL like 'https://gateway.example.com' "
                                 f"(or unset: the real API), got {value!r:.200}") from None
    return value


@runtime_checkable
class Model(Protocol):
    """A backend: one request in, one response out; transport errors raised (the driver retries)."""

    # Read-only: a plain ``name: str`` member asks for a settable attribute, which the frozen
    # dataclasses below are not, so mypy rejected ``Agent("a", ScriptedModel())`` in user code.
    @property
    def name(self) -> str: ...

    def complete(self, request: ModelRequest) -> ModelResponse: ...

    def cost(self, usage: Usage) -> float: ...


_CLIENTS: dict[tuple[str | None, float, str], Any] = {}


@dataclass(frozen=True)
class AnthropicModel:
    """Claude through the official ``anthropic`` SDK. ``max_retries=0``: raysaga retries, durably."""

    name: str
    max_tokens: int = 1024
    """The ``max_tokens`` of each call, unless the ``Agent`` sets its own (``Agent.max_tokens`` wins)."""
    base_url: str | None = None
    timeout: float = 60.0
    api_key_env: str = "ANTHROPIC_API_KEY"
    prices: dict[str, tuple[float, float]] = field(default_factory=dict)
    """USD per million (input, output) tokens by model-name prefix; an entry here wins over
    ``DEFAULT_PRICES`` (checked when the model is made: two finite numbers >= 0)."""

    def __post_init__(self) -> None:
        owner = f"AnthropicModel({self.name!r})"
        if not isinstance(self.name, str) or not self.name:
            raise InvalidOptionError(f"AnthropicModel.name must be a model name (a str), got {self.name!r}")
        check_number(owner, "max_tokens", self.max_tokens, minimum=1, integer=True, allowed="a whole number >= 1")
        # checked here, not on the worker: "abc", -5, nan or True failed every call of the run there
        check_number(owner, "timeout", self.timeout, minimum=0, strict=True, allowed="a finite number of seconds > 0")
        check_base_url(owner, self.base_url)
        if self.base_url is None:
            env_base_url()  # a malformed one here is said now, not after the run's first agent call failed 6 times
        if not isinstance(self.api_key_env, str) or not self.api_key_env.strip():
            raise InvalidOptionError(f"{owner}.api_key_env must name an environment variable, got {self.api_key_env!r}")
        check_prices(owner, self.prices)
        # the key's variable is a secret whatever its name (``LLM_GATEWAY_AUTH`` has no KEY in it):
        # a gateway's 401 echoing the key must be scrubbed in the driver, which records the error. A
        # key under 8 characters is a local server's placeholder ("none", "test"), not a real key:
        # masked as a word, it would mangle text and refuse every tool call holding that word
        register_secret_env(self.api_key_env, shortest=MIN_SECRET_LEN)

    def _client(self) -> Any:
        import anthropic

        # again here: a Ray worker gets this object unpickled, without ``__post_init__``
        register_secret_env(self.api_key_env, shortest=MIN_SECRET_LEN)

        try:
            base_url = self.base_url or env_base_url()
        except InvalidOptionError as exc:  # the worker's environment: every call would fail alike
            raise Permanent(str(exc)) from None
        host = urlparse(base_url).hostname if base_url else REAL_API_HOST
        if os.environ.get(FORBID_ENV) and host == REAL_API_HOST:
            raise Permanent(f"{FORBID_ENV} is set: this process may not call the real Anthropic API")
        key = (base_url, self.timeout, self.api_key_env)
        client = _CLIENTS.get(key)
        if client is None:
            api_key = os.environ.get(self.api_key_env)
            if not api_key:
                raise Permanent(f"{self.api_key_env} is not set on the worker: export it, or use ScriptedModel")
            client = anthropic.Anthropic(api_key=api_key, base_url=base_url, timeout=self.timeout, max_retries=0)
            _CLIENTS[key] = client
        return client

    def complete(self, request: ModelRequest) -> ModelResponse:
        client = self._client()
        kwargs: dict[str, Any] = {"model": request.model or self.name, "messages": request.messages,
                                  "max_tokens": request.max_tokens or self.max_tokens}
        if request.system:
            kwargs["system"] = request.system
        if request.tools:
            kwargs["tools"] = request.tools
        if request.metadata:
            kwargs["metadata"] = request.metadata
        # ``client.post`` (the SDK's documented way to custom requests) sends exactly what
        # ``messages.create`` sends (headers, key, timeout) and raises the same exceptions for every
        # error status, but returns the body as it came: building a pydantic ``Message`` only to
        # dump it again cost ~1 ms of the pool actor's CPU per call, a third of the call's CPU (on
        # 2 cores a turn of 50 agents is bound by CPU: bench/agents_fanout.py).
        body = client.post("/v1/messages", body=kwargs, cast_to=bytes)
        try:
            data = json.loads(body)
        except ValueError:  # (UnicodeDecodeError too) a proxy's or gateway's error page, answered 200
            raise Transient(f"the Messages API answered 200 with a body that is not JSON ({len(body)} bytes, "
                            f"starting {body_start(body)!r}): a proxy or gateway in between?") from None
        if not isinstance(data, dict):
            raise Transient(f"the Messages API answered 200 with a JSON {type(data).__name__}, not a message "
                            f"(starting {body_start(body)!r})")
        if is_error_body(data):
            raise Transient(f"the Messages API answered 200 with an error, not a message: {error_of(data)} (a proxy "
                            "or gateway in between, passing on the API's error?)")
        return response_of(data)

    def cost(self, usage: Usage) -> float:
        return price_of(self.name, usage, self.prices)

    def price(self) -> tuple[float, float] | None:
        """USD per million (input, output) tokens of this model (``price_for``), None if unknown."""
        return price_for(self.name, self.prices)

    def __repr__(self) -> str:  # never the key: there is none to show
        return f"AnthropicModel({self.name!r}, base_url={self.base_url!r})"


#: How much of an answer that is no message its error quotes.
BODY_SHOWN = 100


def body_start(body: bytes | str) -> str:
    """The first ``BODY_SHOWN`` characters of an answer, for an error message: decoded (bytes that
    are not UTF-8 replaced), on one line, scrubbed of secret values (a page echoing the key)."""
    text = body.decode("utf-8", "replace") if isinstance(body, bytes | bytearray) else str(body)
    return scrub_text(" ".join(text[: 4 * BODY_SHOWN].split()))[:BODY_SHOWN]


def is_error_body(data: dict[str, Any]) -> bool:
    """Whether a 200's JSON object is an error, not a message: ``"type": "error"`` (the API's error
    shape, which a gateway may pass on with a 200), or no ``type`` but an ``error`` and no content.
    Read as a message, it was an empty reply: the model was told three times its reply was empty,
    and the node failed ``InvalidOutput``, never retried. Any other object is read as a message."""
    kind = data.get("type")
    return kind == "error" or (kind is None and data.get("error") is not None and not data.get("content"))


def error_of(data: dict[str, Any]) -> str:
    """An error body's type and message, for the retry's error: scrubbed, one line, cut."""
    error = data.get("error")
    if isinstance(error, dict):
        said = f"{error.get('type') or 'error'}: {error.get('message') or ''}"
    else:
        said = "error" if error is None else f"error: {error}"
    return body_start(said.strip().rstrip(":"))


def response_of(data: dict[str, Any]) -> ModelResponse:
    """A Messages API response's JSON as the SDK's ``Message.model_dump(exclude_none=True)`` of
    its blocks had it: no null fields, but inside a tool's ``input`` (the model's own JSON)."""
    usage = data.get("usage") or {}
    return ModelResponse(
        content=[_no_nulls(block) for block in data.get("content") or []],
        stop_reason=data.get("stop_reason"),
        usage=Usage(input_tokens=usage.get("input_tokens") or 0, output_tokens=usage.get("output_tokens") or 0,
                    cache_read_input_tokens=usage.get("cache_read_input_tokens") or 0,
                    cache_creation_input_tokens=usage.get("cache_creation_input_tokens") or 0),
        model=data.get("model") or "",
    )


def _no_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: v if k == "input" else _no_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_no_nulls(v) for v in value]
    return value


@dataclass(frozen=True)
class ScriptedModel:
    """Deterministic responses for tests and the offline demo.

    ``script`` maps a conversation (the first user message's text) to the responses of its
    turns in order; turn n is answered with the n-th response, however often it is asked, so
    a replayed turn is answered the same. ``default`` answers conversations with no script.
    """

    script: dict[str, list[ModelResponse]] = field(default_factory=dict)
    default: tuple[ModelResponse, ...] = ()
    name: str = "scripted"

    def complete(self, request: ModelRequest) -> ModelResponse:
        conversation = first_user_text(request.messages)
        turns = self.script.get(conversation, list(self.default))
        turn = sum(1 for m in request.messages if m.get("role") == "assistant")
        if not turns:
            raise Permanent(f"ScriptedModel has no script for conversation {conversation[:60]!r}")
        return turns[min(turn, len(turns) - 1)]

    def cost(self, usage: Usage) -> float:
        return 0.0


def first_user_text(messages: list[dict[str, Any]]) -> str:
    for message in messages:
        if message.get("role") != "user":
            continue
        content = message.get("content")
        if isinstance(content, str):
            return content
        if isinstance(content, list):
            return "".join(str(b.get("text", "")) for b in content if isinstance(b, dict) and b.get("type") == "text")
    return ""


def text_reply(text: str, *, input_tokens: int = 10, output_tokens: int = 10) -> ModelResponse:
    """A final answer (for ``ScriptedModel`` scripts)."""
    return ModelResponse(content=[{"type": "text", "text": text}], stop_reason="end_turn",
                         usage=Usage(input_tokens=input_tokens, output_tokens=output_tokens), model="scripted")


def tool_reply(*calls: tuple[str, dict[str, Any]], text: str = "", input_tokens: int = 10,
               output_tokens: int = 10) -> ModelResponse:
    """A turn asking for tools: ``tool_reply(("search", {"q": "x"}), ...)``."""
    content: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    for i, (name, args) in enumerate(calls):
        content.append({"type": "tool_use", "id": f"toolu_{i:02d}_{name}", "name": name, "input": args})
    return ModelResponse(content=content, stop_reason="tool_use",
                         usage=Usage(input_tokens=input_tokens, output_tokens=output_tokens), model="scripted")
