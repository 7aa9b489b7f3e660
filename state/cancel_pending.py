"""A cancel on its way to a driver: what decides an approval must not miss it.

``Client.cancel`` of a run at rest (with a rollback: ``compensate=True``) records a ``cancel``
signal and makes the run due (only a due run is concerned: below); the driver that takes it up
obeys the cancel before anything else
(``driver_signals.chosen_cancel``: a rollback asked for wins over a plain cancel). Until then a
decision on the run would be taken in and then rolled back (or dropped): ``decisions.decide``
refuses it (``refuse_if_cancelled``) and ``decisions.waiting`` (the inbox) leaves the run out
(``cancels``).
"""

from __future__ import annotations

import shlex
import time

from sqlalchemy import ColumnElement, Connection, exists, select

from raysaga.errors import UserError
from raysaga.state.decoding import records
from raysaga.state.models import SignalKind, SignalRecord
from raysaga.state.schema import runs, signals


def cancels(run_id: ColumnElement[str] | str) -> ColumnElement[bool]:
    """The run's cancel signals not yet consumed by a driver (through ``ix_raysaga_signals_run``)."""
    return (signals.c.run_id == run_id) & (signals.c.kind == SignalKind.CANCEL.value) & signals.c.consumed_at.is_(None)


def pending_cancel(conn: Connection, run_id: str) -> SignalRecord | None:
    """The cancel on its way to a driver that the driver obeys (a rollback asked for wins over a
    plain cancel), or None."""
    found = records(SignalRecord, conn.execute(select(signals).where(cancels(run_id)).order_by(signals.c.id)).all())
    rollback = (s for s in found if isinstance(s.payload, dict) and s.payload.get("compensate"))
    return next(rollback, found[0] if found else None)


def due_with_cancel(run_id: ColumnElement[str], now: float) -> ColumnElement[bool]:
    """A run with a cancel on its way to a driver that obeys it: its live driver's, at its next step
    boundary, or the next one's (due now: ``wake_at`` passed)."""
    held = runs.c.lease_owner.is_not(None) & (runs.c.lease_expires_at >= now)
    due = runs.c.wake_at.is_not(None) & (runs.c.wake_at <= now)
    return exists().where(cancels(run_id)) & (held | due)


def refuse_if_cancelled(conn: Connection, run_id: str, label: str) -> None:
    """Refuse a decision on ``label`` (``UserError``, one line) while a cancel is on its way to a
    driver that obeys it first: the run's live driver, or the next one (a run due now). A cancel can
    sit unconsumed on a run at rest, not due and not held (queued by a ``cancel --compensate`` whose
    own drive failed): a decision is then taken as before, and wakes the run, whose driver obeys the
    cancel (refused, the run sat hidden from the inbox, for ever)."""
    now = time.time()
    found = conn.execute(select(runs.c.wake_at, runs.c.lease_owner, runs.c.lease_expires_at)
                         .where(runs.c.run_id == run_id)).first()
    if found is None:
        return
    wake_at, owner, expires = found
    if not ((wake_at is not None and wake_at <= now) or (owner is not None and (expires or 0.0) >= now)):
        return
    cancel = pending_cancel(conn, run_id)
    if cancel is None:
        return
    payload = cancel.payload if isinstance(cancel.payload, dict) else {}
    who = f" by {payload['by']}" if isinstance(payload.get("by"), str) and payload["by"] else ""
    what = "rolled back (a cancel with rollback" if payload.get("compensate") else "cancelled (a cancel"
    at = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(cancel.created_at))
    raise UserError(f"run {run_id!r} is being {what} was asked{who} at {at}): a decision on {label!r} is "
                    f"refused; `raysaga status {shlex.quote(run_id)}` shows how it ends")
