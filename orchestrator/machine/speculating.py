"""The run machine's side of speculative tool calls (``raysaga.orchestrator.speculation``): which
tools a model call may run after its response, and an offered outcome taken as a call's attempt.

Pure like the rest of the machine: a breaker's state is asked of the shell (an ``AdmitTool``
query whose key ``is_peek``: it only reads) and kept for ``BREAKER_FRESH_S``; a success counted
through the breaker says closed; a refusal says open; a failure says "read it again once the
batch counting it is durable" (until then the store's row does not show it).
"""

from __future__ import annotations

import functools
from typing import Any

from raysaga.agents.agent import Agent
from raysaga.agents.runtime import model_turn
from raysaga.node_key import NodeKey
from raysaga.orchestrator.machine.calls import Attempt, Calls, recorded
from raysaga.orchestrator.machine.outbox import AdmitTool, Outbox
from raysaga.orchestrator.spec import StepSpec
from raysaga.orchestrator.speculation import (
    BREAKER_FRESH_S,
    PEEK_STEP,
    Offer,
    Plan,
    model_turn_speculating,
    speculable,
)
from raysaga.orchestrator.task import NodeOutcome
from raysaga.state import NodeStatus, NodeWrite

#: ``StepSpec.options`` key: seconds the model's own client gives a call (``AnthropicModel.timeout``)
#: when the agent sets no ``model_timeout``. The rate gate holds a ``concurrent=`` slot that long
#: (plus slack) for a call whose driver died, not ``UNTIMED_HOLD``: the call cannot outlive it.
CLIENT_TIMEOUT = "client_timeout"


def _client_timeout(agent: Agent) -> dict[str, Any]:
    timeout = getattr(agent.model, "timeout", None)
    if agent.model_timeout is not None or isinstance(timeout, bool) or not isinstance(timeout, int | float) \
            or not 0 < timeout < float("inf"):
        return {}
    return {CLIENT_TIMEOUT: float(timeout)}


