"""A local stand-in for Anthropic's Messages API, for tests that drive the real ``anthropic`` SDK.

The real API is not reachable from CI, so tests point the SDK at this server instead::

    srv_responder = ScriptedResponder({"plan a trip": [text("sure"), [fault(529), tool_use("search", {"q": "x"})]]})
    with MessagesServer(srv_responder) as srv:
        client = anthropic.Anthropic(base_url=srv.base_url, api_key="test-key", max_retries=0)
        ...
        assert srv.repeated_requests() == []

Only ``POST /v1/messages`` without streaming is served. Each request is answered by a *responder*,
``responder(request_body: dict) -> Reply``; the module-level helpers build the replies:

- ``text``, ``tool_use``, ``reply`` (with ``text_block`` / ``tool_use_block``): a 200 whose JSON the
  SDK parses into ``anthropic.types.Message``;
- ``fault(status)``: an error in Anthropic's shape ``{"type": "error", "error": {"type", "message"}}``
  (429 carries ``retry-after``, 529 is ``overloaded_error``);
- ``error_200(...)``: a 200 whose JSON is an error, not a message (a gateway passing the API's error
  on with a 200), in Anthropic's shape or any JSON object given as ``body=``;
- ``timeout(seconds)``: the server waits before answering, so the client's own timeout fires;
- ``drop()``: the connection is closed without any response;
- ``delayed(seconds, r)``: ``r``, sent late (a slow but successful answer).

Everything the server sees is logged (``LoggedRequest``: body, headers, arrival time, the kind
of reply and the usage it carried). ``repeated_requests()`` is the oracle for "no model request
is repeated once it was answered"; ``usage_totals()`` sums the tokens of the ok replies.

Responses are deterministic: a ``tool_use`` id is a hash of the request's ``messages`` +
``system`` + ``tools`` and of the block's index, a message id one of the request and the content,
so a replayed request answered by the same ``Reply`` gets a byte-identical answer.

The API key: ``anthropic`` 2.12.0 sends ``api_key`` as ``Authorization: Bearer <key>`` (not as
``x-api-key``); ``LoggedRequest.api_key`` reads either, and ``headers`` has them all.

Import it as ``tests.support.messages_server``.
"""

from __future__ import annotations

import copy
import hashlib
import json
import socket
import struct
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, NamedTuple
from urllib.parse import urlsplit

__all__ = [
    "DEFAULT_USAGE",
    "LoggedRequest",
    "MessagesServer",
    "Reply",
    "Responder",
    "ScriptedResponder",
    "TokenUsage",
    "conversation_of",
    "delayed",
    "drop",
    "error_200",
    "fault",
    "render_error",
    "render_message",
    "reply",
    "request_key",
    "text",
    "text_block",
    "timeout",
    "tool_use",
    "tool_use_block",
    "turn_of",
]

DEFAULT_USAGE = (10, 5)
STOP_REASONS = frozenset(
    {"end_turn", "max_tokens", "stop_sequence", "tool_use", "pause_turn", "refusal", "model_context_window_exceeded"}
)
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    504: "timeout_error",
    529: "overloaded_error",
}
DEFAULT_MESSAGES = {
    400: "Invalid request.",
    401: "invalid x-api-key",
    403: "Your API key does not have permission to use the specified resource.",
    404: "Not found.",
    413: "Request exceeds the maximum allowed number of bytes.",
    429: "Number of request tokens has exceeded your per-minute rate limit.",
    500: "Internal server error.",
    529: "Overloaded",
}
KINDS = ("ok", "fault", "timeout", "drop")


class TokenUsage(NamedTuple):
    input_tokens: int
    output_tokens: int


NO_USAGE = TokenUsage(0, 0)


# --------------------------------------------------------------------------------------------
# Replies


@dataclass(frozen=True)
class Reply:
    """What the server does with one request. Build it with the helpers, not by hand.

    ``kind`` is ``ok`` (200 + a Message), ``fault`` (an error status + error JSON), ``timeout``
    (wait ``delay`` seconds, then send ``then`` or close) or ``drop`` (close, no response).
    """

    kind: str
    status: int = 200
    content: tuple[Mapping[str, Any], ...] = ()
    stop_reason: str | None = None
    stop_sequence: str | None = None
    usage: TokenUsage = NO_USAGE
    model: str | None = None
    error_type: str | None = None
    message: str | None = None
    headers: tuple[tuple[str, str], ...] = ()
    delay: float = 0.0
    then: Reply | None = None
    reset: bool = False
    body: Mapping[str, Any] | None = None
    """A fault's JSON as given, instead of Anthropic's error shape (``error_200(body=...)``)."""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown reply kind {self.kind!r}")


