"""Random workflows for the run machine's model tests, and the world their attempts meet.

- ``cases()``: a hypothesis strategy of workflow plans: steps with data dependencies, effects,
  fan-outs (``map_over``) with every kind of partial-failure policy, compensations, non-critical
  steps (skip or pass), and at most one agent node with scripted turns calling an effect tool
  (with or without an undo), a plain tool and, sometimes, the shared memory; sometimes a token
  budget that pauses the run or fails the agent; now and then a human approval node, which the
  plan's human approves or rejects once the run rests waiting for it (``human``).
- ``build_workflow(plan)``: the plan declared with the public DSL (``raysaga.Workflow``,
  ``@wf.step``, ``@wf.agent``, ``@wf.compensation``, policies from ``raysaga``).
- ``FateWorld``: what each attempt does. Every node (by label) has a fate, drawn by hypothesis
  the first time it is needed and then fixed: ``j`` transient failures (attempts 1..j), then
  ``ok`` / ``permanent`` / ``transient`` forever. With ``j`` below the node's attempts, the
  node's final outcome does not depend on how many attempts a crash used up, so a run with
  crashes can be held to the same end as one without. Outputs are pure functions of the node
  and its inputs; the model answers each turn from a script, and its final answer quotes what
  the tools returned (so a replayed conversation that differs shows).
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

from raysaga import (
    ALL,
    BEST_EFFORT,
    Compensate,
    Continue,
    FanOutResult,
    RetryFailed,
    RetryPolicy,
    RunStatus,
    Workflow,
    min_success_ratio,
    on_partial_failure,
    quorum,
)
from raysaga.agents import Agent, ModelRequest, ScriptedModel, tool
from raysaga.node_key import NodeKey
from raysaga.orchestrator.machine.outbox import Dispatch
from raysaga.orchestrator.task import NodeOutcome
from raysaga.sagas.policy import Decision
from raysaga.state import EffectStatus, NodeStatus, RunRecord, jsoncodec, node_label
from raysaga.state.decisions import request_of
from raysaga.testing import text_reply, tool_reply
from tests.orchestrator.machine.memory_run import MemoryRun

__all__ = ["AGENT", "HUMAN", "Fate", "FateWorld", "Plan", "StepPlan", "build_workflow", "cases", "human", "new_fold",
           "projection"]

AGENT = "ag"
HUMAN = "h"
POLICIES = ("all", "best_effort", "quorum", "ratio", "retry_round")
COMPENSATION_ATTEMPTS = 3
TOOL_ATTEMPTS = 2
MODEL_ATTEMPTS = 2
TURN_TOKENS = 15  # each scripted model turn uses 10 input + 5 output tokens


# ---------------------------------------------------------------------- plans


@dataclass(frozen=True)
class StepPlan:
    name: str
    deps: tuple[str, ...] = ()
    kind: str = "step"  # step | agent | approval
    map_over: str | None = None
    policy: str = "all"
    effect: bool = False
    compensated: bool = False
    critical: bool = True
    on_failure: str = "skip"
    max_attempts: int = 2
    items: int | None = None  # the length of its list output, when a fan-out maps over it
    memory: bool = False  # agent: use the shared memory
    undo: bool = False  # agent: its effect tool has a compensation
    on_budget: str = "pause"  # agent
    undo_retry: bool = True  # its compensation declares a retry policy (else the default one)
    verdict: str = "approve"  # approval: what the human decides once the run rests waiting for it


@dataclass(frozen=True)
class Plan:
    steps: tuple[StepPlan, ...]
    backoff: float = 0.0
    token_budget: int | None = None
    fail_rate: int = 2  # of 20: how often a node's fate ends in a failure

    def step(self, name: str) -> StepPlan:
        return next(p for p in self.steps if p.name == name)

    def describe(self) -> str:
        def one(p: StepPlan) -> str:
            bits = [p.kind if p.kind != "step" else ""]
            bits += [f"deps={list(p.deps)}" if p.deps else "",
                     f"map_over={p.map_over}/{p.policy}" if p.map_over else ""]
            bits += ["effect" if p.effect else "", "compensated" if p.compensated else "",
                     "" if p.critical else f"non-critical/{p.on_failure}", f"items={p.items}" if p.items is not None
                     else "", f"attempts={p.max_attempts}"]
            if p.kind == "agent":
                bits += ["memory" if p.memory else "", "undo" if p.undo else "", f"on_budget={p.on_budget}"]
            if p.kind == "approval":
                bits.append(p.verdict)
            return f"{p.name}({', '.join(b for b in bits if b)})"

        return "; ".join(one(p) for p in self.steps) + (f"; backoff={self.backoff}; token_budget={self.token_budget}"
                                                        f"; fail_rate={self.fail_rate}/20")


@st.composite
def cases(draw: st.DrawFn, *, max_steps: int = 5, agent: bool = True, backoff: bool = False,
          approvals: bool = True) -> Plan:
    n = draw(st.integers(1, max_steps))
    agent_at = draw(st.none() | st.integers(0, n)) if agent else None
    plans: list[StepPlan] = []
    for i in range(n + (agent_at is not None)):
        earlier = [p.name for p in plans]
        deps = tuple(draw(st.lists(st.sampled_from(earlier), unique=True, max_size=2))) if earlier else ()
        critical = draw(st.sampled_from([True, True, False]))
        on_failure = draw(st.sampled_from(["skip", "pass"]))
        on_failure = "skip" if critical else on_failure  # ('pass' on a critical step: a definition error)
        if agent_at == i:
            plans.append(StepPlan(name=AGENT, deps=deps, kind="agent", critical=critical, on_failure=on_failure,
                                  memory=draw(st.booleans()), undo=draw(st.booleans()),
                                  on_budget=draw(st.sampled_from(["pause", "fail"]))))
            continue
        if approvals and earlier and draw(st.integers(0, 5)) == 0:  # a human approval now and then
            plans.append(StepPlan(name=f"s{len(plans)}", deps=deps, kind="approval", critical=critical,
                                  on_failure=on_failure, verdict=draw(st.sampled_from(["approve", "reject"]))))
            continue
        producers = [p.name for p in plans if p.kind == "step" and p.map_over is None]
        map_over = draw(st.none() | st.sampled_from(producers)) if producers else None
        if map_over is not None and map_over not in deps:
            deps = (*deps, map_over)
        plans.append(StepPlan(
            name=f"s{len(plans)}", deps=deps, map_over=map_over,
            policy=draw(st.sampled_from(POLICIES)) if map_over else "all", effect=draw(st.booleans()),
            compensated=draw(st.sampled_from([True, True, False])), critical=critical,
            on_failure=on_failure, max_attempts=draw(st.integers(1, 3))))
    mapped = {p.map_over for p in plans if p.map_over}
    plans = [dataclasses.replace(p, items=draw(st.integers(0, 3))) if p.name in mapped else p for p in plans]
    budget = draw(st.none() | st.sampled_from([TURN_TOKENS, 3 * TURN_TOKENS])) if agent_at is not None else None
    return Plan(tuple(plans), backoff=draw(st.sampled_from([0.0, 0.5])) if backoff else 0.0, token_budget=budget,
                fail_rate=draw(st.sampled_from([2, 0, 1, 4])))


# ---------------------------------------------------------------------- the workflow, declared with the DSL


def _never(name: str, params: Sequence[str]) -> Callable[..., Any]:
    """A step function with these parameters that must never run (the shell runs no user code)."""

    def never(**kwargs: Any) -> Any:
        raise AssertionError(f"{name} ran: the test shell runs no user code")

    never.__name__ = never.__qualname__ = name
    setattr(never, "__signature__", inspect.Signature(  # noqa: B010 (a function attribute mypy does not know)
        [inspect.Parameter(p, inspect.Parameter.KEYWORD_ONLY) for p in params]))
    return never


def _retry_round(result: FanOutResult) -> Decision:
    """Retry the failed items once; then go on with what succeeded, or roll back if nothing did."""
    if result.failures and result.round == 1:
        return RetryFailed("once more")
    return Continue("enough") if result.successes or not result.total else Compensate("nothing worked")


POLICY = {"all": ALL, "best_effort": BEST_EFFORT, "quorum": quorum(2), "ratio": min_success_ratio(0.5),
          "retry_round": on_partial_failure(_retry_round)}


def _charge(amount: int) -> dict[str, Any]:
    raise AssertionError("charge ran: the test shell runs no user code")


def _refund(amount: int, output: Any) -> None:
    raise AssertionError("refund ran: the test shell runs no user code")


def _lookup(q: str) -> dict[str, Any]:
    raise AssertionError("lookup ran: the test shell runs no user code")


def _retry(attempts: int, backoff: float) -> RetryPolicy:
    return RetryPolicy(max_attempts=attempts, base=backoff, cap=max(4 * backoff, 1.0))


def _agent(p: StepPlan, backoff: float) -> Agent:
    retry = _retry(TOOL_ATTEMPTS, backoff)
    charge = tool(_charge, name="charge", effect=True, retry=retry, compensate=_refund if p.undo else None)
    lookup = tool(_lookup, name="lookup", retry=retry)
    return Agent(name="model_agent", model=ScriptedModel(), tools=(charge, lookup), shared_memory=p.memory,
                 transport_retry=_retry(MODEL_ATTEMPTS, backoff), on_budget=p.on_budget)


def build_workflow(plan: Plan) -> Workflow:
    wf = Workflow("machine_model", version="1")
    for p in plan.steps:
        fn = _never(p.name, p.deps)
        if p.kind == "agent":
            wf.agent(_agent(p, plan.backoff), name=p.name, critical=p.critical, on_failure=p.on_failure)(fn)  # type: ignore[arg-type]
            continue
        if p.kind == "approval":  # its request is built by the world's ``prompt``, as an agent's prompt is
            wf.approval(name=p.name, approvers=[HUMAN], critical=p.critical,
                        on_failure=p.on_failure)(fn)  # type: ignore[arg-type]
            continue
        wf.step(fn, name=p.name, effect=p.effect, critical=p.critical, on_failure=p.on_failure,  # type: ignore[call-overload]
                retry=_retry(p.max_attempts, plan.backoff), map_over=p.map_over,
                policy=POLICY[p.policy] if p.map_over else None)
        if p.compensated:
            undo = _never(f"undo_{p.name}", ("output",))
            retry = _retry(COMPENSATION_ATTEMPTS, plan.backoff) if p.undo_retry else None
            wf.compensation(p.name, retry=retry)(undo)
    return wf.validate()


def human(plan: Plan) -> Callable[[MemoryRun, float], None]:
    """The approver: decides every approval the run waits for, as the plan says, once (a decision
    with the same id is not recorded twice), at a fixed time (so runs with and without crashes
    record the same ``Approval``)."""

    def decide(fold: MemoryRun, now: float) -> None:
        recorded = {s.payload.get("decision_id") for s in fold.signals if isinstance(s.payload, dict)}
        for row in fold.nodes.values():
            if row.status != NodeStatus.WAITING or request_of(row) is None:
                continue
            decision_id = f"{row.node_id}-decision"
            if decision_id in recorded:
                continue
            verdict = plan.step(row.node_id).verdict
            fold.send_signal(verdict, {"decision_id": decision_id, "verdict": verdict, "by": HUMAN, "at": 0.0,
                                       "node": row.node_id, "fan_index": row.fan_index, "comment": "as planned"},
                             now)

    return decide


def new_fold(wf: Workflow, plan: Plan) -> MemoryRun:
    """A run just created (``pending``), as ``Store.create_run`` leaves it."""
    return MemoryRun(RunRecord(run_id="run-model", workflow_name=wf.name, workflow_version=wf.version,
                               definition_hash=wf.definition_hash, status=RunStatus.PENDING, version=0,
                               trace_id="trace-model", created_at=1000.0, updated_at=1000.0,
                               token_budget=plan.token_budget))


# ---------------------------------------------------------------------- the world


@dataclass(frozen=True)
class Fate:
    transients: int
    end: str  # ok | permanent | transient

    def at(self, attempt: int) -> str:
        if attempt <= self.transients or self.end == "transient":
            return "transient"
        return self.end


@st.composite
def fates(draw: st.DrawFn, max_attempts: int | None, fail_rate: int) -> Fate:
    """Mostly ``ok`` (a few after transient failures); ``fail_rate`` in 20 end in a failure:
    permanent at once, permanent after transient ones, or transient until the attempts run out
    (not for a node retried without a bound that matters: ``max_attempts`` None)."""
    roll = draw(st.integers(0, 19))  # shrinks towards 0: plain ok
    flaky = draw(st.integers(1, (max_attempts or 3) - 1)) if max_attempts != 1 else 0
    if roll >= 20 - fail_rate:
        ends = [Fate(0, "permanent"), Fate(flaky, "permanent")]
        return draw(st.sampled_from([*ends, Fate(0, "transient")] if max_attempts else ends))
    return Fate(flaky if roll >= 16 - fail_rate else 0, "ok")


def agent_turns(p: StepPlan) -> list[list[tuple[str, dict[str, Any]]]]:
    """The tool uses of the scripted model's turns; the turn after the last one answers."""
    turns: list[list[tuple[str, dict[str, Any]]]] = [[("charge", {"amount": 5}), ("lookup", {"q": "tides"})]]
    if p.memory:
        turns.append([("memory_write", {"key": "notes", "value": {"n": 1}, "expected_version": 0})])
        turns.append([("memory_read", {"key": "notes"})])
    turns.append([("charge", {"amount": 7})])
    return turns


