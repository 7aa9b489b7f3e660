"""Workflows for ``tests/crash/test_silent_driver_takeover.py``: drivers that go silent (stopped
while their step runs) and steps that kill their process. Not a test module.

- ``silent_gated``: one effect step, ``hold``, that appends its process id to ``<log_dir>/starts``
  and then waits until ``<log_dir>/open`` exists: a worker the test stops there is alive, its
  heartbeat silent (as under a step holding the GIL in C code), its lease left to expire.
- ``silent_killer``: one effect step, ``kill_me``, that SIGKILLs its process on every attempt.

``FLOWS`` names them for ``tests.support.crash_driver --flows tests.support.silent_flows``.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from pydantic import BaseModel

from raysaga import StepContext, Workflow


class SilentIn(BaseModel):
    log_dir: str


def note_start(input: SilentIn) -> None:
    with (Path(input.log_dir) / "starts").open("a") as fh:
        fh.write(f"{os.getpid()}\n")
        fh.flush()
        os.fsync(fh.fileno())


def starts(log_dir: Path) -> list[int]:
    """The process ids that started an attempt, in order."""
    path = log_dir / "starts"
    return [int(pid) for pid in path.read_text().split()] if path.exists() else []


def make_gated(name: str = "silent_gated") -> Workflow:
    """A ``silent_gated`` workflow under ``name`` (a test sharing a PostgreSQL database with others
    claims only its own runs: a claim takes any runnable run of the names it serves)."""
    wf = Workflow(name, version="1")

    @wf.step(effect=True)
    def hold(ctx: StepContext, input: SilentIn) -> int:
        note_start(input)
        gate = Path(input.log_dir) / "open"
        while not gate.exists():  # the workload: a step that runs until the test lets it end
            time.sleep(0.02)
        return os.getpid()

    return wf


gated = make_gated()


killer = Workflow("silent_killer", version="1")


@killer.step(effect=True)
def kill_me(ctx: StepContext, input: SilentIn) -> str:
    note_start(input)
    os.kill(os.getpid(), signal.SIGKILL)
    return "never"


FLOWS = {"silent_gated": gated, "silent_killer": killer}
