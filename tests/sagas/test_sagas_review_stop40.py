"""Review of sagas and rollback (stop 40): what a rollback undoes, under which key, and what it says.

- An undo that worked and returned a value with no JSON form (an HTTP client's ``Response``) was
  refused like a step's output: the refund was recorded ``failed`` (``took_effect``), the run
  parked in ``compensation_failed``, and every ``retry --compensations`` refunded again, not
  reconciling, failing the same way. Now an undo's return value is stored as a short note.
- A key re-issued while its last error says ``took_effect`` goes out ``reconciling``.
- A step prepared in the round a failure was found (never sent) was compensated as if it might
  have run; its row now says ``took_effect: False`` (a durable marker), and no rollback undoes it.
  Items still queued in the driver's Ray lane when the run failed, the same.
- ``cancel --compensate`` did nothing on a run paused by its token budget.
- Two forks that inherited one effect both called its compensation under the same key; the
  second's writes moved the ledger row away from the first. Now the second answers from the row.
- A ``Compensate()`` verdict on a non-critical fan-out was reported as "critical step failed".
- ``Saga("s").step(act).step(act)`` said "depends on itself", not that the name is taken.
- A step whose retries ran out on transient errors left its ledger row ``failed`` though the
  rollback treats it as may-have-taken-effect; it is ``abandoned`` now, and a retry reconciles it.
"""

from __future__ import annotations

import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

import raysaga
from raysaga import (
    NOT_APPLIED,
    Compensate,
    Permanent,
    RetryPolicy,
    RunOptions,
    RunStatus,
    Saga,
    StepContext,
    Transient,
    Workflow,
    on_partial_failure,
)
from raysaga.agents import Agent, ScriptedModel, text_reply, tool, tool_reply
from raysaga.errors import WorkflowDefinitionError
from raysaga.state import Batch, EffectStatus, EffectWrite, NodeStatus, SqlStore

CALLS: list[tuple[str, Any]] = []


@pytest.fixture(autouse=True)
def _fresh_calls() -> None:
    CALLS.clear()


