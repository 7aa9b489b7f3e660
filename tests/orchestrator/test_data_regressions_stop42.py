"""Regressions of the data-path change (2c5638e), which dumped every pydantic value one way (by alias)
and read declared types' JSON forms back where they were made. What went wrong:

* an approval whose ``Ask`` payload is a model (or holds models) failed its step: a model in an
  ``Any`` field reads back as a dict, which was taken for a silent change (it is what its reader gets);
* a model with ``Field(serialization_alias=...)`` (camelCase output) was refused everywhere: dumped
  by that alias, which pydantic never reads. A tool taking one was never called (its stored
  arguments did not validate), silently; an agent's output_type with one gave no acceptable answer;
* a validator raising something other than ``ValueError`` on the read-back escaped: an agent's run
  stayed ``running`` with every resume raising, a run input raised a raw ``AttributeError``;
* a subclass of the declared model was refused as if it were a union read as another member;
* a model inside a plain list or dict result still changed silently (an int key became a str);
* a ``Field(exclude=True)`` holding a value was refused with advice about JSON types;
* a tool call's arguments, and so an effect tool's idempotency key, changed form for a parameter
  model with an alias and ``populate_by_name``: a call in flight across the upgrade would get a new
  key and could run twice.
"""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Any

import pytest
from pydantic import BaseModel, ConfigDict, Field, computed_field, field_serializer, field_validator

import raysaga
from raysaga import Approval, Ask, Client, RunStatus, Workflow
from raysaga.agents import Agent, tool
from raysaga.errors import InvalidInputError
from raysaga.orchestrator.keys import effect_key
from raysaga.testing import ScriptedModel, text_reply, tool_reply


def _messages(url: str, run_id: str) -> list[str]:
    store = raysaga.open_store(url)
    try:
        return [n.error.message or "" for n in store.nodes(run_id) if n.error]
    finally:
        store.close()


class Order(BaseModel):
    id: str
    amount: int
    when: dt.datetime = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)


@pytest.mark.parametrize("shape", ["model", "dict_of_model", "list_of_models"])
def test_an_approval_asking_about_a_model_waits_for_its_decision(sqlite_url: str, shape: str) -> None:
    wf = Workflow(f"reg42_ask_{shape}")

    @wf.step()
    def plan() -> Order:
        return Order(id="o1", amount=5)

    @wf.approval()
    def review(plan: Order) -> Ask:
        payload: Any = {"model": plan, "dict_of_model": {"order": plan}, "list_of_models": [plan, plan]}[shape]
        return Ask("Refund 500 cents?", payload)

    @wf.step()
    def ship(review: Approval) -> str:
        return "shipped" if review.approved else "no"

    record = raysaga.run(wf, None, store=sqlite_url, executor="inline")
    assert record.status == RunStatus.WAITING_HUMAN, (record.status_reason, _messages(sqlite_url, record.run_id))
    client = Client(sqlite_url)
    try:
        client.approve(record.run_id, "review", by="ada")
    finally:
        client.close()
    done = raysaga.resume(wf, record.run_id, store=sqlite_url, executor="inline")
    assert done.status == RunStatus.COMPLETED and done.output == {"ship": "shipped"}


class Holder(BaseModel):
    data: Any


class Tagged(BaseModel):
    tags: Any


def test_a_model_held_by_an_any_field_is_still_checked_for_its_own_fields(sqlite_url: str) -> None:
    wf = Workflow("reg42_any_nested")

    @wf.step()
    def made() -> Holder:
        return Holder(data=[Order(id="o1", amount=1), Tagged(tags={"x"})])  # the first is fine, the set is not

    record = raysaga.run(wf, None, store=sqlite_url, executor="inline")
    assert record.status == RunStatus.FAILED
    assert any("output.data[1].tags is {'x'} (set)" in m for m in _messages(sqlite_url, record.run_id))


class CamelOut(BaseModel):
    order_id: str = Field(serialization_alias="orderId")


class Total(BaseModel):
    total_cents: int = Field(serialization_alias="totalCents")


@pytest.mark.parametrize("typed_reader", [True, False], ids=["typed", "untyped"])
def test_a_model_with_a_serialization_alias_passes_from_step_to_step(sqlite_url: str, typed_reader: bool) -> None:
    wf = Workflow(f"reg42_ser_alias_{typed_reader}")

    @wf.step()
    def a() -> CamelOut:
        return CamelOut(order_id="o1")

    if typed_reader:
        @wf.step()
        def b(a: CamelOut) -> str:
            return a.order_id
    else:
        @wf.step()
        def b(a):  # type: ignore[no-untyped-def]  # (an unannotated reader: it gets the stored dict)
            return a["order_id"]

    record = raysaga.run(wf, None, store=sqlite_url, executor="inline")
    assert record.status == RunStatus.COMPLETED, record.status_reason
    assert record.output == {"b": "o1"}


