"""Stop 46, what a review of the DSL's typing found:

* constraints written with ``typing.Annotated`` (``Field(gt=0)``, an ``AfterValidator``) on a step's
  parameters, the run's input or its return type were dropped when the signature was read, and
  silently not enforced: an effect step charged -5 where its input said ``gt=0``;
* a step's return value validated into its declared type, but the raw value stored: a dict
  returned for ``-> Charge`` reached an untyped reader without its defaults and with
  ``approved="no"`` (truthy), ``-> bool`` returning ``"no"`` stored ``"no"``;
* a parameter annotated with a plain class passed ``validate()`` and failed at run time, after the
  effects upstream of it, with pydantic's internal "arbitrary_types_allowed" advice;
* ``NewType`` and ``StrEnum``/``IntEnum`` types refused as having no JSON form;
* ``validate()`` passing what ``run`` refuses: steps declaring different input types, ``set[int]``;
* an annotation that cannot be resolved (``from __future__ import annotations``) with no fix hint.

Runs are inline on a real SQLite file, one on the session's Ray cluster.
"""

import enum
from typing import Annotated, Any, NewType

import pytest
from pydantic import AfterValidator, BaseModel, Field

import raysaga
from raysaga import RunStatus, Workflow
from raysaga.errors import InvalidInputError, WorkflowDefinitionError
from raysaga.orchestrator.executor import RayExecutor
from raysaga.orchestrator.type_adapters import type_adapter
from raysaga.state import RunRecord, SqlStore

Positive = Annotated[int, Field(gt=0, le=100)]


def _upper(text: str) -> str:
    return text.upper()


def _error(record: RunRecord) -> tuple[str, str]:
    assert record.error is not None, record
    return str(record.error.type), str(record.error.message)


# ----------------------------------------------------------------- 1. Annotated constraints kept


def test_an_annotated_input_constraint_refuses_the_run_before_any_effect(sqlite_url: str) -> None:
    charged: list[int] = []
    wf = Workflow("annotated_input46")

    @wf.step(effect=True)
    def charge(input: Annotated[int, Field(gt=0, le=100)]) -> dict[str, int]:
        charged.append(input)
        return {"charged": input}

    for bad in (-5, 10**6):
        with pytest.raises(InvalidInputError, match=r"greater than 0|less than or equal to 100"):
            raysaga.run(wf, bad, store=sqlite_url, executor="inline")
    assert charged == []
    assert raysaga.run(wf, 7, store=sqlite_url, executor="inline").output == {"charge": {"charged": 7}}


def test_an_annotated_validator_on_the_input_runs(sqlite_url: str) -> None:
    wf = Workflow("annotated_validator46")

    @wf.step()
    def shout(input: Annotated[str, AfterValidator(_upper)]) -> str:
        return input

    assert raysaga.run(wf, "abc", store=sqlite_url, executor="inline").output == {"shout": "ABC"}


def test_two_steps_writing_the_same_annotated_input_type_agree(sqlite_url: str) -> None:
    """Each ``Field(gt=0)`` is its own object, equal to no other: still one input type."""
    wf = Workflow("annotated_twice46")

    @wf.step()
    def a(input: Annotated[int, Field(gt=0)]) -> int:
        return input

    @wf.step()
    def b(input: Annotated[int, Field(gt=0)], a: int) -> int:
        return input + a

    assert raysaga.run(wf, 2, store=sqlite_url, executor="inline").output == {"b": 4}
    with pytest.raises(InvalidInputError, match="greater than 0"):
        raysaga.run(wf, 0, store=sqlite_url, executor="inline")


def test_a_nested_annotated_reader_refuses_a_value_naming_the_parameter(sqlite_url: str) -> None:
    wf = Workflow("annotated_reader46")

    @wf.step()
    def p() -> list[int]:
        return [1, -2]

    @wf.step()
    def q(p: list[Annotated[int, Field(gt=0)]]) -> list[int]:
        return p

    record = raysaga.run(wf, None, store=sqlite_url, executor="inline")
    assert record.status == RunStatus.FAILED
    kind, message = _error(record)
    assert kind == "InputTypeError", message
    assert "step 'q' cannot read the output of step 'p' as list[Annotated[int, Field(gt=0)]]" in message, message
    assert "greater than 0" in message


def test_an_annotated_return_type_fails_the_step_that_broke_it(sqlite_url: str) -> None:
    wf = Workflow("annotated_return46")

    @wf.step()
    def make() -> Annotated[int, Field(gt=0)]:
        return 0

    record = raysaga.run(wf, None, store=sqlite_url, executor="inline")
    kind, message = _error(record)
    assert kind == "OutputTypeError", message
    assert "step 'make' returned 0" in message and "greater than 0" in message, message


