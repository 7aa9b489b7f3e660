"""What a launched run's store says about its Ray job, and what ``status`` makes of it.

A run ``raysaga launch`` recorded is driven only by the Ray job it submitted: no worker claims it
(it is not queued). A job that fails before its driver starts (a bad ``--python``, a module
missing on the cluster) left the run ``pending`` with nothing saying why: ``status`` showed "no
live driver", ``status --watch`` waited forever. So once the job is submitted the launch appends
an event ``launched`` to the run (``record``: the job's id and the Job API's address), and a
pending run with such an event and no live driver is shown as launched and not started
(``not_started``), with the commands that say why and the one that starts it again.

``status --watch`` stops (exit 1) on such a run when its job is known to have ended (Ray's Job
API answers from where the watch runs) or, with that API out of reach, once ``NO_DRIVER_GRACE``
seconds have passed since the launch with no driver (``watch_stop``). A run not launched by
``launch`` (a submitted run a worker takes; a ``raysaga run`` starting) has no such event: the
watch never stops on it.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import TYPE_CHECKING

from raysaga.orchestrator.status_text import utc
from raysaga.state.models import RunStatus

if TYPE_CHECKING:
    from raysaga.state import RunRecord, SqlStore

#: The event a launch appends once its job is submitted.
LAUNCHED = "launched"
#: Seconds after a launch a pending run with no driver is given up on by ``status --watch`` when
#: the job's state cannot be asked (the Job API out of reach from the watching machine): a job's
#: setup (unpacking the code, a ``runtime_env``'s installs) takes seconds to a few minutes.
NO_DRIVER_GRACE = 600.0
#: Events of a pending run read to find its launches (a pending run has a handful: one per launch).
EVENTS_READ = 200


@dataclass(frozen=True)
class Launch:
    """The run's latest launch: the Ray job that should drive it, where to ask about it, when."""

    job: str
    address: str
    at: float


def record(store: SqlStore, run_id: str, job: str, address: str) -> bool:
    """Append the event ``launched`` (job id, Job API address) to ``run_id`` if it is still
    pending: a driver that already took it needs no note. Written as an operator's wake is (no
    lease held; ``wake_at`` of a pending run, which no claim reads, is set on the way)."""
    return store.wake(run_id, [RunStatus.PENDING], f"launched as Ray job {job}", LAUNCHED,
                      {"job": job, "address": address})


def latest(store: SqlStore, run: RunRecord) -> Launch | None:
    """The latest launch of a pending run (None for a run in any other state: no read made)."""
    if run.status != RunStatus.PENDING:
        return None
    found: Launch | None = None
    for event in store.events(run.run_id, limit=EVENTS_READ):
        data = event.data
        if event.kind == LAUNCHED and isinstance(data, dict) and isinstance(data.get("job"), str):
            found = Launch(data["job"], str(data.get("address") or ""), event.at)
    return found


def not_started(run: RunRecord, launch: Launch | None, now: float) -> str | None:
    """What ``status`` says of a launched run no driver has taken: None when the run is not
    pending, was not launched, or a driver holds a live lease on it."""
    if launch is None or run.status != RunStatus.PENDING:
        return None
    if run.lease_owner is not None and (run.lease_expires_at or 0.0) > now:
        return None
    at = f" --address {shlex.quote(launch.address)}" if launch.address else ""
    rid = shlex.quote(run.run_id)
    ref = shlex.quote(run.workflow_ref) if run.workflow_ref else "MODULE:WORKFLOW"
    return (f"launched as Ray job {launch.job} at {utc(launch.at)}; no driver has started it: "
            f"`ray job status {launch.job}{at}` and `ray job logs {launch.job}{at}` say why; "
            f"fix that and launch it again with `raysaga launch {ref}{at} --run-id {rid}`")


def watch_stop(run: RunRecord, launch: Launch | None, job_ended: bool | None, now: float,
               job_state: str = "") -> str | None:
    """Why ``status --watch`` gives up on ``run``, or None to go on watching. ``job_ended``: the
    launch's job has ended (True; ``job_state`` as Ray says it, e.g. FAILED), is still there to
    start (False), or its state is unknown (None: the Job API out of reach), when
    ``NO_DRIVER_GRACE`` after the launch decides."""
    note = not_started(run, launch, now)
    if note is None or launch is None or job_ended is False:
        return None
    if job_ended:
        state = f" ({job_state})" if job_state else ""
        return f"Ray job {launch.job} ended{state} before any driver started run {run.run_id}: {note}"
    if now - launch.at >= NO_DRIVER_GRACE:
        return (f"no driver started run {run.run_id} in the {NO_DRIVER_GRACE:g}s since its launch (the Ray Job "
                f"API was out of reach to check its job): {note}")
    return None


__all__ = ["LAUNCHED", "NO_DRIVER_GRACE", "Launch", "latest", "not_started", "record", "watch_stop"]
