"""The migrations build exactly what ``state/schema.py`` declares.

Every store, new or old, is made by the migrations (``migrate.upgrade``); the code reads and
writes it through the tables ``schema.py`` declares. Where the two differ, the code's assumption
is silently false: until schema 10, ``ux_raysaga_signals_dedup`` (one decision per decision id)
was declared unique and built as a plain index, because migration 0001 copied later indexes
into version 1 without their ``unique`` and ``WHERE`` (and 0006 then found the name taken).

So: a store migrated from nothing, and one migrated from each older schema, against a database
made by ``metadata.create_all`` from the declarations, compared on what a reader or writer relies
on: each table's columns (type family, nullability), primary key, indexes (columns, uniqueness,
partial ``WHERE``), foreign keys. Column order and SQLite's WITHOUT ROWID are not compared (the
declarations say the same; the migrations add columns last).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, inspect, text
from sqlalchemy.exc import IntegrityError

from raysaga.state import SqlStore, migrate
from raysaga.state.engine import make_engine
from raysaga.state.schema import SCHEMA_VERSION, metadata, views
from tests.support.old_schema import migrate_to
from tests.support.postgres import drop_pg_database, make_pg_database

#: what the migrations add that no declaration has: alembic's table (and on SQLite the run_key
#: trigger, which ``shape`` does not read)
NOT_DECLARED = {"alembic_version"}
#: PostgreSQL: ``raysaga_runs.run_key`` is an identity column (NOT NULL, generated); it is declared
#: nullable so an INSERT leaves it out, as on SQLite where a trigger fills it
IDENTITY = ("raysaga_runs", "run_key")


@pytest.fixture(params=["sqlite", "postgres"])
def make_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """A factory of empty databases of one backend, dropped at the end."""
    made: list[str] = []

    def make() -> str:
        if request.param == "sqlite":
            url = f"sqlite:///{tmp_path / f'db{len(made)}.db'}"
        else:
            url = make_pg_database(request.getfixturevalue("pg_base_url"))
        made.append(url)
        return url

    yield make
    if request.param == "postgres":
        base = request.getfixturevalue("pg_base_url")
        for url in made:
            drop_pg_database(base, url)


def _type_family(type_: Any) -> str:
    name = str(type_.compile()) if not isinstance(type_, str) else type_
    name = name.upper()
    for family in ("CHAR", "TEXT", "JSON", "INT", "DOUBLE", "FLOAT", "REAL", "NUMERIC", "BOOL", "BLOB", "BYTEA"):
        if family in name:
            return {"FLOAT": "DOUBLE", "REAL": "DOUBLE", "TEXT": "TEXT", "JSON": "TEXT", "BYTEA": "BLOB"}.get(family,
                                                                                                          family)
    return name


def _where(engine: Engine, index: str) -> str | None:
    """An index's partial ``WHERE``, as the database keeps it (normalised), or None."""
    with engine.connect() as conn:
        if engine.dialect.name == "sqlite":
            sql = conn.execute(text("SELECT sql FROM sqlite_master WHERE type = 'index' AND name = :n"),
                               {"n": index}).scalar_one()
        else:
            sql = conn.execute(text("SELECT indexdef FROM pg_indexes WHERE schemaname = current_schema() "
                                    "AND indexname = :n"), {"n": index}).scalar_one()
    if sql is None or " WHERE " not in sql.upper():
        return None
    where = sql[sql.upper().index(" WHERE ") + 7:]
    return re.sub(r"[\s()\"]+", " ", where).strip().lower()


def shape(engine: Engine) -> dict[str, Any]:
    insp = inspect(engine)
    found: dict[str, Any] = {}
    for table in sorted(set(insp.get_table_names()) - NOT_DECLARED):
        columns = {c["name"]: (_type_family(c["type"]), c["nullable"] or (table, c["name"]) == IDENTITY)
                   for c in insp.get_columns(table)}
        pk = tuple(insp.get_pk_constraint(table)["constrained_columns"])
        indexes = {i["name"]: (tuple(i["column_names"]), bool(i["unique"]), _where(engine, str(i["name"])))
                   for i in insp.get_indexes(table)}
        uniques = {tuple(u["column_names"]) for u in insp.get_unique_constraints(table)}
        fks = {(tuple(f["constrained_columns"]), f["referred_table"], tuple(f["referred_columns"]),
                (f.get("options") or {}).get("ondelete", "").upper() or None) for f in insp.get_foreign_keys(table)}
        found[table] = {"columns": columns, "pk": pk, "indexes": indexes, "uniques": uniques, "fks": fks}
    return found


