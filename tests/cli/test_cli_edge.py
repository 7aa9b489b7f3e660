"""The CLI's edge: bad --input, bad run ids, bad numbers, a store that is not there, and
exceptions raysaga did not raise itself. Always exit 2 with one line (the traceback only with
--debug), never a traceback by default, and nothing written to the store."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from raysaga.state import open_store
from tests.support.cli import invoke, one_line_error

FLOW = textwrap.dedent('''
    from pydantic import BaseModel
    from raysaga import Workflow

    wf = Workflow("edge", version="1")

    class Order(BaseModel):
        sku: str
        qty: int
        card: str

    @wf.step()
    def take(input: Order) -> int:
        return input.qty

    free = Workflow("free", version="1")

    @free.step()
    def echo(input) -> object:
        return input
''')


@pytest.fixture
def flow(tmp_path: Path) -> str:
    path = tmp_path / "edge_flow.py"
    path.write_text(FLOW)
    return str(path)




def no_runs(url: str) -> None:
    store = open_store(url)
    try:
        assert store.list_runs() == []
    finally:
        store.close()


# ------------------------------------------------------------------------------- --input


def test_input_invalid_utf8_names_the_byte_offset(flow: str, sqlite_url: str, tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_bytes(b'{"sku": "caf\xe9", "qty": 1, "card": "x"}')
    code, _, err = invoke("run", f"{flow}:wf", "--input", f"@{bad}", "--db", sqlite_url, "--executor", "inline")
    one_line_error(code, err, "is not UTF-8: byte 12 (0xe9)")
    no_runs(sqlite_url)


@pytest.mark.parametrize(("text", "message"), [
    ('{"sku": "a", "qty": 1, "qty": 100, "card": "x"}', "the key 'qty' is given twice in one object"),
    ('{"sku": "a", "qty": 1, "card": "x", "extra": [{"k": 1, "k": 1}]}', "the key 'k' is given twice"),
    ('{"sku": "a", "qty": 1e400, "card": "x"}', "the number 1e400 is too large for a 64-bit float"),
])
def test_input_ambiguous_or_overflowing_json_is_refused(flow: str, sqlite_url: str, text: str, message: str) -> None:
    """Python's JSON parser keeps the last of two equal keys silently (an order for 100, not 1)
    and reads 1e400 as infinity, then named "inf", which the user never typed."""
    code, _, err = invoke("run", f"{flow}:wf", "--input", text, "--db", sqlite_url, "--executor", "inline")
    one_line_error(code, err, message)
    no_runs(sqlite_url)


@pytest.mark.parametrize("depth", [1_000, 100_000])
def test_input_nested_too_deep_is_clean(flow: str, sqlite_url: str, tmp_path: Path, depth: int) -> None:
    deep = tmp_path / "deep.json"
    deep.write_text("[" * depth + "]" * depth)
    code, _, err = invoke("run", f"{flow}:free", "--input", f"@{deep}", "--db", sqlite_url, "--executor", "inline")
    one_line_error(code, err, "is not valid JSON")
    assert "levels" in err
    no_runs(sqlite_url)


def test_input_directory_missing_file_and_stdin(flow: str, sqlite_url: str, tmp_path: Path) -> None:
    code, _, err = invoke("run", f"{flow}:free", "--input", f"@{tmp_path}", "--db", sqlite_url)
    one_line_error(code, err, "is a directory")
    code, _, err = invoke("run", f"{flow}:free", "--input", f"@{tmp_path / 'nope.json'}", "--db", sqlite_url)
    one_line_error(code, err, "does not exist")
    no_runs(sqlite_url)
    code, out, err = invoke("run", f"{flow}:wf", "--input", "@-", "--db", sqlite_url, "--executor", "inline",
                            "--run-id", "from-stdin", "--json", input='{"sku": "a", "qty": 3, "card": "c"}')
    assert code == 0, err
    assert json.loads(out)["output"] == {"take": 3}


def test_input_above_the_cap_is_refused_before_reading(flow: str, sqlite_url: str, tmp_path: Path) -> None:
    big = tmp_path / "big.json"
    with big.open("wb") as f:  # sparse: 64 GiB that would exhaust memory if it were read
        f.truncate(64 * 1024 ** 3)
    code, _, err = invoke("run", f"{flow}:free", "--input", f"@{big}", "--db", sqlite_url)
    one_line_error(code, err, f"is {64 * 1024 ** 3} bytes, above the input cap of {16 * 1024 * 1024} bytes")
    small = tmp_path / "small.json"
    small.write_text(json.dumps({"pad": "x" * 200}))
    code, _, err = invoke("run", f"{flow}:free", "--input", f"@{small}", "--db", sqlite_url,
                          env={"RAYSAGA_MAX_INPUT_BYTES": "100"})
    one_line_error(code, err, "above the input cap of 100 bytes")
    code, _, err = invoke("run", f"{flow}:free", "--input", "@-", "--db", sqlite_url,
                          env={"RAYSAGA_MAX_INPUT_BYTES": "100"}, input="[" + "1," * 100 + "1]")
    one_line_error(code, err, "--input from stdin is more than 100 bytes")
    no_runs(sqlite_url)


def test_missing_input_names_the_model_and_its_fields(flow: str, sqlite_url: str) -> None:
    code, _, err = invoke("run", f"{flow}:wf", "--db", sqlite_url, "--executor", "inline")
    one_line_error(code, err, "--input is required: workflow edge takes an Order (fields: sku, qty, card)")
    code, _, err = invoke("run", f"{flow}:wf", "--db", sqlite_url, "--executor", "inline",
                          "--input", '{"sku": 5, "qty": "many"}')
    one_line_error(code, err, "input does not match Order of workflow 'edge': ")
    assert "sku: Input should be a valid string (got 5)" in err
    assert "qty: Input should be a valid integer" in err and "card: Field required" in err
    assert "{'type'" not in err  # not a dump of pydantic's error dicts
    no_runs(sqlite_url)


# ------------------------------------------------------------------------------- run ids and numbers


@pytest.mark.parametrize("run_id", ["a\x00b", "tab\there", "x" * 201, "", "line\nbreak"])
def test_bad_run_ids_are_refused_at_the_edge(flow: str, store_url: str, run_id: str) -> None:
    code, _, err = invoke("run", f"{flow}:free", "--input", "1", "--db", store_url, "--executor", "inline",
                          "--run-id", run_id)
    one_line_error(code, err, "--run-id")
    for command in ("status", "events", "cancel", "resume"):
        code, _, err = invoke(command, run_id, "--db", store_url)
        one_line_error(code, err, "run id must be 1 to 200 printable characters")


@pytest.mark.parametrize(("args", "message"), [
    (["--lease-ttl", "0"], "--lease-ttl must be a positive number of seconds"),
    (["--lease-ttl", "-5"], "--lease-ttl must be a positive number of seconds"),
    (["--lease-ttl", "nan"], "--lease-ttl must be a positive number of seconds, got nan"),
    (["--lease-ttl", "inf"], "--lease-ttl must be a positive number of seconds, got inf"),
    (["--deadline", "-1"], "--deadline must be a positive number of seconds"),
    (["--deadline", "nan"], "--deadline must be a positive number of seconds"),
    (["--retry-budget", "-1"], "--retry-budget must be at least 0"),
])
def test_run_numbers_are_checked(flow: str, sqlite_url: str, args: list[str], message: str) -> None:
    code, _, err = invoke("run", f"{flow}:free", "--input", "1", "--db", sqlite_url, "--executor", "inline", *args)
    one_line_error(code, err, message)
    no_runs(sqlite_url)


@pytest.mark.parametrize(("args", "message"), [
    (["list", "--limit", "-1"], "--limit must be from 1 to 1000, got -1"),
    (["list", "--limit", "0"], "--limit must be from 1 to 1000"),
    (["list", "--limit", "1000000"], "--limit must be from 1 to 1000"),
    (["events", "r", "--after", "-1"], "--after must be at least 0"),
    (["status", "r", "--nodes-limit", "0"], "--nodes-limit must be at least 1"),
    (["resume", "r", "--lease-ttl", "-1"], "--lease-ttl must be a positive number"),
])
def test_read_command_numbers_are_checked(store_url: str, args: list[str], message: str) -> None:
    open_store(store_url).close()  # an existing, empty store
    code, _, err = invoke(*args, "--db", store_url)
    one_line_error(code, err, message)


# ------------------------------------------------------------------------------- read commands create nothing


@pytest.mark.parametrize("command", [["status", "r1"], ["list"], ["events", "r1"], ["status", "r1", "--json"]])
def test_read_commands_never_create_a_store(tmp_path: Path, command: list[str]) -> None:
    typo = tmp_path / "no-such-dir" / "raysgaa.db"
    code, _, err = invoke(*command, "--db", f"sqlite:///{typo}")
    one_line_error(code, err, str(typo))
    assert not typo.parent.exists()  # neither the file nor its folder
    assert sorted(p.name for p in tmp_path.iterdir()) == []


# ------------------------------------------------------------------------------- foreign exceptions


def _drop_event_log(url: str) -> None:
    """Damage the store outside raysaga: the event log's table is gone (SQLAlchemy then raises)."""
    with sqlite3.connect(url.removeprefix("sqlite:///")) as conn:
        conn.execute("DROP TABLE raysaga_events")


