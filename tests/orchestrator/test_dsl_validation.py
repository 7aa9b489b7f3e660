"""The workflow DSL refuses bad definitions at definition time, each error naming its culprit.

Pure tests: no store, no Ray. A definition error may surface at decoration (a duplicate
name, a self-dependency seen in the signature) or at ``validate()`` (anything that needs
the whole DAG); ``_define`` covers both, since the contract is only "before any run".

This module deliberately does not use ``from __future__ import annotations``: the DSL
resolves annotations with ``typing.get_type_hints``, and the return types below are real
objects, as they are in most user code.
"""

import math
import re
from collections.abc import Callable
from typing import Any, Literal, Optional, TypedDict

import pytest
from pydantic import BaseModel

from raysaga import InvalidInputError, StepContext, Workflow, WorkflowDefinitionError
from raysaga.orchestrator import RetryPolicy


class Order(BaseModel):
    sku: str
    qty: int


class Line(BaseModel):
    sku: str
    price: float


class Plain:
    """A class with no JSON form."""


class Point(TypedDict):
    x: int
    y: int


def _define(build: Callable[[Workflow], None], name: str = "wf") -> Workflow:
    """Build a workflow with ``build`` and validate it."""
    wf = Workflow(name)
    build(wf)
    return wf.validate()


def _definition_error(build: Callable[[Workflow], None]) -> str:
    with pytest.raises(WorkflowDefinitionError) as info:
        _define(build)
    return str(info.value)


# ---------------------------------------------------------------------------- the DAG


def test_two_step_cycle_names_the_path() -> None:
    def build(wf: Workflow) -> None:
        @wf.step()
        def a(b: int) -> int:
            return b

        @wf.step()
        def b(a: int) -> int:
            return a

    message = _definition_error(build)
    assert "cycle" in message
    assert "a -> b -> a" in message or "b -> a -> b" in message, message


def test_three_step_cycle_behind_an_entry_names_every_member() -> None:
    def build(wf: Workflow) -> None:
        @wf.step()
        def start(input: int) -> int:
            return input

        @wf.step()
        def x(start: int, z: int) -> int:
            return z

        @wf.step()
        def y(x: int) -> int:
            return x

        @wf.step()
        def z(y: int) -> int:
            return y

    message = _definition_error(build)
    rotations = ["x -> y -> z -> x", "y -> z -> x -> y", "z -> x -> y -> z"]
    assert any(r in message for r in rotations), message
    assert "start ->" not in message  # the entry is not part of the cycle


def test_cycle_through_after_is_found() -> None:
    def build(wf: Workflow) -> None:
        @wf.step(after=["b"])
        def a() -> int:
            return 1

        @wf.step(after=["a"])
        def b() -> int:
            return 2

    message = _definition_error(build)
    assert "a -> b -> a" in message or "b -> a -> b" in message, message


def test_self_loop_through_a_parameter_named_after_the_step() -> None:
    def build(wf: Workflow) -> None:
        @wf.step()
        def loop(loop: int) -> int:
            return loop

    message = _definition_error(build)
    assert "'loop'" in message and "itself" in message, message


def test_self_loop_through_after() -> None:
    def build(wf: Workflow) -> None:
        @wf.step(after=["loop"])
        def loop() -> int:
            return 1

    message = _definition_error(build)
    assert "'loop'" in message and "itself" in message, message


def test_self_loop_with_an_explicit_name() -> None:
    def build(wf: Workflow) -> None:
        @wf.step(name="renamed", after=["renamed"])
        def fn() -> int:
            return 1

    message = _definition_error(build)
    assert "'renamed'" in message and "itself" in message, message


def test_unknown_dependency_is_named_with_its_dependent() -> None:
    def build(wf: Workflow) -> None:
        @wf.step()
        def a(input: int) -> int:
            return input

        @wf.step()
        def b(a: int, ghost: int) -> int:
            return a + ghost

    message = _definition_error(build)
    assert "'b'" in message and "unknown step 'ghost'" in message, message


def test_unknown_after_dependency_is_named() -> None:
    def build(wf: Workflow) -> None:
        @wf.step(after=["nowhere"])
        def a() -> int:
            return 1

    message = _definition_error(build)
    assert "'a'" in message and "'nowhere'" in message, message


def test_every_problem_is_listed_at_once() -> None:
    def build(wf: Workflow) -> None:
        @wf.step()
        def a(ghost1: int) -> set[int]:
            return {ghost1}

        @wf.step()
        def b(ghost2: int) -> int:
            return ghost2

    message = _definition_error(build)
    for culprit in ("'ghost1'", "'ghost2'", "set"):
        assert culprit in message, message


