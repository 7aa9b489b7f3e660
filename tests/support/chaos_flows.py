"""Random workflows for the chaos suite, built from a JSON spec so any process rebuilds the same DAG.

Not a test module. A spec (``tests.support.chaos_gen`` draws them) is a plain JSON object::

    {"name": "chaos_1a2b", "steps": [
        {"name": "s0", "kind": "plan", "items": 3, "deps": []},
        {"name": "s1", "kind": "map", "over": "s0", "deps": ["s0"], "effect": true, "compensate": true,
         "fail_items": [2], "policy": {"kind": "quorum", "k": 2}},
        {"name": "s2", "kind": "step", "deps": ["s1"], "effect": true, "fate": "flaky",
         "critical": false, "on_failure": "pass"}, ...]}

``build(spec)`` turns it into a ``Workflow``; ``FLOWS[path]`` builds the spec saved as JSON at
``path``, which is how a driver process gets it
(``python -m tests.support.crash_driver --flows tests.support.chaos_flows --flow /tmp/x/spec.json``).

Every step is deterministic in its inputs and its attempt number:

- ``plan`` returns ``items`` elements; ``map`` runs once per element of ``over``'s output,
  its items in ``fail_items`` failing permanently, with the fan-out ``policy`` (``all``,
  ``best_effort``, ``quorum`` k, ``ratio`` r) deciding what the step does with them;
- ``fate``: ``ok``; ``fail`` (``Permanent``, before any call); ``flaky`` (a ``ConnectionError``
  on attempt 1, before any call, then ``ok``);
- ``effect``: one call to the fake provider (kind ``do``, subject ``<seed>/<label>``) with
  ``ctx.idempotency_key``; ``compensate``: a compensation calling it (kind ``undo``, subject
  ``<seed>/<label>:undo``) with its own key, so the provider's ordered log is the rollback's order;
- ``critical`` (default true) and ``on_failure`` (``skip``/``pass``) as in the DSL;
- ``agent``: an agent node on the real ``anthropic`` SDK (``AnthropicModel``) pointed at
  ``tests.support.messages_server`` (the saved spec's ``model_url``), whose answers
  ``chaos_model.reply_for`` scripts from the prompt: ``turns`` lists, per turn, the tool calls the model asks
  for (``lookup``, no effect; ``act``, an effect, kind ``do``; ``act_undone``, an effect with an
  undo, kind ``undo``, as a compensated step's; and the tools that raise, ``RAISING``:
  ``broken``, a plain tool raising ``ToolError``; ``act_broken``, an effect tool failing for good
  (``Permanent``) before any call; ``unreachable``, a plain tool whose every attempt is a
  ``ConnectionError``, retried at once until its attempts are spent; and ``act_lost``, an effect
  whose first attempt takes effect at the provider and then raises ``ConnectionError``, the
  reply lost: its retry re-sends the key, deduped, ``LOST_CALLS`` calls by plan), then a final JSON answer
  digesting every tool result it saw, errors included (the agent goes on after a tool's error).
  Tool arguments carry the provider's URL outside their key (``key=``). With ``over`` (and
  ``policy``) the agent fans out over a plan: one agent per element, its prompt naming its
  item (``item=``), so its tool calls' subjects are its own;
- ``approval``: an approval node; the harness decides it (``verdict``, by ``DECIDER``) once the
  run rests waiting for it (``decide``), so golden and faulted runs get the same decisions. An
  ``Approval``'s time and decision ids differ between runs: digests leave them out, and an
  effect never takes an approval as an input (its key would digest them). With ``over``, one
  approval per element of a plan (``map_over``), each approved but those in ``reject_items``.
  ``quorum: 2``: two approvers (``DECIDER``, ``DECIDER_B``) must both approve (one rejection
  rejects); ``answer: true``: the approval takes an integer answer, each approver answering
  its own (``approval_answer``: the last approval's is the node's);
- an agent's gated tool calls (``act_gated``) in ``edit_calls`` (``<turn>.<call>``) are approved
  with edited arguments (``edited``): the call runs with them, under their key.

A step's output digests its name, the run's seed and every input it received (canonical JSON,
fan-out results included), so a resumed run that fed a step anything else than the golden run
did ends with other outputs.
"""

