"""A run's own crash-loop limit: ``raysaga_runs.max_driver_deaths`` (INTEGER, NULL for none).

A run created with ``RunOptions(max_driver_deaths=5)`` and driven by a ``raysaga worker`` fleet was
parked after the worker's ``--max-driver-deaths`` deaths, not 5: the limit was not stored. Now a
value other than the default is recorded with the run and its drivers use it
(``raysaga.orchestrator.crash_loop``); NULL (the default, and every run of an older store) leaves
the limit to the process that drives the run, as before. A plain ``ADD COLUMN`` (no table rebuild
on SQLite, no rewrite of the rows on PostgreSQL: the new column is NULL), so the upgrade costs the
same for a store of any size.

The downgrade drops the column (SQLite 3.35 or newer: ``ALTER TABLE ... DROP COLUMN``); the runs
then lose their own limits and are driven with their drivers' again.

Revision ID: 0013
Revises: 0012
"""

from __future__ import annotations

import sqlite3

import sqlalchemy as sa
from alembic import op

from raysaga.errors import SchemaVersionError

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

_COLUMN = "max_driver_deaths"


def _columns(bind: sa.Connection) -> set[str]:
    return {c["name"] for c in sa.inspect(bind).get_columns("raysaga_runs")}


def upgrade() -> None:
    bind = op.get_bind()
    if _COLUMN not in _columns(bind):
        bind.exec_driver_sql(f"ALTER TABLE raysaga_runs ADD COLUMN {_COLUMN} INTEGER")
    bind.execute(sa.text("UPDATE raysaga_schema SET version = 13 WHERE id = 1"))


def downgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name == "sqlite" and sqlite3.sqlite_version_info < (3, 35):
        raise SchemaVersionError(
            f"the downgrade from schema 13 drops raysaga_runs.{_COLUMN}, which needs SQLite 3.35 or newer (this "
            f"Python has {sqlite3.sqlite_version}): use a Python built with a newer SQLite; the file is unchanged")
    if _COLUMN in _columns(bind):
        bind.exec_driver_sql(f"ALTER TABLE raysaga_runs DROP COLUMN {_COLUMN}")
    bind.execute(sa.text("UPDATE raysaga_schema SET version = 12 WHERE id = 1"))
