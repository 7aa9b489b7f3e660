"""A shop whose agent's undoable tool can be answered with an error, for the tests of which agent
tool calls owe an undo (tests/orchestrator/test_undo_targets_stop49.py).

``buyer`` (an agent: ``look`` reads; ``pay`` is an effect undone by ``unpay``, and raises a
``ToolError`` without calling anyone for the item ``SOLD_OUT``) -> ``charge`` (an effect, undone
by ``refund``) -> ``ship``. Like ``fork_tool_flows``, but it runs on Ray too: every effect goes
through ``call(kind, key, body)`` (a ``FakeProvider``'s ``call`` inline, ``fake_services.post``
bound to a server's URL on Ray), and the switches are files in ``control`` that any process
reads: ``ship_fails`` (a critical failure: the run rolls back) and ``refuse`` (the refund fails
for good, so the rollback stops there, ``compensation_failed``, before the agent's calls, which
wait on it: upstream); ``lose_answer`` (``pay`` pays, then its answer is lost: a transient
``ConnectionError``, every attempt, until its two attempts are spent: ledger ``abandoned``) and
``unstorable`` (``pay`` pays and returns a value raysaga cannot store: ``took_effect``).

A deploy between runs is another ``undo_shop`` of the same name: ``pay_name`` renames the tool,
``narrowed`` changes its schema (``item`` must be ``"pen"``, and a ``qty`` is required), so the
arguments a call was made with no longer fit (tests/orchestrator/test_fork_agrees_stop49b.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

from raysaga import Permanent, RetryPolicy, StepContext, Workflow
from raysaga.agents import Agent, Model, ScriptedModel, ToolError, text_reply, tool, tool_reply
from tests.support import messages_server as ms

PROMPT = "buy a book"
SOLD_OUT = "sold-out"
#: The switches, as files in the control folder.
SHIP_FAILS, REFUSE, LOSE_ANSWER, UNSTORABLE = "ship_fails", "refuse", "lose_answer", "unstorable"

Call = Callable[[str, str, dict[str, Any]], Any]
Asks = Sequence[tuple[str, dict[str, Any]]]


def scripted(asks: Asks) -> ScriptedModel:
    """A model whose first turn asks for the calls ``asks`` ((tool, input), in order), then answers."""
    return ScriptedModel({PROMPT: [tool_reply(*asks), text_reply("bought")]})


def responder(asks: Asks) -> ms.ScriptedResponder:
    """The same conversation, for the local Messages server (the real SDK's wire)."""
    return ms.ScriptedResponder({PROMPT: [ms.reply([ms.tool_use_block(name, args) for name, args in asks]),
                                          ms.text("bought")]})


class Unstorable:
    """What ``pay`` returns under ``unstorable``: not JSON, so the call fails after its effect."""


def switch(control: Path, *, ship_fails: bool, refuse: bool, lose_answer: bool = False,
           unstorable: bool = False) -> None:
    """Set the switches the next run reads."""
    for name, on in ((SHIP_FAILS, ship_fails), (REFUSE, refuse), (LOSE_ANSWER, lose_answer),
                     (UNSTORABLE, unstorable)):
        (control / name).unlink(missing_ok=True)
        if on:
            (control / name).write_text("on")


def undo_shop(name: str, model: Model, call: Call, control: Path, *, pay_name: str = "pay",
              narrowed: bool = False) -> Workflow:
    """The shop above (see the module's docstring)."""
    folder = str(control)

    def unpay(ctx: StepContext, output: Any, item: str) -> None:
        assert ctx.idempotency_key is not None
        call("unpay", ctx.idempotency_key, {"item": item, "payment": output})

    def paid(item: str, idempotency_key: str) -> Any:
        if item == SOLD_OUT:
            raise ToolError(f"{item}: nothing to pay for, the item is sold out")
        payment = str(call("pay", idempotency_key, {"item": item})["id"])
        if Path(folder, LOSE_ANSWER).exists():
            raise ConnectionError("the answer was lost after the payment")
        return Unstorable() if Path(folder, UNSTORABLE).exists() else payment

    def pay_any(item: str, idempotency_key: str) -> Any:
        """Pay for an item; returns the payment's id."""
        return paid(item, idempotency_key)

    def pay_pen(item: Literal["pen"], qty: int, idempotency_key: str) -> Any:
        """Pay for some pens; returns the payment's id."""
        return paid(item, idempotency_key)

    pay = tool(pay_pen if narrowed else pay_any, name=pay_name, effect=True, compensate=unpay,
               retry=RetryPolicy(max_attempts=2, base=0.01, cap=0.02))

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
