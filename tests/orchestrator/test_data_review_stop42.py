"""Data path review (stop 42): a value was checked as a Python object where it was made, but its
JSON form, what the next step reads, was never checked.

What was wrong, each now refused where the value is made or read back as it was made:

* a model with field aliases (or a ``computed_field`` under ``extra="forbid"``) was stored by field
  name and read back by alias: the next step failed, the step's own compensation failed, the run
  ended ``compensation_failed`` with the charge never refunded; a run input with an alias the same;
* a step declared ``-> Refund | Charge`` returning a ``Charge`` handed the next step a ``Refund``;
* a model's ``Any`` field holding a set, bytes, a datetime, a ``Decimal`` or an int-keyed dict
  reached the next step as a list, a str...; a ``SecretStr`` as its mask, used as the credential;
* an input declared ``dict[str, Any]`` holding what an untyped input refuses was converted;
* a BEST_EFFORT fan-out whose items returned values of the deepest accepted depth crashed every
  drive (the parent's ``FanOutResult`` nests each output three levels deeper), the run stuck;
* an approval answer breaking its model's ``format`` rules (a date, a UUID) was accepted;
* ``on_failure="pass"`` with a typed dependent failed that dependent for good at run time;
* an approval's ``Ask`` above 1 MiB failed whatever ``max_output_bytes`` said, advising to raise it;
* ``Ask("prompt")`` (as docs/api.md writes it) raised ``TypeError``;
* a compensation's input error named "the output of step 'output'".
"""

from __future__ import annotations

import datetime
import decimal
import uuid
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict, Field, SecretStr, computed_field

import raysaga
from raysaga import BEST_EFFORT, Approval, Ask, Client, Permanent, RunOptions, RunStatus, Workflow
from raysaga.errors import InvalidInputError, UserError, WorkflowDefinitionError
from raysaga.orchestrator import task
from raysaga.state import NodeRecord, NodeStatus, jsoncodec
from raysaga.types import StepFailed


class Order(BaseModel):
    order_id: str = Field(alias="orderId")


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")
    a: int

    @computed_field  # type: ignore[prop-decorator]
    @property
    def double(self) -> int:
        return 2 * self.a


class Creds(BaseModel):
    user: str
    api_key: SecretStr


class Other(BaseModel):
    other: int


def _nodes(store_url: str, run_id: str) -> dict[str, NodeRecord]:
    store = raysaga.open_store(store_url)
    try:
        return {n.node_id if n.fan_index < 0 else f"{n.node_id}[{n.fan_index}]": n for n in store.nodes(run_id)}
    finally:
        store.close()


def _message(node: NodeRecord) -> str:
    return "" if node.error is None else str(node.error["message"])


class Charge(BaseModel):
    charge_id: str = Field(alias="chargeId")
    amount: int


def test_an_aliased_model_reaches_the_next_step_and_the_compensation(store_url: str) -> None:
    refunded: list[str] = []
    wf = Workflow("stop42_alias_saga")

    def refund(output: Charge) -> None:
        refunded.append(output.charge_id)

    @wf.step(effect=True, compensate=refund)
    def charge(input: dict[str, int]) -> Charge:
        return Charge(chargeId="ch_1", amount=input["amount"])

    @wf.step()
    def receipt(charge: Charge) -> str:
        raise Permanent(f"printer jammed for {charge.charge_id}")  # read fine: the rollback runs

    record = raysaga.run(wf, {"amount": 500}, store=store_url, executor="inline")
    assert record.status == RunStatus.COMPENSATED, record.status_reason
    nodes = _nodes(store_url, record.run_id)
    assert nodes["charge"].output == {"charge_id": "ch_1", "amount": 500}  # by name, read by name and alias
    assert "printer jammed for ch_1" in _message(nodes["receipt"])
    assert refunded == ["ch_1"]


def test_a_run_input_with_an_alias_is_read_by_its_step(store_url: str) -> None:
    wf = Workflow("stop42_alias_input")

    @wf.step()
    def first(input: Order) -> str:
        return input.order_id

    record = raysaga.run(wf, {"orderId": "o-1"}, store=store_url, executor="inline")
    assert record.status == RunStatus.COMPLETED, record.status_reason
    assert record.input == {"order_id": "o-1"}  # stored by name (as raysaga always did), read by either
    assert record.output == {"first": "o-1"}


