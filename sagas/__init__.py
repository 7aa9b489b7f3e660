"""raysaga.sagas: compensations run in reverse, durably, and partial-failure policies for fan-outs.

It plans; the orchestrator's driver dispatches (sagas never dispatch on their own).
``Saga`` (``raysaga.Saga``, in ``raysaga.orchestrator.saga``: it builds and runs a ``Workflow``, so it
sits above the layer it plans for) is the linear builder for users who only want compensations.
"""

from raysaga.sagas.plan import CompensationTarget, RollbackPlan
from raysaga.sagas.policy import (
    ALL,
    BEST_EFFORT,
    Compensate,
    Continue,
    Decision,
    Fail,
    FanOutPolicy,
    FanOutResult,
    ItemFailure,
    ItemSuccess,
    RetryFailed,
    Verdict,
    min_success_ratio,
    on_partial_failure,
    quorum,
)

__all__ = [
    "ALL",
    "BEST_EFFORT",
    "Compensate",
    "CompensationTarget",
    "Continue",
    "Decision",
    "Fail",
    "FanOutPolicy",
    "FanOutResult",
    "ItemFailure",
    "ItemSuccess",
    "RetryFailed",
    "RollbackPlan",
    "Verdict",
    "min_success_ratio",
    "on_partial_failure",
    "quorum",
]
