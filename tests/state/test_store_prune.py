"""Retention: ``prune`` deletes old runs at rest with all their rows and unshared blobs, in batches,
and never touches a run that is still going (running, waiting, compensating) or recent.

Each test gets a database of its own (a SQLite file; a fresh PostgreSQL database), so the
counts are exact.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select, update

from raysaga.errors import UserError
from raysaga.state import (
    Batch,
    EffectStatus,
    EffectWrite,
    NewEvent,
    NewRun,
    NodeStatus,
    NodeWrite,
    RunStatus,
    RunUpdate,
    SqlStore,
    jsoncodec,
)
from raysaga.state.pruning import prune
from raysaga.state.schema import blobs, effects, events, memory, nodes, runs, signals
from tests.support.postgres import drop_pg_database, make_pg_database

DAY = 86_400.0
PATHS = {
    RunStatus.COMPLETED: [RunStatus.RUNNING, RunStatus.COMPLETED],
    RunStatus.FAILED: [RunStatus.RUNNING, RunStatus.FAILED],
    RunStatus.CANCELLED: [RunStatus.CANCELLED],
    RunStatus.COMPENSATED: [RunStatus.RUNNING, RunStatus.COMPENSATING, RunStatus.COMPENSATED],
    RunStatus.COMPENSATION_FAILED: [RunStatus.RUNNING, RunStatus.COMPENSATING, RunStatus.COMPENSATION_FAILED],
    RunStatus.RUNNING: [RunStatus.RUNNING],
    RunStatus.WAITING_HUMAN: [RunStatus.RUNNING, RunStatus.WAITING_HUMAN],
    RunStatus.COMPENSATING: [RunStatus.RUNNING, RunStatus.COMPENSATING],
    RunStatus.PENDING: [],
}


@pytest.fixture(params=["sqlite", "postgres"])
def fresh(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SqlStore]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'prune.db'}"
        store = SqlStore(url)
        yield store
        store.close()
        return
    base = request.getfixturevalue("pg_base_url")
    url = make_pg_database(base)
    store = SqlStore(url)
    try:
        yield store
    finally:
        store.close()
        drop_pg_database(base, url)


def blob(tag: str) -> tuple[str, bytes]:
    data = jsoncodec.dumps({"blob": tag, "pad": "p" * 100}).encode()
    return jsoncodec.digest(data), data


def make(store: SqlStore, status: RunStatus, *, age_days: float, shared: tuple[str, bytes] | None = None) -> str:
    """A run in ``status`` with 2 nodes (one holding its own blob, one ``shared`` if given), 1
    effect, 1 signal, 1 memory key and its events, last updated ``age_days`` ago."""
    run_id = f"{status.value}-{uuid.uuid4().hex[:8]}"
    store.create_run(NewRun(run_id=run_id, workflow_name="wf", workflow_version="1", definition_hash="d" * 64,
                            trace_id="t", input={"n": 1}))
    lease = store.claim(run_id, "driver", 30.0)
    own = blob(run_id)
    blobs_ = dict([own] + ([shared] if shared else []))
    node_rows = [NodeWrite(node_id="own", status=NodeStatus.COMPLETED, output_digest=own[0])]
    if shared:
        node_rows.append(NodeWrite(node_id="shared", status=NodeStatus.COMPLETED, output_digest=shared[0]))
    store.commit(lease, Batch(blobs=blobs_, nodes=node_rows, events=[NewEvent(kind="note")],
                              effects=[EffectWrite(idempotency_key=f"k-{run_id}", node_id="own", effect_name="e",
                                                   args_digest="a", status=EffectStatus.COMMITTED, result=1)]))
    store.memory_cas(lease, "key", 1, 0, "w")
    store.send_signal(run_id, "approve", "own")
    for step in PATHS[status]:
        store.commit(lease, Batch(run=RunUpdate(status=step)))
    store.release(lease)
    with store.engine.begin() as conn:
        conn.execute(update(runs).where(runs.c.run_id == run_id).values(updated_at=time.time() - age_days * DAY))
    return run_id


def counts(store: SqlStore) -> dict[str, int]:
    with store.engine.connect() as conn:
        return {t.name: int(conn.execute(select(func.count()).select_from(t)).scalar_one())
                for t in (runs, nodes, events, effects, signals, memory, blobs)}


def run_ids(store: SqlStore) -> set[str]:
    with store.engine.connect() as conn:
        return set(conn.execute(select(runs.c.run_id)).scalars())


def digests(store: SqlStore) -> set[str]:
    with store.engine.connect() as conn:
        return set(conn.execute(select(blobs.c.digest)).scalars())


@pytest.mark.parametrize("batch_size", [500, 1])
def test_prune_deletes_old_runs_at_rest_and_nothing_else(fresh: SqlStore, batch_size: int) -> None:
    shared = blob("shared")
    at_rest = [make(fresh, s, age_days=40) for s in
               (RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.COMPENSATED,
                RunStatus.COMPENSATION_FAILED)]
    old_sharer = make(fresh, RunStatus.COMPLETED, age_days=40, shared=shared)
    going = [make(fresh, s, age_days=40) for s in
             (RunStatus.RUNNING, RunStatus.WAITING_HUMAN, RunStatus.COMPENSATING, RunStatus.PENDING)]
    recent_sharer = make(fresh, RunStatus.COMPLETED, age_days=1, shared=shared)
    kept = set(going) | {recent_sharer}
    before = counts(fresh)
    kept_digests = {blob(r)[0] for r in kept} | {shared[0]}

    dry = fresh.prune(30 * DAY, dry_run=True)
    assert counts(fresh) == before  # a dry run deletes nothing

    report = prune(fresh, 30 * DAY, batch_size=batch_size)
    gone = [*at_rest, old_sharer]
    assert run_ids(fresh) == kept
    assert digests(fresh) == kept_digests  # the shared blob stays: a kept run references it
    after = counts(fresh)
    per_run_events = {r: len(fresh.events(r)) for r in kept}
    assert (report.runs, report.nodes, report.effects, report.signals, report.memory, report.blobs) == (
        len(gone), len(gone) + 1, len(gone), len(gone), len(gone), len(gone))
    assert report.events == before["raysaga_events"] - after["raysaga_events"] > 0
    assert {k: before[k] - after[k] for k in before} == {
        "raysaga_runs": report.runs, "raysaga_nodes": report.nodes, "raysaga_events": report.events,
        "raysaga_effects": report.effects, "raysaga_signals": report.signals, "raysaga_memory": report.memory,
        "raysaga_blobs": report.blobs}
    assert report.model_dump(exclude={"dry_run"}) == dry.model_dump(exclude={"dry_run"}) | {"cutoff": report.cutoff}
    # what stays is whole
    for run_id in kept:
        assert fresh.get_run(run_id).run_id == run_id and len(fresh.nodes(run_id)) >= 1
        assert per_run_events[run_id] >= 1
    assert fresh.load_blobs({shared[0]: "shared"}) == {shared[0]: jsoncodec.loads(shared[1])}
    assert prune(fresh, 30 * DAY).runs == 0  # idempotent


def test_prune_only_the_statuses_asked_for(fresh: SqlStore) -> None:
    done = make(fresh, RunStatus.COMPLETED, age_days=40)
    failed = make(fresh, RunStatus.FAILED, age_days=40)
    report = fresh.prune(30 * DAY, statuses={RunStatus.FAILED})
    assert report.runs == 1 and run_ids(fresh) == {done}
    assert failed not in run_ids(fresh)


@pytest.mark.parametrize("statuses", [{"running"}, {"waiting_human"}, {"bogus"}, set()])
def test_prune_refuses_states_that_are_not_at_rest(fresh: SqlStore, statuses: set[str]) -> None:
    make(fresh, RunStatus.RUNNING, age_days=40)
    before = counts(fresh)
    with pytest.raises(UserError):
        fresh.prune(30 * DAY, statuses=statuses)
    assert counts(fresh) == before


@pytest.mark.parametrize("bad", [{"older_than": -1}, {"older_than": "30d"}, {"batch_size": 0}])
def test_prune_validates_its_arguments(fresh: SqlStore, bad: dict[str, Any]) -> None:
    args: dict[str, Any] = {"older_than": DAY, **bad}
    with pytest.raises(UserError):
        fresh.prune(**args)


def test_older_than_reads_cli_durations() -> None:
    from raysaga.orchestrator.cli_input import parse_duration

    def parse_age(text: str) -> float:
        return parse_duration("--older-than", text)

    assert [parse_age(t) for t in ("30d", "12h", "90m", "45s", "2w", " 1.5D ")] == [
        30 * DAY, 12 * 3600.0, 90 * 60.0, 45.0, 14 * DAY, 1.5 * DAY]
    # a bare number (30 meant seconds: every finished run older than 30 s went) needs its unit
    for bad in ("", "d", "thirty days", "-1d", "nan", "infd", "10", "30"):
        with pytest.raises(UserError):
            parse_age(bad)
