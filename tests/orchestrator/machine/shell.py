"""A deterministic, single-threaded test shell around ``RunMachine``: the driver's loop without I/O.

It drives the machine as ``raysaga.orchestrator.driver.Driver`` does (restore from a snapshot;
advance → answer queries → send dispatches, committing first when the batch holds ledger
``pending`` rows → absorb finished attempts → commit; failure → stop_on_failure → begin_rollback;
finish / finish_rollback / cancel / pause), with a fake clock and no executor: nothing user-written
runs. What the outside world does is the test's:

- a ``World`` decides each attempt's outcome when it is sent (ok with an output, a transient or a
  permanent failure), answers prompt builders, and is the model behind agent turns;
- ``decide`` is the human: when the run rests ``waiting_human`` it records decisions (as
  ``Store.decide`` would), and the shell takes the run up again, as a worker does;
- a ``Schedule`` decides which attempts in flight finish next (or that time just passes), where
  the process crashes, whether new attempts overlap a commit, and when operator signals arrive.

A crash drops the machine, the attempts in flight and everything not committed; the shell then
rebuilds a fresh machine from the ``MemoryRun`` fold (as ``Driver._drive``/``_restore`` do) and
goes on. While it runs, the shell checks the invariants that need no second run:

- an effect key is handed to the executor only while its ledger row is durable and ``pending``
  (so never after ``committed``, and never before ``pending`` is durable), and an effect node is
  never sent with a fresh key while an earlier key of it may have taken effect;
- a compensation is sent only for a node that completed or may have, only after every target
  downstream of it (and, for an agent's tool calls, every later call) is compensated, latest
  first among those sent together; a rollback's end matches its plan, and every compensated node
  the world saw take effect is compensated (or the run says which compensation failed);
- once a batch puts the run at rest (completed, compensated, cancelled, failed,
  compensation_failed, paused), the machine produces no further write, dispatch or query.

A broken invariant raises ``InvariantViolation``.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import networkx as nx

from raysaga.agents.messages import ModelResponse
from raysaga.node_key import NodeKey
from raysaga.orchestrator.machine.outbox import AdmitTool, BuildPrompt, CheckDecisions, Dispatch, MemoryOp
from raysaga.orchestrator.machine.run import Phase, RunMachine
from raysaga.orchestrator.options import RunOptions
from raysaga.orchestrator.task import NodeOutcome
from raysaga.orchestrator.workflow import Workflow
from raysaga.state import (
    Batch,
    EffectStatus,
    NodeRecord,
    NodeStatus,
    RunRecord,
    RunStatus,
    RunUpdate,
    jsoncodec,
)
from raysaga.state.models import PARKED, TERMINAL
from tests.orchestrator.machine.memory_run import AT_REST, InvariantViolation, MemoryRun

__all__ = ["AT_REST", "IDLE_TICK", "Crash", "InvariantViolation", "MachineShell", "Schedule", "Sent", "World"]

#: How far the fake clock moves when nothing finishes (the driver's idle tick).
IDLE_TICK = 0.25
#: Node states whose outcome is unknown (``raysaga.sagas.rollback`` documents the rule).
UNKNOWN = frozenset({NodeStatus.RUNNING, NodeStatus.CANCELLED, NodeStatus.RETRYING})
#: A run that loops this often without resting is stuck (a livelock, not a slow test).
MAX_ROUNDS = 20_000


class Crash(Exception):
    """The test's SIGKILL: the machine, the attempts in flight and everything uncommitted are gone."""


class World(Protocol):
    """What the executor's attempts would have done: the test decides, nothing runs."""

    def outcome(self, d: Dispatch, now: float) -> NodeOutcome:
        """The outcome of attempt ``d`` sent at ``now`` (``finished_at`` is set when it finishes)."""
        ...

    def prompt(self, key: NodeKey, kwargs: dict[str, Any]) -> str:
        """What the agent node's prompt builder returns for these inputs."""
        ...