def _name(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


def _facts(url: str, run_id: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The run's node rows and ledger rows, by label."""
    store = SqlStore(url)
    try:
        nodes = {n.label: n for n in store.nodes(run_id)}
        ledger = {e.node_id + ("" if e.fan_index < 0 else f"[{e.fan_index}]"): e for e in store.effects(run_id)}
        return nodes, ledger
    finally:
        store.close()


# ---------------------------------------------------------------------- 1. an undo's return value


class Response:
    """What an HTTP client returns: no JSON form."""

    status_code = 200

    def __repr__(self) -> str:
        return "<Response [200] auth=sk-ant-api03-" + "A" * 40 + " body=" + "x" * 500 + ">"


def _refund_flow(returns: str) -> Workflow:
    wf = Workflow(_name(f"undo_{returns}"))

    def refund(ctx: StepContext, output: str) -> Any:
        CALLS.append(("refund", ctx.reconciling))
        return Response() if returns == "object" else {"blob": "y" * 5000}

    @wf.step(effect=True, compensate=refund)
    def charge(ctx: StepContext) -> str:
        return "ch_1"

    @wf.step(effect=True)
    def ship(ctx: StepContext, charge: str) -> str:
        raise Permanent("no stock")

    return wf


@pytest.mark.parametrize("returns", ["object", "oversized"])
def test_an_undo_that_returned_an_unstorable_value_completes_the_rollback(sqlite_url: str, returns: str) -> None:
    """The refund went through and answered a ``Response`` (or more than the output cap): the run
    is ``compensated``, the refund called once, and its row and ledger keep a short note."""
    wf = _refund_flow(returns)
    done = raysaga.run(wf, None, store=sqlite_url, run_id="r1", executor="inline",
                       options=RunOptions(max_output_bytes=1000))
    assert done.status == RunStatus.COMPENSATED, (done.status_reason, done.error)
    assert CALLS == [("refund", False)]
    nodes, ledger = _facts(sqlite_url, "r1")
    row = ledger["charge:compensate"]
    assert row.status == EffectStatus.COMMITTED
    note = row.result
    assert nodes["charge:compensate"].status == NodeStatus.COMPLETED and nodes["charge:compensate"].output == note
    if returns == "object":
        assert note["not_stored"] == "NotJSONableError" and note["type"] == "Response"
        assert note["repr"].startswith("<Response [200] auth=[redacted]") and "sk-ant" not in note["repr"]
        assert len(note["repr"]) == 200  # cut
    else:
        assert note["not_stored"] == "Permanent" and note["type"] == "dict"


def test_a_key_whose_last_error_says_it_took_effect_is_reissued_reconciling(sqlite_url: str) -> None:
    """An effect step whose function returned a value raysaga refused failed for good, its error
    saying ``took_effect``: an operator's retry re-issues its key ``reconciling`` (the effect is
    there), so its ``reconcile=`` hook is asked first and the charge is not made again."""
    wf = Workflow(_name("took_effect"))
    fixed = [False]

    def look_up(ctx: StepContext) -> str:
        CALLS.append(("reconcile", ctx.reconciling))
        return "ch_1"

    @wf.step(effect=True, reconcile=look_up)
    def charge(ctx: StepContext) -> Any:
        CALLS.append(("charge", ctx.reconciling))
        return "ch_1" if fixed[0] else Response()

    failed = raysaga.run(wf, None, store=sqlite_url, run_id="r1", executor="inline")
    assert failed.status == RunStatus.FAILED, failed.status_reason
    _, ledger = _facts(sqlite_url, "r1")
    assert ledger["charge"].status == EffectStatus.FAILED and ledger["charge"].result["error"]["took_effect"] is True
    fixed[0] = True
    done = raysaga.retry(wf, "r1", store=sqlite_url, executor="inline")
    assert done.status == RunStatus.COMPLETED and done.output == {"charge": "ch_1"}
    assert CALLS == [("charge", False), ("reconcile", True)]  # reconciled, never charged again


# ---------------------------------------------------------------------- 2. never sent


def _unsent_flow() -> Workflow:
    """``y`` (an effect with an undo) is prepared in the round in which ``fan`` fails (it maps
    over a dict): it is never sent."""
    wf = Workflow(_name("unsent"))

    def undo_y(ctx: StepContext, output: Any) -> None:
        CALLS.append(("undo_y", output))

    @wf.step
    def plan() -> dict[str, str]:
        return {"not": "a list"}

    @wf.step(effect=True, compensate=undo_y)
    def y(ctx: StepContext, plan: dict[str, str]) -> str:
        CALLS.append(("y", None))
        return "Y"

    @wf.map("plan")
    def fan(plan: int) -> int:
        return plan

    return wf


def test_an_effect_prepared_but_never_sent_is_not_compensated(sqlite_url: str) -> None:
    wf = _unsent_flow()
    done = raysaga.run(wf, None, store=sqlite_url, run_id="r1", executor="inline")
    assert done.status == RunStatus.FAILED, done.status_reason  # nothing to undo
    assert CALLS == []
    nodes, ledger = _facts(sqlite_url, "r1")
    assert nodes["y"].status == NodeStatus.CANCELLED
    assert nodes["y"].error == {"reason": "not sent: the run failed", "took_effect": False}
    assert "y" not in ledger and "y:compensate" not in nodes


@pytest.fixture(scope="module")
def _pickle_by_value() -> None:
    cloudpickle = pytest.importorskip("ray.cloudpickle")
    cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.mark.ray
def test_items_still_queued_in_the_lane_when_the_run_fails_are_not_compensated(
        ray_session: str, _pickle_by_value: None, sqlite_url: str, tmp_path: Path) -> None:
    """A wide fan-out of items with an undo, and a sibling that fails at once: at most a lane's
    worth of items were handed to Ray; the others, still queued in the driver, are cancelled
    before they leave it. Their rows say ``took_effect: False`` and none is undone; every item
    that started is undone."""
    marks = tmp_path / "marks"
    marks.mkdir()
    wf = Workflow(_name("lane"))
    n = 40

    def undo_item(output: Any, plan: int) -> None:
        (marks / f"undo.{plan}").touch()

    @wf.step
    def plan() -> list[int]:
        return list(range(n))

    @wf.step
    def boom(plan: list[int]) -> int:  # declared before ``item``: it goes to Ray first
        raise Permanent("boom")

    @wf.map("plan", compensate=undo_item)
    def item(plan: int) -> int:
        (marks / f"start.{plan}").touch()
        import time

        time.sleep(0.5)  # work that takes a while: the lane does not drain before the failure
        return plan

    done = raysaga.run(wf, None, store=sqlite_url, run_id="r1", executor="ray")
    assert done.status == RunStatus.COMPENSATED, done.status_reason
    started = {int(p.name.split(".")[1]) for p in marks.glob("start.*")}
    undone = {int(p.name.split(".")[1]) for p in marks.glob("undo.*")}
    nodes, _ = _facts(sqlite_url, "r1")
    unsent = {i for i in range(n) if nodes[f"item[{i}]"].error is not None
              and nodes[f"item[{i}]"].error.get("took_effect") is False}
    assert unsent, "every item was handed to Ray before the failure: the lane held none back"
    assert not unsent & started, "an item the driver says it never sent ran"
    assert started <= undone, "an item that ran was not undone"
    assert undone == set(range(n)) - unsent  # each sent item (it may have started) is undone, none other
    assert all(nodes[f"item[{i}]"].status == NodeStatus.CANCELLED for i in unsent)


# ---------------------------------------------------------------------- 3. cancel a budget-paused run


def test_cancel_with_compensation_rolls_back_a_run_paused_by_its_budget(sqlite_url: str) -> None:
    @tool()
    def lookup(q: str) -> str:
        """look something up"""
        return "x"

    model = ScriptedModel(default=(
        tool_reply(("lookup", {"q": "a"}), input_tokens=50, output_tokens=50),
        tool_reply(("lookup", {"q": "b"}), input_tokens=50, output_tokens=50),
        text_reply("done", input_tokens=50, output_tokens=50),
    ))
    wf = Workflow(_name("budget"))

    def refund(ctx: StepContext, output: str) -> None:
        CALLS.append(("refund", output))

    @wf.step(effect=True, compensate=refund)
    def charge(ctx: StepContext) -> str:
        return "ch_1"

    @wf.agent(Agent(name="ag", model=model, system="s", tools=(lookup,)))
    def research(charge: str) -> str:
        return "go"

    paused = raysaga.run(wf, None, store=sqlite_url, run_id="r1", executor="inline",
                         options=RunOptions(token_budget=150))
    assert paused.status == RunStatus.PAUSED and "budget" in (paused.status_reason or ""), paused.status_reason
    done = raysaga.cancel("r1", store=sqlite_url, compensate=True, workflow=wf, executor="inline")
    assert done.status == RunStatus.COMPENSATED, done.status_reason
    assert CALLS == [("refund", "ch_1")]
    store = SqlStore(sqlite_url)
    try:
        assert store.pending_signals("r1") == []  # the cancel signal was consumed
    finally:
        store.close()


# ---------------------------------------------------------------------- 4. forks sharing an undo key


def _fork_flow(fails: list[bool]) -> Workflow:
    wf = Workflow(_name("forks"))

    def refund(ctx: StepContext, output: str) -> None:
        CALLS.append(("refund", (ctx.run_id, ctx.idempotency_key)))

    @wf.step(effect=True, compensate=refund)
    def charge(ctx: StepContext) -> str:
        CALLS.append(("charge", ctx.run_id))
        return "ch_1"

    @wf.step(effect=True)
    def ship(ctx: StepContext, charge: str) -> str:
        if fails[0]:
            raise Permanent("no stock")
        return "sh"

    return wf


def test_two_forks_rolling_back_an_inherited_effect_call_its_undo_once(sqlite_url: str) -> None:
    fails = [False]
    wf = _fork_flow(fails)
    assert raysaga.run(wf, None, store=sqlite_url, run_id="P", executor="inline").status == RunStatus.COMPLETED
    for child in ("F1", "F2"):  # both made before either rolls back: each inherits the charge
        raysaga.fork(wf, "P", from_node="ship", store=sqlite_url, new_run_id=child, executor="inline", drive=False)
    fails[0] = True
    for child in ("F1", "F2"):
        done = raysaga.resume(wf, child, store=sqlite_url, executor="inline")
        assert done.status == RunStatus.COMPENSATED, (child, done.status_reason, done.error)
    refunds = [c for c in CALLS if c[0] == "refund"]
    assert len(refunds) == 1 and refunds[0][1][0] == "F1", CALLS
    nodes, _ = _facts(sqlite_url, "F2")
    assert nodes["charge:compensate"].status == NodeStatus.COMPLETED  # answered from F1's ledger row
    store = SqlStore(sqlite_url)
    try:
        key = refunds[0][1][1]
        owners = [(e.run_id, e.status) for run in ("P", "F1", "F2") for e in store.effects(run)
                  if e.idempotency_key == key]
        assert owners == [("F1", EffectStatus.COMMITTED)]  # the row stayed with the run that wrote it
        assert [e.kind for e in store.events("F2") if e.kind == "node_completed" and e.node_id == "charge:compensate"
                and e.data.get("from") == "ledger"] == ["node_completed"]
    finally:
        store.close()


def test_a_committed_ledger_row_is_never_overwritten_by_another_run(sqlite_url: str) -> None:
    """The store's side of it: a settling write of another run's committed key changes nothing."""
    wf = Workflow(_name("ledger_guard"))

    @wf.step
    def one() -> int:
        return 1

    store = SqlStore(sqlite_url)
    try:
        for run_id in ("A", "B"):
            raysaga.create_run(wf, None, store=store, run_id=run_id)
        key = "rs-shared:compensate"

        def write(status: EffectStatus, result: Any = None) -> Batch:
            return Batch(effects=[EffectWrite(idempotency_key=key, node_id="x:compensate", effect_name="x:compensate",
                                              args_digest="", status=status, result=result)])

        lease = store.claim("A", "owner-a", 15)
        store.commit(lease, write(EffectStatus.PENDING))
        store.commit(lease, write(EffectStatus.COMMITTED, {"ok": 1}))
        other = store.claim("B", "owner-b", 15)
        store.commit(other, write(EffectStatus.FAILED, {"error": {}}))
        [kept] = [e for e in store.effects("A") if e.idempotency_key == key]
        assert (kept.status, kept.result) == (EffectStatus.COMMITTED, {"ok": 1})
        assert [e for e in store.effects("B") if e.idempotency_key == key] == []
    finally:
        store.close()


# ---------------------------------------------------------------------- 6, 7. words


def test_a_compensate_verdict_on_a_non_critical_fan_out_is_reported_as_the_verdict(sqlite_url: str) -> None:
    wf = Workflow(_name("verdict"))

    def undo(plan: int) -> None:
        CALLS.append(("undo", plan))

    @wf.step
    def plan() -> list[int]:
        return [0, 1, 2]

    @wf.map("plan", effect=True, compensate=undo, critical=False,
            policy=on_partial_failure(lambda result: Compensate("undo all")))
    def item(ctx: StepContext, plan: int) -> int:
        if plan == 1:
            raise Permanent("bad card")
        return plan

    done = raysaga.run(wf, None, store=sqlite_url, run_id="r1", executor="inline")
    assert done.status == RunStatus.COMPENSATED
    assert done.status_reason == "fan-out 'item': its partial-failure policy decided Compensate: undo all; rolled back"
    assert sorted(CALLS) == [("undo", 0), ("undo", 2)]


def test_a_saga_given_the_same_step_twice_says_the_name_is_taken() -> None:
    def act(ctx: StepContext) -> str:
        return "x"

    saga = Saga(_name("saga")).step(act)
    with pytest.raises(WorkflowDefinitionError, match="already has a step named 'act'") as caught:
        saga.step(act)
    assert "depends on itself" not in str(caught.value)
    saga.step(act, name="act_again")  # another name is fine
    assert list(saga.workflow.steps) == ["act", "act_again"]


# ---------------------------------------------------------------------- 8. retries ran out on transient errors


def test_a_step_whose_retries_ran_out_on_transient_errors_is_abandoned_and_reconciled(sqlite_url: str) -> None:
    """Whether its last call took effect is unknown (the rollback assumes it may have): the ledger
    row says ``abandoned``, not ``failed``; an operator's retry re-issues the key ``reconciling``,
    so its ``reconcile=`` hook runs before any new call."""
    wf = Workflow(_name("transient"))
    healthy = [False]

    def look_up(ctx: StepContext) -> Any:
        CALLS.append(("reconcile", ctx.reconciling))
        return "ch_2" if healthy[0] else NOT_APPLIED  # (the provider has no charge under the key yet)

    @wf.step(effect=True, reconcile=look_up, retry=RetryPolicy(max_attempts=2, base=0.0, cap=0.0))
    def charge(ctx: StepContext) -> str:
        CALLS.append(("charge", ctx.reconciling))
        if not healthy[0]:
            raise Transient("timeout: did it commit?")
        return "ch_2"

    failed = raysaga.run(wf, None, store=sqlite_url, run_id="r1", executor="inline")
    assert failed.status == RunStatus.FAILED, failed.status_reason
    nodes, ledger = _facts(sqlite_url, "r1")
    assert nodes["charge"].status == NodeStatus.FAILED and nodes["charge"].error["transient"] is True
    assert ledger["charge"].status == EffectStatus.ABANDONED
    assert ledger["charge"].result["error"]["reason"] == "2 attempts exhausted"
    healthy[0] = True
    done = raysaga.retry(wf, "r1", store=sqlite_url, executor="inline")
    assert done.status == RunStatus.COMPLETED, done.status_reason
    # attempt 2 reconciled in the run already (its key pending); the retry reconciles again (abandoned),
    # finds the charge, and calls nothing
    assert CALLS == [("charge", False), ("reconcile", True), ("charge", True), ("reconcile", True)]
