"""Second adversarial round, sagas: a step or a compensation that calls ``sys.exit()`` on Ray.

On Ray, ``SystemExit`` let through ``task.execute`` ends the worker process: Ray reports a
``WorkerCrashedError``, which raysaga retries as transient. A forward step then failed, after all
its attempts, as "the worker died unexpectedly" (the step's own exit lost), and a compensation —
retried without limit by default — kept the run ``compensating`` for ever, a fresh worker killed
per attempt. Now ``sys.exit()`` in a Ray task is a permanent failure naming ``SystemExit``. (Inline,
the driver's own process runs the step: ``SystemExit`` still ends it, as the caller asked.)
"""

from __future__ import annotations

import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

import raysaga
from raysaga import RetryPolicy, RunStatus, Workflow
from raysaga.state import NodeStatus, SqlStore

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module", autouse=True)
def _pickle_this_module_by_value() -> None:
    cloudpickle = pytest.importorskip("ray.cloudpickle")
    cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _saga(exiting_undo: bool) -> Workflow:
    """``book`` (undone by ``unbook``), then ``pay``, which fails: the saga rolls ``book`` back."""
    wf = Workflow(f"exit_{uuid.uuid4().hex[:8]}")

    @wf.step(effect=True)
    def book() -> dict[str, int]:
        return {"booking": 1}

    # three attempts at most, so the test is bounded before the fix too (the default retries an undo for ever)
    @wf.compensation("book", retry=RetryPolicy(max_attempts=3, base=0.01, cap=0.01))
    def unbook(output: Any) -> None:
        if exiting_undo:
            sys.exit(3)

    @wf.step(retry=RetryPolicy(max_attempts=3, base=0.01, cap=0.01))
    def pay(book: dict[str, int]) -> int:
        if not exiting_undo:
            sys.exit("card processor said goodbye")
        raise ValueError("card declined")

    return wf


def _rows(url: str, run_id: str) -> dict[str, Any]:
    store = SqlStore(url)
    try:
        return {n.node_id: n for n in store.nodes(run_id)}
    finally:
        store.close()


def test_a_step_calling_sys_exit_on_ray_fails_once_naming_it(ray_address: str, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'raysaga.db'}"
    record = raysaga.run(_saga(exiting_undo=False), None, store=url, executor="ray")
    assert record.status == RunStatus.COMPENSATED
    pay = _rows(url, record.run_id)["pay"]
    assert pay.status == NodeStatus.FAILED and pay.error is not None
    assert pay.attempt == 1, "an exit is no transient failure: never retried"
    assert "SystemExit('card processor said goodbye')" in pay.error["message"]
    assert pay.error["transient"] is False
    assert "SystemExit" in (record.status_reason or "")


def test_a_compensation_calling_sys_exit_on_ray_parks_the_run(ray_address: str, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'raysaga.db'}"
    record = raysaga.run(_saga(exiting_undo=True), None, store=url, executor="ray")
    assert record.status == RunStatus.COMPENSATION_FAILED
    undo = _rows(url, record.run_id)["book:compensate"]
    assert undo.status == NodeStatus.FAILED and undo.error is not None
    assert undo.attempt == 1, "retried, each attempt killed a worker (for ever with the default retry)"
    assert "SystemExit(3)" in undo.error["message"]
