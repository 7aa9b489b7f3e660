"""Workflows the worker-fleet tests register (``raysaga worker -w tests.support.fleet_flows:NAME``).

Not a test module. ``short``: ``prepare → charge (effect) → email (effect) → finish``, each step
deterministic in its input, the effects calling the deduping fake provider (``input.services``)
with their idempotency keys. Every step appends ``start``/``end`` lines (run, node, pid, time)
to ``input.trace`` so a test can prove no two worker processes ever drove one run at once.
``approval``: ``prepare → review (approval) → charge (effect)``.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from raysaga import Approval, Permanent, RetryPolicy, StepContext, Workflow
from tests.support import services as fake_services


class FleetIn(BaseModel):
    n: int
    services: str
    trace: str


FAST_RETRY = RetryPolicy(max_attempts=6, base=0.05, cap=0.3)


def _trace(ctx: StepContext, input: FleetIn, what: str) -> None:
    with Path(input.trace).open("a", encoding="utf-8") as fh:
        fh.write(f"{what} {ctx.run_id} {ctx.label} {os.getpid()} {time.time():.6f}\n")


def _key(ctx: StepContext) -> str:
    assert ctx.idempotency_key is not None
    return ctx.idempotency_key


short = Workflow("fleet_short")


@short.step()
def prepare(ctx: StepContext, input: FleetIn) -> int:
    _trace(ctx, input, "start")
    _trace(ctx, input, "end")
    return input.n * 2


@short.step(effect=True, retry=FAST_RETRY)
def charge(ctx: StepContext, input: FleetIn, prepare: int) -> dict[str, Any]:
    _trace(ctx, input, "start")
    reply = fake_services.post(input.services, "charge", _key(ctx), {"subject": f"charge-{input.n}",
                                                                     "amount": prepare})
    _trace(ctx, input, "end")
    return {"id": reply["id"], "amount": prepare}


@short.step(effect=True, retry=FAST_RETRY)
def email(ctx: StepContext, input: FleetIn, charge: dict[str, Any]) -> str:
    _trace(ctx, input, "start")
    reply = fake_services.post(input.services, "email", _key(ctx), {"subject": f"email-{input.n}"})
    _trace(ctx, input, "end")
    return str(reply["id"])


@short.step()
def finish(ctx: StepContext, input: FleetIn, charge: dict[str, Any], email: str) -> dict[str, int]:
    _trace(ctx, input, "start")
    _trace(ctx, input, "end")
    return {"n": input.n, "amount": charge["amount"]}


def golden(n: int) -> dict[str, Any]:
    """The output of an uninterrupted ``short`` run."""
    return {"finish": {"n": n, "amount": n * 2}}


approval = Workflow("fleet_approval")


@approval.step()
def ready(input: FleetIn) -> int:
    return input.n


@approval.approval(approvers=["alice"])
def review(ready: int) -> str:
    return f"charge {ready}?"


@approval.step(effect=True, retry=FAST_RETRY)
def pay(ctx: StepContext, input: FleetIn, ready: int, review: Approval) -> str:
    reply = fake_services.post(input.services, "charge", _key(ctx), {"subject": f"pay-{input.n}", "by": review.by})
    return str(reply["id"])


slow = Workflow("fleet_slow")
#: How long ``wait`` polls for its release file (never reached when the test works).
BLOCK_LIMIT = 120.0


@slow.step()
def wait(ctx: StepContext, input: FleetIn) -> int:
    """Blocks until the file ``release`` appears beside ``input.trace``: the test's hand on a step."""
    _trace(ctx, input, "start")
    release = Path(input.trace).parent / "release"
    deadline = time.monotonic() + BLOCK_LIMIT
    while not release.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    _trace(ctx, input, "end")
    return input.n


@slow.step(effect=True, retry=FAST_RETRY)
def after(ctx: StepContext, input: FleetIn, wait: int) -> str:
    _trace(ctx, input, "start")
    reply = fake_services.post(input.services, "charge", _key(ctx), {"subject": f"slow-{wait}"})
    _trace(ctx, input, "end")
    return str(reply["id"])


fragile = Workflow("fleet_fragile")


@fragile.step()
def check(ctx: StepContext, input: FleetIn) -> int:
    """Fails for good while the file ``broken`` stands beside ``input.trace`` (an operator's fix
    is to delete it, then retry the run)."""
    if (Path(input.trace).parent / "broken").exists():
        raise Permanent("the upstream is broken")
    return input.n


@fragile.step(effect=True, retry=FAST_RETRY)
def settle(ctx: StepContext, input: FleetIn, check: int) -> str:
    reply = fake_services.post(input.services, "charge", _key(ctx), {"subject": f"fragile-{check}"})
    return str(reply["id"])


#: For ``tests.support.crash_driver --flows tests.support.fleet_flows --flow NAME``.
FLOWS = {"short": short, "approval": approval, "slow": slow, "fragile": fragile}
