"""Third adversarial round, fork: what another run of the lineage did to an inherited effect.

- A fork inherited a charge that a sibling fork had already refunded: the parent's own rows
  still said ``pay`` completed and never undone, so the new fork shipped the order on a payment
  given back (1 charge, 1 refund, shipped). Every fork of a run undoes an inherited node under
  the key of the run that executed it, so a sibling's refund is the parent's charge's refund:
  now a node undone by any run of its lineage is not inherited, and the fork charges again.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from sqlalchemy import update

import raysaga
from raysaga import StepContext, Workflow
from raysaga.errors import ForkError, RunNotFoundError
from raysaga.state import RunStatus, SqlStore
from raysaga.state.pruning import prune as prune_runs
from raysaga.state.schema import runs
from raysaga.testing import FakeProvider

PROVIDER = FakeProvider()
SHIP_FAILS: list[bool] = [False]


def _saga(name: str) -> Workflow:
    wf = Workflow(name)

    def refund(ctx: StepContext, output: dict[str, Any]) -> None:
        PROVIDER.call("refund", ctx.idempotency_key, {"charge": output["id"]})

    @wf.step(effect=True, compensate=refund)
    def pay(ctx: StepContext, input: dict[str, Any]) -> dict[str, Any]:
        return PROVIDER.call("charge", ctx.idempotency_key, {"amount": input["amount"]})

    @wf.step()
    def ship(pay: dict[str, Any]) -> str:
        if SHIP_FAILS[0]:
            raise raysaga.Permanent("the warehouse is closed")
        return f"shipped on {pay['id']}"

    return wf


def _fork(wf: Workflow, parent: str, child: str, store_url: str, *, fails: bool) -> raysaga.RunRecord:
    SHIP_FAILS[0] = fails
    try:
        return raysaga.fork(wf, parent, from_node="ship", store=store_url, new_run_id=child, executor="inline")
    finally:
        SHIP_FAILS[0] = False


@pytest.mark.parametrize("depth", ["sibling", "fork of a sibling's sibling"])
def test_a_fork_never_inherits_a_charge_a_sibling_fork_refunded(store_url: str, depth: str) -> None:
    wf = _saga(f"stop28_sib_{uuid.uuid4().hex[:6]}")
    tag = uuid.uuid4().hex[:8]
    parent, failed, fixed = f"p-{tag}", f"f1-{tag}", f"f2-{tag}"
    before = (len(PROVIDER.effects("charge")), len(PROVIDER.effects("refund")))
    assert raysaga.run(wf, {"amount": 5}, store=store_url, run_id=parent, executor="inline").status == \
        RunStatus.COMPLETED
    base = parent
    if depth != "sibling":  # the fixed fork forks a fork of the parent, which inherited the charge
        base = f"mid-{tag}"
        assert _fork(wf, parent, base, store_url, fails=False).status == RunStatus.COMPLETED
    # one fork fails and rolls back: the inherited charge is refunded under the parent's key
    assert _fork(wf, parent, failed, store_url, fails=True).status == RunStatus.COMPENSATED
    assert len(PROVIDER.effects("refund")) == before[1] + 1

    done = _fork(wf, base, fixed, store_url, fails=False)
    assert done.status == RunStatus.COMPLETED, done.status_reason
    charges = len(PROVIDER.effects("charge")) - before[0]
    refunds = len(PROVIDER.effects("refund")) - before[1]
    # the order ships on a charge in force: the refunded one is not inherited, a new one is made
    assert (charges, refunds) == (2, 1)
    store = SqlStore(store_url)
    try:
        assert {n.label: n.origin_run_id for n in store.nodes(fixed)} == {"pay": None, "ship": None}
        assert store.nodes(fixed)[0].output is not None
    finally:
        store.close()


def test_a_sibling_that_never_undid_anything_leaves_the_charge_inherited(store_url: str) -> None:
    """The check looks at what the lineage undid, nothing more: a sibling that completed (or
    failed without a rollback) keeps the charge inherited, and nothing is charged again."""
    wf = _saga(f"stop28_keep_{uuid.uuid4().hex[:6]}")
    tag = uuid.uuid4().hex[:8]
    before = len(PROVIDER.effects("charge"))
    assert raysaga.run(wf, {"amount": 7}, store=store_url, run_id=f"p-{tag}", executor="inline").status == \
        RunStatus.COMPLETED
    assert _fork(wf, f"p-{tag}", f"a-{tag}", store_url, fails=False).status == RunStatus.COMPLETED
    assert _fork(wf, f"p-{tag}", f"b-{tag}", store_url, fails=False).status == RunStatus.COMPLETED
    assert len(PROVIDER.effects("charge")) == before + 1
    store = SqlStore(store_url)
    try:
        assert {n.label: n.origin_run_id for n in store.nodes(f"b-{tag}")} == {"pay": f"p-{tag}", "ship": None}
    finally:
        store.close()


def test_forks_made_before_either_rolls_back_share_one_refund(store_url: str) -> None:
    """Forks that both inherited the charge (made before either rolled back) and both roll back:
    one refund, called once: the second fork finds the key committed by the first and answers
    from the ledger (a compensation runs at most once per key)."""
    wf = _saga(f"stop28_two_{uuid.uuid4().hex[:6]}")
    tag = uuid.uuid4().hex[:8]
    before = (len(PROVIDER.effects("charge")), len(PROVIDER.effects("refund")),
              sum(1 for c in PROVIDER.calls if c.kind == "refund"))
    assert raysaga.run(wf, {"amount": 9}, store=store_url, run_id=f"p-{tag}", executor="inline").status == \
        RunStatus.COMPLETED
    children = [f"c{i}-{tag}" for i in (1, 2)]
    for child in children:  # both recorded first: each inherits the charge
        raysaga.fork(wf, f"p-{tag}", from_node="ship", store=store_url, new_run_id=child, drive=False)
    SHIP_FAILS[0] = True
    try:
        for child in children:
            assert raysaga.resume(wf, child, store=store_url, executor="inline").status == RunStatus.COMPENSATED
    finally:
        SHIP_FAILS[0] = False
    assert len(PROVIDER.effects("charge")) - before[0] == 1
    assert len(PROVIDER.effects("refund")) - before[1] == 1
    calls = [c for c in PROVIDER.calls if c.kind == "refund"][before[2]:]
    assert [c.duplicate for c in calls] == [False]


def test_a_parent_pruned_while_it_is_forked_charges_nothing_again(store_url: str,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """``raysaga prune`` deletes the parent between the fork's reading of its rows and the
    transaction that copies them: the copy found no rows, and the fork ran from scratch as a new
    run, charging the order a second time. Now the fork is refused: ``Store.fork_run`` locks the
    parent's row before it copies and finds it gone, and nothing of the fork is recorded."""
    wf = _saga(f"stop28_prune_{uuid.uuid4().hex[:6]}")
    tag = uuid.uuid4().hex[:8]
    parent, child = f"p-{tag}", f"c-{tag}"
    assert raysaga.run(wf, {"amount": 3}, store=store_url, run_id=parent, executor="inline").status == \
        RunStatus.COMPLETED
    charges = len(PROVIDER.effects("charge"))
    store = SqlStore(store_url)
    real_fork_run = store.fork_run

    def pruned_first(*args: Any, **kwargs: Any) -> Any:
        with store.engine.begin() as conn:  # aged: only the parent is old enough (the database may be shared)
            conn.execute(update(runs).where(runs.c.run_id == parent).values(updated_at=1.0))
        report = prune_runs(store, 1, statuses=["completed"], now=100.0)
        assert report.runs == 1 and parent not in {r.run_id for r in store.list_runs(limit=10_000)}
        return real_fork_run(*args, **kwargs)

    monkeypatch.setattr(store, "fork_run", pruned_first)
    try:
        with pytest.raises(ForkError, match=f"run {parent!r} was deleted while it was being forked"):
            raysaga.fork(wf, parent, from_node="ship", store=store, new_run_id=child, executor="inline")
        assert len(PROVIDER.effects("charge")) == charges  # the order is not charged again
        with pytest.raises(RunNotFoundError):
            store.get_run(child)
    finally:
        store.close()
