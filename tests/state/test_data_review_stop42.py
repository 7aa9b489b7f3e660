"""Data path review (stop 42), the store's side: what was wrong.

* ``jsoncodec`` dumped a pydantic model by field name (``model_dump(mode="json")``) while pydantic
  reads it back by alias, and with its computed fields, which ``extra="forbid"`` refuses on the way
  back: the stored form of such a model could not be read as the model;
* nothing read a typed value's JSON form back, so a union member, an ``Any`` field's set or a
  ``SecretStr`` changed on the way (``json_form.read_back_problem`` now says where);
* an approval's answer was checked against its schema without a format checker: a ``date``,
  ``date-time`` or ``uuid`` string pydantic refuses was accepted (``answer_schema.validate_answer``);
* ``list_runs(workflow="w\\x00")`` raised psycopg's raw ``DataError`` on PostgreSQL (SQLite: []).
"""

from __future__ import annotations

import datetime
import uuid
from typing import Any

import jsonschema
import pytest
from pydantic import BaseModel, ConfigDict, Field, SecretStr, computed_field

import raysaga
from raysaga.state import jsoncodec
from raysaga.state.answer_schema import validate_answer
from raysaga.state.json_form import needs_read_back, read_back, read_back_problem


class Aliased(BaseModel):
    model_config = ConfigDict(extra="forbid")
    charge_id: str = Field(alias="chargeId")

    @computed_field  # type: ignore[prop-decorator]
    @property
    def shown(self) -> str:
        return self.charge_id.upper()


class A(BaseModel):
    n: int


class B(BaseModel):
    n: int


class Holder(BaseModel):
    data: dict[str, Any]
    key: SecretStr | None = None


def test_a_model_is_stored_by_name_without_computed_fields_under_forbid_and_reads_back() -> None:
    text = jsoncodec.dumps(Aliased(chargeId="ch_1"))
    assert text == '{"charge_id":"ch_1"}'  # by name, as raysaga always stored it; read by name and by alias
    assert read_back(Aliased, jsoncodec.loads(text)) == Aliased(chargeId="ch_1")
    assert read_back(Aliased, {"chargeId": "ch_1"}) == Aliased(chargeId="ch_1")
    assert jsoncodec.to_jsonable({"inner": [Aliased(chargeId="x")]}) == {"inner": [{"charge_id": "x"}]}


@pytest.mark.parametrize("tp", [int, str, float, bool, Any, dict, list, dict[str, int], list[str],
                                dict[str, list[int]], int | None, list[Any], dict[str, Any], int | str])
def test_plain_json_types_need_no_read_back(tp: Any) -> None:
    assert not needs_read_back(tp)


@pytest.mark.parametrize("tp", [A, list[A], A | None, A | B, dict[str, A], datetime.date, int | A])
def test_types_whose_form_can_differ_are_read_back(tp: Any) -> None:
    assert needs_read_back(tp)


def test_read_back_names_where_the_form_differs() -> None:
    union: Any = A | B
    assert read_back_problem(union, B(n=1), {"n": 1}, "output") == (
        "output is a B but its JSON form reads back as a A (a union of models has no type in its JSON form: give "
        "it a discriminator, Field(discriminator=...), or members with distinct fields)")
    made = Holder(data={"v": {1, 2}})
    problem = read_back_problem(Holder, made, jsoncodec.to_jsonable(made), "output")
    assert problem is not None and problem.startswith("output.data['v'] is {1, 2} (set)")
    secret = Holder(data={}, key=SecretStr("s3cret"))
    problem = read_back_problem(Holder, secret, jsoncodec.to_jsonable(secret), "output")
    assert problem is not None and "output.key is a pydantic SecretStr" in problem
    same = Holder(data={"v": [1, "x", None], "t": (1, 2)})
    assert read_back_problem(Holder, same, jsoncodec.to_jsonable(same), "output") is None


class Edit(BaseModel):
    ship_on: datetime.date
    at: datetime.datetime
    order: uuid.UUID
    note: str = ""


SCHEMA = Edit.model_json_schema()
GOOD = {"ship_on": "2024-05-01", "at": "2024-05-01T12:00:00+02:00", "order": str(uuid.UUID(int=7))}


@pytest.mark.parametrize(("field", "bad"), [("ship_on", "next tuesday"), ("at", "noon"), ("order", "not-a-uuid"),
                                            ("ship_on", "2024-02-30")])
def test_an_answer_is_checked_against_its_formats_as_pydantic_reads_them(field: str, bad: str) -> None:
    validate_answer(GOOD, SCHEMA)
    Edit.model_validate(GOOD)
    with pytest.raises(jsonschema.ValidationError, match="is not a"):
        validate_answer({**GOOD, field: bad}, SCHEMA)


def test_a_workflow_filter_no_row_can_hold_lists_no_runs(store_url: str) -> None:
    store = raysaga.open_store(store_url)
    try:
        assert store.list_runs(workflow="w\x00") == []
        assert store.list_runs(workflow="w\ud800") == []
    finally:
        store.close()
