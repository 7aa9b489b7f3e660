"""Run labels: ``raysaga_runs.labels``, a run's ``RunOptions.labels`` (JSON, NULL for none).

Before schema 11 the labels were checked and dropped; an older store's runs get none (NULL). A
plain ``ADD COLUMN`` (no table rebuild on SQLite, no rewrite of the rows on PostgreSQL: the new
column is NULL), so the upgrade costs the same for a store of any size. ``list --label`` filters
on it without an index: labels narrow a list that the status or workflow indexes page.

Revision ID: 0011
Revises: 0010
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    bind = op.get_bind()
    columns = {c["name"] for c in sa.inspect(bind).get_columns("raysaga_runs")}
    if "labels" not in columns:
        # as schema.JsonText declares it: TEXT on SQLite (canonical JSON text), json on PostgreSQL
        kind = "TEXT" if bind.dialect.name == "sqlite" else "JSON"
        bind.exec_driver_sql(f"ALTER TABLE raysaga_runs ADD COLUMN labels {kind}")
    bind.execute(sa.text("UPDATE raysaga_schema SET version = 11 WHERE id = 1"))
