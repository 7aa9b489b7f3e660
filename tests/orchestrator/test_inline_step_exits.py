"""An inline step's own ``sys.exit()`` or ``KeyboardInterrupt`` is its permanent failure, as on Ray;
a real Ctrl-C still stops the run as documented (docs/guarantees.md, SIGTERM and SIGINT).

Before, ``task.execute`` let both through whenever the step ran in the driver's process: an
inline ``raysaga.run`` raised the step's ``SystemExit(3)`` (even ``sys.exit(0)``) into the host
program, the run was left ``running``, and every resume ran the exit again; on Ray the same step
failed once, "step 'b' raised SystemExit(3) (sys.exit()): ... must not end or interrupt the
process". Now inline is the same, whatever thread drives the run and whether the step is async.
Only a stop signal's exception is let through: while a driver holds SIGINT and SIGTERM no signal
raises one inside a step, and an application's own handler, called on a second signal, may.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest

import raysaga
from raysaga import RetryPolicy, Workflow
from raysaga.state import NodeStatus, RunRecord, RunStatus, SqlStore
from tests.support.child_signals import sigint_default

RAISED = {"exit3": "SystemExit(3) (sys.exit())", "exit0": "SystemExit(0) (sys.exit())",
          "interrupt": "KeyboardInterrupt"}


def _raise(how: str) -> None:
    if how == "exit3":
        sys.exit(3)
    if how == "exit0":
        sys.exit(0)
    raise KeyboardInterrupt


def _exiting(how: str, *, in_undo: bool = False, is_async: bool = False) -> Workflow:
    """``book`` (an effect undone by ``unbook``), then ``pay``: one of them exits or interrupts."""
    wf = Workflow(f"inline_exit_{uuid.uuid4().hex[:8]}")

    @wf.step(effect=True)
    def book() -> dict[str, int]:
        return {"booking": 1}

    @wf.compensation("book", retry=RetryPolicy(max_attempts=3, base=0.01, cap=0.01))
    def unbook(output: Any) -> None:
        if in_undo:
            _raise(how)

    async def pay_async(book: dict[str, int]) -> int:
        await asyncio.sleep(0)
        _raise(how)
        return 0

    def pay(book: dict[str, int]) -> int:
        if not in_undo:
            _raise(how)
        raise ValueError("card declined")

    wf.step(name="pay", retry=RetryPolicy(max_attempts=3, base=0.01, cap=0.01))(pay_async if is_async else pay)
    return wf


def _rows(url: str, run_id: str) -> tuple[RunRecord, dict[str, Any]]:
    store = SqlStore(url)
    try:
        run = store.get_run(run_id)
        assert run is not None
        return run, {n.node_id: n for n in store.nodes(run_id)}
    finally:
        store.close()


def _run(wf: Workflow, url: str) -> RunRecord:
    """``raysaga.run`` inline; the step's exit or interrupt escaping it fails the test (not the session)."""
    try:
        return raysaga.run(wf, None, store=url, executor="inline")
    except (KeyboardInterrupt, SystemExit) as exc:
        pytest.fail(f"the step's {exc!r} escaped raysaga.run into the host program")


def _in_thread(wf: Workflow, url: str) -> RunRecord:
    """The run driven from a thread of the host program's own (a web server's worker thread)."""
    records: list[RunRecord] = []
    driver = threading.Thread(target=lambda: records.append(_run(wf, url)))
    driver.start()
    driver.join()
    assert records, "the run raised out of its thread"
    return records[0]


@pytest.mark.parametrize("how", list(RAISED))
@pytest.mark.parametrize("where", ["this thread", "another thread", "async, in a running loop"])
def test_an_inline_step_exiting_fails_once_naming_it(sqlite_url: str, how: str, where: str) -> None:
    wf = _exiting(how, is_async=where.startswith("async"))
    if where == "another thread":
        record = _in_thread(wf, sqlite_url)
    elif where == "this thread":
        record = _run(wf, sqlite_url)
    else:
        async def handler() -> RunRecord:
            return _run(wf, sqlite_url)
        record = asyncio.run(handler())
    assert record.status == RunStatus.COMPENSATED, (record.status, record.status_reason)
    run, rows = _rows(sqlite_url, record.run_id)
    assert run.lease_owner is None, "the lease is released: nothing left running"
    pay = rows["pay"]
    assert pay.status == NodeStatus.FAILED and pay.error is not None
    assert pay.attempt == 1, "an exit is no transient failure: never retried"
    assert f"step 'pay' raised {RAISED[how]}" in pay.error["message"]
    assert pay.error["transient"] is False
    assert rows["book:compensate"].status == NodeStatus.COMPLETED


@pytest.mark.parametrize("how", ["exit3", "interrupt"])
def test_an_inline_compensation_exiting_parks_the_run(sqlite_url: str, how: str) -> None:
    record = _run(_exiting(how, in_undo=True), sqlite_url)
    assert record.status == RunStatus.COMPENSATION_FAILED, (record.status, record.status_reason)
    _, rows = _rows(sqlite_url, record.run_id)
    undo = rows["book:compensate"]
    assert undo.status == NodeStatus.FAILED and undo.error is not None
    assert undo.attempt == 1
    assert f"step 'book:compensate' raised {RAISED[how]}" in undo.error["message"]


SIGNALLED = """
import signal
import sys
import ray
import raysaga
from raysaga import Workflow

wf = Workflow("signalled")

class AppInterrupt(KeyboardInterrupt):
    pass

def app_handler(signum, frame):  # the application's own, installed before the run
    raise AppInterrupt("the application's handler")

if sys.argv[2] == "app handler":
    signal.signal(signal.SIGINT, app_handler)

@wf.step
def ctrl_c(input: int) -> int:
    for _ in range(input):
        signal.raise_signal(signal.SIGINT)  # as a Ctrl-C would, while the step runs
    return input

@wf.step
def after(ctrl_c: int) -> int:
    return ctrl_c

try:
    record = raysaga.run(wf.validate(), int(sys.argv[3]), store=sys.argv[1], executor="inline")
    print("returned", record.status, end=" ")
except BaseException as exc:
    print("raised", type(exc).__name__, getattr(exc, "signal_name", None), end=" ")
store = raysaga.open_store(sys.argv[1])
ended = [(n.node_id, str(n.status)) for n in store.nodes(store.list_runs(limit=1)[0].run_id)
         if n.status in ("completed", "failed")]  # (one under way may or may not have a row yet)
print("ended", sorted(ended), "ray started:", ray.is_initialized(), flush=True)
"""


@pytest.mark.parametrize(("handler", "signals", "expected"), [
    # the first Ctrl-C: the step finishes, the driver stops at the next boundary (DriverInterrupted)
    ("default", 1, "raised DriverInterrupted SIGINT ended [('ctrl_c', 'completed')] ray started: False"),
    # a second one calls the application's own handler, whose KeyboardInterrupt ends the program
    ("app handler", 2, "raised AppInterrupt None ended [] ray started: False"),
])
def test_a_real_ctrl_c_still_stops_an_inline_run(tmp_path: Path, handler: str, signals: int, expected: str) -> None:
    done = subprocess.run([sys.executable, "-c", SIGNALLED, f"sqlite:///{tmp_path / 's.db'}", handler, str(signals)],
                          capture_output=True, text=True, timeout=120, preexec_fn=sigint_default)
    assert done.stdout.strip() == expected, done.stdout + done.stderr[-3000:]
