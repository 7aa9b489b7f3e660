"""The store under real concurrency: separate OS processes racing on one database.

Workers are started with the ``spawn`` context and run the source in ``WORKER``. (A test
module imported with ``--import-mode=importlib`` cannot be re-imported by a spawned child,
so the child runs ``exec(WORKER, namespace)``; ``exec`` pickles by reference, and the
namespace carries the URL, the ``multiprocessing.Barrier`` and the result ``Queue``.)
Every racing round starts when both workers pass the barrier; nothing waits on a clock.
Each worker reports one tuple per operation on the queue, and a traceback if it crashes.
"""

from __future__ import annotations

import multiprocessing
import queue
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from raysaga.state import NewRun, NodeStatus, RunStatus, SqlStore

CTX = multiprocessing.get_context("spawn")
RESULT_TIMEOUT = 120.0

WORKER = r'''
import traceback

from raysaga.errors import ConcurrencyConflict, LeaseHeldError
from raysaga.state import (
    Batch, EffectStatus, EffectWrite, NewEvent, NodeStatus, NodeWrite, RunStatus, RunUpdate, SqlStore,
)


def race_transition(store, run_ids):
    for run_id in run_ids:
        barrier.wait(timeout=60)
        try:
            rec = store.transition(run_id, 0, RunStatus.RUNNING, reason=name)
            out.put((name, run_id, "won", rec.version))
        except ConcurrencyConflict as exc:
            out.put((name, run_id, "conflict", str(exc)))


def race_claim(store, run_ids):
    for run_id in run_ids:
        barrier.wait(timeout=60)
        try:
            lease = store.claim(run_id, name, 60.0)
            out.put((name, run_id, "won", lease.fence))
        except LeaseHeldError as exc:
            out.put((name, run_id, "held", str(exc)))


def write_batches(store, run_id, n):
    lease = store.claim(run_id, name, 120.0)
    store.commit(lease, Batch(run=RunUpdate(status=RunStatus.RUNNING)))
    barrier.wait(timeout=60)
    for i in range(n):
        store.commit(lease, Batch(
            nodes=[NodeWrite(node_id=f"n{i}", status=NodeStatus.COMPLETED, attempt=1, output={"i": i})],
            effects=[EffectWrite(idempotency_key=f"{run_id}/{i}", node_id=f"n{i}", effect_name="e",
                                 args_digest="0" * 64, status=EffectStatus.PENDING)],
            events=[NewEvent(kind="node_completed", node_id=f"n{i}", data={"by": name})],
            run=RunUpdate(tokens_delta=1),
        ))
    out.put((name, run_id, "done", n))


store = None
try:
    store = SqlStore(url, migrate_schema=False)
    globals()[task](store, **kwargs)
except BaseException:
    out.put((name, None, "crash", traceback.format_exc()))
    raise
finally:
    if store is not None:
        store.close()
'''


class Workers:
    """Spawned workers sharing one barrier and one result queue."""

    def __init__(self, procs: list[Any], out: Any) -> None:
        self.procs = procs
        self.out = out

    def collect(self, n: int) -> list[tuple[Any, ...]]:
        """The next ``n`` results; fails at once if a worker crashes or dies without reporting."""
        results: list[tuple[Any, ...]] = []
        deadline = time.monotonic() + RESULT_TIMEOUT
        while len(results) < n:
            try:
                item = self.out.get(timeout=0.5)
            except queue.Empty:
                dead = [p for p in self.procs if not p.is_alive()]
                if dead and (len(dead) == len(self.procs) or any(p.exitcode != 0 for p in dead)):
                    pytest.fail(f"worker(s) exited ({[p.exitcode for p in dead]}) after {len(results)} of "
                                f"{n} results: {results}")
                if time.monotonic() > deadline:
                    pytest.fail(f"workers reported {len(results)} of {n} results in {RESULT_TIMEOUT}s: {results}")
                continue
            assert item[2] != "crash", f"{item[0]} crashed:\n{item[3]}"
            results.append(item)
        return results


@contextmanager
def workers(url: str, task: str, per_worker: list[dict[str, Any]]) -> Iterator[Workers]:
    """Start one spawned worker per kwargs dict, all sharing a barrier and a result queue."""
    barrier = CTX.Barrier(len(per_worker))
    out = CTX.Queue()
    procs = []
    try:
        for i, kwargs in enumerate(per_worker):
            namespace = {"__name__": "raysaga_test_worker", "url": url, "task": task, "kwargs": kwargs,
                         "name": f"worker-{i}", "barrier": barrier, "out": out}
            proc = CTX.Process(target=exec, args=(WORKER, namespace), daemon=True)
            proc.start()
            procs.append(proc)
        yield Workers(procs, out)
        for proc in procs:
            proc.join(timeout=60)
            assert proc.exitcode == 0, f"{proc.name} exited with {proc.exitcode}"
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.terminate()
                proc.join(timeout=10)