def _fan_out(executor: Any, url: str, name: str) -> tuple[RunRecord, RunRecord]:
    """A fan-out whose items read an ``Annotated`` element, and a step returning against its
    ``Annotated`` return type: run on ``executor``."""
    wf = Workflow(name)

    @wf.step()
    def plan(input: int) -> list[int]:
        return [1, input]

    @wf.step(map_over="plan")
    def item(plan: Annotated[int, Field(lt=3)]) -> Annotated[int, Field(ge=0)]:
        return plan - 1

    wf_out = Workflow(name + "_out")

    @wf_out.step()
    def made() -> Annotated[int, Field(gt=0)]:
        return -1

    return (raysaga.run(wf, 5, store=url, executor=executor),
            raysaga.run(wf_out, None, store=url, executor=executor))


@pytest.mark.parametrize("where", ["inline", "ray"])
def test_annotated_constraints_hold_for_fan_out_items_on_both_executors(
        where: str, sqlite_url: str, request: pytest.FixtureRequest) -> None:
    executor: Any = "inline" if where == "inline" else RayExecutor(address=request.getfixturevalue("ray_session"))
    read, returned = _fan_out(executor, sqlite_url, f"annotated_fan46_{where}")
    kind, message = _error(read)
    assert kind == "InputTypeError" and "step 'item'" in message and "less than 3" in message, message
    kind, message = _error(returned)
    assert kind == "OutputTypeError" and "step 'made' returned -1" in message, message


def test_annotated_metadata_that_cannot_be_hashed_is_enforced(sqlite_url: str) -> None:
    wf = Workflow("annotated_unhashable46")

    @wf.step()
    def a(input: Annotated[int, {"doc": 1}]) -> Annotated[list[Annotated[int, Field(gt=0)]], {"doc": 2}]:
        return [input, 2]

    assert raysaga.run(wf, 1, store=sqlite_url, executor="inline").output == {"a": [1, 2]}
    _, message = _error(raysaga.run(wf, -1, store=sqlite_url, executor="inline"))
    assert "step 'a' returned [-1, 2]" in message, message


# ----------------------------------------------------------------- 2. the validated value is stored


class Charge(BaseModel):
    charge_id: str = Field(alias="chargeId")
    amount: float
    currency: str = "EUR"
    approved: bool = False


def _stored(url: str, run_id: str, node: str) -> Any:
    store = SqlStore(url)
    try:
        return next(n.output for n in store.nodes(run_id) if n.node_id == node)
    finally:
        store.close()


def _charges(returned: Any) -> Workflow:
    wf = Workflow("stored_model46")

    @wf.step()
    def charge() -> Charge:
        return returned  # type: ignore[no-any-return]

    @wf.step()
    def untyped(charge):  # type: ignore[no-untyped-def]
        return charge

    @wf.step()
    def typed(charge: Charge) -> dict[str, Any]:
        return {"approved": charge.approved, "amount": charge.amount, "currency": charge.currency}

    return wf


def test_a_dict_returned_for_a_model_is_stored_as_the_model_it_validates_into(sqlite_url: str) -> None:
    as_model = raysaga.run(_charges(Charge(chargeId="c1", amount=10, approved=False)), None, store=sqlite_url,
                           executor="inline")
    as_dict = raysaga.run(_charges({"chargeId": "c1", "amount": "10", "approved": "no"}), None, store=sqlite_url,
                          executor="inline")
    assert as_dict.status == as_model.status == RunStatus.COMPLETED
    expected = Charge(chargeId="c1", amount=10).model_dump(mode="json")
    assert as_dict.output == as_model.output
    assert as_dict.output is not None and as_dict.output["untyped"] == expected
    assert as_dict.output["typed"] == {"approved": False, "amount": 10.0, "currency": "EUR"}
    assert _stored(sqlite_url, as_dict.run_id, "charge") == _stored(sqlite_url, as_model.run_id, "charge") == expected


@pytest.mark.parametrize(("declared", "returned"), [(bool, "no"), (int, "5"), (list[int], ["1", 2]),
                                                    (Annotated[str, AfterValidator(_upper)], "abc")])
def test_a_laxly_validated_return_value_is_stored_as_its_readers_read_it(
        declared: Any, returned: Any, sqlite_url: str) -> None:
    wf = Workflow("stored_lax46")

    def make() -> Any:
        return returned

    make.__annotations__["return"] = declared
    wf.step(make, name="make")

    @wf.step()
    def read(make):  # type: ignore[no-untyped-def]
        return [make, type(make).__name__]

    record = raysaga.run(wf, None, store=sqlite_url, executor="inline")
    expected = type_adapter(declared).validate_python(returned)
    assert record.output == {"read": [expected, type(expected).__name__]}
    assert _stored(sqlite_url, record.run_id, "make") == expected


