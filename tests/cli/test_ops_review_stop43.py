"""What the operator's views say about time and about what an approval approves (review, stop 43).

- ``status`` never said when a resting run wakes (a sleep, a retry's backoff) nor its deadline,
  ``status --json`` had no run-level ``wake_at``/``deadline_at`` and ``status --node`` gave a
  backoff's delay, not when the next try is;
- the text ``inbox`` and ``status --node`` showed an agent's tool call as "agent helpdesk asks to
  call refund", never the arguments the approver approves;
- ``raysaga worker --poll 1e10`` was taken, and the worker crashed waiting that long
  (``threading.TIMEOUT_MAX``);
- an approval timeout of 1e300 s printed as 300 digits of hours (inbox) or "(bad time)" (``--node``);
- a failed agent's failed turn (a hidden ``ask@0`` row) made "2 failed node(s)" of one failed row.
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any

import raysaga
from raysaga import Ask, RetryPolicy, RunOptions, RunStatus, Transient, Workflow
from raysaga.agents import Agent, text_reply, tool, tool_reply
from raysaga.testing import RecordingModel
from tests.support.cli import invoke, one_line_error

recording = functools.partial(RecordingModel, journal="test_ops_review_stop43")


def _status(*args: str) -> str:
    code, out, err = invoke("status", *args)
    assert code == 0, err
    return out


def test_status_says_when_a_sleeping_run_wakes_and_its_deadline(sqlite_url: str) -> None:
    wf = Workflow("stop43_wake")

    @wf.step()
    def first() -> int:
        return 1

    wf.sleep("nap", seconds=600, after=["first"])

    rested = raysaga.run(wf, store=sqlite_url, run_id="napper", executor="inline",
                         options=RunOptions(deadline=7200, release_after=0))
    assert rested.status == RunStatus.WAITING_TIMER and rested.wake_at is not None
    text = _status("napper", "--db", sqlite_url)
    assert re.search(r"^wakes at \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC \(in (9|10)m\)$", text, re.M), text
    assert re.search(r"^deadline at \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC \(in (119|120)m\)$", text, re.M), text
    data = json.loads(_status("napper", "--db", sqlite_url, "--json"))
    assert data["schema_version"] == 1
    assert (data["wake_at"], data["deadline_at"]) == (rested.wake_at, rested.deadline_at)
    node = _status("napper", "--node", "nap", "--db", sqlite_url)
    assert re.search(r"^  wakes at .* UTC \(in (9|10)m\)$", node, re.M), node


def test_status_says_when_a_backoff_ends(sqlite_url: str) -> None:
    class Busy(Transient):
        retry_after = 900.0

    wf = Workflow("stop43_backoff")

    @wf.step(retry=RetryPolicy(max_attempts=3, base=0.0, cap=0.0))
    def call() -> int:
        raise Busy("come back in 15 minutes")

    rested = raysaga.run(wf, store=sqlite_url, run_id="backing", executor="inline",
                         options=RunOptions(release_after=0))
    assert rested.status == RunStatus.WAITING_TIMER, rested.status_reason
    text = _status("backing", "--db", sqlite_url)
    assert re.search(r"^wakes at .* UTC \(in (14|15)m\)$", text, re.M), text
    assert "deadline" not in text  # the run has none
    node = _status("backing", "--node", "call", "--db", sqlite_url)
    assert re.search(r"^  next try at .* UTC \(in (14|15)m\)$", node, re.M), node
    assert json.loads(_status("backing", "--db", sqlite_url, "--json"))["deadline_at"] is None


@tool(effect=True, requires_approval=True, approvers=["alice"])
def refund(order: str, amount: int) -> str:
    """Refund an order."""
    return f"refunded {amount} on {order}"


def test_inbox_and_node_show_the_tool_call_arguments_escaped_and_cut(sqlite_url: str) -> None:
    order = "o-1\x1b[2J" + "x" * 1000  # a terminal escape, and far wider than a line
    model = recording(default=(tool_reply(("refund", {"order": order, "amount": 90})), text_reply("done")))
    wf = Workflow("stop43_tool_args")

    @wf.agent(Agent(name="support", model=model, tools=(refund,)))
    def helpdesk(input: str) -> str:
        return f"customer says: {input}"

    rested = raysaga.run(wf, "my parcel never came", store=sqlite_url, run_id="asks", executor="inline")
    assert rested.status == RunStatus.WAITING_HUMAN
    code, out, err = invoke("inbox", "--db", sqlite_url)
    assert code == 0, err
    call = next(line for line in out.splitlines() if line.startswith("  call: "))
    assert call.startswith('  call: refund {"amount": 90, "order": "o-1\\u001b[2Jxxx'), call
    assert "\x1b" not in out and len(call) < 320 and call.endswith(" …"), call
    node = next(w for w in out.splitlines() if w.startswith("asks ")).split()[1]
    shown = _status("asks", "--node", node, "--db", sqlite_url)
    assert '  call: refund {"amount": 90, "order": "o-1\\u001b[2J' in shown and "\x1b" not in shown, shown


def test_an_approval_payload_is_shown_and_a_far_timeout_reads_sanely(sqlite_url: str) -> None:
    wf = Workflow("stop43_far_timeout")

    @wf.step()
    def first() -> int:
        return 1

    @wf.approval(timeout=1e300)
    def ok(first: int) -> Ask:
        return Ask(prompt="ship it?", payload={"boxes": first})

    raysaga.run(wf, store=sqlite_url, run_id="far", executor="inline", options=RunOptions(release_after=0))
    code, out, err = invoke("inbox", "--db", sqlite_url)
    assert code == 0, err
    assert "times out in more than 100 years" in out and "  payload: {\"boxes\": 1}" in out, out
    assert max(len(line) for line in out.splitlines()) < 120, out
    node = _status("far", "--node", "ok", "--db", sqlite_url)
    assert "times out in more than 100 years" in node and "(bad time)" not in node, node
    assert "  asks: ship it?" in node and '  payload: {"boxes": 1}' in node, node
    assert "wakes in more than 100 years" in _status("far", "--db", sqlite_url)


class _Down:
    """A model whose endpoint is down for good: the agent's first turn fails."""

    name = "claude-haiku-4-5"

    def cost(self, usage: Any) -> float:
        return 0.0

    def complete(self, request: Any) -> Any:
        raise ConnectionError("model endpoint down")


def test_a_failed_agent_counts_as_one_failed_node(sqlite_url: str) -> None:
    wf = Workflow("stop43_agent_down")

    @wf.agent(Agent(name="asker", model=_Down(), transport_retry=RetryPolicy(max_attempts=1)))
    def ask(input: str) -> str:
        return input

    failed = raysaga.run(wf, "hello", store=sqlite_url, run_id="down", executor="inline")
    assert failed.status == RunStatus.FAILED, failed.status_reason
    text = _status("down", "--db", sqlite_url)
    table = [line for line in text.splitlines() if line.startswith("ask ")]
    assert len(table) == 1 and " failed " in table[0], text
    assert "1 failed node(s)" in text, text


def test_a_worker_poll_or_lease_longer_than_a_day_is_refused() -> None:
    for option, value in (("--poll", "1e10"), ("--poll", "86401"), ("--lease-ttl", "1e11")):
        code, _, err = invoke("worker", "--workflow", "nowhere:wf", option, value)
        one_line_error(code, err, f"{option} must be at most 86400 seconds (a day)")
