"""A worker's suspects, runs of other code, and its waits (stop 43 review), on SQLite and PostgreSQL.

- A suspect run (its last driver died) is driven alone until it commits an outcome of its own: the
  first commit after its restore (its step's ``running`` row) looked like one when the run had a
  completed step (``Progress`` started from 0), and the worker claimed again beside it.
- With ``--executor ray`` a suspect is driven beside the other runs: a step dies in a Ray worker,
  not in the driver, so handing the others back only cancelled their steps in flight.
- A run whose stored outputs do not read as this worker's types (same definition, other types) is
  released and left for a worker whose code fits: it was counted a failed drive, and parked
  ``failed`` after three. It is not claimed again (it came first at every poll).
- Runs of a definition the worker does not have are named once, not per poll.
- A count of failed drives in a row starts over when another driver made progress since.
- ``poll`` above ``threading.TIMEOUT_MAX`` no longer kills the worker (``Event.wait`` raised).
"""

from __future__ import annotations

import logging
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from raysaga import Client, Workflow
from raysaga.orchestrator import crash_loop
from raysaga.orchestrator.worker import MAX_FAILED_DRIVES, Worker
from raysaga.state import Batch, NewEvent, NodeStatus, NodeWrite, RunStatus, RunUpdate, SqlStore
from raysaga.state.claims import Claim
from tests.support.crash_driver import wait_until

held = threading.Event()
seen: list[object] = []  # what the suspect's step saw of its worker as it started
current: list[Worker] = []

suspect = Workflow("stop43_suspect", version="1")


@suspect.step()
def prep(input: dict[str, Any]) -> int:
    return 1


@suspect.step(effect=True)
def charge(input: dict[str, Any], prep: int) -> int:
    seen.append(current[0]._alone if current else None)
    held.wait(60)
    return prep + 1


plain = Workflow("stop43_plain", version="1")


@plain.step()
def only(input: dict[str, Any]) -> str:
    return "ok"


@pytest.fixture
def store(fleet_url: str) -> Iterator[SqlStore]:
    held.clear()
    seen.clear()
    current.clear()
    opened = SqlStore(fleet_url)
    yield opened
    held.set()
    opened.close()


def _started(worker: Worker) -> threading.Thread:
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    return thread


def _stopped(worker: Worker, thread: threading.Thread) -> None:
    held.set()
    worker.stop()
    thread.join(timeout=60)
    assert not thread.is_alive()


def _idle_scans(worker: Worker, count: int) -> None:
    """Wait until the worker looked ``count`` more times for runs to take over (each idle poll)."""
    scans = {worker._next_scan}

    def more() -> bool:
        scans.add(worker._next_scan)
        return len(scans) > count

    wait_until(more, timeout=60, what=f"{count} more idle scans")


def _kinds(store: SqlStore, run_id: str) -> list[str]:
    return [e.kind for e in store.events(run_id)]


def test_a_suspect_stays_alone_until_it_commits_an_outcome_of_its_own(store: SqlStore) -> None:
    """The run had ``prep`` completed when its driver died; the worker that takes it over starts
    ``charge`` alone, and its ``running`` row (the first commit after the restore) is no outcome."""
    tag = uuid.uuid4().hex[:8]
    with Client(store) as client:
        run_id = client.submit(suspect, {}, run_id=f"suspect-{tag}").run_id
    lease = store.claim(run_id, "dead-0", 60)
    store.commit(lease, Batch(run=RunUpdate(status=RunStatus.RUNNING), nodes=[
        NodeWrite(node_id="prep", status=NodeStatus.COMPLETED, attempt=1, output=1, finished_at=time.time())],
        events=[NewEvent(kind="node_completed", node_id="prep")]))
    store.claim(run_id, "dead-1", -1.0, take_from="dead-0")  # that driver died too: a suspect, claimable
    worker = Worker([suspect, plain], store, concurrency=2, executor="inline", poll=0.05)
    current.append(worker)
    thread = _started(worker)
    try:
        wait_until(lambda: seen, timeout=60, what="the suspect's charge to start")
        assert seen == [run_id], "the suspect was no longer alone before any outcome of its own"
        held.set()
        wait_until(lambda: store.get_run(run_id).status == RunStatus.COMPLETED, timeout=60, what="the suspect done")
        with Client(store) as client:  # then the worker claims again
            other = client.submit(plain, {}, run_id=f"plain-{tag}").run_id
        wait_until(lambda: store.get_run(other).status == RunStatus.COMPLETED, timeout=60, what="the plain run")
    finally:
        _stopped(worker, thread)
    assert crash_loop.ALONE in _kinds(store, run_id)
    assert worker._alone is None


