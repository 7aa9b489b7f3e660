"""What the store says of an active run that no driver drives: the driver's last stop, and how many
such runs there are (``raysaga stats``, the dashboard's run list).

A driver that stops on a signal (Ctrl-C, SIGTERM: a worker handing its runs back) commits a
``driver_interrupted`` event (its ``signal`` and ``owner``) and releases its lease; one killed
leaves its lease to expire. Either way the run stays ``running`` (or ``compensating``) in the store
on purpose: a worker or ``raysaga resume`` takes it up. The views tell such a run from one at work
(``orchestrator.undriven``) from its lease and this event; this module reads them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Select, or_, select

from raysaga.state.decoding import reading
from raysaga.state.models import RunStatus
from raysaga.state.owner_identity import alive_because
from raysaga.state.schema import events, runs

#: The run states a driver advances; a run in one of them with no driver waits for a resume.
ACTIVE = (RunStatus.RUNNING.value, RunStatus.COMPENSATING.value)
#: The events that start and end a driver's hold on a run.
_KINDS = ("lease_claimed", "driver_interrupted")


@dataclass(frozen=True)
class DriverStop:
    """A driver's ``driver_interrupted`` event with no claim of the run after it."""

    at: float
    signal: str | None
    owner: str | None


def latest_stops(conn: Connection, run_ids: Iterable[str]) -> dict[str, DriverStop]:
    """Of each run, its latest ``driver_interrupted`` event when no driver claimed it since; runs
    whose latest such event is a claim (or that have neither) are left out. One short read per
    run, from its last event backwards (the stop is the last or nearly the last event of a run its
    driver let go): asked only for the runs whose lease is free."""
    found: dict[str, DriverStop] = {}
    for run_id in dict.fromkeys(run_ids):
        query = (select(events.c.at, events.c.kind, events.c.data)
                 .where(events.c.run_id == run_id, events.c.kind.in_(_KINDS))
                 .order_by(events.c.seq.desc()).limit(1))
        with reading(run_id, events.name):
            row = conn.execute(query).first()
        if row is None or row.kind != "driver_interrupted":
            continue
        data: Any = row.data if isinstance(row.data, dict) else {}
        signal, owner = data.get("signal"), data.get("owner")
        found[run_id] = DriverStop(at=float(row.at), signal=signal if isinstance(signal, str) else None,
                                   owner=owner if isinstance(owner, str) else None)
    return found


def lapsed(query: Select[Any], now: float) -> Select[Any]:
    """``query`` (of the runs table) narrowed to active runs whose lease is free or expired: the
    candidates for "no driver" (``count_undriven`` drops those whose driver provably still runs)."""
    return query.where(runs.c.status.in_(ACTIVE),
                       or_(runs.c.lease_owner.is_(None), runs.c.lease_expires_at < now))


def count_undriven(conn: Connection, scope: Select[Any] | None, now: float) -> int:
    """Active runs (``scope``: a select of the runs table narrowed as the caller's view is; None:
    every run) that no driver drives: their lease released, or expired with its owner not
    provably alive here (a driver gone silent, its process still running, still drives; one on
    another machine, whose process this one cannot check, counts: dead, or busy past its lease). A driver
    killed a moment ago counts once its lease expires (``--lease-ttl``, 15 s by default);
    ``raysaga status`` tells it at once on its own host."""
    query = lapsed(scope if scope is not None else select(runs.c.run_id), now)
    owners = conn.execute(query.with_only_columns(runs.c.lease_owner)).scalars().all()
    return sum(1 for owner in owners if owner is None or alive_because(str(owner)) is None)


__all__ = ["ACTIVE", "DriverStop", "count_undriven", "lapsed", "latest_stops"]