def declared(url: str) -> dict[str, Any]:
    engine = make_engine(url)
    try:
        metadata.create_all(engine)
        return shape(engine)
    finally:
        engine.dispose()


def migrated(url: str, older: str | None = None) -> dict[str, Any]:
    if older is not None:
        migrate_to(url, older)
    store = SqlStore(url)
    try:
        assert migrate.current_version(store.engine) == SCHEMA_VERSION
        return shape(store.engine)
    finally:
        store.close()


def differences(want: dict[str, Any], got: dict[str, Any]) -> list[str]:
    out = [f"table {t}: {'missing' if t not in got else 'not declared'}" for t in sorted(want.keys() ^ got.keys())]
    for table in sorted(want.keys() & got.keys()):
        for part in ("columns", "indexes"):
            w, g = want[table][part], got[table][part]
            out += [f"{table} {part} {name}: declared {w.get(name)}, "
                    f"built {g.get(name)}" for name in sorted(w.keys() | g.keys()) if w.get(name) != g.get(name)]
        out += [f"{table} {part}: declared {want[table][part]}, built {got[table][part]}"
                for part in ("pk", "uniques", "fks") if want[table][part] != got[table][part]]
    return out


def test_a_new_store_is_built_as_declared(make_url: Any) -> None:
    assert differences(declared(make_url()), migrated(make_url())) == []


@pytest.mark.parametrize("older", ["0001", "0005", "0008"])
def test_a_store_of_an_older_schema_is_brought_to_what_is_declared(make_url: Any, older: str) -> None:
    assert differences(declared(make_url()), migrated(make_url(), older)) == []


def test_one_decision_id_is_one_signal_row_and_the_migration_keeps_every_signal(make_url: Any) -> None:
    """The unique index refuses a second signal row with one decision id; a store that holds two
    already (none can: decisions serialise on the run's row) keeps both, the later one's id cleared."""
    url = make_url()
    migrate_to(url, "0009")
    engine = make_engine(url)
    insert_run = ("INSERT INTO raysaga_runs (run_id, workflow_name, workflow_version, definition_hash, status, "
                  "version, fence, event_seq, retries_used, tokens_used, cost_used, trace_id, created_at, "
                  "updated_at) VALUES ('r', 'wf', '1', :h, 'running', 0, 0, 0, 0, 0, 0.0, 't', 1.0, 1.0)")
    insert_signal = ("INSERT INTO raysaga_signals (run_id, kind, created_at, dedup_key) "
                     "VALUES ('r', 'approve', :at, 'd1')")
    try:
        with engine.begin() as conn:
            conn.execute(text(insert_run), {"h": "d" * 64})
            for at in (1.0, 2.0):
                conn.execute(text(insert_signal), {"at": at})
    finally:
        engine.dispose()
    store = SqlStore(url)
    try:
        with store.engine.connect() as conn:
            rows = conn.execute(text("SELECT created_at, dedup_key FROM raysaga_signals ORDER BY id")).all()
        assert [tuple(r) for r in rows] == [(1.0, "d1"), (2.0, None)]
        with pytest.raises(IntegrityError), store.engine.begin() as conn:
            conn.execute(text(insert_signal), {"at": 3.0})
    finally:
        store.close()


def test_the_views_have_the_columns_declared(make_url: Any) -> None:
    """Readers select a view's declared columns by name: the view the migrations made has them, in order."""
    store = SqlStore(make_url())
    try:
        insp = inspect(store.engine)
        assert set(insp.get_view_names()) >= set(views.tables)
        for view in views.tables.values():
            assert [c["name"] for c in insp.get_columns(view.name)] == [c.name for c in view.columns], view.name
    finally:
        store.close()
