"""A run that no driver drives, as every view tells it (``status``, ``status --json``, ``--dag``,
the dashboard; ``stats`` counts them: ``state.driver_stops``).

A driver stopped by a signal (Ctrl-C, SIGTERM) commits what finished, records
``driver_interrupted`` and releases its lease; a killed one leaves its lease to expire. The run
stays ``running`` (or ``compensating``) in the store, on purpose: the state machine does not change
when a driver goes, a worker or ``raysaga resume`` takes the run up. The views showed such a run
as at work for ever (``running``, its nodes running, their bars growing). Each now derives, from
the lease and the driver's last ``driver_interrupted``, that nobody drives it, since when and why,
and the command that continues it; what shows running (a row, or a step the views infer in flight)
shows as ``interrupted`` when a driver stopped under it, as ``pending`` when the run was handed on
with no driver (an operator's retry or unpause: nothing was cut, it waits to be taken up).

No driver: the lease is released (``interrupted``: its driver's event says by which signal;
``released``: no such event), or expired with its owner not provably alive (``expired``: the
driver died; one alive but silent still drives: its next write stops it), or expired with its
owner on another machine (``silent``: this one cannot tell a dead driver from one busy past its
lease, so it says so, and what shows running still shows ``running``), or still valid with its
owner provably gone on this host (``gone``: a resume takes over at once).
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from raysaga.orchestrator.ownership import gone_because
from raysaga.state import RunRecord, Store
from raysaga.state.dashboard_reads import DashboardReads
from raysaga.state.driver_stops import ACTIVE, DriverStop
from raysaga.state.owner_identity import alive_because, host_name, parse_owner

#: The state a node the store records running (or the views infer in flight) shows in a run whose
#: driver stopped (interrupted, died): nothing runs it until the run is taken up again.
INTERRUPTED = "interrupted"
#: The same in a run handed on with its lease free (``released``: nothing was cut short).
WAITING = "pending"
#: The same when its driver, on another machine, may still be at work (``silent``): as stored.
RUNNING = "running"


@dataclass(frozen=True)
class NoDriver:
    """Why nobody drives an active run: ``why`` is ``interrupted``, ``released``, ``expired``,
    ``silent`` or ``gone``; ``since`` when its driver stopped (None: not known); ``signal`` the signal that
    stopped it; ``driver`` who it was (``pid N on HOST``)."""

    run_id: str
    status: str
    why: str
    since: float | None
    signal: str | None
    driver: str | None
    command: str
    queue: str | None = None
    detail: str | None = None

    def cause(self) -> str:
        """What happened, e.g. ``interrupted at 2026-12-01 18:37:16 UTC by SIGINT``."""
        who = f"its driver ({self.driver})" if self.driver else "its driver"
        if self.why == "interrupted":
            return f"interrupted at {_utc(self.since)} by {self.signal}" if self.signal \
                else f"interrupted at {_utc(self.since)}"
        if self.why == "released":  # an operator's retry or unpause, or a driver that let go unsaid
            return f"none has taken it up since {_utc(self.since)}"
        if self.why == "expired":
            return f"{who} died: its lease expired at {_utc(self.since)}"
        if self.why == "silent":  # a reviewer's live driver on another host was called dead
            return (f"{who} has not renewed its lease since it expired at {_utc(self.since)}: it runs on another "
                    "machine, where it died or is busy past its lease (this one cannot tell)")
        return f"{who} is gone ({self.detail or 'process not running'})"

    def advice(self) -> str:
        """How it goes on: the resume command, and a worker for a submitted run."""
        verb = {"gone": "takes it over at once",
                "silent": "takes it over (a driver still at work then loses it: fenced, no effect twice)"}.get(
                    self.why, "continues it")
        worker = f", or a worker serving queue {self.queue!r} takes it up" if self.queue else ""
        return f"`{self.command}` {verb}{worker}"

    def note(self) -> str:
        """One line: ``no driver: interrupted at T by SIGINT; `raysaga resume X` continues it``."""
        return f"no driver: {self.cause()}; {self.advice()}"

    @property
    def in_flight(self) -> str:
        """The state what would show running shows: ``interrupted`` where a driver stopped under it."""
        return WAITING if self.why == "released" else RUNNING if self.why == "silent" else INTERRUPTED

    def headline(self) -> str:
        """The run's state as the views head it: ``running, no driver``."""
        return f"{self.status}, no driver"

    def as_json(self) -> dict[str, Any]:
        return {"why": self.why, "since": self.since, "signal": self.signal, "driver": self.driver,
                "command": self.command, "note": self.note(), "in_flight": self.in_flight}


def _utc(at: float | None) -> str:
    if at is None:
        return "an unknown time"
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(at))
    except (OverflowError, ValueError, OSError):
        return "(bad time)"


