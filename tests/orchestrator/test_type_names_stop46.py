"""Stop 46, after the DSL review's fixes (Annotated constraints enforced): the run input's refusal
named the declared type ``Annotated`` (``getattr(tp, '__name__', tp)``), and the read-back check
of a JSON form hashed an ``Annotated`` type, which raises for metadata that does not hash."""

from __future__ import annotations

import sys
from typing import Annotated, Any, TypedDict

import pytest
from pydantic import AfterValidator, BaseModel, Field, field_validator

import raysaga
from raysaga import RunStatus, Workflow
from raysaga.errors import InvalidInputError, WorkflowDefinitionError
from raysaga.state.json_form import needs_read_back
from raysaga.state.type_adapters import type_adapter


def test_an_annotated_input_is_named_with_its_constraint_when_refused(sqlite_url: str) -> None:
    wf = Workflow("named46")

    @wf.step()
    def charge(input: Annotated[int, Field(gt=0)]) -> int:
        return input

    with pytest.raises(InvalidInputError, match=r"^input does not match Annotated\[int, Field\(gt=0\)\] of "
                                                r"workflow 'named46': .*greater than 0"):
        raysaga.run(wf, -5, store=sqlite_url, executor="inline")


def test_an_annotated_type_whose_metadata_does_not_hash_needs_a_read_back() -> None:
    unhashable: Any = Annotated[int, {"doc": "a count"}]
    assert needs_read_back(unhashable)
    assert needs_read_back(list[unhashable])


class Receipt(BaseModel):
    cents: int

    @field_validator("cents", mode="before")
    @classmethod
    def from_euros(cls, v: Any) -> int:  # a conversion: validating its result again converts it again
        return round(float(v) * 100)


def test_a_return_whose_validator_is_not_idempotent_is_stored_as_returned(sqlite_url: str) -> None:
    """A diff review of the stop-46 fix that stores a return value as the value it validates into:
    a converting validator then read its own result back converted again (1234 cents as 123400),
    and an effect step that had charged failed for good and was rolled back. The form of the value
    returned reads back as the validated one: that one is stored, as before."""
    undone: list[Any] = []
    wf = Workflow("nonidem46")

    def refund(output: Any) -> None:
        undone.append(output)

    @wf.step(effect=True, compensate=refund)
    def charge() -> Receipt:
        return {"cents": "12.34"}  # type: ignore[return-value]  # (what a provider answered, in euros)

    @wf.step()
    def ship(charge: Receipt) -> int:
        return charge.cents

    record = raysaga.run(wf, None, store=sqlite_url, executor="inline")
    assert (record.status, record.output, undone) == (RunStatus.COMPLETED, {"ship": 1234}, [])


def test_an_input_whose_validator_is_not_idempotent_is_accepted(sqlite_url: str) -> None:
    wf = Workflow("prefixed46")

    @wf.step()
    def typed(input: Annotated[str, AfterValidator(lambda s: "id-" + s)]) -> str:
        return input

    assert raysaga.run(wf, "7", store=sqlite_url, executor="inline").output == {"typed": "id-7"}


class Plain:
    def __init__(self, x: int = 1) -> None:
        self.x = x


def test_a_compensation_input_annotated_with_a_plain_class_is_a_definition_error() -> None:
    wf = Workflow("compinput46")

    def undo(output: Any, input: Plain) -> None:
        return None

    @wf.step(effect=True, compensate=undo)
    def charge(input: Any) -> int:
        return 1

    with pytest.raises(WorkflowDefinitionError, match=r"the compensation 'undo' of step 'charge': parameter 'input' "
                                                      r"is annotated Plain, .* Plain is a plain class"):
        wf.validate()


class StdTypedDict(TypedDict):  # typing's, which pydantic refuses before Python 3.12
    ok: bool


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="pydantic reads typing.TypedDict from Python 3.12")
def test_a_typing_typed_dict_parameter_is_not_called_a_plain_class() -> None:
    wf = Workflow("typeddict46")

    @wf.step()
    def make() -> dict[str, bool]:
        return {"ok": True}

    @wf.step()
    def read(make: StdTypedDict) -> bool:
        return make["ok"]

    with pytest.raises(WorkflowDefinitionError, match=r"typing_extensions.TypedDict") as caught:
        wf.validate()
    assert "plain class" not in str(caught.value)


def test_the_adapter_of_an_annotation_that_does_not_hash_is_built_once() -> None:
    """A fresh adapter for every fan-out item cost 0.7-1.9 ms an item (a diff review's measure)."""
    unhashable: Any = Annotated[int, Field(gt=0), {"doc": "a count"}]
    assert type_adapter(unhashable) is type_adapter(unhashable)