# ----------------------------------------------------------------- 3. a plain class as a parameter


class Plain:
    def __init__(self, x: int = 1) -> None:
        self.x = x


def test_a_parameter_annotated_with_a_plain_class_is_a_definition_error(sqlite_url: str) -> None:
    charged: list[int] = []
    wf = Workflow("plain_class46")

    @wf.step(effect=True)
    def charge() -> dict[str, int]:
        charged.append(1)
        return {"x": 1}

    @wf.step()
    def use(charge: Plain) -> int:
        return charge.x

    @wf.step()
    def use_list(charge: list[Plain] | None = None) -> int:
        return 1

    with pytest.raises(WorkflowDefinitionError) as err:
        wf.validate()
    message = str(err.value)
    assert "step 'use': parameter 'charge' is annotated Plain" in message, message
    assert "step 'use_list': parameter 'charge' is annotated list[Plain] | None" in message, message
    assert "Plain is a plain class; make it a pydantic model" in message and "dataclass" in message, message
    assert "arbitrary_types_allowed" not in message
    with pytest.raises(WorkflowDefinitionError):
        raysaga.run(wf, None, store=sqlite_url, executor="inline")
    assert charged == []


def test_a_compensation_parameter_annotated_with_a_plain_class_is_a_definition_error() -> None:
    def refund(output: Plain) -> None:
        return None

    wf = Workflow("plain_undo46")

    @wf.step(effect=True, compensate=refund)
    def charge() -> int:
        return 1

    with pytest.raises(WorkflowDefinitionError, match="the compensation 'refund' of step 'charge': parameter "
                                                      "'output' is annotated Plain"):
        wf.validate()


# ----------------------------------------------------------------- 4. NewType, StrEnum, IntEnum

UserId = NewType("UserId", int)


class Status(enum.StrEnum):
    OK = "ok"
    BAD = "bad"


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


def test_newtype_and_str_or_int_enums_round_trip(sqlite_url: str) -> None:
    wf = Workflow("json_types46")

    @wf.step()
    def user(input: UserId) -> UserId:
        return UserId(input + 1)

    @wf.step()
    def decide(user: UserId) -> Status:
        return Status.OK if user > 0 else Status.BAD

    @wf.step()
    def level() -> Level:
        return Level.HIGH

    @wf.step()
    def typed(decide: Status, level: Level) -> list[bool]:
        return [decide is Status.OK, level is Level.HIGH]

    @wf.step()
    def untyped(decide, level):  # type: ignore[no-untyped-def]
        return [decide, level]

    record = raysaga.run(wf, 4, store=sqlite_url, executor="inline")
    assert record.output == {"typed": [True, True], "untyped": ["ok", 2]}, record.error


# ----------------------------------------------------------------- 5. validate() reports the input's problems


def test_validate_reports_steps_declaring_different_input_types() -> None:
    class Order(BaseModel):
        qty: int

    class Other(BaseModel):
        name: str

    wf = Workflow("input_types46")

    @wf.step(effect=True)
    def charge(input: Order) -> int:
        return input.qty

    @wf.step()
    def ship(input: Other, charge: int) -> str:
        return input.name

    with pytest.raises(WorkflowDefinitionError) as err:
        wf.validate()
    assert "steps annotate 'input' with different types: Order (step 'charge'); Other (step 'ship')" in str(err.value)


def test_validate_reports_an_input_type_with_no_json_form() -> None:
    wf = Workflow("input_set46")

    @wf.step()
    def a(input: set[int]) -> int:
        return len(input)

    with pytest.raises(WorkflowDefinitionError, match=r"step 'a' declares the run's input as set\[int\], which is "
                                                      "not JSON-able"):
        wf.validate()


# ----------------------------------------------------------------- 6. unresolved annotations


def test_an_annotation_that_cannot_be_resolved_says_where_to_define_the_name() -> None:
    wf = Workflow("unresolved46")

    def a(input: "Undefined46") -> int:  # type: ignore[name-defined]  # noqa: F821
        return 1

    with pytest.raises(WorkflowDefinitionError) as err:
        wf.step()(a)
    message = str(err.value)
    assert "name 'Undefined46' is not defined" in message, message
    assert "define Undefined46 before the step, at module level" in message
    assert "drop `from __future__ import annotations`" in message

