"""The public way to start, resume, cancel and retry runs."""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from threading import Thread
from typing import Any

from raysaga import errors
from raysaga.errors import LeaseHeldError, RaySagaError, RunExistsError, RunNotFoundError, StoreOutageError, UserError
from raysaga.orchestrator import retry_checks, tracing, versions
from raysaga.orchestrator.driver import Driver, driver_id
from raysaga.orchestrator.executor import Executor, make_executor
from raysaga.orchestrator.faults import Faults
from raysaga.orchestrator.keys import is_compensation
from raysaga.orchestrator.options import RunOptions
from raysaga.orchestrator.ownership import claim, owner_is_gone
from raysaga.orchestrator.ray_address import host_port
from raysaga.orchestrator.resumable import SELF_PAUSED, check_resumable, check_run_secrets, held_by_operator
from raysaga.orchestrator.run_identity import own_limit, same_options
from raysaga.orchestrator.secrets import adopt, comparable, name_literals
from raysaga.orchestrator.unrecorded import before_recording
from raysaga.orchestrator.versions import step_hashes
from raysaga.orchestrator.workflow import Workflow
from raysaga.state import (
    Batch,
    Lease,
    NewRun,
    NodeStatus,
    NodeWrite,
    RunRecord,
    RunStatus,
    RunUpdate,
    SqlStore,
    Store,
    jsoncodec,
    open_store,
)
from raysaga.state.engine import is_outage, outage_cause
from raysaga.state.jsoncodec import printable
from raysaga.state.models import PARKED, TERMINAL
from raysaga.types import check_run_id, check_text

ExecutorArg = str | Executor
ProgressHook = Callable[[Any], None]


@contextlib.contextmanager
def using_store(store: Store | str | None) -> Iterator[Store]:
    """The store to use: ``store`` itself when it is a ``Store`` (the caller's: it stays open), else
    the store at that URL (None: the default store), opened here and closed on the way out. Left
    open, each call kept its connections (a PostgreSQL backend, a SQLite file's descriptors) until a
    full garbage collection: SQLAlchemy's engines sit in reference cycles of their own."""
    if isinstance(store, Store):
        yield store
        return
    opened = open_store(store)
    try:
        yield opened
    finally:
        opened.close()


def _executor(executor: ExecutorArg, address: str | None) -> Executor:
    return executor if isinstance(executor, Executor) else make_executor(executor, address=address)


@contextlib.contextmanager
def executor_started(executor: str, address: str | None) -> Iterator[Callable[[], Executor]]:
    """Start the executor now and yield the call that waits for it (raising what starting it
    raised); shut down on exit. Joining a running Ray cluster (HOST:PORT) happens in a thread:
    importing Ray and joining is the larger part of a resume's start-up, and the caller loads the
    run's workflow meanwhile. The sooner this process joins, the sooner its Ray job's first worker
    process (which every new driver needs before its first step runs) is under way. A local Ray
    is started here, in the calling thread: Ray ties the processes it starts (GCS, raylet) to the
    life of the thread that started them (``PR_SET_PDEATHSIG``), and a helper thread ends."""
    started: Future[Executor] = Future()

    def start() -> None:
        try:
            started.set_result(make_executor(executor, address))
        except BaseException as exc:  # handed to whoever waits for it
            started.set_exception(exc)

    if executor == "ray" and _joins_a_cluster(address):
        Thread(target=start, name="raysaga-join-ray", daemon=True).start()
    else:
        start()
    try:
        yield started.result
    finally:
        if started.exception() is None:  # waits for it; a failure the caller never asked for is moot
            started.result().shutdown()


def _joins_a_cluster(address: str | None) -> bool:
    """Whether Ray would join a cluster at HOST:PORT (not start a local one, or look for one)."""
    address = address or os.environ.get("RAY_ADDRESS") or None
    try:
        return address is not None and host_port(address) is not None
    except UserError:
        return False  # malformed: the executor refuses it, in the calling thread


def new_run_id(workflow: Workflow) -> str:
    return f"{workflow.name}-{uuid.uuid4().hex[:12]}"