def test_a_computed_field_under_extra_forbid_is_left_out_of_the_stored_form(store_url: str) -> None:
    wf = Workflow("stop42_computed")

    @wf.step()
    def make() -> Strict:
        return Strict(a=2)

    @wf.step()
    def use(make: Strict) -> int:
        return make.double

    record = raysaga.run(wf, None, store=store_url, executor="inline")
    assert record.status == RunStatus.COMPLETED, record.status_reason
    assert record.output == {"use": 4}
    assert _nodes(store_url, record.run_id)["make"].output == {"a": 2}


class Refund(BaseModel):
    amount: int
    reason: str = ""


class Paid(BaseModel):
    amount: int


def test_a_union_member_its_json_form_cannot_tell_apart_fails_the_step_that_returned_it(store_url: str) -> None:
    seen: list[str] = []
    wf = Workflow("stop42_union")

    @wf.step()
    def money() -> Refund | Paid:
        return Paid(amount=500)

    @wf.step()
    def act(money: Refund | Paid) -> str:
        seen.append(type(money).__name__)
        return type(money).__name__

    record = raysaga.run(wf, None, store=store_url, executor="inline")
    assert record.status == RunStatus.FAILED
    node = _nodes(store_url, record.run_id)["money"]
    assert node.status == NodeStatus.FAILED and node.error is not None
    assert node.error["type"] == "OutputTypeError" and node.error["transient"] is False
    assert "is a Paid but its JSON form reads back as a Refund" in _message(node)
    assert "discriminator" in _message(node)
    assert seen == []  # nothing downstream ran with the wrong member


class Report(BaseModel):
    data: dict[str, Any]


@pytest.mark.parametrize(("value", "words"), [
    ({1: "one"}, "has key 1 of type int"),
    ({1, 2}, "(set) but its JSON form reads back as [1, 2] (list)"),
    (b"abc", "(bytes) but its JSON form reads back as 'abc' (str)"),
    (datetime.datetime(2020, 1, 2, tzinfo=datetime.UTC), "(datetime) but its JSON form reads back as"),
    (decimal.Decimal("1.10"), "(Decimal) but its JSON form reads back as '1.10' (str)"),
    # a model (its reader gets the dict it dumps to): its own fields are what must read back
    (Report(data={"s": {1}}), ".data['s'] is {1} (set) but its JSON form reads back as [1] (list)"),
], ids=["int_key", "set", "bytes", "datetime", "decimal", "model"])
def test_an_any_field_whose_value_json_changes_fails_the_step(sqlite_url: str, value: Any, words: str) -> None:
    wf = Workflow("stop42_any")

    @wf.step()
    def produce() -> Report:
        return Report(data={"v": value})

    record = raysaga.run(wf, None, store=sqlite_url, executor="inline")
    assert record.status == RunStatus.FAILED
    message = _message(_nodes(sqlite_url, record.run_id)["produce"])
    assert "step 'produce' returned a value its stored JSON form does not keep: output.data['v']" in message
    assert words in message


def test_an_undeclared_model_return_is_read_back_as_its_own_type(sqlite_url: str) -> None:
    wf = Workflow("stop42_any_undeclared")

    @wf.step()
    def produce():  # type: ignore[no-untyped-def]  # no annotation: the model's own type reads it back
        return Report(data={"v": {1, 2}})

    record = raysaga.run(wf, None, store=sqlite_url, executor="inline")
    assert record.status == RunStatus.FAILED
    assert "output.data['v'] is {1, 2} (set)" in _message(_nodes(sqlite_url, record.run_id)["produce"])


def test_json_values_and_tuples_in_an_any_field_pass(sqlite_url: str) -> None:
    wf = Workflow("stop42_any_ok")

    @wf.step()
    def produce() -> Report:
        return Report(data={"v": (1, 2), "w": {"a": [1.5, None, "x", True]}})

    @wf.step()
    def consume(produce: Report) -> Any:
        return produce.data

    record = raysaga.run(wf, None, store=sqlite_url, executor="inline")
    assert record.status == RunStatus.COMPLETED, record.status_reason
    assert record.output == {"consume": {"v": [1, 2], "w": {"a": [1.5, None, "x", True]}}}


def test_a_secretstr_in_an_output_fails_the_step_instead_of_storing_its_mask(store_url: str) -> None:
    used: list[str] = []
    wf = Workflow("stop42_secretstr")

    @wf.step()
    def login() -> Creds:
        return Creds(user="u", api_key=SecretStr("real-key-123456"))

    @wf.step()
    def call(login: Creds) -> None:
        used.append(login.api_key.get_secret_value())

    record = raysaga.run(wf, None, store=store_url, executor="inline")
    assert record.status == RunStatus.FAILED
    node = _nodes(store_url, record.run_id)["login"]
    assert node.output is None
    assert "output.api_key is a pydantic SecretStr" in _message(node) and "raysaga.Secret" in _message(node)
    assert used == []


