"""A worker's claim of the next runnable run: one transaction, one winner.

A run is runnable by a worker when its lease is free (never taken, released, or expired) and it
is one of:
- ``new``: ``pending`` and submitted (``queue`` set; a foreground ``raysaga run`` leaves it unset,
  so no worker races the process that created the run);
- ``takeover``: ``running`` or ``compensating`` (its driver died, or handed the run back);
- ``due``: resting in ``waiting_human``, ``waiting_timer`` or ``paused`` with ``wake_at`` passed (a
  timer fired, a decision or an unpause arrived, an approval timed out). A pause clears ``wake_at``
  (a driver's commit of any new status does, ``Store.transition`` too): a paused run is due only
  once an unpause (or a cancel that compensates) sets it; its timers keep their times in its rows.

Only runs of the workflows the worker registered, by name and definition hash, are considered:
a worker never imports code named by the database; less the runs it names as skipped
(``Served.skip``: runs its code's types do not fit, left for a worker whose code does). On
PostgreSQL the candidates are read ``FOR UPDATE SKIP LOCKED`` (workers skip each other's rows
instead of queueing on them); on SQLite the transaction is ``BEGIN IMMEDIATE``. The lease is
then taken by the same conditional update as ``Store.claim`` (``fence + 1``), so the fence still
guards every later write.
Per-workflow limits (at most N runs of a workflow driven at once) are checked in the same
transaction; on PostgreSQL an advisory lock serialises claims that are subject to one.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict
from sqlalchemy import ColumnElement, Connection, Engine, Text, and_, cast, func, insert, or_, select, text, update

from raysaga.state.models import Lease, RunStatus
from raysaga.state.owner_identity import alive_because
from raysaga.state.schema import events, runs

ClaimReason = Literal["new", "takeover", "due"]

#: How many candidates one claim looks at before giving up for this round.
CANDIDATES = 16

_ACTIVE = (RunStatus.RUNNING.value, RunStatus.COMPENSATING.value)
#: A run in one of these whose lease is claimed while another owner still holds it (expired, or
#: its process provably gone) was abandoned: that driver died mid-run, or before the run's first
#: commit (``pending``: every way out of a drive of a pending run lets go of it, or moves it on).
#: The claim's event says so (``abandoned_by``), which is how a crash loop is told apart from runs
#: that rest or are handed back. Unless its process provably still runs (``abandonment``).
ABANDONABLE = frozenset({*_ACTIVE, RunStatus.PENDING.value})
_RESTING = (RunStatus.WAITING_HUMAN.value, RunStatus.WAITING_TIMER.value, RunStatus.PAUSED.value)


class Claim(BaseModel):
    """A run a worker now drives: its lease, why it was runnable, and since when."""

    model_config = ConfigDict(frozen=True)

    lease: Lease
    workflow: str
    reason: ClaimReason
    latency: float
    """Seconds from when the run became runnable to this claim."""
    status: RunStatus | None = None
    """The run's status when it was claimed (what a worker parks it from if no driver can read it)."""
    abandoned_by: str | None = None
    """The lease owner whose driver died holding the run (this claim took its lease): the run is a
    suspect of a crash loop, which a worker drives alone (``raysaga.orchestrator.crash_loop``)."""
    taken_from_live: str | None = None
    """The lease owner whose lease expired while its process provably still runs on this host (a
    driver gone silent, not dead: ``abandonment``): no suspect, no death counted."""


def abandonment(held_by: str | None, status: str | None, owner: str) -> dict[str, str]:
    """What a claim's ``lease_claimed`` event says of the owner whose lease it took: nothing when
    there was none (or it is ``owner``) or the run was not being driven; ``abandoned_by`` when that
    driver stopped without letting go (it died: a crash loop counts it); ``taken_from_live`` with
    ``why`` when its process provably still runs here: its lease expired because it went silent (a
    step holding the GIL in C code starves the heartbeat thread; a stopped process). Counted as a
    death, such take-overs parked a healthy run as a crash loop while its first driver computed on."""
    if held_by is None or held_by == owner or status not in ABANDONABLE:
        return {}
    alive = alive_because(held_by)
    if alive is None:
        return {"abandoned_by": held_by}  # its driver stopped without letting go: it died
    return {"taken_from_live": held_by,
            "why": f"its lease expired while {alive}: a live driver gone silent (a step holding the GIL, a "
                   "stopped process), not a death; it stops at its next write, its fence stale"}


