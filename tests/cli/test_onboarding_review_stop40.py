"""Fixes from the stop-40 review of a newcomer's first hour, each through the real CLI (or the
public API) on a real SQLite file: the dashboard on a busy port announced a URL and exited 3 ("a
live driver owns the run"); an approval of a paused run promised a worker would take it up, and
``resume`` drove a paused run on; approving a plain step said "already decided"; suggested
commands printed run ids unquoted; ``status`` kept "waiting for a decision" after one; definition
errors blamed a parameter for an ``after=`` dependency and named no close match, and a bare
``@wf.compensation`` gave a name error; the ``output:`` line escaped non-ASCII; ``status
--summary`` without ``--json`` was ignored; ``--label``'s help on ``run`` described ``list``'s filter."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from pydantic import TypeAdapter, ValidationError

import raysaga
from raysaga import Client, Permanent, UserError, Workflow, WorkflowDefinitionError
from raysaga.errors import BlobIntegrityError, InputTypeError
from raysaga.orchestrator import blob_parking, cli_status, crash_loop, output_types, runner
from raysaga.state import NewRun, RunStatus, open_store
from tests.support import REPO
from tests.support.cli import invoke, one_line_error

FLOW = textwrap.dedent('''
    from raysaga import Approval, Workflow

    wf = Workflow("onb40", version="1")

    @wf.step()
    def hello() -> str:
        return "héllo 日本 \\x1b[2J"

    @wf.approval()
    def review(hello: str) -> str:
        return f"ok {hello}?"

    @wf.step()
    def done(hello: str, review: Approval) -> str:
        return hello + " ✓"
''')

#: A run id a shell splits and reads otherwise: a suggested command must quote it.
RUN = "réu 40 日本"
QUOTED = "'réu 40 日本'"


@pytest.fixture
def flow(tmp_path: Path) -> str:
    path = tmp_path / "onb40_flow.py"
    path.write_text(FLOW)
    return f"{path}:wf"


@pytest.fixture
def waiting(flow: str, sqlite_url: str) -> Iterator[str]:
    """``RUN`` resting ``waiting_human`` on ``review`` (its ``hello`` completed)."""
    code, _, err = invoke("run", flow, "--run-id", RUN, "--db", sqlite_url, "--executor", "inline", "--quiet")
    assert code == 1 and "waiting for a decision on review" in err, err
    yield RUN


# ------------------------------------------------------------------ 2: the dashboard on a busy port


def test_a_busy_dashboard_port_is_a_one_line_usage_error(sqlite_url: str) -> None:
    open_store(sqlite_url).close()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, out, err = invoke("dashboard", "--db", sqlite_url, "--port", str(port))
    one_line_error(code, err, f"port {port} is in use: pick another --port (0: any free port)")
    assert "http://" not in err + out  # no URL announced for a server that never listened


def test_the_dashboard_url_is_announced_once_it_listens(sqlite_url: str) -> None:
    """The line names a port that accepts a connection at once (the socket listens before it is printed)."""
    open_store(sqlite_url).close()
    proc = subprocess.Popen([sys.executable, "-m", "raysaga", "dashboard", "--db", sqlite_url, "--port", "0"],
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        found = re.search(r"http://127\.0\.0\.1:(\d+)/", line)
        assert found, line
        with socket.create_connection(("127.0.0.1", int(found.group(1))), timeout=10):
            pass  # no retry: refused here would mean the URL came before the server
    finally:
        proc.terminate()
        proc.wait(30)


# ------------------------------------------------------------------ 3: a paused run is held


def test_a_decision_on_a_paused_run_says_it_stays_paused(waiting: str, sqlite_url: str) -> None:
    assert invoke("pause", waiting, "--by", "me", "--db", sqlite_url)[0] == 0
    code, out, err = invoke("approve", waiting, "review", "--by", "me", "--db", sqlite_url)
    assert code == 0, err
    assert "takes the run up now" not in out
    assert "the run is paused (paused by me)" in out and f"`raysaga unpause {QUOTED}`" in out


def test_resume_refuses_a_paused_run_naming_unpause(waiting: str, flow: str, sqlite_url: str) -> None:
    assert invoke("pause", waiting, "--by", "me", "--db", sqlite_url)[0] == 0
    assert invoke("approve", waiting, "review", "--by", "me", "--db", sqlite_url)[0] == 0
    code, _, err = invoke("resume", waiting, "--workflow", flow, "--db", sqlite_url, "--executor", "inline")
    one_line_error(code, err, f"is paused (paused by me): `raysaga unpause {QUOTED}` lets it go on")
    code, _, err = invoke("run", flow, "--run-id", waiting, "--db", sqlite_url, "--executor", "inline")
    one_line_error(code, err, f"`raysaga unpause {QUOTED}`")
    with closing(open_store(sqlite_url)) as store:
        with pytest.raises(UserError, match="raysaga unpause"):
            raysaga.resume(Workflow("onb40", version="1"), waiting, store=store, executor="inline")
        assert store.get_run(waiting).status == RunStatus.PAUSED  # nothing was driven
    assert invoke("unpause", waiting, "--db", sqlite_url)[0] == 0
    code, _, err = invoke("resume", waiting, "--workflow", flow, "--db", sqlite_url, "--executor", "inline", "--json")
    assert code == 0, err  # unpaused: the resume takes the run up, with the decision made while paused


def test_a_paused_run_is_cancelled_with_compensation_without_an_unpause(waiting: str, flow: str,
                                                                          sqlite_url: str) -> None:
    """The cancel is the operator's word: it drives the rollback itself, paused or not."""
    assert invoke("pause", waiting, "--by", "me", "--db", sqlite_url)[0] == 0
    code, _, err = invoke("cancel", waiting, "--compensate", "--workflow", flow, "--db", sqlite_url,
                          "--executor", "inline")
    assert "unpause" not in err
    with closing(open_store(sqlite_url)) as store:
        assert store.get_run(waiting).status == RunStatus.COMPENSATED, (code, err)