def test_unexpected_exceptions_are_one_line_and_debug_shows_the_traceback(flow: str, sqlite_url: str) -> None:
    code, _, err = invoke("run", f"{flow}:wf", "--input", '{"sku": "a", "qty": 1, "card": "c"}', "--db", sqlite_url,
                          "--executor", "inline", "--run-id", "r1")
    assert code == 0, err
    _drop_event_log(sqlite_url)
    code, _, err = invoke("events", "r1", "--db", sqlite_url)
    assert code == 2
    lines = err.strip().splitlines()
    assert lines[0].startswith("error: ") and "Traceback" not in err, err
    assert lines[-1] == "(run with --debug for the traceback)"
    assert len(lines) == 2
    assert lines[0].startswith("error: OperationalError: ") and "raysaga_events" in lines[0], lines
    for argv, env in ((["--debug", "events", "r1", "--db", sqlite_url], None),
                      (["events", "r1", "--db", sqlite_url], {"RAYSAGA_DEBUG": "1"})):
        code, _, err = invoke(*argv, env=env)
        assert code == 2
        assert "Traceback (most recent call last)" in err
        assert err.strip().splitlines()[-1].startswith("error: ")


def test_console_script_has_no_traceback_for_a_bad_store(tmp_path: Path) -> None:
    not_a_db = tmp_path / "notes.txt"
    not_a_db.write_text("these are my notes, not a database\n" * 50)
    exe = Path(sys.executable).with_name("raysaga")
    for argv in (["status", "r1"], ["list"], ["events", "r1"], ["resume", "r1"], ["run", "x:wf"]):
        proc = subprocess.run([str(exe), *argv, "--db", f"sqlite:///{not_a_db}"], capture_output=True, text=True,
                              timeout=120, cwd=tmp_path, env={**os.environ, "COLUMNS": "50"})
        assert proc.returncode == 2, (argv, proc.stderr)
        assert "Traceback" not in proc.stderr, proc.stderr
        assert proc.stderr.startswith("error: "), proc.stderr
    assert not_a_db.read_text() == "these are my notes, not a database\n" * 50
