"""Stop 51, secrets a review found reaching the store, the logs or the terminal:

1. a known secret value written as a JSON *key* (``{"values": {KEY: "primary"}}``) in a model's
   tool call was stored raw and the tool ran with it (as a value the call is refused); span
   content and the CLI's views kept such a key too;
2. ``anthropic`` 2.x logs through ``httpx2``/``httpcore2``, which the log scrub did not cover:
   ``HTTP Request: POST http://bob:PASSWORD@host`` reached an app's INFO log;
3. a bare token as a URL's user info (``https://TOKEN@host``) was never masked;
4. ``raysaga approve RUN NODE --by <secret>`` printed the secret while the store held ``[redacted]``.

The agent tests drive the real ``anthropic`` SDK against the local Messages server.
"""

from __future__ import annotations

import io
import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import raysaga
from raysaga import Ask, RetryPolicy, Workflow
from raysaga.agents import Agent, AnthropicModel, tool
from raysaga.orchestrator import tracing_attrs
from raysaga.orchestrator.cli import app
from raysaga.state import RunStatus, SqlStore, redact
from raysaga.state.redact import MARKER, scrub, scrub_data, scrub_secret_values, scrub_text
from tests.support import messages_server as ms
from tests.support.store_scan import rows_holding

KEY = "Zq9xR2mP7vK4wL8nT3bY6cH1"  # no token shape: known only as ANTHROPIC_API_KEY's value
PW = "Hunter2Hunter2xyzPW"
CALLS: list[Any] = []


