"""Operating runs (review, stop 44).

- ``unpause`` of a run that paused itself on its spent budget set its ``wake_at``; the driver that
  took it up found the budget still spent and returned at once, leaving it due: a worker claimed it
  100-200 times a second for ever (a ``lease_claimed`` event each time);
- such a run with a deadline was never woken at its deadline (docs/operations.md says it is);
- a plain cancel consumed a queued ``cancel --compensate`` and ended the run ``cancelled``, and a
  driver with both pending obeyed the first: the rollback asked for never ran;
- ``retry`` of a run its spent budget failed failed again at once, saying nothing;
- a run started from Python recorded no ``workflow_ref``: ``raysaga resume`` asked for ``--workflow``;
- ``recordable_ref`` of ``a/b/flows.py:wf`` (folders without ``__init__.py``) raised ``KeyError: 'a'``.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import update

import raysaga
from raysaga import Approval, Ask, RunOptions, RunStatus, StepContext, Workflow
from raysaga.agents import Agent, ScriptedModel, text_reply, tool, tool_reply
from raysaga.errors import UserError
from raysaga.orchestrator import loader, runner
from raysaga.orchestrator.driver import Driver
from raysaga.orchestrator.executor import make_executor
from raysaga.state import RunRecord, open_store
from raysaga.state.schema import runs


@tool
def lookup(q: str) -> str:
    """Look something up."""
    return "found " + q


def _agent_flow(name: str, on_budget: str) -> Workflow:
    """An agent of three model turns, 20 tokens each: over ``token_budget=30`` after two."""
    model = ScriptedModel(script={"task": [tool_reply(("lookup", {"q": "a"})), tool_reply(("lookup", {"q": "b"})),
                                           text_reply("done")]})
    wf = Workflow(name)

    @wf.agent(Agent("worker", model, tools=(lookup,), max_turns=5, on_budget=on_budget))
    def work(input: str) -> str:
        return "task"

    return wf


def _paused_on_budget(url: str, run_id: str, **options: Any) -> tuple[Workflow, RunRecord]:
    wf = _agent_flow("stop44_budget", "pause")
    run = raysaga.run(wf, "x", store=url, run_id=run_id, executor="inline",
                      options=RunOptions(token_budget=30, **options))
    assert run.status == RunStatus.PAUSED and (run.status_reason or "").startswith("budget:"), run.status_reason
    return wf, run


def test_unpause_refuses_a_run_paused_on_its_budget_naming_how_to_raise_it(store_url: str) -> None:
    _paused_on_budget(store_url, "b-unpause")
    with raysaga.Client(store_url) as client:
        with pytest.raises(UserError) as refused:
            client.unpause("b-unpause", by="ops")
        assert client.get_run("b-unpause").wake_at is None  # not made due: no worker takes it up
    text = str(refused.value)
    assert "paused itself" in text and "budget:" in text
    assert "raysaga resume b-unpause --token-budget N" in text and "RunOptions(token_budget=N)" in text


def test_a_driver_finding_the_budget_still_spent_leaves_the_run_not_due(store_url: str) -> None:
    wf, _ = _paused_on_budget(store_url, "b-woken")
    store = open_store(store_url)
    try:  # as an unpause before this fix left it: due now
        assert store.wake("b-woken", [RunStatus.PAUSED], "unpaused by ops", "unpause_requested")
        again = raysaga.resume(wf, "b-woken", store=store, executor="inline")
        assert again.status == RunStatus.PAUSED
        assert store.get_run("b-woken").wake_at is None  # a worker claimed it again and again
        assert store.claim_next("worker-1", 15.0, {wf.name: wf.definition_hash}) is None
        # a larger budget lets it go on
        done = raysaga.resume(wf, "b-woken", store=store, executor="inline", options=RunOptions(token_budget=1000))
        assert done.status == RunStatus.COMPLETED, done.status_reason
    finally:
        store.close()


def test_an_operators_pause_lifted_on_a_spent_budget_says_the_budget(sqlite_url: str) -> None:
    """Paused by an operator while the call that spent its budget ran, then unpaused: the run rested
    "paused by operator", which unpause let a worker take up (and hold again, silently) and which
    ``resume --token-budget`` refused (an operator's pause): no way out but by hand."""
    wf, _ = _paused_on_budget(sqlite_url, "b-op")
    store = open_store(sqlite_url)
    try:  # the state the race left: the budget spent, the reason an operator's
        with store.engine.begin() as conn:
            conn.execute(update(runs).where(runs.c.run_id == "b-op").values(status_reason="paused by operator"))
        assert store.wake("b-op", [RunStatus.PAUSED], "unpaused by ops", "unpause_requested")
        again = raysaga.resume(wf, "b-op", store=store, executor="inline")
        assert again.status == RunStatus.PAUSED and (again.status_reason or "").startswith("budget: ")
        with pytest.raises(UserError, match="--token-budget"):  # unpause now says how to raise it
            raysaga.Client(store).unpause("b-op")
        done = raysaga.resume(wf, "b-op", store=store, executor="inline", options=RunOptions(token_budget=1000))
        assert done.status == RunStatus.COMPLETED, done.status_reason
    finally:
        store.close()


def test_a_budget_paused_run_is_due_at_its_deadline_and_rolled_back_then(sqlite_url: str) -> None:
    wf, run = _paused_on_budget(sqlite_url, "b-deadline", deadline=3600)
    assert run.deadline_at is not None and run.wake_at == run.deadline_at  # due at its deadline
    store = open_store(sqlite_url)
    try:  # taken up before it: rests again, due at the deadline still
        assert store.wake("b-deadline", [RunStatus.PAUSED], "unpaused by ops", "unpause_requested")
        assert raysaga.resume(wf, "b-deadline", store=store, executor="inline").status == RunStatus.PAUSED
        assert store.get_run("b-deadline").wake_at == run.deadline_at
        deadline = run.deadline_at  # taken up at its deadline (the driver's clock past it): it ends on it
        ended = Driver(wf, store, make_executor("inline"), "b-deadline", clock=lambda: deadline + 1).drive()
        assert ended.status == RunStatus.FAILED and ended.status_reason == "deadline", ended.status_reason
    finally:
        store.close()


def _saga(name: str) -> tuple[Workflow, list[str]]:
    calls: list[str] = []
    wf = Workflow(name)

    @wf.step(effect=True)
    def charge(ctx: StepContext) -> str:
        calls.append("charge")
        return "ch-1"

    @wf.compensation("charge")
    def refund(ctx: StepContext, output: str) -> None:
        calls.append("refund")

    @wf.approval(after=["charge"])
    def ok(charge: str) -> Ask:
        return Ask(prompt="ship?")

    @wf.step()
    def ship(ok: Approval) -> str:
        return "shipped"

    return wf, calls


def test_a_plain_cancel_leaves_a_run_to_the_rollback_asked_before_it(store_url: str) -> None:
    wf, calls = _saga("stop44_cancel_mix")
    assert raysaga.run(wf, store=store_url, run_id="c-mix", executor="inline").status == RunStatus.WAITING_HUMAN
    with raysaga.Client(store_url) as client:
        client.cancel("c-mix", compensate=True, by="ops-1")  # queued for a worker
    plain = runner.cancel("c-mix", store=store_url, executor="inline")
    assert plain.status == RunStatus.WAITING_HUMAN  # was: cancelled, the rollback's request consumed
    rolled = raysaga.resume(wf, "c-mix", store=store_url, executor="inline")
    assert rolled.status == RunStatus.COMPENSATED and calls == ["charge", "refund"]


def test_a_driver_with_a_plain_and_a_compensating_cancel_pending_rolls_back(store_url: str) -> None:
    wf, calls = _saga("stop44_two_cancels")
    assert raysaga.run(wf, store=store_url, run_id="c-two", executor="inline").status == RunStatus.WAITING_HUMAN
    store = open_store(store_url)
    try:
        store.send_signal("c-two", "cancel", payload={"reason": "stop it", "compensate": False})
        store.send_signal("c-two", "cancel", payload={"reason": "undo it", "compensate": True})
        ended = raysaga.resume(wf, "c-two", store=store, executor="inline")
        assert store.pending_signals("c-two") == []  # the plain cancel passed over is consumed with it
    finally:
        store.close()
    assert ended.status == RunStatus.COMPENSATED and calls == ["charge", "refund"]


def test_a_compensating_cancel_is_sent_though_a_plain_one_is_pending(sqlite_url: str) -> None:
    """``cancel(compensate=True)`` of a run with no live driver and a plain cancel queued sent no
    signal of its own, and its driver obeyed the plain one: ``cancelled``, nothing rolled back."""
    wf, calls = _saga("stop44_queued_plain")
    assert raysaga.run(wf, store=sqlite_url, run_id="c-q", executor="inline").status == RunStatus.WAITING_HUMAN
    store = open_store(sqlite_url)
    try:
        store.send_signal("c-q", "cancel", payload={"reason": "stop it", "compensate": False})
        ended = runner.cancel("c-q", store=store, compensate=True, workflow=wf, executor="inline")
    finally:
        store.close()
    assert ended.status == RunStatus.COMPENSATED and calls == ["charge", "refund"]


def test_retry_of_a_run_its_budget_failed_is_refused_unless_the_budget_is_raised(store_url: str) -> None:
    wf = _agent_flow("stop44_budget_fail", "fail")
    failed = raysaga.run(wf, "x", store=store_url, run_id="b-fail", executor="inline",
                         options=RunOptions(token_budget=30))
    assert failed.status == RunStatus.FAILED and failed.error is not None and failed.error.type == "BudgetExceeded"
    with pytest.raises(UserError) as refused:
        raysaga.retry(wf, "b-fail", store=store_url, executor="inline")
    assert "raysaga retry b-fail --token-budget N" in str(refused.value)
    with raysaga.Client(store_url) as client, pytest.raises(UserError):
        client.retry("b-fail", by="ops")
    assert raysaga.Client(store_url).get_run("b-fail").status == RunStatus.FAILED  # nothing was changed
    done = raysaga.retry(wf, "b-fail", store=store_url, executor="inline", options=RunOptions(token_budget=1000))
    assert done.status == RunStatus.COMPLETED, done.status_reason


FLOW = textwrap.dedent('''
    from raysaga import Workflow

    wf = Workflow("stop44_ref")

    @wf.step()
    def one() -> int:
        return 1

    if __name__ == "__main__":
        import sys
        import raysaga
        run = raysaga.run(wf, store=sys.argv[1], run_id=sys.argv[2], executor="inline")
        print(run.workflow_ref)
''')


def test_a_run_started_from_python_records_where_its_workflow_lives(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sqlite_url: str) -> None:
    (tmp_path / "stop44_refmod.py").write_text(FLOW)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        module = importlib.import_module("stop44_refmod")
        _records_its_module(module, sqlite_url)
    finally:
        sys.modules.pop("stop44_refmod", None)


def _records_its_module(module: Any, sqlite_url: str) -> None:
    run = raysaga.run(module.wf, store=sqlite_url, run_id="ref-1", executor="inline")
    assert run.workflow_ref == "stop44_refmod:wf"
    with raysaga.Client(sqlite_url) as client:
        queued = client.submit(module.wf, run_id="ref-2")
    assert queued.workflow_ref == "stop44_refmod:wf"
    assert loader.load_recorded_workflow(run.workflow_ref, "ref-1") is module.wf  # what resume loads
    assert raysaga.create_run(module.wf, store=sqlite_url, workflow_ref="").workflow_ref is None  # none asked for
    local = Workflow("stop44_local")  # bound to no module-level name: nothing to record

    @local.step()
    def two() -> int:
        return 2

    assert raysaga.run(local, store=sqlite_url, run_id="ref-3", executor="inline").workflow_ref is None


def test_a_script_records_no_module_by_itself(tmp_path: Path, sqlite_url: str) -> None:
    """A run started by a script (``python -m NAME`` or ``python file.py``) records no ref unless
    given one: the dashboard or ``status --dag`` importing the script ran its top level again (a
    new run, a new charge), when that code was not under ``if __name__ == "__main__"``."""
    (tmp_path / "stop44_script.py").write_text(FLOW)
    env_path = str(tmp_path)
    for args, run_id in ((["-m", "stop44_script"], "ref-m"), (["stop44_script.py"], "ref-f")):
        shown = subprocess.run([sys.executable, *args, sqlite_url, run_id], cwd=env_path,
                               capture_output=True, text=True, timeout=120, check=True)
        assert shown.stdout.strip() == "None", shown.stderr


def test_recordable_ref_of_a_file_two_namespace_folders_down(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "stop44ns" / "billing"
    folder.mkdir(parents=True)
    (folder / "orderflow.py").write_text("wf = None\n")
    monkeypatch.chdir(tmp_path)
    assert loader.recordable_ref("stop44ns/billing/orderflow.py:wf") == "stop44ns.billing.orderflow:wf"
    assert loader.recordable_ref("stop44ns/billing/missing.py:wf") is None


def test_a_store_lost_while_a_run_is_created_says_it_may_not_exist(sqlite_url: str,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The connection dropped inside ``create_claimed`` (a fake at the store's edge: the insert
    raising what psycopg raises then): ``raysaga.run`` raised the raw ``OperationalError``, and the
    CLI advised ``raysaga resume`` of a run that was never created."""
    from sqlalchemy.exc import OperationalError

    from raysaga.errors import StoreOutageError, StoreUnavailableError
    from raysaga.state import SqlStore

    wf = Workflow("stop44_lost_create")

    @wf.step()
    def only() -> int:
        return 1

    def dropped(*args: Any, **kwargs: Any) -> Any:
        raise OperationalError("INSERT INTO raysaga_runs ...", {}, Exception(
            "terminating connection due to administrator command"))

    open_store(sqlite_url).close()
    monkeypatch.setattr(SqlStore, "create_claimed", dropped)
    with pytest.raises(StoreUnavailableError, match=r"while run 'lost-1' was created .*it may not exist.*"
                                                    r"--run-id lost-1") as caught:
        raysaga.run(wf, store=sqlite_url, run_id="lost-1", executor="inline")
    assert not isinstance(caught.value, StoreOutageError)  # whose message says "resume continues it"
    monkeypatch.undo()
    assert raysaga.run(wf, store=sqlite_url, run_id="lost-1", executor="inline").status == RunStatus.COMPLETED
