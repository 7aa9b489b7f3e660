"""Speculative tool calls: the non-effect tools a model response asks for, run by the model call's
own attempt as soon as the response is in, and offered to the run machine with it.

Why: a turn cost two round trips through the I/O pool (the model call, then each tool call once
the response was durable), each waiting for a free thread of a busy actor and for the driver's
next round. Most tools an agent calls are cheap reads (search, lookup, fetch); here they start
in the thread that received the answer, and the offer comes back with it.

What keeps the guarantees (docs/agents.md, "Speculative tool calls"):

* only a tool that changes nothing runs this way (``speculable``): not ``effect=True``, not
  ``requires_approval``, no ``rate_limit``; and only if its circuit breaker was closed when the
  model call was issued (read from the store then, ``BREAKER_FRESH_S`` at most before, or a call
  through it counted a success since; a failure or a refusal ends that): the model call's
  ``speculate`` names the tools it may run;
* the result is an offer, not an outcome: the run machine decides every call as it would
  without it (budgets, loops, validation, approvals, breakers), and only a call it would send,
  of the same tool with the same validated arguments, takes the offered outcome as that of its
  attempt instead of sending one (a failure is retried, counted, shown, as a sent one's). That
  happens after the response's own commit, and the result is durable before the next model call
  goes out; a crash discards the offer, and the call runs again like any non-effect call may;
* the response never waits long: the tools get ``Plan.budget`` seconds at most (and never more
  than a quarter of what is left of the model call's own timeout); one that overruns is
  abandoned (its thread ends on its own, its result unused). A tool that itself ran for most of
  the wait is not run speculatively in this process for ``SLOW_PAUSE_S``; one that only started
  late (its thread waited for the GIL of a busy actor) is not paused: that says nothing of it.
"""

from __future__ import annotations

import functools
import threading
import time
from dataclasses import dataclass
from typing import Any

from raysaga.agents.agent import fingerprint
from raysaga.agents.models import Model
from raysaga.agents.runtime import INVALID_INPUT, model_turn, tool_call
from raysaga.agents.tools import Tool, ToolError
from raysaga.agents.turns import CUT_OFF
from raysaga.node_key import NodeKey
from raysaga.orchestrator.context import StepContext
from raysaga.orchestrator.spec import StepSpec
from raysaga.orchestrator.task import Aside, NodeCall, NodeOutcome, execute

#: Seconds a model response waits, at most, for the tools it asked for to finish speculatively.
BUDGET_S = 0.1
#: Seconds a tool that overran the budget is not run speculatively again (in this process).
SLOW_PAUSE_S = 60.0

#: Seconds a breaker read as closed (or a success counted through it) lets its tools run speculatively.
BREAKER_FRESH_S = 1.0
#: The step of the keys of breaker reads (``AdmitTool`` queries that only look: ``is_peek``);
#: no step can have this name, and the key's ``call`` numbers the read.
PEEK_STEP = "$breaker"

_slow_until: dict[str, float] = {}  # tool name -> monotonic time before which it is not speculated


def speculable(tool: Tool) -> bool:
    """Whether calls of ``tool`` may run before the machine decides them: they change nothing
    (at-least-once already) and nothing must admit them first (a human, a fleet-wide limit)."""
    return not tool.effect and not tool.requires_approval and tool.rate_limit is None


def is_peek(key: NodeKey) -> bool:
    """Whether an ``AdmitTool`` query only reads its breaker (for a model call's speculation)
    rather than admitting a call (which may take the half-open breaker's probe)."""
    return key.step == PEEK_STEP


def tool_spec(step: str, tool: Tool) -> StepSpec:
    """The spec of ``tool``'s calls in agent step ``step``: one per step and tool, built by the run
    machine and by a speculating model call alike, so an offered outcome is what a sent call's is."""
    return StepSpec(name=f"{step}@tool:{tool.name}", fn=functools.partial(tool_call, tool), deps=(),
                    param_deps=("args",), input_param=None, ctx_param="ctx", param_types={"args": Any},
                    output_type=Any, effect=tool.effect, effect_name=f"tool:{tool.name}", retry=tool.retry,
                    timeout=tool.timeout, rate_limit=tool.rate_limit)


@dataclass(frozen=True)
class Offer:
    """A tool call of the response, run speculatively: its outcome, success or failure."""

    call: int
    """Its index among the response's tool uses."""
    tool: str
    args: dict[str, Any]
    """Its arguments as ``Tool.validate`` returned them."""
    outcome: NodeOutcome


