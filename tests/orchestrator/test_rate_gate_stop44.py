"""Review stop 44, limits: the rate gate's concurrency slots.

A model call's ``concurrent=`` slot, its driver dead mid-call, stayed held ``UNTIMED_HOLD`` (300 s)
when the agent set no ``model_timeout``, though the model's own client (``AnthropicModel.timeout``)
gives up far sooner: the fleet waited 5 minutes for a call that could no longer be running. A
gate left behind with its grant unreleased stands for the dead driver (the store sees the same).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, cast

from sqlalchemy import create_engine, func, select

import raysaga
from raysaga import RateLimit, RunStatus, Workflow
from raysaga.agents import Agent, AnthropicModel, ScriptedModel, text_reply, tool, tool_reply
from raysaga.orchestrator import InlineExecutor
from raysaga.orchestrator.machine.speculating import Speculation
from raysaga.orchestrator.rate_gate import HOLD_SLACK, UNTIMED_HOLD, RateGate, RateHold, rule_of
from raysaga.orchestrator.spec import StepSpec
from raysaga.orchestrator.task import NodeCall
from raysaga.state import SqlStore
from raysaga.state.rate_limits import BLOCKED, WINDOW, waiting_reason
from raysaga.state.schema import rate_grants
from tests.support.endless_executor import Endless

T0 = 1_000_000.0


def _call(node: str) -> NodeCall:
    return NodeCall(fields=("run", node, -1, 1, "trace", None, False), kwargs={}, max_output_bytes=1 << 20)


def _model_spec(limit: str, **agent: Any) -> StepSpec:
    model = AnthropicModel("claude-test", timeout=20.0)
    speculation = Speculation(cast(Any, None), cast(Any, None), 1 << 20)  # model_spec reads neither
    return speculation.model_spec("ask", Agent("asker", model, rate_limit=RateLimit(name=limit, concurrent=1),
                                               **agent))


def _admitted_after(sqlite_url: str, seconds: float, limit: str, **agent: Any) -> bool:
    """Whether a second driver's call is admitted ``seconds`` after a first driver, its call
    admitted, died (never released nor renewed its grant)."""
    spec = _model_spec(limit, **agent)
    store = SqlStore(sqlite_url)
    try:
        dead = Endless()
        RateGate(dead, store, clock=lambda: T0).submit(spec, _call("first"))
        assert dead.sent == ["first"]
        alive = Endless()
        RateGate(alive, store, clock=lambda: T0 + seconds).submit(spec, _call("second"))
        return alive.sent == ["second"]
    finally:
        store.close()


def test_a_dead_drivers_model_call_frees_its_slot_after_the_clients_timeout(sqlite_url: str) -> None:
    assert not _admitted_after(sqlite_url, 20.0 + HOLD_SLACK - 1, "stop44-early")  # it may still be running
    assert _admitted_after(sqlite_url, 20.0 + HOLD_SLACK + 1, "stop44-client") is True
    assert 20.0 + HOLD_SLACK + 1 < UNTIMED_HOLD


def test_the_agents_model_timeout_wins_over_the_clients(sqlite_url: str) -> None:
    assert not _admitted_after(sqlite_url, 5.0 + HOLD_SLACK + 1, "stop44-agent-early", model_timeout=200.0)
    assert _admitted_after(sqlite_url, 5.0 + HOLD_SLACK + 1, "stop44-agent", model_timeout=5.0) is True


# ---------------------------------------------------------------------- B6: why a run rests at its limits


def _tool_spec(limit: RateLimit) -> StepSpec:
    wf = Workflow("stop44_gate")

    @wf.step()
    def call() -> int:
        return 1

    return dataclasses.replace(wf.steps["call"], rate_limit=limit, timeout=None)


def test_the_gate_says_whether_a_limit_is_blocked_or_only_paced(sqlite_url: str) -> None:
    store = SqlStore(sqlite_url)
    try:
        paced = RateLimit(name="stop44-paced", requests=1, per=60.0)
        assert store.rate_acquire(rule_of(paced), T0, 30.0).grant is not None  # another driver's call
        gate = RateGate(Endless(), store, clock=lambda: T0 + 1)
        gate.submit(_tool_spec(paced), _call("mine"))
        held = gate.held_at_gate()
        assert isinstance(held, RateHold) and held.why == (WINDOW,)
        assert waiting_reason(held.limits, held.why) == ("waiting for rate limit stop44-paced "
                                                         "(paced: its own limit's window is full)")

        blocked = RateLimit(name="stop44-blocked", requests=100)
        store.rate_block("stop44-blocked", T0 + 120, T0)  # a provider's 429 said retry-after 120 s
        gate = RateGate(Endless(), store, clock=lambda: T0 + 1)
        gate.submit(_tool_spec(blocked), _call("mine"))
        held = gate.held_at_gate()
        assert isinstance(held, RateHold) and held.why == (BLOCKED,)
        assert "blocked: a provider's retry-after" in waiting_reason(held.limits, held.why)
    finally:
        store.close()


@tool(rate_limit=RateLimit(name="stop44-ping", requests=1, per=120.0))
def ping(n: int) -> str:
    """Ping."""
    return f"pong {n}"


def test_a_run_paced_by_its_own_limit_does_not_blame_a_provider(sqlite_url: str) -> None:
    """A run resting because its own limit (1 call per 120 s) was used read "(blocked: a
    provider's retry-after)": an operator went looking for a 429 that never came."""
    model = ScriptedModel(script={"go": [tool_reply(("ping", {"n": 1})), tool_reply(("ping", {"n": 2})),
                                         text_reply("done")]})
    wf = Workflow("stop44_paced")

    @wf.agent(Agent("pinger", model, tools=(ping,), max_turns=5))
    def work(input: str) -> str:
        return "go"

    record = raysaga.run(wf, "x", store=sqlite_url, executor="inline", run_id="paced")
    assert record.status == RunStatus.WAITING_TIMER
    assert record.status_reason == "waiting for rate limit stop44-ping (paced: its own limit's window is full)"


