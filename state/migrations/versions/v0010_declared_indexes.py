"""Two indexes as ``schema.py`` declares them; until now every store had them otherwise.

Migration 0001 creates version 1 from today's table declarations and copied their indexes by
name and columns only, so two indexes of later columns were made plain, and 0006 then found
their names taken (``if_not_exists``):

- ``ux_raysaga_signals_dedup`` on ``raysaga_signals (run_id, dedup_key)`` becomes UNIQUE: a
  decision id is recorded once per run (``state/decisions``). The decision path serialises on
  the run's row, so no store can hold two signals with one decision id; should one anyway, the
  later signals' ``dedup_key`` is cleared first (NULLs are distinct in a unique index), keeping
  each signal.
- ``ix_raysaga_runs_parent`` on ``raysaga_runs (parent_run_id)`` becomes partial (``WHERE
  parent_run_id IS NOT NULL``): only forked runs have a parent, and a plain index held an entry
  for every run.

``tests/state/test_schema_drift.py`` compares what the migrations build with the declarations.

Revision ID: 0010
Revises: 0009
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    bind = op.get_bind()
    run = bind.exec_driver_sql
    run("UPDATE raysaga_signals SET dedup_key = NULL WHERE dedup_key IS NOT NULL AND id > "
        "(SELECT MIN(s.id) FROM raysaga_signals s WHERE s.run_id = raysaga_signals.run_id "
        "AND s.dedup_key = raysaga_signals.dedup_key)")
    run("DROP INDEX IF EXISTS ux_raysaga_signals_dedup")
    run("CREATE UNIQUE INDEX ux_raysaga_signals_dedup ON raysaga_signals (run_id, dedup_key)")
    run("DROP INDEX IF EXISTS ix_raysaga_runs_parent")
    run("CREATE INDEX ix_raysaga_runs_parent ON raysaga_runs (parent_run_id) WHERE parent_run_id IS NOT NULL")
    bind.execute(sa.text("UPDATE raysaga_schema SET version = 10 WHERE id = 1"))
