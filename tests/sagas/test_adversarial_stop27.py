"""Second adversarial round, sagas: a step or a compensation that exits or is interrupted on Ray.

On Ray, ``SystemExit`` let through ``task.execute`` ends the worker process: Ray reports a
``WorkerCrashedError``, which raysaga retries as transient. A forward step then failed, after all
its attempts, as "the worker died unexpectedly" (the step's own exit lost), and a compensation —
retried without limit by default — kept the run ``compensating`` for ever, a fresh worker killed
per attempt. A ``KeyboardInterrupt`` raised by user code became Ray's ``TaskCancelledError``, retried
the same way (raysaga cancels a task by killing it, never by interrupting it). Now both, in a Ray
task, are a permanent failure naming them. (Inline, the driver's own process runs the step: both
still end it, as the caller asked, its lease released.)

A fan-out's ``on_partial_failure`` function that raised an exception whose ``__str__`` raises (or
returned a value whose ``__repr__`` raises) escaped the driver's guard around the policy: the
driver crashed, the run stayed ``running``, and every resume crashed the same way. Now the step
fails, the reason saying what could not be read. A decision whose reason held a lone surrogate
failed the commit of its event the same way: the reason is now escaped (and cut to 2000 characters).
"""

from __future__ import annotations

import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

import raysaga
from raysaga import Continue, Fail, FanOutResult, Permanent, RetryPolicy, RunStatus, Workflow, on_partial_failure
from raysaga.state import NodeStatus, SqlStore


@pytest.fixture(scope="module", autouse=True)
def _pickle_this_module_by_value() -> None:
    cloudpickle = pytest.importorskip("ray.cloudpickle")
    cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _raise(how: str) -> None:
    if how == "exit":
        sys.exit(3)
    raise KeyboardInterrupt


def _saga(undo_raises: str | None, pay_raises: str | None) -> Workflow:
    """``book`` (undone by ``unbook``), then ``pay``, which fails: the saga rolls ``book`` back."""
    wf = Workflow(f"exit_{uuid.uuid4().hex[:8]}")

    @wf.step(effect=True)
    def book() -> dict[str, int]:
        return {"booking": 1}

    # three attempts at most, so the test is bounded before the fix too (the default retries an undo for ever)
    @wf.compensation("book", retry=RetryPolicy(max_attempts=3, base=0.01, cap=0.01))
    def unbook(output: Any) -> None:
        if undo_raises:
            _raise(undo_raises)

    @wf.step(retry=RetryPolicy(max_attempts=3, base=0.01, cap=0.01))
    def pay(book: dict[str, int]) -> int:
        if pay_raises:
            _raise(pay_raises)
        raise ValueError("card declined")

    return wf


RAISED = {"exit": "SystemExit(3) (sys.exit())", "interrupt": "KeyboardInterrupt"}


def _rows(url: str, run_id: str) -> dict[str, Any]:
    store = SqlStore(url)
    try:
        return {n.node_id: n for n in store.nodes(run_id)}
    finally:
        store.close()


@pytest.mark.ray
@pytest.mark.parametrize("how", list(RAISED))
def test_a_step_exiting_or_interrupted_on_ray_fails_once_naming_it(ray_address: str, tmp_path: Path,
                                                                  how: str) -> None:
    url = f"sqlite:///{tmp_path / 'raysaga.db'}"
    record = raysaga.run(_saga(None, how), None, store=url, executor="ray")
    assert record.status == RunStatus.COMPENSATED
    pay = _rows(url, record.run_id)["pay"]
    assert pay.status == NodeStatus.FAILED and pay.error is not None
    assert pay.attempt == 1, "an exit is no transient failure: never retried"
    assert f"step 'pay' raised {RAISED[how]}" in pay.error["message"]
    assert pay.error["transient"] is False


@pytest.mark.ray
@pytest.mark.parametrize("how", list(RAISED))
def test_a_compensation_exiting_or_interrupted_on_ray_parks_the_run(ray_address: str, tmp_path: Path,
                                                                   how: str) -> None:
    url = f"sqlite:///{tmp_path / 'raysaga.db'}"
    record = raysaga.run(_saga(how, None), None, store=url, executor="ray")
    assert record.status == RunStatus.COMPENSATION_FAILED
    undo = _rows(url, record.run_id)["book:compensate"]
    assert undo.status == NodeStatus.FAILED and undo.error is not None
    assert undo.attempt == 1, "retried, each attempt killed a worker (for ever with the default retry)"
    assert RAISED[how] in undo.error["message"]


class Unreadable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("str failed")


class Unshowable:
    def __repr__(self) -> str:
        raise RuntimeError("repr failed")


def _raises(result: FanOutResult) -> Any:
    raise Unreadable()


def _returns_unshowable(result: FanOutResult) -> Any:
    return Unshowable()


@pytest.mark.parametrize(("decide", "reason"), [
    (_raises, "on_partial_failure raised Unreadable: <a Unreadable whose str() raised RuntimeError>"),
    (_returns_unshowable, "on_partial_failure returned <a Unshowable whose repr() raised RuntimeError>"),
], ids=["str-raises", "repr-raises"])
def test_a_partial_failure_policy_that_cannot_be_read_fails_its_step(store_url: str, decide: Any,
                                                                     reason: str) -> None:
    wf = Workflow("unreadable_policy")

    @wf.step()
    def items() -> list[int]:
        return [1, 2, 3]

    @wf.map("items", policy=on_partial_failure(decide), retry=RetryPolicy(max_attempts=1))
    def check(items: int) -> int:
        if items == 2:
            raise Permanent("item two is bad")
        return items

    record = raysaga.run(wf, None, store=store_url, executor="inline")  # must return, not raise
    assert record.status == RunStatus.FAILED
    assert reason in (record.status_reason or "")
    assert _rows(store_url, record.run_id)["check"].status == NodeStatus.FAILED


@pytest.mark.parametrize(("decision", "status", "shown"), [
    (Continue("kept \ud800 going"), RunStatus.COMPLETED, "kept \\ud800 going"),
    (Fail("gave up \udcff"), RunStatus.FAILED, "gave up \\udcff"),
    (Fail("x" * 10_000), RunStatus.FAILED, "x" * 2000),
], ids=["continue-surrogate", "fail-surrogate", "fail-huge"])
def test_a_partial_failure_decision_reason_is_stored_readable(store_url: str, decision: Any, status: RunStatus,
                                                              shown: str) -> None:
    """A reason with a lone surrogate failed the commit of its ``fanout_decision`` event
    (``NotJSONableError`` out of the driver, the run left ``running``, every resume the same)."""
    wf = Workflow("readable_reason")

    @wf.step()
    def items() -> list[int]:
        return [1, 2, 3]

    @wf.map("items", policy=on_partial_failure(lambda result: decision), retry=RetryPolicy(max_attempts=1))
    def check(items: int) -> int:
        if items == 2:
            raise Permanent("item two is bad")
        return items

    record = raysaga.run(wf, None, store=store_url, executor="inline")
    assert record.status == status
    store = SqlStore(store_url)
    try:
        (event,) = [e for e in store.events(record.run_id) if e.kind == "fanout_decision"]
    finally:
        store.close()
    assert event.data is not None and event.data["reason"] == shown