@pytest.mark.parametrize(("value", "words"), [
    ({"by_id": {1: "one"}}, "input['by_id'] has key 1 of type int: keys must be str"),
    ({"when": datetime.datetime(2024, 5, 1)}, "input['when'] is a datetime"),
    ({"tags": {"a"}}, "input['tags'] is a set"),
    ({"raw": b"\x01"}, "input['raw'] is a bytes"),
], ids=["int_key", "datetime", "set", "bytes"])
def test_an_input_declared_dict_of_any_is_refused_as_an_untyped_one_is(sqlite_url: str, value: Any,
                                                                         words: str) -> None:
    wf = Workflow("stop42_input_any")

    @wf.step()
    def first(input: dict[str, Any]) -> str:
        return repr(input)

    with pytest.raises(InvalidInputError, match=words.replace("[", r"\[").replace("]", r"\]")):
        raysaga.run(wf, value, store=sqlite_url, executor="inline")


def _deep(levels: int) -> Any:
    value: Any = 1
    for _ in range(levels - 1):
        value = [value]
    return value


def _deep_fanout(name: str, calls: list[int]) -> Workflow:
    wf = Workflow(name)

    @wf.step()
    def plan() -> list[int]:
        return [0, 1]

    @wf.map("plan", policy=BEST_EFFORT)
    def each(plan: int) -> list[Any]:
        calls.append(plan)
        return list(_deep(jsoncodec.MAX_DEPTH))

    @wf.step()
    def join(each: Any) -> int:
        return len(each["successes"])

    return wf


def test_fanout_items_too_deep_for_their_step_result_fail_as_items(store_url: str) -> None:
    calls: list[int] = []
    wf = _deep_fanout("stop42_deep_items", calls)
    record = raysaga.run(wf, None, store=store_url, executor="inline")
    assert record.status == RunStatus.COMPLETED, record.status_reason
    assert record.output == {"join": 0}
    nodes = _nodes(store_url, record.run_id)
    for item in ("each[0]", "each[1]"):
        assert nodes[item].status == NodeStatus.FAILED
        assert "counting the 3 levels its fan-out's result" in _message(nodes[item])
    assert sorted(calls) == [0, 1]
    again = raysaga.resume(wf, record.run_id, store=store_url, executor="inline")
    assert again.status == RunStatus.COMPLETED and sorted(calls) == [0, 1]


