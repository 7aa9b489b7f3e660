"""raysaga.orchestrator: the workflow DSL, DAG validation, the driver loop and its executors.

Never talks SQL: it hands ``raysaga.state`` batches to commit under a lease. ``retry`` is
``raysaga.retry`` (``runner.retry``): here the name is the submodule ``retry``, which an import of it
would bind over a lazy export.
"""

from typing import TYPE_CHECKING

from raysaga._lazy import lazy_exports

if TYPE_CHECKING:  # imported on first use: `raysaga status` must not load the driver and Ray
    from raysaga.orchestrator.context import StepContext
    from raysaga.orchestrator.driver import Driver
    from raysaga.orchestrator.executor import Executor, InlineExecutor, RayExecutor, make_executor
    from raysaga.orchestrator.options import NO_RETRY, RetryPolicy, RunOptions
    from raysaga.orchestrator.runner import cancel, create_run, resume, run
    from raysaga.orchestrator.spec import NOT_APPLIED, StepSpec
    from raysaga.orchestrator.workflow import Workflow

_LAZY = {
    "StepContext": "raysaga.orchestrator.context",
    "Driver": "raysaga.orchestrator.driver",
    **dict.fromkeys(("Executor", "InlineExecutor", "RayExecutor", "make_executor"), "raysaga.orchestrator.executor"),
    **dict.fromkeys(("NO_RETRY", "RetryPolicy", "RunOptions"), "raysaga.orchestrator.options"),
    **dict.fromkeys(("cancel", "create_run", "resume", "run"), "raysaga.orchestrator.runner"),
    **dict.fromkeys(("NOT_APPLIED", "StepSpec"), "raysaga.orchestrator.spec"),
    "Workflow": "raysaga.orchestrator.workflow",
}
__getattr__, __dir__ = lazy_exports(__name__, globals(), _LAZY)

__all__ = [
    "NOT_APPLIED",
    "NO_RETRY",
    "Driver",
    "Executor",
    "InlineExecutor",
    "RayExecutor",
    "RetryPolicy",
    "RunOptions",
    "StepContext",
    "StepSpec",
    "Workflow",
    "cancel",
    "create_run",
    "make_executor",
    "resume",
    "run",
]