def _usage(usage: tuple[int, int]) -> TokenUsage:
    in_tokens, out_tokens = usage
    if in_tokens < 0 or out_tokens < 0:
        raise ValueError(f"usage must be non-negative, got {usage!r}")
    return TokenUsage(int(in_tokens), int(out_tokens))


def text_block(t: str) -> dict[str, Any]:
    """A ``{"type": "text"}`` content block, for ``reply(blocks=...)``."""
    return {"type": "text", "text": t}


def tool_use_block(name: str, input: Mapping[str, Any], id: str | None = None) -> dict[str, Any]:
    """A ``{"type": "tool_use"}`` content block. ``id=None``: derived from the request and the block's index."""
    return {"type": "tool_use", "id": id, "name": name, "input": dict(input)}


def reply(
    blocks: Sequence[Mapping[str, Any]],
    stop_reason: str | None = None,
    *,
    usage: tuple[int, int] = DEFAULT_USAGE,
    stop_sequence: str | None = None,
    model: str | None = None,
) -> Reply:
    """A 200 with these content blocks (``text_block`` / ``tool_use_block``).

    ``stop_reason`` defaults to ``tool_use`` if any block is one, else ``end_turn``.
    """
    content = []
    for block in blocks:
        kind = block.get("type")
        if kind == "text":
            if not isinstance(block.get("text"), str):
                raise ValueError(f"text block without a str text: {block!r}")
        elif kind == "tool_use":
            if not isinstance(block.get("name"), str) or not isinstance(block.get("input"), Mapping):
                raise ValueError(f"tool_use block needs a str name and a dict input: {block!r}")
        else:
            raise ValueError(f"unsupported content block type {kind!r}")
        content.append(copy.deepcopy(dict(block)))
    if stop_reason is None:
        stop_reason = "tool_use" if any(b["type"] == "tool_use" for b in content) else "end_turn"
    if stop_reason not in STOP_REASONS:
        raise ValueError(f"unknown stop_reason {stop_reason!r}")
    return Reply(
        kind="ok",
        content=tuple(content),
        stop_reason=stop_reason,
        stop_sequence=stop_sequence,
        usage=_usage(usage),
        model=model,
    )


def text(t: str, usage: tuple[int, int] = DEFAULT_USAGE, *, stop_reason: str = "end_turn") -> Reply:
    """A 200 with one text block (``stop_reason="max_tokens"`` for a truncated answer)."""
    return reply([text_block(t)], stop_reason, usage=usage)


def tool_use(
    name: str,
    input: Mapping[str, Any],
    id: str | None = None,
    text: str | None = None,
    usage: tuple[int, int] = DEFAULT_USAGE,
) -> Reply:
    """A 200 asking for one tool call (optionally preceded by a text block); ``stop_reason="tool_use"``."""
    blocks = ([text_block(text)] if text is not None else []) + [tool_use_block(name, input, id)]
    return reply(blocks, "tool_use", usage=usage)


def fault(
    status: int,
    message: str | None = None,
    *,
    error_type: str | None = None,
    retry_after: float | None = None,
    headers: Mapping[str, str] | None = None,
) -> Reply:
    """An error response in Anthropic's shape. 429 gets ``retry-after: 1`` unless ``retry_after`` says otherwise."""
    if not 400 <= status <= 599:
        raise ValueError(f"fault status must be 4xx or 5xx, got {status}")
    extra = dict(headers or {})
    if retry_after is None and status == 429:
        retry_after = 1
    if retry_after is not None:
        extra["retry-after"] = str(int(retry_after)) if float(retry_after).is_integer() else str(retry_after)
    return Reply(
        kind="fault",
        status=status,
        error_type=error_type or ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error"),
        message=message or DEFAULT_MESSAGES.get(status, f"Error {status}"),
        headers=tuple(extra.items()),
    )


