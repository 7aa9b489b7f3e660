"""A shop whose rollback can stop half way, for the fork tests about undos a lineage still owes.

``reserve`` (an effect, undone by ``unreserve``) -> ``plan`` -> ``charge`` (a best-effort fan-out
of effects, each undone by ``refund``) -> ``ship``. ``switches`` flips behaviour between runs:
``ship`` fails (a critical failure: the run rolls back), and the refund of the items in
``refuse`` fails for good, so the rollback stops there (``compensation_failed``) and never starts
``unreserve``, which waits on it. Every call goes to one ``FakeProvider`` (it dedupes by key).
"""

from __future__ import annotations

from typing import Any

from raysaga import BEST_EFFORT, Permanent, StepContext, Workflow
from raysaga.testing import FakeProvider


def stopping_shop(name: str, provider: FakeProvider, switches: dict[str, Any]) -> Workflow:
    """The shop above; ``switches``: ``{"ship_fails": bool, "refuse": set of items}``."""
    wf = Workflow(name)

    @wf.step(effect=True)
    def reserve(ctx: StepContext) -> str:
        return str(provider.call("reserve", ctx.idempotency_key)["id"])

    @wf.compensation("reserve")
    def unreserve(ctx: StepContext, output: str) -> None:
        provider.call("unreserve", ctx.idempotency_key, {"reservation": output})

    @wf.step()
    def plan(input: dict[str, int], reserve: str) -> list[int]:
        return list(range(input["n"]))

    @wf.step(map_over="plan", effect=True, policy=BEST_EFFORT)
    def charge(ctx: StepContext, plan: int) -> str:
        return str(provider.call("charge", ctx.idempotency_key, {"item": plan})["id"])

    @wf.compensation("charge")
    def refund(ctx: StepContext, output: str) -> None:
        if ctx.fan_index in switches["refuse"]:
            raise Permanent("refund refused")
        provider.call("refund", ctx.idempotency_key, {"charge": output})

    @wf.step()
    def ship(charge: Any) -> str:
        if switches["ship_fails"]:
            raise Permanent("ship failed")
        return "shipped"

    return wf