class FateWorld:
    """Outcomes from per-node fates (drawn once per label through ``draw``), outputs from inputs."""

    def __init__(self, plan: Plan, draw: Callable[[st.SearchStrategy[Any]], Any]) -> None:
        self.plan = plan
        self.draw = draw
        self.fates: dict[str, Fate] = {}

    def fate(self, label: str, max_attempts: int | None) -> Fate:
        if label not in self.fates:
            self.fates[label] = self.draw(fates(max_attempts, self.plan.fail_rate))
        return self.fates[label]

    def prompt(self, key: NodeKey, kwargs: dict[str, Any]) -> str:
        # normalised like every other node's inputs: an agent downstream of a partial fan-out gets
        # its FanOutResult, whose failures' attempt counts a crash may raise (see ``normalise``)
        return f"task for {key.label}: {jsoncodec.fingerprint(normalise(kwargs))[:12]}"

    def outcome(self, d: Dispatch, now: float) -> NodeOutcome:
        key = d.key
        attempts: int | None
        if key.compensates:
            # a tool's undo retries as long as the tool's retry policy allows, raised to
            # COMPENSATION_ATTEMPTS (a million): it is never left failing transiently for good
            attempts = None if key.turn is not None else COMPENSATION_ATTEMPTS
        elif key.is_agent_call:
            attempts = MODEL_ATTEMPTS if key.call is None else TOOL_ATTEMPTS
        else:
            attempts = self.plan.step(key.step).max_attempts
        what = self.fate(key.label, attempts).at(d.call.attempt)
        if what == "transient":
            return NodeOutcome(ok=False, error={"type": "Flaky", "message": "flaky", "transient": True},
                               transient=True, started_at=now)
        if what == "permanent":
            return NodeOutcome(ok=False, error={"type": "Refused", "message": "refused", "transient": False},
                               started_at=now)
        return NodeOutcome(ok=True, output_json=jsoncodec.dumps(self.value(d)), started_at=now)

    def value(self, d: Dispatch) -> Any:
        key, kwargs = d.key, d.call.kwargs
        if key.compensates:
            return {"undone": key.undone().label}
        if key.is_agent_call and key.call is None:
            return self._model(key, kwargs["request"])
        if key.is_agent_call:
            args = kwargs["args"]
            if d.spec.name.endswith("@tool:charge"):
                ekey = d.call.idempotency_key or ""
                return {"content": jsoncodec.dumps({"charged": args["amount"], "ref": ekey[-8:]}), "is_error": False}
            return {"content": jsoncodec.dumps({"q": args["q"], "hits": 2}), "is_error": False}
        base = {"node": key.label, "in": jsoncodec.fingerprint(normalise(kwargs))[:10]}
        items = self.plan.step(key.step).items
        return [{**base, "n": n} for n in range(items)] if items is not None else base

    def _model(self, key: NodeKey, request: dict[str, Any]) -> dict[str, Any]:
        assert key.turn is not None
        turns = agent_turns(self.plan.step(key.step))
        if key.turn < len(turns):
            reply = tool_reply(*turns[key.turn], input_tokens=10, output_tokens=5)
        else:
            messages = ModelRequest.model_validate(request).messages
            seen = [b.get("content") if not b.get("is_error") else "error"
                    for m in messages if isinstance(m.get("content"), list) for b in m["content"]
                    if b.get("type") == "tool_result"]
            reply = text_reply(f"done {jsoncodec.fingerprint([messages[0], seen])[:12]}", input_tokens=10,
                               output_tokens=5)
        return reply.model_dump(mode="json")


