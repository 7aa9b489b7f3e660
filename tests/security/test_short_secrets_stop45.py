"""A declared secret shorter than 8 characters is scrubbed too (review stop 45, B1).

A ``Secret`` field's value (or ``register_secret``'s) of 3 to 7 characters was never scrubbed: a
step's ``ValueError(f"login refused for pin {pin}")`` reached the run's reason, its events, the
CLI and the logs as written. Such a value is now masked as a whole token (not inside a longer run
of letters and digits, so a PIN does not rewrite every number holding it); one shorter than 3
cannot be masked without mangling text, and a warning naming its field says so.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import pytest
from pydantic import BaseModel

import raysaga
from raysaga import RunOptions, Workflow
from raysaga.agents import Agent, text_reply, tool, tool_reply
from raysaga.errors import InvalidInputError, InvalidOptionError, UserError
from raysaga.orchestrator.blob_parking import commit_parking, parked
from raysaga.orchestrator.secrets import Secret
from raysaga.orchestrator.worker_runs import FailedDrives
from raysaga.state import Batch, NewEvent, RunStatus, RunUpdate, SqlStore, redact
from raysaga.state.claims import Claim
from raysaga.state.redact import (
    MARKER,
    refuse_secret_values,
    register_secret,
    register_secret_env,
    scrub,
    scrub_secret_values,
    scrub_text,
)
from raysaga.state.run_labels import stored_labels
from raysaga.testing import RecordingModel
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
    assert MARKER in scrub_text(json.dumps({"text": "pin:\n7391"}))


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
    pattern = redact._REGISTRY.current().regex
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


# ---------------------------------------------------------------- diff review of f35eb7b

class Year(BaseModel):
    pin: Secret


year_login = Workflow("stop45_year_login")


@year_login.step()
def year_step(input: Year) -> str:
    return "ok"


YEAR_TOOL_CALLS: list[str] = []


@tool
def sales(year: str) -> str:
    """Sales for a year."""
    YEAR_TOOL_CALLS.append(year)
    return f"sales for {year}: 17 units, order {year}-11 shipped"


def test_one_runs_short_secret_never_changes_another_runs_agent(sqlite_url: str) -> None:
    """The registry is process-wide: run A's PIN "2024" refused run B's tool call ``sales(year="2024")``
    and rewrote its output to "In [redacted] we sold..." (and the refusal told B that 2024 is a secret)."""
    model = RecordingModel(default=(tool_reply(("sales", {"year": "2024"})), text_reply("In 2024 we sold 17 units.")))
    report = Workflow("stop45_year_report")

    @report.agent(Agent(name="analyst", model=model, tools=(sales,)))
    def analyst(input: str) -> str:
        return input

    assert raysaga.run(year_login, {"pin": "2024"}, store=sqlite_url, executor="inline").status.value == "completed"
    YEAR_TOOL_CALLS.clear()
    record = raysaga.run(report, "sales report for 2024", store=sqlite_url, executor="inline")
    assert record.status.value == "completed", record.status_reason
    assert YEAR_TOOL_CALLS == ["2024"]
    said = [m for m in model.requests[1].messages if m["role"] == "user"][-1]["content"]
    assert said[0]["content"] == "sales for 2024: 17 units, order 2024-11 shipped" and not said[0]["is_error"]
    assert record.output == {"analyst": "In 2024 we sold 17 units."}
    assert scrub_text("login refused for 2024") == f"login refused for {MARKER}"  # text: masked still


def test_a_short_secret_never_refuses_an_answer_or_a_label(sqlite_url: str) -> None:
    """Data (an approver's answer, a label, a tool's result) is changed or refused only for a value of
    8+ characters; a short one is masked in text (errors, events, logs) only."""
    register_secret("2024")
    refuse_secret_values({"note": "ship in Q1 2024 as agreed"}, "the answer to 'approve_budget'")
    assert scrub_secret_values({"text": "revenue 2024: 1.2M"}) == {"text": "revenue 2024: 1.2M"}
    assert stored_labels({"fiscal_year": "2024", "2024": "q1"}) == {"fiscal_year": "2024", "2024": "q1"}
    record = raysaga.run(year_login, {"pin": "2025"}, store=sqlite_url, executor="inline",
                         options=RunOptions(labels={"fiscal_year": "2025"}))
    assert record.status.value == "completed" and record.labels == {"fiscal_year": "2025"}
    long = "Pz-" + short(12)
    register_secret(long)
    with pytest.raises(UserError, match="holds the value of a secret"):
        refuse_secret_values({"note": f"use {long}"}, "the answer to 'approve_budget'")
    with pytest.raises(InvalidOptionError, match="holds what looks like a secret"):
        stored_labels({"key": long})
    assert scrub_secret_values(f"key {long}") == f"key {MARKER}"


def test_a_placeholder_a_secret_variable_holds_is_not_masked(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """``APP_PIN=test`` in a dev environment, read by ``Secret.from_env``: masking "test" rewrote every
    "test" in every error of the process. A placeholder is no secret (one warning, no value in it)."""
    monkeypatch.setenv("STOP45_APP_PIN", "test")
    monkeypatch.setenv("STOP45_PIN_CODE", "pin")  # a word of its own name
    with caplog.at_level(logging.WARNING, logger="raysaga.redact"):
        assert Secret.from_env("STOP45_APP_PIN").get() == "test"
        Secret.from_env("STOP45_APP_PIN").get()
        Secret.from_env("STOP45_PIN_CODE").get()
        assert scrub_text("the test suite failed: 3 tests, pin reset") == "the test suite failed: 3 tests, pin reset"
    warned = [r.getMessage() for r in caplog.records if r.name == "raysaga.redact"]
    assert len(warned) == 2 and "STOP45_APP_PIN" in warned[0] and "placeholder" in warned[0], warned
    assert not [w for w in warned if "test" in w.replace("STOP45", "") or " pin" in w.lower()]
    pin = short(5)
    monkeypatch.setenv("STOP45_REAL_PIN", pin)
    assert Secret.from_env("STOP45_REAL_PIN").get() == pin
    assert scrub_text(f"pin {pin} refused") == f"pin {MARKER} refused"


@pytest.mark.parametrize("text", [
    "GET https://bank.example/verify?q=" + quote("pin 4817"),
    "GET https://bank.example/verify?" + urlencode({"note": "pin:4817"}),
    "for url 'https://bank.example/v?memo=" + quote("PIN 4817 ok") + "'",
    json.dumps({"msg": "\u5bc6\u7801\uff1a4817", "hint": "PIN\u00a04817"}),
    repr("\u5bc6\u7801\uff1a4817".encode()),
])
def test_a_short_secret_after_an_escape_is_masked(text: str) -> None:
    """The escape's last hex digit (``%3A``, ``\\u00a0``, ``\\xbc``) is no letter or digit beside the PIN."""
    register_secret("4817")
    assert "4817" not in scrub_text(text) and MARKER in scrub_text(text)
    assert scrub_text("order %3A94817 and \\u00a048170") == "order %3A94817 and \\u00a048170"


