"""Review stop 51: a ``ToolError`` answer that could not be stored, and a 200 whose body is an error.

1. An effect tool raising ``ToolError`` took no effect, whatever its message holds: a lone
   surrogate (a file name ``os.listdir`` could not decode) or more than the run's output cap.
   Refused as an unstorable output, the call was recorded as one that *took effect*: the model
   was told not to call it again, its retry was refused, a rollback called its undo.
2. A gateway answering 200 with the API's error object (``{"type": "error", ...}``) is a
   transport error, retried: it was read as an empty reply, fed back three times to the model.

Agents call the real ``anthropic`` SDK against ``tests/support/messages_server.py``, inline, on
real SQLite files; the task's refusal is also checked on ``task.execute`` itself.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

import raysaga
from raysaga import Permanent, RetryPolicy, RunOptions, RunStatus, StepContext, Workflow
from raysaga.agents import Agent, AnthropicModel, Tool, ToolError, tool
from raysaga.orchestrator.speculation import tool_spec
from raysaga.orchestrator.task import NodeCall, execute
from raysaga.state import EffectStatus, NodeStatus, SqlStore, jsoncodec
from tests.support import messages_server as ms

HAIKU = "claude-haiku-4-5"
KEY = "sk-ant-test-key-stop51-0123456789"
FAST = RetryPolicy(max_attempts=3, base=0.001, cap=0.002)
#: A file name that is not UTF-8, as ``os.listdir`` gives it (``surrogateescape``): ``'label-\udcff.pdf'``.
BAD_NAME = b"label-\xff.pdf".decode("utf-8", "surrogateescape")


@pytest.fixture(autouse=True)
def test_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)


class Shipping:
    """An effect tool whose every call raises ``ToolError(message)``, and its undo; both logged."""

    def __init__(self, message: str) -> None:
        self.message = message
        self.ran: list[str] = []
        self.undone: list[str] = []

        def undo(order: str, output: Any = None) -> None:
            self.undone.append(order)

        @tool(effect=True, compensate=undo)
        def ship(order: str) -> str:
            """Ship an order."""
            self.ran.append(order)
            raise ToolError(self.message)

        self.tool: Tool = ship


def rolled_back_flow(base_url: str, shipping: Shipping) -> Workflow:
    """Agent ``a`` (may call ``ship``), then a critical step that fails: the run rolls back."""
    agent = Agent("a", AnthropicModel(HAIKU, base_url=base_url, timeout=5), tools=(shipping.tool,),
                  transport_retry=FAST)
    wf = Workflow("wf51", version="1")

    @wf.agent(agent)
    def a(input: str) -> str:
        return input

    @wf.step()
    def after(a: str) -> str:
        raise Permanent("downstream failed")

    return wf


def tool_result(request: ms.LoggedRequest) -> dict[str, Any]:
    """The one tool_result block of a request's last (user) message."""
    assert request.body is not None
    blocks = [b for b in request.body["messages"][-1]["content"] if b.get("type") == "tool_result"]
    assert len(blocks) == 1, blocks
    return dict(blocks[0])


def run_retried_call(sqlite_url: str, shipping: Shipping, *, max_output_bytes: int | None = None
                     ) -> tuple[raysaga.RunRecord, list[ms.LoggedRequest], dict[str, Any], list[Any]]:
    """The model calls ``ship(o1)``, is answered, calls it again, then answers: the run's record, the
    model requests, the rows by label and the ledger."""
    responder = ms.ScriptedResponder({"go": [ms.tool_use("ship", {"order": "o1"}),
                                             ms.tool_use("ship", {"order": "o1"}), ms.text("done")]})
    options = RunOptions() if max_output_bytes is None else RunOptions(max_output_bytes=max_output_bytes)
    with ms.MessagesServer(responder) as srv:
        record = raysaga.run(rolled_back_flow(srv.base_url, shipping), "go", store=sqlite_url, run_id="r",
                             executor="inline", options=options)
        requests = srv.requests
    store = SqlStore(sqlite_url)
    try:
        nodes = {n.label: n for n in store.nodes("r")}
        ledger = store.effects("r")
    finally:
        store.close()
    return record, requests, nodes, ledger


