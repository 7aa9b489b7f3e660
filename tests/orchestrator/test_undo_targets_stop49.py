"""The fork refusal and the rollback agree on which agent tool calls owe an undo (docs/fork.md, "Which runs").

A ``compensation_failed`` parent owes the undo of every node upstream of the refund it could not
make. ``fork`` counted a call of an undoable tool as owed even when it was answered with an
error (a ``ToolError``, arguments failing the tool's schema): the rollback skips such a call
(nothing happened, nothing to undo), so the fork was refused for an undo no rollback would make.
Both now ask ``machine.undo_targets.call_undo``. A call whose tool cannot be told (its turn's
recorded response unreadable) is owed exactly when the ledger says it took effect: the rollback
stops on it (it crashed on a turn that was not a model response at all), the fork is refused;
with no ledger row (a read-only call) neither counts it.
"""

from __future__ import annotations

import functools
import uuid
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select, update

import raysaga
from raysaga import Workflow
from raysaga.agents import AnthropicModel, Model
from raysaga.errors import ForkError
from raysaga.state import RunStatus, SqlStore
from raysaga.state.schema import nodes, runs
from raysaga.testing import FakeProvider
from tests.support import agent_flows as af
from tests.support import messages_server as ms
from tests.support.services import FakeServices, post
from tests.support.undo_target_flows import SOLD_OUT, Asks, Call, responder, scripted, switch, undo_shop

af.use_test_key()  # Ray workers read the model's key from their environment (agent_flows)


def _stopped(store_url: str, control: Path, model: Model, call: Call, calls: int,
             executor: Any = "inline") -> tuple[Workflow, str]:
    """A parent whose agent made ``calls`` calls, whose refund failed, and whose rollback never reached the agent."""
    control.mkdir(exist_ok=True)
    switch(control, ship_fails=True, refuse=True)
    wf = undo_shop(f"undo49_{uuid.uuid4().hex[:6]}", model, call, control)
    run_id = f"p-{uuid.uuid4().hex[:8]}"
    parent = raysaga.run(wf, None, store=store_url, run_id=run_id, executor=executor)
    assert parent.status == RunStatus.COMPENSATION_FAILED, parent.status_reason
    rows = _rows(store_url, run_id)
    assert rows["charge:compensate"] == "failed", rows
    assert all(rows[f"buyer@0.{k}"] == "completed" and f"buyer@0.{k}:compensate" not in rows
               for k in range(calls)), rows  # none started
    switch(control, ship_fails=False, refuse=False)
    return wf, run_id


def _rows(store_url: str, run_id: str) -> dict[str, str]:
    store = SqlStore(store_url)
    try:
        return {n.label: n.status.value for n in store.nodes(run_id)}
    finally:
        store.close()


@pytest.mark.parametrize("asks", [(("pay", {"item": SOLD_OUT}),), (("pay", {"colour": "red"}),)],
                         ids=["error_result", "invalid_args"])
def test_a_call_of_the_undoable_tool_answered_with_an_error_owes_no_undo(
        store_url: str, tmp_path: Path, asks: Asks) -> None:
    provider = FakeProvider()
    wf, parent = _stopped(store_url, tmp_path / "control", scripted(asks), provider.call, 1)
    child = raysaga.fork(wf, parent, from_node="charge", store=store_url, executor="inline")
    assert child.status == RunStatus.COMPLETED, child.status_reason
    assert len(provider.effects("charge")) == 2  # the fork's own, by choice; the agent's turns inherited
    # the rollback agrees: finishing it undoes the parent's charge and no call of the agent
    done = raysaga.retry(wf, parent, store=store_url, executor="inline", compensations=True)
    assert done.status == RunStatus.COMPENSATED, done.status_reason
    assert (len(provider.effects("refund")), len(provider.effects("pay")), len(provider.effects("unpay"))) == \
        (1, 0, 0)
    assert "buyer@0.0:compensate" not in _rows(store_url, parent)


def _unreadable_turn(store_url: str, run_id: str, output: Any) -> None:
    """Overwrite the recorded model response of the agent's first turn (which says what its calls made)."""
    store = SqlStore(store_url)
    try:
        with store.engine.begin() as conn:
            run_key = conn.execute(select(runs.c.run_key).where(runs.c.run_id == run_id)).scalar_one()
            conn.execute(update(nodes).where(nodes.c.run_key == run_key, nodes.c.node_id == "buyer@0")
                         .values(output=output))
    finally:
        store.close()


