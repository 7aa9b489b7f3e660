"""A worker's row in the fleet registry (``raysaga_workers``): it says the worker is alive and what it serves.

The worker registers at its start, beats from the loop its main thread already runs (at most every
``beat_every`` seconds: no thread of its own, none per slot) and records ``stopped_at`` on a clean
exit. The registry is for people: a store that does not answer a beat costs a logged warning
(once per outage), never a claim or the worker's life. ``RAYSAGA_WORKER_BEAT`` (seconds) sets the
interval (tests use a short one); a worker is live while its last beat is at most ``LIVE_BEATS``
intervals old (``worker_rows``).
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable, Mapping
from importlib import metadata

from raysaga.orchestrator import versions
from raysaga.orchestrator.ownership import new_owner
from raysaga.orchestrator.workflow import Workflow
from raysaga.state import Store
from raysaga.state.engine import outage_cause
from raysaga.state.worker_rows import ANY_QUEUE, ServedWorkflow, WorkerRecord

log = logging.getLogger("raysaga.worker")

#: The environment variable that sets the beat interval, in seconds.
BEAT_ENV = "RAYSAGA_WORKER_BEAT"
#: Seconds between beats unless ``RAYSAGA_WORKER_BEAT`` says otherwise.
DEFAULT_BEAT = 5.0


def beat_interval() -> float:
    """``RAYSAGA_WORKER_BEAT`` if it is a number of seconds from 0.05 to 3600, else ``DEFAULT_BEAT``."""
    raw = os.environ.get(BEAT_ENV)
    if raw is None:
        return DEFAULT_BEAT
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0.05 <= value <= 3600.0:
        log.warning("worker: %s=%r is not a number of seconds from 0.05 to 3600: beating every %.0f s",
                    BEAT_ENV, raw[:40], DEFAULT_BEAT)
        return DEFAULT_BEAT
    return value


def _version() -> str:
    try:
        return metadata.version("raysaga")
    except metadata.PackageNotFoundError:
        return "unknown"


class Presence:
    """The worker's row: ``register``, ``beat`` (cheap to call often: it writes once per interval), ``stop``."""

    def __init__(self, store: Store, workflows: Mapping[str, Workflow], slots: int) -> None:
        self.store = store
        self.every = beat_interval()
        self.worker_id = new_owner()  # host:pid:start:boot:pidns:tag, as a driver's lease owner
        self._record = WorkerRecord(
            worker_id=self.worker_id, host=socket.gethostname(), pid=os.getpid(), started_at=time.time(),
            beat_at=time.time(), beat_every=self.every, queues=[ANY_QUEUE],  # its claims take every queue
            workflows=[ServedWorkflow(name=wf.name, version=str(wf.version), definition_hash=wf.definition_hash,
                                      legacy_hash=versions.legacy_hash(wf))  # (its claims take those runs too)
                       for _, wf in sorted(workflows.items())],
            slots=slots, busy=0, raysaga_version=_version())
        self._next = 0.0  # no beat before then
        self._registered = False
        self._failing = False  # a failure was logged: the next success says the registry answers again
        self._stopping = False  # its stop was recorded when it stopped claiming

    def register(self) -> None:
        now = time.time()
        self._next = now + self.every
        self._try(lambda: self.store.worker_register(self._record.model_copy(update={"beat_at": now})), "register")
        self._registered = not self._failing

    def beat(self, busy: int, stopping: bool = False) -> None:
        """Beat if an interval has passed since the last one (or register, when that failed or the row is gone).
        ``stopping``: it claims no more (SIGTERM) while its runs finish: its stop is recorded at once, so
        no ``status`` counts it as serving a run it will never claim."""
        if stopping and not self._stopping:
            self._stopping = True
            self.stop()
        now = time.time()
        if now < self._next:
            return
        self._next = now + self.every
        if not self._registered:
            self.register()
            return

        def write() -> None:
            if not self.store.worker_beat(self.worker_id, now, busy):
                self._registered = False  # deleted meanwhile (by hand): written again at the next beat

        self._try(write, "beat")

    def stop(self) -> None:
        """Record the clean exit (a failure is logged: the row then goes silent, as a killed worker's)."""
        self._try(lambda: self.store.worker_stop(self.worker_id, time.time()), "record its stop")

    def _try(self, write: Callable[[], object], what: str) -> None:
        try:
            write()
        except Exception as exc:  # the registry is for people: never a reason to stop driving runs
            if not self._failing:
                log.warning("worker: could not %s in the worker registry (raysaga workers): %s", what,
                            outage_cause(exc))
            self._failing = True
            return
        if self._failing:
            log.warning("worker: the worker registry answers again")
        self._failing = False