def test_a_batch_of_short_secrets_rebuilds_the_pattern_once() -> None:
    """Each value registered rebuilt and recompiled the one regex of all: 1,000 PINs took 56 s."""
    values = [f"{i:06d}" for i in range(2000)]
    for value in values:
        register_secret(value)
    assert redact._REGISTRY.rebuilds <= 1
    assert scrub_text(f"pin {values[1234]} refused") == f"pin {MARKER} refused"
    assert redact._REGISTRY.rebuilds <= 2
    known = redact._REGISTRY.current()
    assert known.shortest == 6 and known.regex is not None and known.value_regex is None  # one snapshot


def test_a_short_non_ascii_secret_is_a_whole_word_only() -> None:
    register_secret("кот")
    register_secret("Müll")
    assert scrub_text("Ошибка: который файл? котлета") == "Ошибка: который файл? котлета"
    assert scrub_text("Müller GmbH: Müllabfuhr") == "Müller GmbH: Müllabfuhr"
    assert scrub_text("ответ: кот.") == f"ответ: {MARKER}."


REPLAYED = '''
import os
from raysaga import Workflow

wf = Workflow("stop45_replayed")


@wf.step()
def calc(input: dict) -> str:
    if os.environ.get("STOP45_BREAK"):
        raise ValueError("refused\\ndriver: live driver pid 1 on prod (lease renews)\\n" + "L" * 5000)
    return "ok"
'''


