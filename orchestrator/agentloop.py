"""An agent node's loop, advanced by the driver: model turn → its tool calls → next turn.

Each model call and each tool call is a sub-node (``<step>@<turn>`` and ``<step>@<turn>.<k>``)
dispatched, retried and checkpointed by the driver like any node, so a model response is
durable before any tool it asks for runs, an effect tool goes through the ledger, and a resume
rebuilds the conversation from the store and asks the model only about unanswered turns.
Decisions that depend on the moment (a breaker's state, a shared-memory write) are recorded
as the tool call's result before the model sees them, so a replay sees the same.
"""

from __future__ import annotations

import functools
import json
from typing import TYPE_CHECKING, Any

from raysaga.agents.agent import (
    MEMORY_TOOLS,
    Agent,
    Turn,
    final_answer_problem,
    final_output,
    fingerprint,
    messages_for,
)
from raysaga.agents.breaker import BreakerPolicy, admit, after_call
from raysaga.agents.messages import ModelRequest, ModelResponse
from raysaga.agents.runtime import INVALID_INPUT, model_turn, tool_call
from raysaga.agents.tools import ToolError
from raysaga.orchestrator.keys import effect_key, is_compensation
from raysaga.orchestrator.spec import StepSpec
from raysaga.orchestrator.task import NodeCall
from raysaga.state import Batch, NewEvent, NodeRecord, NodeStatus, NodeWrite, jsoncodec

if TYPE_CHECKING:
    from raysaga.orchestrator.driver import Driver

NodeKey = tuple[str, int]
SEP = "@"


def is_agent_call(node_id: str) -> bool:
    """A model turn or tool call of an agent (not the compensation of a tool call: the rollback's)."""
    return SEP in node_id and not is_compensation(node_id)


def split_call(node_id: str) -> tuple[str, int, int | None]:
    """``"research@3.1"`` → ``("research", 3, 1)``; ``"research@3"`` → ``("research", 3, None)``."""
    step, _, rest = node_id.partition(SEP)
    turn, _, k = rest.partition(".")
    return step, int(turn), int(k) if k else None