class Speculation:
    """One run's speculation state: each agent step's plan, the breakers seen, reads under way."""

    def __init__(self, calls: Calls, out: Outbox, max_output_bytes: int) -> None:
        self.calls = calls
        self.out = out
        self.max_output_bytes = max_output_bytes
        self.plans: dict[str, Plan] = {}  # agent step -> what its model calls may run speculatively
        self._breakers: dict[str, tuple[float, bool]] = {}  # name -> (when seen, closed)
        self._peeks: dict[int, str] = {}  # breaker reads asked of the shell, by the number in their key
        self._asked = 0  # breaker reads asked so far (numbers them)
        self._peeking: dict[str, set[NodeKey]] = {}  # breaker -> agent nodes whose model call waits for it
        self._offer_rows: list[NodeWrite] | None = None  # the batch's rows when an offer was taken into it
        self._failed_in: dict[str, list[NodeWrite]] = {}  # breaker -> the batch's rows when a failure was counted

    def model_spec(self, step: str, agent: Agent) -> StepSpec:
        """The spec of the step's model calls: with a plan when it has tools that may run speculatively."""
        tools = tuple(t for t in agent.tools if speculable(t)) if agent.speculative_tools else ()
        options = _client_timeout(agent)
        if not tools:
            return StepSpec(name=f"{step}@model", fn=functools.partial(model_turn, agent.model), deps=(),
                            param_deps=("request",), input_param=None, ctx_param=None, param_types={"request": Any},
                            output_type=Any, retry=agent.transport_retry, timeout=agent.model_timeout,
                            rate_limit=agent.rate_limit, options=options)
        plan = self.plans[step] = Plan(step, tools, self.max_output_bytes, agent.model_timeout, agent.loop.repeats)
        return StepSpec(name=f"{step}@model", fn=functools.partial(model_turn_speculating, agent.model, plan),
                        deps=(), param_deps=("request",), input_param=None, ctx_param="ctx",
                        param_types={"request": Any, "speculate": Any}, output_type=Any, retry=agent.transport_retry,
                        timeout=agent.model_timeout, rate_limit=agent.rate_limit, options=options)

    def model_kwargs(self, node: NodeKey, agent: Agent, request: dict[str, Any]) -> dict[str, Any] | None:
        """A model call's input: the request, and which tools it may run speculatively: those whose
        breaker is closed (an open breaker keeps calls away from its dependency). None: a breaker's
        state is not known afresh; it is asked of the shell, and ``peeked`` names the node again."""
        plan = self.plans.get(node.step)
        if plan is None:
            return {"request": request}
        now, allowed, unknown = self.out.now, [], set()
        for tool in plan.tools:
            if self._failed_in.get(tool.breaker_name) is self.out.batch.nodes:
                continue  # a failure it counts is not durable yet: the store cannot say if it opened
            when, closed = self._breakers.get(tool.breaker_name, (None, False))
            if when is None or now - when > BREAKER_FRESH_S:
                unknown.add(tool.breaker_name)
            elif closed:
                allowed.append(tool.name)
        if not unknown:
            return {"request": request, "speculate": allowed}
        for name in sorted(unknown):
            waiting = self._peeking.get(name)
            if waiting is None:
                waiting = self._peeking[name] = set()
                self._peeks[self._asked] = name
                self.out.queries.append(AdmitTool(NodeKey(PEEK_STEP, -1, 0, self._asked), name,
                                                  agent.breaker_threshold, agent.breaker_cooldown))
                self._asked += 1
            waiting.add(node)
        return None

    def peeked(self, key: NodeKey, unavailable: str | None) -> set[NodeKey]:
        """A breaker read came back (None: closed); returns the agent nodes to advance again."""
        assert key.call is not None
        name = self._peeks.pop(key.call)
        self._breakers[name] = (self.out.now, unavailable is None)
        return self._peeking.pop(name, set())

    def refused(self, breaker: str) -> None:
        """The breaker refused a call: its tools are not speculated until it is read closed again."""
        self._breakers[breaker] = (self.out.now, False)

    def counted(self, breaker: str, ok: bool | None) -> None:
        if ok is None:  # no verdict: what was read of it still holds
            return
        if ok:  # closed now: it is, after a success
            self._breakers[breaker] = (self.out.now, True)
        else:  # maybe open now: read again, once this batch is durable, before a tool of it is speculated
            self._breakers.pop(breaker, None)
            self._failed_in[breaker] = self.out.batch.nodes

    def matches(self, offer: Offer | None, tool_name: str, args: dict[str, Any]) -> bool:
        """Whether an offer is the very call decided: the same tool, the same validated arguments."""
        return offer is not None and offer.tool == tool_name and offer.args == args

    def take(self, sub: NodeKey, spec: StepSpec, outcome: NodeOutcome) -> None:
        """Make ``outcome`` that of a new attempt of ``sub``, in flight as if sent; the caller then
        hands it to ``Calls.succeeded`` or ``Calls.failed`` as the shell would."""
        attempt = self.calls.attempts.get(sub, 0) + 1
        self.calls.attempts[sub] = attempt
        self.calls.inflight[sub] = Attempt(spec, attempt, outcome.started_at, recorded=False)
        self._offer_rows = self.out.batch.nodes

    def issued_model_call(self, sub: NodeKey) -> None:
        """A model call was issued: if the batch holds a taken offer, the call's 'running' row goes
        into it. The shell makes a batch holding one durable before it sends anything, so the call
        goes out only once the speculated results in the batch (its request is made of) are durable."""
        if self._offer_rows is not self.out.batch.nodes:
            return
        flight = self.calls.inflight.get(sub)
        if flight is not None and not flight.recorded:
            self.calls.inflight[sub] = recorded(flight)
            self.out.batch.nodes.append(NodeWrite(node_id=sub.node_id, fan_index=sub.fan_index,
                                                  status=NodeStatus.RUNNING, attempt=flight.attempt,
                                                  started_at=flight.started_at))