def error_200(
    error_type: str = "overloaded_error", message: str = "Overloaded", *, body: Mapping[str, Any] | None = None
) -> Reply:
    """A 200 whose JSON is an error in Anthropic's shape (or ``body``, any JSON object), not a message:
    what a gateway passing the API's error on with a 200 sends. Logged as a ``fault``: it answers nothing."""
    return Reply(kind="fault", status=200, error_type=error_type, message=message,
                 body=None if body is None else copy.deepcopy(dict(body)))


def timeout(seconds: float, then: Reply | None = None) -> Reply:
    """Hold the request ``seconds`` (longer than the client's timeout), then send ``then`` or just close.

    The wait ends early when the server closes. Logged as ``timeout``; its usage is never counted.
    """
    if then is not None and then.kind not in ("ok", "fault"):
        raise ValueError("timeout(then=...) must be an ok or fault reply")
    return Reply(kind="timeout", delay=float(seconds), then=then)


def drop(*, reset: bool = False) -> Reply:
    """Close the connection without a response (``reset=True``: abortively, with a TCP RST)."""
    return Reply(kind="drop", reset=reset)


def delayed(seconds: float, r: Reply) -> Reply:
    """``r``, sent after ``seconds`` (a slow answer that still arrives). The wait ends early when the server closes."""
    return replace(r, delay=float(seconds))


# --------------------------------------------------------------------------------------------
# Request identity


def request_key(body: Mapping[str, Any]) -> str:
    """Canonical JSON of the parts of a request that define the model call.

    ``{"messages", "system", "tools", "user_id"}`` (sorted keys, no spaces; absent parts are
    ``null``). ``user_id`` is ``metadata.user_id``: two conversations that happen to send the same
    messages under different user ids are different calls, not a repeat.
    """
    metadata = body.get("metadata")
    user_id = metadata.get("user_id") if isinstance(metadata, Mapping) else None
    return json.dumps(
        {
            "messages": body.get("messages"),
            "system": body.get("system"),
            "tools": body.get("tools"),
            "user_id": user_id,
        },
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    )


def conversation_of(body: Mapping[str, Any]) -> str | None:
    """The conversation a request belongs to: ``metadata.user_id`` if set, else the first user message's text."""
    metadata = body.get("metadata")
    if isinstance(metadata, Mapping) and isinstance(metadata.get("user_id"), str):
        return str(metadata["user_id"])
    messages = body.get("messages")
    if not isinstance(messages, list):
        return None
    for message in messages:
        if not isinstance(message, Mapping) or message.get("role") != "user":
            continue
        content = message.get("content")
        if isinstance(content, str):
            return content
        if isinstance(content, list):
            for block in content:
                if isinstance(block, Mapping) and block.get("type") == "text" and isinstance(block.get("text"), str):
                    return str(block["text"])
        return ""
    return None


