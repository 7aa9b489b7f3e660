"""Circuit breaker state transitions (pure); the state itself is a store row shared by the fleet.

closed → open after ``threshold`` consecutive failures → half-open once ``cooldown`` has
passed (one probe call goes through) → closed on its success, open again on its failure.
Kept in the store rather than a Ray actor so every driver on the store, on any cluster, and
any driver started after a crash, sees the same state. The rule lives here, beside the row,
because the store applies it: a call's outcome is counted in the driver's fenced batch
(``Batch.breakers``), under the row's lock, by ``after_call``.
"""

from __future__ import annotations

from dataclasses import dataclass

from raysaga.state.models import BreakerRecord, BreakerState


@dataclass(frozen=True)
class BreakerPolicy:
    threshold: int = 5
    cooldown: float = 30.0


def admit(record: BreakerRecord, now: float, policy: BreakerPolicy) -> tuple[bool, float, BreakerRecord | None]:
    """May a call go through now? Returns (allowed, seconds until it may, the state to store if it changes)."""
    if record.state == BreakerState.CLOSED:
        return True, 0.0, None
    opened = record.opened_at or now
    if record.state == BreakerState.OPEN:
        wait = opened + policy.cooldown - now
        if wait > 0:
            return False, wait, None
        # this caller is the probe; opened_at now dates the probe (see below)
        return True, 0.0, record.model_copy(update={"state": BreakerState.HALF_OPEN, "opened_at": now})
    # half-open: a probe is out; others wait for its verdict. A probe whose verdict never comes
    # (its driver died mid-call, its run was cancelled or paused) held the breaker half-open
    # forever, for the whole fleet: after another cooldown the next caller probes instead.
    if now - opened >= policy.cooldown:
        return True, 0.0, record.model_copy(update={"opened_at": now})
    return False, max(1.0, policy.cooldown / 10), None


def after_call(record: BreakerRecord, ok: bool | None, now: float, policy: BreakerPolicy) -> BreakerRecord:
    """The breaker's state once a call through it succeeded (``ok``) or failed at ``now``.

    ``ok=None``: the call failed in a way that says nothing of the dependency's health (a 404, a
    bad input: a permanent error). No verdict: a half-open breaker frees its probe's place at once,
    so the next caller probes instead of waiting out the stale-probe cooldown; otherwise nothing changes.
    """
    if ok is None:
        if record.state == BreakerState.HALF_OPEN:
            return record.model_copy(update={"opened_at": now - policy.cooldown})
        return record
    if ok:
        return record.model_copy(update={"state": BreakerState.CLOSED, "failures": 0, "opened_at": None})
    failures = record.failures + 1
    if record.state == BreakerState.HALF_OPEN or failures >= policy.threshold:
        return record.model_copy(update={"state": BreakerState.OPEN, "failures": failures, "opened_at": now})
    return record.model_copy(update={"failures": failures})
