"""Failed runs an operator's retry would only fail again at once, refused before anything changes
(``runner.check_retryable``, ``runner.retry``, ``runner.reopen``; apart from ``runner``, which is
at its size cap).

An agent node that failed on what its stored turns decide (a loop, its turn limit, no acceptable
answer, a refusal) is decided again from those turns when it is retried: no model call is made, and
it fails the same way at once. ``raysaga.retry`` (``raysaga retry``) judges the stored turns with the
code it loads, so a larger ``max_turns``, another ``LoopPolicy``... goes on; ``Client.retry``, which
loads no code, refuses them by their kind. A fork that asks the model again from an earlier turn
is the other way on."""

from __future__ import annotations

import shlex
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from raysaga.agents.turns import Conversation, Fail, next_actions, record_tool_failure
from raysaga.errors import UserError
from raysaga.node_key import NodeKey
from raysaga.orchestrator.driver_signals import budget_advice, spent_budget
from raysaga.state import NodeStatus

if TYPE_CHECKING:
    from raysaga.orchestrator.options import RunOptions
    from raysaga.orchestrator.workflow import Workflow
    from raysaga.state import RunRecord, Store

#: Agent failures its stored turns decide again, with what of the code decides otherwise
#: (None: nothing does; the refusal stands in the stored turns whatever the definition).
REDECIDED: dict[str, str | None] = {
    "MaxTurns": "a larger Agent(max_turns=...)",
    "LoopDetected": "another Agent(loop=LoopPolicy(...)): a larger repeats or window, or then='pause'",
    "InvalidOutput": "a larger Agent(max_output_retries=...) or another output_type",
    "ModelRefused": None,
}


def check_repeats(run: RunRecord, options: RunOptions | None) -> None:
    """A failed run past its deadline, or one its spent budget failed (``on_budget="fail"``)
    unless ``options`` raise that budget, fails again at once: refused, saying why."""
    now = time.time()
    if run.deadline_at is not None and now >= run.deadline_at:
        from raysaga.orchestrator.status_text import when

        quoted = shlex.quote(run.run_id)
        raise UserError(f"run {run.run_id!r} passed its deadline {when(run.deadline_at, now)}: a retry keeps the "
                        "deadline, so it would fail again at once; `raysaga fork "
                        f"{quoted} --from NODE` starts a new run that keeps what completed and runs NODE and what "
                        "follows afresh, without this deadline (Python: fork(..., options=RunOptions(deadline=S)) "
                        f"gives it one of its own); `raysaga cancel {quoted} --compensate` undoes what it did")
    if run.error is not None and run.error.type == "BudgetExceeded" and spent_budget(run, options) is not None:
        raise UserError(f"run {run.run_id!r} failed on its spent budget ({run.error.message}): a retry with the same "
                        f"budget fails again at once; raise it: {budget_advice(run, 'retry')}")


def check_agent(st: Store, run: RunRecord, workflow: Workflow | None) -> None:
    """Refuse the retry of ``run`` if the agent node that failed it fails again from its stored
    turns: judged with ``workflow``'s agent (None: no code loaded, by the failure's kind)."""
    error = run.error
    cause = error.get("cause") if error is not None and error.type == "FanOutItemFailed" else error
    if error is None or not error.node or not isinstance(cause, Mapping) or cause.get("type") not in REDECIDED:
        return
    node, kind = error.node, str(cause.get("type"))
    step, _, item = node.partition("[")
    index = int(item.rstrip("]")) if item else -1
    if workflow is not None:
        spec = workflow.steps.get(step)
        if spec is None or spec.kind != "agent":
            return
        if not _fails_again(st, run.run_id, spec.options["agent"], step, index):
            return
    elif not _turn_rows(st, run.run_id, step, index):
        return  # no turns stored: a step's own exception of that name (a plain step's InvalidOutput)
    quoted, fix = shlex.quote(run.run_id), REDECIDED[kind]
    turn = shlex.quote(f"{step}@T[{item}" if item else f"{step}@T")
    judged = "with this code" if workflow is not None else "(judged by its kind: Client.retry loads no code)"
    way = (f"; or retry with code that decides otherwise ({fix}; --allow-changed if that changes the workflow's "
           f"definition): `raysaga retry {quoted}` judges the stored turns with the code it loads" if fix is not None
           else " (a refusal stays in the stored turns whatever the code)")
    raise UserError(f"run {run.run_id!r} failed because its agent node {node!r} failed {kind} "
                    f"({cause.get('message')}): its stored turns decide that again {judged}, so a retry would fail "
                    f"at once without asking the model. Ask the model again from an earlier turn T: `raysaga fork "
                    f"{quoted} --from {turn}` (or `--from {shlex.quote(node)}` for its whole conversation){way}")


def _fails_again(st: Store, run_id: str, agent: Any, step: str, index: int) -> bool:
    """Whether the agent node's stored turns, decided as a resume decides them, end in a failure
    before any model or tool call (the prompt does not matter: it only goes into a model call)."""
    rows = _turn_rows(st, run_id, step, index)
    blobs = st.load_blobs({r.output_digest: f"node {r.label}" for _, r in rows if r.output_digest})
    conv = Conversation("")
    for key, row in sorted(rows, key=lambda kr: (kr[0].turn or 0, -1 if kr[0].call is None else kr[0].call)):
        assert key.turn is not None
        if row.status == NodeStatus.COMPLETED:
            conv.put(key.turn, key.call, blobs[row.output_digest] if row.output_digest else row.output)
        elif key.call is not None and row.status == NodeStatus.FAILED:
            record_tool_failure(agent, conv, key.turn, key.call, row.error.as_dict() if row.error else {})
    actions = next_actions(agent, conv, waiting=set(), budget_stop=None)
    return bool(actions) and isinstance(actions[-1], Fail)


def _turn_rows(st: Store, run_id: str, step: str, index: int) -> list[tuple[NodeKey, Any]]:
    """The stored model turns and tool calls of agent node ``step`` (item ``index``; -1: no item)."""
    rows = []
    for row in st.nodes(run_id):
        key = NodeKey.parse(row.node_id, row.fan_index)
        if key.is_agent_call and not key.compensates and (key.step, key.fan_index) == (step, index):
            rows.append((key, row))
    return rows
