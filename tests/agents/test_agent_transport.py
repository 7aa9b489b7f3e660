"""Model transport faults, semantic tool errors, and the API key, through the real ``anthropic`` SDK.

The agent's model is ``AnthropicModel`` (client built with ``max_retries=0``) pointed at
``tests/support/messages_server.py``; the driver runs inline in this process unless a test says otherwise.

- Transport faults (529, 429, 500, a client timeout, a dropped connection) are retried by the
  harness with its durable backoff (``retry_scheduled`` events, ``retrying`` rows), never shown
  to the model: every retried request is byte-identical to the failed one, and the conversation
  and output equal a fault-free run's. Spent retries fail the node with ``ModelUnavailable``; a
  permanent error (400) is not retried at all.
- Semantic tool errors (``ToolError``, arguments that do not fit the schema, an unknown tool)
  reach the model in the *next* request as ``tool_result`` blocks with ``is_error: true``, and are
  never retried: the tool ran once (or, for bad arguments, not at all). A transient tool failure,
  by contrast, is retried and invisible.
- Invariant 7: a canary API key, used by a driver subprocess logging at DEBUG, reaches the server
  and nothing else: not the SQLite files, the event log, ``raysaga status``/``events``, nor the
  process's output.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import raysaga
from raysaga import RetryPolicy, Workflow
from raysaga.agents import Agent, AnthropicModel, ToolError, tool
from raysaga.orchestrator.cli import app
from raysaga.state import NodeStatus, RunStatus, SqlStore
from tests.support import agent_flows as af
from tests.support import crash_driver as harness
from tests.support import messages_server as ms
from tests.support.services import FakeServices

MODEL = "claude-haiku-4-5"
PROMPT = "Compare the weather in Lisbon and Porto."
FAST = RetryPolicy(max_attempts=6, base=0.01, cap=0.05)
called: Counter[str] = Counter()  # tool calls made in this process (the inline executor runs them here)


@pytest.fixture(autouse=True)
def test_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")
    called.clear()


@tool
def weather(city: str) -> str:
    """Today's weather in a city."""
    called["weather"] += 1
    return f"{city}: sunny, {len(city) + 14} C"


@tool
def record(record_id: int) -> str:
    """Read a record by id."""
    called["record"] += 1
    raise ToolError(f"there is no record {record_id}")


@tool(retry=RetryPolicy(max_attempts=3, base=0.01, cap=0.02))
def fetch(url: str) -> str:
    """Fetch a page (its first call fails with a dropped connection)."""
    called["fetch"] += 1
    if called["fetch"] == 1:
        raise ConnectionError("connection reset by peer")
    return f"<html>{url}</html>"


def flow(srv: Any, *, retry: RetryPolicy = FAST, timeout: float = 1.0, name: str = "transport") -> Workflow:
    agent = Agent("assistant", AnthropicModel(MODEL, base_url=srv.base_url, timeout=timeout),
                  tools=(weather, record, fetch), transport_retry=retry, max_turns=5)
    wf = Workflow(name, version="1")

    @wf.agent(agent)
    def ask(input: str) -> str:
        return input

    return wf


def weather_script(turn0: Any = (), turn1: Any = (), turn2: Any = ()) -> list[list[Any]]:
    """Turns 0 and 1 ask for the weather in one city each, turn 2 answers; faults come first."""
    return [[*turn0, ms.tool_use("weather", {"city": "Lisbon"}, usage=(50, 10))],
            [*turn1, ms.tool_use("weather", {"city": "Porto"}, usage=(80, 12))],
            [*turn2, ms.text("Both sunny; Lisbon is warmer.", usage=(120, 20))]]


def run(wf: Workflow, db: str, run_id: str) -> Any:
    return raysaga.run(wf, PROMPT, store=db, run_id=run_id, executor="inline")


def store_view(db: str, run_id: str) -> tuple[Any, dict[str, Any], list[Any]]:
    store = SqlStore(db)
    try:
        return store.get_run(run_id), {n.label: n for n in store.nodes(run_id)}, store.events(run_id)
    finally:
        store.close()


# ---------------------------------------------------------------------- transport faults


FAULTS = {
    0: [ms.fault(529)],
    1: [ms.fault(429), ms.fault(500)],
    2: [ms.timeout(3.0), ms.drop()],
}
SDK_ERRORS = {0: ["OverloadedError"], 1: ["RateLimitError", "InternalServerError"],
              2: ["APITimeoutError", "APIConnectionError"]}


