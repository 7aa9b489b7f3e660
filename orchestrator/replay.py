"""Replay: re-execute a finished run's steps in this process and report the outputs that now differ.

The check to run after changing a step's code: every completed plain step is called again, in
this process, with the inputs the run recorded (the run's input and its upstream nodes' stored
outputs, never the replayed ones), and its output compared with the stored one. Nothing reaches
the outside world:

- an ``effect=True`` step is not called: its output is its ledger row's committed result;
- an agent node's prompt is built again by its (maybe changed) function and its conversation
  replayed from the stored turns: every model response and tool result comes from the store, and
  the agent's rules (output parsing, validation) decide the final answer again, compared with the
  stored one. A replay that would need a model call or a tool call the run never made says so
  (``diverged``) instead of making it.

Non-effect steps are expected to be pure (raysaga re-runs them after a crash anyway); a step that
calls out is called out again by a replay.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from raysaga.agents.turns import (
    CallModel,
    Conversation,
    Fail,
    Finish,
    RunTool,
    UseMemory,
    next_actions,
    record_tool_failure,
)
from raysaga.errors import ForkError
from raysaga.node_key import NodeKey
from raysaga.orchestrator.context import StepContext
from raysaga.orchestrator.options import RunOptions
from raysaga.orchestrator.task import NodeCall, execute
from raysaga.orchestrator.workflow import Workflow
from raysaga.state import EffectStatus, NodeRecord, NodeStatus, RunRecord, Store, jsoncodec, open_store
from raysaga.state.models import PRUNABLE
from raysaga.state.redact import scrub, scrub_text

__all__ = ["ReplayNode", "ReplayReport", "replay"]

#: Verdicts of a replayed node.
SAME, DIFFERS, FAILED, LEDGER, DIVERGED, NOT_RUN = "same", "differs", "failed", "ledger", "diverged", "not run"


@dataclass(frozen=True)
class ReplayNode:
    """One node of a replay: what it recorded, what the code returns now, and the verdict."""

    label: str
    verdict: str
    """``same``, ``differs``, ``failed`` (raised now), ``ledger`` (an effect, an approval or a
    sleep: its recorded outcome, not called), ``diverged`` (an agent would need a call the run
    never made), ``not run`` (no completed row, or its inputs were not recorded)."""
    recorded: Any = None
    now: Any = None
    detail: str = ""


@dataclass
class ReplayReport:
    run_id: str
    nodes: list[ReplayNode] = field(default_factory=list)

    @property
    def differing(self) -> list[ReplayNode]:
        """Nodes whose output differs now, or that fail or diverge now."""
        return [n for n in self.nodes if n.verdict in (DIFFERS, FAILED, DIVERGED)]

    def as_data(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "differing": [n.label for n in self.differing],  # secrets: never shown
                "nodes": [{"node": n.label, "verdict": n.verdict, "detail": scrub_text(n.detail),
                           "recorded": scrub(n.recorded), "now": scrub(n.now)} for n in self.nodes]}


def _same(a: Any, b: Any) -> bool:
    return bool(jsoncodec.dumps(a) == jsoncodec.dumps(b))


def _short(value: Any) -> str:
    text = jsoncodec.dumps(scrub(value))
    return text if len(text) <= 120 else text[:117] + "..."


class _Replay:
    def __init__(self, wf: Workflow, run: RunRecord, rows: list[NodeRecord], blobs: dict[str, Any],
                 ledger: dict[tuple[str, int], Any]) -> None:
        self.wf = wf
        self.run = run
        self.ledger = ledger
        self.rows: dict[tuple[str, int], NodeRecord] = {}
        self.calls: dict[tuple[str, int], list[tuple[NodeKey, NodeRecord, Any]]] = {}
        self.outputs: dict[tuple[str, int], Any] = {}
        for row in rows:
            key = NodeKey.parse(row.node_id, row.fan_index)
            value = blobs[row.output_digest] if row.output_digest else row.output
            if key.compensates:
                continue
            if key.is_agent_call:
                self.calls.setdefault((key.step, key.fan_index), []).append((key, row, value))
                continue
            self.rows[(key.step, key.fan_index)] = row
            if row.status == NodeStatus.COMPLETED:
                self.outputs[(key.step, key.fan_index)] = value
        self.max_output = RunOptions().max_output_bytes

    def output_of(self, step: str) -> Any:
        spec = self.wf.steps[step]
        if spec.map_over is not None and not spec.fan_out_policy.partial:
            items = sorted(i for s, i in self.outputs if s == step and i >= 0)
            return [self.outputs[(step, i)] for i in items]
        return self.outputs[(step, -1)]

    def kwargs(self, step: str, index: int) -> dict[str, Any]:
        spec = self.wf.steps[step]
        kwargs: dict[str, Any] = {}
        if spec.input_param:
            kwargs[spec.input_param] = self.run.input
        for dep in spec.param_deps:
            value = self.output_of(dep)
            kwargs[dep] = value[index] if dep == spec.map_over else value
        return kwargs

    def call(self, step: str, index: int, kwargs: dict[str, Any]) -> tuple[bool, Any]:
        spec = self.wf.steps[step]
        row = self.rows[(step, index)]
        ctx = StepContext(run_id=self.run.run_id, node_id=step, fan_index=index, attempt=row.attempt,
                          trace_id=self.run.trace_id)
        outcome = execute(spec, NodeCall(ctx=ctx, kwargs=kwargs, max_output_bytes=self.max_output))
        if not outcome.ok:
            return False, (outcome.error or {}).get("message", "failed")
        assert outcome.output_json is not None
        return True, jsoncodec.loads(outcome.output_json)

    def node(self, step: str, index: int) -> ReplayNode:
        label = NodeKey(step, index).label
        spec = self.wf.steps[step]
        recorded = self.outputs.get((step, index))
        if (step, index) not in self.outputs:
            return ReplayNode(label, NOT_RUN, detail="no completed row in the run")
        try:
            kwargs = self.kwargs(step, index)
        except (KeyError, IndexError, TypeError):
            return ReplayNode(label, NOT_RUN, recorded, detail="its inputs were not all recorded")
        if spec.effect:
            return ReplayNode(label, LEDGER, recorded, self.ledger.get((step, index), recorded),
                              detail="an effect: served from the ledger, not called")
        if spec.kind == "agent":
            return self.agent(label, step, index, kwargs, recorded)
        if spec.kind != "step":  # an approval's decision, a sleep's wake-up: what happened, not code to re-run
            return ReplayNode(label, LEDGER, recorded, recorded, detail=f"a {spec.kind}: its recorded outcome")
        ok, now = self.call(step, index, kwargs)
        if not ok:
            return ReplayNode(label, FAILED, recorded, None, detail=f"raises now: {now}")
        if _same(now, recorded):
            return ReplayNode(label, SAME, recorded, now)
        return ReplayNode(label, DIFFERS, recorded, now, detail=f"recorded {_short(recorded)}, now {_short(now)}")

    def agent(self, label: str, step: str, index: int, kwargs: dict[str, Any], recorded: Any) -> ReplayNode:
        ok, prompt = self.call(step, index, kwargs)
        if not ok or not isinstance(prompt, str):
            return ReplayNode(label, FAILED, recorded, None, detail=f"its prompt cannot be built now: {prompt}")
        agent = self.wf.steps[step].options["agent"]
        conv = Conversation(prompt)
        subs = sorted(self.calls.get((step, index), []), key=lambda c: (c[0].turn or 0, -1 if c[0].call is None
                                                                        else c[0].call))
        for key, row, value in subs:
            assert key.turn is not None
            if row.status == NodeStatus.COMPLETED:
                conv.put(key.turn, key.call, value)
            elif key.call is not None and row.status == NodeStatus.FAILED:
                record_tool_failure(agent, conv, key.turn, key.call, row.error.as_dict() if row.error else {})
        turns = sum(1 for k, _, _ in subs if k.call is None)
        for action in next_actions(agent, conv, waiting=set(), budget_stop=None):
            if isinstance(action, CallModel):
                return ReplayNode(label, DIVERGED, recorded, None,
                                  detail=f"would ask the model a turn the run never asked (turn {action.turn})")
            if isinstance(action, RunTool | UseMemory):
                return ReplayNode(label, DIVERGED, recorded, None, detail=f"would make a tool call the run never "
                                  f"made (turn {action.turn}, call {action.call})")
            if isinstance(action, Fail):
                return ReplayNode(label, FAILED, recorded, None, detail=f"fails now: {action.message}")
            if isinstance(action, Finish):
                now = action.output
                if _same(now, recorded):
                    return ReplayNode(label, SAME, recorded, now, detail=f"from {turns} stored turns")
                return ReplayNode(label, DIFFERS, recorded, now,
                                  detail=f"from {turns} stored turns: recorded {_short(recorded)}, now {_short(now)}")
        return ReplayNode(label, DIVERGED, recorded, None, detail="the stored turns end without an answer now")

    def nodes_of(self, step: str) -> Iterable[int]:
        if self.wf.steps[step].map_over is None:
            return [-1]
        return sorted(i for s, i in self.rows if s == step and i >= 0)


def replay(workflow: Workflow, run_id: str, *, store: Store | str | None = None,
           until: str | None = None) -> ReplayReport:
    """Re-execute the finished run ``run_id`` in this process against its recorded inputs and
    report each node's verdict (module docstring). ``until``: only that step and its upstream."""
    if not isinstance(store, Store):  # opened here: closed here (left open, it kept its connections)
        opened = open_store(store, create=False)
        try:
            return replay(workflow, run_id, store=opened, until=until)
        finally:
            opened.close()
    st = store
    workflow.validate()
    run = st.get_run(run_id)
    if run.status not in PRUNABLE:
        raise ForkError(f"run {run_id!r} is {run.status.value}: replay a run at rest (wait for it to finish)")
    if run.workflow_name != workflow.name:
        raise ForkError(f"run {run_id!r} is a run of workflow {run.workflow_name!r}, not {workflow.name!r}: "
                        "replay it with its own workflow (--workflow MODULE:WF)")
    steps = list(workflow.order)
    if until is not None:
        if until not in workflow.steps:  # a step's name, as written: not an item, a turn or a padded name
            raise ForkError(f"--until {until!r} is not a step of workflow {workflow.name!r}: give a step's name (a "
                            f"replay replays whole steps), one of {', '.join(steps)}")
        last = until
        wanted = {last, *workflow.graph.predecessors(last)} | _ancestors(workflow, last)
        steps = [s for s in steps if s in wanted]
    rows = st.nodes(run_id)
    blobs = st.load_blobs({r.output_digest: f"node {r.label}" for r in rows if r.output_digest})
    ledger_rows = [e for e in (*st.inherited_effects(run_id), *st.effects(run_id))
                   if e.status == EffectStatus.COMMITTED]
    ledger_blobs = st.load_blobs({e.result["blob"]: f"node {e.node_id}" for e in ledger_rows
                                  if isinstance(e.result, dict) and set(e.result) == {"blob"}})
    ledger = {(e.node_id, e.fan_index): ledger_blobs[e.result["blob"]] if isinstance(e.result, dict)
              and set(e.result) == {"blob"} else e.result for e in ledger_rows}
    rep = _Replay(workflow, run, rows, blobs, ledger)
    report = ReplayReport(run_id)
    for step in steps:
        for index in rep.nodes_of(step):
            report.nodes.append(rep.node(step, index))
    return report


def _ancestors(wf: Workflow, step: str) -> set[str]:
    import networkx as nx

    return set(nx.ancestors(wf.graph, step))
