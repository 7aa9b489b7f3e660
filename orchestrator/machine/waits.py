"""Nodes that wait: human approvals and durable sleeps.

An approval node, once ready, has its request built by the shell (the decorated function, in
the driver, like an agent's prompt) and is written ``waiting`` with the request in its row: from
then on any process can decide it (``raysaga.state.decisions`` checks the decision against that
row). Decisions reach the machine as signals; the one that settles the node (one rejection, or a
quorum of approvals) completes it with an ``Approval`` or fails it as ``Rejected``, and the
signals are consumed in the same batch. A timeout is a timer: when it fires, the shell first
reads the decisions recorded so far (one may have arrived since the last heartbeat: the first
valid decision wins), then the declared outcome applies (reject, approve with the default, or
escalate to other approvers for another timeout).

A sleep node is a timer whose time is its row's ``not_before``, written when it starts: a
resume after any crash sleeps until the same time.

While such nodes wait and nothing else can progress, the run rests (``RunMachine.resting``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from raysaga.node_key import NodeKey
from raysaga.orchestrator.machine.calls import Calls
from raysaga.orchestrator.machine.forward import Forward, WaitStart
from raysaga.orchestrator.machine.outbox import BuildPrompt, CheckDecisions, Outbox
from raysaga.orchestrator.spec import StepSpec
from raysaga.orchestrator.task import NodeCall, NodeOutcome
from raysaga.orchestrator.waits_dsl import ApprovalOptions
from raysaga.state import NewEvent, NodeStatus, NodeWrite, SignalRecord, jsoncodec
from raysaga.state.decisions import REQUEST_KEY, ApprovalRequest, Decision, decision_of, request_of, settles
from raysaga.types import Approval, StepContext

#: Node kinds that wait (``StepSpec.kind``).
WAIT_KINDS = frozenset({"approval", "sleep"})

#: Told how a gated approval (an agent's tool call) settled: (key, the approval or None, the
#: rejection's error or None, the decision signals, which the owner consumes once the call it
#: gated has its outcome: until then a crash finds the decision again and nobody is asked twice).
OnDecided = Callable[[NodeKey, Approval | None, dict[str, Any] | None, list[int]], None]


class Waits:
    def __init__(self, run_id: str, trace_id: str, calls: Calls, forward: Forward, out: Outbox) -> None:
        self.run_id = run_id
        self.trace_id = trace_id
        self.calls = calls
        self.forward = forward
        self.out = out
        self.requests: dict[NodeKey, ApprovalRequest] = {}  # approvals waiting for a decision
        self.sleeping: dict[NodeKey, tuple[float, float | None]] = {}  # sleeps: until when, since when
        self.decisions: dict[NodeKey, list[tuple[int, Decision]]] = {}
        self._building: set[NodeKey] = set()
        self._seen: set[int] = set()  # signals already applied
        self._early: list[SignalRecord] = []  # decisions read before their node was restored
        self._gates: dict[NodeKey, OnDecided] = {}  # approvals owned by another part (an agent's tool call)
        #: rows restored ``waiting`` (approvals, sleeps, gated tool calls): a run stopped (a cancel,
        #: a failure) before they wait again in this process still closes them
        self.restored_waiting: dict[NodeKey, float | None] = {}  # restored 'waiting' rows -> their start
        self._stopped: set[NodeKey] = set()  # closed with their step (``stop_steps``): their row says so
        forward.on_closed = self.stop_steps

    # ------------------------------------------------------------------ starting

    def start(self, start: WaitStart) -> None:
        key, spec, row = start.key, start.spec, start.row
        if self._closed(key):  # its fan-out failed in this round (an item decided at once): not waited for
            if row is not None and row.status == NodeStatus.WAITING and key not in self._stopped:
                self.restored_waiting_row(key, row.started_at)
                self.stop_steps({key.step}, "its step failed")
            return
        if spec.kind == "sleep":
            until = row.not_before if row is not None and row.not_before is not None else \
                self.out.now + float(spec.options["seconds"])
            if row is None or row.status != NodeStatus.WAITING:
                self.out.batch.nodes.append(NodeWrite(node_id=key.node_id, fan_index=key.fan_index,
                                                      status=NodeStatus.WAITING, attempt=1, not_before=until,
                                                      started_at=self.out.now))
                self.out.batch.events.append(NewEvent(kind="sleep_started", node_id=key.node_id,
                                                      data={"until": until}))
            self.sleeping[key] = (until, row.started_at if row is not None else self.out.now)
            self.restored_waiting.pop(key, None)
            self.calls.schedule(until, key)
            return
        request = request_of(row) if row is not None and row.status == NodeStatus.WAITING else None
        if request is not None:  # restored: it waits as it did
            self._wait(key, request)
            return
        self._building.add(key)
        ctx = StepContext(run_id=self.run_id, node_id=key.node_id, fan_index=key.fan_index, attempt=1,
                          trace_id=self.trace_id)
        # the run's cap (``RunOptions.max_output_bytes``), as its refusal advises: a fixed 1 MiB
        # refused a 2 MiB payload under a 64 MiB cap, saying to raise the cap
        call = NodeCall(ctx=ctx, kwargs=self.forward.kwargs(key.step, key.fan_index),
                        max_output_bytes=self.calls.max_output_bytes)
        self.out.queries.append(BuildPrompt(key, spec, call))

    def request_built(self, key: NodeKey, spec: StepSpec, outcome: NodeOutcome) -> None:
        """The approval's function ran: write the node waiting with its request."""
        self._building.discard(key)
        if self._closed(key):
            return  # its fan-out failed while its request was built: nobody is asked
        asked = jsoncodec.loads(outcome.output_json) if outcome.ok and outcome.output_json else None
        if isinstance(asked, str):
            asked = {"prompt": asked}
        if not isinstance(asked, dict) or not isinstance(asked.get("prompt"), str):
            error = outcome.error or {"type": "ApprovalError", "message": f"the approval {key.label!r} asked "
                                      f"{type(asked).__name__}: return a str prompt or Ask(prompt, payload)"}
            if isinstance(error.get("message"), str):  # its refusal (above the cap...) says what it refused
                error = {**error, "message": error["message"].replace(f"output of step {key.label!r}", (
                    f"request (the Ask: prompt and payload) of approval {key.label!r}"))}
            self.forward.settle_failed(key, {**error, "transient": False}, write=True, attempts=1)
            return
        options: ApprovalOptions = spec.options["approval"]
        now = self.out.now
        request = ApprovalRequest(
            prompt=asked["prompt"], payload=asked.get("payload"),
            approvers=None if options.approvers is None else list(options.approvers), quorum=options.quorum,
            answer_schema=options.answer_schema, asked_at=now,
            timeout_at=None if options.timeout is None else now + options.timeout, on_timeout=options.on_timeout,
            default=options.default, escalate_to=list(options.escalate_to))
        self._write_waiting(key, request, "approval_requested")
        self._wait(key, request)

    def _write_waiting(self, key: NodeKey, request: ApprovalRequest, event: str) -> None:
        self.out.batch.nodes.append(NodeWrite(
            node_id=key.node_id, fan_index=key.fan_index, status=NodeStatus.WAITING, attempt=1,
            output={REQUEST_KEY: request.model_dump(mode="json")}, started_at=request.asked_at))
        self.out.batch.events.append(NewEvent(kind=event, node_id=key.node_id, fan_index=_fan(key), data={
            "approvers": request.deciders(), "quorum": request.quorum, "timeout_at": request.timeout_at}))

    def gate(self, key: NodeKey, request: ApprovalRequest, on_decided: OnDecided) -> None:
        """Wait for a decision on ``key`` for another part of the machine (an agent's tool call
        that requires approval; its row, written by that part, holds the request)."""
        self._gates[key] = on_decided
        if self._closed(key):  # its step settled before it was asked (an approval item would not wait)
            self._fail(key, not_asked(f"its step {'failed' if key.step in self.forward.sched.closed else 'settled'}"))
            return
        self._wait(key, request)

    def _wait(self, key: NodeKey, request: ApprovalRequest) -> None:
        self.restored_waiting.pop(key, None)
        self.requests[key] = request
        if request.timeout_at is not None:
            self.calls.schedule(request.timeout_at, key)
        early, self._early = self._early, []
        for signal in early:
            self.signal(signal)

    # ------------------------------------------------------------------ decisions

    def signal(self, signal: SignalRecord) -> None:
        """A decision signal (approve, reject) from the store."""
        if signal.id in self._seen:
            return
        decision = decision_of(signal)
        if decision is None:
            return
        key = NodeKey.parse(decision.node, decision.fan_index)
        request = self.requests.get(key)
        if request is None:  # read with the snapshot, before its node is restored: applied when it is
            self._early.append(signal)
            return
        self._seen.add(signal.id)
        self.decisions.setdefault(key, []).append((signal.id, decision))
        verdict = settles(request, [d for _, d in self.decisions[key]])
        if verdict == "approve":
            approvals = [d for _, d in self.decisions[key] if d.verdict == "approve"]
            answers = [d.answer for d in approvals if d.answer is not None]
            comments = [d.comment for d in approvals if d.comment]
            self._complete(key, Approval(by=[d.by for d in approvals], answer=answers[-1] if answers else None,
                                         comment="; ".join(comments) or None, at=approvals[-1].at,
                                         decision_ids=[d.decision_id for d in approvals]))
        elif verdict == "reject":
            rejection = next(d for _, d in self.decisions[key] if d.verdict == "reject")
            reason = f": {rejection.comment}" if rejection.comment else ""
            self._fail(key, {"type": "Rejected", "message": f"rejected by {rejection.by}{reason}",
                             "by": rejection.by, "comment": rejection.comment,
                             "decision_id": rejection.decision_id, "transient": False})

    def decisions_checked(self, key: NodeKey, signals: list[SignalRecord]) -> None:
        """The timeout fired and the shell read the decisions recorded so far: apply them first
        (the first valid decision wins), then, if the node still waits, its declared outcome."""
        for signal in signals:
            self.signal(signal)
        request = self.requests.get(key)
        if request is None:
            return
        if request.on_timeout == "escalate" and not request.escalated:
            assert request.timeout_at is not None
            timeout = request.timeout_at - request.asked_at
            escalated = request.model_copy(update={"escalated": True, "asked_at": self.out.now,
                                                   "timeout_at": self.out.now + timeout})
            self._write_waiting(key, escalated, "approval_escalated")
            self._wait(key, escalated)
            return
        if request.on_timeout == "default":
            self._complete(key, Approval(by=["timeout"], answer=request.default, at=self.out.now, timed_out=True))
            return
        self._fail(key, {"type": "ApprovalTimedOut", "transient": False,
                         "message": f"no decision on {key.label!r} before its timeout: rejected "
                                    f"(on_timeout={request.on_timeout!r})"})

    def timer_fired(self, key: NodeKey) -> None:
        if key in self.sleeping:
            until, started = self.sleeping.pop(key)
            self._settle(key, {"slept_until": until}, started)
        elif key in self.requests:
            self.out.queries.append(CheckDecisions(key))

    # ------------------------------------------------------------------ settling

    def _complete(self, key: NodeKey, approval: Approval) -> None:
        request = self.requests.pop(key, None)
        self.calls.unschedule(key)  # its timeout no longer applies
        gate = self._gates.pop(key, None)
        if gate is not None:
            gate(key, approval, None, [signal_id for signal_id, _ in self.decisions.pop(key, [])])
            return
        self._settle(key, approval.model_dump(mode="json"), None if request is None else request.asked_at)

    def _settle(self, key: NodeKey, value: Any, started_at: float | None = None) -> None:
        self._consume(key)
        self.out.batch.nodes.append(NodeWrite(node_id=key.node_id, fan_index=key.fan_index,
                                              status=NodeStatus.COMPLETED, attempt=1, output=value,
                                              started_at=started_at, finished_at=self.out.now))
        self.out.batch.events.append(NewEvent(kind="node_completed", node_id=key.node_id, fan_index=_fan(key)))
        self.forward.outputs[key] = value
        self.forward.settle_completed(key)

    def _fail(self, key: NodeKey, error: dict[str, Any]) -> None:
        self.requests.pop(key, None)
        self.calls.unschedule(key)
        gate = self._gates.pop(key, None)
        if gate is not None:
            gate(key, None, error, [signal_id for signal_id, _ in self.decisions.pop(key, [])])
            return
        self._consume(key)
        self.forward.settle_failed(key, error, write=True, attempts=1)

    def _consume(self, key: NodeKey) -> None:
        self.out.batch.consumed_signals.extend(signal_id for signal_id, _ in self.decisions.pop(key, []))

    def restored_waiting_row(self, key: NodeKey, started_at: float | None) -> None:
        """A row restored 'waiting': closed if the run stops before it waits again."""
        self.restored_waiting[key] = started_at

    def _since(self, key: NodeKey) -> float | None:
        """When the node began to wait: its cancelled row keeps it (a blank 'started' otherwise)."""
        request = self.requests.get(key)
        if request is not None:
            return request.asked_at
        sleep = self.sleeping.get(key)
        return sleep[1] if sleep is not None else self.restored_waiting.get(key)

    def stop_all(self, reason: str) -> None:
        """The forward DAG stops (failure, cancel): what waits is cancelled with it."""
        for key in sorted({*self.requests, *self.sleeping, *self.restored_waiting}):
            self.out.batch.nodes.append(NodeWrite(node_id=key.node_id, fan_index=key.fan_index,
                                                  status=NodeStatus.CANCELLED, attempt=1, started_at=self._since(key),
                                                  error=self._stopped_error(key, reason), finished_at=self.out.now))
        self.requests.clear()
        self.sleeping.clear()
        self.restored_waiting.clear()
        self._gates.clear()

    def _stopped_error(self, key: NodeKey, reason: str) -> dict[str, Any]:
        """The error of a node that stops waiting. A tool call still waiting for a human was never
        sent, so it took no effect (``took_effect: False``: a rollback leaves it alone, as it does a
        rejected call) unless an attempt of it may have left before: one issued by this driver, or a
        ledger row of it in doubt (a crash after its call, then asked again on resume)."""
        error: dict[str, Any] = {"reason": reason}
        if key.call is not None and self.calls.attempts.get(key, 0) == 0 \
                and (key.node_id, key.fan_index) not in self.calls.in_doubt.took:
            error["took_effect"] = False
        return error

    def stop_steps(self, steps: set[str], reason: str) -> None:
        """Steps failed or skipped without stopping the run: their items' approvals and sleeps no
        longer wait (an approval item of a failed fan-out held the driver, the run otherwise done,
        until its timeout), and their rows say so. An agent item's tool call asked of a human is
        answered not run (``NOT_ASKED``): the item runs on to its end, as agent items do, and the
        run does not end with the call 'waiting' for a decision nobody can make any more."""
        for key in sorted({*self.requests, *self.sleeping, *self.restored_waiting}):
            if key.step not in steps:
                continue
            if key in self._gates:
                self._fail(key, not_asked(reason))
                continue
            self.out.batch.nodes.append(NodeWrite(node_id=key.node_id, fan_index=key.fan_index,
                                                  status=NodeStatus.CANCELLED, attempt=1, started_at=self._since(key),
                                                  error=self._stopped_error(key, reason), finished_at=self.out.now))
            self.requests.pop(key, None)
            self.sleeping.pop(key, None)
            self.restored_waiting.pop(key, None)
            self.calls.unschedule(key)
            self._stopped.add(key)

    def drop(self, keys: list[NodeKey], reason: str) -> None:
        """Gated approvals whose owner ended (an agent node failed or finished): nobody is asked any
        more, and their rows say so (cancelled, the call never run)."""
        for key in keys:
            if self._gates.pop(key, None) is None:
                continue
            since = self._since(key)
            self.requests.pop(key, None)
            self.calls.unschedule(key)
            self._consume(key)
            self.out.batch.nodes.append(NodeWrite(node_id=key.node_id, fan_index=key.fan_index,
                                                  status=NodeStatus.CANCELLED, attempt=1, started_at=since,
                                                  error=self._stopped_error(key, reason), finished_at=self.out.now))

    def _closed(self, key: NodeKey) -> bool:
        """An item of a step settled (failed, skipped, or passed on as failed) before it waits."""
        sched = self.forward.sched
        return key.fan_index >= 0 and (key.step in sched.closed or key.step in sched.completed)

    # ------------------------------------------------------------------ where it stands

    def waiting_humans(self) -> list[NodeKey]:
        return sorted(self.requests)

    def busy(self) -> bool:
        """An approval's request is being built (the shell answers within this activation)."""
        return bool(self._building)


#: The error type of a tool call whose approval was closed with its step (``stop_steps``).
NOT_ASKED = "NotAsked"


def not_asked(reason: str) -> dict[str, Any]:
    """The answer to a tool call asked of a human whose step settled first: never run."""
    return {"type": NOT_ASKED, "transient": False, "took_effect": False,
            "message": f"not run: {reason}, so nobody decides on it any more"}


def _fan(key: NodeKey) -> int | None:
    return None if key.fan_index < 0 else key.fan_index
