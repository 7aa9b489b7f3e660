"""An agent item of a fan-out that closed while it asked a human ends there, but its other tool
calls already in flight land first: agent items are never cut short (stop 43, the review of the
fix that ends such an item: it cancelled an effect tool call of the same turn mid-call, on Ray,
and a non-critical step left that half-done charge for nothing to compensate).

One turn asks for ``pay`` (approved by a human) and ``charge`` (an effect, no approval); the other
item's model fails for good, so ``quorum(2)`` is out of reach and the step fails. ``charge`` runs
on Ray until it sees the step failed in the store, then returns: it must be committed."""

from __future__ import annotations

import time
from typing import Any

import raysaga
from raysaga import RetryPolicy, Transient, Workflow
from raysaga.agents import Agent, ModelRequest, ModelResponse, ScriptedModel, text_reply, tool, tool_reply
from raysaga.agents.models import first_user_text
from raysaga.sagas import quorum
from raysaga.state import EffectStatus, NodeStatus, RunStatus, SqlStore


@tool(effect=True, requires_approval=True, approvers=["alice"])
def pay43(who: str, idempotency_key: str) -> str:
    """Pay (a human approves first)."""
    return "paid"


@tool(effect=True)
def charge43(url: str, run_id: str, idempotency_key: str) -> str:
    """Charge; it is still running when its step fails (it waits for that, at most a minute)."""
    store = SqlStore(url)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # a condition: the step's row says it failed
            rows = {n.label: n.status for n in store.nodes(run_id)}
            if rows.get("research") == NodeStatus.FAILED:
                return "charged"
            time.sleep(0.05)
    finally:
        store.close()
    raise RuntimeError("the step never failed")


class Model(ScriptedModel):
    """Item ``alpha`` asks for both tools in one turn, then answers; ``broken`` fails for good."""

    def __init__(self, url: str, run_id: str) -> None:
        super().__init__()
        self.url, self.run_id = url, run_id

    def complete(self, request: ModelRequest) -> ModelResponse:
        if "broken" in first_user_text(request.messages):
            raise Transient("HTTP 500")
        if len(request.messages) > 1:
            return text_reply("done")
        return tool_reply(("pay43", {"who": "a"}), ("charge43", {"url": self.url, "run_id": self.run_id}))


def test_an_item_ended_by_its_step_lets_its_effect_in_flight_land(ray_session: str, sqlite_url: str) -> None:
    run_id = "landed43"
    agent = Agent(name="r", model=Model(sqlite_url, run_id), tools=(pay43, charge43),
                  transport_retry=RetryPolicy(max_attempts=1))
    wf = Workflow("not_asked_lands43")

    @wf.step()
    def plan(input: Any) -> list[str]:
        return ["alpha", "broken"]

    @wf.agent(agent, map_over="plan", policy=quorum(2), critical=False)
    def research(plan: str) -> str:
        return f"R {plan}"

    record = raysaga.run(wf, None, store=sqlite_url, run_id=run_id, executor="ray", address=ray_session)
    assert record.status == RunStatus.COMPLETED, (record.status, record.status_reason)
    store = SqlStore(sqlite_url)
    try:
        rows = {n.label: n for n in store.nodes(run_id)}
        effects = {e.effect_name: e.status for e in store.effects(run_id)}
    finally:
        store.close()
    assert effects.get("tool:charge43") == EffectStatus.COMMITTED, effects  # landed, not cut short
    assert rows["research[0]"].status == NodeStatus.FAILED and rows["research[0]"].error is not None
    assert "not run: its step failed" in (rows["research[0]"].error.message or "")
    assert "tool:pay43" not in effects  # never decided, never run
