"""The compensating phase of a run: undo what was done, in reverse, durably.

It runs with the same ledger, retries and group commits as the forward DAG;
``raysaga.sagas.RollbackPlan`` decides the order and ``raysaga.sagas.rollback`` what gets
compensated, from the node rows the shell read when the rollback started (or resumed): every
node of a step with a compensation that completed, or whose outcome is unknown, and how the
rollback ends. Each compensation is an effect with its own idempotency key, the step's key +
``:compensate``; it is retried like any step and never runs twice for one key.

An agent's effect tools may register an undo too (``tool(compensate=...)``): each call of such a
tool that took effect (or may have) is a target of its own, node ``<step>@<turn>.<k>``, undone
latest first and before anything upstream of the agent, under the call's key + ``:compensate``.
Which calls owe one is ``machine.undo_targets.call_undo``'s answer, the one ``raysaga fork``
refuses by: a call answered with an error owes none; one whose tool cannot be told (its turn
unreadable, the tool gone) or whose arguments fail the tool's schema now stops the rollback when
a ledger row of it says it took effect (the run's own, or, for an inherited call, the row of the
run that executed it: ``RollbackReads.inherited``), and owes nothing when there is no such row.
"""

from __future__ import annotations

import functools
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from raysaga.agents.runtime import tool_undo
from raysaga.agents.tools import Tool
from raysaga.node_key import NodeKey
from raysaga.orchestrator.keys import COMPENSATE_SUFFIX, compensation_node, effect_key
from raysaga.orchestrator.machine.calls import Calls, Committed
from raysaga.orchestrator.machine.doubt import InDoubt, may_have_happened
from raysaga.orchestrator.machine.forward import Forward
from raysaga.orchestrator.machine.undo_targets import ToolLost, call_undo, turn_uses
from raysaga.orchestrator.options import compensation_retry
from raysaga.orchestrator.records import cancelled_row
from raysaga.orchestrator.spec import StepSpec
from raysaga.orchestrator.workflow import Workflow
from raysaga.sagas.plan import CompensationTarget, RollbackPlan
from raysaga.sagas.rollback import (
    UNKNOWN_OUTCOME,
    compensation_rows,
    restore_rollback,
    rollback_outcome,
    step_targets,
)
from raysaga.state import EffectRecord, EffectStatus, NewEvent, NodeRecord, NodeStatus, NodeWrite, RunUpdate

PlanKey = tuple[str, int]  # the plan's key of a target: (node_id, fan_index) of the node undone


@dataclass(frozen=True)
class RollbackReads:
    """What the shell reads for a rollback besides the run's rows (``driver_io.rollback_inputs``)."""

    elsewhere: tuple[EffectRecord, ...] = ()
    """Ledger rows of compensations written by other runs of the lineage (``Elsewhere``)."""
    cause: Any = None
    """The forward cause, read back from the ``rollback_cause`` event, of a run whose error a
    parking (``sagas.rollback.PARKING_ERRORS``) overwrote; None: the run's error says it."""
    approved: Mapping[PlanKey, dict[str, Any]] = field(default_factory=dict)
    """The arguments a human approved a tool call with (maybe edited), of the calls whose outcome
    is unknown (``driver_io.approved_args``): their undo is of the call that ran."""
    inherited: tuple[EffectRecord, ...] = ()
    """Ledger rows of the agent tool calls the run inherited (a fork's: they stay with the run that
    executed them, ``Store.inherited_effects``): whether such a call took effect, as its own
    ledger says for a call the run made."""