def test_a_run_that_paused_itself_or_was_unpaused_may_be_resumed(sqlite_url: str) -> None:
    with closing(open_store(sqlite_url)) as store:
        for run_id, reason in (("budget-40", "budget: 10 tokens used of a budget of 5"), ("held-40", "paused by me"),
                               ("loop-40", "loop: agent 'a' keeps calling look with the same arguments")):
            store.create_run(NewRun(run_id=run_id, workflow_name="w", workflow_version="1",
                                    definition_hash="0" * 64, input=None, trace_id="0" * 32))
            run = store.get_run(run_id)
            store.transition(run_id, run.version, RunStatus.PAUSED, reason=reason)
        runner.check_resumable(store.get_run("budget-40"))  # a larger budget is how it goes on
        runner.check_resumable(store.get_run("loop-40"))  # a resume lets the model go on (docs/agents.md)
        with pytest.raises(UserError, match="raysaga unpause held-40"):
            runner.check_resumable(store.get_run("held-40"))
        Client(store).unpause("held-40", by="me")
        runner.check_resumable(store.get_run("held-40"))  # unpaused: due for a worker, or a resume



def test_an_operators_reason_that_reads_like_a_runs_own_pause_still_holds_it(waiting: str, sqlite_url: str) -> None:
    """Only the run itself writes ``loop:`` or ``budget:``: an operator's reason so worded is kept
    apart (``Client.pause(reason=)``, the dashboard), so a resume (or a relaunched job's) cannot
    take the pause for the run's own."""
    with closing(open_store(sqlite_url)) as store:
        Client(store).pause(waiting, by="me", reason="loop: stuck, looking into it")
        run = store.get_run(waiting)
        assert run.status == RunStatus.PAUSED and run.status_reason == "paused: loop: stuck, looking into it"
        with pytest.raises(UserError, match="raysaga unpause"):
            runner.check_resumable(run)


# ------------------------------------------------------------------ 4: a step is no approval; quoting


def test_approving_a_step_says_it_is_a_step_naming_the_approvals(waiting: str, sqlite_url: str) -> None:
    code, _, err = invoke("approve", waiting, "hello", "--by", "me", "--db", sqlite_url)
    one_line_error(code, err, f"node 'hello' of run {waiting!r} is a step, not an approval "
                              "(the approvals of this run so far: review)")
    assert "already decided" not in err
    code, _, err = invoke("reject", waiting, "nosuch", "--by", "me", "--db", sqlite_url)
    one_line_error(code, err, "the approvals of this run so far: review")


def test_a_decided_approval_names_a_quoted_status_command(waiting: str, flow: str, sqlite_url: str) -> None:
    assert invoke("approve", waiting, "review", "--by", "me", "--db", sqlite_url)[0] == 0
    assert invoke("resume", waiting, "--workflow", flow, "--db", sqlite_url, "--executor", "inline", "--quiet")[0] == 0
    code, _, err = invoke("approve", waiting, "review", "--by", "you", "--db", sqlite_url)
    one_line_error(code, err, f"`raysaga status {QUOTED} --node review` shows who decided")


