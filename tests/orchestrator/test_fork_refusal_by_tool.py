"""A fork and the undo an agent's tool call owes, by the tool the call made (docs/fork.md, "Lineage").

A ``compensation_failed`` parent owes the undo of every node upstream of the refund it could not
make. For an agent's tool call, ``fork`` counted that undo as owed whenever *any* tool of the
agent had one: a run whose agent only called its read-only tool could not be forked, though its
rollback (which reads the tool each call made from the call's turn) would never undo that call.
Now the refusal reads the tool the same way: a read-only call owes nothing, an undoable one does.
"""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import select, update

import raysaga
from raysaga import Workflow
from raysaga.errors import ForkError
from raysaga.state import RunStatus, SqlStore
from raysaga.state.schema import nodes, runs
from raysaga.testing import FakeProvider
from tests.support.fork_tool_flows import tool_shop


def _stopped(store_url: str, provider: FakeProvider, asks: tuple[str, ...]) -> tuple[Workflow, str]:
    """A parent whose agent called ``asks``, whose refund failed, and whose rollback never reached the agent."""
    switches = {"ship_fails": True, "refuse": True}
    wf = tool_shop(f"by_tool_{uuid.uuid4().hex[:6]}", provider, switches, asks)
    run_id = f"p-{uuid.uuid4().hex[:8]}"
    parent = raysaga.run(wf, None, store=store_url, run_id=run_id, executor="inline")
    assert parent.status == RunStatus.COMPENSATION_FAILED, parent.status_reason
    store = SqlStore(store_url)
    try:
        rows = {n.label: n.status.value for n in store.nodes(run_id)}
    finally:
        store.close()
    assert rows["charge:compensate"] == "failed", rows
    calls = [f"buyer@0.{k}" for k in range(len(asks))]
    assert all(rows[c] == "completed" and f"{c}:compensate" not in rows for c in calls), rows  # none started
    switches.update(ship_fails=False, refuse=False)
    return wf, run_id


def test_a_call_of_the_read_only_tool_owes_no_undo(store_url: str) -> None:
    provider = FakeProvider()
    wf, parent = _stopped(store_url, provider, ("look",))
    child = raysaga.fork(wf, parent, from_node="charge", store=store_url, executor="inline")
    assert child.status == RunStatus.COMPLETED, child.status_reason
    assert len(provider.effects("charge")) == 2  # the fork's own, by choice; the agent's turns inherited
    # the rollback agrees: finishing it undoes the parent's charge and no call of the agent
    done = raysaga.retry(wf, parent, store=store_url, executor="inline", compensations=True)
    assert done.status == RunStatus.COMPENSATED, done.status_reason
    assert (len(provider.effects("refund")), len(provider.effects("pay")), len(provider.effects("unpay"))) == \
        (1, 0, 0)


def test_a_call_of_the_undoable_tool_still_refuses_the_fork(store_url: str) -> None:
    provider = FakeProvider()
    wf, parent = _stopped(store_url, provider, ("pay",))
    with pytest.raises(ForkError, match=r"buyer@0\.0:compensate \(not started\).*"
                                        rf"`raysaga retry {parent} --compensations`.*fork from 'buyer'"):
        raysaga.fork(wf, parent, from_node="charge", store=store_url, executor="inline")
    assert len(provider.effects("unpay")) == 0
    # the rollback undoes that very call; then the fork is allowed
    done = raysaga.retry(wf, parent, store=store_url, executor="inline", compensations=True)
    assert done.status == RunStatus.COMPENSATED, done.status_reason
    assert (len(provider.effects("pay")), len(provider.effects("unpay"))) == (1, 1)
    child = raysaga.fork(wf, parent, from_node="charge", store=store_url, executor="inline")
    assert child.status == RunStatus.COMPLETED, child.status_reason


def test_only_the_undoable_call_of_a_turn_is_owed(store_url: str) -> None:
    provider = FakeProvider()
    wf, parent = _stopped(store_url, provider, ("look", "pay"))
    with pytest.raises(ForkError, match=r"has 1 compensation\(s\) that did not complete: "
                                        r"buyer@0\.1:compensate \(not started\)\. "):
        raysaga.fork(wf, parent, from_node="charge", store=store_url, executor="inline")
    done = raysaga.retry(wf, parent, store=store_url, executor="inline", compensations=True)
    assert done.status == RunStatus.COMPENSATED, done.status_reason
    assert len(provider.effects("unpay")) == 1  # the rollback undid the call of pay only, as the refusal said


def test_a_call_whose_tool_cannot_be_read_is_counted_as_owed(store_url: str) -> None:
    """A call of ``pay`` (its ledger row says it took effect) whose turn no longer reads: owed, as
    the rollback owes it (machine/undo_targets). The same with ``look``, which has no ledger row, is
    owed by neither (tests/orchestrator/test_undo_targets_stop49.py)."""
    provider = FakeProvider()
    wf, parent = _stopped(store_url, provider, ("pay",))
    store = SqlStore(store_url)
    try:  # the turn's recorded response no longer says which tool its call made
        with store.engine.begin() as conn:
            run_key = conn.execute(select(runs.c.run_key).where(runs.c.run_id == parent)).scalar_one()
            conn.execute(update(nodes).where(nodes.c.run_key == run_key, nodes.c.node_id == "buyer@0")
                         .values(output={"not": "a model response"}))
    finally:
        store.close()
    with pytest.raises(ForkError, match=r"buyer@0\.0:compensate \(not started\)"):
        raysaga.fork(wf, parent, from_node="charge", store=store_url, executor="inline")