# ---------------------------------------------------------------------- B3: an inline call keeps its slot


class _Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


def _expires_at(url: str, limit: str) -> float:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return float(conn.execute(select(func.max(rate_grants.c.expires_at))
                                      .where(rate_grants.c.name == limit)).scalar_one())
    finally:
        engine.dispose()


def test_an_inline_call_longer_than_its_hold_keeps_its_concurrency_slot(sqlite_url: str) -> None:
    """The inline executor runs a call inside ``submit``, and only ``wait`` renewed holds: a call
    outliving its hold (an inline call's timeout cannot cut it) lost its slot, and a second driver's
    call ran beside it under ``concurrent=1``."""
    limit = RateLimit(name="stop44-inline", concurrent=1)
    clock = _Clock()
    other: list[str] = []

    wf = Workflow("stop44_inline")

    @wf.step()
    def export() -> int:
        clock.now += UNTIMED_HOLD + 10  # the call runs past its hold (the clock is the gate's)
        deadline = time.monotonic() + 10.0
        while _expires_at(sqlite_url, limit.name) < clock.now and time.monotonic() < deadline:
            time.sleep(0.05)  # the renewing thread's write, polled for (bounded)
        second = SqlStore(sqlite_url)
        try:  # another driver asks for the only slot while this call still runs
            endless = Endless()
            RateGate(endless, second, clock=clock).submit(_tool_spec(limit), _call("other"))
            other.extend(endless.sent)
        finally:
            second.close()
        return 1

    store = SqlStore(sqlite_url)
    try:
        gate = RateGate(InlineExecutor(), store, clock=clock)
        handle = gate.submit(dataclasses.replace(wf.steps["export"], rate_limit=limit, timeout=None), _call("export"))
        assert handle.sent
    finally:
        store.close()
    assert other == [], "a second call was admitted while the inline call still held the only slot"
