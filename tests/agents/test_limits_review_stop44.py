"""Review stop 44, limits: circuit breakers keyed by the tool's function (not its bare name),
counting only transient failures, and refusals kept out of loop detection; a token-only
``RateLimit`` on a tool refused; ``raysaga stats`` counting only breakers still cooling down.

Runs are real (inline executor) on SQLite and PostgreSQL stores of their own, with a fake clock
so nothing sleeps.
"""

from __future__ import annotations

import functools
import uuid
from typing import Any

import pytest

import raysaga
from raysaga import Permanent, RateLimit, RetryPolicy, RunStatus, Workflow
from raysaga.agents import Agent, ModelResponse, text_reply, tool_reply
from raysaga.agents.tools import MAX_BREAKER_NAME, Tool, default_breaker, tool
from raysaga.errors import WorkflowDefinitionError
from raysaga.orchestrator import Driver, InlineExecutor
from raysaga.state import BreakerRecord, BreakerState, RunRecord, SqlStore
from raysaga.state.stats import compute, prometheus
from raysaga.testing import RecordingModel

T0 = 1_700_000_000.0
CALLS: list[str] = []


@pytest.fixture(autouse=True)
def _reset() -> None:
    CALLS.clear()


def web_search(q: str) -> str:
    """Search the web (its backend is down)."""
    CALLS.append(f"web:{q}")
    raise ConnectionError("web search backend down")


def kb_search(q: str) -> str:
    """Search the knowledge base (healthy)."""
    CALLS.append(f"kb:{q}")
    return f"kb article for {q}"


def get_order(order_id: str) -> str:
    """Fetch an order; an id the model made up is a 404."""
    CALLS.append(order_id)
    if not order_id.startswith("ord_"):
        raise Permanent(f"404: no order {order_id}")
    return f"order {order_id}: shipped"


class FakeClock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


def agent_workflow(name: str, model: RecordingModel, tools: tuple[Tool, ...], **agent: Any) -> Workflow:
    wf = Workflow(name)

    @wf.agent(Agent(f"{name}_agent", model, tools=tools, max_turns=10, **agent))
    def solve(input: str) -> str:
        return input

    return wf


def drive(wf: Workflow, url: str, prompt: str, clock: FakeClock) -> RunRecord:
    run_id = raysaga.create_run(wf, prompt, store=url).run_id
    store = SqlStore(url)
    try:
        return Driver(wf, store, InlineExecutor(), run_id, clock=clock).drive()
    finally:
        store.close()


def breaker(url: str, name: str) -> BreakerRecord:
    store = SqlStore(url)
    try:
        return store.breaker_get(name)
    finally:
        store.close()


def last_result(model: RecordingModel, prompt: str) -> dict[str, Any]:
    content = model.conversations()[prompt][-1].messages[-1]["content"]
    assert isinstance(content, list)
    result: dict[str, Any] = content[-1]
    return result


def calls(name: str, *args: dict[str, Any]) -> list[ModelResponse]:
    return [tool_reply((name, a)) for a in args] + [text_reply("done")]


# ---------------------------------------------------------------------- B4: the breaker's key


def test_the_default_breaker_is_the_functions_module_qualified_name() -> None:
    web: Tool = tool(web_search, name="search")
    kb: Tool = tool(kb_search, name="search")
    assert web.breaker_name == f"{__name__}.web_search:search"
    assert kb.breaker_name == f"{__name__}.kb_search:search"
    # tools made from one function (a partial, a factory's closure) each keep their own breaker
    weather: Tool = tool(functools.partial(web_search), name="weather")
    stocks: Tool = tool(functools.partial(web_search), name="stocks")
    assert weather.breaker_name != stocks.breaker_name
    shared: Tool = tool(kb_search, name="search", breaker="search-backend")  # sharing one on purpose still works
    assert shared.breaker_name == "search-backend"


def test_a_breaker_name_fits_the_stores_column() -> None:
    def f() -> None:
        return None

    f.__qualname__ = "x" * 400
    name = default_breaker(f, "f")
    assert len(name) == MAX_BREAKER_NAME and name != default_breaker(kb_search, "f")
    with pytest.raises(WorkflowDefinitionError, match="breaker= takes a dependency's name"):
        tool(kb_search, breaker="b" * (MAX_BREAKER_NAME + 1))


def test_the_breaker_key_is_not_in_the_definition_hash() -> None:
    """Runs in flight keep their definition: the breaker's key is the fleet's state, not the run's."""
    model = RecordingModel(script={})
    old = agent_workflow("hash", model, (tool(kb_search, name="search", breaker="search"),))
    new = agent_workflow("hash", model, (tool(kb_search, name="search"),))
    assert old.definition_hash == new.definition_hash


def test_unrelated_tools_called_alike_do_not_share_a_breaker(own_store_url: str) -> None:
    """A crawler's failing web `search` opened the breaker of a support bot's healthy knowledge-base
    `search`, in another workflow: the support bot's call was refused."""
    clock = FakeClock()
    crawl_model = RecordingModel(script={"crawl": calls("search", *({"q": f"q{i}"} for i in range(4)))})
    crawler = agent_workflow("crawler", crawl_model, (tool(web_search, name="search",
                                                           retry=RetryPolicy(max_attempts=1)),),
                             breaker_threshold=2)
    support_model = RecordingModel(script={"help": calls("search", {"q": "refunds"})})
    support = agent_workflow("support", support_model, (tool(kb_search, name="search"),), breaker_threshold=2)

    assert drive(crawler, own_store_url, "crawl", clock).status == RunStatus.COMPLETED
    assert CALLS == ["web:q0", "web:q1"]  # its own breaker opened after 2 failures
    assert breaker(own_store_url, f"{__name__}.web_search:search").state == BreakerState.OPEN
    assert drive(support, own_store_url, "help", clock).status == RunStatus.COMPLETED
    assert CALLS[-1] == "kb:refunds"
    assert last_result(support_model, "help")["content"] == "kb article for refunds"


