"""Speculative tool calls (raysaga.orchestrator.speculation): a model call runs the non-effect tools
its response asks for, and the run machine takes those outcomes for the calls it decides.

Real SQLite, the inline executor (a model call runs in the driver's thread; a speculated tool in
a thread named ``raysaga-speculative-<tool>``, so where a call ran tells how it was made).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterator
from typing import Any

import pytest

import raysaga
from raysaga import RetryPolicy, RunStatus, Workflow
from raysaga.agents import Agent, ScriptedModel, text_reply, tool, tool_reply
from raysaga.agents.runtime import INVALID_INPUT
from raysaga.orchestrator import Driver, InlineExecutor
from raysaga.orchestrator import speculation as spec_mod
from raysaga.orchestrator.context import StepContext
from raysaga.orchestrator.spec import StepSpec
from raysaga.orchestrator.speculation import Offer, Plan, model_turn_speculating
from raysaga.orchestrator.task import Aside, NodeCall
from raysaga.state import EventRecord, NodeRecord, NodeStatus, RunRecord, SqlStore
from raysaga.testing import RecordingModel
from tests.support.models import Recorded

JOURNAL = "test_speculative_tools"
SEEN = Recorded(JOURNAL, lambda r: r.messages)
recording = functools.partial(RecordingModel, journal=JOURNAL)
#: Every tool call that ran: (tool, argument, the thread it ran in).
RAN: list[tuple[str, str, str]] = []
#: Calls of `flaky` still to fail.
FAILURES: list[int] = []


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    SEEN.clear()
    RAN.clear()
    FAILURES.clear()
    yield
    spec_mod._slow_until.clear()


def _ran(name: str, q: str) -> None:
    RAN.append((name, q, threading.current_thread().name))


@tool
def lookup(q: str) -> str:
    """Look q up."""
    _ran("lookup", q)
    return f"about {q}"


@tool(effect=True)
def order(q: str) -> str:
    """Order q."""
    _ran("order", q)
    return f"ordered {q}"


@tool(requires_approval=True)
def wire_money(q: str) -> str:
    """Needs a human."""
    _ran("wire_money", q)
    return "sent"


@tool(retry=RetryPolicy(max_attempts=3, base=0.001, cap=0.001))
def flaky(q: str) -> str:
    """Fails while FAILURES holds calls to fail."""
    _ran("flaky", q)
    if FAILURES:
        FAILURES.pop()
        raise ConnectionError("service unreachable")
    return f"got {q}"


def workflow(agent: Agent) -> Workflow:
    wf = Workflow(f"speculative-{agent.name}")

    @wf.agent(agent)
    def solve(input: str) -> str:
        return f"task: {input}"

    return wf


def drive(url: str, wf: Workflow) -> tuple[RunRecord, dict[str, NodeRecord], list[EventRecord]]:
    run_id = raysaga.create_run(wf, "x", store=url).run_id
    store = SqlStore(url)
    try:
        final = Driver(wf, store, InlineExecutor(), run_id).drive()
        return final, {n.node_id: n for n in store.nodes(run_id)}, store.events(run_id)
    finally:
        store.close()


SPECULATIVE = "raysaga-speculative-"


def test_a_read_tool_runs_with_the_response_once_and_its_result_is_the_calls(sqlite_url: str) -> None:
    script = (tool_reply(("lookup", {"q": "a"})), tool_reply(("lookup", {"q": "b"}), ("lookup", {"q": "c"})),
              text_reply("done"))
    agent = Agent(name="reader", model=recording(default=script), tools=(lookup,), speculative_tools=True)
    final, nodes, events = drive(sqlite_url, workflow(agent))

    assert final.status == RunStatus.COMPLETED, final.error
    # each call ran once, in the model call's speculative threads: none was sent on its own
    assert sorted(q for _, q, _ in RAN) == ["a", "b", "c"]  # b and c run at once, in either order
    assert all(thread == f"{SPECULATIVE}lookup" for _, _, thread in RAN)
    for node_id, q in (("solve@0.0", "a"), ("solve@1.0", "b"), ("solve@1.1", "c")):
        row = nodes[node_id]
        assert row.status == NodeStatus.COMPLETED and row.attempt == 1
        assert row.output == {"content": f"about {q}", "is_error": False}
    # the model saw exactly those results
    results = [b["content"] for m in SEEN[2] if m["role"] == "user" and isinstance(m["content"], list)
               for b in m["content"]]
    assert results == ["about a", "about b", "about c"]
    assert sum(e.kind == "node_completed" and "." in (e.node_id or "") for e in events) == 3


def test_effect_approval_and_switched_off_tools_are_sent_not_speculated(sqlite_url: str) -> None:
    script = (tool_reply(("order", {"q": "a"}), ("lookup", {"q": "b"})), text_reply("done"))
    agent = Agent(name="buyer", model=recording(default=script), tools=(order, lookup), speculative_tools=True)
    final, _, _ = drive(sqlite_url, workflow(agent))
    assert final.status == RunStatus.COMPLETED, final.error
    threads = {name: thread for name, _, thread in RAN}
    assert threads["order"] == "MainThread"  # an effect goes through the ledger, sent on its own
    assert threads["lookup"] == f"{SPECULATIVE}lookup"

    RAN.clear()
    off = Agent(name="plain", model=recording(default=script), tools=(order, lookup))  # off by default
    final, _, _ = drive(sqlite_url, workflow(off))
    assert final.status == RunStatus.COMPLETED, final.error
    assert sorted(RAN) == [("lookup", "b", "MainThread"), ("order", "a", "MainThread")]

    RAN.clear()
    gated = Agent(name="gated", model=recording(default=(tool_reply(("wire_money", {"q": "x"})),)),
                  tools=(wire_money,), speculative_tools=True)
    final, _, _ = drive(sqlite_url, workflow(gated))
    assert final.status == RunStatus.WAITING_HUMAN
    assert RAN == []  # nothing runs before the human decides


def test_a_failed_speculative_call_is_that_attempts_failure_and_is_retried(sqlite_url: str) -> None:
    FAILURES.append(1)  # the first call fails (transient), the retry succeeds
    agent = Agent(name="retrier", model=recording(default=(tool_reply(("flaky", {"q": "a"})), text_reply("ok"))),
                  tools=(flaky,), speculative_tools=True)
    final, nodes, events = drive(sqlite_url, workflow(agent))

    assert final.status == RunStatus.COMPLETED, final.error
    # one speculative attempt (failed), one sent retry: not a third call
    assert [thread for _, _, thread in RAN] == [f"{SPECULATIVE}flaky", "MainThread"]
    assert nodes["solve@0.0"].attempt == 2 and nodes["solve@0.0"].output == {"content": "got a", "is_error": False}
    retries = [e for e in events if e.kind == "retry_scheduled" and e.node_id == "solve@0.0"]
    assert len(retries) == 1 and "ConnectionError" in str(retries[0].data["error"])


def test_a_tool_slower_than_the_budget_is_abandoned_and_the_call_sent(sqlite_url: str) -> None:
    release, finished = threading.Event(), threading.Event()

    def slow(q: str) -> str:
        """Blocks until the sent call releases it."""
        speculative = threading.current_thread().name.startswith(SPECULATIVE)
        _ran("slow", q)
        if speculative:
            try:
                release.wait(10)
            finally:
                finished.set()
            return "late"
        release.set()
        return "on time"

    agent = Agent(name="patient", model=recording(default=(tool_reply(("slow", {"q": "a"})), text_reply("ok"))),
                  tools=(tool(slow),), speculative_tools=True)
    final, nodes, _ = drive(sqlite_url, workflow(agent))
    assert finished.wait(10)
    assert final.status == RunStatus.COMPLETED, final.error
    assert [thread for _, _, thread in RAN] == [f"{SPECULATIVE}slow", "MainThread"]
    assert nodes["solve@0.0"].output == {"content": "on time", "is_error": False}
    assert "slow" in spec_mod._slow_until  # not speculated again for a while in this process


# ---------------------------------------------------------------------- the model call's side


def _plan(**kw: Any) -> Plan:
    return Plan(**{"step": "solve", "tools": (lookup,), "max_output_bytes": 1 << 20, "model_timeout": None,
                   "loop_repeats": 3, **kw})


def _call(plan: Plan, request: dict[str, Any], speculate: list[str]) -> Any:
    model = ScriptedModel(default=(tool_reply(("lookup", {"q": "a"}), ("lookup", {"q": "a"}),
                                              ("lookup", {"q": "b", "x": 1}), ("nope", {"q": "b"}),
                                              ("lookup", {INVALID_INPUT: "bad"}), ("lookup", {"q": "seen"})),))
    ctx = StepContext(run_id="r", node_id="solve@1", fan_index=-1, attempt=1, trace_id="t")
    return model_turn_speculating(model, plan, request, speculate, ctx)


REQUEST: dict[str, Any] = {"model": "scripted", "max_tokens": 10, "messages": [
    {"role": "user", "content": "task"},
    {"role": "assistant", "content": [{"type": "tool_use", "id": "t0", "name": "lookup", "input": {"q": "seen"}}]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t0", "content": "x"}]}]}


def test_only_first_valid_unrepeated_calls_of_allowed_tools_are_offered() -> None:
    result = _call(_plan(), REQUEST, ["lookup"])
    assert isinstance(result, Aside)
    offers: list[Offer] = result.aside
    # call 0 runs; 1 repeats 0 and 5 repeats an earlier turn's (loop detection may refuse them);
    # 2 runs with its arguments as validated; 3 names no tool of the plan; 4 was not JSON
    assert [(o.call, o.args) for o in offers] == [(0, {"q": "a"}), (2, {"q": "b"})]
    assert all(o.outcome.ok for o in offers)
    assert result.value["stop_reason"] == "tool_use"  # the response itself is the call's output
    assert sorted(q for _, q, _ in RAN) == ["a", "b"]


@pytest.mark.parametrize("plan, speculate", [
    (_plan(), []),  # the driver allowed none (a breaker not closed)
    (_plan(loop_repeats=1), ["lookup"]),  # every call is a loop
    (_plan(model_timeout=1e-9), ["lookup"]),  # no time left in the model call's own timeout
], ids=["none-allowed", "repeats-1", "no-time-left"])
def test_nothing_is_run_when_nothing_may_be(plan: Plan, speculate: list[str]) -> None:
    result = _call(plan, REQUEST, speculate)
    assert not isinstance(result, Aside) and result["stop_reason"] == "tool_use"
    assert RAN == []


def test_the_offered_outcome_is_what_a_sent_call_would_return() -> None:
    from raysaga.orchestrator.task import execute

    (offer, *_) = _call(_plan(), REQUEST, ["lookup"]).aside
    spec: StepSpec = spec_mod.tool_spec("solve", lookup)
    ctx = StepContext(run_id="r", node_id="solve@1.0", fan_index=-1, attempt=1, trace_id="t")
    sent = execute(spec, NodeCall(ctx=ctx, kwargs={"args": {"q": "a"}}, max_output_bytes=1 << 20))
    assert (offer.outcome.ok, offer.outcome.output_json) == (sent.ok, sent.output_json)


def test_only_a_tool_that_ran_is_paused_for_overrunning() -> None:
    """A call abandoned at the deadline pauses its tool only if the tool itself had the time: a
    thread that never began, or began late (a busy actor's GIL), says nothing of the tool."""
    wait = 0.1
    assert spec_mod.overran(began=0.0, now=wait, wait=wait)  # began at once, still running
    assert spec_mod.overran(began=0.04, now=wait, wait=wait)  # most of the wait to itself
    assert not spec_mod.overran(began=None, now=wait, wait=wait)  # its thread never ran
    assert not spec_mod.overran(began=0.08, now=wait, wait=wait)  # began 80 ms late


def test_a_tool_whose_thread_starts_late_is_not_paused(sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The pause is decided from when the tool began, not from when its thread was asked for: a
    speculative thread held back past the budget (as a busy actor holds new threads) is abandoned,
    the call is sent, and the tool stays speculable."""
    held, run = threading.Event(), spec_mod._Box.run

    def late_run(self: spec_mod._Box, spec: StepSpec, call: NodeCall) -> None:
        held.wait(10)  # the speculative thread gets to its tool only once the call is sent
        run(self, spec, call)

    def quick(q: str) -> str:
        """Answers at once."""
        if not threading.current_thread().name.startswith(SPECULATIVE):
            held.set()
        return f"got {q}"

    monkeypatch.setattr(spec_mod._Box, "run", late_run)
    agent = Agent(name="eager", model=recording(default=(tool_reply(("quick", {"q": "a"})), text_reply("ok"))),
                  tools=(tool(quick),), speculative_tools=True)
    final, nodes, _ = drive(sqlite_url, workflow(agent))
    assert final.status == RunStatus.COMPLETED, final.error
    assert nodes["solve@0.0"].output == {"content": "got a", "is_error": False}
    assert "quick" not in spec_mod._slow_until


def test_no_call_of_a_reply_cut_off_by_max_tokens_is_run() -> None:
    """The machine runs no tool of a reply cut off by ``max_tokens`` (its input may be cut too): a
    speculative run of one would be a call made for nothing, or with the cut arguments."""
    cut = tool_reply(("lookup", {"q": "a"})).model_copy(update={"stop_reason": "max_tokens"})
    ctx = StepContext(run_id="r", node_id="solve@1", fan_index=-1, attempt=1, trace_id="t")
    result = model_turn_speculating(ScriptedModel(default=(cut,)), _plan(), REQUEST, ["lookup"], ctx)
    assert not isinstance(result, Aside) and result["stop_reason"] == "max_tokens"
    assert RAN == []