class Schedule(Protocol):
    def pick(self, inflight: Sequence[NodeKey], now: float, timer: float | None) -> list[NodeKey]:
        """Attempts that finish now (empty: none finishes before the next tick)."""
        ...

    def crash(self, when: str, commit_no: int, batch: Batch) -> bool:
        """Crash ``before`` or ``after`` commit number ``commit_no`` (counted over the whole run)."""
        ...

    def overlap(self) -> bool:
        """Start what a completion made ready before its batch commits, where the machine allows it."""
        ...

    def signals(self, moment: str, fold: MemoryRun, now: float) -> list[dict[str, Any]]:
        """Cancel signals' payloads an operator sends at ``moment``: ``committed`` (after any
        commit), ``waiting`` (attempts are in flight) or ``completed`` (an attempt of a step or
        item that finished is committed as completed; if the process dies right then, the moment
        comes again when the restored one starts)."""
        ...


@dataclass
class Sent:
    """An attempt handed to the (fake) executor: its outcome is already decided by the world."""

    dispatch: Dispatch
    sent_at: float
    outcome: NodeOutcome


@dataclass
class Journal:
    """What happened, across crashes, for the checks and for a reader of a failing example."""

    dispatched: list[tuple[int, str, str | None]] = field(default_factory=list)  # (incarnation, label, effect key)
    applied: set[tuple[str, int]] = field(default_factory=set)  # nodes the world saw take effect
    compensations: list[tuple[str, int]] = field(default_factory=list)  # targets, in the order sent
    keys: dict[str, set[str]] = field(default_factory=dict)  # the effect keys each node was sent with
    crashes: int = 0
    notes: list[str] = field(default_factory=list)