def create_run(workflow: Workflow, input: Any = None, *, store: Store | str | None = None,
               run_id: str | None = None, options: RunOptions | None = None,
               workflow_ref: str | None = None, queue: str | None = None) -> RunRecord:
    """Record a new run (``pending``) without driving it. ``workflow_ref`` (MODULE:ATTR) lets
    ``raysaga resume RUN`` find the definition again (left out: ``loader.ref_of``, where the
    workflow's module binds it, if importable; ``""``: none); ``queue`` submits it to the worker fleet
    (a ``raysaga worker`` that registered the workflow starts it). A ``max_driver_deaths`` other
    than the default is recorded with the run, so a worker of another limit keeps it."""
    with using_store(store) as st:
        return st.create_run(new_run(workflow, input, run_id=run_id, options=options,
                                     workflow_ref=workflow_ref, queue=queue))


def new_run(workflow: Workflow, input: Any, *, run_id: str | None, options: RunOptions | None,
            workflow_ref: str | None, queue: str | None = None) -> NewRun:
    """The checked record of a run to create (``create_run``; ``run`` creates it claimed)."""
    options = options or RunOptions()
    workflow.validate()
    checked = name_literals(workflow.check_input(input))  # each literal its own re-supply variable
    if run_id is not None:
        check_run_id(run_id, "--run-id")  # printable: PostgreSQL refuses a NUL in text
    # a run row's text columns: unchecked, a NUL or a longer value was stored on SQLite and raised
    # psycopg's DataError on PostgreSQL (a lone surrogate UnicodeEncodeError on both) in the driver
    if queue is not None:
        check_text(queue, "queue", 200)
    if workflow_ref == "":  # asked for none: `raysaga resume` then needs --workflow
        workflow_ref = None
    elif workflow_ref is not None:
        check_text(workflow_ref, "workflow_ref", 500)
    else:  # started from Python: where it lives, if importable there (`raysaga resume` needs it)
        from raysaga.orchestrator.loader import ref_of

        workflow_ref = ref_of(workflow)
    return NewRun(
        run_id=run_id or new_run_id(workflow), workflow_name=workflow.name, workflow_version=workflow.version,
        definition_hash=workflow.definition_hash, step_hashes=step_hashes(workflow), workflow_ref=workflow_ref,
        input=checked,
        deadline_at=time.time() + options.deadline if options.deadline else None,
        retry_budget=options.retry_budget, token_budget=options.token_budget, cost_budget=options.cost_budget,
        trace_id=tracing.new_trace_id(), queue=queue, labels=options.labels or None,
        max_driver_deaths=own_limit(options.max_driver_deaths),
    )


class _NoInput:
    """The type of ``NO_INPUT``."""

    def __repr__(self) -> str:
        return "NO_INPUT"


#: ``run(..., input=NO_INPUT)`` (the default): no input was given. With an existing ``run_id``
#: that resumes the run as it is; a new run gets the input None. Any other value, ``None``
#: (JSON null) included, is an input: with an existing run it must equal the stored one.
NO_INPUT: Any = _NoInput()