@pytest.fixture(autouse=True)
def registry(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """This test's secrets only: a fresh registry, no secret-named variable of the host but the key."""
    monkeypatch.setattr(redact, "_REGISTRY", redact._Registry())
    for name in [n for n in os.environ if redact._SECRET_NAME.search(n)]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    CALLS.clear()
    yield


# 1 ------------------------------------------------------------------ a secret as a dict key


@tool
def store_config(values: dict[str, Any]) -> str:
    """Store config values."""
    CALLS.append(values)
    return "stored"


def _agent_flow(base_url: str) -> Workflow:
    wf = Workflow("stop51_keys", version="1")

    @wf.agent(Agent(name="a1", model=AnthropicModel("claude-x", base_url=base_url), tools=(store_config,),
                    shared_memory=True, max_turns=4))
    def talk(input: str) -> str:
        return input

    return wf


@pytest.mark.parametrize("prompt, call", [
    ("as-key", ms.tool_use("store_config", {"values": {KEY: "primary"}})),
    ("deep-key", ms.tool_use("store_config", {"values": {"env": [{f"key={KEY}": 1}]}})),
    ("memory-key", ms.tool_use("memory_write", {"key": "cfg", "value": {KEY: "primary"}, "expected_version": 0})),
])
def test_a_tool_call_holding_a_secret_as_a_key_is_refused_never_run_nor_stored(
        prompt: str, call: ms.Reply, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'keys.db'}"
    with ms.MessagesServer(ms.ScriptedResponder({prompt: [call, ms.text("done")]})) as srv:
        record = raysaga.run(_agent_flow(srv.base_url), prompt, store=url, executor="inline", run_id=prompt)
        later = [r.body for r in srv.requests if r.body is not None and ms.turn_of(r.body) > 0]
    assert record.status == RunStatus.COMPLETED, record.status_reason
    assert CALLS == []  # not run, with the key nor with "[redacted]"
    assert rows_holding(url, [KEY]) == ""
    store = SqlStore(url)
    try:
        nodes = {n.label: n for n in store.nodes(prompt)}
    finally:
        store.close()
    use = nodes["talk@0"].output["content"][0]
    assert use["type"] == "tool_use" and MARKER not in json.dumps(use["input"])  # stored as acted on
    result = nodes["talk@0.0"].output
    assert result["is_error"] is True and "secret" in result["content"] and "not run" in result["content"]
    assert later and KEY not in json.dumps(later)  # nor sent back to the model


def test_a_secret_as_a_key_is_scrubbed_in_spans_and_views() -> None:
    said = {"values": {KEY: "primary", f"{KEY}-b": "second"}, "plain": {"region": "eu"}}
    for clean in (scrub(said), scrub_data(said), scrub_secret_values(said)):
        assert KEY not in json.dumps(clean)
        # two keys that held it stay two entries, none dropped
        assert sorted(clean["values"].values()) == ["primary", "second"]
        assert clean["plain"] == said["plain"]
    assert scrub(said)["plain"] is said["plain"]  # what held nothing is the same object
    assert scrub({"values": {"region": "eu"}}) == {"values": {"region": "eu"}}
    clean_dict = {"a": {"b": ["c", {"long key, nothing secret": 1}]}}
    assert scrub(clean_dict) is clean_dict and scrub_data(clean_dict) is clean_dict
    # a pattern in a key as in a value: a URL with its password
    assert PW not in json.dumps(scrub({f"postgresql://app:{PW}@db/x": "primary"}))
    content = tracing_attrs.content([{"type": "tool_use", "input": {"values": {KEY: "primary"}}}])
    assert KEY not in content and MARKER in content


def test_a_secret_as_a_key_of_a_steps_output_is_not_shown_by_status(tmp_path: Path) -> None:
    """A step's output is stored as it came (never rewritten); the CLI shows it scrubbed, keys too."""
    wf = Workflow("stop51_output", version="1")

    @wf.step()
    def echo(input: dict[str, Any]) -> dict[str, Any]:
        return {"by_key": {KEY: "primary"}}

    db = f"sqlite:///{tmp_path / 'out.db'}"
    record = raysaga.run(wf, {}, store=db, executor="inline", run_id="out-1")
    assert record.status == RunStatus.COMPLETED
    for args in (["status", "out-1", "--db", db, "--json"], ["status", "out-1", "--db", db]):
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 0, result.output
        assert "primary" in result.stdout and KEY not in result.stdout + result.stderr


# 2 ------------------------------------------------------------------ the SDK's HTTP client logs


def test_the_sdks_http_client_logs_no_secret_of_its_url(tmp_path: Path) -> None:
    """``anthropic`` 2.x logs ``HTTP Request: POST <url>`` at INFO on ``httpx2`` (and traces on
    ``httpcore2`` at DEBUG): a key in the gateway's path and a password in the URL are masked."""
    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    loggers = [logging.getLogger(name) for name in ("httpx2", "httpcore2")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.DEBUG)
        logger.addHandler(handler)
    try:
        with ms.MessagesServer(ms.ScriptedResponder(default=lambda body: ms.text("fine"))) as srv:
            host = srv.base_url.split("://", 1)[1].rstrip("/")
            for i, base in enumerate((f"http://{host}/gw/{KEY}", f"http://bob:{PW}@{host}")):
                wf = Workflow(f"stop51_log{i}", version="1")

                @wf.agent(Agent(name="a1", model=AnthropicModel("claude-x", base_url=base), max_turns=2,
                                transport_retry=RetryPolicy(max_attempts=1)))
                def talk(input: str) -> str:
                    return input

                raysaga.run(wf, "hi", store=f"sqlite:///{tmp_path / 'log.db'}", executor="inline")
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.removeHandler(handler)
            logger.setLevel(level)
    logged = buf.getvalue()
    assert logged.count("HTTP Request: POST") == 2, logged  # the SDK did log both requests there
    assert f"/gw/{MARKER}/v1/messages" in logged and f"bob:{MARKER}@" in logged
    assert KEY not in logged and PW not in logged


# 3 ------------------------------------------------------------------ a bare token as a URL's user


@pytest.mark.parametrize("url, shown", [
    (f"POST https://{PW}@gw.example.com/v1/messages", f"POST https://{MARKER}@gw.example.com/v1/messages"),
    ("git clone https://abcdefghijklmnopqrst@github.com/o/r", f"git clone https://{MARKER}@github.com/o/r"),
    ("http://a1b2c3d4@h/x", f"http://{MARKER}@h/x"),
    # user names, not tokens: left
    ("postgresql://postgres@127.0.0.1:5432/test", "postgresql://postgres@127.0.0.1:5432/test"),
    ("ssh://git@github.com/o/r", "ssh://git@github.com/o/r"),
    ("see https://host/u/ada1815lovelace@example.com", "see https://host/u/ada1815lovelace@example.com"),
])
def test_a_bare_token_as_a_urls_user_info_is_masked(url: str, shown: str) -> None:
    assert scrub_text(url) == shown


# 4 ------------------------------------------------------------------ the CLI's confirmation


def _approval_flow() -> Workflow:
    wf = Workflow("stop51_approve", version="1")

    @wf.approval()
    def review(input: dict[str, Any]) -> Ask:
        return Ask(prompt="ship it?", payload={})

    return wf


@pytest.mark.parametrize("verb, said", [("approve", "approved"), ("reject", "rejected")])
def test_a_decision_by_a_secret_prints_it_scrubbed_as_stored(verb: str, said: str, tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'approve.db'}"
    rested = raysaga.run(_approval_flow(), {}, store=db, executor="inline", run_id="ap-1")
    assert rested.status == RunStatus.WAITING_HUMAN
    result = CliRunner().invoke(app, [verb, "ap-1", "review", "--by", KEY, "--db", db])
    assert result.exit_code == 0, result.output
    assert f"review of run ap-1: {said} by {MARKER}" in result.stdout
    assert KEY not in result.stdout + result.stderr
    assert rows_holding(db, [KEY]) == ""
