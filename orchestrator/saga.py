"""A linear saga without the DAG sugar, for users who only want compensations.

    saga = Saga("trip")
    saga.step(book_flight, compensate=cancel_flight)
    saga.step(charge_card, compensate=refund_card)
    saga.step(book_hotel, compensate=cancel_hotel)
    record = saga.run({"traveller": "ada"}, store="trip.db")

Each action runs after the previous one, as an ``effect`` (ledgered, idempotency key in
``ctx``) unless told otherwise; a failing step rolls back the completed ones in reverse.
Underneath it is an ordinary ``Workflow`` (``saga.workflow``), so resume, status, cancel and
retry work the same. Actions take parameters by name like steps do: ``input``, ``ctx``, and
the name of any earlier step for its output.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from raysaga.errors import WorkflowDefinitionError
from raysaga.orchestrator.dsl_checks import plain_options
from raysaga.orchestrator.runner import ExecutorArg, resume, run
from raysaga.orchestrator.workflow import Workflow
from raysaga.state import RunRecord, Store
from raysaga.types import RetryPolicy, RunOptions


class Saga:
    @plain_options("Saga")
    def __init__(self, name: str, *, version: str = "1") -> None:
        self.workflow = Workflow(name, version=version)
        self._last: str | None = None

    @plain_options("Saga.step()")
    def step(self, action: Callable[..., Any], *, name: str | None = None,
             compensate: Callable[..., Any] | None = None, effect: bool = True,
             retry: RetryPolicy | None = None, timeout: float | None = None) -> Saga:
        """Append an action (and its undo). Returns the saga, so calls can chain."""
        step_name = name or getattr(action, "__name__", None)
        if step_name is not None and step_name in self.workflow.steps:
            # before the chain's ``after=``: the same action again would read "depends on itself"
            raise WorkflowDefinitionError(
                f"saga {self.workflow.name!r} already has a step named {step_name!r}: give one of them another "
                "name (saga.step(fn, name=...))")
        after = (self._last,) if self._last else ()
        self.workflow.step(name=name, after=after, effect=effect, retry=retry, timeout=timeout,
                           compensate=compensate)(action)
        self._last = name or action.__name__
        return self

    def run(self, input: Any = None, *, store: Store | str | None = None, run_id: str | None = None,
            executor: ExecutorArg = "inline", options: RunOptions | None = None,
            workflow_ref: str | None = None) -> RunRecord:
        """Run to the end (``completed``) or through the rollback (``compensated``); ``workflow_ref``
        as ``raysaga.run``'s (``MODULE:ATTR``: where ``raysaga resume`` imports the workflow)."""
        return run(self.workflow, input, store=store, run_id=run_id, executor=executor, options=options,
                   workflow_ref=workflow_ref)

    def resume(self, run_id: str, *, store: Store | str | None = None, executor: ExecutorArg = "inline",
               options: RunOptions | None = None) -> RunRecord:
        return resume(self.workflow, run_id, store=store, executor=executor, options=options)
