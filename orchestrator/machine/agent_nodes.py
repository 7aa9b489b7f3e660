"""Agent nodes in the run machine: their turn rules' actions made into calls, rows and outcomes.

Each model call and each tool call is a sub-node (``NodeKey.turn``/``.call``) issued, retried and
checkpointed like any node, so a model response is durable before any tool it asks for runs, an
effect tool goes through the ledger, and a resume rebuilds the conversation from the store and
asks the model only about unanswered turns. What depends on the moment (a circuit breaker, a
shared-memory write) is asked of the shell and recorded as the tool call's result before the
model sees it, so a replay sees the same. The rules themselves are ``raysaga.agents.turns``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from raysaga.agents.agent import Agent
from raysaga.agents.tools import ToolError
from raysaga.agents.turns import (
    Answer,
    CallModel,
    Conversation,
    Fail,
    Feedback,
    Finish,
    Pause,
    RunTool,
    UseMemory,
    memory_result,
    model_failure,
    next_actions,
    record_tool_failure,
    tool_of,
)
from raysaga.node_key import NodeKey
from raysaga.orchestrator.keys import effect_key
from raysaga.orchestrator.machine import agent_limits as limits
from raysaga.orchestrator.machine import tool_keys
from raysaga.orchestrator.machine.budgets import Budgets, model_cost, unpriced
from raysaga.orchestrator.machine.calls import Calls, Committed
from raysaga.orchestrator.machine.forward import AgentStart, Forward
from raysaga.orchestrator.machine.outbox import AdmitTool, BuildPrompt, MemoryOp, Outbox
from raysaga.orchestrator.machine.speculating import Speculation
from raysaga.orchestrator.machine.waits import NOT_ASKED, Waits
from raysaga.orchestrator.spec import StepSpec
from raysaga.orchestrator.speculation import Offer, is_peek, speculable, tool_spec
from raysaga.orchestrator.task import NodeCall, NodeOutcome
from raysaga.state import BreakerChange, MemoryEntry, NewEvent, NodeRecord, NodeStatus, NodeWrite, jsoncodec
from raysaga.state.decisions import ApprovalRequest, request_of
from raysaga.types import Approval, StepContext


@dataclass
class _Node:
    key: NodeKey
    agent: Agent
    conv: Conversation
    model_spec: StepSpec
    waiting: set[NodeKey] = field(default_factory=set)  # sub-calls under way (sent, timed, or asked of the shell)
    calls: dict[NodeKey, tuple[StepSpec, dict[str, Any], str | None]] = field(default_factory=dict)
    due: set[NodeKey] = field(default_factory=set)  # retry timers fired
    pending_tools: dict[NodeKey, RunTool] = field(default_factory=dict)  # waiting on their breaker
    pending_memory: dict[NodeKey, UseMemory] = field(default_factory=dict)
    asked: dict[NodeKey, ApprovalRequest] = field(default_factory=dict)  # tool calls asked of a human
    approved: dict[NodeKey, dict[str, Any]] = field(default_factory=dict)  # their approved arguments
    gated: dict[NodeKey, RunTool] = field(default_factory=dict)  # waiting for that decision
    decisions: dict[NodeKey, list[int]] = field(default_factory=dict)  # consumed with the call's outcome
    offers: dict[NodeKey, Offer] = field(default_factory=dict)  # tool calls the last response's call ran
    finished: bool = False
    deadline: float | None = None  # when its timeout= fails it
    ended: dict[str, Any] | None = None  # its step closed while it asked a human: it fails at its next advance


class AgentNodes:
    def __init__(self, run_id: str, trace_id: str, calls: Calls, forward: Forward, budgets: Budgets, out: Outbox,
                 waits: Waits, *, max_output_bytes: int, blob_threshold: int) -> None:
        self.waits = waits
        self.run_id = run_id
        self.trace_id = trace_id
        self.calls = calls
        self.forward = forward
        self.budgets = budgets
        self.out = out
        self.max_output_bytes = max_output_bytes
        self.blob_threshold = blob_threshold
        self.nodes: dict[NodeKey, _Node] = {}
        self.due_nodes: set[NodeKey] = set()
        self.pause_reason: str | None = None
        self._rows: dict[NodeKey, list[tuple[NodeRecord, Any]]] = {}  # restored sub-call rows per node
        self._starting: dict[NodeKey, AgentStart] = {}  # waiting on their prompt
        self._tool_specs: dict[tuple[str, str], StepSpec] = {}
        self._model_specs: dict[str, StepSpec] = {}
        self.speculation = Speculation(calls, out, max_output_bytes)

    # ------------------------------------------------------------------ restore, start

    def restore(self, row: NodeRecord, output: Any) -> None:
        """A stored row of a model turn or tool call (``output``: its value, blobs already read)."""
        sub = NodeKey.parse(row.node_id, row.fan_index)
        self._rows.setdefault(sub.owner, []).append((row, output))

    def start(self, start: AgentStart) -> None:
        """Build the prompt: the decorated function, run by the shell in the driver (cheap and pure)."""
        key = start.key
        self._starting[key] = start
        ctx = StepContext(run_id=self.run_id, node_id=key.node_id, fan_index=key.fan_index, attempt=1,
                          trace_id=self.trace_id)
        call = NodeCall(ctx=ctx, kwargs=self.forward.kwargs(key.step, key.fan_index),
                        max_output_bytes=self.max_output_bytes)
        self.out.queries.append(BuildPrompt(key, start.spec, call))

    def prompt_built(self, key: NodeKey, outcome: NodeOutcome) -> None:
        start = self._starting.pop(key)
        prompt = jsoncodec.loads(outcome.output_json) if outcome.ok and outcome.output_json else None
        if not isinstance(prompt, str):
            error = outcome.error or {"type": "PromptError", "message": f"the prompt builder of {key.step!r} "
                                      f"returned {type(prompt).__name__}, not a str"}
            self.forward.settle_failed(key, {**error, "transient": False}, write=True, attempts=1)
            return
        if not prompt.strip():  # the Messages API refuses an empty user message (400): said here, naming it
            item = f" (item {key.fan_index})" if key.fan_index >= 0 else ""
            self.forward.settle_failed(key, {
                "type": "PromptError", "transient": False,
                "message": f"the prompt builder of agent step {key.step!r}{item} returned an empty "
                           f"{'or whitespace-only ' if prompt else ''}prompt: a model call needs a user message "
                           "with text (the Messages API refuses an empty one)"}, write=True, attempts=1)
            return
        if start.row is None:
            self.out.batch.nodes.append(NodeWrite(node_id=key.node_id, fan_index=key.fan_index,
                                                  status=NodeStatus.RUNNING, attempt=1, started_at=self.out.now))
        agent: Agent = start.spec.options["agent"]
        model_spec = self._model_specs.get(key.step)
        if model_spec is None:  # one per step: its fan-out's nodes share it
            model_spec = self._model_specs[key.step] = limits.with_node_retry(
                self.speculation.model_spec(key.step, agent), start.spec)
        node = self.nodes[key] = _Node(key, agent, Conversation(prompt), model_spec,
                                       deadline=limits.node_deadline(start.spec, start.row, self.out.now))
        if node.deadline is not None:  # its timeout= (``agent_limits``): from its first turn, a resume's too
            self.calls.schedule(node.deadline, limits.deadline_key(key))
        self._replay(node, self._rows.pop(key, []))
        problem = unpriced(agent.model, self.budgets.cost_budget)
        if problem is not None:  # before its first model call: nothing is spent that cannot be counted
            self._fail(node, Fail("ModelUnpriced", f"agent {agent.name!r}: {problem}").error())
            return
        self.due_nodes.add(key)

    def _replay(self, node: _Node, rows: list[tuple[NodeRecord, Any]]) -> None:
        def order(item: tuple[NodeRecord, Any]) -> tuple[int, int]:
            sub = NodeKey.parse(item[0].node_id)
            return sub.turn or 0, -1 if sub.call is None else sub.call

        for row, output in sorted(rows, key=order):
            sub = NodeKey.parse(row.node_id, row.fan_index)
            assert sub.turn is not None
            self.calls.attempts[sub] = row.attempt
            if row.status == NodeStatus.WAITING and sub.call is not None:  # a tool call asked of a human
                # it waits again; its decision, if one was made, is still an unconsumed signal (consumed
                # only with the call's outcome) and is applied again: the row's "approved" is for readers
                request = request_of(row)
                if request is not None:
                    node.asked[sub] = request
            elif row.status == NodeStatus.COMPLETED:
                node.conv.put(sub.turn, sub.call, output)
            elif sub.call is not None and row.status == NodeStatus.FAILED:
                record_tool_failure(node.agent, node.conv, sub.turn, sub.call, row.error.as_dict() if row.error else {})
            elif row.status == NodeStatus.RETRYING and row.not_before and row.not_before > self.out.now:
                self.calls.schedule(row.not_before, sub)  # the backoff survives the crash ...
                # ... and holds the call until it fires. Without this, the node issued the call at
                # once (ignoring the backoff) and the timer then issued it a second time, replacing
                # a committed result; for a model call, re-rolling a turn whose tools had run.
                node.waiting.add(sub)

    # ------------------------------------------------------------------ advancing

    def timer_fired(self, sub: NodeKey) -> None:
        node = self.nodes[sub.owner]
        if sub.turn == limits.DEADLINE_TURN:  # its timeout= passed (the timer goes when it ends: ``_ended``)
            self._fail(node, limits.timed_out(node.key, self.forward.wf.steps[node.key.step].timeout))
            return
        node.due.add(sub)
        self.due_nodes.add(node.key)

    def advance_due(self) -> None:
        while self.due_nodes:
            due, self.due_nodes = self.due_nodes, set()
            for key in sorted(due):
                self._advance(self.nodes[key])

    def _advance(self, node: _Node) -> None:
        if node.finished:
            return
        if node.ended is not None and not node.waiting:  # told "not run", its model asked again and again (paid
            return self._fail(node, node.ended)  # turns, a loop); its calls in flight land first, not cut short
        if node.due:
            for sub in sorted(node.due):
                if sub not in node.calls:  # restored mid-backoff: issued below, like any unanswered
                    node.waiting.discard(sub)  # call of the current turn
                    continue
                spec, kwargs, ekey = node.calls[sub]
                self._issue(node, sub, spec, kwargs, ekey)
            node.due.clear()
        if node.waiting or node.finished:
            return
        for action in next_actions(node.agent, node.conv, waiting=set(), budget_stop=self.budgets.stop()):
            if isinstance(action, CallModel):
                model_kwargs = self.speculation.model_kwargs(node.key, node.agent, action.request)
                if model_kwargs is None:
                    continue  # advanced again once the breakers it may speculate on are read
                node.offers.clear()  # what the last turn's call ran and nobody took: unused
                sub = node.key.with_turn(action.turn)
                self._issue(node, sub, node.model_spec, model_kwargs, None)
                self.speculation.issued_model_call(sub)
            elif isinstance(action, RunTool):
                sub = node.key.with_turn(action.turn, action.call)
                ran = tool_keys.ran_before(self.calls, self.run_id, sub, action.tool,
                                           node.approved.get(sub, action.args))
                if ran is not None:  # answered before a human is asked about it, or its breaker
                    self._answered(node, sub, ran)
                    self.due_nodes.add(node.key)
                    continue
                node.waiting.add(sub)
                if action.tool.requires_approval and sub not in node.approved:
                    self._ask(node, sub, action)
                else:
                    self._admit(node, sub, dataclasses.replace(action, args=node.approved.get(sub, action.args)))
            elif isinstance(action, UseMemory):
                self._use_memory(node, action)
            elif isinstance(action, Answer):
                self._answered(node, node.key.with_turn(action.turn, action.call), action.result)
            elif isinstance(action, Feedback):
                self.out.batch.events.append(NewEvent(kind="agent_feedback", node_id=node.key.step,
                                                      fan_index=node.key.fan_index,
                                                      data={"turn": action.turn, "problem": action.problem}))
            elif isinstance(action, Finish):
                self._finish(node, action.output)
            elif isinstance(action, Fail):
                self._fail(node, action.error())
            elif isinstance(action, Pause):
                node.finished = True  # nothing more from this node before the pause
                agent = f"agent {node.agent.name!r}"  # (which of its step's items, or which step, paused)
                self.pause_reason = self.pause_reason or action.reason.replace(agent, f"{agent} ({node.key.label})", 1)

    def _admit(self, node: _Node, sub: NodeKey, action: RunTool) -> None:
        self.waits.restored_waiting.pop(sub, None)  # an approved call goes on: its row is no longer waiting
        node.pending_tools[sub] = action
        self.out.queries.append(AdmitTool(sub, action.tool.breaker_name, node.agent.breaker_threshold,
                                          node.agent.breaker_cooldown))

    # ------------------------------------------------------------------ tool calls that need a human

    def _ask(self, node: _Node, sub: NodeKey, action: RunTool) -> None:
        """Hold the call until a human decides; its row (``waiting``) holds the request."""
        request = node.asked.get(sub)
        if request is None:
            tool = action.tool
            request = node.asked[sub] = ApprovalRequest(
                prompt=f"agent {node.key.label} asks to call {tool.name}", payload={"tool": tool.name,
                                                                                 "args": action.args},
                approvers=None if tool.approvers is None else list(tool.approvers),
                answer_schema=limits.args_schema(tool.input_model.model_json_schema()), asked_at=self.out.now,
                tool=tool.name)
            self.out.batch.nodes.append(limits.asked_row(sub, request, None))
            self.out.batch.events.append(NewEvent(kind="approval_requested", node_id=sub.node_id,
                                                  fan_index=None if sub.fan_index < 0 else sub.fan_index,
                                                  data={"approvers": request.approvers, "tool": tool.name}))
        node.gated[sub] = action
        self.waits.gate(sub, request, self.tool_decided)

    def tool_decided(self, sub: NodeKey, approval: Approval | None, error: dict[str, Any] | None,
                     signals: list[int]) -> None:
        """A human decided a gated tool call: run it (with the approved, maybe edited, arguments), or
        answer the model that it was rejected, and why. The decision's signals are consumed with
        the call's outcome (a crash before it finds the decision again)."""
        node = self.nodes[sub.owner]
        action = node.gated.pop(sub)
        node.decisions[sub] = signals
        self.due_nodes.add(node.key)
        if approval is None:
            node.waiting.discard(sub)
            reason = (error or {}).get("message") or "rejected"
            closed = (error or {}).get("type") == NOT_ASKED  # its step settled: the call is not run
            self._answered(node, sub, {"content": reason if closed else f"a human did not allow this call ({reason})",
                                       "is_error": True, "rejected": True})
            node.ended = {"type": NOT_ASKED, "transient": False, "message": f"ended: {reason}"} if closed else None
            return
        args = action.args
        if approval.answer is not None:
            try:
                args = action.tool.validate(approval.answer)
            except ToolError as exc:
                node.waiting.discard(sub)
                self._answered(node, sub, {"content": f"the approver's edited arguments do not fit: {exc.message}",
                                           "is_error": True})
                return
        twin = tool_keys.twin_of(node.agent, node.conv, self.calls, self.run_id, sub, action.tool, args,
                                 node.pending_tools, node.calls)
        if twin is not None:  # one effect per key and turn (an edit onto another call's key): the first counts
            node.waiting.discard(sub)
            return self._answered(node, sub, tool_keys.twin_answer(action.tool, twin, args, action.args))
        node.approved[sub] = args
        approved = {"args": args, "approval": approval.model_dump(mode="json")}
        self.out.batch.nodes.append(limits.asked_row(sub, node.asked[sub], approved))
        self.out.batch.events.append(limits.approved_event(sub, args))
        self._admit(node, sub, dataclasses.replace(action, args=args))

    def _issue(self, node: _Node, sub: NodeKey, spec: StepSpec, kwargs: dict[str, Any], ekey: str | None) -> None:
        node.calls[sub] = (spec, kwargs, ekey)
        done = self.calls.issue(sub, spec, kwargs, ekey)
        if isinstance(done, Committed):  # already committed in the ledger: settled without a call
            self.on_success(sub, done.value, replayed=True)
            return
        node.waiting.add(sub)

    def _answered(self, node: _Node, sub: NodeKey, result: dict[str, Any]) -> None:
        """A tool call answered by the engine itself: recorded before the model can see it."""
        assert sub.turn is not None and sub.call is not None
        self.out.batch.consumed_signals.extend(node.decisions.pop(sub, []))
        node.conv.put(sub.turn, sub.call, result)
        self.out.batch.nodes.append(NodeWrite(node_id=sub.node_id, fan_index=sub.fan_index, status=NodeStatus.COMPLETED,
                                              output=result, finished_at=self.out.now))

    # ------------------------------------------------------------------ answers from the shell

    def tool_admitted(self, sub: NodeKey, unavailable: str | None) -> None:
        if is_peek(sub):  # a breaker read for speculation
            self.due_nodes.update(self.speculation.peeked(sub, unavailable))
            return
        node = self.nodes[sub.owner]
        action = node.pending_tools.pop(sub)
        node.waiting.discard(sub)
        self.due_nodes.add(node.key)
        if node.finished:
            return
        if unavailable is not None:  # the call did not run: no loop's repeat (turns._loop_check skips it)
            self.speculation.refused(action.tool.breaker_name)
            node.offers.pop(sub, None)
            self._answered(node, sub, {"content": unavailable, "is_error": True, "unavailable": True})
            return
        tool = action.tool
        spec = self._tool_specs.get((sub.step, tool.name))
        if spec is None:  # one per step and tool: the executor packs each distinct spec once
            spec = self._tool_specs[sub.step, tool.name] = tool_spec(sub.step, tool)
        offer = node.offers.pop(sub, None)
        if self.speculation.matches(offer, tool.name, action.args) and speculable(tool) and sub not in node.approved:
            assert offer is not None
            self._take_offer(node, sub, spec, action.args, offer)
            return
        ran = tool_keys.ran_before(self.calls, self.run_id, sub, tool, action.args)  # (a human's edit onto an
        if ran is not None:  # earlier turn's call)
            self._answered(node, sub, ran)
            return
        self._issue(node, sub, spec, {"args": action.args}, tool_keys.tool_key(self.run_id, sub, tool, action.args))

    def _take_offer(self, node: _Node, sub: NodeKey, spec: StepSpec, args: dict[str, Any], offer: Offer) -> None:
        """The call just decided ran already, speculatively, in its response's model call: its
        outcome (success or failure) is that of the call's attempt, which is not sent. The response
        is durable (its commit came first); the result is, before the next model call goes out."""
        node.calls[sub] = (spec, {"args": args}, None)
        self.speculation.take(sub, spec, offer.outcome)
        if offer.outcome.ok:
            self.on_success(sub, self.calls.succeeded(sub, offer.outcome))
            return
        failed = self.calls.failed(sub, offer.outcome)
        if failed is None:  # retried after a backoff, as a sent attempt would be
            node.waiting.add(sub)
        else:
            self.on_failure(sub, failed[0])

    def _use_memory(self, node: _Node, action: UseMemory) -> None:
        sub = node.key.with_turn(action.turn, action.call)
        node.waiting.add(sub)
        node.pending_memory[sub] = action
        args = action.args
        if action.name == "memory_read":
            self.out.queries.append(MemoryOp(sub, action.name, args["key"]))
        else:
            writer = effect_key(self.run_id, sub.node_id, sub.fan_index, "memory_write", args)
            self.out.queries.append(MemoryOp(sub, action.name, args["key"], args.get("value"),
                                             int(args["expected_version"]), writer))

    def memory_done(self, sub: NodeKey, op: MemoryOp, entry: MemoryEntry) -> None:
        node = self.nodes[sub.owner]
        action = node.pending_memory.pop(sub)
        node.waiting.discard(sub)
        self.due_nodes.add(node.key)
        if node.finished:
            return
        result = memory_result(action.name, action.args, entry.key, entry.value, entry.version,
                               won=entry.writer == op.writer)
        self._answered(node, sub, result)

    # ------------------------------------------------------------------ outcomes

    def on_success(self, sub: NodeKey, value: Any, aside: Any = None, *, replayed: bool = False) -> None:
        """A call's result (recorded by ``Calls``). ``aside``: a model call's offers, the tool calls
        it ran speculatively (``raysaga.orchestrator.speculation``), taken only if decided.
        ``replayed``: read from the ledger, no call made (its breaker learns nothing from it)."""
        node = self.nodes[sub.owner]
        node.waiting.discard(sub)
        self.due_nodes.add(node.key)
        assert sub.turn is not None
        node.conv.put(sub.turn, sub.call, value)
        if sub.call is None:
            node.offers = {sub.with_turn(sub.turn, o.call): o for o in aside or () if isinstance(o, Offer)}
            response = node.conv.turns[sub.turn].response  # validated by put
            assert response is not None
            cost, problem = model_cost(node.agent.model, response.usage)
            self.budgets.charge(response.usage.total, cost, self.out.batch)
            if problem is not None:  # the answer is kept (paid for); the node cannot count its spend
                self._fail(node, Fail("ModelCostFailed", f"agent {node.agent.name!r}: {problem}").error())
            return
        tool = tool_of(node.agent, node.conv, sub.turn, sub.call)
        if tool is not None and not replayed:  # a ledger replay reached no dependency: no success to count
            self._count(node, tool.breaker_name, True)
        self.out.batch.consumed_signals.extend(node.decisions.pop(sub, []))
        edited = node.approved.get(sub)
        if edited is not None and isinstance(value, dict) and isinstance(value.get("content"), str):
            asked = node.asked[sub].payload or {}
            if edited != asked.get("args"):  # the model learns the call it asked for was changed; the
                # row keeps the call that ran and what the tool returned, which its undo is called with
                value = {**value, "content": f"(a human edited this call's arguments to "
                                             f"{jsoncodec.dumps(edited, 'arguments')}) {value['content']}",
                         limits.RAN_KEY: {"args": edited, "content": value["content"]}}
                node.conv.put(sub.turn, sub.call, value)
                self.out.batch.nodes.append(NodeWrite(
                    node_id=sub.node_id, fan_index=sub.fan_index, status=NodeStatus.COMPLETED,
                    attempt=self.calls.attempts.get(sub, 1), output=value, finished_at=self.out.now))

    def on_failure(self, sub: NodeKey, error: dict[str, Any]) -> None:
        node = self.nodes[sub.owner]
        node.waiting.discard(sub)
        self.due_nodes.add(node.key)
        assert sub.turn is not None
        if sub.call is None:
            self._fail(node, model_failure(sub.turn, error).error())
            return
        record_tool_failure(node.agent, node.conv, sub.turn, sub.call, error)
        self.out.batch.consumed_signals.extend(node.decisions.pop(sub, []))
        tool = tool_of(node.agent, node.conv, sub.turn, sub.call)  # only a transient failure counts: a 404
        if tool is not None:  # or a bad input says nothing of its health (None: frees a probe's place)
            self._count(node, tool.breaker_name, False if error.get("transient") is True else None)

    def _count(self, node: _Node, breaker: str, ok: bool | None) -> None:
        """A tool call's outcome on its circuit breaker: counted by the store in this batch's transaction."""
        self.speculation.counted(breaker, ok)
        self.out.batch.breakers.append(BreakerChange(name=breaker, ok=ok, at=self.out.now,
                                                     threshold=node.agent.breaker_threshold,
                                                     cooldown=node.agent.breaker_cooldown))

    def _ended(self, node: _Node) -> None:
        """Nothing of the node goes on: its deadline, its calls asked of a human."""
        node.finished = True
        node.offers.clear()
        if node.deadline is not None:
            self.calls.unschedule(limits.deadline_key(node.key))
        self.waits.drop(list(node.gated), "its agent node ended")
        node.gated.clear()

    def _finish(self, node: _Node, output: Any) -> None:
        self._ended(node)
        key = node.key
        self.forward.outputs[key] = output
        text = jsoncodec.dumps(output, f"answer of agent node {key.label!r}")
        digest = None
        batch = self.out.batch
        if len(text.encode()) > self.blob_threshold:
            digest = jsoncodec.digest(text.encode())
            batch.blobs[digest] = text.encode()
        batch.nodes.append(NodeWrite(node_id=key.node_id, fan_index=key.fan_index, status=NodeStatus.COMPLETED,
                                     attempt=1, output=None if digest else output, output_digest=digest,
                                     finished_at=self.out.now))
        batch.events.append(NewEvent(kind="node_completed", node_id=key.node_id, fan_index=key.fan_index,
                                     data={"agent": True}))
        self.forward.settle_completed(key)

    def _fail(self, node: _Node, error: dict[str, Any]) -> None:
        self._ended(node)  # its calls in flight or in a backoff stop, and their rows say so (not 'running')
        self.calls.stop_owned(node.key, "its agent node failed", node.calls)
        self.forward.settle_failed(node.key, error, write=True, attempts=1)

    def asking(self) -> bool:
        """An agent node under way waits for a human's decision on a tool call: the run is not done
        (never ended with the item 'running' and its call 'waiting' for ever)."""
        return any(node.gated and not node.finished for node in self.nodes.values())

    # ------------------------------------------------------------------ pause

    def model_calls_in_flight(self) -> list[NodeKey]:
        """Model calls under way: before a pause their answers are kept (else a re-roll, billed twice)."""
        return [k for k in self.calls.inflight if k.is_agent_call and k.call is None]
