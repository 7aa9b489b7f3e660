"""What a launched run's store says about its Ray job, and what ``status`` makes of it.

A run ``raysaga launch`` recorded is driven only by the Ray job it submitted: no worker claims it
(it is not queued). A job that fails before its driver starts (a bad ``--python``, a module
missing on the cluster) left the run ``pending`` with nothing saying why: ``status`` showed "no
live driver", ``status --watch`` waited forever. So once the job is submitted the launch appends
an event ``launched`` to the run (``record``: the job's id and the Job API's address), and a
pending run with such an event and no live driver is shown as launched and not started
(``not_started``), with the commands that say why and the one that starts it again.

``status --watch`` stops (exit 1) on such a run when none of the run's jobs is live (Ray's Job API
answers from where the watch runs: a relaunch's job counts before its note is written), or, with that
API out of reach, once ``NO_DRIVER_GRACE`` seconds have passed since it last answered (or, never
answering, since the watch first asked) with no driver (``watch_stop``). A run not launched by
``launch`` (a ``raysaga run`` starting), or also submitted for workers (``run.queue`` set: a
worker may take it), is never stopped on.
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
    token: bool = False
    """Whether the launch spoke to the Job API in Ray's token mode (``RAY_AUTH_MODE=token``)."""


def record(store: SqlStore, run_id: str, job: str, address: str, token: bool = False) -> bool:
    """Append the event ``launched`` (job id, Job API address, whether in token mode) to ``run_id``
    if it is still pending: a driver that already took it needs no note. Written as an operator's
    wake is (no lease held; ``wake_at`` of a pending run, which no claim reads, is set on the way)."""
    data: dict[str, object] = {"job": job, "address": address}
    if token:
        data["token"] = True
    return store.wake(run_id, [RunStatus.PENDING], f"launched as Ray job {job}", LAUNCHED, data)


def latest(store: SqlStore, run: RunRecord) -> Launch | None:
    """The latest launch of a pending run (None for a run in any other state: no read made)."""
    if run.status != RunStatus.PENDING:
        return None
    found: Launch | None = None
    for event in store.events(run.run_id, limit=EVENTS_READ):
        data = event.data
        if event.kind == LAUNCHED and isinstance(data, dict) and isinstance(data.get("job"), str):
            found = Launch(data["job"], str(data.get("address") or ""), event.at, data.get("token") is True)
    return found


def not_started(run: RunRecord, launch: Launch | None, now: float) -> str | None:
    """What ``status`` says of a launched run no driver has taken: None when the run is not
    pending, was not launched, was also submitted for workers (``queue`` set: a worker may take
    it), or a driver holds a live lease on it."""
    if launch is None or run.status != RunStatus.PENDING or run.queue is not None:
        return None
    if run.lease_owner is not None and (run.lease_expires_at or 0.0) > now:
        return None
    at = f" --address {shlex.quote(launch.address)}" if launch.address else ""
    ray = "RAY_AUTH_MODE=token ray" if launch.token else "ray"
    rid = shlex.quote(run.run_id)
    ref = shlex.quote(run.workflow_ref) if run.workflow_ref else "MODULE:WORKFLOW"
    what = (f"its driver {run.lease_owner} stopped (its lease expired) before the run's first step committed"
            if run.lease_owner is not None else "no driver has started it")
    return (f"launched as Ray job {launch.job} at {utc(launch.at)}; {what}: "
            f"`{ray} job status {launch.job}{at}` and `{ray} job logs {launch.job}{at}` say why; "
            f"fix that and launch it again with `raysaga launch {ref}{at} --run-id {rid}`")


def watch_stop(run: RunRecord, launch: Launch | None, job_ended: bool | None, now: float,
               job_state: str = "", unknown_since: float | None = None) -> str | None:
    """Why ``status --watch`` gives up on ``run``, or None to go on watching. ``job_ended``: none
    of the run's jobs is live (True; ``job_state`` as Ray says the latest's, e.g. FAILED), one is
    (False), or that is unknown (None: the Job API out of reach): then ``NO_DRIVER_GRACE`` after
    ``unknown_since`` decides (when the API last answered, or, never answering, when the watch
    first asked it; the launch's time if not given)."""
    note = not_started(run, launch, now)
    if note is None or launch is None or job_ended is False:
        return None
    if job_ended:
        state = f" ({job_state})" if job_state else ""
        return f"Ray job {launch.job} ended{state} before any driver started run {run.run_id}: {note}"
    since = launch.at if unknown_since is None else unknown_since
    if now - since >= NO_DRIVER_GRACE:
        return (f"no driver started run {run.run_id} and the Ray Job API was out of reach to check its job for "
                f"{NO_DRIVER_GRACE:g}s: {note}")
    return None


__all__ = ["LAUNCHED", "NO_DRIVER_GRACE", "Launch", "latest", "not_started", "record", "watch_stop"]
