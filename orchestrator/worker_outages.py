"""A worker's run through an outage of its store (``raysaga.orchestrator.worker``): when the store
drops out under a driver (a server restart, a lost connection), its slot waits until the store
answers and takes the run's lease up again, so the run goes on from what is durable without
waiting for its lease to expire, and its next claim is not counted as a driver's death
(``raysaga.orchestrator.crash_loop``). Kept apart from the worker's claiming and turns."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable

from raysaga.errors import DriverInterrupted, LeaseHeldError, LeaseLostError
from raysaga.state import Lease, Store
from raysaga.state.engine import is_outage

__all__ = ["lease_after_outage"]


def lease_after_outage(store: Store, lease: Lease, ttl: float, stop: threading.Event,
                       stopped_by: Callable[[], str]) -> Lease:
    """Wait until the store answers, then take the run's lease up again (the store may drop out
    again meanwhile: then wait again, longer: a standby answers reads but refuses the lease).
    ``DriverInterrupted`` (named ``stopped_by()``) when the worker stops meanwhile: its lease expires."""
    delay = 0.05
    while True:
        delay = _wait_for_store(store, lease.run_id, stop, delay)
        if stop.is_set():  # the worker stops during the outage: the run's lease expires
            raise DriverInterrupted(lease.run_id, stopped_by())
        try:
            return _lease_again(store, lease, ttl)
        except Exception as exc:
            if not is_outage(exc):
                raise


def _lease_again(store: Store, lease: Lease, ttl: float) -> Lease:
    """The run's lease after an outage: still ours (renewed), or claimed again when the failed
    driver managed to release it; ``LeaseLostError`` when another worker has the run now."""
    try:
        return store.renew(lease)
    except LeaseLostError:
        pass
    try:
        return store.claim(lease.run_id, lease.owner, ttl)
    except LeaseHeldError:
        raise LeaseLostError(f"run {lease.run_id!r}: another driver took it up during the outage") from None


def _wait_for_store(store: Store, run_id: str, stop: threading.Event, delay: float = 0.05) -> float:
    """Poll the store (jittered, from ``delay`` to 2 s apart) until it answers, or the worker
    stops; the delay to wait after a next outage."""
    while not stop.wait(delay * (0.5 + random.random())):
        delay = min(2.0, delay * 2)
        try:
            store.get_run(run_id)
            break
        except Exception as exc:  # still down: wait longer
            if not is_outage(exc):
                raise
    return delay