@dataclass(frozen=True)
class Plan:
    """What a model call may run after it: the agent step's speculable tools, and its limits."""

    step: str
    tools: tuple[Tool, ...]
    max_output_bytes: int
    model_timeout: float | None
    loop_repeats: int
    """The agent's ``LoopPolicy.repeats``: 1 makes every call a loop, so nothing is speculated."""
    budget: float = BUDGET_S


def model_turn_speculating(model: Model, plan: Plan, request: dict[str, Any], speculate: list[str],
                           ctx: StepContext) -> Any:
    """One model call; then, within the budget, the speculable tools it asks for that ``speculate``
    names. Returns the response (the call's output) with the offers aside."""
    began = time.monotonic()
    response = model_turn(model, request)
    wait = plan.budget
    if plan.model_timeout is not None:  # never into the model call's own timeout: a re-roll
        wait = min(wait, (plan.model_timeout - (time.monotonic() - began)) / 4)
    offers = []
    if wait > 0 and speculate and plan.loop_repeats > 1:
        offers = run_offers(plan, request, response, set(speculate), ctx, wait)
    return Aside(response, offers) if offers else response


def run_offers(plan: Plan, request: dict[str, Any], response: dict[str, Any], allowed: set[str],
               ctx: StepContext, wait: float) -> list[Offer]:
    """Run the response's calls of allowed tools, each in a thread; their outcomes within ``wait``.

    A call that repeats an earlier one of the conversation (same tool, same input) is left alone:
    the machine's loop detection may refuse it, and a refused call must not have run; so are the
    calls of a reply cut off (``max_tokens``): the machine runs none of them (``turns.CUT_OFF``)."""
    if response.get("stop_reason") in CUT_OFF:
        return []
    now = time.monotonic()
    by_name = {t.name: t for t in plan.tools if t.name in allowed and _slow_until.get(t.name, 0.0) <= now}
    seen = {fingerprint(str(b.get("name", "")), b.get("input")) for b in _earlier_uses(request)}
    uses = [b for b in response.get("content") or [] if b.get("type") == "tool_use"]
    started: list[tuple[int, Tool, dict[str, Any], _Box, threading.Thread]] = []
    for k, use in enumerate(uses):
        name, raw = str(use.get("name", "")), use.get("input")
        mark = fingerprint(name, raw)
        repeated = mark in seen
        seen.add(mark)
        tool = by_name.get(name)
        if tool is None or repeated or (isinstance(raw, dict) and INVALID_INPUT in raw):
            continue
        try:
            args = tool.validate(use.get("input"))
        except ToolError:
            continue  # the machine answers it itself
        sub = StepContext(run_id=ctx.run_id, node_id=f"{ctx.node_id}.{k}", fan_index=ctx.fan_index, attempt=1,
                          trace_id=ctx.trace_id)
        call = NodeCall(ctx=sub, kwargs={"args": args}, max_output_bytes=plan.max_output_bytes)
        box = _Box()
        thread = threading.Thread(target=box.run, args=(tool_spec(plan.step, tool), call),
                                  name=f"raysaga-speculative-{tool.name}", daemon=True)
        thread.start()
        started.append((k, tool, args, box, thread))
    deadline = now + wait
    offers = []
    for k, tool, args, box, thread in started:
        thread.join(max(0.0, deadline - time.monotonic()))
        if box.outcome is None:  # abandoned: it ends on its own, unused
            if overran(box.began, time.monotonic(), wait):
                _slow_until[tool.name] = time.monotonic() + SLOW_PAUSE_S
            continue
        offers.append(Offer(k, tool.name, args, box.outcome))  # a failure too: it is that attempt's outcome
    return offers


class _Box:
    """One speculative call's thread: when the tool began running, and its outcome once it has one."""

    def __init__(self) -> None:
        self.began: float | None = None
        self.outcome: NodeOutcome | None = None

    def run(self, spec: StepSpec, call: NodeCall) -> None:
        self.began = time.monotonic()
        self.outcome = execute(spec, call)


def overran(began: float | None, now: float, wait: float) -> bool:
    """Whether an unfinished speculative call's tool is slow: it had at least half the ``wait`` to
    itself and did not finish. One whose thread had not started (``began`` None) or started late
    waited for the process, not on the tool; pausing the tool for that would switch speculation
    off whenever an actor is busy."""
    return began is not None and now - began >= wait / 2


def _earlier_uses(request: dict[str, Any]) -> list[dict[str, Any]]:
    """The tool uses of the conversation's earlier turns (its assistant messages)."""
    return [b for m in request.get("messages") or []
            if m.get("role") == "assistant" and isinstance(m.get("content"), list)
            for b in m["content"] if isinstance(b, dict) and b.get("type") == "tool_use"]
