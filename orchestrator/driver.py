"""The driver loop: the single writer that advances one run.

It claims the run's lease, rebuilds the run from the store (constant number of queries),
dispatches ready nodes through an executor, drains every finished attempt and commits their
checkpoints in one transaction, and repeats. Every write carries the lease's fence; a stale
fence stops the driver before it makes another call.

Delivery guarantees: an ``effect=True`` step runs through the ledger (``pending`` is durable
before the call, ``committed`` with the result after), so it takes effect at most once per
idempotency key. Other steps are at-least-once: a crash while one is in flight re-runs it.
"""

from __future__ import annotations

import heapq
import logging
import os
import random
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from raysaga.errors import LeaseLostError, UserError
from raysaga.orchestrator.context import StepContext
from raysaga.orchestrator.executor import Executor, Handle
from raysaga.orchestrator.faults import Faults
from raysaga.orchestrator.heartbeat import Heartbeat
from raysaga.orchestrator.keys import args_digest, effect_key
from raysaga.orchestrator.options import DEFAULT_RETRY, RunOptions
from raysaga.orchestrator.retry import backoff_delay
from raysaga.orchestrator.scheduler import NodeKey, Scheduler
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
from raysaga.state.models import PARKED, TERMINAL

log = logging.getLogger("raysaga.driver")

#: How often the main loop wakes with nothing finished, to look at signals and deadlines.
IDLE_TICK = 0.25


def driver_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


@dataclass
class _InFlight:
    handle: Handle
    attempt: int
    started_at: float
    deadline: float | None
    recorded: bool = False  # a 'running' row is durable


@dataclass
class _Progress:
    """Counters a progress display reads."""

    total: int = 0
    done: int = 0
    failed: int = 0
    listeners: list[Callable[[_Progress], None]] = field(default_factory=list)

    def notify(self) -> None:
        for listener in self.listeners:
            listener(self)