@pytest.mark.parametrize("output", [{"content": "not a list of blocks"}, {"not": "a model response"}],
                         ids=["not_a_response", "no_calls"])
def test_an_unreadable_call_that_took_effect_is_owed_by_both(store_url: str, tmp_path: Path, output: Any) -> None:
    provider = FakeProvider()
    wf, parent = _stopped(store_url, tmp_path / "control", scripted((("pay", {"item": "book"}),)), provider.call, 1)
    _unreadable_turn(store_url, parent, output)
    with pytest.raises(ForkError, match=r"buyer@0\.0:compensate \(not started\)"):
        raysaga.fork(wf, parent, from_node="charge", store=store_url, executor="inline")
    # the rollback stops on it (it took effect: the ledger says so), naming it; it never skips it
    done = raysaga.retry(wf, parent, store=store_url, executor="inline", compensations=True)
    assert done.status == RunStatus.COMPENSATION_FAILED, done.status_reason
    failed = (done.error.failed_compensations if done.error is not None else None) or []
    assert [(f.get("node"), f.get("type")) for f in failed] == [("buyer@0.0", "CompensationMissing")], failed
    assert "cannot be read from its turn buyer@0" in str(failed[0].get("message")), failed
    assert (len(provider.effects("refund")), len(provider.effects("pay")), len(provider.effects("unpay"))) == \
        (1, 1, 0)


def test_an_unreadable_call_with_no_effect_on_record_is_owed_by_neither(store_url: str, tmp_path: Path) -> None:
    provider = FakeProvider()
    wf, parent = _stopped(store_url, tmp_path / "control", scripted((("look", {"item": "book"}),)), provider.call, 1)
    _unreadable_turn(store_url, parent, {"not": "a model response"})
    child = raysaga.fork(wf, parent, from_node="charge", store=store_url, executor="inline")
    assert child.status == RunStatus.COMPLETED, child.status_reason
    done = raysaga.retry(wf, parent, store=store_url, executor="inline", compensations=True)
    assert done.status == RunStatus.COMPENSATED, done.status_reason
    assert (len(provider.effects("refund")), len(provider.effects("unpay"))) == (1, 0)


def test_over_the_wire_on_ray_only_the_call_that_took_effect_is_undone(
        store_url: str, tmp_path: Path, ray_session: str) -> None:
    """The real SDK against the local Messages server, every task on Ray: one turn asks for a
    payment with arguments the tool refuses, one the tool answers with an error, and one that pays."""
    asks: Asks = (("pay", {"colour": "red"}), ("pay", {"item": SOLD_OUT}), ("pay", {"item": "book"}))
    with ms.MessagesServer(responder(asks)) as srv, FakeServices() as services:
        model = AnthropicModel(af.MODEL, base_url=srv.base_url, timeout=30.0, api_key_env=af.KEY_ENV)
        call = functools.partial(post, services.url)
        wf, parent = _stopped(store_url, tmp_path / "control", model, call, 3, executor="ray")
        # only buyer@0.2 (it paid) is owed: the refusal names it alone
        with pytest.raises(ForkError, match=r"has 1 compensation\(s\) that did not complete: "
                                            r"buyer@0\.2:compensate \(not started\)\. "):
            raysaga.fork(wf, parent, from_node="charge", store=store_url, executor="ray", address=ray_session)
        done = raysaga.retry(wf, parent, store=store_url, executor="ray", address=ray_session, compensations=True)
        assert done.status == RunStatus.COMPENSATED, done.status_reason
        kinds = sorted(services.log()["kinds"].values())
        assert kinds == ["charge", "pay", "refund", "unpay"], kinds  # the one payment, undone once
        rows = _rows(store_url, parent)
        assert sorted(r for r in rows if r.endswith(":compensate")) == ["buyer@0.2:compensate", "charge:compensate"]
        child = raysaga.fork(wf, parent, from_node="charge", store=store_url, executor="ray", address=ray_session)
        assert child.status == RunStatus.COMPLETED, child.status_reason
        # its payment was undone, so the fork runs the agent again (a compensated run's fork re-runs
        # what was undone): one new payment (the calls answered with an error reach no provider)
        kinds = sorted(services.log()["kinds"].values())
        assert kinds == ["charge", "charge", "pay", "pay", "refund", "unpay"], kinds
