"""A fork refused for an undo that cannot be called says why, and advises what works
(docs/fork.md, "Which runs"; ``orchestrator.fork_refusals.refuse_unsettled``).

A ``compensation_failed`` parent (its refund failed, so its rollback never reached the agent's
payment, which waits upstream of it), then a deploy that renames ``pay`` or narrows its schema:
the payment's undo is owed and cannot be called (``undo_targets.ToolLost``). The refusal said only
``buyer@0.0:compensate (not started)`` and advised ``raysaga retry RUN --compensations``, which
stops on that very call, after which the fork showed the same message again: a loop. It now says
why the undo cannot be called and what to restore first; each way it names is followed here, on a
real store, to the fork it promises.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select, update

import raysaga
from raysaga import RunOptions, Workflow
from raysaga.errors import ForkError
from raysaga.state import RunRecord, RunStatus, SqlStore
from raysaga.state.schema import nodes, runs
from raysaga.testing import FakeProvider
from tests.support.undo_target_flows import scripted, switch, undo_shop

PAYS = (("pay", {"item": "book"}),)
CHANGED = RunOptions(allow_changed=True)
#: How the deploy changes ``pay``, and what the refusal must say of it.
DEPLOYS: dict[str, tuple[dict[str, Any], str, str]] = {
    "renamed": ({"pay_name": "pay_v2"}, "the agent of step 'buyer' no longer has a tool 'pay'",
                "restore tool 'pay' (with its compensate=)"),
    "narrowed": ({"narrowed": True}, "tool 'pay' is there, but the arguments it ran with no longer fit the tool's "
                                     "schema (invalid arguments for pay",
                 "restore tool 'pay''s old schema (the one buyer@0.0 ran with)"),
}


def _refusal(wf: Workflow, store_url: str, run_id: str, at: str = "charge") -> str:
    with pytest.raises(ForkError) as refused:
        raysaga.fork(wf, run_id, from_node=at, store=store_url, executor="inline", options=CHANGED, drive=False)
    return str(refused.value)


def _failed(done: RunRecord) -> list[tuple[Any, Any]]:
    found = (done.error.failed_compensations if done.error is not None else None) or []
    return [(f.get("node"), f.get("type")) for f in found]


def _status(store_url: str, run_id: str) -> RunStatus:
    store = SqlStore(store_url)
    try:
        return store.get_run(run_id).status
    finally:
        store.close()


@pytest.mark.parametrize("deploy", sorted(DEPLOYS))
def test_the_refusal_says_why_the_undo_cannot_be_called_and_each_way_it_advises_works(
        store_url: str, tmp_path: Path, deploy: str) -> None:
    provider, control = FakeProvider(), tmp_path / "control"
    control.mkdir()
    name = f"adv50_{deploy}_{uuid.uuid4().hex[:6]}"
    wf = undo_shop(name, scripted(PAYS), provider.call, control)
    switch(control, ship_fails=True, refuse=True)
    parent = raysaga.run(wf, None, store=store_url, run_id=f"p-{uuid.uuid4().hex[:8]}", executor="inline")
    assert parent.status == RunStatus.COMPENSATION_FAILED, parent.status_reason
    switch(control, ship_fails=False, refuse=False)
    changes, why, restore = DEPLOYS[deploy]
    deployed = undo_shop(name, scripted(PAYS), provider.call, control, **changes)
    retry = f"`raysaga retry {parent.run_id} --compensations`"

    message = _refusal(deployed, store_url, parent.run_id)
    assert "buyer@0.0:compensate (not started). The undo of buyer@0.0 cannot be called: " + why in message, message
    assert f"With the code as it is, {retry} stops on buyer@0.0 again: in the code, {restore}, then {retry} " \
           "finishes its rollback (then fork); or fork from 'buyer' to run it again on purpose" in message, message
    assert f"make them again. {retry} finishes" not in message, message  # the advice that looped

    # the retry with the code as it is does stop there again, and the refusal says the same, no loop
    done = raysaga.retry(deployed, parent.run_id, store=store_url, executor="inline", compensations=True,
                         options=CHANGED)
    assert done.status == RunStatus.COMPENSATION_FAILED and _failed(done) == [("buyer@0.0", "CompensationMissing")]
    assert _refusal(deployed, store_url, parent.run_id) == message

    # way 1: fork from 'buyer' (before the call): allowed, and it runs
    child = raysaga.fork(deployed, parent.run_id, from_node="buyer", store=store_url, executor="inline",
                         options=CHANGED)
    assert child.status == RunStatus.COMPLETED, child.status_reason

    # way 2: the tool (its schema) restored in the code, the retry finishes the rollback, then the fork
    done = raysaga.retry(wf, parent.run_id, store=store_url, executor="inline", compensations=True, options=CHANGED)
    assert done.status == RunStatus.COMPENSATED, done.status_reason
    assert (len(provider.effects("pay")), len(provider.effects("unpay"))) == (1, 1)
    child = raysaga.fork(deployed, parent.run_id, from_node="charge", store=store_url, executor="inline",
                         options=CHANGED)
    assert child.status == RunStatus.COMPLETED, child.status_reason


def test_a_sibling_whose_rollback_owes_an_inherited_call_is_named_with_why(store_url: str, tmp_path: Path) -> None:
    """P completed; its fork B inherits the payment and stops mid-rollback; the deploy renames the
    tool. Forking P is refused for B's undo: the refusal says why, and which run to retry after what."""
    provider, control = FakeProvider(), tmp_path / "control"
    control.mkdir()
    name = f"adv50_lineage_{uuid.uuid4().hex[:6]}"
    wf = undo_shop(name, scripted(PAYS), provider.call, control)
    switch(control, ship_fails=False, refuse=False)
    p = raysaga.run(wf, None, store=store_url, run_id=f"p-{uuid.uuid4().hex[:8]}", executor="inline").run_id
    switch(control, ship_fails=True, refuse=True)
    b = raysaga.fork(wf, p, from_node="charge", store=store_url, executor="inline",
                     new_run_id=f"b-{uuid.uuid4().hex[:8]}").run_id
    assert _status(store_url, b) == RunStatus.COMPENSATION_FAILED
    switch(control, ship_fails=False, refuse=False)
    renamed = undo_shop(name, scripted(PAYS), provider.call, control, pay_name="pay_v2")

    message = _refusal(renamed, store_url, p)
    assert f"buyer@0.0:compensate (not started in run {b!r}). The undo of buyer@0.0 cannot be called: the agent " \
           "of step 'buyer' no longer has a tool 'pay'." in message, message
    assert f"restore tool 'pay' (with its compensate=), then `raysaga retry {b} --compensations` finishes its " \
           "rollback (then fork)" in message, message
    assert _refusal(renamed, store_url, b) == message.replace(f"run {p!r} has", f"run {b!r} has").replace(
        f" in run {b!r})", ")")
    done = raysaga.retry(wf, b, store=store_url, executor="inline", compensations=True, options=CHANGED)
    assert done.status == RunStatus.COMPENSATED, done.status_reason
    child = raysaga.fork(renamed, p, from_node="charge", store=store_url, executor="inline", options=CHANGED)
    assert child.status == RunStatus.COMPLETED, child.status_reason
    assert (len(provider.effects("pay")), len(provider.effects("unpay"))) == (1, 1)