def test_a_run_input_with_a_serialization_alias_is_accepted(sqlite_url: str) -> None:
    wf = Workflow("reg42_ser_alias_input")

    @wf.step()
    def a(input: CamelOut) -> str:
        return input.order_id

    record = raysaga.run(wf, CamelOut(order_id="o1"), store=sqlite_url, executor="inline")
    assert record.status == RunStatus.COMPLETED and record.output == {"a": "o1"}


def test_an_agent_output_type_with_a_serialization_alias_is_an_answer(sqlite_url: str) -> None:
    wf = Workflow("reg42_ser_alias_agent")

    @wf.agent(Agent("a", ScriptedModel({"go": [text_reply('{"total_cents": 3}')]}), output_type=Total))
    def ask(input: Any) -> str:
        return "go"

    @wf.step()
    def after(ask: Total) -> int:
        return ask.total_cents

    record = raysaga.run(wf, {}, store=sqlite_url, executor="inline")
    assert record.status == RunStatus.COMPLETED, record.status_reason
    assert record.output == {"after": 3}


def test_a_tool_taking_a_model_with_a_serialization_alias_is_called(sqlite_url: str) -> None:
    called: list[str] = []

    @tool
    def lookup(q: CamelOut) -> dict[str, str]:
        """Look an order up."""
        called.append(q.order_id)
        return {"id": q.order_id}

    wf = Workflow("reg42_ser_alias_tool")
    model = ScriptedModel({"go": [tool_reply(("lookup", {"q": {"order_id": "o1"}})), text_reply("done")]})

    @wf.agent(Agent("a", model, tools=(lookup,)))
    def ask(input: Any) -> str:
        return "go"

    record = raysaga.run(wf, {}, store=sqlite_url, executor="inline")
    assert record.status == RunStatus.COMPLETED, record.status_reason
    assert called == ["o1"]  # (it was never called: "invalid arguments for lookup: q.order_id: Field required")


class Wrapped(BaseModel):
    n: int

    @field_validator("n", mode="before")
    @classmethod
    def unwrap(cls, v: Any) -> Any:
        return v["value"]  # a raw API payload {"value": 3}: a TypeError on its own JSON form (an int)


def test_an_agent_output_validator_raising_on_its_json_form_fails_the_step(sqlite_url: str) -> None:
    wf = Workflow("reg42_agent_validator")
    model = ScriptedModel({"go": [text_reply('{"n": {"value": 3}}')] * 3})

    @wf.agent(Agent("a", model, output_type=Wrapped))
    def ask(input: Any) -> str:
        return "go"

    record = raysaga.run(wf, {}, store=sqlite_url, executor="inline")  # raised TypeError, left running
    assert record.status == RunStatus.FAILED
    assert any("TypeError in a validator" in m for m in _messages(sqlite_url, record.run_id))


class Event(BaseModel):
    when: dt.datetime

    @field_validator("when", mode="before")
    @classmethod
    def utc(cls, v: Any) -> Any:
        if isinstance(v, dt.datetime):
            return v if v.tzinfo else v.replace(tzinfo=dt.UTC)
        return v.isoformat()  # an AttributeError on the JSON form, a str


def test_a_run_input_validator_raising_on_its_json_form_is_an_invalid_input(sqlite_url: str) -> None:
    wf = Workflow("reg42_input_validator")

    @wf.step()
    def a(input: Event) -> str:
        return str(input.when)

    with pytest.raises(InvalidInputError, match="AttributeError in a validator"):  # a raw AttributeError
        raysaga.run(wf, Event(when=dt.datetime(2024, 1, 1)), store=sqlite_url, executor="inline")


class Base(BaseModel):
    a: int


class Derived(Base):
    b: int = 2


def test_a_subclass_of_the_declared_model_is_read_as_the_declared_model(sqlite_url: str) -> None:
    wf = Workflow("reg42_subclass")

    @wf.step()
    def a() -> Base:
        return Derived(a=1, b=3)

    @wf.step()
    def b(a: Base) -> str:
        return f"{type(a).__name__}:{a.a}"

    record = raysaga.run(wf, None, store=sqlite_url, executor="inline")
    assert record.status == RunStatus.COMPLETED, record.status_reason
    assert record.output == {"b": "Base:1"}


