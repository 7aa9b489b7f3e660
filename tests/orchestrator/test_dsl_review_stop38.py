"""What an adversarial review of the DSL found accepted at definition and broken at run time
(stop 38), each now refused where it is declared, or handled where it is made:

* a compensation whose shape the rollback cannot call (``**kw``, a partial, positional-only, a
  generator, an annotation that does not resolve): it passed ``validate()`` and stopped the
  rollback half-way, the run stuck ``compensating`` with no way out;
* step shapes that could never run (a generator, a class, positional-only, two contexts);
* a parameter with a default named after a step: a dependency or not by declaration order;
* a compensation's parameter with a default, named after another step: handed None;
* a step's return value never checked against its declared type: stored, then blamed on the
  step reading it, and an effect step's undo failing for good on it;
* ``RetryFailed`` answered for ever: rounds in a loop, the retry budget ignored.

Runs are inline, on a real SQLite file (``tmp_path``).
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

import raysaga
from raysaga import (
    FanOutResult,
    Permanent,
    RetryFailed,
    RunOptions,
    RunStatus,
    StepContext,
    Workflow,
    on_partial_failure,
)
from raysaga.errors import WorkflowDefinitionError
from raysaga.sagas.policy import MAX_FANOUT_ROUNDS
from raysaga.state import EffectStatus, NodeStatus, SqlStore


class Charge(BaseModel):
    amount: int


def _store(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'runs.db'}"


def _with_compensation(undo: Any) -> Workflow:
    wf = Workflow("comp_shapes")

    @wf.step(effect=True, compensate=undo)
    def charge(input: int) -> int:
        return input

    return wf


def undo_kw(**kw: Any) -> None: ...


def undo_posonly(output: Any, /) -> None: ...


def undo_gen(output: Any) -> Iterator[int]:
    yield 1


def undo_unresolved(output: NoSuchType) -> None: ...  # type: ignore[name-defined]  # noqa: F821


class _Undo:
    def __call__(self, output: Any) -> None: ...


@pytest.mark.parametrize(("undo", "says"), [
    (undo_kw, "*args/**kwargs"),
    (undo_posonly, "positional-only"),
    (undo_gen, "generator"),
    (undo_unresolved, "cannot be resolved"),
    (functools.partial(undo_kw, reason="x"), "not a function"),
    (_Undo(), "not a function"),
], ids=["kwargs", "posonly", "generator", "unresolved", "partial", "callable"])
def test_a_compensation_the_rollback_cannot_call_is_a_definition_error(undo: Any, says: str) -> None:
    wf = _with_compensation(undo)
    with pytest.raises(WorkflowDefinitionError) as err:
        wf.validate()
    assert says in str(err.value)
    assert "of step 'charge'" in str(err.value)  # the step whose undo it is, named


def gen_step() -> Iterator[int]:
    yield 1


async def agen_step() -> AsyncIterator[int]:
    yield 1


def posonly_step(input: int, /) -> int:
    return input


def two_contexts(ctx: StepContext, other: StepContext) -> int:
    return 1


class NotAFunction:
    def __init__(self) -> None: ...


@pytest.mark.parametrize(("fn", "says"), [
    (gen_step, "generator"), (agen_step, "generator"), (posonly_step, "positional-only"),
    (two_contexts, "context twice"), (NotAFunction, "is the class"),
], ids=["generator", "async-generator", "posonly", "two-contexts", "class"])
def test_a_step_that_could_never_run_is_a_definition_error(fn: Any, says: str) -> None:
    wf = Workflow("shapes")
    with pytest.raises(WorkflowDefinitionError) as err:
        wf.step(name="s")(fn)
    assert says in str(err.value) and "step 's'" in str(err.value)


def _defaults(a_first: bool) -> Workflow:
    wf = Workflow("defaults")

    def a() -> int:
        return 200

    def b(a: int = 5) -> int:
        return a + 1

    for fn in ([a, b] if a_first else [b, a]):
        wf.step()(fn)
    return wf


@pytest.mark.parametrize("a_first", [True, False])
def test_a_defaulted_parameter_named_after_a_step_is_a_dependency_in_any_order(tmp_path: Path,
                                                                                a_first: bool) -> None:
    wf = _defaults(a_first)
    assert list(wf.graph.edges) == [("a", "b")]
    run = raysaga.run(wf, None, store=_store(tmp_path), executor="inline")
    assert run.status == RunStatus.COMPLETED and run.output == {"b": 201}


UNDONE: list[Any] = []


def test_a_compensation_keeps_its_default_for_a_step_its_step_does_not_take(tmp_path: Path) -> None:
    UNDONE.clear()
    wf = Workflow("comp_default")

    @wf.step()
    def other() -> int:
        return 99

    def refund(output: int, other: int = 7) -> None:
        UNDONE.append((output, other))

    @wf.step(effect=True, compensate=refund)
    def pay(input: int) -> int:
        return input

    @wf.step()
    def boom(pay: int, other: int) -> None:
        raise Permanent("boom")

    run = raysaga.run(wf, 3, store=_store(tmp_path), executor="inline")
    assert run.status == RunStatus.COMPENSATED
    assert UNDONE == [(3, 7)]  # its own default, not None


REFUNDS: list[Any] = []


def test_an_effect_returning_another_type_fails_there_and_is_undone(tmp_path: Path) -> None:
    REFUNDS.clear()
    wf = Workflow("out_type")

    def refund(output: Charge | None) -> None:
        REFUNDS.append(output)

    @wf.step(effect=True, compensate=refund)
    def pay(input: int) -> Charge:
        return {"amount": "lots"}  # type: ignore[return-value]

    @wf.step()
    def ship(pay: Charge) -> int:
        raise AssertionError("never reached: pay failed")

    url = _store(tmp_path)
    run = raysaga.run(wf, 1, store=url, executor="inline", run_id="r")
    # the step that returned it fails, naming itself and the type; its effect took place (the
    # function returned), so the rollback undoes it, with output=None (what it returned is refused)
    assert run.status == RunStatus.COMPENSATED, run.status_reason
    assert "step 'pay' returned" in (run.status_reason or "") and "Charge" in (run.status_reason or "")
    assert REFUNDS == [None]
    store = SqlStore(url)
    try:
        pay_row = next(n for n in store.nodes("r") if n.node_id == "pay")
        assert pay_row.status == NodeStatus.FAILED and pay_row.error is not None
        assert pay_row.error.type == "OutputTypeError" and pay_row.error.took_effect
        assert pay_row.attempt == 1  # permanent: running it again returns the same
        assert [e.status for e in store.effects("r") if e.effect_name == "pay:compensate"] == [EffectStatus.COMMITTED]
    finally:
        store.close()


def test_a_plain_step_returning_another_type_fails_and_is_not_undone(tmp_path: Path) -> None:
    wf = Workflow("out_type_plain")

    @wf.step()
    def nothing() -> None:
        return {"a": 1}  # type: ignore[return-value]

    @wf.map("nothing_list")
    def item(nothing_list: int) -> int:
        return nothing_list if nothing_list else "zero"  # type: ignore[return-value]

    @wf.step()
    def nothing_list() -> list[int]:
        return [1, 0, 2]

    url = _store(tmp_path)
    run = raysaga.run(wf, None, store=url, executor="inline", run_id="r")
    assert run.status == RunStatus.FAILED
    store = SqlStore(url)
    try:
        rows = {(n.node_id, n.fan_index): n for n in store.nodes("r")}
        assert rows[("nothing", -1)].status == NodeStatus.FAILED or rows[("item", 1)].status == NodeStatus.FAILED
        failed = [n for n in rows.values() if n.status == NodeStatus.FAILED and n.error is not None
                  and n.error.type == "OutputTypeError"]
        assert failed and all(not n.error.took_effect for n in failed if n.error is not None)
    finally:
        store.close()


def test_returned_values_of_the_declared_type_pass_unchanged(tmp_path: Path) -> None:
    wf = Workflow("out_type_ok")

    @wf.step()
    def model() -> Charge:
        return Charge(amount=3)

    @wf.step()
    def as_dict() -> Charge:
        return {"amount": 4}  # type: ignore[return-value]  # a dict the model validates: as reading it back does

    @wf.step()
    def number() -> float:
        return 2  # an int for a float

    @wf.step()
    def total(model: Charge, as_dict: Charge, number: float) -> float:
        return model.amount + as_dict.amount + number

    run = raysaga.run(wf, None, store=_store(tmp_path), executor="inline")
    assert run.status == RunStatus.COMPLETED and run.output == {"total": 9}


ROUNDS: list[int] = []


def _retrying_for_ever() -> Workflow:
    wf = Workflow("retry_for_ever")

    @wf.step()
    def plan() -> list[int]:
        return [0, 1]

    def decide(result: FanOutResult) -> Any:
        ROUNDS.append(result.round)
        return RetryFailed("again")

    @wf.map("plan", policy=on_partial_failure(decide))
    def item(plan: int) -> int:
        if plan == 1:
            raise Permanent("never works")
        return plan

    @wf.step()
    def join(item: FanOutResult) -> int:
        return len(item.successes)

    return wf


@pytest.mark.parametrize("budget", [None, 3])
def test_retry_failed_answered_for_ever_ends(tmp_path: Path, budget: int | None) -> None:
    ROUNDS.clear()
    options = RunOptions(retry_budget=budget) if budget is not None else None
    run = raysaga.run(_retrying_for_ever(), None, store=_store(tmp_path), executor="inline", options=options)
    assert run.status == RunStatus.FAILED
    if budget is None:
        assert list(range(1, MAX_FANOUT_ROUNDS + 1)) == ROUNDS
        assert "MAX_FANOUT_ROUNDS" in (run.status_reason or "")
        assert run.retries_used == MAX_FANOUT_ROUNDS - 1  # each round's one failed item: a retry
    else:
        assert ROUNDS == [1, 2, 3, 4]  # three rounds retried one item each: the budget of 3 spent
        assert "retry budget (3)" in (run.status_reason or "")
        assert run.retries_used == 3


def test_options_that_mean_nothing_where_given_are_definition_errors() -> None:
    wf = Workflow("meaningless")
    with pytest.raises(WorkflowDefinitionError, match="add critical=False"):
        wf.step(name="a", on_failure="pass")(lambda: 1)
    with pytest.raises(WorkflowDefinitionError, match="add effect=True"):
        wf.step(name="b", effect_name="charge")(lambda: 1)
    with pytest.raises(WorkflowDefinitionError, match="version=None"):
        Workflow("no_version", version=None)  # type: ignore[arg-type]
    wf.step(name="c", critical=False, on_failure="pass")(lambda: 1)  # where they mean something: accepted
    wf.step(name="d", effect=True, effect_name="charge")(lambda: 1)


def test_a_saga_typo_is_a_definition_error_naming_the_option() -> None:
    saga = raysaga.Saga("typos")
    with pytest.raises(WorkflowDefinitionError, match="did you mean 'compensate'"):
        saga.step(lambda: 1, compensat=None)  # type: ignore[call-arg]
    with pytest.raises(WorkflowDefinitionError, match="did you mean 'version'"):
        raysaga.Saga("typos2", versio="2")  # type: ignore[call-arg]


def test_an_input_that_is_not_the_declared_type_names_the_step_it_came_from(tmp_path: Path) -> None:
    """The producer declares no type (or declared another one when the run started, resumed with
    ``--allow-changed``): the reader's failure names the parameter and the producing step,
    permanently (the same value comes again on every attempt), not as pydantic's bare text."""
    wf = Workflow("in_type")

    @wf.step()
    def pay() -> dict[str, Any]:
        return {"amount": "lots"}

    @wf.step(retry=raysaga.RetryPolicy(max_attempts=3, base=0.0, cap=0.0))
    def ship(pay: Charge) -> int:
        return pay.amount

    url = _store(tmp_path)
    run = raysaga.run(wf, None, store=url, executor="inline", run_id="r")
    assert run.status == RunStatus.FAILED
    assert "step 'ship' cannot read the output of step 'pay' as Charge (amount:" in (run.status_reason or "")
    store = SqlStore(url)
    try:
        ship_row = next(n for n in store.nodes("r") if n.node_id == "ship")
        assert ship_row.error is not None and ship_row.error.type == "InputTypeError" and ship_row.attempt == 1
    finally:
        store.close()
