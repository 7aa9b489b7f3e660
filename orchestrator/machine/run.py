"""The run machine: one run's decisions, with no I/O.

Given the run's restored state, each operation takes an input — the time, attempts that
finished, a signal, rows the shell read — and leaves its decisions in the ``Outbox``: the writes
of one fenced batch and the commands for the shell (send these attempts, cancel those, answer
these queries). It never touches the store, the executor, the clock or a thread; the driver
(``raysaga.orchestrator.driver``) is its shell and carries the decisions out (docs/architecture.md).

Concerns live in their own parts, each with its own state: ``Calls`` (attempts, ledger, retry
timers), ``Forward`` (ready steps, settling, fan-out policies), ``AgentNodes`` (agent turns),
``Rollback`` (the compensating phase) and ``Budgets``; this class routes inputs to them and
owns the run's phase and its ending.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from raysaga.errors import RaySagaError
from raysaga.node_key import NodeKey
from raysaga.orchestrator.item_block import ItemOutcomes
from raysaga.orchestrator.machine.agent_nodes import AgentNodes
from raysaga.orchestrator.machine.budgets import Budgets
from raysaga.orchestrator.machine.calls import GONE, Calls
from raysaga.orchestrator.machine.doubt import REPINNED_KEY
from raysaga.orchestrator.machine.forward import AgentStart, Forward, WaitStart, failure_reason
from raysaga.orchestrator.machine.outbox import MemoryOp, Outbox
from raysaga.orchestrator.machine.resting import gate_rest, idle_rest
from raysaga.orchestrator.machine.rollback import Rollback, RollbackReads
from raysaga.orchestrator.machine.waits import WAIT_KINDS, Waits
from raysaga.orchestrator.options import RunOptions
from raysaga.orchestrator.records import cancelled_row, merge_run, parked_reason, parks, short_error, sooner
from raysaga.orchestrator.spec import StepSpec
from raysaga.orchestrator.task import AllSucceeded, NodeOutcome
from raysaga.orchestrator.workflow import Workflow
from raysaga.state import (
    MemoryEntry,
    NewEvent,
    NodeRecord,
    NodeStatus,
    NodeWrite,
    RunRecord,
    RunSnapshot,
    RunStatus,
    RunUpdate,
    SignalRecord,
)
from raysaga.state.rate_limits import waiting_reason

#: The event, beside ``rollback_started``, that keeps why the run rolls back (its forward cause).
CAUSE_EVENT = "rollback_cause"

if TYPE_CHECKING:  # the shell's report, passed in: the machine imports no executor
    from raysaga.orchestrator.executor_base import GateHold


class Phase(StrEnum):
    FORWARD = "forward"
    ROLLBACK = "rollback"
    ENDED = "ended"


class RunMachine:
    def __init__(self, wf: Workflow, run: RunRecord, options: RunOptions, rng: random.Random) -> None:
        self.wf = wf
        self.run_id = run.run_id
        self.out = Outbox()
        self._records_first_of: dict[str, bool] = {}  # step name -> recorded 'running' before its call
        self.calls = Calls(run.run_id, run.trace_id, self.out, max_output_bytes=options.max_output_bytes,
                           blob_threshold=options.blob_threshold, rng=rng, records_first=self._records_first)
        self.calls.retry_budget = run.retry_budget
        self.calls.retries_used = run.retries_used
        self.forward = Forward(wf, run.run_id, run.input, self.calls, self.out)
        self.budgets = Budgets(run.tokens_used, run.cost_used, run.token_budget, run.cost_budget)
        self.waits = Waits(run.run_id, run.trace_id, self.calls, self.forward, self.out)
        self.agents = AgentNodes(run.run_id, run.trace_id, self.calls, self.forward, self.budgets, self.out,
                                 self.waits, max_output_bytes=options.max_output_bytes,
                                 blob_threshold=options.blob_threshold)
        self.deadline_at = run.deadline_at
        self.run_error: Any = None if run.error is None else run.error.as_dict()
        self.phase = Phase.ROLLBACK if run.status == RunStatus.COMPENSATING else Phase.FORWARD
        self.rollback: Rollback | None = None
        self._stopping: tuple[str, dict[str, Any] | None, RunStatus, int | None] | None = None
        self._restored_calls: dict[NodeKey, NodeRecord] = {}  # agents' calls stored 'running'
        self._resume_reason = run.status_reason or "rollback"
        self._decided = 0  # the newest decision signal handed in (``rest_at_gate``'s ``signals_seen``)

    def _records_first(self, spec: StepSpec) -> bool:
        """Effects and compensated steps are durable as 'running' before their call, so a rollback
        that starts while they are in flight (or after a crash) knows to compensate them."""
        if spec.effect:
            return True
        first = self._records_first_of.get(spec.name)
        if first is None:
            first = self._records_first_of[spec.name] = (spec.name in self.wf.steps
                                                         and self.wf.compensation_for(spec.name) is not None)
        return first

    # ------------------------------------------------------------------ restore

    def restore(self, snap: RunSnapshot, outputs: dict[str, Any], ledger_blobs: dict[str, Any]) -> None:
        """The run as stored. ``outputs``: the verified values of the nodes' output blobs;
        ``ledger_blobs``: those of committed effects kept as blobs whose node did not complete."""
        for row in snap.nodes:
            output = outputs[row.output_digest] if row.output_digest else row.output
            key = NodeKey.parse(row.node_id, row.fan_index)
            if row.status == NodeStatus.WAITING:
                self.waits.restored_waiting_row(key, row.started_at)  # closed if the run stops first
            if key.is_agent_call:  # a model turn or tool call: its agent node replays it
                self.agents.restore(row, output)
                if row.status == NodeStatus.RUNNING:
                    self._restored_calls[key] = row  # (settled by a cancel if its agent never starts again)
            elif not key.compensates and row.node_id in self.wf.steps:
                self.forward.restore(row, output)
                # an attempt may have left (a 'pending' row too: written only by a reset, a fan-out's
                # retry round or an operator's retry, of a node that ran): a later one is not its first
                if row.status != NodeStatus.SKIPPED and not (row.error is not None and row.error.took_effect is False) \
                        and self._records_first(self.wf.steps[row.node_id]):
                    self.calls.maybe_ran.add(key)
            # a compensation's row: the rollback reads those itself
        self.calls.ledger.update({e.idempotency_key: (e.status, e.result) for e in snap.effects})
        self.calls.in_doubt.restore(snap.effects, repinned=REPINNED_KEY in (snap.run.step_hashes or {}))  # (doubt)
        self.calls.ledger_blobs.update(ledger_blobs)

    def set_budgets(self, token_budget: int | None, cost_budget: float | None) -> None:
        self.budgets.token_budget, self.budgets.cost_budget = token_budget, cost_budget

    # ------------------------------------------------------------------ forward progress

    def advance(self, now: float) -> None:
        """Fire due timers and issue everything ready. In the forward phase, a node that fails
        for good on the way (a restored failure, a fan-out over a non-list) may set ``failure``:
        what was prepared in the same round is then recorded as never sent, not dispatched."""
        self.out.now = now
        for key in self.calls.due():
            if key.compensates:
                if self.rollback is not None:
                    self.rollback.timer_fired(key)
            elif self.rollback is not None:
                continue
            elif key.is_agent_call:
                self.agents.timer_fired(key)
            elif self.wf.steps[key.step].kind in WAIT_KINDS:
                self.waits.timer_fired(key)
            else:
                self.forward.sched.push((key.step, key.fan_index))
        if self.rollback is not None:
            self.rollback.issue_ready()
            return
        if self.phase != Phase.FORWARD:
            return
        self.forward.decide_early()  # (an agent item's failure, settled outside ``absorb``)
        while True:
            self.forward.release_held(  # (effect items that wait for room in their window)
                not self.calls.inflight and self.calls.timers.next() is None and not self.forward.sched.has_ready())
            while ready := self.forward.sched.pop_ready():  # settling a node can make more ready
                for start in self.forward.prepare_all(ready):
                    if isinstance(start, AgentStart):
                        self.agents.start(start)
                    elif isinstance(start, WaitStart):
                        self.waits.start(start)
            if not self.agents.due_nodes:
                break
            self.agents.advance_due()
        if self.forward.failure is not None:  # prepared in this round but never to be sent
            unsent = self.out.take_dispatch()
            self.calls.unissue({sent.call.idempotency_key for sent in unsent  # never called: no ledger row
                                if sent.call.idempotency_key is not None and not sent.call.reconciling})
            for sent in unsent:
                self.calls.inflight.pop(sent.key, None)
                self.out.batch.nodes.append(NodeWrite(
                    node_id=sent.key.node_id, fan_index=sent.key.fan_index, status=NodeStatus.CANCELLED,
                    attempt=sent.call.attempt, error=self.calls.unsent_error(sent.key, "the run failed"),
                    finished_at=now))

    def not_sent(self, keys: Iterable[NodeKey]) -> None:
        """Attempts the shell cancelled while they still waited in it, never sent (a Ray lane's
        queue): their rows say so, and a first attempt's says it took no effect (``Calls.not_sent``)."""
        self.calls.not_sent(keys)

    # answers to the shell's queries (see outbox.Query)

    def prompt_built(self, key: NodeKey, outcome: NodeOutcome) -> None:
        spec = self.wf.steps.get(key.step)
        if spec is not None and spec.kind == "approval" and not key.is_agent_call:
            self.waits.request_built(key, spec, outcome)
        else:
            self.agents.prompt_built(key, outcome)

    def decision(self, signal: SignalRecord, now: float) -> None:
        """A human's decision (an approve or reject signal) on a waiting approval."""
        self.out.now, self._decided = now, max(self._decided, signal.id)
        if self.phase == Phase.FORWARD and self.rollback is None:
            self.waits.signal(signal)

    def decisions_checked(self, key: NodeKey, signals: list[SignalRecord]) -> None:
        self.waits.decisions_checked(key, signals)

    def tool_admitted(self, key: NodeKey, unavailable: str | None) -> None:
        self.agents.tool_admitted(key, unavailable)

    def memory_done(self, key: NodeKey, op: MemoryOp, entry: MemoryEntry) -> None:
        self.agents.memory_done(key, op, entry)

    def absorb(self, finished: Iterable[tuple[NodeKey, NodeOutcome]], now: float) -> None:
        """Attempts that came back (a cancelled one never does: the shell drops it)."""
        self.out.now = now
        for key, outcome in finished:
            if key not in self.calls.inflight:
                continue  # cancelled while this round was absorbed (a closed fan-out's sibling)
            if key in self.calls.draining:  # an effect let land after its step failed: recorded, no more
                if outcome.ok:
                    self.calls.succeeded(key, outcome)
                else:
                    self.calls.failed(key, outcome)  # still draining there: never retried
                self.calls.draining.discard(key)
                continue
            if outcome.ok:
                value = self.calls.succeeded(key, outcome)
                if key.is_agent_call:
                    self.agents.on_success(key, value, outcome.aside)
                elif key.compensates:
                    assert self.rollback is not None
                    self.rollback.completed(key)
                else:
                    self.forward.outputs[key] = value
                    self.forward.settle_completed(key)
                continue
            failed = self.calls.failed(key, outcome)
            if failed is None:
                continue  # retried after a backoff
            error, attempts = failed
            if key.compensates:
                assert self.rollback is not None
                self.rollback.failed(key, error)
            elif key.is_agent_call:
                self.agents.on_failure(key, error)
            else:
                self.forward.settle_failed(key, error, write=False, attempts=attempts)
        self.forward.decide_early()

    def absorb_items(self, keys: list[NodeKey], outcomes: ItemOutcomes, now: float) -> None:
        """Plain items of one fan-out step that came back together (``item_block.ItemsDone``):
        what ``absorb`` does for each, without its per-item dispatch. The first that needs more
        (a failure, an output kept as a blob) and those after it go through ``absorb``."""
        self.out.now = now
        if isinstance(outcomes, AllSucceeded):
            succeeded = self.calls.all_succeeded(keys, outcomes)
            if succeeded is not None:
                self.forward.outputs.update(zip(keys, succeeded, strict=True))
                self.forward.settle_items(keys[0].step, len(keys))
                return
            outcomes = outcomes.outcomes()
        values, taken = self.calls.items_succeeded(keys, outcomes)
        outputs, settled = self.forward.outputs, 0
        for key, value in zip(keys, values, strict=False):  # values stop where the general path starts
            if value is not GONE:
                outputs[key] = value
                settled += 1
        if settled:
            self.forward.settle_items(keys[0].step, settled)
        if taken < len(keys):
            self.absorb(zip(keys[taken:], outcomes[taken:], strict=True), now)

    def may_overlap(self, finished: Iterable[NodeKey]) -> bool:
        """Whether what these completions made ready may start while their batch is being committed.

        Overlapping the next attempts with the fsync is what lets a chain run at Ray's pace. It is
        safe for plain steps: they are at-least-once, and a crash before the commit re-runs both.
        It is not for a batch holding an effect's result or ledger row (the result is durable
        before anything else happens), nor for a model turn (invariant 3: a response is persisted
        before any tool it asked for runs), nor during a rollback or once a pause is asked for.
        """
        return (self.phase == Phase.FORWARD and self.rollback is None and self.agents.pause_reason is None
                and not self.out.batch.effects and not any(k.is_agent_call for k in finished))

    # ------------------------------------------------------------------ where the run stands

    @property
    def failure(self) -> tuple[str, dict[str, Any]] | None:
        return self.forward.failure if self.phase == Phase.FORWARD else None

    @property
    def pause_reason(self) -> str | None:
        """Why the run must pause (an agent's budget or loop); only the forward DAG pauses: a
        rollback resumed from the failure's commit replays agents too, and must not pause."""
        return self.agents.pause_reason if self.phase == Phase.FORWARD else None

    def idle(self) -> bool:  # nothing in flight
        return not self.calls.inflight

    def next_timer(self) -> float | None:
        return self.calls.next_timer()

    def has_work(self) -> bool:
        """Something is ready to issue (more may start at the next ``advance``)."""
        if self.rollback is not None:
            return not self.rollback.plan.settled()
        return self.forward.sched.has_ready() or bool(self.agents.due_nodes) or self.forward.window.holding()

    def done(self) -> bool:
        """Every step settled, no agent item asking a human (forward), or every compensation (rollback)."""
        if self.rollback is not None:
            return self.rollback.plan.settled()
        return self.forward.sched.settled() and not self.agents.asking()

    def resting(self, now: float, release_after: float) -> tuple[RunStatus, float | None, str] | None:
        """Whether the run should rest without a driver: nothing in flight or ready, and what is
        left waits for a human, or for a timer further away than ``release_after`` seconds.
        Returns (``waiting_human`` or ``waiting_timer``, when it is due again, why)."""
        if not self._may_rest() or not self.idle() or self.done():
            return None
        return idle_rest(self.waits.waiting_humans(), list(self.waits.sleeping), self.next_wake(), now, release_after)

    def next_wake(self) -> float | None:
        """The next timer, or the run's deadline if sooner while something waits (a human, a timer):
        it is woken then, to roll back. None: nothing waits on time."""
        timer = self.next_timer()
        return sooner(timer, self.deadline_at) if timer is not None or self.waits.waiting_humans() else None

    def _may_rest(self) -> bool:
        """Forward, nothing failed, nothing ready to issue or being asked: only waiting is left."""
        return (self.phase == Phase.FORWARD and self.rollback is None and self.forward.failure is None
                and not self.has_work() and not self.waits.busy())

    def rest_at_gate(self, now: float, held: GateHold | None, release_after: float) -> bool:
        """Rest when every attempt in flight waits unsent at its rate limits (a provider's
        ``retry-after``, or their own pacing) for longer than ``release_after``: a driver (a worker's slot)
        held for the block does nothing. They are cancelled, never sent, and issued again (same
        keys) when the run is taken up at the gate's time, or a timer's sooner, or at once on a
        decision (``resting.gate_rest``; one recorded while this driver held the run: ``signals_seen``)."""
        if held is None or held.attempts != len(self.calls.inflight) or not self._may_rest():
            return False
        wake = min(held.until, self.next_timer() or held.until, self.deadline_at or held.until)
        if wake - now <= release_after:
            return False
        reason = waiting_reason(held.limits, getattr(held, "why", ()))  # (``RateHold``: blocked, or only paced)
        self.out.now = now
        self.calls.cancel_all(reason)
        self.rest(*gate_rest(self.waits.waiting_humans(), reason, wake), now, self._decided)
        return True

    def rest(self, status: RunStatus, wake_at: float | None, reason: str, now: float,
             signals_seen: int | None = None) -> None:
        """Record the run resting (its lease is then released): a worker takes it up at ``wake_at``,
        or when a decision arrives (``signals_seen``: the newest signal the shell handed in)."""
        self.out.now = now
        self.out.batch.run = merge_run(self.out.batch.run, RunUpdate(
            status=status, status_reason=reason, wake_at=wake_at, set_wake=True, signals_seen=signals_seen))
        self.phase = Phase.ENDED

    def check_stuck(self) -> None:
        if self.waits.requests or self.waits.busy():
            return
        if self.idle() and self.next_timer() is None and not self.done() and not self.has_work():
            raise RaySagaError(f"run {self.run_id!r} cannot progress: nothing is ready, running or waiting, "
                               "yet steps are unfinished (a raysaga bug: please report it)")

    def past_deadline(self, now: float) -> bool:
        return self.deadline_at is not None and now >= self.deadline_at

    # ------------------------------------------------------------------ stopping the forward DAG

    def stop_forward(self, reason: str, error: dict[str, Any] | None, now: float, *,
                     final: RunStatus = RunStatus.FAILED, signal_id: int | None = None) -> None:
        """Stop the forward DAG: cancel what is in flight. The shell then settles the cancelled
        attempts, commits, and hands the run's rows to ``begin_rollback``."""
        self.out.now = now
        self.calls.stop_retries(reason, self._plain)
        self.calls.cancel_all(reason)
        self.waits.stop_all(reason)  # (rows left 'running' by a driver that died: the Rollback's)
        self._stopping = (reason, error, final, signal_id)

    def _cancel_unsettled(self, reason: str) -> None:
        """The run is cancelled: nodes whose rows say 'running' with no attempt standing for them say
        'cancelled', as attempts in flight do (``cancel_all``): agents under way, rows a dead driver left
        'running' and this one never took up again, fan-out parents in a retry round; left so, an ended
        run would show them under way for ever. (A failure's rollback settles such rows: ``Rollback``.)"""
        batch = self.out.batch
        written = {(n.node_id, n.fan_index) for n in batch.nodes}
        stale: list[tuple[NodeKey, int, float | None]] = [
            (key, 1, None) for key, node in self.agents.nodes.items() if not node.finished]
        stale += [(key, row.attempt, row.started_at) for key, row in self.forward.restored.items()
                  if row.status == NodeStatus.RUNNING]
        stale += [(key, row.attempt, row.started_at) for key, row in self._restored_calls.items()
                  if key.owner not in self.agents.nodes]
        stale += [(NodeKey(step), self.forward.fanout.round(step), None)
                  for step in sorted(self.forward.running_parents)]
        for key, attempt, started_at in stale:
            if (key.node_id, key.fan_index) not in written:
                written.add((key.node_id, key.fan_index))
                batch.nodes.append(cancelled_row(key.node_id, key.fan_index, attempt, reason, self.out.now, started_at))

    def _plain(self, key: NodeKey) -> bool:
        """A step's or item's own node (its retries are the calls', not an agent's or a wait's)."""
        spec = self.wf.steps.get(key.node_id)
        return spec is not None and spec.kind == "step"

    def stop_on_failure(self, now: float) -> None:
        """A critical node failed for good: stop dispatching and roll back what was done (or fail the run)."""
        assert self.forward.failure is not None
        label, error = self.forward.failure
        reason = parked_reason(label, error) if parks(error) else failure_reason(label, error)
        self.stop_forward(reason, {"node": label, **short_error(error)}, now)

    def begin_rollback(self, rows: list[NodeRecord], blobs: dict[str, Any], now: float,
                       reads: RollbackReads | None = None) -> bool:
        """The run's rows as now durable: start compensating (True), or end the run when nothing
        needs undoing (False: the batch holds the final transition). ``reads``: what else the
        shell read for it (other runs' compensation rows; a parked run's forward cause)."""
        self.out.now = now
        batch = self.out.batch
        reads = reads or RollbackReads()
        if self._stopping is None:  # a rollback resumed after a crash
            cause = self.run_error  # a parking's record stands for the forward cause it overwrote:
            if reads.cause is not None and isinstance(cause, dict):
                cause = {**cause, "cause": reads.cause}  # (``sagas.rollback.forward_cause``)
            self.rollback = Rollback(self.wf, self.run_id, self._resume_reason, rows, blobs, self.calls,
                                     self.forward, cause, reads)
            self.phase = Phase.ROLLBACK
            return True
        reason, error, final, signal_id = self._stopping
        self._stopping = None
        cause = error if error is not None else self.run_error
        rollback = Rollback(self.wf, self.run_id, reason, rows, blobs, self.calls, self.forward, cause,
                            reads)
        if signal_id is not None:  # consumed with the transition, so a crash in between re-reads it
            batch.consumed_signals.append(signal_id)
        if final == RunStatus.COMPENSATING or (rollback.plan.targets and not parks(error)):
            batch.run = merge_run(batch.run, RunUpdate(status=RunStatus.COMPENSATING, status_reason=reason,
                                                        error=error, set_error=error is not None))
            batch.events.append(NewEvent(kind="rollback_started",
                                         data={"reason": reason, "targets": len(rollback.plan.targets)}))
            if cause is not None:  # a parking (crash loop, damaged blob) may overwrite the run's error: a
                # retried rollback reads the forward cause back from here (``driver_io.started_cause``)
                batch.events.append(NewEvent(kind=CAUSE_EVENT, data={"cause": cause}))
            self.rollback = rollback
            self.phase = Phase.ROLLBACK
            return True
        batch.run = merge_run(batch.run, RunUpdate(status=final, status_reason=reason, error=error,
                                                    set_error=error is not None))
        self.phase = Phase.ENDED
        return False

    # ------------------------------------------------------------------ endings

    def finish(self, now: float) -> None:
        """Every step settled: the run completed, with its sinks' outputs."""
        self.out.now = now
        self.out.batch.run = merge_run(self.out.batch.run, RunUpdate(
            status=RunStatus.COMPLETED, output=self.forward.sink_outputs(), set_output=True))
        self.phase = Phase.ENDED

    def finish_rollback(self, now: float) -> None:
        assert self.rollback is not None
        self.out.now = now
        self.out.batch.run = merge_run(self.out.batch.run, self.rollback.outcome())
        self.phase = Phase.ENDED

    def cancel(self, reason: str, signal_id: int, now: float) -> None:
        """An operator's cancel (without compensation): stop everything, end cancelled."""
        self.out.now = now
        self.calls.stop_retries("run cancelled", self._plain)
        self.calls.cancel_all("run cancelled")
        self.waits.stop_all("run cancelled")
        self._cancel_unsettled("run cancelled")
        batch = self.out.batch
        batch.consumed_signals.append(signal_id)
        batch.run = merge_run(batch.run, RunUpdate(status=RunStatus.CANCELLED, status_reason=reason))
        self.phase = Phase.ENDED

    def cancel_signal(self, signal: SignalRecord, now: float) -> bool:
        """An operator's cancel signal: stop the forward DAG to roll back (True: the shell settles
        what was in flight and hands the rows to ``begin_rollback``), or end the run ``cancelled``."""
        payload = signal.payload if isinstance(signal.payload, dict) else {}
        reason = str(payload.get("reason") or "cancelled by operator")
        if payload.get("compensate"):
            self.stop_forward(reason, None, now, final=RunStatus.COMPENSATING, signal_id=signal.id)
            return True
        self.cancel(reason, signal.id, now)
        return False

    def pause(self, now: float, reason: str | None = None, signal_id: int | None = None) -> None:
        """Release all compute: cancel what is in flight and rest paused (model answers already
        absorbed are kept; approvals and sleeps keep waiting in their rows). ``signal_id``: an
        operator's pause, consumed with the transition."""
        self.out.now = now
        reason = reason or self.agents.pause_reason or "paused"
        self.calls.cancel_all(reason)
        if signal_id is not None:
            self.out.batch.consumed_signals.append(signal_id)
        self.out.batch.run = merge_run(self.out.batch.run, RunUpdate(status=RunStatus.PAUSED, status_reason=reason))
        self.phase = Phase.ENDED
