"""Schema migrations: from an empty database, idempotent re-open, refusal of a newer schema,
and two processes migrating one fresh database at once.

Each test gets a database of its own: a new SQLite file, or a PostgreSQL database created with
``make_pg_database`` and dropped afterwards.
"""

from __future__ import annotations

import multiprocessing
import queue
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, event, inspect, select, text, update

from raysaga.errors import SchemaVersionError
from raysaga.state import NewRun, SqlStore, migrate
from raysaga.state.engine import make_engine
from raysaga.state.schema import SCHEMA_VERSION, metadata, runs, schema_info
from tests.support.old_schema import store_at
from tests.support.postgres import drop_pg_database, make_pg_database

CTX = multiprocessing.get_context("spawn")
TABLES = {"raysaga_schema", "raysaga_runs", "raysaga_nodes", "raysaga_effects", "raysaga_events",
          "raysaga_blobs", "raysaga_signals"}


@contextmanager
def fresh_databases(request: pytest.FixtureRequest, tmp_path: Path, n: int) -> Iterator[list[str]]:
    if request.param == "sqlite":
        yield [f"sqlite:///{tmp_path / f'fresh{i}' / 'raysaga.db'}" for i in range(n)]
        return
    base = request.getfixturevalue("pg_base_url")
    urls: list[str] = []
    try:
        for _ in range(n):
            urls.append(make_pg_database(base))
        yield urls
    finally:
        for url in urls:
            drop_pg_database(base, url)


@pytest.fixture(params=["sqlite", "postgres"])
def fresh_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty database that no raysaga has touched."""
    with fresh_databases(request, tmp_path, 1) as urls:
        yield urls[0]


#: fresh databases per backend for the concurrent-open test (a PostgreSQL one costs a CREATE DATABASE)
CONCURRENT_ROUNDS = {"sqlite": 8, "postgres": 3}


@pytest.fixture(params=["sqlite", "postgres"])
def fresh_url_list(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[list[str]]:
    with fresh_databases(request, tmp_path, CONCURRENT_ROUNDS[request.param]) as urls:
        yield urls


def new_run(run_id: str) -> NewRun:
    return NewRun(run_id=run_id, workflow_name="wf", workflow_version="1", definition_hash="d" * 64,
                  trace_id=uuid.uuid4().hex)


def schema_rows(engine: Engine) -> list[tuple[Any, ...]]:
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(select(schema_info.c.id, schema_info.c.version))]


def alembic_rows(engine: Engine) -> list[str]:
    with engine.connect() as conn:
        return [r[0] for r in conn.execute(text("SELECT version_num FROM alembic_version"))]


def test_migrate_from_empty_creates_every_table_and_records_version(fresh_url: str) -> None:
    probe = make_engine(fresh_url)
    try:
        assert set(inspect(probe).get_table_names()) & TABLES == set()
        assert migrate.current_version(probe) is None
    finally:
        probe.dispose()

    store = SqlStore(fresh_url)
    try:
        insp = inspect(store.engine)
        assert set(insp.get_table_names()) >= TABLES | {"alembic_version"}
        for name in TABLES:
            declared = {c.name for c in metadata.tables[name].columns}
            assert {c["name"] for c in insp.get_columns(name)} == declared, name
        assert schema_rows(store.engine) == [(1, SCHEMA_VERSION)]
        assert migrate.current_version(store.engine) == SCHEMA_VERSION
        assert len(alembic_rows(store.engine)) == 1
        # the schema works: a run can be written and read back
        assert store.create_run(new_run("r1")).version == 0
    finally:
        store.close()


@pytest.mark.parametrize("older", ["0001", "0002"])
def test_an_older_database_with_runs_is_upgraded_in_place(fresh_url: str, older: str) -> None:
    """A database left at an earlier revision, holding a run, is upgraded on open; the run reads
    back as it was, and what the new schema adds (budgets, run blobs) works on it."""
    with store_at(fresh_url, older) as engine:
        with engine.begin() as conn:
            conn.execute(text(
                "INSERT INTO raysaga_runs (run_id, workflow_name, workflow_version, definition_hash, status, "
                "version, fence, event_seq, input, retries_used, tokens_used, cost_used, trace_id, created_at, "
                "updated_at) VALUES ('old', 'wf', '1', :h, 'completed', 3, 1, 4, :inp, 0, 0, 0.0, 't', 1.0, 2.0)"
            ), {"h": "d" * 64, "inp": '{"kept": [1, 2]}'})
        assert migrate.current_version(engine) == int(older)

    store = SqlStore(fresh_url)
    try:
        assert schema_rows(store.engine) == [(1, SCHEMA_VERSION)]
        runs_columns = {c["name"] for c in inspect(store.engine).get_columns("raysaga_runs")}
        assert runs_columns == {c.name for c in runs.columns}
        old = store.get_run("old")
        assert (old.status.value, old.version, old.input, old.input_digest, old.token_budget) == (
            "completed", 3, {"kept": [1, 2]}, None, None)
        big = {"text": "x" * (store.run_value_inline_limit + 1)}
        assert store.create_run(new_run("new").model_copy(update={"input": big})).input == big
    finally:
        store.close()


def test_opening_a_migrated_database_again_is_a_no_op(fresh_url: str) -> None:
    first = SqlStore(fresh_url)
    first.create_run(new_run("kept"))
    alembic_before = alembic_rows(first.engine)
    first.close()

    engine = make_engine(fresh_url)
    statements: list[str] = []
    event.listen(engine, "before_cursor_execute",
                 lambda _c, _cur, statement, *_a: statements.append(statement))
    try:
        assert migrate.upgrade(engine) == SCHEMA_VERSION
    finally:
        engine.dispose()
    writes = [s for s in statements
              if s.lstrip().split(None, 1)[0].upper() in {"CREATE", "ALTER", "DROP", "INSERT", "UPDATE", "DELETE"}]
    assert writes == []
    assert statements, "the version check itself reads the database"

    again = SqlStore(fresh_url)
    try:
        assert again.get_run("kept").run_id == "kept"
        assert schema_rows(again.engine) == [(1, SCHEMA_VERSION)]
        assert alembic_rows(again.engine) == alembic_before
    finally:
        again.close()


def test_newer_schema_is_refused_with_upgrade_advice(fresh_url: str) -> None:
    store = SqlStore(fresh_url)
    store.create_run(new_run("kept"))
    newer = SCHEMA_VERSION + 1
    with store.engine.begin() as conn:
        conn.execute(update(schema_info).values(version=newer))
    store.close()

    for migrate_schema in (True, False):
        with pytest.raises(SchemaVersionError) as exc:
            SqlStore(fresh_url, migrate_schema=migrate_schema)
        message = str(exc.value)
        assert "upgrade raysaga" in message
        assert str(newer) in message and str(SCHEMA_VERSION) in message

    # refused means untouched: the version is not rewritten and the data is still there
    engine = make_engine(fresh_url)
    try:
        assert schema_rows(engine) == [(1, newer)]
        with engine.connect() as conn:
            assert conn.execute(select(runs.c.run_id)).scalars().all() == ["kept"]
    finally:
        engine.dispose()


OPENER = r"""
import traceback
from raysaga.state import NewRun, SqlStore
from raysaga.state import migrate