from __future__ import annotations

import hashlib
import inspect
import json
from collections.abc import Callable, Iterator, Mapping
from functools import cache
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from raysaga import BEST_EFFORT, Approval, Permanent, RetryPolicy, StepContext, Workflow, min_success_ratio, quorum
from raysaga.agents import Agent, AnthropicModel, LoopPolicy, ToolError, tool
from raysaga.sagas.policy import ALL, FanOutPolicy, FanOutResult
from tests.support import services as fake_services

#: A flaky step's second attempt is due at once: with any backoff, whether a rollback starts
#: before or after the retry would hang on the wall clock (and a crash's pause lets the timer
#: run out), so a resumed run could legitimately end otherwise than the golden one.
FAST_RETRY = RetryPolicy(max_attempts=3, base=0.0, cap=0.0)
COMPENSATION_RETRY = RetryPolicy(max_attempts=3, base=0.01, cap=0.02)
FATES = ("ok", "fail", "flaky")
POLICIES = ("all", "best_effort", "quorum", "ratio")
FAN_OUT_FIELDS = set(FanOutResult.model_fields)
APPROVAL_FIELDS = set(Approval.model_fields)
#: Fields of an ``Approval`` that differ between two runs decided alike (when, which decision row).
APPROVAL_VOLATILE = ("at", "decision_ids")
MODEL = "claude-haiku-4-5"
#: The API key the driver processes and Ray workers run with (``tests.support.agent_flows``'s).
KEY_ENV, TEST_KEY = "ANTHROPIC_API_KEY", "sk-ant-test-raysaga-agents"
DECIDER = "chaos"
#: The second approver of an approval with ``quorum: 2``.
DECIDER_B = "chaos-b"
TOOLS = ("lookup", "act", "act_undone")
#: Tools that raise (``tests.support.chaos_gen`` draws them with ``raising_tools=True``).
RAISING = ("broken", "act_broken", "unreachable")
#: ``unreachable``'s retries: due at once (a backoff would race the wall clock across a crash).
TOOL_RETRY = RetryPolicy(max_attempts=2, base=0.0, cap=0.0)
AGENT_TRANSPORT = RetryPolicy(max_attempts=6, base=0.02, cap=0.1)
#: The third generator's tools (``tests.support.chaos_gen`` draws them with ``ending=True``):
#: ``lookup_flaky`` and ``act_flaky`` fail transiently on their first attempt (before any call)
#: and then succeed, ``act_gated`` is an effect that waits for a human (``requires_approval``).
ENDING = ("lookup_flaky", "act_flaky", "act_gated")
#: The second generator's tool failing transiently *after* its call took effect (``act_lost``: the
#: provider saw the key and answered, then the reply was lost): its retry re-sends the same key
#: and the provider dedupes. Its plan, per call: ``LOST_CALLS`` calls reach the provider with
#: the call's key (the one whose reply was lost, then the retry), one effective.
LOST = ("act_lost",)
LOST_CALLS = 2
#: Tools that tell their first attempt by a mark (``_first_attempt``): the spec gets a marks folder.
MARKED = (*ENDING, *LOST)
#: The flaky tools' retries: due at once, and one to spare (a crash may cost an attempt).
FLAKY_RETRY = RetryPolicy(max_attempts=3, base=0.0, cap=0.0)
#: How an agent of the third generator ends on its own once its scripted tool turns are done
#: (``end``): ``max_turns`` (it keeps asking for tools), ``loop`` (the same call again and again:
#: warned, then ``LoopDetected``), ``invalid`` (answers that are not JSON: ``InvalidOutput``),
#: ``loop_pause`` (the same loop with ``LoopPolicy(then="pause")``: the run pauses, the harness
#: unpauses it, and the model answers), ``fixed`` (one answer refused, the next one valid: it
#: completes), ``model_400`` (its last turn refused by the API: ``ModelCallFailed``),
#: ``model_down`` (its last turn overloaded at every attempt: ``ModelUnavailable``).
ENDS = ("max_turns", "loop", "loop_pause", "invalid", "fixed", "model_400", "model_down")
#: Transport faults the Messages server answers a turn with before its answer (``model_faults``):
#: ``stall`` holds the request past the client's timeout (``STALL_TIMEOUT_S``) and then closes it.
MODEL_FAULTS = ("429", "500", "529", "drop", "stall")
#: The client timeout of an agent whose plan has a ``stall`` (every other agent's is 30 s): far
#: above a scripted answer's time on a loaded 2-core machine, so only the stalls time out (an
#: answered turn that timed out would be asked again, and the oracle would rightly count it).
STALL_TIMEOUT_S = 2.0
#: How long the server holds a stalled request before closing it (past ``STALL_TIMEOUT_S``).
STALL_HOLD_S = 4.0


