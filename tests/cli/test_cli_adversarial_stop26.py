"""Stop 26, the CLI tried as a hostile or careless user would: what a step's error holds must not
drive the operator's terminal, a store URL's password never prints, the secrets a step returned
are shown `[redacted]` as on the dashboard, hints can be pasted back into a shell, and an error
names the option it is about."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from raysaga.orchestrator.cli import app

#: What a terminal would act on: clear the screen, write the clipboard (OSC 52), ring, overwrite
#: the line, reverse the text (a bidi override), a C1 CSI.
CONTROLS = "\x1b[2J\x1b]52;c;ZXZpbA==\x07\rFAKE\u202ereversed\x9b31m"
HOSTILE = textwrap.dedent(f'''
    import os
    from raysaga import Permanent, Workflow

    wf = Workflow("hostile", version="1")

    @wf.step()
    def first() -> dict:
        return {{"key": os.environ["STOP26_API_KEY"], "note": "Authorization: Bearer abcdefghijklmnop"}}

    @wf.step()
    def second(first: dict) -> int:
        raise Permanent({("boom " + CONTROLS)!r})
''')
SECRET = "stop26-" + "q" * 24


def invoke(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, list(args), env=env)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture
def hostile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, str]:
    folder = tmp_path / "a folder with spaces"
    folder.mkdir()
    (folder / "hostile_flow.py").write_text(HOSTILE)
    monkeypatch.setenv("STOP26_API_KEY", SECRET)
    return f"{folder / 'hostile_flow.py'}:wf", f"sqlite:///{tmp_path / 'raysaga.db'}"


def _no_controls(text: str) -> None:
    for c in ("\x1b", "\x07", "\r", "\u202e", "\x9b"):
        assert c not in text, (c, text)


def test_a_steps_error_never_reaches_the_terminal_as_control_sequences(hostile: tuple[str, str]) -> None:
    """A step's error (a provider's response body, a model's words) once went to the terminal raw
    in the `run`/`status` header, the `error:` line and `status --errors` (its attempts and
    traceback): ESC [2J cleared the operator's screen, OSC 52 wrote their clipboard."""
    flow, db = hostile
    code, out, err = invoke("run", flow, "--db", db, "--executor", "inline", "--run-id", "r1", "--quiet")
    assert code == 1, (out, err)
    _no_controls(out + err)
    assert "\\x1b[2J" in out  # shown, escaped
    for args in (("status", "r1"), ("status", "r1", "--errors"), ("status", "r1", "--node", "second"),
                 ("list",), ("status", "r1", "--dag")):
        code, out, err = invoke(*args, "--db", db)
        assert code in (0, 1), (args, out, err)
        _no_controls(out + err)
        assert "\\x1b" in out, args


def test_the_secrets_a_step_returned_are_redacted_by_status_and_replay(hostile: tuple[str, str]) -> None:
    """The dashboard scrubs what a step returned; `status`, `status --json`, `run --json` and
    `replay --json` printed it as stored, the value of an API key included."""
    flow, db = hostile
    code, out, _ = invoke("run", flow, "--db", db, "--executor", "inline", "--run-id", "r2", "--json")
    assert code == 1 and SECRET not in out and "abcdefghijklmnop" not in out
    assert json.loads(out)["status"] == "failed"
    for args in (("status", "r2"), ("status", "r2", "--json"), ("status", "r2", "--json", "--summary"),
                 ("replay", "r2", "--json", "--workflow", flow), ("replay", "r2", "--workflow", flow)):
        code, out, err = invoke(*args, "--db", db)
        assert code in (0, 1), (args, out, err)
        assert SECRET not in out + err and "abcdefghijklmnop" not in out + err, args
    code, out, _ = invoke("replay", "r2", "--json", "--workflow", flow, "--db", db)
    [first] = [n for n in json.loads(out)["nodes"] if n["node"] == "first"]
    assert first["recorded"]["key"] == "[redacted]" and first["verdict"] == "same"


def test_a_store_urls_query_password_is_never_printed(monkeypatch: pytest.MonkeyPatch) -> None:
    """`postgresql://app@db/x?password=...` (libpq takes it there too): `--version`, the
    unreachable-store error and every other place the store is named printed it whole."""
    url = f"postgresql://app@127.0.0.1:1/nowhere?sslmode=disable&password={SECRET}"
    code, out, err = invoke("--version", env={"RAYSAGA_DB": url})
    assert code == 0 and "password=[redacted]" in out and SECRET not in out + err
    for args in (("list", "--db", url), ("status", "r1", "--db", url), ("events", "r1", "--db", url),
                 ("cancel", "r1", "--db", url)):
        code, out, err = invoke(*args)
        assert code == 2, (args, out, err)
        assert SECRET not in out + err, args
        assert err.startswith("error:"), err


def test_hints_quote_run_ids_so_they_paste_back_into_a_shell(tmp_path: Path) -> None:
    """`1 failed node(s): \\`raysaga status evil<x> --errors\\`` pasted into a shell redirected from
    a file named x; each hint now quotes an id a shell would read otherwise."""
    flow = tmp_path / "fails.py"
    flow.write_text("from raysaga import Permanent, Workflow\nwf = Workflow('fails', version='1')\n"
                    "@wf.step()\ndef only() -> int:\n    raise Permanent('no')\n")
    db = f"sqlite:///{tmp_path / 'raysaga.db'}"
    run_id = "tenant 7;<x>"
    code, out, err = invoke("run", f"{flow}:wf", "--db", db, "--executor", "inline", "--run-id", run_id, "--quiet")
    assert code == 1, (out, err)
    [hint] = [line for line in out.splitlines() if "--errors" in line]
    command = hint.split("`")[1]
    assert shlex.split(command) == ["raysaga", "status", run_id, "--errors"]


def test_a_bad_answer_names_answer_not_input(tmp_path: Path) -> None:
    """`raysaga approve RUN NODE --answer '{'` said "--input is not valid JSON"."""
    db = f"sqlite:///{tmp_path / 'raysaga.db'}"
    code, _, err = invoke("approve", "any", "gate", "--by", "ada", "--answer", "{", "--db", db)
    assert code == 2 and err.startswith("error: --answer is not valid JSON"), err
    code, _, err = invoke("approve", "any", "gate", "--by", "ada", "--answer", f"@{tmp_path / 'none.json'}",
                          "--db", db)
    assert code == 2 and "--answer file" in err and "does not exist" in err, err


def test_debug_tracebacks_show_control_characters_escaped(hostile: tuple[str, str], tmp_path: Path) -> None:
    """With --debug the traceback of an error raysaga did not expect is written as well: a
    module that raises on import with ESC in its message must not drive the terminal either."""
    bad = tmp_path / "bad_module.py"
    bad.write_text(f"raise RuntimeError({CONTROLS!r})\n")
    proc = subprocess.run([sys.executable, "-m", "raysaga", "--debug", "run", f"{bad}:wf", "--executor", "inline",
                           "--db", hostile[1]], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    _no_controls(proc.stdout + proc.stderr)
    assert "\\x1b[2J" in proc.stderr


GATE = textwrap.dedent('''
    from raysaga import Approval, Ask, Workflow

    wf = Workflow("gate26", version="1")

    @wf.approval(approvers=["ada", "bob"])
    def review() -> Ask:
        return Ask(prompt="ship it? \\x1b]0;pwned\\x07")

    @wf.step()
    def after(review: Approval) -> str:
        return str(review.by)
''')


def test_the_inbox_names_approvers_without_saying_decided(tmp_path: Path) -> None:
    """`raysaga inbox` read "g1 review  asked 6s ago · decided by ada, bob" for an approval nobody
    had decided; the prompt's OSC title sequence reached the terminal."""
    flow = tmp_path / "gate26.py"
    flow.write_text(GATE)
    db = f"sqlite:///{tmp_path / 'raysaga.db'}"
    code, out, err = invoke("run", f"{flow}:wf", "--db", db, "--executor", "inline", "--run-id", "g1", "--quiet")
    assert code == 1, (out, err)
    code, out, _ = invoke("inbox", "--db", db)
    assert code == 0 and "g1 review" in out
    assert "decided by" not in out and "approvers: ada, bob" in out
    _no_controls(out)
    code, _, err = invoke("approve", "g1", "review", "--by", "ada", "--db", db)
    assert code == 0, err
    code, out, _ = invoke("inbox", "--db", db)
    assert "g1" not in out


@pytest.mark.parametrize("by", ["A" * 201, "ada\x1b[2J", "ada\nmallory"])
def test_by_is_a_name_before_anything_is_recorded(tmp_path: Path, by: str) -> None:
    """`--by` of any size or with control characters was recorded in the decision and the event."""
    flow = tmp_path / "gate26.py"
    flow.write_text(GATE)
    db = f"sqlite:///{tmp_path / 'raysaga.db'}"
    code, out, err = invoke("run", f"{flow}:wf", "--db", db, "--executor", "inline", "--run-id", "g1", "--quiet")
    assert code == 1, (out, err)
    for args in (("approve", "g1", "review"), ("reject", "g1", "review"), ("pause", "g1")):
        code, _, err = invoke(*args, "--by", by, "--db", db)
        assert code == 2 and err.startswith("error: --by "), (args, err)
        assert "must be 1 to 200 printable characters" in err, (args, err)
    code, out, _ = invoke("events", "g1", "--db", db)
    kinds = [json.loads(line)["kind"] for line in out.splitlines()]
    assert code == 0 and by not in out and "decision" not in kinds and "run_paused" not in kinds, kinds


@pytest.mark.parametrize(("body", "said"), [
    ("import sys\nsys.exit(0)\n", "it called sys.exit(0) while being imported"),
    ("import sys\nsys.exit('bye [bold]x')\n", "it called sys.exit('bye [bold]x') while being imported"),
    ("raise BaseException('odd')\n", "BaseException: odd"),
])
def test_a_workflow_file_that_exits_or_raises_on_import_is_a_usage_error(tmp_path: Path, body: str,
                                                                        said: str) -> None:
    """`raysaga run flows.py:wf` of a module that ran its script part at import (sys.exit(0))
    exited 0 having run nothing; sys.exit('msg') printed msg and exited 1 (a run not completed);
    a BaseException printed a traceback."""
    flow = tmp_path / "script26.py"
    flow.write_text(body)
    db = f"sqlite:///{tmp_path / 'raysaga.db'}"
    proc = subprocess.run([sys.executable, "-m", "raysaga", "run", f"{flow}:wf", "--executor", "inline", "--db", db],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert proc.stderr.startswith(f"error: importing '{flow}' failed: {said}"), proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""


UNPRINTABLE = textwrap.dedent('''
    from raysaga import Workflow

    wf = Workflow("unprintable26", version="1")


    class Unprintable(Exception):
        def __str__(self) -> str:
            raise RuntimeError("str failed")


    @wf.step()
    def only() -> int:
        raise Unprintable()
''')


def test_a_step_raising_an_exception_that_cannot_be_printed_fails_the_run(tmp_path: Path) -> None:
    """An exception whose __str__ raises crashed the driver in retry.describe: `raysaga run` said
    "error: RuntimeError: str failed" (exit 2), the run stayed running with no node row, and every
    resume crashed the same way (fixed in fbfdcf1, orchestrator/retry.py and task.py)."""
    flow = tmp_path / "unprintable26.py"
    flow.write_text(UNPRINTABLE)
    db = f"sqlite:///{tmp_path / 'raysaga.db'}"
    code, out, err = invoke("run", f"{flow}:wf", "--db", db, "--executor", "inline", "--run-id", "u1", "--quiet")
    assert code == 1, (code, out, err)  # the run failed: exit 1, never 2 with "error: RuntimeError: str failed"
    code, out, _ = invoke("status", "u1", "--json", "--db", db)
    assert json.loads(out)["status"] == "failed"


def test_a_filter_that_matches_nothing_is_not_an_empty_store(tmp_path: Path) -> None:
    """`raysaga list --workflow "$WF"` with WF unset printed "no runs in STORE", as did a filter
    matching nothing, read as an empty store; `stats --json --prometheus` printed Prometheus."""
    flow = tmp_path / "gate26.py"
    flow.write_text(GATE)
    db = f"sqlite:///{tmp_path / 'raysaga.db'}"
    code, out, err = invoke("run", f"{flow}:wf", "--db", db, "--executor", "inline", "--run-id", "g1", "--quiet")
    assert code == 1, (out, err)
    code, _, err = invoke("list", "--workflow", "", "--db", db)
    assert code == 2 and err.startswith("error: --workflow '' names no workflow"), err
    code, out, _ = invoke("list", "--workflow", "nope", "--status", "failed", "--db", db)
    assert code == 0 and out.startswith("no runs in state failed and of workflow 'nope' in "), out
    code, _, err = invoke("stats", "--json", "--prometheus", "--db", db)
    assert code == 2 and "choose one" in err, err


NUL_ERROR = textwrap.dedent('''
    from raysaga import Permanent, Workflow

    wf = Workflow("nul26", version="1")


    @wf.step()
    def only() -> int:
        raise Permanent("bad\\x00byte")  # a C library's message, a binary protocol's reply
''')


@pytest.mark.postgres
def test_a_step_error_holding_nul_fails_the_run_on_postgresql(tmp_path: Path, pg_url: str) -> None:
    import uuid

    flow = tmp_path / "nul26.py"
    flow.write_text(NUL_ERROR)
    run_id = f"nul26-{uuid.uuid4().hex[:8]}"
    code, out, err = invoke("run", f"{flow}:wf", "--db", pg_url, "--executor", "inline", "--run-id", run_id,
                            "--quiet")
    assert code == 1, (code, out, err)  # not 2, "error: DataError: ... cannot contain NUL (0x00) bytes"
    code, out, _ = invoke("status", run_id, "--json", "--db", pg_url)
    assert json.loads(out)["status"] == "failed"