def run(workflow: Workflow, input: Any = NO_INPUT, *, store: Store | str | None = None, run_id: str | None = None,
        executor: ExecutorArg = "ray", address: str | None = None, options: RunOptions | None = None,
        on_progress: ProgressHook | None = None, workflow_ref: str | None = None) -> RunRecord:
    """Run a workflow to a resting state. With an existing ``run_id`` this resumes that run; an
    ``input`` given with it (``None`` included) must equal the run's; leave it out (``NO_INPUT``)
    to just resume. So must the identity ``options`` given with it (labels, deadline, retry
    budget, and a ``max_driver_deaths`` other than the default when the run recorded a limit of its
    own: ``same_options``, which lists what may change on a resume). ``on_progress(progress)``
    is called as steps finish (``Progress``: total, done, failed); one that raises is logged once
    and dropped, and the run goes on."""
    with using_store(store) as st:
        workflow.validate()
        if run_id is not None:  # before the look-up: a NUL or a lone surrogate failed inside the database driver
            check_run_id(run_id, "--run-id")
        if run_id is not None and (existing := existing_run(workflow, st, run_id, input)) is not None:
            same_options(existing, options, "run")  # left out, the run resumes as it was recorded
            return resume(workflow, run_id, store=st, executor=executor, address=address, options=options,
                          on_progress=on_progress)
        given = input
        if input is NO_INPUT:
            input = None
        workflow.check_input(input)  # a bad input is refused before Ray starts
        Faults()  # a bad RAYSAGA_FAULTS too: its driver refused it with the run recorded and claimed
        with before_recording(run_id):  # first: an unreachable cluster leaves no 'pending' run, a Ctrl-C no run
            ex = _executor(executor, address)
        try:
            lease: Lease | None = None
            new = new_run(workflow, input, run_id=run_id, options=options, workflow_ref=workflow_ref)
            try:  # created already claimed and running by this process's driver: one transaction
                record, lease = st.create_claimed(new, driver_id(), (options or RunOptions()).lease_ttl)
            except RunExistsError:
                # Another process created this run between the look-up above and this insert (two
                # drivers started together with one run id). It is an existing run now: take the resume
                # path, so the loser backs off on the lease (LeaseHeldError) like any second driver,
                # instead of failing with "already exists" (a different input is still refused).
                assert run_id is not None
                raced = existing_run(workflow, st, run_id, given)
                if raced is not None:
                    same_options(raced, options, "run")
                record = st.get_run(run_id, lenient=True)
                check_run_secrets(record, ex)
            except Exception as exc:
                if isinstance(exc, RaySagaError) or not is_outage(exc):
                    raise
                # not StoreOutageError ("resume continues it"): the run may not exist
                raise errors.StoreUnavailableError(
                    f"the store stopped answering while run {new.run_id!r} was created ({outage_cause(exc)}): it "
                    f"may not exist. Once the store answers, run it again with --run-id {shlex.quote(new.run_id)} "
                    "(run_id= in Python): that resumes the run if it was created, and creates it if not") from exc
            # the record in hand, not a second read: a run created here is all its driver needs to start
            return _drive(workflow, st, record, ex, None, options, on_progress, lease, created=lease is not None)
        finally:
            if not isinstance(executor, Executor):
                ex.shutdown()


def existing_run(workflow: Workflow, st: Store, run_id: str, input: Any) -> RunRecord | None:
    """The run ``run_id`` if it exists, after checking that this call may resume it: same
    workflow, and the same input unless ``input`` is ``NO_INPUT`` (else ``UserError``)."""
    try:
        existing = st.get_run(run_id)
    except RunNotFoundError:
        return None
    if existing.workflow_name != workflow.name:
        raise UserError(f"run {run_id!r} belongs to workflow {existing.workflow_name!r}, not {workflow.name!r}")
    if input is not NO_INPUT:
        # secrets compare by reference: a literal is never stored, so any literal equals any other
        checked = workflow.check_input(input, stored=True)  # (as recorded)
        given = jsoncodec.dumps(comparable(checked), "input")
        stored = jsoncodec.dumps(comparable(existing.input), "input")
        if given != stored:
            raise UserError(f"run {run_id!r} exists with a different input: resume it without --input "
                            "(`raysaga resume RUN`), or choose another --run-id")
        adopt(checked, existing.input)  # its literals given again: this process has them for the run
    return existing


def resume(workflow: Workflow, run_id: str, *, store: Store | str | None = None, executor: ExecutorArg = "ray",
           address: str | None = None, options: RunOptions | None = None,
           on_progress: ProgressHook | None = None) -> RunRecord:
    """Continue a run from the store: completed nodes are never re-run. Raises ``LeaseHeldError``
    if another live driver owns it. A run at rest (terminal, or parked for an operator: ``retry``
    revives those) is returned as it stands: nothing is claimed or written."""
    with using_store(store) as st:
        current = st.get_run(run_id, lenient=True)  # RunNotFoundError before starting Ray
        check_resumable(current)
        check_run_secrets(current, executor)  # refused before anything is dispatched, claimed or rolled back
        return _drive(workflow, st, current, executor, address, options, on_progress)


def _drive(workflow: Workflow, st: Store, current: RunRecord, executor: ExecutorArg, address: str | None,
           options: RunOptions | None, on_progress: ProgressHook | None, lease: Lease | None = None, *,
           created: bool = False) -> RunRecord:
    """``resume`` of the run ``current`` (just read, or just created: ``created``, claimed by
    ``create_claimed`` in this call, its driver reads nothing more of it)."""
    if current.status in TERMINAL or current.status in PARKED:
        return current
    run_id = current.run_id
    ex = _executor(executor, address)
    try:
        driver = Driver(workflow, st, ex, run_id, options=options, lease=lease, created=current if created else None)
        if on_progress is not None:
            driver.progress.listeners.append(on_progress)
        return driver.drive()
    except RaySagaError:
        raise
    except Exception as exc:
        if is_outage(exc):  # not the run's failure: it rests as after a crash, its commits intact
            raise StoreOutageError(run_id, outage_cause(exc)) from exc
        raise
    finally:
        if not isinstance(executor, Executor):
            ex.shutdown()