def test_duplicate_step_name_is_refused() -> None:
    def build(wf: Workflow) -> None:
        @wf.step()
        def fetch(input: int) -> int:
            return input

        @wf.step(name="fetch")
        def fetch_again(input: int) -> int:
            return input

    message = _definition_error(build)
    assert "'fetch'" in message and "already" in message, message


def test_duplicate_function_name_in_another_scope_is_refused() -> None:
    wf = Workflow("dup")

    def first() -> int:
        return 1

    def second() -> int:
        return 2

    second.__name__ = "first"
    wf.step(first)
    with pytest.raises(WorkflowDefinitionError, match="'first'"):
        wf.step(second)
    assert wf.steps["first"].fn is first  # the original stands


def test_compensation_for_unknown_step() -> None:
    def build(wf: Workflow) -> None:
        @wf.step()
        def charge(input: int) -> int:
            return input

        @wf.compensation("refund_target_typo")
        def undo() -> None:
            return None

    message = _definition_error(build)
    assert "'refund_target_typo'" in message and "compensation" in message, message


def test_compensation_for_known_step_is_accepted() -> None:
    def build(wf: Workflow) -> None:
        @wf.step()
        def charge(input: int) -> int:
            return input

        @wf.compensation("charge")
        def refund() -> None:
            return None

    wf = _define(build)
    assert wf.compensation_for("charge") is wf.compensations["charge"]


def test_second_compensation_for_the_same_step_is_refused() -> None:
    wf = Workflow("twice")

    @wf.step()
    def charge(input: int) -> int:
        return input

    @wf.compensation("charge")
    def refund() -> None:
        return None

    with pytest.raises(WorkflowDefinitionError, match="'charge'"):
        wf.compensation("charge")(refund)


def test_empty_workflow_is_refused() -> None:
    with pytest.raises(WorkflowDefinitionError, match="no steps"):
        Workflow("empty").validate()


@pytest.mark.parametrize("name", ["", "has space", "semi;colon", "slash/y"])
def test_invalid_workflow_names(name: str) -> None:
    with pytest.raises(WorkflowDefinitionError):
        Workflow(name)


# ---------------------------------------------------------------------------- output types


@pytest.mark.parametrize(
    ("tp", "mentions"),
    [
        (set[int], "set"),
        (frozenset[str], "set"),
        (bytes, "bytes"),
        (object, "object"),
        (Plain, "Plain"),
        (dict[int, str], "keys"),
        (list[bytes], "bytes"),
        (dict[str, set[int]], "set"),
        (Optional[bytes], "bytes"),  # noqa: UP045 - the typing form is what users write
        (int | Plain, "Plain"),
        (tuple[int, bytes], "bytes"),
        (complex, "complex"),
    ],
    ids=lambda v: getattr(v, "__name__", None) or str(v).replace("typing.", ""),
)
def test_non_jsonable_output_type_is_refused(tp: Any, mentions: str) -> None:
    def fn(input: int) -> None:
        return None

    fn.__annotations__["return"] = tp

    def build(wf: Workflow) -> None:
        wf.step(name="produce")(fn)

    message = _definition_error(build)
    assert "'produce'" in message, message
    assert "JSON" in message and mentions in message, message


@pytest.mark.parametrize(
    "tp",
    [
        Order,
        list[Order],
        dict[str, int],
        dict[str, Order],
        Optional[int],  # noqa: UP045
        int | None,
        Literal["a", "b", 3],
        list[dict[str, list[float]]],
        tuple[int, ...],
        Point,
        Any,
        str,
        bool,
        float,
        None,
        list,
        dict,
    ],
    ids=lambda v: getattr(v, "__name__", None) or str(v).replace("typing.", ""),
)
def test_jsonable_output_type_is_accepted(tp: Any) -> None:
    def fn(input: int) -> None:
        return None

    fn.__annotations__["return"] = tp
    wf = Workflow("ok")
    wf.step(name="produce")(fn)
    wf.validate()
    assert wf.steps["produce"].output_type == (type(None) if tp is None else tp)


def test_unresolvable_annotation_is_a_definition_error() -> None:
    def fn(input: int) -> "NoSuchType":  # type: ignore[name-defined]  # noqa: F821
        return None

    wf = Workflow("unresolved")
    with pytest.raises(WorkflowDefinitionError, match="'fn'"):
        wf.step(fn)


