"""Stop 38, secrets an adversarial review found still reaching the store or the dashboard:

1. a model's key read from a variable not named like a secret (``api_key_env="LLM_GATEWAY_AUTH"``)
   was not known to the scrub, so a 401 echoing it (no ``Bearer``) landed in node errors, the run's
   reason and error, and events; ``AnthropicModel`` now declares its variable a secret, when it is
   built (the driver) and when its client is (a Ray worker, which unpickles it without ``__init__``);
2. shapes the patterns missed: ``redis://:pw@host``, a raw ``/`` or ``@`` in a URL's password,
   ``PGPASSWORD=``, an escaped quote in a JSON value, a quoted libpq value with a space, AWS's
   ``aws_secret_access_key``, ``"token"``/``"private_key"`` JSON keys, PEM private keys;
3. the dashboard's agent node view showed a turn's and a tool call's text unscrubbed;
4. a model ``cost()`` error (and its returned value) was cut before it was scrubbed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

import raysaga
from raysaga import Workflow
from raysaga.agents import Agent, AnthropicModel, tool
from raysaga.agents.messages import ModelResponse, Usage
from raysaga.agents.models import ScriptedModel, text_reply
from raysaga.orchestrator.dashboard.server import build
from raysaga.orchestrator.machine.budgets import model_cost
from raysaga.state import RunStatus, SqlStore
from raysaga.state.redact import MARKER, scrub, scrub_text
from tests.support import messages_server as ms
from tests.support.store_scan import rows_holding


def pieces(secret: str, n: int = 10) -> list[str]:
    """The secret and every ``n``-character piece of it: what a cut or a partial scrub leaves."""
    return [secret, *(secret[i:i + n] for i in range(len(secret) - n + 1))]


# -- 1. a model's key variable is a secret whatever its name ---------------------------------------

class KeyEchoingGateway(ms.MessagesServer):
    """A gateway refusing every request with a 401 that quotes the bare key (no ``Bearer``)."""

    def _validate(self, method: str, path: str, headers: Mapping[str, str], body: Any) -> Any:
        sent = headers.get("x-api-key") or headers.get("authorization", "").removeprefix("Bearer ")
        return ms.fault(401, f"unknown key {sent}")


def gateway_key() -> tuple[str, str]:
    """A variable name nothing in this process registered, and a key with no token shape."""
    return f"LLM_GATEWAY_AUTH_{uuid.uuid4().hex[:8].upper()}", f"gw-live-{uuid.uuid4().hex}"


wf = Workflow("leaks_stop38")


def test_a_401_echoing_a_key_from_a_custom_variable_never_reaches_the_store(
        store_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    name, key = gateway_key()
    monkeypatch.setenv(name, key)
    assert scrub_text(f"unknown key {key}") == f"unknown key {key}"  # the name alone says nothing
    with KeyEchoingGateway(lambda body: ms.text("unused")) as gateway:
        flow = Workflow(f"leaks_stop38_gw_{uuid.uuid4().hex[:6]}")

        @flow.agent(Agent("gate", AnthropicModel("claude-haiku-4-5", base_url=gateway.base_url, api_key_env=name)))
        def ask(input: dict[str, Any]) -> str:
            return "hello"

        record = raysaga.run(flow, {}, store=store_url, executor="inline")
        assert gateway.requests and gateway.requests[0].api_key == key  # the key was sent, and echoed
    assert record.status == RunStatus.FAILED
    assert MARKER in (record.status_reason or ""), record.status_reason
    assert rows_holding(store_url, pieces(key)) == ""


WORKER = """
import pickle, sys
from raysaga.agents.messages import ModelRequest
from raysaga.state.redact import scrub_text
model = pickle.loads(sys.stdin.buffer.read())
try:
    model.complete(ModelRequest(model="claude-haiku-4-5", messages=[{"role": "user", "content": "hi"}]))
except Exception as exc:
    print(scrub_text(f"{type(exc).__name__}: {exc}"))
