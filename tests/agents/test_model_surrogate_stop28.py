"""A lone surrogate in a model's answer (``"\\ud800"`` in the Messages API's JSON: ``json.loads``
makes one; no UTF-8 text can hold it) no longer fails the agent node for good: the response is
checkpointed with it replaced by U+FFFD (``agents.runtime.mended``), the node goes on, and the next
request, a resume and the run's output all read the same mended text. Through the real
``anthropic`` SDK against ``tests/support/messages_server.py``, driven inline.

Before: ``ModelCallFailed: NotJSONableError: model response['content'][0]['text'] holds a lone
surrogate``, permanent, the run failed."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

import raysaga
from raysaga import RetryPolicy, Workflow
from raysaga.agents import Agent, AnthropicModel, tool
from raysaga.agents.runtime import INVALID_INPUT, mended
from raysaga.state import RunStatus, SqlStore
from tests.support import messages_server as ms

MODEL = "claude-haiku-4-5"
PROMPT = "Say something odd."
called: list[str] = []


@pytest.fixture(autouse=True)
def _key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")
    called.clear()


@tool
def lookup(word: str) -> str:
    """Look a word up."""
    called.append(word)
    return f"{word}: a word"


def _flow(srv: ms.MessagesServer) -> Workflow:
    agent = Agent("speaker", AnthropicModel(MODEL, base_url=srv.base_url), tools=(lookup,), max_turns=4,
                  transport_retry=RetryPolicy(max_attempts=2, base=0.01, cap=0.01))
    wf = Workflow(f"surrogate_stop28_{uuid.uuid4().hex[:8]}", version="1")

    @wf.agent(agent)
    def ask(input: str) -> str:
        return input

    return wf


def _turns(url: str, run_id: str) -> dict[str, Any]:
    store = SqlStore(url)
    try:
        return {n.label: n.output for n in store.nodes(run_id) if "@" in n.label and "." not in n.label}
    finally:
        store.close()


def test_a_lone_surrogate_in_the_answer_is_mended_and_the_node_completes(store_url: str) -> None:
    script = {PROMPT: [ms.text("odd \ud800 text \udfff end")]}
    with ms.MessagesServer(ms.ScriptedResponder(script)) as srv:
        result = raysaga.run(_flow(srv), PROMPT, store=store_url, executor="inline")
    assert result.status == RunStatus.COMPLETED, result.error
    assert result.output == {"ask": "odd \ufffd text \ufffd end"}
    [turn] = _turns(store_url, result.run_id).values()
    assert turn["content"] == [{"type": "text", "text": "odd \ufffd text \ufffd end"}]
    assert [r.kind for r in srv.requests] == ["ok"]  # answered once: a mended answer is not a retry


def test_the_next_request_carries_the_mended_text_and_tools_still_run(store_url: str) -> None:
    script = {PROMPT: [ms.tool_use("lookup", {"word": "odd"}, text="let me \udc80 check"),
                       ms.text("done \ud83d")]}
    with ms.MessagesServer(ms.ScriptedResponder(script)) as srv:
        wf = _flow(srv)
        result = raysaga.run(wf, PROMPT, store=store_url, executor="inline")
        assert result.status == RunStatus.COMPLETED, result.error
        assert result.output == {"ask": "done \ufffd"}
        assert called == ["odd"]
        sent = srv.requests[1].body
        assert sent is not None
        [assistant] = [m for m in sent["messages"] if m["role"] == "assistant"]
        assert {"type": "text", "text": "let me \ufffd check"} in assistant["content"]
        # a resume of the finished run reads the stored, mended turns: no model call, same output
        again = raysaga.resume(wf, result.run_id, store=store_url, executor="inline")
    assert again.output == result.output and len(srv.requests) == 2


def test_a_lone_surrogate_in_a_tool_input_is_still_a_malformed_call_the_model_is_told_of(store_url: str) -> None:
    script = {PROMPT: [ms.tool_use("lookup", {"word": "bad \ud800"}), ms.text("sorry")]}
    with ms.MessagesServer(ms.ScriptedResponder(script)) as srv:
        result = raysaga.run(_flow(srv), PROMPT, store=store_url, executor="inline")
    assert result.status == RunStatus.COMPLETED, result.error
    assert called == []  # the tool never ran with an argument changed behind the model's back
    first = _turns(store_url, result.run_id)["ask@0"]
    [use] = [b for b in first["content"] if b["type"] == "tool_use"]
    assert INVALID_INPUT in use["input"] and "surrogate" in use["input"][INVALID_INPUT]


def test_mended_replaces_only_lone_surrogates_keys_included() -> None:
    value = {"k\ud800": ["a\udfffb", 1, None, {"t": "fine ✓ 😀"}], "n": 2.5}
    assert mended(value) == {"k\ufffd": ["a\ufffdb", 1, None, {"t": "fine ✓ 😀"}], "n": 2.5}
