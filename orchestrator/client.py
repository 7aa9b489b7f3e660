"""Operating runs from any process: submit to the worker fleet, decide approvals, pause, unpause,
cancel, read the inbox, the figures and the worker fleet (``raysaga.Client``; the CLI verbs are its twins).

Each operation is durable the moment it returns: a decision, a pause or a cancel is a row in
the store. A run with a live driver gets a signal that the driver obeys at its next step
boundary; a run resting without one (waiting for a human or a timer, paused, submitted) is
changed at once, and its ``wake_at`` tells the fleet to take it up when there is work to do.
"""

from __future__ import annotations

import time
from typing import Any

from raysaga.errors import LeaseHeldError, RunExistsError, UserError
from raysaga.orchestrator.driver import driver_id
from raysaga.orchestrator.driver_signals import budget_advice, spent_budget
from raysaga.orchestrator.fleet_view import RECENT
from raysaga.orchestrator.options import RunOptions
from raysaga.orchestrator.ownership import claim, owner_is_gone
from raysaga.orchestrator.run_identity import same_deaths, same_labels, same_options
from raysaga.orchestrator.runner import CANCEL_TTL, SELF_PAUSED, create_run, existing_run, reopen
from raysaga.orchestrator.runner import cancel as cancel_run
from raysaga.orchestrator.workflow import Workflow
from raysaga.state import RunRecord, RunStatus, Store, open_store
from raysaga.state.decisions import MAX_BY, MAX_COMMENT, Decision, WaitingApproval
from raysaga.state.jsoncodec import printable
from raysaga.state.models import PARKED, TERMINAL
from raysaga.state.stats import Stats
from raysaga.state.worker_rows import WorkerRecord
from raysaga.types import check_text

#: Runs that rest without a driver: an operator's pause takes them at once.
_RESTING = (RunStatus.PENDING, RunStatus.WAITING_HUMAN, RunStatus.WAITING_TIMER)
#: What ``pause`` takes at once when no driver holds it: a ``running`` run whose driver died (its
#: lease expired) has none to obey a signal; ``unpause`` then said "not paused".
_PAUSABLE = (*_RESTING, RunStatus.RUNNING)


