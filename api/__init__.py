"""raysaga: crash-proof multi-agent workflows on Ray.

Declare a ``Workflow`` of steps, ``run`` it; a killed run ``resume``s where it stopped,
and no ``effect=True`` step ever takes effect twice.
"""

from raysaga.errors import (
    InvalidInputError,
    LeaseHeldError,
    LeaseLostError,
    NotJSONableError,
    Permanent,
    RaySagaError,
    RunNotFoundError,
    Transient,
    UserError,
    WorkflowDefinitionError,
)
from raysaga.orchestrator import (
    NOT_APPLIED,
    RetryPolicy,
    RunOptions,
    StepContext,
    Workflow,
    cancel,
    create_run,
    resume,
    retry,
    run,
)
from raysaga.state import RunRecord, RunStatus, Store, open_store

__version__ = "0.1.0"

__all__ = [
    "NOT_APPLIED",
    "InvalidInputError",
    "LeaseHeldError",
    "LeaseLostError",
    "NotJSONableError",
    "Permanent",
    "RaySagaError",
    "RetryPolicy",
    "RunNotFoundError",
    "RunOptions",
    "RunRecord",
    "RunStatus",
    "StepContext",
    "Store",
    "Transient",
    "UserError",
    "Workflow",
    "WorkflowDefinitionError",
    "cancel",
    "create_run",
    "open_store",
    "resume",
    "retry",
    "run",
]
