"""Forward progress: which steps are ready, what their inputs are, and what a settled node does to
its step, its fan-out's policy and its dependents.

A node settles completed or failed for good. A failed item of a partial fan-out is kept for the
step's policy, which decides once every item settled (continue, retry the failed items,
fail, compensate); any other failure fails its step: a critical one stops the run (``failure``
is set and the run machine rolls back), a non-critical one skips or passes its dependents.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from raysaga.node_key import NodeKey, item_fields, item_keys
from raysaga.orchestrator.fanout import FanOutBook
from raysaga.orchestrator.keys import effect_key
from raysaga.orchestrator.machine.calls import Calls, Committed
from raysaga.orchestrator.machine.effect_window import EffectWindow
from raysaga.orchestrator.machine.outbox import Outbox
from raysaga.orchestrator.records import cancelled_row, merge_run, parks, short_error, step_failed_record
from raysaga.orchestrator.scheduler import Scheduler
from raysaga.orchestrator.spec import StepSpec
from raysaga.orchestrator.workflow import Workflow
from raysaga.sagas.policy import MAX_FANOUT_ROUNDS, Decision, Fail, Verdict
from raysaga.state import NewEvent, NodeRecord, NodeStatus, NodeWrite, RunUpdate
from raysaga.state.jsoncodec import printable

_MISSING: Any = object()


@dataclass(frozen=True)
class AgentStart:
    """A ready agent node: the run machine hands it to its agents."""

    key: NodeKey
    spec: StepSpec
    row: NodeRecord | None


@dataclass(frozen=True)
class WaitStart:
    """A ready approval or sleep node: the run machine hands it to its waits."""

    key: NodeKey
    spec: StepSpec
    row: NodeRecord | None


@dataclass
class Counts:
    """Progress, for a display: steps in the DAG, steps done, nodes failed."""

    total: int = 0
    done: int = 0
    failed: int = 0


class Forward:
    def __init__(self, wf: Workflow, run_id: str, run_input: Any, calls: Calls, out: Outbox) -> None:
        self.wf = wf
        self.run_id = run_id
        self.run_input = run_input
        self.calls = calls
        self.out = out
        self.sched = Scheduler(wf)
        self.fanout = FanOutBook()
        self.outputs: dict[NodeKey, Any] = {}
        self.restored: dict[NodeKey, NodeRecord] = {}
        self.on_closed: Callable[[set[str], str], None] = lambda steps, reason: None  # (``Waits.stop_steps``)
        self.out_of_reach: set[str] = set()  # partial fan-outs whose policy can only fail now (``decide_early``)
        self.parents_done: set[str] = set()  # fan-out parents already durable as completed
        self.running_parents: set[str] = set()  # fan-out parents durable as 'running' (a retry round)
        self.failure: tuple[str, dict[str, Any]] | None = None  # a critical node failed: (label, error)
        self.counts = Counts(total=len(wf.steps))
        self._item_inputs: dict[str, list[tuple[str, Any, bool]]] = {}  # map step -> (param, value, mapped)
        self._plain_items: dict[str, bool] = {}  # step -> its items are sent as a group (``prepare_all``)
        self.window = EffectWindow()  # an effect fan-out's items beyond the executor's bound, held back

    # ------------------------------------------------------------------ restore

    def restore(self, row: NodeRecord, output: Any) -> None:
        """A stored row of a step or item (``output``: its value, blobs already read)."""
        key = NodeKey(row.node_id, row.fan_index)
        spec = self.wf.steps[row.node_id]
        self.restored[key] = row
        self.calls.attempts[key] = row.attempt
        if row.status == NodeStatus.FAILED and row.fan_index < 0 and not spec.critical and spec.on_failure == "pass":
            # its dependents' record, for a rollback resumed after a crash (which settles no step)
            _, error, _ = _failure_of(row)
            self.outputs[key] = step_failed_record(row.node_id, error)
        if spec.map_over is not None and row.fan_index < 0:
            self.fanout.set_round(row.node_id, max(1, row.attempt))
            if spec.fan_out_policy.kind == "all":
                # An ALL fan-out's parent row holds no output: its output is the list of its
                # items', which output_of collects (restoring the None broke its dependents).
                return
        if row.status == NodeStatus.COMPLETED:
            self.outputs[key] = output

    def _settle_restored_failure(self, key: NodeKey, row: NodeRecord) -> None:
        """Settle a restored failed row as the failure that wrote it was settled: a fan-out
        failed by one item, or by its policy's verdict, is routed as that item or verdict was
        (the same node blamed, the same record passed on, the same rollback)."""
        if key.fan_index < 0 and row.status == NodeStatus.FAILED:
            if key.step in self.sched.closed or key.step in self.sched.completed:
                return
            index, error, force_rollback = _failure_of(row)
            if index >= 0 or force_rollback or error.get("type") == "FanOutPolicy":
                self.counts.failed += 1
                self._step_failed(key.step, index, error, force_rollback=force_rollback, restored=True)
                return
        self.settle_failed(key, row.error.as_dict() if row.error else {}, write=False, attempts=row.attempt)

    # ------------------------------------------------------------------ dispatch

    def prepare_all(self, ready: list[tuple[str, int]]) -> list[AgentStart | WaitStart]:
        """``prepare`` each ready node, in order; the items of a plain fan-out (no effect, no row
        to settle first) are issued together (``Calls.issue_items``): one command for a wide
        fan-out's items, not one per item. Returns the agent and wait nodes to start."""
        starts: list[AgentStart | WaitStart] = []
        restored = self.restored
        group_step, group = "", list[NodeKey]()
        for step, index in ready:
            key = NodeKey(step, index)
            if index >= 0 and self._is_plain_map(step) and (not restored or key not in restored):
                if step != group_step and group:
                    self._issue_items(group_step, group)
                    group = []
                group_step = step
                group.append(key)
                continue
            if group:
                self._issue_items(group_step, group)
                group = []
            windowed = (index >= 0 and self.window.window is not None  # an effect fan-out's item
                        and (spec := self.wf.steps[step]).effect and spec.map_over is not None and spec.kind == "step")
            if windowed and self.calls.attempts.get(key, 0) == 0 and self.window.hold(key):
                continue  # (fresh: a retry or a resumed call, already in doubt, goes out at once)
            start = self.prepare(key)
            if start is not None:
                starts.append(start)
            if windowed and key in self.calls.inflight:
                self.window.opened(key)
        if group:
            self._issue_items(group_step, group)
        return starts

    def _is_plain_map(self, step: str) -> bool:
        plain = self._plain_items.get(step)
        if plain is None:
            spec = self.wf.steps[step]
            plain = self._plain_items[step] = (spec.kind == "step" and spec.map_over is not None and not spec.effect
                                               and not self.calls.records_first(spec))
        return plain

    def release_held(self, stuck: bool) -> None:
        """Make the held effect items that fit in their window ready again (``EffectWindow``)."""
        for key in self.window.release(stuck):
            self.sched.push((key.step, key.fan_index))

    def _issue_items(self, step: str, keys: list[NodeKey], *, whole: bool = False) -> None:
        """``whole``: ``keys`` are every item of the step, in order."""
        self.kwargs(step, keys[0].fan_index)  # caches the step's inputs (the items' upstream outputs are final)
        inputs = self._item_inputs[step]
        if len(inputs) == 1 and inputs[0][2]:  # the item is the only input (the common case)
            name, value, _ = inputs[0]
            kwargs = [{name: item} for item in value] if whole else [{name: value[key.fan_index]} for key in keys]
        else:
            kwargs = [{name: value[key.fan_index] if mapped else value for name, value, mapped in inputs}
                      for key in keys]
        self.calls.issue_items(self.wf.steps[step], keys, kwargs)

    def prepare(self, key: NodeKey) -> AgentStart | WaitStart | None:
        """Issue a ready node, or settle it without a call (restored, a fan-out parent); an
        agent node is returned for the agents to start, an approval or sleep for the waits."""
        step, index = key.step, key.fan_index
        spec = self.wf.steps[step]
        row = self.restored.pop(key, None)
        if row is not None and row.status in (NodeStatus.FAILED, NodeStatus.SKIPPED):
            self._settle_restored_failure(key, row)
            return None
        if spec.map_over is not None and index < 0:
            self._expand(step, row)
            return None
        if row is not None and row.status == NodeStatus.COMPLETED:
            self.settle_completed(key)
            return None
        if spec.kind == "agent":
            return AgentStart(key, spec, row)
        if spec.kind in ("approval", "sleep"):
            return WaitStart(key, spec, row)
        if (row is not None and row.status == NodeStatus.RETRYING and row.not_before
                and row.not_before > self.out.now):
            self.calls.schedule(row.not_before, key)  # a durable backoff survives the crash
            return None
        self.issue(key)
        return None

    def issue(self, key: NodeKey) -> None:
        spec = self.wf.steps[key.step]
        kwargs = self.kwargs(key.step, key.fan_index)
        ekey = effect_key(self.run_id, key.step, key.fan_index, spec.effect_name, kwargs) if spec.effect else None
        done = self.calls.issue(key, spec, kwargs, ekey)
        if isinstance(done, Committed):
            self.outputs[key] = done.value
            self.settle_completed(key)

    def kwargs(self, step: str, index: int) -> dict[str, Any]:
        """The JSON inputs of a forward node: run input, upstream outputs, its fan-out item."""
        inputs = self._item_inputs.get(step) if index >= 0 else None
        if inputs is None:
            spec = self.wf.steps[step]
            inputs = [(spec.input_param, self.run_input, False)] if spec.input_param else []
            inputs += [(dep, self.output_of(dep), dep == spec.map_over) for dep in spec.param_deps]
            if index >= 0:  # an item's upstream outputs are final: its siblings take the same
                self._item_inputs[step] = inputs
        return {name: value[index] if mapped else value for name, value, mapped in inputs}

    def output_of(self, step: str) -> Any:
        key = NodeKey(step)
        value = self.outputs.get(key, _MISSING)
        if value is _MISSING and self.wf.steps[step].map_over is not None:
            get: Callable[[Any], Any] = self.outputs.__getitem__  # a plain tuple finds its NodeKey
            value = self.outputs[key] = list(map(get, item_fields(step, self.fan_total(step))))
        elif value is _MISSING:
            raise KeyError(key)
        return value

    def fan_total(self, step: str) -> int:
        upstream = self.wf.steps[step].map_over
        assert upstream is not None
        return len(self.output_of(upstream))

    def _expand(self, step: str, row: NodeRecord | None) -> None:
        spec = self.wf.steps[step]
        assert spec.map_over is not None
        batch = self.out.batch
        if row is not None and row.status == NodeStatus.COMPLETED and spec.fan_out_policy.partial:
            # its FanOutResult was restored with the parent row: the items need not be replayed
            self.parents_done.add(step)
            self._count_done(self.sched.expand(step, 0))
            return
        items = self.output_of(spec.map_over)
        if not isinstance(items, list):
            error = {"type": "FanOutError", "transient": False,
                     "message": f"step {step!r} maps over {spec.map_over!r}, whose output is a "
                                f"{type(items).__name__}, not a list"}
            self.settle_failed(NodeKey(step), error, write=True, attempts=0)
            return
        if row is None:
            batch.events.append(NewEvent(kind="fanout_expanded", node_id=step, data={"items": len(items)}))
        elif row.status == NodeStatus.COMPLETED:
            self.parents_done.add(step)
        elif row.status == NodeStatus.RUNNING:
            self.running_parents.add(step)
        whole = not self.restored and self._is_plain_map(step)  # no item has a row to settle first
        done = self.sched.expand(step, len(items), ready=not whole)
        if whole and items:  # issued here as one block, not queued to be looked at one by one
            self._issue_items(step, item_keys(step, len(items)), whole=True)
        if done:  # zero items: nothing failed, the policy has nothing to weigh
            if spec.fan_out_policy.partial:
                self.outputs[NodeKey(step)] = self.fanout.result(step, self.outputs, 0).model_dump(mode="json")
            self._write_parent_done(step)
            self._count_done(done)

    # ------------------------------------------------------------------ settling

    def settle_completed(self, key: NodeKey) -> None:
        step, index = key.step, key.fan_index
        self.window.settled(key)
        done = self.sched.complete((step, index))
        for finished in done:
            if finished != step or index >= 0:  # a fan-out parent finished with its last item
                self._write_parent_done(finished)
        self._count_done(done)
        if index >= 0 and self.sched.awaiting_decision(step):
            self._decide(step)

    def settle_items(self, step: str, count: int) -> None:
        """``settle_completed`` for ``count`` items of ``step`` that completed together."""
        done = self.sched.complete_items(step, count)
        for finished in done:
            self._write_parent_done(finished)
        self._count_done(done)
        if self.sched.awaiting_decision(step):
            self._decide(step)

    def _write_parent_done(self, step: str) -> None:
        if step in self.parents_done:
            return
        self.running_parents.discard(step)
        output = self.outputs.get(NodeKey(step)) if self.wf.steps[step].fan_out_policy.partial else None
        self.out.batch.nodes.append(NodeWrite(node_id=step, fan_index=-1, status=NodeStatus.COMPLETED,
                                              attempt=self.fanout.round(step), output=output,
                                              finished_at=self.out.now))
        self.out.batch.events.append(NewEvent(kind="node_completed", node_id=step, data={"fanout": True}))

    def _count_done(self, steps: list[str]) -> None:
        self.counts.done += len(steps)

    def settle_failed(self, key: NodeKey, error: dict[str, Any], *, write: bool, attempts: int = 0) -> None:
        """A forward node failed for good: a partial fan-out's item is recorded for its policy;
        anything else fails its step."""
        step, index = key.step, key.fan_index
        spec = self.wf.steps[step]
        self.window.settled(key)
        if write:
            self.out.batch.nodes.append(NodeWrite(node_id=key.node_id, fan_index=index, status=NodeStatus.FAILED,
                                                  error=error, attempt=attempts, finished_at=self.out.now))
            self.out.batch.events.append(NewEvent(kind="node_failed", node_id=key.node_id, fan_index=index,
                                                  data={"error": short_error(error)}))
        self.counts.failed += 1
        if step in self.sched.closed or step in self.sched.completed:
            return
        if index >= 0 and spec.fan_out_policy.partial and not parks(error):
            self.fanout.record_failure(step, index, error, attempts)
            if self.sched.fail_item((step, index)):
                self._decide(step)
            elif spec.fan_out_policy.unreachable(self.fan_total(step), len(self.fanout.failures(step))):
                self.out_of_reach.add(step)  # decided once the outcomes that came back with it are in
            return
        self._step_failed(step, index, error)

    def _step_failed(self, step: str, index: int, error: dict[str, Any], force_rollback: bool = False,
                     restored: bool = False) -> None:
        """Route a step's final failure: critical (or forced) → stop and roll back; else skip or pass.
        ``restored``: the failure is read back from the step's row, which is not written again."""
        spec, force_rollback = self.wf.steps[step], force_rollback or parks(error)  # (parked, not rolled back)
        batch = self.out.batch
        now = self.out.now
        # An item failing a fan-out fails its step: the parent row says so, with the item's index
        # and error, from which a resume settles the step exactly so (the same node blamed, the
        # same record passed on). Once: a second upsert of one row in a batch is refused by PostgreSQL.
        parent_row = index >= 0 and not restored and (self.failure is None or not (spec.critical or force_rollback))
        if parent_row:
            self.running_parents.discard(step)
            batch.nodes.append(NodeWrite(node_id=step, fan_index=-1, status=NodeStatus.FAILED, finished_at=now,
                                         error=_item_failed(step, index, error)))
        if spec.critical or force_rollback:
            if self.failure is None:
                self.failure = (NodeKey(step, index).label, error)
            return
        self._cancel_steps({step})
        if restored:
            self._drain_restored(step)
        if spec.on_failure == "pass":
            self.outputs[NodeKey(step)] = step_failed_record(step, error)
            self._count_done(self.sched.decided(step))
            return
        skipped_steps = self.sched.close(step)
        self._cancel_steps(set(skipped_steps))
        for skipped in skipped_steps:
            self.restored.pop(NodeKey(skipped), None)
            batch.nodes.append(NodeWrite(node_id=skipped, status=NodeStatus.SKIPPED,
                                         error={"reason": f"upstream step {step!r} failed"}, finished_at=now))
            batch.events.append(NewEvent(kind="node_skipped", node_id=skipped, data={"because": step}))

    def _cancel_steps(self, steps: set[str]) -> None:
        """Stop the attempts of failed (or skipped) steps: those in flight drain, a plain step's
        waiting out a retry's backoff are not retried (an effect's item charged after its step had
        failed and its dependents were skipped: nothing would compensate it). An agent item goes on
        to its end (its calls are the agent's)."""
        def plain(k: NodeKey) -> bool:
            return k.step in steps and not k.is_agent_call and not k.compensates
        self.window.drop(steps)  # (effect items never issued: no row, no key, nothing to undo)
        self.calls.drain([k for k in self.calls.inflight if plain(k)], "its step failed")
        # (a plain step's or item's own retries: an agent's calls and a wait's timeout are theirs)
        self.calls.drop_timers(lambda k: plain(k) and self.wf.steps[k.step].kind == "step", "its step failed",
                               lambda k: self.wf.steps[k.step].effect_name)
        self.on_closed(steps, "its step failed")  # its approvals and sleeps wait no more

    def _drain_restored(self, step: str) -> None:
        """Items of ``step`` that a driver which died had in flight: their rows still say
        'running'. Without the crash, ``Calls.drain`` settled them when the step failed: an
        effect's attempt was let land, a plain one was cancelled. So here: an effect's items are
        sent again under their keys (their 'pending' ledger rows make them reconciling calls) and
        drained, instead of ending ``abandoned``; a plain item's row says 'cancelled', instead of
        'running' for ever on a run that goes on and ends."""
        effect = self.wf.steps[step].effect
        for key in [k for k, row in self.restored.items()
                    if k.step == step and k.fan_index >= 0 and row.status == NodeStatus.RUNNING]:
            row = self.restored.pop(key)
            if not effect:
                self.out.batch.nodes.append(cancelled_row(key.node_id, key.fan_index, row.attempt, "its step failed",
                                                          self.out.now, row.started_at))
                continue
            self.issue(key)  # its pending ledger row makes it a reconciling call
            if key in self.calls.inflight:
                self.calls.draining.add(key)

    def decide_early(self) -> None:
        """Fail the quorum and ratio fan-outs that failures put out of reach, without waiting for
        their other items (``FanOutPolicy.unreachable``): those are stopped, not paid for."""
        while self.out_of_reach:
            step = self.out_of_reach.pop()
            if self.failure is None and step not in self.sched.closed and step not in self.sched.completed:
                self._decide(step, early=True)

    def _decide(self, step: str, *, early: bool = False) -> None:
        """Every item of a partial fan-out settled: ask its policy, record the decision, obey it.
        ``early``: a quorum or ratio that enough failures put out of reach fails now, before the
        rest settle (they are stopped: paying for items whose outcome changes nothing)."""
        spec = self.wf.steps[step]
        total = self.fan_total(step)
        result = self.fanout.result(step, self.outputs, total)
        try:
            decision = spec.fan_out_policy.decide(result)
        except Exception as exc:  # a user's decision function that raises fails the step, visibly
            decision = Fail(f"on_partial_failure raised {type(exc).__name__}: {printable(str(exc))}")
        if early:
            decision = Fail(f"{decision.reason}: out of reach with {len(result.failures)} of {total} items "
                            f"failed; the {total - len(result.failures) - len(result.successes)} unsettled "
                            + ("run to their end (agent items are never cut short)" if spec.kind == "agent"
                               else "were stopped"))
        if decision.verdict == Verdict.RETRY_FAILED:
            decision = self._bounded(decision, len(result.failures), result.round)
        self.out.batch.events.append(NewEvent(kind="fanout_decision", node_id=step, data={
            "verdict": decision.verdict.value, "reason": decision.reason, "round": result.round,
            "successes": len(result.successes), "failures": [f.index for f in result.failures],
            "policy": spec.fan_out_policy.describe()}))
        self._obey(step, decision, result.model_dump(mode="json"))

    def _bounded(self, decision: Decision, failed: int, round_: int) -> Decision:
        """A ``RetryFailed`` as the run's limits allow it: each item it dispatches again is a retry
        of the run's ``retry_budget``, and a fan-out retries ``MAX_FANOUT_ROUNDS`` rounds at most;
        past either, the step fails (a policy answering it for ever re-ran its items in a loop)."""
        why = f"{decision.reason}; " if decision.reason else ""
        if round_ >= MAX_FANOUT_ROUNDS:
            return Fail(f"{why}not retried: the policy answered RetryFailed in {round_} rounds, the most a "
                        "fan-out retries (MAX_FANOUT_ROUNDS)")
        budget = self.calls.retry_budget
        if budget is not None and self.calls.retries_used + failed > budget:
            return Fail(f"{why}not retried: {failed} item(s) to retry and {budget - self.calls.retries_used} "
                        f"retries left of the run's retry budget ({budget})")
        self.calls.retries_used += failed
        self.out.batch.run = merge_run(self.out.batch.run, RunUpdate(retries_delta=failed))
        return decision

    def _obey(self, step: str, decision: Decision, result: dict[str, Any]) -> None:
        batch = self.out.batch
        if decision.verdict == Verdict.CONTINUE:
            self.outputs[NodeKey(step)] = result
            self._write_parent_done(step)
            self._count_done(self.sched.decided(step))
        elif decision.verdict == Verdict.RETRY_FAILED:
            indexes = self.fanout.start_retry(step)
            for i in indexes:
                self.calls.attempts[NodeKey(step, i)] = 0  # a new round: the items get their attempts again
            # The retried items' rows go back to pending in the decision's own commit. Left
            # 'failed', a crash after this commit made the resume read them as failures of the
            # new round: it decided again without re-running them (resume != uninterrupted).
            # (Their earlier writes in this batch are dropped: one upsert per row per statement.)
            again = {(step, i) for i in indexes}
            batch.nodes[:] = [n for n in batch.nodes if (n.node_id, n.fan_index) not in again]
            batch.nodes.extend(NodeWrite(node_id=step, fan_index=i, status=NodeStatus.PENDING, attempt=0)
                               for i in indexes)
            self.running_parents.add(step)
            batch.nodes.append(NodeWrite(node_id=step, fan_index=-1, status=NodeStatus.RUNNING,
                                         attempt=self.fanout.round(step), started_at=self.out.now))
            self.sched.retry_items(step, indexes)
            self.counts.failed = max(0, self.counts.failed - len(indexes))  # failed no more: retried
        else:
            error = {"type": "FanOutPolicy", "message": decision.reason, "verdict": decision.verdict.value}
            self.running_parents.discard(step)
            batch.nodes.append(NodeWrite(node_id=step, fan_index=-1, status=NodeStatus.FAILED, error=error,
                                         attempt=self.fanout.round(step), finished_at=self.out.now))
            self._step_failed(step, -1, error, force_rollback=decision.verdict == Verdict.COMPENSATE)

    # ------------------------------------------------------------------ the end

    def sink_outputs(self) -> dict[str, Any]:
        return {s: self.output_of(s) for s in self.wf.sinks() if s in self.sched.completed}