def turn_of(body: Mapping[str, Any]) -> int:
    """The turn a request asks for: how many assistant messages it already carries."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        return 0
    return sum(1 for m in messages if isinstance(m, Mapping) and m.get("role") == "assistant")


def _digest(*parts: str, n: int = 24) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode())
        h.update(b"\x00")
    return h.hexdigest()[:n]


def render_message(r: Reply, body: Mapping[str, Any], default_model: str | None = None) -> dict[str, Any]:
    """The JSON body of an ok reply to ``body``: exactly what the SDK parses into ``anthropic.types.Message``."""
    key = request_key(body)
    content: list[dict[str, Any]] = []
    for index, block in enumerate(r.content):
        out = copy.deepcopy(dict(block))
        if out["type"] == "tool_use" and out.get("id") is None:
            out["id"] = "toolu_01" + _digest(key, "tool_use", str(index), n=22)
        if out["type"] == "tool_use":
            out = {"type": "tool_use", "id": out["id"], "name": out["name"], "input": out["input"]}
        content.append(out)
    return {
        "id": "msg_01" + _digest(key, "message", json.dumps(content, sort_keys=True), n=22),
        "type": "message",
        "role": "assistant",
        "model": r.model or body.get("model") or default_model or "claude-test",
        "content": content,
        "stop_reason": r.stop_reason,
        "stop_sequence": r.stop_sequence,
        "usage": {
            "input_tokens": r.usage.input_tokens,
            "output_tokens": r.usage.output_tokens,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        },
    }


def render_error(r: Reply) -> dict[str, Any]:
    if r.body is not None:
        return copy.deepcopy(dict(r.body))
    return {"type": "error", "error": {"type": r.error_type, "message": r.message}}


# --------------------------------------------------------------------------------------------
# Scripts

Turn = Reply | Sequence[Reply]
Responder = Callable[[dict[str, Any]], Reply]


class ScriptedResponder:
    """Replies scripted per conversation (``conversation_of``) and turn (``turn_of``).

    ``scripts[conversation][n]`` answers turn ``n`` (the request carrying ``n`` assistant messages).
    A single ``Reply`` answers every arrival of that turn. A list is consumed per arrival, its last
    element then answering every later arrival: ``[fault(529), fault(429), text("ok")]`` fails
    twice and then answers ``ok`` for good, so a turn asked again gets the same answer.

    An unknown conversation or a turn past the end of its script goes to ``default`` if given,
    else raises ``LookupError`` (which the server turns into a 500 and re-raises when it closes).
    """

    def __init__(self, scripts: Mapping[str, Sequence[Turn]] | None = None, *, default: Responder | None = None):
        self._lock = threading.Lock()
        self._scripts: dict[str, list[list[Reply]]] = {}
        self._arrivals: dict[tuple[str, int], int] = {}
        self.default = default
        for conversation, turns in (scripts or {}).items():
            self.add(conversation, turns)

    def add(self, conversation: str, turns: Sequence[Turn]) -> None:
        """Set (or replace) the script of ``conversation``; its arrival counts restart."""
        script: list[list[Reply]] = []
        for n, turn in enumerate(turns):
            queue = [turn] if isinstance(turn, Reply) else list(turn)
            if not queue or not all(isinstance(r, Reply) for r in queue):
                raise ValueError(f"turn {n} of {conversation!r} must be a Reply or a non-empty list of Replies")
            script.append(queue)
        with self._lock:
            self._scripts[conversation] = script
            for k in [k for k in self._arrivals if k[0] == conversation]:
                del self._arrivals[k]

    def arrivals(self, conversation: str, turn: int) -> int:
        """How many requests for ``turn`` of ``conversation`` this responder has answered."""
        with self._lock:
            return self._arrivals.get((conversation, turn), 0)

    def __call__(self, request: dict[str, Any]) -> Reply:
        conversation = conversation_of(request)
        turn = turn_of(request)
        with self._lock:
            script = self._scripts.get(conversation) if conversation is not None else None
            if script is not None and turn < len(script):
                arrival = self._arrivals.get((conversation, turn), 0)  # type: ignore[arg-type]
                self._arrivals[(conversation, turn)] = arrival + 1  # type: ignore[index]
                queue = script[turn]
                return queue[min(arrival, len(queue) - 1)]
        if self.default is not None:
            return self.default(request)
        if script is None:
            raise LookupError(f"no script for conversation {conversation!r} (known: {sorted(self._scripts)})")
        raise LookupError(f"conversation {conversation!r} has {len(script)} scripted turns, asked for turn {turn}")


# --------------------------------------------------------------------------------------------
# The log


@dataclass(frozen=True)
class LoggedRequest:
    """One request as the server saw it, and what it did with it."""

    seq: int
    arrived: float  # time.monotonic() at arrival
    method: str
    path: str
    headers: dict[str, str]  # lower-cased names
    body: dict[str, Any] | None  # parsed JSON (None if it was not a JSON object)
    conversation: str | None
    turn: int
    key: str  # request_key(body): canonical messages + system + tools (+ metadata.user_id)
    kind: str  # ok | fault | timeout | drop
    status: int | None  # HTTP status sent (None: nothing sent)
    usage: TokenUsage  # tokens of the reply sent (0, 0 unless ok)
    response: dict[str, Any] | None = field(default=None, repr=False)  # the JSON sent

    @property
    def api_key(self) -> str | None:
        """The credential the client sent: ``x-api-key``, or the token of ``Authorization: Bearer``."""
        if "x-api-key" in self.headers:
            return self.headers["x-api-key"]
        auth = self.headers.get("authorization", "")
        return auth[len("Bearer ") :] if auth.startswith("Bearer ") else None


# --------------------------------------------------------------------------------------------
# The server


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    owner: MessagesServer

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.to_reset: set[socket.socket] = set()

    def shutdown_request(self, request: Any) -> None:
        if request in self.to_reset:  # no FIN first: close with SO_LINGER 0, so the peer gets a RST
            self.to_reset.discard(request)
            request.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.close_request(request)
            return
        super().shutdown_request(request)


class _Handler(BaseHTTPRequestHandler):
    server: _HTTPServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass  # keep test output clean; everything is in the server's log

    def do_POST(self) -> None:
        self.server.owner._handle(self)

    def do_GET(self) -> None:
        self.server.owner._handle(self)

    def send_json(self, status: int, payload: Mapping[str, Any], headers: Sequence[tuple[str, str]] = ()) -> bool:
        data = json.dumps(payload).encode()
        try:
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.send_header("connection", "close")
            for name, value in headers:
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)
            self.wfile.flush()
            return True
        except OSError:  # the client went away (it timed out, or was killed)
            return False
        finally:
            self.close_connection = True


class MessagesServer:
    """``POST /v1/messages`` on 127.0.0.1, answered by ``responder``; use as a context manager.

    ``api_key``: if set, a request without that key (``x-api-key`` or ``Authorization: Bearer``)
    gets a 401 ``authentication_error``. An exception raised by the responder is answered with a
    500 (``x-should-retry: false``), kept in ``responder_errors``, and re-raised by ``close()`` /
    ``__exit__`` (unless the block is already raising) so a broken script cannot pass silently.

    ``backlog``: the listening socket's queue of connections not yet accepted (default: the
    standard library's 5). Many clients connecting at once (a wide fan-out) overflow a short one;
    Linux then drops their SYNs and each retries a second later, so pass ``backlog=128`` or so.
    """

    def __init__(
        self,
        responder: Responder,
        *,
        api_key: str | None = None,
        model: str | None = None,
        raise_responder_errors: bool = True,
        backlog: int | None = None,
    ) -> None:
        self.responder = responder
        self.api_key = api_key
        self.model = model
        self.raise_responder_errors = raise_responder_errors
        self.backlog = backlog
        self.responder_errors: list[BaseException] = []
        self._log: list[LoggedRequest] = []
        self._cond = threading.Condition(threading.Lock())
        self._closing = threading.Event()
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle

    def start(self) -> MessagesServer:
        if self._httpd is not None:
            raise RuntimeError("server already started")
        httpd = _HTTPServer(("127.0.0.1", 0), _Handler, bind_and_activate=False)
        if self.backlog is not None:
            httpd.request_queue_size = self.backlog  # read by server_activate's listen()
        try:
            httpd.server_bind()
            httpd.server_activate()
        except BaseException:
            httpd.server_close()
            raise
        httpd.owner = self
        self._httpd = httpd
        self._thread = threading.Thread(
            target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, name="messages-server", daemon=True
        )
        self._thread.start()
        return self

    def close(self, *, raise_errors: bool = True) -> None:
        self._closing.set()  # wakes handlers held by timeout()/delayed()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            if self._thread is not None:
                self._thread.join(timeout=5)
        if raise_errors and self.raise_responder_errors and self.responder_errors:
            first = self.responder_errors[0]
            raise RuntimeError(
                f"the responder raised {len(self.responder_errors)} time(s); first: {first!r}"
            ) from first

    def __enter__(self) -> MessagesServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close(raise_errors=exc_type is None)

    @property
    def port(self) -> int:
        if self._httpd is None:
            raise RuntimeError("server not started")
        return int(self._httpd.server_address[1])

    @property
    def base_url(self) -> str:
        """For ``anthropic.Anthropic(base_url=...)``; the SDK appends ``/v1/messages``."""
        return f"http://127.0.0.1:{self.port}"

    # -- the log

    @property
    def requests(self) -> list[LoggedRequest]:
        """Every request so far, in arrival order (a copy)."""
        with self._cond:
            return list(self._log)

    def requests_for(self, conversation: str) -> list[LoggedRequest]:
        """The requests of one conversation (``conversation_of``), in arrival order."""
        with self._cond:
            return [r for r in self._log if r.conversation == conversation]

    def repeated_requests(self) -> list[str]:
        """Canonical request keys (``request_key``: messages + system + tools) that arrived again
        after a request with the same key had been answered ok: model calls repeated for turns that
        already had their answer. Each key once, in the order they were first repeated. ``[]`` is the goal."""
        answered: set[str] = set()
        repeated: list[str] = []
        with self._cond:
            for r in self._log:
                if r.body is None or r.path != "/v1/messages":
                    continue
                if r.key in answered and r.key not in repeated:
                    repeated.append(r.key)
                if r.kind == "ok":
                    answered.add(r.key)
        return repeated

    def usage_totals(self) -> TokenUsage:
        """Summed tokens of every ok reply sent (repeats included: they are billed too)."""
        with self._cond:
            ok = [r.usage for r in self._log if r.kind == "ok"]
        return TokenUsage(sum(u.input_tokens for u in ok), sum(u.output_tokens for u in ok))

    def wait_for_requests(self, n: int, timeout: float = 5.0) -> list[LoggedRequest]:
        """Block until at least ``n`` requests have been logged (a request is logged once its reply
        is decided, before it is sent or held). Raises ``TimeoutError``."""
        with self._cond:
            if not self._cond.wait_for(lambda: len(self._log) >= n, timeout=timeout):
                raise TimeoutError(f"{len(self._log)} request(s) logged, waited for {n}")
            return list(self._log)

    def clear(self) -> None:
        """Forget the log (not the responder's state)."""
        with self._cond:
            self._log.clear()

    # -- serving

    def _handle(self, h: _Handler) -> None:
        arrived = time.monotonic()
        headers = {name.lower(): value for name, value in h.headers.items()}
        length = int(headers.get("content-length") or 0)
        raw = h.rfile.read(length) if length > 0 else b""
        path = urlsplit(h.path).path
        try:
            parsed = json.loads(raw) if raw else None
        except ValueError:
            parsed = None
        body = parsed if isinstance(parsed, dict) else None

        r = self._validate(h.command, path, headers, body)
        if r is None:
            assert body is not None
            try:
                r = self.responder(copy.deepcopy(body))
                if not isinstance(r, Reply):
                    raise TypeError(f"the responder returned {r!r}, not a Reply")
            except Exception as exc:
                with self._cond:
                    self.responder_errors.append(exc)
                r = fault(
                    500,
                    f"responder error: {exc!r}\n{traceback.format_exc(limit=3)}",
                    headers={"x-should-retry": "false"},
                )

        final = r.then if r.kind == "timeout" else r
        response: dict[str, Any] | None = None
        if final is not None and final.kind == "ok":
            response = render_message(final, body or {}, self.model)
        elif final is not None and final.kind == "fault":
            response = render_error(final)
        status = None if final is None or r.kind in ("drop", "timeout") else final.status
        with self._cond:
            entry = LoggedRequest(
                seq=len(self._log),
                arrived=arrived,
                method=h.command,
                path=path,
                headers=headers,
                body=body,
                conversation=conversation_of(body) if body is not None else None,
                turn=turn_of(body) if body is not None else 0,
                key=request_key(body) if body is not None else "",
                kind=r.kind,
                status=status,
                usage=final.usage if final is not None and r.kind == "ok" else NO_USAGE,
                response=response,
            )
            self._log.append(entry)
            self._cond.notify_all()

        if r.delay > 0:
            self._closing.wait(r.delay)
        if r.kind == "drop" or final is None:
            h.close_connection = True
            if r.reset:
                h.server.to_reset.add(h.connection)
            return
        resp_headers = [("request-id", "req_01" + _digest(str(entry.seq), entry.key, n=22)), *final.headers]
        assert response is not None
        h.send_json(final.status, response, resp_headers)

    def _validate(
        self, method: str, path: str, headers: Mapping[str, str], body: dict[str, Any] | None
    ) -> Reply | None:
        """The server's own answer to a request it will not pass to the responder, else None."""
        if path != "/v1/messages":
            return fault(404, f"{method} {path} is not served (only POST /v1/messages)")
        if method != "POST":
            return fault(405, f"{method} not allowed", error_type="invalid_request_error")
        if self.api_key is not None:
            sent = headers.get("x-api-key")
            auth = headers.get("authorization", "")
            if sent is None and auth.startswith("Bearer "):
                sent = auth[len("Bearer ") :]
            if sent != self.api_key:
                return fault(401)
        if "anthropic-version" not in headers:
            return fault(400, "anthropic-version: header is required")
        if body is None:
            return fault(400, "the request body must be a JSON object")
        if body.get("stream") is True:
            return fault(400, "stream: true is not supported by this test server (non-streaming only)")
        for name, kind in (("model", str), ("max_tokens", int), ("messages", list)):
            if not isinstance(body.get(name), kind):
                return fault(400, f"{name}: field required ({kind.__name__})")
        if not body["messages"]:
            return fault(400, "messages: at least one message is required")
        return None