def test_permanent_failures_do_not_open_the_breaker(own_store_url: str) -> None:
    """One run's model asking for made-up ids (a 404 each) opened the breaker for every run."""
    clock = FakeClock()
    model = RecordingModel(script={"bad": calls("get_order", *({"order_id": f"x{i}"} for i in range(4))),
                                   "good": calls("get_order", {"order_id": "ord_1"})})
    wf = agent_workflow("orders", model, (tool(get_order),), breaker_threshold=2)
    assert drive(wf, own_store_url, "bad", clock).status == RunStatus.COMPLETED
    assert CALLS == ["x0", "x1", "x2", "x3"]  # every call reached the service
    record = breaker(own_store_url, f"{__name__}.get_order:get_order")
    assert (record.state, record.failures) == (BreakerState.CLOSED, 0)
    assert drive(wf, own_store_url, "good", clock).status == RunStatus.COMPLETED
    assert last_result(model, "good")["content"] == "order ord_1: shipped"


def test_breaker_refusals_are_not_a_loop(own_store_url: str) -> None:
    """The identical refusal text, asked for the same call turn after turn, read as "the same call
    getting the same result": the run failed `loop` while the breaker was merely cooling down."""
    clock = FakeClock()  # fixed: every refusal says the same, word for word
    model = RecordingModel(script={"go": calls("search", *({"q": "same"} for _ in range(5)))})
    wf = agent_workflow("refused", model, (tool(web_search, name="search", retry=RetryPolicy(max_attempts=1)),),
                        breaker_threshold=1)
    final = drive(wf, own_store_url, "go", clock)
    assert final.status == RunStatus.COMPLETED, final.error
    assert CALLS == ["web:same"]  # the first call failed and opened it; four refusals followed
    result = last_result(model, "go")
    assert result["is_error"] is True and result["content"].startswith("the tool is unavailable")


def test_refusals_of_one_call_asked_twice_in_a_turn_are_not_a_loop(own_store_url: str) -> None:
    """The model asks the same call twice in one turn, turn after turn, and both are refused: two
    identical refusals in a turn read as the same result again, and the node failed `loop`."""
    clock = FakeClock()
    twice = tool_reply(("search", {"q": "same"}), ("search", {"q": "same"}))
    model = RecordingModel(script={"go": [tool_reply(("search", {"q": "first"})), twice, twice, twice,
                                          text_reply("done")]})
    wf = agent_workflow("refused-twice", model, (tool(web_search, name="search", retry=RetryPolicy(max_attempts=1)),),
                        breaker_threshold=1)
    final = drive(wf, own_store_url, "go", clock)
    assert final.status == RunStatus.COMPLETED, final.error
    assert CALLS == ["web:first"]  # it failed and opened the breaker; every later call was refused


def test_a_dependency_shared_on_purpose_keeps_one_breaker(own_store_url: str) -> None:
    clock = FakeClock()
    name = f"backend-{uuid.uuid4().hex[:8]}"
    model = RecordingModel(script={"a": calls("search", {"q": "1"}, {"q": "2"}), "b": calls("lookup", {"q": "3"})})
    wf_a = agent_workflow("a", model, (tool(web_search, name="search", breaker=name,
                                            retry=RetryPolicy(max_attempts=1)),), breaker_threshold=2)
    wf_b = agent_workflow("b", model, (tool(kb_search, name="lookup", breaker=name),), breaker_threshold=2)
    drive(wf_a, own_store_url, "a", clock)
    assert breaker(own_store_url, name).state == BreakerState.OPEN
    drive(wf_b, own_store_url, "b", clock)
    assert CALLS == ["web:1", "web:2"]  # the shared breaker refused kb's call
    assert last_result(model, "b")["content"].startswith("the tool is unavailable")


# ---------------------------------------------------------------------- B8: a token-only limit on a tool


def test_a_token_only_rate_limit_on_a_tool_is_refused() -> None:
    with pytest.raises(WorkflowDefinitionError, match=r"tool 'kb_search'.*tokens="):
        tool(kb_search, rate_limit=RateLimit(name="kb", tokens=1000))


# ---------------------------------------------------------------------- B10: breakers open in `raysaga stats`


def test_stats_count_only_breakers_still_cooling_down(own_store_url: str) -> None:
    """A breaker stays ``open`` in its row until a call comes: `raysaga stats` and the
    `raysaga_breakers_open` gauge counted one open for ever after its cooldown."""
    store = SqlStore(own_store_url)
    try:
        rows = {"cooling": (BreakerState.OPEN, T0 - 5), "cooled": (BreakerState.OPEN, T0 - 3600),
                "probing": (BreakerState.HALF_OPEN, T0 - 5), "closed": (BreakerState.CLOSED, None)}
        for name, (state, opened_at) in rows.items():
            assert store.breaker_cas(BreakerRecord(name=f"stop44-{name}", state=state, failures=5,
                                                   opened_at=opened_at), 0)
        figures = compute(store.engine, now=T0)
    finally:
        store.close()
    assert (figures.breaker_trips, figures.breakers_half_open) == (1, 1)
    text = prometheus(figures)
    assert "raysaga_breakers_open 1\n" in text and "raysaga_breakers_half_open 1\n" in text
