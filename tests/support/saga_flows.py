"""Workflows the rollback tests drive, in-process or in driver subprocesses (``tests.support.saga_driver``).

Not a test module: it is imported by name (``tests.support.saga_flows``; Ray workers import it
again from the PYTHONPATH the Ray executor hands them, which holds the repository root). Every forward effect
calls the fake provider with kind ``do``, every compensation with kind ``undo``; both pass
their idempotency key, so the provider's ordered call log is the order the world saw.

- ``trip``: the example (``examples.trip.workflow``): flight → charge → hotel (sold out).
- ``diamond``: ``a → b, a → c, (b, c) → d``; a, b, c, d effects with compensations; d fails
  (permanently, before its call).
- ``wide10``: ten steps with a four-item effect fan-out: effects a → (b, c), a plain
  ``plan`` (b, c) → ``work[0..3]`` (effect items) → plain ``merge``; ``stamp`` (c) is not an
  effect but has a compensation; ``notify`` (merge, stamp) an effect; ``finish`` fails.
- ``inflight``: ``a → b, a → c``; b (effect) calls the provider, says so in the file
  ``b_called`` and blocks until ``release`` appears in ``input.control_dir``; c waits for
  ``b_called`` and fails: b is in flight (its outcome unknown) when the rollback starts.
- ``unknown``: ``a → b``; b's call reaches the provider, then every attempt ends in a
  connection error: its retries run out on transient errors, outcome unknown.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from examples.trip import workflow as trip_example
from raysaga import Permanent, RetryPolicy, StepContext, Workflow
from tests.support import services as fake_services

COMPENSATE_SUFFIX = ":compensate"
FAST_RETRY = RetryPolicy(max_attempts=3, base=0.02, cap=0.05)
WORK_ITEMS = 4
#: How long a blocked step waits for its file (never reached when the test works; it keeps a
#: broken test from hanging a worker forever).
BLOCK_LIMIT = 120.0


class FlowIn(BaseModel):
    services_url: str
    seed: str = "s"
    control_dir: str | None = None


def _key(ctx: StepContext) -> str:
    assert ctx.idempotency_key is not None, f"{ctx.label} is not an effect"
    return ctx.idempotency_key


def do(ctx: StepContext, input: FlowIn) -> str:
    """A forward effect: one provider call, kind ``do``."""
    reply = fake_services.post(input.services_url, "do", _key(ctx), {"subject": f"{input.seed}/{ctx.label}"})
    return str(reply["id"])


def undo(ctx: StepContext, input: FlowIn, output: Any) -> dict[str, Any]:
    """The compensation of every step here: one provider call, kind ``undo``, saying whether
    it got the step's output (None: the step's outcome was unknown)."""
    reply = fake_services.post(input.services_url, "undo", _key(ctx), {
        "subject": f"{input.seed}/{ctx.label}", "had_output": output is not None, "output": output})
    return {"undo": reply["id"], "had_output": output is not None, "got": output}


def _wait_for(path: Path, what: str) -> None:
    deadline = time.monotonic() + BLOCK_LIMIT
    while not path.exists():
        if time.monotonic() > deadline:
            raise Permanent(f"{what}: {path} did not appear within {BLOCK_LIMIT}s")
        time.sleep(0.02)  # polling for the test's file: the test's hand on a running step


# ---------------------------------------------------------------------- diamond


diamond = Workflow("diamond", version="1")


@diamond.step(effect=True, retry=FAST_RETRY, compensate=undo)
def a(ctx: StepContext, input: FlowIn) -> str:
    return do(ctx, input)


@diamond.step(effect=True, retry=FAST_RETRY, compensate=undo)
def b(ctx: StepContext, input: FlowIn, a: str) -> str:
    return do(ctx, input)


@diamond.step(effect=True, retry=FAST_RETRY, compensate=undo)
def c(ctx: StepContext, input: FlowIn, a: str) -> str:
    return do(ctx, input)


@diamond.step(effect=True, retry=FAST_RETRY, compensate=undo)
def d(ctx: StepContext, input: FlowIn, b: str, c: str) -> str:
    raise Permanent("d refuses: the diamond's sink fails before its call")


# ---------------------------------------------------------------------- wide10


wide10 = Workflow("wide10", version="1")


@wide10.step(name="a", effect=True, retry=FAST_RETRY, compensate=undo)
def w_a(ctx: StepContext, input: FlowIn) -> str:
    return do(ctx, input)


@wide10.step(name="b", effect=True, retry=FAST_RETRY, compensate=undo)
def w_b(ctx: StepContext, input: FlowIn, a: str) -> str:
    return do(ctx, input)


@wide10.step(name="c", effect=True, retry=FAST_RETRY, compensate=undo)
def w_c(ctx: StepContext, input: FlowIn, a: str) -> str:
    return do(ctx, input)


@wide10.step()
def plan(b: str, c: str) -> list[str]:
    return [f"item-{i}" for i in range(WORK_ITEMS)]


@wide10.map("plan", effect=True, retry=FAST_RETRY, compensate=undo)
def work(ctx: StepContext, input: FlowIn, plan: str) -> str:
    return do(ctx, input)


@wide10.step()
def merge(work: list[str]) -> int:
    return len(work)


@wide10.step(compensate=undo)
def stamp(c: str) -> str:
    """Not an effect, yet compensated: its compensation is still an effect with its own key."""
    return f"stamped-{c}"


@wide10.step(effect=True, retry=FAST_RETRY, compensate=undo)
def notify(ctx: StepContext, input: FlowIn, merge: int, stamp: str) -> str:
    return do(ctx, input)


@wide10.step()
def audit(stamp: str, plan: list[str]) -> str:
    return f"audited-{stamp}-{len(plan)}"


@wide10.step()
def finish(notify: str, audit: str) -> str:
    raise Permanent("finish fails: roll the run back")


# ---------------------------------------------------------------------- inflight (Ray)


inflight = Workflow("inflight", version="1")


@inflight.step(name="a", effect=True, retry=FAST_RETRY, compensate=undo)
def i_a(ctx: StepContext, input: FlowIn) -> str:
    return do(ctx, input)


@inflight.step(name="b", effect=True, retry=FAST_RETRY, compensate=undo)
def i_b(ctx: StepContext, input: FlowIn, a: str) -> str:
    reply = do(ctx, input)  # it took effect ...
    assert input.control_dir is not None
    control = Path(input.control_dir)
    (control / "b_called").touch()
    _wait_for(control / "release", "b")  # ... and its result never reaches the driver
    return reply


@inflight.step(name="c")
def i_c(input: FlowIn, a: str) -> str:
    assert input.control_dir is not None
    _wait_for(Path(input.control_dir) / "b_called", "c")
    raise Permanent("c fails while b is in flight")


# ---------------------------------------------------------------------- unknown (inline)


unknown = Workflow("unknown", version="1")


@unknown.step(name="a", effect=True, retry=FAST_RETRY, compensate=undo)
def u_a(ctx: StepContext, input: FlowIn) -> str:
    return do(ctx, input)


@unknown.step(name="b", effect=True, retry=FAST_RETRY, compensate=undo)
def u_b(ctx: StepContext, input: FlowIn, a: str) -> str:
    do(ctx, input)  # the call lands (a retry replays it: same key) ...
    raise ConnectionError("the reply was lost")  # ... but the step never learns it did


FLOWS: dict[str, Workflow] = {"trip": trip_example.wf, "diamond": diamond, "wide10": wide10,
                              "inflight": inflight, "unknown": unknown}


def sample_input(flow: str, services_url: str, control_dir: str | None = None, seed: str = "s") -> dict[str, Any]:
    if flow == "trip":
        return trip_example.sample_input(services_url, trip_id=seed)
    return FlowIn(services_url=services_url, seed=seed, control_dir=control_dir).model_dump()
