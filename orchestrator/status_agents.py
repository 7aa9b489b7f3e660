"""An agent's model turns and tool calls in ``raysaga status``'s human view: one line, the agent's.

Each turn (``research@2``) and tool call (``research@2.1``) is a node row of its own, so listed
as steps they crowded the table (``plan_it@0`` above ``plan_it``) and, for an agent mapped over
a list, each turn's rows by item read as fan-outs of their own (``fan-out research@0: 2 items``).
An agent node's own row has no start time (the machine starts it, no attempt runs it), so it
sorted after the steps that depend on it. Here the calls are counted on their agent's line and
the agent is placed by its first turn's start; ``--json``, ``--node`` and the dashboard still
show every call.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from raysaga.node_key import NodeKey
from raysaga.state.queries import StepInfo

__all__ = ["AgentCalls", "fold_agent_calls"]


@dataclass
class AgentCalls:
    """One agent step's turns and tool calls, as its rows count them."""

    turns: int = 0
    tool_calls: int = 0
    first_started: float | None = None
    unfinished: dict[str, int] = field(default_factory=dict)
    """Calls not completed, by status (a tool call that failed, a turn in flight)."""

    def note(self, shown: Callable[[str], str] = str) -> str:
        """``3 turns, 2 tool calls (1 running)``; ``shown``: a state as the view shows it (a call
        recorded running in a run nobody drives, or at rest, is ``interrupted``: ``undriven``)."""
        text = f"{self.turns} turn{'s' if self.turns != 1 else ''}"
        if self.tool_calls:
            text += f", {self.tool_calls} tool call{'s' if self.tool_calls != 1 else ''}"
        if self.unfinished:
            states: dict[str, int] = {}
            for status, n in self.unfinished.items():
                states[shown(status)] = states.get(shown(status), 0) + n
            text += " (" + ", ".join(f"{n} {status}" for status, n in sorted(states.items())) + ")"
        return text


def fold_agent_calls(infos: Sequence[StepInfo], order: list[str], *, by_start: bool
                     ) -> tuple[list[str], dict[str, AgentCalls]]:
    """``order`` without the agents' calls, and each agent step's calls. With ``by_start`` (the
    order is the run's own, by first start), an agent step takes its first turn's start."""
    calls: dict[str, AgentCalls] = {}
    for info in infos:
        key = NodeKey.parse(info.node_id)
        if not key.is_agent_call:
            continue
        found = calls.setdefault(key.step, AgentCalls())
        if key.call is None:
            found.turns += info.rows
        else:
            found.tool_calls += info.rows
        for status, n in info.counts.items():
            if status != "completed" and n:
                found.unfinished[status] = found.unfinished.get(status, 0) + n
        if info.first_started is not None and (found.first_started is None
                                               or info.first_started < found.first_started):
            found.first_started = info.first_started
    kept = [name for name in order if not NodeKey.parse(name).is_agent_call]
    if by_start and calls:
        started = {info.node_id: info.first_started for info in infos}
        for step, found in calls.items():
            if started.get(step) is None:
                started[step] = found.first_started
        position = {name: i for i, name in enumerate(kept)}
        kept.sort(key=lambda n: (started.get(n) is None, started.get(n) or 0.0, position[n]))
    return kept, calls
