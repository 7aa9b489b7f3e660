"""The driver: the I/O shell around one run's machine, and the run's single writer.

It claims the run's lease, reads the run (a constant number of queries) into a ``RunMachine``, and loops: hand the
machine the time, finished attempts and signals; carry out what it decides (send attempts to the executor, cancel
others, answer its queries); commit its writes as one fenced transaction. Every write carries the lease's fence; a
stale fence stops the driver before it makes another call. The decisions themselves (what is ready, retries, fan-out
policies, agent turns, the rollback) are the machine's: ``raysaga.orchestrator.machine``.

Delivery guarantees: an ``effect=True`` step runs through the ledger (``pending`` is durable before the call,
``committed`` with the result after), so it takes effect at most once per idempotency key. Other steps are
at-least-once: a crash while one is in flight (or, for a fan-out's plain item, before its completion's commit:
``commit_pacing``) re-runs it.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Sequence
from typing import Any

from raysaga.errors import BlobIntegrityError, DriverInterrupted, LeaseLostError, NotJSONableError
from raysaga.node_key import NodeKey
from raysaga.orchestrator import agent_io, crash_loop, driver_io, tracing, versions
from raysaga.orchestrator.commit_pacing import CommitPacer
from raysaga.orchestrator.driver_signals import chosen_cancel, never_started, paused_wake, spent_rest
from raysaga.orchestrator.executor import Executor, Handle
from raysaga.orchestrator.faults import Faults, commit_labels
from raysaga.orchestrator.gc_pacing import paced_gc
from raysaga.orchestrator.heartbeat import Heartbeat
from raysaga.orchestrator.in_flight import InFlight
from raysaga.orchestrator.item_block import ItemsDone
from raysaga.orchestrator.machine.outbox import AdmitTool, BuildPrompt, CheckDecisions, ItemsDispatch, MemoryOp, Send
from raysaga.orchestrator.machine.run import Phase, RunMachine
from raysaga.orchestrator.options import RunOptions
from raysaga.orchestrator.ownership import claim, let_go, new_owner
from raysaga.orchestrator.progress import Progress
from raysaga.orchestrator.rate_gate import RateGate
from raysaga.orchestrator.records import merge_run, new_budgets
from raysaga.orchestrator.stop_signals import STOP_SIGNALS, StopSignals
from raysaga.orchestrator.task import NodeOutcome, execute
from raysaga.orchestrator.tracing import RunTracing
from raysaga.orchestrator.unstorable import committed, park
from raysaga.orchestrator.workflow import Workflow
from raysaga.state import Batch, Lease, NewEvent, RunRecord, RunSnapshot, Store, node_label
from raysaga.state.models import PARKED, TERMINAL, RunStatus, RunUpdate, SignalRecord

__all__ = ["IDLE_TICK", "SETTLE_SECONDS", "STOP_SIGNALS", "Driver", "Progress", "driver_id"]

log = logging.getLogger("raysaga.driver")

#: How often the main loop wakes with nothing finished, to look at signals and deadlines.
IDLE_TICK = 0.25
#: How long a driver waits for cancelled attempts to stop before it compensates, pauses or ends
#: the run (a force-cancel kills the worker: this is a bound, not a wait one expects to reach).
SETTLE_SECONDS = 30.0
#: Run states whose transition is a crash point ``before_transition`` (not a cancel or a pause).
_TRANSITIONS = frozenset({RunStatus.COMPENSATING, RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.COMPENSATED,
                          RunStatus.COMPENSATION_FAILED})

driver_id = new_owner  # a lease owner naming this process (raysaga.orchestrator.ownership)


class Driver:
    """Advances one run to a resting state (completed, failed, compensated, cancelled, paused, lease lost)."""

    def __init__(self, workflow: Workflow, store: Store, executor: Executor, run_id: str, *,
                 options: RunOptions | None = None, clock: Callable[[], float] = time.time,
                 rng: random.Random | None = None, faults: Faults | None = None, lease: Lease | None = None,
                 created: RunRecord | None = None) -> None:
        self.wf = workflow.validate()
        self.store = store
        executor = RateGate(executor, store, clock)  # rate-limited attempts wait for the fleet's admission
        self.executor = executor
        self.run_id = run_id
        self.options = options or RunOptions()
        self.clock = clock
        self.rng = rng or random.Random()
        self.faults = faults or Faults()
        self.owner = lease.owner if lease is not None else driver_id()
        self._claimed = lease  # taken already (a worker's claim_next): drive does not claim again
        self._created = created  # the run as ``create_claimed`` wrote it: no node, effect or signal to read
        self.progress = Progress()
        self.run: RunRecord | None = None
        self.machine: RunMachine | None = None
        self._attempts = InFlight(executor)
        self._hb: Heartbeat | None = None
        self._stops = StopSignals(run_id)
        self._handled_signals: set[int] = set()
        self._blob_refs: dict[str, str] = {}  # digest -> the node (or input) it was read for
        self._pending = Batch()  # writes of the shell itself (events), committed with the machine's
        self._pacer = CommitPacer()  # plain items' completions share a commit over a few ms
        self._let_go = False  # the lease was released with the run's end or rest (``_flush``)
        self.tracing: RunTracing | None = None  # OpenTelemetry spans from what is committed (off: None)

    # ------------------------------------------------------------------ entry point

    def drive(self) -> RunRecord:
        lease, taken_from = (self._claimed, None) if self._claimed is not None else \
            claim(self.store, self.run_id, self.owner, self.options.lease_ttl)
        self._hb = Heartbeat(self.store, lease, min(1.0, self.options.lease_ttl / 3), self.executor.inner)  # hold_new
        lost = False
        self._stops.install()
        try:
            if taken_from is not None:
                self._pending.events.append(NewEvent(kind="lease_taken_over", data={
                    "from": taken_from, "reason": "its driver process is gone (same host and boot)"}))
            try:
                with paced_gc():  # few young collections while driving (see gc_pacing)
                    return self._drive()
            except (BlobIntegrityError, NotJSONableError) as exc:  # a damaged blob, an unstorable write
                return self._park_on_blob(exc)
        except LeaseLostError:
            lost = True
            raise
        finally:
            try:
                self._attempts.cancel_all()
                self._settle_cancelled("the driver stops", SETTLE_SECONDS / 10)
            finally:
                self._stops.restore()
                self._hb.stop()
                if not lost and not self._hb.lost.is_set() and not self._let_go:
                    let_go(self.store, self._hb.lease)

    def _drive(self) -> RunRecord:
        assert self._hb is not None
        snapshot = self.store.snapshot(self.run_id) if self._created is None else RunSnapshot(
            run=self._created, nodes=[], effects=[], signals=[])  # a signal sent since: the heartbeat's poll
        if versions.types_may_differ(snapshot.run, self.wf):  # do the stored outputs read as the types now?
            driver_io.types_fit(self.wf, snapshot, self.blobs)
        run = versions.pin(self.store, self._hb.lease, snapshot.run, self.wf, allow_changed=self.options.allow_changed)
        if run.status in TERMINAL or run.status in PARKED:
            return run
        looping = crash_loop.park_if_looping(self.store, self._hb.lease, run, snapshot.nodes, self.wf,
                                             self.options.max_driver_deaths)
        if looping is not None:
            return looping  # its last drivers all died without progress: a poison pill, parked
        self.run = run
        self._hb.start()
        m = self.machine = self._restore(snapshot.model_copy(update={"run": run}))  # (as pinned: ``versions``)
        budgets = new_budgets(self.options, run)
        if budgets is not None:
            self.run = self._commit(Batch(run=budgets)) or run
            m.set_budgets(self.run.token_budget, self.run.cost_budget)
        if run.status == RunStatus.PAUSED and (spent := m.budgets.stop()) is not None \
                and not m.past_deadline(self.clock()):
            cancel = chosen_cancel(self._hb.take_signals())  # still over budget: paused until it is raised (or
            if cancel is not None:  # its deadline: the loop rolls it back), but a cancel comes first
                return self._obey_cancel(cancel) or self._loop()
            return (self._commit(rest) if (rest := spent_rest(self.run or run, spent)) else None) or self.run or run
        if run.status in (RunStatus.PAUSED, RunStatus.WAITING_HUMAN, RunStatus.WAITING_TIMER):
            self._commit(Batch(run=RunUpdate(status=RunStatus.RUNNING, status_reason="resumed")))
        if run.status == RunStatus.PENDING:
            self._commit(Batch(run=RunUpdate(status=RunStatus.RUNNING)))
        elif m.phase == Phase.ROLLBACK:  # a rollback was under way: finish it
            self._roll_back()
        return self._loop()

    def _restore(self, snap: RunSnapshot) -> RunMachine:
        assert self._hb is not None
        m, outputs = driver_io.restored(self.wf, snap, self.options, self.rng, self.blobs, self.executor.effect_window)
        self.tracing = tracing.for_run(self.wf, snap, outputs, self.owner, self.store)  # None: no receiver
        self._hb.signals.extend(snap.signals)
        self.progress.total = len(self.wf.steps)
        return m

    # ------------------------------------------------------------------ the loop

    def _loop(self) -> RunRecord:
        assert self._hb is not None and self.machine is not None
        m = self.machine
        while True:
            if self._hb.lost.is_set():
                raise LeaseLostError(f"run {self.run_id!r}: lease lost; stopping without further calls")
            if self._stops.received is not None:
                self._stop_interrupted()
            if m.phase == Phase.FORWARD:
                terminal = self._signals_and_deadline()
                if terminal is not None:
                    return terminal
            terminal = self._advance()
            if terminal is not None:
                return terminal
            if m.pause_reason is not None:
                return self._pause()
            if m.idle():
                if self._pacer.deadline() is not None:
                    self._flush()  # nothing in flight: no completion to wait for
                resting = m.resting(self.clock(), self.options.release_after)
                if resting is not None:
                    if not self._hb.poll_decisions(self._handled_signals, m.phase == Phase.FORWARD):  # take it
                        return self._rest(*resting)
                    continue
                when = m.next_wake()  # (a deadline nearer than release_after, a human awaited: sleep to it)
                if when is not None:
                    self._sleep_until(when)
                    continue
                if not m.done():  # settled nodes made others ready: dispatch them
                    m.check_stuck()
                    continue
                return self._finish()
            finished = self.executor.wait(None, self._wait_timeout())
            finished += self._attempts.expire(self.clock())
            items = self._attempts.took(self.executor.take_items())
            if finished or items:
                keys = self._absorb(finished, items)
                if m.failure is not None:
                    terminal = self._stop_forward_on_failure()
                    if terminal is not None:
                        return terminal
                    continue
                # the next attempts start while this batch commits (not inline: they would run first),
                overlap = m.may_overlap(keys) and not self.executor.runs_at_submit and not self._hb.waiting(
                    "cancel", "pause")  # and not with a cancel or pause asked: they come first
                if overlap:
                    terminal = self._advance()
                    if terminal is not None:
                        return terminal
                    if m.idle() and m.done():
                        continue  # the run ends now: these outcomes are committed with its end, one write
                if self.executor.runs_at_submit or not self._pacer.may_wait(m.out.batch, self._pending, self.clock()):
                    self._flush()
            elif m.rest_at_gate(self.clock(), self.executor.held_at_gate(), self.options.release_after):
                self._cancel()  # never sent: nothing to settle
                return self._end(release=True)
            elif m.calls.has_unrecorded() and self._pacer.deadline() is None:
                m.calls.record_running()  # a quiet tick: attempts still in flight become durable as 'running'
                self._flush()
            elif not m.out.batch.empty() or not self._pending.empty():
                self._flush()  # (a paced batch's time is up: what is in flight is no quiet tick's)

    def _wait_timeout(self) -> float:
        assert self.machine is not None
        now = self.clock()
        timers = (w for w in (self.machine.next_timer(), self._pacer.deadline()) if w is not None)
        return max(0.0, self._attempts.horizon(now, min([now + IDLE_TICK, *timers])) - now)

    def _sleep_until(self, when: float) -> None:
        """Wait for a durable timer, what waits committed first (in the inbox; a crash resumes the sleep)."""
        self._flush()
        time.sleep(max(0.0, min(IDLE_TICK, when - self.clock())))

    # ------------------------------------------------------------------ carrying decisions out

    def _advance(self) -> RunRecord | None:
        """Let the machine issue what is ready, answer its queries, and send its attempts."""
        assert self.machine is not None
        m = self.machine
        if self._stops.received is not None:
            return None  # a stop signal: nothing new starts; the loop stops at its top
        while True:
            m.advance(self.clock())
            queries = m.out.take_queries()
            if not queries:
                break
            breakers: dict[str, Any] = {}  # one read of a breaker per round (agent_io.admit_tool)
            for query in queries:
                self._answer(query, breakers)
        self._cancel()
        if m.failure is not None:
            return self._stop_forward_on_failure()
        self._send(m.out.take_dispatch() if self.executor.runs_at_submit else m.out.take_sends())
        return None

    def _answer(self, query: BuildPrompt | AdmitTool | MemoryOp | CheckDecisions, breakers: dict[str, Any]) -> None:
        assert self.machine is not None and self._hb is not None
        m = self.machine
        if isinstance(query, BuildPrompt):
            m.prompt_built(query.key, execute(query.spec, query.call))
        elif isinstance(query, CheckDecisions):
            m.decisions_checked(query.key, self.store.pending_signals(self.run_id))
        elif isinstance(query, AdmitTool):
            m.tool_admitted(query.key, agent_io.admit_tool(self.store, query, self.clock(), breakers))
        else:
            if query.name == "memory_write":
                self._flush()  # what led to this write is durable first
            m.memory_done(query.key, query, agent_io.memory(self.store, self._hb.lease, query))

    def _send(self, dispatches: Sequence[Send]) -> None:
        assert self.machine is not None
        if not dispatches:
            return
        batch = self.machine.out.batch
        if driver_io.commits_first(batch, dispatches):
            labels = [node_label(e.node_id, e.fan_index) for e in batch.effects]
            self.faults.hit("before_pending", labels)
            self._flush()
            self.faults.hit("after_pending", labels)
        self._ensure_lease()
        now = self.clock()
        for d in dispatches:
            if self._stops.received is not None:
                break  # a stop signal: what is not sent yet stays unsent (an inline step runs at submit)
            if isinstance(d, ItemsDispatch) and self.executor.submit_block(d.block):
                self._attempts.add_block(d.block)
            elif isinstance(d, ItemsDispatch):  # (inline, items come one by one: a stop is seen between them)
                self._attempts.add_items(d.keys, self.executor.submit_items(d.spec, d.calls), now, d.spec.timeout)
            else:
                self._attempts.add(d.key, self.executor.submit(d.spec, d.call), now, d.spec.timeout)
        self.executor.pump()  # what it queued leaves now: while this round commits, if it may overlap

    def _absorb(self, finished: list[Handle], items: list[ItemsDone] | None = None) -> list[NodeKey]:
        """Hand the machine what came back (blocks' items as they came); carry out the cancels it decides."""
        assert self.machine is not None
        m = self.machine
        outcomes: list[tuple[NodeKey, NodeOutcome]] = []
        for handle in finished:
            key = handle.node or NodeKey.parse(*handle.key)  # executors key a handle by (node_id, fan_index)
            if self._attempts.pop(key) is None:
                continue  # cancelled while this round was absorbed
            assert handle.outcome is not None
            outcomes.append((key, handle.outcome))
        m.absorb(agent_io.scrubbed_turns(outcomes), self.clock())
        for back in items or ():
            m.absorb_items(back.keys(), back.outcomes, self.clock())
        self._cancel()
        return [key for key, _ in outcomes]

    def _cancel(self) -> None:
        """Cancel what the machine decided (those that never left the driver say so: ``driver_io``)."""
        assert self.machine is not None
        keys = self.machine.out.take_cancel()
        self.machine.not_sent(never_started(self._attempts, self.executor, self.wf, keys))
        self._attempts.cancel(keys)

    def _settle_cancelled(self, then: str, timeout: float) -> None:
        """Wait for cancelled attempts to stop: one still running could land an effect after its
        compensation, or after the run says it ended."""
        left = self.executor.settle_cancelled(timeout)
        if left:
            log.warning("run %s: %d cancelled attempt(s) still running after %.0fs; %s anyway",
                        self.run_id, left, timeout, then)

    # ------------------------------------------------------------------ signals, failure, rollback

    def _signals_and_deadline(self) -> RunRecord | None:
        assert self._hb is not None and self.machine is not None
        m = self.machine
        for signal in (signals := self._hb.take_signals()):
            if signal.id in self._handled_signals:
                continue
            self._handled_signals.add(signal.id)
            payload = signal.payload if isinstance(signal.payload, dict) else {}
            if signal.kind in ("approve", "reject"):
                m.decision(signal, self.clock())
            elif signal.kind == "pause" and not any(s.kind == "cancel" for s in signals):  # a cancel beside it wins
                return self._pause(str(payload.get("reason") or "paused by operator"), signal.id)
            elif signal.kind == "unpause":  # this run is not paused: nothing to undo
                m.out.batch.consumed_signals.append(signal.id)
            elif signal.kind == "cancel":  # one that compensates wins over a plain one beside it (consumed with it)
                others = [s for s in signals if s.kind == "cancel" and s.id not in self._handled_signals]
                cancels = {s.id: s for s in [signal, *others]}
                chosen = chosen_cancel(list(cancels.values())) or signal
                m.out.batch.consumed_signals.extend(i for i in cancels if i != chosen.id)
                return self._obey_cancel(chosen)
        if m.past_deadline(self.clock()):
            m.stop_forward("deadline", {"type": "DeadlineExceeded", "message": "the run passed its deadline"},
                           self.clock())
            return self._begin_rollback()
        return None

    def _obey_cancel(self, signal: SignalRecord) -> RunRecord | None:
        """An operator's cancel: the run ends ``cancelled``, or rolls back (None: on in the loop)."""
        assert self.machine is not None
        self._handled_signals.add(signal.id)
        if self.machine.cancel_signal(signal, self.clock()):
            return self._begin_rollback()
        self._cancel()
        self._settle_cancelled("the run is cancelled", SETTLE_SECONDS)
        return self._flush()

    def _stop_forward_on_failure(self) -> RunRecord | None:
        assert self.machine is not None
        self.machine.stop_on_failure(self.clock())
        return self._begin_rollback()

    def _begin_rollback(self) -> RunRecord | None:
        """The forward DAG stopped: settle what was cancelled, make it durable, then let the
        machine read the rows and roll back (or end the run when nothing needs undoing)."""
        self._cancel()
        self._settle_cancelled("rolling back or failing the run", SETTLE_SECONDS)
        self._flush()  # the failure and the cancellations are durable before the rollback reads them
        rolling_back, record = self._roll_back(), self._flush()
        return None if rolling_back else record

    def _roll_back(self) -> bool:
        """Hand the machine the run's rows as durable now and what else a rollback reads (``driver_io``)."""
        assert self.machine is not None and self.run is not None
        rows, blobs, reads = driver_io.rollback_inputs(self.store, self.run, self.blobs)
        return self.machine.begin_rollback(rows, blobs, self.clock(), reads)

    # ------------------------------------------------------------------ resting states

    def _finish(self) -> RunRecord:
        assert self.machine is not None
        (self.machine.finish_rollback if self.machine.phase == Phase.ROLLBACK else self.machine.finish)(self.clock())
        return self._end(release=True)

    def _pause(self, reason: str | None = None, signal_id: int | None = None) -> RunRecord:
        assert self.machine is not None and self._hb is not None
        m = self.machine
        self._attempts.drain(m.agents.model_calls_in_flight(), m.absorb, lost=self._hb.lost, clock=self.clock,
                             timeout=self._wait_timeout, run_id=self.run_id)
        m.pause(self.clock(), reason, signal_id)
        m.out.batch.run = merge_run(m.out.batch.run, paused_wake(m.budgets.stop(), reason, self.run))
        self._cancel()
        self._settle_cancelled("pausing", SETTLE_SECONDS)  # a pause releases all compute
        return self._end(release=False)

    def _rest(self, status: RunStatus, wake_at: float | None, reason: str) -> RunRecord:
        """Nothing left but waiting (for a human, or a far timer): record it and let go of the run."""
        assert self.machine is not None
        self.machine.rest(status, wake_at, reason, self.clock(), max(self._handled_signals, default=0))
        log.info("run %s: %s; its lease is released (a worker or `raysaga resume` continues it)", self.run_id, reason)
        return self._end(release=True)

    def _end(self, release: bool) -> RunRecord:
        """Commit the run's end, rest or pause; ``release``: its lease goes in the same write (the
        heartbeat stopped first: no renewal after it), not in a transaction of its own."""
        if release and self._hb is not None:
            self._hb.stop()
        record = self._flush(release)
        assert record is not None
        self._let_go = release
        return record

    def interrupt(self, name: str) -> None:
        """Stop at the next boundary as on SIGTERM (a worker stopping: the run is handed back)."""
        self._stops.received = self._stops.received or name

    def _stop_interrupted(self) -> None:
        """Commit what finished, then raise ``DriverInterrupted`` (``drive`` settles and releases)."""
        assert self._stops.received is not None
        self._attempts.cancel_all()
        self._settle_cancelled("the driver stops", SETTLE_SECONDS / 10)
        self._pending.events.append(NewEvent(kind="driver_interrupted", data={
            "signal": self._stops.received, "owner": self.owner}))
        self._flush()
        raise DriverInterrupted(self.run_id, self._stops.received)

    # ------------------------------------------------------------------ blob integrity

    def blobs(self, wanted: dict[str, str]) -> dict[str, Any]:
        """Blobs' JSON values by digest (``wanted``: each to what reads it), verified and parsed by
        ``Store.load_blobs``: a missing, altered or non-JSON blob raises ``BlobIntegrityError`` (parks the run)."""
        self._blob_refs.update(wanted)
        return self.store.load_blobs(wanted) if wanted else {}

    def _park_on_blob(self, exc: BlobIntegrityError | NotJSONableError) -> RunRecord:
        """A blob the run needs is missing or altered: park it naming the node and digest; never use the data.
        A write the store cannot keep (``unstorable``): park it naming the node, not raise on every drive."""
        self._attempts.cancel_all()
        self._settle_cancelled("the run is parked", SETTLE_SECONDS / 10)
        self.machine = None  # its pending writes may have been computed from the data: dropped
        self._pending = Batch()
        commit = self._commit if self.tracing is not None else tracing.traced(  # (none yet: park before it)
            self.store, self.run_id, self.owner, self._commit, self.wf)
        return park(self.store, self.run_id, exc, self._blob_refs, commit)

    # ------------------------------------------------------------------ writes

    def _ensure_lease(self) -> None:
        """Before any call: a driver that was stopped past its lease must find out now."""
        assert self._hb is not None
        if self._hb.lost.is_set():
            raise LeaseLostError(f"run {self.run_id!r}: lease lost")
        if time.time() > self._hb.lease.expires_at - self.options.lease_ttl / 3:
            self._hb.renew()

    def _flush(self, release: bool = False) -> RunRecord | None:
        """Commit the machine's writes (and the shell's own events) as one fenced batch."""
        batch = self._pending.take()
        if self.machine is not None:
            mine = self.machine.out.take_batch()
            self._pacer.committed()
            mine.events = [*batch.events, *mine.events]
            batch = mine
        if release:
            batch.run = merge_run(batch.run, RunUpdate(release_lease=True))
        if batch.empty():
            return None
        # Crash points before/after_commit name the nodes whose state after this batch is an outcome
        labels = commit_labels(batch.node_writes()) if self.faults.active else []
        if batch.run is not None and batch.run.status in _TRANSITIONS:
            self.faults.hit("before_transition", ["*"])
        self.faults.hit("before_commit", labels)
        return self._commit(batch, labels)

    def _commit(self, batch: Batch, labels: list[str] | None = None) -> RunRecord | None:
        assert self._hb is not None
        record = committed(self.store, self._hb.lease, batch)  # (a value it cannot keep: raised naming the node)
        self.run = record or self.run
        if self.tracing is not None:
            self.tracing.committed(batch, record)
        self.faults.hit("after_commit", labels or [])
        if self.machine is not None:
            self.progress.report(self.machine.forward.counts)
        return record