def make_runs(store: SqlStore, n: int) -> list[str]:
    ids = []
    for _ in range(n):
        run_id = f"race-{uuid.uuid4().hex[:12]}"
        store.create_run(NewRun(run_id=run_id, workflow_name="wf", workflow_version="1",
                                definition_hash="d" * 64, trace_id=uuid.uuid4().hex))
        ids.append(run_id)
    return ids


ROUNDS = 20


def test_cas_transition_race_has_exactly_one_winner(store: SqlStore, store_url: str) -> None:
    run_ids = make_runs(store, ROUNDS)

    with workers(store_url, "race_transition", [{"run_ids": run_ids}] * 2) as w:
        results = w.collect(2 * ROUNDS)

    by_run: dict[str, list[tuple[Any, ...]]] = {}
    for item in results:
        by_run.setdefault(item[1], []).append(item)
    assert set(by_run) == set(run_ids)
    for run_id, items in by_run.items():
        outcomes = Counter(i[2] for i in items)
        assert outcomes == Counter({"won": 1, "conflict": 1}), (run_id, items)
        [winner] = [i for i in items if i[2] == "won"]
        [loser] = [i for i in items if i[2] == "conflict"]
        assert winner[0] != loser[0]
        assert winner[3] == 1
        rec = store.get_run(run_id)
        assert (rec.status, rec.version, rec.status_reason) == (RunStatus.RUNNING, 1, winner[0])
        assert [(e.seq, e.kind) for e in store.events(run_id)] == [(1, "run_created"), (2, "run_running")]


def test_claim_race_grants_exactly_one_lease(store: SqlStore, store_url: str) -> None:
    run_ids = make_runs(store, ROUNDS)

    with workers(store_url, "race_claim", [{"run_ids": run_ids}] * 2) as w:
        results = w.collect(2 * ROUNDS)

    by_run: dict[str, list[tuple[Any, ...]]] = {}
    for item in results:
        by_run.setdefault(item[1], []).append(item)
    assert set(by_run) == set(run_ids)
    for run_id, items in by_run.items():
        assert Counter(i[2] for i in items) == Counter({"won": 1, "held": 1}), (run_id, items)
        [winner] = [i for i in items if i[2] == "won"]
        [loser] = [i for i in items if i[2] == "held"]
        assert winner[3] == 1
        assert winner[0] in loser[3]  # the refusal names the driver that holds the run
        rec = store.get_run(run_id)
        assert (rec.lease_owner, rec.fence) == (winner[0], 1)
        events = store.events(run_id)
        assert [(e.seq, e.kind) for e in events] == [(1, "run_created"), (2, "lease_claimed")]
        assert events[1].data == {"owner": winner[0], "fence": 1}


BATCHES = 200


def test_concurrent_writers_on_different_runs_lose_nothing(store: SqlStore, store_url: str) -> None:
    run_ids = make_runs(store, 2)

    with workers(store_url, "write_batches", [{"run_id": r, "n": BATCHES} for r in run_ids]) as w:
        results = w.collect(2)

    assert sorted((r[1], r[2], r[3]) for r in results) == sorted((r, "done", BATCHES) for r in run_ids)
    spans = []
    for run_id in run_ids:
        rec = store.get_run(run_id)
        assert (rec.status, rec.tokens_used, rec.fence) == (RunStatus.RUNNING, BATCHES, 1)
        nodes = store.nodes(run_id)
        assert sorted(n.node_id for n in nodes) == sorted(f"n{i}" for i in range(BATCHES))
        assert {n.status for n in nodes} == {NodeStatus.COMPLETED}
        assert {n.output["i"] for n in nodes} == set(range(BATCHES))
        assert sorted(e.idempotency_key for e in store.effects(run_id)) == sorted(
            f"{run_id}/{i}" for i in range(BATCHES))
        events = store.events(run_id)
        # run_created, lease_claimed, run_running, then one event per batch, gap-free
        assert [e.seq for e in events] == list(range(1, BATCHES + 4))
        assert rec.event_seq == BATCHES + 3
        assert [e.kind for e in events[:3]] == ["run_created", "lease_claimed", "run_running"]
        assert [e.node_id for e in events[3:]] == [f"n{i}" for i in range(BATCHES)]
        spans.append((events[3].at, events[-1].at))
    # the two writers really wrote at the same time (their commit windows overlap)
    assert max(start for start, _ in spans) < min(end for _, end in spans), spans
