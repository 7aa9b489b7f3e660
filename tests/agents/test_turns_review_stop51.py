"""The turn rules' fixes of review stop 51: an approver's edit onto another call's key, a refused
reply's tool calls, and loop detection on calls whose results differ.

Agents call the real ``anthropic`` SDK against ``tests/support/messages_server.py``, with the
inline executor and a SQLite file; approvals go through ``Client`` as a human's would.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import raysaga
from raysaga import Client, Permanent, RetryPolicy, Workflow
from raysaga.agents import Agent, AnthropicModel, tool
from raysaga.orchestrator import Driver, InlineExecutor
from raysaga.state import EffectStatus, NodeStatus, RunStatus, SqlStore
from raysaga.testing import CrashAt, SimulatedCrash
from tests.support import messages_server as ms
from tests.support.store_rows import nodes_of

HAIKU = "claude-haiku-4-5"
FAST = RetryPolicy(max_attempts=3, base=0.001, cap=0.002)
REFUNDS: list[tuple[str, int]] = []
UNDOS: list[tuple[str, int, Any]] = []
SENT: list[str] = []
LOOKUPS: list[str] = []


@pytest.fixture(autouse=True)
def _fresh(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test-key-stop51-0123456789")
    for seen in (REFUNDS, UNDOS, SENT, LOOKUPS):
        seen.clear()
    yield


def agent_flow(base_url: str, tools: tuple[Any, ...], *, fails_after: bool = False, **options: Any) -> Workflow:
    """One agent (``a``) whose prompt is the run's input; ``fails_after``: a step after it fails,
    so the run rolls back."""
    agent = Agent("a", AnthropicModel(HAIKU, base_url=base_url, timeout=5), tools=tools, transport_retry=FAST,
                  **options)
    wf = Workflow("stop51", version="1")

    @wf.agent(agent)
    def a(input: str) -> str:
        return input

    if fails_after:
        @wf.step()
        def after(a: str) -> str:
            raise Permanent("downstream failed")

    return wf


def tool_results(request: ms.LoggedRequest) -> list[dict[str, Any]]:
    """The tool_result blocks of a request's last (user) message."""
    assert request.body is not None
    content = request.body["messages"][-1]["content"]
    assert isinstance(content, list), content
    return [b for b in content if b.get("type") == "tool_result"]


# ---------------------------------------------------------------------- 1. an approver's edit onto another call's key


def undo_refund(order: str, amount: int, output: Any = None) -> None:
    UNDOS.append((order, amount, output))


@tool(effect=True, key=("order",), requires_approval=True, compensate=undo_refund)
def refund(order: str, amount: int, idempotency_key: str) -> str:
    """Refund an order."""
    REFUNDS.append((order, amount))
    return f"refunded {order} {amount}"


TWO_REFUNDS = ms.reply([ms.tool_use_block("refund", {"order": "o1", "amount": 10}),
                        ms.tool_use_block("refund", {"order": "o2", "amount": 99})])


def ledger(url: str, run_id: str) -> list[tuple[str, EffectStatus, Any]]:
    store = SqlStore(url)
    try:
        return [(e.node_id, e.status, e.result) for e in store.effects(run_id) if not e.node_id.endswith("compensate")]
    finally:
        store.close()


