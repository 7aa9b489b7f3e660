"""A tool result longer than ``Agent.max_tool_result_chars`` is cut for the model, told so; the
store keeps it whole. A conversation the API finds too long fails naming the option.

Agents call the real ``anthropic`` SDK against ``tests/support/messages_server.py`` with the
inline executor.
"""

from __future__ import annotations

from typing import Any

import pytest

import raysaga
from raysaga import RetryPolicy, Workflow
from raysaga.agents import Agent, AnthropicModel, tool
from raysaga.agents.agent import Turn, messages_for
from raysaga.agents.messages import ModelResponse
from raysaga.errors import InvalidOptionError
from raysaga.state import RunStatus, SqlStore
from tests.support import messages_server as ms
from tests.support.store_rows import nodes_of

HAIKU = "claude-haiku-4-5"
FAST = RetryPolicy(max_attempts=2, base=0.001, cap=0.002)
PAGE = "0123456789" * 25_000  # 250,000 characters: a web page, a log file


@pytest.fixture(autouse=True)
def test_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test-key-result-cap-0123456789")


@tool
def fetch(url: str) -> str:
    """Fetch a page."""
    return PAGE


def flow(base_url: str, **options: Any) -> Workflow:
    agent = Agent("a", AnthropicModel(HAIKU, base_url=base_url, timeout=5), tools=(fetch,),
                  transport_retry=FAST, **options)
    wf = Workflow("result_cap", version="1")

    @wf.agent(agent)
    def a(input: str) -> str:
        return input

    return wf


def told(request: ms.LoggedRequest) -> Any:
    assert request.body is not None
    blocks = [b for b in request.body["messages"][-1]["content"] if b.get("type") == "tool_result"]
    assert len(blocks) == 1, blocks
    return blocks[0]["content"]


@pytest.mark.parametrize("cap", [1_000, None])
def test_a_long_tool_result_is_cut_for_the_model_and_kept_whole(cap: int | None, sqlite_url: str) -> None:
    responder = ms.ScriptedResponder({"read it": [ms.tool_use("fetch", {"url": "https://example.com"}),
                                                  ms.text("read")]})
    options: dict[str, Any] = {"max_tool_result_chars": cap}
    with ms.MessagesServer(responder) as server:
        record = raysaga.run(flow(server.base_url, **options), "read it", store=sqlite_url, run_id="cap",
                             executor="inline")
        shown = told(server.requests[-1])
    assert record.status == RunStatus.COMPLETED, (record.status_reason, record.error)
    if cap is None:
        assert shown == PAGE
    else:
        assert shown.startswith(PAGE[:cap]) and not shown.startswith(PAGE[:cap + 1])
        assert f"cut at 1,000 of {len(PAGE):,} characters (Agent.max_tool_result_chars)" in shown
    calls = [n for key, n in nodes_of(sqlite_url, "cap").items() if key.startswith("a@0.")]
    assert len(calls) == 1 and calls[0].output_digest is not None  # parked as a blob: it is large
    store = SqlStore(sqlite_url)
    try:  # the store keeps what the tool returned
        digest = calls[0].output_digest
        assert store.load_blobs({digest: "the fetch call"})[digest]["content"] == PAGE
    finally:
        store.close()


def test_the_default_cap_cuts_only_what_is_longer_than_it() -> None:
    assert Agent("a", AnthropicModel(HAIKU)).max_tool_result_chars == 100_000
    response = ModelResponse(content=[{"type": "tool_use", "id": "t0", "name": "fetch", "input": {}}],
                             stop_reason="tool_use")
    for content in ("x" * 100_000, [{"type": "text", "text": "y" * 10}]):
        messages = messages_for("p", [Turn(response, {0: {"content": content, "is_error": False}})], None, 100_000)
        assert messages[-1]["content"][0]["content"] == content
    blocks = [{"type": "text", "text": "y" * 30}, {"type": "image", "source": {"type": "url", "url": "u"}}]
    messages = messages_for("p", [Turn(response, {0: {"content": blocks, "is_error": False}})], None, 20)
    cut = messages[-1]["content"][0]["content"]
    assert cut[0]["text"].startswith("y" * 20 + "\n[raysaga: this result was cut at 20 of 30") and cut[1] == blocks[1]


@pytest.mark.parametrize("bad", [0, -5, 1.5, "many", True])
def test_a_cap_that_is_no_whole_number_is_refused_naming_the_option(bad: Any) -> None:
    with pytest.raises(InvalidOptionError, match="max_tool_result_chars"):
        Agent("a", AnthropicModel(HAIKU), max_tool_result_chars=bad)


def test_a_conversation_too_long_for_the_model_fails_naming_the_option(sqlite_url: str) -> None:
    too_long = ms.fault(400, "prompt is too long: 215000 tokens > 200000 maximum")
    responder = ms.ScriptedResponder({"read it": [ms.tool_use("fetch", {"url": "https://example.com"}), too_long]})
    with ms.MessagesServer(responder) as server:
        record = raysaga.run(flow(server.base_url, max_tool_result_chars=None), "read it", store=sqlite_url,
                             run_id="long", executor="inline")
    assert record.status == RunStatus.FAILED
    message = record.error.message if record.error is not None else None
    assert message is not None and "prompt is too long" in message
    assert "Agent(max_tool_result_chars=...)" in message, message