def assert_took_no_effect(record: raysaga.RunRecord, shipping: Shipping, nodes: dict[str, Any],
                          ledger: list[Any]) -> None:
    """Both calls ran (the retry was not refused), answered ``is_error``; nothing was undone."""
    assert record.status == RunStatus.FAILED, (record.status, record.status_reason)
    assert shipping.ran == ["o1", "o1"] and shipping.undone == []
    for label in ("a@0.0", "a@1.0"):
        row = nodes[label]
        assert row.status == NodeStatus.COMPLETED and row.error is None, (label, row.status, row.error)
        assert row.output["is_error"] is True and "ran" not in row.output, row.output
    assert not any(label.endswith(":compensate") for label in nodes), sorted(nodes)
    assert [e.status for e in ledger] == [EffectStatus.FAILED]  # one key, runnable again
    assert ledger[0].result["error"]["type"] == "ToolError"


def test_a_tool_error_holding_a_lone_surrogate_took_no_effect(sqlite_url: str) -> None:
    shipping = Shipping(f"cannot ship: label file {BAD_NAME} is missing")
    record, requests, nodes, ledger = run_retried_call(sqlite_url, shipping)
    assert_took_no_effect(record, shipping, nodes, ledger)
    mended = "cannot ship: label file label-\ufffd.pdf is missing"  # U+FFFD, as the model's own text gets
    assert nodes["a@0.0"].output["content"] == mended
    for request in requests[1:3]:  # the model is shown the error itself, both times
        assert tool_result(request) == {**tool_result(request), "content": mended, "is_error": True}


def test_a_tool_error_above_the_output_cap_is_cut_to_fit_and_took_no_effect(sqlite_url: str) -> None:
    cap = 6000  # the model turns' rows (about 500 bytes) fit; the error does not
    page = '<html>"bad gateway" \u00e9\U0001f600\t' * 400  # escapes and multi-byte characters: ~10,800 bytes
    shipping = Shipping(f"payment declined, the provider said: {page}")
    record, requests, nodes, ledger = run_retried_call(sqlite_url, shipping, max_output_bytes=cap)
    assert_took_no_effect(record, shipping, nodes, ledger)
    output = nodes["a@0.0"].output
    size = len(jsoncodec.dumps(output).encode("utf-8"))
    assert cap - 20 < size <= cap, size  # cut to fit, no shorter than it must be
    kept, note = output["content"].split("\n[raysaga: ", 1)
    assert shipping.message.startswith(kept) and len(kept) < len(shipping.message)
    assert note == (f"this error message was cut at {len(kept):,} of {len(shipping.message):,} characters, to "
                    "fit the run's output cap (RunOptions.max_output_bytes)]")
    assert tool_result(requests[1])["content"] == output["content"]  # what the model is shown, saying so


def test_a_tool_error_answer_refused_as_output_never_says_took_effect() -> None:
    """Under a cap too small for even the note, the call fails for good: not ``took_effect`` (its
    key runs again, nothing is undone). A tool's *returned* value refused still says it did."""
    shipping = Shipping("x" * 500)

    @tool(effect=True)
    def charge(order: str) -> dict[str, Any]:
        """Charge an order (its result looks like an error answer, but it was returned)."""
        return {"content": "y" * 500, "is_error": True}

    def attempt(t: Tool, cap: int) -> dict[str, Any]:
        ctx = StepContext(run_id="r", node_id="a@0.0", fan_index=-1, attempt=1, trace_id="t",
                          idempotency_key="r:a:tool:x")
        outcome = execute(tool_spec("a", t), NodeCall(ctx=ctx, kwargs={"args": {"order": "o1"}},
                                                       max_output_bytes=cap))
        if outcome.ok:
            assert outcome.output_json is not None
            return {"ok": json.loads(outcome.output_json)}
        assert outcome.error is not None
        return outcome.error

    tiny = attempt(shipping.tool, 40)
    assert tiny["type"] == "Permanent" and "above the cap of 40" in tiny["message"], tiny
    assert "took_effect" not in tiny and tiny["transient"] is False
    assert attempt(charge, 40)["took_effect"] is True
    fits = attempt(shipping.tool, 400)["ok"]
    assert fits["is_error"] is True and len(jsoncodec.dumps(fits).encode()) <= 400, fits


