"""Rollback decisions: what a failed run undoes, what a resumed rollback already did, how it ends.

Pure functions of the run's node rows: no store, no clock, no executor. The orchestrator reads
the rows, loads the outputs these functions ask for, and dispatches the compensations the
``RollbackPlan`` hands out; the rules themselves live here:

- a node is undone if it completed, or if its outcome is unknown (it was in flight, cancelled
  mid-attempt, waiting to retry, or its retries ran out on transient errors): it may have taken
  effect, so it is undone as the most recent (``finished_at = inf``); not one whose only attempt
  was provably never sent (``not_sent``: ``took_effect: False`` in its row);
- a fan-out's items are undone one by one, never its parent;
- a compensation row already written says where a resumed rollback stands: completed (settled),
  failed for good (blocks everything upstream), or waiting out a durable backoff.
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from raysaga.sagas.plan import CompensationTarget, NodeKey, RollbackPlan
from raysaga.state import NodeRecord, NodeStatus, RunStatus, RunUpdate, node_label
from raysaga.types import COMPENSATE_SUFFIX, is_compensation

__all__ = [
    "PARKING_ERRORS",
    "UNKNOWN_OUTCOME",
    "RestoredRollback",
    "compensation_rows",
    "effect_time",
    "forward_cause",
    "not_sent",
    "restore_rollback",
    "rollback_outcome",
    "step_targets",
]

#: Node states whose outcome is unknown: the step may have taken effect.
UNKNOWN_OUTCOME = frozenset({NodeStatus.RUNNING, NodeStatus.CANCELLED, NodeStatus.RETRYING})


def not_sent(why: str, *, first: bool) -> dict[str, Any]:
    """The error of a node whose attempt was prepared and never sent: the run failed in the round
    that prepared it, or it was cancelled while it still waited in the driver (a Ray lane's queue).

    ``first``: no earlier attempt of the node was ever sent either (this was its first, and no
    ledger row said a call under its key may have happened), so the node took no effect, and
    ``took_effect: False`` says so durably: a rollback, resumed or not, leaves it alone
    (``effect_time``). Of a later attempt, only this one is known unsent: an earlier one may have
    taken effect, and the node is undone as any whose outcome is unknown."""
    error: dict[str, Any] = {"reason": f"not sent: {why}"}
    if first:
        error["took_effect"] = False
    return error


def effect_time(row: NodeRecord) -> float | None:
    """When ``row``'s node took effect, to order its undo: its finish time if it completed, ``inf``
    if it may have (outcome unknown, or failed on a transient error) or did and its value was
    refused (``took_effect``), None if it did not (or provably never ran: ``took_effect: False``,
    ``not_sent``)."""
    if row.status == NodeStatus.COMPLETED:
        return row.finished_at or 0.0
    if row.error is not None and row.error.took_effect is False:
        return None  # never sent: nothing to undo
    if row.status in UNKNOWN_OUTCOME or (row.status == NodeStatus.FAILED and row.error is not None
                                         and (row.error.transient or row.error.took_effect)):
        return math.inf
    return None


def compensation_rows(rows: Iterable[NodeRecord]) -> dict[NodeKey, NodeRecord]:
    """The rows of compensations already dispatched, by the key of the node each one undoes."""
    return {(row.node_id[: -len(COMPENSATE_SUFFIX)], row.fan_index): row
            for row in rows if is_compensation(row.node_id)}


def step_targets(rows: Iterable[NodeRecord],
                 undoable: Mapping[str, bool]) -> list[tuple[CompensationTarget, NodeRecord]]:
    """The DAG nodes to undo, each with its row (the caller loads a completed one's output).

    Args:
        rows: every node row of the run.
        undoable: the steps that have a compensation, each mapped to whether it fans out.
    """
    found = []
    for row in rows:
        if is_compensation(row.node_id) or row.node_id not in undoable:
            continue
        if undoable[row.node_id] and row.fan_index < 0:
            continue  # a fan-out's items are compensated one by one, not its parent
        finished = effect_time(row)
        if finished is not None:
            found.append((CompensationTarget((row.node_id, row.fan_index), finished), row))
    return found


@dataclass
class RestoredRollback:
    """Where a resumed rollback stands, from the compensation rows written before the crash."""

    settled: list[NodeKey] = field(default_factory=list)
    """Undone already: never dispatched again."""
    failed: dict[NodeKey, Any] = field(default_factory=dict)
    """Failed for good, with the error recorded (everything upstream of them stays blocked)."""
    not_before: dict[NodeKey, float] = field(default_factory=dict)
    """Waiting out a durable backoff: not dispatched before this time."""
    attempts: dict[NodeKey, int] = field(default_factory=dict)
    """Attempts already spent, so the retry budget carries over the crash."""


def restore_rollback(comp_rows: Mapping[NodeKey, NodeRecord], wanted: Iterable[NodeKey]) -> RestoredRollback:
    """Where the compensations of ``wanted`` stand; rows of compensations no longer wanted are ignored."""
    restored = RestoredRollback()
    wanted = set(wanted)
    for key, row in comp_rows.items():
        if key not in wanted:
            continue
        restored.attempts[key] = row.attempt
        if row.status == NodeStatus.COMPLETED:
            restored.settled.append(key)
        elif row.status == NodeStatus.FAILED:
            restored.failed[key] = None if row.error is None else row.error.as_dict()
        elif row.status == NodeStatus.RETRYING and row.not_before:
            restored.not_before[key] = row.not_before
    return restored


#: Errors a run parked by raysaga holds (``crash_loop``, ``blob_parking``), not a failure of its
#: own: once its rollback is retried, they say nothing about why it rolled back.
PARKING_ERRORS = frozenset({"CrashLoop", "BlobIntegrityError", "DriveFailed"})


def forward_cause(cause: Any) -> tuple[bool, Any]:
    """(whether ``cause`` is a report raysaga wrote over the run's error — an earlier rollback's,
    or a parking's — and the cause it stands for), unwrapped to the forward failure."""
    replaced = False
    while isinstance(cause, Mapping) and ("failed_compensations" in cause or cause.get("type") in PARKING_ERRORS):
        replaced, cause = True, cause.get("cause")
    return replaced, cause


def rollback_outcome(reason: str, plan: RollbackPlan, errors: Mapping[NodeKey, Any], cause: Any,
                     run_id: str | None = None) -> RunUpdate:
    """Compensated, or parked for an operator with every failing and blocked compensation named.

    Args:
        reason: why the run rolled back.
        plan: the settled plan.
        errors: the error of each compensation that failed for good.
        cause: the run's error when the rollback started.
        run_id: the run, named (shell-quoted) in the reason's ``raysaga retry`` hint.
    """
    failed = sorted(plan.failed)
    blocked = plan.blocked()
    # After `retry --compensations` the run's error is the earlier attempt's report: take its
    # cause, so a compensated run does not keep naming failures that were fixed, and a second
    # failure does not nest the first report inside its "cause". A run parked mid-rollback (a
    # crash loop, a damaged blob) holds the parking's record instead: the same, the forward cause
    # being the one it kept (``cause``), if any (the driver reads the ``rollback_cause`` event's).
    retried, cause = forward_cause(cause)
    if not failed and not blocked:
        return RunUpdate(status=RunStatus.COMPENSATED, status_reason=f"{reason}; rolled back"[:500],
                         error=cause, set_error=retried)
    names = ", ".join(node_label(*k) for k in failed)
    text = f"compensation failed for {names or 'none'}"
    if blocked:
        text += f"; not compensated (waiting on those): {', '.join(node_label(*k) for k in blocked)}"
    return RunUpdate(
        status=RunStatus.COMPENSATION_FAILED,
        status_reason=(text + f"; fix and run `raysaga retry {shlex.quote(run_id) if run_id else 'RUN'} "
                              "--compensations`")[:1000],
        error={"failed_compensations": [{"node": node_label(*k), **(errors.get(k) or {})} for k in failed],
               "blocked_compensations": [node_label(*k) for k in blocked], "cause": cause},
        set_error=True,
    )
