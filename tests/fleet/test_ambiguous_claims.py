"""Ambiguous claims: the database commits a worker's claim of a run, then the connection is lost
before the worker hears so. The worker's next try finds the claim it made (``Store.claim_of``,
under the same owner) and drives that run, rather than leaving it leased to no driver until the
lease runs out and claiming it again under a new fence.

``ClaimDropper`` answers a committed ``claim_next`` with a ``ConnectionDropped`` (a lost
connection), with an even chance each time. The lease is long (120 s) and the runs are expected
at rest well before it could run out: a claim not found again would hold its run past the wait.
Checked on SQLite and PostgreSQL: every run ends with its golden output under ONE claim (one
``lease_claimed`` event, fence 1, the owner of the dropped answer when it was dropped), every
effect takes effect once, the worker counts no failure. CI: 24 runs; ``RAYSAGA_FULL_SWEEP=1``:
2,000 runs (about 1,000 injections a store). ``TakeoverDropper`` does the same to a worker's
take-over of a run from a driver proven gone (``Worker.claim_orphan``), which claims under the
slot's owner for the same reason.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from raysaga import Client, RunOptions, Worker
from raysaga.orchestrator.faults import ConnectionDropped
from raysaga.orchestrator.ownership import new_owner
from raysaga.state import EffectStatus, Lease, RunStatus, SqlStore
from raysaga.state.claims import Claim
from tests.support import fleet_flows as flows
from tests.support.crash_driver import wait_until
from tests.support.services import FakeServices, get_log
from tests.support.worker_procs import dead_owner, fleet_input

RUNS = 2000 if os.environ.get("RAYSAGA_FULL_SWEEP") == "1" else 24
LEASE_TTL = 120.0


@pytest.fixture
def services() -> Iterator[FakeServices]:
    with FakeServices() as svc:
        yield svc


class ClaimDropper(SqlStore):
    """A store whose committed claims are, half the time, answered by a lost connection."""

    def __init__(self, url: str, seed: int) -> None:
        super().__init__(url)
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.dropped: dict[str, str] = {}  # run id -> the owner whose claim of it was answered by a drop

    def claim_next(self, owner: str, ttl: float, workflows: Mapping[str, str | tuple[str, str]], *,
                   limits: Mapping[str, int] | None = None) -> Claim | None:
        claim = super().claim_next(owner, ttl, workflows, limits=limits)  # durable from here on
        if claim is not None:
            with self.lock:
                drop = self.rng.random() < 0.5
                if drop:
                    self.dropped[claim.lease.run_id] = owner
            if drop:
                raise ConnectionDropped("after_claim", claim.lease.run_id)
        return claim


def test_a_claim_whose_answer_was_lost_is_found_and_driven(fleet_url: str, tmp_path: Path, services: FakeServices,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    trace = tmp_path / "trace.log"
    client = Client(fleet_url)
    store = ClaimDropper(fleet_url, seed=20261130)
    try:
        runs = [(client.submit(flows.short, fleet_input(n, services, trace)).run_id, n) for n in range(RUNS)]
        caplog.set_level(logging.WARNING, logger="raysaga.worker")
        # well within the lease: a dropped claim not found again would hold its run for LEASE_TTL
        worker = work_until_completed(store, [r for r, _ in runs], concurrency=2,
                                      timeout=LEASE_TTL / 2 if RUNS <= 100 else 600)

        assert len(store.dropped) >= RUNS // 4, f"only {len(store.dropped)} claims dropped of {RUNS}"
        assert worker.counts.failed == 0
        found = [r for r in caplog.records if "was claimed though the answer was lost" in r.getMessage()]
        assert len(found) == len(store.dropped)
        for run_id, n in runs:
            run = store.get_run(run_id)
            assert (run.status, run.output, run.lease_owner) == (RunStatus.COMPLETED, flows.golden(n), None)
            claims = [e.data for e in store.events(run_id) if e.kind == "lease_claimed"]
            assert [c["fence"] for c in claims] == [1], (run_id, claims)  # claimed once: found, not taken again
            if run_id in store.dropped:
                assert claims[0]["owner"] == store.dropped[run_id]
            assert [e.idempotency_key for e in store.effects(run_id) if e.status != EffectStatus.COMMITTED] == []
        provider = get_log(services.url)
        assert len(provider["by_subject"]) == 2 * RUNS and set(provider["by_subject"].values()) == {1}
        assert set(provider["effective"].values()) == {1}
        print(f"{len(store.dropped)} claims answered by a dropped connection over {RUNS} runs: each found and "
              "driven under its one claim, 0 duplicate effects, 0 failed runs")
    finally:
        store.close()
        client.close()


def work_until_completed(store: SqlStore, run_ids: list[str], *, concurrency: int, timeout: float) -> Worker:
    """A worker (inline, ``LEASE_TTL`` leases) on ``store`` in a thread until every run in
    ``run_ids`` completed, then stopped; returned for its counts."""
    worker = Worker([flows.short], store, concurrency=concurrency, executor="inline", poll=0.02,
                    options=RunOptions(lease_ttl=LEASE_TTL))
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        wait_until(lambda: all(store.get_run(r).status == RunStatus.COMPLETED for r in run_ids),
                   timeout=timeout, what="every run completed", interval=0.1)
    finally:
        worker.stop()
        thread.join(timeout=60)
    assert not thread.is_alive()
    return worker


def test_claim_of_finds_only_the_owners_live_claim(fleet_url: str, tmp_path: Path, services: FakeServices) -> None:
    client = Client(fleet_url)
    store = SqlStore(fleet_url)
    try:
        run_id = client.submit(flows.short, fleet_input(0, services, tmp_path / "trace.log")).run_id
        owner = new_owner()
        assert store.claim_of(owner, 30.0) is None  # nothing claimed yet
        claim = store.claim_next(owner, 30.0, {flows.short.name: flows.short.definition_hash})
        assert claim is not None and claim.lease.run_id == run_id
        found = store.claim_of(owner, 30.0)
        assert found is not None and (found.lease, found.workflow, found.reason, found.status, found.abandoned_by) == (
            claim.lease, claim.workflow, claim.reason, claim.status, claim.abandoned_by)
        assert found.latency == pytest.approx(claim.latency, abs=1e-4)  # the claim's event rounds it
        assert store.claim_of(new_owner(), 30.0) is None  # another owner's try finds nothing
        store.release(claim.lease)
        assert store.claim_of(owner, 30.0) is None  # a lease let go is no claim
        short = store.claim_next(owner, 0.05, {flows.short.name: flows.short.definition_hash})
        assert short is not None
        wait_until(lambda: time.time() > short.lease.expires_at, timeout=5, what="the short lease to expire")
        assert store.claim_of(owner, 0.05) is None  # a lease run out is no claim: claim_next takes the run again
    finally:
        store.close()
        client.close()


class TakeoverDropper(SqlStore):
    """A store whose committed take-overs (a lease taken from a driver proven gone: the worker's
    ``claim_orphan``) are answered by a lost connection, the first time for each run."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.dropped: dict[str, str] = {}  # run id -> the owner whose take-over of it was answered by a drop

    def claim(self, run_id: str, owner: str, ttl: float, *, take_from: str | None = None) -> Lease:
        lease = super().claim(run_id, owner, ttl, take_from=take_from)  # durable from here on
        if take_from is not None and run_id not in self.dropped:
            self.dropped[run_id] = owner
            raise ConnectionDropped("after_claim", run_id)
        return lease


