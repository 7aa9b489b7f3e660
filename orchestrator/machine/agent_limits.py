"""What an agent node's own options and its approvals leave in the run: its ``timeout=`` and
``retry=`` (``@wf.agent``), and what a human's approval of one of its tool calls records.

- ``timeout=``: the agent node's whole wall time, from its first turn (its row's ``started_at``, so
  a resume keeps the same deadline). It is a timer on the node (``deadline_key``, never a row); when
  it fires before the node ends, the node fails as a plain step does once its timeout has passed,
  its calls in flight cancelled and its approvals no longer waiting.
- ``retry=``: the attempts of its model calls on transient errors, in place of the agent's
  ``transport_retry`` (the node itself is never run again from its start: its tools may have
  taken effect). A tool's retries are its own (``tool(retry=)``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from raysaga.node_key import NodeKey
from raysaga.orchestrator.spec import StepSpec
from raysaga.state import NewEvent, NodeRecord, NodeStatus, NodeWrite
from raysaga.state.decisions import REQUEST_KEY, ApprovalRequest

__all__ = ["APPROVED_EVENT", "DEADLINE_TURN", "RAN_KEY", "approved_event", "args_schema", "asked_row", "deadline_key",
           "node_deadline", "timed_out", "with_node_retry"]

#: The event that keeps the arguments a human approved a tool call with (``tool_decided``).
APPROVED_EVENT = "tool_call_approved"
#: In a tool call's result once a human edited its arguments: the call that ran and the tool's content.
RAN_KEY = "ran"
#: The turn of an agent node's deadline timer: no model turn has it (turns count from 0).
DEADLINE_TURN = -1


def deadline_key(node: NodeKey) -> NodeKey:
    """The timer key of ``node``'s ``timeout=``."""
    return node.with_turn(DEADLINE_TURN)


def node_deadline(spec: StepSpec, row: NodeRecord | None, now: float) -> float | None:
    """When the agent node of ``spec`` times out: its first turn's start (``row``, restored, or
    ``now``) plus its ``timeout=``; None without one."""
    if spec.timeout is None:
        return None
    started = row.started_at if row is not None and row.started_at is not None else now
    return started + spec.timeout


def timed_out(node: NodeKey, timeout: float | None) -> dict[str, Any]:
    """The error of an agent node still under way at its deadline."""
    return {"type": "AgentTimeout", "transient": False,
            "message": f"agent node {node.label!r} ran past its timeout of {timeout}s (from its first turn): "
                       "its calls in flight were cancelled; raise @wf.agent(timeout=) or lower the agent's "
                       "max_turns"}


def with_node_retry(model_spec: StepSpec, spec: StepSpec) -> StepSpec:
    """The spec of the node's model calls, retried per its ``retry=`` when it has one."""
    return model_spec if spec.retry is None else dataclasses.replace(model_spec, retry=spec.retry)


def args_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """A tool's input schema as the schema of an approver's edited arguments."""
    return {k: v for k, v in schema.items() if k != "title"}


def asked_row(sub: NodeKey, request: ApprovalRequest, approved: dict[str, Any] | None) -> NodeWrite:
    """The row of a tool call asked of a human (``waiting``, holding the request), and once decided
    the approved arguments: durable with the decision's consumption, a crash keeps them."""
    output: dict[str, Any] = {REQUEST_KEY: request.model_dump(mode="json")}
    if approved is not None:
        output["approved"] = approved
    return NodeWrite(node_id=sub.node_id, fan_index=sub.fan_index, status=NodeStatus.WAITING, attempt=0,
                     output=output, started_at=request.asked_at)


def approved_event(sub: NodeKey, args: dict[str, Any]) -> NewEvent:
    """The arguments a tool call was approved with, kept where no later write of its row reaches: a
    rollback that finds the call's outcome unknown undoes these (``driver_io.approved_args``)."""
    return NewEvent(kind=APPROVED_EVENT, node_id=sub.node_id, fan_index=None if sub.fan_index < 0 else sub.fan_index,
                    data={"args": args})
