"""Workflows for ``tests/crash/test_live_neighbours_stop49.py``: a step that really holds the GIL
past a short lease in a ``--concurrency`` worker's process (freezing every run driven in it), and
healthy runs whose steps are longer than the lease but never freeze anything. Not a test module.

- ``hog``: ``prep`` (quick), then ``freeze``, which holds the GIL on every start
  (``live_takeover_flows.hold_gil``, ``hold`` seconds at a time) until another driver has the run
  (or it ended): a step longer than any lease, whichever worker is free to take it over when. Its
  first start first waits at a gate (a FIFO the test opens once healthy runs' steps are in flight
  in the same process), so that first freeze is certainly shared with neighbours.
- ``healthy``: three steps in a chain, each sleeping ``step_s`` seconds (the GIL let go), then
  returning its number.

Every start and end is a line ``<what> <step> <run> <pid> <time>`` of ``<log_dir>/steps``
(``what``: ``start``, ``end``, or ``hold`` just before the GIL is held).
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel

from raysaga import StepContext, Workflow
from raysaga.state import RunStatus, SqlStore
from tests.support.live_takeover_flows import hold_gil

#: The FIFO the hog's first start waits at, and the file that says it waits there.
GATE, AT_GATE = "gate", "gate.at"


class HogIn(BaseModel):
    log_dir: str
    hold: float
    db: str


class HealthyIn(BaseModel):
    log_dir: str
    name: str
    step_s: float


@dataclass(frozen=True)
class Mark:
    what: str
    step: str
    run: str
    pid: int
    at: float


def note(log_dir: str, what: str, step: str, run: str) -> None:
    """Append one line to ``<log_dir>/steps`` (one write, flushed to disk: a process frozen or
    killed right after leaves it whole)."""
    with (Path(log_dir) / "steps").open("a") as fh:
        fh.write(f"{what} {step} {run} {os.getpid()} {time.time():.6f}\n")
        fh.flush()
        os.fsync(fh.fileno())


def marks(log_dir: Path) -> list[Mark]:
    """Every line of ``<log_dir>/steps``, in order."""
    path = log_dir / "steps"
    if not path.exists():
        return []
    found = []
    for line in path.read_text().splitlines():
        what, step, run, pid, at = line.split()
        found.append(Mark(what, step, run, int(pid), float(at)))
    return found


def wait_at_gate(log_dir: str) -> None:
    """Block until the test opens the gate (``GATE``, a FIFO this opens to read; ``AT_GATE`` says it
    waits, and in which process)."""
    fifo = Path(log_dir) / GATE
    with contextlib.suppress(FileExistsError):
        os.mkfifo(fifo)
    (Path(log_dir) / AT_GATE).write_text(str(os.getpid()))
    with fifo.open("rb") as fh:
        fh.read(1)


hog = Workflow("stop49_hog", version="1")


@hog.step()
def prep(ctx: StepContext, input: HogIn) -> str:
    return "ready"


@hog.step(effect=True, after="prep")
def freeze(ctx: StepContext, input: HogIn) -> int:
    first = not [m for m in marks(Path(input.log_dir)) if m.what == "hold"]
    if first:
        wait_at_gate(input.log_dir)
    note(input.log_dir, "hold", "freeze", "hog")
    store = SqlStore(input.db)
    try:
        while True:
            hold_gil(input.hold)
            run = store.get_run(ctx.run_id)
            if run.status != RunStatus.RUNNING or (run.lease_owner or "").split(":")[1:2] != [str(os.getpid())]:
                return os.getpid()  # taken over (or parked): this driver's fence is stale now
    finally:
        store.close()


healthy = Workflow("stop49_healthy", version="1")


def _slow(input: HealthyIn, step: str, number: int) -> int:
    note(input.log_dir, "start", step, input.name)
    time.sleep(input.step_s)  # the step's own work: longer than the lease, the GIL let go
    note(input.log_dir, "end", step, input.name)
    return number


@healthy.step()
def one(ctx: StepContext, input: HealthyIn) -> int:
    return _slow(input, "one", 1)


@healthy.step()
def two(ctx: StepContext, input: HealthyIn, one: int) -> int:
    return _slow(input, "two", one + 1)


@healthy.step()
def three(ctx: StepContext, input: HealthyIn, two: int) -> int:
    return _slow(input, "three", two + 1)
