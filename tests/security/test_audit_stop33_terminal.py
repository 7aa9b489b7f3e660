"""Stop 33 audit, the terminal: ``status --watch`` drew what a step's error said.

``status`` shows user text (a step's error, a run's reason) with every control character escaped
(``cli_errors._Console``). ``--watch`` renders the same view into a capture and re-reads it with
``Text.from_ansi``, and its capture was a plain ``Console``: the error's ESC sequences went into
the capture raw and came out as styles. A step failing with ``ESC]8;;https://evil.example`` put a
clickable link on the operator's screen, ``ESC[8m`` hid the rest of the line; piped, the same
sequences vanished silently instead of showing escaped as ``status`` shows them.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

import raysaga
from raysaga import Permanent, RunStatus, Workflow
from raysaga.orchestrator import cli_errors
from raysaga.orchestrator.cli import app
from raysaga.state import SqlStore

LINK = "\x1b]8;;https://evil.example/\x1b\\click here\x1b]8;;\x1b\\"
HIDE = "\x1b[8mhidden\x1b[0m"
#: An SGR sequence that turns on "conceal" (parameter 8), alone or among others.
CONCEAL = re.compile(r"\x1b\[(?:[0-9;]*;)?8(?:;[0-9;]*)?m")

wf = Workflow("audit_stop33_ansi")


@wf.step()
def fetch(input: str) -> str:
    raise Permanent(f"upstream said: {LINK} {HIDE} [bold]markup[/bold]")


@pytest.fixture
def failed_run(tmp_path: Path) -> tuple[str, str]:
    url = f"sqlite:///{tmp_path / 'ansi.db'}"
    store = SqlStore(url)
    try:
        record = raysaga.run(wf, "x", store=store, executor="inline")
    finally:
        store.close()
    assert record.status == RunStatus.FAILED
    return url, record.run_id


@pytest.mark.parametrize("terminal", [True, False], ids=["terminal", "pipe"])
def test_watch_shows_an_errors_escape_sequences_escaped_never_acted_on(
        failed_run: tuple[str, str], terminal: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    url, run_id = failed_run
    monkeypatch.setattr(cli_errors.out, "_force_terminal", terminal)
    monkeypatch.setattr(cli_errors.out, "_width", 400)  # every line whole (a live display crops them)
    watched = CliRunner().invoke(app, ["status", run_id, "--db", url, "--watch", "--interval", "0.1"])
    plain = CliRunner().invoke(app, ["status", run_id, "--db", url])
    assert watched.exception is None and plain.exception is None, watched.output
    for output in (watched.output, plain.output):
        assert "\x1b]8;" not in output, "a hyperlink drawn from a step's error"
        assert not CONCEAL.search(output), "text hidden by a step's error"
        [error] = [line for line in output.splitlines() if line.startswith("error: ")]
        assert "\\x1b]8;;https://evil.example/" in error and "\\x1b[8mhidden" in error, error
        assert "[bold]markup[/bold]" in error  # never read as rich markup either


def test_a_watch_frame_carries_no_style_a_step_s_error_asked_for(failed_run: tuple[str, str],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The frame itself: its only styles are the ones the view sets (the run id bold, the status coloured)."""
    from raysaga.orchestrator import cli_watch

    url, run_id = failed_run
    monkeypatch.setattr(cli_errors.out, "_force_terminal", True)
    store = SqlStore(url)
    try:
        shown = cli_watch._render(store, store.get_run(run_id), "here", None, None, False, 1.0)
    finally:
        store.close()
    styles = [shown.get_style_at_offset(cli_errors.out, span.start) for span in shown.spans]
    assert not [s for s in styles if s.link or s.conceal], [str(s) for s in styles]
    assert "\\x1b]8;;https://evil.example/" in shown.plain.splitlines()[0]


KEY = "sk-ant-api03-" + "W" * 40

gated = Workflow("audit_stop33_inbox")


@gated.step()
def draft(input: str) -> str:
    return input


@gated.approval(after=["draft"])
def send(draft: str) -> str:
    return f"call the vendor with Authorization: Bearer {KEY}?"  # an approval's prompt is its output: stored as is


def test_the_inbox_shows_a_prompt_scrubbed_as_the_dashboard_does(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'inbox.db'}"
    store = SqlStore(url)
    try:
        record = raysaga.run(gated, "x", store=store, executor="inline")
    finally:
        store.close()
    assert record.status == RunStatus.WAITING_HUMAN
    for extra in ([], ["--json"]):
        shown = CliRunner().invoke(app, ["inbox", "--db", url, *extra])
        assert shown.exit_code == 0 and record.run_id in shown.output, shown.output
        assert KEY not in shown.output
