"""tests/support/messages_server.py speaks enough of the Messages API for the real ``anthropic`` SDK.

Every test drives the installed SDK (``anthropic.Anthropic(base_url=srv.base_url, ...)``) against
the local server: replies parse into ``anthropic.types.Message`` (also under the SDK's strict
response validation), each fault surfaces as the SDK's exception for its status, the server's
timeout and dropped connection surface as ``APITimeoutError`` / ``APIConnectionError``, and the
log's oracles (``repeated_requests``, ``usage_totals``) count what they claim to.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import anthropic
import pytest
from anthropic.types import Message, TextBlock, ToolUseBlock

from tests.support import messages_server as ms

MODEL = "claude-haiku-4-5"
KEY = "test-key"
USER = [{"role": "user", "content": "plan a trip"}]


@pytest.fixture
def make_client() -> Iterator[Any]:
    clients: list[anthropic.Anthropic] = []

    def make(srv: Any, *, strict: bool = False, api_key: str = KEY) -> anthropic.Anthropic:
        client = anthropic.Anthropic(
            base_url=srv.base_url,
            api_key=api_key,
            max_retries=0,
            timeout=2.0,
            _strict_response_validation=strict,
        )
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()


def ask(client: anthropic.Anthropic, messages: list[dict[str, Any]], **kwargs: Any) -> Message:
    return client.messages.create(model=MODEL, max_tokens=256, messages=messages, **kwargs)  # type: ignore[arg-type]


def constant(r: Any) -> Any:
    return lambda _request: r


# -- ok replies


@pytest.mark.parametrize("strict", [False, True])
@pytest.mark.parametrize("stop_reason", ["end_turn", "max_tokens"])
def test_text_reply_parses_to_message_with_usage(make_client: Any, strict: bool, stop_reason: str) -> None:
    with ms.MessagesServer(constant(ms.text("hello", usage=(12, 7), stop_reason=stop_reason))) as srv:
        m = ask(make_client(srv, strict=strict), USER)

    assert isinstance(m, Message)
    assert m.type == "message" and m.role == "assistant" and m.model == MODEL
    assert m.id.startswith("msg_")
    assert len(m.content) == 1 and isinstance(m.content[0], TextBlock)
    assert m.content[0].text == "hello"
    assert m.stop_reason == stop_reason and m.stop_sequence is None
    assert (m.usage.input_tokens, m.usage.output_tokens) == (12, 7)
    assert (m.usage.cache_creation_input_tokens, m.usage.cache_read_input_tokens) == (0, 0)

    [entry] = srv.requests
    assert entry.kind == "ok" and entry.status == 200 and entry.usage == (12, 7)
    assert entry.body == {"model": MODEL, "max_tokens": 256, "messages": USER}
    assert entry.response is not None
    # exactly the documented fields, and they validate (not just construct) as a Message
    assert set(entry.response) == {"id", "type", "role", "model", "content", "stop_reason", "stop_sequence", "usage"}
    assert set(entry.response["usage"]) == {
        "input_tokens",
        "output_tokens",
        "cache_creation_input_tokens",
        "cache_read_input_tokens",
    }
    assert Message.model_validate(entry.response).model_dump() == m.model_dump()


def test_tool_use_reply_parses(make_client: Any) -> None:
    with ms.MessagesServer(constant(ms.tool_use("search", {"q": "lisbon", "n": 3}, usage=(20, 9)))) as srv:
        m = ask(make_client(srv, strict=True), USER)

    assert m.stop_reason == "tool_use"
    [block] = m.content
    assert isinstance(block, ToolUseBlock)
    assert block.type == "tool_use" and block.name == "search" and block.input == {"q": "lisbon", "n": 3}
    assert block.id.startswith("toolu_")
    assert srv.requests[0].response is not None
    assert srv.requests[0].response["content"] == [
        {"type": "tool_use", "id": block.id, "name": "search", "input": {"q": "lisbon", "n": 3}}
    ]


def test_several_tool_uses_in_one_reply_with_deterministic_ids(make_client: Any) -> None:
    several = ms.reply(
        blocks=[
            ms.text_block("Let me look."),
            ms.tool_use_block("search", {"q": "a"}),
            ms.tool_use_block("fetch", {"url": "https://example.com"}),
            ms.tool_use_block("search", {"q": "b"}, id="toolu_fixed"),
        ],
        stop_reason="tool_use",
    )
    with ms.MessagesServer(constant(several)) as srv:
        client = make_client(srv, strict=True)
        first = ask(client, USER)
        again = ask(client, USER)
        other = ask(client, [{"role": "user", "content": "another question"}])

    assert [b.type for b in first.content] == ["text", "tool_use", "tool_use", "tool_use"]
    uses = [b for b in first.content if isinstance(b, ToolUseBlock)]
    assert [(b.name, b.input) for b in uses] == [
        ("search", {"q": "a"}),
        ("fetch", {"url": "https://example.com"}),
        ("search", {"q": "b"}),
    ]
    ids = [b.id for b in uses]
    assert ids[2] == "toolu_fixed" and all(i.startswith("toolu_") for i in ids) and len(set(ids)) == 3
    # the same request gets the same answer, byte for byte; another request gets other ids
    assert again.model_dump() == first.model_dump()
    assert [b.id for b in other.content if isinstance(b, ToolUseBlock)][:2] != ids[:2]
    assert srv.requests[0].response == srv.requests[1].response


def test_delayed_reply_still_arrives(make_client: Any) -> None:
    with ms.MessagesServer(constant(ms.delayed(0.05, ms.text("slow")))) as srv:
        m = ask(make_client(srv), USER)
    assert m.content[0].text == "slow"  # type: ignore[union-attr]
    assert srv.requests[0].kind == "ok"


# -- faults


@pytest.mark.parametrize(
    ("status", "exc_type", "error_type"),
    [
        (429, anthropic.RateLimitError, "rate_limit_error"),
        (500, anthropic.InternalServerError, "api_error"),
        (529, anthropic.OverloadedError, "overloaded_error"),
        (400, anthropic.BadRequestError, "invalid_request_error"),
    ],
)
def test_fault_raises_the_sdk_error_for_its_status(
    make_client: Any, status: int, exc_type: type[anthropic.APIStatusError], error_type: str
) -> None:
    with ms.MessagesServer(constant(ms.fault(status))) as srv, pytest.raises(exc_type) as caught:
        ask(make_client(srv), USER)

    exc = caught.value
    assert type(exc) is exc_type
    assert exc.status_code == status
    assert exc.type == error_type
    assert isinstance(exc.body, dict) and set(exc.body) == {"type", "error"}
    assert exc.body["type"] == "error" and exc.body["error"]["type"] == error_type
    assert isinstance(exc.body["error"]["message"], str)
    assert exc.request_id is not None and exc.request_id.startswith("req_")
    if status == 429:
        assert exc.response.headers["retry-after"] == "1"
    if status == 529:
        assert isinstance(exc, anthropic.InternalServerError)  # OverloadedError subclasses it
    [entry] = srv.requests
    assert (entry.kind, entry.status, entry.usage) == ("fault", status, (0, 0))
    assert srv.usage_totals() == (0, 0)


def test_stream_true_is_rejected_without_asking_the_responder(make_client: Any) -> None:
    asked: list[dict[str, Any]] = []

    def responder(request: dict[str, Any]) -> Any:
        asked.append(request)
        return ms.text("never")

    with ms.MessagesServer(responder) as srv, pytest.raises(anthropic.BadRequestError) as caught:
        ask(make_client(srv), USER, stream=True)

    assert caught.value.status_code == 400
    assert caught.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    assert "stream" in caught.value.body["error"]["message"]  # type: ignore[index]
    assert asked == []
    assert srv.requests[0].body is not None
    assert srv.requests[0].body["stream"] is True


def test_timeout_fires_in_the_client(make_client: Any) -> None:
    started = time.monotonic()
    with ms.MessagesServer(constant(ms.timeout(30))) as srv:
        with pytest.raises(anthropic.APITimeoutError):
            ask(make_client(srv), USER, timeout=0.3)
        assert [r.kind for r in srv.requests] == ["timeout"]
    # closing the server ends its wait: no 30 s hang
    assert time.monotonic() - started < 5
    assert srv.usage_totals() == (0, 0)


def test_a_held_request_is_logged_while_it_is_held(make_client: Any) -> None:
    with ms.MessagesServer(constant(ms.timeout(30, then=ms.text("late")))) as srv:
        client = make_client(srv)
        with ThreadPoolExecutor(1) as pool:
            future = pool.submit(ask, client, USER, timeout=1.0)
            [entry] = srv.wait_for_requests(1)
            assert entry.kind == "timeout" and entry.status is None
            assert not future.done()
            with pytest.raises(anthropic.APITimeoutError):
                future.result()


@pytest.mark.parametrize("reset", [False, True])
def test_drop_raises_connection_error(make_client: Any, reset: bool) -> None:
    with (
        ms.MessagesServer(constant(ms.drop(reset=reset))) as srv,
        pytest.raises(anthropic.APIConnectionError) as caught,
    ):
        ask(make_client(srv), USER)
    assert not isinstance(caught.value, anthropic.APITimeoutError)
    assert [(r.kind, r.status) for r in srv.requests] == [("drop", None)]


# -- scripts and the log's oracles


def tool_result_turn(tool: ToolUseBlock, result: str) -> list[dict[str, Any]]:
    """The assistant's tool call and the user's tool result, as plain message params."""
    return [
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": tool.id, "name": tool.name, "input": tool.input}],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tool.id, "content": result}]},
    ]


def test_scripted_turns_faults_per_arrival_and_the_same_turn_asked_twice(make_client: Any) -> None:
    responder = ms.ScriptedResponder(
        {
            "plan a trip": [
                ms.tool_use("search", {"q": "lisbon"}, usage=(20, 5)),
                [ms.fault(529), ms.fault(429), ms.text("Go in May.", usage=(40, 8))],
            ]
        }
    )
    with ms.MessagesServer(responder) as srv:
        client = make_client(srv)
        first = ask(client, USER)
        tool = first.content[0]
        assert isinstance(tool, ToolUseBlock) and tool.name == "search"

        second_turn = USER + tool_result_turn(tool, "sunny in May")
        with pytest.raises(anthropic.OverloadedError):
            ask(client, second_turn)
        with pytest.raises(anthropic.RateLimitError):
            ask(client, second_turn)
        answer = ask(client, second_turn)
        assert answer.content[0].text == "Go in May."  # type: ignore[union-attr]
        # faults before the first ok answer are retries, not repeats
        assert srv.repeated_requests() == []

        # the answered turn asked again: the same answer, and the oracle lists the request
        again = ask(client, second_turn)
        assert again.model_dump() == answer.model_dump()
        [repeated] = srv.repeated_requests()
        assert json.loads(repeated) == {"messages": second_turn, "system": None, "tools": None, "user_id": None}
        assert repeated == ms.request_key({"messages": second_turn})

        # and the first turn asked again is listed too, after it (the order of first repetition)
        assert ask(client, USER).model_dump() == first.model_dump()
        assert srv.repeated_requests() == [repeated, ms.request_key({"messages": USER})]

    log = srv.requests_for("plan a trip")
    assert [(r.turn, r.kind, r.status) for r in log] == [
        (0, "ok", 200),
        (1, "fault", 529),
        (1, "fault", 429),
        (1, "ok", 200),
        (1, "ok", 200),
        (0, "ok", 200),
    ]
    assert responder.arrivals("plan a trip", 1) == 4
    assert all(b < a for b, a in zip((r.arrived for r in log), (r.arrived for r in log[1:]), strict=False))
    # every ok reply is billed, repeats included; faults carry no usage
    assert srv.usage_totals() == (20 + 40 + 40 + 20, 5 + 8 + 8 + 5)
    assert srv.usage_totals().input_tokens == 120


def test_metadata_user_id_names_the_conversation(make_client: Any) -> None:
    responder = ms.ScriptedResponder({"run-a": [ms.text("A")], "run-b": [ms.text("B")]})
    with ms.MessagesServer(responder) as srv:
        client = make_client(srv)
        a = ask(client, USER, metadata={"user_id": "run-a"})
        b = ask(client, USER, metadata={"user_id": "run-b"})
    assert (a.content[0].text, b.content[0].text) == ("A", "B")  # type: ignore[union-attr]
    assert [r.conversation for r in srv.requests] == ["run-a", "run-b"]
    assert len(srv.requests_for("run-a")) == 1
    # the same messages in two conversations are two calls, not a repeat
    assert srv.repeated_requests() == []


def test_system_and_tools_are_part_of_the_request_key(make_client: Any) -> None:
    tools = [{"name": "search", "description": "web search", "input_schema": {"type": "object"}}]
    with ms.MessagesServer(ms.ScriptedResponder({"plan a trip": [ms.text("ok")]})) as srv:
        client = make_client(srv)
        ask(client, USER, system="be brief")
        ask(client, USER, system="be brief", tools=tools)
        assert srv.repeated_requests() == []
        ask(client, USER, tools=tools, system="be brief")
        [repeated] = srv.repeated_requests()
    assert json.loads(repeated) == {"messages": USER, "system": "be brief", "tools": tools, "user_id": None}


def test_the_api_key_arrives_and_is_checked(make_client: Any) -> None:
    with ms.MessagesServer(constant(ms.text("hi")), api_key=KEY) as srv:
        ask(make_client(srv), USER)
        with pytest.raises(anthropic.AuthenticationError) as caught:
            ask(make_client(srv, api_key="wrong-key"), USER)

    ok, refused = srv.requests
    assert ok.api_key == KEY
    # anthropic 2.12.0 sends api_key as a bearer token; earlier SDKs sent x-api-key
    assert ok.headers.get("x-api-key") == KEY or ok.headers.get("authorization") == f"Bearer {KEY}"
    assert ok.headers["anthropic-version"]
    assert caught.value.status_code == 401 and caught.value.type == "authentication_error"
    assert (refused.api_key, refused.kind, refused.status) == ("wrong-key", "fault", 401)


def test_a_responder_error_answers_500_and_fails_the_block(make_client: Any) -> None:
    with pytest.raises(RuntimeError, match="no script for conversation"):  # noqa: SIM117
        with ms.MessagesServer(ms.ScriptedResponder({"known": [ms.text("x")]})) as srv:
            with pytest.raises(anthropic.InternalServerError) as caught:
                ask(make_client(srv), USER)
            assert caught.value.response.headers["x-should-retry"] == "false"
    assert len(srv.responder_errors) == 1


def test_concurrent_requests_are_all_logged(make_client: Any) -> None:
    def echo(request: dict[str, Any]) -> ms.Reply:
        conversation = ms.conversation_of(request)
        assert conversation is not None
        return ms.text("re: " + conversation)

    responder = ms.ScriptedResponder(default=echo)
    with ms.MessagesServer(responder) as srv:
        client = make_client(srv)
        questions = [f"question {i}" for i in range(16)]
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda q: ask(client, [{"role": "user", "content": q}]), questions))
    assert [a.content[0].text for a in answers] == [f"re: {q}" for q in questions]  # type: ignore[union-attr]
    assert sorted(r.seq for r in srv.requests) == list(range(16))
    assert sorted((r.conversation for r in srv.requests), key=str) == sorted(questions)
    assert srv.usage_totals() == (16 * ms.DEFAULT_USAGE[0], 16 * ms.DEFAULT_USAGE[1])
    assert srv.repeated_requests() == []
