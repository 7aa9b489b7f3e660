"""Engine bugs the chaos suite found: a fixed one stays as its regression test, an open one is a
strict xfail.

``a decision made while a driver holds the run is lost`` (FIXED): a run rests
``waiting_human``; a driver takes it up without a decision (a worker re-driving it after a lost
answer, an orphan scan, a ``resume``) and moves it to ``running``; a human decides right then
(``store.decide`` records it and its signal; its wake finds the run ``running`` and sets no
``wake_at``); the driver, having read its signals before, rests the run ``waiting_human`` again.
The decision's signal stays unconsumed and the run has no wake: no worker ever takes it up
(``claim_next`` passes it by), only a manual ``resume`` would. Found by
``tests/fleet/test_ambiguous_commits.py`` (drops on run transitions made workers re-drive
resting runs while the test decided: 2 runs stuck ``waiting_human`` for 240 s, decisions
recorded). Fixed in the store: the commit that rests a run carries the newest signal its driver acted on
(``RunUpdate.signals_seen``) and, in the same transaction, makes the rest due at once when a
decision newer than that waits unconsumed (``state.decisions.decided_after``).

The two below are one bug seen twice: a run that ends while some effect node's outcome is
unknown to the engine (``raysaga.sagas.rollback.UNKNOWN_OUTCOME``: cancelled in flight, or waiting to retry)
leaves that node's ledger row ``pending`` (and, for a retry, the node ``retrying``) for ever.

``a fan-out that fails fast leaves pending rows`` (FIXED): a fan-out of effect items under the ``ALL``
policy whose item fails for good fails at once and cancels its other items. Their ledger rows,
written ``pending`` before the calls, stay ``pending`` for ever, even once the run is finished
(here it completes: the fan-out is non-critical). With the inline executor the cancelled items
had already run, so their calls took effect and their results were in hand; the engine drops
them (``InlineExecutor.cancel`` discards a finished outcome) and marks the items ``cancelled``.
On Ray the calls may or may not have happened. Either way a finished run keeps effects in an
unknown state that nothing will ever settle or compensate (the fan-out is not critical, so
no rollback runs). Found by the random kill sweep's golden runs (DAG ``chaos_e702630313``).
Fixed in the machine (``Calls.drain``): a step that fails without stopping the run cancels its
plain attempts but lets its effects in flight land, so their ledger rows say what they did.

``a rollback over items waiting to retry leaves pending rows`` (FIXED): the items of an effect fan-out
failed transiently (before their calls) and wait for their retry when a sibling fails for good;
the rollback compensates them (their outcome is unknown: right, and safe) and the run ended
``compensated``, with the items still ``retrying`` and their ledger rows ``pending``. Found by
the random sweep (DAG ``chaos_3cf7112d89``). Fixed in the machine (``Rollback._settle_undone``):
the stop cancels the retries (the items end ``cancelled``, "not retried: ..."), the rollback
still undoes them, and the store marks every ledger row still ``pending`` when a run ends or is
parked ``abandoned`` (``EffectStatus.ABANDONED``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import raysaga
from raysaga.state import RunStatus, SqlStore
from raysaga.state.models import Batch, Lease, RunRecord
from tests.support import chaos_flows
from tests.support import crash_driver as harness
from tests.support.chaos_sweep import FLOWS, RUN_ID, ledger_of
from tests.support.services import FakeServices

FAIL_FAST = {"name": "fail_fast", "steps": [
    {"name": "plan", "kind": "plan", "deps": [], "items": 3},
    {"name": "work", "kind": "map", "over": "plan", "deps": ["plan"], "effect": True, "fail_items": [0],
     "policy": {"kind": "all"}, "critical": False, "on_failure": "skip"},
    {"name": "after", "kind": "step", "deps": ["plan"], "effect": True},
]}


def test_a_fan_out_that_fails_fast_leaves_no_pending_row(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'run.db'}"
    with FakeServices() as services:
        done = harness.run_driver(chaos_flows.save(FAIL_FAST, tmp_path), db, RUN_ID, flows=FLOWS,
                                  any_state_ok=True, lease_ttl=0.5, run_input=chaos_flows.sample_input(services.url))
        log = services.log()
    assert done.returncode == 0 and done.result is not None, done.describe()
    assert done.result["status"] == "completed", done.result
    store = SqlStore(db)
    try:
        nodes = {n.label: n.status.value for n in store.nodes(RUN_ID)}
        ledger = ledger_of(store)
    finally:
        store.close()
    assert nodes["work[0]"] == "failed" and nodes["work"] == "failed", nodes
    # the other items ran and called the provider (inline runs an item at submit) ...
    called = {label for label, (key, _) in ledger.items() if key in log["effective"]}
    assert called == {"after", "work[1]", "work[2]"}, (called, nodes)
    # ... and their rows say so: no finished run with effects in an unknown state
    assert {label: status for label, (_, status) in ledger.items() if status == "pending"} == {}, (ledger, nodes)


RETRYING = {"name": "retrying_rollback", "steps": [
    {"name": "plan", "kind": "plan", "deps": [], "items": 2},
    {"name": "work", "kind": "map", "over": "plan", "deps": ["plan"], "effect": True, "compensate": True,
     "fate": "flaky", "fail_items": [], "policy": {"kind": "best_effort"}},
    {"name": "boom", "kind": "step", "deps": ["plan"], "fate": "fail"},
]}


def test_a_rollback_over_items_waiting_to_retry_leaves_no_pending_row(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'run.db'}"
    with FakeServices() as services:
        done = harness.run_driver(chaos_flows.save(RETRYING, tmp_path), db, RUN_ID, flows=FLOWS,
                                  any_state_ok=True, lease_ttl=0.5, run_input=chaos_flows.sample_input(services.url))
        log = services.log()
    assert done.returncode == 0 and done.result is not None, done.describe()
    assert done.result["status"] == "compensated", done.result
    store = SqlStore(db)
    try:
        nodes = {n.label: n.status.value for n in store.nodes(RUN_ID)}
        ledger = ledger_of(store)
    finally:
        store.close()
    # the items never made their calls; the rollback undid them anyway (their outcome unknown)
    assert {label for label, (key, _) in ledger.items() if key in log["raw"]} == \
        {"work:compensate[0]", "work:compensate[1]"}, (ledger, log["raw"])
    assert {label: status for label, (_, status) in ledger.items() if status == "pending"} == {}, (ledger, nodes)
    # and no node says it will retry on a run that ended: the stop cancelled their retries
    assert nodes["work[0]"] == nodes["work[1]"] == "cancelled", nodes


DECIDED_MID_DRIVE = {"name": "decided_mid_drive", "steps": [
    {"name": "review", "kind": "approval", "deps": [], "verdict": "approve"},
    {"name": "after", "kind": "step", "deps": ["review"], "effect": True},
]}


class DecidesMidDrive(SqlStore):
    """The store of a driver that takes up a resting run: right after it moved the run back to
    ``running``, a human decides (through another connection, as ``raysaga approve`` would)."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.decided: Any = None

    def commit(self, lease: Lease, batch: Batch) -> RunRecord | None:
        record = super().commit(lease, batch)
        if self.decided is None and batch.run is not None and batch.run.status == RunStatus.RUNNING:
            human = SqlStore(self.url)
            try:
                self.decided = human.decide(lease.run_id, "review", "approve", by=chaos_flows.DECIDER)
            finally:
                human.close()
        return record


