"""A wide effect fan-out whose items hold until the test releases them, for
``tests/crash/test_effect_window.py`` (a ``crash_driver`` flows module).

Each item charges the fake provider under its idempotency key, marks that it ran, then waits for
the ``release`` file: the test kills the driver while the first items hold, and reads how many
ledger rows the run had written."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from raysaga import Permanent, RetryPolicy, StepContext, Transient, Workflow
from tests.support import services as fake_services

#: Seconds an item waits for the release file before it gives up (never reached when the test passes).
HOLD_LIMIT = 120.0


class WideCharge(BaseModel):
    services_url: str
    control_dir: str
    count: int


wide = Workflow("effect-window")


@wide.step
def orders(input: WideCharge) -> list[int]:
    return list(range(input.count))


@wide.map("orders", effect=True, retry=RetryPolicy(max_attempts=3, base=0.05, cap=0.2))
def charge(ctx: StepContext, input: WideCharge, orders: int) -> str:
    assert ctx.idempotency_key is not None
    reply = fake_services.post(input.services_url, "charge", ctx.idempotency_key, {"order_id": f"o-{orders}"})
    control = Path(input.control_dir)
    (control / f"ran-{orders}-{ctx.attempt}").touch()
    deadline = time.monotonic() + HOLD_LIMIT
    while not (control / "release").exists():
        if time.monotonic() > deadline:
            raise Permanent(f"item {orders}: never released")
        time.sleep(0.02)
    return str(reply["id"])


@wide.step
def total(charge: list[str]) -> int:
    return len(set(charge))


def sample(services_url: str, control_dir: str, count: int) -> dict[str, Any]:
    return {"services_url": services_url, "control_dir": control_dir, "count": count}


# ---------------------------------------------------------------------- every first attempt fails


class FlakyCharge(BaseModel):
    services_url: str
    control_dir: str
    db_file: str
    count: int


flaky = Workflow("effect-window-flaky")


@flaky.step
def flaky_orders(input: FlakyCharge) -> list[int]:
    return list(range(input.count))


@flaky.map("flaky_orders", effect=True, retry=RetryPolicy(max_attempts=3, base=0.3, cap=0.3))
def flaky_charge(ctx: StepContext, input: FlakyCharge, flaky_orders: int) -> str:
    """Counts the run's pending ledger rows as it starts (what a crash now would leave in doubt),
    charges, then fails its first attempt transiently: it waits out a backoff, its row pending."""
    assert ctx.idempotency_key is not None
    with sqlite3.connect(input.db_file, timeout=30) as db:
        (pending,) = db.execute("SELECT count(*) FROM raysaga_effects WHERE run_id = ? AND status = 'pending'",
                                (ctx.run_id,)).fetchone()
    Path(input.control_dir, f"seen-{flaky_orders}-{ctx.attempt}-{pending}").touch()
    reply = fake_services.post(input.services_url, "charge", ctx.idempotency_key, {"order_id": f"f-{flaky_orders}"})
    if ctx.attempt == 1:
        raise Transient("the provider timed out (the charge went through)")
    return str(reply["id"])


@flaky.step
def flaky_total(flaky_charge: list[str]) -> int:
    return len(set(flaky_charge))


FLOWS: dict[str, Workflow] = {"wide": wide, "flaky": flaky}
