"""A fan-out whose later items hold until the test releases them, driven by a real ``raysaga run``
process the test interrupts (SIGINT) or kills (SIGKILL): the runs no driver drives of the stop 49
tests (``tests/cli/test_no_driver_stop49.py``, ``tests/dashboard/test_no_driver_stop49.py``).

``plain``: ``plan -> work[0..count) -> total``; items from ``hold_at`` on mark that they started,
then wait for the ``release`` file in the control folder. ``effect``: the same with ``work`` an
effect, whose items are recorded ``running`` before their call (a quiet tick of the inline
executor records none), so a killed driver leaves running rows behind.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

from pydantic import BaseModel

from raysaga import Permanent, StepContext, Workflow
from tests.support import REPO
from tests.support.child_signals import sigint_default
from tests.support.crash_driver import wait_until

#: Seconds a held item waits for the release file before it gives up (never reached when the test passes).
HOLD_LIMIT = 120.0
MODULE = "tests.support.no_driver_flows"


class Hold(BaseModel):
    control_dir: str
    count: int = 6
    hold_at: int = 3


def _hold(control_dir: str, name: str) -> None:
    control = Path(control_dir)
    (control / f"started-{name}").touch()
    deadline = time.monotonic() + HOLD_LIMIT
    while not (control / "release").exists():
        if time.monotonic() > deadline:
            raise Permanent(f"{name}: never released")
        time.sleep(0.02)


plain = Workflow("no-driver")


@plain.step
def plan(input: Hold) -> list[int]:
    return list(range(input.count))


@plain.map("plan")
def work(input: Hold, plan: int) -> int:
    if plan >= input.hold_at:
        _hold(input.control_dir, f"work-{plan}")
    return plan


@plain.step
def total(work: list[int]) -> int:
    return sum(work)


effect = Workflow("no-driver-effect")


@effect.step(name="plan")
def plan_effect(input: Hold) -> list[int]:
    return list(range(input.count))


@effect.map("plan", effect=True, name="work")
def work_effect(ctx: StepContext, input: Hold, plan: int) -> int:
    assert ctx.idempotency_key is not None
    if plan >= input.hold_at:
        _hold(input.control_dir, f"work-{plan}")
    return plan


@effect.step(name="total")
def total_effect(work: list[int]) -> int:
    return sum(work)


def start(flow: str, db: str, run_id: str, control: Path, *extra: str, **hold: Any) -> subprocess.Popen[str]:
    """``raysaga run MODULE:FLOW`` (inline) in a process of its own, SIGINT at its default (a test
    run in the background passes it on ignored), from the repository root: the run records the
    module; returns once an item holds."""
    given = Hold(control_dir=str(control), **hold)
    proc = subprocess.Popen([sys.executable, "-m", "raysaga", "run", f"{MODULE}:{flow}", "--db", db, "--run-id",
                             run_id, "--executor", "inline", "--quiet", "--input", given.model_dump_json(), *extra],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={k: v for k, v in os.environ.items() if k != "RAYSAGA_FAULTS"},
                            preexec_fn=sigint_default)
    wait_until(lambda: (control / f"started-work-{given.hold_at}").exists() or proc.poll() is not None,
               timeout=120, what="an item of work to hold")
    assert proc.poll() is None, proc.communicate()
    return proc


def interrupt(proc: subprocess.Popen[str], control: Path) -> str:
    """Ctrl-C the driver; once it says it will stop at the next boundary, release the held item so
    it gets there. Returns its stderr (it exits 130, naming the resume)."""
    proc.send_signal(signal.SIGINT)
    seen = _read_until(proc.stderr, "SIGINT received")
    (control / "release").touch()
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, seen + err
    return seen + err


def _read_until(stream: IO[str] | None, text: str) -> str:
    assert stream is not None
    seen = ""
    while text not in seen:  # the driver logs the signal once it has handled it
        ready, _, _ = select.select([stream], [], [], 60)
        assert ready, f"no word of {text!r}: {seen!r}"
        line = stream.readline()
        assert line, f"the driver exited: {seen!r}"
        seen += line
    return seen


FLOWS: dict[str, Workflow] = {"plain": plain, "effect": effect}
