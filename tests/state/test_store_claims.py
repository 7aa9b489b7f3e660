"""A worker's claim (``Store.claim_next``) on SQLite and PostgreSQL: what is runnable, in what
order, one winner per run under concurrent claims, the per-workflow limit, the definition match."""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from raysaga.state import Batch, NewRun, RunStatus, RunUpdate, SqlStore

WF = {"flow": "h1"}


@pytest.fixture(autouse=True)
def _own_workflows() -> None:
    """PostgreSQL's database is shared by the test session: each test claims its own workflows."""
    global WF
    tag = uuid.uuid4().hex[:8]
    WF = {f"flow{tag}": "h1"}
    _TAG[0] = tag


_TAG = [""]


def _id(name: str) -> str:
    return f"{name}-{_TAG[0]}"


def _wf(name: str = "flow") -> str:
    return f"{name}{_TAG[0]}"


def _new(store: SqlStore, run_id: str, *, queue: str | None = "default", workflow: str = "flow",
         digest: str = "h1") -> None:
    store.create_run(NewRun(run_id=_id(run_id), workflow_name=_wf(workflow), workflow_version="1",
                            definition_hash=digest, trace_id="t", queue=queue))


def test_submitted_runs_are_claimed_oldest_first_and_once(store: SqlStore) -> None:
    for i in range(3):
        _new(store, f"r{i}")
    _new(store, "foreground", queue=None)  # `raysaga run` drives it: no worker may take it
    claims = [store.claim_next("w", 30, WF) for _ in range(4)]
    assert [c.lease.run_id if c else None for c in claims] == [_id("r0"), _id("r1"), _id("r2"), None]
    assert all(c is None or c.reason == "new" for c in claims)
    claimed = [e for e in store.events(_id("r0")) if e.kind == "lease_claimed"]
    assert claimed[-1].data["worker"] is True and claimed[-1].data["reason"] == "new"


def test_only_registered_definitions_are_claimed(store: SqlStore) -> None:
    _new(store, "old", digest="h0")
    _new(store, "other", workflow="other")
    assert store.claim_next("w", 30, WF) is None
    assert store.claim_next("w", 30, {_wf(): "h0"}) is not None


def test_expired_and_released_leases_are_taken_over(store: SqlStore) -> None:
    _new(store, "r")
    # 2 s: the lease must still be live at the next claim (0.5 s ran out first in CI under load)
    first = store.claim_next("w1", 2.0, WF)
    assert first is not None
    store.commit(first.lease, Batch(run=RunUpdate(status=RunStatus.RUNNING)))
    assert store.claim_next("w2", 30, WF) is None  # its lease is live
    deadline = time.time() + 10
    while time.time() < first.lease.expires_at and time.time() < deadline:
        time.sleep(0.05)  # let the short lease run out (wall clock is what the lease is made of)
    second = store.claim_next("w2", 30, WF)
    assert second is not None and second.reason == "takeover" and second.lease.fence == first.lease.fence + 1
    store.release(second.lease)
    third = store.claim_next("w3", 30, WF)  # handed back: free at once
    assert third is not None and third.reason == "takeover"


def test_resting_runs_are_claimed_when_due(store: SqlStore) -> None:
    _new(store, "r")
    claim = store.claim_next("w", 30, WF)
    assert claim is not None
    store.commit(claim.lease, Batch(run=RunUpdate(status=RunStatus.RUNNING)))
    store.commit(claim.lease, Batch(run=RunUpdate(status=RunStatus.WAITING_TIMER, wake_at=time.time() + 3600,
                                                  set_wake=True)))
    store.release(claim.lease)
    assert store.claim_next("w", 30, WF) is None  # not due for an hour
    assert store.wake(_id("r"), [RunStatus.WAITING_TIMER], "test", "woken")
    due = store.claim_next("w", 30, WF)
    assert due is not None and due.reason == "due"


def test_per_workflow_limit(store: SqlStore) -> None:
    for i in range(3):
        _new(store, f"r{i}")
    _new(store, "x0", workflow="other", digest="h9")
    both = {_wf(): "h1", _wf("other"): "h9"}
    limits = {_wf(): 1}
    first = store.claim_next("w", 30, both, limits=limits)
    assert first is not None and first.workflow == _wf()
    nxt = store.claim_next("w", 30, both, limits=limits)
    assert nxt is not None and nxt.workflow == _wf("other")  # the limited workflow is skipped, not the queue
    assert store.claim_next("w", 30, both, limits=limits) is None
    store.release(first.lease)
    again = store.claim_next("w", 30, both, limits=limits)
    assert again is not None and again.workflow == _wf()


def test_concurrent_claims_take_each_run_once(store: SqlStore, store_url: str) -> None:
    for i in range(20):
        _new(store, f"r{i:02d}")
    stores = [SqlStore(store_url) for _ in range(6)]
    taken: list[str] = []
    lock = threading.Lock()
    barrier = threading.Barrier(len(stores))

    def claim_all(s: SqlStore) -> None:
        barrier.wait()
        while (claim := s.claim_next(f"w{id(s)}", 30, WF)) is not None:
            with lock:
                taken.append(claim.lease.run_id)

    threads = [threading.Thread(target=claim_all, args=(s,)) for s in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    for s in stores:
        s.close()
    assert sorted(taken) == [_id(f"r{i:02d}") for i in range(20)]  # every run once: no run twice, none lost
