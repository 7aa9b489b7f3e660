"""The driver loop: the single writer that advances one run.

It claims the run's lease, rebuilds the run from the store (constant number of queries),
dispatches ready nodes through an executor, drains every finished attempt and commits their
checkpoints in one transaction, and repeats. Every write carries the lease's fence; a stale
fence stops the driver before it makes another call. When a critical node fails for good the
same loop runs the rollback (``raysaga.orchestrator.rollback``) instead of the forward DAG.

Delivery guarantees: an ``effect=True`` step runs through the ledger (``pending`` is durable
before the call, ``committed`` with the result after), so it takes effect at most once per
idempotency key. Other steps are at-least-once: a crash while one is in flight re-runs it.
"""

from __future__ import annotations

import heapq
import logging
import random
import signal as posix_signal
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

from raysaga.errors import BlobIntegrityError, DriverInterrupted, LeaseLostError, RaySagaError, UserError
from raysaga.orchestrator.agentloop import AgentNode, is_agent_call, split_call
from raysaga.orchestrator.context import StepContext
from raysaga.orchestrator.driver_agents import AgentHooks
from raysaga.orchestrator.driver_base import SETTLE_SECONDS, InFlight, Progress
from raysaga.orchestrator.executor import Executor, Handle
from raysaga.orchestrator.fanout import FanOutBook
from raysaga.orchestrator.faults import Faults
from raysaga.orchestrator.heartbeat import Heartbeat
from raysaga.orchestrator.keys import args_digest, effect_key, is_compensation
from raysaga.orchestrator.options import DEFAULT_RETRY, RunOptions
from raysaga.orchestrator.ownership import claim, new_owner
from raysaga.orchestrator.records import merge_run, short_error
from raysaga.orchestrator.retry import backoff_delay
from raysaga.orchestrator.rollback import Rollback
from raysaga.orchestrator.scheduler import NodeKey, Scheduler
from raysaga.orchestrator.spec import StepSpec
from raysaga.orchestrator.task import NodeCall, NodeOutcome
from raysaga.orchestrator.workflow import Workflow
from raysaga.state import (
    Batch,
    EffectStatus,
    EffectWrite,
    NewEvent,
    NodeRecord,
    NodeStatus,
    NodeWrite,
    RunRecord,
    RunSnapshot,
    RunStatus,
    RunUpdate,
    Store,
    jsoncodec,
    node_label,
)
from raysaga.state.models import PARKED, TERMINAL, can_transition

log = logging.getLogger("raysaga.driver")

#: How often the main loop wakes with nothing finished, to look at signals and deadlines.
IDLE_TICK = 0.25


def driver_id() -> str:
    """A lease owner string naming this process (``raysaga.orchestrator.ownership``)."""
    return new_owner()


#: Signals a driver turns into a clean stop (``DriverInterrupted``): SIGINT (Ctrl-C) and SIGTERM
#: (``docker stop``, Kubernetes, systemd).
STOP_SIGNALS = (posix_signal.SIGINT, posix_signal.SIGTERM)


