"""A fan-out of effects for the Ray fault tests (``tests/crash/test_ray_faults.py``).

Not a test module: Ray workers import it by name. ``plan`` lists ``n`` items; each ``charge`` item
charges the deduping fake provider under its idempotency key, writes ``start <label> <pid> <node
id>`` to ``input.log`` (the charge is made), holds ``input.hold`` seconds (the window in which the test kills the
process or node running it: after the effect, before its result is back), and writes ``end``;
``total`` counts them.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from pydantic import BaseModel

from raysaga import RetryPolicy, StepContext, Workflow
from tests.support import services as fake_services


class FanIn(BaseModel):
    services: str
    log: str
    n: int
    hold: float


def _note(path: str, line: str) -> None:
    with Path(path).open("a", encoding="utf-8") as fh:
        fh.write(line + "\n")


def _node_id() -> str:
    try:
        import ray

        return str(ray.get_runtime_context().get_node_id())
    except Exception:  # not in a Ray worker
        return "-"


fan = Workflow("ray_faults", version="1")


@fan.step()
def plan(input: FanIn) -> list[int]:
    return list(range(input.n))


@fan.map("plan", effect=True, retry=RetryPolicy(max_attempts=8, base=0.05, cap=0.3))
def charge(ctx: StepContext, input: FanIn, plan: int) -> str:
    assert ctx.idempotency_key is not None
    reply = fake_services.post(input.services, "charge", ctx.idempotency_key, {"subject": f"item-{plan}"})
    _note(input.log, f"start {ctx.label} {os.getpid()} {_node_id()}")  # charged: from here a kill costs a retry
    time.sleep(input.hold)  # the item's work after its effect: where a kill lands
    _note(input.log, f"end {ctx.label} {os.getpid()}")
    return str(reply["id"])


@fan.step()
def total(charge: list[str]) -> int:
    return len(charge)