class MachineShell:
    def __init__(self, wf: Workflow, fold: MemoryRun, world: World, schedule: Schedule, *,
                 options: RunOptions | None = None, seed: int = 0,
                 decide: Callable[[MemoryRun, float], None] | None = None) -> None:
        self.wf = wf.validate()
        self.decide = decide  # the human: when the run rests waiting_human, it records decisions
        self.fold = fold
        self.world = world
        self.schedule = schedule
        self.options = options or RunOptions()
        self.seed = seed
        self.now = fold.run.created_at + 1.0
        self.m: RunMachine | None = None
        self.sent: dict[NodeKey, Sent] = {}
        self.cancelled: list[Sent] = []
        self.handled: set[int] = set()
        self.journal = Journal()
        self.incarnation = 0
        self.commit_no = 0
        self._absorbing: set[tuple[str, int]] = set()  # committing these attempts' outcomes
        self._completed = False  # that commit made one of them (a step or item) durable as completed
        self.rollback = RollbackOracle(self.wf, fold, self.journal)

    # ------------------------------------------------------------------ entry point

    def run(self) -> RunRecord:
        """Drive the run to rest, crashing and resuming wherever the schedule says."""
        while True:
            self.incarnation += 1
            try:
                record = self._drive()
            except Crash:
                self.journal.crashes += 1
                self.m = None
                self.sent.clear()
                self.cancelled.clear()
                continue
            if record.status == RunStatus.WAITING_HUMAN and self.decide is not None:
                self.decide(self.fold, self.now)  # the human answers; then a worker takes the run up
                continue
            self.rollback.at_rest(record)
            return record

    def _drive(self) -> RunRecord:
        snap = self.fold.snapshot()
        run = snap.run
        if run.status in TERMINAL or run.status in PARKED:
            return run
        outputs = self.fold.load_blobs({n.output_digest: n.label for n in snap.nodes if n.output_digest})
        completed = {(n.node_id, n.fan_index) for n in snap.nodes if n.status == NodeStatus.COMPLETED}
        ledger = self.fold.load_blobs({
            e.result["blob"]: e.node_id for e in snap.effects
            if e.status == EffectStatus.COMMITTED and isinstance(e.result, dict) and set(e.result) == {"blob"}
            and (e.node_id, e.fan_index) not in completed})
        m = self.m = RunMachine(self.wf, run, self.options, random.Random(self.seed + self.incarnation))
        m.restore(snap, outputs, ledger)
        self.handled = set()
        if run.status == RunStatus.PAUSED:
            if m.budgets.stop() is not None:
                return run
            self._commit(Batch(run=RunUpdate(status=RunStatus.RUNNING, status_reason="resumed")))
        elif run.status in (RunStatus.WAITING_HUMAN, RunStatus.WAITING_TIMER):
            self._commit(Batch(run=RunUpdate(status=RunStatus.RUNNING, status_reason="resumed")))
        if run.status == RunStatus.PENDING:
            self._commit(Batch(run=RunUpdate(status=RunStatus.RUNNING)))
        elif m.phase == Phase.ROLLBACK:
            m.begin_rollback(*self._rows_and_blobs(), self.now)
        return self._loop()

    # ------------------------------------------------------------------ the loop (Driver._loop)

    def _loop(self) -> RunRecord:
        m = self._machine()
        self._completed_moment()  # the process died right after committing a completion
        for _ in range(MAX_ROUNDS):
            if m.phase == Phase.FORWARD:
                terminal = self._signals()
                if terminal is not None:
                    return self._rested(terminal)
            terminal = self._advance()
            if terminal is not None:
                return self._rested(terminal)
            if m.pause_reason is not None:
                return self._rested(self._pause())
            if m.idle():
                resting = m.resting(self.now, self.options.release_after)
                if resting is not None:  # nothing left but waiting for a human: the run is let go
                    m.rest(*resting, self.now)
                    record = self._flush()
                    assert record is not None
                    return self._rested(record)
                when = m.next_wake()
                if when is not None:
                    self.now = max(self.now, when)  # a durable backoff (or the deadline): the fake clock jumps to it
                    continue
                if not m.done():
                    m.check_stuck()
                    continue
                return self._rested(self._finish())
            self._check_in_flight()
            for payload in self.schedule.signals("waiting", self.fold, self.now):
                self.fold.send_signal("cancel", payload, self.now)
            timer = m.next_timer()
            finished = self.schedule.pick(sorted(self.sent), self.now, timer)
            if finished:
                self.now += 1.0
                keys = self._absorb(finished)
                if m.failure is not None:
                    terminal = self._stop_forward_on_failure()
                    if terminal is not None:
                        return self._rested(terminal)
                    continue
                if m.may_overlap(keys) and not self._cancel_waiting() and self.schedule.overlap():
                    terminal = self._advance()
                    if terminal is not None:
                        return self._rested(terminal)
                self._absorbing = {(k.node_id, k.fan_index) for k in keys}
                try:
                    self._flush()
                finally:
                    self._absorbing = set()
                self._completed_moment()
            else:
                self.now = min(timer, self.now + IDLE_TICK) if timer is not None and timer > self.now \
                    else self.now + IDLE_TICK
                if m.calls.has_unrecorded():
                    m.calls.record_running()  # a quiet tick: attempts in flight become durable as 'running'
                    self._flush()
                elif not m.out.batch.empty():
                    self._flush()
        raise InvariantViolation(f"the run did not rest within {MAX_ROUNDS} rounds (a livelock)")

    def _completed_moment(self) -> None:
        """The moment right after a completion's commit (the next thing the loop does is look at
        signals): an operator's signal sent now is seen at once, by this process or, if it died
        right after that commit, by the restored one."""
        if self._completed:
            self._completed = False
            for payload in self.schedule.signals("completed", self.fold, self.now):
                self.fold.send_signal("cancel", payload, self.now)

    def _machine(self) -> RunMachine:
        assert self.m is not None
        return self.m

    def _check_in_flight(self) -> None:
        """The shell's attempts in flight are the machine's (a harness check, for clear failures)."""
        mine, machine = set(self.sent), set(self._machine().calls.inflight)
        if mine != machine:
            raise AssertionError(f"shell and machine disagree on attempts in flight: shell only {mine - machine}, "
                                 f"machine only {machine - mine}")

    # ------------------------------------------------------------------ carrying decisions out

    def _advance(self) -> RunRecord | None:
        m = self._machine()
        while True:
            m.advance(self.now)
            queries = m.out.take_queries()
            if not queries:
                break
            for query in queries:
                self._answer(query)
        self._cancel(m.out.take_cancel())
        if m.failure is not None:
            return self._stop_forward_on_failure()
        self._send(m.out.take_dispatch())
        return None

    def _answer(self, query: BuildPrompt | AdmitTool | MemoryOp | CheckDecisions) -> None:
        m = self._machine()
        if isinstance(query, CheckDecisions):  # an approval's timeout: the decisions recorded so far
            m.decisions_checked(query.key, self.fold.pending_signals())
        elif isinstance(query, BuildPrompt):
            text = self.world.prompt(query.key, query.call.kwargs)
            m.prompt_built(query.key, NodeOutcome(ok=True, output_json=jsoncodec.dumps(text),
                                                  started_at=self.now, finished_at=self.now))
        elif isinstance(query, AdmitTool):
            m.tool_admitted(query.key, None)  # the breaker is closed
        elif query.name == "memory_write":
            self._flush()  # what led to this write is durable first
            m.memory_done(query.key, query, self.fold.memory_cas(query.memory_key, query.value,
                                                                 query.expected_version, query.writer))
        else:
            m.memory_done(query.key, query, self.fold.memory_get(query.memory_key))

    def _send(self, dispatches: list[Dispatch]) -> None:
        if not dispatches:
            return
        batch = self._machine().out.batch
        if batch.effects or any(n.status == NodeStatus.RUNNING for n in batch.node_writes()):
            self._flush()  # ledger 'pending' rows and compensated steps' 'running' rows: durable before the call
        self.rollback.on_send([d for d in dispatches if d.key.compensates])
        for d in dispatches:
            self._check_effect_key(d)
            self._check_step_open(d)
            outcome = self.world.outcome(d, self.now)
            self.sent[d.key] = Sent(d, self.now, outcome)
            self.journal.dispatched.append((self.incarnation, d.key.label, d.call.idempotency_key))
            if outcome.ok and not d.key.compensates and (d.key.call is not None or d.key.turn is None):
                self.journal.applied.add((d.key.node_id, d.key.fan_index))

    def _check_effect_key(self, d: Dispatch) -> None:
        """Invariant: an effect key goes out only while its ledger row is durable and 'pending'; and
        an effect node never gets a fresh key while an earlier one of its keys may have taken effect
        (a 'pending' or 'committed' row): the service could not tell the two calls are one."""
        ekey = d.call.idempotency_key
        if d.spec.effect and ekey is None:
            raise InvariantViolation(f"effect {d.key.label} was sent without an idempotency key")
        if ekey is None:
            return
        row = self.fold.effects.get(ekey)
        if row is None or row.status != EffectStatus.PENDING:
            seen = sum(1 for _, _, k in self.journal.dispatched if k == ekey)
            raise InvariantViolation(
                f"effect key {ekey} of {d.key.label} (attempt {d.call.attempt}) was sent while its durable "
                f"ledger row is {'absent' if row is None else row.status.value} (sent {seen} time(s) before)")
        keys = self.journal.keys.setdefault(d.key.label, set())
        for earlier in keys - {ekey}:
            old = self.fold.effects.get(earlier)
            if old is not None and old.status != EffectStatus.FAILED:
                raise InvariantViolation(
                    f"effect {d.key.label} was sent with a fresh key {ekey} while its earlier key {earlier} is "
                    f"{old.status.value}: the call may take effect twice")
        keys.add(ekey)

    def _check_step_open(self, d: Dispatch) -> None:
        """Invariant: once a step is durable as failed or skipped, none of its items is sent again,
        but an attempt a dead driver had in flight (its row says 'running'), sent again under its
        key by the driver that took over (once) so its ledger row settles: a retry then could take
        effect after the rollback's plan, or with nothing left to compensate it."""
        key = d.key
        if key.compensates or key.is_agent_call or key.fan_index < 0:
            return
        step = self.fold.nodes.get((key.step, -1))
        if step is None or step.status not in (NodeStatus.FAILED, NodeStatus.SKIPPED):
            return
        row = self.fold.nodes.get((key.node_id, key.fan_index))
        here = any(n == self.incarnation and label == key.label for n, label, _ in self.journal.dispatched)
        if row is None or row.status != NodeStatus.RUNNING or d.call.idempotency_key is None or here:
            raise InvariantViolation(
                f"{key.label} (attempt {d.call.attempt}) was sent after its step {key.step} was durable as "
                f"{step.status.value} (its row: {'absent' if row is None else row.status.value})")

    def _cancel(self, keys: Iterable[NodeKey]) -> None:
        for key in keys:
            sent = self.sent.pop(key, None)
            if sent is not None:
                self.cancelled.append(sent)

    def _absorb(self, finished: list[NodeKey]) -> list[NodeKey]:
        m = self._machine()
        outcomes = []
        for key in finished:
            sent = self.sent.pop(key)
            outcomes.append((key, sent.outcome._replace(finished_at=self.now)))
        m.absorb(outcomes, self.now)
        self._cancel(m.out.take_cancel())
        return list(finished)

    # ------------------------------------------------------------------ signals, failure, rollback

    def _cancel_waiting(self) -> bool:
        return any(s.kind == "cancel" and s.id not in self.handled for s in self.fold.pending_signals())

    def _signals(self) -> RunRecord | None:
        m = self._machine()
        for signal in self.fold.pending_signals():
            if signal.id in self.handled:
                continue
            self.handled.add(signal.id)
            if signal.kind in ("approve", "reject"):
                m.decision(signal, self.now)
                continue
            if signal.kind != "cancel":
                continue
            payload = signal.payload if isinstance(signal.payload, dict) else {}
            reason = str(payload.get("reason") or "cancelled by operator")
            if payload.get("compensate"):
                m.stop_forward(reason, None, self.now, final=RunStatus.COMPENSATING, signal_id=signal.id)
                return self._begin_rollback()
            m.cancel(reason, signal.id, self.now)
            self._cancel(m.out.take_cancel())
            return self._flush()
        return None

    def _stop_forward_on_failure(self) -> RunRecord | None:
        self._machine().stop_on_failure(self.now)
        return self._begin_rollback()

    def _begin_rollback(self) -> RunRecord | None:
        m = self._machine()
        self._cancel(m.out.take_cancel())
        self._flush()  # the failure and the cancellations are durable before the rollback reads them
        rolling_back = m.begin_rollback(*self._rows_and_blobs(), self.now)
        record = self._flush()
        return None if rolling_back else record

    def _rows_and_blobs(self) -> tuple[list[NodeRecord], dict[str, Any]]:
        rows = self.fold.node_rows()
        return rows, self.fold.load_blobs({r.output_digest: r.label for r in rows if r.output_digest})

    # ------------------------------------------------------------------ resting states

    def _finish(self) -> RunRecord:
        m = self._machine()
        if m.phase == Phase.ROLLBACK:
            m.finish_rollback(self.now)
        else:
            m.finish(self.now)
        record = self._flush()
        assert record is not None
        return record

    def _pause(self) -> RunRecord:
        m = self._machine()
        for key in m.agents.model_calls_in_flight():  # their answers are kept (Driver._drain_model_calls)
            sent = self.sent.get(key)
            if sent is not None and sent.outcome.ok:
                del self.sent[key]
                m.absorb([(key, sent.outcome._replace(finished_at=self.now))], self.now)
        m.pause(self.now)
        self._cancel(m.out.take_cancel())
        record = self._flush()
        assert record is not None
        return record

    def _rested(self, record: RunRecord) -> RunRecord:
        """Invariant: once a batch put the run at rest, the machine writes, sends and asks nothing more."""
        m = self._machine()
        if record.status not in AT_REST:
            raise InvariantViolation(f"the shell stopped with the run {record.status.value}, not at rest")
        if m.phase != Phase.ENDED:
            raise InvariantViolation(f"the run rests {record.status.value} but the machine is in phase {m.phase}")
        if m.calls.inflight:
            raise InvariantViolation(f"the run rests {record.status.value} with attempts in flight: "
                                     f"{sorted(k.label for k in m.calls.inflight)}")
        late = [(s.dispatch.key, s.outcome._replace(finished_at=self.now + 1.0))
                for s in [*self.cancelled, *self.sent.values()]]
        m.absorb(late, self.now + 1.0)  # cancelled attempts a slow executor still reports
        m.advance(self.now + 1e6)  # every timer fires
        out = m.out
        if not out.batch.empty() or out.dispatch or out.queries:
            raise InvariantViolation(
                f"after the run rested {record.status.value} the machine produced writes, dispatches or queries: "
                f"{[n.node_id for n in out.batch.node_writes()]}, {[d.key.label for d in out.take_dispatch()]}, "
                f"{out.queries}")
        return record

    # ------------------------------------------------------------------ writes

    def _flush(self) -> RunRecord | None:
        batch = self._machine().out.take_batch()
        if batch.empty():
            return None
        return self._commit(batch)

    def _commit(self, batch: Batch) -> RunRecord | None:
        self.commit_no += 1
        if self.schedule.crash("before", self.commit_no, batch):
            raise Crash
        record = self.fold.commit(batch, self.now)
        self._completed = any(n.status == NodeStatus.COMPLETED and (n.node_id, n.fan_index) in self._absorbing
                              and not NodeKey.parse(n.node_id).compensates and NodeKey.parse(n.node_id).turn is None
                              for n in batch.node_writes())
        self.rollback.after_commit(batch)
        for payload in self.schedule.signals("committed", self.fold, self.now):
            self.fold.send_signal("cancel", payload, self.now)
        if self.schedule.crash("after", self.commit_no, batch):
            raise Crash
        return record


