"""raysaga: crash-proof multi-agent workflows on Ray.

Declare a ``Workflow`` of steps, ``run`` it; a killed run ``resume``s where it stopped,
and no ``effect=True`` step ever takes effect twice.

The public API, by group (one line each in docs/api.md):

- **Declaring a workflow**: ``Workflow`` (``@wf.step``, ``@wf.map``, ``@wf.agent``,
  ``@wf.approval``, ``wf.sleep``, ``@wf.compensation``), ``Ask`` and ``Approval`` (what an approval
  asks and answers), ``StepContext``, ``StepFailed`` (what an ``on_failure="pass"`` step hands its
  dependents), ``RetryPolicy``, ``RateLimit``, ``NOT_APPLIED``, ``Secret``, ``Saga``.
- **Fan-out policies**: ``ALL``, ``BEST_EFFORT``, ``quorum``, ``min_success_ratio``,
  ``on_partial_failure``, and what a policy sees and answers: ``FanOutResult``, ``Continue``,
  ``RetryFailed``, ``Fail``, ``Compensate``.
- **Running**: ``run``, ``create_run``, ``resume``, ``retry``, ``cancel``, ``fork``, ``replay``, ``RunOptions``;
  ``Client`` (submit to the worker fleet, approve and reject, pause, cancel, the inbox, stats),
  ``Worker`` (claim and drive runnable runs, as ``raysaga worker`` does); ``configure_tracing``
  (OpenTelemetry spans of every run, to a provider of your choice).
- **The store**: ``open_store``, ``Store``, ``RunRecord``, ``RunStatus``, ``prune``; ``RunView`` (a run's
  DAG with live states, in a notebook).
- **Failing a step on purpose**: ``StepFailure``, ``Permanent``, ``Transient``.
- **Errors**: every one descends from ``RaySagaError`` (the tree is drawn in ``raysaga.errors``):
  a caller's mistakes are ``UserError``s (``WorkflowDefinitionError``, ``InvalidInputError``,
  ``InvalidOptionError``, ``SecretUnavailableError``); ``NotJSONableError``; the store's are
  ``StoreError``s (``StoreUnavailableError`` and its ``StoreOutageError``, ``RunNotFoundError``, ``RunExistsError``,
  ``LeaseHeldError``, ``LeaseLostError``); ``DriverInterrupted`` after SIGINT/SIGTERM.

Also public: ``raysaga.agents`` (LLM sub-agents: ``Agent``, ``tool``, model backends),
``raysaga.testing`` (a scripted model, a guard against the real API), ``raysaga.errors``,
``raysaga.types``, ``raysaga.state`` (the store's records and states, as ``open_store`` reads
them: ``NodeRecord``, ``NodeStatus``...); the ``raysaga`` command (``raysaga.cli``). Every other
module (``raysaga.orchestrator.*``, the store's internals) is implementation and may change
without notice; ``tests/test_public_api.py`` checks that the examples and docs import nothing else.

``import raysaga`` is cheap: only the errors are imported at once; every other name is imported
the first time it is used (``_LAZY``), so ``import raysaga`` loads neither the driver nor Ray.
"""

import typing as _typing

from raysaga._lazy import lazy_exports as _lazy_exports
from raysaga.errors import (
    DriverInterrupted,
    InvalidInputError,
    InvalidOptionError,
    LeaseHeldError,
    LeaseLostError,
    NotJSONableError,
    Permanent,
    RaySagaError,
    RunExistsError,
    RunNotFoundError,
    SecretUnavailableError,
    StepFailure,
    StoreError,
    StoreOutageError,
    StoreUnavailableError,
    Transient,
    UserError,
    WorkflowDefinitionError,
)