def test_a_decision_made_while_a_driver_holds_the_run_is_not_lost(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'run.db'}"
    flow = chaos_flows.build(DECIDED_MID_DRIVE)
    options = raysaga.RunOptions(lease_ttl=0.5)
    store = SqlStore(db)
    with FakeServices() as services:
        first = raysaga.run(flow, chaos_flows.sample_input(services.url), store=store, run_id=RUN_ID,
                            executor="inline", options=options)
        assert first.status == RunStatus.WAITING_HUMAN
        driver_store = DecidesMidDrive(db)
        try:
            second = raysaga.resume(flow, RUN_ID, store=driver_store, executor="inline", options=options)
        finally:
            driver_store.close()
        assert driver_store.decided is not None, "the decision was not made mid-drive"
        try:
            # the driver applied the decision, or left the run where the fleet takes it up again
            if second.status != RunStatus.COMPLETED:
                run = store.get_run(RUN_ID)
                assert run.lease_owner is None, run
                claim = store.claim_next("a-worker", 5.0, {flow.name: flow.definition_hash})
                assert claim is not None, (f"the run rests {run.status.value} ({run.status_reason}) with the "
                                           f"decision unconsumed ({store.pending_signals(RUN_ID)}) and no wake: "
                                           "no worker will take it up")
        finally:
            store.close()