def cancel(run_id: str, *, store: Store | str | None = None, reason: str = "cancelled by operator",
           compensate: bool = False, workflow: Workflow | None = None, executor: ExecutorArg = "ray",
           address: str | None = None, wait: float = 60.0, allow_changed: bool = False) -> RunRecord:
    """Cancel a run. Committed effects stand, unless ``compensate``: then the run is rolled back
    (compensations in reverse) and ends ``compensated`` (rolling back needs its ``workflow``).

    A run with no live driver — its lease free, expired, or held by a driver process that is
    provably gone (``raysaga.orchestrator.ownership``) — is cancelled here at once. A live
    driver is sent a signal and acts on it within a heartbeat; this call waits for that (up to
    ``wait`` s), and takes the run over itself if that driver's lease lapses meanwhile; with
    ``wait=0`` the signal is queued and the run is returned as it stands. A compensating cancel
    under another definition of the workflow is refused before anything is written
    (``DefinitionChangedError``) unless ``allow_changed``: the rollback runs the new code. A rollback
    asked for wins over a plain cancel: a plain one finding it queued returns the run unchanged."""
    with using_store(store) as st:
        reason = printable(reason)  # an operator's text: a lone surrogate failed every write of the cancel
        run = st.get_run(run_id, lenient=True)  # a damaged input must not stop a cancel
        if run.status in TERMINAL or (run.status in PARKED and not compensate) or run.status == _CF:
            return run  # (a failed rollback: ``retry --compensations`` finishes it; asked again, it flipped back)
        if compensate and workflow is None:
            raise UserError("cancel with compensation runs the workflow's compensations: pass the workflow "
                            "(CLI: the run's recorded workflow, or --workflow MODULE:WORKFLOW)")
        changed = RunOptions(allow_changed=True) if allow_changed else None
        if compensate:
            assert workflow is not None
            versions.check(st, run, workflow, allow_changed=allow_changed, verb="cancel --compensate")
        if run.status == RunStatus.COMPENSATING:  # a rollback is under way: cancelling it would half-undo
            if not compensate:
                raise UserError(f"run {run_id!r} is rolling back (compensating): it cannot be cancelled half-way; "
                                f"let the rollback finish (`raysaga resume {shlex.quote(run_id)}`)")
            assert workflow is not None
            return _drive(workflow, st, st.get_run(run_id, lenient=True), executor, address, changed, None)
        payload = {"reason": reason, "compensate": compensate}
        owner = driver_id()
        try:
            lease, _ = claim(st, run_id, owner, CANCEL_TTL)
        except LeaseHeldError:  # a live driver: it acts on the signal at its next heartbeat
            st.send_signal(run_id, "cancel", payload=payload)
            found = _wait_for_rest(st, run_id, wait, owner)
            if isinstance(found, RunRecord):
                return found
            lease = found  # its driver's lease lapsed: this call finishes the job; the signal is queued
        try:
            current = st.get_run(run_id, lenient=True)
            if current.status in TERMINAL or (current.status in PARKED and not compensate) or current.status == _CF:
                return current
            signals = [s for s in st.pending_signals(run_id) if s.kind == "cancel"]
            # a rollback asked for wins over a plain cancel: ended ``cancelled`` here, it never ran
            rollback_asked = any(isinstance(s.payload, dict) and s.payload.get("compensate") for s in signals)
            if current.status == RunStatus.COMPENSATING:  # its driver started rolling back, then stopped
                if not compensate:
                    raise UserError(f"run {run_id!r} is rolling back (compensating): it cannot be cancelled "
                                    f"half-way; let the rollback finish (`raysaga resume {shlex.quote(run_id)}`)")
            elif compensate and current.status in PARKED:
                st.commit(lease, Batch(run=RunUpdate(status=RunStatus.COMPENSATING, status_reason=reason),
                                       consumed_signals=[s.id for s in signals]))
            elif compensate:
                if not rollback_asked:  # the driver below acts on it first thing, consuming it with the transition
                    st.send_signal(run_id, "cancel", payload=payload)
            elif rollback_asked:  # left for the driver (a worker, the compensating cancel) that rolls it back
                return current
            else:
                nodes = [NodeWrite(node_id=n.node_id, fan_index=n.fan_index, status=NodeStatus.CANCELLED,
                                   attempt=n.attempt, error={"reason": reason}, started_at=n.started_at)
                         for n in st.nodes(run_id)
                         if n.status in (NodeStatus.RUNNING, NodeStatus.RETRYING, NodeStatus.WAITING)]
                batch = Batch(nodes=nodes, consumed_signals=[s.id for s in signals],
                              run=RunUpdate(status=RunStatus.CANCELLED, status_reason=reason))
                traced = tracing.for_commit(st, run_id, owner, workflow)  # None unless tracing is on
                record = st.commit(lease, batch)
                if traced is not None:  # its cancelled nodes' spans and the run's root span
                    try:
                        traced.committed(batch, record)
                    except Exception as exc:  # the cancel is done: tracing must not say otherwise
                        logging.getLogger("raysaga.tracing").warning("run %s: the cancel's spans were not written "
                                                                     "(%s: %s)", run_id, type(exc).__name__, exc)
        finally:
            st.release(lease)
        if compensate:  # driven here, paused or not: the cancel is the operator's word
            assert workflow is not None
            return _drive(workflow, st, st.get_run(run_id, lenient=True), executor, address, changed, None)
        return st.get_run(run_id, lenient=True)


