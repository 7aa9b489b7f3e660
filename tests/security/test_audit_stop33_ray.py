"""Stop 33 audit on Ray: a secret only the driver knows, in text a Ray worker cut or an agent said.

A value declared secret in the driver (a ``Secret`` input's, ``register_secret``) is unknown to a
Ray worker: the worker scrubs a failed attempt's message of what it knows and cuts it to 2,000
characters, and the driver cuts the run's reason from it to 500. A secret across either cut left
its first characters in the node's error, the run's error and reason and the event log, where the
store's scrub looks for whole values only. ``scrub_text`` now masks such a piece at a text's end
(or start). An agent's turns and tool results are outputs, which were scrubbed in their task
only; the driver scrubs them too now (``agent_io.scrubbed_turns``).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import raysaga
from raysaga import Permanent, RunStatus, Workflow
from raysaga.agents import Agent, ModelResponse, ScriptedModel, Usage, text_reply, tool
from raysaga.agents.messages import ModelRequest
from raysaga.agents.tools import ToolError
from raysaga.orchestrator import RayExecutor
from raysaga.state import SqlStore
from raysaga.state.redact import register_secret
from tests.support.store_scan import rows_holding

cloudpickle = pytest.importorskip("ray.cloudpickle")

#: Registered in the driver's process only (as a ``Secret`` input's value is): a Ray worker's scrub
#: cannot know it, so what the driver stores must not hold it, whole or cut.
DRIVER_SECRET = "audit33-ray-only-" + "k" * 24


@pytest.fixture(autouse=True)
def _by_value() -> None:
    cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture
def ray_ex(ray_session: str) -> Iterator[RayExecutor]:
    register_secret(DRIVER_SECRET)
    yield RayExecutor(address=ray_session)


def _pieces(secret: str, size: int = 10) -> list[str]:
    return [secret[i:i + size] for i in range(len(secret) - size + 1)]


cut = Workflow("audit_stop33_cut")


@cut.step()
def fails(input: int) -> str:
    raise Permanent("x" * input + DRIVER_SECRET + " (end)")  # (the worker has the value, unregistered)


# 450: the run's reason ("critical step 'fails' failed: " + the message) is cut at 500 by the driver;
# 1990: the message itself at 2,000 by the worker, before the driver (which knows the value) sees it
@pytest.mark.parametrize("pad", [450, 1990], ids=["reason_cut", "message_cut"])
def test_a_failure_cut_across_a_driver_only_secret_leaves_no_piece_of_it(tmp_path: Path, ray_ex: RayExecutor,
                                                                         pad: int) -> None:
    url = f"sqlite:///{tmp_path / 'cut.db'}"
    store = SqlStore(url)
    try:
        record = raysaga.run(cut, pad, store=store, executor=ray_ex)
    finally:
        store.close()
    assert record.status == RunStatus.FAILED
    assert rows_holding(url, _pieces(DRIVER_SECRET)) == ""


@tool
def vendor(account: str) -> str:
    """Look an account up at the vendor."""
    if account == "bad":
        raise ToolError(f"the vendor refused {DRIVER_SECRET}")
    return f"account {account} uses {DRIVER_SECRET}"


def _turn(*blocks: dict[str, Any]) -> ModelResponse:
    return ModelResponse(content=list(blocks), stop_reason="tool_use", usage=Usage(input_tokens=5, output_tokens=5),
                         model="scripted")


def _use(args: dict[str, Any], k: int) -> dict[str, Any]:
    return {"type": "tool_use", "id": f"toolu_{k}", "name": "vendor", "input": args}


def test_what_an_agent_and_its_tools_said_holds_no_driver_only_secret(tmp_path: Path, ray_ex: RayExecutor) -> None:
    script = (_turn(_use({"account": "good"}, 0), _use({"account": "bad"}, 1)),
              text_reply(f"done: {DRIVER_SECRET}"))
    agent = Agent(name="buyer", model=ScriptedModel(default=script), tools=(vendor,), max_turns=4)
    wf = Workflow("audit_stop33_agent")

    @wf.agent(agent)
    def buy(input: str) -> str:
        return input

    url = f"sqlite:///{tmp_path / 'agent.db'}"
    store = SqlStore(url)
    try:
        record = raysaga.run(wf, "buy it", store=store, executor=ray_ex)
    finally:
        store.close()
    assert record.status == RunStatus.COMPLETED, record.status_reason
    assert rows_holding(url, [DRIVER_SECRET]) == ""


@tool
def explode(order: str) -> str:
    """Place an order at the vendor."""
    raise Permanent(f"the vendor is down (tried with {DRIVER_SECRET})")  # not a ToolError: the call fails


@dataclass(frozen=True)
class Witness:
    """A model that calls ``explode``, then answers whether the failure it was told held the secret."""

    name: str = "witness"

    def complete(self, request: ModelRequest) -> ModelResponse:
        if len(request.messages) == 1:
            return _turn({"type": "tool_use", "id": "toolu_0", "name": "explode", "input": {"order": "o-1"}})
        told = json.dumps(request.model_dump(mode="json"))
        return text_reply("told the secret" if DRIVER_SECRET in told else "told a scrubbed failure")

    def cost(self, usage: Usage) -> float:
        return 0.0


def test_a_failed_tool_call_is_told_to_the_model_scrubbed_of_a_driver_only_secret(tmp_path: Path,
                                                                                 ray_ex: RayExecutor) -> None:
    """The driver turns a tool call that failed for good into the model's next message
    (``record_tool_failure``), from the error the worker scrubbed of what it knew: the model was
    told a secret declared in the driver, which a resume (reading the store's row) never tells."""
    wf = Workflow("audit_stop33_witness")

    @wf.agent(Agent(name="orderer", model=Witness(), tools=(explode,), max_turns=3))
    def order(input: str) -> str:
        return input

    url = f"sqlite:///{tmp_path / 'witness.db'}"
    store = SqlStore(url)
    try:
        record = raysaga.run(wf, "order it", store=store, executor=ray_ex)
    finally:
        store.close()
    assert record.status == RunStatus.COMPLETED, record.status_reason
    assert record.output == {"order": "told a scrubbed failure"}
