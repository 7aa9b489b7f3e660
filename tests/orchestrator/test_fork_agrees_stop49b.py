"""The rollback and the fork refusal agree on which agent tool calls owe an undo, from the same
facts (docs/fork.md, "Which runs"; ``machine.undo_targets.call_undo``).

Three ways they did not, each a ``compensation_failed`` parent (its refund failed, so its
rollback never reached the agent's payment, which waits upstream of it):

- the deploy changed ``pay``'s schema: the committed payment's recorded arguments no longer fit,
  and the rule "arguments failing the schema: refused before any call, owes nothing" made
  ``retry --compensations`` end ``compensated`` with no refund, and the fork was allowed. A call
  whose ledger says it took effect is owed: the rollback stops on it, naming why, and the fork is
  refused;
- the payment was inherited (the parent is a fork): "the ledger says it took effect" read the
  parent's own ledger only, never the row of the run that made the call, so with the tool renamed
  the rollback skipped it (``compensated``, no refund) and a fork of the parent was allowed;
- the payment's outcome is uncertain (its answer lost until its retries ran out: ledger
  ``abandoned``; or it returned what raysaga cannot store: ``took_effect``): its row is
  ``failed``, the rollback undoes it, but the fork looked at completed calls only and was allowed,
  inheriting the agent whose payment the parent's retry then refunded.
"""

from __future__ import annotations

import functools
import uuid
from pathlib import Path
from typing import Any

import pytest

import raysaga
from raysaga import RunOptions, Workflow
from raysaga.agents import AnthropicModel, Model
from raysaga.errors import ForkError
from raysaga.state import EffectStatus, RunRecord, RunStatus, SqlStore
from raysaga.testing import FakeProvider
from tests.support import agent_flows as af
from tests.support import messages_server as ms
from tests.support.services import FakeServices, post
from tests.support.undo_target_flows import Call, responder, scripted, switch, undo_shop

af.use_test_key()  # Ray workers read the model's key from their environment (agent_flows)

PAYS = (("pay", {"item": "book"}),)
#: A retry with the deployed code (its agent's step changed) must be allowed to use it.
CHANGED = RunOptions(allow_changed=True)


def _rows(store_url: str, run_id: str) -> dict[str, str]:
    store = SqlStore(store_url)
    try:
        return {n.label: n.status.value for n in store.nodes(run_id)}
    finally:
        store.close()


def _ledger(store_url: str, run_id: str) -> dict[str, tuple[EffectStatus, Any]]:
    store = SqlStore(store_url)
    try:
        return {e.node_id: (e.status, e.result) for e in store.effects(run_id)}
    finally:
        store.close()


def _failed(done: RunRecord) -> list[tuple[Any, Any, str]]:
    found = (done.error.failed_compensations if done.error is not None else None) or []
    return [(f.get("node"), f.get("type"), str(f.get("message"))) for f in found]


def _stopped(store_url: str, control: Path, wf: Workflow, executor: Any = "inline", **switches: bool) -> str:
    """Run ``wf`` until its refund fails for good: ``compensation_failed``, the agent's calls owed."""
    switch(control, ship_fails=True, refuse=True, **switches)
    run_id = f"p-{uuid.uuid4().hex[:8]}"
    parent = raysaga.run(wf, None, store=store_url, run_id=run_id, executor=executor)
    assert parent.status == RunStatus.COMPENSATION_FAILED, parent.status_reason
    rows = _rows(store_url, run_id)
    assert rows["charge:compensate"] == "failed" and "buyer@0.0:compensate" not in rows, rows
    switch(control, ship_fails=False, refuse=False)
    return run_id


def test_a_committed_call_whose_arguments_no_longer_fit_the_schema_is_owed_by_both(
        store_url: str, tmp_path: Path) -> None:
    provider, control = FakeProvider(), tmp_path / "control"
    control.mkdir()
    name = f"undo49b_schema_{uuid.uuid4().hex[:6]}"
    parent = _stopped(store_url, control, undo_shop(name, scripted(PAYS), provider.call, control))
    assert _ledger(store_url, parent)["buyer@0.0"][0] == EffectStatus.COMMITTED  # it paid
    deployed = undo_shop(name, scripted(PAYS), provider.call, control, narrowed=True)
    with pytest.raises(ForkError, match=r"has 1 compensation\(s\) that did not complete: "
                                        r"buyer@0\.0:compensate \(not started\)"):
        raysaga.fork(deployed, parent, from_node="charge", store=store_url, executor="inline", options=CHANGED)
    # the rollback stops on it, saying why, never ends 'compensated' with the payment standing
    done = raysaga.retry(deployed, parent, store=store_url, executor="inline", compensations=True, options=CHANGED)
    assert done.status == RunStatus.COMPENSATION_FAILED, done.status_reason
    [(node, kind, message)] = _failed(done)
    assert (node, kind) == ("buyer@0.0", "CompensationMissing"), message
    assert "tool 'pay' took effect" in message and "no longer fit the tool's schema" in message, message
    assert (len(provider.effects("pay")), len(provider.effects("refund")), len(provider.effects("unpay"))) == \
        (1, 1, 0)
    # with the schema the call was made under back, the same retry undoes it
    restored = undo_shop(name, scripted(PAYS), provider.call, control)
    done = raysaga.retry(restored, parent, store=store_url, executor="inline", compensations=True, options=CHANGED)
    assert done.status == RunStatus.COMPENSATED, done.status_reason
    assert len(provider.effects("unpay")) == 1