def claim_next(engine: Engine, owner: str, ttl: float, workflows: Mapping[str, Digests], *,
               limits: Mapping[str, int] | None = None, now: float | None = None) -> Claim | None:
    """Take the lease of the next runnable run of ``workflows`` (name -> definition hash), oldest
    first, leaving out the workflows at their limit; None when there is none."""
    if not workflows:
        return None
    now = time.time() if now is None else now
    limits = dict(limits or {})
    with engine.begin() as conn:
        postgres = conn.dialect.name == "postgresql"
        if postgres and limits:
            conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _lock_key("raysaga-claim-limits")})
        live = _live_counts(conn, list(limits), now) if limits else {}
        # a workflow at its limit is left out of the query: its backlog must not fill the candidates
        # and hide another workflow's runs (the slot would idle while they wait)
        open_ = {name: digest for name, digest in workflows.items()
                 if name not in limits or live.get(name, 0) < limits[name]}
        if not open_:
            return None
        query = (select(runs.c.run_id, runs.c.status, runs.c.workflow_name, runs.c.created_at, runs.c.wake_at,
                        runs.c.lease_expires_at, runs.c.updated_at, runs.c.lease_owner)
                 .where(_runnable(open_, now))
                 .order_by(func.coalesce(runs.c.wake_at, runs.c.created_at), runs.c.run_id)
                 .limit(CANDIDATES))
        if postgres:
            query = query.with_for_update(skip_locked=True)
        for row in conn.execute(query).all():
            run_id, status, workflow, created_at, wake_at, lease_expires_at, updated_at, held_by = row
            fence_seq = conn.execute(
                update(runs).where(runs.c.run_id == run_id, _lease_free(now))
                .values(lease_owner=owner, lease_expires_at=now + ttl, fence=runs.c.fence + 1,
                        event_seq=runs.c.event_seq + 1, updated_at=now)
                .returning(runs.c.fence, runs.c.event_seq)).first()
            if fence_seq is None:
                continue  # taken a moment ago (SQLite reads no lock): try the next one
            fence, seq = fence_seq
            reason: ClaimReason
            if status == RunStatus.PENDING.value:
                reason, since = "new", created_at
            elif status in _ACTIVE:
                reason, since = "takeover", lease_expires_at or updated_at
            else:
                reason, since = "due", wake_at if wake_at is not None else updated_at
            latency = max(0.0, now - since)
            data = {"owner": owner, "fence": fence, "worker": True, "reason": reason, "latency": round(latency, 4)}
            taken = abandonment(held_by, status, owner)
            data.update(taken)
            conn.execute(insert(events).values(run_id=run_id, seq=seq, at=now, kind="lease_claimed", data=data))
            return Claim(lease=Lease(run_id=run_id, owner=owner, fence=fence, expires_at=now + ttl, ttl=ttl),
                         workflow=workflow, reason=reason, latency=latency, status=RunStatus(status),
                         abandoned_by=taken.get("abandoned_by"), taken_from_live=taken.get("taken_from_live"))
    return None


def claim_of(engine: Engine, owner: str, ttl: float, now: float | None = None) -> Claim | None:
    """The claim ``owner`` holds, if a ``claim_next`` under it committed: what a worker whose claim
    raised (the connection was lost, maybe after the commit) asks before it claims again under
    the same owner. Without it the run sat leased to nobody driving it until its lease expired.
    None when the owner holds no live lease (the claim never committed, or its lease ran out).
    Read by ``lease_owner`` with no index: asked only after a claim failed, never per poll."""
    now = time.time() if now is None else now
    with engine.connect() as conn:
        row = conn.execute(select(runs.c.run_id, runs.c.status, runs.c.workflow_name, runs.c.fence,
                                  runs.c.lease_expires_at)
                           .where(runs.c.lease_owner == owner, runs.c.lease_expires_at >= now)).first()
        if row is None:
            return None
        run_id, status, workflow, fence, expires_at = row
        claimed = conn.execute(select(events.c.data).where(events.c.run_id == run_id,
                                                           events.c.kind == "lease_claimed")
                               .order_by(events.c.seq.desc()).limit(1)).scalar_one_or_none()
    data = claimed if isinstance(claimed, dict) and claimed.get("owner") == owner else {}
    # a worker's take-over from a driver proven gone (``Store.claim`` taking the lease) names the
    # owner it took from and no reason: a take-over all the same, driven alone like the one answered
    taken_from = data.get("abandoned_by") or data.get("taken_from")
    return Claim(lease=Lease(run_id=run_id, owner=owner, fence=fence, expires_at=expires_at, ttl=ttl),
                 workflow=workflow, reason=data.get("reason") or ("takeover" if taken_from else "new"),
                 latency=float(data.get("latency", 0.0)), status=RunStatus(status), abandoned_by=taken_from,
                 taken_from_live=data.get("taken_from_live"))


