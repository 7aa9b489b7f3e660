"""The worker fleet, visible: ``raysaga_workers``, one row per ``raysaga worker`` process.

A run submitted for workers whose workflow or definition no live worker serves sat ``pending``,
and nothing told an operator whether any worker was alive or what the fleet served. Now each
worker writes a row at its start (its owner id, host, pid, the workflows it serves with their
versions and definition hashes, its queues and slots), beats it every few seconds with its busy
slots, and records ``stopped_at`` on a clean exit; ``raysaga workers`` and ``raysaga status``
read it. A plain ``CREATE TABLE``: nothing is rewritten, so the upgrade costs the same for a store
of any size, and the runs already there are untouched. The downgrade drops the table.

Revision ID: 0015
Revises: 0014
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    bind = op.get_bind()
    sqlite = bind.dialect.name == "sqlite"
    json = "TEXT" if sqlite else "JSON"  # as schema.JsonText declares it
    bind.exec_driver_sql(
        "CREATE TABLE IF NOT EXISTS raysaga_workers (worker_id VARCHAR(200) NOT NULL, host VARCHAR(255) NOT NULL, "
        "pid INTEGER NOT NULL, started_at DOUBLE PRECISION NOT NULL, beat_at DOUBLE PRECISION NOT NULL, "
        "beat_every DOUBLE PRECISION NOT NULL, stopped_at DOUBLE PRECISION, "
        f"queues {json} NOT NULL, workflows {json} NOT NULL, slots INTEGER NOT NULL, busy INTEGER NOT NULL, "
        "raysaga_version VARCHAR(50) NOT NULL, CONSTRAINT raysaga_workers_pkey PRIMARY KEY (worker_id))"
        + (" WITHOUT ROWID" if sqlite else ""))  # (SQLite: no page for an index of the key: schema.workers)
    bind.execute(sa.text("UPDATE raysaga_schema SET version = 15 WHERE id = 1"))


def downgrade() -> None:
    bind = op.get_bind()
    bind.exec_driver_sql("DROP TABLE IF EXISTS raysaga_workers")
    bind.execute(sa.text("UPDATE raysaga_schema SET version = 14 WHERE id = 1"))
