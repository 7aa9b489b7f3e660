"""Operational figures of a store, read from the runs and the event log (``raysaga stats``).

Everything here is derived from rows the engine writes anyway: no counter is kept on the side,
so the figures cannot drift from the history they summarise. Nor do they outlive it: ``raysaga
prune`` deletes runs with their events and lowers the counts, so ``prometheus`` types every figure
a gauge (a counter that goes down reads as a reset: ``rate()`` counted phantom retries).
"""

from __future__ import annotations

import json
import math
import time
from collections import defaultdict
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import Engine, Text, cast, func, select

from raysaga.state.breakers import BreakerPolicy
from raysaga.state.driver_stops import count_undriven
from raysaga.state.models import RunStatus
from raysaga.state.schema import breakers, events, runs


class Quantiles(BaseModel):
    model_config = ConfigDict(frozen=True)

    count: int = 0
    p50: float | None = None
    p95: float | None = None


class Stats(BaseModel):
    """What ``raysaga stats`` prints; ``since``: only runs created after it (None: all)."""

    model_config = ConfigDict(frozen=True)

    at: float
    since: float | None = None
    runs_by_state: dict[str, int] = Field(default_factory=dict)
    runs_without_driver: int = 0
    """Of the runs ``running`` or ``compensating`` in ``runs_by_state``, those no driver drives:
    interrupted (lease released) or whose driver died (lease expired, its process not provably
    alive). They stay in that state on purpose, until a worker or ``raysaga resume`` takes them up
    (``driver_stops.count_undriven``)."""
    waiting_human_seconds: Quantiles = Quantiles()
    """How long approvals waited for a human: one wait per approval, from when it was asked to when
    it was decided (else its timeout, or its run's end); a wait under way counts up to now."""
    resumes: int = 0
    """Claims of a run after its first by a driver that goes on with it (a crash, a hand-back, a
    wake-up); not an operator's cancel, pause or retry, which claim the run for one transition, nor
    the drive a retry starts (it starts the run again, as a first claim does)."""
    resumed_runs: int = 0
    resumed_completed: int = 0
    resume_success_rate: float | None = None
    """Of the runs resumed at least once and now at rest, the share that completed."""
    duplicates_prevented: int = 0
    """Effects served from the ledger instead of being called again (a committed key)."""
    retries: int = 0
    """Retries scheduled after a failed attempt (``retry_scheduled`` events: an operator's retry of
    the run does not take back those already made)."""
    breaker_trips: int = 0
    """Circuit breakers open now: opened within the default cooldown (``BreakerPolicy``, 30 s; the
    store keeps their state, not a history of trips, nor an agent's own cooldown). One open for
    longer admits its next call as a probe: it counted as open for ever."""
    breakers_half_open: int = 0
    """Circuit breakers whose probe call is out (taken within the default cooldown)."""
    claim_latency_seconds: Quantiles = Quantiles()
    """Workers' claims: from when the run became runnable to its claim."""


_AT_REST = {RunStatus.COMPLETED.value, RunStatus.FAILED.value, RunStatus.COMPENSATED.value,
            RunStatus.COMPENSATION_FAILED.value, RunStatus.CANCELLED.value}
#: the events that open, widen and settle an approval (``waiting_human_seconds``)
_APPROVAL_KINDS = ("approval_requested", "approval_escalated", "decision")
#: transitions that close whatever the run still asked of a human (its forward part stopped)
_RUN_ENDS = ("run_completed", "run_failed", "run_cancelled", "run_compensating", "run_compensated",
             "run_compensation_failed")
#: an event of the trail: run, at, kind, data (JSON text), (node, fan index or -1)
Trail = tuple[str, float, str, str | None, tuple[str | None, int]]