def test_a_worker_s_idle_scan_names_runs_of_another_definition_once(
        store: SqlStore, caplog: pytest.LogCaptureFixture) -> None:
    old = Workflow("stop43_versions", version="1")

    @old.step()
    def step(input: dict[str, Any]) -> int:
        return 1

    new = Workflow("stop43_versions", version="2")
    new.step()(step)
    assert old.definition_hash != new.definition_hash
    tag = uuid.uuid4().hex[:8]
    with Client(store) as client:
        ids = [client.submit(old, {}, run_id=f"old-{tag}-{i}").run_id for i in range(2)]
    caplog.set_level(logging.WARNING, logger="raysaga.worker")
    worker = Worker([new], store, concurrency=1, executor="inline", poll=0.05)
    thread = _started(worker)
    try:
        def told() -> list[logging.LogRecord]:
            return [r for r in caplog.records if "another definition" in r.getMessage()]

        wait_until(told, timeout=60, what="the worker to name the runs it cannot drive")
        _idle_scans(worker, 3)
    finally:
        _stopped(worker, thread)
    assert len(told()) == 1
    message = told()[0].getMessage()
    assert "2 run(s) of workflow 'stop43_versions'" in message and old.definition_hash[:12] in message
    assert "(version '1', hash" in message and "it has version '2'" in message and min(ids) in message
    assert all(store.get_run(i).status == RunStatus.PENDING for i in ids)  # left for a worker with that code


def _typed(charge_type: type) -> Workflow:
    """The same definition (name, version, steps) with ``charge`` returning, ``finish`` reading another type."""
    wf = Workflow("stop43_typed", version="1")

    @wf.step()
    def prepare(input: dict[str, Any]) -> int:
        return 7

    if charge_type is str:
        @wf.step()
        def charge(input: dict[str, Any], prepare: int) -> str:
            return f"ch-{prepare}"

        @wf.step()
        def finish(charge: str) -> str:
            return charge + "-ok"
    else:
        @wf.step()
        def charge(input: dict[str, Any], prepare: int) -> int:  # type: ignore[misc]
            return prepare

        @wf.step()
        def finish(charge: int) -> str:  # type: ignore[misc]
            return f"{charge}-ok"
    return wf


def _handed_back_by_v1(store: SqlStore, v1: Workflow, tag: str) -> str:
    """A run of ``v1`` whose worker ran prepare and charge (``charge`` stored as a str), then handed it back."""
    with Client(store) as client:
        misfit = client.submit(v1, {}, run_id=f"a-misfit-{tag}").run_id
    lease = store.claim(misfit, "v1-worker", 60)
    now = time.time()
    store.commit(lease, Batch(run=RunUpdate(status=RunStatus.RUNNING), nodes=[
        NodeWrite(node_id="prepare", status=NodeStatus.COMPLETED, attempt=1, output=7, finished_at=now),
        NodeWrite(node_id="charge", status=NodeStatus.COMPLETED, attempt=1, output="ch-7", finished_at=now)],
        events=[NewEvent(kind="node_completed", node_id="prepare"), NewEvent(kind="node_completed", node_id="charge")]))
    store.release(lease)
    return misfit


def test_a_run_this_code_s_types_do_not_fit_is_left_for_a_worker_whose_code_does(store: SqlStore) -> None:
    v1, v4 = _typed(str), _typed(int)
    assert v1.definition_hash == v4.definition_hash  # only the types differ
    tag = uuid.uuid4().hex[:8]
    misfit = _handed_back_by_v1(store, v1, tag)
    with Client(store) as client:
        fresh = client.submit(v4, {}, run_id=f"b-fresh-{tag}").run_id  # newer: claimed after the misfit
    worker = Worker([v4], store, concurrency=1, executor="inline", poll=0.05)
    thread = _started(worker)
    try:
        wait_until(lambda: store.get_run(fresh).status == RunStatus.COMPLETED, timeout=60,
                   what="the run this code fits, behind the one it does not")
        _idle_scans(worker, 3)
    finally:
        _stopped(worker, thread)
    run = store.get_run(misfit)
    assert run.status == RunStatus.RUNNING and run.lease_owner is None, run.status_reason
    assert worker.counts.failed == 0 and worker.counts.completed == 1
    claims = [e.data.get("owner") for e in store.events(misfit) if e.kind == "lease_claimed"]
    assert len(claims) == 2, claims  # the v1 worker's, and this worker's one: not claimed again for a while
    fits = Worker([v1], store, concurrency=1, executor="inline", poll=0.05)
    thread = _started(fits)
    try:
        wait_until(lambda: store.get_run(misfit).status == RunStatus.COMPLETED, timeout=60,
                   what="a worker with the run's own code to complete it")
    finally:
        _stopped(fits, thread)
    assert store.get_run(misfit).output == {"finish": "ch-7-ok"}


