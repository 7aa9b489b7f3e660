"""Partial failure in a fan-out: what the items produced, and what the workflow decides.

A mapped step whose policy is not ``ALL`` hands its dependents a ``FanOutResult`` (the
successes and the annotated failures) instead of a plain list. The policy looks at it once
every item has settled and returns a ``Decision`` that the driver records as an event and obeys.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, Field

from raysaga.errors import UserError, WorkflowDefinitionError
from raysaga.state.redact import scrub_text


class ItemSuccess(BaseModel):
    index: int
    output: Any = None


class ItemFailure(BaseModel):
    index: int
    error_type: str
    message: str
    attempts: int


class FanOutResult(BaseModel):
    """What a fan-out produced: successes in index order and the annotated failures."""

    total: int
    successes: list[ItemSuccess] = Field(default_factory=list)
    failures: list[ItemFailure] = Field(default_factory=list)
    round: int = 1
    """1 for the first pass; +1 each time the policy answered ``RetryFailed``."""

    @property
    def outputs(self) -> list[Any]:
        return [s.output for s in self.successes]

    @property
    def success_ratio(self) -> float:
        return len(self.successes) / self.total if self.total else 1.0


class Verdict(StrEnum):
    CONTINUE = "continue"
    RETRY_FAILED = "retry_failed"
    FAIL = "fail"
    COMPENSATE = "compensate"


#: A decision's reason is stored in its event and, for a failure, in the step's error and the
#: run's reason: it is cut to this many characters, like a step's error message.
MAX_REASON = 2000


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    reason: str = ""

    def __post_init__(self) -> None:
        # a user's text: a lone surrogate in it failed the commit of the decision's event (NotJSONableError
        # out of the driver; the run stayed running and every resume decided, and crashed, again)
        object.__setattr__(self, "reason", _readable(str, self.reason)[:MAX_REASON])


def Continue(reason: str = "") -> Decision:
    """Go on with the successes; dependents receive the ``FanOutResult``."""
    return Decision(Verdict.CONTINUE, reason)


#: The most rounds a fan-out runs: a policy answering ``RetryFailed`` in round 20 fails the step
#: instead (each item dispatched again also spends one retry of the run's ``retry_budget``).
MAX_FANOUT_ROUNDS = 20


def RetryFailed(reason: str = "") -> Decision:
    """Dispatch the failed items again (same idempotency keys); decide again afterwards."""
    return Decision(Verdict.RETRY_FAILED, reason)


def Fail(reason: str = "") -> Decision:
    """The fan-out step fails (a critical one fails the run and rolls it back)."""
    return Decision(Verdict.FAIL, reason)


def Compensate(reason: str = "") -> Decision:
    """Roll the run back now, even if the step is not critical."""
    return Decision(Verdict.COMPENSATE, reason)


DecisionFn = Callable[[FanOutResult], Decision]


@dataclass(frozen=True)
class FanOutPolicy:
    """How a fan-out treats failed items. Build with the helpers below, not directly."""

    kind: str
    quorum: int | None = None
    min_ratio: float | None = None
    decide_fn: DecisionFn | None = None

    def __post_init__(self) -> None:
        needs = {"all": (), "best_effort": (), "quorum": ("quorum",), "ratio": ("min_ratio",), "decide": ("decide_fn",)}
        if self.kind not in needs or any(getattr(self, field) is None for field in needs[self.kind]):
            raise WorkflowDefinitionError(
                f"{self!r} is not a fan-out policy: build one with raysaga.quorum(k), min_success_ratio(r), "
                "on_partial_failure(fn), or use ALL or BEST_EFFORT")

    @property
    def partial(self) -> bool:
        """Item failures are collected rather than failing the step at once."""
        return self.kind != "all"

    def decide(self, result: FanOutResult) -> Decision:
        n_ok, n = len(result.successes), result.total
        if self.kind == "all":
            return Continue("all items succeeded") if not result.failures else Fail(
                f"{len(result.failures)} of {n} items failed")
        if self.kind == "best_effort":
            return Continue(f"{n_ok} of {n} items succeeded (best effort)")
        if self.kind == "quorum":
            assert self.quorum is not None
            need = min(self.quorum, n)
            if n_ok >= need:
                return Continue(f"quorum met: {n_ok} of {n} succeeded, {need} needed")
            return Fail(f"quorum not met: {n_ok} of {n} succeeded, {need} needed")
        if self.kind == "ratio":
            assert self.min_ratio is not None
            if result.success_ratio >= self.min_ratio:
                return Continue(f"{n_ok} of {n} succeeded (ratio {result.success_ratio:.2f} >= {self.min_ratio})")
            return Fail(f"only {n_ok} of {n} succeeded (ratio {result.success_ratio:.2f} < {self.min_ratio})")
        assert self.decide_fn is not None
        try:
            decision = self.decide_fn(result)
        except Exception as exc:  # the user's function failed: the step fails, saying how
            return Fail(f"on_partial_failure raised {type(exc).__name__}: {_readable(str, exc)}")
        if not isinstance(decision, Decision):
            raise UserError(f"on_partial_failure returned {_readable(repr, decision)}: return Continue(), "
                            "RetryFailed(), Fail() or Compensate()")
        return decision

    def unreachable(self, total: int, failed: int) -> bool:
        """True once enough items failed that the policy can only say Fail (stop waiting early)."""
        if self.kind == "quorum" and self.quorum is not None:
            return total - failed < min(self.quorum, total)
        if self.kind == "ratio" and self.min_ratio is not None and total:
            return (total - failed) / total < self.min_ratio
        return False

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "quorum": self.quorum, "min_ratio": self.min_ratio,
                "decide": getattr(self.decide_fn, "__qualname__", None)}


ALL = FanOutPolicy("all")
BEST_EFFORT = FanOutPolicy("best_effort")


def quorum(k: int) -> FanOutPolicy:
    """Continue when at least ``k`` items succeed (all of them, if fewer than ``k`` exist).

    Raises:
        WorkflowDefinitionError: ``k`` is not a whole number >= 1.
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise WorkflowDefinitionError(f"quorum({k!r}): k is the number of items that must succeed, a whole number >= 1")
    return FanOutPolicy("quorum", quorum=k)


