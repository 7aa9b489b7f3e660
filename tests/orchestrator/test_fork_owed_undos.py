"""A fork and the undos its lineage owes or made (docs/fork.md, "Which runs" and "Lineage").

- A ``compensation_failed`` parent stops its rollback at the refund it could not make; what is
  upstream of it (``reserve``) waits, with no compensation row. A fork from ``charge[1]`` was
  accepted, inherited ``reserve``, completed, and then ``raysaga retry PARENT --compensations``
  released the reservation under the parent's key: the completed fork stood on nothing. A fork
  that would inherit a node whose undo any run of the lineage still owes is now refused, row or no
  row, naming it and the retry that finishes it.
- A run whose in-doubt effects its rollback undid (a cancel mid-charge, then ``--compensate``)
  could not be forked from downstream: "outcome unknown", though the undo completed.
- Two forks that rolled back the parent's charges: the parent's status named the one that was
  answered from the ledger as the one whose rollback undid them.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

import raysaga
from raysaga import StepContext, Workflow
from raysaga.errors import ForkError
from raysaga.orchestrator.status_text import undone_by_forks
from raysaga.state import EffectStatus, RunStatus, SqlStore
from raysaga.testing import CrashAt, FakeProvider, SimulatedCrash, drive_inline
from tests.support.cli import invoke
from tests.support.fork_undo_flows import stopping_shop


def _stopped(store_url: str, provider: FakeProvider) -> tuple[Workflow, dict[str, Any], str]:
    """A parent whose rollback refunded items 0 and 2, failed on item 1, and never reached ``reserve``."""
    switches: dict[str, Any] = {"ship_fails": True, "refuse": {1}}
    wf = stopping_shop(f"owed_{uuid.uuid4().hex[:6]}", provider, switches)
    run_id = f"p-{uuid.uuid4().hex[:8]}"
    parent = raysaga.run(wf, {"n": 3}, store=store_url, run_id=run_id, executor="inline")
    assert parent.status == RunStatus.COMPENSATION_FAILED, parent.status_reason
    store = SqlStore(store_url)
    try:
        undos = {n.label: n.status.value for n in store.nodes(run_id) if ":compensate" in n.label}
    finally:
        store.close()
    assert "reserve:compensate" not in undos, undos  # owed, and no row says so
    switches.update(ship_fails=False, refuse=set())
    return wf, switches, run_id


def test_a_fork_does_not_inherit_what_a_stopped_rollback_still_owes(store_url: str) -> None:
    provider = FakeProvider()
    wf, _, parent = _stopped(store_url, provider)
    for label in ("charge[1]", "charge", "ship"):
        with pytest.raises(ForkError, match=r"reserve:compensate \(not started\).*"
                                            rf"`raysaga retry {parent} --compensations`.*fork from 'reserve'"):
            raysaga.fork(wf, parent, from_node=label, store=store_url, executor="inline")
    assert len(provider.effects("unreserve")) == 0
    # the rollback finishes; then a fork re-runs what it undid, and nothing it made is undone later
    assert raysaga.retry(wf, parent, store=store_url, executor="inline", compensations=True).status == \
        RunStatus.COMPENSATED
    child = raysaga.fork(wf, parent, from_node="charge[1]", store=store_url, executor="inline")
    assert child.status == RunStatus.COMPLETED, child.status_reason
    store = SqlStore(store_url)
    try:
        assert not [e for e in store.inherited_effects(child.run_id)]  # reserve was undone: made again
        assert {e.node_id for e in store.effects(child.run_id) if e.status == EffectStatus.COMMITTED} >= \
            {"reserve", "charge"}
    finally:
        store.close()
    assert (len(provider.effects("reserve")), len(provider.effects("unreserve"))) == (2, 1)


def test_forking_from_the_owed_node_runs_it_again_on_purpose(store_url: str) -> None:
    provider = FakeProvider()
    wf, _, parent = _stopped(store_url, provider)
    child = raysaga.fork(wf, parent, from_node="reserve", store=store_url, executor="inline")
    assert child.status == RunStatus.COMPLETED, child.status_reason
    assert len(provider.effects("reserve")) == 2  # the operator's choice, under the fork's key


def test_a_sibling_forks_stopped_rollback_owes_the_inherited_reservation(store_url: str) -> None:
    provider = FakeProvider()
    switches: dict[str, Any] = {"ship_fails": False, "refuse": set()}
    wf = stopping_shop(f"owed_sib_{uuid.uuid4().hex[:6]}", provider, switches)
    parent = f"p-{uuid.uuid4().hex[:8]}"
    assert raysaga.run(wf, {"n": 3}, store=store_url, run_id=parent, executor="inline").status == \
        RunStatus.COMPLETED
    switches.update(ship_fails=True, refuse={1})  # the sibling inherits everything and cannot refund item 1
    sibling = raysaga.fork(wf, parent, from_node="ship", store=store_url, executor="inline")
    assert sibling.status == RunStatus.COMPENSATION_FAILED
    switches.update(ship_fails=False, refuse=set())
    # item 1 is re-run by choice, but reserve would be inherited while the sibling still owes its undo
    with pytest.raises(ForkError, match=rf"reserve:compensate \(not started in run {sibling.run_id!r}\).*"
                                        rf"`raysaga retry {sibling.run_id} --compensations`"):
        raysaga.fork(wf, parent, from_node="charge[1]", store=store_url, executor="inline")
    assert len(provider.effects("unreserve")) == 0


def _paying(name: str, provider: FakeProvider) -> Workflow:
    wf = Workflow(name)

    @wf.step(effect=True)
    def pay(ctx: StepContext, input: dict[str, Any]) -> str:
        return str(provider.call("charge", ctx.idempotency_key, {"amount": input["amount"]})["id"])

    @wf.compensation("pay")
    def refund(ctx: StepContext) -> None:
        provider.call("refund", ctx.idempotency_key)

    @wf.step()
    def ship(pay: str) -> str:
        return f"shipped on {pay}"

    return wf


def test_a_compensated_run_whose_doubtful_charge_was_refunded_is_forked_from_downstream(store_url: str) -> None:
    provider = FakeProvider()
    wf = _paying(f"doubt_undone_{uuid.uuid4().hex[:6]}", provider)
    parent = f"p-{uuid.uuid4().hex[:8]}"
    raysaga.create_run(wf, {"amount": 7}, store=store_url, run_id=parent)
    with pytest.raises(SimulatedCrash):  # charged; the result never became durable
        drive_inline(wf, parent, store=store_url, crash_at=CrashAt("before_commit", "pay"))
    assert raysaga.cancel(parent, store=store_url, compensate=True, workflow=wf, executor="inline").status == \
        RunStatus.COMPENSATED
    store = SqlStore(store_url)
    try:
        doubt = [e for e in store.effects(parent) if e.node_id == "pay"]
        assert [e.status for e in doubt] in ([EffectStatus.ABANDONED], [EffectStatus.PENDING]), doubt
    finally:
        store.close()
    assert len(provider.effects("refund")) == 1
    child = raysaga.fork(wf, parent, from_node="ship", store=store_url, executor="inline")
    assert child.status == RunStatus.COMPLETED, child.status_reason
    assert len(provider.effects("charge")) == 2  # the refunded charge is made again, under the fork's key


def test_the_parent_names_the_fork_whose_refund_was_called(store_url: str) -> None:
    provider = FakeProvider()
    switches: dict[str, Any] = {"ship_fails": False, "refuse": set()}
    wf = stopping_shop(f"owed_two_{uuid.uuid4().hex[:6]}", provider, switches)
    parent = f"p-{uuid.uuid4().hex[:8]}"
    assert raysaga.run(wf, {"n": 2}, store=store_url, run_id=parent, executor="inline").status == \
        RunStatus.COMPLETED
    switches["ship_fails"] = True
    first, second = (raysaga.fork(wf, parent, from_node="ship", store=store_url, new_run_id=f"{parent}-{n}",
                                  executor="inline", drive=False).run_id for n in ("b", "a"))
    for run_id in (first, second):  # both inherited the charges; the first to roll back calls the refunds
        assert raysaga.resume(wf, run_id, store=store_url, executor="inline").status == RunStatus.COMPENSATED
    assert (len(provider.effects("refund")), len(provider.effects("unreserve"))) == (2, 1)
    store = SqlStore(store_url)
    try:
        undone = undone_by_forks(store, parent)
    finally:
        store.close()
    assert sorted((u["node"], u["run_id"], u["status"]) for u in undone) == [
        (node, first, "completed") for node in ("charge[0]", "charge[1]", "reserve")]
    code, out, err = invoke("status", parent, "--db", store_url)
    assert code == 0, out + err
    reserve = next(line for line in out.splitlines() if line.startswith("reserve "))
    told = next(line for line in out.splitlines() if line.startswith("undone by forks: "))
    assert f"undone by {first}'s rollback" in reserve and second not in told + reserve, out
