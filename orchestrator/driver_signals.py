"""How the driver reads the cancels it finds, what a cancel finds never started, when a run paused
on its spent budget is due, and what an operator is told of a spent budget (apart from ``driver``,
which is at its size cap)."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from typing import TYPE_CHECKING

from raysaga.orchestrator.driver_io import never_sent
from raysaga.state import Batch, RunRecord, RunUpdate, SignalRecord

if TYPE_CHECKING:
    from raysaga.node_key import NodeKey
    from raysaga.orchestrator.executor_base import Executor
    from raysaga.orchestrator.in_flight import InFlight
    from raysaga.orchestrator.options import RunOptions
    from raysaga.orchestrator.workflow import Workflow


def chosen_cancel(signals: list[SignalRecord]) -> SignalRecord | None:
    """The cancel to obey among the pending signals: one that asks to compensate wins over a plain
    one beside it. Taking the first, a plain cancel sent a moment earlier ended the run
    ``cancelled`` and the rollback an operator asked for never ran."""
    cancels = [s for s in signals if s.kind == "cancel"]
    compensating = (s for s in cancels if isinstance(s.payload, dict) and s.payload.get("compensate"))
    return next(compensating, cancels[0] if cancels else None)


def never_started(attempts: InFlight, executor: Executor, wf: Workflow, keys: Sequence[NodeKey]) -> list[NodeKey]:
    """Of ``keys`` (attempts about to be cancelled), those that never left the driver
    (``driver_io.never_sent``: a Ray lane's queue, a rate gate's), and those the inline executor
    held back once a cancel or pause was seen (``Executor.hold_new``): the run machine says they
    took no effect, and an effect's ledger row, written ``pending`` before its round, ends
    ``failed`` (``Calls.not_sent``), not left in doubt on a cancelled run for a rollback to undo."""
    if not keys:
        return []
    found = never_sent(attempts, executor, wf, keys)
    sent, seen = attempts.sent, set(found)
    return found + [k for k in keys if (s := sent.get(k)) is not None and s.handle.held and k not in seen]


def spent_rest(run: RunRecord, why: str) -> Batch | None:
    """A run paused on its spent budget and taken up again (an unpause, a resume) with the budget
    still spent rests as it was: due at its deadline (to roll back then), else never. Left due now,
    every worker claimed it again and again, a ``lease_claimed`` event each time. Its reason says
    the budget (``why``): an operator's pause, lifted, left it "paused by operator", which
    ``unpause`` and ``resume --token-budget`` both refused. None: as it is."""
    if run.wake_at == run.deadline_at and run.status_reason == why:
        return None
    return Batch(run=RunUpdate(wake_at=run.deadline_at, set_wake=True, status_reason=why))


def paused_wake(spent: str | None, reason: str | None, run: RunRecord | None) -> RunUpdate:
    """A run pausing itself on its spent budget (``spent``: why, no operator's ``reason``) with a
    deadline is due at that deadline: a worker then rolls it back, as it does a run waiting for a
    human (docs/operations.md). Without it the run stayed paused past its deadline for ever."""
    if spent is None or reason is not None or run is None or run.deadline_at is None:
        return RunUpdate()
    return RunUpdate(wake_at=run.deadline_at, set_wake=True)


def spent_budget(run: RunRecord, options: RunOptions | None = None) -> str | None:
    """The run's budget still spent with the budgets ``options`` give it (``--token-budget`` ...):
    ``"token"`` or ``"cost"``, or None."""
    tokens = options.token_budget if options is not None and options.token_budget is not None else run.token_budget
    cost = options.cost_budget if options is not None and options.cost_budget is not None else run.cost_budget
    if tokens is not None and run.tokens_used >= tokens:
        return "token"
    return "cost" if cost is not None and run.cost_used >= cost else None


def budget_advice(run: RunRecord, verb: str = "resume") -> str:
    """How an operator gives ``run`` a larger budget (CLI and Python), above what it used."""
    spent = spent_budget(run) or "token"
    used = f"{run.tokens_used} tokens" if spent == "token" else f"${run.cost_used:.4f}"
    call = "retry" if verb == "retry" else "resume"
    return (f"`raysaga {verb} {shlex.quote(run.run_id)} --{spent}-budget N` with N above the {used} used (Python: "
            f"raysaga.{call}(wf, {run.run_id!r}, options=RunOptions({spent}_budget=N)))")


__all__ = ["budget_advice", "chosen_cancel", "never_started", "paused_wake", "spent_budget", "spent_rest"]