class ChaosIn(BaseModel):
    services_url: str
    seed: str = "chaos"


def sample_input(services_url: str, seed: str = "chaos") -> dict[str, Any]:
    return ChaosIn(services_url=services_url, seed=seed).model_dump()


def canonical(value: Any) -> Any:
    """``value`` as plain JSON data (pydantic models dumped), for digests.

    A fan-out result's failures lose their attempt counts: a crash may cost an attempt (a killed
    attempt counts, so a step that kills its process is parked), so they may differ from the
    golden run's without anything being wrong. An approval's time and decision ids, and a
    rejection's decision id, go too: each run's decisions are made anew."""
    if isinstance(value, BaseModel):
        return canonical(value.model_dump(mode="json"))
    if isinstance(value, dict):
        if set(value) == FAN_OUT_FIELDS:  # a FanOutResult, as a step with an untyped input gets it
            value = {**value, "failures": [{k: v for k, v in f.items() if k != "attempts"} for f in value["failures"]]}
        if set(value) == APPROVAL_FIELDS:  # an Approval: when and under which ids it was decided differ
            value = {k: v for k, v in value.items() if k not in APPROVAL_VOLATILE}
        if value.get("type") == "Rejected":  # a rejection's error record: its decision's id differs
            value = {k: v for k, v in value.items() if k != "decision_id"}
        return {str(k): canonical(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [canonical(v) for v in value]
    return value


def digest(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(canonical(list(parts)), sort_keys=True).encode()).hexdigest()[:12]


def _key(ctx: StepContext) -> str:
    assert ctx.idempotency_key is not None, f"{ctx.label} is not an effect"
    return ctx.idempotency_key


def run_step(step: dict[str, Any], ctx: StepContext, input: ChaosIn, deps: dict[str, Any]) -> Any:
    """The body of every generated step."""
    fate = step.get("fate", "ok")
    if step["kind"] == "map" and ctx.fan_index in step.get("fail_items", []):
        fate = "fail"
    if fate == "flaky" and ctx.attempt == 1:
        raise ConnectionError(f"{ctx.label}: flaky on its first attempt")
    if fate == "fail":
        raise Permanent(f"{ctx.label} fails on purpose")
    receipt = None
    if step.get("effect"):
        reply = fake_services.post(input.services_url, "do", _key(ctx), {"subject": f"{input.seed}/{ctx.label}"})
        receipt = reply["id"]
    mine = digest(ctx.label, input.seed, deps)
    if step["kind"] == "plan":
        return [{"item": i, "d": digest(mine, i)} for i in range(step["items"])]
    return {"step": ctx.label, "d": mine, "receipt": receipt}


def undo(ctx: StepContext, input: ChaosIn, output: Any) -> dict[str, Any]:
    """The compensation of every compensated step: one provider call, kind ``undo``."""
    reply = fake_services.post(input.services_url, "undo", _key(ctx), {
        "subject": f"{input.seed}/{ctx.label}:undo", "output": digest(output)})
    return {"undo": reply["id"]}


def _policy(spec: dict[str, Any] | None) -> FanOutPolicy:
    kind = (spec or {}).get("kind", "all")
    if kind == "best_effort":
        return BEST_EFFORT
    if kind == "quorum":
        return quorum(int(spec["k"]))  # type: ignore[index]
    if kind == "ratio":
        return min_success_ratio(float(spec["r"]))  # type: ignore[index]
    assert kind == "all", kind
    return ALL


def _function(step: dict[str, Any], run: Callable[..., Any] | None = None) -> Callable[..., Any]:
    """A function named after the step whose parameters are ``ctx``, ``input`` and its dependencies
    (``run(step, input, deps)`` given: no ``ctx``, for an agent's prompt or an approval's ask)."""
    deps: list[str] = list(step["deps"])

    def body(**kwargs: Any) -> Any:
        run_input = kwargs.pop("input")
        if run is not None:
            return run(step, run_input, kwargs)
        return run_step(step, kwargs.pop("ctx"), run_input, kwargs)

    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    head = {"input": ChaosIn} if run is not None else {"ctx": StepContext, "input": ChaosIn}
    params = [inspect.Parameter(name, kind, annotation=ann) for name, ann in head.items()]
    params += [inspect.Parameter(dep, kind, annotation=Any) for dep in deps]
    body.__signature__ = inspect.Signature(params, return_annotation=Any)  # type: ignore[attr-defined]
    body.__annotations__ = {**head, **dict.fromkeys(deps, Any), "return": Any}
    body.__name__ = body.__qualname__ = step["name"]
    return body


def build(spec: dict[str, Any]) -> Workflow:
    """The workflow of ``spec`` (the same DAG, names and contracts in every process)."""
    wf = Workflow(spec["name"], version="1", description="a random DAG of the chaos suite")
    for step in spec["steps"]:
        options: dict[str, Any] = {
            "name": step["name"], "effect": bool(step.get("effect")), "retry": FAST_RETRY,
            "critical": bool(step.get("critical", True)), "on_failure": step.get("on_failure", "skip")}
        if step["kind"] == "agent":
            fan_out = {"map_over": step["over"], "policy": _policy(step.get("policy"))} if "over" in step else {}
            if spec.get("marks") and uses(step, MARKED):
                step = {**step, "marks": spec["marks"]}
            wf.agent(make_agent(step, spec["model_url"]), name=step["name"], critical=options["critical"],
                     on_failure=options["on_failure"], **fan_out)(_function(step, prompt))
            continue
        if step["kind"] == "approval":
            wf.approval(name=step["name"], approvers=deciders(step), quorum=int(step.get("quorum", 1)),
                        answer=int if step.get("answer") else None, critical=options["critical"],
                        on_failure=options["on_failure"], map_over=step.get("over"))(_function(step, ask))
            continue
        if step["kind"] == "map":
            wf.map(step["over"], policy=_policy(step.get("policy")), **options)(_function(step))
        else:
            wf.step(**options)(_function(step))
        if step.get("compensate"):
            wf.compensation(step["name"], retry=COMPENSATION_RETRY)(undo)
    return wf.validate()


# ---------------------------------------------------------------------- agents and approvals


class AgentAnswer(BaseModel):
    """An agent node's output: its name and a digest of its prompt and of every tool result."""

    agent: str
    d: str


def prompt(step: dict[str, Any], input: ChaosIn, deps: dict[str, Any]) -> str:
    """An agent's prompt: everything the scripted model needs (``chaos_model.reply_for`` parses it); an
    agent of a fan-out names its item (the element's ``item`` of the plan it maps over)."""
    head = f"agent {step['name']} seed={input.seed} services={input.services_url} deps={digest(deps)}"
    item = None
    if "over" in step:
        item = int(deps[step["over"]]["item"])
        head += f" item={item}"
    text = f"{head}\nturns={json.dumps(step['turns'], separators=(',', ':'))}"
    plan = plan_of(step, item)
    return text + (f"\nplan={json.dumps(plan, separators=(',', ':'), sort_keys=True)}" if plan else "")


def agent_label(fields: Mapping[str, str]) -> str:
    """The node label of the agent a prompt's ``fields`` (``parse_prompt``) belong to: ``s3``, or
    ``s3[1]`` for item 1 of a fan-out."""
    return fields["agent"] + (f"[{fields['item']}]" if "item" in fields else "")


def ask(step: dict[str, Any], input: ChaosIn, deps: dict[str, Any]) -> str:
    return f"approve {step['name']} of {input.seed}? inputs {digest(deps)}"


def lookup_impl(subject: str, n: int) -> str:
    """A plain tool: deterministic in its arguments."""
    return f"found {digest(subject, n)}"


def act_impl(subject: str, n: int, services_url: str, idempotency_key: str | None = None) -> dict[str, Any]:
    """An effect tool: one provider call (kind ``do``) under the call's key."""
    assert idempotency_key is not None
    reply = fake_services.post(services_url, "do", idempotency_key, {"subject": subject})
    return {"receipt": str(reply["id"])}


def act_undo(ctx: StepContext, output: Any, subject: str, n: int, services_url: str) -> dict[str, Any]:
    """The undo of an ``act_undone`` call: one provider call, kind ``undo``."""
    reply = fake_services.post(services_url, "undo", _key(ctx), {"subject": f"{subject}:undo",
                                                                 "output": digest(output)})
    return {"undo": reply["id"]}


def _first_attempt(marks: str, subject: str) -> bool:
    """Whether this is the first attempt of the call about ``subject`` in this run: a tool cannot
    see its attempt, so the first one leaves a mark (a file in ``marks``, created exclusively:
    once per run, whatever the process; the harness empties the folder before every run)."""
    folder = Path(marks)
    folder.mkdir(parents=True, exist_ok=True)
    try:
        (folder / hashlib.sha256(subject.encode()).hexdigest()[:24]).open("x").close()
    except FileExistsError:
        return False
    return True


def reset_marks(path: str) -> None:
    """Forget every flaky call's first attempt (before a run of the spec saved at ``path``)."""
    marks = json.loads(Path(path).read_text()).get("marks")
    if marks and Path(marks).is_dir():
        for mark in Path(marks).iterdir():
            mark.unlink()


def lookup_flaky_impl(subject: str, n: int, marks: str) -> str:
    """A plain tool failing transiently (``ConnectionError``) on its first attempt, then answering."""
    if _first_attempt(marks, subject):
        raise ConnectionError(f"lookup_flaky: flaky on its first attempt: {subject}")
    return f"found {digest(subject, n)}"


def act_flaky_impl(subject: str, n: int, services_url: str, marks: str,
                   idempotency_key: str | None = None) -> dict[str, Any]:
    """An effect tool failing transiently on its first attempt before its call, then calling the
    provider (kind ``do``) under the call's key: the retry must carry the same key."""
    if _first_attempt(marks, subject):
        raise ConnectionError(f"act_flaky: flaky on its first attempt: {subject}")
    return act_impl(subject, n, services_url, idempotency_key)


def act_lost_impl(subject: str, n: int, services_url: str, marks: str,
                  idempotency_key: str | None = None) -> dict[str, Any]:
    """An effect tool whose first attempt calls the provider (kind ``do``) under the call's key, the
    call taking effect, and then fails transiently (``ConnectionError``: the reply was lost); every
    later attempt calls again under the same key (the provider dedupes) and returns its receipt."""
    first = _first_attempt(marks, subject)
    receipt = act_impl(subject, n, services_url, idempotency_key)
    if first:
        raise ConnectionError(f"act_lost: the reply to the call was lost: {subject}")
    return receipt


def broken_impl(subject: str, n: int) -> str:
    """A plain tool answering every call with an error the model sees (``ToolError``)."""
    raise ToolError(f"broken on purpose: {subject}")


def act_broken_impl(subject: str, n: int, services_url: str, idempotency_key: str | None = None) -> dict[str, Any]:
    """An effect tool failing for good (``Permanent``) before it calls anything."""
    raise Permanent(f"act_broken fails on purpose: {subject}")


def unreachable_impl(subject: str, n: int) -> str:
    """A plain tool whose every attempt fails transiently: its retries spent, the model sees an error."""
    raise ConnectionError(f"unreachable on purpose: {subject}")


KEY = ("subject", "n")  # the provider's URL is no part of what a call does
lookup = tool(lookup_impl, name="lookup", description="Look a subject up.")
act = tool(act_impl, name="act", effect=True, key=KEY, description="Do something (an effect).")
act_undone = tool(act_impl, name="act_undone", effect=True, key=KEY, compensate=act_undo,
                  description="Do something that a rollback undoes.")
broken = tool(broken_impl, name="broken", description="Look a subject up (always answers an error).")
act_broken = tool(act_broken_impl, name="act_broken", effect=True, key=KEY,
                  description="Do something (an effect that always fails).")
unreachable = tool(unreachable_impl, name="unreachable", retry=TOOL_RETRY,
                   description="Look a subject up (its service is never reachable).")
lookup_flaky = tool(lookup_flaky_impl, name="lookup_flaky", retry=FLAKY_RETRY,
                    description="Look a subject up (its service fails once).")
act_flaky = tool(act_flaky_impl, name="act_flaky", effect=True, key=KEY, retry=FLAKY_RETRY,
                 description="Do something (an effect whose service fails once).")
act_lost = tool(act_lost_impl, name="act_lost", effect=True, key=KEY, retry=FLAKY_RETRY,
                description="Do something (an effect whose service's first reply is lost).")
act_gated = tool(act_impl, name="act_gated", effect=True, key=KEY, compensate=act_undo, requires_approval=True,
                 approvers=[DECIDER], description="Do something a human must allow (undone by a rollback).")
#: Far above any DAG's tool failures: a breaker opening would hang on its cooldown (wall clock),
#: which a crash's pause may let run out in one run and not in another.
BREAKER_THRESHOLD = 10_000


def make_agent(step: dict[str, Any], model_url: str) -> Agent:
    model = AnthropicModel(MODEL, base_url=model_url, timeout=STALL_TIMEOUT_S if stalls(step) else 30.0,
                           api_key_env=KEY_ENV)
    tools = (lookup, act, act_undone) + ((broken, act_broken, unreachable) if uses_raising(step) else ())
    tools += (lookup_flaky, act_flaky, act_gated) if uses(step, ENDING) else ()
    tools += (act_lost,) if uses(step, LOST) else ()
    # an agent that ends on its own gets room for it: 2 refused answers and a third (``invalid``),
    # 2 loop calls, the warned one and the one that fails (``loop``); ``max_turns`` uses them all
    # and the looping turns, then the answer, of ``loop_pause``
    extra = 6 if step.get("end") == "loop_pause" else 4 if "end" in step else 2
    loop = LoopPolicy(then="pause") if step.get("end") == "loop_pause" else LoopPolicy()
    return Agent(f"agent_{step['name']}", model, system="You are a chaos-suite agent.", output_type=AgentAnswer,
                 tools=tools, transport_retry=AGENT_TRANSPORT, max_turns=len(step["turns"]) + extra, loop=loop,
                 breaker_threshold=BREAKER_THRESHOLD, speculative_tools=bool(step.get("speculative")))


def stalls(step: dict[str, Any]) -> bool:
    """Whether the server stalls one of ``step``'s turns (a ``stall`` in its ``model_faults``)."""
    return any("stall" in kinds for kinds in (step.get("model_faults") or {}).values())


def uses_raising(step: dict[str, Any]) -> bool:
    """Whether an agent step asks for a tool that raises (only those agents are offered them, so
    the other agents' requests are what they were before these tools existed)."""
    return uses(step, RAISING)


def uses(step: dict[str, Any], tools: tuple[str, ...]) -> bool:
    return any(t in tools for turn in step["turns"] for t in turn)


def tool_at(step: dict[str, Any] | None, label: str) -> str | None:
    """The tool the call ``label`` (``s3@1.0``, ``s3@1.0[2]``) of agent ``step`` asks for, if any."""
    if step is None or step["kind"] != "agent":
        return None
    call = label.partition("[")[0].partition("@")[2]
    turn, dot, k = call.partition(".")
    if not dot or not turn.isdigit() or not k.isdigit() or int(turn) >= len(step["turns"]):
        return None
    calls = step["turns"][int(turn)]
    return calls[int(k)] if int(k) < len(calls) else None


def plan_of(step: dict[str, Any], item: int | None) -> dict[str, Any]:
    """What the scripted model does besides ``turns`` for ``step`` (its item ``item`` in a fan-out):
    ``end`` (``ENDS``; in a fan-out only for the items in ``end_items``) and ``faults`` (turn ->
    the transport faults answered before its answer, ``MODEL_FAULTS``); {} for the first two
    generators' agents (their prompts are as they were) but the marks folder of an agent calling
    ``act_lost`` (``MARKED``)."""
    plan: dict[str, Any] = {}
    if "end" in step and (item is None or "over" not in step or item in step.get("end_items", [])):
        plan["end"] = step["end"]
    if step.get("model_faults"):
        plan["faults"] = step["model_faults"]
    if step.get("marks"):
        plan["marks"] = step["marks"]
    return plan


def verdict(step: dict[str, Any], fan_index: int | None) -> str:
    """What the harness answers ``step``'s approval (its item ``fan_index`` for a fan-out)."""
    if "over" in step:
        return "reject" if fan_index in step.get("reject_items", []) else "approve"
    return str(step.get("verdict", "approve"))


def tool_verdict(step: dict[str, Any], node: str) -> str:
    """What the harness answers the gated tool call ``node`` (``s3@1.0``) of agent ``step``:
    rejected if its ``<turn>.<call>`` is in ``reject_calls`` (every item alike in a fan-out)."""
    return "reject" if node.partition("@")[2] in step.get("reject_calls", []) else "approve"


def deciders(step: dict[str, Any]) -> list[str]:
    """Who may decide an approval step: ``DECIDER``, and ``DECIDER_B`` for a quorum of two."""
    return [DECIDER, DECIDER_B] if int(step.get("quorum", 1)) > 1 else [DECIDER]


def approval_answer(step: dict[str, Any], fan_index: int, by: str) -> int | None:
    """The integer answer ``by`` approves ``step`` (its item ``fan_index``) with, if it takes one."""
    if not step.get("answer"):
        return None
    return int(digest(step["name"], fan_index, by), 16) % 1000


def edited(arguments: dict[str, Any]) -> dict[str, Any]:
    """The arguments a human approves a gated call with instead of the model's (``edit_calls``)."""
    return {**arguments, "subject": f"{arguments['subject']}:edited", "n": int(arguments["n"]) + 1000}


def decide(store: Any, spec: dict[str, Any], run_id: str) -> list[str]:
    """Decide every approval the run waits for as ``spec`` says (``verdict``, ``tool_verdict`` for
    an agent's gated tool call, approved with ``edited`` arguments when in ``edit_calls``; both
    approvers of a quorum of two, one after the other, a rejection by the first alone); return
    their names."""
    steps = {s["name"]: s for s in spec["steps"] if s["kind"] in ("approval", "agent")}
    decided = []
    for waiting in store.waiting_approvals(run_id=run_id):
        step = steps[waiting.node.partition("@")[0]]
        if step["kind"] == "agent":
            answer = tool_verdict(step, waiting.node)
            edit = answer == "approve" and waiting.node.partition("@")[2] in step.get("edit_calls", [])
            store.decide(run_id, waiting.node, answer, by=DECIDER, fan_index=waiting.fan_index,
                         answer=edited(waiting.request.payload["args"]) if edit else None,
                         comment=f"{answer} by the chaos harness")
        else:
            answer = verdict(step, waiting.fan_index)
            for by in deciders(step) if answer == "approve" else [DECIDER]:
                store.decide(run_id, waiting.node, answer, by=by, fan_index=waiting.fan_index,
                             answer=approval_answer(step, waiting.fan_index, by) if answer == "approve" else None,
                             comment=f"{answer} by the chaos harness ({by})")
        decided.append(waiting.node)
    return decided


@cache
def load(path: str) -> Workflow:
    return build(json.loads(Path(path).read_text()))


class _Specs(Mapping[str, Workflow]):
    """``FLOWS[path]``: the workflow of the JSON spec at ``path`` (for ``crash_driver --flow``)."""

    def __getitem__(self, path: str) -> Workflow:
        if not Path(path).is_file():
            raise KeyError(path)
        return load(path)

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0


FLOWS = _Specs()


def save(spec: dict[str, Any], folder: Path, model_url: str | None = None) -> str:
    """Write ``spec`` as JSON into ``folder`` (with the Messages server's URL its agents call, and
    the folder of its flaky tools' marks if any agent calls one); return the path a driver
    process takes as ``--flow``."""
    path = folder / f"{spec['name']}.json"
    extra: dict[str, Any] = {"model_url": model_url}
    if any(s["kind"] == "agent" and uses(s, MARKED) for s in spec["steps"]):
        extra["marks"] = str(folder / "marks")
    path.write_text(json.dumps({**spec, **extra}, indent=1, sort_keys=True))
    return str(path)
