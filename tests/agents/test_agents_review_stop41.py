"""The agent runtime's fixes of review stop 41, one test (or a few) per finding.

Agents call the real ``anthropic`` SDK against ``tests/support/messages_server.py`` (or, for a
reply that is no JSON, a small server of this module), with the inline executor; the failure
classification is checked on the exceptions real connections raise; the turn rules (a cut-off
reply) on their own as well, with no driver.
"""

from __future__ import annotations

import datetime
import enum
import json
import socket
import struct
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest
import requests
from pydantic import BaseModel

import raysaga
from raysaga import Permanent, RetryPolicy, RunOptions, Workflow
from raysaga.agents import Agent, AnthropicModel, ToolError, tool
from raysaga.agents.agent import Turn, messages_for
from raysaga.agents.messages import ModelResponse
from raysaga.agents.turns import Answer, Conversation, next_actions
from raysaga.errors import InvalidOptionError
from raysaga.orchestrator.retry import is_transient
from raysaga.state import EffectStatus, NodeStatus, RunStatus, SqlStore
from tests.support import messages_server as ms
from tests.support.store_rows import nodes_of

HAIKU = "claude-haiku-4-5"
KEY = "sk-ant-test-key-stop41-0123456789"
FAST = RetryPolicy(max_attempts=3, base=0.001, cap=0.002)


@pytest.fixture(autouse=True)
def test_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)


def agent_flow(base_url: str, tools: tuple[Any, ...], *, name: str = "wf", **options: Any) -> Workflow:
    """A workflow of one agent (``a``) whose prompt is the run's input."""
    model = AnthropicModel(HAIKU, base_url=base_url, timeout=5)
    agent = Agent("a", model, tools=tools, transport_retry=FAST, **options)
    wf = Workflow(name, version="1")

    @wf.agent(agent)
    def a(input: str) -> str:
        return input

    return wf


def tool_results(request: ms.LoggedRequest) -> list[dict[str, Any]]:
    """The tool_result blocks of a request's last (user) message."""
    assert request.body is not None
    content = request.body["messages"][-1]["content"]
    assert isinstance(content, list), content
    return [b for b in content if b.get("type") == "tool_result"]


# ---------------------------------------------------------------------- 1. typed tool parameters


class Item(BaseModel):
    sku: str
    qty: int


class Order(BaseModel):
    items: list[Item]


class Priority(enum.Enum):
    LOW = "low"
    HIGH = "high"


SEEN: list[tuple[str, ...]] = []


def unbook(output: Any, order: Order, when: datetime.date, priority: Priority = Priority.LOW) -> None:
    SEEN.append(("undo", type(order).__name__, type(when).__name__, type(priority).__name__))


@tool(effect=True, compensate=unbook)
def book(order: Order, when: datetime.date, priority: Priority = Priority.LOW,
         idempotency_key: str | None = None) -> str:
    """Book an order."""
    SEEN.append(("call", type(order).__name__, type(when).__name__, type(priority).__name__))
    return f"{sum(i.qty for i in order.items)} items on {when.isoformat()} priority {priority.value}"


@pytest.fixture
def seen() -> Iterator[list[tuple[str, ...]]]:
    SEEN.clear()
    yield SEEN
    SEEN.clear()


BOOKING = {"order": {"items": [{"sku": "w", "qty": 2}]}, "when": "2025-01-02", "priority": "high"}


def test_a_tool_and_its_undo_get_their_parameters_as_the_declared_types(
        seen: list[tuple[str, ...]], sqlite_url: str) -> None:
    responder = ms.ScriptedResponder({"book it": [ms.tool_use("book", BOOKING), ms.text("booked")]})
    with ms.MessagesServer(responder) as server:
        model = AnthropicModel(HAIKU, base_url=server.base_url, timeout=5)
        wf = Workflow("typed", version="1")

        @wf.agent(Agent("a", model, tools=(book,), transport_retry=FAST))
        def a(input: str) -> str:
            return input

        @wf.step()
        def ship(a: str) -> str:
            raise Permanent("nothing to ship")  # the run rolls back: the booking is undone

        record = raysaga.run(wf, "book it", store=sqlite_url, run_id="typed", executor="inline")
        told = tool_results(server.requests[-1])
    assert record.status == RunStatus.COMPENSATED, (record.status_reason, record.error)
    assert told[0]["is_error"] is False and told[0]["content"] == "2 items on 2025-01-02 priority high"
    assert seen == [("call", "Order", "date", "Priority"), ("undo", "Order", "date", "Priority")]


# ---------------------------------------------------------------------- 2. transport errors of HTTP clients