class Elsewhere:
    """Ledger rows of compensations written by other runs of the run's lineage, by key.

    A fork undoes a node it inherited under the key of the run that executed it, so the parent and
    every fork that inherited the node share one compensation key: two forks rolling back both
    undo it, and the run that executed it may too. The run's own ledger (read by run) holds only
    the rows it wrote; the shell also hands in those its lineage wrote (the runs each key derives
    from and their forks: ``raysaga.orchestrator.driver_io``). Before a compensation is
    issued, its key is looked up here: committed elsewhere, it is answered from that row (never
    called again, the row left as it is); pending elsewhere, another run is undoing it now, and
    this one's undo fails for good, naming that run, rather than call it a second time under the
    same key (once that run settles it, ``raysaga retry RUN --compensations`` answers it from the
    ledger); failed or abandoned elsewhere, this run takes it up, ``reconciling`` when the row
    says the call may have happened (``calls.may_have_happened``). A row keeps the run that wrote
    it first (``state.ledger_rows``): a taken-up key is settled in place, and its first writer
    finds it settled when its own rollback is retried."""

    def __init__(self, run_id: str, rows: Iterable[EffectRecord]) -> None:
        self.run_id = run_id
        self.rows = {row.idempotency_key: row for row in rows if row.run_id != run_id}

    def take_up(self, ekey: str, ledger: dict[str, tuple[EffectStatus, Any]]) -> dict[str, Any] | None:
        """Put another run's row of ``ekey`` into ``ledger`` (the run's own, which ``Calls.issue``
        reads), or return the error of a key another run has under way."""
        row = self.rows.get(ekey)
        if row is None or ekey in ledger:
            return None  # none elsewhere, or the run's own row (it wrote it first)
        if row.status == EffectStatus.PENDING:
            return {"type": "CompensationElsewhere", "transient": False, "run": row.run_id,
                    "message": f"its undo under key {ekey} is under way in run {row.run_id!r} (ledger row pending): "
                               f"not called a second time; once that run settles it, `raysaga retry "
                               f"{shlex.quote(self.run_id)} --compensations` answers it from the ledger"}
        result = row.result
        if row.status == EffectStatus.COMMITTED and isinstance(result, dict) and set(result) == {"blob"}:
            result = None  # (nothing reads an undo's output: its blob is not loaded for it)
        ledger[ekey] = (row.status, result)
        return None


@dataclass(frozen=True)
class _ToolCall:
    """A recorded call of an effect tool with an undo: what its compensation is called with."""

    tool: Tool
    args: dict[str, Any]
    key: str  # the call's idempotency key


def missing_tool(call: NodeKey, name: str, key: str, run_id: str, why: str = "") -> dict[str, Any]:
    """The error of a rollback target: an effect call (ledger key ``key``) of tool ``name``, which
    the code the run is resumed with no longer has (its undo, if it had one, cannot run); ``name``
    "": its turn's recorded response cannot be read, so which tool it made is unknown; ``why``: the
    tool is there but its undo cannot be called (``undo_targets.ToolLost.why``)."""
    retry = f"`raysaga retry {shlex.quote(run_id)} --compensations`"
    if why and "schema" in why:  # (ToolLost.why: its arguments no longer fit the tool's schema)
        return {"type": "CompensationMissing", "transient": False,
                "message": f"tool call {call.label} of tool {name!r} took effect (ledger key {key}), but {why}: "
                           f"its undo cannot be called with them; restore the schema the call was made under "
                           f"and {retry}, or undo it by hand"}
    if why:  # nothing in the code can call it (its recorded result is not a tool result): by hand
        return {"type": "CompensationMissing", "transient": False,
                "message": f"tool call {call.label} of tool {name!r} took effect (ledger key {key}), but {why}: "
                           "its undo cannot run; undo it by hand"}
    if not name:
        turn = call.owner.with_turn(call.turn).label if call.turn is not None else call.step
        return {"type": "CompensationMissing", "transient": False,
                "message": f"tool call {call.label} took effect (ledger key {key}), but which tool it made cannot "
                           f"be read from its turn {turn} (its recorded model response is not readable or asks "
                           "for fewer calls): its undo cannot run; undo it by hand"}
    return {"type": "CompensationMissing", "transient": False,
            "message": f"tool call {call.label} of tool {name!r} took effect (ledger key {key}), but the agent "
                       f"of step {call.step!r} no longer has a tool {name!r}: its undo cannot run; restore the "
                       f"tool (with its compensate=) and {retry}, or undo it by hand"}


#: What a node whose outcome was unknown says once its compensation undid it.
UNDONE_UNKNOWN = {"type": "Compensated", "transient": False,
                  "reason": "rolled back while its outcome was unknown (in flight, cancelled or waiting to "
                            "retry): its compensation ran"}