def test_parked_reasons_quote_the_run_id() -> None:
    reasons = [
        crash_loop.parking(RunStatus.RUNNING, 3, ["a"], RUN)[1].run,
        crash_loop.parking(RunStatus.PENDING, 3, ["a"], RUN, started=False)[1].run,
        crash_loop.failing_parking(RunStatus.RUNNING, 3, "boom", RUN)[1].run,
        blob_parking.parking(RunStatus.RUNNING, BlobIntegrityError("sha256:00", "is missing"), None, RUN)[1].run,
    ]
    for update in reasons:
        assert update is not None and f"`raysaga retry {QUOTED}`" in (update.status_reason or "")


# ------------------------------------------------------------------ 5: status after a decision


def test_status_says_a_decision_was_recorded_and_waits_for_a_driver(waiting: str, flow: str, sqlite_url: str) -> None:
    assert invoke("approve", waiting, "review", "--by", "me", "--db", sqlite_url)[0] == 0
    code, out, err = invoke("status", waiting, "--db", sqlite_url)
    assert code == 0, err
    first = out.splitlines()[0]
    assert "waiting for a decision" not in first
    assert "review approved by me: waiting for a driver" in first and f"raysaga resume {QUOTED}" in first
    assert invoke("resume", waiting, "--workflow", flow, "--db", sqlite_url, "--executor", "inline", "--quiet")[0] == 0


# ------------------------------------------------------------------ 6: definition errors


def test_an_unknown_after_dependency_is_blamed_on_after_with_a_close_match() -> None:
    wf = Workflow("after40")

    @wf.step()
    def charge() -> int:
        return 1

    @wf.step(after=["chrage"])
    def ship(charge: int) -> int:
        return charge

    @wf.step()
    def mail(chargee: int) -> int:
        return chargee

    with pytest.raises(WorkflowDefinitionError) as caught:
        wf.validate()
    text = str(caught.value)
    after_line = next(line for line in text.splitlines() if "'chrage'" in line)
    assert "from after=['chrage']; did you mean 'charge'?" in after_line
    assert "rename the parameter" not in after_line and "fix after=" in after_line
    param_line = next(line for line in text.splitlines() if "'chargee'" in line)
    assert "its parameter 'chargee'; did you mean 'charge'?" in param_line and "rename the parameter" in param_line


def test_compensation_given_no_step_name_says_how_it_is_used() -> None:
    wf = Workflow("comp40")

    @wf.step(effect=True)
    def charge() -> int:
        return 1

    def refund(output: int | None) -> None:
        return None

    with pytest.raises(WorkflowDefinitionError, match=r"takes the name of the step it undoes, not the step's "
                                                      r"function: @comp40.compensation\('charge'\)"):
        wf.compensation(charge)  # type: ignore[arg-type]
    with pytest.raises(WorkflowDefinitionError, match=r"e\.g\. @comp40\.compensation\('charge'\) above def "
                                                      r"refund\(\.\.\.\): used bare"):
        wf.compensation(refund)  # type: ignore[arg-type]


# ------------------------------------------------------------------ 7: the output line


def test_the_output_line_keeps_text_and_escapes_controls(waiting: str, flow: str, sqlite_url: str) -> None:
    assert invoke("approve", waiting, "review", "--by", "me", "--db", sqlite_url)[0] == 0
    code, out, err = invoke("resume", waiting, "--workflow", flow, "--db", sqlite_url, "--executor", "inline",
                            "--quiet")
    assert code == 0, err
    line = next(line for line in out.splitlines() if line.startswith("output: "))
    assert "héllo 日本" in line and "\\u00e9" not in line
    assert "\x1b" not in line and "\\u001b[2J" in line


@pytest.mark.parametrize("pad", range(590, 602))
def test_the_output_line_is_never_cut_inside_an_escape(pad: int) -> None:
    line = cli_status.output_line("x" * pad + "\x1b\u0085" + "y" * 50, 600)
    body = line.removesuffix(" …")
    assert line.endswith(" …") and len(body) <= 600
    assert not re.search(r"(?<!\\)(\\\\)*\\(u[0-9a-f]{0,3}|x[0-9a-f]?)?$", body), body[-12:]


# ------------------------------------------------------------------ 8: options, exports, docs


@pytest.mark.parametrize("option", [["--summary"], ["--nodes-limit", "5"], ["--nodes-after", "hello"]])
def test_json_only_status_options_without_json_are_refused(waiting: str, sqlite_url: str,
                                                           option: list[str]) -> None:
    code, out, err = invoke("status", waiting, "--db", sqlite_url, *option)
    one_line_error(code, err, f"{option[0]} shapes the JSON document: add --json")
    assert out == ""


