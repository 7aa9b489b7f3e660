"""Secrets compared by reference, secret messages that name the field and the way out, Mermaid
ids that are not JavaScript prototype names, bounded JSON path messages."""

from __future__ import annotations

import re
import uuid

import pytest
from pydantic import BaseModel

import raysaga
from raysaga import Secret, Workflow
from raysaga.errors import NotJSONableError, SecretUnavailableError, UserError
from raysaga.orchestrator.render import mermaid
from raysaga.state import RunStatus, SqlStore, jsoncodec


class Order(BaseModel):
    amount: int
    token: Secret


def order_flow() -> Workflow:
    wf = Workflow("secret_compare")

    @wf.step()
    def pay(input: Order) -> int:
        return input.amount

    return wf


def test_a_secret_literal_identical_to_the_original_is_the_same_input(store: SqlStore) -> None:
    wf = order_flow()
    run_id = "sec-" + uuid.uuid4().hex[:8]
    raysaga.create_run(wf, {"amount": 3, "token": "tok-literal-1"}, store=store, run_id=run_id)
    # the same input again (a literal is never stored: any literal compares equal to any literal)
    done = raysaga.run(wf, {"amount": 3, "token": "tok-literal-1"}, store=store, run_id=run_id,
                       executor="inline")
    assert done.status == RunStatus.COMPLETED and done.output == {"pay": 3}
    with pytest.raises(UserError, match="different input"):  # another non-secret field still differs
        raysaga.run(wf, {"amount": 4, "token": "tok-literal-1"}, store=store, run_id=run_id, executor="inline")


def test_env_secrets_compare_by_variable_name(store: SqlStore, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FIX_PAY_TOKEN", "tok-from-env-123")
    wf = order_flow()
    run_id = "sec-" + uuid.uuid4().hex[:8]
    raysaga.create_run(wf, {"amount": 3, "token": {"env": "FIX_PAY_TOKEN"}}, store=store, run_id=run_id)
    with pytest.raises(UserError, match="different input"):
        raysaga.run(wf, {"amount": 3, "token": {"env": "OTHER_TOKEN"}}, store=store, run_id=run_id,
                    executor="inline")
    done = raysaga.run(wf, {"amount": 3, "token": {"env": "FIX_PAY_TOKEN"}}, store=store, run_id=run_id,
                       executor="inline")
    assert done.status == RunStatus.COMPLETED


def test_an_unset_env_secret_names_its_field(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FIX_UNSET_TOKEN", raising=False)
    order = Order.model_validate({"amount": 1, "token": {"env": "FIX_UNSET_TOKEN"}})
    with pytest.raises(SecretUnavailableError, match="field 'token' reads environment variable FIX_UNSET_TOKEN"):
        order.token.get()
    stored = Order.model_validate({"amount": 1, "token": {"$secret": {"env": "FIX_UNSET_TOKEN"}}})
    with pytest.raises(SecretUnavailableError, match="field 'token'") as exc:
        stored.token.get()
    assert "retry" in str(exc.value)


def test_a_missing_literal_says_resume_or_retry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAYSAGA_SECRET_TOKEN", raising=False)
    other_process = Order.model_validate({"amount": 1, "token": {"$secret": {"memory": "gone", "field": "token"}}})
    with pytest.raises(SecretUnavailableError) as exc:
        other_process.token.get()
    message = str(exc.value)
    assert "RAYSAGA_SECRET_TOKEN" in message and "or retry it, if the run failed" in message


@pytest.mark.parametrize("name", ["constructor", "toString", "valueOf", "hasOwnProperty", "__proto__"])
def test_mermaid_ids_are_never_javascript_prototype_names(name: str) -> None:
    wf = Workflow("proto_names")

    @wf.step(name=name)
    def first() -> int:
        return 1

    @wf.step(after=[name])
    def later() -> int:
        return 2

    text = mermaid(wf)
    ids = re.findall(r"^\s+(\S+?)\[", text, flags=re.M)
    assert ids and name not in ids, text
    assert f'"{name}"' in text or name in text  # still labelled with its name


def test_a_deep_value_message_is_bounded() -> None:
    key = "k" * 5000
    value: object = 1
    for _ in range(150):
        value = {key: value}
    with pytest.raises(NotJSONableError, match="nested deeper than 100 levels") as exc:
        jsoncodec.to_jsonable(value, "input")
    assert len(str(exc.value)) < 1000
    assert str(exc.value).startswith("input[")