for i, url in enumerate(urls):
    barrier.wait(timeout=60)
    try:
        store = SqlStore(url)
        try:
            version = migrate.current_version(store.engine)
            store.create_run(NewRun(run_id=f"{name}-{i}", workflow_name="wf", workflow_version="1",
                                    definition_hash="d" * 64, trace_id="t"))
        finally:
            store.close()
        out.put((name, url, "ok", version))
    except BaseException:
        # report and go on, so the other opener is never left alone at the barrier
        out.put((name, url, "crash", traceback.format_exc()))
"""

def test_two_processes_migrating_one_fresh_database_both_succeed(fresh_url_list: list[str]) -> None:
    barrier = CTX.Barrier(2)
    out = CTX.Queue()
    names = ["opener-0", "opener-1"]
    procs = [CTX.Process(target=exec, daemon=True, args=(OPENER, {
        "__name__": "raysaga_test_opener", "urls": fresh_url_list, "name": name, "barrier": barrier, "out": out}))
        for name in names]
    results: list[tuple[Any, ...]] = []
    try:
        for proc in procs:
            proc.start()
        deadline = time.monotonic() + 120
        while len(results) < 2 * len(fresh_url_list):
            try:
                results.append(out.get(timeout=0.5))
            except queue.Empty:
                dead = [p.exitcode for p in procs if not p.is_alive()]
                assert not dead, f"opener exited {dead} after results {results}"
                assert time.monotonic() < deadline, f"openers reported only {results}"
        for proc in procs:
            proc.join(timeout=60)
            assert proc.exitcode == 0
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.terminate()
                proc.join(timeout=10)

    # on a fresh SQLite file the switch to WAL answers SQLITE_BUSY at once while the other process
    # holds the file: engine.py retries it until the busy timeout, so no open may crash
    crashes = [r for r in results if r[2] != "ok"]
    assert crashes == [], "\n".join(f"{r[0]} on {r[1]}:\n{r[3]}" for r in crashes)
    assert sorted((r[0], r[1], r[3]) for r in results) == sorted(
        (name, url, SCHEMA_VERSION) for name in names for url in fresh_url_list)
    for i, url in enumerate(fresh_url_list):
        engine = make_engine(url)
        try:
            assert schema_rows(engine) == [(1, SCHEMA_VERSION)]
            assert len(alembic_rows(engine)) == 1
            with engine.connect() as conn:
                assert sorted(conn.execute(select(runs.c.run_id)).scalars()) == [f"{n}-{i}" for n in names]
        finally:
            engine.dispose()
