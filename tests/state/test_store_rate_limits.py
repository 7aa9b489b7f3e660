"""Fleet-wide rate limits in the store (``raysaga.state.rate_limits``), on SQLite and PostgreSQL.

Admissions through one limit serialise on its row: threads on separate connections racing for
the same window never get more grants than the limit; a call counts from its grant until ``per``
seconds after it ended (its request reached the provider at some time in between), or while it
is under way; a refused caller is told how long to wait; tokens are counted when a call ends; a
concurrency slot is freed by its release or by its hold expiring; a 429's block holds for the
whole fleet. Limits are global to a store and the PostgreSQL database is shared by the session:
every test names its own limit.
"""

from __future__ import annotations

import threading
import uuid

import pytest

from raysaga.state import SqlStore
from raysaga.state.rate_limits import RateRule

T0 = 1_700_000_000.0


def rule(**limits: object) -> RateRule:
    return RateRule(name=f"limit-{uuid.uuid4().hex[:10]}", **limits)  # type: ignore[arg-type]


def call(store: SqlStore, r: RateRule, at: float, took: float = 0.0, tokens: int = 0) -> int:
    """A call admitted at ``at`` that ended ``took`` seconds later."""
    admission = store.rate_acquire(r, at, hold=30.0)
    assert admission.grant is not None, f"refused at {at - T0}: wait {admission.wait}"
    store.rate_release(admission.grant, tokens, at + took)
    return admission.grant


def test_a_call_counts_until_per_seconds_after_it_ended(store: SqlStore) -> None:
    r = rule(requests=3, per=10.0, margin=1.0)
    call(store, r, T0, took=2.0)  # ended at T0 + 2: counts until T0 + 13 (10 s + the 1 s margin)
    call(store, r, T0 + 1)
    call(store, r, T0 + 2)
    refused = store.rate_acquire(r, T0 + 3, hold=30.0)
    assert refused.grant is None
    assert refused.wait == pytest.approx(9.0)  # the first call to stop counting: the one ended at T0 + 1
    assert store.rate_acquire(r, T0 + 11.9, hold=30.0).grant is None
    assert store.rate_acquire(r, T0 + 12.01, hold=30.0).grant is not None


def test_a_call_under_way_counts_until_it_ends(store: SqlStore) -> None:
    """Its request may reach the provider any time before it ends: it is counted, and a caller
    refused because of it asks again soon."""
    r = rule(requests=1, per=10.0, margin=0.0)
    under_way = store.rate_acquire(r, T0, hold=30.0)
    assert under_way.grant is not None
    refused = store.rate_acquire(r, T0 + 20, hold=30.0)
    assert refused.grant is None and 0 < refused.wait <= 0.25
    store.rate_release(under_way.grant, 0, T0 + 21)
    assert store.rate_acquire(r, T0 + 30.5, hold=30.0).grant is None
    assert store.rate_acquire(r, T0 + 31.01, hold=30.0).grant is not None


def test_tokens_are_counted_when_a_call_ends(store: SqlStore) -> None:
    r = rule(tokens=1000, per=60.0, margin=0.0)
    call(store, r, T0, tokens=600)
    call(store, r, T0 + 1, tokens=400)
    refused = store.rate_acquire(r, T0 + 2, hold=30.0)
    assert refused.grant is None and refused.wait == pytest.approx(58.0)
    assert store.rate_acquire(r, T0 + 60.5, hold=30.0).grant is not None


def test_a_concurrency_slot_is_freed_by_release_or_by_its_hold_expiring(store: SqlStore) -> None:
    r = rule(concurrent=1)
    held = store.rate_acquire(r, T0, hold=5.0)
    assert held.grant is not None
    refused = store.rate_acquire(r, T0 + 1, hold=5.0)
    assert refused.grant is None and 0 < refused.wait <= 0.25
    store.rate_release(held.grant, 0, T0 + 1)
    again = store.rate_acquire(r, T0 + 1, hold=5.0)
    assert again.grant is not None  # released: the slot is free
    # never released (its driver died): the slot comes back once the hold expires
    assert store.rate_acquire(r, T0 + 5.9, hold=5.0).grant is None
    assert store.rate_acquire(r, T0 + 6.1, hold=5.0).grant is not None


def test_a_block_holds_every_caller_until_it_ends(store: SqlStore) -> None:
    r = rule(requests=100)
    store.rate_block(r.name, T0 + 30, T0)
    store.rate_block(r.name, T0 + 10, T0)  # a shorter retry-after never shortens a block
    refused = store.rate_acquire(r, T0 + 5, hold=5.0)
    assert refused.grant is None and refused.wait == pytest.approx(25.0)
    assert store.rate_acquire(r, T0 + 30.5, hold=5.0).grant is not None


def test_racing_admissions_never_exceed_the_limit(store_url: str) -> None:
    """Threads on their own stores (connections) race for one window: exactly the limit is granted."""
    r = rule(requests=25, per=3600.0)
    stores = [SqlStore(store_url) for _ in range(4)]
    grants: list[int] = []
    lock = threading.Lock()
    start = threading.Barrier(len(stores))

    def take(s: SqlStore) -> None:
        start.wait()
        for i in range(20):
            admission = s.rate_acquire(r, T0 + i * 0.001, hold=1.0)
            if admission.grant is not None:
                s.rate_release(admission.grant, 0, T0 + i * 0.001)
                with lock:
                    grants.append(admission.grant)

    threads = [threading.Thread(target=take, args=(s,)) for s in stores]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        for s in stores:
            s.close()
    assert len(grants) == 25 and len(set(grants)) == 25