class Driver(AgentHooks):
    """Advances one run to a resting state (completed, failed, compensated, cancelled, or lease lost)."""

    def __init__(self, workflow: Workflow, store: Store, executor: Executor, run_id: str, *,
                 options: RunOptions | None = None, clock: Callable[[], float] = time.time,
                 rng: random.Random | None = None, faults: Faults | None = None) -> None:
        self.wf = workflow.validate()
        self.store = store
        self.executor = executor
        self.run_id = run_id
        self.options = options or RunOptions()
        self.clock = clock
        self.rng = rng or random.Random()
        self.faults = faults or Faults()
        self.owner = driver_id()
        self.progress = Progress()
        self.specs: dict[str, StepSpec] = dict(self.wf.steps)  # + compensations, added by the rollback
        self.outputs: dict[NodeKey, Any] = {}
        self._sched = Scheduler(self.wf)
        self._fanout = FanOutBook()
        self._restored: dict[NodeKey, NodeRecord] = {}
        self._ledger: dict[str, tuple[EffectStatus, Any]] = {}
        self._keys: dict[NodeKey, str] = {}  # idempotency key of each effect node dispatched
        self._attempts: dict[NodeKey, int] = {}
        self._timers: list[tuple[float, NodeKey]] = []
        self._inflight: dict[NodeKey, InFlight] = {}
        self._timed: dict[NodeKey, InFlight] = {}  # in flight with a deadline (may hold stale entries)
        self._unrecorded: list[NodeKey] = []  # dispatched, no 'running' row yet (may hold stale keys)
        self._pending_batch = Batch()
        self._handled_signals: set[int] = set()
        self._parents_done: set[str] = set()  # fan-out parents already durable as completed
        self._failure: tuple[str, dict[str, Any]] | None = None
        self._rollback: Rollback | None = None
        self._agents: dict[NodeKey, AgentNode] = {}
        self._agent_rows: dict[NodeKey, list[NodeRecord]] = {}
        self._agents_due: set[NodeKey] = set()
        self._pause_reason: str | None = None
        self._tokens = 0
        self._cost = 0.0
        self._retries_used = 0
        self.run: RunRecord | None = None
        self._hb: Heartbeat | None = None
        self._interrupted: str | None = None  # the name of the stop signal received
        self._saved_handlers: dict[int, Any] = {}
        self._blob_refs: dict[str, str] = {}  # digest -> the node (or input) it was read for

    # ------------------------------------------------------------------ entry point

    def drive(self) -> RunRecord:
        lease, taken_from = claim(self.store, self.run_id, self.owner, self.options.lease_ttl)
        self._hb = Heartbeat(self.store, lease, period=min(1.0, self.options.lease_ttl / 3))
        lost = False
        self._install_stop_handlers()
        try:
            if taken_from is not None:
                self._pending_batch.events.append(NewEvent(kind="lease_taken_over", data={
                    "from": taken_from, "reason": "its driver process is gone (same host and boot)"}))
            try:
                return self._drive()
            except BlobIntegrityError as exc:
                return self._park_on_blob(exc)
        except LeaseLostError:
            lost = True
            raise
        finally:
            try:
                for flight in self._inflight.values():
                    self.executor.cancel(flight.handle)
                self._settle_cancelled("the driver stops", SETTLE_SECONDS / 10)
            finally:
                self._restore_stop_handlers()
                self._hb.stop()
                if not lost and not self._hb.lost.is_set():
                    self.store.release(self._hb.lease)

    def _drive(self) -> RunRecord:
        assert self._hb is not None
        snapshot = self.store.snapshot(self.run_id)
        run = snapshot.run
        if run.definition_hash != self.wf.definition_hash:
            raise UserError(
                f"run {self.run_id!r} was started by another definition of workflow {run.workflow_name!r} "
                f"(hash {run.definition_hash[:12]} != {self.wf.definition_hash[:12]}): resume it with the code "
                "it started with, or start a new run"
            )
        if run.status in TERMINAL or run.status in PARKED:
            return run
        self.run = run
        self._hb.start()
        self._restore(snapshot)
        budgets = self._new_budgets(run)
        if budgets is not None:
            self.run = self._commit(Batch(run=budgets)) or run
        if run.status == RunStatus.PAUSED:
            stop = self.budget_stop()
            if stop is not None:  # still over budget: it stays paused until the budget is raised
                return self.run
            self._commit(Batch(run=RunUpdate(status=RunStatus.RUNNING, status_reason="resumed")))
        if run.status == RunStatus.PENDING:
            self._commit(Batch(run=RunUpdate(status=RunStatus.RUNNING)))
        elif run.status == RunStatus.COMPENSATING:  # a rollback was under way: finish it
            self._rollback = Rollback(self, run.status_reason or "rollback")
        return self._loop()

    # ------------------------------------------------------------------ stop signals

    def _install_stop_handlers(self) -> None:
        """SIGINT/SIGTERM stop the driver cleanly (main thread only; the previous handlers come
        back when ``drive`` returns). The first signal sets a flag: the loop stops at its next
        boundary (with the inline executor a step running in this thread finishes first), settles
        what is in flight, commits what finished, releases the lease and raises
        ``DriverInterrupted``. A second signal ends the process at once (exit 130 or 143, or the
        application's own handler if it installed one): a resume on this host takes the lease
        over at once, its owner being provably gone."""
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in STOP_SIGNALS:
            try:
                self._saved_handlers[signum] = posix_signal.signal(signum, self._on_stop_signal)
            except (ValueError, OSError):  # not the main interpreter, or a platform without it
                continue

    def _restore_stop_handlers(self) -> None:
        for signum, previous in self._saved_handlers.items():
            posix_signal.signal(signum, previous if previous is not None else posix_signal.SIG_DFL)
        self._saved_handlers.clear()

    def _on_stop_signal(self, signum: int, frame: FrameType | None) -> None:
        if self._interrupted is None:
            self._interrupted = posix_signal.Signals(signum).name
            log.warning("run %s: %s received: stopping at the next boundary (again to stop at once)",
                        self.run_id, self._interrupted)
            return
        # The second signal stops at once, whatever the step in flight does: an inline step cannot
        # be preempted, a KeyboardInterrupt can be swallowed by the step, and a shell that started
        # this process in the background leaves SIGINT ignored. An application's own handler is
        # called instead. The process ends with 130 (SIGINT) or 143 (SIGTERM), its lease still
        # held: its pid is gone, so `raysaga resume` on this host takes the lease over at once.
        import contextlib
        import os

        self._restore_stop_handlers()
        previous = posix_signal.getsignal(signum)
        if callable(previous) and previous is not posix_signal.default_int_handler:
            previous(signum, frame)
            return
        name = posix_signal.Signals(signum).name
        with contextlib.suppress(OSError):  # os.write: a handler must not re-enter sys.stderr's buffer
            os.write(2, f"interrupted by {name} again: stopped at once, inside the step in flight; "
                        f"`raysaga resume {self.run_id}` continues it (on this host it takes the lease "
                        f"over at once)\n".encode("utf-8", "replace"))
        os._exit(128 + signum)

    def _stop_interrupted(self) -> None:
        """Commit what finished, then raise ``DriverInterrupted`` (``drive`` settles and releases)."""
        assert self._interrupted is not None
        for key, flight in list(self._inflight.items()):
            self.executor.cancel(flight.handle)
            del self._inflight[key]
        self._settle_cancelled("the driver stops", SETTLE_SECONDS / 10)
        self._pending_batch.events.append(NewEvent(kind="driver_interrupted", data={
            "signal": self._interrupted, "owner": self.owner}))
        self._flush()
        raise DriverInterrupted(self.run_id, self._interrupted)

    # ------------------------------------------------------------------ blob integrity

    def blob(self, digest: str, where: str) -> Any:
        """A blob's JSON value, checked by the store; ``BlobIntegrityError`` if missing, altered or not JSON."""
        return self.blobs({digest: where})[digest]

    def blobs(self, wanted: dict[str, str]) -> dict[str, Any]:
        """Blobs' JSON values by digest (``wanted`` maps each to what reads it, for the error), each
        verified and parsed by the store (``load_blobs``): a missing, altered or non-JSON blob raises
        ``BlobIntegrityError``, which parks the run."""
        self._blob_refs.update(wanted)
        return self.store.load_blobs(wanted)

    def _park_on_blob(self, exc: BlobIntegrityError) -> RunRecord:
        """A blob the run needs is missing or altered: park the run (``failed``, or
        ``compensation_failed`` mid-rollback) naming the node and digest; never use the data."""
        assert self._hb is not None
        for flight in self._inflight.values():
            self.executor.cancel(flight.handle)
        self._inflight.clear()
        self._settle_cancelled("the run is parked", SETTLE_SECONDS / 10)
        where = self._blob_refs.get(exc.digest) or exc.where
        current = self.store.get_run(self.run_id, lenient=True)  # its own input may be the damaged blob
        if current.status in TERMINAL or current.status in PARKED:
            return current
        target = RunStatus.COMPENSATION_FAILED if current.status == RunStatus.COMPENSATING else RunStatus.FAILED
        reason = (f"blob {exc.digest} of {where or 'this run'} {exc.problem}: the store was changed outside "
                  "raysaga, so the run is parked and the data not used; restore the blob (or the node) and "
                  f"`raysaga retry {self.run_id}`")[:1000]
        error = {"type": "BlobIntegrityError", "digest": exc.digest, "problem": exc.problem, "node": where,
                 "message": str(exc)}
        batch = Batch()  # the pending batch may hold writes computed from the data: drop it
        self._pending_batch = Batch()
        if not can_transition(current.status, target) and can_transition(current.status, RunStatus.RUNNING):
            self._commit(Batch(run=RunUpdate(status=RunStatus.RUNNING, status_reason="resumed")))
        batch.events.append(NewEvent(kind="blob_integrity_error", node_id=None, data={
            "digest": exc.digest, "problem": exc.problem, "node": where}))
        batch.run = RunUpdate(status=target, status_reason=reason, error=error, set_error=True)
        record = self._commit(batch)
        log.error("run %s: %s", self.run_id, reason)
        return record or self.store.get_run(self.run_id, lenient=True)

    # ------------------------------------------------------------------ restore

    def _new_budgets(self, run: RunRecord) -> RunUpdate | None:
        """Budgets given to this resume (raising a spent one lets a paused run go on)."""
        tokens = self.options.token_budget if self.options.token_budget is not None else run.token_budget
        cost = self.options.cost_budget if self.options.cost_budget is not None else run.cost_budget
        if (tokens, cost) == (run.token_budget, run.cost_budget):
            return None
        return RunUpdate(token_budget=tokens, cost_budget=cost, set_budgets=True)

    def _restore(self, snap: RunSnapshot) -> None:
        run = snap.run
        self._retries_used = run.retries_used
        self._tokens, self._cost = run.tokens_used, run.cost_used
        blobs = self.blobs({n.output_digest: f"node {n.label}" for n in snap.nodes if n.output_digest})
        for node in snap.nodes:
            key = (node.node_id, node.fan_index)
            if is_agent_call(node.node_id):  # a model turn or tool call: its agent node replays it
                self._agent_rows.setdefault((split_call(node.node_id)[0], node.fan_index), []).append(node)
                if node.status == NodeStatus.COMPLETED:
                    self.outputs[key] = blobs[node.output_digest] if node.output_digest else node.output
                continue
            spec = self.wf.steps.get(node.node_id)
            if spec is None:
                continue  # a compensation's row: the rollback reads those itself
            self._restored[key] = node
            self._attempts[key] = node.attempt
            if spec.map_over is not None and node.fan_index < 0:
                self._fanout.set_round(node.node_id, max(1, node.attempt))
                if spec.fan_out_policy.kind == "all":
                    # An ALL fan-out's parent row holds no output: its output is the list of its
                    # items', which output_of collects (restoring the None broke its dependents).
                    continue
            if node.status == NodeStatus.COMPLETED:
                self.outputs[key] = blobs[node.output_digest] if node.output_digest else node.output
        for effect in snap.effects:
            self._ledger[effect.idempotency_key] = (effect.status, effect.result)
        assert self._hb is not None
        self._hb.signals.extend(snap.signals)
        self.progress.total = len(self.wf.steps)

    # ------------------------------------------------------------------ the loop

    def _loop(self) -> RunRecord:
        assert self._hb is not None
        while True:
            if self._hb.lost.is_set():
                raise LeaseLostError(f"run {self.run_id!r}: lease lost; stopping without further calls")
            if self._interrupted is not None:
                self._stop_interrupted()
            if self._rollback is None:
                terminal = self._check_signals_and_deadline()
                if terminal is not None:
                    return terminal
            self._fire_timers()
            terminal = self._dispatch_ready()
            if terminal is not None:
                return terminal
            if self._pause_reason is not None:
                return self._pause()
            if not self._inflight:
                if self._timers:
                    self._sleep_until(self._timers[0][0])
                    continue
                if self._rollback is not None:
                    if not self._rollback.plan.settled():
                        continue
                    return self._finish_rollback()
                if not self._sched.settled():  # settled nodes made others ready: dispatch them
                    if self._sched.has_ready() or self._agents_due:
                        continue
                    raise RaySagaError(f"run {self.run_id!r} cannot progress: nothing is ready, running or "
                                       "waiting, yet steps are unfinished (a raysaga bug: please report it)")
                return self._finish()
            finished = self.executor.wait(None, self._wait_timeout())
            if self._timed:
                finished += self._expire_timeouts()
            if finished:
                terminal = self._absorb(finished)
                if terminal is not None:
                    return terminal
                if self._may_dispatch_before_commit(finished):
                    terminal = self._dispatch_ready()
                    if terminal is not None:
                        return terminal
                self._flush()
            elif self._unrecorded:
                self._flush(running=True)  # a quiet tick: attempts still in flight become durable as 'running'
            elif not self._pending_batch.empty():
                self._flush()

    def _may_dispatch_before_commit(self, finished: list[Handle]) -> bool:
        """Whether what these completions made ready may start while their batch is being committed.

        Overlapping the next attempts with the fsync is what lets a chain run at Ray's pace. It is
        safe for plain steps: they are at-least-once, and a crash before the commit re-runs both.
        It is not for a batch holding an effect's result or ledger row (the result is durable
        before anything else happens), nor for a model turn (invariant 3: a response is persisted
        before any tool it asked for runs), nor during a rollback or once a pause is asked for.
        """
        return (self._rollback is None and self._pause_reason is None and not self._pending_batch.effects
                and not any(is_agent_call(h.key[0]) for h in finished)
                and not (self._hb is not None and self._hb.waiting("cancel")))  # a cancel first

    def _wait_timeout(self) -> float:
        now = self.clock()
        horizon = now + IDLE_TICK
        if self._timers:
            horizon = min(horizon, self._timers[0][0])
        for key, flight in list(self._timed.items()):
            if self._inflight.get(key) is not flight:
                del self._timed[key]  # finished or cancelled
            elif (deadline := flight.deadline_from(now)) is not None:
                horizon = min(horizon, deadline)
        return max(0.0, horizon - now)

    def _sleep_until(self, when: float) -> None:
        delay = min(IDLE_TICK, when - self.clock())
        if delay > 0:
            time.sleep(delay)  # a durable backoff timer: nothing else can finish meanwhile

    # ------------------------------------------------------------------ dispatch

    def _fire_timers(self) -> None:
        now = self.clock()
        while self._timers and self._timers[0][0] <= now:
            _, key = heapq.heappop(self._timers)
            if self._rollback is not None and is_compensation(key[0]):
                self._rollback.retry_later(key)
            elif self._rollback is None and is_agent_call(key[0]):
                owner = (split_call(key[0])[0], key[1])
                self._agents[owner].due(key)
                self._agents_due.add(owner)
            elif self._rollback is None:
                self._sched.push(key)

    def _dispatch_ready(self) -> RunRecord | None:
        if self._interrupted is not None:
            return None  # a stop signal: nothing new starts; the loop stops at its top
        batch = self._pending_batch
        to_submit: list[tuple[NodeKey, NodeCall]] = []
        if self._rollback is not None:
            to_submit = self._rollback.ready_calls(batch)
        else:
            while True:
                while keys := self._sched.pop_ready():  # settling a node can make more ready
                    for key in keys:
                        call = self._prepare(key, batch)
                        if call is not None:
                            to_submit.append((key, call))
                if not self._agents_due:
                    break
                due, self._agents_due = self._agents_due, set()
                for owner in sorted(due):
                    to_submit += self._agents[owner].advance(batch)
            if self._failure is not None:  # prepared in this round but never to be sent
                for key, call in to_submit:
                    batch.nodes.append(NodeWrite(node_id=key[0], fan_index=key[1], status=NodeStatus.CANCELLED,
                                                 attempt=call.ctx.attempt, error={"reason": "not sent: the run failed"},
                                                 finished_at=self.clock()))
            terminal = self._pop_failure()
            if terminal is not None or self._rollback is not None:
                return terminal
        if not to_submit:
            return None
        if batch.effects:
            labels = [node_label(e.node_id, e.fan_index) for e in batch.effects]
            self.faults.hit("before_pending", labels)
            self._flush()
            self.faults.hit("after_pending", labels)
        self._ensure_lease()
        now = self.clock()
        for key, call in to_submit:
            if self._interrupted is not None:
                break  # a stop signal: what is not sent yet stays unsent (an inline step runs at submit)
            spec = self.specs[key[0]]
            handle = self.executor.submit(spec, call, f"{self.run_id}:{node_label(*key)}")
            flight = self._inflight[key] = InFlight(handle, call.ctx.attempt, now, timeout=spec.timeout,
                                                    recorded=self._records_before_dispatch(spec))
            if spec.timeout is not None:
                flight.deadline_from(now)
                self._timed[key] = flight
            if not flight.recorded:
                self._unrecorded.append(key)
        if len(self._unrecorded) > 2 * len(self._inflight) + 64:  # amortised O(1): drop keys no longer in flight
            self._unrecorded = [k for k in self._unrecorded if k in self._inflight]
        return None

    def _records_before_dispatch(self, spec: StepSpec) -> bool:
        """Effects and compensated steps are durable as 'running' before their call, so a rollback
        that starts while they are in flight (or after a crash) knows to compensate them."""
        return spec.effect or (spec.name in self.wf.steps and self.wf.compensation_for(spec.name) is not None)

    def _prepare(self, key: NodeKey, batch: Batch) -> NodeCall | None:
        """Turn a ready forward node into a call, or settle it without one (restored, fan-out parent)."""
        step, index = key
        spec = self.wf.steps[step]
        row = self._restored.pop(key, None)
        if row is not None and row.status in (NodeStatus.FAILED, NodeStatus.SKIPPED):
            self._settle_failed(key, batch, row.error or {}, write=False, attempts=row.attempt)
            return None
        if spec.map_over is not None and index < 0:
            self._expand(step, row, batch)
            return None
        if row is not None and row.status == NodeStatus.COMPLETED:
            self._settle_completed(key, batch, write=False)
            return None
        if spec.kind == "agent":
            self._start_agent(key, spec, row, batch)
            return None
        if (row is not None and row.status == NodeStatus.RETRYING and row.not_before
                and row.not_before > self.clock()):
            heapq.heappush(self._timers, (row.not_before, key))  # a durable backoff survives the crash
            return None
        kwargs = self.kwargs(step, index)
        ekey = effect_key(self.run_id, step, index, spec.effect_name, kwargs) if spec.effect else None
        return self.make_call(key, spec, kwargs, ekey, batch)

    def make_call(self, key: NodeKey, spec: StepSpec, kwargs: dict[str, Any], ekey: str | None,
                  batch: Batch) -> NodeCall | None:
        """The shared half of dispatch: attempt count, ledger (pending before the call), pre-records."""
        node_id, index = key
        attempt = self._attempts.get(key, 0) + 1
        self._attempts[key] = attempt
        reconciling = False
        if ekey is not None:
            self._keys[key] = ekey
            status, result = self._ledger.get(ekey, (None, None))
            if status == EffectStatus.COMMITTED:  # its result is durable: never call it again
                if isinstance(result, dict) and set(result) == {"blob"}:
                    result = self.blob(result["blob"], f"node {node_label(node_id, index)}")
                self.outputs[key] = result
                batch.nodes.append(NodeWrite(node_id=node_id, fan_index=index, status=NodeStatus.COMPLETED,
                                             attempt=attempt, output=result, finished_at=self.clock()))
                batch.events.append(NewEvent(kind="node_completed", node_id=node_id, fan_index=index,
                                             data={"attempt": attempt, "from": "ledger"}))
                self._after_success(key, batch)
                return None
            reconciling = status == EffectStatus.PENDING
            self._ledger[ekey] = (EffectStatus.PENDING, None)
            batch.effects.append(EffectWrite(idempotency_key=ekey, node_id=node_id, fan_index=index,
                                             effect_name=spec.effect_name, args_digest=args_digest(kwargs),
                                             status=EffectStatus.PENDING))
        if self._records_before_dispatch(spec):
            batch.nodes.append(NodeWrite(node_id=node_id, fan_index=index, status=NodeStatus.RUNNING,
                                         attempt=attempt, started_at=self.clock()))
        ctx = StepContext(run_id=self.run_id, node_id=node_id, fan_index=index, attempt=attempt,
                          trace_id=self.run.trace_id if self.run else "", idempotency_key=ekey,
                          reconciling=reconciling)
        return NodeCall(ctx=ctx, kwargs=kwargs, max_output_bytes=self.options.max_output_bytes,
                        reconcile=reconciling)

    def schedule(self, when: float, key: NodeKey) -> None:
        """Dispatch ``key`` again at ``when`` (a durable retry timer)."""
        heapq.heappush(self._timers, (when, key))

    def restore_attempts(self, key: NodeKey, attempts: int) -> None:
        self._attempts[key] = attempts

    def kwargs(self, step: str, index: int) -> dict[str, Any]:
        """The JSON inputs of a forward node: run input, upstream outputs, its fan-out item."""
        spec = self.wf.steps[step]
        kwargs: dict[str, Any] = {}
        if spec.input_param:
            kwargs[spec.input_param] = self.run.input if self.run else None
        for dep in spec.param_deps:
            value = self.output_of(dep)
            kwargs[dep] = value[index] if dep == spec.map_over else value
        return kwargs

    def output_of(self, step: str) -> Any:
        key = (step, -1)
        if key not in self.outputs and self.wf.steps[step].map_over is not None:
            self.outputs[key] = self._collect_items(step)
        return self.outputs[key]

    def _collect_items(self, step: str) -> list[Any]:
        return [self.outputs[(step, i)] for i in range(self._fan_total(step))]

    def _fan_total(self, step: str) -> int:
        upstream = self.wf.steps[step].map_over
        assert upstream is not None
        return len(self.output_of(upstream))

    def _expand(self, step: str, row: NodeRecord | None, batch: Batch) -> None:
        spec = self.wf.steps[step]
        assert spec.map_over is not None
        if row is not None and row.status == NodeStatus.COMPLETED and spec.fan_out_policy.partial:
            # its FanOutResult was restored with the parent row: the items need not be replayed
            self._parents_done.add(step)
            self._count_done(self._sched.expand(step, 0))
            return
        items = self.output_of(spec.map_over)
        if not isinstance(items, list):
            error = {"type": "FanOutError", "transient": False,
                     "message": f"step {step!r} maps over {spec.map_over!r}, whose output is a "
                                f"{type(items).__name__}, not a list"}
            self._fail_node((step, -1), batch, error, attempts=0)
            return
        if row is None:
            batch.events.append(NewEvent(kind="fanout_expanded", node_id=step, data={"items": len(items)}))
        elif row.status == NodeStatus.COMPLETED:
            self._parents_done.add(step)
        done = self._sched.expand(step, len(items))
        if done:  # zero items: nothing failed, the policy has nothing to weigh
            if spec.fan_out_policy.partial:
                self.outputs[(step, -1)] = self._fanout.result(step, self.outputs, 0).model_dump(mode="json")
            self._write_parent_done(step, batch)
            self._count_done(done)

    # ------------------------------------------------------------------ outcomes

    def _absorb(self, finished: list[Handle]) -> RunRecord | None:
        batch = self._pending_batch
        for handle in finished:
            key = handle.key
            flight = self._inflight.pop(key, None)
            if flight is None:  # cancelled while this batch was absorbed (a closed fan-out's sibling)
                continue
            outcome = handle.outcome
            assert outcome is not None
            if outcome.ok:
                self._on_success(key, flight, outcome, batch)
            else:
                self._on_failure(key, flight, outcome, batch)
        if self._rollback is not None:
            return None
        return self._pop_failure()

    def _on_success(self, key: NodeKey, flight: InFlight, outcome: NodeOutcome, batch: Batch) -> None:
        assert outcome.output_json is not None
        node_id, index = key
        spec = self.specs[node_id]
        value = jsoncodec.loads(outcome.output_json)
        self.outputs[key] = value
        data = outcome.output_json.encode("utf-8")
        digest = None
        if len(data) > self.options.blob_threshold:
            digest = jsoncodec.digest(data)
            batch.blobs[digest] = data
        ekey = self._keys.get(key)
        if ekey is not None:
            self._ledger[ekey] = (EffectStatus.COMMITTED, value)
            batch.effects.append(EffectWrite(
                idempotency_key=ekey, node_id=node_id, fan_index=index, effect_name=spec.effect_name,
                args_digest="", status=EffectStatus.COMMITTED,
                result={"blob": digest} if digest else value))
        batch.nodes.append(NodeWrite(
            node_id=node_id, fan_index=index, status=NodeStatus.COMPLETED, attempt=flight.attempt,
            output=None if digest else value, output_digest=digest, started_at=outcome.started_at,
            finished_at=outcome.finished_at, duration=outcome.finished_at - outcome.started_at))
        batch.events.append(NewEvent(kind="node_completed", node_id=node_id, fan_index=index,
                                     data={"attempt": flight.attempt}))
        self._after_success(key, batch)

    def _after_success(self, key: NodeKey, batch: Batch) -> None:
        if is_agent_call(key[0]):
            owner = (split_call(key[0])[0], key[1])
            self._agents[owner].on_success(key, self.outputs[key], batch)
            self._agents_due.add(owner)
        elif is_compensation(key[0]):
            assert self._rollback is not None
            self._rollback.completed(key)
        else:
            self._settle_completed(key, batch, write=False)

    def _on_failure(self, key: NodeKey, flight: InFlight, outcome: NodeOutcome, batch: Batch) -> None:
        node_id, index = key
        spec = self.specs[node_id]
        policy = spec.retry or DEFAULT_RETRY
        error = dict(outcome.error or {})
        compensating = is_compensation(node_id)  # a rollback is not stopped by the run's retry budget
        budget = self.run.retry_budget if self.run and not compensating else None
        budget_left = budget is None or self._retries_used < budget
        if outcome.transient and flight.attempt < policy.max_attempts and budget_left:
            delay = backoff_delay(flight.attempt, policy, self.rng)
            not_before = self.clock() + delay
            self._retries_used += 1
            batch.run = merge_run(batch.run, RunUpdate(retries_delta=1))
            batch.nodes.append(NodeWrite(node_id=node_id, fan_index=index, status=NodeStatus.RETRYING,
                                         attempt=flight.attempt, not_before=not_before, error=error,
                                         started_at=outcome.started_at, finished_at=outcome.finished_at))
            # the whole error, its (redacted, bounded) traceback included: the node row keeps only
            # the latest attempt's, and `raysaga status --errors` shows every attempt's
            data = {"attempt": flight.attempt, "delay": round(delay, 4), "error": error}
            if compensating:  # a rollback waiting on an undo: say which, which attempt, next try when
                data["not_before"] = round(not_before, 3)
            batch.events.append(NewEvent(kind="compensation_retry" if compensating else "retry_scheduled",
                                         node_id=node_id, fan_index=index, data=data))
            heapq.heappush(self._timers, (not_before, key))
            return
        if outcome.transient and not budget_left:
            error["reason"] = "retry budget exhausted"
        elif outcome.transient:
            error["reason"] = f"{flight.attempt} attempts exhausted"
        ekey = self._keys.get(key)
        if ekey is not None:
            self._ledger[ekey] = (EffectStatus.FAILED, None)
            batch.effects.append(EffectWrite(idempotency_key=ekey, node_id=node_id, fan_index=index,
                                             effect_name=spec.effect_name, args_digest="",
                                             status=EffectStatus.FAILED, result={"error": short_error(error)}))
        batch.nodes.append(NodeWrite(node_id=node_id, fan_index=index, status=NodeStatus.FAILED,
                                     attempt=flight.attempt, error=error, started_at=outcome.started_at,
                                     finished_at=outcome.finished_at))
        batch.events.append(NewEvent(kind="node_failed", node_id=node_id, fan_index=index,
                                     data={"attempt": flight.attempt, "error": short_error(error)}))
        if compensating:
            assert self._rollback is not None
            self._rollback.failed(key, error)
        elif is_agent_call(node_id):
            owner = (split_call(node_id)[0], index)
            self._agents[owner].on_failure(key, error, batch)
            self._agents_due.add(owner)
        else:
            self._settle_failed(key, batch, error, write=False, attempts=flight.attempt)

    # ------------------------------------------------------------------ failure, rollback, finish

    def _pop_failure(self) -> RunRecord | None:
        """A critical node failed for good: stop dispatching, cancel what is in flight, roll back
        what was done (or fail the run when nothing needs undoing)."""
        if self._failure is None:
            return None
        label, error = self._failure
        reason = f"critical step {label!r} failed: {error.get('message') or error.get('reason') or ''}"[:500]
        return self._stop_forward(reason, {"node": label, **short_error(error)})

    def _stop_forward(self, reason: str, error: dict[str, Any] | None, *,
                      final: RunStatus = RunStatus.FAILED, signal_id: int | None = None) -> RunRecord | None:
        self._cancel_inflight(self._pending_batch, reason=reason)
        self._settle_cancelled("rolling back or failing the run", SETTLE_SECONDS)
        self._flush()  # the failure and the cancellations are durable before the rollback reads them
        rollback = Rollback(self, reason)
        batch = self._pending_batch
        if signal_id is not None:  # consumed with the transition, so a crash in between re-reads it
            batch.consumed_signals.append(signal_id)
        if final == RunStatus.COMPENSATING or rollback.plan.targets:
            batch.run = merge_run(batch.run, RunUpdate(status=RunStatus.COMPENSATING, status_reason=reason,
                                                        error=error, set_error=error is not None))
            batch.events.append(NewEvent(kind="rollback_started",
                                         data={"reason": reason, "targets": len(rollback.plan.targets)}))
            self.faults.hit("before_transition", ["*"])
            self._flush()
            self._rollback = rollback
            return None
        batch.run = merge_run(batch.run, RunUpdate(status=final, status_reason=reason, error=error,
                                                    set_error=error is not None))
        self.faults.hit("before_transition", ["*"])
        return self._flush()

    def _finish_rollback(self) -> RunRecord:
        assert self._rollback is not None
        batch = self._pending_batch
        batch.run = merge_run(batch.run, self._rollback.outcome())
        self.faults.hit("before_transition", ["*"])
        record = self._flush()
        assert record is not None
        return record

    def _cancel_inflight(self, batch: Batch, reason: str) -> None:
        for key, flight in list(self._inflight.items()):
            self.executor.cancel(flight.handle)
            batch.nodes.append(NodeWrite(node_id=key[0], fan_index=key[1], status=NodeStatus.CANCELLED,
                                         attempt=flight.attempt, error={"reason": reason},
                                         started_at=flight.started_at, finished_at=self.clock()))
        self._inflight.clear()
        self._timed.clear()
        self._timers = [(t, k) for t, k in self._timers if is_compensation(k[0])]

    def _settle_cancelled(self, then: str, timeout: float) -> None:
        """Wait for cancelled attempts to stop: one still running could land an effect after its
        compensation, or after the run says it ended."""
        left = self.executor.settle_cancelled(timeout)
        if left:
            log.warning("run %s: %d cancelled attempt(s) still running after %.0fs; %s anyway",
                        self.run_id, left, timeout, then)

    def _expire_timeouts(self) -> list[Handle]:
        now = self.clock()
        expired = []
        for key, flight in list(self._timed.items()):
            if self._inflight.get(key) is not flight:
                del self._timed[key]  # finished or cancelled
                continue
            deadline = flight.deadline_from(now)
            if deadline is not None and now >= deadline and flight.handle.outcome is None:
                self.executor.cancel(flight.handle)
                spec = self.specs[key[0]]
                flight.handle.outcome = NodeOutcome.failure(
                    TimeoutError(f"step {node_label(*key)!r} exceeded its timeout of {spec.timeout}s"),
                    transient=True, started_at=flight.started_at)
                expired.append(flight.handle)
        return expired

    def _check_signals_and_deadline(self) -> RunRecord | None:
        assert self._hb is not None
        for signal in self._hb.take_signals():
            if signal.id in self._handled_signals:
                continue
            self._handled_signals.add(signal.id)
            if signal.kind == "cancel":
                payload = signal.payload if isinstance(signal.payload, dict) else {}
                reason = str(payload.get("reason") or "cancelled by operator")
                if payload.get("compensate"):
                    return self._stop_forward(reason, None, final=RunStatus.COMPENSATING, signal_id=signal.id)
                batch = self._pending_batch
                self._cancel_inflight(batch, reason="run cancelled")
                self._settle_cancelled("the run is cancelled", SETTLE_SECONDS)
                batch.consumed_signals.append(signal.id)
                batch.run = merge_run(batch.run, RunUpdate(status=RunStatus.CANCELLED, status_reason=reason))
                return self._flush()
        run = self.run
        if run is not None and run.deadline_at is not None and self.clock() >= run.deadline_at:
            return self._stop_forward("deadline", {"type": "DeadlineExceeded",
                                                   "message": "the run passed its deadline"})
        return None

    def _finish(self) -> RunRecord:
        output = {s: self.output_of(s) for s in self.wf.sinks() if s in self._sched.completed}
        batch = self._pending_batch
        batch.run = merge_run(batch.run, RunUpdate(status=RunStatus.COMPLETED, output=output, set_output=True))
        self.faults.hit("before_transition", ["*"])
        record = self._flush()
        assert record is not None
        return record

    # ------------------------------------------------------------------ writes

    def _ensure_lease(self) -> None:
        """Before any call: a driver that was stopped past its lease must find out now."""
        assert self._hb is not None
        if self._hb.lost.is_set():
            raise LeaseLostError(f"run {self.run_id!r}: lease lost")
        if time.time() > self._hb.lease.expires_at - self.options.lease_ttl / 3:
            self._hb.renew()

    def _flush(self, *, running: bool = False) -> RunRecord | None:
        batch = self._pending_batch
        if running:
            # Attempts still in flight at a quiet tick become durable as 'running'. One that finishes
            # before goes straight to 'completed': recovery needs no 'running' row for a plain step (a
            # node without a row is pending, and a resume re-runs an unfinished attempt either way;
            # effects and compensated steps are recorded before their call), and skipping it halves
            # the node writes of short steps.
            for key in self._unrecorded:
                flight = self._inflight.get(key)
                if flight is not None and not flight.recorded:
                    flight.recorded = True
                    batch.nodes.append(NodeWrite(node_id=key[0], fan_index=key[1], status=NodeStatus.RUNNING,
                                                 attempt=flight.attempt, started_at=flight.started_at))
            self._unrecorded = []
        if batch.empty():
            return None
        # Crash points before_commit/after_commit name the nodes whose *outcome* this batch makes
        # durable. A 'running' row (an effect's pending write, an in-flight node) is no outcome:
        # counting it made `before_commit:<effect>` fire on the pending flush, before the call,
        # so the window "call returned, result not yet durable" was never exercised.
        labels = [node_label(n.node_id, n.fan_index) for n in batch.nodes if n.status != NodeStatus.RUNNING]
        self.faults.hit("before_commit", labels)
        # Commit a copy and empty the pending batch in place: callers mid-round (an agent's
        # advance, a dispatch) hold a reference to it and go on appending to it after a flush.
        return self._commit(batch.take(), labels)

    def _commit(self, batch: Batch, labels: list[str] | None = None) -> RunRecord | None:
        assert self._hb is not None
        record = self.store.commit(self._hb.lease, batch)
        if record is not None:
            self.run = record
        self.faults.hit("after_commit", labels or [])
        return record
