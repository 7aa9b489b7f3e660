"""raysaga.orchestrator: the workflow DSL, DAG validation, the driver loop and its executors.

Never talks SQL: it hands ``raysaga.state`` batches to commit under a lease.
"""

from raysaga.orchestrator.context import StepContext
from raysaga.orchestrator.driver import Driver
from raysaga.orchestrator.executor import Executor, InlineExecutor, RayExecutor, make_executor
from raysaga.orchestrator.options import NO_RETRY, RetryPolicy, RunOptions
from raysaga.orchestrator.runner import cancel, create_run, resume, retry, run
from raysaga.orchestrator.spec import NOT_APPLIED, StepSpec
from raysaga.orchestrator.workflow import Workflow

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
    "retry",
    "run",
]
