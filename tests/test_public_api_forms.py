"""Every documented call form of the public decorators, as user code writes them.

This file is run by pytest (each form builds what it should) *and* type-checked by mypy, strict,
in ``tests/test_public_api.py::test_documented_forms_type_check``: the overloads of
``Workflow.step`` and ``tool`` and the explicit keyword options of ``map``, ``agent`` and the
option objects must accept each form, and keep the decorated function's own signature
(``assert_type`` on what the decorated functions return).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, assert_type

from pydantic import BaseModel

from raysaga import (
    BEST_EFFORT,
    NOT_APPLIED,
    Continue,
    FanOutResult,
    RetryFailed,
    RetryPolicy,
    RunOptions,
    StepContext,
    Workflow,
    min_success_ratio,
    on_partial_failure,
    quorum,
)
from raysaga.agents import Agent, LoopPolicy, Tool, tool
from raysaga.testing import ScriptedModel


class Answer(BaseModel):
    text: str


def search_impl(query: str, limit: int = 5) -> list[str]:
    """Search the corpus."""
    return [query][:limit]


def file_report_impl(services_url: str, question: str, idempotency_key: str) -> dict[str, str]:
    return {"url": services_url, "question": question, "key": idempotency_key}


def undo_report(question: str, output: Any, ctx: StepContext) -> None:
    return None


# ----------------------------------------------------------------------------- tools


@tool
def lookup(query: str) -> str:
    """Look a term up."""
    return query


@tool()
def today() -> str:
    return "2025-01-01"


@tool(effect=True, key=("order_id", "amount"))
def pay(order_id: str, amount: int, idempotency_key: str) -> dict[str, Any]:
    return {"order_id": order_id, "amount": amount}


@tool(retry=RetryPolicy(max_attempts=4, base=0.1, cap=2.0), timeout=5.0, breaker="search-api")
def slow_search(query: str) -> str:
    return query


@tool(name="email", description="Send an email.", effect=True, key="to")
def send_email(to: str, body: str) -> str:
    return to


search = tool(search_impl, name="search", description="Search the corpus.")
fetch_page = tool(lambda url: url, name="fetch_page", retry=RetryPolicy(max_attempts=2))
file_report = tool(functools.partial(file_report_impl, "http://127.0.0.1:1"), name="file_report", effect=True,
                   key=("question",), compensate=undo_report)
make_tool = tool(name="named")

assert_type(lookup, Tool)
assert_type(today, Tool)
assert_type(pay, Tool)
assert_type(search, Tool)
assert_type(file_report, Tool)
assert_type(make_tool, Callable[[Callable[..., Any]], Tool])


# ----------------------------------------------------------------------------- agents

model = ScriptedModel()
planner = Agent("planner", model, system="Split the question.", output_type=Answer, max_turns=4)
researcher = Agent("researcher", model, system="Research.", tools=(search, file_report), max_turns=8,
                   loop=LoopPolicy(window=6, repeats=3, then="pause"), model_timeout=30.0,
                   transport_retry=RetryPolicy(max_attempts=6, base=0.5, cap=20.0))
writer = Agent(name="writer", model=model, max_tokens=2048, shared_memory=True, on_budget="fail")


# ----------------------------------------------------------------------------- options

RETRY = RetryPolicy(max_attempts=5, base=1.0, cap=60.0, transient=(TimeoutError,), permanent=(KeyError,))
OPTIONS = RunOptions(deadline=3600.0, retry_budget=10, lease_ttl=15.0, token_budget=100_000, cost_budget=5.0,
                     labels={"team": "payments"})


def decide(result: FanOutResult) -> Any:
    return Continue("enough") if len(result.successes) >= 2 else RetryFailed("again")


def refund(ctx: StepContext, output: dict[str, Any] | None, input: dict[str, Any]) -> None:
    return None


def find_charge(ctx: StepContext, input: dict[str, Any]) -> Any:
    return NOT_APPLIED


def external(plan: list[str]) -> int:
    return len(plan)


# ----------------------------------------------------------------------------- workflow steps


def build() -> Workflow:
    """One workflow using every documented form of ``step``, ``map``, ``agent`` and ``compensation``."""
    wf = Workflow("forms", version="2", description="every call form")

    @wf.step
    def plan(input: dict[str, Any]) -> list[str]:
        return ["a", "b"]

    @wf.step()
    def reserve(input: dict[str, Any]) -> dict[str, Any]:
        return {"sku": input.get("sku")}

    @wf.step(name="check", after=["reserve"])
    def check_stock(reserve: dict[str, Any]) -> bool:
        return True

    @wf.step(after="check", retry=RetryPolicy(max_attempts=3))
    def audit(ctx: StepContext) -> str:
        return ctx.run_id

    @wf.step(effect=True, retry=RETRY, compensate=refund, timeout=30.0)
    def charge(ctx: StepContext, input: dict[str, Any], reserve: dict[str, Any]) -> dict[str, Any]:
        return {"key": ctx.idempotency_key}

    @wf.step(effect=True, effect_name="receipt", reconcile=find_charge)
    def email(ctx: StepContext, input: dict[str, Any], charge: dict[str, Any]) -> dict[str, Any]:
        return {}

    @wf.step(critical=False, on_failure="pass", retry=RetryPolicy(max_attempts=1))
    def enrich(plan: list[str]) -> list[str]:
        return plan

    @wf.step(io_bound=True, timeout=10.0)
    def ping(plan: list[str]) -> int:
        return 1

    @wf.step(num_cpus=0.5, num_gpus=1, memory=2 * 1024**3, resources={"special": 1.0})
    def train(plan: list[str]) -> float:
        return 0.0

    @wf.step(map_over="plan", policy=quorum(1))
    def each(plan: str) -> str:
        return plan

    @wf.map("plan")
    def fetch(plan: str) -> str:
        return plan

    @wf.map("plan", effect=True, policy=BEST_EFFORT, retry=RETRY)
    def post(ctx: StepContext, plan: str) -> str:
        return plan

    @wf.map("plan", io_bound=True, policy=min_success_ratio(0.5))
    def crawl(plan: str) -> str:
        return plan

    @wf.map("plan", num_cpus=1, resources={"special": 1.0}, policy=on_partial_failure(decide))
    def shard(plan: str) -> str:
        return plan

    @wf.agent(planner)
    def plan_it(input: dict[str, Any]) -> str:
        return f"Question: {input}"

    @wf.agent(researcher, map_over="plan")
    def research(plan: str) -> str:
        return f"Research: {plan}"

    @wf.agent(writer, name="write", after=["audit"], critical=False, retry=RetryPolicy(max_attempts=2),
              timeout=120.0, on_failure="skip")
    def write_up(research: list[str]) -> str:
        return "\n".join(research)

    @wf.compensation("email")
    def unsend(ctx: StepContext, output: dict[str, Any] | None) -> None:
        return None

    @wf.compensation("post", retry=RetryPolicy(max_attempts=10, cap=5.0))
    def unpost(ctx: StepContext, plan: str) -> None:
        return None

    counted = wf.step(external, name="count")

    # the decorators hand back the user's own functions, signatures intact
    assert_type(plan({"q": 1}), list[str])
    assert_type(check_stock({}), bool)
    same_charge: Callable[[StepContext, dict[str, Any], dict[str, Any]], dict[str, Any]] = charge
    assert_type(fetch("x"), str)
    assert_type(research("x"), str)
    assert_type(counted(["a"]), int)
    same_unsend: Callable[[StepContext, dict[str, Any] | None], None] = unsend
    assert same_charge is charge and same_unsend is unsend
    return wf


def test_every_documented_form_builds() -> None:
    wf = build().validate()
    assert {"plan", "reserve", "check", "audit", "charge", "email", "enrich", "ping", "train", "each", "fetch",
            "post", "crawl", "shard", "plan_it", "research", "write", "count"} == set(wf.steps)
    assert wf.steps["check"].deps == ("reserve",)
    assert wf.steps["audit"].deps == ("check",)  # after="check" is one step name, not five letters
    assert wf.steps["fetch"].map_over == "plan"
    assert wf.steps["research"].kind == "agent" and wf.steps["research"].map_over == "plan"
    assert wf.steps["write"].deps == ("research", "audit")
    assert wf.steps["email"].effect_name == "receipt"
    assert wf.compensation_retries["post"].max_attempts == 10


def test_every_documented_tool_form_builds() -> None:
    assert [t.name for t in (lookup, today, pay, slow_search, send_email, search, fetch_page, file_report)] == [
        "lookup", "today", "pay", "slow_search", "email", "search", "fetch_page", "file_report"]
    assert pay.key == ("order_id", "amount") and send_email.key == ("to",)
    assert search.description == "Search the corpus."
    assert make_tool(search_impl).name == "named"
    assert researcher.tools == (search, file_report)
