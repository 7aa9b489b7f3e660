"""A worker: a long-running process that claims runnable runs and drives them (``raysaga worker``).

It drives only the workflows it was given (matched on name and definition hash: it never imports
a module named by the database), at most ``concurrency`` runs at once, each by a ``Driver`` in a
slot thread with its own executor. A slot claims through ``Store.claim_next`` (new submitted
runs, runs whose driver died or handed them back, resting runs that are due: a timer, a
decision, an unpause, an approval's timeout) and the claim's fence guards every later write, so
several workers on one store never drive one run at once.

A run whose driver died on this host (a SIGKILLed ``raysaga run``, an OOM-killed worker) is taken
over at once, without waiting for its lease to expire: when a slot finds nothing to claim, the
worker looks (at most once per ``poll``) at the active runs of its workflows (and the pending
ones: a driver may die between its claim and the run's first commit) whose lease owner is
provably gone (``ownership.owner_is_gone``: same host, boot and pid namespace, process dead) and
claims one from that owner (``ownership.claim``; the claim names it ``abandoned_by``, so a crash
loop is still counted). An owner on another host cannot be proven gone from here: its runs wait
for their lease to expire, as before.

A run whose last driver died (its claim took the lease of a dead owner: ``Claim.abandoned_by``) is a
suspect of a crash loop, and so is one taken from a driver alive but silent past its lease
(``Claim.taken_from_live``: a step holding the GIL froze that driver's whole process). The worker
drives a suspect alone: it claims nothing else meanwhile, asks its other drivers to hand their runs
back at their next step boundary, and starts the suspect once no other run is driven in the
process; it is no longer alone once its driver commits an attempt's outcome of its own
(``worker_runs.outcome_since``: it proved it does not kill or freeze its process right away) or its
drive ends. A process killed by one step would otherwise count a death for every run it drove, and
one frozen by a step would have every run it drove taken over live, again wherever the step went:
either way a healthy neighbour was parked beside the culprit (``raysaga.orchestrator.crash_loop``). Claims
are made one at a time in a process, and a suspect is counted as waiting for its turn as it is
claimed: two slots claiming at once took a second suspect (or a plain run) into a process the
first was about to freeze. This holds on Ray too: workflow code still runs in the driver's process
there (a prompt builder, a ``local=True`` step).

A run this code cannot drive is left for a worker that can (``worker_runs.Skips``): one whose
stored outputs do not read as this code's types is let go and not claimed again; runs of a
definition the worker does not have are named once in its log.

``stop()`` (the CLI calls it on SIGTERM or Ctrl-C) stops claiming and asks each driver to stop
at its next step boundary: it commits what finished, releases the lease and the run is free for
another worker at once. A SIGKILLed worker's runs are taken over when their leases expire.
Its row in the worker registry (``worker_presence``: ``raysaga workers``) says it is alive and what it serves.
"""

from __future__ import annotations

import contextlib
import logging
import random
import re
import signal
import threading
import time
from collections.abc import Mapping, Sequence

from raysaga.errors import (
    DefinitionChangedError,
    DriverInterrupted,
    LeaseHeldError,
    LeaseLostError,
    RaySagaError,
    SecretUnavailableError,
    UserError,
)
from raysaga.orchestrator import versions
from raysaga.orchestrator.crash_loop import ALONE, WAITS
from raysaga.orchestrator.driver import Driver
from raysaga.orchestrator.executor import Executor, make_executor
from raysaga.orchestrator.options import RunOptions
from raysaga.orchestrator.ownership import claim, new_owner, owner_is_gone
from raysaga.orchestrator.resumable import check_run_secrets
from raysaga.orchestrator.stop_signals import sigint_kept_ignored
from raysaga.orchestrator.worker_checks import (  # (re-exported: the CLI and tests import them from here)
    checked_concurrency,
    checked_executor,
    checked_limits,
    checked_max_driver_deaths,
    checked_poll,
)
from raysaga.orchestrator.worker_outages import lease_after_outage
from raysaga.orchestrator.worker_presence import Presence
from raysaga.orchestrator.worker_runs import FailedDrives, Skips, WorkerCounts, event_seq, outcome_since
from raysaga.orchestrator.workflow import Workflow
from raysaga.state import Batch, Lease, NewEvent, RunRecord, RunStatus, Store
from raysaga.state.claims import Claim
from raysaga.state.engine import is_outage, outage_cause
from raysaga.state.pool_fit import fit_pool
from raysaga.state.redact import scrub_text

