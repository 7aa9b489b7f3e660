"""The CLI's side of operating runs (review, stop 44).

- ``raysaga unpause`` of a run paused on its spent budget made it due for ever (a worker claimed it
  100-200 times a second): it is refused, naming how to raise the budget;
- no command could raise a budget: ``resume`` and ``retry`` take ``--token-budget``/``--cost-budget``,
  a retry of a run its budget failed is refused without one, a resume left paused says how;
- ``raysaga cancel --compensate`` of a run with a plain cancel queued ended it ``cancelled``, exit 0,
  nothing rolled back; one that finds the run ended so exits 1 naming the effects that stand;
- a run started from Python recorded no workflow: ``raysaga resume RUN`` asked for ``--workflow``.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import typer

import raysaga
from raysaga import RunOptions, RunStatus
from raysaga.orchestrator import cli_ops
from raysaga.state import open_store
from tests.support.cli import invoke, one_line_error, project_folder

FLOW = '''
from raysaga import Approval, Ask, StepContext, Workflow
from raysaga.agents import Agent, ScriptedModel, text_reply, tool, tool_reply


@tool
def lookup(q: str) -> str:
    """Look something up."""
    return "found " + q


def _model() -> ScriptedModel:
    return ScriptedModel(script={"task": [tool_reply(("lookup", {"q": "a"})), tool_reply(("lookup", {"q": "b"})),
                                          text_reply("done")]})


paused = Workflow("stop44_cli_pause")


@paused.agent(Agent("worker", _model(), tools=(lookup,), max_turns=5, on_budget="pause"))
def work(input: str) -> str:
    return "task"


failing = Workflow("stop44_cli_fail")


@failing.agent(Agent("worker", _model(), tools=(lookup,), max_turns=5, on_budget="fail"))
def work2(input: str) -> str:
    return "task"


saga = Workflow("stop44_cli_saga")


@saga.step(effect=True)
def charge(ctx: StepContext) -> str:
    return "ch-1"


@saga.compensation("charge")
def refund(ctx: StepContext, output: str) -> None:
    pass


@saga.approval(after=["charge"])
def ok(charge: str) -> Ask:
    return Ask(prompt="ship?")


@saga.step()
def ship(ok: Approval) -> str:
    return "shipped"
'''


@pytest.fixture
def flows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    """The module, imported from this test's own project folder (the one ``resume`` finds there)."""
    project_folder(tmp_path, monkeypatch, "stop44_cli_flows", FLOW)
    sys.modules.pop("stop44_cli_flows", None)
    yield importlib.import_module("stop44_cli_flows")
    sys.modules.pop("stop44_cli_flows", None)


def test_resume_and_retry_raise_a_spent_budget(flows: object, sqlite_url: str) -> None:
    run = raysaga.run(flows.paused, "x", store=sqlite_url, run_id="p1", executor="inline",  # type: ignore[attr-defined]
                      options=RunOptions(token_budget=30))
    assert run.status == RunStatus.PAUSED and run.workflow_ref == "stop44_cli_flows:paused"  # no --workflow needed
    code, _, err = invoke("unpause", "p1", "--db", sqlite_url)
    one_line_error(code, err, "raise the budget: `raysaga resume p1 --token-budget N` with N above the 40 tokens")
    code, _, err = invoke("resume", "p1", "--executor", "inline", "--db", sqlite_url, "-q")
    assert code == 1 and "raysaga resume p1 --token-budget N" in err, err  # left paused: says how
    code, out, err = invoke("resume", "p1", "--executor", "inline", "--db", sqlite_url, "-q", "--token-budget", "1000")
    assert code == 0 and "completed" in out, err

    failed = raysaga.run(flows.failing, "x", store=sqlite_url, run_id="f1", executor="inline",  # type: ignore[attr-defined]
                         options=RunOptions(token_budget=30))
    assert failed.status == RunStatus.FAILED
    code, _, err = invoke("retry", "f1", "--executor", "inline", "--db", sqlite_url, "-q")
    one_line_error(code, err, "a retry with the same budget fails again at once; raise it: `raysaga retry f1 "
                              "--token-budget N`")
    assert raysaga.Client(sqlite_url).get_run("f1").status == RunStatus.FAILED  # refused before any change
    code, out, err = invoke("retry", "f1", "--executor", "inline", "--db", sqlite_url, "-q", "--token-budget", "1000")
    assert code == 0 and "completed" in out, err


@pytest.mark.parametrize(("option", "value", "message"), [
    ("--token-budget", "-1", "--token-budget must be at least 0, got -1"),
    ("--token-budget", str(2**63), "--token-budget must be from 0 to 9223372036854775807"),
    ("--cost-budget", "nan", "--cost-budget must be a finite amount of USD >= 0, got nan"),
    ("--cost-budget", "-0.5", "--cost-budget must be a finite amount of USD >= 0, got -0.5"),
])
@pytest.mark.parametrize("verb", ["resume", "retry"])
def test_budget_options_are_checked(verb: str, option: str, value: str, message: str, sqlite_url: str) -> None:
    code, _, err = invoke(verb, "any-run", "--db", sqlite_url, option, value)
    one_line_error(code, err, message)


def test_cancel_compensate_rolls_back_though_a_plain_cancel_is_queued(flows: object, sqlite_url: str) -> None:
    run = raysaga.run(flows.saga, store=sqlite_url, run_id="s1", executor="inline")  # type: ignore[attr-defined]
    assert run.status == RunStatus.WAITING_HUMAN
    store = open_store(sqlite_url)
    try:
        store.send_signal("s1", "cancel", payload={"reason": "stop", "compensate": False})
    finally:
        store.close()
    code, out, err = invoke("cancel", "s1", "--compensate", "--executor", "inline", "--db", sqlite_url)
    assert code == 0 and "s1: compensated" in out, (out, err)


def test_cancel_compensate_finding_the_run_cancelled_names_what_stands(
        flows: object, sqlite_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    raysaga.run(flows.saga, store=sqlite_url, run_id="s2", executor="inline")  # type: ignore[attr-defined]
    code, out, _ = invoke("cancel", "s2", "--executor", "inline", "--db", sqlite_url)  # a plain cancel came first
    assert code == 0 and "s2: cancelled" in out
    store = open_store(sqlite_url)
    try:
        with pytest.raises(typer.Exit) as ended:
            cli_ops.cancel_outcome(store, store.get_run("s2"), True)
    finally:
        store.close()
    assert ended.value.exit_code == 1
    err = capsys.readouterr().err
    assert "run s2 ended cancelled without a rollback" in err and "Its effects stand: charge (charge)" in err, err
    assert "undo them by hand" in err
    # the CLI says it too when the plain cancel ended the run before `cancel --compensate` looked at it
    code, out, err = invoke("cancel", "s2", "--compensate", "--executor", "inline", "--db", sqlite_url)
    assert code == 1 and "already cancelled" in out and "Its effects stand: charge (charge)" in err, out + err