class Client:
    """A handle on a store for operators and programs: ``Client(db="postgresql://...")``."""

    def __init__(self, db: str | Store | None = None) -> None:
        self.store = db if isinstance(db, Store) else open_store(db)

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ runs

    def submit(self, workflow: Workflow, input: Any = None, *, run_id: str | None = None, queue: str = "default",
               options: RunOptions | None = None, workflow_ref: str | None = None) -> RunRecord:
        """Record a run for the worker fleet and return at once (``pending``): a ``raysaga worker``
        that registered this workflow (same name and definition) starts it.

        With a ``run_id`` (an order number, a request id) a submit is idempotent: a retry, say
        after a timeout that hid whether the first one landed, returns the run already recorded
        under that id, as it stands now, instead of starting a second one. The same id with
        another workflow, input, queue or identity option (labels, deadline, retry budget:
        ``run_identity.same_options``; its own ``max_driver_deaths``: ``run_identity.same_deaths``) raises
        ``UserError``. Without a
        ``run_id`` every call records a new run: a blind retry may then start the work twice."""
        try:
            return create_run(workflow, input, store=self.store, run_id=run_id, options=options,
                              workflow_ref=workflow_ref, queue=queue)
        except RunExistsError:
            assert run_id is not None  # a generated id is new
            existing = existing_run(workflow, self.store, run_id, input)
            if existing is None:  # pruned between the insert and this read: record it again
                return self.submit(workflow, input, run_id=run_id, queue=queue, options=options,
                                   workflow_ref=workflow_ref)
            # a submit's labels are its own, given or not (a retry without them asks for another
            # run); its other identity options are compared when given, as a resume's are
            same_labels(existing, (options or RunOptions()).labels, "submit")
            same_options(existing, options, "submit", queue=queue)
            same_deaths(existing, options or RunOptions(), "submit")
            return existing

    def get_run(self, run_id: str) -> RunRecord:
        return self.store.get_run(run_id, lenient=True)

    # ------------------------------------------------------------------ decisions

    def approve(self, run_id: str, node: str, *, by: str, answer: Any = None, comment: str | None = None,
                decision_id: str | None = None, fan_index: int = -1) -> Decision:
        """Approve a waiting approval (``answer``: an approve "with edits", checked against the
        node's schema). ``decision_id`` makes a retried call one decision."""
        return self.store.decide(run_id, node, "approve", by=by, fan_index=fan_index, answer=answer,
                                 comment=comment, decision_id=decision_id)

    def reject(self, run_id: str, node: str, *, by: str, comment: str | None = None,
               decision_id: str | None = None, fan_index: int = -1) -> Decision:
        """Reject a waiting approval: the node fails (a critical one rolls the saga back); an agent's
        tool call is refused and the model is shown ``comment``."""
        return self.store.decide(run_id, node, "reject", by=by, fan_index=fan_index, comment=comment,
                                 decision_id=decision_id)

    def inbox(self, approver: str | None = None) -> list[WaitingApproval]:
        """Approvals waiting for a decision (with ``approver``, those they may decide), oldest first."""
        return self.store.waiting_approvals(approver)

    # ------------------------------------------------------------------ pause, unpause, cancel

    def pause(self, run_id: str, *, by: str | None = None, reason: str | None = None) -> RunRecord:
        """Pause a run: its driver cancels what is in flight and rests ``paused`` (a run without a
        driver is paused at once). Approvals and sleeps keep waiting in their rows."""
        by, reason = _actor(by), _reason(reason)
        reason = printable(reason or f"paused by {by or 'operator'}")  # a lone surrogate failed its writes
        if reason.startswith(SELF_PAUSED):  # read as a run's own pause, a resume would drive it on
            reason = f"paused: {reason}"
        for _ in range(5):
            run = self.get_run(run_id)
            if run.status in TERMINAL or run.status in PARKED or run.status == RunStatus.COMPENSATING:
                raise UserError(f"run {run_id!r} is {run.status.value}: only a running or waiting run can be paused")
            self._refuse_if_cancelled(run)
            if run.status == RunStatus.PAUSED:
                return run
            if run.status in _PAUSABLE and not _live(run):
                paused = self._pause_at_rest(run_id, reason, by)
                if paused is not None:
                    return paused
                continue  # a worker took it up meanwhile: look again
            self.store.send_signal(run_id, "pause", payload={"reason": reason, "by": by})
            return self.get_run(run_id)
        raise UserError(f"run {run_id!r} kept changing while it was being paused: try again")

    def _pause_at_rest(self, run_id: str, reason: str, by: str | None) -> RunRecord | None:
        """Pause a run no driver holds, under a lease of its own (as a cancel is taken): a worker
        claiming the run a moment later finds it paused; one that claimed it first makes this
        return None (the caller then signals its driver)."""
        try:
            lease, _ = claim(self.store, run_id, driver_id(), CANCEL_TTL)
        except LeaseHeldError:
            return None
        try:
            run = self.store.get_run(run_id, lenient=True)
            if run.status not in _PAUSABLE:
                return None
            self._refuse_if_cancelled(run)
            # holding the lease, no driver can move the run: the transition's event names the actor
            self.store.transition(run_id, run.version, RunStatus.PAUSED, reason=reason, data={"by": by})
            if self._cancel_pending(run_id):  # one queued meanwhile (its wake came before the pause cleared
                # ``wake_at``): due again, a worker (or the waiting cancel) takes the paused run and cancels it
                self.store.wake(run_id, [RunStatus.PAUSED], "a cancel came while it was being paused",
                                "cancel_requested", {"by": by})
        finally:
            self.store.release(lease)
        return self.get_run(run_id)

    def _cancel_pending(self, run_id: str) -> bool:
        return any(s.kind == "cancel" for s in self.store.pending_signals(run_id))

    def _plain_cancel_queued(self, run_id: str) -> bool:
        """A cancel is queued and none asks a rollback (that one waits for a driver to roll back)."""
        cancels = [s for s in self.store.pending_signals(run_id) if s.kind == "cancel"]
        return bool(cancels) and not any(isinstance(s.payload, dict) and s.payload.get("compensate") for s in cancels)

    def _refuse_if_cancelled(self, run: RunRecord) -> None:
        """A pause of a run with a cancel queued is refused: paused, the run was not due any more
        and the cancel (a rollback asked for) waited for an unpause that nobody knew was needed."""
        if self._cancel_pending(run.run_id):
            raise UserError(f"run {run.run_id!r} has a cancel queued ({run.status_reason or 'cancel requested'}): "
                            "it is not paused; the cancel goes on (`raysaga status` shows where it is)")

    def unpause(self, run_id: str, *, by: str | None = None) -> RunRecord:
        """Let a paused run go on: a worker takes it up at once (or ``raysaga resume RUN``). A run
        that paused itself on its spent budget is refused (``UserError`` naming how to raise it)."""
        by = _actor(by)
        run = self.get_run(run_id)
        if run.status != RunStatus.PAUSED:
            # (an ended run's pause never comes: a cancel beside it won, it said so to a cancelled run)
            pending = run.status not in TERMINAL and any(s.kind == "pause" for s in self.store.pending_signals(run_id))
            hint = " (its pause is still on its way to the driver: unpause once it is paused)" if pending else ""
            raise UserError(f"run {run_id!r} is {run.status.value}, not paused{hint}")
        if (run.status_reason or "").startswith("budget:") and spent_budget(run) is not None:  # it pauses again
            # at once: made due, every worker claimed it again and again
            raise UserError(f"run {run_id!r} paused itself: its {run.status_reason}; an unpause cannot lift that: "
                            f"raise the budget: {budget_advice(run)}")
        self.store.wake(run_id, [RunStatus.PAUSED], f"unpaused by {by or 'operator'}", "unpause_requested",
                        {"by": by})
        return self.get_run(run_id)

    def cancel(self, run_id: str, *, compensate: bool = False, by: str | None = None,
               reason: str | None = None) -> RunRecord:
        """Cancel a run; committed effects stand unless ``compensate``. Without a live driver a plain
        cancel is taken at once; a live driver obeys the signal at its next step boundary. With
        ``compensate`` the rollback runs in a driver: a worker takes the run up (or ``raysaga resume``)."""
        by, given = _actor(by), _reason(reason)
        reason = printable(given or f"cancelled by {by or 'operator'}")  # a lone surrogate failed its writes
        if not compensate:
            record = cancel_run(run_id, store=self.store, reason=reason, wait=0)
            for _ in range(_AT_REST_TRIES):
                # queued on a run at rest whose lease another call held a moment (a pause at rest, a
                # worker taking it up): no driver at work obeys it; taken here once the lease is free
                if record.status not in (*_RESTING, RunStatus.PAUSED) or not self._plain_cancel_queued(run_id):
                    return record
                if _live(record):
                    time.sleep(_AT_REST_POLL)  # (polling another process's progress)
                    record = self.get_run(run_id)
                else:
                    record = cancel_run(run_id, store=self.store, reason=reason, wait=0)
            return record
        run = self.get_run(run_id)
        if run.status in TERMINAL or run.status == RunStatus.COMPENSATION_FAILED:  # (``retry(compensations)``
            return run  # finishes a failed rollback; moved to compensating, it failed on the same row again)
        if run.status in PARKED or run.status == RunStatus.COMPENSATING:
            if run.status != RunStatus.COMPENSATING:
                self.store.transition(run_id, run.version, RunStatus.COMPENSATING, reason=reason, data={"by": by})
            return self.get_run(run_id)
        self.store.send_signal(run_id, "cancel", payload={"reason": reason, "compensate": True, "by": by})
        # a run at rest says it in its reason until a driver rolls it back (the event keeps the cancel's)
        said = f"cancel with rollback requested by {by or 'an operator'}" + (f" ({reason})" if given else "")
        self.store.wake(run_id, [RunStatus.WAITING_HUMAN, RunStatus.WAITING_TIMER, RunStatus.PAUSED], said,
                        "cancel_requested", {"by": by, "compensate": True, "reason": reason})
        return self.get_run(run_id)

    def retry(self, run_id: str, *, by: str | None = None) -> RunRecord:
        """An operator's retry of a parked run, with the same idempotency keys: a ``failed`` run's
        failed and skipped nodes go back to pending, a ``compensation_failed`` run's failed
        compensations do; a worker takes the run up (or ``raysaga resume RUN``). A ``failed`` run past
        its deadline is refused before anything is written (``runner.check_retryable``: it would fail
        ``deadline`` again at once); its rollback is not, a rollback being no forward work. So is one
        its spent budget failed: ``raysaga retry RUN --token-budget N`` (``raysaga.retry``) raises it; and
        one an agent failed on what its stored turns decide (MaxTurns, LoopDetected, InvalidOutput,
        ModelRefused), judged by kind as the client loads no code: ``raysaga retry RUN`` judges it with
        the code, or ``raysaga fork RUN --from 'AGENT@T'`` goes on from a turn."""
        by = _actor(by)
        current = self.get_run(run_id)
        record = reopen(self.store, run_id, compensations=current.status == RunStatus.COMPENSATION_FAILED)
        self.store.wake(run_id, [record.status], f"retried by {by or 'operator'}", "retry_requested", {"by": by})
        return self.get_run(run_id)

    # ------------------------------------------------------------------ figures

    def stats(self, since: float | None = None) -> Stats:
        return self.store.stats(since)

    def workers(self, *, include_gone: bool = False) -> list[WorkerRecord]:
        """The live workers (``raysaga workers``): each one's host, pid, slots and what it serves;
        with ``include_gone``, also those that stopped or went silent (no beat: killed, frozen, cut
        off) in the last 24 hours. ``WorkerRecord.state(now)`` tells which."""
        now = time.time()
        rows = self.store.workers(now - RECENT)
        return rows if include_gone else [w for w in rows if w.state(now) == "live"]


