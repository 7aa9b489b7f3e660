"""What a worker remembers of the runs it could not drive (``raysaga.orchestrator.worker``).

- **Failed drives** (``FailedDrives``): drives of a run that ended in an error, counted in a row
  until the worker parks the run (``MAX_FAILED_DRIVES``). A count is "in a row" only while the
  run made no progress: one an earlier failure left here is started over when another driver
  committed an outcome since (a worker kept it for ever, and parked a run that failed here twice,
  went on elsewhere, and failed here once more).
- **Runs this code's types do not fit** (``Skips.unfit``): a run of the worker's definition whose
  stored outputs do not read as the types its code declares (``DefinitionChangedError``; a deploy
  that changed a parameter's type) was started by other code. The driver let it go with nothing
  written; the worker leaves it to a worker whose code fits: not a failed drive (three parked a
  healthy run ``failed``), and not claimed again (``claims.Served.skip``), said once.
- **Runs of another definition** (``Skips.look``): never claimed (a claim matches the definition
  hash), so they wait for a worker that has their code, and nothing said so (the worker claimed
  0; ``status`` showed the run pending with no live driver). On its idle scan the worker names
  once per definition how many such runs it saw.
- **A suspect's outcome** (``outcome_since``): a suspect run driven alone is proven once its
  driver commits an attempt's outcome, read from its events after its drive began.
- **What it did** (``WorkerCounts``): runs claimed, and how each drive left its run: completed,
  ended otherwise (failed, rolled back, cancelled), resting (waiting, paused), handed back.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from raysaga.errors import CorruptRecordError
from raysaga.orchestrator import tracing, versions
from raysaga.orchestrator.crash_loop import PROGRESS, WINDOW, cut, failing_parking
from raysaga.orchestrator.ownership import new_owner
from raysaga.orchestrator.status_text import flat
from raysaga.orchestrator.workflow import Workflow
from raysaga.state import Batch, RunStatus, RunUpdate, Store
from raysaga.state.claims import Claim, Served
from raysaga.state.models import PRUNABLE, RunSummary
from raysaga.state.redact import scrub_text

__all__ = ["FailedDrives", "Skips", "WorkerCounts", "event_seq", "outcome_since"]

log = logging.getLogger("raysaga.worker")

#: Runs a worker remembers as skipped, or as read on its idle scan (the oldest forgotten first).
KEPT = 10_000
#: Unleased runs of its workflows a worker reads per idle scan to see their definition.
LOOKS_PER_SCAN = 20


@dataclass
class WorkerCounts:
    """What a worker did (for its line at exit and for tests). ``failed``: drives that ended in an
    error (the line's "errors"), not runs that ended ``failed``: those are ``ended``."""

    claimed: int = 0
    completed: int = 0
    ended: int = 0
    """Drives that left the run ended otherwise: failed, compensated, cancelled, compensation_failed."""
    rested: int = 0
    """Drives that left the run at rest, to be taken up again: waiting for a human or a timer, paused."""
    handed_back: int = 0
    failed: int = 0
    by_reason: dict[str, int] = field(default_factory=dict)

    def drove(self, status: RunStatus) -> None:
        """Count a drive that returned with the run ``status`` (a failed or rolled-back run was counted
        "resting", as if a worker would take it up again)."""
        if status == RunStatus.COMPLETED:
            self.completed += 1
        elif status in PRUNABLE:  # ended: terminal or parked for an operator
            self.ended += 1
        else:
            self.rested += 1


def event_seq(store: Store, run_id: str) -> int:
    """The run's newest event's seq; -1 when it cannot be read (then no progress is seen after it)."""
    try:
        return store.get_run(run_id, lenient=True).event_seq
    except Exception:  # (unreadable, or the store is down: what reads it next says so)
        return -1


def outcome_since(store: Store, run_id: str, seq: int) -> bool:
    """Whether an attempt's outcome (``crash_loop.PROGRESS``) was committed after event ``seq``.

    What tells a worker that its suspect run, driven alone, proved it does not kill its process at
    once: its driver's own outcomes, not the counts of a progress display, which a resumed run
    settles from its restored rows (they moved at its first commit, a step's ``running`` row)."""
    if seq < 0:
        return False
    try:
        return any(e.kind in PROGRESS for e in store.events(run_id, after_seq=seq, limit=WINDOW))
    except Exception:
        return False


@dataclass
class _Failed:
    count: int
    seq: int  # the run's event_seq at the last failure: progress after it starts the count over


class FailedDrives:
    """Per run, its drives in a row on this worker that ended in an error (see the module doc)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._runs: dict[str, _Failed] = {}
        self._lock = threading.Lock()  # (the worker's slots share it)

    def failed(self, run_id: str) -> int:
        """Count a failed drive of the run; returns its failures in a row (this one included).
        Failed drives write a claim or two each, no outcome: progress after the last is another's."""
        seq = event_seq(self.store, run_id)
        with self._lock:
            before = self._runs.pop(run_id, None)
        count = 1 if before is None or outcome_since(self.store, run_id, before.seq) else before.count + 1
        with self._lock:
            self._runs[run_id] = _Failed(count, seq)
            while len(self._runs) > KEPT:
                self._runs.pop(next(iter(self._runs)))
        return count

    def park(self, claimed: Claim, failures: int, exc: Exception, ttl: float) -> None:
        """Park the run ``failed`` (``crash_loop.failing_parking``) under a lease of its own, unless
        another driver has it now, or it ended or was parked meanwhile."""
        run_id = claimed.lease.run_id
        first_line = scrub_text((str(exc).splitlines() or [""])[0])  # (cut by failing_parking, advice kept)
        try:
            lease = self.store.claim(run_id, new_owner(), ttl)
        except Exception as why:  # another driver has it now (it is driven), or the store is down
            log.warning("worker: run %s: not parked after %d failed drives: %s", run_id, failures, why)
            return
        try:
            try:
                status = self.store.get_run(run_id, lenient=True).status
            except CorruptRecordError:  # no driver can read it (why it failed): as it was claimed
                if claimed.status is None:
                    raise
                status = claimed.status
            if status in PRUNABLE:  # ended or parked meanwhile: nothing to park
                return
            try:  # its rows in flight are settled with the park (none left ``running`` on a parked run)
                nodes = self.store.nodes(run_id)
            except CorruptRecordError:
                nodes = []
            resume_first, batch = failing_parking(status, failures, f"{type(exc).__name__}: {first_line}", run_id,
                                                  nodes=nodes)
            # no driver, so no tracer: the park's ``run`` span (its trace's root) is written here
            commit = tracing.traced(self.store, run_id, lease.owner, lambda b: self.store.commit(lease, b))
            if resume_first:
                commit(Batch(run=RunUpdate(status=RunStatus.RUNNING, status_reason="resumed")))
            commit(batch)
            log.error("worker: run %s parked: %s", run_id,
                      flat(batch.run.status_reason or "") if batch.run else "failed")  # one line: an error's newlines
            self.forget(run_id)
        except Exception:
            log.exception("worker: run %s: parking it failed", run_id)
        finally:
            with contextlib.suppress(Exception):
                self.store.release(lease)

    def forget(self, run_id: str) -> None:
        """The run was driven (or parked): its count is over."""
        with self._lock:
            self._runs.pop(run_id, None)


#: How long a worker leaves alone a run its code's types do not fit before it looks again.
UNFIT_RECHECK_S = 30.0


class Skips:
    """Runs a worker does not claim, and definitions it does not have, each said once."""

    def __init__(self, workflows: Mapping[str, Workflow]) -> None:
        self.workflows = workflows
        self._unfit: dict[str, tuple[str, float]] = {}  # run id -> its workflow's name, skipped until when
        self._said: dict[str, None] = {}  # runs whose skip was logged (once)
        self._read: dict[str, None] = {}  # runs read on an idle scan (whatever they were)
        self._foreign: dict[tuple[str, str], tuple[str, set[str]]] = {}  # (workflow, hash) -> version, runs
        self._told: set[tuple[str, str]] = set()
        self._lock = threading.Lock()  # (the worker's slots share them)
        self._looking = threading.Lock()  # one idle scan's reads at a time

    def served(self, hashes: Mapping[str, tuple[str, str]]) -> dict[str, str | tuple[str, str]]:
        """What ``Store.claim_next`` is given: each workflow's digests, less the runs skipped."""
        skipped: dict[str, list[str]] = {}
        now = time.monotonic()
        with self._lock:
            for run_id in [r for r, (_, until) in self._unfit.items() if until <= now]:
                del self._unfit[run_id]  # looked at again: its next steps may fit this code now
            for run_id, (name, _) in self._unfit.items():
                skipped.setdefault(name, []).append(run_id)
        return {name: Served(*digests, skip=skipped[name]) if name in skipped else digests
                for name, digests in hashes.items()}

    def skipped(self, run_id: str) -> bool:
        with self._lock:
            entry = self._unfit.get(run_id)
            return entry is not None and entry[1] > time.monotonic()

    def unfit(self, run_id: str, workflow: str, exc: Exception,
              why: str = "left for a worker with the code it started with") -> None:
        """This code's types do not fit what the run stored (or, ``why`` says, this process lacks a
        secret of its input): leave it for a worker that can drive it, for ``UNFIT_RECHECK_S``, then
        look again (a rolling deploy: once the old code ran the steps this code cannot read, the rest
        may fit; a secret exported meanwhile; a skip for the process's life left the run alone)."""
        with self._lock:
            new = run_id not in self._said
            self._said[run_id] = None
            self._unfit[run_id] = (workflow, time.monotonic() + UNFIT_RECHECK_S)
            for kept in (self._unfit, self._said):
                while len(kept) > KEPT:
                    kept.pop(next(iter(kept)))
        if new:
            first = scrub_text((str(exc).splitlines() or [""])[0])
            log.warning("worker: run %s is %s (looked at again in %.0fs): %s", run_id, why, UNFIT_RECHECK_S,
                        cut(first, 600 if why.startswith("left for a worker with the code") else 2000))

    def look(self, store: Store, rows: Iterable[RunSummary], now: float | None = None) -> None:
        """Of the unleased runs of this worker's workflows in ``rows`` (what its idle scan listed:
        runs it would have claimed had it their definition), read a few not read yet, and say once
        per definition it does not have how many runs of it wait (once all listed are read)."""
        if not self._looking.acquire(blocking=False):
            return  # another slot's scan reads them
        try:
            self._look(store, rows, time.time() if now is None else now)
        finally:
            self._looking.release()

    def _look(self, store: Store, rows: Iterable[RunSummary], now: float) -> None:
        reads = 0
        for row in rows:
            if (row.run_id in self._read or row.corrupt or row.workflow_name not in self.workflows
                    or (row.lease_owner is not None and (row.lease_expires_at or 0.0) >= now)
                    or row.status not in (RunStatus.PENDING, RunStatus.RUNNING, RunStatus.COMPENSATING)):
                continue
            if reads >= LOOKS_PER_SCAN:
                return  # the rest at the next scans: the count is told once it is whole
            reads += 1
            self._read[row.run_id] = None
            if len(self._read) > KEPT:
                self._read.pop(next(iter(self._read)))
            try:
                run = store.get_run(row.run_id, lenient=True)
            except Exception:  # (unreadable: ``status`` says why; not this note's business)
                continue
            key = (run.workflow_name, run.definition_hash)
            if key not in self._told and not versions.definition_known(run, self.workflows[row.workflow_name]):
                self._foreign.setdefault(key, (run.workflow_version, set()))[1].add(run.run_id)
        for (name, digest), (version, seen) in list(self._foreign.items()):
            self._told.add((name, digest))
            del self._foreign[(name, digest)]
            wf = self.workflows[name]
            log.warning("worker: %d run(s) of workflow %r (e.g. %s) were started by another definition (version "
                        "%r, hash %s), which this worker does not have (it has version %r, hash %s): they wait "
                        "for a worker with that code; keep one up until they end (docs/fork.md)", len(seen), name,
                        min(seen), version, digest[:12], wf.version, wf.definition_hash[:12])