def test_a_call_no_code_can_undo_is_said_so_and_only_the_fork_that_runs_it_again_is_advised(
        store_url: str, tmp_path: Path) -> None:
    """The turn's recorded response cannot be read (damaged): which tool the call made is unknown,
    so no code restored makes its undo callable, and no retry ever finishes that rollback."""
    provider, control = FakeProvider(), tmp_path / "control"
    control.mkdir()
    wf = undo_shop(f"adv50_unread_{uuid.uuid4().hex[:6]}", scripted(PAYS), provider.call, control)
    switch(control, ship_fails=True, refuse=True)
    parent = raysaga.run(wf, None, store=store_url, run_id=f"p-{uuid.uuid4().hex[:8]}", executor="inline").run_id
    switch(control, ship_fails=False, refuse=False)
    store = SqlStore(store_url)
    try:
        with store.engine.begin() as conn:  # the first turn's model response, damaged
            run_key = conn.execute(select(runs.c.run_key).where(runs.c.run_id == parent)).scalar_one()
            conn.execute(update(nodes).where(nodes.c.run_key == run_key, nodes.c.node_id == "buyer@0")
                         .values(output={"not": "a model response"}))
    finally:
        store.close()

    message = _refusal(wf, store_url, parent)
    assert "The undo of buyer@0.0 cannot be called: which tool it made cannot be read from its turn buyer@0." \
        in message, message
    assert f"No retry of run {parent!r} can undo buyer@0.0: undo it by hand with the provider; a fork from " \
           "'charge' stays refused while it is owed: fork from 'buyer' to run it again on purpose" in message, message
    assert "finishes its rollback" not in message, message
    done = raysaga.retry(wf, parent, store=store_url, executor="inline", compensations=True)
    assert done.status == RunStatus.COMPENSATION_FAILED and _failed(done) == [("buyer@0.0", "CompensationMissing")]
    child = raysaga.fork(wf, parent, from_node="buyer", store=store_url, executor="inline")
    assert child.status == RunStatus.COMPLETED, child.status_reason
