"""Small record helpers shared by the driver's parts."""

from __future__ import annotations

from typing import Any

from raysaga.orchestrator.options import RunOptions
from raysaga.state import NodeStatus, NodeWrite, RunRecord, RunUpdate
from raysaga.state.redact import scrub_text


def step_failed_record(step: str, error: dict[str, Any]) -> dict[str, Any]:
    """What dependents of a non-critical ``on_failure="pass"`` step receive instead of its output."""
    return {"failed": True, "step": step, "error_type": str(error.get("type", "Error")),
            "message": scrub_text(str(error.get("message") or error.get("reason") or ""))}


def cancelled_row(node_id: str, fan_index: int, attempt: int, reason: str, now: float,
                  started_at: float | None = None) -> NodeWrite:
    """A node stopped before its outcome was known says so: ``cancelled``, and why (an attempt in
    flight, or a row a driver that died left ``running``, when the step or the run stopped)."""
    return NodeWrite(node_id=node_id, fan_index=fan_index, status=NodeStatus.CANCELLED, attempt=attempt,
                     error={"reason": reason}, started_at=started_at, finished_at=now)


def merge_run(old: RunUpdate | None, new: RunUpdate) -> RunUpdate:
    if old is None:
        return new
    merged = old.model_copy()
    merged.retries_delta += new.retries_delta
    merged.tokens_delta += new.tokens_delta
    merged.cost_delta += new.cost_delta
    for field_name in ("status", "status_reason"):
        if getattr(new, field_name) is not None:
            setattr(merged, field_name, getattr(new, field_name))
    if new.set_output:
        merged.output, merged.set_output = new.output, True
    if new.set_error:
        merged.error, merged.set_error = new.error, True
    if new.set_wake:
        merged.wake_at, merged.set_wake, merged.signals_seen = new.wake_at, True, new.signals_seen
    if new.set_budgets:
        merged.token_budget, merged.cost_budget, merged.set_budgets = new.token_budget, new.cost_budget, True
    merged.release_lease = merged.release_lease or new.release_lease
    return merged


#: What a failure's record says when a secret of the run's input was missing where its step ran.
SECRET_MISSING = "secret_missing"


def parks(error: Any) -> bool:
    """Whether a failure's record stops the run ``failed``, its committed effects standing, whatever
    the step's ``critical`` or policy: a secret missing where it ran (``retry.secret_missing``) is
    fixed by exporting it and retrying; rolled back, the run had ended for good."""
    return isinstance(error, dict) and (bool(error.get(SECRET_MISSING))
                                        or error.get("type") == "SecretUnavailableError")


def parked_reason(label: str, error: dict[str, Any]) -> str:
    """The reason of a run ``parks`` stopped: the step, the error (which names the variable), what to do."""
    said = error.get(SECRET_MISSING)
    said = said if isinstance(said, str) else str(error.get("message") or "")
    return (f"step {label!r} failed: {said[:800]} (the run is parked, its committed effects standing: export the "
            "variable, then `raysaga retry` the run)")


def short_error(error: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in error.items() if k != "traceback"}


def new_budgets(options: RunOptions, run: RunRecord) -> RunUpdate | None:
    """Budgets given to this resume (raising a spent one lets a paused run go on)."""
    tokens = options.token_budget if options.token_budget is not None else run.token_budget
    cost = options.cost_budget if options.cost_budget is not None else run.cost_budget
    if (tokens, cost) == (run.token_budget, run.cost_budget):
        return None
    return RunUpdate(token_budget=tokens, cost_budget=cost, set_budgets=True)


def sooner(when: float | None, deadline: float | None) -> float | None:
    """When a resting run is due again: ``when``, or its deadline if sooner (it is woken then to roll
    back: an approval without a timeout, or an hour's sleep, outlived a 2 s deadline)."""
    if deadline is None:
        return when
    return deadline if when is None else min(when, deadline)
