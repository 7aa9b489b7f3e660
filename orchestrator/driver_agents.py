"""The driver's side of agent nodes: starting their loop, finishing them, budgets and pauses.

A mixin of ``Driver`` (split out to keep modules small); the loop itself is ``agentloop``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from raysaga.errors import LeaseLostError
from raysaga.orchestrator.agentloop import AgentNode, is_agent_call, split_call
from raysaga.orchestrator.context import StepContext
from raysaga.orchestrator.driver_base import SETTLE_SECONDS
from raysaga.orchestrator.driver_settle import ForwardSettling
from raysaga.orchestrator.records import merge_run
from raysaga.orchestrator.scheduler import NodeKey
from raysaga.orchestrator.spec import StepSpec
from raysaga.orchestrator.task import NodeCall, execute
from raysaga.state import (
    Batch,
    MemoryEntry,
    NewEvent,
    NodeRecord,
    NodeStatus,
    NodeWrite,
    RunRecord,
    RunStatus,
    RunUpdate,
    jsoncodec,
    node_label,
)

if TYPE_CHECKING:
    from raysaga.orchestrator.driver import Driver


class AgentHooks(ForwardSettling):
    # ------------------------------------------------------------------ agent nodes

    def _start_agent(self, key: NodeKey, spec: StepSpec, row: NodeRecord | None, batch: Batch) -> None:
        """Build the prompt (the decorated function, run here: it must be cheap and pure) and
        hand the node to its loop, which replays whatever turns are already durable."""
        outcome = execute(spec, NodeCall(
            ctx=StepContext(run_id=self.run_id, node_id=key[0], fan_index=key[1], attempt=1,
                            trace_id=self.run.trace_id if self.run else ""),
            kwargs=self.kwargs(*key), max_output_bytes=self.options.max_output_bytes))
        prompt = jsoncodec.loads(outcome.output_json) if outcome.ok and outcome.output_json else None
        if not isinstance(prompt, str):
            error = outcome.error or {"type": "PromptError", "message": f"the prompt builder of {key[0]!r} "
                                      f"returned {type(prompt).__name__}, not a str"}
            self._fail_node(key, batch, {**error, "transient": False}, attempts=1)
            return
        if row is None:
            batch.nodes.append(NodeWrite(node_id=key[0], fan_index=key[1], status=NodeStatus.RUNNING, attempt=1,
                                         started_at=self.clock()))
        driver = cast("Driver", self)  # the loop drives through the whole Driver, whose part this is
        self._agents[key] = AgentNode(driver, key, spec, prompt, self._agent_rows.pop(key, []))
        self._agents_due.add(key)

    def agent_finished(self, key: NodeKey, output: Any, batch: Batch) -> None:
        self.outputs[key] = output
        text = jsoncodec.dumps(output, f"answer of agent node {node_label(*key)!r}")
        digest = None
        if len(text.encode()) > self.options.blob_threshold:
            digest = jsoncodec.digest(text.encode())
            batch.blobs[digest] = text.encode()
        batch.nodes.append(NodeWrite(node_id=key[0], fan_index=key[1], status=NodeStatus.COMPLETED, attempt=1,
                                     output=None if digest else output, output_digest=digest,
                                     finished_at=self.clock()))
        batch.events.append(NewEvent(kind="node_completed", node_id=key[0], fan_index=key[1],
                                     data={"agent": True}))
        self._settle_completed(key, batch, write=False)

    def agent_failed(self, key: NodeKey, error: dict[str, Any], batch: Batch) -> None:
        for sub in [k for k in self._inflight if is_agent_call(k[0]) and (split_call(k[0])[0], k[1]) == key]:
            self.executor.cancel(self._inflight.pop(sub).handle)
        self._fail_node(key, batch, error, attempts=1)

    @property
    def pending_batch(self) -> Batch:
        return self._pending_batch

    def restored_timer(self, when: float, key: NodeKey) -> None:
        self.schedule(when, key)

    def charge(self, tokens: int, cost: float, batch: Batch) -> None:
        """Count a model response's usage against the run (durable with the response itself)."""
        self._tokens += tokens
        self._cost += cost
        batch.run = merge_run(batch.run, RunUpdate(tokens_delta=tokens, cost_delta=cost))

    def budget_stop(self) -> str | None:
        """Why no further model call may start (the run's token or cost budget is spent), or None."""
        run = self.run
        if run is None:
            return None
        if run.token_budget is not None and self._tokens >= run.token_budget:
            return f"budget: {self._tokens} tokens used of a budget of {run.token_budget}"
        if run.cost_budget is not None and self._cost >= run.cost_budget:
            return f"budget: ${self._cost:.4f} spent of a budget of ${run.cost_budget:.4f}"
        return None

    def request_pause(self, reason: str) -> None:
        self._pause_reason = self._pause_reason or reason

    def _pause(self) -> RunRecord:
        reason = self._pause_reason or "paused"
        self._drain_model_calls()
        batch = self._pending_batch
        self._cancel_inflight(batch, reason=reason)
        self._settle_cancelled("pausing", SETTLE_SECONDS)  # a pause releases all compute
        batch.run = merge_run(batch.run, RunUpdate(status=RunStatus.PAUSED, status_reason=reason))
        record = self._flush()
        assert record is not None
        return record

    def _drain_model_calls(self) -> None:
        """Before a pause: let the agents' model calls in flight finish, and keep their answers
        (committed with the pause). They used to be cancelled with the rest: an answer already
        given, and billed, was lost, so the resume asked that turn again (a re-roll, invariant 3)
        and the run counted fewer tokens than the provider billed. A call that fails, or passes
        its timeout, is cancelled as before: it left no answer to keep."""
        assert self._hb is not None
        waiting = {key for key in self._inflight if is_agent_call(key[0]) and split_call(key[0])[2] is None}
        while waiting:
            if self._hb.lost.is_set():
                raise LeaseLostError(f"run {self.run_id!r}: lease lost; stopping without further calls")
            now = self.clock()
            waiting = {key for key in waiting if (self._inflight[key].deadline_from(now) or now + 1) > now}
            handles = [self._inflight[key].handle for key in waiting]
            for handle in self.executor.wait(handles, self._wait_timeout()) if handles else []:
                waiting.discard(handle.key)
                if handle.outcome is not None and handle.outcome.ok:
                    self._on_success(handle.key, self._inflight.pop(handle.key), handle.outcome,
                                     self._pending_batch)

    def memory_cas(self, key: str, value: Any, expected_version: int, writer: str) -> MemoryEntry:
        assert self._hb is not None
        self._flush()  # what led to this write is durable first
        return self.store.memory_cas(self._hb.lease, key, value, expected_version, writer)

