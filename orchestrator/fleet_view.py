"""Whether the worker fleet serves a run that waits for it (``raysaga status``, the dashboard's run).

A submitted run (its ``queue`` set) that a worker could claim now (``pending``, due, or active
with its lease free) and no driver holds waits for a live worker (``worker_rows``) that serves its
workflow at its definition hash on its queue. ``fleet`` says how many do, or that none does, what
the live ones serve instead, and the command that would serve it.
"""

from __future__ import annotations

import shlex
from typing import Any

from raysaga.state import RunRecord, RunStatus, Store
from raysaga.state.claims import SCHEME_KEY
from raysaga.state.worker_rows import WorkerRecord

#: ``raysaga workers --all`` and this view read the rows that beat or stopped in this window.
RECENT = 24 * 3600.0
#: Live workers' workflows named in a note (the rest are counted).
SERVED_SHOWN = 8

_RESTING = (RunStatus.WAITING_HUMAN, RunStatus.WAITING_TIMER, RunStatus.PAUSED)
_ACTIVE = (RunStatus.RUNNING, RunStatus.COMPENSATING)


def live_workers(store: Store, now: float) -> list[WorkerRecord]:
    return [w for w in store.workers(now - RECENT) if w.state(now) == "live"]


def waits_for_fleet(run: RunRecord, now: float) -> bool:
    """A submitted run a worker would claim now, and no live lease on it."""
    if run.queue is None or (run.lease_owner is not None and (run.lease_expires_at or 0.0) >= now):
        return False
    due = run.status in _RESTING and run.wake_at is not None and run.wake_at <= now
    return run.status == RunStatus.PENDING or run.status in _ACTIVE or due


def short(definition_hash: str) -> str:
    return definition_hash[:12]


def command(run: RunRecord) -> str:
    """The worker command that would serve the run (its recorded ``MODULE:ATTR``, else a placeholder)."""
    ref = run.workflow_ref or "MODULE:WORKFLOW"
    return f"raysaga worker -w {shlex.quote(ref)}"


def fleet(store: Store, run: RunRecord, now: float) -> dict[str, Any] | None:
    """``{"live_workers", "serving", "queue", "note", "command"}`` for a run that waits for the
    fleet, else None. ``command`` is null when a live worker serves it."""
    if not waits_for_fleet(run, now):
        return None
    live = live_workers(store, now)
    legacy = SCHEME_KEY not in (run.step_hashes or {})  # recorded by an earlier raysaga: its old hash counts
    serving = [w for w in live if w.serves(run.workflow_name, run.definition_hash, run.queue, legacy)]
    what = f"{run.workflow_name} v{run.workflow_version} (hash {short(run.definition_hash)}) on queue {run.queue!r}"
    if serving:
        count = "1 live worker serves" if len(serving) == 1 else f"{len(serving)} live workers serve"
        note = (f"{count} {what}: it is claimed once one has a free slot (unless that worker's code cannot "
                "read the run's stored values: its log then says it left the run for another)")
        return {"live_workers": len(live), "serving": len(serving), "queue": run.queue, "note": note, "command": None}
    cmd = command(run)
    if not live:
        note = f"no live worker serves {what}: no registered worker is live (`raysaga workers --all` shows " \
               f"recent ones; workers of raysaga before 0.3.0 do not register); start one: {cmd}"
    else:
        others = "the one live worker serves" if len(live) == 1 else f"the {len(live)} live workers serve"
        note = f"no live worker serves {what}: {others} {served(live, run.queue)}; start one that does: {cmd}"
    return {"live_workers": len(live), "serving": 0, "queue": run.queue, "note": note, "command": cmd}


def served(live: list[WorkerRecord], queue: str | None) -> str:
    """What live workers serve, e.g. ``order v2 (hash 1a2b3c4d5e6f) x2, research v1 (hash ...)``;
    a workflow served on other queues only says so."""
    seen: dict[tuple[str, str, str, bool], int] = {}
    for w in live:
        for wf in w.workflows:
            key = (wf.name, wf.version, wf.definition_hash, w.serves_queue(queue))
            seen[key] = seen.get(key, 0) + 1
    items = [f"{name} v{version} (hash {short(digest)}){'' if here else ' on other queues'}"
             + (f" x{n}" if n > 1 else "") for (name, version, digest, here), n in sorted(seen.items())]
    more = len(items) - SERVED_SHOWN
    return ", ".join(items[:SERVED_SHOWN]) + (f" and {more} more" if more > 0 else "") if items else "nothing"
