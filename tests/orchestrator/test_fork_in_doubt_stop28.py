"""A fork never calls again, under a new key, an effect whose outcome its parent left unknown.

Run P was cancelled while ``pay`` was under way: the provider charged the card, the result never
became durable, and the ledger row is ``abandoned`` (the call may or may not have happened). A
fork from ``ship`` does not inherit ``pay`` (it never completed), so it ran ``pay`` again under the
fork's own key, which the provider cannot dedupe: the card was charged twice. The fork is now
refused, naming the effect and its key; forking from ``pay`` itself re-runs it, on purpose.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

import raysaga
from raysaga import StepContext, Workflow
from raysaga.errors import ForkError
from raysaga.orchestrator.fork import _refuse_in_doubt, parse_node
from raysaga.state import EffectRecord, EffectStatus, RunStatus, SqlStore
from raysaga.testing import CrashAt, FakeProvider, SimulatedCrash, drive_inline

PROVIDER = FakeProvider()


def _shop(name: str) -> Workflow:
    wf = Workflow(name)

    @wf.step(effect=True)
    def pay(ctx: StepContext, input: dict[str, Any]) -> dict[str, Any]:
        return PROVIDER.call("charge", ctx.idempotency_key, {"amount": input["amount"]})

    @wf.step()
    def ship(pay: dict[str, Any]) -> str:
        return f"shipped on {pay['id']}"

    return wf


def _cancelled_mid_charge(store_url: str) -> tuple[Workflow, str]:
    """A run cancelled after ``pay`` charged and before its result was durable."""
    wf = _shop(f"stop28_doubt_{uuid.uuid4().hex[:6]}")
    run_id = f"p-{uuid.uuid4().hex[:8]}"
    raysaga.create_run(wf, {"amount": 7}, store=store_url, run_id=run_id)
    with pytest.raises(SimulatedCrash):
        drive_inline(wf, run_id, store=store_url, crash_at=CrashAt("before_commit", "pay"))
    assert raysaga.cancel(run_id, store=store_url).status == RunStatus.CANCELLED
    return wf, run_id


def test_a_fork_past_an_effect_in_doubt_is_refused(store_url: str) -> None:
    wf, parent = _cancelled_mid_charge(store_url)
    store = SqlStore(store_url)
    try:
        [ledger] = store.effects(parent)
        assert ledger.status == EffectStatus.ABANDONED
        charges = len(PROVIDER.effects("charge"))
        before = {r.run_id for r in store.list_runs(limit=10_000)}
        with pytest.raises(ForkError, match=f"outcome is unknown.*key {ledger.idempotency_key}.*fork from 'pay'"):
            raysaga.fork(wf, parent, from_node="ship", store=store, executor="inline")
        assert len(PROVIDER.effects("charge")) == charges  # not charged again
        assert {r.run_id for r in store.list_runs(limit=10_000)} == before  # nothing recorded
    finally:
        store.close()


def test_forking_from_the_effect_itself_runs_it_again_on_purpose(store_url: str) -> None:
    wf, parent = _cancelled_mid_charge(store_url)
    charges = len(PROVIDER.effects("charge"))
    done = raysaga.fork(wf, parent, from_node="pay", store=store_url, executor="inline")
    assert done.status == RunStatus.COMPLETED
    assert len(PROVIDER.effects("charge")) == charges + 1  # the operator's choice, under the fork's key


def _ledger(node_id: str, fan_index: int, status: EffectStatus) -> EffectRecord:
    return EffectRecord(idempotency_key=f"k-{node_id}-{fan_index}", run_id="p", node_id=node_id, fan_index=fan_index,
                        effect_name=node_id, args_digest="d", status=status, created_at=0.0, updated_at=0.0)


def test_forked_from_an_item_only_that_item_is_run_again_by_choice() -> None:
    """A fork from ``charge[3]`` re-runs item 3 by choice; item 5, whose charge is in doubt, would
    be run again too (it never completed), under the fork's key: refused. From ``charge`` (every
    item) or from a step before it, nothing is refused."""
    wf = Workflow("stop28_doubt_items")

    @wf.step()
    def plan() -> list[int]:
        return list(range(6))

    @wf.step(effect=True, map_over="plan")
    def charge(plan: int) -> int:
        return plan

    parent = raysaga.RunRecord.model_construct(run_id="p", status=RunStatus.CANCELLED)
    doubt = [_ledger("charge", 5, EffectStatus.ABANDONED), _ledger("charge", 3, EffectStatus.PENDING)]
    with pytest.raises(ForkError, match=r"charge\[5\].*key k-charge-5"):
        _refuse_in_doubt(wf, doubt, parse_node("charge[3]"), parent)
    for label in ("charge", "plan"):
        _refuse_in_doubt(wf, doubt, parse_node(label), parent)
    _refuse_in_doubt(wf, [_ledger("charge", 5, EffectStatus.COMMITTED)], parse_node("charge[3]"), parent)
