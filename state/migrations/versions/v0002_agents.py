"""Agents: per-run model budgets, the shared-memory blackboard, fleet-wide circuit breakers.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    bind = op.get_bind()
    columns = {c["name"] for c in sa.inspect(bind).get_columns("raysaga_runs")}
    with op.batch_alter_table("raysaga_runs") as batch:
        if "token_budget" not in columns:
            batch.add_column(sa.Column("token_budget", sa.BigInteger, nullable=True))
        if "cost_budget" not in columns:
            batch.add_column(sa.Column("cost_budget", sa.Double, nullable=True))
    op.create_table(
        "raysaga_memory",
        sa.Column("run_id", sa.String(200), sa.ForeignKey("raysaga_runs.run_id", ondelete="CASCADE"),
                  primary_key=True),
        sa.Column("key", sa.String(200), primary_key=True),
        sa.Column("value", sa.JSON, nullable=True),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("writer", sa.String(120), nullable=True),
        sa.Column("updated_at", sa.Double, nullable=False),
        if_not_exists=True,
    )
    op.create_table(
        "raysaga_breakers",
        sa.Column("name", sa.String(200), primary_key=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("failures", sa.Integer, nullable=False),
        sa.Column("opened_at", sa.Double, nullable=True),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("updated_at", sa.Double, nullable=False),
        if_not_exists=True,
    )
    bind.execute(sa.text("UPDATE raysaga_schema SET version = 2 WHERE id = 1"))
