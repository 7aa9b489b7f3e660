"""Stop 41, secret scrubbing an adversarial review found leaking, or changing what it must not:

1. pydantic's error display cuts a value in the middle (``input_value='first25...last24'``): the
   pieces of a secret-named variable's value were not looked for (declared values only), nor a
   tail after a cut's mark inside a text; ``sk-ant-`` masked only the front half of a key;
2. a secret percent-encoded in a URL's query (httpx quotes the URL: ``key=AbC9%2FxYz%2B...``) or
   JSON-escaped was not recognised, nor ``?key=``/``&sig=``/``&signature=`` of a URL;
3. ``RedactingFilter`` scrubbed ``exc_text`` but left the live exception in ``exc_info``, which
   OpenTelemetry's handler, JSON formatters and Sentry format themselves;
4. an approver's answer was scrubbed before the next step got it (``{"token": "COUPON"}`` arrived
   as ``[redacted]``): it is now stored as given, and refused if it holds a known secret value;
5. a plain word in a secret-named variable (``POSTGRES_PASSWORD=postgres``) was masked in a tool's
   arguments before the tool ran; a tool never runs with arguments a scrub changed now;
6. a ``--db`` URL with a typo (``postgresql:/app:PW@db/x``) was echoed, password and all.
"""

from __future__ import annotations

import io
import json
import logging
import os
import re
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, quote_plus

import httpx
import pytest
from pydantic import BaseModel, ValidationError
from typer.testing import CliRunner

import raysaga
from raysaga import Approval, Ask, Client, UserError, Workflow
from raysaga.agents import Agent, tool
from raysaga.agents.models import ScriptedModel, text_reply, tool_reply
from raysaga.orchestrator.cli import app
from raysaga.state import SqlStore, redact
from raysaga.state.redact import MARKER, scrub_text
from tests.support.store_scan import rows_holding

KEY = "vl-7Hq2Lw9XzPm4Rt8Ny6Kb3Vc5Jd1Fg0SaWeQ2w8E4r6T1y3U5i7O9p0A"  # no token shape
ANT = "sk-ant-api03-" + "Xy7Pq2Lm9Rt4Vb8Nc1Kd6Fg3Hj5Sa0We" * 2 + "Zx9Cv2Bn4Mq7-AbCdEfAA"
QUERY_KEY = "AbC9/xYz+Qm7wLp2=="  # base64-shaped, as Azure's and AWS's are


