"""Migration 0013 (``raysaga_runs.max_driver_deaths``), up and down, on SQLite and PostgreSQL.

A schema-12 store holding runs is upgraded in place: its runs read back with no limit of their
own (NULL: their drivers' applies) and a new run records one. The downgrade drops the column and
keeps every run; upgrading again gives the column back, NULL (the limits it held are gone).
"""

from __future__ import annotations

import uuid

from sqlalchemy import Engine, inspect, text

from raysaga.state import NewRun, SqlStore
from raysaga.state.engine import make_engine
from raysaga.state.schema import SCHEMA_VERSION, runs
from tests.support.old_schema import downgrade, store_at

_INSERT_RUN = ("INSERT INTO raysaga_runs (run_id, workflow_name, workflow_version, definition_hash, status, version, "
               "fence, event_seq, input, retries_used, tokens_used, cost_used, trace_id, created_at, updated_at, "
               "queue, labels) VALUES (:id, 'wf', '1', :h, :status, 2, 1, 3, :inp, 0, 0, 0.0, 't', 1.0, 2.0, :q, "
               "{labels})")


def _insert(engine: Engine, run_id: str, status: str, queue: str | None) -> None:
    labels = "CAST(:labels AS JSON)" if engine.dialect.name == "postgresql" else ":labels"
    with engine.begin() as conn:
        conn.execute(text(_INSERT_RUN.format(labels=labels)), {
            "id": run_id, "h": "d" * 64, "status": status, "inp": '{"n": 1}', "q": queue, "labels": '{"team": "a"}'})


def _new(run_id: str, deaths: int | None) -> NewRun:
    return NewRun(run_id=run_id, workflow_name="wf", workflow_version="1", definition_hash="d" * 64,
                  trace_id=uuid.uuid4().hex, max_driver_deaths=deaths)


def _columns(engine: Engine) -> set[str]:
    return {c["name"] for c in inspect(engine).get_columns("raysaga_runs")}


def _state(engine: Engine) -> tuple[int, list[str]]:
    """(raysaga's schema version, alembic's revisions)."""
    with engine.connect() as conn:
        version = conn.execute(text("SELECT version FROM raysaga_schema WHERE id = 1")).scalar_one()
        return version, [r[0] for r in conn.execute(text("SELECT version_num FROM alembic_version"))]


def _schema_12(engine: Engine) -> None:
    """Make the store ``store_at(url, "0012")`` built exactly what a raysaga of schema 12 left:
    migration 0001 builds version 1 from ``schema.py`` minus ``v0001_initial.ADDED_LATER``, and
    until that set names ``max_driver_deaths`` it creates the column already (0013 then finds it
    and adds nothing: a new store is right either way, but not the schema-12 store this needs)."""
    if "max_driver_deaths" in _columns(engine):
        with engine.begin() as conn:
            conn.exec_driver_sql("ALTER TABLE raysaga_runs DROP COLUMN max_driver_deaths")
    assert "max_driver_deaths" not in _columns(engine)


def test_a_schema_12_store_with_runs_is_upgraded_and_its_runs_have_no_limit_of_their_own(empty_url: str) -> None:
    with store_at(empty_url, "0012") as engine:
        _schema_12(engine)
        _insert(engine, "old-queued", "pending", "default")
        _insert(engine, "old-done", "completed", None)
        assert _state(engine) == (12, ["0012"])

    store = SqlStore(empty_url)
    try:
        assert SCHEMA_VERSION == 15 and _state(store.engine) == (15, ["0015"])
        assert _columns(store.engine) == {c.name for c in runs.columns}
        for run_id, status in (("old-queued", "pending"), ("old-done", "completed")):
            old = store.get_run(run_id)
            assert (old.status.value, old.version, old.input, old.labels) == (status, 2, {"n": 1}, {"team": "a"})
            assert old.max_driver_deaths is None
        assert store.create_run(_new("new-own", 5)).max_driver_deaths == 5
        assert store.get_run("new-own").max_driver_deaths == 5
        store.create_run(_new("new-plain", None))
        assert store.get_run("new-plain").max_driver_deaths is None
    finally:
        store.close()


def test_the_downgrade_drops_the_column_and_keeps_the_runs(empty_url: str) -> None:
    store = SqlStore(empty_url)
    try:
        store.create_run(_new("own", 5))
        store.create_run(_new("plain", None))
    finally:
        store.close()

    downgrade(empty_url, "0012")
    engine = make_engine(empty_url)
    try:
        assert _state(engine) == (12, ["0012"])
        assert "max_driver_deaths" not in _columns(engine)
        with engine.connect() as conn:
            kept = conn.execute(text("SELECT run_id, status, version FROM raysaga_runs ORDER BY run_id")).all()
        assert [tuple(r) for r in kept] == [("own", "pending", 0), ("plain", "pending", 0)]
    finally:
        engine.dispose()

    again = SqlStore(empty_url)  # opening it upgrades it again: the column is back, empty
    try:
        assert _state(again.engine) == (15, ["0015"])
        assert [again.get_run(r).max_driver_deaths for r in ("own", "plain")] == [None, None]
        assert again.create_run(_new("after", 2)).max_driver_deaths == 2
    finally:
        again.close()