def test_a_write_the_store_refuses_at_commit_parks_the_run_naming_the_node(
        store_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The driver's last line: a value made from checked parts that the commit still refuses."""
    monkeypatch.setattr(task, "ITEM_NESTING", 0)  # items pass as before; the parent's result cannot be stored
    calls: list[int] = []
    wf = _deep_fanout("stop42_unstorable", calls)
    record = raysaga.run(wf, None, store=store_url, executor="inline")  # raised NotJSONableError
    assert record.status == RunStatus.FAILED
    assert record.status_reason is not None and "the output of node 'each' cannot be stored" in record.status_reason
    assert record.error is not None and record.error["node"] == "each"
    again = raysaga.resume(wf, record.run_id, store=store_url, executor="inline")  # raised again, re-ran items
    assert again.status == RunStatus.FAILED
    assert sorted(calls) == [0, 1]


class Edit(BaseModel):
    ship_on: datetime.date
    at: datetime.datetime
    order: uuid.UUID


def _approval_flow(name: str) -> Workflow:
    wf = Workflow(name)

    @wf.approval(answer=Edit)
    def review() -> Ask:
        return Ask("ship it?", {"n": 1})  # positional, as docs/api.md writes it

    @wf.step()
    def ship(review: Approval) -> str:
        return str(Edit.model_validate(review.answer).ship_on)

    return wf


@pytest.mark.parametrize(("answer", "where", "fmt"), [
    ({"ship_on": "next tuesday", "at": "2024-05-01T12:00:00Z", "order": str(uuid.UUID(int=1))}, "ship_on", "date"),
    ({"ship_on": "2024-05-01", "at": "noon", "order": str(uuid.UUID(int=1))}, "at", "date-time"),
    ({"ship_on": "2024-05-01", "at": "2024-05-01T12:00:00Z", "order": "not-a-uuid"}, "order", "uuid"),
], ids=["date", "date-time", "uuid"])
def test_an_answer_breaking_its_models_formats_is_refused(store_url: str, answer: dict[str, str], where: str,
                                                          fmt: str) -> None:
    wf = _approval_flow("stop42_answer_format")
    record = raysaga.run(wf, None, store=store_url, executor="inline")
    assert record.status == RunStatus.WAITING_HUMAN
    client = Client(store_url)
    try:
        with pytest.raises(UserError, match=f"does not fit its schema at {where}: .* is not a '{fmt}'"):
            client.approve(record.run_id, "review", by="ada", answer=answer)
        client.approve(record.run_id, "review", by="ada",  # the decision was not used up
                       answer={"ship_on": "2024-05-01", "at": "2024-05-01T12:00:00Z", "order": str(uuid.UUID(int=1))})
    finally:
        client.close()
    done = raysaga.resume(wf, record.run_id, store=store_url, executor="inline")
    assert done.status == RunStatus.COMPLETED and done.output == {"ship": "2024-05-01"}


class Enrichment(BaseModel):
    score: float


def test_a_typed_dependent_of_a_pass_step_is_refused_where_it_is_defined() -> None:
    wf = Workflow("stop42_pass_typed")

    @wf.step(critical=False, on_failure="pass")
    def enrich() -> Enrichment:
        raise Permanent("down")

    @wf.step()
    def decide(enrich: Enrichment) -> str:
        return "x"

    with pytest.raises(WorkflowDefinitionError, match=r"annotate the parameter Enrichment \| StepFailed"):
        wf.validate()


def test_a_dependent_of_a_pass_step_reads_the_step_failed_record(store_url: str) -> None:
    wf = Workflow("stop42_pass_record")

    @wf.step(critical=False, on_failure="pass")
    def enrich() -> Enrichment:
        raise Permanent("enrichment service down")

    @wf.step()
    def decide(enrich: Enrichment | StepFailed) -> str:
        return f"without ({enrich.message})" if isinstance(enrich, StepFailed) else "with"

    record = raysaga.run(wf, None, store=store_url, executor="inline")
    assert record.status == RunStatus.COMPLETED, record.status_reason
    assert record.output == {"decide": "without (enrichment service down)"}


def _big_ask() -> Workflow:
    wf = Workflow("stop42_ask_cap")

    @wf.step()
    def draft() -> str:
        return "w" * (600 * 1024)

    @wf.approval()
    def review(draft: str) -> Ask:  # a payload of 1.2 MB
        return Ask(prompt="approve the drafts?", payload={"first": draft, "second": draft})

    return wf


def test_an_approval_request_is_capped_by_the_runs_max_output_bytes(sqlite_url: str) -> None:
    big = raysaga.run(_big_ask(), None, store=sqlite_url, executor="inline",
                      options=RunOptions(max_output_bytes=64 * 1024 * 1024))
    assert big.status == RunStatus.WAITING_HUMAN, big.status_reason  # failed: the cap was a fixed 1 MiB
    capped = raysaga.run(_big_ask(), None, store=sqlite_url, executor="inline",
                         options=RunOptions(max_output_bytes=1024 * 1024))
    assert capped.status == RunStatus.FAILED
    message = _message(_nodes(sqlite_url, capped.run_id)["review"])
    assert "request (the Ask: prompt and payload) of approval 'review' is " in message
    assert "above the cap of 1048576" in message


def test_ask_takes_its_prompt_and_payload_by_position() -> None:
    assert Ask("Refund 500 cents?", {"order": "o-1"}) == Ask(prompt="Refund 500 cents?", payload={"order": "o-1"})
    assert Ask("ok?").payload is None


def test_a_compensation_that_cannot_read_its_output_names_its_step(sqlite_url: str) -> None:
    wf = Workflow("stop42_undo_name")

    def undo(output: Other) -> None:
        pass

    @wf.step(effect=True, compensate=undo)
    def pay() -> dict[str, int]:
        return {"amount": 1}

    @wf.step()
    def boom(pay: dict[str, int]) -> None:
        raise Permanent("boom")

    record = raysaga.run(wf, None, store=sqlite_url, executor="inline")
    assert record.status == RunStatus.COMPENSATION_FAILED
    message = _message(_nodes(sqlite_url, record.run_id)["pay:compensate"])
    assert "cannot read the output of step 'pay' as Other" in message
