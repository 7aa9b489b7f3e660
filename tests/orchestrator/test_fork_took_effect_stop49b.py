"""A fork never makes again, under its own key, an effect its parent made whose value could not be
stored (docs/fork.md: the ledger row ``failed`` with ``took_effect: true``).

``pay`` charged the card and returned a value raysaga cannot store: the node failed, its ledger
row says the call took effect. A fork from ``ship`` does not inherit ``pay`` (it never
completed), so it called ``pay`` again under the fork's key, which the provider cannot dedupe:
the card was charged twice. Only ``pending`` and ``abandoned`` rows refused such a fork; a row that
says the call took effect (``machine.doubt.may_have_happened``) refuses it too now. Forking from
``pay`` itself runs it again by choice.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

import raysaga
from raysaga import StepContext, Workflow
from raysaga.errors import ForkError
from raysaga.state import EffectStatus, RunStatus, SqlStore
from raysaga.testing import FakeProvider


class _Receipt:
    """Not JSON: what a careless ``pay`` returns after the charge."""


def _shop(name: str, provider: FakeProvider, unstorable: dict[str, bool]) -> Workflow:
    wf = Workflow(name)

    @wf.step(effect=True)
    def pay(ctx: StepContext) -> Any:
        assert ctx.idempotency_key is not None
        charged = provider.call("charge", ctx.idempotency_key, {"amount": 7})
        return _Receipt() if unstorable["on"] else charged["id"]

    @wf.step()
    def ship(pay: str) -> str:
        return f"shipped on {pay}"

    return wf


def test_a_fork_past_an_effect_that_took_effect_and_failed_is_refused(store_url: str) -> None:
    provider, unstorable = FakeProvider(), {"on": True}
    wf = _shop(f"undo49b_took_{uuid.uuid4().hex[:6]}", provider, unstorable)
    run_id = f"p-{uuid.uuid4().hex[:8]}"
    parent = raysaga.run(wf, None, store=store_url, run_id=run_id, executor="inline")
    assert parent.status == RunStatus.FAILED, parent.status_reason
    store = SqlStore(store_url)
    try:
        [row] = store.effects(run_id)
    finally:
        store.close()
    assert row.status == EffectStatus.FAILED and isinstance(row.result, dict), row
    assert row.result["error"].get("took_effect") is True, row.result
    unstorable["on"] = False
    with pytest.raises(ForkError, match=rf"left 1 effect\(s\) whose outcome is unknown.*: pay \(pay, key "
                                        rf"{row.idempotency_key}\).*fork from 'pay'"):
        raysaga.fork(wf, run_id, from_node="ship", store=store_url, executor="inline")
    assert len(provider.effects("charge")) == 1  # not charged again
    child = raysaga.fork(wf, run_id, from_node="pay", store=store_url, executor="inline")  # by choice
    assert child.status == RunStatus.COMPLETED, child.status_reason
    assert len(provider.effects("charge")) == 2