def test_transport_faults_are_retried_and_invisible_to_the_model(sqlite_url: str) -> None:
    with ms.MessagesServer(ms.ScriptedResponder({PROMPT: weather_script()})) as clean:
        reference = run(flow(clean), sqlite_url, "clean")
    assert reference.status == RunStatus.COMPLETED, reference.error
    clean_keys = [r.key for r in clean.requests]
    assert [r.kind for r in clean.requests] == ["ok"] * 3

    script = weather_script(FAULTS[0], FAULTS[1], FAULTS[2])
    with ms.MessagesServer(ms.ScriptedResponder({PROMPT: script})) as srv:
        record_ = run(flow(srv), sqlite_url, "faulty")
    assert record_.status == RunStatus.COMPLETED, record_.error
    assert record_.output == reference.output == {"ask": "Both sunny; Lisbon is warmer."}

    # each fault was retried: the server saw it, then the same request again
    log = srv.requests
    assert [(r.turn, r.kind, r.status) for r in log] == [
        (0, "fault", 529), (0, "ok", 200),
        (1, "fault", 429), (1, "fault", 500), (1, "ok", 200),
        (2, "timeout", None), (2, "drop", None), (2, "ok", 200)]
    # invisible: a retried request is byte-identical to the failed one (the fault left no trace
    # in the messages), and the conversation is the fault-free run's
    for turn in range(3):
        bodies = {json.dumps(r.body, sort_keys=True) for r in log if r.turn == turn}
        assert len(bodies) == 1, f"turn {turn}'s retries differ from its first request"
    assert [r.key for r in log if r.kind == "ok"] == clean_keys
    assert srv.repeated_requests() == []

    # and the harness counted them as retries, durably, with the SDK's classified errors
    run_row, nodes, events = store_view(sqlite_url, "faulty")
    retries = [e for e in events if e.kind == "retry_scheduled"]
    assert {t: [e.data["error"]["type"] for e in retries if e.node_id == f"ask@{t}"] for t in range(3)} == SDK_ERRORS
    assert all(e.data["error"]["transient"] for e in retries)
    assert run_row.retries_used == 5
    assert {t: nodes[f"ask@{t}"].attempt for t in range(3)} == {0: 2, 1: 3, 2: 3}
    assert all(n.status == NodeStatus.COMPLETED for n in nodes.values())
    # faults carry no usage: what the store counted is what the server billed
    billed = srv.usage_totals()
    assert run_row.tokens_used == billed.input_tokens + billed.output_tokens == reference.tokens_used == 292


def test_spent_transport_retries_fail_the_node_with_model_unavailable(sqlite_url: str) -> None:
    script = [[ms.fault(529)]]  # overloaded, every time
    with ms.MessagesServer(ms.ScriptedResponder({PROMPT: script})) as srv:
        record_ = run(flow(srv, retry=RetryPolicy(max_attempts=3, base=0.01, cap=0.02)), sqlite_url, "spent")

    assert [(r.kind, r.status) for r in srv.requests] == [("fault", 529)] * 3
    assert record_.status == RunStatus.FAILED
    _, nodes, events = store_view(sqlite_url, "spent")
    assert [e.data["error"]["type"] for e in events if e.kind == "retry_scheduled"] == ["OverloadedError"] * 2
    model_call, agent_node = nodes["ask@0"], nodes["ask"]
    assert (model_call.status, model_call.attempt) == (NodeStatus.FAILED, 3)
    assert model_call.error is not None and model_call.error["reason"] == "3 attempts exhausted"
    assert agent_node.status == NodeStatus.FAILED and agent_node.error is not None
    assert agent_node.error["type"] == "ModelUnavailable"
    assert "turn 0" in agent_node.error["message"] and "OverloadedError" in agent_node.error["message"]
    assert record_.error is not None and record_.error["type"] == "ModelUnavailable"
    assert record_.tokens_used == 0


def test_a_permanent_model_error_is_not_retried(sqlite_url: str) -> None:
    script = [[ms.fault(400, "messages: roles must alternate")]]
    with ms.MessagesServer(ms.ScriptedResponder({PROMPT: script})) as srv:
        record_ = run(flow(srv), sqlite_url, "bad-request")

    assert [(r.kind, r.status) for r in srv.requests] == [("fault", 400)]
    assert record_.status == RunStatus.FAILED
    _, nodes, events = store_view(sqlite_url, "bad-request")
    assert not [e for e in events if e.kind == "retry_scheduled"]
    assert nodes["ask@0"].attempt == 1 and nodes["ask@0"].error["transient"] is False
    assert "BadRequestError" in nodes["ask"].error["message"]
    assert nodes["ask"].error["type"] == "ModelCallFailed"


# ---------------------------------------------------------------------- semantic tool errors