def _item_failed(step: str, index: int, error: dict[str, Any]) -> dict[str, Any]:
    """A fan-out's row when its item ``index`` failed it: the item and its error, whole."""
    return {"type": "FanOutItemFailed", "message": f"item {index} failed", "item": index,
            "node": NodeKey(step, index).label, "cause": error}


def _failure_of(row: NodeRecord) -> tuple[int, dict[str, Any], bool]:
    """How a failed step's row was settled: (the failed item or -1, its error, roll back?).
    Rows written before the item was kept (``item`` absent) read as the step's own failure."""
    error = row.error.as_dict() if row.error else {}
    cause = error.get("cause")
    if isinstance(error.get("item"), int) and isinstance(cause, dict):
        return error["item"], cause, False
    return -1, error, error.get("type") == "FanOutPolicy" and error.get("verdict") == Verdict.COMPENSATE.value


def failure_reason(label: str, error: dict[str, Any]) -> str:
    """Why the forward DAG stopped, in the words of what stopped it: a critical step that failed,
    or a fan-out whose partial-failure policy decided ``Compensate`` (critical or not: that verdict
    rolls the run back whatever the step's ``critical``, so "critical step failed" misread it)."""
    text = error.get("message") or error.get("reason") or ""
    if error.get("type") == "FanOutPolicy" and error.get("verdict") == Verdict.COMPENSATE.value:
        return f"fan-out {label!r}: its partial-failure policy decided Compensate: {text}"[:500]
    return f"critical step {label!r} failed: {text}"[:500]
