"""An ``async def`` step runs when ``run``, ``resume``, ``retry``, ``fork`` or ``replay`` is called
inline from inside a running event loop (an async web handler, ``asyncio.run(main())``, Jupyter).

Before, ``task._call`` called ``asyncio.run`` whatever the thread was doing: there it raises
"asyncio.run() cannot be called from a running event loop", classified as a permanent failure of
the step, so every async step failed for good (a replay reported it "failed"), and a critical one
rolled back a charge that had gone through. Now its coroutine runs to its end on a loop of its own
(``raysaga.agents.awaiting``), with the same result, the same classification of what it raises
(a ``Transient`` retried, another exception failing it), and the caller's context variables.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from contextvars import ContextVar
from pathlib import Path
from typing import Any, TypeVar

import pytest

import raysaga
from raysaga import RetryPolicy, StepContext, Transient, Workflow
from raysaga.state import NodeStatus, RunRecord, RunStatus, SqlStore

T = TypeVar("T")

#: What the host program sets before it calls raysaga: an async step reads it, as asyncio.run's would.
CURRENT_USER: ContextVar[str] = ContextVar("current_user", default="nobody")

#: What a retried run's async step does: fails for good while ``broken`` is set.
SWITCH: dict[str, bool] = {"broken": False}


def in_loop(call: Callable[[], T]) -> T:
    """``call()`` made from inside a running event loop, the caller's context variable set."""
    async def handler() -> T:
        CURRENT_USER.set("alice")
        await asyncio.sleep(0)  # a loop really runs this coroutine
        return call()
    return asyncio.run(handler())


def _charging(log: Path, *, refunded: bool = True) -> Workflow:
    """``charge`` (an effect, refunded on rollback when ``refunded``), then the critical async step
    ``enrich``. (Nothing to refund, a failed run stays ``failed``: a retry revives it.)"""
    wf = Workflow(f"async_in_loop_{uuid.uuid4().hex[:8]}")

    def refund(output: dict[str, Any]) -> None:
        with log.open("a") as f:
            f.write(f"REFUND {output['amount']}\n")

    @wf.step(effect=True, compensate=refund if refunded else None)
    def charge(input: int) -> dict[str, Any]:
        with log.open("a") as f:
            f.write(f"CHARGE {input}\n")
        return {"amount": input}

    @wf.step(retry=RetryPolicy(max_attempts=3, base=0.01, cap=0.01))
    async def enrich(charge: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
        await asyncio.sleep(0)
        if SWITCH["broken"]:
            raise ValueError("enrichment service refused")
        if ctx.attempt == 1:
            raise Transient("enrichment service busy")  # retried, as outside a loop
        return {**charge, "user": CURRENT_USER.get(), "attempt": ctx.attempt}

    return wf


def _nodes(url: str, run_id: str) -> dict[str, Any]:
    store = SqlStore(url)
    try:
        return {n.node_id: n for n in store.nodes(run_id)}
    finally:
        store.close()


@pytest.mark.parametrize("loop", [False, True], ids=["no loop", "in a running loop"])
def test_an_async_step_after_a_charge_completes_without_a_rollback(sqlite_url: str, tmp_path: Path,
                                                                   loop: bool) -> None:
    log = tmp_path / "effects.log"
    wf = _charging(log)
    CURRENT_USER.set("alice")  # the path without a loop sees it the same way

    def go() -> RunRecord:
        return raysaga.run(wf, 100, store=sqlite_url, executor="inline")

    record = in_loop(go) if loop else go()
    assert record.status == RunStatus.COMPLETED, (record.status_reason, record.error)
    assert record.output == {"enrich": {"amount": 100, "user": "alice", "attempt": 2}}
    assert log.read_text().splitlines() == ["CHARGE 100"], "nothing refunded: the charge stands"
    enrich = _nodes(sqlite_url, record.run_id)["enrich"]
    assert enrich.attempt == 2, "the Transient of attempt 1 was retried"


def test_an_async_steps_own_error_fails_it_as_outside_a_loop(sqlite_url: str, tmp_path: Path) -> None:
    """A ``ValueError`` is that step's permanent failure, named as such, and the rollback refunds."""
    log = tmp_path / "effects.log"
    wf = _charging(log)
    SWITCH["broken"] = True
    try:
        record = in_loop(lambda: raysaga.run(wf, 7, store=sqlite_url, executor="inline"))
    finally:
        SWITCH["broken"] = False
    assert record.status == RunStatus.COMPENSATED
    enrich = _nodes(sqlite_url, record.run_id)["enrich"]
    assert enrich.status == NodeStatus.FAILED and enrich.error is not None
    assert (enrich.error["type"], enrich.error["message"]) == ("ValueError", "enrichment service refused")
    assert "event loop" not in enrich.error["traceback"]
    assert log.read_text().splitlines() == ["CHARGE 7", "REFUND 7"]


def test_retry_fork_and_replay_of_async_steps_from_a_running_loop(sqlite_url: str, tmp_path: Path) -> None:
    log = tmp_path / "effects.log"
    wf = _charging(log, refunded=False)
    SWITCH["broken"] = True  # its async step fails for good: the run is left ``failed``
    try:
        failed = raysaga.run(wf, 5, store=sqlite_url, executor="inline")
    finally:
        SWITCH["broken"] = False
    assert failed.status == RunStatus.FAILED

    retried = in_loop(lambda: raysaga.retry(wf, failed.run_id, store=sqlite_url, executor="inline"))
    assert retried.status == RunStatus.COMPLETED, (retried.status_reason, retried.error)
    assert retried.output == {"enrich": {"amount": 5, "user": "alice", "attempt": 2}}

    forked = in_loop(lambda: raysaga.fork(wf, failed.run_id, from_node="enrich", store=sqlite_url,
                                          executor="inline"))
    assert forked.status == RunStatus.COMPLETED, (forked.status_reason, forked.error)
    assert forked.output == retried.output

    report = in_loop(lambda: raysaga.replay(wf, forked.run_id, store=sqlite_url))
    verdicts = {node.label: node.verdict for node in report.nodes}
    assert verdicts["enrich"] == "same", report
    assert log.read_text().splitlines() == ["CHARGE 5"], "the charge ran once, and nothing was refunded"
