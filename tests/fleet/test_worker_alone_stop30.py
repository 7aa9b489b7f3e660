"""A worker drives a suspect run (its last driver died) alone, on SQLite and PostgreSQL.

An in-process ``Worker`` (inline executor, two slots) is driving a plain run whose step is held
(a ``threading.Event`` the test sets) when a suspect becomes claimable: a pending run whose lease
a dead driver never let go. The worker claims it, but must not start it beside the plain run's
step (a death then would count for both: ``tests/fleet/test_crash_neighbours_stop30.py``). It
says the suspect waits (``drive_waits``, naming the run it drives), asks that run's driver to hand
it back at its next step boundary, claims nothing else meanwhile, and starts the suspect alone
(``drive_alone``) once the plain run is handed back; then both complete. The order of the steps
(recorded as they start and end) shows the suspect's step never ran beside the other.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from raysaga import Client, Workflow
from raysaga.orchestrator import crash_loop
from raysaga.orchestrator.worker import HAND_BACK, Worker
from raysaga.state import RunStatus, SqlStore
from tests.support.crash_driver import wait_until

held = threading.Event()
order: list[str] = []

plain = Workflow("stop30_plain", version="1")


@plain.step()
def long_step(input: dict[str, Any]) -> int:
    order.append("plain starts")
    held.wait(60)
    order.append("plain ends")
    return 1


@plain.step()
def next_step(input: dict[str, Any], long_step: int) -> int:
    return long_step + 1


suspect = Workflow("stop30_suspect", version="1")


@suspect.step()
def quick(input: dict[str, Any]) -> str:
    order.append("suspect runs")
    return "ok"


@pytest.fixture
def store(store_url: str) -> Iterator[SqlStore]:
    held.clear()
    order.clear()
    opened = SqlStore(store_url)
    yield opened
    held.set()
    opened.close()


def kinds(store: SqlStore, run_id: str) -> list[str]:
    return [e.kind for e in store.events(run_id)]


def test_a_suspect_waits_for_its_turn_alone_and_the_other_run_is_handed_back(store: SqlStore) -> None:
    tag = uuid.uuid4().hex[:8]
    with Client(store) as client:
        plain_id = client.submit(plain, {}, run_id=f"plain-{tag}").run_id
        suspect_id = client.submit(suspect, {}, run_id=f"suspect-{tag}").run_id
    store.claim(suspect_id, "dead-0", 60)  # a driver holds it: not claimable yet
    worker = Worker([plain, suspect], store, concurrency=2, executor="inline", poll=0.05)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        wait_until(lambda: "plain starts" in order, timeout=60, what="the plain run's step to start")
        # that driver dies: its successor's lease lapses at once, so the worker's free slot claims it
        store.claim(suspect_id, "dead-1", -1.0, take_from="dead-0")
        wait_until(lambda: crash_loop.WAITS in kinds(store, suspect_id), timeout=60,
                   what="the suspect to wait for its turn alone")
        assert "suspect runs" not in order
        held.set()
        wait_until(lambda: store.get_run(suspect_id).status == RunStatus.COMPLETED
                   and store.get_run(plain_id).status == RunStatus.COMPLETED, timeout=60, what="both runs done")
    finally:
        held.set()
        worker.stop()
        thread.join(timeout=60)
    assert not thread.is_alive()
    assert order == ["plain starts", "plain ends", "suspect runs"]
    events = store.events(suspect_id)
    waits = [e.data for e in events if e.kind == crash_loop.WAITS]
    assert waits == [{"abandoned_by": "dead-1", "driving": [plain_id]}]
    assert [e.kind for e in events].index(crash_loop.ALONE) > [e.kind for e in events].index(crash_loop.WAITS)
    handed = [e.data for e in store.events(plain_id) if e.kind == "driver_interrupted"]
    assert [h["signal"] for h in handed] == [HAND_BACK]
    assert store.get_run(plain_id).output == {"next_step": 2}
    assert worker.counts.handed_back == 1 and worker.counts.completed == 2
