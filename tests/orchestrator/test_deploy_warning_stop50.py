"""What a resume under a changed definition announces of the agent's tool calls agrees with the
rollback that follows (docs/fork.md, "Workflow versions"; ``versions.changes``, ``call_undo``).

The warning (and the refusal without ``--allow-changed``) said "completed effects that will not be
compensated: buyer@0.0" of a call whose tool the deploy renamed, but the rollback stops on that
call (``compensation_failed``, ``CompensationMissing``) rather than leave it; and it named nothing
for a call whose arguments no longer fit the tool's schema, nor for a call the run inherited (a
fork's: its ledger row stays with the run that made it). Such calls are now named for what they
are: owed, their undo cannot be called, a rollback stops on them.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

import raysaga
from raysaga import RunOptions, Workflow
from raysaga.errors import DefinitionChangedError
from raysaga.orchestrator import versions
from raysaga.state import RunStatus, SqlStore
from raysaga.testing import FakeProvider
from tests.support.undo_target_flows import scripted, switch, undo_shop

PAYS = (("pay", {"item": "book"}),)
CHANGED = RunOptions(allow_changed=True)
BLOCKED = "completed tool calls whose undo cannot be called, on which a rollback will stop (compensation_failed): "
#: The deploys: how ``pay`` changes, and why its undo cannot be called.
DEPLOYS: dict[str, tuple[dict[str, Any], str]] = {
    "renamed": ({"pay_name": "pay_v2"}, "buyer@0.0 (the agent of step 'buyer' no longer has a tool 'pay')"),
    "narrowed": ({"narrowed": True}, "buyer@0.0 (tool 'pay' is there, but the arguments it ran with no longer fit "
                                     "the tool's schema (invalid arguments for pay: "),
}


def _with_audit(wf: Workflow) -> Workflow:
    """The deploy adds a step too: a tool's schema is not in the definition hash, a new step is."""
    @wf.step()
    def audit(ship: str) -> str:
        return ship

    return wf


def _stopped(store_url: str, control: Path, wf: Workflow, inherited: bool) -> str:
    """A ``compensation_failed`` run whose rollback still owes the payment: its own, or inherited
    (a fork of a completed run, which made the payment)."""
    if inherited:
        switch(control, ship_fails=False, refuse=False)
        first = raysaga.run(wf, None, store=store_url, run_id=f"a-{uuid.uuid4().hex[:8]}", executor="inline")
        switch(control, ship_fails=True, refuse=True)
        run = raysaga.fork(wf, first.run_id, from_node="charge", store=store_url, executor="inline")
    else:
        switch(control, ship_fails=True, refuse=True)
        run = raysaga.run(wf, None, store=store_url, run_id=f"p-{uuid.uuid4().hex[:8]}", executor="inline")
    assert run.status == RunStatus.COMPENSATION_FAILED, run.status_reason
    switch(control, ship_fails=False, refuse=False)
    return run.run_id


def _changed_event(store_url: str, run_id: str) -> dict[str, Any]:
    store = SqlStore(store_url)
    try:
        [data] = [e.data for e in store.events(run_id) if e.kind == "definition_changed"]
        return dict(data)
    finally:
        store.close()


@pytest.mark.parametrize("inherited", [False, True], ids=["own", "inherited"])
@pytest.mark.parametrize("deploy", sorted(DEPLOYS))
def test_a_call_whose_undo_cannot_be_called_is_announced_as_what_the_rollback_stops_on(
        store_url: str, tmp_path: Path, deploy: str, inherited: bool) -> None:
    provider, control = FakeProvider(), tmp_path / "control"
    control.mkdir()
    name = f"warn50_{deploy}_{uuid.uuid4().hex[:6]}"
    run_id = _stopped(store_url, control, undo_shop(name, scripted(PAYS), provider.call, control), inherited)
    changes, named = DEPLOYS[deploy]
    deployed = _with_audit(undo_shop(name, scripted(PAYS), provider.call, control, **changes))

    with pytest.raises(DefinitionChangedError) as refused:
        raysaga.retry(deployed, run_id, store=store_url, executor="inline", compensations=True)
    message = str(refused.value)
    assert BLOCKED + named in message, message
    assert "will not be compensated" not in message, message

    # what the rollback does: it stops on that very call, as announced (in the event too)
    done = raysaga.retry(deployed, run_id, store=store_url, executor="inline", compensations=True, options=CHANGED)
    assert done.status == RunStatus.COMPENSATION_FAILED, done.status_reason
    failed = (done.error.failed_compensations if done.error is not None else None) or []
    assert [(f.get("node"), f.get("type")) for f in failed] == [("buyer@0.0", "CompensationMissing")], failed
    event = _changed_event(store_url, run_id)
    assert event["not_compensated"] == [] and [b[:len(named)] for b in event["undo_blocked"]] == [named], event
    assert (len(provider.effects("pay")), len(provider.effects("unpay"))) == (1, 0)


def test_once_the_call_is_undone_it_is_not_announced(store_url: str, tmp_path: Path) -> None:
    """Undone (its compensation completed with the tool there), the call owes nothing: a later
    deploy renaming the tool names nothing (asked of ``versions.check``, as ``retry`` and ``cancel``
    ask it, for a run at rest that no operation reopens: ``compensated``)."""
    provider, control = FakeProvider(), tmp_path / "control"
    control.mkdir()
    name = f"warn50_done_{uuid.uuid4().hex[:6]}"
    wf = undo_shop(name, scripted(PAYS), provider.call, control)
    run_id = _stopped(store_url, control, wf, inherited=False)
    done = raysaga.retry(wf, run_id, store=store_url, executor="inline", compensations=True)
    assert done.status == RunStatus.COMPENSATED, done.status_reason
    renamed = undo_shop(name, scripted(PAYS), provider.call, control, pay_name="pay_v2")
    store = SqlStore(store_url)
    try:
        with pytest.raises(DefinitionChangedError) as refused:
            versions.check(store, store.get_run(run_id), renamed, allow_changed=False)
    finally:
        store.close()
    assert "steps changed: buyer" in str(refused.value) and "buyer@0.0" not in str(refused.value), refused.value
