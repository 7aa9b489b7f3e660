"""Keeps a driver's lease alive and brings operator signals to it, off the hot path."""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from raysaga.errors import LeaseLostError
from raysaga.state import Lease, SignalRecord, Store
from raysaga.state.engine import outage_cause

if TYPE_CHECKING:
    from raysaga.orchestrator.executor_base import Executor

log = logging.getLogger("raysaga.driver")


class Heartbeat:
    """A daemon thread: renew the lease every ``period`` s and poll signals.

    If a renewal finds the fence moved, ``lost`` is set and the driver stops before its next
    call. The main thread also renews synchronously when its local view of the lease is
    about to expire (a process stopped for longer than the TTL wakes up to a stale lease).
    """

    def __init__(self, store: Store, lease: Lease, period: float, executor: Executor | None = None) -> None:
        self._store = store
        self.lease = lease
        self._period = period
        self._stop = threading.Event()
        self.lost = threading.Event()
        self.signals: list[SignalRecord] = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name=f"raysaga-heartbeat-{lease.run_id}", daemon=True)
        if executor is not None:  # an inline round starts nothing more once a cancel or pause is seen
            executor.hold_new(lease.run_id, self.stop_asked)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def renew(self) -> Lease:
        with self._lock:
            try:
                self.lease = self._store.renew(self.lease)
            except LeaseLostError:
                self.lost.set()
                raise
            return self.lease

    def _run(self) -> None:
        while not self._stop.wait(self._period):
            try:
                self.renew()
                signals = self._store.pending_signals(self.lease.run_id)
                with self._lock:
                    self.signals = signals
            except LeaseLostError:
                log.warning("run %s: lease lost; this driver stops", self.lease.run_id)
                return
            except Exception as exc:  # a database hiccup: try again next beat
                log.warning("run %s: heartbeat failed: %s", self.lease.run_id, outage_cause(exc))

    def waiting(self, *kinds: str) -> bool:
        """Whether a signal of one of ``kinds`` was seen and not yet taken (a cancel or a pause:
        start nothing new before obeying it)."""
        with self._lock:
            return any(s.kind in kinds for s in self.signals)

    def stop_asked(self) -> bool:
        """``waiting("cancel", "pause")`` without the lock, asked before each inline attempt: a
        renewal holds the lock over a store round trip, and the list is only ever replaced whole
        by another thread (extended in place by the driver's own, before its loop)."""
        return any(s.kind in ("cancel", "pause") for s in self.signals)

    def poll_decisions(self, handled: set[int], obeys: bool = False) -> bool:
        """Poll the signals now (its driver is about to let the run rest): whether a decision it has
        not handled came since the last beat. The run would rest with it, due at once, for a worker
        or a resume to take up; ``raysaga run`` returned ``waiting_human`` on an approved run.
        ``obeys`` (the forward phase, where its loop obeys them): a cancel or a pause too; the run
        rested with it unread and not due, and the cancel an operator sent was never carried out."""
        try:
            signals = self._store.pending_signals(self.lease.run_id)
        except Exception as exc:  # a database hiccup: rest as without this look (a worker takes it up)
            log.warning("run %s: could not look for decisions before resting: %s", self.lease.run_id,
                        outage_cause(exc))
            return False
        with self._lock:
            self.signals = signals
        kinds = ("approve", "reject", "cancel", "pause") if obeys else ("approve", "reject")
        return any(s.kind in kinds and s.id not in handled for s in signals)

    def take_signals(self) -> list[SignalRecord]:
        with self._lock:
            signals, self.signals = self.signals, []
            return signals