@pytest.fixture
def refusing_port() -> Iterator[int]:
    """A port bound and not listening: a connection to it is refused (Linux answers RST)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    try:
        yield sock.getsockname()[1]
    finally:
        sock.close()


def raised(call: Callable[[], object]) -> BaseException:
    try:
        call()
    except Exception as exc:
        return exc
    raise AssertionError("it did not raise")


class Timeout(Exception):
    """A user's own class named like requests' (a business rule's timeout): no transport error."""


def test_refused_connections_of_requests_and_urllib_are_transient(refusing_port: int) -> None:
    url = f"http://127.0.0.1:{refusing_port}/x"
    by_requests = raised(lambda: requests.get(url, timeout=5))
    assert isinstance(by_requests, requests.ConnectionError) and not isinstance(by_requests, ConnectionError)
    assert is_transient(by_requests)
    by_urllib = raised(lambda: urllib.request.urlopen(url, timeout=5))
    assert isinstance(by_urllib, urllib.error.URLError)
    assert is_transient(by_urllib)
    assert is_transient(urllib.error.URLError(TimeoutError("timed out")))
    assert is_transient(raised(lambda: httpx.get(url, timeout=5)))

    def wrapped() -> None:  # a tool hiding its library's error in its own
        try:
            requests.get(url, timeout=5)
        except requests.RequestException as exc:
            raise RuntimeError("fetching the page failed") from exc

    assert is_transient(raised(wrapped))
    for exc in (requests.Timeout(), requests.exceptions.ChunkedEncodingError(), httpx.ReadError("reset"),
                httpx.WriteError("reset"), httpx.PoolTimeout("busy"), httpx.NetworkError("down"),
                socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")):
        assert is_transient(exc), exc
    # by name *and* package: a class of the user's called Timeout is not a transport error, nor
    # a certificate refused, nor a URLError that says nothing of the connection
    refused: tuple[BaseException, ...] = (Timeout("the quote expired"),
                                          requests.exceptions.SSLError("certificate verify failed"),
                                          urllib.error.URLError("unknown url type: ftpx"))
    for problem in refused:
        assert not is_transient(problem), problem


class ResettingService:
    """An HTTP service restarting: it resets its first ``resets`` connections (TCP RST), then answers."""

    def __init__(self, resets: int) -> None:
        self.resets = resets
        self.connections = 0
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port: int = self.sock.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)
                self.connections += 1
                if self.connections <= self.resets:
                    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                else:
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nup")

    def close(self) -> None:
        self.sock.shutdown(socket.SHUT_RDWR)  # wakes the accept (a close alone does not, on Linux)
        self.sock.close()
        self.thread.join(5)


@pytest.mark.parametrize("lib", ["requests", "httpx"])
def test_a_tool_whose_http_call_is_reset_is_retried(lib: str, sqlite_url: str) -> None:
    service = ResettingService(resets=2)
    attempts: list[str] = []

    @tool(retry=RetryPolicy(max_attempts=3, base=0.001, cap=0.002))
    def fetch(path: str) -> str:
        """Fetch a page of the internal service."""
        attempts.append(path)
        url = f"http://127.0.0.1:{service.port}{path}"
        return requests.get(url, timeout=5).text if lib == "requests" else httpx.get(url, timeout=5).text

    responder = ms.ScriptedResponder({"fetch": [ms.tool_use("fetch", {"path": "/status"}), ms.text("done")]})
    try:
        with ms.MessagesServer(responder) as server:
            record = raysaga.run(agent_flow(server.base_url, (fetch,)), "fetch", store=sqlite_url, run_id="reset",
                                 executor="inline")
            told = tool_results(server.requests[-1])
    finally:
        service.close()
    assert record.status == RunStatus.COMPLETED, (record.status_reason, record.error)
    assert len(attempts) == 3 and service.connections == 3
    assert told[0] == {**told[0], "content": "up", "is_error": False}


# ---------------------------------------------------------------------- 3. an effect whose result is not JSON


CHARGES: list[tuple[str, int]] = []


@tool(effect=True, key=("card", "amount"))
def charge(card: str, amount: int, idempotency_key: str | None = None) -> Any:
    """Charge a card; what the provider returns is not always JSON."""
    CHARGES.append((card, amount))
    if card == "surrogate":
        return "charged \ud800"  # a lone surrogate: no UTF-8 text can hold it
    return {"charge_id": "ch_1", "at": datetime.datetime(2025, 1, 1)}


@pytest.fixture
def charges() -> Iterator[list[tuple[str, int]]]:
    CHARGES.clear()
    yield CHARGES
    CHARGES.clear()


@pytest.mark.parametrize("card", ["4242", "surrogate"])
def test_an_effect_that_ran_but_could_not_be_stored_is_not_run_again(
        card: str, charges: list[tuple[str, int]], sqlite_url: str) -> None:
    call = ms.tool_use("charge", {"card": card, "amount": 10}, usage=(20, 10))
    responder = ms.ScriptedResponder({"charge": [call, ms.tool_use("charge", {"card": card, "amount": 10}),
                                                 ms.text("done")]})
    with ms.MessagesServer(responder) as server:
        wf = agent_flow(server.base_url, (charge,))
        # turn 0's usage spends the budget: the run pauses once the call's outcome is recorded, and
        # the model's second call is decided by a resumed driver, from the ledger in the store
        paused = raysaga.run(wf, "charge", store=sqlite_url, run_id="nj", executor="inline",
                             options=RunOptions(token_budget=30))
        assert paused.status == RunStatus.PAUSED, (paused.status_reason, paused.error)
        done = raysaga.resume(wf, "nj", store=sqlite_url, executor="inline",
                              options=RunOptions(token_budget=10_000))
        first, second = tool_results(server.requests[1])[0], tool_results(server.requests[2])[0]
        assert server.repeated_requests() == []
    assert done.status == RunStatus.COMPLETED, (done.status_reason, done.error)
    assert charges == [(card, 10)]
    assert first["is_error"] is True and first["content"].startswith("charge ran and took effect, but its result "
                                                                      "could not be stored"), first
    assert "failed" not in first["content"].split("Why:")[0]
    assert second["is_error"] is True and second["content"].startswith("not run: charge already ran"), second
    store = SqlStore(sqlite_url)
    try:
        effects = store.effects("nj")
    finally:
        store.close()
    (effect,) = effects  # settled, saying the call took effect (``abandoned``, or ``failed`` as rows once were)
    assert effect.status in (EffectStatus.ABANDONED, EffectStatus.FAILED), effect
    assert isinstance(effect.result, dict) and effect.result["error"]["took_effect"] is True, effect
    nodes = nodes_of(sqlite_url, "nj")
    assert nodes["a@0.0"].status == NodeStatus.FAILED and nodes["a@1.0"].status == NodeStatus.COMPLETED


# ---------------------------------------------------------------------- 4. tool calls of a cut-off reply


SENT: list[tuple[str, str, str]] = []


@tool(effect=True, key=("to", "subject"))
def send_email(to: str, subject: str, body: str = "") -> str:
    """Send an email."""
    SENT.append((to, subject, body))
    return "sent"


def cut_reply(*calls: tuple[str, dict[str, Any]]) -> ms.Reply:
    blocks = [ms.text_block("Sending it."), *(ms.tool_use_block(name, args) for name, args in calls)]
    return ms.reply(blocks, "max_tokens", usage=(50, 1024))


@pytest.fixture
def sent() -> Iterator[list[tuple[str, str, str]]]:
    SENT.clear()
    yield SENT
    SENT.clear()


def test_no_tool_of_a_reply_cut_off_by_max_tokens_runs(sent: list[tuple[str, str, str]], sqlite_url: str) -> None:
    half = {"to": "bob@example.com", "subject": "Contract", "body": "Hi Bob, the contract says we must not"}
    whole = {"to": "bob@example.com", "subject": "Contract", "body": "Hi Bob, all is well."}
    responder = ms.ScriptedResponder({"email bob": [
        cut_reply(("send_email", half), ("send_email", {"to": "ann@example.com", "subject": "Cc"})),
        ms.tool_use("send_email", whole), ms.text("done")]})
    with ms.MessagesServer(responder) as server:
        wf = agent_flow(server.base_url, (send_email,))
        # turn 0's usage spends the budget: the resume rebuilds turn 1's request from the store
        paused = raysaga.run(wf, "email bob", store=sqlite_url, run_id="cut", executor="inline",
                             options=RunOptions(token_budget=1000))
        assert paused.status == RunStatus.PAUSED, (paused.status_reason, paused.error)
        assert sent == []
        done = raysaga.resume(wf, "cut", store=sqlite_url, executor="inline", options=RunOptions(token_budget=10_000))
        told = tool_results(server.requests[1])
        assert server.repeated_requests() == []
    assert done.status == RunStatus.COMPLETED, (done.status_reason, done.error)
    assert sent == [("bob@example.com", "Contract", "Hi Bob, all is well.")]  # the shorter call of turn 1 only
    assert [r["is_error"] for r in told] == [True, True]
    assert all("cut off (stop_reason 'max_tokens')" in r["content"] and "Ask again" in r["content"] for r in told)


def test_a_cut_off_reply_is_decided_the_same_when_replayed() -> None:
    model = AnthropicModel(HAIKU, base_url="http://127.0.0.1:9")
    agent = Agent("a", model, tools=(send_email,))
    for reason in ("max_tokens", "model_context_window_exceeded"):
        response = ModelResponse(content=[{"type": "tool_use", "id": "t0", "name": "send_email",
                                           "input": {"to": "x@example.com", "subject": "s"}}], stop_reason=reason)
        decided = [next_actions(agent, Conversation("go", [Turn(response)]), waiting=set(), budget_stop=None)
                   for _ in range(2)]
        assert decided[0] == decided[1]
        answer = decided[0][0]
        assert isinstance(answer, Answer) and answer.result["is_error"] is True
        assert f"stop_reason {reason!r}" in answer.result["content"]


# ---------------------------------------------------------------------- 5. a ToolError with no message


@tool
def lookup(key: str) -> str:
    """Look a key up."""
    try:
        return {"a": "1"}[key]
    except KeyError as exc:
        raise ToolError(str(exc.__class__())) from None  # KeyError() -> ""


def test_a_tool_error_without_a_message_is_sent_with_one(sqlite_url: str) -> None:
    responder = ms.ScriptedResponder({"look": [ms.tool_use("lookup", {"key": "zz"}), ms.text("not found")]})
    with ms.MessagesServer(responder) as server:
        record = raysaga.run(agent_flow(server.base_url, (lookup,)), "look", store=sqlite_url, run_id="te",
                             executor="inline")
        told = tool_results(server.requests[-1])
    assert record.status == RunStatus.COMPLETED, (record.status_reason, record.error)
    assert told[0]["is_error"] is True and told[0]["content"] == "lookup returned an error with no message"


def test_a_stored_blank_error_result_is_sent_with_a_message() -> None:
    """A run recorded before the fix has the blank answer in its turns: its next request is sendable."""
    response = ModelResponse(content=[{"type": "tool_use", "id": "t0", "name": "lookup", "input": {"key": "zz"}}],
                             stop_reason="tool_use")
    messages = messages_for("look", [Turn(response, {0: {"content": "  ", "is_error": True}})])
    assert messages[-1]["content"][0]["content"] == "lookup returned an error with no message"


# ---------------------------------------------------------------------- 6. a 200 whose body is not JSON


class GatewayPage:
    """A Messages API behind a proxy whose first answer is its HTML error page, with a 200."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)))
                outer.bodies.append(body)
                if len(outer.bodies) == 1:
                    data = f"<html><body>Bad gateway (your key: {KEY})</body></html>".encode()
                    kind = "text/html"
                else:
                    data = json.dumps(ms.render_message(ms.text("fine"), body)).encode()
                    kind = "application/json"
                self.send_response(200)
                self.send_header("content-type", kind)
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


def test_a_reply_that_is_not_json_is_retried_as_a_transport_error(sqlite_url: str) -> None:
    gateway = GatewayPage()
    try:
        record = raysaga.run(agent_flow(gateway.base_url, ()), "hello", store=sqlite_url, run_id="gw",
                             executor="inline")
    finally:
        gateway.close()
    assert record.status == RunStatus.COMPLETED, (record.status_reason, record.error)
    assert record.output == {"a": "fine"} and len(gateway.bodies) == 2
    store = SqlStore(sqlite_url)
    try:
        retries = [e for e in store.events("gw") if e.kind == "retry_scheduled"]
    finally:
        store.close()
    assert len(retries) == 1
    message = retries[0].data["error"]["message"]
    assert "not JSON" in message and "<html><body>Bad gateway" in message, message
    assert KEY not in json.dumps(retries[0].data)


# ---------------------------------------------------------------------- 7. prompts the API refuses


@pytest.mark.parametrize("prompt", ["", "  \n\t"])
def test_an_empty_prompt_fails_its_agent_node_before_any_model_call(prompt: str, sqlite_url: str) -> None:
    with ms.MessagesServer(ms.ScriptedResponder(default=lambda body: ms.text("fine"))) as server:
        model = AnthropicModel(HAIKU, base_url=server.base_url, timeout=5)
        wf = Workflow("empty", version="1")

        @wf.step()
        def topics(input: str) -> list[str]:
            return ["heat pumps", input]

        @wf.agent(Agent("a", model, transport_retry=FAST), map_over="topics", critical=False)
        def research(topics: str) -> str:
            return topics

        raysaga.run(wf, prompt, store=sqlite_url, run_id="ep", executor="inline")
        asked = [r.conversation for r in server.requests]
    assert all(c == "heat pumps" for c in asked), asked  # the empty one never reached the model
    failed = nodes_of(sqlite_url, "ep")["research[1]"]
    assert failed.status == NodeStatus.FAILED and failed.error is not None
    assert failed.error["type"] == "PromptError"
    assert "agent step 'research' (item 1) returned an empty" in failed.error["message"], failed.error


def test_a_system_prompt_with_a_lone_surrogate_is_refused_when_the_agent_is_made() -> None:
    model = AnthropicModel(HAIKU, base_url="http://127.0.0.1:9")
    with pytest.raises(InvalidOptionError, match=r"Agent\('a'\)\.system holds a lone surrogate at index 8"):
        Agent("a", model, system="be nice \udc80")
