"""A charge, its refund and a shipping step that fails on demand: the smallest saga a fork can
roll back (the charge under the parent's key refunded by the fork), for the fork and prune tests."""

from __future__ import annotations

from typing import Any

from raysaga import Permanent, StepContext, Workflow
from raysaga.testing import FakeProvider


def shop(name: str, provider: FakeProvider, fails: dict[str, bool]) -> Workflow:
    """``charge`` (an effect on ``provider``, of ``input["amount"]`` when given) → ``ship``, which
    raises ``Permanent`` while ``fails["ship"]``; ``refund`` compensates the charge."""
    wf = Workflow(name)

    @wf.step(effect=True)
    def charge(ctx: StepContext, input: Any) -> str:
        args = {"amount": input["amount"]} if isinstance(input, dict) else {}
        return str(provider.call("charge", ctx.idempotency_key, args)["id"])

    @wf.compensation("charge")
    def refund(ctx: StepContext, output: str) -> None:
        provider.call("refund", ctx.idempotency_key, {"charge": output})

    @wf.step()
    def ship(charge: str) -> str:
        if fails["ship"]:
            raise Permanent("the warehouse is closed")
        return f"shipped on {charge}"

    return wf
