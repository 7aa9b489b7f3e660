"""Ambiguous commits: the database commits a driver's write, then the connection is lost before the
driver hears so. The worker drives the run again from what is durable, under its lease, and the
write is found, not made twice.

``RAYSAGA_FAULTS="after_commit:*=drop:0.5,after_pending:*=drop:0.5"`` (``orchestrator/faults.py``)
raises a ``ConnectionDropped`` right after a durable write of a step's outcome or of an effect's
``pending`` row, with an even chance, at most once per driver: about every other write is
answered by a lost connection, and each run needs several drivers. Checked on SQLite and PostgreSQL: every run
ends with its golden output, every effect takes effect once at the deduping provider (no effect
was called again for a ``pending`` row the driver did not know was durable), no ledger row is left
``pending``, and there is no false conflict: no driver lost its lease, no run failed, the worker
counted no failure. CI: 24 runs; ``RAYSAGA_FULL_SWEEP=1``: 400 runs (about 1,000 injections a
store).

Run-state transitions too (``TransitionDropper``, a store whose ``commit`` of a batch that moves
the run, ``running``, ``waiting_human``, ``completed``, answers with that ``ConnectionDropped``
after the database committed it, with an even chance each time): ``short`` runs and
``approval`` runs, decided once every one rests waiting for it (no driver holding it: see
``tests/chaos/test_known_bugs.py`` for a decision made while one does), so each rests and
wakes. The same checks, and every drop was of a transition that is durable (the store says so).
CI: 12 runs of each; full: 200 of each.
"""

from __future__ import annotations

import logging
import os
import random
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from raysaga import Client, RunOptions, Worker
from raysaga.orchestrator.faults import ConnectionDropped
from raysaga.state import EffectStatus, RunStatus, SqlStore
from raysaga.state.models import Batch, Lease, RunRecord
from tests.support import fleet_flows as flows
from tests.support.crash_driver import wait_until
from tests.support.services import FakeServices, get_log
from tests.support.worker_procs import fleet_input

RUNS = 400 if os.environ.get("RAYSAGA_FULL_SWEEP") == "1" else 24
TRANSITION_RUNS = 200 if os.environ.get("RAYSAGA_FULL_SWEEP") == "1" else 12
DROPS = "after_commit:*=drop:0.5,after_pending:*=drop:0.5"


@pytest.fixture
def services() -> Iterator[FakeServices]:
    with FakeServices() as svc:
        yield svc