def _lease_free(now: float) -> ColumnElement[bool]:
    return or_(runs.c.lease_owner.is_(None), runs.c.lease_expires_at < now)


#: The key among a run's ``step_hashes`` that marks the hash scheme it was recorded under (its
#: value: ``versions.SCHEME``): a run without it was recorded by an earlier raysaga (scheme 1). Kept
#: here, the lowest layer that reads it: ``versions``, claims and ``fleet_view`` (which ``raysaga
#: status`` loads without the DSL or networkx) share this one.
SCHEME_KEY = ":scheme"

#: Digests a worker drives a workflow's runs under: its definition hash, or (hash, earlier scheme's
#: hash of the same code): a run an earlier raysaga recorded (no ``:scheme`` among its step hashes)
#: under the latter is this code's too (``versions.legacy_hash``), and the driver repins it.
Digests = str | tuple[str, str]


class Served(tuple[str, str]):
    """A workflow's digests (definition hash, earlier scheme's hash) with the runs of it a worker
    does not claim (``skip``): runs whose stored outputs do not read as its code's types
    (``raysaga.orchestrator.worker_runs``), left for a worker whose code fits. Claimed again at
    every poll, such a run came first each time (oldest first) and hid the runs behind it."""

    skip: frozenset[str]

    def __new__(cls, current: str, legacy: str, skip: Iterable[str] = ()) -> Served:
        served = super().__new__(cls, (current, legacy))
        served.skip = frozenset(skip)
        return served

    def __reduce__(self) -> tuple[Any, ...]:  # (a tuple subclass's default calls __new__ with the tuple alone)
        return (Served, (self[0], self[1], sorted(self.skip)))


def _runnable(workflows: Mapping[str, Digests], now: float) -> ColumnElement[bool]:
    mine = or_(*(_of(name, digests) for name, digests in workflows.items()))
    return and_(mine, _lease_free(now), or_(
        and_(runs.c.status == RunStatus.PENDING.value, runs.c.queue.is_not(None)),
        runs.c.status.in_(_ACTIVE),
        and_(runs.c.status.in_(_RESTING), runs.c.wake_at.is_not(None), runs.c.wake_at <= now),
    ))


def _of(name: str, digests: Digests) -> ColumnElement[bool]:
    current, legacy = (digests, None) if isinstance(digests, str) else digests
    hashed = runs.c.definition_hash == current
    if legacy is not None and legacy != current:  # (a scheme-2 hash of other code may equal it: the mark tells)
        unmarked = or_(runs.c.step_hashes.is_(None), cast(runs.c.step_hashes, Text).not_like(f'%"{SCHEME_KEY}"%'))
        hashed = or_(hashed, and_(runs.c.definition_hash == legacy, unmarked))
    if isinstance(digests, Served) and digests.skip:
        hashed = and_(hashed, runs.c.run_id.not_in(sorted(digests.skip)))
    return and_(runs.c.workflow_name == name, hashed)


def _live_counts(conn: Connection, names: list[str], now: float) -> dict[str, int]:
    """Runs of these workflows driven right now (a live lease)."""
    rows = conn.execute(select(runs.c.workflow_name, func.count())
                        .where(runs.c.workflow_name.in_(names), runs.c.lease_owner.is_not(None),
                               runs.c.lease_expires_at >= now)
                        .group_by(runs.c.workflow_name)).all()
    return {name: int(count) for name, count in rows}


def _lock_key(name: str) -> int:
    return zlib.crc32(name.encode()) & 0x7FFFFFFF
