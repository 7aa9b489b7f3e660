"""Migration 0015 (``raysaga_workers``), up and down, on SQLite and PostgreSQL, with runs in the
store: the upgrade adds the empty table and keeps every run as it was (a submitted one is still
claimable), the downgrade drops the table and keeps the runs, and opening the store again
upgrades it again."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, inspect, text

from raysaga.state import RunStatus, SqlStore, WorkerRecord
from raysaga.state.engine import make_engine
from raysaga.state.schema import SCHEMA_VERSION
from tests.support.old_schema import downgrade, store_at
from tests.support.postgres import drop_pg_database, make_pg_database

_INSERT_RUN = ("INSERT INTO raysaga_runs (run_id, workflow_name, workflow_version, definition_hash, status, version, "
               "fence, event_seq, input, retries_used, tokens_used, cost_used, trace_id, created_at, updated_at, "
               "queue) VALUES (:id, 'wf', '1', :h, :status, 2, 1, 3, {inp}, 0, 0, 0.0, 't', 1.0, 2.0, :q)")


@pytest.fixture(params=["sqlite", "postgres"])
def empty(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A database of its own that nothing has migrated yet."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'raysaga.db'}"
        return
    base = str(request.getfixturevalue("pg_base_url"))
    url = make_pg_database(base)
    try:
        yield url
    finally:
        drop_pg_database(base, url)


def _runs(engine: Engine) -> list[tuple[str, str, str | None, str]]:
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT run_id, status, queue, definition_hash FROM raysaga_runs ORDER BY run_id"))
        return [(str(a), str(b), None if c is None else str(c), str(d)) for a, b, c, d in rows]


def _state(engine: Engine) -> tuple[int, list[str], bool]:
    """(raysaga's schema version, alembic's revisions, whether raysaga_workers is there)."""
    with engine.connect() as conn:
        version = conn.execute(text("SELECT version FROM raysaga_schema WHERE id = 1")).scalar_one()
        revisions = [r[0] for r in conn.execute(text("SELECT version_num FROM alembic_version"))]
    return version, revisions, "raysaga_workers" in inspect(engine).get_table_names()


def _schema_14_store(url: str) -> list[tuple[str, str, str | None, str]]:
    with store_at(url, "0014") as engine:
        assert _state(engine) == (14, ["0014"], False)
        cast = "CAST(:inp AS JSON)" if engine.dialect.name == "postgresql" else ":inp"
        with engine.begin() as conn:
            for run_id, status, queue in (("submitted", "pending", "default"), ("done", "completed", None)):
                conn.execute(text(_INSERT_RUN.format(inp=cast)),
                             {"id": run_id, "h": "d" * 64, "status": status, "inp": '{"n": 1}', "q": queue})
        return _runs(engine)


def _record(worker_id: str) -> WorkerRecord:
    now = time.time()
    return WorkerRecord(worker_id=worker_id, host="h", pid=1, started_at=now, beat_at=now, beat_every=1.0,
                        queues=["*"], workflows=[], slots=1, busy=0, raysaga_version="test")


def test_a_schema_14_store_with_runs_is_upgraded_and_keeps_them(empty: str) -> None:
    before = _schema_14_store(empty)
    store = SqlStore(empty)
    try:
        assert SCHEMA_VERSION == 15 and _state(store.engine) == (15, ["0015"], True)
        assert _runs(store.engine) == before
        assert store.get_run("submitted").queue == "default"
        assert [r.run_id for r in store.list_runs(RunStatus.PENDING)] == ["submitted"]
        assert store.workers() == []
        store.worker_register(_record("w1"))
        assert [w.worker_id for w in store.workers()] == ["w1"]
    finally:
        store.close()


def test_the_downgrade_drops_the_table_and_keeps_the_runs(empty: str) -> None:
    before = _schema_14_store(empty)
    store = SqlStore(empty)
    store.worker_register(_record("w1"))
    store.close()
    downgrade(empty, "0014")
    engine = make_engine(empty)
    try:
        assert _state(engine) == (14, ["0014"], False) and _runs(engine) == before
    finally:
        engine.dispose()
    again = SqlStore(empty)
    try:
        assert _state(again.engine) == (15, ["0015"], True) and _runs(again.engine) == before
        assert again.workers() == []
    finally:
        again.close()


def test_a_registering_worker_forgets_the_workers_silent_for_a_week(empty: str) -> None:
    store = SqlStore(empty)
    try:
        old = _record("old").model_copy(update={"beat_at": time.time() - 8 * 24 * 3600})
        recent = _record("recent").model_copy(update={"beat_at": time.time() - 6 * 24 * 3600})
        store.worker_register(old)
        store.worker_register(recent)  # (written with its own beat: "old" was not a week older than it)
        assert {w.worker_id for w in store.workers()} == {"old", "recent"}
        store.worker_register(_record("new"))  # "old" has been silent for 8 days, "recent" for 6
        assert {w.worker_id for w in store.workers()} == {"recent", "new"}
        assert store.worker_beat("new", time.time(), 1) and not store.worker_beat("gone", time.time(), 1)
    finally:
        store.close()
