"""Workflows for ``tests/crash/test_live_takeover_bound.py``: steps that really hold the GIL past a
short lease in the driver's process (the inline executor), so their driver goes silent while alive
and another takes the run over. Not a test module.

The hold is ``usleep`` called through ``ctypes.PyDLL``, which keeps the GIL for the whole call (a
``CDLL`` call releases it): the heartbeat thread cannot renew the lease, as under a catastrophic
regular expression, but for a fixed time and without burning a core.

- ``gil_hog``: ``prep`` (quick), then the effect step ``hog`` that holds the GIL ``hold`` seconds
  on every start: a run that passes from driver to driver for ever unless bounded.
- ``gil_once``: four effect steps in a chain, each holding the GIL ``hold`` seconds on its first
  start only: each is taken over once, then completes under its next driver (progress between
  the take-overs).

Every start appends ``<step> <pid>`` to ``<log_dir>/starts``.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

from pydantic import BaseModel

from raysaga import StepContext, Workflow


class HogIn(BaseModel):
    log_dir: str
    hold: float


def hold_gil(seconds: float) -> None:
    """Sleep ``seconds`` in C without letting go of the GIL: no other thread of the process runs."""
    ctypes.PyDLL(None).usleep(ctypes.c_uint(int(seconds * 1_000_000)))


def note_start(input: HogIn, step: str) -> int:
    """Record that ``step`` started in this process; how many times it has started so far."""
    path = Path(input.log_dir) / "starts"
    with path.open("a") as fh:
        fh.write(f"{step} {os.getpid()}\n")
        fh.flush()
        os.fsync(fh.fileno())
    return sum(1 for s, _ in starts(Path(input.log_dir)) if s == step)


def starts(log_dir: Path) -> list[tuple[str, int]]:
    """(step, process id) of every start, in order."""
    path = log_dir / "starts"
    if not path.exists():
        return []
    return [(step, int(pid)) for step, pid in (line.split() for line in path.read_text().splitlines() if line)]


def make_hog(name: str = "live_gil_hog") -> Workflow:
    """A ``gil_hog`` workflow under ``name`` (a test sharing a PostgreSQL database with others claims
    only its own runs: a claim takes any runnable run of the names it serves)."""
    wf = Workflow(name, version="1")

    @wf.step()
    def prep(ctx: StepContext, input: HogIn) -> str:
        note_start(input, "prep")
        return "ready"

    @wf.step(effect=True, after="prep")
    def hog(ctx: StepContext, input: HogIn) -> int:
        note_start(input, "hog")
        hold_gil(input.hold)
        return os.getpid()

    return wf


gil_hog = make_hog()


gil_once = Workflow("live_gil_once", version="1")


def _once(input: HogIn, step: str) -> str:
    if note_start(input, step) == 1:
        hold_gil(input.hold)
    return step


@gil_once.step(effect=True)
def s1(ctx: StepContext, input: HogIn) -> str:
    return _once(input, "s1")


@gil_once.step(effect=True, after="s1")
def s2(ctx: StepContext, input: HogIn) -> str:
    return _once(input, "s2")


@gil_once.step(effect=True, after="s2")
def s3(ctx: StepContext, input: HogIn) -> str:
    return _once(input, "s3")


@gil_once.step(effect=True, after="s3")
def s4(ctx: StepContext, input: HogIn) -> str:
    return _once(input, "s4")


FLOWS = {"live_gil_hog": gil_hog, "live_gil_once": gil_once}