def test_a_takeover_whose_answer_was_lost_is_found_and_driven_alone(
        fleet_url: str, tmp_path: Path, services: FakeServices, caplog: pytest.LogCaptureFixture) -> None:
    """A worker takes a run over from a driver proven gone and the answer is lost: it finds the
    take-over under the same owner and drives the run alone (a suspect, as any take-over), instead
    of leaving it leased to no driver until the (long) lease ran out."""
    client = Client(fleet_url)
    store = TakeoverDropper(fleet_url)
    try:
        runs = [(client.submit(flows.short, fleet_input(n, services, tmp_path / "trace.log")).run_id, n)
                for n in range(3)]
        dead = dead_owner()
        for run_id, _ in runs:  # each held by a driver that died mid-run, its lease far from running out
            store.claim(run_id, dead, LEASE_TTL)
            store.transition(run_id, store.get_run(run_id).version, RunStatus.RUNNING)
        caplog.set_level(logging.WARNING, logger="raysaga.worker")
        worker = work_until_completed(store, [r for r, _ in runs], concurrency=1, timeout=LEASE_TTL / 2)

        assert sorted(store.dropped) == sorted(r for r, _ in runs)
        assert worker.counts.failed == 0 and worker.counts.by_reason == {"takeover": 3}
        found = [r for r in caplog.records if "was claimed though the answer was lost" in r.getMessage()]
        assert len(found) == len(runs)
        for run_id, n in runs:
            run = store.get_run(run_id)
            assert (run.status, run.output, run.lease_owner) == (RunStatus.COMPLETED, flows.golden(n), None)
            claims = [e.data for e in store.events(run_id) if e.kind == "lease_claimed"]
            # the dead driver's claim, then the one take-over: found, not taken again under a new owner
            assert [(c["owner"], c.get("taken_from")) for c in claims] == [(dead, None), (store.dropped[run_id], dead)]
            assert "abandoned_by" in claims[1]  # counted as the dead driver's death
        provider = get_log(services.url)
        assert len(provider["by_subject"]) == 2 * len(runs) and set(provider["effective"].values()) == {1}
    finally:
        store.close()
        client.close()