def compute(engine: Engine, since: float | None = None, now: float | None = None) -> Stats:
    now = time.time() if now is None else now
    scope = select(runs.c.run_id)
    if since is not None:
        scope = scope.where(runs.c.created_at >= since)
    in_scope = events.c.run_id.in_(scope.scalar_subquery())
    with engine.connect() as conn:
        by_state_query = select(runs.c.status, func.count()).group_by(runs.c.status)
        if since is not None:
            by_state_query = by_state_query.where(runs.c.created_at >= since)
        by_state = {str(s): int(n) for s, n in conn.execute(by_state_query).all()}
        undriven = count_undriven(conn, scope, now)
        retries = int(conn.execute(select(func.count()).select_from(events)
                                   .where(in_scope, events.c.kind == "retry_scheduled")).scalar_one())
        status_of = dict(conn.execute(select(runs.c.run_id, runs.c.status)
                                      .where(runs.c.run_id.in_(scope.scalar_subquery()))).all())
        rows = conn.execute(
            select(events.c.run_id, events.c.at, events.c.kind, cast(events.c.data, Text), events.c.node_id,
                   events.c.fan_index)
            .where(in_scope, events.c.kind.in_(["lease_claimed", "run_waiting_human", "run_running", "run_paused",
                                                *_RUN_ENDS, *_APPROVAL_KINDS]))
            .order_by(events.c.run_id, events.c.seq)).all()
        trail: list[Trail] = [(r, at, kind, data, (node, -1 if index is None else index))
                              for r, at, kind, data, node, index in rows]
        ledger_hits = int(conn.execute(
            select(func.count()).select_from(events)
            .where(in_scope, events.c.kind == "node_completed",
                   cast(events.c.data, Text).like('%"from"%"ledger"%'))).scalar_one())
        # the row changes only when a call comes: open past its cooldown, it is not open any more (the
        # next call probes); its cooldown is the agent's, not in the row, so the default's is read
        cooling = (breakers.c.opened_at > now - BreakerPolicy().cooldown)
        trips, probing = (int(conn.execute(select(func.count()).select_from(breakers)
                                           .where(breakers.c.state == state, cooling)).scalar_one())
                          for state in ("open", "half_open"))
    resumes = _resumes(trail)
    waits = _approval_waits(trail, now)
    latencies = [_latency(data) for _, _, kind, data, _ in trail
                 if kind == "lease_claimed" and data and '"worker"' in data]
    resumed = [r for r, n in resumes.items() if n]
    resumed_at_rest = [r for r in resumed if status_of.get(r) in _AT_REST]
    completed = sum(1 for r in resumed_at_rest if status_of.get(r) == RunStatus.COMPLETED.value)
    return Stats(
        at=now, since=since, runs_by_state=by_state, runs_without_driver=undriven,
        waiting_human_seconds=_quantiles(waits),
        resumes=sum(resumes.values()), resumed_runs=len(resumed),
        resumed_completed=completed,
        resume_success_rate=completed / len(resumed_at_rest) if resumed_at_rest else None,
        duplicates_prevented=ledger_hits, retries=retries, breaker_trips=trips, breakers_half_open=probing,
        claim_latency_seconds=_quantiles(latencies))


def _resumes(trail: list[Trail]) -> dict[str, int]:
    """Each run's claims after its first by a driver that goes on with it. An operator's claim is
    told by the transition it makes; the claim of the driver an operator's retry starts (``retry``,
    or a worker taking the reopened run) starts the run again, as its first claim did: no resume."""
    claims: dict[str, int] = defaultdict(int)  # run -> its claims (since it was last started)
    resumes: dict[str, int] = defaultdict(int)  # run -> its claims after the first by a driver
    unsure: set[str] = set()  # runs whose last claim is not known yet to be a driver's or an operator's
    for run_id, _, kind, data, _ in trail:
        if kind in _APPROVAL_KINDS:
            continue
        if kind == "lease_claimed":
            if run_id in unsure:  # claimed again before any transition: a driver's (it crashed)
                resumes[run_id] += 1
            claims[run_id] += 1
            if claims[run_id] > 1:
                unsure.add(run_id)
            continue
        if run_id in unsure:  # the claim's first transition says whose it was
            unsure.discard(run_id)
            if not _operators(kind, data):
                resumes[run_id] += 1
        if _retried(kind, data):  # the next claim is the retry's own driver's, as a new run's first
            claims[run_id] = 0
    for run_id in unsure:
        resumes[run_id] += 1
    return resumes


class _Asked:
    """An approval under way: since when, how many approvals settle it, its timeout, approvals so far."""

    def __init__(self, since: float) -> None:
        self.since = since
        self.quorum = 1
        self.timeout_at: float | None = None
        self.approvals = 0  # each from another approver: ``decisions.decide`` refuses one twice

    def ended(self, at: float) -> float:
        """Its length, had it ended at ``at`` undecided: a timeout ended it then (a decision after
        it is refused)."""
        end = at if self.timeout_at is None else min(at, self.timeout_at)
        return max(0.0, end - self.since)


def _approval_waits(trail: list[Trail], now: float) -> list[float]:
    """One wait per approval asked (a step's, an agent's tool call's): from ``approval_requested``
    to the decision that settles it (a rejection, or its quorum of distinct approvers), else its
    timeout, else the run's end (cancelled, failed, rolled back); one under way counts up to now.
    A driver handing the run back and another taking it up (``waiting_human``, ``running``,
    ``waiting_human`` again) is the same wait: the human was asked once."""
    waits: list[float] = []
    asked: dict[str, dict[tuple[str | None, int], _Asked]] = defaultdict(dict)  # run -> approval -> wait
    for run_id, at, kind, data, key in trail:
        if kind in ("approval_requested", "approval_escalated"):  # escalated: the same approval, asked of more
            fields = _fields(data)
            wait = asked[run_id].setdefault(key, _Asked(at))
            quorum, timeout_at = fields.get("quorum"), fields.get("timeout_at")
            wait.quorum = quorum if isinstance(quorum, int) and quorum > 0 else 1
            wait.timeout_at = float(timeout_at) if isinstance(timeout_at, int | float) else None
        elif kind == "decision" and key in asked[run_id]:
            fields, wait = _fields(data), asked[run_id][key]
            wait.approvals += fields.get("verdict") == "approve"  # (a "by" may read "[redacted]")
            if fields.get("verdict") != "approve" or wait.approvals >= wait.quorum:
                waits.append(max(0.0, at - asked[run_id].pop(key).since))
        elif kind in _RUN_ENDS:  # what still waits is closed with the run (or its rollback)
            waits.extend(wait.ended(at) for wait in asked.pop(run_id, {}).values())
    waits.extend(wait.ended(now) for run in asked.values() for wait in run.values())
    return waits


