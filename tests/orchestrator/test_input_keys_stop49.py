"""A run input's keys that its type does not declare (review, stop 49).

``raysaga run slow.py:wf --input '{"n":2,"dealy":0,"txet":"hi"}'`` completed with the input
``{'delay': 0.5, 'n': 2, 'text': ''}``: pydantic's default (``extra`` unset: ignore) dropped both
misspelt keys without a word, and the run went on with the defaults. Now such a key is refused
with ``InvalidInputError`` naming it, the keys its type declares and the closest one, before
anything runs or is recorded, from the CLI (``run``, ``submit``) and the Python API (``run``,
``create_run``, ``Client.submit``), at any depth (a list's models, a dict's, a TypedDict's, the
branch of a union pydantic chose). A model (a TypedDict) that sets ``extra`` itself keeps its
behaviour, as does one whose ``mode="before"`` validator may rename keys. Real SQLite stores, and
PostgreSQL for the API's paths.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any, NotRequired

import pytest
from pydantic import BaseModel, ConfigDict, Field, model_validator, with_config
from typing_extensions import TypedDict

import raysaga
from raysaga import Client, Workflow
from raysaga.errors import InvalidInputError
from raysaga.state import SqlStore
from tests.support.cli import invoke, one_line_error, project_folder

MODULE = "input_keys_stop49_flow"
FLOW = textwrap.dedent('''
    from pathlib import Path

    from pydantic import BaseModel

    from raysaga import Workflow

    wf = Workflow("input_keys_stop49")
    RAN = Path(__file__).with_name("ran")

    class In(BaseModel):
        n: int = 5
        delay: float = 0.5
        text: str = ""

    @wf.step()
    def plan(input: In) -> str:
        RAN.write_text("ran")
        return input.text
''')


def _runs(url: str) -> list[str]:
    store = SqlStore(url)
    try:
        return [r.run_id for r in store.list_runs()]
    finally:
        store.close()


def test_cli_run_and_submit_refuse_a_misspelt_key_naming_the_fields_and_the_closest(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = project_folder(tmp_path, monkeypatch, MODULE, FLOW)
    db = str(tmp_path / "s.db")
    for verb, extra in (("run", ("--executor", "inline")), ("submit", ())):
        code, _out, err = invoke(verb, f"{MODULE}:wf", "--input", '{"n":2,"dealy":0,"txet":"hi"}', "--db", db,
                                 *extra)
        one_line_error(code, err, "unknown keys 'dealy' (did you mean 'delay'?) and 'txet' (did you mean 'text'?), "
                                  "where In declares n, delay, text")
        assert "set extra on In" in err and 'extra="ignore"' in err
        assert not (folder / "ran").exists()  # nothing ran
        assert _runs(f"sqlite:///{db}") == []  # nothing recorded
    code, out, err = invoke("run", f"{MODULE}:wf", "--input", '{"n":2,"delay":0,"text":"hi"}', "--db", db,
                            "--executor", "inline")
    assert code == 0 and "completed" in out, err


class Line(BaseModel):
    sku: str
    qty: int = 1


class Order(BaseModel):
    lines: list[Line]
    by_sku: dict[str, Line] = {}
    gift: Line | None = None


class Loose(BaseModel):
    model_config = ConfigDict(extra="allow")
    a: int = 0


class Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore")  # set on purpose: unknown keys are dropped
    a: int = 0


class LenientChild(Lenient):
    b: int = 0


class Aliased(BaseModel):
    order_id: int = Field(0, alias="orderId")


class Renamed(BaseModel):
    a: int = 0

    @model_validator(mode="before")
    @classmethod
    def _old_name(cls, value: Any) -> Any:
        return {"a": value.pop("old")} if isinstance(value, dict) and "old" in value else value


class Card(TypedDict):
    number: str
    line: NotRequired[Line]


@with_config(ConfigDict(extra="ignore"))
class LenientCard(TypedDict):
    number: str


class Cat(BaseModel):
    meow: int = 0


class Dog(BaseModel):
    woof: int = 0


def _wf(tp: Any, name: str) -> Workflow:
    """A workflow whose one step declares its input as ``tp``."""
    wf = Workflow(name)

    def only(input: Any) -> int:
        return 1

    only.__annotations__ = {"input": tp, "return": int}  # (a parameter's type, not a name in this module)
    wf.step()(only)
    return wf


@pytest.mark.parametrize(("tp", "given", "refused"), [
    (Order, {"lines": [{"sku": "a"}, {"sku": "b", "qtty": 3}]},
     "lines.1: unknown key 'qtty' (did you mean 'qty'?), where Line declares sku, qty"),
    (Order, {"lines": [], "by_sku": {"x": {"sku": "b", "qyt": 1}}}, "by_sku.x: unknown key 'qyt'"),
    (Order, {"lines": [], "gift": {"sku": "b", "kty": 1}}, "gift: unknown key 'kty'"),
    (Order, {"lines": [], "gfit": None}, "unknown key 'gfit' (did you mean 'gift'?), where Order declares"),
    (Aliased, {"order_id": 7}, "unknown key 'order_id' (did you mean 'orderId'?), where Aliased declares orderId"),
    (Card, {"number": "1", "nubmer": "2"}, "unknown key 'nubmer' (did you mean 'number'?), where Card declares"),
    (Card, {"number": "1", "line": {"sku": "a", "qyt": 2}}, "line: unknown key 'qyt'"),
    (list[Line], [{"sku": "a", "Qty": 2}], "0: unknown key 'Qty' (did you mean 'qty'?)"),
    (Cat | Dog, {"woof": 1, "bark": 2}, "unknown key 'bark', where Dog declares woof"),  # the branch pydantic chose
])
def test_a_key_the_type_does_not_declare_is_refused_at_any_depth(tp: Any, given: Any, refused: str) -> None:
    with pytest.raises(InvalidInputError) as caught:
        _wf(tp, "keys_stop49").check_input(given)
    assert refused in str(caught.value)


@pytest.mark.parametrize(("tp", "given", "stored"), [
    (Loose, {"a": 1, "b": 2}, {"a": 1, "b": 2}),  # extra="allow": kept
    (Lenient, {"a": 1, "b": 2}, {"a": 1}),  # extra="ignore" set on purpose: dropped, as before
    (LenientChild, {"a": 1, "c": 2}, {"a": 1, "b": 0}),  # (inherited)
    (Aliased, {"orderId": 7}, {"order_id": 7}),
    (Renamed, {"old": 3}, {"a": 3}),  # a validator that may rename keys: left to it
    (LenientCard, {"number": "1", "x": 2}, {"number": "1"}),
    (dict[str, Any], {"any": 1}, {"any": 1}),
])
def test_a_type_that_sets_extra_or_renames_keys_keeps_its_behaviour(tp: Any, given: Any, stored: Any) -> None:
    assert _wf(tp, "keys_kept_stop49").check_input(given) == stored


def test_the_python_api_refuses_before_anything_runs_or_is_recorded(own_store_url: str) -> None:
    ran: list[int] = []
    wf = Workflow("input_keys_api_stop49")

    @wf.step()
    def only(input: Order) -> int:
        ran.append(1)
        return len(input.lines)

    bad = {"lines": [{"sku": "a", "qtty": 3}]}
    with pytest.raises(InvalidInputError, match=r"lines\.0: unknown key 'qtty'"):
        raysaga.run(wf, bad, store=own_store_url, executor="inline")
    with pytest.raises(InvalidInputError, match="unknown key 'qtty'"):
        raysaga.create_run(wf, bad, store=own_store_url)
    with Client(own_store_url) as client, pytest.raises(InvalidInputError, match="unknown key 'qtty'"):
        client.submit(wf, bad)
    assert ran == [] and _runs(own_store_url) == []
    done = raysaga.run(wf, {"lines": [{"sku": "a", "qty": 3}]}, store=own_store_url, executor="inline")
    assert done.output == {"only": 1} and ran == [1]