class Loose(BaseModel):
    data: Any


@pytest.mark.parametrize("shape", ["list", "dict"])
def test_a_model_in_a_plain_list_or_dict_is_read_back_where_it_is_made(sqlite_url: str, shape: str) -> None:
    wf = Workflow(f"reg42_plain_{shape}")

    @wf.step()
    def a() -> Any:
        made = Loose(data={1: "one"})
        return [made] if shape == "list" else {"r": made}

    @wf.step()
    def b(a: Any) -> str:  # got [{'data': {'1': 'one'}}], silently
        return repr(a)

    record = raysaga.run(wf, None, store=sqlite_url, executor="inline")
    assert record.status == RunStatus.FAILED
    where = "[0]" if shape == "list" else "['r']"
    assert any(f"{where}.data has key 1 of type int" in m for m in _messages(sqlite_url, record.run_id))


class Cached(BaseModel):
    a: int
    cache: str = Field(default="", exclude=True)


def test_an_excluded_field_holding_a_value_is_named_as_excluded(sqlite_url: str) -> None:
    wf = Workflow("reg42_exclude")

    @wf.step()
    def a() -> Cached:
        return Cached(a=1, cache="c")

    record = raysaga.run(wf, None, store=sqlite_url, executor="inline")
    assert record.status == RunStatus.FAILED
    messages = _messages(sqlite_url, record.run_id)
    assert any("output.cache is excluded from the dump (Field(exclude=True))" in m for m in messages), messages


class Camel(BaseModel):
    model_config = ConfigDict(populate_by_name=True)
    order_id: str = Field(alias="orderId")


class Money(BaseModel):
    cents: int

    @computed_field  # type: ignore[prop-decorator]
    @property
    def euros(self) -> float:
        return self.cents / 100


def test_an_effect_tools_idempotency_key_keeps_its_form_across_the_upgrade() -> None:
    @tool(effect=True)
    def refund(order: Camel, amount: Money) -> str:
        """Refund an order."""
        return order.order_id

    sent = {"order": {"orderId": "o1"}, "amount": {"cents": 500}}  # what the model sends (the schema's alias)
    before = refund.input_model.model_validate(sent).model_dump(mode="json")  # the form keyed before 2c5638e
    assert refund.validate(sent) == before == {"order": {"order_id": "o1"}, "amount": {"cents": 500, "euros": 5.0}}
    key = effect_key("run-1", "ask", -1, "tool:refund", refund.key_args(refund.validate(sent)))
    assert key == effect_key("run-1", "ask", -1, "tool:refund", before)
    typed = refund.typed(refund.validate(sent))  # and the form reads back as the call's arguments
    assert typed == {"order": Camel.model_validate({"order_id": "o1"}), "amount": Money(cents=500)}


class Shown(BaseModel):
    name: str
    cents: int = 0

    @field_serializer("name")
    def upper(self, v: str) -> str:
        return v.upper()  # display formatting: the stored form no longer reads back as the value


class Priced(BaseModel):
    cents: int

    @field_serializer("cents")
    def dollars(self, v: int) -> str:
        return f"${v / 100:.2f}"


@pytest.mark.parametrize(("made", "words"), [
    (Shown(name="ab"), "output.name is written by its @field_serializer 'upper' as a form it does not read back"),
    (Priced(cents=150), "written by a serializer: Priced.cents (dollars)"),
], ids=["changed", "unreadable"])
def test_a_one_way_field_serializer_is_named_in_the_refusal(sqlite_url: str, made: BaseModel, words: str) -> None:
    wf = Workflow(f"reg42_serializer_{type(made).__name__}")

    def a() -> Any:
        return made

    a.__annotations__ = {"return": type(made)}
    wf.step()(a)
    record = raysaga.run(wf, None, store=sqlite_url, executor="inline")
    assert record.status == RunStatus.FAILED  # (was: "store a JSON value (str, number...)", no serializer named)
    messages = _messages(sqlite_url, record.run_id)
    assert any(words in m for m in messages), messages


class External(BaseModel):
    order_id: str = Field(validation_alias="orderId")  # parses an external payload; dumped by name


