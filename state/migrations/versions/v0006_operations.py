"""Operations: runs that wait without a driver, a fleet that claims them, and run lineage.

- ``raysaga_runs.wake_at``: when a run resting without a driver must be taken up again (a
  ``waiting_timer`` run's timer, a ``waiting_human`` run's approval timeout); workers claim by it.
- ``raysaga_runs.queue``: set by ``submit``: a ``pending`` run a worker may start. A run started
  in the foreground (``raysaga run``) has none, so no worker races its own driver for it.
- ``raysaga_runs.parent_run_id`` / ``forked_from``: a forked run's parent and the node it was
  forked from (lineage, shown by ``status``); ``step_hashes``: each step's signature hash at
  creation, so a resume under a changed definition names the steps that changed.
- ``raysaga_nodes.origin_run_id``: on a row a fork inherited, the run that executed the node.
- ``raysaga_signals.dedup_key``: a decision's id, unique per run, so a double click is one decision.

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    bind = op.get_bind()
    inspector = sa.inspect(bind)
    run_columns = {c["name"] for c in inspector.get_columns("raysaga_runs")}
    with op.batch_alter_table("raysaga_runs") as batch:
        if "wake_at" not in run_columns:
            batch.add_column(sa.Column("wake_at", sa.Double, nullable=True))
        if "queue" not in run_columns:
            batch.add_column(sa.Column("queue", sa.String(200), nullable=True))
        if "parent_run_id" not in run_columns:
            batch.add_column(sa.Column("parent_run_id", sa.String(200), nullable=True))
        if "forked_from" not in run_columns:
            batch.add_column(sa.Column("forked_from", sa.String(200), nullable=True))
        if "step_hashes" not in run_columns:
            batch.add_column(sa.Column("step_hashes", sa.Text().with_variant(sa.JSON(), "postgresql"), nullable=True))
    node_columns = {c["name"] for c in inspector.get_columns("raysaga_nodes")}
    if "origin_run_id" not in node_columns:
        with op.batch_alter_table("raysaga_nodes") as batch:
            batch.add_column(sa.Column("origin_run_id", sa.String(200), nullable=True))
    op.create_index("ix_raysaga_runs_status_wake", "raysaga_runs", ["status", "wake_at"], if_not_exists=True)
    op.create_index("ix_raysaga_runs_parent", "raysaga_runs", ["parent_run_id"], if_not_exists=True,
                    sqlite_where=sa.text("parent_run_id IS NOT NULL"),
                    postgresql_where=sa.text("parent_run_id IS NOT NULL"))
    signal_columns = {c["name"] for c in inspector.get_columns("raysaga_signals")}
    if "dedup_key" not in signal_columns:
        with op.batch_alter_table("raysaga_signals") as batch:
            batch.add_column(sa.Column("dedup_key", sa.String(200), nullable=True))
    op.create_index("ux_raysaga_signals_dedup", "raysaga_signals", ["run_id", "dedup_key"], unique=True,
                    if_not_exists=True)
    bind.execute(sa.text("UPDATE raysaga_schema SET version = 6 WHERE id = 1"))