__all__ = ["HAND_BACK", "MAX_FAILED_DRIVES", "ORPHAN_SCAN", "Worker", "WorkerCounts", "checked_concurrency",
           "checked_limits", "checked_max_driver_deaths"]

_VARYING = re.compile(r"\d+|'[^']*'")  # what differs between two claim errors of one kind (an id, a value)

log = logging.getLogger("raysaga.worker")

#: Active and pending runs (per state, newest first) a worker looks at for a driver gone on this host.
ORPHAN_SCAN = 500
#: Drives of one run in a row that end in an error (not an outage of the store, a lost lease or a
#: stop) before the worker parks the run ``failed``: the driver releases the run as it fails, so
#: without a limit the slot claimed it again at once, hundreds of times a second, for ever.
MAX_FAILED_DRIVES = 3
#: What a driver is interrupted with when its worker hands its run back to drive a suspect run
#: alone (the ``driver_interrupted`` event's ``signal``).
HAND_BACK = "hand-back"


class Worker:
    def __init__(self, workflows: Sequence[Workflow], store: Store, *, concurrency: int = 4, executor: str = "ray",
                 address: str | None = None, options: RunOptions | None = None, poll: float = 0.5,
                 limits: Mapping[str, int] | None = None) -> None:
        if not workflows:
            raise UserError("a worker drives registered workflows only: give at least one --workflow MODULE:WF")
        by_name: dict[str, Workflow] = {}
        for wf in workflows:
            if not isinstance(wf, Workflow):  # a name or a module: wf.validate() raised AttributeError
                raise UserError(f"a worker drives Workflow objects, got {wf!r}: pass the workflows themselves")
            wf.validate()
            if wf.name in by_name and by_name[wf.name].definition_hash != wf.definition_hash:
                raise UserError(f"two definitions of workflow {wf.name!r} were given: register one per worker")
            by_name[wf.name] = wf
        limits = checked_limits(limits)
        unknown = sorted(set(limits) - set(by_name))
        if unknown:
            raise UserError(f"--limit names {', '.join(unknown)}, which this worker does not drive "
                            f"(it drives {', '.join(sorted(by_name))})")
        concurrency = checked_concurrency(concurrency)
        # per slot a driver's connection and its heartbeat's, and 2 for claims and looks: a pool of
        # SQLAlchemy's 5 (+10) made drives wait 30 s for one under load, and fail
        fit_pool(getattr(store, "engine", None), 2 * concurrency + 2)
        self.workflows = by_name
        # its own definitions, and runs an earlier raysaga recorded of this code (``versions.legacy_hash``)
        self.hashes = {name: (wf.definition_hash, versions.legacy_hash(wf)) for name, wf in by_name.items()}
        self.store = store
        self.concurrency = concurrency
        self.executor_kind = checked_executor(executor)
        self.address = address
        self.options = options or RunOptions()
        self.poll = checked_poll(poll)
        self.limits = dict(limits or {})
        self.counts = WorkerCounts()
        self._stop = threading.Event()
        self._stop_name = "SIGTERM"
        self._lock = threading.Lock()
        self._drivers: set[Driver] = set()
        self._primary: Executor | None = None
        self._next_scan = 0.0  # no look for runs of dead drivers before then (one look per poll)
        self._failed_drives = FailedDrives(store)  # per run, its drives in a row that ended in an error
        self.skips = Skips(by_name)  # runs this code's types do not fit; definitions this worker does not have
        # A suspect run (its last driver died) is driven alone: see the module doc
        self._turns = threading.Condition(self._lock)
        self._running = 0  # drives in progress in this process
        self._alone: str | None = None  # the suspect run driven alone, until its first outcome
        self._queued = 0  # suspects claimed, waiting for their turn to be driven alone
        self._claiming = threading.Lock()  # one claim at a time: see ``_reserve``
        self.failure: Exception | None = None  # what killed a slot: the worker stops, and ``run`` raises it
        self._claim_errors: set[str] = set()  # causes of unexpected claim errors logged in full: once each
        self.presence = Presence(store, by_name, concurrency)  # its row in raysaga_workers (raysaga workers)

    def start_engine(self) -> None:
        """Start (or join) Ray once, in this thread, before the slots run. Ray installs signal
        handlers of its own as it starts: a caller that handles SIGTERM installs its handler after."""
        if self.executor_kind == "ray" and self._primary is None:
            self._primary = make_executor("ray", self.address)

    def run(self) -> WorkerCounts:
        """Claim and drive until ``stop()``; returns what was done. A process that was started
        with SIGINT ignored (a background job: ``nohup raysaga worker &``) keeps it ignored meanwhile,
        whatever handler was installed for it since (``stop_signals.sigint_kept_ignored``): a Ctrl-C
        meant for the foreground job does not stop it. SIGTERM does."""
        self.start_engine()
        self.presence.register()
        slots = [threading.Thread(target=self._slot, name=f"raysaga-worker-{i}", daemon=True)
                 for i in range(self.concurrency)]
        try:
            with sigint_kept_ignored():
                for slot in slots:
                    slot.start()
                for slot in slots:
                    while slot.is_alive():
                        slot.join(timeout=min(0.5, self.presence.every))  # (lets signal handlers run)
                        self.presence.beat(self._running, stopping=self._stop.is_set())  # never raises
        finally:
            self.presence.stop()
            if self._primary is not None:
                self._primary.shutdown()
                self._primary = None
        if self.failure is not None:
            raise self.failure
        return self.counts

    def stop(self, name: str = "SIGTERM") -> None:
        """Stop claiming; each driver stops at its next boundary and hands its run back."""
        self._stop_name = name
        self._stop.set()
        with self._lock:
            for driver in self._drivers:
                driver.interrupt(name)
            self._turns.notify_all()  # a suspect waiting for its turn hands its run back

    # ------------------------------------------------------------------ a slot

    def _slot(self) -> None:
        # SIGTERM and SIGINT go to the main thread, whose wait they interrupt: delivered to a slot's
        # thread, they waited for its next 0.5 s join, and a step finishing meanwhile ran the run on
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        executor: Executor | None = None
        rng = random.Random()
        down_since: float | None = None  # the store stopped answering this slot's claims then
        unanswered: str | None = None  # the owner of a claim that raised: it may have committed
        try:
            executor = make_executor(self.executor_kind, self.address)  # before any claim: a run is never
            while not self._stop.is_set():  # left leased to a slot that cannot drive it
                if not self._may_claim():
                    continue
                owner = unanswered or new_owner()
                try:
                    with self._claiming:  # (checked again: another slot's claim may have taken a suspect)
                        if self._stop.is_set() or not self._may_claim(wait=False):
                            continue
                        claim = self._claim(owner, answered=unanswered is None)
                        self._reserve(claim)
                    unanswered = None
                    if down_since is not None:
                        log.warning("worker: the store answers again (after %.1f s)", time.time() - down_since)
                        down_since = None
                except Exception as exc:  # a slot never dies: it tries again after a pause
                    if not (is_outage(exc) or isinstance(exc, RaySagaError)):
                        self._claim_error(exc)
                    elif down_since is None:  # unreachable for a moment (a restart): said once, not per poll
                        down_since = time.time()
                        log.warning("worker: claim failed: %s", outage_cause(exc))
                    unanswered = owner  # the next try looks for what this one may have claimed
                    claim = None
                if claim is None:
                    self._stop.wait(self.poll * (0.5 + rng.random()))  # jittered: slots do not poll in step
                    continue
                if not self._drive(claim, executor):
                    self._stop.wait(self.poll * (0.5 + rng.random()))  # failed: not claimed again at once
        except Exception as exc:  # a slot that dies stops the worker, which fails with why (never a quiet exit 0)
            log.error("worker: a slot failed, stopping: %s", scrub_text(str(exc).splitlines()[0] if str(exc) else
                                                                        type(exc).__name__))
            with self._lock:
                self.failure = self.failure or exc
            self.stop("worker-failed")
        finally:
            if executor is not None:
                executor.shutdown()

    def _claim_error(self, exc: Exception) -> None:
        """Log an unexpected claim error with its traceback once per cause (every slot met it at every
        poll: thousands of lines a second), then on one line at debug level."""
        said = str(getattr(exc, "orig", None) or exc).strip().split("\n")[0]  # not where in which statement
        kind = getattr(getattr(exc, "orig", None), "sqlstate", None) or _VARYING.sub("#", said)  # not its numbers
        cause = f"{type(exc).__name__}: {scrub_text(str(kind))[:200]}"
        with self._lock:
            first = cause not in self._claim_errors and len(self._claim_errors) < 100  # (bounded)
            if first:
                self._claim_errors.add(cause)
        if first:
            log.exception("worker: claim failed (said once per cause; it is tried again every poll)")
        else:
            log.debug("worker: claim failed: %s", cause)

    def _claim(self, owner: str, *, answered: bool) -> Claim | None:
        """The next run to drive, under ``owner``; after a claim under it that raised (not ``answered``),
        first the run that claim took if it committed before its answer was lost (``Store.claim_of``)."""
        ttl = self.options.lease_ttl
        if not answered and (found := self.store.claim_of(owner, ttl)) is not None:
            log.warning("worker: run %s was claimed though the answer was lost: driving it", found.lease.run_id)
            return found
        return (self.store.claim_next(owner, ttl, self.skips.served(self.hashes), limits=self.limits)
                or self.claim_orphan(owner))

    def _may_claim(self, *, wait: bool = True) -> bool:
        """Whether a slot may claim a run now: not while a suspect waits for its turn or is driven
        alone (then False, after waiting up to ``poll`` for that to change if ``wait``)."""
        with self._turns:
            if self._alone is None and self._queued == 0:
                return True
            if wait:
                self._turns.wait(self.poll)
            return False

    def _reserve(self, claim: Claim | None) -> None:
        """Count the claimed run in, under ``_claiming``: a suspect as waiting for its turn alone
        (no slot claims again until it is proven), any other as driven (a suspect claimed next
        waits for it). Counted only as its slot began to drive it, a run another slot claimed at the
        same moment went into the process beside a suspect starting alone."""
        if claim is None:
            return
        with self._lock:
            if suspect_of(claim):
                self._queued += 1
            else:
                self._running += 1

    def claim_orphan(self, owner: str | None = None) -> Claim | None:
        """A run of ours whose driver is provably gone (see the module doc), its lease taken from
        that driver under ``owner`` (the slot's: a take-over whose answer is lost is found again
        by ``_claim``); None when there is none, or another slot looked less than ``poll`` ago."""
        now = time.time()
        with self._lock:
            if now < self._next_scan:
                return None
            self._next_scan = now + self.poll
        listed = []
        for status in (RunStatus.RUNNING, RunStatus.COMPENSATING, RunStatus.PENDING):
            listed += (rows := self.store.list_runs(status, ORPHAN_SCAN))
            for row in rows:
                if (row.corrupt or row.workflow_name not in self.workflows or row.lease_owner is None
                        or (row.lease_expires_at or 0.0) < now  # expired: claim_next takes it
                        or self.skips.skipped(row.run_id) or not owner_is_gone(row.lease_owner)):
                    continue
                if not versions.definition_known(self.store.get_run(row.run_id, lenient=True),
                                                 self.workflows[row.workflow_name]):
                    continue  # another definition: a worker that registered that one drives it
                try:
                    lease, _ = claim(self.store, row.run_id, owner or new_owner(), self.options.lease_ttl)
                except LeaseHeldError:  # another worker took it first, or a resume did
                    continue
                return Claim(lease=lease, workflow=row.workflow_name, reason="takeover",
                             latency=max(0.0, time.time() - row.updated_at), status=row.status,
                             abandoned_by=row.lease_owner)
        self.skips.look(self.store, listed, now)  # runs no claim takes: another definition's, said once
        return None

    def _drive(self, claim: Claim, executor: Executor) -> bool:
        """Drive a claimed run; False when the drive ended in an error (the slot pauses then)."""
        lease, workflow, reason = claim.lease, claim.workflow, claim.reason
        with self._lock:
            self.counts.claimed += 1
            self.counts.by_reason[reason] = self.counts.by_reason.get(reason, 0) + 1
        # a suspect is driven alone on Ray too: workflow code still runs in this process there (a
        # prompt builder, reading a large output), and its neighbours would count every death it caused
        alone = bool(suspect_of(claim))
        driving = not alone  # (a plain run was counted driven as it was claimed: ``_reserve``)
        try:
            if alone:
                lease = self._turn_alone(claim)
                driving = True
            record = self._drive_through_outages(lease, workflow, executor, alone=alone)
            with self._lock:
                self.counts.drove(record.status)
            log.info("worker: run %s (%s) is %s", lease.run_id, reason, record.status.value)
        except DriverInterrupted as exc:
            with self._lock:
                self.counts.handed_back += 1
            log.info("worker: run %s handed back (%s)", lease.run_id, exc.signal_name)
        except LeaseLostError as exc:
            log.warning("worker: run %s: %s", lease.run_id, exc)
        except DefinitionChangedError as exc:  # started by other code (the driver let it go, writing nothing)
            self.skips.unfit(lease.run_id, workflow, exc)  # left for a worker with that code: not a failure
        except SecretUnavailableError as exc:  # let go, writing nothing: ``_check_secrets``
            self.skips.unfit(lease.run_id, workflow, exc, "left for a worker that has its secrets: export the variable")
        except Exception as exc:
            if isinstance(exc, RaySagaError):
                log.error("worker: run %s: %s", lease.run_id, exc)
            else:
                log.exception("worker: run %s: unexpected error", lease.run_id)
            self._drive_failed(claim, exc)
            return False
        finally:
            if driving:
                self._proven(lease.run_id)
                with self._lock:
                    self._running -= 1
                    self._turns.notify_all()
        with self._lock:
            self._failed_drives.forget(lease.run_id)
        return True

    def _turn_alone(self, claim: Claim) -> Lease:
        """Wait until no other run is driven in this process, then make the claimed (suspect) run
        the one driven alone; its lease, renewed meanwhile. While it waits (counted in ``_queued``
        by ``_reserve`` as it was claimed) the worker claims nothing and its other drivers are asked
        to hand their runs back at their next boundary; the run's events say it waited (``WAITS``: a
        death meanwhile is not its own) and when it starts (``ALONE``), each naming the owner it was
        taken from (``suspect_of``). ``DriverInterrupted``, the lease released, when the worker stops first."""
        lease, run_id, since, taken = claim.lease, claim.lease.run_id, time.time(), suspect_of(claim)
        waits = False
        try:
            while True:
                with self._lock:
                    if self._stop.is_set():
                        break
                    if self._running == 0 and self._alone is None:
                        self._alone, self._running = run_id, self._running + 1
                        break
                    others = [d for d in self._drivers if d.run_id != self._alone]
                if not waits:
                    self.store.commit(lease, Batch(events=[NewEvent(kind=WAITS, data={
                        **taken, "driving": sorted(d.run_id for d in others)[:20]})]))
                    waits = True
                for driver in others:  # proven or plain runs: another worker (or this one, later) goes on
                    driver.interrupt(HAND_BACK)
                with self._lock:
                    if not self._stop.is_set() and (self._running or self._alone is not None):
                        self._turns.wait(lease.ttl / 3)
                lease = self.store.renew(lease)
        except Exception as exc:  # let the run go (not left to lapse: its next claim would count a death)
            with contextlib.suppress(Exception):
                self.store.release(lease)
            if is_outage(exc):  # not the run's failure: claimable again once the store answers
                raise LeaseLostError(f"run {run_id!r}: the store dropped out while it waited for its turn to be "
                                     "driven alone; it is claimed again once the store answers") from exc
            raise
        finally:
            with self._lock:
                self._queued -= 1
                self._turns.notify_all()
        if self._alone != run_id:  # the worker stops: the run is handed back, free at once
            self.store.release(lease)
            raise DriverInterrupted(run_id, self._stop_name)
        try:
            self.store.commit(lease, Batch(events=[NewEvent(kind=ALONE, data={
                **taken, "waited": round(time.time() - since, 3)})]))
        except BaseException:
            self._proven(run_id)
            with self._lock:
                self._running -= 1
            raise
        return lease

    def _proven(self, run_id: str) -> None:
        """The run driven alone committed an attempt's outcome (or its drive ended): the worker
        claims again, and a waiting suspect may hand it back."""
        with self._lock:
            if self._alone == run_id:
                self._alone = None
                self._turns.notify_all()

    def _drive_failed(self, claimed: Claim, exc: Exception) -> None:
        """Count a drive that ended in an error; park the run after ``MAX_FAILED_DRIVES`` in a row."""
        with self._lock:
            self.counts.failed += 1
        failures = self._failed_drives.failed(claimed.lease.run_id)  # (reads the store: not under the lock)
        if failures >= MAX_FAILED_DRIVES:
            self._failed_drives.park(claimed, failures, exc, self.options.lease_ttl)

    def _drive_through_outages(self, lease: Lease, workflow: str, executor: Executor, *,
                               alone: bool = False) -> RunRecord:
        """Drive the run; when the store drops out under the driver (a server restart, a lost
        connection), wait until it answers and drive the run again under the same lease, from what
        is durable. Nothing is lost (the driver fails stop: what it had not committed is redone as
        after a crash), the run does not wait for its lease to expire, and its next claim is not
        counted as a driver's death (``raysaga.orchestrator.crash_loop``)."""
        run_id = lease.run_id
        self._check_secrets(lease)
        since = event_seq(self.store, run_id) if alone else -1  # (its events after it are this drive's)

        def outcome(_: object) -> None:  # counts moved: proven once it committed an outcome of its own
            if self._alone == run_id and outcome_since(self.store, run_id, since):
                self._proven(run_id)  # (not at a count of restored rows: earlier drivers' outcomes)

        while True:
            driver = Driver(self.workflows[workflow], self.store, executor, lease.run_id, options=self.options,
                            lease=lease)
            if alone:
                driver.progress.listeners.append(outcome)
            with self._lock:
                self._drivers.add(driver)
                if self._stop.is_set():
                    driver.interrupt(self._stop_name)  # stopped between the claim and now: hand it back at once
                elif self._queued and self._alone != lease.run_id:
                    driver.interrupt(HAND_BACK)  # a suspect waits to be driven alone
            try:
                return driver.drive()
            except Exception as exc:
                if not is_outage(exc):
                    raise
                if self._stop.is_set():  # stopping: handed back (its lease is released or lapses), not failed
                    raise DriverInterrupted(lease.run_id, self._stop_name) from exc
                log.warning("worker: run %s: the store is unreachable (%s); driving it again once it answers",
                            lease.run_id, outage_cause(exc))
            finally:
                with self._lock:
                    self._drivers.discard(driver)
            lease = lease_after_outage(self.store, lease, self.options.lease_ttl, self._stop, lambda: self._stop_name)


    def _check_secrets(self, lease: Lease) -> None:
        """Let the run go (released, nothing written) with ``SecretUnavailableError`` naming the variable when
        this process lacks a secret of its input: driven, a step failed on it and the run rolled back."""
        try:
            check_run_secrets(self.store.get_run(lease.run_id, lenient=True), self.executor_kind)
        except Exception:  # (a row that does not read: a failed drive, counted, its lease let go as a driver's)
            self.store.release(lease)
            raise


def suspect_of(claim: Claim) -> dict[str, str]:
    """What makes a claimed run a suspect, driven alone (see the module doc), as its ``WAITS`` and
    ``ALONE`` events say it: the owner whose driver died holding it (``abandoned_by``), or the owner
    alive but silent it was taken from (``taken_from_live``); empty for any other claim."""
    if claim.abandoned_by is not None:
        return {"abandoned_by": claim.abandoned_by}
    if claim.taken_from_live is not None:
        return {"taken_from_live": claim.taken_from_live}
    return {}
