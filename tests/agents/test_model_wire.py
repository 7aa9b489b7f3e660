"""``AnthropicModel.complete`` reads the Messages API's JSON itself (``client.post(..., cast_to=bytes)``)
instead of the SDK's parsed ``Message``: what it sends and what it returns must be what
``client.messages.create`` sent and what ``Message.model_dump(exclude_none=True)`` returned."""

from __future__ import annotations

from typing import Any

import anthropic
import pytest
from anthropic._models import construct_type
from anthropic.types import Message

from raysaga.agents import AnthropicModel
from raysaga.agents.messages import ModelRequest, ModelResponse, Usage
from raysaga.agents.models import response_of
from tests.support import messages_server as ms

KEY = "test-key"
MODEL = "claude-haiku-4-5"


def sdk_response(data: dict[str, Any]) -> ModelResponse:
    """What ``complete`` returned when it went through ``messages.create`` (the SDK's parse)."""
    message = construct_type(type_=Message, value=data)
    assert isinstance(message, Message)
    return ModelResponse(
        content=[block.model_dump(mode="json", exclude_none=True) for block in message.content],
        stop_reason=message.stop_reason,
        usage=Usage(input_tokens=message.usage.input_tokens, output_tokens=message.usage.output_tokens,
                    cache_read_input_tokens=message.usage.cache_read_input_tokens or 0,
                    cache_creation_input_tokens=message.usage.cache_creation_input_tokens or 0),
        model=message.model,
    )


BODIES: list[dict[str, Any]] = [
    {"id": "msg_1", "type": "message", "role": "assistant", "model": MODEL, "stop_reason": "tool_use",
     "stop_sequence": None,
     "usage": {"input_tokens": 12, "output_tokens": 7, "cache_read_input_tokens": None,
               "cache_creation_input_tokens": 3, "server_tool_use": None},
     "content": [
         {"type": "text", "text": "Looking.", "citations": None},
         # the model's own JSON keeps its nulls, at any depth
         {"type": "tool_use", "id": "toolu_1", "name": "search",
          "input": {"q": None, "filters": {"lang": None, "tags": [None, {"x": None}]}}, "caller": None},
     ]},
    {"id": "msg_2", "type": "message", "role": "assistant", "model": MODEL, "stop_reason": "end_turn",
     "stop_sequence": None, "usage": {"input_tokens": 1, "output_tokens": 1},
     "content": [
         {"type": "text", "text": "Cited.", "citations": [
             {"type": "char_location", "cited_text": "a", "document_index": 0, "document_title": None,
              "start_char_index": 0, "end_char_index": 1, "file_id": None}]},
         {"type": "a_block_type_from_a_newer_api", "payload": {"kept": 1}, "empty": None},
     ]},
    {"id": "msg_3", "type": "message", "role": "assistant", "model": MODEL, "stop_reason": "max_tokens",
     "stop_sequence": None, "usage": {"input_tokens": 5, "output_tokens": 256}, "content": []},
]


@pytest.mark.parametrize("body", BODIES, ids=["tool_use", "citations_and_unknown_block", "empty"])
def test_the_json_reads_as_the_sdks_parse_of_it(body: dict[str, Any]) -> None:
    assert response_of(body).model_dump() == sdk_response(body).model_dump()


def test_complete_sends_what_messages_create_sends_and_returns_what_it_returned(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAYSAGA_TEST_WIRE_KEY", KEY)
    answer = ms.tool_use("lookup", {"query": "item-1", "page": None}, text="Let me look.")
    with ms.MessagesServer(lambda body: answer, api_key=KEY, model=MODEL) as srv:
        model = AnthropicModel(MODEL, max_tokens=64, base_url=srv.base_url, api_key_env="RAYSAGA_TEST_WIRE_KEY")
        request = ModelRequest(model=MODEL, system="Be brief.", max_tokens=64, metadata={"user_id": "u1"},
                               messages=[{"role": "user", "content": "Look item-1 up."}],
                               tools=[{"name": "lookup", "description": "Look it up.",
                                       "input_schema": {"type": "object", "properties": {}}}])
        ours = model.complete(request)
        client = anthropic.Anthropic(api_key=KEY, base_url=srv.base_url, max_retries=0)
        sdk_kwargs: dict[str, Any] = {"model": MODEL, "system": "Be brief.", "max_tokens": 64,
                                      "metadata": {"user_id": "u1"}, "messages": request.messages,
                                      "tools": request.tools}
        message = client.messages.create(**sdk_kwargs)
        sent = [r for r in srv.requests if r.path == "/v1/messages"]
    assert [r.status for r in sent] == [200, 200]
    assert sent[0].body == sent[1].body
    for name in ("anthropic-version", "authorization", "content-type", "accept"):
        assert sent[0].headers.get(name) == sent[1].headers.get(name), name
    assert ours.content == [block.model_dump(mode="json", exclude_none=True) for block in message.content]
    assert ours.content[1]["input"] == {"query": "item-1", "page": None}
    assert (ours.stop_reason, ours.model, ours.usage.input_tokens, ours.usage.output_tokens) == (
        message.stop_reason, message.model, message.usage.input_tokens, message.usage.output_tokens)


@pytest.mark.parametrize("status", [429, 500, 529, 400, 404])
def test_an_error_status_raises_what_messages_create_raises(monkeypatch: pytest.MonkeyPatch, status: int) -> None:
    monkeypatch.setenv("RAYSAGA_TEST_WIRE_KEY", KEY)
    with ms.MessagesServer(lambda body: ms.fault(status), api_key=KEY, model=MODEL) as srv:
        model = AnthropicModel(MODEL, base_url=srv.base_url, api_key_env="RAYSAGA_TEST_WIRE_KEY")
        with pytest.raises(anthropic.APIStatusError) as ours:
            model.complete(ModelRequest(model=MODEL, max_tokens=8, messages=[{"role": "user", "content": "hi"}]))
        client = anthropic.Anthropic(api_key=KEY, base_url=srv.base_url, max_retries=0)
        with pytest.raises(anthropic.APIStatusError) as sdks:
            client.messages.create(model=MODEL, max_tokens=8, messages=[{"role": "user", "content": "hi"}])
    assert type(ours.value) is type(sdks.value)
    assert ours.value.status_code == sdks.value.status_code == status
