"""A shop whose agent has an undoable tool and a read-only one, for the fork tests about which
tool an agent's call made (tests/orchestrator/test_fork_refusal_by_tool.py).

``buyer`` (an agent: ``look`` reads, ``pay`` is an effect undone by ``unpay``; its one tool turn
asks for the calls ``asks`` names, then it answers) -> ``charge`` (an effect, undone by
``refund``) -> ``ship``. ``switches`` flips behaviour between runs: ``ship`` fails (a critical
failure: the run rolls back), and with ``refuse`` the refund fails for good, so the rollback
stops there (``compensation_failed``) and never starts the undo of the agent's calls, which wait
on it (upstream). Every call goes to one ``FakeProvider`` (it dedupes by key).
"""

from __future__ import annotations

from typing import Any

from raysaga import Permanent, StepContext, Workflow
from raysaga.agents import Agent, ScriptedModel, text_reply, tool, tool_reply
from raysaga.testing import FakeProvider

PROMPT = "buy a book"


def tool_shop(name: str, provider: FakeProvider, switches: dict[str, bool], asks: tuple[str, ...]) -> Workflow:
    """The shop above; ``switches``: ``{"ship_fails": bool, "refuse": bool}``; ``asks``: the tools
    (``"look"``, ``"pay"``) the agent's first turn calls, in order."""
    def unpay(ctx: StepContext, output: Any, item: str) -> None:
        provider.call("unpay", ctx.idempotency_key, {"item": item, "payment": output})

    @tool(effect=True, compensate=unpay)
    def pay(item: str, idempotency_key: str) -> str:
        """Pay for an item; returns the payment's id."""
        return str(provider.call("pay", idempotency_key, {"item": item})["id"])

    @tool()
    def look(item: str) -> str:
        """Look an item up in the catalogue (reads only)."""
        return f"{item}: in stock"

    model = ScriptedModel({PROMPT: [tool_reply(*((asked, {"item": "book"}) for asked in asks)),
                                    text_reply("bought")]})
    wf = Workflow(name)

    @wf.agent(Agent("buyer", model, tools=(look, pay), max_turns=4))
    def buyer() -> str:
        return PROMPT

    @wf.step(effect=True)
    def charge(ctx: StepContext, buyer: str) -> str:
        return str(provider.call("charge", ctx.idempotency_key, {"for": buyer})["id"])

    @wf.compensation("charge")
    def refund(ctx: StepContext, output: str) -> None:
        if switches["refuse"]:
            raise Permanent("refund refused")
        provider.call("refund", ctx.idempotency_key, {"charge": output})

    @wf.step()
    def ship(charge: str) -> str:
        if switches["ship_fails"]:
            raise Permanent("ship failed")
        return "shipped"

    return wf
