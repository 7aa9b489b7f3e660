"""A shop whose agent's undoable tool can be answered with an error, for the tests of which agent
tool calls owe an undo (tests/orchestrator/test_undo_targets_stop49.py).

``buyer`` (an agent: ``look`` reads; ``pay`` is an effect undone by ``unpay``, and raises a
``ToolError`` without calling anyone for the item ``SOLD_OUT``) -> ``charge`` (an effect, undone
by ``refund``) -> ``ship``. Like ``fork_tool_flows``, but it runs on Ray too: every effect goes
through ``call(kind, key, body)`` (a ``FakeProvider``'s ``call`` inline, ``fake_services.post``
bound to a server's URL on Ray), and the switches are files in ``control`` that any process
reads: ``ship_fails`` (a critical failure: the run rolls back) and ``refuse`` (the refund fails
for good, so the rollback stops there, ``compensation_failed``, before the agent's calls, which
wait on it: upstream).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from raysaga import Permanent, StepContext, Workflow
from raysaga.agents import Agent, Model, ScriptedModel, ToolError, text_reply, tool, tool_reply
from tests.support import messages_server as ms

PROMPT = "buy a book"
SOLD_OUT = "sold-out"
#: The switches, as files in the control folder.
SHIP_FAILS, REFUSE = "ship_fails", "refuse"

Call = Callable[[str, str, dict[str, Any]], Any]
Asks = Sequence[tuple[str, dict[str, Any]]]


def scripted(asks: Asks) -> ScriptedModel:
    """A model whose first turn asks for the calls ``asks`` ((tool, input), in order), then answers."""
    return ScriptedModel({PROMPT: [tool_reply(*asks), text_reply("bought")]})


def responder(asks: Asks) -> ms.ScriptedResponder:
    """The same conversation, for the local Messages server (the real SDK's wire)."""
    return ms.ScriptedResponder({PROMPT: [ms.reply([ms.tool_use_block(name, args) for name, args in asks]),
                                          ms.text("bought")]})


def switch(control: Path, *, ship_fails: bool, refuse: bool) -> None:
    """Set the switches the next run reads."""
    for name, on in ((SHIP_FAILS, ship_fails), (REFUSE, refuse)):
        (control / name).unlink(missing_ok=True)
        if on:
            (control / name).write_text("on")


def undo_shop(name: str, model: Model, call: Call, control: Path) -> Workflow:
    """The shop above (see the module's docstring)."""
    folder = str(control)

    def unpay(ctx: StepContext, output: Any, item: str) -> None:
        assert ctx.idempotency_key is not None
        call("unpay", ctx.idempotency_key, {"item": item, "payment": output})

    @tool(effect=True, compensate=unpay)
    def pay(item: str, idempotency_key: str) -> str:
        """Pay for an item; returns the payment's id."""
        if item == SOLD_OUT:
            raise ToolError(f"{item}: nothing to pay for, the item is sold out")
        return str(call("pay", idempotency_key, {"item": item})["id"])

    @tool()
    def look(item: str) -> str:
        """Look an item up in the catalogue (reads only)."""
        return f"{item}: in stock"

    wf = Workflow(name)

    @wf.agent(Agent("buyer", model, tools=(look, pay), max_turns=4))
    def buyer() -> str:
        return PROMPT

    @wf.step(effect=True)
    def charge(ctx: StepContext, buyer: str) -> str:
        assert ctx.idempotency_key is not None
        return str(call("charge", ctx.idempotency_key, {"for": buyer})["id"])

    @wf.compensation("charge")
    def refund(ctx: StepContext, output: str) -> None:
        if Path(folder, REFUSE).exists():
            raise Permanent("refund refused")
        assert ctx.idempotency_key is not None
        call("refund", ctx.idempotency_key, {"charge": output})

    @wf.step()
    def ship(charge: str) -> str:
        if Path(folder, SHIP_FAILS).exists():
            raise Permanent("ship failed")
        return "shipped"

    return wf
