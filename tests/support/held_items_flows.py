"""Fan-outs whose items hold until the test releases them, for the ``raysaga status`` tests of
items with no row yet (``tests/cli/test_status_unissued_stop49.py``; a ``crash_driver`` flows
module).

``held``: an effect fan-out. Its items are issued ``Executor.effect_window`` at a time; the rest
wait, with no row and no ledger key, until one settles. ``plain``: the same items without an
effect, issued all at once with no row until they end (or a quiet tick records them running).
Each item marks that it started, then waits for the ``release`` file in the control folder."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from raysaga import Permanent, StepContext, Workflow

#: Seconds an item waits for the release file before it gives up (never reached when the test passes).
HOLD_LIMIT = 120.0


class Held(BaseModel):
    control_dir: str
    count: int


def _hold(control_dir: str, name: str) -> None:
    control = Path(control_dir)
    (control / f"started-{name}").touch()
    deadline = time.monotonic() + HOLD_LIMIT
    while not (control / "release").exists():
        if time.monotonic() > deadline:
            raise Permanent(f"{name}: never released")
        time.sleep(0.02)


held = Workflow("held-items")


@held.step
def orders(input: Held) -> list[int]:
    return list(range(input.count))


@held.map("orders", effect=True)
def charge(ctx: StepContext, input: Held, orders: int) -> int:
    assert ctx.idempotency_key is not None  # an effect: issued a window at a time
    _hold(input.control_dir, f"charge-{orders}")
    return orders


@held.step
def total(charge: list[int]) -> int:
    return len(charge)


plain = Workflow("held-plain-items")


@plain.step
def numbers(input: Held) -> list[int]:
    return list(range(input.count))


@plain.map("numbers")
def square(input: Held, numbers: int) -> int:
    _hold(input.control_dir, f"square-{numbers}")
    return numbers * numbers


@plain.step
def added(square: list[int]) -> int:
    return sum(square)


def sample(control_dir: str, count: int) -> dict[str, Any]:
    return {"control_dir": control_dir, "count": count}


FLOWS: dict[str, Workflow] = {"held": held, "plain": plain}