# ---------------------------------------------------------------------- comparing two runs

_ATTEMPTS = re.compile(r"\d+ attempts? exhausted")


def normalise(value: Any) -> Any:
    """A value with the attempt counts a crash may change taken out: an attempt in flight when the
    process died counts as one (it may have run), so a resumed node can fail for good at a higher
    attempt than the same node in a run without the crash. Counts show in error reasons ('3
    attempts exhausted') and in a partial fan-out's ``FanOutResult.failures[].attempts``, hence
    in the inputs (and the effect keys) of its dependents."""
    if isinstance(value, dict):
        return {k: normalise(v) for k, v in value.items() if k not in ("attempt", "attempts")}
    if isinstance(value, list):
        return [normalise(v) for v in value]
    if isinstance(value, str):
        return _ATTEMPTS.sub("N attempts exhausted", value)
    return value


def drained_items(fold: MemoryRun) -> set[tuple[str, int]]:
    """The items of a fan-out that settled after it failed: drained, an effect's attempt in flight
    let land and recorded, never retried (``Calls.drain``). What that one call did (ok, or a
    transient failure) is the world's answer to it, and a crash changes which call that is: the
    attempt a crash cut off is sent again as another (a world that answers by attempt number
    answers it otherwise). So their outcomes are not compared (``projection``: only that none is
    left pending), nor counted as progress (a schedule's signal waits on forward nodes done).
    Items settled before their step failed are compared as any node."""
    failed_at = {r.node_id: r.finished_at for r in fold.nodes.values()
                 if r.fan_index < 0 and r.status == NodeStatus.FAILED and r.finished_at is not None}
    return {(r.node_id, r.fan_index) for r in fold.nodes.values()
            if r.fan_index >= 0 and r.node_id in failed_at
            and (r.finished_at is None or r.finished_at > failed_at[r.node_id])}