@pytest.fixture(autouse=True)
def registry(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """This test's secrets only: a fresh registry, and no secret-named variable of the host."""
    monkeypatch.setattr(redact, "_REGISTRY", redact._Registry())
    for name in [n for n in os.environ if redact._SECRET_NAME.search(n)]:
        monkeypatch.delenv(name)
    yield


def windows(secret: str, size: int = 10) -> list[str]:
    return [secret[i:i + size] for i in range(len(secret) - size + 1)]


class Cfg(BaseModel):
    timeout: int


def pydantic_error(value: str) -> str:
    try:
        Cfg.model_validate({"timeout": value})
    except ValidationError as exc:
        return str(exc)
    raise AssertionError("not refused")


# 1 ------------------------------------------------------------------ a secret cut in the middle

def test_a_secret_named_variable_cut_by_pydantic_leaves_no_piece(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VENDOR_API_KEY", KEY)
    message = pydantic_error(KEY)
    assert KEY not in message and KEY[:20] in message and KEY[-20:] in message  # pydantic shows both ends
    clean = scrub_text(message)
    assert f"input_value='{MARKER}...{MARKER}'" in clean
    assert not [w for w in windows(KEY, 8) if w in clean]
    # a piece beside a mark anywhere in the text, head and tail, as other libraries cut ("…", "***")
    assert scrub_text(f"got {KEY[:12]}… (len 60)") == f"got {MARKER}… (len 60)"
    assert scrub_text(f"key {KEY[:14]}*** rejected") == f"key {MARKER}*** rejected"
    assert scrub_text(f"[...{KEY[-16:]}] done") == f"[...{MARKER}] done"
    # not a piece: beside no mark and at no end of the text, or under 8 characters
    for text in (f"a {KEY[:12]} b", f"a ...{KEY[-7:]} b", f"{KEY[:7]}... b"):
        assert scrub_text(text) == text


def test_an_anthropic_key_cut_by_pydantic_is_masked_whole_even_unknown() -> None:
    message = pydantic_error(ANT)  # not in this process's environment: the shape alone
    clean = scrub_text(message)
    assert ANT[-20:] not in clean and ANT[:20] not in clean
    assert f"input_value='{MARKER}'" in clean


def test_a_pydantic_error_of_a_step_reaches_no_row_with_a_piece(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VENDOR_API_KEY", KEY)
    monkeypatch.setenv("ANTHROPIC_API_KEY", ANT)
    wf = Workflow("stop41_pydantic_cut")

    @wf.step()
    def connect(input: dict[str, Any]) -> str:
        Cfg.model_validate({"timeout": os.environ["VENDOR_API_KEY"]})  # a wrong field mapping
        return "ok"

    @wf.step()
    def connect2(input: dict[str, Any]) -> str:
        Cfg.model_validate({"timeout": os.environ["ANTHROPIC_API_KEY"]})
        return "ok"

    url = f"sqlite:///{tmp_path / 'cut.db'}"
    store = SqlStore(url)
    try:
        record = raysaga.run(wf, {}, store=store, executor="inline")
    finally:
        store.close()
    assert rows_holding(url, windows(KEY) + windows(ANT)) == ""
    assert record.status.value == "failed" and record.status_reason is not None
    assert "input_value=" in record.status_reason and MARKER in record.status_reason


# 2 ------------------------------------------------------------------ encoded forms

def test_a_secret_percent_encoded_in_a_url_is_masked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VENDOR_API_KEY", QUERY_KEY)
    url = httpx.URL("https://api.example.com/v1/search", params={"q": "x", "k": QUERY_KEY})
    message = f"Client error '401 Unauthorized' for url '{url}'"
    assert QUERY_KEY not in message and quote(QUERY_KEY, safe="") in message  # httpx's own form
    clean = scrub_text(message)
    assert clean.endswith(f"k={MARKER}'") and "%2F" not in clean
    lower = re.sub("%[0-9A-F]{2}", lambda m: m[0].lower(), quote(QUERY_KEY, safe=""))  # %2f: as valid
    for form in (lower, quote_plus(QUERY_KEY), quote(QUERY_KEY)):
        assert scrub_text(f"GET /v1?token-for={form}&q=1") == f"GET /v1?token-for={MARKER}&q=1"
    # JSON-escaped: "\/" (PHP's, Java's encoders), "\u00e9" (ensure_ascii)
    assert scrub_text(json.dumps({"m": f"key {QUERY_KEY}"}).replace("/", "\\/")) == json.dumps({"m": f"key {MARKER}"})
    accented = "clé-secrète-Zq8Lm2Xp9Tt4"
    monkeypatch.setenv("OTHER_SECRET", accented)
    assert scrub_text(json.dumps({"m": accented})) == json.dumps({"m": MARKER})


@pytest.mark.parametrize("name", ["key", "api_key", "apikey", "access_token", "sig", "signature"])
def test_a_url_query_parameter_naming_a_secret_is_masked(name: str) -> None:
    clean = scrub_text(f"GET https://maps.example.com/api?q=cafe&{name}=AIzaSyD-unknown-123&n=5 -> 403")
    assert clean.startswith(f"GET https://maps.example.com/api?q=cafe&{name}={MARKER}") and "AIzaSyD" not in clean


# 3 ------------------------------------------------------------------ exc_info in the logs

def test_a_logged_exception_reaches_no_handler_unscrubbed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VENDOR_API_KEY", KEY)

    class JsonFormatter(logging.Formatter):  # as python-json-logger, OpenTelemetry, Sentry do
        def format(self, record: logging.LogRecord) -> str:
            out = {"msg": record.getMessage()}
            if record.exc_info:
                out["exc"] = "".join(traceback.format_exception(*record.exc_info))
            return json.dumps(out)

    plain, as_json = io.StringIO(), io.StringIO()
    handlers = [logging.StreamHandler(plain), logging.StreamHandler(as_json)]
    handlers[1].setFormatter(JsonFormatter())
    logger = logging.getLogger("raysaga.driver")
    top = logging.getLogger("raysaga")
    old_level = logger.level
    logger.setLevel(logging.DEBUG)
    for handler in handlers:
        top.addHandler(handler)
    try:
        try:
            raise RuntimeError(f"metrics push failed (key {KEY})")
        except RuntimeError:
            logger.exception("the progress callback raised")
    finally:
        for handler in handlers:
            top.removeHandler(handler)
        logger.setLevel(old_level)
    assert KEY not in as_json.getvalue() and KEY not in plain.getvalue()
    # logging's own formatter still prints the (scrubbed) traceback
    assert "Traceback (most recent call last)" in plain.getvalue()
    assert f"RuntimeError: metrics push failed (key {MARKER})" in plain.getvalue()


# 4 ------------------------------------------------------------------ an approver's answer

class Edit(BaseModel):
    token: str
    callback: str


def _approval_flow(name: str) -> Workflow:
    wf = Workflow(name)

    @wf.approval(approvers=["ops"], answer=Edit)
    def review(input: dict[str, Any]) -> Ask:
        return Ask(prompt="pick a coupon", payload={})

    @wf.step()
    def apply(review: Approval) -> dict[str, Any]:
        return {"got": review.answer}

    return wf


def test_an_answer_reaches_the_next_step_as_the_approver_gave_it(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'answer.db'}"
    wf = _approval_flow("stop41_answer")
    assert raysaga.run(wf, {}, store=url, executor="inline", run_id="a1").status.value == "waiting_human"
    answer = {"token": "SPRING-2025-COUPON", "callback": "https://hooks.example.com/notify?token=abc12345678&x=1"}
    client = Client(url)
    first = client.approve("a1", "review", by="ops", answer=answer, decision_id="d-1")
    # the same decision asked again (a double click) is the one recorded, not "another decision"
    assert client.approve("a1", "review", by="ops", answer=answer, decision_id="d-1") == first
    record = raysaga.run(wf, store=url, executor="inline", run_id="a1")
    assert record.status.value == "completed"
    assert record.output == {"apply": {"got": answer}}


def test_an_answer_holding_a_known_secret_is_refused_not_rewritten(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VENDOR_API_KEY", KEY)
    url = f"sqlite:///{tmp_path / 'refused.db'}"
    wf = _approval_flow("stop41_answer_secret")
    raysaga.run(wf, {}, store=url, executor="inline", run_id="a2")
    with pytest.raises(UserError) as caught:
        Client(url).approve("a2", "review", by="ops", answer={"token": KEY, "callback": "https://x.example"})
    message = str(caught.value)
    assert "the answer to 'review'" in message and "secret" in message and "\n" not in message
    assert KEY not in message
    assert rows_holding(url, windows(KEY)) == ""
    assert SqlStore(url).nodes("a2")[0].status.value == "waiting"  # nothing recorded: it can be decided again


# 5 ------------------------------------------------------------------ tool arguments

CALLS: list[str] = []


@tool
def list_tables(database: str) -> str:
    """List the tables of a database."""
    CALLS.append(database)
    return f"database {database}: users, orders (engine: postgres 16)"


def _agent_flow(name: str, database: str) -> Workflow:
    wf = Workflow(name)
    model = ScriptedModel(default=(tool_reply(("list_tables", {"database": database})), text_reply("done")))

    @wf.agent(Agent("dba", model, tools=(list_tables,)))
    def ask(input: dict[str, Any]) -> str:
        return "which tables are in it?"

    return wf


def test_a_plain_word_in_a_secret_named_variable_changes_no_tool_argument(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("POSTGRES_PASSWORD", "postgres")  # docker compose's default
    monkeypatch.setattr(logging.getLogger("raysaga"), "propagate", True)
    CALLS.clear()
    with caplog.at_level(logging.WARNING):
        record = raysaga.run(_agent_flow("stop41_plain", "postgres_analytics"), {},
                             store=f"sqlite:///{tmp_path / 'plain.db'}", executor="inline")
    assert record.status.value == "completed"
    assert CALLS == ["postgres_analytics"]
    assert scrub_text("could not connect to postgres_analytics") == "could not connect to postgres_analytics"
    warned = [r.getMessage() for r in caplog.records if "POSTGRES_PASSWORD" in r.getMessage()]
    assert len(warned) == 1 and "placeholder" in warned[0]  # once, naming the variable
    assert "'postgres'" not in warned[0]  # never the value


def test_a_tool_never_runs_with_arguments_a_scrub_rewrote(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VENDOR_API_KEY", KEY)
    CALLS.clear()
    url = f"sqlite:///{tmp_path / 'echo.db'}"
    record = raysaga.run(_agent_flow("stop41_echo", f"db-{KEY}"), {}, store=url, executor="inline")
    assert record.status.value == "completed"
    assert CALLS == []  # not with "db-[redacted]": the call is answered, never run
    assert rows_holding(url, windows(KEY)) == ""
    nodes = {n.label: n for n in SqlStore(url).nodes(record.run_id)}
    use = nodes["ask@0"].output["content"][0]
    assert use["type"] == "tool_use" and MARKER not in json.dumps(use["input"])  # stored as acted on
    result = nodes["ask@0.0"].output
    assert result["is_error"] is True and "secret" in result["content"] and "not run" in result["content"]


def test_a_plain_variable_value_and_its_pieces_are_not_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in (("DB_PASSWORD", "localhost"), ("SETUP_TOKEN", "changeme"), ("MAX_TOKENS", "100000000"),
                        ("API_KEY_FILE", "/run/secrets/api_key"), ("APP_SECRET", "not-a-real-secret"),
                        ("POSTGRES_PASSWORD", "postgres")):
        monkeypatch.setenv(name, value)
        assert scrub_text(f"using {value} now") == f"using {value} now"
    monkeypatch.setenv("SERVICE_TOKEN", "postgres-prod-" + "Xy7Pq2Lm9Rt4")
    assert scrub_text("token postgres-prod-Xy7Pq2...") == f"token {MARKER}..."
    assert scrub_text("could not log in: password...") == "could not log in: password..."  # a placeholder piece
    # declared, it is a secret whatever it looks like
    redact.register_secret_env("DB_PASSWORD")
    assert scrub_text("using localhost now") == f"using {MARKER} now"


# 6 ------------------------------------------------------------------ a --db typo

@pytest.mark.parametrize("db", ["postgresql:/app:Tr0ub4dor-x9@db/x", "postgresql:app:Tr0ub4dor-x9@db/x",
                                "postgres//app:Tr0ub4dor-x9@db/x"])
def test_a_db_url_typo_is_not_echoed_with_its_password(db: str, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["list", "--db", db])
    assert result.exit_code != 0
    assert "no raysaga store at" in result.stderr and "@db/x" in result.stderr
    assert "Tr0ub4dor" not in result.stderr + result.stdout


def test_the_driver_answers_a_tool_call_holding_a_secret_only_it_knows_never_runs_it() -> None:
    """A value declared only in the driver is unknown to the Ray worker that made the model call:
    the driver scrubs the response it receives (``agent_io.scrubbed_turns``) as the worker would
    have (``scrubbed_response``): the call is answered as malformed, never run with the input the
    scrub rewrote (``[redacted]``), and the response's text is scrubbed in place."""
    from raysaga.agents.runtime import INVALID_INPUT
    from raysaga.node_key import NodeKey
    from raysaga.orchestrator.agent_io import scrubbed_turns
    from raysaga.orchestrator.task import NodeOutcome
    from raysaga.state import jsoncodec

    redact.register_secret(KEY)
    response = {"content": [{"type": "text", "text": f"using {KEY}"},
                            {"type": "tool_use", "id": "t1", "name": "look_up", "input": {"account": f"acct {KEY}"}},
                            {"type": "tool_use", "id": "t2", "name": "look_up", "input": {"account": "plain"}}],
                "stop_reason": "tool_use"}
    key = NodeKey("ask", -1, turn=0)
    [(_, outcome)] = scrubbed_turns([(key, NodeOutcome(ok=True, output_json=jsoncodec.dumps(response)))])
    assert outcome.output_json is not None and KEY not in outcome.output_json
    text, secret_call, plain_call = jsoncodec.loads(outcome.output_json)["content"]
    assert text["text"] == f"using {MARKER}"
    assert INVALID_INPUT in secret_call["input"] and MARKER not in json.dumps(secret_call["input"])
    assert plain_call["input"] == {"account": "plain"}


@pytest.mark.parametrize("name, value", [
    ("SMTP_PASSWORD", "qwhzkrtplmnbvcxs"),  # a Google app password: 16 random lowercase letters
    ("JWT_SECRET", "/x9Kq+2bZr7vY4mN0pLw8sTq3eHd5uJc6fGa1iBo7nVz"),  # base64 that starts with "/"
    ("TOTP_SECRET", "JBSWYXDPEHPKQPXP"), ("ADMIN_PASSWORD", "Sunshine"), ("DB_PASSWORD", "horse.battery.staple"),
    ("BANK_PIN_KEY", "480193726511"), ("DEV_PASSWORD", "Password123"),
])
def test_a_real_secret_that_looks_plain_is_still_masked(name: str, value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Review of the first fix: "plain" was any word, capitalised word, 8-12 digit number or path."""
    monkeypatch.setenv(name, value)
    assert scrub_text(f"connect failed with {value} for user") == f"connect failed with {MARKER} for user"


def test_a_cut_piece_of_a_word_like_password_is_masked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MAIL_PASSWORD", "Xq7mountainriverstone")
    assert "riverstone" not in scrub_text("mountainriverstone' is wrong")
    assert "riverstone" not in scrub_text("input_value='Xq7mountainr...iverstone'")


def test_a_logged_exception_holding_no_secret_keeps_its_exc_info() -> None:
    """Only a traceback that held a secret loses its live exception: Ray's JSON formatter (and
    OpenTelemetry's handler) write a traceback only from ``exc_info``."""
    seen: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record)

    handler, logger = Keep(), logging.getLogger("raysaga.driver")
    logger.addHandler(handler)
    try:
        try:
            raise RuntimeError("the terminal went away")
        except RuntimeError:
            logger.exception("the progress callback raised")
    finally:
        logger.removeHandler(handler)
    [record] = seen
    assert record.exc_info is not None and "the terminal went away" in str(record.exc_info[1])
