"""The driver's forward bookkeeping: a node settled (completed or failed for good), what that
does to its step, its fan-out's policy and its dependents.

A mixin of ``Driver`` (split out to keep modules small).
"""

from __future__ import annotations

from typing import Any

from raysaga.orchestrator.driver_base import DriverBase
from raysaga.orchestrator.records import short_error, step_failed_record
from raysaga.orchestrator.retry import printable
from raysaga.orchestrator.scheduler import NodeKey
from raysaga.sagas.policy import Decision, Fail, Verdict
from raysaga.state import Batch, NewEvent, NodeStatus, NodeWrite, node_label


class ForwardSettling(DriverBase):
    # ------------------------------------------------------------------ forward settling

    def _settle_completed(self, key: NodeKey, batch: Batch, *, write: bool) -> None:
        step, index = key
        done = self._sched.complete(key)
        for finished in done:
            if finished != step or index >= 0:  # a fan-out parent finished with its last item
                self._write_parent_done(finished, batch)
        self._count_done(done)
        if index >= 0 and self._sched.awaiting_decision(step):
            self._decide(step, batch)

    def _write_parent_done(self, step: str, batch: Batch) -> None:
        if step in self._parents_done:
            return
        output = self.outputs.get((step, -1)) if self.wf.steps[step].fan_out_policy.partial else None
        batch.nodes.append(NodeWrite(node_id=step, fan_index=-1, status=NodeStatus.COMPLETED,
                                     attempt=self._fanout.round(step), output=output, finished_at=self.clock()))
        batch.events.append(NewEvent(kind="node_completed", node_id=step, data={"fanout": True}))

    def _count_done(self, steps: list[str]) -> None:
        self.progress.done += len(steps)
        self.progress.notify()

    def _settle_failed(self, key: NodeKey, batch: Batch, error: dict[str, Any], *, write: bool,
                       attempts: int = 0) -> None:
        """A forward node failed for good: a partial fan-out's item is recorded for its policy;
        anything else fails its step."""
        step, index = key
        spec = self.wf.steps[step]
        if write:
            self._write_failed(key, batch, error, attempts)
        self.progress.failed += 1
        if step in self._sched.closed or step in self._sched.completed:
            return
        if index >= 0 and spec.fan_out_policy.partial:
            self._fanout.record_failure(step, index, error, attempts)
            if self._sched.fail_item(key):
                self._decide(step, batch)
            return
        self._step_failed(step, index, batch, error)

    def _write_failed(self, key: NodeKey, batch: Batch, error: dict[str, Any], attempts: int) -> None:
        batch.nodes.append(NodeWrite(node_id=key[0], fan_index=key[1], status=NodeStatus.FAILED, error=error,
                                     attempt=attempts, finished_at=self.clock()))
        batch.events.append(NewEvent(kind="node_failed", node_id=key[0], fan_index=key[1],
                                     data={"error": short_error(error)}))

    def _fail_node(self, key: NodeKey, batch: Batch, error: dict[str, Any], attempts: int) -> None:
        self._settle_failed(key, batch, error, write=True, attempts=attempts)

    def _step_failed(self, step: str, index: int, batch: Batch, error: dict[str, Any],
                     force_rollback: bool = False) -> None:
        """Route a step's final failure: critical (or forced) → stop and roll back; else skip or pass."""
        spec = self.wf.steps[step]
        if spec.critical or force_rollback:
            if self._failure is None:
                self._failure = (node_label(step, index), error)
                if index >= 0:
                    # An item failing an ALL fan-out fails its step: its parent row says so, as it
                    # does for a non-critical fan-out (it had no row at all: `status` never showed
                    # the failed step, only its items). Once: a second upsert of one row in a
                    # batch is refused by PostgreSQL.
                    batch.nodes.append(NodeWrite(
                        node_id=step, fan_index=-1, status=NodeStatus.FAILED, finished_at=self.clock(),
                        error={"type": "FanOutItemFailed", "message": f"item {index} failed"}))
            return
        if index >= 0:
            batch.nodes.append(NodeWrite(node_id=step, fan_index=-1, status=NodeStatus.FAILED,
                                         error={"type": "FanOutItemFailed", "message": f"item {index} failed"},
                                         finished_at=self.clock()))
        self._cancel_steps({step}, batch)
        if spec.on_failure == "pass":
            self.outputs[(step, -1)] = step_failed_record(step, error)
            self._count_done(self._sched.decided(step))
            return
        skipped_steps = self._sched.close(step)
        self._cancel_steps(set(skipped_steps), batch)
        for skipped in skipped_steps:
            self._restored.pop((skipped, -1), None)
            batch.nodes.append(NodeWrite(node_id=skipped, status=NodeStatus.SKIPPED,
                                         error={"reason": f"upstream step {step!r} failed"},
                                         finished_at=self.clock()))
            batch.events.append(NewEvent(kind="node_skipped", node_id=skipped, data={"because": step}))
        self.progress.notify()

    def _cancel_steps(self, steps: set[str], batch: Batch) -> None:
        for key in [k for k in self._inflight if k[0] in steps]:
            flight = self._inflight.pop(key)
            self.executor.cancel(flight.handle)
            batch.nodes.append(NodeWrite(node_id=key[0], fan_index=key[1], status=NodeStatus.CANCELLED,
                                         attempt=flight.attempt, error={"reason": "its step failed"},
                                         started_at=flight.started_at, finished_at=self.clock()))

    def _decide(self, step: str, batch: Batch) -> None:
        """Every item of a partial fan-out settled: ask its policy, record the decision, obey it."""
        spec = self.wf.steps[step]
        result = self._fanout.result(step, self.outputs, self._fan_total(step))
        try:
            decision = spec.fan_out_policy.decide(result)
        except Exception as exc:  # a user's decision function that raises fails the step, visibly
            decision = Fail(f"on_partial_failure raised {type(exc).__name__}: {printable(str(exc))}")
        batch.events.append(NewEvent(kind="fanout_decision", node_id=step, data={
            "verdict": decision.verdict.value, "reason": decision.reason, "round": result.round,
            "successes": len(result.successes), "failures": [f.index for f in result.failures],
            "policy": spec.fan_out_policy.describe()}))
        self._obey(step, decision, result.model_dump(mode="json"), batch)

    def _obey(self, step: str, decision: Decision, result: dict[str, Any], batch: Batch) -> None:
        if decision.verdict == Verdict.CONTINUE:
            self.outputs[(step, -1)] = result
            self._write_parent_done(step, batch)
            self._count_done(self._sched.decided(step))
        elif decision.verdict == Verdict.RETRY_FAILED:
            indexes = self._fanout.start_retry(step)
            for i in indexes:
                self._attempts[(step, i)] = 0  # a new round: the items get their attempts again
            # The retried items' rows go back to pending in the decision's own commit. Left
            # 'failed', a crash after this commit made the resume read them as failures of the
            # new round: it decided again without re-running them (resume != uninterrupted).
            # (Their earlier writes in this batch are dropped: one upsert per row per statement.)
            again = {(step, i) for i in indexes}
            batch.nodes[:] = [n for n in batch.nodes if (n.node_id, n.fan_index) not in again]
            batch.nodes.extend(NodeWrite(node_id=step, fan_index=i, status=NodeStatus.PENDING, attempt=0)
                               for i in indexes)
            batch.nodes.append(NodeWrite(node_id=step, fan_index=-1, status=NodeStatus.RUNNING,
                                         attempt=self._fanout.round(step), started_at=self.clock()))
            self._sched.retry_items(step, indexes)
        else:
            error = {"type": "FanOutPolicy", "message": decision.reason, "verdict": decision.verdict.value}
            batch.nodes.append(NodeWrite(node_id=step, fan_index=-1, status=NodeStatus.FAILED, error=error,
                                         attempt=self._fanout.round(step), finished_at=self.clock()))
            self._step_failed(step, -1, batch, error, force_rollback=decision.verdict == Verdict.COMPENSATE)

