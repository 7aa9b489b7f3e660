"""Workflows for the fleet crash-loop tests (``tests/fleet/test_poison_fleet_stop29.py``), registered
by ``raysaga worker -w tests.support.poison_fleet_stop29:NAME``. Not a test module.

Every step appends ``<name> <pid>`` to ``<log_dir>/calls`` (fsynced) before anything else, so a test
counts the attempts that really started, in which process, across every worker that ran them.

- ``pill``: its first and only step, ``swallow``, SIGKILLs its process on every attempt.
- ``healthy``: ``one → two``, no harm.
- ``late_pill``: ``a → b → c``; ``a`` and ``b`` complete, ``c`` kills its process every time.
- ``held``: ``only``, harmless; but with ``STOP29_HOLD_DIR`` set in a worker's environment, a driver
  of a ``held`` run stops between its claim and its first commit (the run still ``pending``): it
  writes ``<dir>/held-<pid>-<fence>`` and waits there for ever, for the test to SIGKILL the worker
  (an OOM kill, a deploy, a node lost: whatever kills a process in that window). With
  ``STOP29_HOLD_TIMES=N`` only the first N drivers are held (counted by those files). The hold is
  put on ``Driver._restore``, which a driver runs after the crash-loop check and before the run's
  first commit (``pending → running``).
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

from pydantic import BaseModel

from raysaga import Workflow
from raysaga.orchestrator.driver import Driver
from raysaga.state import RunSnapshot


class PillIn(BaseModel):
    log_dir: str


def log_call(input: PillIn, name: str) -> None:
    with (Path(input.log_dir) / "calls").open("a") as fh:
        fh.write(f"{name} {os.getpid()}\n")
        fh.flush()
        os.fsync(fh.fileno())


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


pill = Workflow("stop29_pill", version="1")


@pill.step()
def swallow(input: PillIn) -> str:
    log_call(input, "swallow")
    die()
    return "never"


healthy = Workflow("stop29_healthy", version="1")


@healthy.step()
def one(input: PillIn) -> int:
    log_call(input, "one")
    return 1


@healthy.step()
def two(input: PillIn, one: int) -> int:
    log_call(input, "two")
    return one + 1


late_pill = Workflow("stop29_late_pill", version="1")


@late_pill.step()
def a(input: PillIn) -> int:
    log_call(input, "a")
    return 1


@late_pill.step()
def b(input: PillIn, a: int) -> int:
    log_call(input, "b")
    return a + 1


@late_pill.step()
def c(input: PillIn, b: int) -> int:
    log_call(input, "c")
    die()
    return b


held = Workflow("stop29_held", version="1")


@held.step()
def only(input: PillIn) -> str:
    log_call(input, "only")
    return "done"


HOLD_DIR, HOLD_TIMES = "STOP29_HOLD_DIR", "STOP29_HOLD_TIMES"


def _hold_here(driver: Driver, snap: RunSnapshot) -> None:
    """Mark this driver held and block its slot for ever (the test SIGKILLs the process)."""
    folder = Path(os.environ[HOLD_DIR])
    limit = int(os.environ.get(HOLD_TIMES, "1000000"))
    if snap.run.workflow_name != held.name or len(list(folder.glob("held-*"))) >= limit:
        return
    (folder / f"held-{os.getpid()}-{snap.run.fence}").write_text(snap.run.status.value)
    threading.Event().wait()


if os.environ.get(HOLD_DIR):
    _restore = Driver._restore

    def _held_restore(self: Driver, snap: RunSnapshot) -> object:
        _hold_here(self, snap)
        return _restore(self, snap)

    Driver._restore = _held_restore  # type: ignore[method-assign,assignment]
