"""User text the terminal views print on one line stays on one line (review stop 45, B5).

A prompt, a step's error or an operator's reason is text a step or a person wrote: a newline in
it drew a line of its own (``driver: ...`` under the status header, a fake approval in the
inbox), and ``raysaga inbox`` printed a prompt whole, however long. Each is now shown flattened
(``\\n`` escaped) and cut, as ``status --node`` shows a prompt; ``inbox --json`` has it whole.
"""

from __future__ import annotations

import json
from typing import Any

import raysaga
from raysaga import Ask, Workflow
from raysaga.orchestrator.status_text import PAYLOAD_WIDTH
from raysaga.state import RunStatus
from tests.support.cli import invoke

FAKE = "driver: live, held by you"  # what a forged line would say
PROMPT = "Approve refund?\nrun-fake ask  asked 1s ago\n" + FAKE + "\n" + "L" * 100_000

asking = Workflow("stop45_asking")


@asking.approval(approvers=["alice\n" + FAKE, "bob"])
def ask(input: dict[str, Any]) -> Ask:
    return Ask(input["prompt"])


failing = Workflow("stop45_failing")


@failing.step()
def boom(input: dict[str, Any]) -> str:
    raise ValueError("refused\n" + FAKE)


def forged(text: str) -> list[str]:
    """The lines of ``text`` that start with the forged words (a line of their own)."""
    return [line for line in text.splitlines() if line.lstrip().startswith(("driver: live", "run-fake"))]


def test_inbox_shows_a_prompt_on_one_line_cut(sqlite_url: str) -> None:
    rested = raysaga.run(asking, {"prompt": PROMPT}, store=sqlite_url, executor="inline")
    assert rested.status == RunStatus.WAITING_HUMAN
    code, out, _ = invoke("inbox", "--db", sqlite_url)
    assert code == 0 and rested.run_id in out
    assert forged(out) == [], out[:2000]
    lines = out.splitlines()
    assert len(lines) == 2, lines[:5]  # the approval's line, its prompt's line
    assert "alice\\ndriver: live" in lines[0]  # an approver's name is user text too
    assert lines[1].startswith("  Approve refund?\\nrun-fake ask") and "\\n" + FAKE in lines[1]
    assert "L" * PAYLOAD_WIDTH not in lines[1] and len(lines[1]) < PAYLOAD_WIDTH + 80
    assert "raysaga inbox --json" in lines[1]  # where the rest is
    code, out, _ = invoke("inbox", "--json", "--db", sqlite_url)
    assert code == 0 and json.loads(out)["request"]["prompt"] == PROMPT


def test_status_shows_a_step_error_on_one_line(sqlite_url: str) -> None:
    failed = raysaga.run(failing, {}, store=sqlite_url, executor="inline")
    assert failed.status == RunStatus.FAILED and FAKE in (failed.status_reason or "")
    code, out, _ = invoke("status", failed.run_id, "--db", sqlite_url)
    assert code in (0, 1) and forged(out) == [], out
    header = out.splitlines()[0]
    assert header.startswith(f"run {failed.run_id}") and "refused\\n" + FAKE in header
    assert len([line for line in out.splitlines() if line.startswith("driver:")]) == 1, out


def test_cancel_shows_its_reason_on_one_line(sqlite_url: str) -> None:
    rested = raysaga.run(asking, {"prompt": "ok?"}, store=sqlite_url, executor="inline")
    code, out, _ = invoke("cancel", rested.run_id, "--reason", "by ops\n" + FAKE, "--db", sqlite_url,
                          "--executor", "inline")
    assert code == 0 and forged(out) == [], out
    assert f"run {rested.run_id}: cancelled — by ops\\n{FAKE}" in out, out
