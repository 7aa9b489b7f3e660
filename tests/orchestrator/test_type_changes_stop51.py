"""Runs of old code meeting new types (stop 51, a review of deploys).

1. The types digest hashed ``repr`` of each type, which for a pydantic model is its name: a
   required field added to a model changed no digest, no check ran, and a resume under that code
   failed its first reader for good and rolled back the charges that had succeeded.
2. The run's stored input was never checked against a step still to run (a new required field).
3. A fork never checked that what it inherits reads as the new code's types: its first reader
   failed, and its rollback refunded the parent's charges under the parent's keys.

Each is refused now before anything is sent or written. Real inline runs on a real SQLite file.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

import raysaga
from raysaga import Workflow
from raysaga.errors import DefinitionChangedError, ForkError
from raysaga.state import RunStatus, SqlStore

SENT: list[str] = []


class Charge(BaseModel):
    item: str


class ChargeV2(BaseModel):  # a required field added
    item: str
    amount: int


class Order(BaseModel):
    email: str


class OrderV2(BaseModel):
    email: str
    currency: str


def _shop(charge_type: Any, order_type: Any, *, gate: bool) -> Workflow:
    wf = Workflow("shop51")

    def charge(input: Any) -> Any:
        SENT.append("charge")
        return {"item": "a"}

    charge.__annotations__ = {"input": order_type, "return": charge_type}
    wf.step(effect=True)(charge)

    @wf.compensation("charge")
    def refund(output: Any) -> None:
        SENT.append("refund")

    if gate:
        @wf.approval(after=["charge"])
        def ok(input: Any) -> str:
            return "ship?"

    def notify(input: Any, charge: Any) -> str:
        SENT.append("notify")
        return "sent"

    notify.__annotations__ = {"input": order_type, "charge": charge_type, "return": str}
    wf.step(after=["ok"] if gate else [])(notify)
    return wf


@pytest.fixture
def url(tmp_path: Path) -> str:
    SENT.clear()
    return f"sqlite:///{tmp_path / 's.db'}"


def _waiting(url: str) -> None:
    v1 = _shop(Charge, Order, gate=True)
    assert raysaga.run(v1, {"email": "x@y"}, store=url, run_id="r", executor="inline").status == \
        RunStatus.WAITING_HUMAN
    raysaga.Client(url).approve("r", "ok", by="alice")
    assert SENT == ["charge"]


def test_a_model_gaining_a_required_field_is_checked_at_resume(url: str) -> None:
    _waiting(url)
    v2 = _shop(ChargeV2, Order, gate=True)
    misfit = r"step 'notify' cannot read the stored output of step 'charge' \(amount: Field required\)"
    with pytest.raises(DefinitionChangedError, match=misfit + r".*fork it from step 'charge'"):
        raysaga.resume(v2, "r", store=url, executor="inline")
    assert SENT == ["charge"]  # nothing sent, nothing refunded
    store = SqlStore(url)
    try:
        assert store.get_run("r").status == RunStatus.WAITING_HUMAN
    finally:
        store.close()


def test_an_input_a_step_to_run_cannot_read_is_checked_at_resume(url: str) -> None:
    _waiting(url)
    v2 = _shop(Charge, OrderV2, gate=True)
    with pytest.raises(DefinitionChangedError, match=r"step 'notify' cannot read the run's stored input "
                                                     r"\(currency: Field required\)"):
        raysaga.resume(v2, "r", store=url, executor="inline")
    assert SENT == ["charge"]


def test_a_fork_inheriting_what_the_code_cannot_read_is_refused(url: str) -> None:
    v1 = _shop(Charge, Order, gate=False)
    assert raysaga.run(v1, {"email": "x@y"}, store=url, run_id="p", executor="inline").status == RunStatus.COMPLETED
    v2 = _shop(ChargeV2, Order, gate=False)
    with pytest.raises(ForkError, match="the fork would inherit what this code cannot read"):
        raysaga.fork(v2, "p", from_node="notify", store=url, new_run_id="f", executor="inline")
    assert SENT == ["charge", "notify"]  # no refund of the parent's charge
    store = SqlStore(url)
    try:
        assert [r.run_id for r in store.list_runs()] == ["p"]
    finally:
        store.close()


def _parked(name: str, step: str) -> Workflow:
    wf = Workflow("park51")

    def effect(input: int) -> int:
        return input

    effect.__name__ = step
    wf.step(effect=True)(effect)

    def undo(output: int) -> None:
        raise raysaga.Permanent("the refund service is down")

    wf.compensation(step)(undo)

    def finish(**kwargs: int) -> int:
        raise raysaga.Permanent("closed")

    finish.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [inspect.Parameter(step, inspect.Parameter.KEYWORD_ONLY, annotation=int)], return_annotation=int)
    wf.step(name="finish")(finish)
    return wf


def test_a_fork_under_code_that_renamed_the_owing_step_is_refused_with_advice(url: str) -> None:
    """A fork of a run whose rollback is owed, under code that renamed the step, raised a bare
    ``ValueError: 'charge' is not in list`` (a review): refused now, saying which code forks it."""
    parked = raysaga.run(_parked("park51", "charge"), 1, store=url, run_id="c", executor="inline")
    assert parked.status == RunStatus.COMPENSATION_FAILED
    with pytest.raises(ForkError, match="fork with the code the run started with"):
        raysaga.fork(_parked("park51", "pay"), "c", from_node="finish", store=url, new_run_id="f", executor="inline")


def test_a_changed_definitions_refusal_repeats_the_command_refused(url: str) -> None:
    """``cancel --compensate`` under changed code was advised ``raysaga resume RUN --allow-changed``
    (a review): followed, the run went on forward, charging more. Each refusal names its own verb
    and the run."""
    _waiting(url)
    v2 = _shop(Charge, Order, gate=True)  # and a step added

    @v2.step(after=["notify"])
    def audit(notify: str) -> str:
        return notify

    with pytest.raises(DefinitionChangedError, match=r"`raysaga cancel r --compensate --allow-changed`"):
        raysaga.cancel("r", store=url, compensate=True, workflow=v2, executor="inline")
    with pytest.raises(DefinitionChangedError, match=r"`raysaga resume r --allow-changed`"):
        raysaga.resume(v2, "r", store=url, executor="inline")
    assert SENT == ["charge"]
