"""Workflows whose steps kill the process running them, for the crash-loop tests
(``tests/crash/test_poison_pill.py``), driven by ``tests.support.crash_driver --flows
tests.support.poison_flows``.

Every step appends its name to ``<log_dir>/calls`` before anything else, so the test counts the
attempts that really started, across every process that ran them.

- ``poison``: ``swallow`` SIGKILLs its process on every attempt.
- ``stumbles``: ``s1 → s2 → s3 → s4``; each step kills its process on its first attempt only, so
  every driver but the first gets one step done before it dies: deaths, but never in a row
  without progress.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

from pydantic import BaseModel

from raysaga import Workflow


class PoisonIn(BaseModel):
    log_dir: str


def log_call(input: PoisonIn, name: str) -> int:
    """Record an attempt of ``name``; return how many attempts of it started before this one."""
    path = Path(input.log_dir) / "calls"
    before = path.read_text().split().count(name) if path.exists() else 0
    with path.open("a") as fh:
        fh.write(name + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    return before


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


poison = Workflow("poison", version="1")


@poison.step()
def swallow(input: PoisonIn) -> str:
    log_call(input, "swallow")
    die()
    return "never"


stumbles = Workflow("stumbles", version="1")


def _stumble(input: PoisonIn, name: str) -> str:
    if log_call(input, name) == 0:
        die()
    return name


@stumbles.step()
def s1(input: PoisonIn) -> str:
    return _stumble(input, "s1")


@stumbles.step()
def s2(input: PoisonIn, s1: str) -> str:
    return _stumble(input, "s2")


@stumbles.step()
def s3(input: PoisonIn, s2: str) -> str:
    return _stumble(input, "s3")


@stumbles.step()
def s4(input: PoisonIn, s3: str) -> str:
    return _stumble(input, "s4")


FLOWS = {"poison": poison, "stumbles": stumbles}