if _typing.TYPE_CHECKING:  # the names below are imported on first use (see _LAZY)
    from raysaga.orchestrator.client import Client
    from raysaga.orchestrator.fork import fork
    from raysaga.orchestrator.replay import replay
    from raysaga.orchestrator.run_views import RunView
    from raysaga.orchestrator.runner import cancel, create_run, resume, retry, run
    from raysaga.orchestrator.saga import Saga
    from raysaga.orchestrator.secrets import Secret
    from raysaga.orchestrator.spec import NOT_APPLIED
    from raysaga.orchestrator.tracing import configure_tracing
    from raysaga.orchestrator.worker import Worker
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
    from raysaga.types import Approval, Ask, RateLimit, RetryPolicy, RunOptions, StepContext, StepFailed

#: Where each lazily exported name lives: ``import raysaga`` stays cheap (no driver, no Ray)
#: until a name that needs them is used.
_LAZY = {
    **dict.fromkeys(("Approval", "Ask", "RateLimit", "RetryPolicy", "RunOptions", "StepContext", "StepFailed"),
                    "raysaga.types"),
    **dict.fromkeys(("Client",), "raysaga.orchestrator.client"),
    **dict.fromkeys(("Worker",), "raysaga.orchestrator.worker"),
    **dict.fromkeys(("RunView",), "raysaga.orchestrator.run_views"),
    **dict.fromkeys(("cancel", "create_run", "resume", "retry", "run"), "raysaga.orchestrator.runner"),
    **dict.fromkeys(("fork",), "raysaga.orchestrator.fork"),
    **dict.fromkeys(("replay",), "raysaga.orchestrator.replay"),
    **dict.fromkeys(("configure_tracing",), "raysaga.orchestrator.tracing"),
    **dict.fromkeys(("Secret",), "raysaga.orchestrator.secrets"),
    **dict.fromkeys(("NOT_APPLIED",), "raysaga.orchestrator.spec"),
    **dict.fromkeys(("Workflow",), "raysaga.orchestrator.workflow"),
    **dict.fromkeys(("ALL", "BEST_EFFORT", "Compensate", "Continue", "Fail", "FanOutResult", "RetryFailed",
                     "min_success_ratio", "on_partial_failure", "quorum"), "raysaga.sagas.policy"),
    **dict.fromkeys(("Saga",), "raysaga.orchestrator.saga"),
    **dict.fromkeys(("RunRecord", "RunStatus", "Store", "open_store", "prune"), "raysaga.state"),
}
__getattr__, __dir__ = _lazy_exports(__name__, globals(), _LAZY)

__version__ = "0.3.0"

# Grouped as in the docstring above and docs/api.md; tests/test_public_api.py pins each group.
__all__ = [  # noqa: RUF022 (grouped by topic, sorted within each group)
    # declaring a workflow
    "NOT_APPLIED",
    "Approval",
    "Ask",
    "RateLimit",
    "RetryPolicy",
    "Saga",
    "Secret",
    "StepContext",
    "StepFailed",
    "Workflow",
    # fan-out policies, and what a policy sees and answers
    "ALL",
    "BEST_EFFORT",
    "Compensate",
    "Continue",
    "Fail",
    "FanOutResult",
    "RetryFailed",
    "min_success_ratio",
    "on_partial_failure",
    "quorum",
    # running
    "Client",
    "RunOptions",
    "Worker",
    "cancel",
    "configure_tracing",
    "create_run",
    "fork",
    "replay",
    "resume",
    "retry",
    "run",
    # the store
    "RunRecord",
    "RunStatus",
    "RunView",
    "Store",
    "open_store",
    "prune",
    # failing a step on purpose
    "Permanent",
    "StepFailure",
    "Transient",
    # errors (the whole tree: raysaga.errors): the root, a caller's mistakes, the store, the driver
    "RaySagaError",
    "UserError",
    "InvalidInputError",
    "InvalidOptionError",
    "NotJSONableError",
    "SecretUnavailableError",
    "WorkflowDefinitionError",
    "StoreError",
    "LeaseHeldError",
    "LeaseLostError",
    "RunExistsError",
    "RunNotFoundError",
    "StoreUnavailableError",
    "StoreOutageError",
    "DriverInterrupted",
]