class AgentNode:
    def __init__(self, driver: Driver, key: NodeKey, spec: StepSpec, prompt: str, rows: list[NodeRecord]) -> None:
        self._d = driver
        self.key = key
        self.step, self.index = key
        self.agent: Agent = spec.options["agent"]
        self.prompt = prompt
        self.turns: list[Turn] = []
        self.inflight: set[NodeKey] = set()
        self._due: set[NodeKey] = set()
        self._calls: dict[NodeKey, tuple[StepSpec, dict[str, Any], str | None]] = {}
        self.finished = False
        self._policy = BreakerPolicy(self.agent.breaker_threshold, self.agent.breaker_cooldown)
        self._restore(rows)

    # ------------------------------------------------------------------ restore

    def _restore(self, rows: list[NodeRecord]) -> None:
        def order(row: NodeRecord) -> tuple[int, int]:
            _, turn, k = split_call(row.node_id)
            return turn, -1 if k is None else k

        for row in sorted(rows, key=order):
            _, turn, k = split_call(row.node_id)
            while len(self.turns) <= turn:
                self.turns.append(Turn())
            sub = (row.node_id, row.fan_index)
            self._d.restore_attempts(sub, row.attempt)
            if k is None and row.status == NodeStatus.COMPLETED:
                self.turns[turn].response = ModelResponse.model_validate(self._d.outputs[sub])
            elif k is not None and row.status == NodeStatus.COMPLETED:
                self.turns[turn].results[k] = self._d.outputs[sub]
            elif k is not None and row.status == NodeStatus.FAILED:
                self.turns[turn].results[k] = self._failure_result(turn, k, row.error or {})
            elif row.status == NodeStatus.RETRYING and row.not_before and row.not_before > self._d.clock():
                self._d.restored_timer(row.not_before, sub)  # the backoff survives the crash
                # ... and holds the call until it fires. Without this, advance() issued the call at
                # once (ignoring the backoff) and the timer then issued it a second time, replacing
                # a committed result; for a model call, re-rolling a turn whose tools had run.
                self.inflight.add(sub)

    # ------------------------------------------------------------------ advancing

    def due(self, sub: NodeKey) -> None:
        """A sub-call's retry timer fired: issue it again on the next advance."""
        self._due.add(sub)

    def advance(self, batch: Batch) -> list[tuple[NodeKey, NodeCall]]:
        """What the persisted state calls for next; settles the node when it is done."""
        if self.finished:
            return []
        if self._due:
            reissued: list[tuple[NodeKey, NodeCall]] = []
            for sub in sorted(self._due):
                if sub not in self._calls:  # restored mid-backoff: built and issued below, like any
                    self.inflight.discard(sub)  # unanswered call of the current turn
                    continue
                spec, kwargs, ekey = self._calls[sub]
                call = self._d.make_call(sub, spec, kwargs, ekey, batch)
                if call is not None:
                    reissued.append((sub, call))
            self._due.clear()
            if reissued or self.inflight:
                return reissued
        if self.inflight:
            return []
        if not self.turns:
            self.turns.append(Turn())
        t = len(self.turns) - 1
        turn = self.turns[t]
        if turn.response is None:
            if t >= self.agent.max_turns:
                self._fail(batch, "MaxTurns", f"agent {self.agent.name!r} did not finish within {t} turns")
                return []
            stop = self._d.budget_stop()
            if stop is not None:
                self._over_budget(batch, stop)
                return []
            return self._issue((f"{self.step}{SEP}{t}", self.index), self._model_spec(),
                               {"request": self._request(t)}, None, batch)
        uses = turn.response.tool_uses()
        if not uses:
            return self._final(t, batch)
        calls: list[tuple[NodeKey, NodeCall]] = []
        for k, use in enumerate(uses):
            sub = (f"{self.step}{SEP}{t}.{k}", self.index)
            if k in turn.results or sub in self.inflight:
                continue
            calls += self._tool(t, k, use, batch)
            if self.finished:
                return []
        if calls or self.inflight:
            return calls
        self.turns.append(Turn())  # every tool answered: the next turn
        return self.advance(batch)

    def _issue(self, sub: NodeKey, spec: StepSpec, kwargs: dict[str, Any], ekey: str | None,
               batch: Batch) -> list[tuple[NodeKey, NodeCall]]:
        self._d.specs[sub[0]] = spec
        self._calls[sub] = (spec, kwargs, ekey)
        call = self._d.make_call(sub, spec, kwargs, ekey, batch)
        if call is None:  # already committed in the ledger: settled without a call
            return []
        self.inflight.add(sub)
        return [(sub, call)]

    def _request(self, t: int) -> dict[str, Any]:
        agent = self.agent
        return ModelRequest(model=agent.model.name, system=agent.system, tools=agent.tool_definitions(),
                            messages=messages_for(self.prompt, self.turns[:t], agent.output_type),
                            max_tokens=agent.max_tokens,
                            ).model_dump(mode="json")

    @functools.cached_property
    def _model_spec_cached(self) -> StepSpec:
        return StepSpec(name=f"{self.step}{SEP}model", fn=functools.partial(model_turn, self.agent.model),
                        deps=(), param_deps=("request",), input_param=None, ctx_param=None,
                        param_types={"request": Any}, output_type=Any, retry=self.agent.transport_retry,
                        timeout=self.agent.model_timeout)

    def _model_spec(self) -> StepSpec:
        return self._model_spec_cached

    # ------------------------------------------------------------------ tool calls

    def _tool(self, t: int, k: int, use: dict[str, Any], batch: Batch) -> list[tuple[NodeKey, NodeCall]]:
        sub = (f"{self.step}{SEP}{t}.{k}", self.index)
        name = str(use.get("name", ""))
        args = use.get("input")
        loop = self._loop_check(t, k, name, args)
        if loop == "stop":
            return []
        if loop is not None:
            return self._answer(sub, t, k, {"content": loop, "is_error": True, "loop": True}, batch)
        if isinstance(args, dict) and INVALID_INPUT in args:
            return self._answer(sub, t, k, {"content": f"your input for {name} was not valid JSON: "
                                                       f"{args[INVALID_INPUT]}", "is_error": True}, batch)
        if self.agent.shared_memory and name in MEMORY_TOOLS:
            return self._answer(sub, t, k, self._memory(name, args, sub), batch)
        tool = self.agent.tool(name)
        if tool is None:
            known = [d["name"] for d in self.agent.tool_definitions()]
            return self._answer(sub, t, k, {"content": f"there is no tool named {name!r}; the tools are {known}",
                                            "is_error": True}, batch)
        try:
            valid = tool.validate(args)
        except ToolError as exc:
            return self._answer(sub, t, k, {"content": exc.message, "is_error": True}, batch)
        unavailable = self._breaker_admit(tool.breaker_name)
        if unavailable is not None:
            return self._answer(sub, t, k, {"content": unavailable, "is_error": True, "unavailable": True}, batch)
        spec = StepSpec(name=f"{self.step}{SEP}tool:{tool.name}", fn=functools.partial(tool_call, tool),
                        deps=(), param_deps=("args",), input_param=None, ctx_param="ctx",
                        param_types={"args": Any}, output_type=Any, effect=tool.effect,
                        effect_name=f"tool:{tool.name}", retry=tool.retry, timeout=tool.timeout)
        ekey = None
        if tool.effect:
            ekey = effect_key(self._d.run_id, self.step, self.index, f"tool:{tool.name}", tool.key_args(valid))
            # One call per key at a time. Two calls of one turn with the same key both went out
            # (the second as a "reconcile" of the first's pending row); the second, a replay or a
            # refusal at the provider, then overwrote the first's committed ledger row: a refusal
            # left the ledger saying "failed" for an effect that took place. The twin is answered here.
            if any(self._calls.get(other, (None, None, None))[2] == ekey for other in self.inflight):
                return self._answer(sub, t, k, {
                    "content": f"not run: an earlier {tool.name} call of this turn has the same "
                               f"{'/'.join(tool.key) if tool.key else 'arguments'} and is the one that counts",
                    "is_error": True}, batch)
        return self._issue(sub, spec, {"args": valid}, ekey, batch)

    def _answer(self, sub: NodeKey, t: int, k: int, result: dict[str, Any],
                batch: Batch) -> list[tuple[NodeKey, NodeCall]]:
        """A tool call answered by the driver itself: recorded before the model can see it."""
        self.turns[t].results[k] = result
        batch.nodes.append(NodeWrite(node_id=sub[0], fan_index=sub[1], status=NodeStatus.COMPLETED, output=result,
                                     finished_at=self._d.clock()))
        return []

    def _loop_check(self, t: int, k: int, name: str, args: Any) -> str | None:
        """A warning for the model, "stop" when the node was failed or the run paused, or None."""
        policy = self.agent.loop
        history: list[str] = []
        warned = 0
        for i, turn in enumerate(self.turns[: t + 1]):
            if turn.response is None:
                break
            for j, use in enumerate(turn.response.tool_uses()):
                if (i, j) == (t, k):
                    break
                history.append(fingerprint(str(use.get("name", "")), use.get("input")))
                if (turn.results.get(j) or {}).get("loop"):
                    warned += 1
        current = fingerprint(name, args)
        if history[-policy.window:].count(current) < policy.repeats - 1:
            return None
        message = (f"You are repeating {name} with the same arguments ({policy.repeats} times within your last "
                   f"{policy.window} calls); it will not give a different result. Try something else.")
        if warned == 0:
            return message
        reason = f"loop: agent {self.agent.name!r} keeps calling {name} with the same arguments"
        if policy.then == "pause":
            # The call is answered (durable with the pause) with the warning: unanswered, a resume
            # replayed to the same decision and paused again at once, so an operator had no way on.
            # Resumed, the model sees the warning; one more repeat pauses the run again.
            self._answer((f"{self.step}{SEP}{t}.{k}", self.index), t, k,
                         {"content": message, "is_error": True, "loop": True}, self._d.pending_batch)
            self._d.request_pause(reason)
            # nothing more from this node before the pause: without this, advance() went on to
            # the next turn and called the model with this tool_use left unanswered
            self.finished = True
        else:
            self._fail(self._d.pending_batch, "LoopDetected", reason)
        return "stop"

    def _memory(self, name: str, args: Any, sub: NodeKey) -> dict[str, Any]:
        if not isinstance(args, dict) or not isinstance(args.get("key"), str):
            return {"content": f"{name} needs a string 'key'", "is_error": True}
        store = self._d.store
        if name == "memory_read":
            entry = store.memory_get(self._d.run_id, args["key"])
            return {"content": json.dumps({"key": entry.key, "value": entry.value, "version": entry.version}),
                    "is_error": False}
        expected = args.get("expected_version")
        if not isinstance(expected, int):
            return {"content": "memory_write needs an integer 'expected_version' (0 for a new key)", "is_error": True}
        try:
            value = jsoncodec.to_jsonable(args.get("value"), "value")
        except Exception as exc:
            return {"content": f"memory_write: {exc}", "is_error": True}
        writer = effect_key(self._d.run_id, sub[0], self.index, "memory_write", args)
        entry = self._d.memory_cas(args["key"], value, expected, writer)
        if entry.writer == writer:
            return {"content": json.dumps({"ok": True, "key": entry.key, "version": entry.version}), "is_error": False}
        return {"content": f"conflict: {args['key']!r} is at version {entry.version}, not {expected} — another agent "
                           f"wrote it first. Read it again, merge, and write with expected_version={entry.version}.",
                "is_error": True, "conflict": True}

    def _breaker_admit(self, name: str) -> str | None:
        store, now = self._d.store, self._d.clock()
        for _ in range(5):
            record = store.breaker_get(name)
            allowed, wait, change = admit(record, now, self._policy)
            if not allowed:
                return (f"the tool is unavailable: {name} failed {record.failures} times in a row and its circuit "
                        f"breaker is open; try again in about {max(1, round(wait))} s, or continue without it")
            if change is None or store.breaker_cas(change, record.version):
                return None
        return None

    def _breaker_record(self, name: str, ok: bool) -> None:
        store, now = self._d.store, self._d.clock()
        for _ in range(5):
            record = store.breaker_get(name)
            if ok and record.state == "closed" and record.failures == 0:
                return
            if store.breaker_cas(after_call(record, ok, now, self._policy), record.version):
                return

    # ------------------------------------------------------------------ outcomes

    def on_success(self, sub: NodeKey, value: Any, batch: Batch) -> None:
        self.inflight.discard(sub)
        _, t, k = split_call(sub[0])
        if k is None:
            response = ModelResponse.model_validate(value)
            self.turns[t].response = response
            self._d.charge(response.usage.total, self.agent.model.cost(response.usage), batch)
            return
        self.turns[t].results[k] = value
        tool = self._tool_of(t, k)
        if tool is not None:
            self._breaker_record(tool.breaker_name, True)

    def on_failure(self, sub: NodeKey, error: dict[str, Any], batch: Batch) -> None:
        self.inflight.discard(sub)
        _, t, k = split_call(sub[0])
        if k is None:
            # transient: the model could not be reached and the transport retries are spent;
            # permanent: the API refused the call (400, 401) or its answer could not be used
            kind = "ModelUnavailable" if error.get("transient") else "ModelCallFailed"
            self._fail(batch, kind,
                       f"model call for turn {t} failed: {error.get('type')}: {error.get('message', '')}"[:500])
            return
        self.turns[t].results[k] = self._failure_result(t, k, error)
        tool = self._tool_of(t, k)
        if tool is not None:
            self._breaker_record(tool.breaker_name, False)

    def _tool_of(self, t: int, k: int) -> Any:
        response = self.turns[t].response
        if response is None:
            return None
        uses = response.tool_uses()
        return self.agent.tool(str(uses[k].get("name", ""))) if k < len(uses) else None

    def _failure_result(self, t: int, k: int, error: dict[str, Any]) -> dict[str, Any]:
        tool = self._tool_of(t, k)
        name = tool.name if tool is not None else "the tool"
        detail = error.get("reason") or "it failed"
        return {"content": f"{name} failed ({detail}): {error.get('type')}: {error.get('message', '')}"[:1000],
                "is_error": True}

    def _final(self, t: int, batch: Batch) -> list[tuple[NodeKey, NodeCall]]:
        response = self.turns[t].response
        assert response is not None
        problem = final_answer_problem(response, self.agent.output_type)
        if problem is None:
            self.finished = True
            self._d.agent_finished(self.key, final_output(response, self.agent.output_type), batch)
            return []
        rejected = sum(1 for turn in self.turns if turn.response is not None and not turn.response.tool_uses()
                       and final_answer_problem(turn.response, self.agent.output_type) is not None)
        if rejected > self.agent.max_output_retries:
            self._fail(batch, "InvalidOutput", f"agent {self.agent.name!r} gave no acceptable answer after "
                                               f"{rejected} tries: {problem[:300]}")
            return []
        batch.events.append(NewEvent(kind="agent_feedback", node_id=self.step, fan_index=self.index,
                                     data={"turn": t, "problem": problem[:300]}))
        self.turns.append(Turn())
        return self.advance(batch)

    def _over_budget(self, batch: Batch, reason: str) -> None:
        if self.agent.on_budget == "pause":
            self._d.request_pause(reason)
        else:
            self._fail(batch, "BudgetExceeded", reason)

    def _fail(self, batch: Batch, kind: str, message: str) -> None:
        self.finished = True
        self._d.agent_failed(self.key, {"type": kind, "message": message, "transient": False}, batch)