def test_an_approvers_edit_onto_another_calls_key_runs_no_second_effect(sqlite_url: str) -> None:
    with ms.MessagesServer(ms.ScriptedResponder({"refund": [TWO_REFUNDS, ms.text("done")]})) as server:
        wf = agent_flow(server.base_url, (refund,), fails_after=True)
        rested = raysaga.run(wf, "refund", store=sqlite_url, run_id="r", executor="inline")
        assert rested.status == RunStatus.WAITING_HUMAN
        client = Client(sqlite_url)
        client.approve("r", "a@0.0", by="alice")
        client.approve("r", "a@0.1", by="alice", answer={"order": "o1", "amount": 99})  # onto call 0's key
        done = raysaga.resume(wf, "r", store=sqlite_url, executor="inline")
        told = tool_results(server.requests[-1])
    assert REFUNDS == [("o1", 10)]  # the edited call did not run as a second effect under o1's key
    assert told[0]["content"] == "refunded o1 10"
    assert told[1]["is_error"] is True and told[1]["content"].startswith(
        'not run: this refund call (a human approved it with its arguments edited to {"amount":99,"order":"o1"}) '
        "has the same order as refund call 0 of this turn")
    # call 0's commit stands (not overwritten by the edited call's), and the rollback undoes it
    assert ledger(sqlite_url, "r") == [("a@0.0", EffectStatus.COMMITTED,
                                        {"content": "refunded o1 10", "is_error": False})]
    assert done.status == RunStatus.COMPENSATED, done.status_reason
    assert UNDOS == [("o1", 10, "refunded o1 10")]


def test_the_call_that_went_first_under_a_key_counts_after_a_resume(sqlite_url: str) -> None:
    """Call 1, edited onto o1, is approved and runs first; call 0 (o1 as the model asked), approved
    in a later drive that rebuilt the turn from the store, is the twin and does not run."""
    with ms.MessagesServer(ms.ScriptedResponder({"refund": [TWO_REFUNDS, ms.text("done")]})) as server:
        wf = agent_flow(server.base_url, (refund,))
        raysaga.run(wf, "refund", store=sqlite_url, run_id="r", executor="inline")
        client = Client(sqlite_url)
        client.approve("r", "a@0.1", by="alice", answer={"order": "o1", "amount": 99})
        assert raysaga.resume(wf, "r", store=sqlite_url, executor="inline").status == RunStatus.WAITING_HUMAN
        assert REFUNDS == [("o1", 99)]
        client.approve("r", "a@0.0", by="alice")
        done = raysaga.resume(wf, "r", store=sqlite_url, executor="inline")
        told = tool_results(server.requests[-1])
    assert done.status == RunStatus.COMPLETED, done.status_reason
    assert REFUNDS == [("o1", 99)]
    assert told[0]["is_error"] is True and told[0]["content"].startswith(
        "not run: this refund call has the same order as refund call 1 of this turn, which went first")
    assert ledger(sqlite_url, "r") == [("a@0.1", EffectStatus.COMMITTED,
                                        {"content": "refunded o1 99", "is_error": False})]


def test_a_call_in_doubt_under_a_key_counts_after_a_crash(sqlite_url: str) -> None:
    """Call 1, edited onto o1, ran and the driver died before its result was durable (its ledger
    row ``pending``); call 0 (o1), approved meanwhile, is its twin in the next drive: not run."""
    with ms.MessagesServer(ms.ScriptedResponder({"refund": [TWO_REFUNDS, ms.text("done")]})) as server:
        wf = agent_flow(server.base_url, (refund,))
        run_id = raysaga.create_run(wf, "refund", store=sqlite_url, run_id="r").run_id
        store = SqlStore(sqlite_url)
        try:
            assert Driver(wf, store, InlineExecutor(), run_id).drive().status == RunStatus.WAITING_HUMAN
            store.decide(run_id, "a@0.1", "approve", by="alice", answer={"order": "o1", "amount": 99})
            with pytest.raises(SimulatedCrash):
                Driver(wf, store, InlineExecutor(), run_id, faults=CrashAt("before_commit", "a@0.1")).drive()
            store.decide(run_id, "a@0.0", "approve", by="alice")
            done = Driver(wf, store, InlineExecutor(), run_id).drive()
        finally:
            store.close()
        told = tool_results(server.requests[-1])
    assert done.status == RunStatus.COMPLETED, done.status_reason
    assert {amount for _, amount in REFUNDS} == {99}  # call 1 again under its key (in doubt); never call 0
    assert told[0]["is_error"] is True and "as refund call 1 of this turn, which went first" in told[0]["content"]
    assert [(node, status) for node, status, _ in ledger(sqlite_url, "r")] == [("a@0.1", EffectStatus.COMMITTED)]