# ---------------------------------------------------------------------- the rollback's oracle

PlanKey = tuple[str, int]


class RollbackOracle:
    """What ``RollbackPlan`` and ``raysaga.sagas.rollback`` promise, checked from the durable rows.

    Targets: every node of a step with a compensation (a fan-out's items, not its parent) that
    completed, or whose outcome is unknown (running, cancelled, retrying, or failed on a transient
    error): ``inf`` as its time; and every call of an agent's effect tool with an undo that
    answered without an error, or whose outcome is unknown. A target is undone only after every
    target of a step downstream of it (and, for a tool call, every later call of its agent).
    """

    def __init__(self, wf: Workflow, fold: MemoryRun, journal: Journal) -> None:
        self.wf = wf
        self.fold = fold
        self.journal = journal
        self.below = {s: nx.descendants(wf.graph, s) for s in wf.steps}
        self.rolled_back = False

    # the targets, from the rows

    def targets(self) -> dict[PlanKey, tuple[str, float, tuple[int, int] | None]]:
        """Each target: (its DAG step, when it took effect, (turn, call) for an agent's tool call)."""
        found: dict[PlanKey, tuple[str, float, tuple[int, int] | None]] = {}
        rows = self.fold.nodes
        sent = {label for _, label, _ in self.journal.dispatched}
        for (node_id, index), row in rows.items():
            key = NodeKey.parse(node_id, index)
            if key.compensates:
                continue
            if row.error is not None and row.error.took_effect is False and key.label in sent:
                raise InvariantViolation(f"{key.label} says it never left the driver (took_effect: false), yet an "
                                         "attempt of it was sent")
            when = _took_effect(row)
            if when is None:
                continue
            if key.is_agent_call:
                if key.call is None or key.turn is None:
                    continue
                tool = self._undoable_tool(key, rows)
                if tool is None:
                    continue
                if row.status == NodeStatus.COMPLETED and (not isinstance(row.output, dict)
                                                           or row.output.get("is_error")):
                    continue
                found[(node_id, index)] = (key.step, when, (key.turn, key.call))
            elif key.step in self.wf.steps and self.wf.compensation_for(key.step) is not None:
                if self.wf.steps[key.step].map_over is not None and index < 0:
                    continue
                found[(node_id, index)] = (key.step, when, None)
        return found

    def _undoable_tool(self, key: NodeKey, rows: dict[tuple[str, int], NodeRecord]) -> str | None:
        spec = self.wf.steps.get(key.step)
        model_row = rows.get((NodeKey(key.step, key.fan_index, key.turn).node_id, key.fan_index))
        if spec is None or spec.kind != "agent" or model_row is None or model_row.status != NodeStatus.COMPLETED:
            return None
        uses = ModelResponse.model_validate(model_row.output).tool_uses()
        assert key.call is not None
        if key.call >= len(uses):
            return None
        tool = spec.options["agent"].tool(str(uses[key.call].get("name", "")))
        return None if tool is None or tool.compensate is None else tool.name

    def must_go_first(self, target: PlanKey, targets: dict[PlanKey, tuple[str, float, tuple[int, int] | None]]
                      ) -> set[PlanKey]:
        """Targets to be undone before ``target``: those of steps downstream of its step, and the
        later tool calls of the same agent node."""
        step, _, call = targets[target]
        first = {k for k, (s, _, _) in targets.items() if s in self.below[step]}
        if call is not None:
            first |= {k for k, (s, _, c) in targets.items()
                      if s == step and c is not None and k[1] == target[1] and c > call}
        return first

    def comp_status(self, target: PlanKey) -> NodeStatus | None:
        row = self.fold.nodes.get((NodeKey.parse(*target).undo().node_id, target[1]))
        return None if row is None else row.status

    # hooks

    def after_commit(self, batch: Batch) -> None:
        if batch.run is not None and batch.run.status == RunStatus.COMPENSATING and not self.rolled_back:
            self.rolled_back = True
            self._check_complete_targets("the rollback started")

    def on_send(self, comps: list[Dispatch]) -> None:
        if not comps:
            return
        targets = self.targets()
        times = []
        for d in comps:
            undone = d.key.undone()
            target = (undone.node_id, undone.fan_index)
            self.journal.compensations.append(target)
            if target not in targets:
                raise InvariantViolation(f"compensation of {undone.label} was sent, but {undone.label} neither "
                                         f"completed nor may have (row: {self.fold.nodes.get(target)})")
            if self.comp_status(target) == NodeStatus.COMPLETED:
                raise InvariantViolation(f"compensation of {undone.label} was sent after it completed")
            early = [k for k in self.must_go_first(target, targets) if self.comp_status(k) != NodeStatus.COMPLETED]
            if early:
                raise InvariantViolation(f"compensation of {undone.label} was sent before those of "
                                         f"{sorted(early)}, which must be undone first")
            times.append(targets[target][1])
        if any(a < b for a, b in itertools.pairwise(times)):
            raise InvariantViolation(f"compensations sent together are not latest first: "
                                     f"{[(d.key.label, t) for d, t in zip(comps, times, strict=True)]}")

    def at_rest(self, record: RunRecord) -> None:
        status = record.status
        if status in (RunStatus.COMPENSATED, RunStatus.COMPENSATION_FAILED):
            targets = self._check_complete_targets(f"the run rests {status.value}")
            states = {k: self.comp_status(k) for k in targets}
            failed = {k for k, s in states.items() if s == NodeStatus.FAILED}
            if status == RunStatus.COMPENSATED and any(s != NodeStatus.COMPLETED for s in states.values()):
                raise InvariantViolation(f"the run is compensated but not every target is undone: {states}")
            if status == RunStatus.COMPENSATION_FAILED:
                if not failed:
                    raise InvariantViolation(f"compensation_failed without a failed compensation: {states}")
                for k, s in states.items():
                    if s not in (NodeStatus.COMPLETED, NodeStatus.FAILED) and not self._blocked(k, targets, failed):
                        raise InvariantViolation(f"target {k} was left ({s}) though nothing it waits on failed")
        elif status == RunStatus.FAILED and not self.rolled_back:
            targets = self.targets()
            if targets:
                raise InvariantViolation(f"the run failed without a rollback, yet {sorted(targets)} took effect "
                                         "(or may have) and have compensations")
            self._check_complete_targets("the run failed")

    def _blocked(self, k: PlanKey, targets: dict[PlanKey, tuple[str, float, tuple[int, int] | None]],
                 failed: set[PlanKey]) -> bool:
        seen: set[PlanKey] = set()
        todo = [k]
        while todo:
            for first in self.must_go_first(todo.pop(), targets):
                if first in failed:
                    return True
                if first not in seen:
                    seen.add(first)
                    todo.append(first)
        return False

    def _check_complete_targets(self, when: str) -> dict[PlanKey, tuple[str, float, tuple[int, int] | None]]:
        """Every node with an undo that the world saw take effect is a target."""
        targets = self.targets()
        missing = []
        for node_id, index in self.journal.applied:
            key = NodeKey.parse(node_id, index)
            if key.is_agent_call:
                rows = self.fold.nodes
                if self._undoable_tool(key, rows) is None:
                    continue
                row = rows.get((node_id, index))
                if row is not None and row.status == NodeStatus.COMPLETED and isinstance(row.output, dict) \
                        and row.output.get("is_error"):
                    continue
            elif self.wf.compensation_for(key.step) is None:
                continue
            if (node_id, index) not in targets:
                missing.append((node_id, index))
        if missing:
            raise InvariantViolation(f"{when}, but {sorted(missing)} took effect in the world and are not "
                                     f"compensation targets (their rows: {[self.fold.nodes.get(k) for k in missing]})")
        return targets


def _took_effect(row: NodeRecord) -> float | None:
    if row.status == NodeStatus.COMPLETED:
        return row.finished_at or 0.0
    if row.error is not None and row.error.took_effect is False:
        return None  # never sent (checked against what was sent: ``RollbackOracle.targets``)
    if row.status in UNKNOWN or (row.status == NodeStatus.FAILED and row.error is not None and row.error.transient):
        return float("inf")
    return None