def needs_stop(status: str | None, lease_owner: str | None) -> bool:
    """Whether telling this run needs its driver's last stop (``Store``'s ``driver_stops``): an
    active run whose lease is released."""
    return status in ACTIVE and lease_owner is None


def derive(row: Mapping[str, Any], stop: DriverStop | None, now: float) -> NoDriver | None:
    """The ``NoDriver`` of a run summary (``run_id``, ``status``, ``lease_owner``,
    ``lease_expires_at``, ``updated_at``, ``workflow_ref``, ``queue``: a dashboard row or a
    ``RunRecord``'s fields), ``stop`` its driver's last stop; None when a driver drives it, or it
    is not active (pending, waiting, paused or ended: nobody is meant to drive it now)."""
    status = row.get("status")
    status = getattr(status, "value", status)
    if status not in ACTIVE:
        return None
    run_id = str(row["run_id"])
    owner, expires = row.get("lease_owner"), row.get("lease_expires_at")
    command = f"raysaga resume {shlex.quote(run_id)}" + ("" if row.get("workflow_ref") else " --workflow MODULE:WF")
    queue = row.get("queue")

    def stopped(why: str, since: float | None, driver: str | None, signal: str | None = None,
                detail: str | None = None) -> NoDriver:
        return NoDriver(run_id=run_id, status=str(status), why=why, since=since, signal=signal, driver=driver,
                        command=command, queue=str(queue) if queue else None, detail=detail)

    if owner is None:
        if stop is not None:
            return stopped("interrupted", stop.at, _who(stop.owner), stop.signal)
        updated = row.get("updated_at")
        return stopped("released", float(updated) if updated is not None else None, None)
    if expires is not None and expires < now:
        if alive_because(str(owner)) is not None:
            return None  # alive but silent: it still drives (``status``'s driver line says so)
        parsed = parse_owner(str(owner))  # another host's pid names nothing here; this host's, before a
        elsewhere = parsed is not None and parsed.host != host_name()  # reboot or in the old format: dead
        return stopped("silent" if elsewhere else "expired", float(expires), _who(owner))
    why = gone_because(str(owner))
    return None if why is None else stopped("gone", None, _who(owner), detail=why)


def _who(owner: str | None) -> str | None:
    parsed = parse_owner(owner) if owner else None
    return parsed.label() if parsed else None


def of_run(store: Store, run: RunRecord, now: float | None = None) -> NoDriver | None:
    """``derive`` for one run, its driver's stop read when its lease is released."""
    stop = None
    if needs_stop(run.status.value, run.lease_owner):
        stop = stops(store, [run.run_id]).get(run.run_id)
    fields = {"run_id": run.run_id, "status": run.status.value, "lease_owner": run.lease_owner,
              "lease_expires_at": run.lease_expires_at, "updated_at": run.updated_at,
              "workflow_ref": run.workflow_ref, "queue": run.queue}
    return derive(fields, stop, time.time() if now is None else now)


def of_summaries(store: Store, rows: Iterable[Any], now: float | None = None) -> dict[str, NoDriver]:
    """Of a page of ``RunSummary`` rows (``raysaga list``: no module, no queue in them), the runs no
    driver drives, by run id: each candidate (active, its lease free, expired or its owner gone)
    read again whole with its driver's stop, the rest not read at all."""
    now = time.time() if now is None else now
    wanted = [r.run_id for r in rows if r.status is not None and derive(
        {"run_id": r.run_id, "status": r.status, "lease_owner": r.lease_owner,
         "lease_expires_at": r.lease_expires_at, "updated_at": r.updated_at}, None, now) is not None]
    if not wanted or not isinstance(store, DashboardReads):
        return {}
    found = stops(store, wanted)
    out = {}
    for run_id in wanted:
        row = store.run_row(run_id)
        none = None if row is None else derive(row, found.get(run_id), now)
        if none is not None:
            out[run_id] = none
    return out


def stops(store: Store, run_ids: list[str]) -> dict[str, DriverStop]:
    """The driver stops of ``run_ids`` (the store's one implementation reads them; another: none)."""
    return store.driver_stops(run_ids) if isinstance(store, DashboardReads) and run_ids else {}


def shown_state(state: str, no_driver: NoDriver | None, status: str | None = None) -> str:
    """A node's (or step's) state as a view shows it: ``running`` is ``NoDriver.in_flight`` in a run
    no driver drives, and ``interrupted`` in a run at rest (``status``: paused, waiting or ended; a
    pause cancels the calls in flight, their rows stay running until the run goes on and runs them
    again: a paused run showed "5 running"); every other state as stored."""
    if state != "running":
        return state
    if no_driver is not None:
        return no_driver.in_flight
    return INTERRUPTED if status is not None and status not in ACTIVE else state


__all__ = ["INTERRUPTED", "WAITING", "NoDriver", "derive", "needs_stop", "of_run", "of_summaries", "shown_state",
           "stops"]