def test_semantic_tool_errors_reach_the_model_and_are_never_retried(sqlite_url: str) -> None:
    asks = ms.reply([
        ms.tool_use_block("record", {"record_id": 7}),           # raises ToolError
        ms.tool_use_block("weather", {"town": "Lisbon"}),        # arguments that do not fit
        ms.tool_use_block("teleport", {"to": "Mars"}),           # no such tool
        ms.tool_use_block("fetch", {"url": "https://x.test"}),   # transient failure, then ok
    ], usage=(60, 30))
    script = [asks, ms.text("I could not read record 7.", usage=(200, 15))]
    with ms.MessagesServer(ms.ScriptedResponder({PROMPT: script})) as srv:
        record_ = run(flow(srv), sqlite_url, "tool-errors")
    assert record_.status == RunStatus.COMPLETED, record_.error

    first, second = srv.requests
    assert (first.turn, second.turn) == (0, 1) and srv.repeated_requests() == []
    uses = [b for b in first.response["content"] if b["type"] == "tool_use"]  # type: ignore[index]
    assistant, results = second.body["messages"][1:]  # type: ignore[index]
    assert assistant == {"role": "assistant", "content": uses}
    assert results["role"] == "user"
    blocks = results["content"]
    assert [b["type"] for b in blocks] == ["tool_result"] * 4
    assert [b["tool_use_id"] for b in blocks] == [u["id"] for u in uses]
    assert [b["is_error"] for b in blocks] == [True, True, True, False]
    refused, invalid, unknown, fetched = (b["content"] for b in blocks)
    assert refused == "there is no record 7"
    assert "invalid arguments for weather" in invalid and "city" in invalid
    assert "no tool named 'teleport'" in unknown and "weather" in unknown
    assert fetched == "<html>https://x.test</html>"  # the transient failure left no trace

    # never retried: the refusing tool ran once, the mis-called one never; only fetch retried
    assert called == Counter({"record": 1, "fetch": 2})
    _, nodes, events = store_view(sqlite_url, "tool-errors")
    assert [e.node_id for e in events if e.kind == "retry_scheduled"] == ["ask@0.3"]
    assert {k: nodes[f"ask@0.{k}"].attempt for k in range(4)} == {0: 1, 1: 0, 2: 0, 3: 2}
    assert all(nodes[f"ask@0.{k}"].status == NodeStatus.COMPLETED for k in range(4))


# ---------------------------------------------------------------------- invariant 7: the key


class FaultyOnce:
    """``agent_flows.reply_for``, but each turn's first request fails (529, dropped, 500): the
    error paths, whose records are stored, run with the key in the client too."""

    FIRST = {0: ms.fault(529), 1: ms.drop(), 2: ms.fault(500)}

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seen: Counter[int] = Counter()

    def __call__(self, request: dict[str, Any]) -> Any:
        turn = ms.turn_of(request)
        with self.lock:
            self.seen[turn] += 1
            first = self.seen[turn] == 1
        return self.FIRST[turn] if first else af.reply_for(request)


def test_the_api_key_never_leaves_the_model_call(tmp_path: Path) -> None:
    canary = f"sk-ant-canary-{uuid.uuid4()}"
    db_file = tmp_path / "secrets.db"
    db = f"sqlite:///{db_file}"
    with FakeServices() as services, \
            ms.MessagesServer(FaultyOnce(), api_key=canary) as srv:
        done = harness.finish(af.spawn(db, "secret-1", model_url=srv.base_url, services_url=services.url,
                                       api_key=canary, log_level="DEBUG"))
    assert done.returncode == 0, done.describe()
    assert done.result is not None and done.result["status"] == "completed"

    # the key did reach the model server, on every request (it refuses any other key)
    assert len(srv.requests) == 6 and {r.api_key for r in srv.requests} == {canary}
    assert [r.kind for r in srv.requests].count("ok") == 3
    assert "DEBUG" in done.stderr, "the driver should have logged at DEBUG (the test would be vacuous)"

    runner = CliRunner()
    outputs = {
        "status": runner.invoke(app, ["status", "secret-1", "--db", db]),
        "status --json": runner.invoke(app, ["status", "secret-1", "--db", db, "--json"]),
        "events": runner.invoke(app, ["events", "secret-1", "--db", db]),
    }
    for name, result in outputs.items():
        assert result.exit_code == 0, (name, result.output)
    assert json.loads(outputs["status --json"].stdout)["status"] == "completed"
    assert "retry_scheduled" in outputs["events"].stdout  # the error paths were exercised

    store = SqlStore(db)
    try:
        rows = [e.model_dump_json() for e in store.events("secret-1")]
    finally:
        store.close()
    files = sorted(tmp_path.glob("secrets.db*"))
    assert db_file in files
    places: dict[str, bytes] = {f"file {f.name}": f.read_bytes() for f in files}
    places.update({f"event row {i}": row.encode() for i, row in enumerate(rows)})
    places.update({f"`raysaga {name}`": (r.stdout + r.stderr).encode() for name, r in outputs.items()})
    places.update({"driver stdout": done.stdout.encode(), "driver stderr": done.stderr.encode()})
    leaks = [where for where, data in places.items() if canary.encode() in data]
    assert leaks == []
    # nor any part of its random tail (a truncated key is still a leak): every 12 characters of
    # it, and its first 8 (random hex: a chance match is ~1e-5 even in a large file)
    tail = canary.removeprefix("sk-ant-canary-")
    fragments = {tail[:8], *(tail[i:i + 12] for i in range(len(tail) - 11))}
    partial = sorted({where for where, data in places.items() for f in fragments if f.encode() in data})
    assert partial == []

