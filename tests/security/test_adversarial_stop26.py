"""Stop 26, secrets an adversarial round found still reaching the store or a message: a password in
a URL's query (``?password=``, which libpq and SQLAlchemy accept) and ``password=...`` in an
error's free text."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

import raysaga
from raysaga.state.redact import MARKER, scrub, scrub_text

SECRET = "stop26pw" + "z" * 16


@pytest.mark.parametrize(("text", "expected"), [
    (f"postgresql://app@db:5432/x?password={SECRET}", f"postgresql://app@db:5432/x?password={MARKER}"),
    (f"postgresql://app@db/x?sslmode=require&password={SECRET}&connect_timeout=3",
     f"postgresql://app@db/x?sslmode=require&password={MARKER}&connect_timeout=3"),
    (f"https://api.example/cb?code=1&access_token={SECRET}&state=2",
     f"https://api.example/cb?code=1&access_token={MARKER}&state=2"),
    (f"login failed: password={SECRET} for app", f"login failed: password={MARKER} for app"),
    (f"DB_PASSWORD={SECRET}", f"DB_PASSWORD={MARKER}"),
    (f"{{'user': 'app', 'password': '{SECRET}'}}", f"{{'user': 'app', 'password': '{MARKER}'}}"),
    (f'{{"client_secret": "{SECRET}"}}', f'{{"client_secret": "{MARKER}"}}'),
])
def test_query_and_free_text_passwords_are_scrubbed(text: str, expected: str) -> None:
    assert scrub_text(text) == expected
    assert scrub_text(expected) == expected  # idempotent: the marker is never redacted again
    assert scrub({"error": text}) == {"error": expected}


@pytest.mark.parametrize("text", ["PWD=/home/ada", "tokens=1200 used", "input_tokens: 12345678",
                                  "password reset email sent", "the secret sauce"])
def test_ordinary_text_is_left_alone(text: str) -> None:
    assert scrub_text(text) == text


FLOW = textwrap.dedent(f'''
    from raysaga import Permanent, Workflow

    wf = Workflow("leaks", version="1")

    @wf.step()
    def connect() -> int:
        raise Permanent("cannot connect to postgresql://app@db/x?password={SECRET}: "
                        "retry with {{'password': '{SECRET}'}}")
''')


def test_a_steps_error_with_a_query_password_never_reaches_the_store(tmp_path: Path) -> None:
    """A step failing with its connection URL in the message: the userinfo password was scrubbed,
    the query one written to the node's error, the run's reason and error, and the event log."""
    path = tmp_path / "leaks_flow.py"
    path.write_text(FLOW)
    from raysaga.orchestrator.loader import load_workflow

    wf = load_workflow(f"{path}:wf")
    db = tmp_path / "raysaga.db"
    run = raysaga.run(wf, store=f"sqlite:///{db}", executor="inline", run_id="leak-1")
    assert run.status.value == "failed"
    assert MARKER in (run.status_reason or "")
    for file in tmp_path.glob("raysaga.db*"):  # the database and its WAL
        assert SECRET.encode() not in file.read_bytes(), file.name


def test_describe_store_hides_a_query_password() -> None:
    from raysaga.state import describe_store

    assert SECRET not in describe_store(f"postgresql://app@db:5432/x?password={SECRET}")
    shown = describe_store(f"postgresql://app:{SECRET}@db:5432/x?sslmode=require&sslpassword={SECRET}")
    assert shown == "postgresql://app:***@db:5432/x?sslmode=require&sslpassword=***", shown


def test_the_dashboards_token_and_its_servers_log_are_scrubbed() -> None:
    """A token given as `--token` (not through RAYSAGA_DASHBOARD_TOKEN, whose name marks it) was no
    secret to the redaction; and uvicorn's own records (an error's traceback) were never scrubbed."""
    import logging

    from raysaga.orchestrator.dashboard.security import resolve_token

    token = "stop26-token-" + "t" * 20
    assert resolve_token(token) == token
    assert scrub_text(f"saw {token}") == f"saw {MARKER}"
    record = logging.getLogger("uvicorn.error").makeRecord(
        "uvicorn.error", logging.ERROR, __file__, 1, "failed on postgresql://app@db/x?password=%s", (SECRET,), None)
    assert SECRET not in record.getMessage()


def test_a_store_written_before_a_shape_was_known_is_scrubbed_when_read(tmp_path: Path) -> None:
    """A store written by an older raysaga keeps `?password=...` in a run's reason and error, its
    node's error and its events (the write boundary did not know the shape): `list`, `status`
    (its table, --errors, --json, --summary) and `events` printed them; the dashboard did not."""
    import sqlite3

    from typer.testing import CliRunner

    from raysaga.orchestrator.cli import app

    path = tmp_path / "leaks_flow.py"
    path.write_text(FLOW)
    from raysaga.orchestrator.loader import load_workflow

    db = tmp_path / "raysaga.db"
    raysaga.run(load_workflow(f"{path}:wf"), store=f"sqlite:///{db}", executor="inline", run_id="old-1")
    with sqlite3.connect(db) as conn:  # as an older raysaga wrote them
        for table, column in (("raysaga_runs", "status_reason"), ("raysaga_runs", "error"),
                              ("raysaga_nodes", "error"), ("raysaga_events", "data")):
            conn.execute(f"UPDATE {table} SET {column} = replace({column}, 'password={MARKER}', 'password={SECRET}')")
        assert conn.execute("SELECT count(*) FROM raysaga_events WHERE data LIKE ?", (f"%{SECRET}%",)).fetchone()[0]
    for args in (("list",), ("list", "--json"), ("status", "old-1"), ("status", "old-1", "--errors"),
                 ("status", "old-1", "--json"), ("status", "old-1", "--json", "--summary"), ("events", "old-1")):
        result = CliRunner().invoke(app, [*args, "--db", f"sqlite:///{db}"])
        assert result.exit_code in (0, 1), (args, result.output)
        assert "connect" in result.stdout or args[0] == "events", (args, result.stdout)
        assert SECRET not in result.stdout + result.stderr, args