class Rollback:
    def __init__(self, wf: Workflow, run_id: str, reason: str, rows: list[NodeRecord], blobs: dict[str, Any],
                 calls: Calls, forward: Forward, cause: Any, reads: RollbackReads | None = None) -> None:
        """``rows``: every node row of the run, as the store holds them now; ``blobs``: the
        verified values of their output blobs; ``cause``: the run's error when it started;
        ``reads``: what else the shell read (``RollbackReads``)."""
        reads = reads or RollbackReads()
        self.wf = wf
        self.run_id = run_id
        self.reason = reason
        self.calls = calls
        self.forward = forward
        self.cause = cause
        self._elsewhere = Elsewhere(run_id, reads.elsewhere)
        undoable = {name: spec.map_over is not None for name, spec in wf.steps.items()
                    if wf.compensation_for(name) is not None}
        targets: list[CompensationTarget] = []
        self._outputs: dict[PlanKey, Any] = {}
        # a node a fork inherited is undone under the keys of the run that executed it (its
        # compensation then has one key in the parent and in every fork: at most once overall)
        self._origins: dict[PlanKey, str] = {}
        # nodes whose outcome is unknown: once undone, their rows are settled (a finished run
        # leaves no node 'retrying' or 'running' for ever; its ledger rows: EffectStatus.ABANDONED)
        self._unsettled: dict[PlanKey, NodeRecord] = {}
        for target, row in step_targets(rows, undoable):
            targets.append(target)
            if row.status in UNKNOWN_OUTCOME:
                self._unsettled[target.key] = row
            if row.origin_run_id:
                self._origins[target.key] = row.origin_run_id
            completed = row.status == NodeStatus.COMPLETED  # else in flight at the failure: no output
            self._outputs[target.key] = (blobs[row.output_digest] if row.output_digest
                                         else row.output) if completed else None
        self._tool_calls: dict[PlanKey, _ToolCall] = {}
        self._missing: dict[PlanKey, dict[str, Any]] = {}  # effect calls whose tool the code lost
        self._inherited = InDoubt()  # whether an inherited call took effect: its executor's ledger says
        self._inherited.restore(reads.inherited)
        targets += self._tool_targets(rows, blobs, reads.approved)
        self._settle_stale(rows, reason, {t.key for t in targets})
        restored = restore_rollback(compensation_rows(rows), (t.key for t in targets))
        self.plan = RollbackPlan(wf.graph, targets, restored.settled)
        self.errors: dict[PlanKey, Any] = dict(restored.failed)
        self._not_before: dict[PlanKey, float] = restored.not_before
        self._specs: dict[str, StepSpec] = {}
        for key, attempt in restored.attempts.items():
            calls.attempts[NodeKey.parse(*key).undo()] = attempt
        self.errors.update(self._missing)
        for key in [*restored.failed, *self._missing]:
            self.plan.fail(key)

    def _settle_stale(self, rows: list[NodeRecord], reason: str, wanted: set[PlanKey]) -> None:
        """Rows that say 'running' when the rollback starts: nothing is in flight once the forward
        DAG stops (its attempts were cancelled, their rows say so), so these were left by a driver
        that died (a step, item, agent or agent call it had under way). They say 'cancelled' now,
        as the attempts in flight did; one with an undo is still undone (its outcome is unknown:
        ``_unsettled`` keeps the row as read) and says so once undone (``_settle_undone``). A
        compensation's row is the plan's (restored), unless the code no longer undoes its node
        (``wanted``: a deploy removed the undo while it ran): left so, a compensated run kept it
        running for ever."""
        written = {(n.node_id, n.fan_index) for n in self.calls.out.batch.nodes}  # one upsert per row
        for row in rows:
            key = (row.node_id, row.fan_index)
            if row.status != NodeStatus.RUNNING or key in written:
                continue
            why = reason
            if NodeKey.parse(row.node_id, row.fan_index).compensates:
                if (row.node_id.removesuffix(COMPENSATE_SUFFIX), row.fan_index) in wanted:
                    continue  # a compensation's own row: the plan restores it
                why = "its undo was removed from the code while it ran: whether it took effect is unknown"
            self.calls.out.batch.nodes.append(cancelled_row(row.node_id, row.fan_index, row.attempt, why,
                                                            self.calls.out.now, row.started_at))

    def _tool_targets(self, rows: list[NodeRecord], blobs: dict[str, Any],
                      approved: Mapping[PlanKey, dict[str, Any]]) -> list[CompensationTarget]:
        """The calls of effect tools with an undo, per agent node: each undone after the later ones."""
        def output(row: NodeRecord) -> Any:
            return blobs[row.output_digest] if row.output_digest else row.output

        calls = [(NodeKey.parse(r.node_id, r.fan_index), r) for r in rows]
        calls = [(k, r) for k, r in calls if k.is_agent_call]
        uses_of = {(k.step, k.turn, k.fan_index): turn_uses(output(r)) for k, r in calls
                   if k.call is None and r.status == NodeStatus.COMPLETED}
        found: list[tuple[NodeKey, int, int, CompensationTarget]] = []  # (agent node, turn, k, target)
        for sub, row in calls:
            spec = self.wf.steps.get(sub.step)
            if sub.call is None or sub.turn is None or spec is None or spec.kind != "agent":
                continue
            uses = uses_of.get((sub.step, sub.turn, sub.fan_index))
            key = (row.node_id, row.fan_index)
            took = self._took(sub, key)
            undo = call_undo(spec.options["agent"], uses[sub.call] if uses is not None and sub.call < len(uses)
                             else None, row, functools.partial(output, row), took=took is not None,
                             approved=approved.get(key))
            if undo is None:
                continue
            if isinstance(undo, ToolLost):
                # an effect the code no longer has the tool of (or whose turn cannot be read):
                # whether it had an undo is unknown, so the rollback stops on it
                # (compensation_failed, naming it), never skips it
                assert took is not None
                self._missing[key] = missing_tool(sub, undo.name, took, self.run_id, undo.why)
            else:
                self._outputs[key] = undo.output
                call_key = self.calls.keys.get(sub) or effect_key(
                    row.origin_run_id or self.run_id, sub.step, row.fan_index, f"tool:{undo.tool.name}",
                    undo.tool.key_args(undo.args))
                self._tool_calls[key] = _ToolCall(undo.tool, undo.args, call_key)
                if row.status in UNKNOWN_OUTCOME:
                    self._unsettled[key] = row
            found.append((sub.owner, sub.turn, sub.call, CompensationTarget(key, undo.finished_at, step=sub.step)))
        found.sort(key=lambda f: (f[0], f[1], f[2]))
        targets = []
        for i, (agent, _, _, target) in enumerate(found):  # one by one per agent node, the latest call first
            later = found[i + 1] if i + 1 < len(found) and found[i + 1][0] == agent else None
            targets.append(CompensationTarget(target.key, target.finished_at, step=target.step,
                                              after=(later[3].key,) if later else ()))
        return targets

    def _took(self, call: NodeKey, key: PlanKey) -> str | None:
        """The ledger key of ``call``'s row that took effect or may have (None: no such row): the
        run's ledger as restored, the rows of the calls it inherited, and what this driver wrote
        since (a call it made and committed before the rollback began)."""
        found = self.calls.in_doubt.took.get(key) or self._inherited.took.get(key)
        ekey = self.calls.keys.get(call) if found is None else None
        if ekey is not None:
            status, result = self.calls.ledger.get(ekey, (None, None))
            if status == EffectStatus.COMMITTED or may_have_happened(status, result):
                found = ekey
        return found

    # ------------------------------------------------------------------ dispatch

    def issue_ready(self) -> None:
        """Issue every compensation the plan allows now (or wait out a restored backoff)."""
        for key in self.plan.ready():
            comp = NodeKey.parse(*key).undo()
            not_before = self._not_before.pop(key, None)
            if not_before is not None and not_before > self.calls.out.now:
                self.calls.schedule(not_before, comp)  # a durable backoff survives the crash
                continue
            if key in self._tool_calls:
                call = self._tool_calls[key]
                spec = self._tool_spec(comp, call.tool)
                kwargs: dict[str, Any] = {"args": call.args, "output": self._outputs[key]}
                ekey = call.key + COMPENSATE_SUFFIX
            else:
                step, index = key
                spec = self._step_spec(step)
                original = self.wf.steps[step]
                step_kwargs = self.forward.kwargs(step, index)
                kwargs = {}
                for name in spec.param_deps:  # (one with a default the step does not take keeps it)
                    if name == "output" or name in step_kwargs:
                        kwargs[name] = self._outputs[key] if name == "output" else step_kwargs[name]
                if spec.input_param:
                    kwargs[spec.input_param] = self.forward.run_input
                ekey = effect_key(self._origins.get(key, self.run_id), step, index, original.effect_name,
                                  step_kwargs) + COMPENSATE_SUFFIX
            busy = self._elsewhere.take_up(ekey, self.calls.ledger)
            if busy is not None:  # another run of the lineage is undoing it now: never a second call
                self._refuse(comp, busy)
                continue
            if isinstance(self.calls.issue(comp, spec, kwargs, ekey), Committed):
                self.completed(comp)

    def _tool_spec(self, comp: NodeKey, tool: Tool) -> StepSpec:
        name = f"{comp.step}@tool:{tool.name}{COMPENSATE_SUFFIX}"
        spec = self._specs.get(name)
        if spec is None:
            spec = self._specs[name] = StepSpec(
                name=name, fn=functools.partial(tool_undo, tool), deps=(), param_deps=("args", "output"),
                input_param=None, ctx_param="ctx", param_types={"args": Any, "output": Any}, output_type=Any,
                effect=True, effect_name=f"tool:{tool.name}{COMPENSATE_SUFFIX}",
                retry=compensation_retry(None, tool.retry), timeout=tool.timeout)
        return spec

    def _step_spec(self, step: str) -> StepSpec:
        name = compensation_node(step)
        spec = self._specs.get(name)
        if spec is None:
            original = self.wf.steps[step]
            fn = self.wf.compensation_for(step)
            assert fn is not None
            retry = compensation_retry(self.wf.compensation_retries.get(step), original.retry)
            spec = self.wf.make_spec(fn, name=name, effect=True, effect_name=original.effect_name + COMPENSATE_SUFFIX,
                                     retry=retry, timeout=original.timeout)
            self._specs[name] = spec
        return spec

    # ------------------------------------------------------------------ outcomes

    @staticmethod
    def _target(comp: NodeKey) -> PlanKey:
        undone = comp.undone()
        return (undone.node_id, undone.fan_index)

    def timer_fired(self, comp: NodeKey) -> None:
        self.plan.retry(self._target(comp))

    def completed(self, comp: NodeKey) -> None:
        key = self._target(comp)
        self.plan.complete(key)
        self._settle_undone(key)

    def _settle_undone(self, key: PlanKey) -> None:
        """The compensation of a node whose outcome was unknown committed: in the same batch, a row
        left ``retrying`` ends ``failed`` (its last attempt failed and no retry will come), one left
        ``running`` ``cancelled`` (it was in flight when the run stopped and never came back). Its
        ledger row, still ``pending``, becomes ``abandoned`` when the run ends (``EffectStatus``)."""
        row = self._unsettled.pop(key, None)
        if row is None:
            return
        final = {NodeStatus.RETRYING: NodeStatus.FAILED, NodeStatus.RUNNING: NodeStatus.CANCELLED}.get(row.status)
        if final is not None:
            batch = self.calls.out.batch  # (its 'cancelled' from _settle_stale, if not committed yet: one upsert a row)
            batch.nodes[:] = [n for n in batch.nodes if (n.node_id, n.fan_index) != key]
            batch.nodes.append(NodeWrite(
                node_id=row.node_id, fan_index=row.fan_index, status=final, attempt=row.attempt,
                error=UNDONE_UNKNOWN, started_at=row.started_at, finished_at=self.calls.out.now))

    def _refuse(self, comp: NodeKey, error: dict[str, Any]) -> None:
        """Fail ``comp`` for good without calling it (its key is another run's, under way there)."""
        batch, attempt = self.calls.out.batch, self.calls.attempts.get(comp, 0)
        batch.nodes.append(NodeWrite(node_id=comp.node_id, fan_index=comp.fan_index, status=NodeStatus.FAILED,
                                     attempt=attempt, error=error, finished_at=self.calls.out.now))
        batch.events.append(NewEvent(kind="node_failed", node_id=comp.node_id, fan_index=comp.fan_index,
                                     data={"attempt": attempt, "error": error}))
        self.failed(comp, error)

    def failed(self, comp: NodeKey, error: Any) -> None:
        key = self._target(comp)
        self.plan.fail(key)
        self.errors[key] = {k: v for k, v in (error or {}).items() if k != "traceback"}

    def outcome(self) -> RunUpdate:
        """Compensated, or parked for an operator with every failing and blocked compensation named."""
        return rollback_outcome(self.reason, self.plan, self.errors, self.cause, run_id=self.run_id)