@pytest.mark.parametrize("command", ["run", "submit", "launch"])
def test_label_help_describes_the_new_runs_label(command: str) -> None:
    code, out, _ = invoke(command, "--help")
    assert code == 0
    assert "a label of the new run" in " ".join(out.split()) and "only runs with" not in out


def test_list_label_help_describes_the_filter() -> None:
    code, out, _ = invoke("list", "--help")
    assert code == 0 and "only runs with this label" in " ".join(out.split())


def _validation_error() -> ValidationError:
    try:
        TypeAdapter(int).validate_python("x")
    except ValidationError as exc:
        return exc
    raise AssertionError("unreachable")


def test_input_type_error_is_public_and_survives_ray_pickling() -> None:
    error: Any = output_types.input_type_error("ship", "charge", int, _validation_error())
    assert isinstance(error, InputTypeError) and isinstance(error, Permanent)
    assert "step 'ship' cannot read the output of step 'charge' as int" in str(error)
    cls, args = error.__reduce__()  # what pickling (Ray's, as a task raises it) rebuilds it from
    again = cls(*args)
    assert type(again) is InputTypeError and str(again) == str(error)


def test_the_readme_saga_snippet_defines_refund_before_using_it() -> None:
    readme = (REPO / "README.md").read_text()
    snippet = readme[readme.index("## Sagas and partial failure"):]
    snippet = snippet[:snippet.index("```", snippet.index("```python") + 3)]
    assert snippet.index("def refund(") < snippet.index("compensate=refund")


def test_the_cli_doc_lists_resume_and_retry_options() -> None:
    doc = (REPO / "docs" / "cli.md").read_text()
    section = doc[doc.index("### `raysaga resume RUN`"):doc.index("### `raysaga fork")]
    assert "Options as for `run`" not in section
    for option in ("--workflow", "--db", "--executor", "--address", "--lease-ttl", "--json", "--quiet",
                   "--allow-changed", "--compensations", "raysaga unpause RUN"):
        assert option in section, option


# ------------------------------------------------------------------ 9: an agent's calls on its own line

AGENT_FLOW = textwrap.dedent('''
    from raysaga import Workflow
    from raysaga.agents import Agent, tool
    from raysaga.testing import ScriptedModel, text_reply, tool_reply


    @tool
    def search(query: str) -> str:
        """Search the corpus."""
        return f"about {query}"


    model = ScriptedModel({
        "Question: heat pumps?": [text_reply("costs|carbon")],
        "Sub: costs": [tool_reply(("search", {"query": "costs"})), text_reply("cheap")],
        "Sub: carbon": [text_reply("less")],
    })
    planner = Agent("planner", model)
    researcher = Agent("researcher", model, tools=(search,))
    wf = Workflow("onb40_agents")


    @wf.agent(planner)
    def plan_it(input: str) -> str:
        return f"Question: {input}"


    @wf.step()
    def plan(plan_it: str) -> list[str]:
        return plan_it.split("|")


    @wf.agent(researcher, map_over="plan")
    def research(plan: str) -> str:
        return f"Sub: {plan}"
''')


def test_an_agents_turns_and_tool_calls_are_counted_on_its_line_in_run_order(tmp_path: Path,
                                                                              sqlite_url: str) -> None:
    """``plan_it`` (an agent) ran before ``plan``: it is listed first, its turn is counted on its
    line, and a mapped agent's turns by item are not fan-outs of their own."""
    (tmp_path / "onb40_agents.py").write_text(AGENT_FLOW)
    flow = f"{tmp_path / 'onb40_agents.py'}:wf"
    code, _, err = invoke("run", flow, "--input", '"heat pumps?"', "--run-id", "ag40", "--db", sqlite_url,
                          "--executor", "inline", "--quiet")
    assert code == 0, err
    for extra in ((), ("--workflow", flow)):
        code, out, err = invoke("status", "ag40", "--db", sqlite_url, *extra)
        assert code == 0, err
        lines = out.splitlines()
        table = [line.split()[0] for line in lines[lines.index(next(x for x in lines if x.startswith("node"))) + 1:]
                 if line and not line.startswith(("fan-out", "output"))]
        assert table == ["plan_it", "plan", "research"], out
        assert re.search(r"^plan_it\s+completed\s+1\s+1 turn$", out, re.M), out
        assert re.search(r"^research\s+completed\s+1\s+3 turns, 1 tool call$", out, re.M), out
        assert [x for x in lines if x.startswith("fan-out")] == ["fan-out research: 2 items — 2 completed"], out
        assert "@" not in out, out