# ---------------------------------------------------------------------------- fan-out


def test_map_over_a_non_parameter_is_refused() -> None:
    def build(wf: Workflow) -> None:
        @wf.step()
        def plan(input: int) -> list[int]:
            return list(range(input))

        @wf.step(map_over="plan")
        def item(x: int) -> int:
            return x

    message = _definition_error(build)
    assert "'item'" in message and "'plan'" in message, message


def test_map_over_the_input_is_refused() -> None:
    def build(wf: Workflow) -> None:
        @wf.map("input")
        def item(input: list[int]) -> int:
            return 1

    message = _definition_error(build)
    assert "'item'" in message and "'input'" in message, message


def test_map_over_a_parameter_is_accepted_and_recorded() -> None:
    def build(wf: Workflow) -> None:
        @wf.step()
        def plan(input: int) -> list[int]:
            return list(range(input))

        @wf.map("plan")
        def item(plan: int) -> int:
            return plan * 2

    wf = _define(build)
    assert wf.steps["item"].map_over == "plan"
    assert wf.steps["item"].deps == ("plan",)
    assert wf.order == ["plan", "item"]


# ---------------------------------------------------------------------------- decorators


def test_decorators_return_the_function_unchanged_and_callable() -> None:
    wf = Workflow("plain")

    def a(input: int) -> int:
        return input + 1

    def b(ctx: StepContext, a: int, scale: int = 10) -> int:
        return a * scale

    def c(b: int) -> list[int]:
        return [b, b]

    def d(c: int) -> int:
        return -c

    def undo_a() -> str:
        return "undone"

    assert wf.step(a) is a  # bare decorator
    assert wf.step(effect=True, retry=RetryPolicy(max_attempts=2))(b) is b
    assert wf.step()(c) is c
    assert wf.map("c")(d) is d
    assert wf.compensation("a")(undo_a) is undo_a
    wf.validate()
    # still plain functions, callable on their own
    assert a(1) == 2
    assert b(None, 3) == 30  # type: ignore[arg-type]
    assert b(None, 3, scale=2) == 6  # type: ignore[arg-type]
    assert d(5) == -5
    assert undo_a() == "undone"
    assert a.__name__ == "a" and not hasattr(a, "__wrapped__")


def test_parameters_are_classified() -> None:
    wf = Workflow("params")

    @wf.step()
    def first(input: Order) -> Line:
        return Line(sku=input.sku, price=1.0)

    @wf.step(after=["first"])
    def second(context: StepContext, first: Line, input: Order, knob: int = 3) -> int:
        return knob

    wf.validate()
    spec = wf.steps["second"]
    assert spec.ctx_param == "context"
    assert spec.input_param == "input"
    assert spec.param_deps == ("first",)
    assert spec.deps == ("first",)  # after= and the parameter are one dependency
    assert "knob" not in spec.param_types
    assert wf.input_type is Order


def test_async_step_is_recorded_as_async() -> None:
    wf = Workflow("asyncwf")

    @wf.step()
    async def fetch(input: int) -> int:
        return input

    assert wf.steps["fetch"].is_async


@pytest.mark.parametrize(
    ("options", "culprit"),
    [({"timeout": 0}, "timeout"), ({"timeout": -1.0}, "timeout"), ({"reconcile": lambda: None}, "reconcile"),
     ({"compensate": "not a function"}, "compensate")],
)
def test_bad_step_options(options: dict[str, Any], culprit: str) -> None:
    wf = Workflow("opts")

    def step_fn(input: int) -> int:
        return input

    with pytest.raises(WorkflowDefinitionError, match=culprit):
        wf.step(**options)(step_fn)


def test_varargs_are_refused() -> None:
    wf = Workflow("varargs")

    def step_fn(*things: int) -> int:
        return 0

    with pytest.raises(WorkflowDefinitionError, match="step_fn"):
        wf.step(step_fn)


# ---------------------------------------------------------------------------- definition hash


def _order_workflow(*, extra_step: bool = False, after_b: bool = False, version: str = "1",
                    body: int = 0, critical: bool = True) -> Workflow:
    wf = Workflow("orders", version=version)

    @wf.step()
    def reserve(input: Order) -> Line:
        return Line(sku=input.sku, price=float(body))

    @wf.step(critical=critical)
    def price(reserve: Line) -> float:
        return reserve.price + body

    @wf.step(after=["price"] if after_b else ())
    def notify(reserve: Line) -> str:
        return reserve.sku

    if extra_step:
        @wf.step()
        def audit(notify: str) -> str:
            return notify

    return wf