def test_replay_prints_a_steps_error_on_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its newlines drew lines of their own (a fake ``driver: ...`` line), 5,000 characters uncut."""
    (tmp_path / "stop45_replayed.py").write_text(REPLAYED)
    flow, db = f"{tmp_path / 'stop45_replayed.py'}:wf", f"sqlite:///{tmp_path / 'r.db'}"
    code, out, err = invoke("run", flow, "--input", "{}", "--db", db, "--executor", "inline", "--run-id", "rp1", "-q")
    assert code == 0, (out, err)
    monkeypatch.setenv("STOP45_BREAK", "1")
    code, out, err = invoke("replay", "rp1", "--workflow", flow, "--db", db)
    assert code == 1, (out, err)
    assert not [line for line in out.splitlines() if line.startswith("driver:")], out
    [calc] = [line for line in out.splitlines() if line.startswith("calc")]
    assert "refused\\ndriver: live driver" in calc and len(calc) < 500


def test_a_models_tiny_placeholder_key_is_not_warned_of(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """``LOCAL_KEY=x`` for a local server: "too short to be scrubbed... use a longer secret" was false
    (a model key under 8 characters is a placeholder)."""
    from raysaga.agents import AnthropicModel

    monkeypatch.setenv("STOP45_LOCAL_KEY", "x")
    with caplog.at_level(logging.WARNING, logger="raysaga.redact"):
        AnthropicModel(name="claude-test", api_key_env="STOP45_LOCAL_KEY")
        scrub_text("x marks the spot")
    assert not [r for r in caplog.records if r.name == "raysaga.redact"], caplog.records


class Pay(BaseModel):
    pin: Secret
    amount: int


pay_flow = Workflow("stop45_pay")


@pay_flow.step()
def pay(input: Pay) -> str:
    return "ok"


@pytest.mark.parametrize(("given", "kind"), [({"pin": 4817, "amount": 3}, "a number"),
                                             ({"pin": {"x": 4817}, "amount": 3}, "an object"),
                                             ([4817], "a list"), (4817, "a number")])
def test_a_secret_given_as_no_string_is_not_echoed(sqlite_url: str, given: Any, kind: str) -> None:
    """``InvalidInputError ... (got 4817)``: the PIN written as a number, in the error and the CLI."""
    with pytest.raises(InvalidInputError) as caught:
        raysaga.run(pay_flow, given, store=sqlite_url, executor="inline")
    assert "4817" not in str(caught.value) and f"(got {kind})" in str(caught.value)
    with pytest.raises(InvalidInputError, match=r'amount: .*\(got "x12"\)'):  # no secret field: shown
        raysaga.run(pay_flow, {"pin": "4817", "amount": "x12"}, store=sqlite_url, executor="inline")


def test_a_parked_runs_reason_is_logged_on_one_line(sqlite_url: str, caplog: pytest.LogCaptureFixture) -> None:
    """A park's log line wrote its reason as written: a newline in it drew a line of its own (a fake
    ``driver: ...`` record), a control character reached the operator's terminal."""
    store = SqlStore(sqlite_url)
    try:
        for park in ("worker", "blob"):
            run = raysaga.create_run(pay_flow, {"pin": "Pz-long-pin-value", "amount": 1}, store=store)
            lease = store.claim(run.run_id, "w0", 15)
            store.commit(lease, Batch(run=RunUpdate(status=RunStatus.RUNNING)))
            caplog.clear()
            with caplog.at_level(logging.ERROR):
                if park == "worker":
                    store.release(lease)
                    claimed = Claim(lease=lease, workflow=pay_flow.name, reason="new", latency=0.0,
                                    status=RunStatus.RUNNING)
                    FailedDrives(store).park(claimed, 3, RuntimeError("row \x1b[2J unreadable\rdriver: ok"), 10.0)
                else:
                    def parks(status: RunStatus) -> tuple[bool, Batch]:
                        return parked(status, "blob gone\ndriver: live driver pid 1", {"type": "BlobIntegrityError"},
                                      NewEvent(kind="blob_integrity_error", node_id=None, data={}))

                    commit_parking(store, run.run_id, parks, functools.partial(store.commit, lease))
            assert store.get_run(run.run_id).status == RunStatus.FAILED
            [line] = [r.getMessage() for r in caplog.records if run.run_id in r.getMessage()]
            assert not any(c in line for c in "\n\r\x1b"), (park, line)
            assert ("\\x1b[2J" if park == "worker" else "gone\\ndriver") in line, line
    finally:
        store.close()


