"""Circuit breaker counts go through the driver's fenced batch (``Batch.breakers``).

``SqlStore.commit`` applies them in the batch's transaction: the breaker row is read under a
lock, moved on by ``after_call`` and written back. Checked on SQLite and PostgreSQL: two
drivers counting failures on one breaker at the same time both count (no lost update), also
when neither finds the row and both would insert it; a batch refused for a stale fence
changes nothing, its breaker counts included. Breaker rows are global to a store and the
PostgreSQL database is shared by the session: every test names its own breaker.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy import text

from raysaga.errors import LeaseLostError
from raysaga.state import (
    Batch,
    BreakerChange,
    BreakerState,
    Lease,
    NewRun,
    NodeStatus,
    NodeWrite,
    RunStatus,
    RunUpdate,
    SqlStore,
)

T0 = 1_700_000_000.0


def fail(name: str, at: float = T0, threshold: int = 100) -> BreakerChange:
    return BreakerChange(name=name, ok=False, at=at, threshold=threshold, cooldown=30.0)


def driving(store: SqlStore, tag: str) -> Lease:
    run_id = f"{tag}-{uuid.uuid4().hex[:10]}"
    store.create_run(NewRun(run_id=run_id, workflow_name="wf", workflow_version="1", definition_hash="d" * 64,
                            trace_id=uuid.uuid4().hex))
    lease = store.claim(run_id, f"driver-{tag}", 30.0)
    store.commit(lease, Batch(run=RunUpdate(status=RunStatus.RUNNING)))
    return lease


@contextmanager
def holding(store: SqlStore, name: str, *, insert: bool) -> Iterator[None]:
    """Another transaction holds the breaker row (PostgreSQL: its row lock, or its uncommitted
    insert; SQLite: the write lock) until the block ends; it commits what it wrote."""
    conn = store.engine.connect()
    try:
        with conn.begin():
            if insert:
                conn.execute(text("INSERT INTO raysaga_breakers (name, state, failures, opened_at, version, "
                                  "updated_at) VALUES (:n, 'closed', 1, NULL, 1, 0)"), {"n": name})
            elif store.dialect == "postgresql":
                conn.execute(text("SELECT failures FROM raysaga_breakers WHERE name = :n FOR UPDATE"), {"n": name})
            else:  # the write transaction began IMMEDIATE: it holds SQLite's write lock already
                conn.execute(text("UPDATE raysaga_breakers SET updated_at = 0 WHERE name = :n"), {"n": name})
            yield
    finally:
        conn.close()


def commit_in_thread(store: SqlStore, lease: Lease, batch: Batch, errors: list[BaseException]) -> threading.Thread:
    def run() -> None:
        try:
            store.commit(lease, batch)
        except BaseException as exc:  # reported by the test
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


@pytest.mark.parametrize("row", ["existing", "inserted concurrently"])
def test_two_drivers_counting_failures_at_once_both_count(store: SqlStore, row: str) -> None:
    name = f"svc-{uuid.uuid4().hex[:8]}"
    first, second = driving(store, "a"), driving(store, "b")
    if row == "existing":
        store.commit(first, Batch(breakers=[fail(name)]))
        assert store.breaker_get(name).failures == 1
    errors: list[BaseException] = []
    # both commits start while another transaction holds the row: each must count on the row as
    # the other left it (a read without the lock would see failures=1 twice, and write 2 twice)
    with holding(store, name, insert=row != "existing"):
        threads = [commit_in_thread(store, lease, Batch(breakers=[fail(name)]), errors) for lease in (first, second)]
        time.sleep(0.5)  # both are inside their transactions, waiting on the row
        assert all(t.is_alive() for t in threads)
    for thread in threads:
        thread.join(30)
    assert errors == []
    record = store.breaker_get(name)
    assert (record.state, record.failures) == (BreakerState.CLOSED, 3)


def test_many_concurrent_counts_are_all_kept_and_open_the_breaker_once(store: SqlStore) -> None:
    name = f"svc-{uuid.uuid4().hex[:8]}"
    leases = [driving(store, f"d{i}") for i in range(4)]
    errors: list[BaseException] = []
    start = threading.Barrier(len(leases))

    def drive(lease: Lease) -> None:
        try:
            start.wait()
            for i in range(10):
                store.commit(lease, Batch(breakers=[fail(name, T0 + i, threshold=25)],
                                          nodes=[NodeWrite(node_id=f"n{i}", status=NodeStatus.FAILED)]))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=drive, args=(lease,)) for lease in leases]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    record = store.breaker_get(name)
    assert (record.state, record.failures) == (BreakerState.OPEN, 40)


def test_a_batch_refused_for_a_stale_fence_leaves_the_breaker_unchanged(store: SqlStore) -> None:
    name, fresh = f"svc-{uuid.uuid4().hex[:8]}", f"svc-{uuid.uuid4().hex[:8]}"
    lease = driving(store, "stale")
    store.commit(lease, Batch(breakers=[fail(name, threshold=3), fail(name, threshold=3)]))
    before = store.breaker_get(name)
    assert (before.state, before.failures) == (BreakerState.CLOSED, 2)

    store.release(lease)
    newer = store.claim(lease.run_id, "another driver", 30.0)  # the fence moves on
    with pytest.raises(LeaseLostError):
        store.commit(lease, Batch(breakers=[fail(name, threshold=3), fail(fresh)],
                                  nodes=[NodeWrite(node_id="x", status=NodeStatus.FAILED)]))
    assert store.breaker_get(name) == before  # the third failure would have opened it
    assert store.breaker_get(fresh).version == 0  # never written
    assert store.nodes(lease.run_id) == []
    # the driver that holds the run counts on it
    store.commit(newer, Batch(breakers=[fail(name, T0 + 5, threshold=3)]))
    after = store.breaker_get(name)
    assert (after.state, after.failures, after.opened_at) == (BreakerState.OPEN, 3, T0 + 5)


def test_counts_in_one_batch_apply_in_order_and_a_success_on_a_closed_breaker_writes_nothing(
        store: SqlStore) -> None:
    name, quiet = f"svc-{uuid.uuid4().hex[:8]}", f"svc-{uuid.uuid4().hex[:8]}"
    lease = driving(store, "order")
    ok = BreakerChange(name=name, ok=True, at=T0 + 3, threshold=2, cooldown=30.0)
    store.commit(lease, Batch(breakers=[fail(name, T0, 2), fail(name, T0 + 1, 2), ok, fail(name, T0 + 4, 2),
                                        BreakerChange(name=quiet, ok=True, at=T0, threshold=2, cooldown=30.0)]))
    record = store.breaker_get(name)
    # opened by the second failure, closed by the success, one failure counted since
    assert (record.state, record.failures, record.opened_at, record.version) == (BreakerState.CLOSED, 1, None, 1)
    assert store.breaker_get(quiet).version == 0  # as before: no row for a success on a closed breaker
    with store.engine.connect() as conn:
        stored: Any = conn.execute(text("SELECT state FROM raysaga_breakers WHERE name = :n"), {"n": name}).scalar()
    assert stored == "closed"  # the stored values are the same strings as before BreakerState


def test_the_batch_carries_breaker_counts_like_its_other_writes() -> None:
    batch = Batch()
    assert batch.empty()
    batch.breakers.append(fail("x"))
    assert not batch.empty()
    taken = batch.take()
    assert taken.breakers == [fail("x")] and batch.breakers == [] and batch.empty()
