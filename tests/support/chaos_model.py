"""The scripted Messages model of the chaos suite's agents (``tests.support.chaos_flows``).

Not a test module. ``reply_for`` answers every agent node's model calls, pure in the request:
the prompt (``chaos_flows.prompt``) names the agent, its item, its scripted tool ``turns`` and
its plan (``chaos_flows.plan_of``: how it ends, the transport faults before some answers, the
flaky tools' marks), which ``parse_plan`` reads back; ``ChaosModel`` adds the planned transport
faults (counted per request from its last reset). ``tests.support.messages_server`` serves it.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from typing import Any

from tests.support import messages_server as ms
from tests.support.chaos_flows import STALL_HOLD_S, agent_label, digest


def parse_prompt(text: str) -> tuple[dict[str, str], list[list[str]]]:
    """``prompt``'s fields and turns back from the conversation's first message."""
    fields, turns, _ = parse_plan(text)
    return fields, turns


def parse_plan(text: str) -> tuple[dict[str, str], list[list[str]], dict[str, Any]]:
    """``prompt``'s fields, turns and plan (``plan_of``) back from the conversation's first message."""
    head, _, rest = text.partition("\nturns=")
    turns, _, plan = rest.partition("\nplan=")
    words = head.split()
    assert words[0] == "agent", text
    fields = dict(w.split("=", 1) for w in words[2:])
    fields["agent"] = words[1]
    return fields, json.loads(turns), json.loads(plan) if plan else {}


def _tool_results(request: dict[str, Any]) -> list[Any]:
    return [block.get("content") for m in request["messages"] if m.get("role") == "user"
            and isinstance(m.get("content"), list) for block in m["content"]
            if isinstance(block, dict) and block.get("type") == "tool_result"]


#: The looping turns of an agent that ends ``loop_pause``: 2 answered, 1 warned, 1 that pauses the run.
LOOP_PAUSE_TURNS = 4


def turn_usage(turn: int) -> tuple[int, int]:
    return (100 + turn, 10 + turn)


def _args(t: str, subject: str, turn: int, fields: Mapping[str, str], plan: Mapping[str, Any]) -> dict[str, Any]:
    args: dict[str, Any] = {"subject": subject, "n": turn}
    if t not in ("lookup", "broken", "unreachable", "lookup_flaky"):
        args["services_url"] = fields["services"]
    if t in ("lookup_flaky", "act_flaky", "act_lost"):
        args["marks"] = plan["marks"]
    return args


def reply_for(request: dict[str, Any]) -> ms.Reply:
    """The scripted model of every agent node: a ``MessagesServer`` responder, pure in the request.

    Turn ``t < len(turns)`` asks for ``turns[t]``'s tool calls (subject ``<seed>/<agent>@<t>.<k>``,
    unique per call); turn ``len(turns)`` answers ``AgentAnswer`` as JSON. An agent whose plan
    (``plan_of``) says how it ends (``ENDS``) does that from turn ``len(turns)`` on instead. The
    transport faults of ``plan["faults"]`` are ``ChaosModel``'s (they need a count of arrivals)."""
    first = ms.conversation_of(request)
    assert first is not None, request
    fields, turns, plan = parse_plan(first)
    turn = ms.turn_of(request)
    name, seed = agent_label(fields), fields["seed"]
    if turn < len(turns):
        blocks = [ms.tool_use_block(t, _args(t, f"{seed}/{name}@{turn}.{k}", turn, fields, plan))
                  for k, t in enumerate(turns[turn])]
        return ms.reply(blocks, usage=turn_usage(turn))
    end = plan.get("end")
    if end == "max_turns":  # never done: one more lookup each turn, until the agent's max_turns
        return ms.reply([ms.tool_use_block("lookup", {"subject": f"{seed}/{name}@{turn}.0", "n": turn})],
                        usage=turn_usage(turn))
    if end == "loop" or (end == "loop_pause" and turn < len(turns) + LOOP_PAUSE_TURNS):
        # the same call each turn: answered twice, then warned, then the node fails (``loop``) or
        # the run pauses (``loop_pause``: its turn answered as a loop; unpaused, the model answers)
        return ms.reply([ms.tool_use_block("lookup", {"subject": f"{seed}/{name}@loop", "n": 0})],
                        usage=turn_usage(turn))
    if end == "loop_pause":
        return _answer(name, fields, request, turn)
    if end == "model_400":
        return ms.fault(400, f"{name}: refused on purpose")
    if end == "model_down":
        return ms.fault(529, f"{name}: overloaded on purpose")
    if end == "invalid" or (end == "fixed" and turn == len(turns)):
        return ms.text(f"{name} has no JSON to give (turn {turn})", usage=turn_usage(turn))
    if turn == len(turns) + (end == "fixed"):
        return _answer(name, fields, request, turn)
    raise LookupError(f"{name} has {len(turns)} tool turns, asked for turn {turn}")


def _answer(name: str, fields: Mapping[str, str], request: dict[str, Any], turn: int) -> ms.Reply:
    """The agent's final answer (``AgentAnswer`` as JSON): its name and a digest of every tool result."""
    answer = {"agent": name, "d": digest(fields["deps"], _tool_results(request))}
    return ms.text(json.dumps(answer), usage=turn_usage(turn))


def transport_fault(kind: str) -> ms.Reply:
    """A transient fault of the Messages API (``MODEL_FAULTS``); a 429 asks for a short wait, a
    stall is held past the client's timeout and closed unanswered (never an answer: the oracle
    counts answers)."""
    if kind == "drop":
        return ms.drop()
    if kind == "stall":
        return ms.timeout(STALL_HOLD_S)
    return ms.fault(int(kind), retry_after=0.05) if kind == "429" else ms.fault(int(kind))


def planned_faults(request: dict[str, Any]) -> list[str]:
    """The transport faults planned before the answer to this request's turn ([] for most)."""
    first = ms.conversation_of(request)
    if first is None or not first.startswith("agent "):
        return []
    _, _, plan = parse_plan(first)
    return list(plan.get("faults", {}).get(str(ms.turn_of(request)), []))


def fails_for_good(request: dict[str, Any]) -> bool:
    """Whether this request's every arrival is answered with an error (``model_400``, ``model_down``)."""
    first = ms.conversation_of(request)
    if first is None or not first.startswith("agent "):
        return False
    _, turns, plan = parse_plan(first)
    return plan.get("end") in ("model_400", "model_down") and ms.turn_of(request) >= len(turns)


class ChaosModel:
    """``reply_for`` with the planned transport faults: the first arrivals of a turn with
    ``plan["faults"]`` get those faults, in order, and later ones its answer. The arrivals are
    counted from the last ``reset`` (the harness resets with the server's log, before each run)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._arrivals: dict[str, int] = {}

    def reset(self) -> None:
        with self._lock:
            self._arrivals.clear()

    def __call__(self, request: dict[str, Any]) -> ms.Reply:
        faults = planned_faults(request)
        if faults:
            key = ms.request_key(request)
            with self._lock:
                arrival = self._arrivals.get(key, 0)
                self._arrivals[key] = arrival + 1
            if arrival < len(faults):
                return transport_fault(faults[arrival])
        return reply_for(request)
