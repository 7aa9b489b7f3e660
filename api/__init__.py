"""raysaga: crash-proof multi-agent workflows on Ray.

Declare a ``Workflow`` of steps, ``run`` it; a killed run ``resume``s where it stopped,
and no ``effect=True`` step ever takes effect twice.
"""

from typing import TYPE_CHECKING

from raysaga._lazy import lazy_exports
from raysaga.errors import (
    DriverInterrupted,
    InvalidInputError,
    InvalidOptionError,
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

if TYPE_CHECKING:  # the names below are imported on first use (see _LAZY)
    from raysaga.orchestrator.runner import cancel, create_run, resume, retry, run
    from raysaga.orchestrator.saga import Saga
    from raysaga.orchestrator.secrets import Secret
    from raysaga.orchestrator.spec import NOT_APPLIED
    from raysaga.orchestrator.workflow import Workflow
    from raysaga.sagas.policy import (
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
    from raysaga.state import RunRecord, RunStatus, Store, open_store, prune
    from raysaga.types import RetryPolicy, RunOptions, StepContext

#: Where each lazily exported name lives: ``import raysaga`` stays cheap (no driver, no Ray)
#: until a name that needs them is used.
_LAZY = {
    **dict.fromkeys(("RetryPolicy", "RunOptions", "StepContext"), "raysaga.types"),
    **dict.fromkeys(("cancel", "create_run", "resume", "retry", "run"), "raysaga.orchestrator.runner"),
    **dict.fromkeys(("Secret",), "raysaga.orchestrator.secrets"),
    **dict.fromkeys(("NOT_APPLIED",), "raysaga.orchestrator.spec"),
    **dict.fromkeys(("Workflow",), "raysaga.orchestrator.workflow"),
    **dict.fromkeys(("ALL", "BEST_EFFORT", "Compensate", "Continue", "Fail", "FanOutResult", "RetryFailed",
                     "min_success_ratio", "on_partial_failure", "quorum"), "raysaga.sagas.policy"),
    **dict.fromkeys(("Saga",), "raysaga.orchestrator.saga"),
    **dict.fromkeys(("RunRecord", "RunStatus", "Store", "open_store", "prune"), "raysaga.state"),
}
__getattr__, __dir__ = lazy_exports(__name__, globals(), _LAZY)

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
    "InvalidOptionError",
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