def test_a_lost_answer_to_a_commit_is_found_not_redone(store_url: str, tmp_path: Path, services: FakeServices,
                                                       monkeypatch: pytest.MonkeyPatch,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    trace = tmp_path / "trace.log"
    client = Client(store_url)
    store = SqlStore(store_url)
    worker: Worker | None = None
    try:
        runs = [(client.submit(flows.short, fleet_input(n, services, trace)).run_id, n) for n in range(RUNS)]
        monkeypatch.setenv("RAYSAGA_FAULTS", DROPS)  # read by each driver the worker starts
        caplog.set_level(logging.WARNING, logger="raysaga.worker")
        worker = Worker([flows.short], store, concurrency=2, executor="inline", poll=0.02,
                        options=RunOptions(lease_ttl=5.0))
        thread = threading.Thread(target=worker.run, daemon=True)
        thread.start()
        wait_until(lambda: all(store.get_run(r).status in (RunStatus.COMPLETED, RunStatus.FAILED) for r, _ in runs),
                   timeout=240, what="every run at rest", interval=0.1)
        worker.stop()
        thread.join(timeout=60)
        assert not thread.is_alive()

        dropped = [r for r in caplog.records if "the store is unreachable" in r.getMessage()]
        assert len(dropped) >= 2 * RUNS, f"only {len(dropped)} injected drops for {RUNS} runs"
        assert worker.counts.failed == 0 and not [r for r in caplog.records if "lease" in r.getMessage()]
        for run_id, n in runs:
            run = store.get_run(run_id)
            assert (run.status, run.output) == (RunStatus.COMPLETED, flows.golden(n)), (run_id, run.status_reason)
            assert [e.idempotency_key for e in store.effects(run_id) if e.status != EffectStatus.COMMITTED] == []
            assert run.lease_owner is None
        provider = get_log(services.url)
        assert len(provider["by_subject"]) == 2 * RUNS and set(provider["by_subject"].values()) == {1}
        assert set(provider["effective"].values()) == {1}
        print(f"{len(dropped)} commits answered by a dropped connection over {RUNS} runs: "
              f"0 duplicate effects, 0 lost leases, 0 failed runs")
    finally:
        if worker is not None:
            worker.stop()
        store.close()
        client.close()


class TransitionDropper(SqlStore):
    """A store whose committed run transitions are, half the time, answered by a lost connection."""

    def __init__(self, url: str, seed: int) -> None:
        super().__init__(url)
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.dropped: list[tuple[str, RunStatus]] = []

    def commit(self, lease: Lease, batch: Batch) -> RunRecord | None:
        record = super().commit(lease, batch)  # durable from here on
        status = None if batch.run is None else batch.run.status
        if status is not None:
            with self.lock:
                drop = self.rng.random() < 0.5
                if drop:
                    self.dropped.append((lease.run_id, status))
            if drop:
                raise ConnectionDropped("after_commit", f"{lease.run_id}->{status.value}")
        return record


def test_a_lost_answer_to_a_run_transition_is_found_not_redone(store_url: str, tmp_path: Path,
                                                               services: FakeServices,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    trace = tmp_path / "trace.log"
    client = Client(store_url)
    store = TransitionDropper(store_url, seed=20261126)
    runs: list[str] = []
    try:
        short = [client.submit(flows.short, fleet_input(n, services, trace)).run_id for n in range(TRANSITION_RUNS)]
        asked = [client.submit(flows.approval, fleet_input(TRANSITION_RUNS + n, services, trace)).run_id
                 for n in range(TRANSITION_RUNS)]
        runs = short + asked
        caplog.set_level(logging.WARNING, logger="raysaga.worker")

        def at_rest(run_id: str, statuses: tuple[RunStatus, ...]) -> bool:
            run = store.get_run(run_id)
            return run.status in statuses and run.lease_owner is None

        # The decisions are made while no driver holds the runs (the worker stopped): a decision
        # made while a driver holds the run is lost (tests/chaos/test_known_bugs.py). A worker
        # stopping may hand a run back mid-drive (a re-drive after a dropped answer): go again.
        firsts: list[Worker] = []
        while not all(at_rest(r, (RunStatus.WAITING_HUMAN,)) for r in asked):
            assert len(firsts) < 5, "the runs never all rested waiting for their decision with no worker on them"
            with fleet_worker(store) as first:
                firsts.append(first)
                wait_until(lambda: all(at_rest(r, (RunStatus.COMPLETED,)) for r in short)
                           and all(at_rest(r, (RunStatus.WAITING_HUMAN,)) for r in asked), timeout=240,
                           what="the short runs completed, the others waiting for a decision", interval=0.1)
        for run_id in asked:
            client.approve(run_id, "review", by="alice")
        with fleet_worker(store) as second:
            wait_until(lambda: all(at_rest(r, (RunStatus.COMPLETED,)) for r in asked), timeout=240,
                       what="every run completed", interval=0.1)

        kinds = {status for _, status in store.dropped}
        assert {RunStatus.RUNNING, RunStatus.WAITING_HUMAN, RunStatus.COMPLETED} <= kinds, kinds
        assert [w.counts.failed for w in [*firsts, second]] == [0] * (len(firsts) + 1)
        assert not [r for r in caplog.records if "lease" in r.getMessage()]
        for n, run_id in enumerate(runs):
            run = store.get_run(run_id)
            assert run.status == RunStatus.COMPLETED and run.lease_owner is None, (run_id, run.status_reason)
            if n < TRANSITION_RUNS:
                assert run.output == flows.golden(n), (run_id, run.output)
            assert [e.idempotency_key for e in store.effects(run_id) if e.status != EffectStatus.COMMITTED] == []
            assert [e.data["by"] for e in store.events(run_id) if e.kind == "decision"] == \
                ([] if n < TRANSITION_RUNS else ["alice"])
        # every dropped transition is durable: the run's events hold it
        for run_id, status in store.dropped:
            assert f"run_{status.value}" in [e.kind for e in store.events(run_id)], \
                (run_id, status, [e.kind for e in store.events(run_id)])
        provider = get_log(services.url)
        assert len(provider["by_subject"]) == 3 * TRANSITION_RUNS and set(provider["by_subject"].values()) == {1}
        assert set(provider["effective"].values()) == {1}
        print(f"{len(store.dropped)} run transitions answered by a dropped connection over {len(runs)} runs "
              f"({sorted(kinds)}): 0 duplicate effects, 0 lost leases, 0 failed runs")
    except AssertionError as exc:  # say which runs are not done, and how
        stuck = [(r.run_id, r.status.value, r.lease_owner, r.status_reason,
                  [e.kind for e in store.events(r.run_id)][-8:])
                 for r in map(store.get_run, runs) if r.status != RunStatus.COMPLETED]
        raise AssertionError(f"{exc}\nnot completed: {stuck}\ndropped: {store.dropped}") from exc
    finally:
        store.close()
        client.close()


@contextmanager
def fleet_worker(store: SqlStore) -> Iterator[Worker]:
    """A worker on ``store`` in a thread, stopped (and joined) on exit."""
    worker = Worker([flows.short, flows.approval], store, concurrency=2, executor="inline", poll=0.02,
                    options=RunOptions(lease_ttl=5.0))
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        yield worker
    finally:
        worker.stop()
        thread.join(timeout=60)
    assert not thread.is_alive()