_CF = RunStatus.COMPENSATION_FAILED

#: The lease a ``cancel`` takes while it records the cancellation (it renews nothing: it is quick).
CANCEL_TTL = 10.0


def _wait_for_rest(st: Store, run_id: str, wait: float, owner: str) -> RunRecord | Lease:
    """Wait for the live driver to act on the cancel signal: the run at rest, or the run's lease
    if that driver's lease lapsed (or its process died) first."""
    if wait <= 0:  # queued: the live driver acts on it at its next heartbeat
        return st.get_run(run_id, lenient=True)
    deadline = time.time() + wait
    while time.time() < deadline:
        run = st.get_run(run_id, lenient=True)
        if run.status in TERMINAL or run.status in PARKED:
            return run
        # Only a lease that looks lapsed is worth a claim: a live driver that just ended the run
        # and released must not see this call claim the ended run behind it.
        lapsed = (run.lease_owner is None or (run.lease_expires_at or 0.0) < time.time()
                  or owner_is_gone(run.lease_owner))
        if lapsed:
            try:
                lease, _ = claim(st, run_id, owner, CANCEL_TTL)
            except LeaseHeldError:
                pass
            else:
                return lease
        time.sleep(0.1)  # polling the store for another process's progress
    raise UserError(f"run {run_id!r}: the cancel signal is queued; its driver has not finished acting on it "
                    f"within {wait:.0f}s (`raysaga status {shlex.quote(run_id)}` shows where it is)")


def check_retryable(run: RunRecord, compensations: bool, options: RunOptions | None = None) -> None:
    """Only a ``failed`` run is retried (with ``compensations``, only a ``compensation_failed`` one),
    and not past its deadline: a retry keeps the deadline, so the retried run failed ``deadline``
    again at once, its retried nodes left ``pending`` and their earlier record lost. A rollback
    retried past the deadline runs (the driver checks the deadline only going forward). Nor is a
    run its spent budget failed (``on_budget="fail"``) retried unless ``options`` raise that budget:
    it failed again at once, saying nothing of why (``retry_checks``; an agent its stored turns fail again
    is refused by ``retry``, judged with the code, and by ``reopen``)."""
    wanted = RunStatus.COMPENSATION_FAILED if compensations else RunStatus.FAILED
    if run.status != wanted:
        hint = " (use --compensations for a compensation_failed run)" \
            if run.status == RunStatus.COMPENSATION_FAILED else ""
        raise UserError(f"run {run.run_id!r} is {run.status.value}: only a {wanted.value} run can be retried "
                        f"{'with' if compensations else 'without'} --compensations{hint}")
    if not compensations:  # past its deadline, on a spent budget: it would fail again at once
        retry_checks.check_repeats(run, options)


