"""Workflows the crash tests drive in driver subprocesses (``python -m tests.support.crash_driver --flow NAME``).

Not a test module: ``crash_driver`` imports it by name. Every step is deterministic in
its inputs, so an uninterrupted run and a killed-and-resumed one must agree byte for byte.

- ``order``: the example (``examples.order.workflow``): 4 nodes, 2 effects.
- ``wide``: 20 nodes: a diamond, a planner fanning out into ``WIDE_ITEMS`` effect items
  (``work[0..7]``), a join and a chain behind them, with one more effect (``notify``).
- ``gate``: ``prepare → gate → charge (effect) → finish``; the *first* process to enter
  ``gate`` blocks there until the file ``release`` appears in ``input.control_dir`` (the
  zombie-driver and two-drivers tests).
- ``workerkill``: an effect whose first attempt calls the provider, writes its Ray worker's
  pid to ``worker.pid`` and blocks (the test SIGKILLs that worker); later attempts return.
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from examples.order.workflow import sample_input as order_input
from examples.order.workflow import wf as order
from raysaga import Permanent, RetryPolicy, StepContext, Workflow
from tests.support import services as fake_services

WIDE_ITEMS = 8
#: How long a blocked step waits for its release file before giving up (never reached when
#: the test works; it keeps a broken test from hanging a worker forever).
BLOCK_LIMIT = 120.0
FAST_RETRY = RetryPolicy(max_attempts=4, base=0.05, cap=0.2)


def _h(*parts: object) -> str:
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:10]


def _key(ctx: StepContext) -> str:
    assert ctx.idempotency_key is not None
    return ctx.idempotency_key


def _wait_for(path: Path, what: str) -> None:
    """Block (poll) until ``path`` exists: the test's hand on a running step."""
    deadline = time.monotonic() + BLOCK_LIMIT
    while not path.exists():
        if time.monotonic() > deadline:
            raise Permanent(f"{what}: {path} did not appear within {BLOCK_LIMIT}s")
        time.sleep(0.02)


# ---------------------------------------------------------------------- wide: 20 nodes


class WideIn(BaseModel):
    services_url: str
    seed: str = "wide"
    items: int = WIDE_ITEMS


class Item(BaseModel):
    index: int
    name: str
    weight: int


class WorkDone(BaseModel):
    index: int
    receipt: str
    weight: int


wide = Workflow("wide", version="1", description="a diamond, an 8-way effect fan-out, a join and a chain")


@wide.step()
def prepare(input: WideIn) -> str:
    return f"base-{_h(input.seed)}"


@wide.step()
def left(prepare: str) -> int:
    return int(prepare[-6:], 16) % 97


@wide.step()
def right(prepare: str) -> int:
    return int(prepare[-4:], 16) % 89


@wide.step()
def join(left: int, right: int) -> int:
    return left + right


@wide.step()
def plan(input: WideIn, join: int) -> list[Item]:
    return [Item(index=i, name=f"item-{i}-{_h(input.seed, i)}", weight=(join + i) % 13 + 1)
            for i in range(input.items)]


@wide.map("plan", effect=True, retry=FAST_RETRY)
def work(ctx: StepContext, input: WideIn, plan: Item) -> WorkDone:
    reply = fake_services.post(input.services_url, "work", _key(ctx),
                               {"subject": f"{input.seed}/{plan.name}", "weight": plan.weight})
    return WorkDone(index=plan.index, receipt=reply["id"], weight=plan.weight)


@wide.step()
def checksum(plan: list[Item]) -> str:
    return _h(*[item.name for item in plan])


@wide.step()
def tally(work: list[WorkDone]) -> int:
    return sum(done.weight for done in work)


@wide.step()
def audit(tally: int, checksum: str, join: int) -> dict[str, Any]:
    return {"tally": tally, "checksum": checksum, "join": join}


@wide.step(effect=True, retry=FAST_RETRY)
def notify(ctx: StepContext, input: WideIn, audit: dict[str, Any]) -> str:
    reply = fake_services.post(input.services_url, "notify", _key(ctx), {"subject": f"{input.seed}/audit", **audit})
    return str(reply["id"])


@wide.step()
def report(audit: dict[str, Any], notify: str, work: list[WorkDone]) -> dict[str, Any]:
    return {**audit, "notice": notify, "receipts": [done.receipt for done in work]}


@wide.step()
def finalize(input: WideIn, report: dict[str, Any]) -> dict[str, Any]:
    return {"seed": input.seed, "report": report, "digest": _h(sorted(report.items()))}


# ---------------------------------------------------------------------- gate: one blocking step


class GateIn(BaseModel):
    services_url: str
    control_dir: str
    order_id: str = "gate-1"


gate_flow = Workflow("gate", version="1")


@gate_flow.step()
def gate_prepare(input: GateIn) -> str:
    return f"prepared-{input.order_id}"


@gate_flow.step()
def gate(input: GateIn, gate_prepare: str) -> str:
    control = Path(input.control_dir)
    with open(control / "gate.entries", "a") as entries:  # who ran this step (inline: the driver's pid)
        entries.write(f"{os.getpid()}\n")
    try:  # the first process to get here blocks; any later one passes
        fd = os.open(control / "gate.entered", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return f"{gate_prepare}-gated"
    os.write(fd, str(os.getpid()).encode())
    os.close(fd)
    _wait_for(control / "release", "gate")
    return f"{gate_prepare}-gated"


@gate_flow.step(effect=True, retry=FAST_RETRY)
def gate_charge(ctx: StepContext, input: GateIn, gate: str) -> str:
    reply = fake_services.post(input.services_url, "charge", _key(ctx), {"order_id": input.order_id, "note": gate})
    return str(reply["id"])


@gate_flow.step()
def gate_finish(gate_charge: str) -> str:
    return f"done:{gate_charge}"


# ---------------------------------------------------------------------- workerkill: a Ray worker dies mid-effect


class KillIn(BaseModel):
    services_url: str
    control_dir: str
    order_id: str = "wk-1"


workerkill = Workflow("workerkill", version="1")


@workerkill.step()
def wk_prepare(input: KillIn) -> str:
    return f"prepared-{input.order_id}"


@workerkill.step(effect=True, retry=FAST_RETRY)
def wk_charge(ctx: StepContext, input: KillIn, wk_prepare: str) -> str:
    # The call takes effect first; then, on attempt 1 only, the worker reports its pid and
    # hangs, so the test can kill it after the effect and before the result reaches the driver.
    reply = fake_services.post(input.services_url, "charge", _key(ctx), {"order_id": input.order_id})
    if ctx.attempt == 1:
        control = Path(input.control_dir)
        tmp = control / "worker.pid.tmp"
        tmp.write_text(f"{os.getpid()}\n{_key(ctx)}\n")
        tmp.rename(control / "worker.pid")  # atomic: the test never reads a half-written file
        _wait_for(control / "release", "wk_charge")
    return str(reply["id"])


@workerkill.step()
def wk_finish(wk_charge: str) -> str:
    return f"done:{wk_charge}"


FLOWS: dict[str, Workflow] = {"order": order, "wide": wide, "gate": gate_flow, "workerkill": workerkill}


def sample_input(flow: str, services_url: str, control_dir: str | None = None) -> dict[str, Any]:
    """The input the tests give a run of ``flow``."""
    if flow == "order":
        return order_input(services_url)
    if flow == "wide":
        return WideIn(services_url=services_url).model_dump()
    assert control_dir is not None, f"flow {flow!r} needs a control_dir"
    model = GateIn if flow == "gate" else KillIn
    return model(services_url=services_url, control_dir=control_dir).model_dump()
