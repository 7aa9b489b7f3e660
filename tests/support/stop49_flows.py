"""Workflows of ``tests/cli/test_inline_cancel_stop49.py`` and ``test_sigint_unrecorded_stop49.py``.

``charges``: an inline fan-out of effect items, each a charge at a provider (a line in
``<dir>/charges.log``, its idempotency key; a file ``<dir>/started-<i>`` when the item starts).
The item ``hold_at`` (1, the second) holds until its driver has seen the operator's cancel or
pause: it looks at the driver's own heartbeat, whose thread runs in this process (the item runs
in the driver's thread, inline), so the test's signal is provably seen before the round goes on,
with no sleep. Bounded: a broken test cannot hang a process for ever.

``slow_start``: imported with ``STOP49_BLOCK_RAY=<file>`` set, this module makes the Ray
executor's start write that file and then block (a Ray start that takes long, as on a loaded
machine), after Ray itself is up: a Ctrl-C then lands before the run is recorded.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from pydantic import BaseModel

from raysaga import Permanent, StepContext, Workflow

charges = Workflow("stop49_charges", version="1")


class ChargeIn(BaseModel):
    dir: str
    n: int = 8
    hold_at: int = 1


@charges.step()
def plan(input: ChargeIn) -> list[int]:
    return list(range(input.n))


def _driver_saw_a_stop(run_id: str) -> bool:
    """Whether the heartbeat of this process's driver of ``run_id`` holds a cancel or pause."""
    for thread in threading.enumerate():
        if thread.name == f"raysaga-heartbeat-{run_id}":
            heartbeat = vars(thread)["_target"].__self__  # its bound ``_run``
            return bool(heartbeat.waiting("cancel", "pause"))
    return False


@charges.map("plan", effect=True)
def charge(ctx: StepContext, plan: int, input: ChargeIn) -> str:
    folder, key = Path(input.dir), str(ctx.idempotency_key)
    (folder / f"started-{plan}").touch()
    with open(folder / "charges.log", "a") as log:
        log.write(key + "\n")
    if plan == input.hold_at and not (folder / "released").exists():
        deadline = time.monotonic() + 120
        while not _driver_saw_a_stop(ctx.run_id):
            if time.monotonic() > deadline:
                raise Permanent("the test never cancelled")
            time.sleep(0.02)  # polling the driver's view of the store
        (folder / "released").touch()  # once: a resume after a pause runs the rest straight on
    return key


@charges.step()
def total(charge: list[str]) -> int:
    return len(charge)


slow_start = Workflow("stop49_slow_start", version="1")


@slow_start.step()
def only(input: dict[str, int] | None = None) -> str:
    return "ran"


def _block_ray_start(ready: str) -> None:
    from raysaga.orchestrator import ray_start

    real = ray_start.start_ray

    def start_ray(*args: object, **kwargs: object) -> None:
        real(*args, **kwargs)  # type: ignore[arg-type]
        Path(ready).touch()
        time.sleep(600)  # a start that takes long: the test's Ctrl-C ends it

    ray_start.start_ray = start_ray


if os.environ.get("STOP49_BLOCK_RAY"):
    _block_ray_start(os.environ["STOP49_BLOCK_RAY"])