def reopen(st: Store, run_id: str, compensations: bool = False, options: RunOptions | None = None, *,
           judged: bool = False) -> RunRecord:
    """Make a parked run runnable again, with the same idempotency keys: a ``failed`` run's failed
    and skipped nodes go back to pending and it is ``running``; with ``compensations``, a
    ``compensation_failed`` run's failed compensations go back to pending and it is
    ``compensating``. Its lease is free afterwards: ``resume`` (or a worker) drives it. ``judged``:
    the failed agent's stored turns were judged with the code (``retry``), else by their failure."""
    run = st.get_run(run_id, lenient=True)  # a damaged input: the resume parks it again, naming it
    check_retryable(run, compensations, options)
    if not compensations and not judged:
        retry_checks.check_agent(st, run, None)
    lease, _ = claim(st, run_id, driver_id(), CANCEL_TTL)
    try:
        nodes = st.nodes(run_id)
        if compensations:
            reset = [NodeWrite(node_id=n.node_id, fan_index=n.fan_index, status=NodeStatus.PENDING, attempt=0)
                     for n in nodes if is_compensation(n.node_id) and n.status == NodeStatus.FAILED]
            # the rollback keeps the reason it started with (the forward failure), so the run's
            # final word names what was rolled back, not just that an operator retried
            started = [e for e in st.events(run_id) if e.kind == "rollback_started"]
            reason = str(started[-1].data.get("reason") or "") if started else ""
            update = RunUpdate(status=RunStatus.COMPENSATING,
                               status_reason=f"{reason} (operator retry of compensations)" if reason
                               else "operator retry of compensations")
        else:
            reset = [NodeWrite(node_id=n.node_id, fan_index=n.fan_index, status=NodeStatus.PENDING, attempt=0)
                     for n in nodes if not is_compensation(n.node_id) and n.status in (
                         NodeStatus.FAILED, NodeStatus.SKIPPED, NodeStatus.CANCELLED, NodeStatus.RETRYING)]
            update = RunUpdate(status=RunStatus.RUNNING, status_reason="operator retry",
                               retries_delta=-run.retries_used, error=None, set_error=True)
        # a cancel or pause sent as the run ended was never obeyed: the retry comes after it
        stale = [s.id for s in st.pending_signals(run_id) if s.kind in ("cancel", "pause")]
        record = st.commit(lease, Batch(nodes=reset, run=update, consumed_signals=stale))
    finally:
        st.release(lease)
    assert record is not None
    return record


def retry(workflow: Workflow, run_id: str, *, store: Store | str | None = None, executor: ExecutorArg = "ray",
          address: str | None = None, options: RunOptions | None = None,
          on_progress: ProgressHook | None = None, compensations: bool = False) -> RunRecord:
    """Operator retry of a parked run, with the same idempotency keys.

    A ``failed`` run: its failed and skipped nodes run again; completed nodes and committed
    effects stand. With ``compensations``, a ``compensation_failed`` run: its failed
    compensations run again and the rollback completes. A ``failed`` run past its deadline is
    refused (``check_retryable``): the deadline stays, so it would fail again at once. So is one an
    agent failed if ``workflow``'s agent decides its stored turns the same (MaxTurns, LoopDetected...).
    """
    with using_store(store) as st:
        # a definition change is refused before the run is reopened: refused after, it was left
        # running with no driver (or compensating); allowed, the resume's driver pins it
        current = st.get_run(run_id, lenient=True)
        check_retryable(current, compensations, options)
        versions.check(st, current, workflow, allow_changed=options is not None and options.allow_changed,
                       verb="retry --compensations" if compensations else "retry")
        if not compensations:  # an agent its stored turns fail again with this code
            retry_checks.check_agent(st, current, workflow)
            check_run_secrets(current, executor, reopening=True)  # reopened, then refused: left running, driverless
        reopen(st, run_id, compensations, options, judged=True)
        return resume(workflow, run_id, store=st, executor=executor, address=address, options=options,
                      on_progress=on_progress)


__all__ = ["NO_INPUT", "SELF_PAUSED", "SqlStore", "cancel", "check_resumable", "create_run",
           "executor_started", "held_by_operator", "new_run_id", "resume", "retry", "run"]
