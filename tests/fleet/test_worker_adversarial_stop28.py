"""Third adversarial round, the worker's claim loop: a run its driver cannot read.

A run whose row cannot be read back (its input column is not JSON: hand-edited, bit rot, a
tool writing the store) makes every driver raise ``CorruptRecordError`` before it drives
anything. The driver releases the lease on the way out, so the run is at once runnable again,
and the slot claims it again with no pause: a worker with ``--poll 60`` claimed it ~360 times a
second, each claim a ``lease_claimed`` event and a fence increment, for ever (1,090 claims in
3 s measured on SQLite; every worker of the fleet does the same on PostgreSQL). The crash-loop
guard does not see it: nothing died, every driver let go. Fixed in ``orchestrator/worker.py``:
after a drive that ends in an error (not an outage, a lost lease or a stop) the slot pauses for
its poll, and after ``MAX_FAILED_DRIVES`` such drives in a row the run is parked ``failed`` with
the error as its reason (``crash_loop.failing_parking``), for an operator to fix and retry.
"""

from __future__ import annotations

import threading
import time
import uuid

from sqlalchemy import func, select, text

from raysaga import Client, RunStatus, Worker, Workflow
from raysaga.orchestrator.worker import MAX_FAILED_DRIVES
from raysaga.state import SqlStore
from raysaga.state.schema import events, runs

wf = Workflow("stop28_unreadable")


@wf.step()
def first(input: int) -> int:
    return input


def _unreadable_run(url: str) -> str:
    """A submitted run whose input column no longer parses (PostgreSQL's json type refuses it)."""
    run_id = f"unreadable-{uuid.uuid4().hex[:8]}"
    with Client(url) as client:
        client.submit(wf, 1, run_id=run_id)
    store = SqlStore(url)
    try:
        with store.engine.begin() as conn:
            conn.execute(text("UPDATE raysaga_runs SET input = :bad WHERE run_id = :run"),
                         {"bad": "{not json", "run": run_id})
    finally:
        store.close()
    return run_id


def _claims(store: SqlStore, run_id: str) -> int:
    with store.reader.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(events).where(
            events.c.run_id == run_id, events.c.kind == "lease_claimed")).scalar_one())


def _status_and_reason(store: SqlStore, run_id: str) -> tuple[str, str | None]:
    """The run's status columns (its row as a whole does not read back: the damaged input)."""
    with store.reader.connect() as conn:
        status, reason = conn.execute(select(runs.c.status, runs.c.status_reason).where(
            runs.c.run_id == run_id)).one()
    return str(status), reason


def test_a_run_no_driver_can_read_is_not_claimed_in_a_tight_loop(sqlite_url: str) -> None:
    run_id = _unreadable_run(sqlite_url)
    store = SqlStore(sqlite_url)
    try:
        worker = Worker([wf], store, concurrency=1, executor="inline", poll=60.0)
        thread = threading.Thread(target=worker.run, daemon=True)
        thread.start()
        try:
            deadline = time.monotonic() + 30
            while worker.counts.failed < 1 and time.monotonic() < deadline:
                time.sleep(0.01)  # polling for the worker's first drive to end
            assert worker.counts.failed >= 1, "the worker never claimed the run"
            time.sleep(1.0)  # an observation window: a poll of 60 s allows no second claim in it
        finally:
            worker.stop()
            thread.join(30)
        claims = _claims(store, run_id)
        assert claims <= 2, f"claimed {claims} times in about a second"
    finally:
        store.close()


def test_a_run_that_fails_every_drive_is_parked_with_the_error(sqlite_url: str) -> None:
    """After MAX_FAILED_DRIVES drives in a row end in the error, the run is ``failed`` naming it
    (an operator fixes the row and retries), and no worker claims it again."""
    run_id = _unreadable_run(sqlite_url)
    store = SqlStore(sqlite_url)
    try:
        worker = Worker([wf], store, concurrency=1, executor="inline", poll=0.05)
        thread = threading.Thread(target=worker.run, daemon=True)
        thread.start()
        try:
            deadline = time.monotonic() + 30
            while _status_and_reason(store, run_id)[0] != RunStatus.FAILED and time.monotonic() < deadline:
                time.sleep(0.01)  # polling the store for the parked run
            status, reason = _status_and_reason(store, run_id)
            assert status == RunStatus.FAILED, status
            claims = _claims(store, run_id)
            time.sleep(0.5)  # ten polls: a parked run is not claimed again
            assert _claims(store, run_id) == claims
        finally:
            worker.stop()
            thread.join(30)
        assert claims == MAX_FAILED_DRIVES + 1  # three drives, then the claim that parks it
        assert worker.counts.failed == MAX_FAILED_DRIVES
        assert reason is not None and "CorruptRecordError" in reason and f"raysaga retry {run_id}" in reason
        assert [e.data["failures"] for e in store.events(run_id) if e.kind == "drive_failed"] == [MAX_FAILED_DRIVES]
    finally:
        store.close()