def projection(fold: MemoryRun) -> dict[str, Any]:
    """What a run ends with that no crash may change: its status, reason, output and error; the
    nodes that completed (with their outputs), failed or were skipped; the ledger; the tokens."""
    run = fold.run
    drained = drained_items(fold)

    done = {r.label: normalise(r.output) for r in fold.nodes.values()
            if r.status == NodeStatus.COMPLETED and (r.node_id, r.fan_index) not in drained}
    ended = {r.label: r.status.value for r in fold.nodes.values()
             if r.status in (NodeStatus.FAILED, NodeStatus.SKIPPED) and (r.node_id, r.fan_index) not in drained}
    return {
        "status": run.status.value,
        "reason": normalise(run.status_reason),
        "output": normalise(run.output),
        "error": normalise(None if run.error is None else run.error.as_dict()),
        "tokens": run.tokens_used,
        "completed": done,
        "failed_or_skipped": ended,
        # by node, not by key: an effect's key covers its inputs, and a partial fan-out's result
        # upstream counts its failed items' attempts (see ``normalise``)
        "ledger": sorted((e.node_id, e.fan_index, e.effect_name, e.status.value, jsoncodec.dumps(normalise(e.result)))
                         for e in fold.effects.values() if (e.node_id, e.fan_index) not in drained),
        "drained_pending": sorted(node_label(e.node_id, e.fan_index) for e in fold.effects.values()
                                  if (e.node_id, e.fan_index) in drained and e.status == EffectStatus.PENDING),
        "memory": {k: (v.value, v.version) for k, v in fold.memory.items()},
    }