# ---------------------------------------------------------------------- 2. a 200 whose body is an error


def one_agent(base_url: str, attempts: int = 3) -> Workflow:
    agent = Agent("a", AnthropicModel(HAIKU, base_url=base_url, timeout=5),
                  transport_retry=RetryPolicy(max_attempts=attempts, base=0.001, cap=0.002))
    wf = Workflow("wf51m", version="1")

    @wf.agent(agent)
    def a(input: str) -> str:
        return input

    return wf


def retries_of(sqlite_url: str, run_id: str) -> list[dict[str, Any]]:
    store = SqlStore(sqlite_url)
    try:
        return [e.data["error"] for e in store.events(run_id) if e.kind == "retry_scheduled"]
    finally:
        store.close()


@pytest.mark.parametrize("answer", [
    ms.error_200("overloaded_error", f"Overloaded (key {KEY})"),
    ms.error_200(body={"error": {"type": "overloaded_error", "message": f"Overloaded (key {KEY})"}}),  # no type
], ids=["typed", "untyped"])
def test_a_200_whose_body_is_an_error_is_retried_as_a_transport_error(sqlite_url: str, answer: ms.Reply) -> None:
    with ms.MessagesServer(ms.ScriptedResponder({"hello": [[answer, ms.text("fine")]]})) as srv:
        record = raysaga.run(one_agent(srv.base_url), "hello", store=sqlite_url, run_id="gw", executor="inline")
        requests = srv.requests
    assert record.status == RunStatus.COMPLETED, (record.status_reason, record.error)
    assert record.output == {"a": "fine"}
    assert [(r.status, r.kind) for r in requests] == [(200, "fault"), (200, "ok")]
    assert requests[0].key == requests[1].key  # asked again as it was: the model was told nothing
    (error,) = retries_of(sqlite_url, "gw")
    assert error["transient"] is True and "overloaded_error: Overloaded (key [redacted])" in error["message"], error
    assert "empty" not in error["message"] and KEY not in json.dumps(error)


def test_a_200_error_that_lasts_fails_the_node_as_the_model_unavailable(sqlite_url: str) -> None:
    with ms.MessagesServer(ms.ScriptedResponder({"hello": [ms.error_200()]})) as srv:
        record = raysaga.run(one_agent(srv.base_url, attempts=2), "hello", store=sqlite_url, run_id="gw2",
                             executor="inline")
        requests = srv.requests
    assert record.status == RunStatus.FAILED
    assert len(requests) == 2 and len({r.key for r in requests}) == 1  # no "your reply was empty" fed back
    store = SqlStore(sqlite_url)
    try:
        row = {n.label: n for n in store.nodes("gw2")}["a"]
    finally:
        store.close()
    assert row.error is not None
    error = row.error.as_dict()
    assert error["type"] == "ModelUnavailable" and "overloaded_error: Overloaded" in error["message"], error


def test_a_200_message_without_a_type_is_still_read_as_a_message(sqlite_url: str) -> None:
    """Conservative: only an error object is retried; a message a gateway sends without its
    ``type`` (nor an ``error``) is read as today."""
    message = {"role": "assistant", "content": [{"type": "text", "text": "fine"}], "stop_reason": "end_turn",
               "usage": {"input_tokens": 3, "output_tokens": 2}}
    with ms.MessagesServer(ms.ScriptedResponder({"hello": [ms.error_200(body=message)]})) as srv:
        record = raysaga.run(one_agent(srv.base_url), "hello", store=sqlite_url, run_id="gw3", executor="inline")
    assert record.status == RunStatus.COMPLETED and record.output == {"a": "fine"}, record.status_reason