def test_failed_drives_in_a_row_start_over_after_another_driver_s_progress(store: SqlStore) -> None:
    tag = uuid.uuid4().hex[:8]
    with Client(store) as client:
        run_id = client.submit(suspect, {}, run_id=f"flaky-{tag}").run_id
    worker = Worker([suspect], store, concurrency=1, executor="inline", poll=0.05)

    def failed_drive() -> None:
        lease = store.claim(run_id, f"me-{uuid.uuid4().hex[:6]}", 30)
        store.release(lease)  # (the driver let go as it failed)
        worker._drive_failed(Claim(lease=lease, workflow=suspect.name, reason="takeover", latency=0.0,
                                   status=RunStatus.RUNNING), RuntimeError("a bug"))

    for _ in range(MAX_FAILED_DRIVES - 1):
        failed_drive()
    other = store.claim(run_id, "another-worker", 30)  # it drove the run on: prep's outcome
    store.commit(other, Batch(run=RunUpdate(status=RunStatus.RUNNING), nodes=[
        NodeWrite(node_id="prep", status=NodeStatus.COMPLETED, attempt=1, output=1, finished_at=time.time())],
        events=[NewEvent(kind="node_completed", node_id="prep")]))
    store.release(other)
    failed_drive()
    assert store.get_run(run_id).status == RunStatus.RUNNING  # one failure since the progress: not parked
    for _ in range(MAX_FAILED_DRIVES - 1):
        failed_drive()
    parked = store.get_run(run_id)
    assert parked.status == RunStatus.FAILED and f"parked after {MAX_FAILED_DRIVES} drives" in (
        parked.status_reason or "")


def _waiting(thread: threading.Thread) -> bool:
    """Whether ``thread`` is blocked in a wait of its slot loop (not failed, not busy)."""
    frame = sys._current_frames().get(thread.ident or -1)
    names = []
    while frame is not None:
        names.append(frame.f_code.co_name)
        frame = frame.f_back
    return "_slot" in names and "wait" in names


def test_a_poll_beyond_threading_s_timeout_max_only_waits(store: SqlStore) -> None:
    worker = Worker([plain], store, concurrency=1, executor="inline", poll=1e12)
    thread = _started(worker)
    try:
        wait_until(lambda: worker.failure is not None or worker._next_scan > 0, timeout=60, what="a first poll")
        slots = [t for t in threading.enumerate() if t.name == "raysaga-worker-0"]
        wait_until(lambda: worker.failure is not None or not slots or _waiting(slots[0]), timeout=60,
                   what="the slot to wait for its next poll")
        assert worker.failure is None, worker.failure
    finally:
        worker.stop()
        thread.join(timeout=60)
    assert not thread.is_alive()


@pytest.mark.parametrize("poll", [float("nan"), -1.0, 0, "1", True])
def test_a_worker_refuses_a_poll_that_is_not_a_positive_number(sqlite_url: str, poll: Any) -> None:
    """The second review: ``Worker(poll=nan)`` never slept between looks, ``poll=-1`` spun; the CLI
    refused them, the Python API did not."""
    from raysaga.errors import UserError

    wf = Workflow("poll43", version="1")

    @wf.step()
    def only() -> int:
        return 1

    store = SqlStore(sqlite_url)
    try:
        with pytest.raises(UserError, match="poll must be a number of seconds > 0"):
            Worker([wf], store, executor="inline", poll=poll)
    finally:
        store.close()


def test_a_skipped_run_is_looked_at_again(store: SqlStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """The second review: a run skipped as unfit stayed skipped for the worker's life, so in a
    rolling deploy (the old code ran the step the new code cannot read, the rest fits) nothing
    drove it until the worker restarted. The skip now lasts ``UNFIT_RECHECK_S``."""
    monkeypatch.setattr("raysaga.orchestrator.worker_runs.UNFIT_RECHECK_S", 0.2)
    v1, v4 = _typed(str), _typed(int)
    misfit = _handed_back_by_v1(store, v1, uuid.uuid4().hex[:8])
    worker = Worker([v4], store, concurrency=1, executor="inline", poll=0.05)
    thread = _started(worker)
    try:
        wait_until(lambda: len([e for e in store.events(misfit) if e.kind == "lease_claimed"]) >= 3, timeout=60,
                   what="the skipped run looked at again")
    finally:
        _stopped(worker, thread)
    run = store.get_run(misfit)
    assert run.status == RunStatus.RUNNING and worker.counts.failed == 0, run.status_reason
