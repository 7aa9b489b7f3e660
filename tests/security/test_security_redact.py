"""``raysaga.state.redact``: what is a secret, and the store's write boundary as a safety net.

End-to-end canaries (CLI, messages server, Ray logs, PostgreSQL rows) are in test_security_secrets.py.
"""

from __future__ import annotations

import io
import logging
import uuid

import pytest

from raysaga.state import Batch, NewEvent, NewRun, NodeStatus, NodeWrite, RunStatus, RunUpdate, SqlStore
from raysaga.state.redact import MARKER, RedactingFilter, register_secret, register_secret_env, scrub, scrub_text


def canary(prefix: str = "canary") -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


@pytest.mark.parametrize("name", ["ANTHROPIC_API_KEY", "OPENAI_API_KEY", "MY_SERVICE_TOKEN", "DB_PASSWORD",
                                  "vendor_secret", "GOOGLE_CREDENTIALS"])
def test_values_of_secret_named_env_vars_are_scrubbed(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    value = canary()
    monkeypatch.setenv(name, value)
    assert scrub_text(f"failed with {value}!") == f"failed with {MARKER}!"
    # a change of the environment is seen at once (no stale cache)
    other = canary()
    monkeypatch.setenv(name, other)
    assert scrub_text(f"x {other} y") == f"x {MARKER} y"


def test_short_values_and_other_names_are_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TINY_KEY", "abc")
    monkeypatch.setenv("GREETING", "hello-world-value")
    assert scrub_text("abc and hello-world-value") == "abc and hello-world-value"


def test_registered_names_and_values(monkeypatch: pytest.MonkeyPatch) -> None:
    value, literal = canary(), canary("literal")
    monkeypatch.setenv("VENDOR_THING", value)
    assert scrub_text(value) == value  # the name says nothing
    register_secret_env("VENDOR_THING")
    register_secret(literal)
    assert scrub_text(f"{value} / {literal}") == f"{MARKER} / {MARKER}"


@pytest.mark.parametrize(("text", "expected"), [
    ("Authorization: Bearer abc.def-123456789", f"Authorization: Bearer {MARKER}"),
    ("{'authorization': 'Basic dXNlcjpwYXNzd29yZA=='}", f"{{'authorization': 'Basic {MARKER}'}}"),
    ('"x-api-key": "k-1234567890"', f'"x-api-key": "{MARKER}"'),
    ("X-Api-Key: k-1234567890 sent", f"X-Api-Key: {MARKER} sent"),
    ("token was bearer zzzzzzzzzzzz", f"token was bearer {MARKER}"),
    ("sk-ant-api03-AbCdEf0123456789_xyz rejected", f"{MARKER} rejected"),
    ("key sk-proj-ABCDEFGHIJKLMNOPQRSTUVWXYZ", f"key {MARKER}"),
    ("postgresql://app:hunter2hunter2@db:5432/x", f"postgresql://app:{MARKER}@db:5432/x"),
    ("ghp_0123456789abcdefghij0123", MARKER),
    ("AKIAABCDEFGHIJKLMNOP", MARKER),
])
def test_secret_shapes_in_text(text: str, expected: str) -> None:
    assert scrub_text(text) == expected


@pytest.mark.parametrize("text", [
    "step 'pay' failed: ValueError: amount must be positive",
    "ANTHROPIC_API_KEY is not set on the worker: export it, or use ScriptedModel",
    "see https://docs.example.com/a:b and task-12345678",
    "Bearer short",
])
def test_clean_text_is_unchanged(text: str) -> None:
    assert scrub_text(text) is text


def test_scrub_walks_json_and_redacts_secret_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    value = canary()
    monkeypatch.setenv("SOME_API_KEY", value)
    items = [f"saw {value}", 3, None, {"password": "pw"}]
    data = {"headers": {"Authorization": "Bearer q", "X-API-KEY": "short", "accept": "json"},
            "tokens": 120, "items": items, "ok": True}
    out = scrub(data)
    assert out == {"headers": {"Authorization": MARKER, "X-API-KEY": MARKER, "accept": "json"},
                   "tokens": 120, "items": [f"saw {MARKER}", 3, None, {"password": MARKER}], "ok": True}
    assert items[0] == f"saw {value}"  # the input is not mutated
    clean = {"node": "pay", "attempt": 2, "error": {"type": "ValueError", "message": "bad amount"}}
    assert scrub(clean) is clean


def test_the_log_filter_scrubs_messages_args_and_tracebacks(monkeypatch: pytest.MonkeyPatch) -> None:
    value = canary("sk-ant")
    monkeypatch.setenv("ANTHROPIC_API_KEY", value)
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    logger = logging.getLogger("raysaga.driver")
    assert any(isinstance(f, RedactingFilter) for f in logger.filters)
    top = logging.getLogger("raysaga")
    top.addHandler(handler)  # the children's records reach it by propagation
    old_level = logger.level
    logger.setLevel(logging.DEBUG)
    try:
        logger.warning("heartbeat failed: %s", f"connect with key={value}")
        try:
            raise RuntimeError(f"Authorization: Bearer {value}")
        except RuntimeError:
            logger.exception("run %s crashed", "r1")
        logging.getLogger("raysaga.some.new.module").error("late logger %s", value)
        sql = logging.getLogger("sqlalchemy.engine.Engine")
        sql.addHandler(handler)
        try:
            sql.error("[parameters] (%r,)", value)  # a library's record, scrubbed as it is made
        finally:
            sql.removeHandler(handler)
    finally:
        top.removeHandler(handler)
        logger.setLevel(old_level)
    text = stream.getvalue()
    assert "heartbeat failed" in text and "RuntimeError" in text and "late logger [redacted]" in text
    assert "[parameters] ('[redacted]',)" in text
    assert value not in text and value[-12:] not in text


def test_the_store_boundary_scrubs_errors_events_and_reasons(store_url: str,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    value = canary("sk-ant")
    monkeypatch.setenv("ANTHROPIC_API_KEY", value)
    store = SqlStore(store_url)
    try:
        run_id = f"redact-{uuid.uuid4().hex[:8]}"
        run = store.create_run(NewRun(run_id=run_id, workflow_name="w", workflow_version="1", definition_hash="h",
                                      input={"user": "data"}, trace_id="t"))
        run = store.transition(run_id, run.version, RunStatus.RUNNING, reason=f"started by {value}",
                               data={"note": value})
        lease = store.claim(run_id, "me", ttl=30)
        error = {"type": "APIStatusError", "message": f"401 echo Authorization: Bearer {value}",
                 "traceback": f"Traceback ...\n  key={value}\n"}
        store.commit(lease, Batch(
            nodes=[NodeWrite(node_id="pay", fan_index=-1, status=NodeStatus.FAILED, attempt=1, error=error),
                   NodeWrite(node_id="ok", fan_index=-1, status=NodeStatus.COMPLETED, attempt=1,
                             output={"echo": value})],
            events=[NewEvent(kind="node_failed", node_id="pay", data={"error": error})],
            run=RunUpdate(status=RunStatus.FAILED, status_reason=f"step pay failed: {value}",
                          error=error, set_error=True)))
        got = store.get_run(run_id)
        nodes = {n.node_id: n for n in store.nodes(run_id)}
        events = [e.model_dump_json() for e in store.events(run_id)]
    finally:
        store.close()
    stored = [got.status_reason or "", str(got.error), str(nodes["pay"].error), *events]
    assert [s for s in stored if value in s] == []
    assert MARKER in str(nodes["pay"].error) and MARKER in (got.status_reason or "")
    # a step's output is the user's data: never changed (changing it would be a wrong result)
    assert nodes["ok"].output == {"echo": value}


def test_a_tool_error_quoting_a_secret_is_scrubbed_before_the_model_or_the_store(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from raysaga.agents import ToolError, tool
    from raysaga.agents.tools import run_tool

    value = canary()
    monkeypatch.setenv("CRM_API_TOKEN", value)

    @tool
    def lookup(customer: str) -> str:
        """Look a customer up."""
        raise ToolError(f"CRM refused token {value} for {customer}")

    result = run_tool(lookup, {"customer": "ada"}, None)
    assert result == {"content": f"CRM refused token {MARKER} for ada", "is_error": True}


def test_a_step_failure_record_is_scrubbed_before_it_is_cut(monkeypatch: pytest.MonkeyPatch) -> None:
    from raysaga.orchestrator.task import NodeOutcome

    value = canary("sk-ant-api03")
    monkeypatch.setenv("ANTHROPIC_API_KEY", value)
    # the secret straddles the 2000-character cut of the message: no prefix of it may survive
    exc = RuntimeError("x" * 1990 + value)
    outcome = NodeOutcome.failure(exc, transient=False, started_at=0.0)
    assert outcome.error is not None
    assert value[:12] not in outcome.error["message"] and value[:12] not in outcome.error["traceback"]
    assert outcome.error["message"] == "x" * 1990 + MARKER


def test_json_text_is_parsed_for_secret_values_only_when_it_can_hold_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """``json_may_hold_secret_value`` lets an agent's turns skip the parse and walk of
    ``scrub_secret_values`` when no known value occurs in their text; a value a JSON encoder
    would escape (a quote, a backslash, a slash, non-ASCII) can hide in it, so then every text is parsed."""
    import os

    from raysaga.state import jsoncodec, redact

    monkeypatch.setattr(redact, "_REGISTRY", redact._Registry())  # this test's secrets only
    for name in [n for n in os.environ if redact._SECRET_NAME.search(n)]:
        monkeypatch.delenv(name)
    value = canary()
    said = jsoncodec.dumps({"content": [{"type": "text", "text": f"the key is {value}."}]})
    clean = jsoncodec.dumps({"content": [{"type": "text", "text": "nothing here"}]})
    assert not redact.json_may_hold_secret_value(said)  # nothing known yet
    monkeypatch.setenv("MY_SERVICE_TOKEN", value)
    assert redact.json_may_hold_secret_value(said) and not redact.json_may_hold_secret_value(clean)
    for odd in ['pa"ss-' + canary(), "back\\slash-" + canary(), "sl/ash-" + canary(), "clé-" + canary()]:
        monkeypatch.setenv("OTHER_PASSWORD", odd)
        assert redact.json_may_hold_secret_value(clean)  # it might be there, escaped
        hidden = jsoncodec.dumps({"text": f"{odd}!"})
        assert redact.scrub_secret_values(jsoncodec.loads(hidden)) == {"text": f"{MARKER}!"}
