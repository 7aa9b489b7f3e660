"""A declared secret shorter than 8 characters is scrubbed too (review stop 45, B1).

A ``Secret`` field's value (or ``register_secret``'s) of 3 to 7 characters was never scrubbed: a
step's ``ValueError(f"login refused for pin {pin}")`` reached the run's reason, its events, the
CLI and the logs as written. Such a value is now masked as a whole token (not inside a longer run
of letters and digits, so a PIN does not rewrite every number holding it); one shorter than 3
cannot be masked without mangling text, and a warning naming its field says so.
"""

from __future__ import annotations

import json
import logging
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import BaseModel

import raysaga
from raysaga import Workflow
from raysaga.orchestrator.secrets import Secret
from raysaga.state import SqlStore, redact
from raysaga.state.redact import MARKER, register_secret, register_secret_env, scrub, scrub_text
from tests.support.cli import invoke
from tests.support.store_scan import rows_holding


@pytest.fixture(autouse=True)
def registry(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """This test's secrets only (a short one registered would stay for every later test of the
    process): a fresh registry, and no secret-named variable of the host."""
    monkeypatch.setattr(redact, "_REGISTRY", redact._Registry())
    for name in [n for n in os.environ if redact._SECRET_NAME.search(n)]:
        monkeypatch.delenv(name)
    yield


def short(length: int) -> str:
    """A value of ``length`` characters no other text of the test holds ("Pz" is in no hex id)."""
    return ("Pz" + uuid.uuid4().hex)[:length]


class Login(BaseModel):
    pin: Secret


login_flow = Workflow("stop45_short_pin")


@login_flow.step()
def login(input: Login) -> str:
    logging.getLogger("raysaga.user").warning("logging in with %s", input.pin.get())
    raise ValueError(f"login refused for pin {input.pin.get()}")


def test_a_short_secret_field_reaches_no_reason_event_row_cli_or_log(
        sqlite_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    pin = short(7)
    with caplog.at_level(logging.INFO):
        record = raysaga.run(login_flow, {"pin": pin}, store=sqlite_url, executor="inline")
    assert record.status.value == "failed"
    assert record.status_reason == f"critical step 'login' failed: login refused for pin {MARKER}"
    assert any(r.getMessage() == f"logging in with {MARKER}" for r in caplog.records)
    assert not [r for r in caplog.records if pin in r.getMessage()]
    store = SqlStore(sqlite_url)
    try:
        events = store.events(record.run_id)
    finally:
        store.close()
    assert any(MARKER in str(e.data) for e in events) and not [e for e in events if pin in str(e.data)]
    assert rows_holding(sqlite_url, [pin]) == ""
    for args in (["status", record.run_id], ["events", record.run_id], ["list"]):
        code, out, err = invoke(*args, "--db", sqlite_url)
        assert code in (0, 1) and pin not in out + err, args
    code, out, _ = invoke("status", record.run_id, "--db", sqlite_url)
    assert f"login refused for pin {MARKER}" in out


@pytest.mark.parametrize("length", [3, 4, 7])
def test_a_short_declared_value_is_masked_as_a_whole_token_only(length: int) -> None:
    value = short(length)
    register_secret(value)
    assert scrub_text(f"pin {value} refused") == f"pin {MARKER} refused"
    assert scrub_text(f"({value}).") == f"({MARKER})."
    assert scrub_text(value) == MARKER  # a text as short as the value itself
    assert scrub({"pin": value, "n": [value, 3]}) == {"pin": MARKER, "n": [MARKER, 3]}
    for inside in (f"order 9{value}", f"{value}9 items", f"x{value}y"):
        assert scrub_text(inside) == inside  # inside a longer run of letters and digits: not the secret
    assert scrub_text(f"order_{value}") == f"order_{MARKER}"  # "_" is no letter or digit


def test_a_pin_is_masked_in_prose_not_inside_a_longer_number() -> None:
    register_secret("7391")
    assert scrub_text("pin 7391 refused") == f"pin {MARKER} refused"
    assert scrub_text("order 9173912 and 17391 and 73910") == "order 9173912 and 17391 and 73910"
    assert scrub_text('{"pin": "7391"}') == f'{{"pin": "{MARKER}"}}'
    # after an escape, in a repr or JSON text: a newline, not a letter, is before it
    assert scrub_text(repr("pin:\n7391")) == f"'pin:\\n{MARKER}'"
    said = json.dumps({"text": "pin:\n7391"})
    assert redact.json_may_hold_secret_value(said) and MARKER in scrub_text(said)


def test_a_short_secret_by_env_reference_is_masked(monkeypatch: pytest.MonkeyPatch) -> None:
    value = short(5)
    monkeypatch.setenv("STOP45_VENDOR_PIN", value)
    register_secret_env("STOP45_VENDOR_PIN")
    assert scrub_text(f"vendor pin {value} refused") == f"vendor pin {MARKER} refused"
    # a variable's value is a secret by its name only from 8 characters: unchanged
    monkeypatch.setenv("STOP45_TINY_TOKEN", "abcdefg")
    assert scrub_text("abcdefg and hello") == "abcdefg and hello"


def test_a_secret_too_short_to_mask_is_warned_of_once_without_its_value(
        caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="raysaga.redact"):
        secret = Secret.literal("Pz", "pin")
        Secret.literal("Pz", "pin")
        assert secret.get() == "Pz"
    warned = [r.getMessage() for r in caplog.records if r.name == "raysaga.redact"]
    assert len(warned) == 1, warned
    assert "secret input field 'pin'" in warned[0] and "too short to be scrubbed" in warned[0]
    assert "Pz" not in warned[0] and "3+ characters" in warned[0]
    assert scrub_text("pin Pz refused") == "pin Pz refused"  # not masked: it would mangle text


def test_many_short_secrets_are_one_pattern() -> None:
    """The scrub runs on every error and event: however many short values, one compiled regex."""
    values = [short(6) for _ in range(200)]
    for value in values:
        register_secret(value)
    pattern = redact._REGISTRY.current()
    assert pattern is not None and all(pattern.fullmatch(v) for v in values)  # each a branch of it
    assert scrub_text(f"refused {values[123]} at step 4") == f"refused {MARKER} at step 4"


def test_a_models_placeholder_key_is_no_secret_but_a_real_one_is(monkeypatch: pytest.MonkeyPatch) -> None:
    """``ANTHROPIC_API_KEY=none`` for a local server is a placeholder: masking the word would rewrite
    every "none" in errors and refuse every tool call holding it. A key of 8+ characters is masked."""
    from raysaga.agents import AnthropicModel

    monkeypatch.setenv("STOP45_MODEL_KEY", "none")
    AnthropicModel(name="claude-test", api_key_env="STOP45_MODEL_KEY")
    assert scrub_text("none of the tools answered") == "none of the tools answered"
    monkeypatch.setenv("STOP45_MODEL_KEY", "sk-local-" + short(12))
    assert scrub_text(f"401: bad key {os.environ['STOP45_MODEL_KEY']}") == f"401: bad key {MARKER}"


def test_a_secret_field_from_the_models_variable_keeps_its_short_value_masked(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same variable declared by a ``Secret`` field too: the shorter rule (a PIN) wins, in either order."""
    from raysaga.agents import AnthropicModel

    pin = short(4)
    monkeypatch.setenv("STOP45_SHARED", pin)
    Secret.from_env("STOP45_SHARED")
    AnthropicModel(name="claude-test", api_key_env="STOP45_SHARED")
    assert scrub_text(f"pin {pin} refused") == f"pin {MARKER} refused"
