"""Stop 46, after the DSL review's fixes (Annotated constraints enforced): the run input's refusal
named the declared type ``Annotated`` (``getattr(tp, '__name__', tp)``), and the read-back check
of a JSON form hashed an ``Annotated`` type, which raises for metadata that does not hash."""

from __future__ import annotations

from typing import Annotated, Any

import pytest
from pydantic import Field

import raysaga
from raysaga import Workflow
from raysaga.errors import InvalidInputError
from raysaga.state.json_form import needs_read_back


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
