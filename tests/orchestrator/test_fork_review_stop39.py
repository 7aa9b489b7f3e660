"""Review of fork and replay (stop 39): what a fork inherits when the input, the code or the
parent's rollback says an effect may no longer stand, counted at a deduping provider.

The rule (docs/fork.md): a fork inherits what is still valid and re-runs what is not; no effect
stands that was made with an input the run no longer has; every compensation is called with the
input its step saw; never a side effect twice.

- New code that only adds an optional input field, no patch: the fork charged again (the parent's
  input, filled with the default, compared unequal to the stored one). Now only a patch changes the
  input; a parent input the new code refuses is refused with the way out.
- A step that does not read the input but whose compensation does was inherited under a patch:
  the fork's rollback refunded the parent's charge to the patched account.
- A ``compensation_failed`` parent: its failed refunds counted as undone, so a fork charged again
  while the first charges stood. Now a fork that would inherit them is refused, naming
  ``raysaga retry RUN --compensations``; likewise a sibling fork's failed refund.
- An agent that read the input and paid through an effect tool was inherited under a patch.
- A fork inheriting a partial (best-effort) fan-out dropped its failed item: the fork showed 2
  items of 3, and a fork of that fork from the failed item was refused.
- ``--from`` took non-ASCII digits and loose forms; ``replay --until`` took items and turns.
- ``--input-patch null`` was no patch at all; ``fork(options=RunOptions(labels=...))`` dropped them.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

import raysaga
from raysaga import BEST_EFFORT, Permanent, RunOptions, StepContext, Workflow
from raysaga.agents import Agent, ScriptedModel, text_reply, tool, tool_reply
from raysaga.errors import ForkError, InvalidInputError
from raysaga.orchestrator.fork import NO_PATCH, parse_node
from raysaga.state import RunStatus, SqlStore
from raysaga.testing import FakeProvider
from tests.support.cli import invoke, one_line_error, project_folder


def _labels(store_url: str, run_id: str) -> dict[str, tuple[str, str | None]]:
    """Each node of the run: its status and the run that executed it (None: this one)."""
    store = SqlStore(store_url)
    try:
        return {n.label: (n.status.value, n.origin_run_id) for n in store.nodes(run_id)}
    finally:
        store.close()


# ---------------------------------------------------------------------- 1. new code, optional field


class OrderV1(BaseModel):
    order_id: str
    amount: int


class OrderV2(OrderV1):
    coupon: str | None = None


class OrderV3(OrderV1):
    currency: str  # required: the parent's input no longer fits


def _orders(model: type[OrderV1], provider: FakeProvider) -> Workflow:
    wf = Workflow("stop39_order", version=model.__name__)

    def charge(ctx: StepContext, input: OrderV1) -> str:
        return str(provider.call("charge", ctx.idempotency_key, {"amount": input.amount})["id"])

    charge.__annotations__ = {"ctx": StepContext, "input": model, "return": str}  # this version's input type
    wf.step(effect=True)(charge)

    @wf.step()
    def ship(charge: str) -> str:
        return f"shipped on {charge}"

    return wf


def test_new_code_adding_an_optional_input_field_does_not_charge_again(sqlite_url: str) -> None:
    provider = FakeProvider()
    parent = raysaga.run(_orders(OrderV1, provider), {"order_id": "o1", "amount": 5}, store=sqlite_url,
                         run_id="p", executor="inline")
    assert parent.status == RunStatus.COMPLETED
    v2 = _orders(OrderV2, provider)
    assert v2.definition_hash != _orders(OrderV1, provider).definition_hash
    child = raysaga.fork(v2, "p", from_node="ship", store=sqlite_url, new_run_id="c", executor="inline")
    assert child.status == RunStatus.COMPLETED, child.status_reason
    assert len(provider.effects("charge")) == 1  # the charge is inherited: the input did not change
    assert _labels(sqlite_url, "c")["charge"] == ("completed", "p")
    # a patch that changes nothing the new code sees is no change either
    same = raysaga.fork(v2, "p", from_node="ship", input_patch={"coupon": None}, store=sqlite_url,
                        new_run_id="c2", executor="inline")
    assert same.status == RunStatus.COMPLETED and len(provider.effects("charge")) == 1
    # one that does change it re-runs the charge, under the fork's key
    other = raysaga.fork(v2, "p", from_node="ship", input_patch={"coupon": "SAVE5"}, store=sqlite_url,
                         new_run_id="c3", executor="inline")
    assert other.status == RunStatus.COMPLETED and len(provider.effects("charge")) == 2
    assert _labels(sqlite_url, "c3")["charge"] == ("completed", None)


def test_a_parent_input_the_new_code_refuses_needs_a_patch(sqlite_url: str) -> None:
    provider = FakeProvider()
    raysaga.run(_orders(OrderV1, provider), {"order_id": "o1", "amount": 5}, store=sqlite_url, run_id="p",
                executor="inline")
    v3 = _orders(OrderV3, provider)
    with pytest.raises(ForkError, match=r"run 'p''s input does not fit .*--input-patch"):
        raysaga.fork(v3, "p", from_node="ship", store=sqlite_url, new_run_id="c", executor="inline")
    assert len(provider.effects("charge")) == 1
    fixed = raysaga.fork(v3, "p", from_node="ship", input_patch={"currency": "EUR"}, store=sqlite_url,
                         new_run_id="c2", executor="inline")
    assert fixed.status == RunStatus.COMPLETED and fixed.input == {"order_id": "o1", "amount": 5, "currency": "EUR"}
    assert len(provider.effects("charge")) == 2  # made with an input the run has now


# ---------------------------------------------------------------------- 2. an undo that reads the input


def test_an_inherited_charge_is_never_refunded_with_the_patched_input(sqlite_url: str) -> None:
    provider = FakeProvider()
    ship_fails = [False]
    wf = Workflow("stop39_undo_input")

    @wf.step()
    def price(input: dict[str, str]) -> int:
        return 42

    @wf.step(effect=True)
    def charge(ctx: StepContext, price: int) -> str:
        return str(provider.call("charge", ctx.idempotency_key, {"amount": price})["id"])

    @wf.compensation("charge")
    def refund(ctx: StepContext, input: dict[str, str], output: str) -> None:
        provider.call("refund", ctx.idempotency_key, {"charge": output, "account": input["account"]})

    @wf.step()
    def ship(charge: str) -> str:
        if ship_fails[0]:
            raise Permanent("the warehouse is closed")
        return "shipped"

    assert raysaga.run(wf, {"account": "ADA"}, store=sqlite_url, run_id="p", executor="inline").status == \
        RunStatus.COMPLETED
    ship_fails[0] = True
    child = raysaga.fork(wf, "p", from_node="ship", input_patch={"account": "MALLORY"}, store=sqlite_url,
                         new_run_id="c", executor="inline")
    assert child.status == RunStatus.COMPENSATED
    charges, refunds = provider.effects("charge"), provider.effects("refund")
    # the fork charged under its own key and refunded that charge to the account it was made with;
    # the parent's charge (made for ADA) stands, never refunded to MALLORY
    assert len(charges) == 2 and len(refunds) == 1
    assert refunds[0].key == f"{charges[1].key}:compensate" and refunds[0].body["account"] == "MALLORY"
    assert _labels(sqlite_url, "c")["charge"] == ("completed", None)


# ---------------------------------------------------------------------- 3. a rollback that did not finish


def _fan(provider: FakeProvider, fails: dict[str, bool]) -> Workflow:
    wf = Workflow("stop39_fan")

    @wf.step()
    def plan(input: dict[str, int]) -> list[int]:
        return list(range(input["n"]))

    @wf.step(map_over="plan", effect=True)
    def charge(ctx: StepContext, plan: int) -> str:
        return str(provider.call("charge", ctx.idempotency_key, {"item": plan})["id"])

    @wf.compensation("charge")
    def refund(ctx: StepContext, output: str) -> None:
        if fails["refund"]:
            raise Permanent("refund refused")
        provider.call("refund", ctx.idempotency_key, {"charge": output})

    @wf.step()
    def total(charge: list[str]) -> int:
        if fails["total"]:
            raise Permanent("total fails")
        return len(charge)

    return wf


def test_a_compensation_failed_parent_is_not_charged_again_while_its_charges_stand(sqlite_url: str) -> None:
    provider = FakeProvider()
    fails = {"refund": True, "total": True}
    wf = _fan(provider, fails)
    parent = raysaga.run(wf, {"n": 2}, store=sqlite_url, run_id="p", executor="inline")
    assert parent.status == RunStatus.COMPENSATION_FAILED
    fails.update(refund=False, total=False)
    with pytest.raises(ForkError, match=r"charge:compensate\[0\] \(failed\).*`raysaga retry p --compensations`"
                                        r".*fork from 'charge'"):
        raysaga.fork(wf, "p", from_node="total", store=sqlite_url, new_run_id="c", executor="inline")
    with pytest.raises(ForkError, match="retry p --compensations"):  # an item keeps its sibling
        raysaga.fork(wf, "p", from_node="charge[1]", store=sqlite_url, new_run_id="c", executor="inline")
    assert (len(provider.effects("charge")), len(provider.effects("refund"))) == (2, 0)
    # the rollback finished, the charges are refunded: a fork from downstream charges again
    assert raysaga.retry(wf, "p", store=sqlite_url, executor="inline", compensations=True).status == \
        RunStatus.COMPENSATED
    child = raysaga.fork(wf, "p", from_node="total", store=sqlite_url, new_run_id="c", executor="inline")
    assert child.status == RunStatus.COMPLETED, child.status_reason
    assert (len(provider.effects("charge")), len(provider.effects("refund"))) == (4, 2)


def test_forking_from_the_step_whose_refund_failed_runs_it_again_on_purpose(sqlite_url: str) -> None:
    provider = FakeProvider()
    fails = {"refund": True, "total": True}
    wf = _fan(provider, fails)
    assert raysaga.run(wf, {"n": 2}, store=sqlite_url, run_id="p", executor="inline").status == \
        RunStatus.COMPENSATION_FAILED
    fails.update(refund=False, total=False)
    child = raysaga.fork(wf, "p", from_node="charge", store=sqlite_url, new_run_id="c", executor="inline")
    assert child.status == RunStatus.COMPLETED and len(provider.effects("charge")) == 4


def test_a_sibling_forks_failed_refund_of_an_inherited_charge_refuses_the_next_fork(sqlite_url: str) -> None:
    provider = FakeProvider()
    fails = {"refund": False, "total": False}
    wf = _fan(provider, fails)
    assert raysaga.run(wf, {"n": 1}, store=sqlite_url, run_id="p", executor="inline").status == RunStatus.COMPLETED
    fails.update(refund=True, total=True)  # a sibling inherits the charge, fails, and cannot refund it
    sibling = raysaga.fork(wf, "p", from_node="total", store=sqlite_url, new_run_id="s", executor="inline")
    assert sibling.status == RunStatus.COMPENSATION_FAILED
    fails.update(refund=False, total=False)
    with pytest.raises(ForkError, match=r"in run 's'\).*`raysaga retry s --compensations`"):
        raysaga.fork(wf, "p", from_node="total", store=sqlite_url, new_run_id="c", executor="inline")
    assert (len(provider.effects("charge")), len(provider.effects("refund"))) == (1, 0)


# ---------------------------------------------------------------------- 4. an agent with an effect tool


def test_an_agent_that_read_the_input_and_paid_runs_again_under_a_patch(sqlite_url: str) -> None:
    provider = FakeProvider()
    asked: list[str] = []

    @tool(effect=True)
    def pay(item: str, idempotency_key: str) -> str:
        """Pay for an item."""
        return str(provider.call("pay", idempotency_key, {"item": item})["id"])

    class Counting(ScriptedModel):
        def complete(self, request: Any) -> Any:
            asked.append(str(request.messages[0]["content"]))
            return super().complete(request)

    model = Counting(default=(tool_reply(("pay", {"item": "book"})), text_reply("done")))
    wf = Workflow("stop39_agent")

    @wf.agent(Agent(name="buyer", model=model, tools=(pay,), max_turns=4))
    def buyer(input: dict[str, str]) -> str:
        return f"buy a book for {input['customer']}"

    @wf.step()
    def write(buyer: str) -> str:
        return buyer

    assert raysaga.run(wf, {"customer": "ada"}, store=sqlite_url, run_id="p", executor="inline").status == \
        RunStatus.COMPLETED
    assert len(provider.effects("pay")) == 1
    asked.clear()
    child = raysaga.fork(wf, "p", from_node="write", input_patch={"customer": "grace"}, store=sqlite_url,
                         new_run_id="c", executor="inline")
    assert child.status == RunStatus.COMPLETED, child.status_reason
    assert len(provider.effects("pay")) == 2  # paid for grace, under the fork's key
    assert asked and all("grace" in prompt for prompt in asked)
    assert _labels(sqlite_url, "c")["buyer"] == ("completed", None)


# ---------------------------------------------------------------------- 5. a partial fan-out's failed item


def test_a_fork_inheriting_a_partial_fan_out_keeps_its_failed_item(sqlite_url: str) -> None:
    provider = FakeProvider()
    fails = [True]
    wf = Workflow("stop39_partial")

    @wf.step()
    def plan() -> list[int]:
        return [0, 1, 2]

    @wf.step(map_over="plan", effect=True, policy=BEST_EFFORT, critical=False)
    def charge(ctx: StepContext, plan: int) -> int:
        provider.call("charge", ctx.idempotency_key, {"item": plan})
        if plan == 1 and fails[0]:
            raise Permanent("item 1 fails")
        return plan

    @wf.step()
    def total(charge: dict[str, Any]) -> list[int]:  # the fan-out's FanOutResult, as JSON
        return sorted(s["index"] for s in charge["successes"])

    assert raysaga.run(wf, store=sqlite_url, run_id="p", executor="inline").output == {"total": [0, 2]}
    fails[0] = False
    child = raysaga.fork(wf, "p", from_node="total", store=sqlite_url, new_run_id="c", executor="inline")
    assert child.status == RunStatus.COMPLETED and child.output == {"total": [0, 2]}
    nodes = _labels(sqlite_url, "c")
    assert {label: nodes[label] for label in ("charge[0]", "charge[1]", "charge[2]")} == \
        {"charge[0]": ("completed", "p"), "charge[1]": ("failed", "p"), "charge[2]": ("completed", "p")}
    assert len(provider.effects("charge")) == 3
    # a fork of the fork from the failed item runs that item alone again
    again = raysaga.fork(wf, "c", from_node="charge[1]", store=sqlite_url, new_run_id="c2", executor="inline")
    assert again.status == RunStatus.COMPLETED and again.output == {"total": [0, 1, 2]}
    assert len(provider.effects("charge")) == 4
    # a fork from a sibling keeps the failed item as it was (not run again unasked)
    fails[0] = True
    sibling = raysaga.fork(wf, "c", from_node="charge[0]", store=sqlite_url, new_run_id="c3", executor="inline")
    assert sibling.status == RunStatus.COMPLETED and sibling.output == {"total": [0, 2]}
    assert len(provider.effects("charge")) == 5
    assert _labels(sqlite_url, "c3")["charge[1]"] == ("failed", "p")


# ---------------------------------------------------------------------- 6. labels, --until


@pytest.mark.parametrize("label", ["charge[\u0661]", "charge[\U0001d7cf]", "research@ 1[1]", "research@+2[0]",
                                   "research@1.[1]", "research@1_0", "charge[1_0]", "charge[ 1]", "charge[-1]",
                                   "research@1.2.3", "research@\u00b2", "ch arge"])
def test_a_node_label_is_ascii_digits_and_nothing_loose(label: str) -> None:
    with pytest.raises(ForkError, match="is not a node label"):
        parse_node(label)


def test_node_labels_as_status_shows_them() -> None:
    assert parse_node("research@2[1]") == ("research", 1, 2, None, False)
    assert parse_node("research@2.0") == ("research", -1, 2, 0, False)
    assert parse_node("charge:compensate[3]") == ("charge", 3, None, None, True)
    assert parse_node(" writer ") == ("writer", -1, None, None, False)


@pytest.mark.parametrize("until", ["total@5", "plan[2]", " total", "nothing"])
def test_replay_until_takes_a_step_name_only(sqlite_url: str, until: str) -> None:
    wf = _fan(FakeProvider(), {"refund": False, "total": False})
    assert raysaga.run(wf, {"n": 2}, store=sqlite_url, run_id="p", executor="inline").status == RunStatus.COMPLETED
    with pytest.raises(ForkError, match="give a step's name"):
        raysaga.replay(wf, "p", store=sqlite_url, until=until)
    assert [n.label for n in raysaga.replay(wf, "p", store=sqlite_url, until="charge").nodes] == \
        ["plan", "charge[0]", "charge[1]"]


FLOW = '''
from raysaga import Workflow

wf = Workflow("stop39_cli")

@wf.step()
def first(input: dict) -> dict:
    return input

@wf.step()
def second(first: dict) -> str:
    return "done"
'''


def test_cli_input_patch_null_makes_the_input_null_and_until_a_step(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    project_folder(tmp_path, monkeypatch, "stop39_cli_flow", FLOW)
    db = f"sqlite:///{tmp_path / 'raysaga.db'}"
    code, _, err = invoke("run", "stop39_cli_flow:wf", "--input", '{"x": 1}', "--run-id", "p", "--executor",
                          "inline", "--db", db)
    assert code == 0, err
    code, _, err = invoke("fork", "p", "--from", "first", "--input-patch", "null", "--executor", "inline", "--db", db)
    one_line_error(code, err, "dict")  # the input type check judges the null input
    code, _, err = invoke("fork", "p", "--from", "charge[\u0661]", "--executor", "inline", "--db", db)
    one_line_error(code, err, "is not a node label")
    code, _, err = invoke("replay", "p", "--until", "second[0]", "--db", db)
    one_line_error(code, err, "give a step's name")
    store = SqlStore(db)
    try:
        assert [r.run_id for r in store.list_runs()] == ["p"]  # no fork recorded
    finally:
        store.close()


def test_input_patch_none_is_a_null_input_and_no_patch_keeps_it(sqlite_url: str) -> None:
    wf = _fan(FakeProvider(), {"refund": False, "total": False})
    assert raysaga.run(wf, {"n": 1}, store=sqlite_url, run_id="p", executor="inline").status == RunStatus.COMPLETED
    with pytest.raises(InvalidInputError):
        raysaga.fork(wf, "p", from_node="total", input_patch=None, store=sqlite_url, executor="inline")
    kept = raysaga.fork(wf, "p", from_node="total", input_patch=NO_PATCH, store=sqlite_url, executor="inline")
    assert kept.input == {"n": 1}


def test_fork_options_labels_are_the_forks(sqlite_url: str) -> None:
    tag = uuid.uuid4().hex[:8]
    wf = _fan(FakeProvider(), {"refund": False, "total": False})
    raysaga.run(wf, {"n": 1}, store=sqlite_url, run_id="p", executor="inline",
                options=RunOptions(labels={"team": "a", "t": tag}))
    child = raysaga.fork(wf, "p", from_node="total", store=sqlite_url, new_run_id="c", executor="inline",
                         options=RunOptions(labels={"team": "b"}))
    assert child.status == RunStatus.COMPLETED and child.labels == {"team": "b"}
    kept = raysaga.fork(wf, "p", from_node="total", store=sqlite_url, new_run_id="d", executor="inline")
    assert kept.labels == {"team": "a", "t": tag}


def test_a_refund_failed_in_one_sibling_and_done_in_another_is_settled(sqlite_url: str) -> None:
    """Sibling ``s`` inherited the charge and could not refund it; sibling ``s2`` refunded it under
    the same key (the parent's). The charge no longer stands: a fork from ``total`` charges again,
    and ``s``'s failed row no longer refuses it (found by the stop-39 read of this change)."""
    provider = FakeProvider()
    fails = {"refund": False, "total": False}
    wf = _fan(provider, fails)
    assert raysaga.run(wf, {"n": 1}, store=sqlite_url, run_id="p", executor="inline").status == RunStatus.COMPLETED
    for sibling in ("s", "s2"):  # both inherit the charge before either runs
        raysaga.fork(wf, "p", from_node="total", store=sqlite_url, new_run_id=sibling, executor="inline", drive=False)
    fails.update(refund=True, total=True)
    assert raysaga.resume(wf, "s", store=sqlite_url, executor="inline").status == RunStatus.COMPENSATION_FAILED
    fails.update(refund=False)  # the provider answers again; total still fails: s2 rolls back
    assert raysaga.resume(wf, "s2", store=sqlite_url, executor="inline").status == RunStatus.COMPENSATED
    assert (len(provider.effects("charge")), len(provider.effects("refund"))) == (1, 1)
    fails.update(total=False)
    child = raysaga.fork(wf, "p", from_node="total", store=sqlite_url, new_run_id="c", executor="inline")
    assert child.status == RunStatus.COMPLETED
    assert (len(provider.effects("charge")), len(provider.effects("refund"))) == (2, 1)