def _live(run: RunRecord) -> bool:
    """A driver holds the run: its lease is valid and its owner not provably gone (a SIGKILLed
    driver's lease outlives it: a pause said "its driver pauses it shortly", and none came)."""
    return run.lease_owner is not None and (run.lease_expires_at or 0.0) >= time.time() \
        and not owner_is_gone(run.lease_owner)


#: How many times, and how often, a plain cancel looks again at a run at rest whose lease another
#: call held: a pause at rest holds it for one transition (milliseconds); a driver holding a waiting
#: run obeys the signal at its next heartbeat, or the cancel returns queued after this second.
_AT_REST_TRIES = 20
_AT_REST_POLL = 0.05


def _actor(by: str | None) -> str | None:
    """``by=`` checked as ``approve`` checks it (1-200 printable characters): it is recorded in the
    transition's event and shown by ``status``, ``events`` and the dashboard, where a NUL failed the
    write on PostgreSQL and an ESC reached the terminal of whoever read it."""
    return None if by is None else check_text(by.strip() if isinstance(by, str) else by, "by (who acts)", MAX_BY)


def _reason(reason: str | None) -> str | None:
    """A pause's or cancel's reason, at most ``MAX_COMMENT`` characters as a decision's comment is
    (it is stored in the run's row and its event, and shown in every view of the run)."""
    if reason is not None and (not isinstance(reason, str) or len(reason) > MAX_COMMENT):
        size = f"{len(reason):,} characters" if isinstance(reason, str) else type(reason).__name__
        raise UserError(f"reason must be text of at most {MAX_COMMENT:,} characters, got {size}")
    return reason