# ---------------------------------------------------------------------- 2. a refused reply's tool calls


@tool(effect=True)
def send_email(to: str, body: str) -> str:
    """Send an email."""
    SENT.append(to)
    return "sent"


@tool
def lookup(q: str) -> str:
    """Look something up."""
    LOOKUPS.append(q)
    return f"found {q}"


@pytest.mark.parametrize("speculative", [False, True])
def test_a_refused_reply_runs_none_of_its_calls_and_fails_the_node(sqlite_url: str, speculative: bool) -> None:
    """``speculative``: a non-effect tool the model call's task would run itself (``speculative_tools``)."""
    use = ("lookup", {"q": "x"}) if speculative else ("send_email", {"to": "all@corp.example", "body": "Dear"})
    refused = ms.reply([ms.text_block("I'll do it"), ms.tool_use_block(*use)], "refusal")
    with ms.MessagesServer(ms.ScriptedResponder({"p": [refused, ms.text("done")]})) as server:
        wf = agent_flow(server.base_url, (send_email, lookup), speculative_tools=speculative)
        record = raysaga.run(wf, "p", store=sqlite_url, run_id="r", executor="inline")
        asked = len(server.requests)
    assert SENT == [] and LOOKUPS == []
    assert asked == 1  # the model is not asked again
    assert record.status == RunStatus.FAILED
    node = nodes_of(sqlite_url, "r")["a"]
    assert node.status == NodeStatus.FAILED and node.error is not None
    message = node.error.message or ""
    assert node.error.type == "ModelRefused"
    assert "none of the 1 tool call(s) it asked for ran" in message and "I'll do it" in message
    assert "a@0.0" not in nodes_of(sqlite_url, "r")


# ---------------------------------------------------------------------- 3. loops of calls whose results differ

COUNTER = [0]


@tool
def next_id() -> str:
    """Allocate the next free ticket id."""
    COUNTER[0] += 1
    return f"T-{COUNTER[0]}"


@tool
def status() -> str:
    """The job's status (it never changes)."""
    return "running"


def uses(name: str, n: int) -> ms.Reply:
    return ms.reply([ms.tool_use_block(name, {})] * n)


@pytest.mark.parametrize("script", [(3, 1), (1, 2, 1)], ids=["three-then-one", "one-two-one"])
def test_a_call_whose_results_all_differ_is_no_loop(sqlite_url: str, script: tuple[int, ...]) -> None:
    """A same-turn repeat is warned (its results are not read yet); once they are read and differ,
    the warning is no repeat: the next call runs, and the node completes."""
    COUNTER[0] = 0
    turns = [uses("next_id", n) for n in script] + [ms.text("done")]
    with ms.MessagesServer(ms.ScriptedResponder({"p": turns})) as server:
        record = raysaga.run(agent_flow(server.base_url, (next_id,)), "p", store=sqlite_url, run_id="r",
                             executor="inline")
        last = tool_results(server.requests[-1])
    assert record.status == RunStatus.COMPLETED, record.status_reason
    assert last[-1]["content"] == f"T-{COUNTER[0]}" and last[-1]["is_error"] is False
    assert COUNTER[0] == sum(script) - 1  # the one warned same-turn repeat did not run; every other call did


def test_same_turn_repeats_that_got_one_result_still_end_the_node(sqlite_url: str) -> None:
    turns = [uses("status", 3), uses("status", 1), ms.text("done")]
    with ms.MessagesServer(ms.ScriptedResponder({"p": turns})) as server:
        record = raysaga.run(agent_flow(server.base_url, (status,)), "p", store=sqlite_url, run_id="r",
                             executor="inline")
    assert record.status == RunStatus.FAILED
    node = nodes_of(sqlite_url, "r")["a"]
    assert node.error is not None and node.error.type == "LoopDetected"
