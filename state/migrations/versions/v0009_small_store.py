"""A smaller store: completed node rows without their status text, two SQLite automatic indexes
fewer.

- ``raysaga_nodes.status`` may be NULL, which means ``completed`` (the status of most rows: 9
  bytes less a row on SQLite). The view ``raysaga_node_rows`` reads it back as 'completed', so
  readers and plain SQL see what they saw; a row holding the text 'completed' reads the same.
  SQLite: the table is rebuilt (a NOT NULL cannot be dropped in place) in the migration's
  transaction, its rows copied inside the database with 'completed' written as NULL; still
  ``WITHOUT ROWID``, its partial index recreated. PostgreSQL: the NOT NULL is dropped (no
  rewrite); existing rows keep their text, new completed rows are written NULL.
- SQLite: ``raysaga_breakers`` and ``raysaga_rate_limits`` become ``WITHOUT ROWID`` (rebuilt, rows
  copied): their rows are a name and a few numbers, and a rowid table kept the name twice, in the
  table and in an automatic index (a page of its own even when empty).

The page size of a NEW SQLite file is set by ``engine`` before anything is created; an existing
file keeps its own (docs/storage.md says how to change it).

Revision ID: 0009
Revises: 0008
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

_OLD = "raysaga_nodes__v8"
#: Node columns other than the key's first, in the table's order: ``(type on SQLite, on PostgreSQL)``.
_COLUMNS = (("node_id", "VARCHAR(200) NOT NULL", "VARCHAR(200) NOT NULL"),
            ("fan_index", "INTEGER NOT NULL", "INTEGER NOT NULL"),
            ("status", "VARCHAR(32)", "VARCHAR(32)"),
            ("attempt", "INTEGER NOT NULL", "INTEGER NOT NULL"),
            ("not_before", "DOUBLE", "DOUBLE PRECISION"),
            ("output", "TEXT", "JSON"),
            ("output_digest", "VARCHAR(80)", "VARCHAR(80)"),
            ("error", "TEXT", "JSON"),
            ("started_at", "DOUBLE", "DOUBLE PRECISION"),
            ("finished_at", "DOUBLE", "DOUBLE PRECISION"),
            ("duration", "DOUBLE", "DOUBLE PRECISION"),
            ("origin_run_id", "VARCHAR(200)", "VARCHAR(200)"))
_INDEX = ("CREATE INDEX ix_raysaga_nodes_output_digest ON raysaga_nodes (output_digest) "
          "WHERE output_digest IS NOT NULL")
_DERIVED = {"finished_at": "COALESCE(n.finished_at, n.started_at + n.duration)",
            "status": "COALESCE(n.status, 'completed')"}
_VIEW = ("CREATE VIEW raysaga_node_rows AS SELECT r.run_id AS run_id, "
         + ", ".join(f"{_DERIVED.get(name, f'n.{name}')} AS {name}" for name, _, _ in _COLUMNS)
         + " FROM raysaga_nodes n JOIN raysaga_runs r ON r.run_key = n.run_key")
#: The SQLite tables made ``WITHOUT ROWID``, with their columns as schema 2 and 5 created them.
_SMALL_TABLES = {
    "raysaga_breakers": ("name VARCHAR(200) NOT NULL, state VARCHAR(16) NOT NULL, failures INTEGER NOT NULL, "
                         "opened_at DOUBLE, version INTEGER NOT NULL, updated_at DOUBLE NOT NULL"),
    "raysaga_rate_limits": ("name VARCHAR(200) NOT NULL, blocked_until DOUBLE NOT NULL, version INTEGER NOT NULL, "
                            "updated_at DOUBLE NOT NULL"),
}


def upgrade() -> None:
    bind = op.get_bind()
    run = bind.exec_driver_sql
    run("DROP VIEW raysaga_node_rows")
    if bind.dialect.name == "sqlite":
        _rebuild_nodes(bind)
        for table, columns in _SMALL_TABLES.items():
            _without_rowid(bind, table, columns)
    else:
        run("ALTER TABLE raysaga_nodes ALTER COLUMN status DROP NOT NULL")
    run(_VIEW)
    bind.execute(sa.text("UPDATE raysaga_schema SET version = 9 WHERE id = 1"))


def _rebuild_nodes(bind: sa.Connection) -> None:
    """SQLite: the node table again with ``status`` nullable, its rows copied with 'completed' as
    NULL. Nothing references the table (the view is dropped), so it can move aside and go."""
    run = bind.exec_driver_sql
    run(f"ALTER TABLE raysaga_nodes RENAME TO {_OLD}")
    run("DROP INDEX ix_raysaga_nodes_output_digest")
    columns = ", ".join(f"{name} {lite}" for name, lite, _ in _COLUMNS)
    run(f"CREATE TABLE raysaga_nodes (run_key BIGINT NOT NULL, {columns}, "
        "CONSTRAINT raysaga_nodes_pkey PRIMARY KEY (run_key, node_id, fan_index), "
        "FOREIGN KEY (run_key) REFERENCES raysaga_runs (run_key) ON DELETE CASCADE) WITHOUT ROWID")
    names = ", ".join(name for name, _, _ in _COLUMNS)
    copied = ", ".join("NULLIF(status, 'completed')" if name == "status" else name for name, _, _ in _COLUMNS)
    run(f"INSERT INTO raysaga_nodes (run_key, {names}) SELECT run_key, {copied} FROM {_OLD}")
    run(f"DROP TABLE {_OLD}")
    run(_INDEX)


def _without_rowid(bind: sa.Connection, table: str, columns: str) -> None:
    """SQLite: ``table`` again as a ``WITHOUT ROWID`` table keyed by ``name``, its rows copied."""
    run = bind.exec_driver_sql
    old = f"{table}__v8"
    run(f"ALTER TABLE {table} RENAME TO {old}")  # its automatic index goes with it
    run(f"CREATE TABLE {table} ({columns}, PRIMARY KEY (name)) WITHOUT ROWID")
    names = ", ".join(c.split()[0] for c in columns.split(", "))
    run(f"INSERT INTO {table} ({names}) SELECT {names} FROM {old}")
    run(f"DROP TABLE {old}")
