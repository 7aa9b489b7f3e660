"""Workflows the dashboard tests (and its screenshots) run: not a test module.

Runs record ``workflow_ref`` (``tests.support.dashboard_flows:NAME``) so the dashboard draws each
from its workflow's graph. ``gated`` and ``refund`` rest ``waiting_human`` at their approval until
a test decides (``approve_and_resume``), so a browser or a stream watches them advance; every
flow runs with the inline executor in the test's process.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

import raysaga
from raysaga import Approval, Ask, Permanent, StepContext, Workflow
from raysaga.agents import Agent, tool
from raysaga.agents.models import ScriptedModel, text_reply, tool_reply

MODULE = "tests.support.dashboard_flows"
#: A token-shaped value a step returns: the dashboard must never show it.
LEAKY = "sk-ant-" + "x" * 30

gated = Workflow("gated", version="1")


@gated.step()
def plan(input: dict[str, Any]) -> list[int]:
    return list(range(int(input.get("items", 3))))


@gated.map("plan")
def fetch(plan: int) -> dict[str, int]:
    return {"item": plan, "square": plan * plan}


@gated.approval()
def gate(fetch: list[dict[str, int]]) -> Ask:
    return Ask(prompt=f"Publish {len(fetch)} items?", payload={"items": len(fetch)})


@gated.step()
def report(gate: Approval, plan: list[int]) -> dict[str, Any]:
    return {"items": len(plan), "approved_by": gate.by, "token": LEAKY}


shop = Workflow("shop", version="1")


@shop.step(effect=True)
def reserve(ctx: StepContext, input: dict[str, Any]) -> dict[str, str]:
    return {"reservation": "r-" + str(ctx.idempotency_key)[:8]}


@shop.compensation("reserve")
def release(ctx: StepContext, input: dict[str, Any], output: Any) -> dict[str, str]:
    return {"released": str(output)}


@shop.step(effect=True)
def charge(ctx: StepContext, input: dict[str, Any], reserve: dict[str, str]) -> dict[str, str]:
    return {"charge": "ch-" + str(ctx.idempotency_key)[:8]}


@shop.compensation("charge")
def refund_charge(ctx: StepContext, input: dict[str, Any], output: Any) -> dict[str, str]:
    return {"refunded": str(output)}


@shop.step()
def ship(input: dict[str, Any], charge: dict[str, str]) -> str:
    raise Permanent("the carrier refused the parcel (address unknown)")


wide = Workflow("wide", version="1")


@wide.step()
def split(input: dict[str, Any]) -> list[int]:
    return list(range(int(input["items"])))


@wide.map("split")
def square(split: int) -> int:
    return split * split


@wide.step()
def total(square: list[int]) -> int:
    return sum(square)


@tool
def lookup(sku: str) -> str:
    """Look a product up."""
    return f"{sku}: 12 in stock"


@tool(effect=True, key=["sku"])
def order(sku: str, qty: int) -> dict[str, Any]:
    """Order more of a product."""
    return {"po": f"po-{sku}-{qty}"}


def _model() -> ScriptedModel:
    return ScriptedModel(default=(tool_reply(("lookup", {"sku": "A1"})), tool_reply(("order", {"sku": "A1", "qty": 5})),
                                  text_reply("Ordered 5 more of A1 (po-A1-5).")))


helper = Workflow("helper", version="1")


@helper.agent(Agent(name="buyer", model=_model(), system="You restock.", tools=(lookup, order)))
def restock(input: dict[str, Any]) -> str:
    return f"restock {input.get('sku', 'A1')}"


class Edit(BaseModel):
    amount: int


refund = Workflow("refund", version="1")


@refund.step(effect=True)
def hold(ctx: StepContext, input: dict[str, Any]) -> dict[str, Any]:
    return {"amount": int(input.get("amount", 40)), "hold": "h-" + str(ctx.idempotency_key)[:8]}


@refund.compensation("hold")
def unhold(ctx: StepContext, input: dict[str, Any], output: Any) -> dict[str, Any]:
    return {"released": output}


@refund.step(effect=True)
def note(ctx: StepContext, hold: dict[str, Any]) -> str:
    return "noted " + str(hold["amount"])


@refund.compensation("note")
def unnote(ctx: StepContext, hold: dict[str, Any], output: Any) -> str:
    return "unnoted"


@refund.approval(approvers=["alice", "bob"], answer=Edit)
def review(hold: dict[str, Any], note: str) -> Ask:
    return Ask(prompt=f"Refund {hold['amount']}?", payload=hold)


@refund.step()
def pay(hold: dict[str, Any], review: Approval) -> dict[str, Any]:
    amount = review.answer["amount"] if review.answer else hold["amount"]
    return {"paid": amount, "by": review.by}


def start(wf: Workflow, name: str, input: Any, url: str, run_id: str | None = None) -> str:
    """Record a run of ``wf`` (named ``name`` in this module) without driving it."""
    from raysaga.orchestrator.runner import create_run

    return create_run(wf, input, store=url, run_id=run_id, workflow_ref=f"{MODULE}:{name}").run_id


def drive(wf: Workflow, run_id: str, url: str) -> raysaga.RunRecord:
    return raysaga.resume(wf, run_id, store=url, executor="inline")


def approve_and_resume(wf: Workflow, run_id: str, node: str, url: str, *, by: str = "alice",
                       answer: Any = None) -> raysaga.RunRecord:
    """Decide a waiting approval as ``by`` and drive the run on (as a worker would)."""
    with raysaga.Client(url) as client:
        client.approve(run_id, node, by=by, answer=answer)
    return drive(wf, run_id, url)


def populate(url: str, *, wide_items: int = 40) -> dict[str, str]:
    """One run of each flow, driven to rest (``gated`` approved and completed, ``refund`` waiting
    for its approval): name -> run id."""
    runs = {}
    for name, wf, value in (("gated", gated, {"items": 4}), ("shop", shop, {"sku": "A1"}),
                            ("wide", wide, {"items": wide_items}), ("helper", helper, {"sku": "A1"}),
                            ("refund", refund, {"amount": 40})):
        runs[name] = start(wf, name, value, url)
        drive(wf, runs[name], url)
    approve_and_resume(gated, runs["gated"], "gate", url)
    return runs