def min_success_ratio(ratio: float) -> FanOutPolicy:
    """Continue when at least this fraction of the items succeed.

    Raises:
        WorkflowDefinitionError: ``ratio`` is not a number in (0, 1].
    """
    if isinstance(ratio, bool) or not isinstance(ratio, int | float) or math.isnan(ratio) or not 0.0 < ratio <= 1.0:
        raise WorkflowDefinitionError(f"min_success_ratio({ratio!r}): use a ratio in (0, 1], e.g. 0.8")
    return FanOutPolicy("ratio", min_ratio=ratio)


def _readable(show: Callable[[Any], str], value: Any) -> str:
    """``str``/``repr`` of user code's exception or return value, scrubbed, bounded and storable, or a note if
    it cannot be read: one whose ``__str__`` raised escaped the driver's guard around the policy and
    crashed it (the run left running, every resume the same)."""
    try:
        text = show(value)
    except Exception as problem:  # any failure of user code reading its own value
        return f"<a {type(value).__name__} whose {show.__name__}() raised {type(problem).__name__}>"
    # scrubbed before it is cut (a secret cut in two is no longer one the store's scrub can find)
    return scrub_text(text)[:MAX_REASON].encode("utf-8", "backslashreplace").decode("utf-8")


def on_partial_failure(fn: DecisionFn) -> FanOutPolicy:
    """Let a function decide: ``fn(result: FanOutResult) -> Continue() | RetryFailed() | Fail() | Compensate()``.

    Raises:
        WorkflowDefinitionError: ``fn`` is not callable.
    """
    if not callable(fn):
        raise WorkflowDefinitionError(f"on_partial_failure(fn): fn must be a function of the FanOutResult, got {fn!r}")
    return FanOutPolicy("decide", decide_fn=fn)
