"""The compensating phase of a run: undo what was done, in reverse, durably.

The driver runs it with the same lease, executor, ledger and group commits as the forward
DAG; ``raysaga.sagas.RollbackPlan`` decides the order and ``raysaga.sagas.rollback`` what gets
compensated, from the node rows read when the rollback starts (or resumes): every node of a step
with a compensation that completed, or whose outcome is unknown (it was in flight, or its retries
ran out on transient errors), and how the rollback ends. Each compensation is an effect with
its own idempotency key, the step's key + ``:compensate``; it is retried like any step and never
runs twice for one key.

An agent's effect tools may register an undo too (``tool(compensate=...)``): each call of such a
tool that took effect (or may have) is a target of its own, node ``<step>@<turn>.<k>``, undone
latest first and before anything upstream of the agent, under the call's key + ``:compensate``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from raysaga.agents.messages import ModelResponse
from raysaga.agents.runtime import tool_undo
from raysaga.agents.tools import Tool, ToolError, tool_output
from raysaga.orchestrator.agentloop import SEP, is_agent_call, split_call
from raysaga.orchestrator.keys import COMPENSATE_SUFFIX, compensation_node, effect_key
from raysaga.orchestrator.options import compensation_retry
from raysaga.orchestrator.spec import StepSpec
from raysaga.orchestrator.task import NodeCall
from raysaga.sagas.plan import CompensationTarget, RollbackPlan
from raysaga.sagas.rollback import compensation_rows, effect_time, restore_rollback, rollback_outcome, step_targets
from raysaga.state import Batch, NodeRecord, NodeStatus, RunUpdate

if TYPE_CHECKING:
    from raysaga.orchestrator.driver import Driver

NodeKey = tuple[str, int]

@dataclass(frozen=True)
class _ToolCall:
    """A recorded call of an effect tool with an undo: what its compensation is called with."""

    tool: Tool
    args: dict[str, Any]
    key: str  # the call's idempotency key


class Rollback:
    def __init__(self, driver: Driver, reason: str) -> None:
        self._d = driver
        self.reason = reason
        wf = driver.wf
        rows = driver.store.nodes(driver.run_id)
        # verified and parsed by the store: a missing, altered or non-JSON blob parks the run (BlobIntegrityError)
        blobs = driver.blobs({r.output_digest: f"node {r.label}" for r in rows if r.output_digest})
        undoable = {name: spec.map_over is not None for name, spec in wf.steps.items()
                    if wf.compensation_for(name) is not None}
        targets: list[CompensationTarget] = []
        self._outputs: dict[NodeKey, Any] = {}
        for target, row in step_targets(rows, undoable):
            targets.append(target)
            completed = row.status == NodeStatus.COMPLETED  # else in flight at the failure: no output
            # blobs come verified and parsed from the store (driver.blobs)
            self._outputs[target.key] = (blobs[row.output_digest] if row.output_digest
                                         else row.output) if completed else None
        self._tool_calls: dict[NodeKey, _ToolCall] = {}
        targets += self._tool_targets(rows, blobs)
        restored = restore_rollback(compensation_rows(rows), (t.key for t in targets))
        self.plan = RollbackPlan(wf.graph, targets, restored.settled)
        self.errors: dict[NodeKey, Any] = dict(restored.failed)
        self._not_before: dict[NodeKey, float] = restored.not_before
        for key, attempt in restored.attempts.items():
            driver.restore_attempts((compensation_node(key[0]), key[1]), attempt)
        for key in restored.failed:
            self.plan.fail(key)

    def _tool_targets(self, rows: list[NodeRecord], blobs: dict[str, Any]) -> list[CompensationTarget]:
        """The calls of effect tools with an undo, per agent node: each undone after the later ones."""
        wf = self._d.wf

        def output(row: NodeRecord) -> Any:
            return blobs[row.output_digest] if row.output_digest else row.output

        calls = [(split_call(r.node_id), r) for r in rows if is_agent_call(r.node_id)]
        uses_of = {(step, turn, r.fan_index): ModelResponse.model_validate(output(r)).tool_uses()
                   for (step, turn, k), r in calls if k is None and r.status == NodeStatus.COMPLETED}
        found: list[tuple[NodeKey, int, int, CompensationTarget]] = []  # (agent node, turn, k, target)
        for (step, turn, k), row in calls:
            spec = wf.steps.get(step)
            uses = uses_of.get((step, turn, row.fan_index))
            if k is None or spec is None or spec.kind != "agent" or uses is None:
                continue
            use = uses[k] if k < len(uses) else {}
            tool = spec.options["agent"].tool(str(use.get("name", "")))
            if tool is None or tool.compensate is None:
                continue
            try:
                args = tool.validate(use.get("input"))
            except ToolError:
                continue  # refused before any call
            key = (row.node_id, row.fan_index)
            finished = effect_time(row)
            if finished is None:
                continue
            if row.status == NodeStatus.COMPLETED:
                result = output(row)
                if not isinstance(result, dict) or result.get("is_error"):
                    continue  # answered without an effect: a refusal, a breaker, a loop stop
                self._outputs[key] = tool_output(result)
            else:
                self._outputs[key] = None  # it may have taken effect: undone as the latest
            call_key = effect_key(self._d.run_id, step, row.fan_index, f"tool:{tool.name}", tool.key_args(args))
            self._tool_calls[key] = _ToolCall(tool, args, call_key)
            found.append(((step, row.fan_index), turn, k, CompensationTarget(key, finished, step=step)))
        found.sort(key=lambda f: (f[0], f[1], f[2]))
        targets = []
        for i, (agent, _, _, target) in enumerate(found):  # one by one per agent node, the latest call first
            later = found[i + 1] if i + 1 < len(found) and found[i + 1][0] == agent else None
            targets.append(CompensationTarget(target.key, target.finished_at, step=target.step,
                                              after=(later[3].key,) if later else ()))
        return targets

    # ------------------------------------------------------------------ dispatch

    def _tool_call(self, key: NodeKey, batch: Batch) -> tuple[NodeKey, NodeCall] | None:
        call = self._tool_calls[key]
        comp_key = (compensation_node(key[0]), key[1])
        spec = self._d.specs.get(comp_key[0])
        if spec is None:
            tool = call.tool
            spec = self._d.specs[comp_key[0]] = StepSpec(
                name=f"{split_call(key[0])[0]}{SEP}tool:{tool.name}{COMPENSATE_SUFFIX}",
                fn=functools.partial(tool_undo, tool), deps=(), param_deps=("args", "output"), input_param=None,
                ctx_param="ctx", param_types={"args": Any, "output": Any}, output_type=Any, effect=True,
                effect_name=f"tool:{tool.name}{COMPENSATE_SUFFIX}", retry=compensation_retry(None, tool.retry),
                timeout=tool.timeout)
        made = self._d.make_call(comp_key, spec, {"args": call.args, "output": self._outputs[key]},
                                 call.key + COMPENSATE_SUFFIX, batch)
        return None if made is None else (comp_key, made)

    def _spec(self, step: str) -> StepSpec:
        name = compensation_node(step)
        spec = self._d.specs.get(name)
        if spec is None:
            wf = self._d.wf
            original = wf.steps[step]
            fn = wf.compensation_for(step)
            assert fn is not None
            retry = compensation_retry(wf.compensation_retries.get(step), original.retry)
            spec = wf.make_spec(fn, name=name, effect=True, effect_name=original.effect_name + COMPENSATE_SUFFIX,
                                retry=retry, timeout=original.timeout)
            self._d.specs[name] = spec
        return spec

    def ready_calls(self, batch: Batch) -> list[tuple[NodeKey, NodeCall]]:
        calls = []
        for key in self.plan.ready():
            step, index = key
            comp_key = (compensation_node(step), index)
            not_before = self._not_before.pop(key, None)
            if not_before is not None and not_before > self._d.clock():
                self._d.schedule(not_before, comp_key)  # a durable backoff survives the crash
                continue
            if key in self._tool_calls:
                made = self._tool_call(key, batch)
                if made is not None:
                    calls.append(made)
                continue
            spec = self._spec(step)
            original = self._d.wf.steps[step]
            step_kwargs = self._d.kwargs(step, index)
            kwargs: dict[str, Any] = {}
            for name in spec.param_deps:
                kwargs[name] = self._outputs[key] if name == "output" else step_kwargs.get(name)
            if spec.input_param:
                kwargs[spec.input_param] = self._d.run.input if self._d.run else None
            step_key = effect_key(self._d.run_id, step, index, original.effect_name, step_kwargs)
            call = self._d.make_call(comp_key, spec, kwargs, step_key + COMPENSATE_SUFFIX, batch)
            if call is not None:
                calls.append((comp_key, call))
        return calls

    # ------------------------------------------------------------------ outcomes

    @staticmethod
    def _original(comp_key: NodeKey) -> NodeKey:
        return (comp_key[0][: -len(COMPENSATE_SUFFIX)], comp_key[1])

    def retry_later(self, comp_key: NodeKey) -> None:
        self.plan.retry(self._original(comp_key))

    def completed(self, comp_key: NodeKey) -> None:
        self.plan.complete(self._original(comp_key))

    def failed(self, comp_key: NodeKey, error: Any) -> None:
        key = self._original(comp_key)
        self.plan.fail(key)
        self.errors[key] = {k: v for k, v in (error or {}).items() if k != "traceback"}

    def outcome(self) -> RunUpdate:
        """Compensated, or parked for an operator with every failing and blocked compensation named."""
        return rollback_outcome(self.reason, self.plan, self.errors, self._d.run.error if self._d.run else None)
