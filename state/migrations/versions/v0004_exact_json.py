"""Exact JSON on SQLite, the indexes that bound ``list``, ``prune`` and blob collection, and
``raysaga_runs.output_key`` (a run output that wraps its sink's blob stores it once).

SQLite: every JSON column was declared ``JSON``, a NUMERIC-affinity type, so SQLite rewrote bare
numbers on insert (``12345678901234567891`` became a float, ``2.0`` an int). Each such column is
replaced by a TEXT column holding the same JSON text. Tables are NOT recreated (alembic's batch
mode): dropping ``raysaga_runs`` with foreign keys on would cascade-delete every node, event and
effect. Instead, per column: ADD a TEXT column, copy, DROP the old one, RENAME (SQLite 3.35+).
Values SQLite had already turned into numbers are written back as JSON text of that number (the
original spelling is gone; no later write is affected). PostgreSQL's ``json`` type keeps text
verbatim: only the indexes are added there.

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlite3

import sqlalchemy as sa
from alembic import op

from raysaga.errors import StoreUnavailableError
from raysaga.state.migrations.versions.v0001_initial import INDEXES_ADDED_LATER
from raysaga.state.schema import JsonText, metadata

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    bind = op.get_bind()
    if "output_key" not in {c["name"] for c in sa.inspect(bind).get_columns("raysaga_runs")}:
        op.add_column("raysaga_runs", sa.Column("output_key", sa.String(200), nullable=True))
    if bind.dialect.name == "sqlite":
        if sqlite3.sqlite_version_info < (3, 35):
            raise StoreUnavailableError(
                f"upgrading this SQLite store to schema 4 needs SQLite 3.35 or later (this Python has "
                f"{sqlite3.sqlite_version}): use a Python built with a newer SQLite; the file is unchanged")
        for table in metadata.tables.values():
            for column in table.columns:
                if isinstance(column.type, JsonText):
                    _to_text(bind, table.name, column.name)
    for table in metadata.tables.values():
        for index in table.indexes:
            if index.name in INDEXES_ADDED_LATER:
                index.create(bind, checkfirst=True)
    bind.execute(sa.text("UPDATE raysaga_schema SET version = 4 WHERE id = 1"))


def _to_text(bind: sa.Connection, table: str, column: str) -> None:
    declared = {row[1]: str(row[2]).upper() for row in bind.exec_driver_sql(f'PRAGMA table_info("{table}")')}
    if column not in declared or declared[column] == "TEXT":
        return  # absent (a later migration adds it) or already converted
    tmp = f"{column}__text"
    bind.exec_driver_sql(f'ALTER TABLE "{table}" ADD COLUMN "{tmp}" TEXT')
    bind.exec_driver_sql(
        f'UPDATE "{table}" SET "{tmp}" = "{column}" WHERE typeof("{column}") NOT IN (\'integer\', \'real\')')
    # numbers SQLite coerced: their exact Python value as JSON text (SQL's CAST keeps 15 digits only)
    coerced = bind.exec_driver_sql(
        f'SELECT rowid, "{column}" FROM "{table}" WHERE typeof("{column}") IN (\'integer\', \'real\')').all()
    if coerced:
        bind.exec_driver_sql(f'UPDATE "{table}" SET "{tmp}" = ? WHERE rowid = ?',
                             [(repr(value), rowid) for rowid, value in coerced])
    bind.exec_driver_sql(f'ALTER TABLE "{table}" DROP COLUMN "{column}"')
    bind.exec_driver_sql(f'ALTER TABLE "{table}" RENAME COLUMN "{tmp}" TO "{column}"')