"""


def test_a_worker_that_unpickled_the_model_knows_its_key_is_a_secret(tmp_path: Path) -> None:
    """A Ray worker gets the model unpickled (no ``__post_init__``) in a process of its own: its
    client registers the variable before the call whose error quotes the key."""
    cloudpickle = pytest.importorskip("ray.cloudpickle")  # how Ray ships the model to its workers
    name, key = gateway_key()
    with KeyEchoingGateway(lambda body: ms.text("unused")) as gateway:
        model = AnthropicModel("claude-haiku-4-5", base_url=gateway.base_url, api_key_env=name)
        done = subprocess.run([sys.executable, "-c", WORKER], input=cloudpickle.dumps(model), capture_output=True,
                              env={**os.environ, name: key}, cwd=tmp_path, timeout=120)
        assert gateway.requests and gateway.requests[0].api_key == key
    said = done.stdout.decode()
    assert done.returncode == 0, done.stderr.decode()
    assert "AuthenticationError" in said and MARKER in said and key not in said, said


# -- 2. shapes of secrets the patterns missed ------------------------------------------------------

PW = "S3cr3tPw" + "q" * 8


@pytest.mark.parametrize(("text", "expected"), [
    (f"redis://:{PW}@cache:6379/0", f"redis://:{MARKER}@cache:6379/0"),
    (f"postgresql://app:pa/{PW}@db/prod", f"postgresql://app:{MARKER}@db/prod"),
    (f"postgresql://app:p@{PW}@db/prod?x=a@b", f"postgresql://app:{MARKER}@db/prod?x=a@b"),
    (f"mongodb+srv://app:p@ss/{PW}@cluster0.example.net/db", f"mongodb+srv://app:{MARKER}@cluster0.example.net/db"),
    (f"amqp://guest:gu#{PW}@rabbit:5672//", f"amqp://guest:{MARKER}@rabbit:5672//"),
    (f"(ran: PGPASSWORD={PW} pg_dump prod)", f"(ran: PGPASSWORD={MARKER} pg_dump prod)"),
    (f'{{"dbPassword": "{PW}"}}', f'{{"dbPassword": "{MARKER}"}}'),
    (f'{{"password": "hun\\"{PW}", "user": "ada"}}', f'{{"password": "{MARKER}", "user": "ada"}}'),
    (f'body {{\\"password\\": \\"hun\\\\\\"{PW}\\"}}', f'body {{\\"password\\": \\"{MARKER}\\"}}'),
    (f"host=db user=app password='hunter2 {PW}' dbname=x", f"host=db user=app password='{MARKER}' dbname=x"),
    (f"aws_secret_access_key = {PW}/K7MDENG", f"aws_secret_access_key = {MARKER}"),
    (f"AWS_SECRET_ACCESS_KEY={PW}", f"AWS_SECRET_ACCESS_KEY={MARKER}"),
    (f'{{"token": "{PW}"}}', f'{{"token": "{MARKER}"}}'),
    (f"{{'private_key': 'a b {PW}'}}", f"{{'private_key': '{MARKER}'}}"),
    (f"-----BEGIN RSA PRIVATE KEY-----\nMII{PW}\n-----END RSA PRIVATE KEY-----",
     f"-----BEGIN RSA PRIVATE KEY-----{MARKER}-----END RSA PRIVATE KEY-----"),
    (f"key: -----BEGIN OPENSSH PRIVATE KEY-----\\nb3Bl{PW}", f"key: -----BEGIN OPENSSH PRIVATE KEY-----{MARKER}"),
])
def test_secret_shapes_are_scrubbed(text: str, expected: str) -> None:
    assert scrub_text(text) == expected
    assert scrub_text(expected) == expected  # idempotent: the marker is never redacted again
    assert scrub({"error": text}) == {"error": expected}


@pytest.mark.parametrize("text", [
    "GET https://api.example.com:8443/users/ada@example.com failed",
    "https://host:8080?email=ada@example.com",
    "ray://head:10001 unreachable; mail ops@example.com",
    "redis://cache:6379/0 and a@b",
    "postgresql://app@db:5432/x",
    "see https://docs.example.com/a:b and task-12345678",
    "nopassword: true",
    "Passwords must match",
    "password reset email sent to ada@example.com",
    "password=''",
    '{"input_tokens": 12, "output_tokens": 40, "stop_reason": "end_turn"}',
    'the model said "the token budget of 1000 tokens is spent"',
    "private key not found at /etc/ssl/key.pem",
    "PWD=/home/ada",
])
def test_ordinary_text_is_unchanged(text: str) -> None:
    assert scrub_text(text) is text


def test_a_dict_key_naming_a_secret_is_redacted_whole() -> None:
    data = {"DB_PASSWORD": "abcdefghijk", "token": "abcdefghijk123", "private_key": "k" * 20,
            "webhook_secret": "w" * 12, "input_tokens": 12, "next": "page-2-of-9"}
    assert scrub(data) == {"DB_PASSWORD": MARKER, "token": MARKER, "private_key": MARKER,
                           "webhook_secret": MARKER, "input_tokens": 12, "next": "page-2-of-9"}


@pytest.mark.parametrize("text", ["://a:" * 20_000, "x://ab:cd" * 20_000, "password='x " * 20_000,
                                  '{"token": "' * 20_000, "-----BEGIN PRIVATE KEY-----" * 5_000])
def test_the_patterns_stay_linear_on_hostile_text(text: str) -> None:
    import time

    started = time.perf_counter()
    scrub_text(text)
    assert time.perf_counter() - started < 2.0  # quadratic scans took seconds to minutes


# -- 3. the dashboard's agent node view -------------------------------------------------------------

DB_PW, BEARER, AWS = "Tr0ub4dor3pwXYZ", "abcdEFGH12345678ijkl", "AKIAIOSFODNN7EXAMPLE"


@tool
def read_config(name: str) -> str:
    """Read a config entry."""
    if name == "long":  # the password straddles the view's 2,000-character cut
        return "x" * 1980 + f"postgresql://app:{DB_PW}@db.internal/prod"
    return f"db=postgresql://app:{DB_PW}@db.internal/prod; Authorization: Bearer {BEARER}"


def asks(*names: str) -> ModelResponse:
    return ModelResponse(content=[{"type": "tool_use", "id": f"t{i}", "name": "read_config", "input": {"name": n}}
                                  for i, n in enumerate(names)], stop_reason="tool_use",
                         usage=Usage(input_tokens=1, output_tokens=1))


@wf.agent(Agent("a", ScriptedModel(default=(asks("db", "long"), text_reply(f"the AWS key is {AWS}"))),
                tools=(read_config,)))
def ask_config(input: dict[str, Any]) -> str:
    return "what is the db config?"


def test_the_dashboard_shows_turn_and_tool_text_scrubbed(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'dash.db'}"
    record = raysaga.run(wf, {}, store=url, executor="inline")
    assert record.status == RunStatus.COMPLETED
    assert rows_holding(url, [DB_PW, AWS])  # the user's data as stored: the view must scrub it
    store = SqlStore(url)
    try:
        app, _ = build(store)
        with TestClient(app, base_url="http://127.0.0.1:8765") as client:
            answer = client.get(f"/api/runs/{record.run_id}/nodes/ask_config")
    finally:
        store.close()
    assert answer.status_code == 200, answer.text
    body = answer.text
    assert [s for s in [*pieces(DB_PW), *pieces(BEARER), *pieces(AWS)] if s in body] == []
    texts = [t.get("text") or "" for t in answer.json()["turns"]]
    assert f"the AWS key is {MARKER}" in texts
    assert any(t.startswith("x" * 1980 + "postgresql://app:[") for t in texts), texts


# -- 4. a model's cost() error, scrubbed before it is cut ------------------------------------------

class Pricing:
    """A model of one's own whose ``cost()`` fails quoting a key, or returns one."""

    name = "pricing"

    def __init__(self, fail: str | None = None, returns: Any = None) -> None:
        self.fail, self.returns = fail, returns

    def cost(self, usage: Usage) -> Any:
        if self.fail is not None:
            raise RuntimeError(self.fail)
        return self.returns


def test_a_cost_error_is_scrubbed_before_it_is_cut(monkeypatch: pytest.MonkeyPatch) -> None:
    key = f"plain{uuid.uuid4().hex}{uuid.uuid4().hex}"
    monkeypatch.setenv("STOP38_PRICING_API_KEY", key)
    head = "its model's cost() raised RuntimeError: "
    filler = "z" * (500 - len(head) - 21 - 20)  # the key straddles the 500-character cut
    _, why = model_cost(Pricing(fail=f"{filler} pricing lookup with {key} failed"), Usage())
    assert why is not None and why.startswith(head) and len(why) <= 500
    assert [p for p in pieces(key, 8) if p in why] == [], why
    _, why = model_cost(Pricing(returns="p" * 60 + key), Usage())  # repr cut to 80 characters
    assert why is not None and MARKER in why and [p for p in pieces(key, 8) if p in why] == [], why