def test_an_inherited_call_is_owed_by_the_ledger_of_the_run_that_made_it(store_url: str, tmp_path: Path) -> None:
    provider, control = FakeProvider(), tmp_path / "control"
    control.mkdir()
    name = f"undo49b_inherit_{uuid.uuid4().hex[:6]}"
    wf = undo_shop(name, scripted(PAYS), provider.call, control)
    switch(control, ship_fails=False, refuse=False)
    first = raysaga.run(wf, None, store=store_url, run_id=f"a-{uuid.uuid4().hex[:8]}", executor="inline")
    assert first.status == RunStatus.COMPLETED, first.status_reason
    # B inherits the agent and its payment (its ledger row stays with A), and stops mid-rollback
    switch(control, ship_fails=True, refuse=True)
    b = raysaga.fork(wf, first.run_id, from_node="charge", store=store_url, executor="inline")
    assert b.status == RunStatus.COMPENSATION_FAILED, b.status_reason
    assert "buyer@0.0" not in _ledger(store_url, b.run_id) and "buyer@0.0" in _ledger(store_url, first.run_id)
    switch(control, ship_fails=False, refuse=False)
    renamed = undo_shop(name, scripted(PAYS), provider.call, control, pay_name="pay_v2")  # the deploy
    with pytest.raises(ForkError, match=r"buyer@0\.0:compensate \(not started\)"):
        raysaga.fork(renamed, b.run_id, from_node="charge", store=store_url, executor="inline", options=CHANGED)
    done = raysaga.retry(renamed, b.run_id, store=store_url, executor="inline", compensations=True, options=CHANGED)
    assert done.status == RunStatus.COMPENSATION_FAILED, done.status_reason
    [(node, kind, message)] = _failed(done)
    assert (node, kind) == ("buyer@0.0", "CompensationMissing") and "no longer has a tool 'pay'" in message, message
    assert (len(provider.effects("pay")), len(provider.effects("unpay"))) == (1, 0)
    # the tool back: B's retry undoes the payment it inherited, under A's key (once)
    done = raysaga.retry(wf, b.run_id, store=store_url, executor="inline", compensations=True, options=CHANGED)
    assert done.status == RunStatus.COMPENSATED, done.status_reason
    assert (len(provider.effects("pay")), len(provider.effects("unpay"))) == (1, 1)


@pytest.mark.parametrize("how", ["lose_answer", "unstorable"])
def test_a_failed_call_that_may_have_taken_effect_refuses_the_fork_until_undone(
        store_url: str, tmp_path: Path, how: str) -> None:
    provider, control = FakeProvider(), tmp_path / "control"
    control.mkdir()
    wf = undo_shop(f"undo49b_doubt_{uuid.uuid4().hex[:6]}", scripted(PAYS), provider.call, control)
    parent = _stopped(store_url, control, wf, **{how: True})
    assert _rows(store_url, parent)["buyer@0.0"] == "failed"
    status, result = _ledger(store_url, parent)["buyer@0.0"]
    assert (status, result["error"].get("took_effect")) == \
        ((EffectStatus.ABANDONED, None) if how == "lose_answer" else (EffectStatus.FAILED, True)), result
    with pytest.raises(ForkError, match=r"has 1 compensation\(s\) that did not complete: "
                                        r"buyer@0\.0:compensate \(not started\)"):
        raysaga.fork(wf, parent, from_node="charge", store=store_url, executor="inline")
    # the rollback undoes that very call: the refusal named what it would do
    done = raysaga.retry(wf, parent, store=store_url, executor="inline", compensations=True)
    assert done.status == RunStatus.COMPENSATED, done.status_reason
    assert (len(provider.effects("pay")), len(provider.effects("unpay")), len(provider.effects("refund"))) == \
        (1, 1, 1)
    assert _rows(store_url, parent)["buyer@0.0:compensate"] == "completed"
    child = raysaga.fork(wf, parent, from_node="charge", store=store_url, executor="inline")
    assert child.status == RunStatus.COMPLETED, child.status_reason  # (the agent runs again: it was undone)
    assert len(provider.effects("pay")) == 2


def test_over_the_wire_on_ray_a_lost_answer_is_owed_by_both(store_url: str, tmp_path: Path,
                                                             ray_session: str) -> None:
    """The real SDK against the local Messages server, every task on Ray, the provider over HTTP."""
    control = tmp_path / "control"
    control.mkdir()
    with ms.MessagesServer(responder(PAYS)) as srv, FakeServices() as services:
        model: Model = AnthropicModel(af.MODEL, base_url=srv.base_url, timeout=30.0, api_key_env=af.KEY_ENV)
        call: Call = functools.partial(post, services.url)
        wf = undo_shop(f"undo49b_ray_{uuid.uuid4().hex[:6]}", model, call, control)
        parent = _stopped(store_url, control, wf, executor="ray", lose_answer=True)
        with pytest.raises(ForkError, match=r"buyer@0\.0:compensate \(not started\)"):
            raysaga.fork(wf, parent, from_node="charge", store=store_url, executor="ray", address=ray_session)
        done = raysaga.retry(wf, parent, store=store_url, executor="ray", address=ray_session, compensations=True)
        assert done.status == RunStatus.COMPENSATED, done.status_reason
        kinds = sorted(services.log()["kinds"].values())
        assert kinds == ["charge", "pay", "refund", "unpay"], kinds  # the payment (its 2 attempts deduped), undone
