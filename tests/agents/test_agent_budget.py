"""Token and cost budgets of a run with an agent, against the real ``anthropic`` SDK.

The agent (``AnthropicModel`` → ``tests/support/messages_server.py``) needs five model calls of 120
tokens each; the run's budget allows fewer. The budget is checked before each model call, so
the run stops within one call of it: ``paused`` with a reason starting ``budget`` (or, with
``on_budget="fail"``, the agent node fails). A paused run stays paused when resumed with the same
budget, without a single request reaching the server, and goes on, replaying nothing, when
resumed with a raised one. ``status --json`` counts exactly what the server billed.

On Ray, with two agents in parallel, a pause while the other agent's model call is in flight
keeps that call's answer (it was sent, and billed): nothing is asked twice, nothing billed is
left uncounted.
"""

from __future__ import annotations

import json
import sys
import threading
from typing import Any

import pytest
from typer.testing import CliRunner

import raysaga
from raysaga import RetryPolicy, RunOptions, Workflow
from raysaga.agents import Agent, AnthropicModel, price_of, tool
from raysaga.agents.messages import Usage
from raysaga.orchestrator.cli import app
from raysaga.state import NodeStatus, RunStatus, SqlStore
from tests.support import agent_flows as af
from tests.support import messages_server as ms

af.use_test_key()  # the Ray test's workers read it from their environment

MODEL = "claude-haiku-4-5"
PROMPT = "Count the primes below 30, one decade at a time."
USAGE = (100, 20)
PER_CALL = sum(USAGE)
CALLS = 5  # the conversation needs this many model calls
ANSWER = "There are 10 primes below 30."
#: USD per million tokens: one call costs (100 * 1000 + 20 * 5000) / 1e6 = $0.20
PRICES = {MODEL: (1000.0, 5000.0)}


@pytest.fixture(autouse=True)
def test_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")


@tool
def count_primes(start: int, stop: int) -> int:
    """How many primes lie in [start, stop)."""
    return sum(1 for n in range(max(2, start), stop) if all(n % d for d in range(2, int(n**0.5) + 1)))


def script() -> list[Any]:
    decades = [ms.tool_use("count_primes", {"start": 10 * i, "stop": 10 * i + 10}, usage=USAGE) for i in range(4)]
    return [*decades, ms.text(ANSWER, usage=USAGE)]


def flow(srv: Any, on_budget: str = "pause") -> Workflow:
    model = AnthropicModel(MODEL, base_url=srv.base_url, timeout=5.0, prices=PRICES)
    agent = Agent("counter", model, tools=(count_primes,), on_budget=on_budget, max_turns=8,
                  transport_retry=RetryPolicy(max_attempts=3, base=0.01, cap=0.05))
    wf = Workflow("budget", version="1")

    @wf.agent(agent)
    def count(input: str) -> str:
        return input

    @wf.step()
    def report(count: str) -> str:
        return count.upper()

    return wf


@pytest.fixture
def srv() -> Any:
    with ms.MessagesServer(ms.ScriptedResponder({PROMPT: script()})) as server:
        yield server


def status_json(db: str, run_id: str) -> dict[str, Any]:
    result = CliRunner().invoke(app, ["status", run_id, "--db", db, "--json"])
    assert result.exit_code == 0, result.output
    data: dict[str, Any] = json.loads(result.stdout)
    return data


def billed(srv: Any) -> int:
    totals = srv.usage_totals()
    return int(totals.input_tokens + totals.output_tokens)


def test_token_budget_pauses_stays_paused_and_resumes_with_a_raised_budget(srv: Any, sqlite_url: str) -> None:
    wf = flow(srv)
    budget = 250  # two calls fit (240); the third starts under budget and ends over it (360)
    paused = raysaga.run(wf, PROMPT, store=sqlite_url, run_id="b1", executor="inline",
                         options=RunOptions(token_budget=budget))

    assert paused.status == RunStatus.PAUSED
    assert paused.status_reason is not None and paused.status_reason.startswith("budget"), paused.status_reason
    assert len(srv.requests) == 3
    assert budget <= paused.tokens_used <= budget + PER_CALL  # within one model call of the budget
    status = status_json(sqlite_url, "b1")
    assert billed(srv) == 3 * PER_CALL
    assert status["status"] == "paused" and status["tokens_used"] == paused.tokens_used == billed(srv)
    assert status["reason"] == paused.status_reason

    # the same budget: it stays paused, and no model request reaches the server
    again = raysaga.resume(wf, "b1", store=sqlite_url, executor="inline")
    assert again.status == RunStatus.PAUSED and again.tokens_used == paused.tokens_used
    assert len(srv.requests) == 3

    # a raised budget: it goes on from turn 3, replaying nothing
    done = raysaga.resume(wf, "b1", store=sqlite_url, executor="inline", options=RunOptions(token_budget=10_000))
    assert done.status == RunStatus.COMPLETED, (done.status_reason, done.error)
    assert done.output == {"report": ANSWER.upper()}
    assert [r.turn for r in srv.requests] == list(range(CALLS))
    assert srv.repeated_requests() == []
    status = status_json(sqlite_url, "b1")
    assert status["tokens_used"] == done.tokens_used == billed(srv) == CALLS * PER_CALL

    # and the conversation is the one an unbudgeted run has
    with ms.MessagesServer(ms.ScriptedResponder({PROMPT: script()})) as free:
        free_run = raysaga.run(flow(free), PROMPT, store=sqlite_url, run_id="free", executor="inline")
    assert free_run.output == done.output
    assert [r.key for r in free.requests] == [r.key for r in srv.requests]