class Driver:
    """Advances one run to a resting state (completed, failed, cancelled, or lease lost)."""

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
        self.progress = _Progress()
        self._sched = Scheduler(self.wf)
        self._outputs: dict[NodeKey, Any] = {}
        self._restored: dict[NodeKey, NodeRecord] = {}
        self._ledger: dict[str, tuple[EffectStatus, Any]] = {}
        self._attempts: dict[NodeKey, int] = {}
        self._timers: list[tuple[float, NodeKey]] = []
        self._inflight: dict[NodeKey, _InFlight] = {}
        self._pending_batch = Batch()
        self._handled_signals: set[int] = set()
        self._parents_done: set[str] = set()  # fan-out parents already durable as completed
        self._retries_used = 0
        self._run: RunRecord | None = None
        self._hb: Heartbeat | None = None

    # ------------------------------------------------------------------ entry point

    def drive(self) -> RunRecord:
        lease = self.store.claim(self.run_id, self.owner, self.options.lease_ttl)
        self._hb = Heartbeat(self.store, lease, period=min(1.0, self.options.lease_ttl / 3))
        lost = False
        try:
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
            self._run = run
            self._hb.start()
            self._restore(snapshot)
            if run.status == RunStatus.PENDING:
                self._commit(Batch(run=RunUpdate(status=RunStatus.RUNNING)))
            return self._loop()
        except LeaseLostError:
            lost = True
            raise
        finally:
            self._hb.stop()
            for flight in self._inflight.values():
                self.executor.cancel(flight.handle)
            if not lost and not self._hb.lost.is_set():
                self.store.release(self._hb.lease)

    # ------------------------------------------------------------------ restore

    def _restore(self, snap: RunSnapshot) -> None:
        run = snap.run
        self._retries_used = run.retries_used
        blobs = self.store.get_blobs(n.output_digest for n in snap.nodes if n.output_digest)
        for node in snap.nodes:
            key = (node.node_id, node.fan_index)
            if node.node_id not in self.wf.steps:
                continue
            self._restored[key] = node
            self._attempts[key] = node.attempt
            if node.status == NodeStatus.COMPLETED:
                if node.fan_index < 0 and self.wf.steps[node.node_id].map_over is not None:
                    # A fan-out parent's row holds no output (None): its output is the list of
                    # its items', which _output_of collects. Restoring the None made every
                    # dependent of a parent completed before the crash receive None on resume.
                    continue
                if node.output_digest:
                    self._outputs[key] = jsoncodec.loads(blobs[node.output_digest])
                else:
                    self._outputs[key] = node.output
        for effect in snap.effects:
            self._ledger[effect.idempotency_key] = (effect.status, effect.result)
        for signal in snap.signals:
            if self._hb is not None:
                self._hb.signals.append(signal)
        self.progress.total = len(self.wf.steps)

    # ------------------------------------------------------------------ the loop

    def _loop(self) -> RunRecord:
        assert self._hb is not None
        while True:
            if self._hb.lost.is_set():
                raise LeaseLostError(f"run {self.run_id!r}: lease lost; stopping without further calls")
            terminal = self._check_signals_and_deadline()
            if terminal is not None:
                return terminal
            self._fire_timers()
            failed = self._dispatch_ready()
            if failed is not None:
                return failed
            if not self._inflight:
                if self._timers:
                    self._sleep_until(self._timers[0][0])
                    continue
                if not self._sched.settled():  # settled nodes made others ready: dispatch them
                    continue
                return self._finish()
            finished = self.executor.wait([f.handle for f in self._inflight.values()], self._wait_timeout())
            finished += self._expire_timeouts()
            if finished:
                failed = self._absorb(finished)
                if failed is not None:
                    return failed
            elif self._pending_batch.empty():
                continue
            self._flush()

    def _wait_timeout(self) -> float:
        now = self.clock()
        horizon = now + IDLE_TICK
        if self._timers:
            horizon = min(horizon, self._timers[0][0])
        for flight in self._inflight.values():
            if flight.deadline is not None:
                horizon = min(horizon, flight.deadline)
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
            self._sched.push(key)

    def _dispatch_ready(self) -> RunRecord | None:
        to_submit: list[tuple[NodeKey, NodeCall]] = []
        batch = self._pending_batch
        while keys := self._sched.pop_ready():  # settling a node can make more ready
            for key in keys:
                call = self._prepare(key, batch)
                if call is not None:
                    to_submit.append((key, call))
        failed = self._pop_failure()
        if failed is not None:
            return failed
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
            spec = self.wf.steps[key[0]]
            handle = self.executor.submit(spec, call, f"{self.run_id}:{node_label(*key)}")
            self._inflight[key] = _InFlight(handle, call.ctx.attempt, now,
                                            now + spec.timeout if spec.timeout else None,
                                            recorded=spec.effect)
        return None

    def _prepare(self, key: NodeKey, batch: Batch) -> NodeCall | None:
        """Turn a ready node into a call, or settle it without one (restored or fan-out parent)."""
        step, index = key
        spec = self.wf.steps[step]
        row = self._restored.pop(key, None)
        if row is not None and row.status in (NodeStatus.FAILED, NodeStatus.SKIPPED):
            self._settle_failed(key, batch, row.error or {}, write=False)
            return None
        if spec.map_over is not None and index < 0:
            self._expand(step, row, batch)
            return None
        if row is not None and row.status == NodeStatus.COMPLETED:
            self._settle_completed(key, batch, write=False)
            return None
        if (row is not None and row.status == NodeStatus.RETRYING and row.not_before
                and row.not_before > self.clock()):
            heapq.heappush(self._timers, (row.not_before, key))  # a durable backoff survives the crash
            return None
        attempt = self._attempts.get(key, 0) + 1
        self._attempts[key] = attempt
        kwargs = self._kwargs(spec.name, index)
        ekey = None
        reconciling = False
        if spec.effect:
            ekey = effect_key(self.run_id, step, index, spec.effect_name, kwargs)
            status, result = self._ledger.get(ekey, (None, None))
            if status == EffectStatus.COMMITTED:
                self._outputs[key] = result
                self._settle_completed(key, batch, write=True, attempt=attempt)
                return None
            reconciling = status == EffectStatus.PENDING
            self._ledger[ekey] = (EffectStatus.PENDING, None)
            batch.effects.append(EffectWrite(idempotency_key=ekey, node_id=step, fan_index=index,
                                             effect_name=spec.effect_name, args_digest=args_digest(kwargs),
                                             status=EffectStatus.PENDING))
            batch.nodes.append(NodeWrite(node_id=step, fan_index=index, status=NodeStatus.RUNNING,
                                         attempt=attempt, started_at=self.clock()))
        ctx = StepContext(run_id=self.run_id, node_id=step, fan_index=index, attempt=attempt,
                          trace_id=self._run.trace_id if self._run else "", idempotency_key=ekey,
                          reconciling=reconciling)
        return NodeCall(ctx=ctx, kwargs=kwargs, max_output_bytes=self.options.max_output_bytes,
                        reconcile=reconciling)

    def _kwargs(self, step: str, index: int) -> dict[str, Any]:
        spec = self.wf.steps[step]
        kwargs: dict[str, Any] = {}
        if spec.input_param:
            kwargs[spec.input_param] = self._run.input if self._run else None
        for dep in spec.param_deps:
            value = self._output_of(dep)
            kwargs[dep] = value[index] if dep == spec.map_over else value
        return kwargs

    def _output_of(self, step: str) -> Any:
        key = (step, -1)
        if key not in self._outputs and self.wf.steps[step].map_over is not None:
            self._outputs[key] = self._collect_items(step)
        return self._outputs[key]

    def _collect_items(self, step: str) -> list[Any]:
        upstream = self.wf.steps[step].map_over
        assert upstream is not None
        count = len(self._output_of(upstream))
        return [self._outputs[(step, i)] for i in range(count)]

    def _expand(self, step: str, row: NodeRecord | None, batch: Batch) -> None:
        spec = self.wf.steps[step]
        assert spec.map_over is not None
        items = self._output_of(spec.map_over)
        if not isinstance(items, list):
            error = {"type": "FanOutError", "transient": False,
                     "message": f"step {step!r} maps over {spec.map_over!r}, whose output is a "
                                f"{type(items).__name__}, not a list"}
            self._settle_failed((step, -1), batch, error, write=True)
            return None
        if row is None:
            batch.events.append(NewEvent(kind="fanout_expanded", node_id=step, data={"items": len(items)}))
        elif row.status == NodeStatus.COMPLETED:
            self._parents_done.add(step)
        done = self._sched.expand(step, len(items))
        if done:  # zero items
            self._settle_completed((step, -1), batch, write=row is None)
        return None

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
        return self._pop_failure()

    def _on_success(self, key: NodeKey, flight: _InFlight, outcome: NodeOutcome, batch: Batch) -> None:
        assert outcome.output_json is not None
        step, index = key
        spec = self.wf.steps[step]
        value = jsoncodec.loads(outcome.output_json)
        self._outputs[key] = value
        data = outcome.output_json.encode("utf-8")
        digest = None
        if len(data) > self.options.blob_threshold:
            digest = jsoncodec.digest(data)
            batch.blobs[digest] = data
        if spec.effect:
            ekey = effect_key(self.run_id, step, index, spec.effect_name, self._kwargs(step, index))
            self._ledger[ekey] = (EffectStatus.COMMITTED, value)
            batch.effects.append(EffectWrite(
                idempotency_key=ekey, node_id=step, fan_index=index, effect_name=spec.effect_name,
                args_digest="", status=EffectStatus.COMMITTED,
                result={"blob": digest} if digest else value))
        batch.nodes.append(NodeWrite(
            node_id=step, fan_index=index, status=NodeStatus.COMPLETED, attempt=flight.attempt,
            output=None if digest else value, output_digest=digest, started_at=outcome.started_at,
            finished_at=outcome.finished_at, duration=outcome.finished_at - outcome.started_at))
        batch.events.append(NewEvent(kind="node_completed", node_id=step, fan_index=index,
                                     data={"attempt": flight.attempt}))
        self._settle_completed(key, batch, write=False)

    def _on_failure(self, key: NodeKey, flight: _InFlight, outcome: NodeOutcome, batch: Batch) -> None:
        step, index = key
        spec = self.wf.steps[step]
        policy = spec.retry or DEFAULT_RETRY
        error = dict(outcome.error or {})
        budget = self._run.retry_budget if self._run else None
        budget_left = budget is None or self._retries_used < budget
        if outcome.transient and flight.attempt < policy.max_attempts and budget_left:
            delay = backoff_delay(flight.attempt, policy, self.rng)
            not_before = self.clock() + delay
            self._retries_used += 1
            batch.run = _merge_run(batch.run, RunUpdate(retries_delta=1))
            batch.nodes.append(NodeWrite(node_id=step, fan_index=index, status=NodeStatus.RETRYING,
                                         attempt=flight.attempt, not_before=not_before, error=error,
                                         started_at=outcome.started_at, finished_at=outcome.finished_at))
            batch.events.append(NewEvent(kind="retry_scheduled", node_id=step, fan_index=index,
                                         data={"attempt": flight.attempt, "delay": round(delay, 4),
                                               "error": _short(error)}))
            heapq.heappush(self._timers, (not_before, key))
            return
        if outcome.transient and not budget_left:
            error["reason"] = "retry budget exhausted"
        elif outcome.transient:
            error["reason"] = f"{flight.attempt} attempts exhausted"
        if spec.effect:
            ekey = effect_key(self.run_id, step, index, spec.effect_name, self._kwargs(step, index))
            self._ledger[ekey] = (EffectStatus.FAILED, None)
            batch.effects.append(EffectWrite(idempotency_key=ekey, node_id=step, fan_index=index,
                                             effect_name=spec.effect_name, args_digest="",
                                             status=EffectStatus.FAILED, result={"error": _short(error)}))
        batch.nodes.append(NodeWrite(node_id=step, fan_index=index, status=NodeStatus.FAILED,
                                     attempt=flight.attempt, error=error, started_at=outcome.started_at,
                                     finished_at=outcome.finished_at))
        batch.events.append(NewEvent(kind="node_failed", node_id=step, fan_index=index,
                                     data={"attempt": flight.attempt, "error": _short(error)}))
        self._settle_failed(key, batch, error, write=False)

    def _settle_completed(self, key: NodeKey, batch: Batch, *, write: bool, attempt: int = 0) -> None:
        step, index = key
        if write:
            batch.nodes.append(NodeWrite(node_id=step, fan_index=index, status=NodeStatus.COMPLETED,
                                         attempt=attempt, output=self._outputs.get(key),
                                         finished_at=self.clock()))
            batch.events.append(NewEvent(kind="node_completed", node_id=step, fan_index=index,
                                         data={"attempt": attempt, "from": "ledger" if attempt else "fanout"}))
        for done in self._sched.complete(key):
            self.progress.done += 1
            if (done != step or index >= 0) and done not in self._parents_done:
                # a fan-out parent finished with its last item
                batch.nodes.append(NodeWrite(node_id=done, fan_index=-1, status=NodeStatus.COMPLETED,
                                             finished_at=self.clock()))
                batch.events.append(NewEvent(kind="node_completed", node_id=done, data={"fanout": True}))
        self.progress.notify()

    _failure: tuple[str, dict[str, Any]] | None = None

    def _settle_failed(self, key: NodeKey, batch: Batch, error: dict[str, Any], *, write: bool) -> None:
        step, index = key
        spec = self.wf.steps[step]
        if write:
            batch.nodes.append(NodeWrite(node_id=step, fan_index=index, status=NodeStatus.FAILED, error=error,
                                         finished_at=self.clock()))
            batch.events.append(NewEvent(kind="node_failed", node_id=step, fan_index=index,
                                         data={"error": _short(error)}))
        self.progress.failed += 1
        if step in self._sched.closed:
            return
        if spec.critical:
            if self._failure is None:
                self._failure = (node_label(step, index), error)
            return
        if index >= 0:
            batch.nodes.append(NodeWrite(node_id=step, fan_index=-1, status=NodeStatus.FAILED,
                                         error={"type": "FanOutItemFailed", "message": f"item {index} failed"},
                                         finished_at=self.clock()))
        skipped_steps = self._sched.close(step)
        for k in [k for k in self._inflight if k[0] == step or k[0] in skipped_steps]:
            self.executor.cancel(self._inflight.pop(k).handle)
        for skipped in skipped_steps:
            self._restored.pop((skipped, -1), None)
            batch.nodes.append(NodeWrite(node_id=skipped, status=NodeStatus.SKIPPED,
                                         error={"reason": f"upstream step {step!r} failed"},
                                         finished_at=self.clock()))
            batch.events.append(NewEvent(kind="node_skipped", node_id=skipped, data={"because": step}))
        self.progress.notify()

    def _pop_failure(self) -> RunRecord | None:
        """A critical node failed for good: stop dispatching, cancel what is in flight, fail the run."""
        if self._failure is None:
            return None
        label, error = self._failure
        batch = self._pending_batch
        self._cancel_inflight(batch, reason=f"critical step {label!r} failed")
        batch.run = _merge_run(batch.run, RunUpdate(
            status=RunStatus.FAILED, status_reason=f"critical step {label!r} failed: {error.get('message', '')}"[:500],
            error={"node": label, **_short(error)}, set_error=True))
        self.faults.hit("before_transition", [label])
        return self._flush()

    def _cancel_inflight(self, batch: Batch, reason: str) -> None:
        for key, flight in list(self._inflight.items()):
            self.executor.cancel(flight.handle)
            batch.nodes.append(NodeWrite(node_id=key[0], fan_index=key[1], status=NodeStatus.CANCELLED,
                                         attempt=flight.attempt, error={"reason": reason},
                                         started_at=flight.started_at, finished_at=self.clock()))
        self._inflight.clear()

    def _expire_timeouts(self) -> list[Handle]:
        now = self.clock()
        expired = []
        for key, flight in self._inflight.items():
            if flight.deadline is not None and now >= flight.deadline and flight.handle.outcome is None:
                self.executor.cancel(flight.handle)
                spec = self.wf.steps[key[0]]
                flight.handle.outcome = NodeOutcome.failure(
                    TimeoutError(f"step {node_label(*key)!r} exceeded its timeout of {spec.timeout}s"),
                    transient=True, started_at=flight.started_at)
                expired.append(flight.handle)
        return expired

    # ------------------------------------------------------------------ signals, deadline, finish

    def _check_signals_and_deadline(self) -> RunRecord | None:
        assert self._hb is not None
        for signal in self._hb.take_signals():
            if signal.id in self._handled_signals:
                continue
            self._handled_signals.add(signal.id)
            if signal.kind == "cancel":
                batch = self._pending_batch
                self._cancel_inflight(batch, reason="run cancelled")
                batch.consumed_signals.append(signal.id)
                reason = (signal.payload or {}).get("reason") if isinstance(signal.payload, dict) else None
                batch.run = _merge_run(batch.run, RunUpdate(status=RunStatus.CANCELLED,
                                                            status_reason=reason or "cancelled by operator"))
                return self._flush()
        run = self._run
        if run is not None and run.deadline_at is not None and self.clock() >= run.deadline_at:
            batch = self._pending_batch
            self._cancel_inflight(batch, reason="run deadline passed")
            batch.run = _merge_run(batch.run, RunUpdate(
                status=RunStatus.FAILED, status_reason="deadline",
                error={"type": "DeadlineExceeded", "message": "the run passed its deadline"}, set_error=True))
            return self._flush()
        return None

    def _finish(self) -> RunRecord:
        output = {s: self._output_of(s) for s in self.wf.sinks() if s in self._sched.completed}
        batch = self._pending_batch
        batch.run = _merge_run(batch.run, RunUpdate(status=RunStatus.COMPLETED, output=output, set_output=True))
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

    def _flush(self) -> RunRecord | None:
        batch = self._pending_batch
        if batch.empty():
            return None
        # in-flight nodes not yet durable as 'running' become so in the same transaction
        for key, flight in self._inflight.items():
            if not flight.recorded:
                flight.recorded = True
                batch.nodes.append(NodeWrite(node_id=key[0], fan_index=key[1], status=NodeStatus.RUNNING,
                                             attempt=flight.attempt, started_at=flight.started_at))
        # Crash points before_commit/after_commit name the nodes whose *outcome* this batch makes
        # durable. A 'running' row (an effect's pending write, an in-flight node) is no outcome:
        # counting it made `before_commit:<effect>` fire on the pending flush, before the call,
        # so the window "call returned, result not yet durable" was never exercised.
        labels = [node_label(n.node_id, n.fan_index) for n in batch.nodes if n.status != NodeStatus.RUNNING]
        self.faults.hit("before_commit", labels)
        self._pending_batch = Batch()
        return self._commit(batch, labels)

    def _commit(self, batch: Batch, labels: list[str] | None = None) -> RunRecord | None:
        assert self._hb is not None
        record = self.store.commit(self._hb.lease, batch)
        if record is not None:
            self._run = record
        self.faults.hit("after_commit", labels or [])
        return record


def _merge_run(old: RunUpdate | None, new: RunUpdate) -> RunUpdate:
    if old is None:
        return new
    merged = old.model_copy()
    merged.retries_delta += new.retries_delta
    merged.tokens_delta += new.tokens_delta
    merged.cost_delta += new.cost_delta
    for field_name in ("status", "status_reason"):
        if getattr(new, field_name) is not None:
            setattr(merged, field_name, getattr(new, field_name))
    if new.set_output:
        merged.output, merged.set_output = new.output, True
    if new.set_error:
        merged.error, merged.set_error = new.error, True
    return merged


def _short(error: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in error.items() if k != "traceback"}