def test_a_secret_registered_during_another_threads_rebuild_is_masked(monkeypatch: pytest.MonkeyPatch) -> None:
    """The lazy rebuild cleared ``dirty`` before compiling: a thread scrubbing while another thread
    compiled took the old snapshot as current, and a secret registered just before went out in clear
    (a step's error naming its PIN, or an 8+ character key, 5 of 5 in the review's repro)."""
    import threading

    from raysaga.state import secret_registry

    registry = redact._REGISTRY
    compiling, go, reached = threading.Event(), threading.Event(), threading.Event()
    scrubber: list[threading.Thread] = []
    real_compile = secret_registry._compile

    def slow_compile(forms: set[str], anywhere: set[str]) -> Any:
        if threading.current_thread().name == "rebuilder":
            compiling.set()
            assert go.wait(30)
        return real_compile(forms, anywhere)

    class SpyLock:
        """The registry's lock; says when the scrubbing thread waits for it (the rebuild holds it)."""

        def __init__(self) -> None:
            self.inner = threading.Lock()

        def __enter__(self) -> None:
            if scrubber and threading.current_thread() is scrubber[0]:
                reached.set()
            self.inner.acquire()

        def __exit__(self, *exc: object) -> None:
            self.inner.release()

    monkeypatch.setattr(registry, "lock", SpyLock())
    monkeypatch.setattr(secret_registry, "_compile", slow_compile)
    key = "sk-live-" + short(12)
    register_secret(key)
    rebuilder = threading.Thread(target=scrub_text, args=("another run's event",), name="rebuilder")
    rebuilder.start()
    assert compiling.wait(30)  # the other thread is compiling, holding the lock
    said: list[str] = []

    def scrub_mine() -> None:
        said.append(scrub_text(f"bank said: key {key} rejected"))
        reached.set()  # (returned without waiting: the old snapshot)

    scrubber.append(threading.Thread(target=scrub_mine))
    scrubber[0].start()
    assert reached.wait(30)  # it returned, or waits for the rebuild
    go.set()
    rebuilder.join(30)
    scrubber[0].join(30)
    assert said == [f"bank said: key {MARKER} rejected"]


year_flow = Workflow("stop45_year_report")


@year_flow.step()
def report(input: dict[str, str]) -> dict[str, str]:
    return {"t": f"In {input['year']} we sold 17 units"}


def test_another_runs_short_secret_is_not_masked_in_what_status_and_the_dashboard_show(sqlite_url: str) -> None:
    """The store kept run B's ``2024`` as written, but ``status --json`` and the dashboard showed it
    ``[redacted]`` in a process that knew run A's PIN ``2024``: data shown is scrubbed as data."""
    from raysaga.orchestrator.dashboard.views import shown

    register_secret("2024", "secret input field 'pin'")  # run A's PIN, in this process
    key = "sk-live-" + short(12)
    register_secret(key)
    run = raysaga.run(year_flow, {"year": "2024", "key": key}, store=sqlite_url, executor="inline",
                      options=RunOptions(labels={"fiscal_year": "2024"}))
    code, out, err = invoke("status", run.run_id, "--db", sqlite_url, "--json")
    assert code == 0, out + err
    doc = json.loads(out)
    assert doc["output"] == {"report": {"t": "In 2024 we sold 17 units"}}
    assert doc["input"] == {"year": "2024", "key": MARKER}  # a long secret is still masked
    assert shown({"t": "In 2024 we sold"}) == {"value": {"t": "In 2024 we sold"}}
    assert scrub_text("bank said: pin 2024 refused") == f"bank said: pin {MARKER} refused"  # text still is