def test_on_budget_fail_fails_the_agent_node(srv: Any, sqlite_url: str) -> None:
    record = raysaga.run(flow(srv, on_budget="fail"), PROMPT, store=sqlite_url, run_id="b2", executor="inline",
                         options=RunOptions(token_budget=250))

    assert record.status == RunStatus.FAILED
    assert len(srv.requests) == 3
    store = SqlStore(sqlite_url)
    try:
        nodes = {n.label: n for n in store.nodes("b2")}
    finally:
        store.close()
    agent_node = nodes["count"]
    assert agent_node.status == NodeStatus.FAILED and agent_node.error is not None
    assert agent_node.error["type"] == "BudgetExceeded"
    assert agent_node.error["message"].startswith("budget")
    assert "report" not in nodes  # never started: the run failed before it was ready
    assert record.error is not None and record.error["type"] == "BudgetExceeded"
    assert status_json(sqlite_url, "b2")["tokens_used"] == billed(srv) == 3 * PER_CALL


def test_cost_budget_pauses_and_counts_what_the_server_billed(srv: Any, sqlite_url: str) -> None:
    per_call = price_of(MODEL, Usage(input_tokens=USAGE[0], output_tokens=USAGE[1]), PRICES)
    assert per_call == pytest.approx(0.2)
    wf = flow(srv)
    paused = raysaga.run(wf, PROMPT, store=sqlite_url, run_id="b3", executor="inline",
                         options=RunOptions(cost_budget=0.5))

    assert paused.status == RunStatus.PAUSED and paused.status_reason is not None
    assert paused.status_reason.startswith("budget") and "$" in paused.status_reason
    assert len(srv.requests) == 3
    assert status_json(sqlite_url, "b3")["cost_used"] == pytest.approx(3 * per_call)

    done = raysaga.resume(wf, "b3", store=sqlite_url, executor="inline", options=RunOptions(cost_budget=5.0))
    assert done.status == RunStatus.COMPLETED
    assert len(srv.requests) == CALLS and srv.repeated_requests() == []
    status = status_json(sqlite_url, "b3")
    assert status["cost_used"] == pytest.approx(CALLS * per_call)
    assert status["tokens_used"] == billed(srv)


# ---------------------------------------------------------------------- parallel agents on Ray


@tool
def note(text: str) -> str:
    """Write a note."""
    return f"noted: {text}"


class Parallel:
    """Two agents dispatched together. ``fast``'s first answer spends the budget and asks for a
    tool; its next model call is refused, and the run pauses. ``slow``'s only call is at the
    server by then (``fast`` is answered only once it arrived) and answered ``HOLD`` s later."""

    HOLD = 1.5

    def __init__(self) -> None:
        self.slow_arrived = threading.Event()

    def __call__(self, request: dict[str, Any]) -> Any:
        conversation, turn = ms.conversation_of(request), ms.turn_of(request)
        if conversation == "slow":
            self.slow_arrived.set()
            return ms.delayed(self.HOLD, ms.text("slow done", usage=(50, 5)))
        if turn == 0:
            assert self.slow_arrived.wait(60), "the slow agent's call never reached the server"
            return ms.tool_use("note", {"text": "half way"}, usage=(500, 20))
        return ms.text("fast done", usage=(60, 6))


def parallel_flow(srv: Any) -> Workflow:
    model = AnthropicModel(MODEL, base_url=srv.base_url, timeout=30.0)
    agent = Agent("worker", model, tools=(note,), transport_retry=RetryPolicy(max_attempts=2, base=0.01, cap=0.05))
    wf = Workflow("budget_parallel", version="1")

    @wf.agent(agent)
    def fast(input: str) -> str:
        return "fast"

    @wf.agent(agent)
    def slow(input: str) -> str:
        return "slow"

    return wf


@pytest.mark.ray
def test_a_budget_pause_keeps_the_answers_already_on_their_way(ray_session: str, sqlite_url: str) -> None:
    """A budget pause while another agent's model call is in flight: that call was sent (and is
    billed), so its answer is recorded with the pause, not cancelled. Cancelled, the answer was
    lost: the resume asked the same turn again (a re-roll), and the run counted fewer tokens
    than the server billed."""
    cloudpickle = pytest.importorskip("ray.cloudpickle")
    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import this module
    with ms.MessagesServer(Parallel()) as srv:
        wf = parallel_flow(srv)
        paused = raysaga.run(wf, "go", store=sqlite_url, run_id="par", executor="ray",
                             options=RunOptions(token_budget=300))
        assert paused.status == RunStatus.PAUSED, (paused.status_reason, paused.error)
        assert paused.status_reason is not None and paused.status_reason.startswith("budget")
        assert [(r.conversation, r.turn) for r in srv.requests] == [("slow", 0), ("fast", 0)]
        assert paused.tokens_used == billed(srv) == 520 + 55
        store = SqlStore(sqlite_url)
        try:
            nodes = {n.label: n.status for n in store.nodes("par")}
        finally:
            store.close()
        assert nodes["slow@0"] == NodeStatus.COMPLETED  # its answer is durable; the node settles on resume

        done = raysaga.resume(wf, "par", store=sqlite_url, executor="ray", options=RunOptions(token_budget=10_000))
        assert done.status == RunStatus.COMPLETED, (done.status_reason, done.error)
        assert done.output == {"fast": "fast done", "slow": "slow done"}
        assert srv.repeated_requests() == []
        assert [(r.conversation, r.turn) for r in srv.requests] == [("slow", 0), ("fast", 0), ("fast", 1)]
        assert done.tokens_used == billed(srv) == status_json(sqlite_url, "par")["tokens_used"]
