"""A review of stop 49's refusal of unknown run-input keys (``orchestrator/input_keys.py``) found it
refusing what it must not (stop 50):

* a fork of a run whose input model has an alias or a computed field: the store keeps the input
  by field name with its computed fields (``{"label": ..., "order_id": 7}``), and the fork put that
  form through the check of a new input: "unknown keys 'label' and 'order_id' ... fork with the
  code the run started with", with that very code. (Before stop 49 the alias was silently reset
  to its default in the fork: 7 became 0.) A stored input is read as the steps read it now.
* a TypedDict key with a pydantic alias, which pydantic takes: "unknown key 'orderId'";
* the same ``raysaga run --run-id X --input ...`` that resumes a run an older raysaga recorded
  (its input had a key pydantic dropped): refused, and without the key "a different input";
* a fork's new run id starting with '-', which ``run`` and ``submit`` refuse: made.

Real inline runs on a real SQLite file.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Annotated, Any

import pytest
from pydantic import BaseModel, ConfigDict, Field, computed_field, with_config
from pydantic.alias_generators import to_camel
from typing_extensions import TypedDict

import raysaga
from raysaga import Workflow
from raysaga.errors import UserError
from raysaga.orchestrator.versions import step_hashes
from raysaga.state import NewRun, RunStatus, SqlStore


class Order(BaseModel):
    order_id: int = Field(0, alias="orderId")
    qty: int = 1

    @computed_field  # type: ignore[prop-decorator]
    @property
    def label(self) -> str:
        return f"order-{self.order_id}"


def _ordering() -> Workflow:
    wf = Workflow(f"stop50_order_{uuid.uuid4().hex[:6]}")

    @wf.step()
    def a(input: Order) -> str:
        return f"{input.label} x{input.qty}"

    @wf.step(after=["a"])
    def b(a: str) -> str:
        return a + "!"

    del b
    return wf


def test_a_run_whose_input_has_an_alias_and_a_computed_field_forks(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    wf = _ordering()
    parent = raysaga.run(wf, {"orderId": 7}, store=url, run_id="p", executor="inline")
    assert parent.status == RunStatus.COMPLETED and parent.input == {"label": "order-7", "order_id": 7, "qty": 1}
    fork = raysaga.fork(wf, "p", from_node="a", store=url, new_run_id="f", executor="inline")
    assert fork.status == RunStatus.COMPLETED, fork.status_reason
    assert fork.output == {"b": "order-7 x1!"}  # the alias's value kept (it was reset to 0 before stop 49)
    patched = raysaga.fork(wf, "p", from_node="a", store=url, new_run_id="g", executor="inline",
                           input_patch={"qty": 2})
    assert patched.status == RunStatus.COMPLETED and patched.output == {"b": "order-7 x2!"}, patched.output


class AliasedKey(TypedDict):
    order_id: Annotated[int, Field(alias="orderId")]


@with_config(ConfigDict(alias_generator=to_camel))
class GeneratedKey(TypedDict):
    order_id: int


@pytest.mark.parametrize("tp", [AliasedKey, GeneratedKey], ids=["field-alias", "alias-generator"])
def test_a_typeddict_key_given_by_its_alias_is_taken(tp: Any, tmp_path: Path) -> None:
    wf = Workflow(f"stop50_td_{uuid.uuid4().hex[:6]}")

    def only(input: Any) -> int:
        return int(input["order_id"])

    only.__annotations__ = {"input": tp, "return": int}
    wf.step()(only)
    run = raysaga.run(wf, {"orderId": 7}, store=f"sqlite:///{tmp_path / 's.db'}", executor="inline")
    assert run.status == RunStatus.COMPLETED and run.output == {"only": 7}
    if tp is AliasedKey:  # a misspelt key is still refused
        with pytest.raises(raysaga.errors.InvalidInputError, match="unknown key 'orderID'"):
            wf.check_input({"orderId": 7, "orderID": 8})


class Nightly(BaseModel):
    n: int
    delay: float = 0.5


def test_the_command_that_resumes_a_run_an_older_raysaga_recorded_still_resumes_it(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    wf = Workflow(f"stop50_nightly_{uuid.uuid4().hex[:6]}")

    @wf.step()
    def twice(input: Nightly) -> int:
        return input.n * 2

    del twice
    given = {"n": 2, "dealy": 0}  # an older raysaga took it (pydantic dropped "dealy") and stored the rest
    with pytest.raises(raysaga.errors.InvalidInputError, match="unknown key 'dealy'"):
        wf.check_input(given)
    store = SqlStore(url)
    try:
        store.create_run(NewRun(run_id="nightly-1", workflow_name=wf.name, workflow_version=wf.version,
                                definition_hash=wf.definition_hash, step_hashes=step_hashes(wf),
                                trace_id=uuid.uuid4().hex, input=wf.check_input({"n": 2})))
    finally:
        store.close()
    resumed = raysaga.run(wf, given, store=url, run_id="nightly-1", executor="inline")  # the same command
    assert resumed.status == RunStatus.COMPLETED and resumed.output == {"twice": 4}
    with pytest.raises(raysaga.errors.InvalidInputError, match="unknown key 'dealy'"):  # a new run: refused
        raysaga.run(wf, given, store=url, run_id="nightly-2", executor="inline")


def test_a_forks_run_id_starting_with_a_dash_is_refused(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    wf = _ordering()
    assert raysaga.run(wf, {"orderId": 1}, store=url, run_id="p", executor="inline").status == RunStatus.COMPLETED
    with pytest.raises(UserError, match="run id '-f' starts with '-'"):
        raysaga.fork(wf, "p", from_node="a", store=url, new_run_id="-f", executor="inline")
    store = SqlStore(url)
    try:
        assert [r.run_id for r in store.list_runs(limit=10)] == ["p"]  # nothing recorded
    finally:
        store.close()