def _retried(kind: str, data: str | None) -> bool:
    """An operator's retry's transition (``runner.reopen``: of the run, or of its compensations)."""
    if kind not in ("run_running", "run_compensating") or not data or "operator retry" not in data:
        return False
    reason = _fields(data).get("reason")
    return isinstance(reason, str) and (reason == "operator retry"
                                        or reason.endswith("operator retry of compensations)")
                                        or reason == "operator retry of compensations")


def _fields(data: str | None) -> dict[str, Any]:
    try:
        value = json.loads(data) if data else None
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _operators(kind: str, data: str | None) -> bool:
    """Whether the first transition after a claim is an operator's act, taken under a lease of its
    own (``raysaga cancel``, ``pause``, ``retry``), not a driver's resume."""
    return kind in ("run_cancelled", "run_paused") or _retried(kind, data)


def _latency(data: str) -> float:
    try:
        value = json.loads(data).get("latency", 0.0)
    except (ValueError, AttributeError):
        return 0.0
    return float(value) if isinstance(value, int | float) else 0.0


def _quantiles(values: list[float]) -> Quantiles:
    if not values:
        return Quantiles()
    ordered = sorted(values)

    def at(q: float) -> float:  # nearest rank: the ceil(q*n)-th value (``int(q*n)`` took the max for n <= 20)
        return round(ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))], 4)

    return Quantiles(count=len(ordered), p50=at(0.5), p95=at(0.95))


#: what a count of the event log's rows covers (a HELP text's end): the runs ``raysaga prune`` left
HELD = ", over the runs the store holds (a gauge: pruning runs lowers it)"


def prometheus(stats: Stats) -> str:
    """The figures in Prometheus' text exposition format (0.0.4): ``raysaga stats --prometheus``,
    and the first part of the dashboard's ``/metrics``."""
    lines: list[str] = []

    def metric(name: str, text: str, samples: list[tuple[str, float | int | None]], kind: str = "gauge") -> None:
        lines.extend([f"# HELP {name} {text}", f"# TYPE {name} {kind}"])
        lines.extend(f"{name}{labels} {value}" for labels, value in samples if value is not None)

    known = [s.value for s in RunStatus]
    states = known + sorted(set(stats.runs_by_state) - set(known))
    metric("raysaga_runs", "Runs in the store by state.",
           [(f'{{status="{label_value(n)}"}}', stats.runs_by_state.get(n, 0)) for n in states])
    metric("raysaga_runs_without_driver", "Runs running or compensating that no driver drives (interrupted, or "
           "their driver died): a resume or a worker takes them up.", [("", stats.runs_without_driver)])
    # quantiles over the runs held, not a summary's: its _count went down with a prune, as a counter would
    for name, q, text, count, counted in (
            ("raysaga_waiting_human_seconds", stats.waiting_human_seconds,
             "How long approvals waited for a human, from asked to decided (ongoing ones up to now)",
             "raysaga_waiting_human_waits", "Approvals asked of a human (waits finished and under way)"),
            ("raysaga_claim_latency_seconds", stats.claim_latency_seconds,
             "From a run becoming runnable to a worker's claim", "raysaga_worker_claims", "Workers' claims of runs")):
        metric(name, f"{text}{HELD}.", [('{quantile="0.5"}', q.p50), ('{quantile="0.95"}', q.p95)])
        metric(count, f"{counted}{HELD}.", [("", q.count)])
    # gauges, not counters: each is a count of rows the store holds, so ``raysaga prune`` lowers it (a
    # counter that went down read as a reset: rate() and increase() counted a prune as new retries)
    metric("raysaga_duplicates_prevented", f"Effects served from the ledger instead of called again{HELD}.",
           [("", stats.duplicates_prevented)])
    metric("raysaga_retries", f"Retries scheduled after a failed attempt{HELD}.", [("", stats.retries)])
    metric("raysaga_breakers_open", "Circuit breakers open now (within their cooldown).", [("", stats.breaker_trips)])
    metric("raysaga_breakers_half_open", "Circuit breakers with a probe call out.", [("", stats.breakers_half_open)])
    metric("raysaga_resumes", f"Claims of a run after its first by a driver going on with it (crash, hand-back, "
           f"wake-up; not an operator's act, nor the drive a retry starts){HELD}.",
           [("", stats.resumes)])
    metric("raysaga_resume_success_ratio", "Of the runs resumed and now at rest, the share that completed.",
           [("", stats.resume_success_rate)])
    return "\n".join(lines) + "\n"


def label_value(value: str) -> str:
    """A Prometheus label value, escaped."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