def test_definition_hash_is_stable_across_identical_definitions() -> None:
    one, two = _order_workflow(), _order_workflow()
    assert one is not two
    assert re.fullmatch(r"[0-9a-f]{64}", one.definition_hash)
    assert one.definition_hash == two.definition_hash
    assert one.definition_hash == one.definition_hash  # cached, and stable on re-read


def test_definition_hash_ignores_step_bodies() -> None:
    assert _order_workflow(body=0).definition_hash == _order_workflow(body=7).definition_hash


@pytest.mark.parametrize(
    "change",
    [{"extra_step": True}, {"after_b": True}, {"version": "2"}, {"critical": False}],
    ids=["new-step", "new-edge", "version", "critical"],
)
def test_definition_hash_changes_with_the_dag(change: dict[str, Any]) -> None:
    assert _order_workflow(**change).definition_hash != _order_workflow().definition_hash


def test_definition_hash_changes_when_a_step_is_added_after_first_use() -> None:
    wf = _order_workflow()
    before = wf.definition_hash

    @wf.step()
    def audit(notify: str) -> str:
        return notify

    assert wf.definition_hash != before
    assert wf.definition_hash == _order_workflow(extra_step=True).definition_hash


def test_order_includes_a_step_added_after_first_use() -> None:
    wf = _order_workflow()
    assert "audit" not in wf.order

    @wf.step()
    def audit(notify: str) -> str:
        return notify

    assert "audit" in wf.order, wf.order
    assert wf.order.index("notify") < wf.order.index("audit")
    assert wf.sinks() == ["audit", "price"]


# ---------------------------------------------------------------------------- run input


def _typed_input_workflow() -> Workflow:
    wf = Workflow("typed")

    @wf.step()
    def reserve(input: Order) -> int:
        return input.qty

    return wf


def test_check_input_accepts_a_matching_dict_and_model() -> None:
    wf = _typed_input_workflow()
    assert wf.check_input({"sku": "A-1", "qty": 2}) == {"sku": "A-1", "qty": 2}
    assert wf.check_input(Order(sku="B", qty=1)) == {"sku": "B", "qty": 1}


@pytest.mark.parametrize(
    "bad",
    [{"sku": "A-1"}, {"sku": "A-1", "qty": "many"}, "just a string", None, [1, 2]],
    ids=["missing-field", "wrong-type", "str", "none", "list"],
)
def test_check_input_rejects_input_not_matching_the_model(bad: Any) -> None:
    wf = _typed_input_workflow()
    with pytest.raises(InvalidInputError) as info:
        wf.check_input(bad)
    assert "Order" in str(info.value) and "'typed'" in str(info.value)


@pytest.mark.parametrize(
    "bad",
    [math.nan, math.inf, -math.inf, {"x": math.nan}, [1.0, math.nan], {"nested": {"deep": [math.inf]}}],
    ids=["nan", "inf", "-inf", "dict", "list", "nested"],
)
def test_check_input_rejects_nan_and_infinity(bad: Any) -> None:
    wf = Workflow("untyped")

    @wf.step()
    def take(input: Any) -> int:
        return 1

    with pytest.raises(InvalidInputError, match=r"nan|inf"):
        wf.check_input(bad)


def test_check_input_rejects_nan_inside_a_model_field() -> None:
    wf = Workflow("typed-float")

    @wf.step()
    def take(input: Line) -> float:
        return input.price

    with pytest.raises(InvalidInputError, match="nan"):
        wf.check_input({"sku": "x", "price": math.nan})


@pytest.mark.parametrize("bad", [{1, 2}, b"bytes", object(), {1: "int key"}, "lone \ud800 surrogate"],
                         ids=["set", "bytes", "object", "int-key", "surrogate"])
def test_check_input_rejects_non_json_values(bad: Any) -> None:
    wf = Workflow("untyped2")

    @wf.step()
    def take(input: Any) -> int:
        return 1

    with pytest.raises(InvalidInputError):
        wf.check_input(bad)


def test_steps_disagreeing_on_the_input_type_are_refused() -> None:
    wf = Workflow("two-inputs")

    @wf.step()
    def a(input: Order) -> int:
        return 1

    @wf.step()
    def b(input: Line) -> int:
        return 2

    with pytest.raises(WorkflowDefinitionError, match="input"):
        wf.check_input({"sku": "x", "qty": 1})
