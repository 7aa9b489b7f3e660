"""Workflows whose steps are declared ``local=True`` (``raysaga.orchestrator.local_steps``), for
``tests/orchestrator/test_local_steps.py`` and its crash test (a ``crash_driver`` flows module).

- ``where``: a local planner, items on Ray, a local join; every step returns the pid it ran in.
- ``flaky``: a local step that fails transiently on its first attempt.
- ``charge``: a local effect that calls the fake provider, then, on its first attempt, SIGKILLs
  its own process: the driver's, since a local step runs there.
- ``held``: a Ray step, then a local effect that charges and holds until the test releases it.
- ``mutating``: a local step that appends to the upstream output it was given.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from raysaga import NOT_APPLIED, Permanent, RetryPolicy, StepContext, Transient, Workflow
from tests.support import services as fake_services

FAST_RETRY = RetryPolicy(max_attempts=3, base=0.01, cap=0.05)

# ---------------------------------------------------------------------- where each step runs

where = Workflow("local-where")


@where.step(local=True)
def plan(input: int) -> list[int]:
    return [os.getpid()] * input


@where.map("plan")
def item(plan: int) -> int:
    return os.getpid()


@where.step(local=True)
def join(plan: list[int], item: list[int]) -> dict[str, Any]:
    return {"plan": plan[0], "items": sorted(set(item)), "join": os.getpid()}


# ---------------------------------------------------------------------- retried in the driver

flaky = Workflow("local-flaky")


@flaky.step(local=True, retry=FAST_RETRY)
def wobbly(ctx: StepContext) -> dict[str, int]:
    if ctx.attempt == 1:
        raise Transient("the first attempt fails")
    return {"attempt": ctx.attempt, "pid": os.getpid()}


# ---------------------------------------------------------------------- an effect, and a dying driver


class ChargeIn(BaseModel):
    services_url: str
    order_id: str


charge = Workflow("local-charge")


def _reconcile(ctx: StepContext, input: ChargeIn) -> str:
    """Asks the provider whether the charge under this key took effect."""
    assert ctx.idempotency_key is not None
    if fake_services.get_log(input.services_url)["effective"].get(ctx.idempotency_key):
        return fake_services.response_id("charge", ctx.idempotency_key)
    return NOT_APPLIED  # type: ignore[no-any-return]


@charge.step(local=True, effect=True, reconcile=_reconcile, retry=FAST_RETRY)
def pay(ctx: StepContext, input: ChargeIn) -> str:
    assert ctx.idempotency_key is not None
    reply = fake_services.post(input.services_url, "charge", ctx.idempotency_key, {"order_id": input.order_id})
    if ctx.attempt == 1:
        os.kill(os.getpid(), signal.SIGKILL)  # the driver dies after the charge, before its result is committed
    return str(reply["id"])


@charge.step(local=True)
def receipt(pay: str) -> str:
    return f"receipt:{pay}"


# ---------------------------------------------------------------------- a local effect held by the test

HOLD_LIMIT = 120.0


class HeldIn(BaseModel):
    services_url: str
    control_dir: str


held = Workflow("local-held")


@held.step
def first(input: HeldIn) -> str:
    return "ok"


@held.step(local=True, effect=True)
def slow_pay(ctx: StepContext, input: HeldIn, first: str) -> str:
    """Charges, says so, then holds until the test writes ``release`` (the test pauses the run meanwhile)."""
    assert ctx.idempotency_key is not None
    reply = fake_services.post(input.services_url, "charge", ctx.idempotency_key, {"order_id": "held-1"})
    control = Path(input.control_dir)
    (control / f"paid-{ctx.attempt}").touch()
    deadline = time.monotonic() + HOLD_LIMIT
    while not (control / "release").exists():
        if time.monotonic() > deadline:
            raise Permanent("never released")
        time.sleep(0.01)
    return str(reply["id"])


@held.step
def after(slow_pay: str) -> str:
    return f"after:{slow_pay}"


# ---------------------------------------------------------------------- a local step mutating its input

mutating = Workflow("local-mutating")


@mutating.step
def src() -> dict[str, list[int]]:
    return {"a": [1, 2]}


@mutating.step(local=True)
def mutate(src: Any) -> int:  # (Any: no validation makes a new object on the way in)
    src["a"].append(99)
    return len(src["a"])


@mutating.step(local=True)
def later(src: Any, mutate: int) -> Any:
    return src


FLOWS: dict[str, Workflow] = {"where": where, "flaky": flaky, "charge": charge}
