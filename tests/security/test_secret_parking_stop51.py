"""A step that finds a secret of the run's input missing where it runs (a Ray worker without the
variable; here a new run whose variable is unset, which nothing checks up front) parks the run
``failed`` with its committed effects standing, whatever the step's ``critical``: a rollback ended
it ``compensated``, where the error's advice (export it, then retry) could no longer be followed."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

import raysaga
from raysaga import Secret, Workflow
from raysaga.orchestrator import runner
from raysaga.state import NodeStatus, RunStatus

CALLS: list[str] = []
VAR = "STOP51_PARK_TOKEN"


class Order(BaseModel):
    amount: int
    token: Secret


crit = Workflow("stop51_park", version="1")


@crit.step(effect=True)
def charge(input: Order) -> dict[str, str]:
    CALLS.append("charge")
    return {"charge": "ch_1"}


@crit.compensation("charge")
def refund(output: dict[str, str]) -> None:
    CALLS.append("refund")


@crit.step()
def ship(input: Order, charge: dict[str, str]) -> str:
    try:
        return "shipped with " + input.token.get()
    except Exception as exc:  # a step that wraps what it met: the chain still says a secret was missing
        raise RuntimeError("could not ship") from exc


soft = Workflow("stop51_park_soft", version="1")


@soft.step(effect=True)
def book(input: Order) -> str:
    CALLS.append("book")
    return "booked"


@soft.compensation("book")
def unbook(output: str) -> None:
    CALLS.append("unbook")


@soft.step(critical=False)
def notify(input: Order, book: str) -> str:
    return "told with " + input.token.get()


@pytest.fixture(autouse=True)
def unset(monkeypatch: pytest.MonkeyPatch) -> None:
    CALLS.clear()
    monkeypatch.delenv(VAR, raising=False)


@pytest.mark.parametrize("wf,effect,step", [(crit, "charge", "ship"), (soft, "book", "notify")])
def test_a_missing_secret_parks_the_run_and_a_retry_goes_on(
        sqlite_url: str, monkeypatch: pytest.MonkeyPatch, wf: Workflow, effect: str, step: str) -> None:
    value: Any = {"amount": 5, "token": {"env": VAR}}
    parked = raysaga.run(wf, value, store=sqlite_url, run_id="p51", executor="inline")
    assert parked.status == RunStatus.FAILED, parked.status_reason
    assert [effect] == CALLS  # committed, and not undone
    assert "parked" in (parked.status_reason or "") and VAR in (parked.status_reason or "")
    with runner.using_store(sqlite_url) as st:
        nodes = {n.node_id: n.status for n in st.nodes("p51")}
    assert nodes[effect] == NodeStatus.COMPLETED and nodes[step] == NodeStatus.FAILED
    assert not any(":" in n for n in nodes), nodes
    monkeypatch.setenv(VAR, "ParkTok-51515151")  # the error's advice: export it, then retry
    done = runner.retry(wf, "p51", store=sqlite_url, executor="inline")
    assert done.status == RunStatus.COMPLETED
    assert [effect] == CALLS
