"""Invariant 7 end to end: canaries never reach the store, the event log, the CLI or the logs.

Four canaries, each in a place a secret really turns up:

- an environment variable named like a secret (``ACME_SERVICE_TOKEN``), quoted by a step's exception;
- the Anthropic API key, echoed in a 401 body by a gateway (``Authorization: Bearer …``), reached
  through the real ``anthropic`` SDK and ``tests/support/messages_server.py``;
- a ``Secret`` input field given as a literal, which a step's exception quotes;
- the same ``Secret`` field given as ``{"env": NAME}`` (a reference).

The run is driven by ``python -m raysaga run … --executor inline`` in a subprocess, read back with
``events``, ``status --json``, ``status`` and ``list``; then every byte of the SQLite file (+ WAL)
or every PostgreSQL row, and every output, is searched for each canary and for fragments of it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, select

import raysaga
from raysaga.state import RunStatus, SqlStore
from raysaga.state.schema import metadata
from tests.support import messages_server as ms

FLOW = textwrap.dedent('''
    import hashlib
    import os
    from typing import Any

    from pydantic import BaseModel

    from raysaga import Permanent, Workflow
    from raysaga.agents import Agent, AnthropicModel
    from raysaga.orchestrator.secrets import Secret

    class Order(BaseModel):
        amount: int
        token: Secret

    wf = Workflow("leaky")
    agent = Agent("gate", AnthropicModel("claude-haiku-4-5"))

    @wf.agent(agent, critical=False, on_failure="pass")
    def ask(input: Order) -> str:
        return "hello"

    @wf.step(critical=False, on_failure="pass")
    def env_leak() -> int:
        raise RuntimeError("connect failed: token=" + os.environ["ACME_SERVICE_TOKEN"])

    @wf.step()
    def pay(input: Order, ask: Any, env_leak: Any) -> str:
        token = input.token.get()
        raise Permanent(f"vendor refused {token} (amount {input.amount})")

    # resume/re-supply: the step proves it got the right value without revealing it
    later = Workflow("later")

    @later.step()
    def first(input: Order) -> int:
        return input.amount

    @later.step()
    def use(input: Order, first: int) -> str:
        return hashlib.sha256(input.token.get().encode()).hexdigest()
''')


class EchoingGateway(ms.MessagesServer):
    """A gateway that refuses every request with a 401 echoing the credentials it received."""

    def _validate(self, method: str, path: str, headers: Mapping[str, str], body: Any) -> Any:
        return ms.fault(401, f"unauthorized: Authorization: {headers.get('authorization')}; "
                             f"x-api-key: {headers.get('x-api-key')}; headers={dict(headers)!r}")


def canary(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}{uuid.uuid4().hex[:8]}"


def cli(cwd: Path, env: Mapping[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "raysaga", *args], cwd=cwd, env={**os.environ, **env},
                          capture_output=True, text=True, timeout=180)


def database_bytes(url: str, folder: Path) -> dict[str, bytes]:
    """Every byte the store holds: the SQLite files, or every row of every raysaga table."""
    if url.startswith("sqlite"):
        return {f"file {f.name}": f.read_bytes() for f in sorted(folder.glob("store.db*"))}
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return {f"table {t.name}": repr(conn.execute(select(t)).all()).encode() for t in metadata.sorted_tables}
    finally:
        engine.dispose()


def leaks(secret: str, places: Mapping[str, bytes]) -> list[str]:
    """Where ``secret`` or any 12-character piece of its random tail appears."""
    tail = secret.split("-", 1)[1]
    pieces = {secret, *(tail[i:i + 12] for i in range(len(tail) - 11))}
    return sorted({where for where, data in places.items() for p in pieces if p.encode() in data})


def test_canaries_never_reach_the_store_the_cli_or_the_output(store_url: str, tmp_path: Path) -> None:
    env_canary = canary("envtok")
    api_key = canary("sk-ant-api03")
    literal = canary("literal")
    (tmp_path / "flows.py").write_text(FLOW)
    db = store_url if not store_url.startswith("sqlite") else f"sqlite:///{tmp_path / 'store.db'}"
    run_id = f"leaky-{uuid.uuid4().hex[:8]}"

    with EchoingGateway(lambda body: ms.text("unused")) as gateway:
        env = {"ACME_SERVICE_TOKEN": env_canary, "ANTHROPIC_API_KEY": api_key,
               "ANTHROPIC_BASE_URL": gateway.base_url}
        started = cli(tmp_path, env, "run", "flows.py:wf", "--run-id", run_id, "--db", db, "--executor", "inline",
                      "--input", json.dumps({"amount": 5, "token": literal}))
        # the gateway did receive the key, and echoed it: the test is not vacuous
        assert gateway.requests and gateway.requests[0].api_key == api_key

    assert started.returncode == 1, started.stderr
    outputs = {"run": started}
    for name, args in {"events": ["events", run_id], "status --json": ["status", run_id, "--json"],
                       "status": ["status", run_id], "list": ["list"], "list --json": ["list", "--json"]}.items():
        outputs[name] = cli(tmp_path, env, *args, "--db", db)
        assert outputs[name].returncode in (0, 1), (name, outputs[name].stderr)

    status = json.loads(outputs["status --json"].stdout)
    assert status["status"] == "failed"
    errors = {n["step"]: n["error"] for n in status["nodes"] if n["error"]}
    # the three failure paths were exercised, and what was secret in them is marked
    assert "[redacted]" in errors["env_leak"]["message"]
    assert "[redacted]" in errors["pay"]["message"] and "amount 5" in errors["pay"]["message"]
    assert "401" in json.dumps(errors) and errors["ask"]["type"] == "ModelCallFailed"
    assert status["input"]["token"] == {"$secret": {"memory": status["input"]["token"]["$secret"]["memory"],
                                                    "field": "token"}}

    places = database_bytes(db, tmp_path)
    assert places, "no database bytes were read"
    for name, done in outputs.items():
        places[f"`raysaga {name}` stdout"] = done.stdout.encode()
        places[f"`raysaga {name}` stderr"] = done.stderr.encode()
    for secret in (env_canary, api_key, literal):
        assert leaks(secret, places) == [], secret


def test_a_secret_given_by_reference_is_read_at_use_and_survives_a_resume(tmp_path: Path) -> None:
    value = canary("vendor")
    (tmp_path / "flows.py").write_text(FLOW)
    db = f"sqlite:///{tmp_path / 'store.db'}"
    create = textwrap.dedent(f'''
        import raysaga, flows
        raysaga.create_run(flows.later, {{"amount": 2, "token": {{"env": "VENDOR_TOKEN"}}}}, store={db!r},
                           run_id="by-ref", workflow_ref="flows:later")
    ''')
    made = subprocess.run([sys.executable, "-c", create], cwd=tmp_path, env={**os.environ, "VENDOR_TOKEN": value},
                          capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr
    # another process, which has the variable: the step gets exactly the value
    done = cli(tmp_path, {"VENDOR_TOKEN": value}, "resume", "by-ref", "--db", db, "--executor", "inline", "--json")
    assert done.returncode == 0, done.stderr
    import hashlib

    assert json.loads(done.stdout)["output"] == {"use": hashlib.sha256(value.encode()).hexdigest()}
    assert leaks(value, database_bytes(db, tmp_path)) == []


def test_a_literal_secret_is_not_silently_wrong_in_a_new_process(tmp_path: Path) -> None:
    value = canary("literal")
    (tmp_path / "flows.py").write_text(FLOW)
    db = f"sqlite:///{tmp_path / 'store.db'}"
    create = textwrap.dedent(f'''
        import raysaga, flows
        raysaga.create_run(flows.later, {{"amount": 2, "token": {value!r}}}, store={db!r}, run_id="lit",
                           workflow_ref="flows:later")
    ''')
    made = subprocess.run([sys.executable, "-c", create], cwd=tmp_path, env=dict(os.environ), capture_output=True,
                          text=True, timeout=120)
    assert made.returncode == 0, made.stderr

    resumed = cli(tmp_path, {}, "resume", "lit", "--db", db, "--executor", "inline")
    assert resumed.returncode != 0
    shown = resumed.stderr + cli(tmp_path, {}, "status", "lit", "--db", db, "--json").stdout
    assert "SecretUnavailableError" in shown or "error:" in resumed.stderr
    assert "'token'" in shown and "RAYSAGA_SECRET_TOKEN" in shown

    # re-supplied through the variable the message names: the right value, and still not stored
    retried = cli(tmp_path, {"RAYSAGA_SECRET_TOKEN": value}, "retry", "lit", "--db", db, "--executor", "inline",
                  "--json")
    if retried.returncode == 2 and "only a failed run" in retried.stderr:  # the resume refused before running
        retried = cli(tmp_path, {"RAYSAGA_SECRET_TOKEN": value}, "resume", "lit", "--db", db, "--executor",
                      "inline", "--json")
    assert retried.returncode == 0, retried.stderr
    import hashlib

    assert json.loads(retried.stdout)["output"] == {"use": hashlib.sha256(value.encode()).hexdigest()}
    places = database_bytes(db, tmp_path)
    places.update({"resume": (resumed.stdout + resumed.stderr).encode(),
                   "retry": (retried.stdout + retried.stderr).encode()})
    assert leaks(value, places) == []


RAY_FLOW = textwrap.dedent('''
    from raysaga import Permanent, Workflow

    CANARY = {canary!r}
    wf = Workflow("ray_leaky")

    @wf.step()
    def call() -> int:
        raise Permanent(f"gateway said 401: Authorization: Bearer {{CANARY}} / key {{CANARY}}")
''')


@pytest.mark.ray
def test_no_canary_in_the_ray_session_logs(ray_session: str, tmp_path: Path) -> None:
    import ray
    from ray import cloudpickle

    secret = canary("sk-ant-api03")
    (tmp_path / "ray_leaky_flow.py").write_text(RAY_FLOW.format(canary=secret))
    from raysaga.orchestrator.loader import load_workflow

    wf = load_workflow(f"{tmp_path / 'ray_leaky_flow.py'}:wf")
    # the workers cannot import it (cloudpickle is untyped)
    cloudpickle.register_pickle_by_value(sys.modules["ray_leaky_flow"])  # type: ignore[no-untyped-call]
    db = f"sqlite:///{tmp_path / 'store.db'}"
    record = raysaga.run(wf, store=db, run_id="ray-leaky", executor="ray", address=ray_session)
    assert record.status == RunStatus.FAILED
    store = SqlStore(db)
    try:
        node = store.nodes("ray-leaky")[0]
    finally:
        store.close()
    assert node.error is not None and "[redacted]" in node.error["message"]  # it ran, on a worker, and failed

    # Ray declares its private global node as a bare `None`: it is untyped
    session = Path(ray._private.worker._global_node.get_session_dir_path())  # type: ignore[attr-defined]
    logs = [p for p in session.rglob("*") if p.is_file() and p.stat().st_size < 50_000_000]
    assert logs, f"no files under the Ray session dir {session}"
    places = {str(p.relative_to(session)): p.read_bytes() for p in logs}
    places.update(database_bytes(db, tmp_path))
    assert leaks(secret, places) == []
