"""Whether a run may be driven on here: not while an operator's pause holds it, nor in a process
that lacks one of its input's secrets (``check_run_secrets``). Apart from ``runner`` (which
re-exports them) so its module stays within its size."""

from __future__ import annotations

import shlex
from typing import Any

from raysaga.errors import UserError
from raysaga.orchestrator.secrets import check_secrets
from raysaga.state import RunRecord, RunStatus
from raysaga.state.models import PARKED, TERMINAL

#: How a run that paused itself words its reason: an agent's spent budget (``budget: ...``), a loop
#: with ``LoopPolicy(then="pause")`` (``loop: ...``). Its operator goes on with ``resume`` (a
#: budget's with a larger budget), not ``unpause``; any other pause is an operator's.
SELF_PAUSED = ("budget:", "loop:")


def held_by_operator(run: RunRecord) -> bool:
    """Whether an operator's pause holds ``run``: paused, not by itself, and not unpaused since (an
    unpause sets ``wake_at``: the run is then due for a worker, or a resume)."""
    return (run.status == RunStatus.PAUSED and run.wake_at is None
            and not (run.status_reason or "").startswith(SELF_PAUSED))


def check_resumable(run: RunRecord) -> None:
    """A run an operator paused is held until unpaused (docs/operations.md: a pause holds a run; no
    timer or decision wakes it): a resume refuses it rather than quietly drive it on."""
    if held_by_operator(run):
        raise UserError(f"run {run.run_id!r} is paused ({run.status_reason or 'by an operator'}): "
                        f"`raysaga unpause {shlex.quote(run.run_id)}` lets it go on (Client.unpause in Python)")


def check_run_secrets(run: RunRecord, executor: Any, *, reopening: bool = False) -> None:
    """``SecretUnavailableError`` before ``run`` goes forward in this process (a resume, ``run
    --run-id`` of an existing run, a retry before it reopens the run, a worker's claim) when a
    secret of its input is not to be had here: refused by the step instead, the run's committed
    effects were rolled back and the error's advice (export, resume again) no longer worked. A run
    at rest is not driven (nothing to check) unless ``reopening`` it; a rollback does not go forward.
    ``executor``: its kind or the executor (not inline: steps run where this process's memory is not)."""
    if not reopening and (run.status in TERMINAL or run.status in PARKED):
        return
    if run.status in (RunStatus.COMPENSATING, RunStatus.COMPENSATION_FAILED):
        return
    kind = executor if isinstance(executor, str) else getattr(executor, "name", "ray")
    check_secrets(run.run_id, run.input, remote=kind != "inline")
