"""Compensations complete: an undo whose answers get lost retries until it succeeds.

A payment provider that applies a refund and then loses its answer 30% of the time (an
ambiguous outcome: a transient error after the effect) must not leave runs in
``compensation_failed``: by default a compensation retries transient failures with capped
exponential backoff and full jitter, effectively without limit, under one idempotency key, so
the provider (which dedupes by key) applies each refund exactly once. A budget the workflow
declares with ``@wf.compensation(step, retry=RetryPolicy(...))`` is honoured. The wait is durable
and visible: each retry is a ``compensation_retry`` event naming the undo, its attempt and its
``not_before``, and the undo's node row is ``retrying`` with that time (a resume honours it) while the run
is ``compensating``.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import raysaga
from raysaga import Permanent, RetryPolicy, StepContext, Workflow
from raysaga.orchestrator.options import COMPENSATION_ATTEMPTS, COMPENSATION_RETRY, compensation_retry
from raysaga.state import EffectStatus, NodeStatus, RunStatus, SqlStore

#: The forward step's policy: 3 attempts, tiny backoff (a compensation keeps its base and cap).
FORWARD = RetryPolicy(max_attempts=3, base=0.001, cap=0.004)


@dataclass
class DroppingProvider:
    """Dedupes by idempotency key; after applying a refund it loses the answer with ``drop`` odds."""

    drop: float
    rng: random.Random
    applied: Counter[str] = field(default_factory=Counter)
    calls: Counter[str] = field(default_factory=Counter)
    observe: Any = None

    def charge(self, key: str) -> dict[str, Any]:
        self.calls[key] += 1
        if not self.applied[key]:
            self.applied[key] += 1
        return {"charge": key}

    def refund(self, key: str) -> dict[str, Any]:
        self.calls[key] += 1
        if self.observe is not None:
            self.observe(key, self.calls[key])
        if not self.applied[key]:
            self.applied[key] += 1  # the refund takes effect...
        if self.rng.random() < self.drop:
            raise ConnectionError("connection reset: the refund's answer was lost")  # ...its answer does not
        return {"refund": key}


def order_saga(provider: DroppingProvider, comp_retry: RetryPolicy | None = None) -> Workflow:
    wf = Workflow("runtime_refund")

    @wf.step(effect=True, retry=FORWARD)
    def charge(ctx: StepContext, input: dict[str, Any]) -> dict[str, Any]:
        assert ctx.idempotency_key is not None
        return provider.charge(ctx.idempotency_key)

    @wf.compensation("charge", retry=comp_retry)
    def refund(ctx: StepContext, output: dict[str, Any]) -> dict[str, Any]:
        assert ctx.idempotency_key is not None
        return provider.refund(ctx.idempotency_key)

    @wf.step()
    def ship(charge: dict[str, Any]) -> str:
        raise Permanent("out of stock")

    return wf


def test_100_refunds_through_a_provider_that_drops_30_percent_of_answers_all_complete(store_url: str) -> None:
    provider = DroppingProvider(drop=0.3, rng=random.Random(20261123))
    wf = order_saga(provider)
    store = SqlStore(store_url)
    try:
        for i in range(100):
            record = raysaga.run(wf, {"order": i}, store=store, run_id=f"refund-{i}", executor="inline")
            assert record.status == RunStatus.COMPENSATED, (i, record.status_reason, record.error)
            effects = {e.node_id: e for e in store.effects(record.run_id)}
            refund_key = effects["charge:compensate"].idempotency_key
            assert effects["charge:compensate"].status == EffectStatus.COMMITTED
            assert provider.applied[refund_key] == 1
            retries = [e for e in store.events(record.run_id) if e.kind == "compensation_retry"]
            assert len(retries) == provider.calls[refund_key] - 1
            assert [e.data["attempt"] for e in retries] == list(range(1, len(retries) + 1))
            assert all(e.node_id == "charge:compensate" and e.data["not_before"] > 0 for e in retries)
    finally:
        store.close()
    refunds = [k for k in provider.calls if k.endswith(":compensate")]
    assert len(refunds) == 100
    assert set(provider.applied.values()) == {1}, "an effect applied twice"
    # the drops did happen, and some refunds needed more attempts than the forward step's 3
    assert sum(provider.calls[k] for k in refunds) > 120
    assert max(provider.calls[k] for k in refunds) > FORWARD.max_attempts


def test_waiting_undo_is_durable_and_visible(sqlite_url: str) -> None:
    store = SqlStore(sqlite_url)
    seen: list[tuple[int, Any, Any, Any]] = []

    def observe(key: str, attempt: int) -> None:  # called by the provider, inside the driver, mid-rollback
        if attempt > 1:
            run = store.get_run("visible")
            row = {n.label: n for n in store.nodes("visible")}["charge:compensate"]
            event = [e for e in store.events("visible") if e.kind == "compensation_retry"][-1]
            seen.append((attempt, run.status, (row.status, row.attempt, time.time()), event.data))

    provider = DroppingProvider(drop=1.0, rng=random.Random(1), observe=observe)
    wf = order_saga(provider, comp_retry=RetryPolicy(max_attempts=4, base=0.001, cap=0.004))
    try:
        record = raysaga.run(wf, {}, store=store, run_id="visible", executor="inline")
        # a declared budget runs out: parked for an operator, the undo named
        assert record.status == RunStatus.COMPENSATION_FAILED
        assert "compensation failed for charge" in (record.status_reason or "")
        key = store.effects("visible")[-1].idempotency_key
        refund_key = next(k for k in provider.calls if k.endswith(":compensate"))
        assert key and provider.calls[refund_key] == 4 and provider.applied[refund_key] == 1
    finally:
        store.close()
    assert [s[0] for s in seen] == [2, 3, 4]
    for attempt, status, (row_status, row_attempt, called_at), data in seen:
        assert status == RunStatus.COMPENSATING
        # the undo is durable as running before each call (an effect), under its attempt number
        assert row_status == NodeStatus.RUNNING and row_attempt == attempt
        # the previous attempt's retry was recorded with its time, and the call waited for it
        assert data["attempt"] == attempt - 1 and data["not_before"] <= called_at + 0.001
        assert "connection reset" in data["error"]["message"]


def test_compensation_retry_defaults() -> None:
    declared = RetryPolicy(max_attempts=2)
    assert compensation_retry(declared, FORWARD) is declared
    derived = compensation_retry(None, FORWARD)
    assert (derived.max_attempts, derived.base, derived.cap) == (COMPENSATION_ATTEMPTS, FORWARD.base, FORWARD.cap)
    assert compensation_retry(None, None) == COMPENSATION_RETRY
    assert (COMPENSATION_RETRY.base, COMPENSATION_RETRY.cap) == (0.5, 60.0)
    assert COMPENSATION_RETRY.max_attempts >= 1_000_000
