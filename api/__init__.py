"""raysaga: crash-proof multi-agent workflows on Ray.

Declare a ``Workflow`` of steps, ``run`` it; a killed run ``resume``s where it stopped,
and no ``effect=True`` step ever takes effect twice.
"""

from raysaga.errors import (
    DriverInterrupted,
    InvalidInputError,
    LeaseHeldError,
    LeaseLostError,
    NotJSONableError,
    Permanent,
    RaySagaError,
    RunNotFoundError,
    SecretUnavailableError,
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
from raysaga.orchestrator.secrets import Secret
from raysaga.sagas import (
    ALL,
    BEST_EFFORT,
    Compensate,
    Continue,
    Fail,
    FanOutResult,
    RetryFailed,
    min_success_ratio,
    on_partial_failure,
    quorum,
)
from raysaga.sagas.saga import Saga
from raysaga.state import RunRecord, RunStatus, Store, open_store, prune

__version__ = "0.1.0"

__all__ = [
    "ALL",
    "BEST_EFFORT",
    "NOT_APPLIED",
    "Compensate",
    "Continue",
    "DriverInterrupted",
    "Fail",
    "FanOutResult",
    "InvalidInputError",
    "LeaseHeldError",
    "LeaseLostError",
    "NotJSONableError",
    "Permanent",
    "RaySagaError",
    "RetryFailed",
    "RetryPolicy",
    "RunNotFoundError",
    "RunOptions",
    "RunRecord",
    "RunStatus",
    "Saga",
    "Secret",
    "SecretUnavailableError",
    "StepContext",
    "Store",
    "Transient",
    "UserError",
    "Workflow",
    "WorkflowDefinitionError",
    "cancel",
    "create_run",
    "min_success_ratio",
    "on_partial_failure",
    "open_store",
    "prune",
    "quorum",
    "resume",
    "retry",
    "run",
]
