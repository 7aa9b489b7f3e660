"""A workflow whose agent charges cards through a tool with an undo, for the rollback tests.

Not a test module: ``tests/agents/test_agent_compensation.py`` imports it, and ``crash_driver
--flows tests.support.agent_undo_flows`` drives it in processes the tests kill. Every call of a step, a tool
or an undo appends a JSON line to the run input's ``log`` file (the provider's view, which
survives any process); the provider "dedupes" by idempotency key, so a key's effective calls
are its distinct lines and its raw calls all of them.

Tools get no context, so the log's path travels as a model would pass context on: the prompt
names it and the model (``LogModel``) copies it into each tool call's arguments, outside the
arguments that make the idempotency key.

``reserve`` (an effect step, undone by ``unreserve``) -> agent ``buyer`` (a scripted model: turn
0 charges card c1 and sends an email, turn 1 charges c2 and tries the card "declined", which the
tool refuses, turn 2 answers) -> ``ship``, which fails for good: the run rolls back.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from raysaga import Permanent, StepContext, Workflow
from raysaga.agents import Agent, ModelRequest, ModelResponse, ScriptedModel, ToolError, text_reply, tool, tool_reply
from raysaga.agents.models import first_user_text


def _log(log: str, key: str | None, **entry: Any) -> None:
    with open(log, "a") as fh:
        fh.write(json.dumps({**entry, "key": key}) + "\n")


def refund(ctx: StepContext, output: Any, card: str, amount: int, log: str) -> None:
    _log(log, ctx.idempotency_key, kind="refund", card=card, amount=amount, charge=output)


@tool(effect=True, key=("card", "amount"), compensate=refund)
def charge(card: str, amount: int, log: str, idempotency_key: str | None = None) -> dict[str, Any]:
    """Charge a card."""
    if card == "declined":
        raise ToolError("the card was declined")
    _log(log, idempotency_key, kind="charge", card=card, amount=amount)
    return {"charge_id": f"ch_{card}", "amount": amount}


@tool(effect=True, key=("to",))
def email(to: str, log: str, idempotency_key: str | None = None) -> str:
    """Send an email (nothing to undo)."""
    _log(log, idempotency_key, kind="email", to=to)
    return "sent"


@dataclass(frozen=True)
class LogModel(ScriptedModel):
    """The scripted turns, with the log path the prompt names copied into every tool call."""

    def complete(self, request: ModelRequest) -> ModelResponse:
        response = super().complete(request)
        log = first_user_text(request.messages).split()[0].removeprefix("log=")
        content = [{**b, "input": {**b["input"], "log": log}} if b.get("type") == "tool_use" else b
                   for b in response.content]
        return response.model_copy(update={"content": content})


MODEL = LogModel(default=(
    tool_reply(("charge", {"card": "c1", "amount": 5}), ("email", {"to": "ann@example.com"})),
    tool_reply(("charge", {"card": "c2", "amount": 7}), ("charge", {"card": "declined", "amount": 1})),
    text_reply("bought"),
))
BUYER = Agent(name="buyer", model=MODEL, system="You buy things.", tools=(charge, email))

undo = Workflow("agent-undo")


def unreserve(ctx: StepContext, input: dict[str, str], output: Any) -> None:
    _log(input["log"], ctx.idempotency_key, kind="unreserve", reservation=output)


@undo.step(effect=True, compensate=unreserve)
def reserve(ctx: StepContext, input: dict[str, str]) -> str:
    _log(input["log"], ctx.idempotency_key, kind="reserve")
    return "R-1"


@undo.agent(BUYER)
def buyer(input: dict[str, str], reserve: str) -> str:
    return f"log={input['log']} buy for reservation {reserve}"


@undo.step()
def ship(buyer: str) -> str:
    raise Permanent("nothing left to ship")


FLOWS = {"undo": undo}


def read_log(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    try:
        with open(path) as fh:
            return [json.loads(line) for line in fh if line.strip()]
    except FileNotFoundError:
        return []