def test_a_tool_taking_a_model_with_only_a_validation_alias_is_called(sqlite_url: str) -> None:
    called: list[str] = []

    @tool
    def fetch(q: External) -> dict[str, str]:
        """Fetch an order."""
        called.append(q.order_id)
        return {"id": q.order_id}

    assert "orderId" in fetch.definition()["input_schema"]["$defs"]["External"]["properties"]
    wf = Workflow("reg42_val_alias_tool")
    model = ScriptedModel({"go": [tool_reply(("fetch", {"q": {"orderId": "o1"}})), text_reply("done")]})

    @wf.agent(Agent("a", model, tools=(fetch,)))
    def ask(input: Any) -> str:
        return "go"

    record = raysaga.run(wf, {}, store=sqlite_url, executor="inline")
    assert record.status == RunStatus.COMPLETED, record.status_reason
    assert called == ["o1"]  # (its stored arguments, by name, did not validate: "invalid arguments for fetch")


# ---------------------------------------------------------------- a third review (72562ff): one stored form, by name

SENT: list[tuple[str, str, str]] = []


@tool(effect=True, key=("from_",))
def send42(from_: Annotated[str, Field(alias="from")], body: str, idempotency_key: str = "") -> str:
    """Send a message from someone."""
    SENT.append((from_, body, idempotency_key))
    return "sent"


def test_an_effect_tool_keyed_by_an_aliased_parameter_sends_each_call(tmp_path: Any) -> None:
    """Dumped by alias, the arguments had no ``from_`` for ``key_args`` to read: every call got the
    key of ``None``, and bob's message was answered "sent" from alice's ledger row without a call."""
    SENT.clear()
    model = ScriptedModel({"go": [tool_reply(("send42", {"from": "alice", "body": "1"})),
                                  tool_reply(("send42", {"from": "bob", "body": "2"})), text_reply("done")]})
    wf = Workflow("send42")

    @wf.agent(Agent("mailer", model, tools=(send42,)))
    def ask(input: dict[str, Any]) -> str:
        return "go"

    record = raysaga.run(wf, {}, store=f"sqlite:///{tmp_path / 's.db'}", executor="inline")
    assert record.status == RunStatus.COMPLETED, record.status_reason
    assert [(who, body) for who, body, _ in SENT] == [("alice", "1"), ("bob", "2")]
    assert SENT[0][2] != SENT[1][2]  # two calls, two keys


class CamelGen(BaseModel):
    model_config = ConfigDict(alias_generator=lambda name: "".join(
        part if i == 0 else part.title() for i, part in enumerate(name.split("_"))))
    order_id: str


class Doubled(BaseModel):
    model_config = ConfigDict(extra="allow")
    a: int

    @computed_field  # type: ignore[prop-decorator]
    @property
    def double(self) -> int:
        return 2 * self.a


def test_models_are_stored_by_name_with_their_computed_fields_as_raysaga_always_stored_them(tmp_path: Any) -> None:
    """Stored by alias, a camelCase-parsing model reached untyped readers and the run's output
    under other keys than before (a reader's ``.get("order_id")`` silently None), and an
    ``extra="allow"`` model lost its computed field; one holding an aliased and a
    serialization-aliased model was refused. Stored by name, read by name and by alias."""
    wf = Workflow("by_name42")

    @wf.step()
    def parsed() -> CamelGen:
        return CamelGen.model_validate({"orderId": "o1"})

    @wf.step()
    def doubled() -> Doubled:
        return Doubled(a=1)

    @wf.step()
    def untyped(parsed: Any, doubled: Any) -> list[Any]:
        return [parsed.get("order_id"), doubled]

    @wf.step()
    def typed(parsed: CamelGen, doubled: Doubled) -> list[Any]:
        return [parsed.order_id, doubled.double]

    record = raysaga.run(wf, None, store=f"sqlite:///{tmp_path / 'n.db'}", executor="inline")
    assert record.status == RunStatus.COMPLETED, record.status_reason
    assert record.output == {"untyped": ["o1", {"a": 1, "double": 2}], "typed": ["o1", 2]}


def test_an_effect_tools_key_keeps_its_form_for_a_model_with_a_computed_field_and_extra_allow() -> None:
    """Computed fields left out of an ``extra="allow"`` model changed the key of a call in flight
    across the upgrade: a second charge under a new key."""
    @tool(effect=True)
    def charge(order: Doubled) -> str:
        """Charge for an order."""
        return "charged"

    sent = {"order": {"a": 250}}
    before = charge.input_model.model_validate(sent).model_dump(mode="json")  # the form raysaga always keyed
    assert charge.validate(sent) == before == {"order": {"a": 250, "double": 500}}
